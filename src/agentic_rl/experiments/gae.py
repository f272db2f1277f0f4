"""The GAE lab's experiment: one warm start per seed on FrozenLake, then PPO with a critic at
lambda = 1 and 0.9, and GRPO without one, on the same budget of episodes per step.

Per seed, :func:`warm_start` trains the SFT model on mixed-quality demonstrations and evaluates
it; :func:`train_arm` runs an arm from a copy of it on the RL task stream that follows the warm
start's (the same lakes in the same order for every arm; GRPO plays each lake ``G = 4`` times, so
a quarter as many lakes per step). The lab's own seed-0 run is
``train_arm(warm_start(0), "PPO, λ=1")``: its teaching cells use the warm start before RL, and its
main run is still the record's seed 0.
"""

from __future__ import annotations

import math
import statistics

from ..agent import AgentTrainer, PPOConfig
from . import arms as lab_arms
from . import curves, evaluations

#: GRPO's group size; its lakes per step are the PPO arms' divided by it (same episodes).
GRPO_GROUP = 4
ARMS = {"PPO, λ=1": {}, "PPO, λ=0.9": dict(lam=0.9),
        "GRPO, G=4": dict(advantage_estimator="grpo", num_generations=GRPO_GROUP)}
SEEDS = 8
REPLICATE = ("PPO, λ=1",)
CHECKED = ("before_sampled_success", "after_sampled_success", "after_greedy_success",
           "clip_ratio_mean", "explained_variance_mean")
FLOORS: dict[str, float] = {}
CURVES = ("success_rate", "clip_ratio", "explained_variance", "entropy")


def warm_start(seed: int, *, profile="quick", device="cpu", **overrides) -> AgentTrainer:
    """The SFT'd trainer of one seed, evaluated (``evals["before"]``): the lab's config
    (:func:`agentic_rl.experiments.arms.warm_start`)."""
    config = PPOConfig.from_profile(profile, seed=seed, disable_tqdm=True, device=device,
                                    **overrides)
    return lab_arms.warm_start(AgentTrainer, config)


def train_arm(start: AgentTrainer, arm: str) -> AgentTrainer:
    """One arm's RL from a copy of the warm start, on the same episodes per step."""
    fields = dict(ARMS[arm])
    if "num_generations" in fields:
        fields["prompts_per_step"] = start.config.prompts_per_step // fields["num_generations"]
    return lab_arms.train_arm(start, **fields)


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested arms of one seed from one warm start: trainers by arm."""
    start = warm_start(seed, profile=profile, device=device, **overrides)
    return {arm: train_arm(start, arm) for arm in arms}


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def measure(trainer, arm: str, seed: int) -> dict:
    """The evaluations, the clip fractions, and what the critic learned (PPO arms)."""
    metrics = evaluations(trainer)
    h = trainer.history
    for key in ("clip_ratio", "vf_clip_ratio"):
        values = _finite(r.get(key) for r in h)
        metrics[f"{key}_mean"] = statistics.mean(values) if values else math.nan
        metrics[f"{key}_steps"] = float(sum(v > 0 for v in values))
    loss = _finite(r.get("value_loss") for r in h)
    ev = _finite(r.get("explained_variance") for r in h)
    metrics["value_loss_first3"] = statistics.mean(loss[:3]) if loss else math.nan
    metrics["value_loss_last10"] = statistics.mean(loss[-10:]) if loss else math.nan
    metrics["explained_variance_mean"] = statistics.mean(ev) if ev else math.nan
    metrics["explained_variance_max"] = max(ev) if ev else math.nan
    metrics["success_rate_last10"] = statistics.mean(r["success_rate"] for r in h[-10:])
    return {"metrics": metrics, "curves": curves(h, CURVES)}
