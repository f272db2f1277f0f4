"""The agent LLM lab's experiment: ReTool's recipe on SmolLM2-135M-Instruct with LoRA, per seed.

Per seed, the packaged model (loaded offline, once per process, and copied for every trainer)
gets fresh LoRA adapters; the untrained model answers the held-out problems greedily
(:func:`untrained`); then a short LoRA SFT on expert conversations in its chat template and GRPO
with the interpreter in the loop and its turn masked (ReTool's ``pretrained`` profile, whatever the
runner's profile: the lab has no other). The record holds the untrained model's greedy accuracy,
every number of the evaluations after the warm start and after GRPO, and the curves the lab plots.
"""

from __future__ import annotations

import copy

from ..retool import ReToolConfig, ReToolTrainer
from . import curves, evaluations
from .pretrained import base_model

ARMS = {"ReTool GRPO, LoRA": {}}
SEEDS = 8
REPLICATE = ("ReTool GRPO, LoRA",)
CHECKED = ("untrained_greedy_accuracy", "before_sampled_accuracy", "after_sampled_accuracy",
           "before_sampled_code_ratio", "after_sampled_code_ratio")
FLOORS: dict[str, float] = {}
CURVES = ("reward_mean", "accuracy", "code_ratio", "tool_calls")


def trainer(seed: int, *, device="cpu", **overrides) -> ReToolTrainer:
    """The lab's trainer for one seed (the ``pretrained`` profile), on a copy of the model."""
    model, tokenizer = base_model()
    config = ReToolConfig.from_profile("pretrained", seed=seed, disable_tqdm=True,
                                       device=device, **overrides)
    return ReToolTrainer(config, base=(copy.deepcopy(model), tokenizer))


def untrained(trainer: ReToolTrainer):
    """The untrained model's greedy episodes on the held-out problems (returned), their accuracy
    and well-formed share kept as ``trainer.evals["untrained"]``."""
    batch = trainer.play(trainer.eval_problems, greedy=True)
    trainer.evals["untrained"] = {
        "greedy_accuracy": batch.correct.float().mean().item(),
        "greedy_format_rate": batch.format_ok.float().mean().item(),
    }
    return batch


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """One seed: the untrained model's greedy answers, then SFT and GRPO (``trainer.train()``)."""
    t = trainer(seed, device=device, **overrides)
    untrained(t)
    t.train()
    t.close()
    return {arm: t for arm in arms}


def measure(trainer: ReToolTrainer, arm: str, seed: int) -> dict:
    """The evaluations (untrained, after the warm start, after GRPO) and the curves."""
    return {"metrics": evaluations(trainer), "curves": curves(trainer.history, CURVES)}
