"""RAGEN's StarPO and StarPO-S on the agent trainer, and the Echo Trap's early warnings.

StarPO optimises whole multi-turn trajectories (eq. starpo of the RAGEN chapter): that is what
:class:`~agentic_rl.agent.AgentTrainer` already does, with GRPO or PPO+GAE advantages. This module
adds what the chapter is about, and nothing else:

- the environments RAGEN trains on (:class:`~agentic_rl.envs.BanditEnv`, and FrozenLake and Sokoban
  with several actions per turn through :class:`~agentic_rl.envs.MultiActionEnv`);
- the **filter stage** (``filter_rows``): RAGEN's reward-std filter or DAPO's dynamic sampling
  (:mod:`agentic_rl.filters`); StarPO-S is that filter plus no KL plus clip-higher, a config
  preset (``StarPOConfig.from_profile(preset="starpo-s")``);
- RAGEN's minibatching by size (``mini_batch_size`` rows per gradient step), so that a filter that
  keeps a quarter of the batch also takes a quarter of the gradient steps;
- the **Echo-Trap indicators** logged every step: in-group reward std (all groups and the kept
  ones), the fraction of groups kept, and the number of distinct action sequences per group
  (template collapse); entropy and gradient norm come with every step already;
- :func:`~agentic_rl.plotting.collapse_step` (also importable from here): where a logged curve
  falls below a fraction of its peak, to measure the lag between the std's fall and success's fall
  (RAGEN's Finding 3); :func:`~agentic_rl.plotting.plot_echo_trap` marks both on one run's curves.
"""

from __future__ import annotations

import math

import torch

from . import filters
from .agent import AgentTrainer
from .config import StarPOConfig
from .envs import BanditEnv, FrozenLakeEnv, MultiActionEnv, SokobanEnv
from .plotting import collapse_step  # re-exported: the chapter's indicator helper
from .rollout import Batch
from .train import run_recipe

__all__ = ["StarPOTrainer", "distinct_per_group", "collapse_step", "run_starpo"]


def distinct_per_group(completions: list[str], group_ids: torch.Tensor) -> float:
    """Mean number of distinct action sequences in a group (1: every rollout did the same)."""
    groups: dict[int, set] = {}
    for text, g in zip(completions, group_ids.tolist()):
        groups.setdefault(g, set()).add(text)
    return sum(len(s) for s in groups.values()) / max(len(groups), 1)


class StarPOTrainer(AgentTrainer):
    """StarPO (GRPO or PPO+GAE over whole trajectories) with RAGEN's filter stage: StarPO-S."""

    config: StarPOConfig

    headline = ("success", "sampled_success")
    headline_definition = (
        "success: fraction of held-out episodes that succeed (bandit: pull the dragon; grid "
        "envs: reach the goal or solve the level), sampling at the training temperature "
        "(= sampled_success); greedy_success: with greedy actions"
    )

    # ------------------------------------------------------------------ construction
    def _make_task(self):
        c = self.config
        if c.env == "bandit":
            return BanditEnv(payoffs=c.bandit_payoffs, format_penalty=c.format_penalty)
        if c.env == "frozenlake":
            inner = FrozenLakeEnv(
                c.map_size,
                is_slippery=c.is_slippery,
                p_frozen=c.p_frozen,
                max_turns=c.max_actions,
                format_penalty=c.format_penalty,
            )
        else:
            inner = SokobanEnv(
                c.room_size,
                max_turns=c.max_actions,
                format_penalty=c.format_penalty,
                max_solution_length=c.max_actions,
            )
        return MultiActionEnv(
            inner,
            max_turns=c.max_turns,
            max_actions_per_turn=c.max_actions_per_turn,
            max_actions=c.max_actions,
            format_penalty=c.format_penalty,
        )

    # ------------------------------------------------------------------ rollout and filter
    def rollout(self) -> Batch:
        """P seeds x N trajectories; with ``rollout_filter="dynamic"``, DAPO's refill: more seeds
        are played (up to ``max_sample_rounds`` rounds) until P groups have reward spread."""
        c = self.config
        if c.rollout_filter != "dynamic":
            return super().rollout()
        kept, rounds, need = [], 0, c.prompts_per_step * c.num_generations
        while rounds < c.max_sample_rounds and sum(len(b) for b in kept) < need:
            rounds += 1
            b = super().rollout()
            rows = filters.nonzero_std_filter(b.scores, b.group_id).nonzero().flatten()
            if len(rows):
                b = b.select(rows)
                b.group_id = b.group_id + 10_000 * rounds  # groups of different rounds stay apart
                kept.append(b)
        self._sample_rounds = rounds
        if not kept:  # no group with spread in any round: play one more, the filter will skip it
            return super().rollout()
        batch = Batch.cat(kept, self.tokenizer.pad_token_id)
        groups = torch.unique(batch.group_id)[: c.prompts_per_step]
        return batch.select(torch.isin(batch.group_id, groups).nonzero().flatten())

    def filter_rows(self, batch: Batch) -> torch.Tensor | None:
        c, scores, gid = self.config, batch.scores, batch.group_id
        if c.rollout_filter in ("top_k", "top_p"):
            return filters.reward_std_filter(
                scores,
                gid,
                strategy=c.rollout_filter,
                value=c.filter_value,
                include_zero=c.filter_include_zero,
            )
        if c.rollout_filter == "dynamic":
            return filters.nonzero_std_filter(scores, gid)
        return None

    def rollout_metrics(self, batch: Batch, keep: torch.Tensor | None) -> dict:
        """The Echo-Trap indicators, over the whole rollout (compute_loss sees only a minibatch
        of the kept rows)."""
        scores, gid = batch.scores, batch.group_id
        if keep is None:
            keep = torch.ones_like(scores, dtype=torch.bool)
        return dict(
            filters.filter_metrics(scores, gid, keep),
            distinct_per_group=distinct_per_group(batch.completions, gid),
            success_rate=batch.extras["success"].float().mean().item(),
            num_turns=batch.extras["num_turns"].float().mean().item(),
        )

    def _minibatches(self, n: int) -> list[torch.Tensor | None]:
        """RAGEN's minibatches: ``ceil(n / mini_batch_size)`` gradient steps over a random
        permutation of the rows (slices of equal size, up to one row)."""
        k = max(1, math.ceil(n / self.config.mini_batch_size))
        if k == 1:
            return [None]
        perm = torch.randperm(n)  # the global torch stream: seeded, and checkpointed
        return list(torch.tensor_split(perm, k))


def run_starpo(config: StarPOConfig) -> dict:
    """The StarPO recipe headless (``python -m agentic_rl starpo``)."""
    return run_recipe(StarPOTrainer(config))
