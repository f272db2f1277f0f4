"""The DAPO lab's experiment: one noisy-teacher SFT start per seed, then GRPO (the control),
DAPO, and DAPO without its dynamic sampling, at the same number of gradient steps.

Per seed, :func:`warm_start` trains the SFT model on the GRPO chapter's noisy teacher and evaluates
it; each arm then trains from a copy of it on the RL task stream that follows the warm start's
(:mod:`agentic_rl.experiments.arms`), so the arms start from the same weights and draw their
prompts from the same stream. Dynamic sampling draws more prompts per step: the lab compares the
arms at equal gradient steps, and counts the rollouts each one generated (``rollouts``).
"""

from __future__ import annotations

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
REPLICATE = ("GRPO", "DAPO")
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
