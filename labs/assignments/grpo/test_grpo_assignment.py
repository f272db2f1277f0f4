"""Autograder for the GRPO assignment: ``pytest labs/assignments/grpo/`` (seconds on one CPU).

It runs the code cells tagged ``graded`` of ``grpo_assignment.ipynb`` (or of the notebook named by
``$ASSIGNMENT_NOTEBOOK``) and checks the functions they define against ``agentic_rl`` and against
the behaviour the GRPO chapter describes. Each failure is one sentence naming the function.
"""

from __future__ import annotations

import pathlib
import statistics
import sys

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _grading import (SubmissionError, call, convention_hints, expect_close, fail,  # noqa: E402
                      load_submission)

MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


@pytest.fixture(scope="module")
def ns():
    torch.set_num_threads(1)
    try:
        return load_submission(HERE / "grpo_assignment.ipynb")
    except SubmissionError as err:
        problem = str(err)
    fail(problem)


def _random_groups(seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([7, 7, 7, 7, 2, 2, 2, 9, 5, 5, 5, 5, 5, 5])  # non-contiguous; 9 is alone
    scores = torch.randint(0, 3, (len(ids),), generator=gen).double() / 2
    scores[4:7] = 1.0  # an all-equal group
    return scores, ids


# --- Task 1: group_advantages -------------------------------------------------------------------


def test_group_advantages_unbiased_std(ns):
    got = call(ns, "group_advantages", torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4))
    want = torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / (3 ** -0.5 + 1e-6)
    expect_close("group_advantages", got, want,
                 "rewards (1, 0, 0, 1) in one group: the std must be the unbiased one "
                 "(divide by G-1), so the advantages are +-0.866, not +-1", atol=1e-4)


def test_group_advantages_all_equal_group_is_zero(ns):
    got = call(ns, "group_advantages", torch.ones(4), torch.zeros(4))
    expect_close("group_advantages", got, torch.zeros(4), "an all-equal group (eps is added to the "
                 "std, so 0 / eps = 0, not NaN)", atol=0)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_match_the_package(ns, scale):
    from agentic_rl.advantages import group_advantages

    for seed in range(3):
        scores, ids = _random_groups(seed)
        got = call(ns, "group_advantages", scores, ids, scale=scale)
        hint = lambda: convention_hints(ns["group_advantages"], "group_advantages")  # noqa: E731
        expect_close("group_advantages", got, group_advantages(scores, ids, scale=scale),
                     f"scale={scale!r} on groups of sizes 4, 3 (all equal), 1 and 6", hint=hint)


# --- Task 2: aggregate --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_token_weights(ns, mode):
    """The chapter's example: a 2-token and a 6-token answer, loss 1 per token (eq. agg)."""
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    per_token = torch.ones(2, 6, requires_grad=True)
    out = call(ns, "aggregate", per_token, mask, mode, norm_constant=6)
    if not isinstance(out, torch.Tensor) or out.numel() != 1 or not out.requires_grad:
        fail(f"`aggregate` must return a scalar tensor that keeps the graph (mode {mode!r})")
    out.backward()
    want = {"seq-mean-token-mean": (1 / 4, 1 / 12), "token-mean": (1 / 8, 1 / 8),
            "seq-mean-token-sum-norm": (1 / 12, 1 / 12)}[mode]
    got = (per_token.grad[0, 0].item(), per_token.grad[1, 0].item())
    if abs(got[0] - want[0]) > 1e-6 or abs(got[1] - want[1]) > 1e-6:
        fail(f"`aggregate` with mode {mode!r} gives a token of the short answer weight "
             f"{got[0]:.4f} and one of the long answer {got[1]:.4f}; expected {want[0]:.4f} "
             f"and {want[1]:.4f}")
    if per_token.grad[0, 2:].abs().max() > 0:
        fail(f"`aggregate` with mode {mode!r} gives weight to padding (mask 0) positions")


@pytest.mark.parametrize("mode", MODES)
def test_aggregate_matches_the_package(ns, mode):
    from agentic_rl.losses import aggregate

    gen = torch.Generator().manual_seed(1)
    loss_mat = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 9, generator=gen) < 0.7).long()
    mask[:, 0] = 1
    for norm in (9, 16):
        got = call(ns, "aggregate", loss_mat, mask, mode, norm_constant=norm)
        want = aggregate(loss_mat, mask, mode, norm_constant=norm)
        expect_close("aggregate", torch.as_tensor(got).reshape(()), want,
                     f"mode {mode!r}, norm_constant={norm}, random ragged mask",
                     hint=lambda: convention_hints(
                         lambda lm, m: ns["aggregate"](lm, m, mode), "aggregate"))


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregate_rows_without_tokens_do_not_count(ns, mode):
    from agentic_rl.losses import aggregate

    loss_mat = torch.tensor([[2.0, 2.0], [5.0, 5.0], [1.0, 3.0]])
    mask = torch.tensor([[1, 1], [0, 0], [1, 1]])
    got = call(ns, "aggregate", loss_mat, mask, mode, norm_constant=2)
    want = aggregate(loss_mat, mask, mode, norm_constant=2)
    expect_close("aggregate", torch.as_tensor(got).reshape(()), want,
                 f"mode {mode!r} with a row that has no generated token: a sequence mean is "
                 "over the rows that have at least one token", atol=1e-6)


# --- Task 3: clipped_token_loss -----------------------------------------------------------------


def test_clipped_token_loss_values_and_gradient(ns):
    ratios = torch.tensor([0.6, 0.9, 1.0, 1.1, 1.3])
    adv = torch.tensor([[+1.0], [-1.0]]).expand(2, 5)
    old = torch.full((2, 5), -1.0)
    new = (old + ratios.log()).requires_grad_()
    got = call(ns, "clipped_token_loss", new, old, adv, epsilon=0.2)
    want = -torch.minimum(ratios * adv, ratios.clamp(0.8, 1.2) * adv)
    hint = lambda: convention_hints(  # noqa: E731
        lambda lp, old, a, m, epsilon=0.2: ns["clipped_token_loss"](lp, old, a, epsilon=epsilon),
        "policy_loss")
    expect_close("clipped_token_loss", got, want, "ratios (0.6, 0.9, 1.0, 1.1, 1.3) with "
                 "A = +1 and A = -1 (loss = -min(rho A, clip(rho, 1-eps, 1+eps) A), per token)",
                 atol=1e-5, hint=hint)
    (grad,) = torch.autograd.grad(got.sum(), new)
    clipped = ((adv > 0) & (ratios > 1.2)) | ((adv < 0) & (ratios < 0.8))
    if grad[clipped].abs().max() > 1e-7 or (grad[~clipped] == 0).any():
        fail("`clipped_token_loss` has the right values but the wrong gradient: only tokens "
             "where the clip binds (rho > 1+eps with A > 0, rho < 1-eps with A < 0) may get "
             "zero gradient")


# --- Task 4: Dr. GRPO stops the wrong answers from growing --------------------------------------


def test_dr_grpo_stops_wrong_answers_growing(ns):
    from toy_length import length_experiment

    def run(scale, mode):
        ga = lambda *a, **k: call(ns, "group_advantages", *a, **k)  # noqa: E731
        ag = lambda *a, **k: call(ns, "aggregate", *a, **k)  # noqa: E731
        lengths = length_experiment(ga, ag, scale=scale, mode=mode, steps=100)
        return statistics.mean(lengths[:10]), statistics.mean(lengths[-10:])

    g0, g1 = run("group", "seq-mean-token-mean")
    if not g1 > 2 * g0:
        fail(f"with your `group_advantages` and `aggregate`, GRPO (scale='group', "
             f"seq-mean-token-mean) should make the wrong answers of the toy grow (the length "
             f"bias): mean length went {g0:.1f} -> {g1:.1f}, expected more than doubling")
    d0, d1 = run("none", "seq-mean-token-sum-norm")
    if not d1 < 1.3 * d0:
        fail(f"with your `group_advantages` and `aggregate`, Dr. GRPO (scale='none', "
             f"seq-mean-token-sum-norm) should keep the wrong answers' length flat: it went "
             f"{d0:.1f} -> {d1:.1f}, expected less than x1.3")
