"""The RC-GRPO lab's experiment: seven arms from three warm starts per seed.

Per seed, three warm starts on the BFCL-style file system (SFT on the successful demonstrations;
RCTP on all of them with their reward tokens, success-matched and step-matched), then, from copies
of them with the same tasks and sampling stream, the seven RL arms of :data:`agentic_rl.rcgrpo.ARMS`
(the paper's ablation, the step-matched pair, RC-GRPO with a KL anchor). Per arm the record holds
every number of the evaluations after the warm start and after RL (success greedy, sampled under
the evaluation token and under the low token, by family; zero-std groups of the held-out tasks),
the separation of the two tokens by family, the training metrics averaged over the RL steps, and
the curves the lab plots.
"""

from __future__ import annotations

import math
import statistics

from .. import rcgrpo
from . import curves, evaluations

ARMS = dict(rcgrpo.ARMS)
SEEDS = 8
#: the paper's four arms: the attribution (RCTP instead of SFT, the draw instead of the high
#: token) and the zero-std cut; they need two of the three warm starts
REPLICATE = ("SFT -> GRPO", "RCTP -> GRPO", "RCTP -> RC-GRPO", "SFT -> RC-GRPO")
CHECKED = ("before_sampled_success", "after_sampled_success", "before_zero_std",
           "frac_reward_zero_std_mean", "mean_abs_advantage_mean")
#: 64 held-out groups: a zero-std share moves in steps of 1/64
FLOORS: dict[str, float] = {"before_zero_std": 0.02}
#: the training metrics the lab averages over the RL steps (steps where they exist)
STEP_MEANS = ("frac_reward_zero_std", "zero_std_easy", "zero_std_hard", "mean_abs_advantage",
              "success_rate", "high_success", "low_success")
CURVES = ("frac_reward_zero_std", "zero_std_easy", "mean_abs_advantage", "grad_norm",
          "success_rate")


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested arms of one seed, from their shared warm starts: trainers by arm (the lab's
    config: the profile's, nothing changed)."""
    config = rcgrpo.RCGRPOConfig.from_profile(
        profile, seed=seed, disable_tqdm=True, device=device, **overrides
    )
    return rcgrpo.run_arms(config, {arm: ARMS[arm] for arm in arms})


def _step_mean(history: list[dict], key: str) -> float:
    values = [r[key] for r in history if r.get(key) is not None]
    return statistics.mean(values) if values else math.nan


def measure(trainer, arm: str, seed: int) -> dict:
    """The evaluations before and after RL, the separation by family, the training metrics
    averaged over the RL steps, and the curves."""
    metrics = evaluations(trainer)
    for when in ("before", "after"):
        for family in ("easy", "hard"):
            high = metrics.get(f"{when}_sampled_success_{family}", math.nan)
            low = metrics.get(f"{when}_low_success_{family}", math.nan)
            metrics[f"{when}_separation_{family}"] = high - low
    for key in STEP_MEANS:
        metrics[f"{key}_mean"] = _step_mean(trainer.history, key)
    return {"metrics": metrics, "curves": curves(trainer.history, CURVES)}
