"""Hidden checks of the GAE assignment (carried by the autograder; the student never sees them).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. Expected values are recorded from ``agentic_rl`` (``gae_reference.json``)
or derived by hand in the check.
"""

from __future__ import annotations

import pathlib
from math import comb

import torch
from gradelib import CheckFailed, References, call, check, convention_hint, expect_close, fail

REFS = References(pathlib.Path(__file__).with_name("gae_reference.json"), {
    "gae": "agentic_rl.advantages:gae",
    "masked_whiten": "agentic_rl.advantages:masked_whiten",
})
GAE = ("agentic_rl.advantages:gae",)
WHITEN = ("agentic_rl.advantages:masked_whiten",)
VALUE_LOSS = ()  # the package computes it inside AgentTrainer.compute_loss: nothing to import

SETTINGS = [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)]


def _ragged(seed: int, rows: int = 6, width: int = 14):
    """Random rewards, values and a ragged mask: mask-0 runs at the start, inside and at the end."""
    gen = torch.Generator().manual_seed(seed)
    r = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    v = torch.randn(rows, width, generator=gen, dtype=torch.float64)
    m = (torch.rand(rows, width, generator=gen) < 0.6).long()
    m[:, 0] = 0  # a prompt token
    if rows >= 3:
        m[0, -4:] = 0  # padding at the end
        m[1, 3:7] = 0  # an observation in the middle
        m[2] = 0  # a row with no generated token
    return r, v, m


def _gae(fn, *args, **kwargs):
    out = call(fn, "gae", *args, **kwargs)
    if not (isinstance(out, tuple) and len(out) == 2):
        fail(f"`gae` must return a pair (advantages, returns), got {type(out).__name__}.")
    return out


def _gae_hint(fn):
    return lambda: convention_hint(fn, "gae")


# --- q1: gae ----------------------------------------------------------------------------------
# Points (master, 9 in all), argued from what each slip breaks in training:
# - skips_observation_tokens 3.5 (with ragged_masks 1: 4.5 for a masking slip): a recursion that
#   steps through observation tokens feeds the untrained values of tool/environment tokens into
#   every advantage before them: multi-turn credit is wrong, the chapter's point. The most points.
# - returns 3: returns without `+ values` are the critic's target; the critic then learns the
#   advantage instead of V, and PPO with a critic trains on wrong targets and a wrong baseline.
# - limits 1 (with ragged_masks 1): gamma missing from the recursion is invisible at gamma = 1,
#   the usual LLM setting, and shortens the horizon to lam otherwise: 2 points in all.
# - ragged_masks 1: everything against the package on random masks; a backstop that every slip
#   above fails too, so it is kept small (a slip is charged where it is named).
# - coin_game_bias 0.5: lam's bias trade-off; an answer right at lam = 0 and 1 passes it.


@check("gae", GAE)
def limits(fn):
    """Eq. gae-delta at lam = 0 and Monte Carlo minus the baseline at lam = 1 (no mask)."""
    r = torch.tensor([[0.0, 0.0, 0.5, 0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.6, 0.7, 0.4, 0.8, 0.9]], dtype=torch.float64)
    m = torch.ones_like(r)
    gamma = 0.9
    v_next = torch.cat([v[:, 1:], torch.zeros(1, 1, dtype=v.dtype)], 1)
    delta = r + gamma * v_next - v
    adv0, _ = _gae(fn, r, v, m, gamma=gamma, lam=0.0)
    expect_close("gae", adv0, delta, "lam=0, which must be the one-step TD error delta_t "
                 "(eq. gae-delta, with V = 0 after the last token)", atol=1e-8)
    returns = torch.tensor([[gamma ** (4 - t) * 1.0 + (0.5 * gamma ** (2 - t) if t <= 2 else 0.0)
                             for t in range(5)]], dtype=torch.float64)
    adv1, _ = _gae(fn, r, v, m, gamma=gamma, lam=1.0)
    expect_close("gae", adv1, returns - v, "lam=1, which must be Monte Carlo minus the baseline, "
                 "G_t - V(s_t) (gamma=0.9, rewards 0.5 and 1 on tokens 2 and 4)", atol=1e-8)


@check("gae", GAE)
def coin_game_bias(fn):
    """The chapter's coin game: 8 flips, reward 1 for at least 5 heads, a half-trained critic."""
    n_tok, need, p, n = 8, 5, 0.6, 20_000

    def v_true(t, h):
        k, left = need - h, n_tok - t
        return sum(comb(left, j) * p**j * (1 - p) ** (left - j)
                   for j in range(max(k, 0), left + 1))

    v_pi = torch.tensor([[v_true(t, h) if h <= t else 0.0 for h in range(n_tok + 1)]
                         for t in range(n_tok)], dtype=torch.float64)
    true_grad = p * (1 - p) * (v_pi[1, 1] - v_pi[1, 0]).item()
    gen = torch.Generator().manual_seed(0)
    heads = torch.rand(n, n_tok, generator=gen, dtype=torch.float64) < p
    h_before = heads.long().cumsum(1) - heads.long()
    reward = torch.zeros(n, n_tok, dtype=torch.float64)
    reward[:, -1] = (heads.sum(1) >= need).double()
    score0 = torch.where(heads[:, 0], 1 - p, -p).double()
    critic = (0.5 * v_pi + 0.25)[torch.arange(n_tok).expand(n, n_tok), h_before]
    mask = torch.ones(n, n_tok)
    for lam, target, claim in ((1.0, true_grad, "unbiased whatever the critic"),
                               (0.0, 0.5 * true_grad, "exactly half the true gradient, because "
                                "it trusts the critic's halved difference")):
        adv, _ = _gae(fn, reward, critic, mask, gamma=1.0, lam=lam)
        if not isinstance(adv, torch.Tensor) or tuple(adv.shape) != (n, n_tok):
            fail(f"`gae` returned advantages of shape {tuple(getattr(adv, 'shape', ()))} for "
                 f"{n} coin-game episodes of {n_tok} tokens; expected {(n, n_tok)}.")
        g = score0 * adv[:, 0].double()
        se = g.std().item() / n**0.5
        if not abs(g.mean().item() - target) <= 4 * se:
            fail(f"`gae` with lam={lam} and a half-trained critic (0.5 V + 0.25) on the coin game "
                 f"should give a policy-gradient estimate that is {claim}: expected "
                 f"{target:.4f} +- {4 * se:.4f}, got {g.mean().item():.4f}.")


@check("gae", GAE)
def skips_observation_tokens(fn):
    """With the mask, GAE on the whole row equals GAE on the row with the mask-0 columns deleted."""
    r, v, m = _ragged(5, rows=1, width=16)
    m[0, [1, 2, 4, 8, 9, 10, 13]] = torch.tensor([1, 1, 1, 1, 0, 1, 1])
    keep = m[0].bool()
    adv, _ = _gae(fn, r, v, m, gamma=0.99, lam=0.9)
    short, _ = _gae(fn, r[:, keep], v[:, keep], torch.ones(1, int(keep.sum())),
                    gamma=0.99, lam=0.9)
    if not isinstance(adv, torch.Tensor) or tuple(adv.shape) != tuple(r.shape):
        fail(f"`gae` returned advantages of shape {tuple(getattr(adv, 'shape', ()))} for a "
             f"[1, 16] row; expected (1, 16).")
    expect_close("gae", adv[:, keep], short, "a row with observation tokens (mask 0) between "
                 "the actions: they must be skipped *inside* the recursion, so the result "
                 "equals GAE on the row with those columns deleted (gamma=0.99, lam=0.9)",
                 atol=1e-8, hint=_gae_hint(fn))
    if adv[0, ~keep].abs().max() > 0:
        fail("`gae` must give masked (mask 0) positions an advantage of exactly 0.")


@check("gae", GAE)
def ragged_masks(fn):
    for gamma, lam in SETTINGS:
        for seed in range(3):
            r, v, m = _ragged(seed)
            adv, _ = _gae(fn, r, v, m, gamma=gamma, lam=lam)
            want_adv, _ = REFS("gae", r, v, m, gamma=gamma, lam=lam)
            expect_close("gae", adv, want_adv, f"the advantages, gamma={gamma}, lam={lam} on "
                         "random ragged masks (a prompt token, observations inside, padding at "
                         "the end, a row with no generated token)", atol=1e-8,
                         hint=_gae_hint(fn))


@check("gae", GAE)
def returns(fn):
    """Eq. gae-return, against the student's own advantages: A_t + V(s_t) on mask-1, 0 elsewhere."""
    r, v, m = _ragged(7)
    adv, ret = _gae(fn, r, v, m, gamma=0.99, lam=0.95)
    if not isinstance(adv, torch.Tensor) or tuple(adv.shape) != tuple(r.shape):
        fail(f"`gae` should return advantages of shape {tuple(r.shape)} for a {tuple(r.shape)} "
             "batch.")
    want = (adv.detach().double() + v) * m
    expect_close("gae", ret, want, "the returns, which must be the advantages plus the values "
                 "on mask-1 positions (eq. gae-return) and 0 on mask-0 positions: they are the "
                 "critic's target", atol=1e-8)


# --- q2: masked_whiten ------------------------------------------------------------------------


def _whiten_diagnosis(got, x, m) -> str:
    """Name the usual mistake when the student's whitening matches one (hand-derived)."""
    valid = m.bool()
    mean = x[valid].mean()
    per_row = torch.zeros_like(x)
    for k in range(x.shape[0]):
        if int(valid[k].sum()) >= 2:
            xr = x[k][valid[k]]
            per_row[k] = (x[k] - xr.mean()) / xr.std()
    candidates = [
        ("the variance is the biased one (divide by N): use N - 1, as verl",
         (x - mean) / x[valid].var(unbiased=False).sqrt()),
        ("the mean and variance include the masked positions: take them over mask 1 only",
         (x - x.mean()) / x.std()),
        ("each row is whitened on its own: use the whole batch's mask-1 positions", per_row),
    ]
    mine = got.detach().double()[valid]
    for why, want in candidates:
        if torch.allclose(mine, want[valid], atol=1e-6):
            return f" It looks like {why}."
    return ""


# q2's points (master, 3 in all), argued from what each slip breaks in training:
# - whiten_statistics 1.5: statistics over the masked positions, or per row, whiten with the
#   wrong mean and scale: every advantage is shifted or rescaled row by row.
# - whiten_unbiased_variance 0.5: a biased variance (divide by N) over a batch's thousands of
#   tokens changes the scale by a factor 1 + 1/(2N): close to right, so it costs only this check
#   (whiten_statistics accepts it).
# - whiten_masked_positions 1: nonzero (or NaN) advantages on masked tokens leak into the loss.


@check("masked_whiten", WHITEN)
def whiten_statistics(fn):
    """The statistics over the whole batch's mask-1 positions, up to the variance's estimator."""
    r, _, m = _ragged(3)
    got = call(fn, "masked_whiten", r, m)
    want = REFS("masked_whiten", r, m)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(r.shape):
        expect_close("masked_whiten", got, want, "random values and a ragged mask")
    on_mask = torch.where(m.bool(), got, torch.zeros_like(got))  # q2's other check: the zeros
    try:
        expect_close("masked_whiten", on_mask, want, "random values and a ragged mask "
                     "(on the mask-1 positions: mean and *unbiased* variance over the mask-1 "
                     "positions of the whole batch, eps under the square root)", atol=1e-6,
                     hint=lambda: _whiten_diagnosis(got, r, m))
    except CheckFailed:
        valid = m.bool()
        biased = (r - r[valid].mean()) / (r[valid].var(unbiased=False) + 1e-8).sqrt()
        if not torch.allclose(got.detach().double()[valid], biased[valid], atol=1e-6):
            raise


@check("masked_whiten", WHITEN)
def whiten_unbiased_variance(fn):
    """The estimator alone: x = (1, 3, 5, 7) and a masked 100, variance 20/3 (N - 1), not 5."""
    x = torch.tensor([[1.0, 3.0, 5.0, 7.0, 100.0]], dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 1, 0]])
    got = call(fn, "masked_whiten", x, m)
    want = (x - 4.0) / (20.0 / 3.0 + 1e-8) ** 0.5 * m
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(x.shape):
        expect_close("masked_whiten", got, want, "x = (1, 3, 5, 7) and a masked 100")
    on_mask = torch.where(m.bool(), got, torch.zeros_like(got))
    expect_close("masked_whiten", on_mask, want, "x = (1, 3, 5, 7) and a masked 100: the "
                 "variance must be the unbiased one (divide by N - 1 = 3, as verl's "
                 "masked_whiten), so 7 whitens to +1.162, not +1.342", atol=1e-6,
                 hint=lambda: _whiten_diagnosis(got, x, m))


@check("masked_whiten", WHITEN)
def whiten_masked_positions(fn):
    r, _, m = _ragged(4)
    got = call(fn, "masked_whiten", r, m)
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(r.shape):
        fail(f"`masked_whiten` should return a tensor of the shape of x, {tuple(r.shape)}.")
    outside = got.detach()[~m.bool()]
    if outside.isnan().any() or outside.abs().max() > 0:
        fail("`masked_whiten` must return exactly 0 on the masked (mask 0) positions: got "
             f"values up to {outside.abs().max().item():.4g} there.")


# --- q3: value_loss ---------------------------------------------------------------------------


def _value_case():
    v_old = torch.zeros(1, 4, dtype=torch.float64)
    target = torch.ones(1, 4, dtype=torch.float64)
    v_new = torch.tensor([[0.1, 0.5, -0.1, -0.5]], dtype=torch.float64, requires_grad=True)
    plain = (v_new.detach() - target) ** 2
    clipped = (v_old + (v_new.detach() - v_old).clamp(-0.2, 0.2) - target) ** 2
    return v_new, v_old, target, torch.maximum(plain, clipped)


def _scalar(fn_name: str, out):
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        fail(f"`{fn_name}` must return a scalar tensor, got {type(out).__name__}"
             + (f" of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else "") + ".")
    return out.reshape(())


@check("value_loss", VALUE_LOSS)
def value_loss_clip(fn):
    v_new, v_old, target, worst = _value_case()
    loss = _scalar("value_loss", call(fn, "value_loss", v_new, v_old, target, torch.ones(1, 4),
                                      cliprange_value=0.2))
    want = 0.5 * worst.mean()
    expect_close("value_loss", loss, want, "eq. value-loss with predictions that moved +0.1, "
                 "+0.5, -0.1, -0.5 from 0 towards a target of 1 (epsilon_V = 0.2; the max of "
                 "the plain and the clipped squared error, times 1/2)", atol=1e-8)
    if not loss.requires_grad:
        fail("`value_loss` has the right value but does not keep the autograd graph of `values`.")
    (grad,) = torch.autograd.grad(loss, v_new)
    if grad[0, 1] != 0 or (grad[0, [0, 2, 3]] == 0).any():
        fail("`value_loss` has the right value but the wrong gradient: only the prediction "
             "that overshot the clip range towards the target (+0.5) may get zero gradient.")


@check("value_loss", VALUE_LOSS)
def value_loss_mask(fn):
    v_new, v_old, target, worst = _value_case()
    mask = torch.tensor([[1, 1, 0, 0]])
    loss = _scalar("value_loss", call(fn, "value_loss", v_new.detach(), v_old, target, mask,
                                      cliprange_value=0.2))
    want = 0.5 * worst[0, :2].mean()
    expect_close("value_loss", loss, want, "a mask with two valid positions of four (a token "
                 "mean over the mask: divide by the 2 valid tokens, not by 4)", atol=1e-8)
