"""GRPO on a single-turn verifiable task: the GRPO chapter's recipe.

What the chapter adds to the loop (:class:`agentic_rl.train.Trainer`), and nothing else:

- :class:`GRPOConfig`: the task, its noisy teacher and the completion length, and the profiles
  (``quick`` on a CPU, ``full`` on a GPU, ``pretrained``: SmolLM2-135M-Instruct with LoRA);
- :class:`GRPOTrainer`: the task's prompts, ``G`` completions each (:func:`~agentic_rl.rollout.
  generate_batch`), the noisy teacher's demonstrations, and :func:`evaluate`. GRPO's advantage and
  the clipped loss are the loop's defaults (``Trainer.compute_advantages``, ``compute_loss``).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import distributed as dist
from .bounds import COEF
from .config import FULL_MODEL, RLConfig, param
from .envs import make_task
from .rollout import Batch, build_sft_batch, chat_prompt, generate_batch
from .train import Trainer, check_split
from .utils import EVAL_PROBLEMS_OFFSET, EVAL_SAMPLING_OFFSET, eval_sampling_seed, fixed_rng

__all__ = ["GRPOConfig", "GRPOTrainer", "evaluate", "CONFIG", "TRAINER"]


@functools.lru_cache(maxsize=64)
def _prompt_tokens(task: str, digits: int) -> int:
    from .envs import make_task

    problem = make_task(task, digits=digits).sample(1, random.Random(0))[0]
    return len(problem.prompt.split()) + 1


@dataclass
class GRPOConfig(RLConfig):
    """GRPO on a single-turn verifiable task: SFT warm start, GRPO, before/after evaluation."""

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},  # the dataclass defaults
        "full": dict(
            FULL_MODEL,
            num_hidden_layers=6,
            digits=3,
            sft_steps=3000,
            sft_batch_size=128,
            sft_learning_rate=5e-4,
            max_steps=300,
            prompts_per_step=64,
            num_generations=16,
            learning_rate=5e-5,
            eval_size=1024,
        ),
        # A real pretrained instruct model (shipped as a pip package, no hub), LoRA on its attention
        # projections, GRPO on sums asked in English. Sized for one CPU thread (~3 minutes); on a
        # GPU, GPU_PROFILES scales the batch and the run up, and the frozen base runs in bf16.
        "pretrained": dict(
            model_name_or_path="smollm2-135m-instruct",
            use_lora=True,
            lora_r=16,
            lora_alpha=32,
            task="sums",
            digits=1,
            format_weight=0.5,
            sft_steps=0,
            max_steps=10,
            prompts_per_step=4,
            num_generations=4,
            learning_rate=5e-4,
            temperature=0.7,
            max_completion_length=12,
            # one prompt per row in the loss: the shared-prefix path is tested on the tiny model,
            # not yet on chat-template prompts (skip_prompt_logits, on, is the pretrained saving)
            share_prompt_prefix=False,
            log_kl=True,  # the lab plots the drift from the base model (the adapters switched off)
            eval_size=32,
            eval_samples=1,
        ),
    }

    GPU_PROFILES: ClassVar[dict[str, dict]] = {
        "full": dict(bf16=True),  # bfloat16 autocast where the GPU supports it
        # the pretrained profile on a GPU (device auto or cuda): 128 answers per step, 100 steps
        "pretrained": dict(
            prompts_per_step=16, num_generations=8, max_steps=100, eval_size=256, eval_samples=4
        ),
    }

    # --- task
    task: str = param("addition", "Task name (see agentic_rl.envs.TASKS).")
    digits: int = param(2, "Addition and sums tasks: digits per operand.")
    teacher_error_rate: float = param(
        0.5, "Fraction of SFT demonstrations with one wrong digit (the noisy teacher)."
    )
    format_weight: float = param(
        0.1,
        "Weight of the format reward added to the 0/1 exact-match reward (sums: the bare number).",
        high=1e3,
        why=COEF,
    )
    max_completion_length: int = param(8, "Maximum generated tokens per completion.", tokens=True)

    def validate(self) -> None:
        super().validate()
        from .envs import TASKS

        if self.task not in TASKS:
            self._bad("task", f"unknown task; known tasks are {sorted(TASKS)}")
        if self.num_generations < 2:
            self._bad(
                "num_generations",
                "GRPO needs a group of at least 2 completions per prompt "
                "(a group of one has no baseline)",
            )
        self._at_least(("max_completion_length", "digits"), 1)
        if self.digits > 6:
            self._bad("digits", f"the {self.task} task supports 1 to 6 digits")
        if self.task == "sums" and self.model_name_or_path is None:
            self._bad(
                "model_name_or_path",
                "the sums task is written in English and needs a pretrained model with a chat "
                "template (e.g. --profile pretrained); the tiny model's vocabulary is digits",
            )
        if not 0.0 <= self.teacher_error_rate <= 1.0:
            self._bad("teacher_error_rate", "must be in [0, 1]")
        if self.format_weight < 0:
            self._bad("format_weight", "must be >= 0")
        tokens = self.prompt_tokens() + self.max_completion_length
        self._check_positions("max_completion_length", tokens)

    _size_fields: ClassVar[tuple[str, ...]] = ("max_completion_length",)

    def prompt_tokens(self) -> int:
        """Tokens of the task's prompt (one word-level token per word, plus BOS)."""
        return _prompt_tokens(self.task, self.digits)

    def min_sequence_tokens(self) -> int:
        return self.prompt_tokens() + 1


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
    seed: int = EVAL_SAMPLING_OFFSET,
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
    with fixed_rng(seed, device):
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


class GRPOTrainer(Trainer):
    """SFT warm start on a noisy teacher, then GRPO, from one :class:`GRPOConfig`."""

    config: GRPOConfig

    headline = ("accuracy", "sampled_accuracy")
    headline_definition = (
        "accuracy: exact-match rate of samples at the training temperature "
        "(pass@1, = sampled_accuracy); greedy_accuracy: of greedy decoding"
    )

    def make_task(self, split: str = "train"):
        check_split(split)  # (the held-out problems are drawn from the same task)
        c = self.config
        kwargs = dict(digits=c.digits, format_weight=c.format_weight)
        if c.task == "addition":
            kwargs["teacher_error_rate"] = c.teacher_error_rate
        return make_task(c.task, **kwargs)

    def make_eval_set(self):
        # a fixed held-out set, drawn from its own stream: it never depends on the training draws
        rng = random.Random(EVAL_PROBLEMS_OFFSET + self.config.seed)
        return self.task.sample(self.config.eval_size, rng)

    def sft_batch(self) -> Batch:
        """``sft_batch_size`` fresh teacher demonstrations."""
        problems = self.task.sample(self.config.sft_batch_size, self.problem_rng)
        demos = [self.task.demonstration(p, self.problem_rng) for p in problems]
        prompts = [
            chat_prompt(self.tokenizer, p.prompt) if self.chat else p.prompt for p in problems
        ]
        return build_sft_batch(self.tokenizer, prompts, demos, self.device)

    rollout_is_sharded = True

    def rollout(self) -> Batch:
        """Sample ``num_generations`` completions for each of ``prompts_per_step`` fresh prompts
        (under torchrun: for this rank's share of them)."""
        c = self.config
        # Every rank draws the step's prompts (the same draws as one process), then plays its
        # contiguous share of them, each prompt's whole group.
        problems = dist.shard(self.task.sample(c.prompts_per_step, self.problem_rng))
        # With mu = 1 the policy that sampled is the policy being updated, so pi_old's log-probs
        # are the loss's own (detached) log-probs: no separate forward pass is needed (as TRL).
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
            seed=eval_sampling_seed(c.seed),
            chat=self.chat,
        )


CONFIG, TRAINER = GRPOConfig, GRPOTrainer
