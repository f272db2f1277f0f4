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
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import filters
from .agent import AgentTrainer
from .bounds import COEF, ROUNDS
from .config import (
    FULL_MODEL,
    AgentFields,
    CriticFields,
    FrozenLakeFields,
    defaults,
    param,
)
from .denominator import PolicyDenominatorFields, over_policy_tokens
from .envs import BanditEnv, FrozenLakeEnv, MultiActionEnv, SokobanEnv
from .plotting import collapse_step  # re-exported: the chapter's indicator helper
from .rollout import Batch
from .train import check_split

__all__ = [
    "StarPOConfig",
    "StarPOTrainer",
    "distinct_per_group",
    "collapse_step",
    "CONFIG",
    "TRAINER",
]


@dataclass
@defaults(sft_batch_size=32, eval_size=128, loss_type="token-mean", num_minibatches=4)
class StarPOConfig(AgentFields, CriticFields, FrozenLakeFields, PolicyDenominatorFields):
    """RAGEN's StarPO and StarPO-S: whole multi-turn trajectories, and an uncertainty filter."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("bandit", "frozenlake", "sokoban")

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(
            FULL_MODEL,
            num_hidden_layers=4,
            env="sokoban",
            map_size=4,
            sft_steps=1500,
            max_steps=200,
            eval_size=256,
        ),
    }
    #: StarPO-S and its three parts (RAGEN section 4.2); the dataclass defaults are vanilla StarPO
    #: (presets: see RLConfig.PRESETS).
    PRESETS: ClassVar[dict[str, dict]] = {
        "starpo": {},
        "starpo-s": dict(rollout_filter="top_k", filter_value=0.25, beta=0.0, epsilon_high=0.28),
    }

    preset: str = param(
        "starpo",
        "'starpo' (no filter, KL k1 at 0.001, symmetric clip) or 'starpo-s' (keep the top "
        "quarter of groups by reward std, no KL, clip-higher 0.28). Fields you set override the "
        "preset: that is how the ablation removes one part at a time.",
    )
    # --- defaults that differ from the agent fields': RAGEN's settings, scaled down
    env: str = param("bandit", "Environment: 'bandit', 'frozenlake' or 'sokoban'.")
    advantage_estimator: str = param(
        "grpo",
        "'grpo' (StarPO-GRPO, eqs. 5-6) or 'gae' (StarPO-PPO with a critic, RAGEN's default).",
    )
    num_generations: int = param(16, "N: trajectories per initial state (RAGEN: 16).")
    prompts_per_step: int = param(8, "P: initial states (episode seeds) per RL step (RAGEN: 8).")
    mini_batch_size: int = param(
        32,
        "Trajectories per gradient step (RAGEN's ppo_mini_batch_size 32): a batch of P * N rows "
        "takes ceil(rows / 32) steps, so a filter that keeps fewer rows takes fewer steps.",
    )
    beta: float = param(0.001, "KL coefficient (vanilla StarPO: 0.001 with k1; StarPO-S: 0).")
    kl_estimator: str = param("k1", "KL estimator in the loss (StarPO: 'k1', logp - ref_logp).")
    entropy_coeff: float = param(0.001, "Entropy bonus (RAGEN: 0.001).")
    learning_rate: float = param(1e-4, "Policy learning rate (AdamW).")
    sft_steps: int = param(200, "SFT steps on demonstrations before RL (0: skip).")
    max_steps: int = param(60, "RL steps (one rollout batch each).")
    demo_error_rate: float = param(
        0.5,
        "Fraction of demonstration actions replaced by another action (a weak start leaves "
        "room for RL).",
    )
    is_slippery: bool = param(
        True, "FrozenLake: slippery ice (RAGEN: on; the intended move 1/3 of the time)."
    )
    map_size: int = param(
        3,
        "FrozenLake: side of the random lakes (RAGEN: 4). 3 keeps a CPU run learnable: a policy "
        "that sees the lake after every action reaches the goal within 10 slippery actions at "
        "most 40 %% of the time on 3 x 3 lakes, 10 %% on 4 x 4 (less with several actions a turn).",
    )
    max_turns: int = param(5, "Turns per episode (RAGEN: 5).")
    max_action_tokens: int = param(
        4, "Maximum tokens of one turn (actions, separators and the stop word)."
    )
    # --- the environment
    max_actions_per_turn: int = param(
        2,
        "Actions one turn may name, joined by '||' (RAGEN: 5). 1: one action per turn.",
        tokens=True,
    )
    max_actions: int = param(
        10, "Actions per episode (RAGEN: 10); the grid env's time limit.", tokens=True
    )
    format_penalty: float = param(
        0.1,
        "Cost of a turn with an invalid action (RAGEN: 0.1); the episode goes on.",
        high=1e3,
        why=COEF,
    )
    bandit_payoffs: str = param(
        "paper", "Bandit: the phoenix pays 0.15 ('paper', App. B.1) or 0.1 ('code')."
    )
    room_size: int = param(6, "Sokoban: side of the room, walls included (RAGEN: 6).")
    # --- the filter stage
    rollout_filter: str = param(
        "none",
        "Which groups enter the update: 'none'; 'top_k' / 'top_p' (RAGEN's reward-std filter, "
        "filters.reward_std_filter); 'dynamic' (DAPO: drop groups whose rewards are all equal "
        "and sample more groups to refill the batch).",
    )
    filter_value: float = param(
        0.25, "top_k: fraction of groups kept (RAGEN: 0.25); top_p: share of the total std."
    )
    filter_include_zero: bool = param(
        True, "Let the reward-std filter keep groups with zero std (RAGEN's original: yes)."
    )
    max_sample_rounds: int = param(
        4,
        "Dynamic sampling: at most this many rollout rounds per step to refill the batch.",
        high=100,
        why=ROUNDS,
    )
    mask_observations: bool = param(
        True,
        "No loss on the environment's tokens (the states after the first action; RAGEN's later "
        "code: enable_response_mask). False trains them as if the policy had written them, as "
        "RAGEN's paper runs did ('jointly optimized').",
    )

    def validate(self) -> None:
        super().validate()
        if self.rollout_filter not in ("none", "top_k", "top_p", "dynamic"):
            self._bad("rollout_filter", "must be 'none', 'top_k', 'top_p' or 'dynamic'")
        if not 0.0 < self.filter_value <= 1.0:
            self._bad("filter_value", "must be in (0, 1]")
        if self.bandit_payoffs not in ("paper", "code"):
            self._bad("bandit_payoffs", "must be 'paper' or 'code'")
        if self.format_penalty < 0:
            self._bad("format_penalty", "must be >= 0 (it is subtracted)")
        self._at_least(("max_actions_per_turn", "max_actions", "mini_batch_size"), 1)
        self._at_least(("max_sample_rounds",), 1)
        if not 5 <= self.room_size <= 10:
            self._bad("room_size", "must be between 5 and 10 (a 2 x 2 inside has only corners)")
        if not self.mask_observations and self.env == "bandit":
            self._bad("mask_observations", "has nothing to unmask on the bandit (one turn)")
        if self.rollout_filter in ("top_k", "top_p", "dynamic") and self.num_generations < 2:
            self._bad("num_generations", "a group filter needs groups of at least 2")
        # each action is one token, separators too, and the stop word closes the turn
        need = 2 * (1 if self.env == "bandit" else self.max_actions_per_turn)
        if self.max_action_tokens < need:
            self._bad("max_action_tokens", f"must be >= {need} to write a whole turn")

    def check_data_parallel(self, world: int) -> None:
        super().check_data_parallel(world)
        if self.rollout_filter == "dynamic":  # (the ranks' task streams would part)
            why = f"'dynamic' (refill rounds differ between ranks) needs one process, not {world}"
            self._bad("rollout_filter", why + " ranks; use 'top_k' or 'top_p'")

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "room_size")

    def min_sequence_tokens(self) -> int:
        grid = {"bandit": 2, "frozenlake": self.map_size**2, "sokoban": self.room_size**2}
        side = {"bandit": 0, "frozenlake": self.map_size, "sokoban": self.room_size}
        return grid[self.env] + side[self.env] + 3 + self.max_action_tokens


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
    def make_task(self, split: str = "train"):
        check_split(split)
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
    rollout_is_sharded = True  # the agent's rollout; the 'dynamic' refill is refused under torchrun

    def rollout(self) -> Batch:
        """P seeds x N trajectories; with ``rollout_filter="dynamic"``, DAPO's refill: more seeds
        are played (up to ``max_sample_rounds`` rounds) until P groups have reward spread. With
        ``mask_observations=False`` the later states join the loss (RAGEN's paper runs)."""
        c = self.config
        if c.rollout_filter == "dynamic":
            batch, self.sample_rounds = filters.dynamic_sampling(
                super().rollout, groups=c.prompts_per_step, group_size=c.num_generations,
                max_rounds=c.max_sample_rounds, pad_token_id=self.tokenizer.pad_token_id,
            )  # fmt: skip
        else:
            batch = super().rollout()
        if not c.mask_observations:
            from .multiturn import unmask_environment_tokens  # imports transformers

            unmask_environment_tokens(batch, self.model, temperature=c.temperature)
        return batch

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
            **super().rollout_metrics(batch, keep),
        )

    def compute_loss(
        self, batch: Batch, advantages: torch.Tensor, *, outputs: tuple | None = None
    ) -> tuple[torch.Tensor, dict]:
        """The agent trainer's loss; with ``loss_denominator="policy"`` and the states trained
        (``mask_observations=False``), divided by the policy's own tokens (the control arm that
        separates the states' loss from their dilution of the policy's tokens)."""
        loss, metrics = super().compute_loss(batch, advantages, outputs=outputs)
        if self.config.loss_denominator == "policy":
            loss = over_policy_tokens(loss, batch)
        return loss, metrics

    def minibatches(self, n: int) -> list[torch.Tensor | None]:
        """RAGEN's minibatches: ``ceil(n / mini_batch_size)`` gradient steps over a random
        permutation of the rows (slices of equal size, up to one row)."""
        k = max(1, math.ceil(n / self.config.mini_batch_size))
        if k == 1:
            return [None]
        perm = torch.randperm(n)  # the global torch stream: seeded, and checkpointed
        return list(torch.tensor_split(perm, k))


CONFIG, TRAINER = StarPOConfig, StarPOTrainer
