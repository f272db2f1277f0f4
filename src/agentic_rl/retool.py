"""ReTool: a code interpreter inside the rollout, and the interpreter-feedback mask.

The ReTool chapter's new ideas, on top of the multi-turn agent trainer (:class:`AgentTrainer`):

- the environment is an interpreter (:class:`~agentic_rl.envs.MultiplyEnv`): generation pauses at
  ``</code>``, the snippet runs in the sandbox (:mod:`agentic_rl.sandbox`), and its output comes
  back inside ``<interpreter> ... </interpreter>``; the multi-turn engine keeps its KV cache across
  the pause, so only the output's tokens are encoded;
- the **interpreter feedback mask**: those tokens stay in the context, but with ``loss_mask`` 0
  (eq. retool-loss). :func:`interpreter_tokens` finds them; ``mask_interpreter=False`` is the
  ablation that trains them as if the policy had written them (:func:`unmask_interpreter`);
- :func:`gradient_share`: how much of the update comes from interpreter tokens when they are not
  masked;
- :func:`resample_on_correct`: rStar2-Agent's GRPO-RoC down-sampling (positives with the fewest
  tool errors, negatives at random);
- ``interpreter_placebo``: the unmasked ablation's placebo (:func:`placebo_signs`).

Everything else (SFT, GRPO or PPO+GAE, checkpoints, the CLI) is the agent trainer's.

The ``pretrained`` profile runs the same recipe on a real chat model (SmolLM2-135M-Instruct, LoRA):
the env is :class:`~agentic_rl.envs.PythonToolEnv` (real Python in a fenced block), turns are
encoded in the model's chat template (:mod:`agentic_rl.chat`, :attr:`ReToolTrainer.chat_format`),
and the interpreter's tokens are the template's tool turn.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import distributed as dist
from . import jail, sandbox
from .agent import AgentTrainer
from .config import FULL_MODEL, AgentFields, ConfigError, CriticFields, defaults, param
from .denominator import PolicyDenominatorFields, over_policy_tokens
from .envs import make_env
from .losses import policy_loss
from .rollout import Batch, build_segments_batch, sequence_logprobs
from .train import check_split
from .utils import EVAL_SAMPLING_OFFSET, eval_sampling_seed, fixed_rng, substream, train_seed

__all__ = [
    "ReToolConfig",
    "ReToolTrainer",
    "interpreter_tokens",
    "interpreter_span",
    "unmask_interpreter",
    "gradient_share",
    "resample_on_correct",
    "placebo_signs",
    "CONFIG",
    "TRAINER",
]


#: The sandbox pool's longest deadline per snippet (``sandbox.Pool``'s ``timeout_s``, in seconds).
TOOL_TIMEOUT_MAX_S = 3600.0


@dataclass
@defaults(
    env="multiply",
    prompts_per_step=16,
    sft_steps=400,
    max_steps=40,
    eval_size=128,
    loss_type="token-mean",
    sft_batch_size=32,
)
class ReToolConfig(AgentFields, CriticFields, PolicyDenominatorFields):
    """ReTool: code runs inside the rollout; the interpreter's output is masked out of the loss."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("multiply", "python-tool")

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(
            FULL_MODEL,
            num_hidden_layers=4,
            digits_a=4,
            digits_b=3,
            max_action_tokens=14,
            max_output_tokens=10,
            sft_steps=1500,
            sft_batch_size=64,
            max_steps=300,
            prompts_per_step=64,
            eval_size=512,
        ),
        # A real instruct model (SmolLM2-135M-Instruct, shipped as a pip package: no hub) in its
        # chat template, writing real Python in a fenced block (the python-tool env); LoRA on the
        # attention projections. A short SFT on expert conversations, then GRPO: sized for one CPU
        # thread (the agent LLM lab). On a GPU, GPU_PROFILES scales the group and the run up.
        "pretrained": dict(
            env="python-tool",
            model_name_or_path="smollm2-135m-instruct",
            use_lora=True,
            lora_r=16,
            lora_alpha=32,
            max_turns=2,  # one tool call, then the answer
            max_action_tokens=20,  # a code block is ~15 tokens with its end-of-turn token
            max_output_tokens=32,  # characters of the tool's output
            # half the expert conversations answer directly (the model cannot compute those): GRPO
            # then has a choice to learn, call the tool or guess
            sft_tool_fraction=0.5,
            demo_error_rate=0.0,
            sft_steps=8,
            sft_batch_size=8,
            sft_learning_rate=1e-3,
            max_steps=8,
            prompts_per_step=4,
            num_generations=4,
            num_minibatches=1,
            learning_rate=5e-4,
            temperature=0.7,
            grad_share_every=0,
            tool_workers=1,
            eval_size=32,
            eval_samples=1,
        ),
    }
    GPU_PROFILES: ClassVar[dict[str, dict]] = {
        "pretrained": dict(
            sft_steps=60,
            sft_batch_size=32,
            max_steps=100,
            prompts_per_step=16,
            num_generations=8,
            num_minibatches=2,
            tool_workers=4,
            eval_size=256,
            eval_samples=4,
            bf16=True,
        ),
    }

    # --- defaults that differ from the agent fields' (quick profile: ~1 minute per run)
    advantage_estimator: str = param(
        "grpo",
        "'grpo' (group-relative, as the verl ReTool recipe) or 'gae' (PPO with a critic, as the "
        "ReTool paper).",
    )
    num_generations: int = param(8, "Episodes per problem (the GRPO group).")
    num_minibatches: int = param(
        2,
        "Minibatches per pass over the rollout batch (from the second, the ratio departs from 1).",
    )
    max_turns: int = param(
        3,
        "Segments of policy text per episode; a tool call ends a segment, so the tool budget "
        "is max_turns - 1 calls.",
    )
    max_action_tokens: int = param(10, "Maximum tokens of one segment of policy text.")
    demo_error_rate: float = param(
        0.15,
        "Fraction of the cold-start tool traces whose code miscopies a digit (a consistent but "
        "wrong trace).",
    )
    demo_retry_rate: float = param(
        0.0,
        "Fraction of the cold-start tool traces whose first snippet is a syntax error, followed "
        "by a correct retry (correct traces with a tool error: the GRPO-RoC demonstration).",
    )
    # --- the task and the tool
    digits_a: int = param(3, "Digits of the first factor.")
    digits_b: int = param(2, "Digits of the second factor.")
    sft_tool_fraction: float = param(
        0.5, "Fraction of cold-start traces that use the tool (the rest answer directly)."
    )
    mask_interpreter: bool = param(
        True,
        "Interpreter feedback mask: no loss on interpreter tokens (ReTool). False is the "
        "ablation: they are trained as if the policy had written them.",
    )
    interpreter_placebo: bool = param(
        False,
        "A placebo, not ReTool (needs mask_interpreter False): the interpreter tokens of each "
        "episode get its advantage times a random sign of their own (one per episode). The "
        "interpreter term keeps its size (its share of AdamW's per-coordinate normaliser) but "
        "its direction no longer follows success: nothing consistent to imitate.",
    )
    max_output_tokens: int = param(
        8,
        "Interpreter output longer than this is cut and marked '...' (in tokens; in characters "
        "for the python-tool env).",
        tokens=True,
    )
    tool_error_rate: float = param(
        0.0, "Probability that a tool call fails without running (the GRPO-RoC demonstration)."
    )
    tool_timeout_s: float = param(1.0, "Sandbox: wall-clock limit per snippet, in seconds.")
    tool_memory_mb: int = param(256, "Sandbox: address-space limit per snippet, in MiB.")
    tool_workers: int = param(
        2,
        "Sandbox pool: snippets run concurrently.",
        high=1024,
        why="each worker is a process (about 16 MiB)",
    )
    allow_uncontained_code: bool = param(
        False,
        "UNSAFE. Run the model's code even where bubblewrap cannot (namespaces and the audit hook "
        "only, which a snippet can switch off: it can then read and write your files, reach the "
        "network and kill processes). Off: such a machine refuses the run before any compute.",
    )
    resample_on_correct: bool = param(
        False,
        "GRPO-RoC: sample 2 * num_generations episodes per problem, keep num_generations "
        "(positives with the fewest tool errors, negatives at random as in the paper).",
    )
    grad_share_every: int = param(
        5,
        "Every this many RL steps, measure the share of the gradient norm that comes from "
        "interpreter tokens (0: never; costs two extra backward passes).",
    )

    def validate(self) -> None:
        super().validate()
        for name in ("digits_a", "digits_b"):
            if not 1 <= getattr(self, name) <= 6:
                self._bad(name, "must be between 1 and 6")
        for name in ("sft_tool_fraction", "tool_error_rate", "demo_retry_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                self._bad(name, "must be in [0, 1]")
        if self.max_turns < 2:
            self._bad("max_turns", "must be >= 2 (one tool call and an answer)")
        if self.env == "python-tool" and not self.model_name_or_path:
            why = (
                "the python-tool env is a conversation in a chat template, written in real Python: "
                "it needs a pretrained chat model (--profile pretrained)"
            )
            self._bad("env", why)
        # the sandbox pool's own limits (sandbox.Pool refuses anything else at the first rollout)
        if not 0 < self.tool_timeout_s <= TOOL_TIMEOUT_MAX_S:
            why = f"must be in (0, {TOOL_TIMEOUT_MAX_S:g}] seconds (the pool's)"
            self._bad("tool_timeout_s", why)
        self._at_least(("max_output_tokens", "tool_workers"), 1)
        self._at_least(("tool_memory_mb",), sandbox.MIN_MEMORY_MB)
        self._at_least(("grad_share_every",), 0)
        if self.resample_on_correct and self.advantage_estimator != "grpo":
            self._bad("resample_on_correct", "is a GRPO method: use advantage_estimator 'grpo'")
        if self.interpreter_placebo and self.mask_interpreter:
            why = "signs the interpreter tokens' advantages: needs mask_interpreter False"
            self._bad("interpreter_placebo", why)
        # the answer segment: <answer>, the product's digits, </answer>, EOS
        need = self.digits_a + self.digits_b + 3
        if self.max_action_tokens < need:
            self._bad("max_action_tokens", f"must be >= {need} to write the answer")
        # prompt, every segment, and an interpreter block (with its "...") after each tool call
        tokens = self.digits_a + self.digits_b + 3 + self.max_turns * self.max_action_tokens
        self._check_positions(
            "max_turns", tokens + (self.max_turns - 1) * (self.max_output_tokens + 3)
        )

    def host_memory_needs(self) -> list[tuple[int, tuple[str, ...], str]]:
        """The sandbox, in RAM whatever the device: a process of ~16 MiB per worker, and one
        snippet's memory cap (a cap above the RAM is no cap at all)."""
        return [
            (self.tool_workers * (16 << 20), ("tool_workers",), "the sandbox workers"),
            (self.tool_memory_mb << 20, ("tool_memory_mb",), "one snippet's memory cap"),
        ]

    def check_environment(self) -> None:
        super().check_environment()
        problem = jail.boundary_problem(self.allow_uncontained_code)  # the model's code runs
        if problem:  # only inside bubblewrap, unless the user opts out, by name
            self._bad("allow_uncontained_code", problem)

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "max_turns")

    def min_sequence_tokens(self) -> int:
        # the prompt and one answer segment
        return self.digits_a + self.digits_b + 3 + self.max_action_tokens


def interpreter_tokens(batch: Batch) -> torch.Tensor:
    """``[B, T]`` bool: the interpreter's output, which is all the environment appends here
    (:func:`~agentic_rl.multiturn.environment_tokens`: the real tokens the policy did not sample,
    after its first sampled token)."""
    from .multiturn import environment_tokens  # transformers is imported on first use

    return environment_tokens(batch)


def interpreter_span(batch: Batch, tokenizer) -> torch.Tensor:
    """``[B, T]`` bool: every token from an ``<interpreter>`` tag to its ``</interpreter>``, tags
    included, found from the token ids alone.

    An independent definition of what :func:`interpreter_tokens` finds from the masks: on a batch
    in which only the environment writes these tags, the two must agree (a policy that wrote an
    ``<interpreter>`` tag itself would make them differ, as a check should)."""
    from .envs.multiply import END_INTERP, INTERP

    ids = batch.input_ids
    opening, closing = (ids == tokenizer.convert_tokens_to_ids(t) for t in (INTERP, END_INTERP))
    opened, closed = opening.long().cumsum(1), closing.long().cumsum(1)
    # inside a span: more tags opened (up to here) than closed (before here)
    return batch.attention_mask.bool() & (opened - closed + closing.long() > 0)


def unmask_interpreter(batch: Batch, model, *, temperature: float = 1.0) -> torch.Tensor:
    """The ablation: give the interpreter's tokens ``loss_mask`` 1, as if the policy had sampled
    them, with their "old" log-probs from one forward of the current policy
    (:func:`~agentic_rl.multiturn.unmask_environment_tokens`). Returns their ``[B, T]`` mask."""
    from .multiturn import unmask_environment_tokens

    return unmask_environment_tokens(batch, model, temperature=temperature)


def gradient_share(trainer: "ReToolTrainer", batch: Batch, advantages: torch.Tensor) -> float:
    """``|g_I| / (|g_I| + |g_P|)``: the interpreter tokens' share of the policy gradient's norm.

    ``g_I`` and ``g_P`` are the gradients of the step's policy loss restricted to the interpreter
    tokens and to the policy's own tokens (token-mean aggregation, each with the full batch's
    normaliser, so that ``g_I + g_P`` is the gradient of the step's loss). 0 when the mask is on:
    they get no loss.
    """
    tool = batch.extras.get("env_tokens")
    if tool is None or not bool(tool.any()):
        return 0.0
    c, model = trainer.config, trainer.model
    params = [p for p in model.parameters() if p.requires_grad]
    logprobs = sequence_logprobs(
        model, batch.input_ids, batch.attention_mask, temperature=c.temperature
    )
    # token-mean over the whole mask, so g_I + g_P is the gradient of the full loss
    weight = batch.loss_mask.sum().clamp(min=1)
    norms = []
    for part in (tool, batch.loss_mask.bool() & ~tool):
        mask = part.long()
        loss, _ = policy_loss(
            logprobs, batch.old_logprobs, advantages, mask, epsilon=c.epsilon, agg="token-mean"
        )
        loss = loss * mask.sum().clamp(min=1) / weight
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        norms.append(torch.sqrt(sum((g.float() ** 2).sum() for g in grads if g is not None)))
    g_tool, g_policy = (float(n) for n in norms)
    return g_tool / max(g_tool + g_policy, 1e-12)


def resample_on_correct(
    scores: torch.Tensor,
    group_id: torch.Tensor,
    tool_calls: torch.Tensor,
    tool_errors: torch.Tensor,
    keep: int,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """GRPO-RoC (rStar2-Agent): the rows to keep, ``keep`` per group, from an oversampled batch.

    Per group: negatives (score <= 0) are kept at random, about half of them
    (``round(keep * n_neg / n)``), to keep failures diverse (the paper's rule); positives fill the
    rest, those with the lowest tool-error rate ``errors / calls`` first (0.5 when there were no
    calls, which nudges toward using the tool), ties in generation order. Where this follows the
    released code (verl ``recipe/rstar2_agent/src/down_sample/roc.py``) and where not: the paper
    samples positives with probability inversely proportional to the penalty, the code sorts them
    (as here); the code also sorts the *negatives* by the same penalty and keeps the lowest (here,
    as in the paper, at random); and the penalty of paper and code is ``p_err + p_format``, where
    ``p_format`` counts repeated answer tags. Here it is ``p_err`` alone: an ``<answer>`` ends the
    episode, so ``p_format`` is 0 for every positive.
    """
    rows = []
    for g in torch.unique(group_id):
        idx = (group_id == g).nonzero().flatten()
        pos = idx[scores[idx] > 0]
        neg = idx[scores[idx] <= 0]
        n_neg = min(len(neg), max(keep - len(pos), round(keep * len(neg) / len(idx))))
        perm = torch.randperm(len(neg), generator=generator)[:n_neg]
        calls = tool_calls[pos].float()
        p_err = torch.where(calls > 0, tool_errors[pos].float() / calls.clamp(min=1), 0.5)
        order = torch.argsort(p_err, stable=True)[: keep - n_neg]
        rows += [*neg[perm.sort().values].tolist(), *pos[order].tolist()]
    return torch.tensor(sorted(rows), dtype=torch.long)


def placebo_signs(tool: torch.Tensor, seed: int, step: int) -> torch.Tensor:
    """``[B, T]``: one sign per row (+1 or -1, each with probability 1/2) on the row's ``tool``
    tokens, +1 elsewhere. One per row, not per token: an episode's interpreter tokens still push
    together, as in the control, so the term's gradient keeps its size (independent signs per
    token would partly cancel within an episode). Its own stream
    (:func:`~agentic_rl.utils.substream` of ``seed`` and ``step``): the same signs on every call of
    a step, and no draw of any other stream."""
    rng = torch.Generator().manual_seed(substream("retool-placebo", seed, step).getrandbits(63))
    signs = torch.randint(0, 2, (tool.shape[0], 1), generator=rng) * 2 - 1
    return torch.where(tool.cpu(), signs, 1).to(tool.device)


class ReToolTrainer(AgentTrainer):
    """Cold-start SFT on synthetic tool traces, then GRPO (or PPO+GAE) with a code interpreter."""

    config: ReToolConfig

    headline = ("accuracy", "sampled_accuracy")
    headline_definition = (
        "accuracy: fraction of held-out problems answered exactly, sampling at the training "
        "temperature with the tool on (= sampled_accuracy); hallucination_rate: fraction of "
        "episodes in which the policy writes the interpreter's output itself when the tool is off"
    )

    def __init__(self, config: ReToolConfig, *, model=None, tokenizer=None, base=None):
        self._pool = None
        super().__init__(config, model=model, tokenizer=tokenizer, base=base)
        from .chat import ChatTemplateError

        try:  # a chat template that cannot serve an agent is refused before any training
            self.chat_format
        except ChatTemplateError as err:
            name = config.model_name_or_path
            raise ConfigError("model_name_or_path", str(err), name) from None

    # ------------------------------------------------------------------ construction
    @property
    def pool(self) -> sandbox.Pool:
        """The sandbox pool, started on first use (worker processes are not checkpointed)."""
        if self._pool is None:
            c = self.config
            self._pool = sandbox.Pool(
                workers=c.tool_workers,
                timeout_s=c.tool_timeout_s,
                memory_mb=c.tool_memory_mb,
                allow_uncontained=c.allow_uncontained_code,
            )
        return self._pool

    def summary(self) -> dict:
        """The recipe's summary, and the isolation the model's code ran in (``sandbox``)."""
        out = super().summary()
        launcher = jail.launcher()
        layers = self._pool.isolation if self._pool is not None else sandbox.isolation()
        out["sandbox"] = dict(launcher=launcher.kind, layers=layers)
        return out

    def close(self) -> None:
        """Stop the sandbox's worker processes (also done at exit; a later rollout restarts
        them)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def make_task(
        self, split: str = "train", *, tool_enabled: bool = True, pool: sandbox.Pool | None = None
    ):
        """The environment (one split), with the interpreter on or off (``tool_enabled``), its
        snippets run in ``pool`` (:attr:`pool` in a rollout; ``None``: a fresh sandbox each)."""
        check_split(split)
        c = self.config
        # the chat env's tool output is cut in characters, the word-level env's in tokens
        size = "max_output_chars" if c.env == "python-tool" else "max_output_tokens"
        return make_env(
            c.env,
            digits=(c.digits_a, c.digits_b),
            max_tool_calls=c.max_turns - 1,
            tool_enabled=tool_enabled,
            tool_error_rate=c.tool_error_rate,
            timeout_s=c.tool_timeout_s,
            memory_mb=c.tool_memory_mb,
            pool=pool,
            **{size: c.max_output_tokens},
        )

    @functools.cached_property
    def chat_format(self):
        """The chat template's markers (:class:`~agentic_rl.chat.ChatFormat`) when the env is a
        conversation (``task.chat``), else ``None``: word-level turns with tags."""
        from .chat import ChatFormat

        return ChatFormat.from_tokenizer(self.tokenizer) if self.chat else None

    @property
    def max_generated_tokens(self) -> float:
        c = self.config
        return float(
            c.max_turns * c.max_action_tokens + (c.max_turns - 1) * (c.max_output_tokens + 3)
        )

    # ------------------------------------------------------------------ cold start
    def sft_batch(self) -> Batch:
        """Synthetic traces (half with the tool by default); interpreter output not trainable."""
        c, env = self.config, self.task
        eos = self.tokenizer.eos_token
        rows, chat = [], self.chat_format
        for _ in range(c.sft_batch_size):
            seed = train_seed(self.problem_rng)
            segments = env.demonstration(
                seed,
                self.problem_rng,
                tool_fraction=c.sft_tool_fraction,
                error_rate=c.demo_error_rate,
                retry_rate=c.demo_retry_rate,
            )
            if chat is None:
                text, trainable = segments[-1]
                segments = segments[:-1] + [(f"{text} {eos}", trainable)]
            rows.append(segments)
        if chat is not None:  # each turn in the template, each assistant turn ends its own
            from .chat import chat_segments_batch

            return chat_segments_batch(chat, rows, self.device)
        return build_segments_batch(self.tokenizer, rows, self.device)

    # ------------------------------------------------------------------ rollout
    def play(
        self,
        seeds: list[int],
        *,
        group_size: int = 1,
        greedy: bool = False,
        ref_model=None,
        envs: list | None = None,
    ) -> Batch:
        """``group_size`` episodes per problem seed, the interpreter in the loop (``envs``: one
        per episode; default: ``make_task(pool=self.pool)`` each; the tool off:
        ``make_task(tool_enabled=False)``).

        ``extras`` gets, per row: ``tool_calls``, ``tool_errors``, ``answered`` and
        ``hallucinated`` (the policy wrote interpreter output itself).
        """
        from .multiturn import rollout_multiturn

        c = self.config
        if envs is None:
            pool = self.pool
            envs = [self.make_task(pool=pool) for _ in range(len(seeds) * group_size)]
        batch = rollout_multiturn(
            self.model,
            self.tokenizer,
            envs,
            [s for s in seeds for _ in range(group_size)],
            max_action_tokens=c.max_action_tokens,
            stop_word="</code>",  # (a chat env's turns end at the template's end-of-turn token)
            keep_stop_word=True,
            chat=self.chat_format,
            temperature=c.temperature,
            greedy=greedy,
            group_ids=torch.arange(len(seeds)).repeat_interleave(group_size),
            ref_model=ref_model,
        )

        def per_row(values, dtype):
            return torch.tensor(values, dtype=dtype, device=batch.input_ids.device)

        batch.extras.update(
            tool_calls=per_row([e.calls for e in envs], torch.long),
            tool_errors=per_row([e.tool_errors for e in envs], torch.long),
            answered=per_row([e.answered for e in envs], torch.bool),
            hallucinated=per_row([e.hallucinated for e in envs], torch.bool),
        )
        return batch

    rollout_is_sharded = True

    def rollout(self) -> Batch:
        c = self.config
        seeds = [train_seed(self.problem_rng) for _ in range(c.prompts_per_step)]
        seeds = dist.shard(seeds)  # under torchrun: this rank's share, each with its whole group
        factor = 2 if c.resample_on_correct else 1
        batch = self.play(seeds, group_size=factor * c.num_generations, ref_model=self.ref_model)
        # the policy's own behaviour, measured before any down-sampling
        batch.extras["policy_error_rate"] = _error_rate_in_positives(batch)
        if c.resample_on_correct:
            x = batch.extras
            keep = resample_on_correct(
                batch.scores, batch.group_id, x["tool_calls"], x["tool_errors"], c.num_generations
            )
            batch = batch.select(keep.to(batch.input_ids.device))
        if not c.mask_interpreter:
            unmask_interpreter(batch, self.model, temperature=c.temperature)
        batch = self._attach_values(batch)
        if c.grad_share_every and self.step % c.grad_share_every == 0:
            # measured on the policy that sampled, before the update: the share of *this*
            # step's gradient that interpreter tokens carry (two extra backward passes)
            advantages = self.compute_advantages(batch)
            batch.extras["grad_share"] = gradient_share(self, batch, advantages)
        return batch

    def rollout_metrics(self, batch: Batch, keep: torch.Tensor | None) -> dict:
        """Tool use over the whole rollout batch, and the interpreter tokens' share of the
        gradient (NaN on the steps it is not measured; see :meth:`rollout`)."""
        x = batch.extras
        return dict(
            super().rollout_metrics(batch, keep),
            code_ratio=(x["tool_calls"] > 0).float().mean().item(),
            tool_calls=x["tool_calls"].float().mean().item(),
            tool_errors=x["tool_errors"].float().mean().item(),
            error_rate_in_positives=x["policy_error_rate"],
            grad_share=x.get("grad_share", float("nan")),
        )

    # ------------------------------------------------------------------ loss
    def compute_advantages(self, batch: Batch) -> torch.Tensor:
        """The agent trainer's; with ``interpreter_placebo``, each episode's interpreter tokens'
        times a random sign of the episode's (:func:`placebo_signs`; the policy's tokens keep
        theirs)."""
        advantages, tool = super().compute_advantages(batch), batch.extras.get("env_tokens")
        if self.config.interpreter_placebo and tool is not None:
            # The control differs from the masked, unclipped arm by the interpreter term, whose
            # gradient also enlarges AdamW's per-coordinate normaliser (its second moment) on
            # shared parameters, and so shrinks the policy's step: a scale effect, not imitation.
            # The placebo keeps each token's |advantage| (the term's size), not its direction.
            # (eq. retool-imitation with A_i replaced by s_i A_i, s_i = +-1 at random.)
            signs = placebo_signs(tool, self.config.seed, self.step)
            advantages = advantages * signs.to(advantages.dtype)
        return advantages

    def compute_loss(
        self, batch: Batch, advantages: torch.Tensor, *, outputs: tuple | None = None
    ) -> tuple[torch.Tensor, dict]:
        """The agent trainer's loss; with ``loss_denominator="policy"`` and unmasked interpreter
        tokens, every token-mean term is divided by the policy's own tokens instead of all trained
        tokens: the policy's tokens keep the weight they have in the masked arm, and the
        interpreter's add to it (sum over all trained tokens / number of policy tokens)."""
        loss, metrics = super().compute_loss(batch, advantages, outputs=outputs)
        if self.config.loss_denominator == "policy":
            loss = over_policy_tokens(loss, batch)
        return loss, metrics

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict:
        c = self.config
        seed = eval_sampling_seed(c.seed)
        return evaluate_retool(self, self.eval_problems, samples=c.eval_samples, seed=seed)


def _error_rate_in_positives(batch: Batch) -> float:
    """Tool errors per tool call, over the episodes that got a positive reward."""
    pos = batch.scores > 0
    calls = batch.extras["tool_calls"][pos].sum()
    return float(batch.extras["tool_errors"][pos].sum() / calls) if calls > 0 else float("nan")


@torch.no_grad()
def evaluate_retool(
    trainer: ReToolTrainer, seeds: list[int], *, samples: int = 4, seed: int = EVAL_SAMPLING_OFFSET
):
    """Held-out problems, tool on and tool off.

    Tool on, greedy and sampled: ``accuracy``, ``code_ratio`` (episodes that call the tool),
    ``tool_calls`` per episode, ``error_rate_in_positives`` (tool errors per call in the correct
    episodes; None when no correct episode called the tool). Tool off, sampled:
    ``tool_off_accuracy`` and ``hallucination_rate``, the fraction of episodes in which the policy
    writes the interpreter's output itself (see :class:`~agentic_rl.envs.MultiplyEnv`). And
    ``interpreter_logprob``: the policy's mean log-probability of the interpreter's tokens in the
    sampled episodes (how well it has learned to *predict* the tool).
    """
    out, c = {}, trainer.config
    with fixed_rng(seed, trainer.device):
        runs = (("greedy", True, 1, True), ("sampled", False, samples, True))
        for name, greedy, g, tool in runs + (("tool_off", False, samples, False),):
            pool, n = trainer.pool, len(seeds) * g
            envs = [trainer.make_task(tool_enabled=tool, pool=pool) for _ in range(n)]
            b = trainer.play(seeds, group_size=g, greedy=greedy, envs=envs)
            x = b.extras
            out[f"{name}_accuracy"] = b.correct.float().mean().item()
            out[f"{name}_format_rate"] = b.format_ok.float().mean().item()
            out[f"{name}_code_ratio"] = (x["tool_calls"] > 0).float().mean().item()
            out[f"{name}_tool_calls"] = x["tool_calls"].float().mean().item()
            out[f"{name}_hallucination_rate"] = x["hallucinated"].float().mean().item()
            if tool:
                rate = _error_rate_in_positives(b)
                # None (not NaN: it must compare equal to itself after a resume) when undefined
                out[f"{name}_error_rate_in_positives"] = rate if rate == rate else None
            if name == "sampled":
                # how well the policy predicts what the interpreter wrote (a mask never teaches it)
                tool_tokens = interpreter_tokens(b)
                logp = sequence_logprobs(
                    trainer.model, b.input_ids, b.attention_mask, temperature=c.temperature
                )
                n = int(tool_tokens.sum())
                out["interpreter_logprob"] = float(logp[tool_tokens].sum()) / n if n else None
    out["hallucination_rate"] = out["tool_off_hallucination_rate"]
    return out


CONFIG, TRAINER = ReToolConfig, ReToolTrainer
