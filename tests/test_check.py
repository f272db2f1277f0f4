"""check_implementation: the package's own functions pass; deliberately wrong variants fail with the
convention that differs named; a function that raises or returns the wrong shape is reported, never
a traceback from the checker. The reference cases are data: neither verl nor TRL is needed here."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from agentic_rl import advantages as A
from agentic_rl import check as _check
from agentic_rl import check_grid as _grid
from agentic_rl import losses as L
from agentic_rl.check import CheckReport, check_implementation, load_reference_cases


def test_metadata_names_the_frameworks():
    meta = load_reference_cases()["metadata"]
    assert meta["verl"] and meta["trl"] and meta["verl_imported"] is True
    assert "calling verl" in meta["provenance"]


@pytest.mark.parametrize("fn, kind, ref", [
    (A.group_advantages, "group_advantages", "agentic_rl.group_advantages"),
    (A.gae, "gae", "agentic_rl.gae"),
    (L.kl_penalty, "kl", "agentic_rl.kl_penalty"),
    (L.policy_loss, "policy_loss", "agentic_rl.policy_loss(agg='token-mean')"),
    (L.aggregate, "aggregate", "agentic_rl.aggregate"),
])
def test_package_functions_pass(fn, kind, ref):
    report = check_implementation(fn, kind)
    assert isinstance(report, CheckReport)
    assert report.passed, str(report)
    assert any(m.startswith(ref) for m in report.matches)
    assert not report.differences and not report.problems
    assert "PASSED" in str(report) and "PASSED" in report._repr_html_()


def test_package_modes_match_the_named_references():
    ok = check_implementation(functools.partial(A.group_advantages, scale="none"),
                              "group_advantages", expect="agentic_rl-none")
    assert ok.passed
    r = check_implementation(functools.partial(L.aggregate, mode="seq-mean-token-mean"),
                             "aggregate", expect="verl-seq-mean-token-mean")
    assert r.passed
    r = check_implementation(functools.partial(L.policy_loss, dual_clip=3.0), "policy_loss",
                             expect="verl-token-mean")
    assert r.passed and any("verl" in m for m in r.matches)


def _per_group(fn):
    def adv(scores, gids):
        out = torch.zeros_like(scores)
        for g in gids.unique():
            m = gids == g
            out[m] = fn(scores[m])
        return out
    return adv


def test_biased_std_is_named():
    fn = _per_group(lambda x: (x - x.mean()) / (x.std(unbiased=False) + 1e-6))
    r = check_implementation(fn, "group_advantages")
    assert not r.passed
    assert any(d.startswith("std estimator: yours is the biased") for d in r.differences), r
    assert any("n-1" in d for d in r.differences)


def test_eps_under_sqrt_is_named():
    def fn(x):
        return torch.zeros_like(x) if len(x) == 1 else (x - x.mean()) / torch.sqrt(x.var() + 1e-6)
    r = check_implementation(_per_group(fn), "group_advantages")
    assert not r.passed
    assert any("epsilon" in d and "square root" in d for d in r.differences), r


def test_trl_eps_passes_and_is_named():
    def fn(x):
        return torch.zeros_like(x) if len(x) == 1 else (x - x.mean()) / (x.std() + 1e-4)
    r = check_implementation(_per_group(fn), "group_advantages")
    assert r.passed and any(m.startswith("TRL GRPO (unbiased std, +1e-4") for m in r.matches)
    r = check_implementation(_per_group(fn), "group_advantages", expect="verl")
    assert not r.passed and any("epsilon" in d for d in r.differences)


@pytest.mark.filterwarnings("ignore:std\\(\\):UserWarning")
def test_group_of_one_handling_is_named():
    def fn(x):  # torch.std of one sample is NaN
        return (x - x.mean()) / (x.std() + 1e-6)
    r = check_implementation(_per_group(fn), "group_advantages")
    assert not r.passed
    assert any(d.startswith("a group of one: yours is NaN") for d in r.differences), r


def test_gae_ignoring_the_mask_is_named():
    def fn(r, v, m, gamma, lam):
        adv, ret = A.gae(r, v, torch.ones_like(m), gamma=gamma, lam=lam)
        return adv * m, ret * m
    rep = check_implementation(fn, "gae")
    assert not rep.passed
    assert any("treated as ordinary steps" in d for d in rep.differences), rep


def test_gae_whitened_matches_verl():
    def fn(r, v, m, gamma, lam):
        adv, ret = A.gae(r, v, m, gamma=gamma, lam=lam)
        return A.masked_whiten(adv, m), ret
    rep = check_implementation(fn, "gae")
    assert rep.passed and any(m.startswith("verl") for m in rep.matches)


def test_kl_k1_and_direction_are_named():
    r = check_implementation(functools.partial(L.kl_penalty, kind="k1"), "kl")
    assert not r.passed and any(m.startswith("verl kl_penalty 'k1'") for m in r.matches)
    assert any(d.startswith("KL estimator: yours is k1") for d in r.differences)
    r = check_implementation(lambda lp, ref: L.kl_penalty(ref, lp, "k3"), "kl")
    assert not r.passed and any(d.startswith("direction") for d in r.differences), r


def test_policy_loss_variants_are_named():
    def no_high(logprobs, old_logprobs, advantages, mask, epsilon=0.2, epsilon_high=None):
        return L.policy_loss(logprobs, old_logprobs, advantages, mask, epsilon=epsilon)
    r = check_implementation(no_high, "policy_loss")
    assert not r.passed and any(d.startswith("clip bounds") for d in r.differences), r

    def optimistic(logprobs, old_logprobs, advantages, mask, epsilon=0.2, epsilon_high=0.2):
        ratio = torch.exp(logprobs - old_logprobs)
        lm = torch.minimum(-advantages * ratio,
                           -advantages * ratio.clamp(1 - epsilon, 1 + epsilon_high))
        return L.aggregate(lm, mask)
    r = check_implementation(optimistic, "policy_loss")
    assert not r.passed and any(d.startswith("clipped surrogate") for d in r.differences), r

    seq = functools.partial(L.policy_loss, agg="seq-mean-token-mean")
    assert check_implementation(seq, "policy_loss").passed
    r = check_implementation(seq, "policy_loss", expect="trl-dapo")
    assert not r.passed and any(d.startswith("loss aggregation") for d in r.differences)


def test_wrong_aggregation_is_named():
    r = check_implementation(lambda lm, m: lm.mean(), "aggregate")
    assert not r.passed
    assert any("padding included" in d for d in r.differences), r
    r = check_implementation(L.aggregate, "aggregate", expect="verl-seq-mean-token-mean")
    assert not r.passed
    assert any(d.startswith("loss aggregation: yours is token-mean") for d in r.differences)
    # TRL's grpo counts empty rows in the mean over rows; verl's excludes them
    def trl_grpo(lm, m):
        m = m.float()
        return ((lm * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()
    r = check_implementation(trl_grpo, "aggregate", expect="verl-seq-mean-token-mean")
    assert not r.passed and any("empty rows counted" in d for d in r.differences)
    assert check_implementation(trl_grpo, "aggregate", expect="trl-grpo").passed


def test_exceptions_and_shapes_are_reported_not_raised():
    def boom(scores, gids):
        raise RuntimeError("not implemented yet")
    r = check_implementation(boom, "group_advantages")
    assert not r.passed and "boom raised RuntimeError: not implemented yet" in r.problems[0]
    assert "binary" in r.problems[0]
    r = check_implementation(lambda s, g: s[:, None].repeat(1, 3), "group_advantages")
    assert not r.passed and "shape" in r.problems[0]
    r = check_implementation(lambda lp, ref: "x", "kl")
    assert not r.passed and r.problems
    assert "FAILED" in str(r)
    with pytest.raises(ValueError, match="kind"):
        check_implementation(A.gae, "nope")
    with pytest.raises(ValueError, match="expect"):
        check_implementation(A.gae, "gae", expect="nope")


def test_report_prose_for_each_path():
    # the convention a function follows when it is no reference's
    fn = _per_group(lambda x: (x - x.mean()) / (x.std(unbiased=False) + 1e-6))
    r = check_implementation(fn, "group_advantages")
    assert r.matches == [
        "no reference; your convention: std estimator: the biased group std (divides by n); "
        "epsilon and where it goes: (x - mean) / (std + 1e-6); a group of one: advantage 0"
    ]
    assert r.notes == ["closest expected reference: agentic_rl.group_advantages (unbiased std, "
                       "+1e-6; a group of one gets 0)"]
    # an output no convention explains: got vs the closest reference, case by case
    def noisy(scores, gids):
        return A.group_advantages(scores, gids) + 0.01 * (scores > 0.5).float()
    r = check_implementation(noisy, "group_advantages")
    assert not r.passed and len(r.differences) == 1 and r.matches == []
    assert r.differences[0].startswith("on case 'binary' (0/1 rewards")
    assert ("your output matches no known convention: the advantages first differ at index 0: "
            "yours 0.51, agentic_rl.group_advantages 0.5; values [0:16]: yours [0.51, -1.5, 0.51"
            ) in r.differences[0]
    assert r.differences[0].endswith("(nor on cases 'interleaved', 'batch-8x4')")
    assert [c["ok"] for c in r.cases] == [False, False, True, False]
    # a policy loss without epsilon keywords: only the epsilon-0.2 cases run
    def no_eps(logprobs, old_logprobs, advantages, mask):
        return L.policy_loss(logprobs, old_logprobs, advantages, mask)
    r = check_implementation(no_eps, "policy_loss")
    assert r.passed and r.notes == [
        f"{r.function} takes no epsilon keyword (epsilon, eps, clip_ratio, cliprange, "
        "epsilon_low, clip_eps): checked only the cases with epsilon 0.2",
        f"{r.function} takes no epsilon_high keyword: the clip-higher cases were skipped",
    ]
    assert [c["ok"] for c in r.cases] == [True, None, None, True]
    assert [c["note"].endswith("(skipped)") for c in r.cases] == [False, True, True, False]
    # nothing usable: every case an error, one closing problem
    r = check_implementation(lambda lp, ref: "x", "kl")
    assert r.problems[-1] == (
        f"{r.function} produced no usable output on any case; nothing to compare"
    )
    assert all(c["ok"] is None for c in r.cases) and not r.differences and not r.matches


# ---------------------------------------------------------------------------- GAE bugs named
def _gae_variant(*, raw_next=False, terminal="zero", coef=None, whiten=None, plus_values=True):
    """A learner's masked GAE (the assignment's loop) with one planted bug."""
    def fn(r, v, m, gamma, lam):
        mf = m.to(v.dtype)
        B, T = v.shape
        adv = torch.zeros_like(v)
        if terminal == "self":  # V(s_H) = V of the row's last policy token
            last = torch.where(m > 0, torch.arange(T).expand(B, T), -1).max(1).values
            nv = v[torch.arange(B), last]
        else:
            nv = v[:, -1].clone() if terminal == "last" else torch.zeros(B)
        na = torch.zeros(B)
        for t in reversed(range(T)):
            if raw_next and t + 1 < T:
                nv = v[:, t + 1]  # the raw next column, masked or not
            a = r[:, t] + gamma * nv - v[:, t] + (gamma * lam if coef is None else lam) * na
            na = torch.where(mf[:, t] > 0, a, na)
            nv = torch.where(mf[:, t] > 0, v[:, t], nv)
            adv[:, t] = a * mf[:, t]
        ret = (adv + v) * mf if plus_values else adv
        if whiten == "biased":
            n = mf.sum()
            mu = (adv * mf).sum() / n
            adv = (adv - mu) * torch.rsqrt((((adv - mu) ** 2) * mf).sum() / n + 1e-8) * mf
        elif whiten == "padded":
            adv = (adv - adv.mean()) / (adv.std() + 1e-8) * mf
        return adv, ret
    return fn


def _evidence(rep):
    return [d for d in rep.differences if d.startswith(("e.g. on case", "on case"))]


def test_gae_returns_without_values_shows_the_returns():
    rep = check_implementation(_gae_variant(plus_values=False), "gae")
    assert not rep.passed
    assert rep.differences[0].startswith(
        "the returns: yours is returns = advantages (forgot + values)"), rep
    (ev,) = _evidence(rep)
    assert "the advantages match; the returns differ (returns must be advantages + values)" in ev
    # the lists shown are the returns, yours vs expected: not the (matching) advantages twice
    yours, theirs = ev.split("yours [")[1].split("]")[0], ev.split("agentic_rl.gae [")[1]
    assert yours != theirs.split("]")[0]


def test_gae_positions_not_compared_are_not_shown_as_nan():
    rep = check_implementation(_gae_variant(raw_next=True), "gae")
    text = str(rep)
    assert "nan" not in text.lower().replace("nan)", ""), text
    (ev,) = _evidence(rep)
    assert "(· = not compared, mask 0)" in ev and "[·, ·, ·, " in ev


def test_gae_shows_the_first_difference_and_its_row():
    # one value wrong past the first 8 flattened ones: row 2, column 10 (a policy token)
    def late(r, v, m, gamma, lam):
        adv, ret = A.gae(r, v, m, gamma=gamma, lam=lam)
        adv[2, 10] += 1.0
        return adv, ret + (adv - A.gae(r, v, m, gamma=gamma, lam=lam)[0])
    rep = check_implementation(late, "gae")
    (ev,) = _evidence(rep)
    assert ev.startswith("on case 'multiturn-0' (gamma 0.99, lam 0.95) your output matches no "
                         "known convention: the advantages first differ at row 2, column 10: "
                         "yours "), ev
    assert "; row 2 (· = not compared, mask 0): yours [·, " in ev
    # the other layout has an observation token there (not compared): only multiturn-2 differs
    assert ev.endswith("(nor on case 'multiturn-2')")


def test_gae_off_by_one_bootstrap_is_named_not_mask_through():
    rep = check_implementation(_gae_variant(raw_next=True), "gae")
    assert not rep.passed
    assert rep.differences[0].startswith(
        "masked (observation) tokens inside the recursion: yours is an off-by-one bootstrap: "
        "V(s_next) read from the raw next column values[:, t+1]"), rep
    assert not any("treated as ordinary steps" in d for d in rep.differences)
    assert not any("no known convention" in d for d in rep.differences)
    # on the shipped cases the bug and "mask applied afterwards" give different advantages
    spec = _check._spec("gae")
    names = [[o["name"] for o in d["options"]] for d in spec["dims"]]
    grid = list(itertools.product(*names))
    rest = ("none", "zero", "gamma*lam", "adv+values")
    raw, through = grid.index(("raw-next", *rest)), grid.index(("through", *rest))
    differ = [c["name"] for c in spec["cases"] if not torch.allclose(
        c["expected"][c["grid"][raw]][0][0], c["expected"][c["grid"][through]][0][0], atol=1e-4)]
    assert len(differ) >= 3, differ


@pytest.mark.parametrize("terminal, text", [
    ("self", "V(s_H) = V(s_t) of the last token itself"),
    ("last", "the row's last value values[:, -1]"),
])
def test_gae_nonzero_terminal_value_is_named(terminal, text):
    rep = check_implementation(_gae_variant(terminal=terminal), "gae")
    assert not rep.passed
    assert rep.differences[0] == (
        f"the value after the last token: yours is a non-zero terminal value: {text}; "
        "agentic_rl.gae (skips masked tokens, no whitening) uses 0 (the episode ends there) "
        "(so does verl compute_gae_advantage_return (skips masked tokens, whitens advantages))")
    assert len(rep.differences) == 2 and _evidence(rep)


@pytest.mark.parametrize("whiten, text", [
    ("biased", "whitened with the biased variance (divides by n, not n-1)"),
    ("padded", "whitened with the mean and variance of every position, padding and masked "
               "tokens included"),
])
def test_gae_whitening_bugs_are_named_against_the_whitened_reference(whiten, text):
    rep = check_implementation(_gae_variant(whiten=whiten), "gae")
    assert not rep.passed
    assert rep.differences[0].startswith(f"whitening of the advantages: yours is {text}; verl"), rep
    assert rep.notes[-1].startswith("closest expected reference: verl")
    (ev,) = _evidence(rep)
    assert "verl compute_gae_advantage_return" in ev and "agentic_rl.gae" not in ev


def test_gae_lambda_without_gamma_is_named():
    rep = check_implementation(_gae_variant(coef="lam"), "gae")
    assert not rep.passed
    assert rep.differences[0].startswith(
        "the recursion's factor: yours is gamma missing: A_t = delta_t + lam * A_next"), rep


def test_gae_added_conventions_reproduce_the_shipped_grid():
    for kind in ("gae", "group_advantages"):
        spec = _check._spec(kind)
        shipped = load_reference_cases()["kinds"][kind]
        names = [d["name"] for d in spec["dims"]]
        old = list(itertools.product(*[[o["name"] for o in d["options"]] for d in shipped["dims"]]))
        defaults = tuple(d["options"][0]["name"] for d in spec["dims"][len(shipped["dims"]):])
        for case, c0 in zip(spec["cases"], shipped["cases"]):
            for k, pt in enumerate(old):
                p = dict(zip(names, pt + defaults))
                if kind == "group_advantages" and p["singleton"] == "nan":
                    continue  # the shipped grid's NaN of a group of one: not recomputed here
                got = _grid._EXTRA_POINT[kind](case, p, {})
                want = case["expected"][c0["grid"][k]]
                for (g, gc, gn), (w, wc, wn) in zip(got, want):
                    assert torch.equal(gc, wc) and torch.equal(gn, wn), (kind, case["name"], pt)
                    assert torch.allclose(g, w, rtol=1e-5, atol=1e-5), (kind, case["name"], pt)


def test_group_advantages_whole_batch_normalisation_is_named():
    rep = check_implementation(lambda s, g: (s - s.mean()) / (s.std() + 1e-6), "group_advantages")
    assert not rep.passed
    assert rep.differences[0].startswith(
        "whole-batch normalisation: yours subtracts the mean and divides by the std of the whole "
        "batch; agentic_rl.group_advantages normalises each group by its own mean and std"), rep
    assert not any("no known convention" in d for d in rep.differences)
    assert len(rep.differences) == 2 and rep.differences[1].startswith("e.g. on case 'binary'")


def test_clip_bug_report_is_short():
    def optimistic(logprobs, old_logprobs, advantages, mask, epsilon=0.2, epsilon_high=0.2):
        ratio = torch.exp(logprobs - old_logprobs)
        lm = torch.minimum(-advantages * ratio,
                           -advantages * ratio.clamp(1 - epsilon, 1 + epsilon_high))
        return L.aggregate(lm, mask)
    r = check_implementation(optimistic, "policy_loss")
    first = r.differences[0]
    assert first.startswith("clipped surrogate: yours is min(-A*ratio, -A*clip(ratio))")
    assert first.endswith(
        "(so do TRL GRPO loss, loss_type='bnpo' and verl "
        "compute_policy_loss_vanilla (dual clip 3), agg 'token-mean', and 8 more)")
    assert len(r.differences) == 2 and r.differences[1].startswith("e.g. on case 'symmetric'")
    assert len(" ".join(r.differences)) < 600
