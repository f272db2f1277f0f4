"""Hidden checks of the GRPO assignment (carried by the autograder; the student never sees them).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. Expected values are recorded from ``agentic_rl`` (``grpo_reference.json``)
or derived by hand in the check.
"""

from __future__ import annotations

import pathlib
import statistics

import torch
from gradelib import CheckFailed, References, call, check, convention_hint, expect_close, fail

REFS = References(pathlib.Path(__file__).with_name("grpo_reference.json"), {
    "group_advantages": "agentic_rl.advantages:group_advantages",
    "aggregate": "agentic_rl.losses:aggregate",
})
ADVANTAGES = ("agentic_rl.advantages:group_advantages",)
AGGREGATE = ("agentic_rl.losses:aggregate",)
CLIPPED = ("agentic_rl.losses:policy_loss",)


def _random_groups(seed: int):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([7, 7, 7, 7, 2, 2, 2, 9, 5, 5, 5, 5, 5, 5])  # non-contiguous; 9 is alone
    scores = torch.randint(0, 3, (len(ids),), generator=gen).double() / 2
    scores[4:7] = 1.0  # an all-equal group
    return scores, ids


def _biased_std_advantages(scores, ids, scale: str, eps: float = 1e-6):
    """Eq. grpo-adv with the *biased* std (divide by G): the estimator's typical slip, by hand."""
    s = scores.double()
    adv = torch.zeros_like(s)
    for g in torch.unique(ids):
        rows = ids == g
        centred = s[rows] - s[rows].mean()
        if scale == "group":
            centred = centred / (s[rows].std(unbiased=False) + eps)
        adv[rows] = centred
    return adv / (s.std(unbiased=False) + eps) if scale == "batch" else adv


# --- q1: group_advantages -------------------------------------------------------------------
# Points (master), argued from what each slip breaks in training:
# - unbiased_std 1: a biased std (divide by G) rescales a group's advantages by sqrt(G/(G-1)),
#   about a learning-rate change (x1.15 at G = 4): close to right, so it costs only this check.
# - all_equal_group_is_zero 0.5: NaN on an all-equal group poisons the whole batch's gradient;
#   many_groups has such a group too, so that slip also loses the structure checks below.
# - many_groups 'group' 3: no groups (whole-batch mean and std) or mixed-up groups compare
#   answers to other prompts' answers: the baseline is gone, GRPO is broken. The most points.
# - many_groups 'batch' 1 and 'none' 0.5: the same structure for the two other scales (Dr. GRPO
#   keeps only the group mean); both are accepted with either std estimator.


@check("group_advantages", ADVANTAGES)
def unbiased_std(fn):
    got = call(fn, "group_advantages", torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.zeros(4))
    want = torch.tensor([1.0, -1.0, -1.0, 1.0]) * 0.5 / (3 ** -0.5 + 1e-6)
    expect_close("group_advantages", got, want,
                 "rewards (1, 0, 0, 1) in one group: the std must be the unbiased one "
                 "(divide by G-1), so the advantages are +-0.866, not +-1", atol=1e-4)


@check("group_advantages", ADVANTAGES)
def all_equal_group_is_zero(fn):
    got = call(fn, "group_advantages", torch.ones(4), torch.zeros(4))
    expect_close("group_advantages", got, torch.zeros(4), "an all-equal group (eps is added to "
                 "the std, so 0 / eps = 0, not NaN)", atol=0)


@check("group_advantages", ADVANTAGES)
def many_groups(fn, scale: str):
    """Groups of sizes 4, 3 (all equal), 1 and 6 with arbitrary labels: the group structure,
    up to the std estimator (a biased std passes here and loses only `unbiased_std`'s point)."""
    for seed in range(3):
        scores, ids = _random_groups(seed)
        got = call(fn, "group_advantages", scores, ids, scale=scale)
        want = REFS("group_advantages", scores, ids, scale=scale)
        try:
            expect_close("group_advantages", got, want,
                         f"scale={scale!r} on groups of sizes 4, 3 (all equal), 1 and 6 (labels "
                         "7, 2, 9, 5): each row is centred and scaled by its own group",
                         hint=lambda: convention_hint(fn, "group_advantages"))
        except CheckFailed:
            biased = _biased_std_advantages(scores, ids, scale)
            if not (scale != "none" and isinstance(got, torch.Tensor)
                    and got.shape == biased.shape
                    and torch.allclose(got.detach().double(), biased, atol=1e-6, rtol=1e-5)):
                raise


# --- q2: aggregate ----------------------------------------------------------------------------


@check("aggregate", AGGREGATE)
def token_weights(fn, mode: str):
    """The chapter's example: a 2-token and a 6-token answer, loss 1 per token (eq. agg)."""
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    per_token = torch.ones(2, 6, requires_grad=True)
    out = call(fn, "aggregate", per_token, mask, mode, norm_constant=6)
    if not isinstance(out, torch.Tensor) or out.numel() != 1 or not out.requires_grad:
        fail(f"`aggregate` must return a scalar tensor that keeps the graph (mode {mode!r}).")
    out.backward()
    want = {"seq-mean-token-mean": (1 / 4, 1 / 12), "token-mean": (1 / 8, 1 / 8),
            "seq-mean-token-sum-norm": (1 / 12, 1 / 12)}[mode]
    got = (per_token.grad[0, 0].item(), per_token.grad[1, 0].item())
    if abs(got[0] - want[0]) > 1e-6 or abs(got[1] - want[1]) > 1e-6:
        fail(f"`aggregate` with mode {mode!r} weights the tokens wrongly: a token of the short "
             f"answer gets {got[0]:.4f} and one of the long answer {got[1]:.4f}; expected "
             f"{want[0]:.4f} and {want[1]:.4f} (a 2-token and a 6-token answer, L = 6).")
    if per_token.grad[0, 2:].abs().max() > 0:
        fail(f"`aggregate` with mode {mode!r} gives weight to padding (mask 0) positions.")


@check("aggregate", AGGREGATE)
def ragged_batches(fn):
    gen = torch.Generator().manual_seed(1)
    loss_mat = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 9, generator=gen) < 0.7).long()
    mask[:, 0] = 1
    empty_row = (torch.tensor([[2.0, 2.0], [5.0, 5.0], [1.0, 3.0]]),
                 torch.tensor([[1, 1], [0, 0], [1, 1]]))
    for mode in ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"):
        for norm in (9, 16):
            got = call(fn, "aggregate", loss_mat, mask, mode, norm_constant=norm)
            want = REFS("aggregate", loss_mat, mask, mode, norm_constant=norm)
            expect_close("aggregate", torch.as_tensor(got).reshape(()), want,
                         f"mode {mode!r}, norm_constant={norm}, a random ragged mask")
        if mode != "token-mean":
            got = call(fn, "aggregate", *empty_row, mode, norm_constant=2)
            want = REFS("aggregate", *empty_row, mode, norm_constant=2)
            expect_close("aggregate", torch.as_tensor(got).reshape(()), want,
                         f"mode {mode!r} with a row that has no generated token: a sequence "
                         "mean is over the rows that have at least one token")


# --- q3: clipped_token_loss -------------------------------------------------------------------


@check("clipped_token_loss", CLIPPED)
def clipped_values_and_gradient(fn):
    ratios = torch.tensor([0.6, 0.9, 1.0, 1.1, 1.3])
    adv = torch.tensor([[+1.0], [-1.0]]).expand(2, 5)
    old = torch.full((2, 5), -1.0)
    new = (old + ratios.log()).requires_grad_()
    got = call(fn, "clipped_token_loss", new, old, adv, epsilon=0.2)
    want = -torch.minimum(ratios * adv, ratios.clamp(0.8, 1.2) * adv)
    expect_close("clipped_token_loss", got, want, "ratios (0.6, 0.9, 1.0, 1.1, 1.3) with "
                 "A = +1 and A = -1 (loss = -min(rho A, clip(rho, 1-eps, 1+eps) A), per token)",
                 atol=1e-5, hint=lambda: convention_hint(
                     lambda lp, o, a, m, epsilon=0.2: fn(lp, o, a, epsilon=epsilon),
                     "policy_loss"))
    (grad,) = torch.autograd.grad(got.sum(), new)
    clipped = ((adv > 0) & (ratios > 1.2)) | ((adv < 0) & (ratios < 0.8))
    if grad[clipped].abs().max() > 1e-7 or (grad[~clipped] == 0).any():
        fail("`clipped_token_loss` has the right values but the wrong gradient: only tokens "
             "where the clip binds (rho > 1+eps with A > 0, rho < 1-eps with A < 0) may get "
             "zero gradient.")


# --- q4: the length experiment ----------------------------------------------------------------


@check("aggregate", AGGREGATE)
def _aggregate_is_honest(fn):
    """Only the integrity check of `aggregate` (the experiment uses both functions)."""


@check("group_advantages", ADVANTAGES)
def length_experiment(group_advantages, *, ns: dict):
    from toy_length import length_experiment as experiment

    _aggregate_is_honest(ns)
    aggregate = ns["aggregate"]

    def run(scale, mode):
        ga = lambda *a, **k: call(group_advantages, "group_advantages", *a, **k)  # noqa: E731
        ag = lambda *a, **k: call(aggregate, "aggregate", *a, **k)  # noqa: E731
        lengths = experiment(ga, ag, scale=scale, mode=mode, steps=100)
        return statistics.mean(lengths[:10]), statistics.mean(lengths[-10:])

    g0, g1 = run("group", "seq-mean-token-mean")
    if not g1 > 2 * g0:
        fail(f"GRPO (scale='group', seq-mean-token-mean) with your functions does not show the "
             f"length bias: the wrong answers' mean length went {g0:.1f} -> {g1:.1f} in 100 "
             "steps; expected more than doubling.")
    d0, d1 = run("none", "seq-mean-token-sum-norm")
    if not d1 < 1.3 * d0:
        fail(f"Dr. GRPO (scale='none', seq-mean-token-sum-norm) with your functions lets the "
             f"wrong answers grow: {d0:.1f} -> {d1:.1f}; expected less than x1.3.")
