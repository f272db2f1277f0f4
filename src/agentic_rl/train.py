"""Training: the SFT warm start and the GRPO loop, with metrics, checkpoints and a NaN guard
(once, here).

The GRPO step is the design's data path, one line each::

    batch = self.rollout()                          # sample G completions per prompt, score them
    advantages = self.compute_advantages(batch)     # [B, T]: group-normalised, broadcast to tokens
    keep = self.filter_rows(batch)                  # which rows enter the update (None: all)
    loss, metrics = self.compute_loss(batch, advantages)   # clipped surrogate + beta * KL
    optimizer step (gradient clipping, NaN guard)

Later chapters subclass :class:`GRPOTrainer` and override ``compute_advantages``, ``filter_rows``
or ``compute_loss``.

Metric dictionary (one row per GRPO step in ``history`` and ``metrics.csv``; TRL's names where TRL
has the metric):

========================  ==========================================================================
``step``                  GRPO step (1-based)
``reward_mean``           mean reward of the sampled completions (exact match + format)
``reward_std``            std of those rewards over the whole batch
``accuracy``              fraction of sampled completions that are exactly right (pass@1 at
                          temperature)
``format_rate``           fraction of completions that are well formed
``frac_reward_zero_std``  fraction of groups whose rewards are all equal: they give zero advantage,
                          no gradient
``completion_length``     mean generated tokens per completion (EOS included)
``loss``                  the minimised loss (clipped surrogate + beta * KL); near 0 by
                          construction, see chapter
``kl``                    k3 estimate of KL(pi || pi_ref) on generated tokens (pi_ref = the policy
                          GRPO started from); NaN when ``beta == 0`` and ``log_kl`` is off
``entropy``               mean entropy (nats) of the policy's next-token distribution on generated
                          tokens
``clip_ratio``            fraction of generated tokens whose probability ratio was clipped (mean
                          over gradient steps of the step; 0 with one gradient step per batch)
``approx_kl``             k3 estimate of KL(pi_old || pi) on generated tokens, mean over the
                          gradient steps: how far the update moved the policy from the one that
                          sampled
``grad_norm``             gradient norm before clipping
``tokens_per_s``          generated tokens per second of the rollout phase (sampling, scoring,
                          reference log-probs)
``step_time``             wall seconds of the whole step
``skipped``               1 if the NaN/inf guard skipped this update
========================  ==========================================================================
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import os
import random
import time
import warnings
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

# tqdm.auto warns in notebooks without ipywidgets; it falls back to text bars
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from tqdm.auto import tqdm

from . import checkpoint as ckpt
from . import distributed as dist
from .advantages import group_advantages
from .checkpoint import CheckpointError, ConfigMismatchError, run_lock
from .config import ConfigError, GRPOConfig
from .envs import make_task
from .losses import aggregate, kl_penalty, policy_loss
from .models import (
    AdaptersOff,
    add_lora,
    add_special_tokens,
    base_dtype,
    build_model,
    build_tokenizer,
    check_lora_targets,
    count_parameters,
    get_device,
    load_pretrained,
)
from .rollout import (
    Batch,
    build_sft_batch,
    chat_prompt,
    first_scored_column,
    generate_batch,
    sequence_logprobs,
    shared_prefix_logprobs,
)
from .utils import seed_everything

__all__ = [
    "GRPOTrainer",
    "evaluate",
    "sft_step",
    "write_csv",
    "run_recipe",
    "run_grpo",
    "run_arms",
    "preflight",
]

CHECKPOINT = "checkpoint.pt"
#: The files a run writes in its output folder (``run.lock`` aside).
OUTPUT_FILES = (CHECKPOINT, "metrics.csv", "sft_metrics.csv", "summary.json")
#: Config fields a resumed run may change (everything else must match the checkpoint's config).
RESUMABLE_CHANGES = ("output_dir", "resume", "max_steps", "save_steps", "disable_tqdm", "device")


def mixed_precision(device: torch.device, bf16: bool):
    """``torch.autocast`` to bfloat16 when ``bf16`` is asked for and ``device`` is a CUDA GPU that
    supports it (config field ``bf16``); otherwise a context that changes nothing."""
    if bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


@contextmanager
def _fixed_rng(seed: int, device: torch.device):
    """Run a block with its own torch RNG stream, leaving the caller's stream untouched."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


@torch.no_grad()
def evaluate(
    model,
    tokenizer,
    task,
    problems,
    *,
    samples: int = 4,
    temperature: float = 1.0,
    max_completion_length: int = 8,
    seed: int = 1234,
    chunk: int = 512,
    chat: bool = False,
) -> dict:
    """Greedy accuracy, sampled accuracy (``samples`` draws per problem at ``temperature``)
    and format rate.

    Sampling uses its own seeded RNG stream, so evaluating does not change a training run, and the
    same problems and seed give the same numbers before and after training.
    """
    device = next(model.parameters()).device
    out = {}
    with _fixed_rng(seed, device):
        for name, greedy, g in (("greedy", True, 1), ("sampled", False, samples)):
            correct, fmt, n = 0, 0, 0
            step = max(1, chunk // g)
            for i in range(0, len(problems), step):
                b = generate_batch(
                    model,
                    tokenizer,
                    task,
                    problems[i : i + step],
                    num_generations=g,
                    max_completion_length=max_completion_length,
                    temperature=temperature,
                    greedy=greedy,
                    compute_old_logprobs=False,
                    chat=chat,
                )
                correct += int(b.correct.sum())
                fmt += int(b.format_ok.sum())
                n += len(b)
            out[f"{name}_accuracy"] = correct / n
            out[f"{name}_format_rate"] = fmt / n
    return out


def sft_step(model, optimizer, batch: Batch, *, max_grad_norm: float = 1.0) -> float:
    """One teacher-forcing step: cross-entropy on the completion tokens only (``loss_mask``)."""
    logprobs = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
    loss = aggregate(-logprobs, batch.loss_mask, "token-mean")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def write_csv(rows: list[dict], path: str) -> None:
    """Write a list of metric dicts as CSV (columns: the union of keys, in first-seen order)."""
    cols = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


class GRPOTrainer:
    """SFT warm start, then GRPO, from one :class:`GRPOConfig`.

    ``GRPOTrainer(config)`` builds the task, tokenizer and model; pass ``model`` and ``tokenizer``
    to start from an existing policy (e.g. a copy of an SFT'd model, with ``sft_steps=0``), or
    ``base=(model, tokenizer)``, a pretrained model already loaded, to build the policy on it as
    ``model_name_or_path`` would (LoRA wraps it in place: give each run its own copy).
    ``train()`` runs whatever is left of the run and resumes from ``output_dir/checkpoint.pt`` when
    one exists.
    """

    def __init__(self, config: GRPOConfig, *, model=None, tokenizer=None, task=None, base=None):
        config.check_environment()  # config, device, output folder, memory: before any compute
        self.device = dist.rank_device(get_device(config.device))
        dist.init(self.device)  # under torchrun: join the other ranks (one process: nothing)
        check_data_parallel(config, type(self))
        if not dist.is_main():  # one progress bar: rank 0's
            config = dataclasses.replace(config, disable_tqdm=True)
        self.config = config
        self.task = task or self._make_task()
        seed_everything(config.seed)
        if model is None:
            model, tokenizer = self._build_policy(base)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with the model")
        self.model = model.to(self.device)
        # Under torchrun: the weights are rank 0's (broadcast, as DDP does), and rank r > 0's
        # random streams restart from seed + r, so that the ranks sample different completions
        # (rank 0's go on as one process's).
        dist.broadcast([*self.model.parameters(), *self.model.buffers()])
        if dist.rank() > 0:
            seed_everything((config.seed + dist.rank()) % 2**32)
        self.tokenizer = tokenizer
        self.ref_model = None
        # training problems (its state is checkpointed)
        self.problem_rng = random.Random(config.seed)
        self.eval_problems = self._make_eval_set()
        self.phase = "sft" if config.sft_steps > 0 else "grpo"
        self.step = 0  # steps done in the current phase
        self.sft_history: list[dict] = []
        self.history: list[dict] = []
        self.evals: dict[str, dict] = {}
        self.optimizer = self._make_optimizer()
        self.wall_time = 0.0  # seconds spent in train(), summed over every resume
        self._clock = None  # perf_counter() when wall_time was last brought up to date (None: idle)
        self.was_complete = False  # train() found the run already finished and changed nothing

    # ------------------------------------------------------------------ construction
    def _make_task(self):
        c = self.config
        kwargs = (
            dict(
                digits=c.digits,
                teacher_error_rate=c.teacher_error_rate,
                format_weight=c.format_weight,
            )
            if c.task == "addition"
            else dict(digits=c.digits, format_weight=c.format_weight)
        )
        return make_task(c.task, **kwargs)

    def _make_eval_set(self):
        # A fixed held-out set, drawn from its own stream
        # so it never depends on the training seed's draws.
        return self.task.sample(self.config.eval_size, random.Random(10_000 + self.config.seed))

    def _build_policy(self, base=None):
        c = self.config
        if base is not None:  # a loaded pretrained (model, tokenizer), shared by several runs
            model, tokenizer = base
        elif c.model_name_or_path:
            try:
                dtype = base_dtype(self.device, lora=c.use_lora)
                model, tokenizer = load_pretrained(c.model_name_or_path, dtype=dtype)
            except (OSError, ValueError, ImportError) as err:  # not found, offline, not a model
                why = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
                name = c.model_name_or_path
                raise ConfigError("model_name_or_path", f"cannot be loaded: {why}", name) from None
        else:
            tokenizer = build_tokenizer(self.task.vocabulary())
            model = build_model(
                tokenizer,
                hidden_size=c.hidden_size,
                num_hidden_layers=c.num_hidden_layers,
                num_attention_heads=c.num_attention_heads,
                num_key_value_heads=c.num_key_value_heads,
                intermediate_size=c.intermediate_size,
                seed=c.seed,
            )
        if self.chat and not tokenizer.chat_template:
            why = (
                f"has no chat template, and the {self.task.name} task's prompts are chat turns: "
                "use an instruct (chat) model, or a folder whose tokenizer has one"
            )
            raise ConfigError("model_name_or_path", why, c.model_name_or_path)
        # tokens a recipe adds to the vocabulary (RC-GRPO's reward tokens), before the adapters
        new_ids = (
            add_special_tokens(model, tokenizer, self.added_tokens) if self.added_tokens else []
        )
        if c.use_lora:
            targets = c.lora_target_modules.split(",")
            try:
                check_lora_targets(model, targets)
            except ValueError as err:
                raise ConfigError("lora_target_modules", str(err), c.lora_target_modules) from None
            model = add_lora(
                model,
                r=c.lora_r,
                lora_alpha=c.lora_alpha,
                target_modules=targets,
                trainable_token_ids=new_ids or None,
            )
        return model, tokenizer

    @property
    def chat(self) -> bool:
        """Whether prompts are chat turns (the task says so: ``task.chat``), to be wrapped in the
        model's chat template."""
        return bool(getattr(self.task, "chat", False))

    #: Special tokens a recipe adds to the tokenizer and the embedding (none for GRPO).
    added_tokens: tuple[str, ...] = ()

    def _make_optimizer(self):
        lr = self.config.sft_learning_rate if self.phase == "sft" else self.config.learning_rate
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    #: The summary's headline metric: ``(name, evaluation key)``, reported as
    #: ``<name>_before/_after``.
    headline = ("accuracy", "sampled_accuracy")
    headline_definition = (
        "accuracy: exact-match rate of samples at the training temperature "
        "(pass@1, = sampled_accuracy); greedy_accuracy: of greedy decoding"
    )

    @property
    def max_generated_tokens(self) -> float:
        """The most tokens one rollout can generate: the constant L of
        ``seq-mean-token-sum-norm``."""
        return float(self.config.max_completion_length)

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """Names of ``compute_loss`` metrics a subclass adds to each history row (none for GRPO)."""
        return ()

    def _extra_state(self) -> dict:
        """What a subclass adds to a checkpoint (e.g. a critic)."""
        return {}

    def _load_extra_state(self, state: dict) -> None:
        pass

    def close(self) -> None:
        """Release what a subclass holds outside the process's memory (e.g. ReTool's sandbox
        workers); nothing for GRPO. The CLI calls it when a run ends."""

    def _start_grpo(self):
        """Switch from SFT to GRPO: fresh optimizer; freeze a copy of the policy as pi_ref."""
        self.phase, self.step = "grpo", 0
        self.optimizer = self._make_optimizer()
        if self.config.beta > 0 or self.config.log_kl:
            self._make_ref_model()

    def _make_ref_model(self, adapters_off: bool | None = None):
        # pi_ref is the policy GRPO starts from. With beta = 0 it is only kept when log_kl is on,
        # to log the KL drift: one extra forward pass per step
        # (measured: ~15-25 % of a quick-profile step).
        # A LoRA policy whose adapters are still at their initialisation (B = 0: no SFT moved
        # them) *is* its base model, so pi_ref is the same model with the adapters switched off,
        # no second copy (the pretrained profile: 135 M parameters saved).
        if adapters_off is None:
            adapters_off = self._adapters_untouched()
        if adapters_off:
            self.ref_model = AdaptersOff(self.model)
            return
        self.ref_model = copy.deepcopy(self.model).eval()
        for p in self.ref_model.parameters():
            p.requires_grad_(False)

    def _sync_weights(self) -> None:
        """Under torchrun: every rank takes rank 0's trainable weights (the policy's, a critic's)
        and pi_ref's, so that all start RL from the same bits whatever the device's numerics
        (CUDA's backward is not bit-deterministic); nothing to do in one process."""
        tensors = [p for g in self.optimizer.param_groups for p in g["params"]]
        if self.ref_model is not None and not isinstance(self.ref_model, AdaptersOff):
            tensors += list(self.ref_model.parameters())
        dist.broadcast(tensors)

    def _adapters_untouched(self) -> bool:
        """A LoRA policy whose every ``lora_B`` is still zero: it computes its base model."""
        if not self.config.use_lora or not hasattr(self.model, "disable_adapter"):
            return False
        named = self.model.named_parameters()
        return all(not p.any() for n, p in named if "lora_B" in n or "trainable_tokens" in n)

    @property
    def num_parameters(self) -> int:
        return count_parameters(self.model)

    # ------------------------------------------------------------------ SFT
    def sft(self, steps: int | None = None) -> list[dict]:
        """Teacher-forcing on the task's (noisy) demonstrations,
        until ``sft_steps`` steps are done."""
        c = self.config
        target = c.sft_steps if steps is None else min(c.sft_steps, self.step + steps)
        bar = tqdm(
            total=c.sft_steps, initial=self.step, desc="SFT", disable=c.disable_tqdm, leave=False
        )
        self.model.train()
        while self.phase == "sft" and self.step < target:
            loss = sft_step(
                self.model, self.optimizer, self.sft_batch(), max_grad_norm=c.max_grad_norm
            )
            self.step += 1
            self.sft_history.append({"step": self.step, "loss": loss})
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            self._maybe_checkpoint()
        bar.close()
        if self.phase == "sft" and self.step >= c.sft_steps:
            self._start_grpo()
            self.save_checkpoint()
        return self.sft_history

    def sft_batch(self) -> Batch:
        """``sft_batch_size`` fresh teacher demonstrations."""
        problems = self.task.sample(self.config.sft_batch_size, self.problem_rng)
        demos = [self.task.demonstration(p, self.problem_rng) for p in problems]
        prompts = [
            chat_prompt(self.tokenizer, p.prompt) if self.chat else p.prompt for p in problems
        ]
        return build_sft_batch(self.tokenizer, prompts, demos, self.device)

    # ------------------------------------------------------------------ GRPO
    def rollout(self) -> Batch:
        """Sample ``num_generations`` completions for each of ``prompts_per_step`` fresh prompts
        (under torchrun: for this rank's share of them)."""
        c = self.config
        # Every rank draws the step's prompts (the same draws as one process), then plays its
        # contiguous share of them, each prompt's whole group.
        problems = dist.shard(self.task.sample(c.prompts_per_step, self.problem_rng))
        # With mu = 1 the policy that sampled is the policy being updated, so pi_old's log-probs
        # are the loss's own (detached) log-probs: no separate forward pass is needed
        # (TRL does the same).
        return generate_batch(
            self.model,
            self.tokenizer,
            self.task,
            problems,
            num_generations=c.num_generations,
            max_completion_length=c.max_completion_length,
            temperature=c.temperature,
            ref_model=self.ref_model,
            compute_old_logprobs=c.num_iterations > 1 or c.num_minibatches > 1,
            chat=self.chat,
            share_prompt_prefix=c.share_prompt_prefix,
        )

    def compute_advantages(self, batch: Batch) -> torch.Tensor:
        """GRPO (eq. grpo-adv): one group-normalised scalar per completion,
        copied to its tokens ``[B, T]``."""
        adv = group_advantages(batch.scores, batch.group_id, scale=self.config.scale_rewards)
        return adv[:, None] * batch.loss_mask

    def compute_loss(
        self, batch: Batch, advantages: torch.Tensor, *, outputs: tuple | None = None
    ) -> tuple[torch.Tensor, dict]:
        """Clipped surrogate (eq. grpo-obj) plus ``beta`` times the KL estimate,
        aggregated by ``loss_type``. ``outputs``: the policy's ``(logprobs, entropy)`` of this
        batch when the caller already ran the forward pass (a subclass adding a loss on it)."""
        c = self.config
        logprobs, entropy = outputs or self.policy_logprobs(batch)
        norm = self.max_generated_tokens  # the constant L of seq-mean-token-sum-norm (Dr. GRPO)
        # one gradient step per batch: pi_old is the policy itself, rho = 1
        old_logprobs = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
        loss, metrics = policy_loss(
            logprobs,
            old_logprobs,
            advantages,
            batch.loss_mask,
            epsilon=c.epsilon,
            epsilon_high=c.epsilon_high,
            dual_clip=c.dual_clip,
            agg=c.agg_mode,
            norm_constant=norm,
        )
        if c.beta > 0:
            kl = kl_penalty(logprobs, batch.ref_logprobs, c.kl_estimator)
            loss = loss + c.beta * aggregate(kl, batch.loss_mask, c.agg_mode, norm_constant=norm)
        if c.entropy_coeff > 0:  # the entropy bonus (verl: pg_loss - entropy_coeff * entropy)
            bonus = aggregate(entropy, batch.loss_mask, c.agg_mode, norm_constant=norm)
            loss = loss - c.entropy_coeff * bonus
        metrics["entropy"] = aggregate(entropy.detach(), batch.loss_mask, "token-mean").item()
        metrics["kl"] = float("nan")
        # the drift from pi_ref, logged with k3 whatever the loss uses
        if batch.ref_logprobs is not None:
            metrics["kl"] = aggregate(
                kl_penalty(logprobs.detach(), batch.ref_logprobs, "k3"),
                batch.loss_mask,
                "token-mean",
            ).item()
        return loss, metrics

    def policy_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's log-probs and entropies ``[B, T]`` of a batch's tokens, with gradients:
        the loss's forward pass (each prompt once with ``share_prompt_prefix``)."""
        c = self.config
        entropy_grad = c.entropy_coeff > 0  # else entropy is only logged
        start = first_scored_column(batch.loss_mask)
        if c.share_prompt_prefix:
            return shared_prefix_logprobs(
                self.model, batch.input_ids, batch.attention_mask, prompt_len=start,
                temperature=c.temperature, with_entropy=True, entropy_grad=entropy_grad,
            )  # fmt: skip
        return sequence_logprobs(
            self.model,
            batch.input_ids,
            batch.attention_mask,
            temperature=c.temperature,
            with_entropy=True,
            start=start if c.skip_prompt_logits else 1,
            entropy_grad=entropy_grad,
        )

    def filter_rows(self, batch: Batch) -> torch.Tensor | None:
        """The filter stage between advantages and loss: a ``[B]`` keep-mask, or ``None`` to
        keep every row (GRPO). StarPO-S overrides it (``agentic_rl.filters``)."""
        return None

    def rollout_metrics(self, batch: Batch, keep: torch.Tensor | None) -> dict:
        """Facts of the whole rollout batch for the history row (``keep``: the filter's mask), which
        a subclass adds whether or not an update happened; none for GRPO."""
        return {}

    def _optimizer_step(self, loss: torch.Tensor | None) -> tuple[float, bool]:
        """Backward, average the gradients over the ranks (under torchrun), clip, step;
        skip the update (and say so) if the loss or gradient is not finite.

        ``loss=None`` (torchrun only): this rank has no rows in this gradient step; it joins the
        average with a zero gradient."""
        self.optimizer.zero_grad(set_to_none=True)
        finite = loss is None or bool(torch.isfinite(loss))
        if not finite:
            warnings.warn(
                f"GRPO step {self.step + 1}: loss is {loss.item()}; skipped this update",
                RuntimeWarning,
                stacklevel=2,
            )
            if dist.world_size() == 1:
                return float("nan"), True
        elif loss is not None:
            loss.backward()
        # Under torchrun: the gradient of the step's whole batch, before clipping, so that every
        # rank clips and steps alike. A rank whose loss is not finite makes it NaN on every rank,
        # and every rank skips the update below.
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        dist.average_gradients(params, poison=not finite)
        # Clip each parameter group on its own (the policy; a critic, when there is one);
        # report the policy's.
        norms = [
            torch.nn.utils.clip_grad_norm_(g["params"], self.config.max_grad_norm).item()
            for g in self.optimizer.param_groups
        ]
        grad_norm = norms[0]
        if not all(math.isfinite(n) for n in norms):
            grad_norm = next(n for n in norms if not math.isfinite(n))
            self.optimizer.zero_grad(set_to_none=True)
            warnings.warn(
                f"GRPO step {self.step + 1}: gradient norm is {grad_norm}; skipped this update",
                RuntimeWarning,
                stacklevel=2,
            )
            return grad_norm, True
        self.optimizer.step()
        return grad_norm, False

    def mixed_precision(self):
        """The ``bf16`` autocast of this run's forward passes, or nothing (see
        :func:`mixed_precision`)."""
        return mixed_precision(self.device, self.config.bf16)

    def _rank_share(self, mb: Batch | None) -> float:
        """The weight ``w_r`` of this rank's loss under torchrun (1 in one process), so that the
        ranks' averaged gradient ``(1/W) sum_r w_r g_r`` is the gradient of the loss over all
        ranks' rows of the gradient step (see :mod:`agentic_rl.distributed`).

        The loss is a mean over tokens (token-mean: ``w_r = W n_r / N``, with ``n_r`` this rank's
        generated tokens and ``N`` all ranks'), a mean over rows (the seq-mean modes: the same with
        the rows that have a token; 1 when every rank has as many), or a sum (token-sum: ``W``).
        A second loss in the same scalar gets the same weight: a critic's value loss (a token
        mean) is exact with token-mean, PPO's default; with the other modes, it and GCD's
        judgement loss are (near) the mean of the ranks' means. ``mb=None``: no rows here.
        """
        w = dist.world_size()
        if w == 1:
            return 1.0
        mask = mb.loss_mask if mb is not None else torch.zeros(0, 0)
        tokens, rows = float(mask.sum()), float((mask.sum(-1) > 0).sum())
        all_tokens, all_rows = dist.sum_over_ranks([tokens, rows])
        mode = self.config.agg_mode
        if mode == "token-sum":
            return float(w)
        mine, everyone = (tokens, all_tokens) if mode == "token-mean" else (rows, all_rows)
        return w * mine / everyone if everyone else 0.0

    def _minibatches(self, n: int) -> list[torch.Tensor | None]:
        """Row indices of each minibatch of one pass (``[None]``: the whole batch, no copy)."""
        k = self.config.num_minibatches
        if k == 1:
            return [None]
        perm = torch.randperm(n)  # the global torch stream: seeded, and checkpointed
        return list(torch.tensor_split(perm, k))

    def grpo_step(self) -> dict:
        """One RL step: rollout, advantages, then ``num_iterations`` passes over the batch, each of
        ``num_minibatches`` gradient steps
        (1 x 1 by default: one on-policy step, as GRPO and TRL).

        Under torchrun each rank plays, scores, filters and differentiates its share of the step's
        groups: group advantages are those of one process (a group is whole on one rank), while
        batch-level statistics are the rank's own (PPO's advantage whitening; StarPO-S's filter
        keeps the best of *its* groups). ``_optimizer_step`` averages the gradients, and the
        history row describes the whole step, all ranks' rows."""
        c = self.config
        if self.ref_model is None and (c.beta > 0 or c.log_kl):
            self._make_ref_model()
        t0 = time.perf_counter()
        with self.mixed_precision():  # bf16 autocast on a GPU when asked for (else nothing)
            batch = self.rollout()
        t_rollout = time.perf_counter() - t0
        advantages = self.compute_advantages(batch)
        # the filter stage (StarPO-S, dynamic sampling): which rows enter the update
        update, update_adv = batch, advantages
        keep = self.filter_rows(batch)
        if keep is not None:
            rows = keep.nonzero().flatten()
            update, update_adv = batch.select(rows), advantages[rows]
        self.model.train()
        skipped = 0
        per_update = []
        nan = float("nan")
        first = dict.fromkeys(
            ("loss", "kl", "entropy", "clip_ratio", "approx_kl", "grad_norm", *self.extra_metrics),
            nan,
        )
        (kept,) = dist.sum_over_ranks([len(update)])  # the rows that enter the update (all ranks')
        if kept == 0:
            skipped = 1
            warnings.warn(
                f"GRPO step {self.step + 1}: the filter kept no rollout (no group had the reward "
                "spread it asks for); skipped this update",
                RuntimeWarning,
                stacklevel=2,
            )
        for _ in range(c.num_iterations if kept else 0):  # mu passes over the batch ...
            parts = self._minibatches(len(update)) if len(update) else []
            # ... of num_minibatches gradient steps (under torchrun, as many on every rank: a rank
            # short of rows joins the other ranks' gradient steps with none, a zero gradient)
            for part in dist.pad_to_longest(parts):
                if part is dist.NO_ROWS:  # no rows here: a zero gradient, a share of the loss of 0
                    self._rank_share(None)  # (the other ranks count their rows)
                    grad_norm, skip = self._optimizer_step(None)
                    skipped += int(skip)
                    if not per_update and math.isnan(first["loss"]):
                        first.update(loss=0.0, grad_norm=grad_norm)
                    continue
                mb = update if part is None else update.select(part)
                share = self._rank_share(mb)
                with self.mixed_precision():
                    loss, m = self.compute_loss(
                        mb, update_adv if part is None else update_adv[part]
                    )
                if share != 1.0:
                    loss = loss * share  # this rank's share of the step's loss (torchrun only)
                grad_norm, skip = self._optimizer_step(loss)
                skipped += int(skip)
                per_update.append(m)
                if len(per_update) == 1:
                    first = dict(m, loss=loss.item(), grad_norm=grad_norm)
        # How far the updates moved the policy (and the critic): averaged over all gradient steps,
        # as TRL and verl log them. At the first step the ratio is 1 (up to sampling-time numerics),
        # so with one step per batch these are ~0 by construction; clipping can only act from the
        # second step on.
        for key in ("clip_ratio", "approx_kl", "vf_clip_ratio"):
            if per_update and key in per_update[0]:
                first[key] = sum(x[key] for x in per_update) / len(per_update)
        self.step += 1
        # The row describes the step's whole batch. Under torchrun: all ranks' rows (gathered) and
        # counts (summed); the loss-side and recipe metrics are the means of the ranks' (exact for
        # the loss, whose shares add up, and for means over rows or groups, which every rank holds
        # as many of; the mean of the ranks' token means for the others).
        scores, gid = batch.scores, batch.group_id
        _, counts = torch.unique(gid, return_counts=True)
        zero_std = sum(
            bool((scores[gid == g] == scores[gid == g][0]).all()) for g in torch.unique(gid)
        )
        zero_std, groups, gen_tokens = dist.sum_over_ranks(
            [zero_std, len(counts), int(batch.loss_mask.sum())]
        )
        (t_rollout,) = dist.max_over_ranks([t_rollout])
        scores = dist.gather_rows(scores)
        correct, format_ok = dist.gather_rows(batch.correct), dist.gather_rows(batch.format_ok)
        first = dist.mean_over_ranks(first)
        row = {
            "step": self.step,
            "reward_mean": scores.mean().item(),
            "reward_std": scores.std().item(),
            "accuracy": correct.float().mean().item(),
            "format_rate": format_ok.float().mean().item(),
            "frac_reward_zero_std": zero_std / groups,
            "completion_length": gen_tokens / len(scores),
            "loss": first["loss"],
            "kl": first["kl"],
            "entropy": first["entropy"],
            "clip_ratio": first["clip_ratio"],
            "approx_kl": first["approx_kl"],
            "grad_norm": first["grad_norm"],
            "tokens_per_s": gen_tokens / max(t_rollout, 1e-9),
            "step_time": time.perf_counter() - t0,
            "skipped": skipped,
        }
        row.update({k: first[k] for k in self.extra_metrics})
        row.update(dist.mean_over_ranks(self.rollout_metrics(batch, keep)))
        self.history.append(row)
        return row

    def train(self) -> dict:
        """Run what is left of the run (SFT, evaluation, GRPO, evaluation) and return the summary.

        With an ``output_dir`` it holds the folder's run lock (a second run there stops with
        ``RunLockedError``) and resumes from ``checkpoint.pt`` when ``resume`` is on and the file
        exists. A run that is already complete returns its summary, writes nothing and sets
        ``was_complete``. ``wall_time_s`` adds up the time of every ``train()`` of the run.
        """
        c = self.config
        c.validate()
        with run_lock(c.output_dir if dist.is_main() else None):  # torchrun: rank 0 holds it
            path = os.path.join(c.output_dir, CHECKPOINT) if c.output_dir else None
            if path and c.resume and os.path.exists(path):
                self.load_checkpoint(path)  # every rank reads it (its own RNG streams are in it)
            dist.barrier()  # ... before rank 0 may write a new one
            self.was_complete = self.is_complete
            if self.was_complete:
                return self.summary()
            self._clock = time.perf_counter()
            try:
                self._train()
            finally:
                self._tick()
                self._clock = None
            self.save_checkpoint()  # the final state, with the final wall time: a re-run reports it
            return self.summary()

    @property
    def is_complete(self) -> bool:
        """All RL steps done and the final evaluation made."""
        return self.phase == "grpo" and self.step >= self.config.max_steps and "after" in self.evals

    def _tick(self) -> None:
        """Bring ``wall_time`` up to now (while ``train()`` runs)."""
        if self._clock is not None:
            now = time.perf_counter()
            self.wall_time += now - self._clock
            self._clock = now

    def _train(self) -> None:
        c = self.config
        if self.phase == "sft":
            self.sft()  # under torchrun, every rank runs the same SFT steps (no speed-up) ...
            self._sync_weights()  # ... and starts RL from rank 0's weights
        if "before" not in self.evals:
            self.evals["before"] = self.evaluate()
            self.save_checkpoint()
        bar = tqdm(
            total=c.max_steps, initial=self.step, desc="GRPO", disable=c.disable_tqdm, leave=False
        )
        while self.step < c.max_steps:
            row = self.grpo_step()
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward_mean']:.3f}", acc=f"{row['accuracy']:.3f}")
            self._maybe_checkpoint()
        bar.close()
        self.evals["after"] = self.evaluate()

    def evaluate(self) -> dict:
        # Under torchrun every rank evaluates the whole held-out set with the same seeded stream
        # and the same weights: the numbers of one process, on every rank, with no communication
        # (and no speed-up). Recipes' own evaluate methods follow the same rule.
        c = self.config
        return evaluate(
            self.model,
            self.tokenizer,
            self.task,
            self.eval_problems,
            samples=c.eval_samples,
            temperature=c.temperature,
            max_completion_length=c.max_completion_length,
            seed=c.seed + 1234,
            chat=self.chat,
        )

    def summary(self) -> dict:
        """The run's before/after evaluation (``*_before`` / ``*_after`` keys), cost and config."""
        out = {
            "task": self.task.name,
            "profile": self.config.profile,
            "seed": self.config.seed,
            "num_parameters": self.num_parameters,
            "rl_steps": self.step if self.phase == "grpo" else 0,
            "definition": self.headline_definition,
        }
        for when, ev in self.evals.items():
            for k, v in ev.items():
                out[f"{k}_{when}"] = v
        name, key = self.headline
        if "before" in self.evals and "after" in self.evals:
            out[f"{name}_before"] = self.evals["before"][key]
            out[f"{name}_after"] = self.evals["after"][key]
        out["wall_time_s"] = self.wall_time
        out["config"] = self.config.to_dict()
        return out

    # ------------------------------------------------------------------ checkpoints
    def _maybe_checkpoint(self):
        if self.config.save_steps and self.step % self.config.save_steps == 0:
            self.save_checkpoint()

    def save_checkpoint(self, path: str | None = None) -> str | None:
        """All it takes to continue bit-for-bit: weights, optimizer, RNG streams, histories, evals.

        Plain types and tensors only (see :mod:`agentic_rl.checkpoint`), so loading runs no code.
        Under torchrun rank 0 writes it, with every rank's RNG streams (``rank_rng``); call it on
        every rank.
        """
        self._tick()
        if path is None:
            if not self.config.output_dir:
                return None
            os.makedirs(self.config.output_dir, exist_ok=True)
            path = os.path.join(self.config.output_dir, CHECKPOINT)
        rngs = dist.all_gather_object(_rng_state(self.problem_rng))  # one per rank
        if not dist.is_main():
            return path
        state = {
            "phase": self.phase,
            "step": self.step,
            "model": self._policy_state(),
            "optimizer": self.optimizer.state_dict(),
            "ref_model": (
                "adapters_off"
                if isinstance(self.ref_model, AdaptersOff)
                else None
                if self.ref_model is None
                else self.ref_model.state_dict()
            ),
            "rng": rngs[0],
            "sft_history": self.sft_history,
            "history": self.history,
            "evals": self.evals,
            "wall_time": self.wall_time,
            "config": self.config.to_dict(),
            **self._extra_state(),
        }
        if len(rngs) > 1:
            state["rank_rng"] = rngs  # rank r's streams, to resume on as many ranks
        ckpt.save(state, path)
        out = self.config.output_dir
        if out and os.path.dirname(os.path.abspath(path)) == os.path.abspath(out) and self.history:
            write_csv(self.history, os.path.join(out, "metrics.csv"))
        return path

    def _policy_state(self) -> dict:
        """The policy's weights for a checkpoint: all of them, or with LoRA only the trainable
        ones (the frozen base is loaded again from its source: 0.1 MB-10 MB instead of 540 MB
        for the pretrained profile)."""
        state = self.model.state_dict()
        if not self.config.use_lora:
            return state
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v for k, v in state.items() if k in trainable}

    def _load_policy_state(self, state: dict, path: str) -> None:
        if not self.config.use_lora:
            self.model.load_state_dict(state)
            return
        trainable = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if set(state) != trainable:
            why = "its LoRA weights do not match this model's adapters"
            raise CheckpointError(path, why)
        self.model.load_state_dict(state, strict=False)

    def load_checkpoint(self, path: str) -> None:
        """Verify ``path`` (format, hash, config: :func:`check_resumable`) and continue from it."""
        state = ckpt.load(path, map_location=self.device)
        check_resumable(self.config, state, path)
        _check_world_size(state, path)
        self._load_policy_state(state["model"], path)
        self.phase, self.step = state["phase"], state["step"]
        # before the optimizer: a subclass may add parameters (a critic)
        self._load_extra_state(state)
        self.optimizer = self._make_optimizer()
        self.optimizer.load_state_dict(state["optimizer"])
        if state["ref_model"] == "adapters_off":
            self._make_ref_model(adapters_off=True)
        elif state["ref_model"] is not None:
            self._make_ref_model(adapters_off=False)
            self.ref_model.load_state_dict(state["ref_model"])
        # this rank's RNG streams (the problem stream is the same on every rank)
        rng = state["rank_rng"][dist.rank()] if "rank_rng" in state else state["rng"]
        _set_rng_state(rng, self.problem_rng)
        self.sft_history, self.history, self.evals = (
            state["sft_history"],
            state["history"],
            state["evals"],
        )
        self.wall_time = state["wall_time"]


_STATE_KEYS = (
    "phase",
    "step",
    "model",
    "optimizer",
    "ref_model",
    "rng",
    "sft_history",
    "history",
    "evals",
    "wall_time",
    "config",
)


def _rng_state(problem_rng: random.Random) -> dict:
    """Every RNG stream as plain types and tensors (numpy's key array becomes a tensor)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "problems": problem_rng.getstate(),
    }


def _set_rng_state(rng: dict, problem_rng: random.Random) -> None:
    random.setstate(rng["python"])
    n = rng["numpy"]
    keys = n["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(rng["torch"].cpu())
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.cpu() for t in rng["cuda"]])
    problem_rng.setstate(rng["problems"])


def check_resumable(config: GRPOConfig, state: dict, path: str) -> None:
    """Raise a named error unless ``config`` can continue the run in ``state`` (a checkpoint).

    ``CheckpointError`` if it is not a training checkpoint; ``ConfigMismatchError`` listing each
    differing field (the checkpoint's value and yours) unless only ``RESUMABLE_CHANGES`` differ;
    ``ConfigError`` on ``max_steps`` if the checkpoint has already done more RL steps.
    """
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing or not isinstance(state["config"], dict):
        lacks = missing or ["config"]
        raise CheckpointError(path, f"is not a training checkpoint (it lacks {lacks})")
    mine = config.to_dict()
    saved = {k: v for k, v in state["config"].items() if k not in RESUMABLE_CHANGES}
    diffs = {
        k: (v, mine.get(k, "<no such field>")) for k, v in sorted(saved.items()) if mine.get(k) != v
    }
    if diffs:
        raise ConfigMismatchError(path, diffs)
    if state["phase"] == "grpo" and state["step"] > config.max_steps:
        why = (
            f"the checkpoint {path} has already done {state['step']} RL steps; ask for at least "
            "that many, or --resume false to start over"
        )
        raise ConfigError("max_steps", why, config.max_steps)


def preflight(config: GRPOConfig) -> None:
    """Every check a run makes before any compute, as named errors (``agentic_rl.config.RunError``).

    The config and the machine (``config.check_environment``), then, with an ``output_dir``: no
    other run holds the folder, and an existing checkpoint is sound and matches the config (when
    resuming).
    The CLI calls it before building anything; a trainer makes the same checks as it starts.
    """
    config.check_environment()
    dist.init(dist.rank_device(get_device(config.device)))  # torchrun: join; others go quiet
    check_data_parallel(config)
    out = config.output_dir
    if out and os.path.isdir(out):
        if dist.is_main():  # torchrun: rank 0 takes the lock, the others leave it alone
            ckpt.check_unlocked(out)
        path = os.path.join(out, CHECKPOINT)
        if config.resume and os.path.exists(path):
            state = ckpt.load(path, map_location="cpu")
            check_resumable(config, state, path)
            _check_world_size(state, path)


#: The rollouts that play only this rank's share of a step's groups under torchrun: every
#: recipe's (StarPO's calls the agent's; its 'dynamic' refill is refused below). A new recipe
#: whose rollout draws its own tasks joins this list once it shards them (``dist.shard``).
DATA_PARALLEL_ROLLOUTS = (
    "GRPOTrainer.rollout",
    "AgentTrainer.rollout",
    "StarPOTrainer.rollout",
    "RCGRPOTrainer.rollout",
    "ReToolTrainer.rollout",
)


def check_data_parallel(config: GRPOConfig, trainer_cls: type | None = None) -> None:
    """Under torchrun (W > 1 ranks), refuse with :class:`ConfigError`, before any compute, what
    does not split across the ranks; nothing to check in one process.

    A step's prompts must divide across the ranks (each rank plays an equal share, each prompt
    with its whole group), and each rank's share must fill ``num_minibatches``. Not supported
    yet: ``scale_rewards='batch'`` (the std of the whole batch), StarPO's ``dynamic`` refill
    (the ranks would refill in different numbers of rounds, and their task streams would part),
    and a recipe whose ``rollout`` would play the whole step on every rank (``trainer_cls``: one
    not in :data:`DATA_PARALLEL_ROLLOUTS`).
    """
    w = dist.world_size()
    if w == 1:
        return
    c = config
    if c.prompts_per_step % w:
        why = (
            f"does not divide across {w} ranks (each rank plays an equal share of a step's "
            f"prompts, each with its whole group); use a multiple of {w}"
        )
        raise ConfigError("prompts_per_step", why, c.prompts_per_step)
    rows = c.prompts_per_step // w * c.num_generations
    if c.num_minibatches > rows:
        why = (
            f"must be <= the rows of each rank's batch (prompts_per_step * num_generations / "
            f"{w} ranks = {rows}): a minibatch needs at least one rollout"
        )
        raise ConfigError("num_minibatches", why, c.num_minibatches)
    if c.scale_rewards == "batch":
        why = f"'batch' (the std of the whole batch, spread over {w} ranks) needs one process"
        raise ConfigError("scale_rewards", why + "; use 'group' or 'none'", c.scale_rewards)
    if getattr(c, "rollout_filter", None) == "dynamic":
        why = f"'dynamic' (refill rounds differ between ranks) needs one process, not {w} ranks"
        raise ConfigError("rollout_filter", why + "; use 'top_k' or 'top_p'", c.rollout_filter)
    name = trainer_cls.rollout.__qualname__ if trainer_cls is not None else None
    if name is not None and name not in DATA_PARALLEL_ROLLOUTS:
        why = (
            f"{name} draws a step's tasks and plays all of them on every rank (it does not "
            "shard them yet): this recipe runs in one process only"
        )
        raise ConfigError("nproc_per_node", why, w)


def _check_world_size(state: dict, path: str) -> None:
    """A checkpoint resumes on as many ranks as wrote it (it holds each rank's RNG streams)."""
    saved = len(state.get("rank_rng", [None]))
    if saved != dist.world_size():
        fields = {"ranks (torchrun --nproc_per_node)": (saved, dist.world_size())}
        raise ConfigMismatchError(path, fields)


def run_recipe(trainer: GRPOTrainer) -> dict:
    """Run a recipe headless: train, write ``metrics.csv``, ``sft_metrics.csv``, ``summary.json``.

    A run that was already complete writes nothing (``trainer.was_complete``).
    """
    out = trainer.config.output_dir
    with run_lock(out if dist.is_main() else None):  # torchrun: rank 0 holds it ...
        summary = trainer.train()
        if out and not trainer.was_complete and dist.is_main():  # ... and writes the files
            os.makedirs(out, exist_ok=True)
            write_csv(trainer.history, os.path.join(out, "metrics.csv"))
            write_csv(trainer.sft_history, os.path.join(out, "sft_metrics.csv"))
            tmp = os.path.join(out, "summary.json.tmp")
            with open(tmp, "w") as fh:
                json.dump(summary, fh, indent=2)
            os.replace(tmp, os.path.join(out, "summary.json"))
    return summary


def run_arms(
    trainer_cls, config: GRPOConfig, arms: dict[str, dict], *, start_fields: tuple[str, ...] = ()
) -> dict:
    """Train the arms of a lab from shared warm starts: ``arms`` maps an arm's name to the config
    fields it changes; arms that agree on ``start_fields`` share one warm start (SFT, trained once
    with the first such arm's config). Every arm's RL then starts from a copy of its warm start,
    with the same seed (same tasks, same sampling stream: the task stream continues from where the
    warm start left it). Returns the trained trainers by arm name; each holds its warm start's
    ``sft_history``. In memory only: for checkpoints, run one arm per CLI call."""
    if config.output_dir is not None:
        raise ConfigError(
            "output_dir", "run_arms keeps no checkpoints; run one arm per CLI call for that"
        )
    starts, out = {}, {}
    for name, fields in arms.items():
        arm = dataclasses.replace(config, **fields)
        key = tuple(getattr(arm, f) for f in start_fields)
        if key not in starts:
            warm = trainer_cls(arm)
            warm.sft()
            starts[key] = warm
        warm = starts[key]
        trainer = trainer_cls(
            dataclasses.replace(arm, sft_steps=0),
            model=copy.deepcopy(warm.model),
            tokenizer=copy.deepcopy(warm.tokenizer),
        )
        trainer.sft_history = list(warm.sft_history)
        trainer.problem_rng.setstate(warm.problem_rng.getstate())  # RL tasks follow the demos'
        trainer.train()
        out[name] = trainer
    return out


def run_grpo(config: GRPOConfig) -> dict:
    """The GRPO recipe headless (``python -m agentic_rl grpo``)."""
    return run_recipe(GRPOTrainer(config))
