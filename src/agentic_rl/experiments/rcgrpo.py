"""The RC-GRPO lab's experiment: nine arms from four warm starts per seed.

Per seed, four warm starts on the BFCL-style file system (SFT on the successful demonstrations;
RCTP on all of them with their reward tokens, success-matched, step-matched and epoch-matched),
then, from copies of them with the same tasks and sampling stream, the nine RL arms of
:data:`agentic_rl.rcgrpo.ARMS` (the paper's ablation, the step-matched and epoch-matched pairs,
RC-GRPO with a KL anchor). Per arm the record holds every number of the evaluations after the warm
start and after RL (success greedy, sampled under the evaluation token and under the low token, by
family; zero-std groups of the held-out tasks), the separation of the two tokens by family, the
training metrics averaged over the RL steps, the curves the lab plots, what its warm start trained
on (``warm_updates``, ``warm_rows``, ``warm_successes``) and the warm start's learning curve
(:func:`warm_start_with_curve`: held-out sampled success every :data:`CURVE_EVERY` warm-start steps,
as the curves ``warm_step``, ``warm_updates``, ``warm_sampled_success`` (``_easy``, ``_hard``) and,
for the RCTP starts, ``warm_low_success``), so that the lab can say whether each start is on its
plateau.
"""

from __future__ import annotations

import math
import statistics

import torch

from .. import rcgrpo
from ..utils import eval_sampling_seed, fixed_rng
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
#: The warm starts' learning curves: the held-out evaluation after every CURVE_EVERY warm-start
#: steps (the last point: at sft_steps, the arm's ``before_sampled_success``)
CURVE_EVERY = 100
WARM_CURVE = ("step", "updates", "sampled_success", "sampled_success_easy",
              "sampled_success_hard", "low_success")
WARM_SEEN = ("updates", "rows", "successes")


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu",
          curve_every: int | None = CURVE_EVERY, **overrides) -> dict:
    """The requested arms of one seed, from their shared warm starts: trainers by arm (the lab's
    config: the profile's, nothing changed). Each trainer holds its warm start's learning curve
    (``warm_curve``, every ``curve_every`` steps; ``None``: none) and ``warm_seen``."""
    config = rcgrpo.RCGRPOConfig.from_profile(
        profile, seed=seed, disable_tqdm=True, device=device, **overrides
    )
    chosen = {arm: ARMS[arm] for arm in arms}

    def warm_start(trainer):
        warm_start_with_curve(trainer, curve_every)

    return rcgrpo.run_arms(config, chosen, warm_start=warm_start)


def warm_start_with_curve(trainer, every: int | None = CURVE_EVERY) -> list[dict]:
    """Train ``trainer``'s warm start to its end (``sft_steps``) in chunks of ``every`` steps,
    evaluating after each (:func:`warm_evaluation`): ``trainer.warm_curve``, one row per check
    (``step``: warm-start steps, ``updates``: gradient steps so far). ``every=None``: one chunk,
    no check (the trained weights are the same either way)."""
    trainer.warm_curve = []
    while trainer.phase == "sft":
        trainer.sft(every)
        if every:
            step = trainer.step if trainer.phase == "sft" else trainer.config.sft_steps
            updates = trainer.warm_seen["updates"]
            trainer.warm_curve.append(dict(step=step, updates=updates, **warm_evaluation(trainer)))
    return trainer.warm_curve


@torch.no_grad()
def warm_evaluation(trainer) -> dict:
    """The warm start's held-out success now: the evaluation's sampled runs (its held-out tasks
    x ``eval_samples``, its own sampling stream, under high_token for an RCTP start and no token
    for SFT; then, for RCTP, under low_token), by family. It moves no random stream of the
    training and leaves the model in the mode it found it in; at the end of the warm start its
    numbers are the arms' ``before_sampled_success`` and ``before_low_success`` (an SFT start's:
    those of its arm without tokens, ``SFT -> GRPO``)."""
    c, seeds, out = trainer.config, trainer.eval_problems, {}
    rctp, training = c.warm_start == "rctp", trainer.model.training
    runs = [("sampled", c.high_token if rctp else None)] + ([("low", c.low_token)] if rctp else [])
    with fixed_rng(eval_sampling_seed(c.seed), trainer.device):  # (greedy draws nothing)
        for name, token in runs:
            envs = trainer.conditioned_envs([token] * len(seeds) * c.eval_samples)
            b = trainer.play(seeds, group_size=c.eval_samples, envs=envs)
            ok, hard = b.extras["success"].float(), b.extras["hard"]
            out[f"{name}_success"] = ok.mean().item()
            if name == "sampled":
                out["sampled_success_easy"] = ok[~hard].mean().item() if (~hard).any() else None
                out["sampled_success_hard"] = ok[hard].mean().item() if hard.any() else None
    trainer.model.train(training)
    return out


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
    seen = getattr(trainer, "warm_seen", {})
    metrics.update({f"warm_{k}": float(seen[k]) for k in WARM_SEEN if k in seen})
    out = curves(trainer.history, CURVES)
    warm = curves(getattr(trainer, "warm_curve", []), WARM_CURVE)
    out.update({f"warm_{k}": v for k, v in warm.items() if v})
    return {"metrics": metrics, "curves": out}
