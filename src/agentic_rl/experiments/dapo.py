"""The DAPO lab's experiment: one noisy-teacher SFT start per seed, then GRPO (the control),
DAPO, and DAPO without its dynamic sampling, at the same number of gradient steps.

Per seed, :func:`warm_start` trains the SFT model on the GRPO chapter's noisy teacher and evaluates
it; each arm then trains from a copy of it on the RL task stream that follows the warm start's
(:mod:`agentic_rl.experiments.arms`), so the arms start from the same weights and draw their
prompts from the same stream. Dynamic sampling draws more prompts per step: the lab compares the
arms at equal gradient steps, and counts the rollouts each one generated (``rollouts``).
"""

from __future__ import annotations

import copy
import dataclasses
import statistics

from ..dapo import DAPOConfig, DAPOTrainer
from . import arms as lab_arms
from . import curves, evaluations

ARMS = {
    "GRPO": dict(DAPOConfig.PRESETS["grpo"], preset="grpo"),
    "DAPO": {},
    "DAPO, no dynamic sampling": dict(dynamic_sampling=False),
}
SEEDS = 8
REPLICATE = ("DAPO",)  # (the GRPO arm is the GRPO lab's own run: the same numbers)
CHECKED = ("before_sampled_accuracy", "after_sampled_accuracy", "entropy_last10",
           "completion_length_last10")
FLOORS: dict[str, float] = {"completion_length_last10": 0.05}
#: The per-step metrics the lab reads as first-10 and last-10 means.
STEP_KEYS = ("accuracy", "entropy", "frac_reward_zero_std", "completion_length", "truncated_rate",
             "clip_ratio")
CURVES = ("accuracy", "entropy", "frac_reward_zero_std", "completion_length", "sample_rounds")


def warm_start(seed: int, *, profile="quick", device="cpu", **overrides) -> DAPOTrainer:
    """The SFT'd trainer of one seed, evaluated (``evals["before"]``)."""
    config = DAPOConfig.from_profile(profile, seed=seed, disable_tqdm=True, device=device,
                                     **overrides)
    return lab_arms.warm_start(DAPOTrainer, config)


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested arms of one seed from one warm start: trainers by arm."""
    start = warm_start(seed, profile=profile, device=device, **overrides)
    return {arm: lab_arms.train_arm(start, **ARMS[arm]) for arm in arms}


def train_from(start, arm: str) -> DAPOTrainer:
    """An arm trained from another trainer's warm start of the same seed and profile: the GRPO
    lab's, whose SFT reads none of DAPO's fields, so that its weights and task stream are those
    of :func:`warm_start` (the record's GRPO arm equals the GRPO record's G = 8 on every seed)."""
    c = start.config
    config = DAPOConfig.from_profile(c.profile, seed=c.seed, disable_tqdm=True, device=c.device)
    config = dataclasses.replace(config, sft_steps=0, **ARMS[arm])
    trainer = DAPOTrainer(config, model=copy.deepcopy(start.model), tokenizer=start.tokenizer)
    trainer.sft_history = list(start.sft_history)
    trainer.problem_rng.setstate(start.rl_tasks)  # the RL tasks follow the warm start's
    trainer.evals["before"] = start.evals["before"]
    trainer.train()
    return trainer


def measure(trainer, arm: str, seed: int) -> dict:
    """The evaluations before and after RL, the per-step metrics early and late, and the rollouts
    generated (prompts x G per round played)."""
    metrics = evaluations(trainer)
    h, c = trainer.history, trainer.config
    for key in STEP_KEYS:
        metrics[f"{key}_first10"] = statistics.mean(r[key] for r in h[:10])
        metrics[f"{key}_last10"] = statistics.mean(r[key] for r in h[-10:])
    rounds = sum(r["sample_rounds"] for r in h)
    metrics["rollouts"] = rounds * c.prompts_per_step * c.num_generations
    metrics["skipped_steps"] = sum(r["skipped"] for r in h)
    return {"metrics": metrics, "curves": curves(h, CURVES)}
