"""This package's single-turn tasks and GRPO settings, handed to TRL's ``GRPOTrainer``.

Two functions, so that TRL optimises exactly the reward this package optimises, with the same
settings (``benchmarks/bench_vs_trl.py``, ``tests/test_trl_bridge.py``):

- :func:`trl_task`: a task as a TRL train dataset (a ``prompt`` column, plus the columns the reward
  needs, which TRL forwards to reward functions as keyword arguments) and a reward function with
  TRL's signature that scores with the task's own ``score``;
- :func:`trl_config_kwargs`: a :class:`~agentic_rl.config.GRPOConfig` as keyword arguments for
  ``trl.GRPOConfig`` (TRL 1.16.0), every TRL default that differs from this package pinned.

TRL is an optional peer (``pip install trl==1.16.0``, or ``pip install agentic-rl[trl]``): this
module never imports it at import time, so the package imports without it (Colab never installs
TRL). :func:`trl_task` needs it (and ``datasets``, which comes with it) and says how to install it;
:func:`trl_config_kwargs` returns a plain dict and needs neither.

What cannot be made identical, whatever the settings:

- **Random streams.** Sampling, the minibatch split and the order of operations differ, so the two
  frameworks agree in distribution, not bit for bit.
- **The ``eps`` added to the group std**: ``1e-4`` in TRL (hard-coded), ``1e-6`` here.
- **The log-ratio clamp**: this package clamps ``log rho`` to [-20, 20] before ``exp``; TRL does
  not. The two differ only for a ratio beyond ``e**20``.
- **Positions of left-padded prompts.** TRL's loss forward pass passes no ``position_ids``, so the
  model counts positions from the first (pad) column, while ``generate`` (TRL's sampler, and this
  package in both places) counts real tokens only. Exact when a batch's prompts all have the same
  length (the addition task; the sums task with one-digit operands on SmolLM2's tokenizer).
- **Minibatches across passes.** With ``num_minibatches = k > 1`` and ``num_iterations = mu > 1``
  TRL splits the batch once and reuses the split in every pass; this package draws a new split per
  pass.
- **The SFT warm start and the evaluation** are this package's; TRL's ``GRPOTrainer`` does RL only.
  Start both from the same saved model (``save_pretrained`` after SFT).

:func:`trl_config_kwargs` raises ``ValueError`` for settings TRL has no equivalent of (the
``token-sum`` and ``seq-mean-token-sum`` aggregations, a KL estimator other than ``k3`` when
``beta > 0``, an entropy bonus under an aggregation other than ``token-mean``, ``dual_clip`` below
``1 + epsilon_high``, a batch that ``num_minibatches`` does not divide).
"""

from __future__ import annotations

import json
import random

from .envs import make_task
from .envs.base import Problem

__all__ = ["TRL_LOSS_TYPES", "trl_config_kwargs", "trl_task"]

#: The TRL ``loss_type`` that computes each aggregation mode (``losses.aggregate``) exactly.
#: ``token-mean`` is ``"bnpo"``, not TRL's default ``"dapo"``: both divide by the number of
#: generated tokens, but ``"dapo"`` counts those of the whole generation batch (divided by
#: ``steps_per_generation``), ``"bnpo"`` those of the minibatch, as this package does. With one
#: gradient step per batch the two are the same.
TRL_LOSS_TYPES = {
    "seq-mean-token-mean": "grpo",
    "token-mean": "bnpo",
    "seq-mean-token-sum-norm": "dr_grpo",
}

_INSTALL = "pip install trl==1.16.0 (or pip install agentic-rl[trl])"


def _require_datasets():
    """``datasets``, once TRL and ``datasets`` are known to be installed (TRL itself is not
    imported: it takes seconds, and the caller imports it to build its trainer anyway)."""
    import importlib
    import importlib.util

    for module in ("trl", "datasets"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ValueError:  # in sys.modules as None: blocked
            found = False
        if not found:
            raise ImportError(
                f"the TRL bridge needs {module!r}, which is not installed: {_INSTALL}"
            )
    return importlib.import_module("datasets")


def _decode(tokenizer, ids) -> tuple[str, bool]:
    """A completion's text and whether it was truncated, exactly as ``rollout.generate_batch``
    decodes it: the tokens before the first EOS, special tokens kept (a stray ``<pad>`` makes an
    answer malformed); no EOS means truncated, and then every token counts."""
    ids = [int(i) for i in ids]
    eos = tokenizer.eos_token_id
    truncated = eos not in ids
    content = ids if truncated else ids[: ids.index(eos)]
    return tokenizer.decode(content, skip_special_tokens=False), truncated


def _text(completion) -> str:
    """TRL's decoded completion: a string, or (conversational prompts) a list of messages."""
    if isinstance(completion, str):
        return completion
    return completion[-1]["content"]


def trl_task(task, num_prompts: int, *, seed: int = 0, tokenizer=None):
    """``(dataset, reward_fn)``: ``num_prompts`` problems of ``task`` for ``trl.GRPOTrainer``.

    Args:
        task: a task object (``agentic_rl.envs.TASKS``; use the trainer's own, ``trainer.task``,
            so that ``digits`` and ``format_weight`` match) or a task name.
        num_prompts: rows of the dataset: ``max_steps * prompts_per_step`` for a run that sees
            each problem once (with ``shuffle_dataset=False``, as :func:`trl_config_kwargs` sets).
        seed: the problems are ``task.sample(num_prompts, random.Random(seed))``: for a run with
            ``sft_steps = 0`` and the same seed, the very problems ``GRPOTrainer`` trains on, in
            the same order.
        tokenizer: the policy's tokenizer. With it the reward decodes TRL's ``completion_ids``
            exactly as this package's rollout does (special tokens kept, no EOS = truncated, a
            format failure). Without it, it scores the text TRL decoded (special tokens dropped)
            and cannot tell a truncated completion: pass it for the same reward.

    The dataset has the columns ``prompt`` (plain text; for a task with ``chat = True`` a user
    turn, ``[{"role": "user", "content": ...}]``, which TRL wraps in the chat template itself, as
    ``rollout.chat_prompt`` does), ``question`` and ``answer`` (the problem's text and reference
    answer) and ``meta`` (its ``meta`` as JSON). TRL passes every column but ``prompt`` to the
    reward function, ``reward_fn(completions, completion_ids=..., question=..., answer=...,
    meta=..., **kwargs) -> list[float]``, which returns ``task.score(...).reward`` per completion.
    """
    datasets = _require_datasets()
    if isinstance(task, str):
        task = make_task(task)
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
    problems = task.sample(num_prompts, random.Random(seed))
    chat = bool(getattr(task, "chat", False))
    dataset = datasets.Dataset.from_dict(
        {
            "prompt": [
                [{"role": "user", "content": p.prompt}] if chat else p.prompt for p in problems
            ],
            "question": [p.prompt for p in problems],
            "answer": [p.answer for p in problems],
            "meta": [json.dumps(p.meta) for p in problems],
        }
    )

    def reward_fn(completions, completion_ids=None, *, question, answer, meta=None, **kwargs):
        rewards = []
        for i, completion in enumerate(completions):
            problem = Problem(
                prompt=question[i],
                answer=answer[i],
                meta=json.loads(meta[i]) if meta is not None else {},
            )
            if tokenizer is not None and completion_ids is not None:
                text, truncated = _decode(tokenizer, completion_ids[i])
            else:
                text, truncated = _text(completion), False
            rewards.append(float(task.score(problem, text, truncated=truncated).reward))
        return rewards

    reward_fn.__name__ = f"{task.name}_reward"  # TRL logs it as rewards/<name>/mean
    return dataset, reward_fn


def trl_config_kwargs(config, **overrides) -> dict:
    """Keyword arguments for ``trl.GRPOConfig`` (TRL 1.16.0) that run ``config``'s GRPO.

    ``trl.GRPOConfig(output_dir=..., max_steps=..., **trl_config_kwargs(config))``. The two are
    left to the caller: TRL counts optimizer steps, so ``config``'s run is
    ``max_steps = config.max_steps * config.num_minibatches * config.num_iterations``.
    ``overrides`` replace or add entries.

    One rollout batch of ``prompts_per_step x num_generations`` completions is TRL's generation
    batch, split into ``steps_per_generation = num_minibatches`` optimizer steps of
    ``per_device_train_batch_size`` rows each, for ``num_iterations`` passes. Pinned against TRL's
    own defaults: fp32 (TRL defaults to ``bf16=True``, even on CPU), no gradient checkpointing
    (default on), ``loss_type`` by :data:`TRL_LOSS_TYPES` (default ``"dapo"``), the learning rate
    (default ``1e-6``) held constant (default: linear decay), plain ``torch.optim.AdamW`` without
    weight decay (default: the fused kernel), no top-k/top-p, the prompts in dataset order, the
    unbiased KL gradient off (TRL multiplies the KL term by the ratio by default), logging every
    step and no checkpoints. Only the keys below are set; LoRA is ``peft_config`` of the trainer,
    not of the config.
    """
    c = config
    _check_trl_can_run(c)
    agg, rows = c.agg_mode, c.prompts_per_step * c.num_generations
    epsilon_high = c.epsilon if c.epsilon_high is None else c.epsilon_high
    from .models import get_device

    kwargs = {
        # --- the batch: one generation of rows, num_minibatches optimizer steps, mu passes
        "num_generations": c.num_generations,
        "per_device_train_batch_size": rows // c.num_minibatches,
        "steps_per_generation": c.num_minibatches,
        "gradient_accumulation_steps": 1,
        "num_iterations": c.num_iterations,
        "shuffle_dataset": False,  # in order: trl_task's rows are GRPOTrainer's problem stream
        "remove_unused_columns": False,  # the reward reads question/answer/meta
        # --- sampling: plain ancestral sampling at the loss's temperature
        "max_completion_length": c.max_completion_length,
        "temperature": c.temperature,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": None,
        "repetition_penalty": 1.0,
        "use_vllm": False,
        # --- the loss
        "loss_type": TRL_LOSS_TYPES[agg],
        "scale_rewards": c.scale_rewards,
        "beta": c.beta,
        "use_bias_correction_kl": False,  # this package's k3 KL gradient (no ratio in front)
        "epsilon": c.epsilon,
        "epsilon_high": epsilon_high,
        "delta": c.dual_clip,
        "importance_sampling_level": "token",
        "mask_truncated_completions": False,  # truncated answers stay in the loss, as here
        "top_entropy_quantile": 1.0,
        "entropy_coef": c.entropy_coeff,
        "multi_objective_aggregation": "sum_then_normalize",
        # --- the optimizer: torch AdamW, no weight decay, constant learning rate
        "learning_rate": c.learning_rate,
        "optim": "adamw_torch",
        "weight_decay": 0.0,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "max_grad_norm": c.max_grad_norm,
        # --- numerics and machine
        "bf16": False,
        "fp16": False,
        "use_cpu": get_device(c.device).type == "cpu",
        "seed": c.seed,
        # --- logging and saving
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": c.disable_tqdm,
    }
    kwargs[_checkpointing_field()] = False
    kwargs.update(overrides)
    return kwargs


def _check_trl_can_run(c) -> None:
    """Raise ``ValueError`` for a config TRL cannot run as this package does."""
    agg = c.agg_mode
    if agg not in TRL_LOSS_TYPES:
        raise ValueError(
            f"loss_type {c.loss_type!r} ({agg}) has no TRL loss_type; "
            f"TRL computes {sorted(TRL_LOSS_TYPES)}"
        )
    if c.beta > 0 and c.kl_estimator != "k3":
        raise ValueError(f"TRL's KL term is k3 only; kl_estimator is {c.kl_estimator!r}")
    if c.entropy_coeff > 0 and agg != "token-mean":
        raise ValueError(
            "TRL's entropy bonus is a token-mean whatever the loss_type; this package aggregates "
            f"it like the loss ({agg}): use a token-mean loss_type to compare"
        )
    epsilon_high = c.epsilon if c.epsilon_high is None else c.epsilon_high
    if c.dual_clip is not None and c.dual_clip < 1 + epsilon_high:
        # TRL's delta caps rho for every token; for A < 0 that is dual-clip's bound, and for A > 0
        # the clip already binds below delta, but only when delta >= 1 + epsilon_high.
        raise ValueError(
            f"dual_clip ({c.dual_clip}) maps to TRL's delta only when >= 1 + epsilon_high "
            f"({1 + epsilon_high})"
        )
    rows = c.prompts_per_step * c.num_generations
    if rows % c.num_minibatches:
        raise ValueError(
            f"TRL needs num_minibatches ({c.num_minibatches}) to divide the batch "
            f"(prompts_per_step * num_generations = {rows})"
        )


def _checkpointing_field() -> str:
    """The name of the activation-checkpointing switch: ``gradient_checkpointing`` until
    transformers 5.x renamed it ``activation_checkpointing`` (the old name still works, with a
    deprecation warning, and TRL's default for it, ``True``, applies unless the new one is set)."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    new = "activation_checkpointing"
    return new if new in names else "gradient_checkpointing"
