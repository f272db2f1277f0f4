"""Hidden checks of the ReTool assignment (carried by the autograder; the student never sees them).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. Expected values are recorded from ``agentic_rl``
(``retool_reference.json``, through the two adapters below, which only ``release.py --record``
calls) or derived by hand in the check (autograd, a Monte-Carlo estimate, the prompt's rule).
"""

from __future__ import annotations

import pathlib

import torch

from gradelib import References, call, check, expect_close, expect_tensor, fail

REFS = References(pathlib.Path(__file__).with_name("retool_reference.json"), {
    "interpreter_tokens": "retool_checks:_package_mask",
    "resample_on_correct": "retool_checks:_package_roc",
})
MASK = ("agentic_rl.retool:interpreter_tokens", "agentic_rl.multiturn:environment_tokens")
GRADIENT = ()  # the package has no function for it: only the package's own objects are flagged
ROC = ("agentic_rl.retool:resample_on_correct",)


def _package_mask(attention_mask, loss_mask):
    """Recording only: ``agentic_rl.retool.interpreter_tokens`` on the two masks."""
    import types

    from agentic_rl.retool import interpreter_tokens

    return interpreter_tokens(types.SimpleNamespace(attention_mask=attention_mask,
                                                    loss_mask=loss_mask))


def _package_roc(scores, calls, errors, keep, seed):
    """Recording only: the package's GRPO-RoC restricted to one group, generator seeded."""
    from agentic_rl.retool import resample_on_correct

    gen = torch.Generator().manual_seed(seed)
    group = torch.zeros(len(scores), dtype=torch.long)
    return resample_on_correct(scores, group, calls, errors, keep, gen)


# --- q1: tool_output_mask -----------------------------------------------------------------------

#: the chapter's episode, one token per word: (number of tokens, sampled by the policy?)
EPISODE = [(7, 0), (8, 1), (7, 0), (8, 1)]  # prompt, code, interpreter output, answer + eos


def _row(segments, left_pad=0, right_pad=0):
    loss = [m for n, m in segments for _ in range(n)]
    attention = [0] * left_pad + [1] * len(loss) + [0] * right_pad
    return attention, [0] * left_pad + loss + [0] * right_pad


def _batch(*rows):
    return (torch.tensor([a for a, _ in rows]), torch.tensor([m for _, m in rows]))


def _check_mask(fn, attention, loss, what):
    att_in, loss_in = attention.clone(), loss.clone()
    got = call(fn, "tool_output_mask", att_in, loss_in)
    expect_tensor("tool_output_mask", got, what, shape=attention.shape, dtype=torch.bool)
    if not (torch.equal(att_in, attention) and torch.equal(loss_in, loss)):
        fail(f"`tool_output_mask` changed its input masks in place for {what}.")
    want = REFS("interpreter_tokens", attention, loss)
    if torch.equal(got.cpu(), want):
        return
    real, sampled = attention.bool(), loss.bool()
    before = real & ~sampled & (sampled.long().cumsum(1) == 0)
    extra, missed = got.cpu() & ~want, want & ~got.cpu()
    problems = []
    if (extra & before).any():
        problems.append(f"it marks {int((extra & before).sum())} token(s) before the row's first "
                        "policy token (the prompt, or a row with no policy token at all), "
                        "which are not the interpreter's")
    if (extra & ~real).any():
        problems.append(f"it marks {int((extra & ~real).sum())} padding token(s) "
                        "(attention_mask 0)")
    if (extra & real & sampled).any():
        problems.append(f"it marks {int((extra & real & sampled).sum())} of the policy's own "
                        "token(s) (loss_mask 1)")
    if missed.any():
        problems.append(f"it misses {int(missed.sum())} interpreter token(s) (attention_mask 1, "
                        "loss_mask 0, after the row's first policy token)")
    fail(f"`tool_output_mask` is wrong for {what}: " + "; ".join(problems) + ".")


@check("tool_output_mask", MASK)
def mask_right_padded(fn):
    attention, loss = _batch(_row(EPISODE, right_pad=3))
    _check_mask(fn, attention, loss, "the chapter's right-padded row (prompt, code, interpreter "
                "output, answer, padding)")


@check("tool_output_mask", MASK)
def mask_left_padded(fn):
    attention, loss = _batch(_row(EPISODE, left_pad=3), _row(EPISODE[:2] + [(10, 0), (8, 1)]))
    _check_mask(fn, attention, loss, "a left-padded row (padding, prompt, code, interpreter "
                "output, answer) batched with an unpadded one")


@check("tool_output_mask", MASK)
def mask_two_calls_and_a_cut_episode(fn):
    two_calls = [(4, 0), (3, 1), (5, 0), (2, 1), (4, 0), (3, 1)]
    cut = [(4, 0), (3, 1), (5, 0), (2, 1), (7, 0)]  # the episode ends on an interpreter output
    attention, loss = _batch(_row(two_calls, right_pad=2), _row(cut, left_pad=2))
    _check_mask(fn, attention, loss, "rows with two tool calls, one of them ending on the "
                "interpreter's output (no policy token after it)")


@check("tool_output_mask", MASK)
def mask_rows_without_policy_tokens(fn):
    attention, loss = _batch(_row([(6, 0)], right_pad=4), _row([(6, 0)], left_pad=4),
                             _row([], right_pad=10), _row([(4, 0), (6, 1)]))
    _check_mask(fn, attention, loss, "rows without any policy token (a prompt only, right- and "
                "left-padded, and an all-padding row), which have no interpreter tokens")


@check("tool_output_mask", MASK)
def mask_bool_masks(fn):
    attention, loss = _batch(_row(EPISODE, right_pad=2), _row(EPISODE, left_pad=2))
    _check_mask(fn, attention.bool(), loss.bool(), "the chapter's rows with the masks given as "
                "torch.bool tensors")


@check("tool_output_mask", MASK)
def mask_random_batch(fn):
    gen = torch.Generator().manual_seed(0)
    rows = []
    for k in range(12):
        segments = [(int(torch.randint(1, 5, (1,), generator=gen)), j % 2) for j in range(
            int(torch.randint(1, 7, (1,), generator=gen)))]
        pad = 24 - sum(n for n, _ in segments)
        rows.append(_row(segments, right_pad=pad) if k % 2 else _row(segments, left_pad=pad))
    attention, loss = _batch(*rows)
    _check_mask(fn, attention, loss, "a random batch of left- and right-padded rows with up to "
                "three tool calls each")


# --- q2: spurious_logit_gradient ----------------------------------------------------------------


def _logits(seed, v=12, scale=1.0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(v, generator=gen, dtype=torch.float64)
    q = torch.softmax(2 * torch.randn(v, generator=gen, dtype=torch.float64), -1)
    return z.to(dtype), q.to(dtype)


def _sign_hint(got, want):
    def hint():
        if isinstance(got, torch.Tensor) and got.shape == want.shape and torch.allclose(
                got.detach().double(), -want.double(), atol=1e-6):
            return (" Its sign is flipped: it is the gradient of log softmax(logits)[f], which "
                    "points toward the environment's distribution (env_probs - softmax(logits)).")
        return ""
    return hint


@check("spurious_logit_gradient", GRADIENT)
def gradient_zero_when_the_policy_matches_the_tool(fn):
    for seed in range(3):
        z, _ = _logits(seed)
        got = call(fn, "spurious_logit_gradient", z, torch.softmax(z, -1))
        expect_close("spurious_logit_gradient", got, torch.zeros_like(z), "env_probs equal to "
                     "softmax(logits), where the expected gradient must be 0, as for the policy's "
                     "own tokens", atol=1e-10)


@check("spurious_logit_gradient", GRADIENT)
def gradient_deterministic_tool(fn):
    z, _ = _logits(1)
    for f in (0, 5, 11):
        leaf = z.clone().requires_grad_()
        (want,) = torch.autograd.grad(torch.log_softmax(leaf, -1)[f], leaf)
        got = call(fn, "spurious_logit_gradient", z, torch.eye(len(z), dtype=z.dtype)[f])
        expect_close("spurious_logit_gradient", got, want, f"a deterministic tool (env_probs "
                     f"one-hot on token {f}): it must be the autograd gradient of "
                     f"log softmax(logits)[{f}], e_f - softmax(logits)", atol=1e-10,
                     hint=_sign_hint(got, want))


@check("spurious_logit_gradient", GRADIENT)
def gradient_is_the_expectation_over_the_tool(fn):
    for seed in range(3):
        z, q = _logits(10 + seed, scale=2.0)
        leaf = z.clone().requires_grad_()
        (want,) = torch.autograd.grad((q * torch.log_softmax(leaf, -1)).sum(), leaf)
        got = call(fn, "spurious_logit_gradient", z, q)
        expect_close("spurious_logit_gradient", got, want, "random logits and a random env_probs: "
                     "it must be the expectation over f ~ env_probs of the autograd gradient of "
                     "log softmax(logits)[f]", atol=1e-10, hint=_sign_hint(got, want))


@check("spurious_logit_gradient", GRADIENT)
def gradient_matches_monte_carlo(fn):
    n = 200_000
    z, q = _logits(7, v=8)
    got = call(fn, "spurious_logit_gradient", z, q)
    gen = torch.Generator().manual_seed(7)
    f = torch.multinomial(q, n, replacement=True, generator=gen)  # the tool writes f ~ q
    leaf = z.clone().requires_grad_()
    (mc,) = torch.autograd.grad(torch.log_softmax(leaf, -1)[f].mean(), leaf)
    se = (q * (1 - q) / n).sqrt()
    if not isinstance(got, torch.Tensor) or got.shape != mc.shape:
        fail("`spurious_logit_gradient` should return a [V] tensor for logits and env_probs of "
             f"shape [{len(z)}].")
    off = (got.detach().double() - mc).abs() > 5 * se + 1e-9
    if off.any():
        i = int(off.nonzero()[0])
        fail(f"`spurious_logit_gradient` does not match a Monte-Carlo estimate ({n} tokens "
             f"f ~ env_probs, the autograd gradient of log softmax(logits)[f] averaged): at index "
             f"{i} it gave {got[i].item():.4f}, the estimate is {mc[i].item():.4f} +- "
             f"{5 * se[i].item():.4f}.")


@check("spurious_logit_gradient", GRADIENT)
def gradient_ignores_a_shift_of_the_logits(fn):
    z, q = _logits(3)
    base = call(fn, "spurious_logit_gradient", z, q)
    shifted = call(fn, "spurious_logit_gradient", z + 7.5, q)
    if not isinstance(base, torch.Tensor):
        fail(f"`spurious_logit_gradient` should return a torch.Tensor, got {type(base).__name__}.")
    expect_close("spurious_logit_gradient", shifted, base.detach(), "logits shifted by a "
                 "constant (7.5 added to every logit), which softmax ignores, so the gradient "
                 "must not change", atol=1e-10)


@check("spurious_logit_gradient", GRADIENT)
def gradient_large_float32_logits(fn):
    z, q = _logits(4, v=10, scale=60.0, dtype=torch.float32)
    z = z + 100.0  # logits around 100: exp overflows float32 without the max subtracted
    got = call(fn, "spurious_logit_gradient", z, q)
    want = q.double() - torch.softmax(z.double(), -1)
    if isinstance(got, torch.Tensor) and got.dtype != torch.float32:
        fail(f"`spurious_logit_gradient` should return the dtype of `logits` (float32), "
             f"got {got.dtype}.")
    expect_close("spurious_logit_gradient", got, want, "float32 logits around 100 (use a "
                 "numerically stable softmax, such as torch.softmax)", atol=1e-5)


# --- q3: resample_on_correct --------------------------------------------------------------------


def _roc(fn, scores, calls, errors, keep, seed=0):
    gen = torch.Generator().manual_seed(seed)
    got = call(fn, "resample_on_correct", scores, calls, errors, keep, gen)
    what = f"a group of {len(scores)} with keep={keep}"
    if not isinstance(got, torch.Tensor):
        fail(f"`resample_on_correct` should return a torch.Tensor for {what}, "
             f"got {type(got).__name__}.")
    if got.dtype != torch.long or got.ndim != 1:
        fail(f"`resample_on_correct` should return a 1-D torch.long tensor of row indices for "
             f"{what}, got dtype {got.dtype} and shape {tuple(got.shape)}.")
    rows = got.tolist()
    if rows != sorted(set(rows)):
        fail(f"`resample_on_correct` should return distinct row indices in increasing order for "
             f"{what}, got {rows}.")
    if rows and not 0 <= rows[0] <= rows[-1] < len(scores):
        fail(f"`resample_on_correct` returned indices outside the group for {what}: {rows}.")
    return rows


def _positives(rows, scores):
    return [i for i in rows if scores[i] > 0]


@check("resample_on_correct", ROC)
def roc_keeps_the_cleanest_positives(fn):
    scores = torch.tensor([1.0, -1, 1, -1, 1, -1, 1, -1])
    calls = torch.tensor([2, 1, 1, 1, 0, 1, 1, 1])
    errors = torch.tensor([1, 0, 0, 1, 0, 0, 1, 0])
    rows = _roc(fn, scores, calls, errors, 4)
    if len(rows) != 4:
        fail(f"`resample_on_correct` should keep `keep` = 4 rows of the worked example's group "
             f"of 8, got {len(rows)}: {rows}.")
    if _positives(rows, scores) != [0, 2]:
        fail("`resample_on_correct` is wrong for the worked example (positives with error rates "
             "1/2, 0/1, no call and 1/1, keep 4): the positives kept must be rows 2 (rate 0) "
             f"and 0 (rate 0.5, before row 4 in generation order), got "
             f"{_positives(rows, scores)}.")
    scores = torch.tensor([1.0, 1, 1, 1, -1, -1, -1, -1])
    calls = torch.tensor([3, 1, 2, 1, 1, 1, 1, 1])
    errors = torch.tensor([2, 1, 0, 0, 1, 0, 0, 1])
    rows = _roc(fn, scores, calls, errors, 4)
    if _positives(rows, scores) != [2, 3]:
        fail("`resample_on_correct` does not keep the cleanest positives: in a group whose "
             "positives come first with error rates 2/3, 1/1, 0/2 and 0/1 (keep 4, so 2 "
             "positives), it must keep rows 2 and 3 (rate 0), the lowest tool-error rate "
             f"errors / calls, not the first generated; it kept {_positives(rows, scores)}.")


@check("resample_on_correct", ROC)
def roc_positives_without_calls_count_as_half(fn, errors3: int):
    want, why = {3: (0, "the one without any call (0.5) ranks before 3 errors in 4 calls (0.75)"),
                 1: (1, "1 error in 4 calls (0.25) ranks before the one without any call (0.5)")
                 }[errors3]
    scores = torch.tensor([1.0, 1, -1, -1])
    calls = torch.tensor([0, 4, 1, 1])
    errors = torch.tensor([0, errors3, 0, 0])
    rows = _roc(fn, scores, calls, errors, 2)
    if _positives(rows, scores) != [want]:
        fail(f"`resample_on_correct` is wrong for positives without any tool call: their error "
             f"rate counts as 0.5, so {why}; with keep=2 of (no call, {errors3}/4 errors, two "
             f"negatives) it must keep positive row {want}, it kept {_positives(rows, scores)}.")


@check("resample_on_correct", ROC)
def roc_ties_in_generation_order(fn):
    scores = torch.tensor([-1.0, 1, 1, -1, 1, 1, 1, 1])
    calls = torch.tensor([1, 2, 1, 1, 2, 1, 3, 1])
    errors = torch.tensor([0, 0, 0, 1, 1, 0, 0, 0])
    rows = _roc(fn, scores, calls, errors, 4)
    if _positives(rows, scores) != [1, 2, 5]:
        fail("`resample_on_correct` is wrong for positives tied at error rate 0: ties go in "
             "generation order (a stable sort), so of rows 1, 2, 5, 6, 7 it must keep 1, 2 and "
             f"5 (keep=4, one negative), it kept {_positives(rows, scores)}.")


@check("resample_on_correct", ROC)
def roc_number_of_negatives(fn):
    cases = [(4, 4, 5), (2, 6, 4), (1, 7, 4), (0, 8, 4), (8, 0, 4), (2, 6, 6), (3, 5, 2),
             (6, 2, 4)]
    for n_pos, n_neg, keep in cases:
        n = n_pos + n_neg
        order = torch.randperm(n, generator=torch.Generator().manual_seed(n_pos * 10 + keep))
        scores = torch.where(order < n_pos, 1.0, -1.0)
        calls, errors = torch.ones(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
        rows = _roc(fn, scores, calls, errors, keep)
        want_neg = min(n_neg, max(keep - n_pos, round(keep * n_neg / n)))
        got_neg = len(rows) - len(_positives(rows, scores))
        want_total = want_neg + min(n_pos, keep - want_neg)
        if got_neg != want_neg or len(rows) != want_total:
            half = " (Python's round takes halves to even: round(2.5) == 2)" if (
                keep * n_neg * 2 % n == 0 and keep * n_neg % n != 0) else ""
            fail(f"`resample_on_correct` keeps the wrong number of rows for a group of {n_pos} "
                 f"positives and {n_neg} negatives with keep={keep}: it kept {got_neg} "
                 f"negatives and {len(rows)} rows, expected {want_neg} negatives = "
                 f"min(len(neg), max(keep - len(pos), round(keep * len(neg) / n))){half} and "
                 f"{want_total} rows.")


@check("resample_on_correct", ROC)
def roc_a_score_of_zero_is_a_negative(fn):
    scores = torch.tensor([0.0, 0, 0, 0, 1, 1, 1, 1])
    calls, errors = torch.ones(8, dtype=torch.long), torch.zeros(8, dtype=torch.long)
    rows = _roc(fn, scores, calls, errors, 4)
    if sum(scores[i] == 0 for i in rows) != 2 or _positives(rows, scores) != [4, 5]:
        fail("`resample_on_correct` is wrong for a group with scores 0 and 1: a score of 0 is a "
             "negative (score <= 0), so keep=4 of 4 zeros and 4 ones keeps 2 of each; it kept "
             f"rows {rows}.")


@check("resample_on_correct", ROC)
def roc_draws_the_negatives_with_randperm(fn):
    scores = torch.tensor([-1.0, 1, -1, -1, 1, -1, -1, 1, -1, -1, 1, -1])
    calls = torch.tensor([1, 1, 2, 0, 1, 1, 1, 2, 1, 3, 1, 1])
    errors = torch.tensor([1, 0, 1, 0, 0, 1, 0, 1, 0, 2, 1, 0])
    for seed in range(5):
        rows = _roc(fn, scores, calls, errors, 6, seed=seed)
        want = REFS("resample_on_correct", scores, calls, errors, 6, seed).tolist()
        neg, want_neg = [i for i in rows if scores[i] <= 0], [i for i in want if scores[i] <= 0]
        if neg != want_neg:
            fail(f"`resample_on_correct` keeps negatives {neg} where `torch.randperm(len(neg), "
                 f"generator=generator)[:n_neg]` applied to the negatives in generation order "
                 f"picks {want_neg} (a group of 12 with 8 negatives, keep=6, generator seed "
                 f"{seed}); call randperm exactly so, once.")


@check("resample_on_correct", ROC)
def roc_random_groups(fn):
    gen = torch.Generator().manual_seed(3)
    for k in range(40):
        n = int(torch.randint(2, 17, (1,), generator=gen))
        keep = int(torch.randint(1, n + 1, (1,), generator=gen))
        scores = torch.randint(-1, 2, (n,), generator=gen).double()
        calls = torch.randint(0, 4, (n,), generator=gen)
        errors = torch.minimum(torch.randint(0, 3, (n,), generator=gen), calls)
        rows = _roc(fn, scores, calls, errors, keep, seed=k)
        want = REFS("resample_on_correct", scores, calls, errors, keep, k).tolist()
        if rows != want:
            fail(f"`resample_on_correct` is wrong for random group {k} (n={n}, keep={keep}, "
                 f"scores {scores.long().tolist()}, tool calls {calls.tolist()}, errors "
                 f"{errors.tolist()}, generator seed {k}): it kept {rows}, expected {want}.")
