"""The Early Experience lab's experiment: three warm starts from one initial policy per seed.

Per seed, one initial policy and one collection of early experience, shared; then imitation,
implicit world modelling and self-reflection (:func:`agentic_rl.early_experience.run_starts`),
each followed by the same GRPO. Per start the record holds every number of the evaluations after
the warm start and after RL (success in and out of domain, sampled and greedy; the next-state
loss), a fingerprint of the RL task stream (equal for every start of a seed), and the curves.
"""

from __future__ import annotations

import hashlib

from ..early_experience import STARTS, EarlyExperienceConfig, run_starts
from . import curves, evaluations

ARMS = {start: dict(start=start) for start in STARTS}
SEEDS = 8
REPLICATE = tuple(ARMS)  # the starts share the initial policy: a seed's three cost little more
CHECKED = ("before_id_sampled_success", "after_id_sampled_success",
           "before_id_next_state_loss", "after_ood_sampled_success")
FLOORS: dict[str, float] = {}
CURVES = ("success_rate", "num_turns")


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested starts of one seed, then GRPO from each: trainers by start."""
    config = EarlyExperienceConfig.from_profile(profile, seed=seed, disable_tqdm=True,
                                                device=device, **overrides)
    return run_starts(config, {arm: ARMS[arm] for arm in arms})


def task_stream(trainer) -> float:
    """A 48-bit fingerprint of where the RL task stream stands (equal: the same RL tasks)."""
    digest = hashlib.sha256(str(trainer.problem_rng.getstate()).encode()).hexdigest()
    return float(int(digest[:12], 16))


def measure(trainer, arm: str, seed: int) -> dict:
    """The evaluations after the warm start and after GRPO, the task stream, the curves."""
    metrics = evaluations(trainer)
    metrics["task_stream"] = task_stream(trainer)
    return {"metrics": metrics, "curves": curves(trainer.history, CURVES)}
