"""DAPO (``agentic_rl.dapo``): the overlong penalty (eq. dapo-overlong), dynamic sampling's refill
on answers that differ, overlong filtering, the ``grpo`` preset as an exact GRPO control, and the
torchrun refusal. Tiny models on 1-digit addition, one CPU thread."""

from __future__ import annotations

import pytest
import torch

from agentic_rl import filters
from agentic_rl.config import ConfigError
from agentic_rl.dapo import DAPOTrainer, overlong_penalty
from agentic_rl.grpo import GRPOTrainer
from agentic_rl.utils import setup

from testkit import tiny


def test_overlong_penalty_is_zero_then_linear_then_minus_one():
    lengths = torch.tensor([1, 4, 5, 6, 7, 8, 9])
    got = overlong_penalty(lengths, max_length=8, buffer=4)
    # (L_max - L_cache - |y|) / L_cache, clipped to [-1, 0]: 0 up to 4 tokens, -1 from 8
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    assert overlong_penalty(lengths, max_length=8, buffer=0).tolist() == [0.0] * 7


def test_the_penalty_lands_on_the_last_generated_token():
    setup(0)
    t = DAPOTrainer(tiny("dapo", dynamic_sampling=False, overlong_buffer=2))
    t.sft()
    batch = t.rollout()
    lengths = batch.loss_mask.sum(1)
    penalty = overlong_penalty(lengths, 4, 2)
    task_reward = batch.scores - penalty  # the scores hold the task's reward plus R_length
    assert torch.allclose(batch.extras["overlong_penalty"], penalty)
    allowed = torch.tensor([0.0, 0.1, 1.0, 1.1])  # exact match + format
    assert bool(((task_reward[:, None] - allowed).abs().min(1).values < 1e-5).all())
    last = batch.loss_mask.shape[1] - 1 - batch.loss_mask.flip(1).argmax(1)
    nonzero = batch.token_rewards != 0
    assert all(set(row.nonzero().flatten().tolist()) <= {int(j)} for row, j in zip(nonzero, last))


def test_dynamic_sampling_keeps_groups_whose_answers_differ():
    setup(0)
    t = DAPOTrainer(tiny("dapo", max_sample_rounds=3))
    t.sft()
    batch = t.rollout()
    std, _ = filters.group_std(batch.correct.float(), batch.group_id)
    assert 1 <= t.sample_rounds <= 3
    if len(batch) < 16:  # ran out of rounds: the filter stage drops what has no spread
        keep = t.filter_rows(batch)
        assert bool((filters.group_std(batch.correct[keep].float(), batch.group_id[keep])[0] > 0)
                    .all())  # fmt: skip
    else:
        assert len(batch) == 16 and bool((std > 0).all())


def test_dynamic_sampling_criterion_is_the_answers_not_the_shaped_reward():
    # all four right, lengths differ: the shaped rewards differ, the answers do not -> dropped
    correct = torch.tensor([True, True, True, True, False, True, False, False])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert filters.nonzero_std_filter(correct.float(), gid).tolist() == [False] * 4 + [True] * 4


def test_overlong_filtering_takes_truncated_completions_out_of_the_loss():
    setup(0)
    t = DAPOTrainer(tiny("dapo", dynamic_sampling=False, mask_truncated=True, sft_steps=0))
    batch = t.rollout()  # an untrained model rarely stops within 4 tokens
    truncated = batch.extras["truncated"]
    assert truncated.any()
    assert (batch.loss_mask[truncated] == 0).all()
    assert (batch.loss_mask[~truncated].sum(1) > 0).all()


def test_the_grpo_preset_is_grpo_bit_for_bit():
    """The chapter's control: DAPO's recipe with all four changes off trains exactly as the GRPO
    chapter's trainer does, on the same seed."""
    runs = {}
    for name, trainer, config in (
        ("grpo", GRPOTrainer, tiny("grpo", sft_steps=30)),
        ("dapo:grpo", DAPOTrainer, tiny("dapo", preset="grpo")),
    ):
        setup(0)
        t = trainer(config)
        t.train()
        runs[name] = t
    a, b = runs["grpo"], runs["dapo:grpo"]
    assert all(torch.equal(a.model.state_dict()[k], v) for k, v in b.model.state_dict().items())
    assert [r["reward_mean"] for r in a.history] == [r["reward_mean"] for r in b.history]


def test_presets_and_bad_values():
    d, g = tiny("dapo"), tiny("dapo", preset="grpo")
    assert (d.epsilon_high, d.loss_type, d.dynamic_sampling, d.overlong_buffer) == (
        0.28, "dapo", True, 4)  # fmt: skip
    assert (g.epsilon_high, g.loss_type, g.dynamic_sampling, g.overlong_buffer) == (
        None, "grpo", False, 0)  # fmt: skip
    with pytest.raises(ConfigError, match="^overlong_buffer: "):
        tiny("dapo", overlong_buffer=5)  # longer than the completion budget
    with pytest.raises(ConfigError, match="^overlong_penalty_factor: "):
        tiny("dapo", overlong_penalty_factor=-1.0)
    with pytest.raises(ConfigError, match="^dynamic_sampling: .*one process, not 2 ranks"):
        tiny("dapo").check_data_parallel(2)
    tiny("dapo", dynamic_sampling=False).check_data_parallel(2)
