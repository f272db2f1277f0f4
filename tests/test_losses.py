"""Hand-computed checks of aggregation, the clipped PPO/GRPO surrogate and the KL estimators."""

from __future__ import annotations


import pytest
import torch
from torch.testing import assert_close

from agentic_rl.losses import (
    aggregate,
    clip_region,
    kl_penalty,
    policy_loss,
    resolve_agg_mode,
)

F64 = torch.float64


def t(values, dtype=F64):
    return torch.tensor(values, dtype=dtype)


def scalar(x):
    return torch.tensor(x, dtype=F64)


# --------------------------------------------------------------------------- aggregate

# row 0: two valid tokens (1, 2); row 1: four valid tokens (5..8); row 2: no valid token (junk 9s).
LOSS = t([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
MASK = t([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
# row sums 3 and 26 (29 in all), lengths 2 and 4 (6 in all), B' = 2 rows with a valid token.


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", 29.0 / 6.0),  # 4.83333
        ("token-sum", 29.0),
        ("seq-mean-token-mean", (3.0 / 2.0 + 26.0 / 4.0) / 2.0),  # (1.5 + 6.5)/2 = 4.0, not 8/3
        ("seq-mean-token-sum", (3.0 + 26.0) / 2.0),  # 14.5, not 29/3
        ("seq-mean-token-sum-norm", (3.0 + 26.0) / 2.0 / 4.0),  # 14.5 / T=4 = 3.625
    ],
)
def test_aggregate_modes_hand_computed_with_empty_row(mode, expected):
    assert_close(aggregate(LOSS, MASK, mode), scalar(expected))


def test_aggregate_sum_norm_uses_norm_constant_when_given():
    # 14.5 / 10 = 1.45 (instead of / padded width 4)
    assert_close(aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm_constant=10), scalar(1.45))


@pytest.mark.parametrize(
    "alias,mode",
    [("grpo", "seq-mean-token-mean"), ("bnpo", "token-mean"), ("dapo", "token-mean"),
     ("dr_grpo", "seq-mean-token-sum-norm")],
)
def test_trl_loss_type_aliases(alias, mode):
    assert resolve_agg_mode(alias) == mode
    assert_close(aggregate(LOSS, MASK, alias), aggregate(LOSS, MASK, mode))


def test_unknown_aggregation_raises():
    with pytest.raises(ValueError):
        resolve_agg_mode("seq-sum")
    with pytest.raises(ValueError):
        aggregate(LOSS, MASK, "seq-sum")


# --------------------------------------------------------------------------- policy_loss


def per_token(rhos, advs, **kw):
    """Loss and d loss / d logprobs of independent tokens (token-sum, so the gradient is per
    token)."""
    old = torch.zeros(1, len(rhos), dtype=F64)
    logp = torch.log(t([rhos])).requires_grad_(True)
    loss, metrics = policy_loss(logp, old, t([advs]), torch.ones_like(old), agg="token-sum", **kw)
    loss.backward()
    return loss.detach(), logp.grad[0], metrics


def test_inside_band_value_and_gradient_is_minus_a_rho():
    # rho 1.1, A 2: l = -2.2, dl/dlogp = -A*rho = -2.2
    # rho 0.9, A -1: l = 0.9, dl/dlogp = 0.9 ; sum = -1.3
    loss, grad, m = per_token([1.1, 0.9], [2.0, -1.0])
    assert_close(loss, scalar(-1.3))
    assert_close(grad, t([-2.2, 0.9]))
    assert m["clip_ratio"] == 0.0


def test_ratio_above_upper_bound_with_positive_advantage_is_clipped():
    # rho 1.5, A 1, eps .2: max(-1.5, -1.2) = -1.2 (clipped branch) -> gradient 0
    loss, grad, m = per_token([1.5], [1.0])
    assert_close(loss, scalar(-1.2))
    assert torch.equal(grad, t([0.0]))
    assert (m["clip_ratio"], m["clip_ratio_high"], m["clip_ratio_low"]) == (1.0, 1.0, 0.0)


def test_ratio_below_lower_bound_with_negative_advantage_is_clipped():
    # rho .5, A -1, eps .2: max(0.5, 0.8) = 0.8 (clipped branch) -> gradient 0
    loss, grad, m = per_token([0.5], [-1.0])
    assert_close(loss, scalar(0.8))
    assert torch.equal(grad, t([0.0]))
    assert (m["clip_ratio"], m["clip_ratio_high"], m["clip_ratio_low"]) == (1.0, 0.0, 1.0)


def test_pessimistic_side_is_not_clipped():
    # rho 1.5, A -1: max(1.5, 1.2) = 1.5, grad -A*rho = 1.5 (ratio moved the wrong way: keep
    # gradient)
    # rho 0.5, A  1: max(-0.5, -0.8) = -0.5, grad -0.5 ; sum 1.0
    loss, grad, m = per_token([1.5, 0.5], [-1.0, 1.0])
    assert_close(loss, scalar(1.0))
    assert_close(grad, t([1.5, -0.5]))
    assert m["clip_ratio"] == 0.0


def test_clip_higher_lets_ratio_1_25_through():
    # symmetric eps .2: rho 1.25, A 1 -> max(-1.25, -1.2) = -1.2, grad 0
    loss, grad, _ = per_token([1.25], [1.0], epsilon=0.2)
    assert_close(loss, scalar(-1.2))
    assert torch.equal(grad, t([0.0]))
    # eps_high .28: 1.25 < 1.28 -> l = -1.25, grad -1.25, not counted as clipped
    loss, grad, m = per_token([1.25], [1.0], epsilon=0.2, epsilon_high=0.28)
    assert_close(loss, scalar(-1.25))
    assert_close(grad, t([-1.25]))
    assert m["clip_ratio"] == 0.0
    # the lower bound stays 1 - eps = .8: rho .75, A -1 -> max(.75, .8) = .8, grad 0
    loss, grad, _ = per_token([0.75], [-1.0], epsilon=0.2, epsilon_high=0.28)
    assert_close(loss, scalar(0.8))
    assert torch.equal(grad, t([0.0]))


def test_dual_clip_bounds_negative_advantage_loss_value_and_gradient():
    # c = 3.
    # rho 5, A -1: PPO term max(5, 1.2) = 5, dual min(5, -A*c = 3) = 3, gradient 0
    # rho 2, A -1: PPO term 2 < 3, untouched, gradient -A*rho = 2
    # rho 5, A +1: A > 0 ignores dual clip: max(-5, -1.2) = -1.2, gradient 0
    # total = 3 + 2 - 1.2 = 3.8
    loss, grad, m = per_token([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0], dual_clip=3.0)
    assert_close(loss, scalar(3.8))
    assert_close(grad, t([0.0, 2.0, 0.0]))
    assert m["dual_clip_ratio"] == pytest.approx(1.0 / 3.0)
    # without dual clip the first token would contribute 5: 5 + 2 - 1.2 = 5.8, gradient 5
    loss, grad, m = per_token([5.0, 2.0, 5.0], [-1.0, -1.0, 1.0])
    assert_close(loss, scalar(5.8))
    assert_close(grad, t([5.0, 2.0, 0.0]))
    assert m["dual_clip_ratio"] == 0.0


def test_metrics_hand_computed_over_valid_tokens_only():
    # valid: (rho 1.1, A 1) inside the band; (rho .5, A -1) clipped low. Third token masked (junk).
    # clip_ratio 1/2, low 1/2, high 0; ratio_mean (1.1+.5)/2 = .8
    # approx_kl = mean(rho - 1 - ln rho): 0.1 - ln 1.1 = 0.0046898 ; -0.5 - ln .5 = 0.1931472
    #           -> 0.0989185
    logp = torch.log(t([[1.1, 0.5, 50.0]]))
    _, m = policy_loss(logp, torch.zeros_like(logp), t([[1.0, -1.0, 1.0]]), t([[1.0, 1.0, 0.0]]))
    assert m["clip_ratio"] == pytest.approx(0.5)
    assert m["clip_ratio_low"] == pytest.approx(0.5)
    assert m["clip_ratio_high"] == pytest.approx(0.0)
    assert m["ratio_mean"] == pytest.approx(0.8)
    assert m["approx_kl"] == pytest.approx((0.004689820195675 + 0.1931471805599453) / 2)


def test_approx_kl_is_unbiased_for_kl_old_to_new_on_samples_from_old():
    # The tokens a rollout scores were sampled by pi_old, so approx_kl must estimate KL(old || new)
    # from samples of pi_old. Draw many tokens from a categorical pi_old and compare with the
    # exact KL.
    # (The former 1/rho + log rho - 1 has expectation sum old^2/new - 1 - KL(old || new): not a KL.)
    gen = torch.Generator().manual_seed(0)
    old = torch.softmax(torch.randn(6, generator=gen, dtype=torch.float64), 0)
    new = torch.softmax(torch.log(old) + torch.randn(6, generator=gen, dtype=torch.float64), 0)
    exact = float((old * (old.log() - new.log())).sum())
    tokens = torch.multinomial(old, 200_000, replacement=True, generator=gen)
    logp, old_logp = new.log()[tokens][None], old.log()[tokens][None]
    _, m = policy_loss(logp, old_logp, torch.zeros_like(logp), torch.ones_like(logp))
    assert exact > 0.05
    assert m["approx_kl"] == pytest.approx(exact, rel=0.03)


@pytest.mark.parametrize("agg", ["token-mean", "token-sum", "seq-mean-token-mean",
                                 "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_gradient_is_zero_on_masked_tokens(agg):
    g = torch.Generator().manual_seed(3)
    B, T = 4, 6
    old = -torch.rand(B, T, generator=g, dtype=F64)
    logp = (old + 0.1 * torch.randn(B, T, generator=g, dtype=F64)).requires_grad_(True)
    adv = torch.randn(B, T, generator=g, dtype=F64)
    mask = t([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0]])
    loss, _ = policy_loss(logp, old, adv, mask, agg=agg, dual_clip=3.0)
    loss.backward()
    assert torch.equal(logp.grad[mask == 0], torch.zeros(int((mask == 0).sum()), dtype=F64))
    assert (logp.grad[mask == 1] != 0).any()
    # junk on masked positions leaves the loss unchanged
    junk = torch.where(mask.bool(), logp.detach(), torch.full_like(old, 30.0))
    loss_junk, _ = policy_loss(junk, old, adv, mask, agg=agg, dual_clip=3.0)
    assert_close(loss_junk, loss.detach())


@pytest.mark.parametrize("kw", [{"epsilon": 0.2, "epsilon_high": 0.1}, {"dual_clip": 1.0},
                                {"dual_clip": 0.5}])
def test_policy_loss_rejects_bad_clip_settings(kw):
    x = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError):
        policy_loss(x, x, x, torch.ones_like(x), **kw)


@pytest.mark.parametrize(
    "kw, dtype",
    [
        ({}, torch.float32),
        ({"epsilon": 0.1, "epsilon_high": 0.28}, torch.float32),
        ({"epsilon": 0.2, "dual_clip": 3.0}, torch.float32),
        ({"epsilon": 0.2, "epsilon_high": 0.28, "dual_clip": 1.5}, F64),
        ({"epsilon": 0.0, "epsilon_high": 0.0, "dual_clip": 2.0}, F64),
    ],
)
def test_clip_region_is_where_policy_loss_cuts_the_gradient(kw, dtype):
    # The token view marks clipped tokens with clip_region: it must agree with policy_loss's
    # metrics and with its gradient (a marked token gets exactly zero gradient; an unmarked valid
    # token with A != 0 gets some), on random tokens on both sides of every bound.
    g = torch.Generator().manual_seed(11)
    any_dual = False
    for trial in range(20):
        B, T = 4, 64
        old = -torch.rand(B, T, generator=g, dtype=F64).to(dtype)
        logp = (old + torch.randn(B, T, generator=g, dtype=F64).to(dtype)).requires_grad_(True)
        if trial % 2:
            adv = torch.randn(B, 1, generator=g, dtype=F64).to(dtype)  # one advantage per row
        else:
            adv = torch.randn(B, T, generator=g, dtype=F64).to(dtype)
            adv[0, :8] = 0.0
        mask = (torch.rand(B, T, generator=g) > 0.2).to(dtype)
        loss, m = policy_loss(logp, old, adv, mask, agg="token-sum", **kw)
        loss.backward()
        ratio = torch.exp(torch.clamp(logp.detach() - old, -20.0, 20.0))
        low, high, dual = clip_region(ratio, adv, **kw)
        assert low.shape == high.shape == dual.shape == (B, T) and low.dtype == torch.bool
        valid = mask.bool()
        n = int(valid.sum())
        for name, region in [
            ("clip_ratio", low | high),
            ("clip_ratio_low", low),
            ("clip_ratio_high", high),
            ("dual_clip_ratio", dual),
        ]:
            assert m[name] == pytest.approx(int((region & valid).sum()) / n, abs=1e-6), name
        a = adv.expand(B, T)
        eps, eps_high = kw.get("epsilon", 0.2), kw.get("epsilon_high", kw.get("epsilon", 0.2))
        assert not (low & high).any() and not ((low | high) & dual).any()
        assert bool((a[low] < 0).all()) and bool((ratio[low] < 1 - eps).all())
        assert bool((a[high] > 0).all()) and bool((ratio[high] > 1 + eps_high).all())
        if "dual_clip" not in kw:
            assert not dual.any()
        cut = (low | high | dual) & valid
        kept = ~(low | high | dual) & valid & (a != 0)
        assert bool((logp.grad[cut] == 0).all())
        assert bool((logp.grad[kept] != 0).all())
        assert cut.sum() > 0 and kept.sum() > 0
        any_dual |= bool(dual.any())
    assert any_dual == ("dual_clip" in kw)


def test_clip_region_hand_cases():
    # eps .2, eps_high .28, dual clip 3: (rho, A) -> region
    rho = t([0.5, 0.5, 1.25, 1.3, 1.3, 5.0, 2.0, 0.5])
    adv = t([-1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 0.0])
    low, high, dual = clip_region(rho, adv, epsilon=0.2, epsilon_high=0.28, dual_clip=3.0)
    assert low.tolist() == [True, False, False, False, False, False, False, False]
    assert high.tolist() == [False, False, False, True, False, False, False, False]
    assert dual.tolist() == [False, False, False, False, False, True, False, False]
    # epsilon_high defaults to epsilon; no dual clip: no dual region
    low, high, dual = clip_region(rho, adv, epsilon=0.2)
    assert high.tolist() == [False, False, True, True, False, False, False, False]
    assert low.tolist() == [True] + [False] * 7 and not dual.any()


# --------------------------------------------------------------------------- kl_penalty


def test_kl_estimators_hand_computed():
    # x = ref - logp.  token 0: logp -1, ref -1.5 -> x = -0.5
    #                  token 1: logp -1, ref -0.3 -> x = 0.7
    # k1 = -x:            [0.5, -0.7]        (k1 can be negative)
    # k2 = x^2/2:         [0.125, 0.245]
    # k3 = e^x - x - 1:   [0.6065307 - 0.5, 2.0137527 - 1.7] = [0.1065307, 0.3137527]
    logp = t([[-1.0, -1.0]])
    ref = t([[-1.5, -0.3]])
    assert_close(kl_penalty(logp, ref, "k1"), t([[0.5, -0.7]]))
    assert_close(kl_penalty(logp, ref, "k2"), t([[0.125, 0.245]]))
    assert_close(kl_penalty(logp, ref, "k3"), t([[0.10653065971263342, 0.3137527074704767]]))


def test_k3_and_k2_are_nonnegative_and_zero_at_equal_policies():
    g = torch.Generator().manual_seed(4)
    logp = 3.0 * torch.randn(64, 32, generator=g, dtype=F64)
    ref = 3.0 * torch.randn(64, 32, generator=g, dtype=F64)
    assert (kl_penalty(logp, ref, "k3") >= 0).all()
    assert (kl_penalty(logp, ref, "k2") >= 0).all()
    for kind in ("k1", "k2", "k3"):
        assert torch.equal(kl_penalty(logp, logp, kind), torch.zeros_like(logp))


def test_kl_estimator_means_under_pi_k1_k3_unbiased_k2_biased():
    # pi = [.5, .3, .2], ref = [.2, .5, .3]
    # KL(pi||ref) = .5 ln 2.5 + .3 ln .6 + .2 ln(2/3) = .45815 - .15325 - .08109 = 0.223805
    # E_pi[k2] = 1/2 sum pi (ln ref/pi)^2 = (.5*.83959 + .3*.26094 + .2*.16440)/2 = 0.265479
    #   (bias .042)
    pi = t([0.5, 0.3, 0.2])
    ref = t([0.2, 0.5, 0.3])
    true_kl = 0.22380465718564752
    e_k2 = 0.2654787944033222
    assert_close((pi * (pi / ref).log()).sum(), scalar(true_kl))

    # exact expectations over the three tokens
    lp, lr = pi.log()[None], ref.log()[None]
    assert_close((pi * kl_penalty(lp, lr, "k1")[0]).sum(), scalar(true_kl))
    assert_close((pi * kl_penalty(lp, lr, "k3")[0]).sum(), scalar(true_kl))
    assert_close((pi * kl_penalty(lp, lr, "k2")[0]).sum(), scalar(e_k2))

    # Monte-Carlo: 200k samples from pi; std of k1 ~ .69 -> standard error ~ .0016, tolerance .01
    g = torch.Generator().manual_seed(5)
    idx = torch.multinomial(pi, 200_000, replacement=True, generator=g)
    logp_s, ref_s = pi.log()[idx][None], ref.log()[idx][None]
    k1 = kl_penalty(logp_s, ref_s, "k1").mean().item()
    k2 = kl_penalty(logp_s, ref_s, "k2").mean().item()
    k3 = kl_penalty(logp_s, ref_s, "k3").mean().item()
    assert k1 == pytest.approx(true_kl, abs=0.01)
    assert k3 == pytest.approx(true_kl, abs=0.01)
    assert k2 == pytest.approx(e_k2, abs=0.01)
    assert abs(k2 - true_kl) > 0.03


def test_unknown_kl_kind_raises():
    x = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError):
        kl_penalty(x, x, "k4")


def _expected_loss_gradient(kind: str, *, in_reward: bool = False) -> tuple:
    """Exact E_{y ~ pi}[gradient] over a 5-word softmax, of each KL estimator used as a loss
    term (its value differentiated, the sample held fixed: what autograd does with beta * k(y)),
    or put into the reward (REINFORCE: k(y) * grad log pi(y), as verl's use_kl_in_reward).
    Returns (that expectation, grad KL(pi || ref), grad KL(ref || pi)), all w.r.t. the logits."""
    z = torch.tensor([0.3, -1.2, 0.8, 0.0, 0.5], dtype=F64, requires_grad=True)
    ref = torch.softmax(torch.tensor([1.0, 0.2, -0.4, 0.1, -0.9], dtype=F64), 0)
    logp = torch.log_softmax(z, 0)
    pi = logp.exp().detach()
    expected = torch.zeros(5, dtype=F64)
    for y in range(5):
        k = kl_penalty(logp[y : y + 1][None], ref.log()[y : y + 1][None], kind)[0, 0]
        surrogate = k.detach() * logp[y] if in_reward else k
        (grad,) = torch.autograd.grad(surrogate, z, retain_graph=True)
        expected += pi[y] * grad
    forward = torch.autograd.grad((logp.exp() * (logp - ref.log())).sum(), z)[0]
    reverse = torch.autograd.grad((ref * (ref.log() - torch.log_softmax(z, 0))).sum(), z)[0]
    return expected, forward, reverse


def test_kl_estimators_as_loss_terms_expected_gradients():
    # the pitfall of the StarPO chapter: k1 as a loss term has zero expected gradient (its
    # gradient is beta * grad log pi(y), whose mean under pi is 0), whatever beta
    k1, forward, reverse = _expected_loss_gradient("k1")
    assert forward.abs().max() > 0.1 and reverse.abs().max() > 0.1  # the policies differ
    assert_close(k1, torch.zeros(5, dtype=F64))
    # k2 = x^2 / 2 as a loss: exactly the gradient of KL(pi || ref)
    assert_close(_expected_loss_gradient("k2")[0], forward)
    # k3 as a loss (GRPO's): the gradient of the *reverse* KL(ref || pi), not KL(pi || ref)
    assert_close(_expected_loss_gradient("k3")[0], reverse)
    assert (reverse - forward).abs().max() > 0.05
    # k1 in the reward (RAGEN's paper-era code, verl's use_kl_in_reward): grad KL(pi || ref)
    assert_close(_expected_loss_gradient("k1", in_reward=True)[0], forward)
