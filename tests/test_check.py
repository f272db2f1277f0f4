"""check_implementation: the package's own functions pass; deliberately wrong variants fail with the
convention that differs named; a function that raises or returns the wrong shape is reported, never
a traceback from the checker. The reference cases are data: neither verl nor TRL is needed here."""

from __future__ import annotations

import functools

import pytest
import torch

from agentic_rl import advantages as A
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
    assert not r.passed and len(r.differences) == 3 and r.matches == []
    assert r.differences[0].startswith("on case 'binary' (0/1 rewards")
    assert "your output matches no known convention: got [0.51, -1.5, 0.51" in r.differences[0]
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
