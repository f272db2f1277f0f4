"""GiGPO's controls and its credit measurement: the discounted-episode GRPO control, the
shuffled-anchor placebo, the household's slack, and the within-state AUC against the
environment's action labels."""

from __future__ import annotations

import math
import random

import pytest
import torch
from testkit import tiny

from agentic_rl.config import ConfigError
from agentic_rl.gigpo import (
    GiGPOConfig,
    GiGPOTrainer,
    anchor_groups,
    gigpo_advantages,
    shuffle_anchors,
    within_state_auc,
)
from agentic_rl.utils import setup


# ---------------------------------------------------------------- the discounted episode level
def test_discounted_episodes_rank_a_short_success_above_a_long_one():
    # two successful episodes of 2 and 4 steps, one failure: undiscounted, both successes tie
    rewards = [0, 1, 0, 0, 0, 1, 0, 0]
    episodes = [0, 0, 1, 1, 1, 1, 2, 2]
    kw = dict(gamma=0.5, omega=0.0, scale_by_std=False, cross_steps=False)
    plain = gigpo_advantages(rewards, list("abcdefgh"), [0] * 8, episodes, **kw)[0]
    short = gigpo_advantages(rewards, list("abcdefgh"), [0] * 8, episodes,
                             discount_episodes=True, **kw)[0]  # fmt: skip
    assert plain[0] == plain[2]  # R = 1 for both
    # R_1 = 0.5 (2 steps) and 0.125 (4 steps), 0: mean 0.625 / 3
    mean = (0.5 + 0.125) / 3
    assert short[0].item() == pytest.approx(0.5 - mean)
    assert short[2].item() == pytest.approx(0.125 - mean)
    assert short[6].item() == pytest.approx(-mean)


def test_discounting_changes_nothing_when_gamma_is_one():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(10, generator=g, dtype=torch.float64)
    episodes, groups = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3], [0] * 5 + [1] * 5
    a = gigpo_advantages(rewards, list("aabbcacbba"), groups, episodes, gamma=1.0, omega=1.0)
    b = gigpo_advantages(rewards, list("aabbcacbba"), groups, episodes, gamma=1.0, omega=1.0,
                         discount_episodes=True)  # fmt: skip
    for x, y in zip(a, b):
        assert torch.allclose(x, y, atol=1e-12)


# ---------------------------------------------------------------- the placebo
def test_shuffled_anchors_keep_every_group_size_and_stay_in_their_episode_group():
    anchors = ["s", "a", "s", "b", "s", "a", "x", "y", "x", "x"]
    groups = [0] * 6 + [1] * 4
    moved = shuffle_anchors(anchors, groups, random.Random(3))
    assert sorted(moved[:6]) == sorted(anchors[:6]) and sorted(moved[6:]) == sorted(anchors[6:])
    _, before = anchor_groups(anchors, groups)
    _, after = anchor_groups(moved, groups)
    assert sorted(before.tolist()) == sorted(after.tolist())
    assert moved != anchors  # (this stream does move them)
    assert shuffle_anchors(anchors, groups, random.Random(3)) == moved  # a function of the rng


def test_shuffle_refuses_misaligned_rows():
    with pytest.raises(ValueError, match="anchor_states"):
        shuffle_anchors(["a", "b"], [0, 0, 0], random.Random(0))


# ---------------------------------------------------------------- the credit measurement
def test_within_state_auc_by_hand():
    # state s: good steps valued 2 and 0, others 1 and 0 -> pairs (2>1, 2>0, 0<1, 0=0): 2.5/4
    # state t: one good (5) against one other (5): a tie, 0.5 of a pair; state u: no good step
    values = [2, 1, 0, 0, 5, 5, 3]
    anchors = ["s", "s", "s", "s", "t", "t", "u"]
    kinds = ["good", "flawed", "good", "invalid", "good", "malformed", "flawed"]
    auc, pairs = within_state_auc(values, anchors, [0] * 7, kinds)
    assert pairs == 5 and auc == pytest.approx(3.0 / 5)


def test_within_state_auc_compares_only_inside_a_state_and_a_group():
    # the good step is worse than a flawed one elsewhere, better than the one in its own state
    values, anchors = [1.0, 0.0, 9.0], ["s", "s", "t"]
    auc, pairs = within_state_auc(values, anchors, [0, 0, 0], ["good", "flawed", "flawed"])
    assert (auc, pairs) == (1.0, 1)
    auc, pairs = within_state_auc(values, anchors, [0, 1, 1], ["good", "flawed", "flawed"])
    assert math.isnan(auc) and pairs == 0  # another episode group: never compared


def test_within_state_auc_refuses_misaligned_labels():
    with pytest.raises(ValueError, match="kinds"):
        within_state_auc([0.0, 1.0], ["a", "a"], [0, 0], ["good"])


# ---------------------------------------------------------------- the recipe
@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(slack=-1), "slack"),
        (dict(slack=21), "slack"),
        (dict(env="household", slack=6, max_turns=11), "max_turns"),
        (dict(shuffle_anchors=True, step_advantage_weight=0.0), "shuffle_anchors"),
    ],
)
def test_bad_control_fields_are_refused_before_any_compute(fields, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        GiGPOConfig(**fields)


def household(**overrides):
    setup(0, threads=1)
    fields = dict(env="household", max_turns=8, max_action_tokens=5, sft_steps=2, max_steps=2)
    return GiGPOTrainer(tiny("gigpo", **{**fields, **overrides}))


def test_the_household_gets_its_slack():
    t = household(slack=4, max_turns=10)
    env = t.make_task()
    env.reset(5)
    assert env.slack == 4 and env.budget == min(len(env.plan()) + 4, 10)


def test_the_recipe_logs_the_credit_measurement_from_the_labels():
    t = household()
    t.train()
    for row in t.history:
        assert 0.0 <= row["state_auc"] <= 1.0 or math.isnan(row["state_auc"])
        assert row["state_auc_pairs"] >= 0
    batch = t.play([11, 12], group_size=4)
    kinds = batch.extras["kinds"]
    assert [len(k) for k in kinds] == batch.extras["num_turns"].tolist()
    assert {k for row in kinds for k in row} <= {"good", "flawed", "invalid", "malformed"}


def test_grpo_arm_state_auc_is_its_episode_level():
    t = household(step_advantage_weight=0.0)
    t.train()
    for row in t.history:  # omega = 0: the advantage trained on is the episode level
        same = row["state_auc"] == row["state_auc_episode"]
        assert same or (math.isnan(row["state_auc"]) and math.isnan(row["state_auc_episode"]))


def test_the_placebo_changes_the_advantages_and_not_the_task_stream():
    batches, advantages = [], []
    for shuffled in (False, True):  # each from the same seed: the same start and stream
        t = household(shuffle_anchors=shuffled)
        t.sft()
        batches.append(t.rollout())
        for i, rewards in enumerate(batches[-1].extras["turn_rewards"]):
            rewards[-1] = float(i % 3 == 0)  # (an untrained policy never succeeds: outcomes set)
        advantages.append(t.compute_advantages(batches[-1]))
    batch, same = batches
    assert torch.equal(batch.input_ids, same.input_ids)
    assert not torch.equal(*advantages)
    m = batch.extras["anchor_metrics"], same.extras["anchor_metrics"]
    assert m[0]["mean_step_group_size"] == m[1]["mean_step_group_size"]
