"""The GRPO lab's experiment: one noisy-teacher SFT start per seed, then GRPO with groups of 8,
2 and 16 at the same budget of sampled answers per step.

Per seed, :func:`warm_start` trains the SFT model on the noisy teacher and evaluates it (256
held-out problems, greedy and 4 samples each); :func:`train_arm` runs GRPO from a copy of it, on
the RL task stream that follows the warm start's, so every arm sees the same problems in the same
order (more of them per step where the group is smaller: the budget of prompts x G answers is the
profile's). The lab's own seed-0 run is ``train_arm(warm_start(0), "G=8")``, so its teaching cells
can look at the warm start before RL and its main run is still the record's seed 0.
"""

from __future__ import annotations

import statistics

from ..grpo import GRPOConfig, GRPOTrainer
from . import arms as lab_arms
from . import curves, evaluations

ARMS = {"G=8": dict(num_generations=8), "G=2": dict(num_generations=2),
        "G=16": dict(num_generations=16)}
SEEDS = 8
REPLICATE = ("G=8",)
CHECKED = ("before_sampled_accuracy", "after_sampled_accuracy", "after_greedy_accuracy",
           "frac_reward_zero_std_mean")
FLOORS: dict[str, float] = {}
#: The per-step metrics the lab reads as first-10 and last-10 means and as a mean over the run.
STEP_KEYS = ("accuracy", "entropy", "kl", "frac_reward_zero_std", "grad_norm")
CURVES = ("accuracy", "entropy", "frac_reward_zero_std", "kl")


def warm_start(seed: int, *, profile="quick", device="cpu", **overrides) -> GRPOTrainer:
    """The SFT'd trainer of one seed, evaluated (``evals["before"]``): the lab's config, with the
    KL to the starting policy logged (:func:`agentic_rl.experiments.arms.warm_start`)."""
    config = GRPOConfig.from_profile(profile, seed=seed, disable_tqdm=True, log_kl=True,
                                     device=device, **overrides)
    return lab_arms.warm_start(GRPOTrainer, config)


def train_arm(start: GRPOTrainer, arm: str) -> GRPOTrainer:
    """GRPO from a copy of the warm start, with the arm's group size at the profile's budget."""
    budget = start.config.prompts_per_step * start.config.num_generations
    group = ARMS[arm]["num_generations"]
    return lab_arms.train_arm(start, num_generations=group, prompts_per_step=budget // group)


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested arms of one seed from one warm start: trainers by arm."""
    start = warm_start(seed, profile=profile, device=device, **overrides)
    return {arm: train_arm(start, arm) for arm in arms}


def measure(trainer, arm: str, seed: int) -> dict:
    """The evaluations before and after RL, the per-step metrics early, late and over the run."""
    metrics = evaluations(trainer)
    before, after = metrics["before_sampled_accuracy"], metrics["after_sampled_accuracy"]
    metrics["sampled_ratio"] = after / before if before else float("nan")
    h = trainer.history
    for key in STEP_KEYS:
        metrics[f"{key}_first10"] = statistics.mean(r[key] for r in h[:10])
        metrics[f"{key}_last10"] = statistics.mean(r[key] for r in h[-10:])
        metrics[f"{key}_mean"] = statistics.mean(r[key] for r in h)
    metrics["grad_norm_median"] = statistics.median(r["grad_norm"] for r in h)
    metrics["abs_loss_mean"] = statistics.mean(abs(r["loss"]) for r in h)
    return {"metrics": metrics, "curves": curves(h, CURVES)}
