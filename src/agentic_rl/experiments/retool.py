"""The ReTool lab's experiment: the interpreter feedback mask, its control, PPO, and GRPO-RoC.

Per seed, :func:`warm_start` trains the cold-start model on synthetic tool traces and evaluates
it; :func:`train_arm` runs an arm from a copy of it on the RL task stream that follows the warm
start's. Five GRPO arms share the plain cold start (the mask on and off; the control, unmasked
with the policy's tokens as the token mean's denominator and no clipping; its placebo, whose
interpreter tokens get random-sign advantages; the masked arm without clipping, the control's
reference), and so does PPO with a critic (the mask on, one episode per problem, as many
episodes per step). GRPO and GRPO-RoC share a second cold start whose traces include retries
after a tool error. The lab's own seed-0 runs are ``train_arm(warm_start(0), arm)``: its
teaching cells use the cold start before RL.

Per arm the record holds every number of the evaluations after the cold start and after RL, the
pre-clip norm of every gradient step (:func:`record_grad_norms`; how many the clip touched), the
interpreter tokens' share of the gradient's norm, the log-probability the policy gives the
interpreter's tags and output (:func:`interpreter_logprob_split`), and the curves the lab plots.
"""

from __future__ import annotations

import math
import statistics

import torch

from ..envs.multiply import END_INTERP, INTERP
from ..retool import ReToolConfig, ReToolTrainer, interpreter_tokens
from ..rollout import sequence_logprobs
from . import NO_CLIP, curves, evaluations
from . import arms as lab_arms

#: the cold start each arm trains from: the plain traces, or traces with retries after an error
RETRY_TRACES = dict(demo_retry_rate=0.3)
ARMS = {
    "masked": dict(mask_interpreter=True),
    "unmasked": dict(mask_interpreter=False),
    # the unmasked loss, with the policy's tokens as the token mean's denominator, never clipped
    "control": dict(mask_interpreter=False, loss_denominator="policy", max_grad_norm=NO_CLIP),
    # the control with a random sign on each interpreter token's advantage: the same term's size
    # in AdamW's per-coordinate normaliser (its scale effect on the policy's step), no imitation
    "control, placebo": dict(mask_interpreter=False, loss_denominator="policy",
                             max_grad_norm=NO_CLIP, interpreter_placebo=True),
    "masked, unclipped": dict(mask_interpreter=True, max_grad_norm=NO_CLIP),
    # one episode per problem, as many problems: the critic is the baseline, not a group
    "PPO + GAE, masked": dict(advantage_estimator="gae", num_generations=1),
    "GRPO, retry traces": dict(RETRY_TRACES, grad_share_every=0),
    "GRPO-RoC, retry traces": dict(RETRY_TRACES, grad_share_every=0, resample_on_correct=True),
}
_RETRY_ARMS = frozenset(a for a, f in ARMS.items() if "demo_retry_rate" in f)
SEEDS = 8
#: the four arms of the mask's comparison, from the lab's own cold start
REPLICATE = ("masked", "unmasked", "control", "masked, unclipped")
CHECKED = ("before_sampled_accuracy", "after_sampled_accuracy", "after_greedy_accuracy",
           "after_sampled_code_ratio", "after_hallucination_rate", "clipped_steps")
#: a count of gradient steps moves in steps of 1
FLOORS: dict[str, float] = {"clipped_steps": 1.0}
CURVES = ("accuracy", "code_ratio", "tool_calls", "grad_share", "clip_ratio",
          "error_rate_in_positives")


def warm_start(seed: int, *, profile="quick", device="cpu", retry_traces=False,
               **overrides) -> ReToolTrainer:
    """The cold-start trainer of one seed, evaluated (``evals["before"]``): the lab's config,
    with retries in the traces if ``retry_traces``."""
    if retry_traces:
        overrides = {**RETRY_TRACES, **overrides}
    config = ReToolConfig.from_profile(profile, seed=seed, disable_tqdm=True, device=device,
                                       **overrides)
    return lab_arms.warm_start(ReToolTrainer, config)


def record_grad_norms(trainer: ReToolTrainer) -> list[float]:
    """Keep the norm of every gradient step before clipping (two per RL step here), in the list
    returned (and ``trainer.grad_norms``); the history keeps one per RL step."""
    norms, step = [], trainer.optimizer_step

    def recorded(loss):
        norm, skipped = step(loss)
        norms.append(norm)
        return norm, skipped

    trainer.optimizer_step = recorded
    trainer.grad_norms = norms
    return norms


def train_arm(start: ReToolTrainer, arm: str) -> ReToolTrainer:
    """One arm's RL from a copy of the cold start (its sandbox pool closed after), with every
    gradient step's pre-clip norm recorded."""
    fields = {k: v for k, v in ARMS[arm].items() if k not in RETRY_TRACES}
    if (start.config.demo_retry_rate > 0) != (arm in _RETRY_ARMS):
        raise ValueError(f"arm {arm!r} trains from the other cold start: "
                         f"warm_start(seed, retry_traces={arm in _RETRY_ARMS})")
    if fields.get("num_generations") == 1:  # as many episodes per step as the GRPO arms
        fields["prompts_per_step"] = start.config.prompts_per_step * start.config.num_generations
    trainer = lab_arms.arm_trainer(start, **fields)
    record_grad_norms(trainer)
    trainer.train()
    trainer.close()
    return trainer


def train(seed: int, arms=tuple(ARMS), *, profile="quick", device="cpu", **overrides) -> dict:
    """The requested arms of one seed, from their cold starts: trainers by arm."""
    out = {}
    for retry in (False, True):
        group = [a for a in arms if (a in _RETRY_ARMS) == retry]
        if group:
            start = warm_start(seed, profile=profile, device=device, retry_traces=retry,
                               **overrides)
            out.update({arm: train_arm(start, arm) for arm in group})
            start.close()
    return {arm: out[arm] for arm in arms}


@torch.no_grad()
def interpreter_logprob_split(trainer: ReToolTrainer, seed: int) -> tuple[float, float]:
    """Mean log-prob (nats per token) of the interpreter's tags and of its other tokens (the
    output: digits, mostly), in one sampled episode per held-out problem."""
    torch.manual_seed(seed)
    batch = trainer.play(trainer.eval_problems, group_size=1)
    trainer.close()
    logp = sequence_logprobs(trainer.model, batch.input_ids, batch.attention_mask)
    tool = interpreter_tokens(batch)
    tag_ids = torch.tensor(trainer.tokenizer.convert_tokens_to_ids([INTERP, END_INTERP]))
    tags = tool & torch.isin(batch.input_ids, tag_ids)
    output = tool & ~tags
    mean = lambda m: logp[m].mean().item() if m.any() else math.nan  # noqa: E731
    return mean(tags), mean(output)


def _measured(history: list[dict], key: str) -> list[float]:
    return [r[key] for r in history if r.get(key) is not None and r[key] == r[key]]


def measure(trainer: ReToolTrainer, arm: str, seed: int) -> dict:
    """The evaluations, the gradient steps the profile's clip norm touched, the interpreter
    tokens' share of the gradient (``share``; their norm over the policy's is
    ``share / (1 - share)``), the log-prob split, and the curves (``pre_clip_norm``: every
    gradient step's)."""
    metrics = evaluations(trainer)
    norms = getattr(trainer, "grad_norms", [])
    clip = ReToolConfig.from_profile(trainer.config.profile).max_grad_norm  # the arms' usual
    metrics["clipped_steps"] = float(sum(n > clip for n in norms))
    metrics["gradient_steps"] = float(len(norms))
    metrics["pre_clip_norm_median"] = statistics.median(norms) if norms else math.nan
    shares = _measured(trainer.history, "grad_share")
    metrics["grad_share_mean"] = statistics.mean(shares) if shares else math.nan
    ratios = [s / (1 - s) for s in shares if s < 1]
    metrics["norm_ratio_mean"] = statistics.mean(ratios) if ratios else math.nan
    if trainer.config.demo_retry_rate == 0:  # the retry arms' lab does not look at it
        tags, output = interpreter_logprob_split(trainer, seed)
        metrics["interpreter_tags_logprob"], metrics["interpreter_output_logprob"] = tags, output
    measured = curves(trainer.history, CURVES)
    measured["pre_clip_norm"] = [float(n) for n in norms]
    return {"metrics": metrics, "curves": measured}
