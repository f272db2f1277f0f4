"""The pretrained-model lab's experiment: GRPO with LoRA on SmolLM2-135M-Instruct, per seed.

Per seed, the packaged model (loaded offline, once per process, and copied for every trainer) gets
fresh LoRA adapters and 10 GRPO steps on the sums task (the ``pretrained`` profile, whatever the
runner's profile: the lab has no other). The record holds the evaluations before and after
(sampled, at the training temperature), the shapes of the greedy answers to the 32 held-out sums
before and after (number only, ``a + b = c``, other, cut off by the length limit), their lengths,
the KL to the base model at the last step, and the curves the lab plots.
"""

from __future__ import annotations

import copy
import functools
import re
import statistics

import torch

from ..envs.sums import is_bare_number
from ..grpo import GRPOConfig, GRPOTrainer
from ..models import load_pretrained
from ..rollout import generate_batch
from . import curves, evaluations

ALIAS = "smollm2-135m-instruct"
ARMS = {"GRPO, LoRA": {}}
SEEDS = 8
REPLICATE = ("GRPO, LoRA",)
CHECKED = ("before_sampled_accuracy", "after_sampled_accuracy", "after_sampled_format_rate",
           "cut_off_after")
FLOORS: dict[str, float] = {"cut_off_after": 1.0}  # a count of answers
SHAPES = ("number only", "a + b = c", "other", "cut off")
CURVES = ("reward_mean", "kl")


@functools.lru_cache(maxsize=1)
def base_model():
    """The packaged model and its tokenizer, loaded once per process (a copy goes to each seed)."""
    return load_pretrained(ALIAS)


def shape(text: str, cut: bool) -> str:
    """The shape of an answer."""
    if cut:
        return "cut off"
    if is_bare_number(text):
        return "number only"
    if re.search(r"\d+\s*\+\s*\d+\s*(=|is|equals)\s*-?\d+", text):
        return "a + b = c"
    return "other"


@torch.no_grad()
def greedy_answers(trainer) -> list[tuple[str, int, bool]]:
    """Greedy answers to the held-out sums: (text, generated tokens, cut off by the length
    limit)."""
    tok, c = trainer.tokenizer, trainer.config
    b = generate_batch(trainer.model, tok, trainer.task, trainer.eval_problems,
                       max_completion_length=c.max_completion_length, greedy=True,
                       compute_old_logprobs=False, chat=True)
    n = b.loss_mask.sum(1)
    last_index = b.loss_mask.shape[1] - 1 - b.loss_mask.flip(1).argmax(1)
    last = b.input_ids.gather(1, last_index[:, None])[:, 0]
    cut = (last != tok.eos_token_id).tolist()
    return list(zip(b.completions, n.tolist(), cut))


def config(seed: int, *, device="cpu", **overrides) -> GRPOConfig:
    """The lab's config for one seed: the ``pretrained`` profile."""
    return GRPOConfig.from_profile("pretrained", seed=seed, disable_tqdm=True, device=device,
                                   **overrides)


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """One seed: adapters on a copy of the packaged model, greedy answers before, GRPO."""
    model, tokenizer = base_model()
    trainer = GRPOTrainer(config(seed, device=device, **overrides),
                          base=(copy.deepcopy(model), tokenizer))
    trainer.answers_before = greedy_answers(trainer)
    trainer.train()
    trainer.answers_after = greedy_answers(trainer)
    return {arm: trainer for arm in arms}


def measure(trainer, arm: str, seed: int) -> dict:
    """The evaluations, the reward (accuracy + format weight x format rate), the answers' shapes
    and lengths before and after, and the KL at the last step."""
    metrics = evaluations(trainer)
    weight = trainer.task.format_weight
    for when in ("before", "after"):
        metrics[f"reward_{when}"] = (metrics[f"{when}_sampled_accuracy"]
                                     + weight * metrics[f"{when}_sampled_format_rate"])
        answers = getattr(trainer, f"answers_{when}")
        for name in SHAPES:
            key = name.replace(" + ", "_plus_").replace(" = ", "_is_").replace(" ", "_")
            metrics[f"{key}_{when}"] = float(sum(shape(t, c) == name for t, _, c in answers))
        metrics[f"tokens_{when}"] = statistics.mean(n for _, n, _ in answers)
    metrics["kl_last"] = trainer.history[-1]["kl"]
    metrics["trainable_share"] = (
        sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
        / sum(p.numel() for p in trainer.model.parameters()))
    return {"metrics": metrics, "curves": curves(trainer.history, CURVES)}
