"""GiGPO: the two-level advantage on hand-computed cases, its edge cases, the config's refusals,
the recipe from the CLI, and the trainer's per-token advantages on a real rollout."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentic_rl.cli import main
from agentic_rl.config import ConfigError
from agentic_rl.gigpo import (
    AnchorRecorder,
    GiGPOConfig,
    GiGPOTrainer,
    anchor_groups,
    anchor_metrics,
    discounted_returns,
    gigpo_advantages,
    step_group_size_histogram,
)
from agentic_rl.envs import SokobanEnv
from agentic_rl.utils import setup

from testkit import tiny, tiny_values

# A group of four episodes on a small grid: start A, cells B and C, the goal G (reward 1 on the
# step that reaches it), a hole (reward 0, the episode ends). Anchors = the state each step acts in.
#   tau1: A -> B -> G              anchors A B      rewards 0 1    R = 1
#   tau2: A -> C -> B -> G         anchors A C B    rewards 0 0 1  R = 1
#   tau3: A -> C -> hole           anchors A C      rewards 0 0    R = 0
#   tau4: A -> A (a wall) -> B -> hole  anchors A A B  rewards 0 0 0  R = 0
REWARDS = [0, 1, 0, 0, 1, 0, 0, 0, 0, 0]
ANCHORS = ["A", "B", "A", "C", "B", "A", "C", "A", "A", "B"]
EPISODES = [1, 1, 2, 2, 2, 3, 3, 4, 4, 4]
GROUPS = [0] * 10
S5, S3, S2 = 0.2236068, 0.5773503, 0.3535534  # the step groups' stds (below)


def hand_case(**kw):
    kw = {"gamma": 0.5, "omega": 1.0, "eps": 0.0, **kw}
    return gigpo_advantages(REWARDS, ANCHORS, GROUPS, EPISODES, **kw)


def test_hand_computed_group_of_four_episodes():
    episode_level, step_level, combined = hand_case()
    # A^E over the 10 step rows (the code's cross_steps): returns 1,1 | 1,1,1 | 0,0 | 0,0,0;
    # mean 0.5, unbiased variance 10 * 0.25 / 9 = 5/18, so A^E = +-0.5 / sqrt(5/18) = +-sqrt(0.9)
    e = math.sqrt(0.9)
    assert episode_level.tolist() == pytest.approx([e] * 5 + [-e] * 5)
    # R_t with gamma = 0.5: tau1 0.5 1 | tau2 0.25 0.5 1 | tau3 0 0 | tau4 0 0 0
    # step group A: 0.5 0.25 0 0 0, mean 0.15, var (0.35^2 + 0.1^2 + 3 * 0.15^2) / 4 = 0.05
    # step group B: 1 1 0, mean 2/3, var (2/9 + 4/9) / 2 = 1/3; C: 0.5 0, mean 0.25, var 0.125
    expected_step = [0.35 / S5, (1 / 3) / S3,  # tau1 at A, B
                     0.1 / S5, 0.25 / S2, (1 / 3) / S3,  # tau2 at A, C, B
                     -0.15 / S5, -0.25 / S2,  # tau3 at A, C
                     -0.15 / S5, -0.15 / S5, -(2 / 3) / S3]  # tau4 at A, A, B  # fmt: skip
    assert step_level.tolist() == pytest.approx(expected_step, abs=1e-6)
    # e.g. 1.5652 = 0.35 / 0.2236: the shorter path's first step beats the longer one's (0.4472)
    assert step_level[0].item() == pytest.approx(1.565248, abs=1e-6)
    assert step_level[9].item() == pytest.approx(-1.154701, abs=1e-6)
    # Eq. 8 with omega = 1: tau3's step at C, -sqrt(0.9) - 0.7071 = -1.655790
    assert combined[6].item() == pytest.approx(-1.655790, abs=1e-6)
    assert torch.allclose(combined, episode_level + step_level)


def test_eps_is_added_to_the_std():
    with_eps, _, _ = hand_case(eps=1e-6)
    assert with_eps[0].item() == pytest.approx(0.5 / (math.sqrt(5 / 18) + 1e-6), rel=1e-12)


def test_gamma_one_ties_paths_of_different_length_and_095_prefers_the_shorter():
    _, one, _ = hand_case(gamma=1.0)
    # step group A with gamma 1: 1 1 0 0 0, mean 0.4, std sqrt(0.3): tau1 and tau2 tie at +1.0954
    assert one[0].item() == pytest.approx(0.6 / math.sqrt(0.3)) == one[2].item()
    _, discounted, _ = hand_case(gamma=0.95)
    # 0.95 vs 0.9025: the two-step path's first action beats the three-step one's
    assert discounted[0] > discounted[2] > 0
    assert discounted_returns([0, 0, 1], [7, 7, 7], 0.95).tolist() == pytest.approx(
        [0.9025, 0.95, 1.0]
    )


def test_omega_zero_is_the_episode_level_advantage():
    episode_level, _, combined = hand_case(omega=0.0)
    assert torch.equal(combined, episode_level)


def test_cross_steps_weighs_long_episodes_more():
    # episodes of different lengths: R = 1 over 1 step, R = 0 over 3 steps
    args = ([1, 0, 0, 0], ["a", "b", "c", "d"], [0, 0, 0, 0], [0, 1, 1, 1])
    rows, _, _ = gigpo_advantages(*args, gamma=1.0, omega=1.0, eps=0.0, cross_steps=True)
    per_episode, _, _ = gigpo_advantages(*args, gamma=1.0, omega=1.0, eps=0.0, cross_steps=False)
    # rows: 1 0 0 0, mean 0.25, std sqrt(0.25): A^E = 1.5 and -0.5
    assert rows.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    # episodes (Eq. 3): 1 0, mean 0.5, std sqrt(0.5): +-0.7071
    r = 0.5 / math.sqrt(0.5)
    assert per_episode.tolist() == pytest.approx([r, -r, -r, -r])


def test_singletons_as_the_reference_code():
    # distinct anchors after the shared start: every later step group is a singleton, A^S = 0
    _, step_level, _ = gigpo_advantages(
        [0, 1, 0, 0], ["s", "x", "s", "y"], [0, 0, 0, 0], [0, 0, 1, 1], gamma=1.0, omega=1.0
    )
    assert step_level[1].item() == 0.0 and step_level[3].item() == 0.0
    # an episode group with one row: mean 0, std 1, so A^E = R / (1 + eps), not 0
    episode_level, _, _ = gigpo_advantages([2.0], ["s"], [0], [0], gamma=1.0, omega=1.0)
    assert episode_level.item() == pytest.approx(2.0 / (1 + 1e-6), rel=1e-12)
    plain, _, _ = gigpo_advantages([2.0], ["s"], [0], [0], gamma=1, omega=1, scale_by_std=False)
    assert plain.item() == 2.0


def test_all_equal_groups_give_exact_zeros_without_nan():
    # eight identical successful episodes, gamma 0.95 (verl-agent's float32 gives +-0.056, A9.8)
    rewards, anchors = [0, 0, 0, 1] * 8, ["a", "b", "c", "d"] * 8
    episodes = [i // 4 for i in range(32)]
    outs = gigpo_advantages(rewards, anchors, [0] * 32, episodes, gamma=0.95, omega=1.0)
    for out in outs:
        assert torch.equal(out, torch.zeros(32, dtype=torch.float64))


def test_anchors_never_grouped_across_episode_groups():
    # "s" in group 0 (returns 1 and 0) and in group 1 (return 5): two step groups, not one
    step_group, sizes = anchor_groups(["s", "s", "s"], [0, 0, 1])
    assert step_group.tolist() == [0, 0, 1] and sizes.tolist() == [2, 2, 1]
    _, step_level, _ = gigpo_advantages(
        [1, 0, 5], ["s", "s", "s"], [0, 0, 1], [0, 1, 2], gamma=1.0, omega=1.0, eps=0.0
    )
    assert step_level.tolist() == pytest.approx([math.sqrt(0.5), -math.sqrt(0.5), 0.0])


def test_anchors_compare_exactly():
    step_group, _ = anchor_groups(["at x", "at  x", "At x", "at x"], [0, 0, 0, 0])
    assert step_group.tolist() == [0, 1, 2, 0]
    step_group, _ = anchor_groups([(1, 2), (1, 2), 3], [0, 0, 0])  # any hashable
    assert step_group.tolist() == [0, 0, 1]


def test_bad_input_is_refused_with_its_name():
    with pytest.raises(ValueError, match=r"anchor_states\[1\] is None"):
        gigpo_advantages([0, 1], ["s", None], [0, 0], [0, 0], gamma=1.0, omega=1.0)
    with pytest.raises(TypeError, match=r"anchor_states\[0\] is not hashable"):
        anchor_groups([["s"]], [0])
    for kw, name in ((dict(gamma=0.0), "gamma"), (dict(gamma=1.5), "gamma"),
                     (dict(omega=-1.0), "omega"), (dict(omega=math.nan), "omega")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name} must"):
            gigpo_advantages([1], ["s"], [0], [0], **{"gamma": 1.0, "omega": 1.0, **kw})
    with pytest.raises(ValueError, match="contiguous"):
        gigpo_advantages([0, 0, 0], ["a", "b", "c"], [0, 0, 0], [0, 1, 0], gamma=1, omega=1)
    with pytest.raises(ValueError, match="same group"):
        gigpo_advantages([0, 0], ["a", "b"], [0, 1], [0, 0], gamma=1, omega=1)


def test_anchor_metrics_on_the_hand_case():
    episode_level, step_level, _ = hand_case()
    _, sizes = anchor_groups(ANCHORS, GROUPS)
    assert sizes.tolist() == [5, 3, 5, 2, 3, 5, 2, 5, 5, 3]
    assert step_group_size_histogram(sizes) == pytest.approx({2: 1 / 3, 3: 1 / 3, 5: 1 / 3})
    m = anchor_metrics(step_level, episode_level, sizes)
    assert m["recurring_share"] == 1.0 and m["singleton_group_share"] == 0.0
    assert m["mean_step_group_size"] == pytest.approx(10 / 3)
    # by hand: A^E is +-e, so corr = mean(A^S * sign) / std(A^S) with both centred
    a = torch.tensor(step_level.tolist(), dtype=torch.float64)
    s = torch.tensor([1.0] * 5 + [-1.0] * 5, dtype=torch.float64)
    a, s = a - a.mean(), s - s.mean()
    assert m["step_episode_corr"] == pytest.approx(((a * s).sum() / (a.norm() * s.norm())).item())
    # sizes 1 1 2 2: half of the steps recur; two of three groups are singletons
    m = anchor_metrics(torch.zeros(4), torch.zeros(4), torch.tensor([1, 1, 2, 2]))
    assert m["recurring_share"] == 0.5 and m["singleton_group_share"] == pytest.approx(2 / 3)
    assert math.isnan(m["step_episode_corr"])  # constant advantages: no correlation defined


# ---------------------------------------------------------------------- the config and recipe
@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(step_advantage_weight=-0.1), "step_advantage_weight"),
        (dict(step_advantage_weight=math.nan), "step_advantage_weight"),
        (dict(gamma=0.0), "gamma"),
        (dict(gamma=1.01), "gamma"),
        (dict(num_generations=1), "num_generations"),
        (dict(beta=0.1, kl_in_reward=True), "kl_in_reward"),
        (dict(scale_rewards="none"), "scale_rewards"),
        (dict(env="household"), "max_action_tokens"),
    ],
)
def test_bad_config_values_are_refused_naming_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        GiGPOConfig.from_profile("quick", **overrides)


def test_recipe_runs_tiny_from_the_cli_and_writes_the_summary(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["gigpo", "--output-dir", str(out)]
    values = tiny_values("gigpo", sft_steps=2, sft_batch_size=4, max_steps=2, map_size=3)
    for key, value in values.items():
        argv += [f"--{key.replace('_', '-')}", str(value).lower()]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rl_steps"] == 2 and "success_before" in summary and "success_after" in summary
    header = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    for key in ("recurring_share", "singleton_group_share", "mean_step_group_size"):
        assert key in header


def test_trainer_token_advantages_are_the_pure_functions_per_step_values():
    # Sokoban: a malformed action is dropped and the episode goes on, so an untrained policy
    # plays several turns and revisits states (the anchor recurs)
    setup(0)
    t = GiGPOTrainer(tiny("gigpo", env="sokoban", max_turns=4))
    batch = t.rollout()
    assert max(batch.extras["num_turns"].tolist()) > 1
    adv = t.compute_advantages(batch)
    rows = t.step_rows(batch)
    _, _, combined = gigpo_advantages(
        **rows, gamma=0.95, omega=1.0, scale_by_std=True, cross_steps=True
    )
    step = 0
    for i, n in enumerate(batch.extras["num_turns"].tolist()):
        for k in range(n):
            tokens = batch.turn_ids[i] == k
            assert tokens.any()
            assert torch.allclose(adv[i][tokens], torch.full_like(adv[i][tokens],
                                  combined[step].item()))  # fmt: skip
            step += 1
    assert step == len(combined)
    assert (adv[batch.loss_mask == 0] == 0).all()  # observations and padding get nothing
    # the anchors are the raw observations: a group's episodes start from one reset grid
    firsts = [a[0] for a in batch.extras["anchors"]]
    assert firsts[0] == firsts[3] != firsts[4] and firsts[0].endswith("<action>")
    assert batch.extras["anchor_metrics"]["recurring_share"] > 0  # 4 episodes share the start


def test_anchor_recorder_keeps_the_observation_each_step_acts_on():
    rec = AnchorRecorder(SokobanEnv(6, max_turns=3))
    first = rec.reset(5)
    second, _, done, _ = rec.step("nonsense")  # dropped: the state, and the anchor, recur
    assert not done and rec.anchors == [first, second] and first == second
    rec.step("up")
    _, _, done, _ = rec.step("up")
    assert done and len(rec.anchors) == 3  # the truncated episode's final state acts on nothing
    assert rec.max_turns == 3  # everything else is the environment's
