"""Autograder for the GAE assignment: ``pytest labs/assignments/gae/`` (seconds on one CPU).

It runs the code cells tagged ``graded`` of ``gae_assignment.ipynb`` (or of the notebook named by
``$ASSIGNMENT_NOTEBOOK``) and checks the functions they define against ``agentic_rl`` and against
the behaviour the GAE chapter describes. Each failure is one sentence naming the function.
"""

from __future__ import annotations

import pathlib
import sys
from math import comb

import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _grading import (SubmissionError, call, convention_hints, expect_close, fail,  # noqa: E402
                      load_submission)

SETTINGS = [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)]


@pytest.fixture(scope="module")
def ns():
    torch.set_num_threads(1)
    try:
        return load_submission(HERE / "gae_assignment.ipynb")
    except SubmissionError as err:
        problem = str(err)
    fail(problem)


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


def _gae(ns, *args, **kwargs):
    out = call(ns, "gae", *args, **kwargs)
    if not (isinstance(out, tuple) and len(out) == 2):
        fail("`gae` must return a pair (advantages, returns)")
    return out


# --- Task 1: masked GAE -------------------------------------------------------------------------


@pytest.mark.parametrize("gamma,lam", SETTINGS)
def test_gae_matches_the_package_on_ragged_masks(ns, gamma, lam):
    from agentic_rl.advantages import gae

    for seed in range(3):
        r, v, m = _ragged(seed)
        adv, ret = _gae(ns, r, v, m, gamma=gamma, lam=lam)
        want_adv, want_ret = gae(r, v, m, gamma=gamma, lam=lam)
        what = f"gamma={gamma}, lam={lam} on random ragged masks"
        hint = lambda: convention_hints(ns["gae"], "gae")  # noqa: E731
        expect_close("gae", adv, want_adv, f"the advantages, {what}", atol=1e-8, hint=hint)
        expect_close("gae", ret, want_ret, f"the returns (advantages + values on mask-1 "
                     f"positions, 0 elsewhere), {what}", atol=1e-8, hint=hint)


def test_gae_skips_observation_tokens(ns):
    """With the mask, GAE on the whole row equals GAE on the row with the mask-0 columns deleted."""
    r, v, m = _ragged(5, rows=1, width=16)
    m[0, [1, 2, 4, 8, 9, 10, 13]] = torch.tensor([1, 1, 1, 1, 0, 1, 1])
    keep = m[0].bool()
    adv, _ = _gae(ns, r, v, m, gamma=0.99, lam=0.9)
    short, _ = _gae(ns, r[:, keep], v[:, keep], torch.ones(1, int(keep.sum())), gamma=0.99, lam=0.9)
    expect_close("gae", adv[:, keep], short, "a row with observation tokens (mask 0) between "
                 "the actions: they must be skipped *inside* the recursion, so the result "
                 "equals GAE on the row with those columns deleted (gamma=0.99, lam=0.9)",
                 atol=1e-8)
    if adv[0, ~keep].abs().max() > 0:
        fail("`gae` must give masked (mask 0) positions an advantage of exactly 0")


def test_gae_limits(ns):
    r = torch.tensor([[0.0, 0.0, 0.5, 0.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.6, 0.7, 0.4, 0.8, 0.9]], dtype=torch.float64)
    m = torch.ones_like(r)
    gamma = 0.9
    v_next = torch.cat([v[:, 1:], torch.zeros(1, 1, dtype=v.dtype)], 1)
    delta = r + gamma * v_next - v
    adv0, _ = _gae(ns, r, v, m, gamma=gamma, lam=0.0)
    expect_close("gae", adv0, delta, "lam=0, which must be the one-step TD error delta_t "
                 "(eq. gae-delta, with V = 0 after the last token)", atol=1e-8)
    returns = torch.tensor([[gamma ** (4 - t) * 1.0 + (0.5 * gamma ** (2 - t) if t <= 2 else 0.0)
                             for t in range(5)]], dtype=torch.float64)
    adv1, ret1 = _gae(ns, r, v, m, gamma=gamma, lam=1.0)
    expect_close("gae", adv1, returns - v, "lam=1, which must be Monte Carlo minus the baseline, "
                 "G_t - V(s_t)", atol=1e-8)


def test_gae_lambda_one_gradient_is_unbiased_with_a_wrong_critic(ns):
    """The chapter's coin game: 8 flips, reward 1 for at least 5 heads, a half-trained critic."""
    n_tok, need, p, n = 8, 5, 0.6, 20_000

    def v_true(t, h):
        k, left = need - h, n_tok - t
        return sum(comb(left, j) * p**j * (1 - p) ** (left - j) for j in range(max(k, 0), left + 1))

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
        adv, _ = _gae(ns, reward, critic, mask, gamma=1.0, lam=lam)
        g = score0 * adv[:, 0]
        se = g.std().item() / n**0.5
        if abs(g.mean().item() - target) > 4 * se:
            fail(f"`gae` with lam={lam} and a half-trained critic should give a policy-gradient "
                 f"estimate that is {claim}: expected {target:.4f} +- {4 * se:.4f}, "
                 f"got {g.mean().item():.4f}")


# --- Task 2: whitening --------------------------------------------------------------------------


def test_masked_whiten_matches_the_package(ns):
    from agentic_rl.advantages import masked_whiten

    r, _, m = _ragged(3)
    got = call(ns, "masked_whiten", r, m)
    expect_close("masked_whiten", got, masked_whiten(r, m), "random values and a ragged mask "
                 "(mean and *unbiased* variance over the mask-1 positions of the whole batch, eps "
                 "under the square root, 0 on masked positions)", atol=1e-8)


# --- Task 3: the clipped value loss -------------------------------------------------------------


def test_value_loss(ns):
    v_old = torch.zeros(1, 4, dtype=torch.float64)
    target = torch.ones(1, 4, dtype=torch.float64)
    v_new = torch.tensor([[0.1, 0.5, -0.1, -0.5]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 4)
    loss = call(ns, "value_loss", v_new, v_old, target, mask, cliprange_value=0.2)
    plain = (v_new - target) ** 2
    clipped = (v_old + (v_new - v_old).clamp(-0.2, 0.2) - target) ** 2
    want = 0.5 * torch.maximum(plain, clipped).mean()
    expect_close("value_loss", torch.as_tensor(loss).reshape(()), want.detach(),
                 "eq. value-loss with predictions that moved +0.1, +0.5, -0.1, -0.5 from 0 towards "
                 "a target of 1 (epsilon_V = 0.2)", atol=1e-8)
    (grad,) = torch.autograd.grad(loss, v_new)
    if grad[0, 1] != 0 or (grad[0, [0, 2, 3]] == 0).any():
        fail("`value_loss` has the wrong gradient: only the prediction that overshot the clip "
             "range towards the target (+0.5) may get zero gradient")
    mask2 = torch.tensor([[1, 1, 0, 0]])
    loss2 = call(ns, "value_loss", v_new.detach(), v_old, target, mask2, cliprange_value=0.2)
    want2 = 0.5 * torch.maximum(plain, clipped)[0, :2].mean()
    expect_close("value_loss", torch.as_tensor(loss2).reshape(()), want2.detach(),
                 "a mask with two valid positions (a token mean over the mask)", atol=1e-8)
