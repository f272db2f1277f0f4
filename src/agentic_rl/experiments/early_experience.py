"""The Early Experience lab's experiment: six warm starts from one initial policy per seed.

Per seed, one initial policy and one collection of early experience, shared; then each arm's
warm start (:func:`agentic_rl.early_experience.run_starts`) and the same GRPO. The arms are the
paper's three starts and three controls: world modelling kept up during imitation (a mixed
schedule), and two reflection arms on the same rows, one with the rationale untrained, one with
each row's rationale taken from another pair. Per arm the record holds every number of the
evaluations after the warm start and after RL (success in and out of domain, sampled and greedy;
the next-state loss), the next-state loss at the end of the initial policy and of the
world-modelling stage, the early experience's make-up, a fingerprint of the RL task stream (equal
for every arm of a seed), and the curves: GRPO's, and the next-state loss through the warm start.
"""

from __future__ import annotations

import hashlib

from ..early_experience import EarlyExperienceConfig, probe_steps, run_starts
from . import curves, evaluations

ARMS = {
    "imitation": dict(start="imitation"),
    "world_model": dict(start="world_model"),
    "world_model_mixed": dict(start="world_model", world_model_mix=0.25),
    "reflection": dict(start="reflection"),
    "reflection_untrained": dict(start="reflection", rationale="untrained"),
    "reflection_shuffled": dict(start="reflection", rationale="shuffled"),
}
SEEDS = 8
REPLICATE = ("world_model",)  # the initial policy, the data, a warm start and GRPO: all of it
CHECKED = ("before_id_sampled_success", "after_id_sampled_success",
           "before_id_next_state_loss", "stage_id_next_state_loss", "after_ood_sampled_success")
FLOORS: dict[str, float] = {}
CURVES = ("success_rate", "num_turns")
PROBES = "warm_next_state_loss"  # the curve of the next-state loss, at ``probe_steps``


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested arms of one seed, then GRPO from each: trainers by arm."""
    config = EarlyExperienceConfig.from_profile(profile, seed=seed, disable_tqdm=True,
                                                device=device, **overrides)
    return run_starts(config, {arm: ARMS[arm] for arm in arms})


def task_stream(trainer) -> float:
    """A 48-bit fingerprint of where the RL task stream stands (equal: the same RL tasks)."""
    digest = hashlib.sha256(str(trainer.problem_rng.getstate()).encode()).hexdigest()
    return float(int(digest[:12], 16))


def measure(trainer, arm: str, seed: int) -> dict:
    """The evaluations after the warm start and after GRPO, the next-state loss at the end of
    the initial policy (``initial_``) and of the world-modelling stage (``stage_``, the same
    step for every arm), the early experience's make-up, the task stream, the curves."""
    c = trainer.config
    metrics = evaluations(trainer)
    metrics["initial_id_next_state_loss"] = trainer.probes[c.initial_steps]
    metrics["stage_id_next_state_loss"] = trainer.probes[c.initial_steps + c.world_model_steps]
    metrics.update({k: v for k, v in trainer.summary().items()
                    if k.startswith(("experience_", "proposals_"))})
    metrics["task_stream"] = task_stream(trainer)
    out = curves(trainer.history, CURVES)
    out[PROBES] = [trainer.probes[step] for step in probe_steps(c)]
    return {"metrics": metrics, "curves": out}
