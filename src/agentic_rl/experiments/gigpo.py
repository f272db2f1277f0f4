"""The GiGPO lab's experiment: four arms at two horizons on an unsaturated household.

A fair test of GiGPO's claim needs a task where credit assignment can matter and controls that
separate its parts. Per seed and horizon (``short``: 2 turns of slack beyond the optimal plan, at
most 8 turns; ``long``: 6 turns of slack, at most 12), one SFT start, stopped by
:func:`sft_until` at the first check where greedy success on 32 validation tasks reaches 0.3
(SFT on this task jumps from 0 to near 1 within a few tens of steps, at a point that depends on
the seed: a fixed number of steps gives saturated starts on some seeds and dead ones on others).
Episodes are sampled at temperature 0.7 (in training and in the sampled evaluation): from such a
start, at temperature 1, under 1 % of the sampled episodes succeed and neither arm learned in 40
steps (a pilot of one seed).
From it, four RL arms on the same task stream (:func:`agentic_rl.runs.run_arms`):

- ``GRPO``: omega = 0 (verl-agent's row-weighted episode statistics, as GiGPO's own);
- ``GRPO-disc``: omega = 0, the episode's return discounted to its start (gamma^(T-1) R): the
  preference for short paths that GiGPO's discounted step returns give, without anchors;
- ``GiGPO``: omega = 1, gamma = 0.95;
- ``GiGPO-shuffled``: omega = 1 with the anchors permuted within each episode group (the same
  step-group sizes, random membership): a placebo for "the same state".

Each arm reports success before and after (64 held-out tasks, greedily and 4 samples each), the
mean training success over the RL steps (the area under the success curve, per step), the
within-state AUC of its advantages against the environment's good / other labels (logged every
step), and the anchor statistics.
"""

from __future__ import annotations

import numpy as np
import torch

from ..advantages import group_advantages
from ..envs import HouseholdEnv
from ..gigpo import GiGPOConfig, GiGPOTrainer, gigpo_advantages
from ..runs import run_arms
from ..utils import eval_seeds, fixed_rng
from . import curves, evaluations

#: The four arms' fields (the method and its controls).
METHODS = {
    "GRPO": dict(step_advantage_weight=0.0),
    "GRPO-disc": dict(step_advantage_weight=0.0, discount_episode_return=True),
    "GiGPO": dict(step_advantage_weight=1.0),
    "GiGPO-shuffled": dict(step_advantage_weight=1.0, shuffle_anchors=True),
}
#: The two horizons: turns of slack beyond the optimal plan (of 2 to 6 actions), and the cap.
HORIZONS = {"short": dict(slack=2, max_turns=8), "long": dict(slack=6, max_turns=12)}
ARMS = {f"{m} {h}": {**fields, **HORIZONS[h]} for h in HORIZONS for m, fields in METHODS.items()}
SEEDS = 8
REPLICATE = ("GRPO long", "GiGPO long")
CHECKED = ("before_greedy_success", "after_sampled_success", "success_auc", "state_auc_mean")
FLOORS: dict[str, float] = {}
#: The quick profile's sizes: SFT stops by :func:`sft_until` (at most ``sft_steps``), 40 RL steps.
QUICK = dict(sft_steps=400, max_steps=40)
#: The warm-start rule: greedy success on the validation tasks at or above TARGET, checked after
#: FIRST SFT steps and then every EVERY steps.
TARGET, FIRST, EVERY, VALIDATION = 0.3, 120, 10, 32
#: The anchor statistics logged every RL step, with the lab's names for them.
ANCHOR_KEYS = {
    "recurring_share": "steps in step groups > 1",
    "singleton_group_share": "step groups of one step",
    "step_episode_corr": "corr(A^S, A^E)",
    "state_auc": "within-state AUC of the advantage",
    "state_auc_episode": "within-state AUC of A^E",
}
CURVES = ("success_rate", "state_auc", "recurring_share")


def config(seed: int, *, profile: str = "quick", device: str = "cpu", **overrides) -> GiGPOConfig:
    """The lab's config for one seed (before an arm's fields)."""
    sizes = dict(QUICK) if profile == "quick" else {}
    fields = dict(max_turns=8, max_action_tokens=5, demo_error_rate=0.15, temperature=0.7, **sizes)
    fields.update(overrides)
    return GiGPOConfig.from_profile(
        profile, env="household", seed=seed, disable_tqdm=True, device=device, **fields
    )


def validation_success(trainer) -> float:
    """Greedy success on VALIDATION held-out tasks beyond the evaluation's (no RNG is used)."""
    c = trainer.config
    seeds = eval_seeds(c.seed, c.eval_size + VALIDATION)[c.eval_size :]
    with fixed_rng(97531, trainer.device):
        return trainer.play(seeds, greedy=True).extras["success"].float().mean().item()


def sft_until(trainer) -> None:
    """SFT until greedy validation success reaches TARGET (checked after FIRST steps, then every
    EVERY), or ``sft_steps``; ``trainer.validation`` keeps each check as ``(step, success)``."""
    trainer.validation = []
    trainer.sft(FIRST)
    while trainer.phase == "sft":
        trainer.validation.append((trainer.step, validation_success(trainer)))
        if trainer.validation[-1][1] >= TARGET:
            break
        trainer.sft(EVERY)


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The arms of one seed, one SFT start per horizon, one task stream: trainers by arm."""
    chosen = {arm: ARMS[arm] for arm in arms}
    start = config(seed, profile=profile, device=device, **overrides)
    return run_arms(
        GiGPOTrainer, start, chosen, start_fields=("slack", "max_turns"), warm_start=sft_until
    )


def optimal_length(task_seed: int) -> int:
    """The number of actions of the task's shortest plan."""
    env = HouseholdEnv(max_turns=8)
    env.reset(task_seed)
    return len(env.plan())


@torch.no_grad()
def solved_turns(trainer, samples: int = 4) -> tuple[float, float]:
    """(turns per solved episode, excess turns over the optimal plan per solved episode), on the
    held-out tasks x ``samples`` episodes, one fixed sampling stream."""
    with fixed_rng(2468, trainer.device):
        b = trainer.play(trainer.eval_problems, group_size=samples)
    solved = b.extras["success"].bool()
    turns = b.extras["num_turns"].double()
    best = torch.tensor(
        [optimal_length(s) for s in trainer.eval_problems for _ in range(samples)],
        dtype=torch.float64,
    )
    if not solved.any():
        return float("nan"), float("nan")
    return turns[solved].mean().item(), (turns - best)[solved].mean().item()


@torch.no_grad()
def omega0_gap(trainer) -> float:
    """On one rollout batch of the final policy (a fixed stream): max |A(omega = 0, per-episode
    statistics) - GRPO's advantage|, which must be 0."""
    with fixed_rng(4321, trainer.device):
        batch = trainer.rollout()
    rows = trainer.step_rows(batch)
    per_episode = gigpo_advantages(**rows, gamma=0.95, omega=0.0, cross_steps=False)[2]
    grpo = group_advantages(batch.scores.double(), batch.group_id)
    return (per_episode - grpo[torch.tensor(rows["episode_ids"])]).abs().max().item()


def measure(trainer, arm: str, seed: int) -> dict:
    """Everything the lab reports about one trained arm."""
    metrics = evaluations(trainer)
    h = trainer.history
    metrics["sft_steps_used"] = float(len(trainer.sft_history))
    metrics["success_auc"] = float(np.mean([r["success_rate"] for r in h]))
    metrics["first_success_rate"] = h[0]["success_rate"]
    metrics["solved_turns"], metrics["solved_excess_turns"] = solved_turns(trainer)
    for key in ANCHOR_KEYS:
        values = [r[key] for r in h]
        if np.isnan(values).all():
            metrics.update({f"{key}_{k}": float("nan") for k in ("first10", "last10", "mean")})
            continue
        metrics[f"{key}_first10"] = float(np.nanmean(values[:10]))
        metrics[f"{key}_last10"] = float(np.nanmean(values[-10:]))
        metrics[f"{key}_mean"] = float(np.nanmean(values))
    metrics["state_auc_pairs_mean"] = float(np.mean([r["state_auc_pairs"] for r in h]))
    metrics["fresh_omega0_gap"] = omega0_gap(trainer)
    return {"metrics": metrics, "curves": curves(h, CURVES)}
