"""The StarPO trainer: presets, the filter stage, RAGEN's minibatching, dynamic sampling, the
entropy bonus, the indicators, and the recipe on every environment."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from agentic_rl import filters
from agentic_rl.cli import main
from agentic_rl.config import ConfigError
from agentic_rl.starpo import StarPOConfig
from agentic_rl.rollout import Batch
from agentic_rl.starpo import StarPOTrainer, collapse_step, distinct_per_group
from agentic_rl.utils import setup

from testkit import tiny, tiny_values


def test_presets_fill_unset_fields_and_fields_you_set_win():
    s = StarPOConfig.from_profile("quick", preset="starpo-s")
    assert (s.rollout_filter, s.filter_value, s.beta, s.epsilon_high) == ("top_k", 0.25, 0.0, 0.28)
    v = StarPOConfig.from_profile("quick")
    assert (v.rollout_filter, v.beta, v.kl_estimator, v.epsilon_high) == ("none", 0.001, "k1", None)
    ablated = StarPOConfig.from_profile("quick", preset="starpo-s", rollout_filter="none")
    assert ablated.rollout_filter == "none" and ablated.epsilon_high == 0.28
    with pytest.raises(ConfigError, match="^preset: unknown preset"):
        StarPOConfig.from_profile("quick", preset="starpo-z")
    with pytest.raises(
        ConfigError, match="^preset: the 'starpo-s' preset's values are not applied"
    ):
        StarPOConfig(preset="starpo-s")


def test_top_k_filter_keeps_whole_groups_and_takes_fewer_gradient_steps():
    setup(0)
    t = StarPOTrainer(tiny("starpo", preset="starpo-s", filter_value=0.5, mini_batch_size=2))
    steps = []
    t.optimizer_step = lambda loss, f=t.optimizer_step: steps.append(1) or f(loss)
    row = t.rl_step()
    assert row["kept_groups"] == 0.5  # 2 of 4 groups
    assert len(steps) == math.ceil(2 * 4 / 2)  # 8 kept rows, 2 per gradient step
    assert row["chosen_in_group_std"] >= row["in_group_std"]


def test_no_filter_uses_every_row_in_minibatches_of_the_configured_size():
    setup(0)
    t = StarPOTrainer(tiny("starpo", mini_batch_size=5))
    steps = []
    t.optimizer_step = lambda loss, f=t.optimizer_step: steps.append(1) or f(loss)
    row = t.rl_step()
    assert row["kept_groups"] == 1.0 and len(steps) == math.ceil(16 / 5)


class _NoSpread(StarPOTrainer):
    """A rollout in which every episode scores the same: no group has any spread."""

    def rollout(self) -> Batch:
        batch = super().rollout()
        batch.token_rewards = torch.zeros_like(batch.token_rewards)
        return batch


def test_a_filter_that_keeps_nothing_skips_the_update_and_says_why():
    setup(0)
    t = _NoSpread(tiny("starpo", preset="starpo-s", filter_include_zero=False))
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    with pytest.warns(
        RuntimeWarning, match="the filter kept no rollout \\(no group had the reward spread"
    ):
        row = t.rl_step()
    assert row["skipped"] == 1 and row["kept_groups"] == 0.0 and math.isnan(row["loss"])
    assert row["in_group_std"] == 0.0  # the indicators are still the rollout's
    assert all(torch.equal(before[k], v) for k, v in t.model.state_dict().items())


def test_dynamic_sampling_refills_with_groups_that_have_spread():
    setup(0)
    t = StarPOTrainer(tiny("starpo", rollout_filter="dynamic", max_sample_rounds=3))
    batch = t.rollout()
    std, _ = filters.group_std(batch.scores, batch.group_id)
    assert len(std) <= 4 and bool((std > 0).all())
    assert 1 <= t.sample_rounds <= 3
    assert len(batch) == 4 * len(std)  # whole groups


def test_entropy_bonus_is_subtracted_from_the_loss():
    setup(0)
    t = StarPOTrainer(tiny("starpo", entropy_coeff=0.0, beta=0.0))
    batch = t.rollout()
    adv = t.compute_advantages(batch)
    t.filter_rows(batch)
    plain, m = t.compute_loss(batch, adv)
    t.config.entropy_coeff = 0.5
    bonus, _ = t.compute_loss(batch, adv)
    # token-mean entropy, which the metrics report too
    assert bonus.item() == pytest.approx(plain.item() - 0.5 * m["entropy"], abs=1e-5)


@pytest.mark.parametrize("env", ["bandit", "frozenlake", "sokoban"])
def test_one_step_on_every_environment(env):
    setup(0)
    t = StarPOTrainer(tiny("starpo", env=env, sft_steps=2, sft_batch_size=4))
    t.sft()
    row = t.rl_step()
    assert 1.0 <= row["distinct_per_group"] <= 4.0
    assert row["skipped"] == 0 and math.isfinite(row["loss"])


def test_distinct_per_group_and_collapse_step():
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    assert distinct_per_group(["a", "a", "b", "c", "c", "c"], gid) == 1.5
    h = [{"step": i + 1, "x": v} for i, v in enumerate([0.2, 0.8, 0.6, 0.5, 0.3])]
    assert collapse_step(h, "x", window=1) == 5  # half of the peak 0.8 is 0.4: 0.3 at step 5
    assert collapse_step(h, "x", drop=0.3, window=1) is None
    assert collapse_step([{"step": 1, "x": 0.0}], "x") is None


def test_batch_cat_pads_and_joins_rows():
    a = Batch(
        torch.ones(2, 3, dtype=torch.long),
        torch.ones(2, 3, dtype=torch.long),
        torch.ones(2, 3, dtype=torch.long),
        torch.zeros(2, 3),
        torch.tensor([0, 0]),
        completions=["x", "y"],
        turn_ids=torch.zeros(2, 3, dtype=torch.long),
        extras={"success": torch.tensor([True, False]), "turn_end": [[1], [2]]},
    )
    b = Batch(
        torch.ones(1, 5, dtype=torch.long),
        torch.ones(1, 5, dtype=torch.long),
        torch.ones(1, 5, dtype=torch.long),
        torch.zeros(1, 5),
        torch.tensor([7]),
        completions=["z"],
        turn_ids=torch.zeros(1, 5, dtype=torch.long),
        extras={"success": torch.tensor([True]), "turn_end": [[4]]},
    )
    c = Batch.cat([a, b], pad_token_id=9)
    assert c.input_ids.shape == (3, 5) and c.input_ids[0].tolist() == [1, 1, 1, 9, 9]
    assert c.attention_mask[0].tolist() == [1, 1, 1, 0, 0] and c.turn_ids[0, 4] == -1
    assert c.group_id.tolist() == [0, 0, 7] and c.completions == ["x", "y", "z"]
    assert c.extras["turn_end"] == [[1], [2], [4]] and c.extras["success"].tolist() == [1, 0, 1]


def test_cli_runs_the_starpo_recipe(tmp_path, capsys):
    argv = ["starpo", "--preset", "starpo-s", "--output-dir", str(tmp_path / "run")]
    for k, v in tiny_values("starpo").items():
        argv += [f"--{k.replace('_', '-')}", str(v).lower() if isinstance(v, bool) else str(v)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert '"success_before"' in out and (tmp_path / "run" / "metrics.csv").exists()


def test_plot_echo_trap_marks_where_success_and_the_std_fall():
    import matplotlib

    matplotlib.use("Agg")
    from agentic_rl.plotting import plot_echo_trap

    acc = [0.2, 0.6, 0.8, 0.8, 0.5, 0.3, 0.2, 0.1]
    std = [0.3, 0.4, 0.4, 0.3, 0.1, 0.1, 0.1, 0.1]
    h = [
        {"step": i + 1, "accuracy": a, "in_group_std": s, "entropy": 1.0, "grad_norm": 0.5}
        for i, (a, s) in enumerate(zip(acc, std))
    ]
    fig = plot_echo_trap(h, window=1)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["success falls: step 6", "reward std falls: step 5"]
    assert len(fig.axes[1].lines) == 2 + 2  # raw and smoothed curve, then the two marks
    fig = plot_echo_trap([{**r, "in_group_std": 0.4} for r in h], window=1)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()][1] == (
        "reward std falls: never"
    )


def test_starpo_ppo_with_a_critic_runs_and_filters_whole_groups():
    setup(0)
    t = StarPOTrainer(
        tiny(
            "starpo",
            env="frozenlake",
            advantage_estimator="gae",
            preset="starpo-s",
            filter_value=0.5,
        )
    )
    assert t.critic is not None
    row = t.rl_step()
    assert row["kept_groups"] == 0.5 and math.isfinite(row["value_loss"])


def _moved_policy(**overrides) -> tuple[StarPOTrainer, Batch]:
    """A trainer one RL step away from pi_ref (so the KL is not zero), and a fresh rollout."""
    setup(0)
    t = StarPOTrainer(tiny("starpo", env="frozenlake", learning_rate=1e-2, **overrides))
    t.rl_step()
    return t, t.rollout()


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_kl_in_reward_shapes_the_advantages_and_leaves_the_loss(estimator):
    from agentic_rl.advantages import group_advantages
    from agentic_rl.losses import kl_penalty

    t, batch = _moved_policy(
        beta=0.5, kl_estimator="k1", kl_in_reward=True, advantage_estimator=estimator
    )
    penalty = t.kl_reward_penalty(batch)
    want = 0.5 * kl_penalty(batch.old_logprobs, batch.ref_logprobs, "k1") * batch.loss_mask
    assert torch.allclose(penalty, want) and penalty.abs().sum() > 1e-4
    adv = t.compute_advantages(batch)
    if estimator == "grpo":  # the episode's score minus beta * sum_t k1(t), then the group
        shaped = group_advantages(batch.scores - want.sum(1), batch.group_id, scale="group")
        assert torch.allclose(adv, shaped[:, None] * batch.loss_mask)
    with_reward_kl, _ = t.compute_loss(batch, adv)
    t.config = dataclasses.replace(t.config, kl_in_reward=False, beta=0.0)
    no_kl, _ = t.compute_loss(batch, adv)  # the loss has no KL term when the KL is in the reward
    assert with_reward_kl.item() == pytest.approx(no_kl.item(), abs=1e-7)
    assert not torch.allclose(adv, t.compute_advantages(batch))  # the penalty moved them


def test_training_the_observation_tokens_puts_the_later_states_in_the_loss():
    from agentic_rl.multiturn import environment_tokens

    setup(0)
    masked = StarPOTrainer(tiny("starpo", env="frozenlake", max_steps=1)).rollout()
    setup(0)
    t = StarPOTrainer(tiny("starpo", env="frozenlake", max_steps=1, mask_observations=False))
    batch = t.rollout()
    env = batch.extras["env_tokens"]
    assert torch.equal(env, environment_tokens(masked)) and env.any()
    assert torch.equal(batch.loss_mask.bool(), masked.loss_mask.bool() | env)
    # their old log-probs are the policy's (it never sampled them): finite, negative
    assert bool((batch.old_logprobs[env] < 0).all())
    assert math.isfinite(t.rl_step()["loss"])


def test_the_policy_denominator_reweighs_the_states_trained_loss_and_nothing_else():
    """With the states trained, 'policy' divides the same summed loss by the policy's tokens
    (every term of the token mean: surrogate, entropy, KL); with them masked it changes
    nothing. The ReTool recipe shares the field and the function (agentic_rl.denominator)."""
    setup(0)
    t = StarPOTrainer(tiny("starpo", env="frozenlake", max_steps=1, mask_observations=False,
                           beta=0.0))  # (the KL needs the reference's log-probs: rl_step's)
    batch = t.rollout()
    adv = t.compute_advantages(batch) + 0.5 * batch.loss_mask  # every token with a size
    config, losses = t.config, {}
    for denominator in ("all", "policy"):
        t.config = dataclasses.replace(config, loss_denominator=denominator)
        losses[denominator] = t.compute_loss(batch, adv)[0].detach()
    t.config = config
    trained, env = batch.loss_mask.bool(), batch.extras["env_tokens"]
    ratio = float(trained.sum()) / float((trained & ~env).sum())
    assert ratio > 1
    torch.testing.assert_close(losses["policy"], losses["all"] * ratio)
    masked = dataclasses.replace(batch, extras={})  # (no environment tokens recorded)
    t.config = dataclasses.replace(config, loss_denominator="policy")
    torch.testing.assert_close(t.compute_loss(masked, adv)[0].detach(), losses["all"])
    t.config = config
    for bad in (dict(loss_denominator="tokens"),
                dict(loss_denominator="policy", advantage_estimator="gae")):
        with pytest.raises(ConfigError, match="^loss_denominator: "):
            tiny("starpo", env="frozenlake", **bad)


def test_cli_takes_the_critic_and_kl_in_reward_and_refuses_bad_values(tmp_path, capsys):
    argv = ["starpo", "--advantage-estimator", "gae", "--kl-in-reward", "true", "--beta", "0.001"]
    for k, v in tiny_values("starpo").items():
        argv += [f"--{k.replace('_', '-')}", str(v).lower() if isinstance(v, bool) else str(v)]
    assert main([*argv, "--output-dir", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "metrics.csv").exists()
    capsys.readouterr()
    for extra, why in (
        (["--beta", "0"], "kl_in_reward: needs beta > 0"),
        (
            ["--mask-observations", "false"],
            "mask_observations: has nothing to unmask on the bandit",
        ),
    ):
        given = argv[:5] + argv[7:] if extra[0] == "--beta" else argv  # each flag once
        with pytest.raises(SystemExit) as exit_:
            main([*given, *extra, "--output-dir", str(tmp_path / "bad")])
        assert exit_.value.code == 2 and why in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()  # refused before anything was written


def test_the_control_arms_differ_from_the_arm_they_control_in_the_named_fields_only():
    """Issue 43's arms: each differs from the arm it controls in the named fields only."""
    from agentic_rl.experiments import starpo as experiment

    arms = experiment.ARMS
    pairs = {"Bandit: StarPO, mean baseline": ("Bandit: StarPO", {"scale_rewards"}),
             "Lake: StarPO, states trained, control": ("Lake: StarPO, states trained",
                                                        {"loss_denominator", "max_grad_norm"}),
             "Lake: StarPO, unclipped": ("Lake: StarPO", {"max_grad_norm"})}
    for arm, (base, changed) in pairs.items():
        a, b = arms[arm], arms[base]
        assert {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} == changed, arm
        env = experiment.env_of(arm)
        StarPOConfig.from_profile("quick", env=env, **experiment._env_fields(env, "quick"), **a)
