"""Training: the SFT warm start and the RL loop, with metrics, checkpoints and a NaN guard (once,
here). Every recipe's trainer subclasses :class:`Trainer` and fills in its hooks; GRPO's is in
:mod:`agentic_rl.grpo`, PPO's in :mod:`agentic_rl.agent`.

The RL step (:meth:`Trainer.rl_step`, printed in the GRPO chapter as *the loop*) is the design's
data path, one line each::

    batch = self.rollout()                          # sample G completions per prompt, score them
    advantages = self.compute_advantages(batch)     # [B, T]: group-normalised, GAE, ...
    keep = self.filter_rows(batch)                  # which rows enter the update (None: all)
    for each of num_iterations passes, for each minibatch:
        loss, metrics = self.compute_loss(mb, adv)  # clipped surrogate + beta * KL (+ a recipe's)
        optimizer step                              # gradient clipping, NaN guard
    history row                                     # the metrics below + rollout_metrics

Hooks a recipe may override (public; none of a recipe's overrides is underscored):

==========================================  ======================================================
hook                                        when it runs, what it returns
==========================================  ======================================================
``make_task(self, split="train")``          construction: the task or environment (required);
                                            ``split``: a held-out one where the recipe has it
                                            (GCD's ``"ood"``), else only ``"train"``
``make_eval_set(self)``                     construction: held-out problems or seeds (required)
``sft_batch(self) -> Batch``                each SFT step: demonstrations (required)
``sft_update(self, batch) -> float``        each SFT step: one gradient step, its loss
                                            (default: :func:`sft_step`)
``rollout(self) -> Batch``                  each RL step: the rollout batch (required)
``evaluate(self) -> dict``                  before and after RL: held-out numbers (required)
``compute_advantages(self, batch)``         each RL step: ``[B, T]`` (default: GRPO's group
                                            advantage, broadcast to the generated tokens)
``kl_reward_penalty(self, batch)``          inside ``compute_advantages``: ``beta * k(t)`` per
                                            token when ``kl_in_reward``, else ``None``
``filter_rows(self, batch)``                each RL step: a ``[B]`` keep-mask or ``None`` (all)
``minibatches(self, n)``                    each pass: row indices per gradient step
``compute_loss(self, batch, adv, *, outputs=None)``  each gradient step: ``(loss, metrics)``
``policy_logprobs(self, batch)``            inside ``compute_loss``: ``(logprobs, entropy)``
``rollout_metrics(self, batch, keep)``      each RL step: facts of the whole batch for its row
``make_optimizer(self)``                    construction, start of RL, resume: the optimizer
``start_rl(self)``                          once, when SFT ends (a critic is built here)
``extra_state(self)`` / ``load_extra_state(self, state)``  checkpoint: what a recipe adds
``close(self)``                             when a run ends: release processes (a sandbox)
``headline``, ``headline_definition``       class attributes: the summary's headline metric
``self.extra_metrics``                      property: ``compute_loss`` metrics kept in the row
``self.max_generated_tokens``               property: the constant L of ``seq-mean-token-sum-norm``
``self.added_tokens``                       property: special tokens a recipe adds (RC-GRPO's)
``self.rollout_is_sharded``                 class flag beside ``rollout``: it plays only this
                                            rank's share under torchrun (:mod:`.distributed`)
==========================================  ======================================================

Metric dictionary (one row per RL step in ``history`` and ``metrics.csv``; TRL's names where TRL
has the metric):

========================  ==========================================================================
``step``                  RL step (1-based)
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
                          RL started from); NaN when ``beta == 0`` and ``log_kl`` is off
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
import dataclasses
import math
import os
import random
import time
import warnings

import torch

# tqdm.auto warns in notebooks without ipywidgets; it falls back to text bars
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from tqdm.auto import tqdm

from . import checkpoint as ckpt
from . import distributed as dist
from .advantages import group_advantages
from .checkpoint import CHECKPOINT, run_lock
from .config import RLConfig
from .losses import aggregate, kl_penalty, policy_loss
from .models import AdaptersOff, build_policy, count_parameters, get_device
from .rollout import Batch, first_scored_column, sequence_logprobs, shared_prefix_logprobs
from .utils import grad_scaler, mixed_precision, seed_everything

__all__ = ["Trainer", "sft_step", "check_split"]


def sft_step(
    model, optimizer, batch: Batch, *, max_grad_norm: float = 1.0, loss: torch.Tensor | None = None
) -> float:
    """One teacher-forcing step: cross-entropy on the completion tokens only (``loss_mask``), or
    ``loss`` when a recipe has computed its own SFT loss on ``batch`` (with extra terms)."""
    if loss is None:
        logprobs = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
        loss = aggregate(-logprobs, batch.loss_mask, "token-mean")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return loss.item()


def check_split(split: str, splits: tuple[str, ...] = ("train",)) -> None:
    """Refuse a ``make_task`` split that the recipe does not have."""
    if split not in splits:
        raise ValueError(f"unknown split {split!r}: this recipe's tasks have {list(splits)}")


class _UpdateLog:
    """The loss-side metrics of one RL step's gradient steps: the first step's values, and the
    means over every step of how far the updates moved the policy (as TRL and verl log them)."""

    MEANS = ("clip_ratio", "approx_kl", "vf_clip_ratio")

    def __init__(self, extra: tuple[str, ...]):
        keys = ("loss", "kl", "entropy", "clip_ratio", "approx_kl", "grad_norm", *extra)
        self.first = dict.fromkeys(keys, float("nan"))
        self.updates: list[dict] = []
        self.skipped = 0

    def add(self, loss: torch.Tensor | None, metrics: dict, grad_norm: float, skipped: bool):
        self.skipped += int(skipped)
        if loss is None:  # torchrun: no rows on this rank in this gradient step
            if not self.updates and math.isnan(self.first["loss"]):
                self.first.update(loss=0.0, grad_norm=grad_norm)
            return
        self.updates.append(metrics)
        if len(self.updates) == 1:
            self.first = dict(metrics, loss=loss.item(), grad_norm=grad_norm)

    def result(self) -> dict:
        # At the first gradient step the ratio is 1 (up to sampling-time numerics), so with one
        # step per batch these are ~0 by construction; clipping can only act from the second on.
        out = dict(self.first)
        for key in self.MEANS:
            if self.updates and key in self.updates[0]:
                out[key] = sum(m[key] for m in self.updates) / len(self.updates)
        return out


class Trainer:
    """SFT warm start, then RL, from one config (:class:`~agentic_rl.config.RLConfig`): the loop,
    with the hooks of the module docstring for a recipe to fill in.

    ``Trainer(config)`` builds the task, tokenizer and model; pass ``model`` and ``tokenizer``
    to start from an existing policy (e.g. a copy of an SFT'd model, with ``sft_steps=0``), or
    ``base=(model, tokenizer)``, a pretrained model already loaded, to build the policy on it as
    ``model_name_or_path`` would (LoRA wraps it in place: give each run its own copy).
    ``train()`` runs whatever is left of the run and resumes from ``output_dir/checkpoint.pt`` when
    one exists.
    """

    #: The summary's headline metric: ``(name, evaluation key)``, as ``<name>_before/_after``.
    headline = ("accuracy", "sampled_accuracy")
    headline_definition = "accuracy: exact-match rate of samples at the training temperature"
    #: Special tokens a recipe adds to the tokenizer and the embedding (none by default).
    added_tokens: tuple[str, ...] = ()

    def __init__(self, config: RLConfig, *, model=None, tokenizer=None, task=None, base=None):
        config.check_environment()  # config, device, output folder, memory: before any compute
        self.device = dist.rank_device(get_device(config.device))
        dist.init(self.device)  # under torchrun: join the other ranks (one process: nothing)
        dist.check_data_parallel(config, type(self))
        if not dist.is_main():  # one progress bar: rank 0's
            config = dataclasses.replace(config, disable_tqdm=True)
        self.config = config
        self.task = task or self.make_task()
        seed_everything(config.seed)
        if model is None:
            model, tokenizer = build_policy(
                config, self.task, self.device, base=base, chat=self.chat, added=self.added_tokens
            )
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
        self.problem_rng = random.Random(config.seed)  # the task stream (checkpointed)
        self.eval_problems = self.make_eval_set()
        self.phase = "sft" if config.sft_steps > 0 else "rl"
        self.step = 0  # steps done in the current phase
        self.sft_history: list[dict] = []
        self.history: list[dict] = []
        self.evals: dict[str, dict] = {}
        self.optimizer = self.make_optimizer()
        self.scaler = grad_scaler(self.device, config.bf16)  # fp16 only; else a disabled one
        self.wall_time = 0.0  # seconds spent in train(), summed over every resume
        self._clock = None  # perf_counter() when wall_time was last brought up to date (None: idle)
        self.was_complete = False  # train() found the run already finished and changed nothing
        self.skip_reason: str | None = None  # why the last skipped update was skipped

    # ------------------------------------------------------------------ hooks a recipe fills in
    def make_task(self, split: str = "train"):
        """The task or environment the recipe trains on (``split="train"``), or one of a held-out
        split where the recipe has one; a recipe without splits refuses any other
        (:func:`check_split`)."""
        raise NotImplementedError(f"{type(self).__name__} must define make_task")

    def make_eval_set(self) -> list:
        """Held-out problems (or episode seeds), fixed for the run."""
        raise NotImplementedError(f"{type(self).__name__} must define make_eval_set")

    def sft_batch(self) -> Batch:
        """``sft_batch_size`` fresh demonstrations for one SFT step."""
        raise NotImplementedError(f"{type(self).__name__} must define sft_batch")

    def rollout(self) -> Batch:
        """One RL step's rollout batch."""
        raise NotImplementedError(f"{type(self).__name__} must define rollout")

    def evaluate(self) -> dict:
        """Held-out numbers, before and after RL (the same seeded stream both times)."""
        raise NotImplementedError(f"{type(self).__name__} must define evaluate")

    #: Whether ``rollout`` (as defined in the class that sets this flag beside it) plays only this
    #: rank's share of a step under torchrun. A subclass overriding ``rollout`` sets it again.
    rollout_is_sharded = False

    @property
    def chat(self) -> bool:
        """Whether prompts are chat turns (the task says so: ``task.chat``), to be wrapped in the
        model's chat template."""
        return bool(getattr(self.task, "chat", False))

    @property
    def max_generated_tokens(self) -> float:
        """The most tokens one rollout can generate: the constant L of
        ``seq-mean-token-sum-norm``."""
        return float(self.config.max_completion_length)

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """Names of ``compute_loss`` metrics a subclass adds to each history row (none here)."""
        return ()

    def extra_state(self) -> dict:
        """What a subclass adds to a checkpoint (e.g. a critic)."""
        return {}

    def load_extra_state(self, state: dict) -> None:
        """Restore what :meth:`extra_state` saved."""

    def close(self) -> None:
        """Release what a subclass holds outside the process's memory (e.g. ReTool's sandbox
        workers); nothing here. The CLI calls it when a run ends."""

    def make_optimizer(self):
        lr = self.config.sft_learning_rate if self.phase == "sft" else self.config.learning_rate
        params = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def start_rl(self):
        """Switch from SFT to RL: fresh optimizer; freeze a copy of the policy as pi_ref."""
        self.phase, self.step = "rl", 0
        self.optimizer = self.make_optimizer()
        if self.config.beta > 0 or self.config.log_kl:
            self.make_ref_model()

    def make_ref_model(self, adapters_off: bool | None = None):
        """pi_ref, the policy RL starts from (with beta = 0 only kept when ``log_kl`` is on: one
        extra forward pass per step, ~15-25 % of a quick-profile step). A LoRA policy whose
        adapters are still at their initialisation (B = 0: no SFT moved them) *is* its base model,
        so pi_ref is the same model with the adapters switched off, no second copy."""
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
        """Teacher-forcing on the task's demonstrations, until ``sft_steps`` steps are done."""
        c = self.config
        target = c.sft_steps if steps is None else min(c.sft_steps, self.step + steps)
        bar = tqdm(
            total=c.sft_steps, initial=self.step, desc="SFT", disable=c.disable_tqdm, leave=False
        )
        self.model.train()
        while self.phase == "sft" and self.step < target:
            loss = self.sft_update(self.sft_batch())
            self.step += 1
            self.sft_history.append({"step": self.step, "loss": loss})
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            self._maybe_checkpoint()
        bar.close()
        if self.phase == "sft" and self.step >= c.sft_steps:
            self.start_rl()
            self.save_checkpoint()
        return self.sft_history

    def sft_update(self, batch: Batch) -> float:
        """One SFT gradient step on ``batch`` (teacher forcing, :func:`sft_step`); its loss."""
        return sft_step(self.model, self.optimizer, batch, max_grad_norm=self.config.max_grad_norm)

    # ------------------------------------------------------------------ RL hooks with defaults
    def compute_advantages(self, batch: Batch) -> torch.Tensor:
        """GRPO (eq. grpo-adv): one group-normalised scalar per completion,
        copied to its tokens ``[B, T]``."""
        scores = batch.scores
        penalty = self.kl_reward_penalty(batch)
        if penalty is not None:
            scores = scores - penalty.sum(1)
        adv = group_advantages(scores, batch.group_id, scale=self.config.scale_rewards)
        return adv[:, None] * batch.loss_mask

    @torch.no_grad()
    def kl_reward_penalty(self, batch: Batch) -> torch.Tensor | None:
        """``[B, T]``: ``beta * k(t)`` on every trained token when the KL goes into the reward
        (``kl_in_reward``: verl's ``apply_kl_penalty``, ``r_t - beta * kld_t``); ``None`` when it is
        a loss term. k is the ``kl_estimator`` at the policy that sampled (pi_old)."""
        c = self.config
        if not c.kl_in_reward:
            return None
        old = batch.old_logprobs
        if old is None:  # one on-policy step: the rollout did not record them
            old = sequence_logprobs(
                self.model, batch.input_ids, batch.attention_mask, temperature=c.temperature
            )
        return c.beta * kl_penalty(old, batch.ref_logprobs, c.kl_estimator) * batch.loss_mask

    def filter_rows(self, batch: Batch) -> torch.Tensor | None:
        """The filter stage between advantages and loss: a ``[B]`` keep-mask, or ``None`` to
        keep every row (GRPO). StarPO-S overrides it (``agentic_rl.filters``)."""
        return None

    def minibatches(self, n: int) -> list[torch.Tensor | None]:
        """Row indices of each minibatch of one pass (``[None]``: the whole batch, no copy)."""
        k = self.config.num_minibatches
        if k == 1:
            return [None]
        perm = torch.randperm(n)  # the global torch stream: seeded, and checkpointed
        return list(torch.tensor_split(perm, k))

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
            logprobs, old_logprobs, advantages, batch.loss_mask, epsilon=c.epsilon,
            epsilon_high=c.epsilon_high, dual_clip=c.dual_clip, agg=c.agg_mode,
            norm_constant=norm,
        )  # fmt: skip
        if c.beta > 0 and not c.kl_in_reward:  # (in the reward: see kl_reward_penalty)
            kl = kl_penalty(logprobs, batch.ref_logprobs, c.kl_estimator)
            loss = loss + c.beta * aggregate(kl, batch.loss_mask, c.agg_mode, norm_constant=norm)
        if c.entropy_coeff > 0:  # the entropy bonus (verl: pg_loss - entropy_coeff * entropy)
            bonus = aggregate(entropy, batch.loss_mask, c.agg_mode, norm_constant=norm)
            loss = loss - c.entropy_coeff * bonus
        metrics["entropy"] = aggregate(entropy.detach(), batch.loss_mask, "token-mean").item()
        metrics["kl"] = float("nan")
        if batch.ref_logprobs is not None:  # the drift from pi_ref, logged with k3
            kl = kl_penalty(logprobs.detach(), batch.ref_logprobs, "k3")
            metrics["kl"] = aggregate(kl, batch.loss_mask, "token-mean").item()
        return loss, metrics

    def policy_logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's log-probs and entropies ``[B, T]`` of a batch's tokens, with gradients:
        the loss's forward pass (each prompt once with ``share_prompt_prefix``)."""
        c = self.config
        entropy_grad = c.entropy_coeff > 0  # else entropy is only logged
        start = first_scored_column(batch.loss_mask)
        kwargs = dict(temperature=c.temperature, with_entropy=True, entropy_grad=entropy_grad)
        if c.share_prompt_prefix:
            return shared_prefix_logprobs(
                self.model, batch.input_ids, batch.attention_mask, prompt_len=start, **kwargs
            )
        start = start if c.skip_prompt_logits else 1
        return sequence_logprobs(
            self.model, batch.input_ids, batch.attention_mask, start=start, **kwargs
        )

    def rollout_metrics(self, batch: Batch, keep: torch.Tensor | None) -> dict:
        """Facts of the whole rollout batch for the history row (``keep``: the filter's mask), which
        a subclass adds whether or not an update happened; none here."""
        return {}

    # ------------------------------------------------------------------ the loop
    def rl_step(self) -> dict:
        """One RL step: rollout, advantages, filter, then ``num_iterations`` passes over the kept
        rows, each of ``num_minibatches`` gradient steps (1 x 1 by default: one on-policy step, as
        GRPO and TRL), and the step's history row. Under torchrun each rank plays its share of the
        groups; the ``dist.`` lines pair the ranks' gradient steps and weight their losses (one
        process: they change nothing; see :mod:`agentic_rl.distributed`)."""
        c = self.config
        if self.ref_model is None and (c.beta > 0 or c.log_kl):
            self.make_ref_model()
        t0 = time.perf_counter()
        with self.mixed_precision():  # bf16 (else fp16) autocast on a GPU when asked for
            batch = self.rollout()
        t_rollout = time.perf_counter() - t0
        advantages = self.compute_advantages(batch)
        keep = self.filter_rows(batch)  # the filter stage (StarPO-S, dynamic sampling)
        rows = keep.nonzero().flatten() if keep is not None else None
        update, update_adv = batch.select(rows), Batch.take(advantages, rows)  # the kept rows
        self.model.train()
        log = _UpdateLog(self.extra_metrics)
        log.skipped = 0 if self._any_rows(update) else 1  # the filter kept nothing: no update
        for _ in range(c.num_iterations if not log.skipped else 0):  # mu passes over the batch ...
            parts = self.minibatches(len(update)) if len(update) else []
            for part in dist.pad_to_longest(parts):  # ... of num_minibatches gradient steps
                if part is dist.NO_ROWS:  # torchrun: none of this step's rows on this rank
                    dist.rank_share(None, c.agg_mode)
                    log.add(None, {}, *self.optimizer_step(None))
                    continue
                mb, mb_adv = update.select(part), Batch.take(update_adv, part)
                with self.mixed_precision():
                    loss, metrics = self.compute_loss(mb, mb_adv)
                loss = loss * dist.rank_share(mb.loss_mask, c.agg_mode)  # 1 in one process
                log.add(loss, metrics, *self.optimizer_step(loss))
        self.step += 1
        row = self._history_row(batch, log, t0, t_rollout)
        row.update(dist.mean_over_ranks(self.rollout_metrics(batch, keep)))
        self.history.append(row)
        return row

    def _any_rows(self, update: Batch) -> bool:
        (kept,) = dist.sum_over_ranks([len(update)])  # the rows that enter the update (all ranks')
        if not kept:
            self.skip_reason = "the filter kept no rollout"
            warnings.warn(
                f"RL step {self.step + 1}: the filter kept no rollout (no group had the reward "
                "spread it asks for); skipped this update",
                RuntimeWarning,
                stacklevel=3,
            )
        return bool(kept)

    def _history_row(self, batch: Batch, log: _UpdateLog, t0: float, t_rollout: float) -> dict:
        """The step's row: the whole batch's (all ranks' rows under torchrun), then the loss side
        (the first gradient step's; the means over the ranks under torchrun)."""
        rollout = dist.rollout_row(batch, t_rollout)
        tokens_per_s = rollout.pop("tokens_per_s")
        first = dist.mean_over_ranks(log.result())
        keys = ("loss", "kl", "entropy", "clip_ratio", "approx_kl", "grad_norm")
        row = {"step": self.step, **rollout, **{k: first[k] for k in keys}}
        row.update(tokens_per_s=tokens_per_s, step_time=time.perf_counter() - t0)
        row["skipped"] = log.skipped
        row.update({k: first[k] for k in self.extra_metrics})
        return row

    def optimizer_step(self, loss: torch.Tensor | None) -> tuple[float, bool]:
        """Backward, average the gradients over the ranks (under torchrun), clip, step; skip the
        update (and say so) if the loss or gradient is not finite (fp16: the ``GradScaler``'s
        overflows too, each lowering its scale). Returns ``(grad_norm, skipped)``. ``loss=None``
        (torchrun only): this rank has no rows in this step; it joins with a zero gradient."""
        self.optimizer.zero_grad(set_to_none=True)
        finite = loss is None or bool(torch.isfinite(loss))
        if not finite:
            self.skip_reason = f"the loss was {loss.item()}"
            warnings.warn(
                f"RL step {self.step + 1}: loss is {loss.item()}; skipped this update",
                RuntimeWarning,
                stacklevel=3,
            )
            if dist.world_size() == 1:
                return float("nan"), True
        elif loss is not None:
            self.scaler.scale(loss).backward()  # fp16: the loss scaled up (else it is the loss)
        # Under torchrun: the gradient of the step's whole batch, before clipping, so that every
        # rank clips and steps alike. A rank whose loss is not finite makes it NaN on every rank,
        # and every rank skips the update below.
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        dist.average_gradients(params, poison=not finite)
        self.scaler.unscale_(self.optimizer)  # fp16: the true gradients, to clip (else nothing)
        # Clip each parameter group on its own (the policy; a critic); report the policy's.
        norms = [
            torch.nn.utils.clip_grad_norm_(g["params"], self.config.max_grad_norm).item()
            for g in self.optimizer.param_groups
        ]
        if not all(math.isfinite(n) for n in norms):
            grad_norm = next(n for n in norms if not math.isfinite(n))
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()  # fp16: an overflow lowers the scale (else nothing)
            self.skip_reason = f"the gradient norm was {grad_norm}"
            warnings.warn(
                f"RL step {self.step + 1}: gradient norm is {grad_norm}; skipped this update",
                RuntimeWarning,
                stacklevel=3,
            )
            return grad_norm, True
        self.scaler.step(self.optimizer)  # optimizer.step() (fp16: unless an overflow was found)
        self.scaler.update()
        return norms[0], False

    def mixed_precision(self):
        """This run's autocast (see :func:`agentic_rl.utils.mixed_precision`), or nothing."""
        return mixed_precision(self.device, self.config.bf16)

    # ------------------------------------------------------------------ a whole run
    def train(self) -> dict:
        """Run what is left of the run (SFT, evaluation, RL, evaluation) and return the summary.

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
        return self.phase == "rl" and self.step >= self.config.max_steps and "after" in self.evals

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
            total=c.max_steps, initial=self.step, desc="RL", disable=c.disable_tqdm, leave=False
        )
        while self.step < c.max_steps:
            row = self.rl_step()
            bar.update(1)
            bar.set_postfix(reward=f"{row['reward_mean']:.3f}", acc=f"{row['accuracy']:.3f}")
            self._maybe_checkpoint()
        bar.close()
        self.evals["after"] = self.evaluate()

    def summary(self) -> dict:
        """The run's before/after evaluation (``*_before`` / ``*_after`` keys), cost and config."""
        out = {
            "task": self.task.name,
            "model": self.config.model_name_or_path or "tiny model (trained from scratch)",
            "profile": self.config.profile,
            "seed": self.config.seed,
            "num_parameters": self.num_parameters,
            "rl_steps": self.step if self.phase == "rl" else 0,
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
        """All it takes to continue bit-for-bit: weights, optimizer, RNG streams, histories, evals
        (:func:`~agentic_rl.checkpoint.state_of`, read back by :meth:`load_checkpoint`).

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
        rngs = dist.all_gather_object(ckpt.rng_state(self.problem_rng))  # one per rank
        if not dist.is_main():
            return path
        ckpt.save(ckpt.state_of(self, rngs), path)
        out = self.config.output_dir
        if out and os.path.dirname(os.path.abspath(path)) == os.path.abspath(out) and self.history:
            ckpt.write_csv(self.history, os.path.join(out, "metrics.csv"))
        return path

    def load_checkpoint(self, path: str) -> None:
        """Verify ``path`` (format, hash, config, contents:
        :func:`~agentic_rl.checkpoint.check_resumable`) and continue from it
        (:func:`~agentic_rl.checkpoint.restore`)."""
        state = ckpt.load(path, map_location=self.device)
        ckpt.check_resumable(self.config, state, path)
        ckpt.check_world_size(state, path)
        ckpt.restore(self, state, path)
