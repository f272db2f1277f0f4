"""The GCD lab's experiment: six arms from two SFT starts per seed.

Per seed, one SFT start on the flawed teacher and one that also learned to judge
(``judge_sft_weight``); from copies of them, with the same tasks and sampling stream, GRPO (the
judge never trained: the control), GCD with oracle, advantage or outcome labels, and from the
judged start GRPO and GCD with oracle labels (:data:`agentic_rl.gcd.ARMS`). Per arm the record
holds every number of the evaluations after the warm start and after RL (success, flawed-action
rates, the judge's balanced accuracy and AUROC against each label rule, gradient coupling and its
same-word control, in and out of domain) and the curves the lab plots.
"""

from __future__ import annotations

import statistics

from .. import gcd
from . import curves, evaluations

ARMS = dict(gcd.ARMS)
SEEDS = 8
#: the plain start's control and GCD, and the judged start's: both comparisons the lab makes
REPLICATE = ("GRPO", "GCD oracle", "GRPO, judged SFT", "GCD oracle, judged SFT")
CHECKED = ("before_id_sampled_success", "after_id_sampled_success",
           "after_id_sampled_flawed_rate", "after_ood_sampled_success")
FLOORS: dict[str, float] = {}
CURVES = ("success_rate", "flawed_rate", "grad_norm", "grad_cos", "grad_cos_control")


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested arms of one seed, from their shared SFT starts: trainers by arm."""
    lab = dict(coupling_every=15, num_probes=32 if profile == "quick" else 64)
    lab.update(overrides)
    config = gcd.GCDConfig.from_profile(profile, seed=seed, disable_tqdm=True, device=device,
                                        **lab)
    return gcd.run_arms(config, {arm: ARMS[arm] for arm in arms})


def measure(trainer, arm: str, seed: int) -> dict:
    """The evaluations before and after RL, the mean gradient norm, and the curves."""
    metrics = evaluations(trainer)
    metrics["mean_grad_norm"] = statistics.mean(r["grad_norm"] for r in trainer.history)
    return {"metrics": metrics, "curves": curves(trainer.history, CURVES)}
