"""Hand-computed checks of the advantage estimators in ``agentic_rl.advantages``.

Every expected number is derived in a comment next to it, so each test pins one convention.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from agentic_rl.advantages import (
    explained_variance, gae, group_advantages, masked_whiten, rloo_advantages,
)

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


# ------------------------------------------------------------------------ group_advantages (GRPO)


def test_group_scale_uses_unbiased_std():
    # scores [1,0,0,1], one group: mean .5, deviations ±.5, sum of squares 1.
    # unbiased var = 1/3 -> std = sqrt(1/3) = 0.57735 -> A = ±0.5/0.57735 = ±0.86603 (eps=0)
    # biased   var = 1/4 -> std = 0.5                -> A = ±1.0 (what we must NOT get)
    scores = t([1.0, 0.0, 0.0, 1.0])
    adv = group_advantages(scores, torch.zeros(4, dtype=torch.long), scale="group", eps=0.0)
    a = 0.5 * math.sqrt(3.0)  # 0.8660254
    assert_close(adv, t([a, -a, -a, a]))
    assert not torch.allclose(adv, t([1.0, -1.0, -1.0, 1.0]))


def test_group_scale_default_eps_is_added_to_std():
    # same scores, default eps = 1e-6: A = 0.5 / (0.5773503 + 1e-6) = 0.8660239
    scores = t([1.0, 0.0, 0.0, 1.0])
    adv = group_advantages(scores, torch.zeros(4, dtype=torch.long))
    a = 0.5 / (math.sqrt(1.0 / 3.0) + 1e-6)
    assert_close(adv, t([a, -a, -a, a]), rtol=1e-12, atol=1e-12)


def test_eps_added_to_std_not_under_sqrt():
    # scores [0,2]: mean 1, deviations ±1, unbiased var = 2/1 = 2, std = 1.41421.
    # eps=0.5 on the std: A = ±1/(1.41421+0.5) = ±0.52241
    # eps under sqrt would give ±1/sqrt(2.5) = ±0.63246 (must NOT be this)
    adv = group_advantages(t([0.0, 2.0]), torch.tensor([0, 0]), scale="group", eps=0.5)
    assert_close(adv, t([-0.5224077499274828, 0.5224077499274828]))
    assert not torch.allclose(adv, t([-0.6324555320336759, 0.6324555320336759]))


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_all_equal_group_gives_exactly_zero(scale, dtype):
    # group 0 = [3,3,3]: deviations all exactly 0 -> 0/(0+eps) = 0 exactly, never NaN.
    # group 1 = [0,1] is there so the batch std is non-zero.
    scores = t([3.0, 3.0, 3.0, 0.0, 1.0], dtype=dtype)
    ids = torch.tensor([0, 0, 0, 1, 1])
    adv = group_advantages(scores, ids, scale=scale)
    assert adv.dtype == dtype
    assert torch.equal(adv[:3], torch.zeros(3, dtype=dtype))
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_of_one_gets_zero(scale):
    # singleton group 5 = [7.0]: mean 7, deviation 0, std 0 (not NaN from an N-1 = 0 divisor)
    # -> 0/(0 + 1e-6) = 0.  group 1 = [0,2] (mean 1, dev ±1) stays non-zero.
    adv = group_advantages(t([7.0, 0.0, 2.0]), torch.tensor([5, 1, 1]), scale=scale)
    assert adv[0].item() == 0.0
    assert torch.isfinite(adv).all()
    if scale == "group":  # ±1/(sqrt(2) + 1e-6) = ±0.70711
        r = 1.0 / (math.sqrt(2.0) + 1e-6)
        assert_close(adv, t([0.0, -r, r]))


def test_non_contiguous_group_ids():
    # ids 7, -2, 100 (unsorted, negative, gaps).
    # group 7   = rows 0,2: [1,3] mean 2, dev ∓1, var 2/1 = 2, std sqrt2 -> ∓0.70711
    # group -2  = rows 1,3: [4,0] mean 2, dev ±2, var 8/1 = 8, std 2sqrt2 -> ±0.70711
    # group 100 = row 4 alone -> 0   (default eps 1e-6 on the std: r = 1/(sqrt2 + 1e-6))
    scores = t([1.0, 4.0, 3.0, 0.0, 5.0])
    ids = torch.tensor([7, -2, 7, -2, 100])
    adv = group_advantages(scores, ids)
    r1 = 1.0 / (math.sqrt(2.0) + 1e-6)
    r2 = 2.0 / (2.0 * math.sqrt(2.0) + 1e-6)
    assert_close(adv, t([-r1, r2, r1, -r2, 0.0]))
    # relabelling the groups 0..2 changes nothing
    assert_close(group_advantages(scores, torch.tensor([0, 1, 0, 1, 2])), adv)


def test_batch_scale_divides_group_centred_scores_by_batch_unbiased_std():
    # scores [0,2 | 10,14]: group means 1 and 12 -> centred [-1, 1, -2, 2]  (mean is the GROUP mean)
    # batch: mean 6.5, dev [-6.5,-4.5,3.5,7.5], squares 42.25+20.25+12.25+56.25 = 131,
    # unbiased var 131/3 = 43.6667, std 6.60808 -> A = [-0.15133, 0.15133, -0.30266, 0.30266]
    scores = t([0.0, 2.0, 10.0, 14.0])
    adv = group_advantages(scores, torch.tensor([0, 0, 1, 1]), scale="batch", eps=0.0)
    sd = math.sqrt(131.0 / 3.0)
    assert_close(adv, t([-1.0 / sd, 1.0 / sd, -2.0 / sd, 2.0 / sd]))
    # eps is added to the batch std too: eps = 1 -> divisor 7.60808
    adv_eps = group_advantages(scores, torch.tensor([0, 0, 1, 1]), scale="batch", eps=1.0)
    assert_close(adv_eps, t([-1.0, 1.0, -2.0, 2.0]) / (sd + 1.0))


def test_none_scale_is_dr_grpo_group_centring_only():
    # same scores: r - group mean = [-1, 1, -2, 2]; eps is unused
    scores = t([0.0, 2.0, 10.0, 14.0])
    adv = group_advantages(scores, torch.tensor([0, 0, 1, 1]), scale="none", eps=123.0)
    assert_close(adv, t([-1.0, 1.0, -2.0, 2.0]))


def test_unknown_scale_raises():
    with pytest.raises(ValueError):
        group_advantages(t([0.0, 1.0]), torch.tensor([0, 0]), scale="std")


# --------------------------------------------------------------------------- rloo_advantages


def test_rloo_leave_one_out_hand_computed():
    # group 0 = [1,2,6]: others' means 4, 3.5, 1.5 -> A = [-3, -1.5, 4.5]
    #   check: G/(G-1) (r - mean) = 1.5 * ([1,2,6] - 3) = [-3, -1.5, 4.5]
    # group 9 = [4] alone -> 0
    adv = rloo_advantages(t([1.0, 2.0, 6.0, 4.0]), torch.tensor([0, 0, 0, 9]))
    assert_close(adv, t([-3.0, -1.5, 4.5, 0.0]))


def test_rloo_equals_scaled_grpo_none_on_random_groups():
    g = torch.Generator().manual_seed(0)
    sizes = [2, 3, 5, 8]
    ids = torch.cat([torch.full((n,), 10 * k) for k, n in enumerate(sizes)])
    ids = ids[torch.randperm(len(ids), generator=g)]  # interleaved, non-contiguous
    scores = torch.randn(len(ids), generator=g, dtype=F64)
    centred = group_advantages(scores, ids, scale="none")
    G = torch.tensor([sizes[int(i) // 10] for i in ids], dtype=F64)
    assert_close(rloo_advantages(scores, ids), G / (G - 1) * centred)


# --------------------------------------------------------------------------- gae


def reference_gae(rewards, values, mask, gamma, lam):
    """Textbook GAE on each row's compacted valid tokens, scattered back; plain Python floats."""
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for b in range(B):
        idx = [j for j in range(T) if mask[b][j]]
        r = [rewards[b][j] for j in idx]
        v = [values[b][j] for j in idx]
        n = len(idx)
        a = [0.0] * n
        running = 0.0
        for k in range(n - 1, -1, -1):
            v_next = v[k + 1] if k + 1 < n else 0.0
            delta = r[k] + gamma * v_next - v[k]
            running = delta + gamma * lam * running
            a[k] = running
        for k, j in enumerate(idx):
            adv[b][j] = a[k]
            ret[b][j] = a[k] + v[k]
    return adv, ret


def test_gae_hand_computed_with_masked_observation_column():
    # valid tokens: r = [0, 0, 1], V = [.5, .6, .7], gamma .9, lam .8 (gamma*lam = .72)
    # delta2 = 1 + 0 - .7 = .3                  A2 = .3
    # delta1 = 0 + .9*.7 - .6 = .03             A1 = .03 + .72*.3   = .246
    # delta0 = 0 + .9*.6 - .5 = .04             A0 = .04 + .72*.246 = .21712
    # returns = A + V = [.71712, .846, 1.0]
    # column 1, a masked observation with junk reward/value, is skipped: A = return = 0 there.
    rewards = t([[0.0, 5.0, 0.0, 1.0]])
    values = t([[0.5, 9.9, 0.6, 0.7]])
    mask = t([[1.0, 0.0, 1.0, 1.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert_close(adv, t([[0.21712, 0.0, 0.246, 0.3]]))
    assert_close(ret, t([[0.71712, 0.0, 0.846, 1.0]]))


def test_gae_lam_zero_is_one_step_td_over_valid_tokens():
    # lam = 0: A_t = r_t + gamma V_next_valid - V_t.  gamma = .5, mask [1,0,1,1,0]
    # t=3: 2 + .5*0  - 4  = -2       (last valid -> next value 0; trailing pad skipped)
    # t=2: 0 + .5*4  - 3  = -1
    # t=0: 1 + .5*3  - 1  = 1.5      (next valid is t=2, the V=100 at t=1 is skipped)
    rewards = t([[1.0, 7.0, 0.0, 2.0, 9.0]])
    values = t([[1.0, 100.0, 3.0, 4.0, 50.0]])
    mask = t([[1.0, 0.0, 1.0, 1.0, 0.0]])
    adv, _ = gae(rewards, values, mask, gamma=0.5, lam=0.0)
    assert_close(adv, t([[1.5, 0.0, -1.0, -2.0, 0.0]]))


def test_gae_lam_one_gamma_one_final_reward_is_return_minus_value():
    # lam = gamma = 1, only final reward R = 3: A_t = R - V_t on every valid token
    # (telescoping sum of deltas). Masked: prompt column 0, observation column 3, padding column 6.
    R = 3.0
    rewards = t([[0.0, 0.0, 0.0, 0.0, 0.0, R, 0.0]])
    values = t([[8.0, 0.2, -0.4, 6.0, 1.1, 2.5, 7.0]])
    mask = t([[0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert_close(adv, t([[0.0, 2.8, 3.4, 0.0, 1.9, 0.5, 0.0]]))
    # returns are the Monte-Carlo return R on valid tokens, 0 elsewhere
    assert_close(ret, t([[0.0, R, R, 0.0, R, R, 0.0]]))


def test_gae_inserting_masked_columns_changes_nothing_on_valid_tokens():
    g = torch.Generator().manual_seed(1)
    T = 6
    rewards = torch.randn(1, T, generator=g, dtype=F64)
    values = torch.randn(1, T, generator=g, dtype=F64)
    base_adv, base_ret = gae(rewards, values, torch.ones(1, T, dtype=F64), gamma=0.95, lam=0.9)
    # insert junk masked columns at the start, between tokens 1|2 (two), between 4|5, and at the end
    positions = [0, 2, 2, 5, 6]
    r_cols, v_cols, m_cols = list(rewards[0]), list(values[0]), [1.0] * T
    for p in sorted(positions, reverse=True):
        r_cols.insert(p, torch.tensor(42.0, dtype=F64))
        v_cols.insert(p, torch.tensor(-17.0, dtype=F64))
        m_cols.insert(p, 0.0)
    r2, v2, m2 = torch.stack(r_cols)[None], torch.stack(v_cols)[None], t([m_cols])
    adv2, ret2 = gae(r2, v2, m2, gamma=0.95, lam=0.9)
    valid = m2[0].bool()
    assert_close(adv2[0, valid], base_adv[0])
    assert_close(ret2[0, valid], base_ret[0])
    assert torch.equal(adv2[0, ~valid], torch.zeros(len(positions), dtype=F64))
    assert torch.equal(ret2[0, ~valid], torch.zeros(len(positions), dtype=F64))


@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (1.0, 1.0), (0.7, 0.0), (0.0, 0.5)])
def test_gae_matches_reference_loop_on_random_masked_batches(gamma, lam):
    g = torch.Generator().manual_seed(2)
    B, T = 7, 13
    rewards = torch.randn(B, T, generator=g, dtype=F64)
    values = torch.randn(B, T, generator=g, dtype=F64)
    mask = (torch.rand(B, T, generator=g) < 0.6).to(F64)
    mask[0] = 0.0  # a row with no valid token
    mask[1] = 1.0  # a fully valid row
    mask[2, :4] = 0.0  # prompt prefix
    mask[2, -3:] = 0.0  # trailing padding
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = reference_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    assert_close(adv, t(ref_adv))
    assert_close(ret, t(ref_ret))
    # returns = advantages + values on valid tokens; both 0 on masked tokens
    assert_close(ret * mask, (adv + values) * mask)
    assert torch.equal(adv[mask == 0], torch.zeros_like(adv[mask == 0]))
    assert torch.equal(ret[mask == 0], torch.zeros_like(ret[mask == 0]))


@pytest.mark.parametrize("gamma,lam", [(1.01, 0.9), (-0.1, 0.9), (0.9, 1.5), (0.9, -0.01)])
def test_gae_rejects_gamma_or_lam_outside_unit_interval(gamma, lam):
    x = torch.zeros(1, 3, dtype=F64)
    with pytest.raises(ValueError):
        gae(x, x, torch.ones_like(x), gamma=gamma, lam=lam)


# --------------------------------------------------------------------------- masked_whiten


def test_masked_whiten_unbiased_var_eps_under_sqrt_and_zero_on_mask():
    # valid x = [1,2,3] (the 100 is masked): mean 2, unbiased var (1+0+1)/2 = 1
    # eps = 0: [-1, 0, 1, 0]   (biased var 2/3 would give ±1.22474)
    x = t([[1.0, 2.0], [3.0, 100.0]])
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    assert_close(masked_whiten(x, mask, eps=0.0), t([[-1.0, 0.0], [1.0, 0.0]]))
    # eps = 3 sits under the sqrt: (x-2)/sqrt(1+3) = ±0.5   (std+eps would give ±0.25)
    assert_close(masked_whiten(x, mask, eps=3.0), t([[-0.5, 0.0], [0.5, 0.0]]))


def test_explained_variance_uses_the_variance_of_the_residual():
    # verl / Stable-Baselines3: 1 - Var(R - V) / Var(R). A critic right up to a constant offset
    # explains all the variance (1.0); the mean-square form 1 - mean((R - V)^2) / Var(R) would give
    # 1 - 4/1.25 < 0.
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # the last column is padding
    assert explained_variance(returns + 2.0, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)
    gen = torch.Generator().manual_seed(0)
    r, v = torch.randn(4, 7, generator=gen), torch.randn(4, 7, generator=gen)
    m = (torch.rand(4, 7, generator=gen) > 0.3).float()
    rv, vv = r[m.bool()].double(), v[m.bool()].double()
    expected = 1 - torch.var(rv - vv) / torch.var(rv)
    assert explained_variance(v, r, m) == pytest.approx(expected.item())
    assert math.isnan(explained_variance(v, torch.ones_like(r), m))  # returns that do not vary
