"""RC-GRPO (Zhong et al. 2026): reward-conditioned rollouts to put reward spread back into groups.

A GRPO group whose rewards are all equal has advantage 0 everywhere and gives no gradient; after a
strong warm start most groups of a binary task are all-1 (or all-0). RC-GRPO answers in two stages:

1. **RCTP** (reward-conditioned trajectory pretraining): imitate *mixed-quality* trajectories, each
   with a reward token in its prompt, ``<|high_reward|>`` for the successful ones and
   ``<|low_reward|>`` for the failures, so the model learns to produce either on demand;
2. **RC-GRPO**: in RL, draw a token for every rollout of a group (:func:`draw_conditions`), so a
   group holds high- and low-conditioned episodes whose rewards differ; advantages over the whole
   mixed group, the reward computed on the episode alone; evaluation under ``<|high_reward|>``.

This module is that and only that, on the agent trainer: the tokens are true special tokens
(:func:`agentic_rl.models.add_special_tokens`, embedding resized; trainable rows under LoRA), put in
front of the first observation by :class:`RewardConditionedEnv` (the "reward goal" of the task's
first message); the trainer's warm start, rollout, metrics and evaluation know about them. The
zero-std measurements (:func:`zero_std_fraction`) and the variance bound of the chapter
(:func:`variance_lower_bound`, :func:`simulate_group_variance`) are plain functions.

What is the paper's and what is not (``reference/algorithms.md`` sections 5 and 15): the two
stages and the tokens are; whether tokens are drawn i.i.d. or as a fixed split is unknown (both
here, ``token_assignment``); the token's position, ``p``, and the hyperparameters are unknown.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import ClassVar

import torch

from . import distributed as dist
from . import runs
from .advantages import group_advantages
from .agent import AgentTrainer
from .config import (
    GROUP_AGENT_DEFAULTS,
    GROUP_AGENT_FULL,
    AgentFields,
    ConfigError,
    defaults,
    param,
)
from .envs import EnvWrapper, FileSystemEnv
from .rollout import build_segments_batch
from .train import check_split
from .utils import CONDITION_DRAW_OFFSET, eval_sampling_seed, fixed_rng, substream, train_seed

__all__ = [
    "ARMS",
    "RCGRPOConfig",
    "RCGRPOTrainer",
    "RewardConditionedEnv",
    "draw_conditions",
    "run_arms",
    "simulate_group_variance",
    "variance_lower_bound",
    "zero_std_fraction",
    "CONFIG",
    "TRAINER",
]


@functools.lru_cache(maxsize=1)
def _filesystem_words() -> tuple[str, ...]:
    return tuple(FileSystemEnv().vocabulary())


@dataclass
@defaults(**GROUP_AGENT_DEFAULTS)
class RCGRPOConfig(AgentFields):
    """RC-GRPO: reward-conditioned rollouts (RCTP, then GRPO with a reward token per rollout)."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("filesystem",)
    PROFILES: ClassVar[dict[str, dict]] = {"quick": {}, "full": GROUP_AGENT_FULL}
    # (group-relative only: no CriticFields, so no critic and no critic flags; uses_critic False)
    # --- defaults that differ from the agent fields'
    env: str = param("filesystem", "Environment: 'filesystem' (BFCL-style tool calls).")
    sft_steps: int = param(
        700,
        "Warm-start steps (SFT or RCTP, see warm_start) before RL: past the steep part of the "
        "learning curve (the copying of names is learned at about 300 steps).",
    )
    sft_learning_rate: float = param(3e-3, "Warm-start learning rate.")
    max_steps: int = param(50, "RL steps (one rollout batch each).")
    max_turns: int = param(5, "Calls per episode, 'done' included (the hard tasks need 4).")
    max_action_tokens: int = param(4, "Tokens of one call: the name, two arguments, the stop word.")
    demo_error_rate: float = param(
        0.5,
        "Fraction of warm-start trajectories that are corrupted (a wrong argument, a skipped, "
        "swapped or extra call): 0.5 gives RCTP its 1:1 mix. SFT keeps only the successful ones.",
    )
    # --- the environment
    hard_fraction: float = param(
        0.5, "Fraction of tasks from the hard family (a folder first, 2-3 calls)."
    )
    demo_hard_fraction: float | None = param(
        0.05,
        "Fraction of hard tasks among the warm-start trajectories (None: hard_fraction). "
        "Small values leave the hard family mostly unlearned after the warm start.",
    )
    # --- reward conditioning
    warm_start: str = param(
        "rctp",
        "'sft': imitate the successful warm-start trajectories, no reward token; 'rctp': "
        "imitate all of them, each with its reward token in the prompt (RCTP).",
    )
    warm_start_budget: str = param(
        "successes",
        "What the two warm starts have in common: 'successes' (the paper's convention: each step "
        "draws demonstrations until sft_batch_size of them succeed; SFT trains on those, RCTP on "
        "those and the failures drawn between them, so RCTP sees every success SFT sees, in "
        "batches of about 1.8 x sft_batch_size rows), 'steps' (sft_batch_size trajectories a "
        "step for both: RCTP sees fewer successes) or 'epochs' (RCTP sees the demonstrations of "
        "'successes', in batches of sft_batch_size rows: each row weighs what an SFT row weighs, "
        "in about 1.8x SFT's gradient steps; for SFT, 'epochs' is 'successes').",
    )
    conditioning: str = param(
        "mixed",
        "Reward token of the RL rollouts: 'mixed' (RC-GRPO: drawn per rollout), 'high' (always "
        "high_token: GRPO on a reward-conditioned policy) or 'none' (plain GRPO).",
    )
    token_assignment: str = param(
        "bernoulli",
        "How 'mixed' draws the tokens of a group: 'bernoulli' (each rollout high with "
        "probability p_high) or 'split' (round(p_high * G) high per group). The paper's choice "
        "is unknown.",
    )
    p_high: float = param(0.5, "Probability (or share) of high_token in a group, in (0, 1).")
    high_token: str = param(
        "<|high_reward|>", "The special token that asks for a successful episode."
    )
    low_token: str = param("<|low_reward|>", "The special token that asks for a failed episode.")

    def validate(self) -> None:
        super().validate()
        if self.warm_start not in ("sft", "rctp"):
            self._bad("warm_start", "must be 'sft' or 'rctp'")
        if self.warm_start_budget not in ("successes", "steps", "epochs"):
            self._bad("warm_start_budget", "must be 'successes', 'steps' or 'epochs'")
        if self.conditioning not in ("none", "high", "mixed"):
            self._bad("conditioning", "must be 'none', 'high' or 'mixed'")
        if self.token_assignment not in ("bernoulli", "split"):
            self._bad("token_assignment", "must be 'bernoulli' or 'split'")
        if not 0.0 < self.p_high < 1.0:
            self._bad("p_high", "must be in (0, 1): a group needs both tokens to have any spread")
        for name in ("hard_fraction", "demo_hard_fraction"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                self._bad(name, "must be in [0, 1]")
        if self.max_turns < 4:
            self._bad("max_turns", "must be >= 4 (the hard tasks take 3 calls and 'done')")
        if self.max_action_tokens < 4:
            self._bad("max_action_tokens", "must be >= 4 (a name, two arguments, the stop word)")
        self._check_new_tokens(("high_token", "low_token"), _filesystem_words())

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "max_turns")

    def min_sequence_tokens(self) -> int:
        # the reward token, the task's first observation (at most 14 words) and one call
        return 1 + 14 + self.max_action_tokens


#: The lab's arms: which warm start, and which tokens the RL rollouts get. The first four are the
#: paper's ablation (RCTP success-matched to SFT, the paper's convention); then RCTP step-matched
#: (as many trajectories as SFT, so fewer successes), RC-GRPO anchored to the RCTP policy
#: by a KL term (beta = 0.05, a value one summary quotes, not verified as the paper's; the
#: others: beta = 0), and RCTP epoch-matched: the success-matched demonstrations in batches of
#: sft_batch_size rows (each success weighs what it weighs in SFT, in ~1.8x SFT's gradient steps;
#: at equal steps a success-matched batch of ~58 rows gives each success ~55 % of it).
ARMS: dict[str, dict] = {
    "SFT -> GRPO": dict(warm_start="sft", conditioning="none"),
    "RCTP -> GRPO": dict(warm_start="rctp", conditioning="high"),
    "RCTP -> RC-GRPO": dict(warm_start="rctp", conditioning="mixed"),
    "SFT -> RC-GRPO": dict(warm_start="sft", conditioning="mixed"),
    "RCTPstep -> GRPO": dict(warm_start="rctp", warm_start_budget="steps", conditioning="high"),
    "RCTPstep -> RC-GRPO": dict(warm_start="rctp", warm_start_budget="steps", conditioning="mixed"),
    "RCTP -> RC-GRPO, KL": dict(warm_start="rctp", conditioning="mixed", beta=0.05),
    "RCTPepoch -> GRPO": dict(warm_start="rctp", warm_start_budget="epochs", conditioning="high"),
    "RCTPepoch -> RC-GRPO": dict(
        warm_start="rctp", warm_start_budget="epochs", conditioning="mixed"
    ),
}


def draw_conditions(
    num_groups: int, group_size: int, p_high: float, assignment: str, rng: random.Random
) -> list[bool]:
    """The reward token of every rollout, group after group (``True``: high).

    ``"bernoulli"``: each rollout independently high with probability ``p_high`` (a group can come
    out all-high or all-low); ``"split"``: ``round(p_high * G)`` high rollouts per group (at least
    one of each), at random positions.
    """
    if assignment == "bernoulli":
        return [rng.random() < p_high for _ in range(num_groups * group_size)]
    if assignment == "split":
        k = min(max(round(p_high * group_size), 1), group_size - 1)
        out = []
        for _ in range(num_groups):
            group = [True] * k + [False] * (group_size - k)
            rng.shuffle(group)
            out += group
        return out
    raise ValueError(f"assignment must be 'bernoulli' or 'split', got {assignment!r}")


def zero_std_fraction(
    scores: torch.Tensor, group_ids: torch.Tensor, rows: torch.Tensor | None = None
) -> float | None:
    """Fraction of groups whose rewards are all equal (zero advantage, no gradient); with
    ``rows`` (a bool mask), only the groups of those rows. ``None`` when there is no group."""
    values: dict[int, set] = {}
    for g, s in zip(group_ids.tolist(), scores.tolist()):
        values.setdefault(g, set()).add(s)
    chosen = values if rows is None else {g: values[g] for g in group_ids[rows].tolist()}
    return sum(len(v) == 1 for v in chosen.values()) / len(chosen) if chosen else None


def variance_lower_bound(group_size: int, p_high: float, separation: float) -> float:
    """Prop. 4.3 as automated reviews quote it (eq. rc-bound):
    ``E[sigma^2] >= (G - 1) / G * p (1 - p) * eps^2`` for a
    group whose tokens are i.i.d. Bernoulli(p) and whose success rates under the two tokens differ
    by ``eps``; ``sigma^2`` is the group's population variance (divided by G)."""
    return (group_size - 1) / group_size * p_high * (1 - p_high) * separation**2


def simulate_group_variance(
    group_size: int,
    p_high: float,
    success_high: float,
    success_low: float,
    *,
    groups: int = 20_000,
    assignment: str = "bernoulli",
    seed: int = 0,
) -> float:
    """Monte Carlo estimate of ``E[sigma^2]`` (eq. rc-variance: the population variance of a
    group's binary rewards)
    when each rollout's token is drawn by :func:`draw_conditions` and it succeeds with
    ``success_high`` / ``success_low`` under its token."""
    rng = random.Random(seed)
    high = torch.tensor(draw_conditions(groups, group_size, p_high, assignment, rng))
    gen = torch.Generator().manual_seed(seed)
    p = torch.where(high, success_high, success_low).to(torch.float64)
    rewards = (torch.rand(p.shape, generator=gen, dtype=torch.float64) < p).double()
    return rewards.view(groups, group_size).var(dim=1, unbiased=False).mean().item()


class RewardConditionedEnv(EnvWrapper):
    """An environment whose first observation starts with a reward token (or none).

    The token is part of the prompt: the rollout gives it ``loss_mask`` 0 like every observation
    token, so it is never trained on, and the environment's reward ignores it. Everything else is
    the wrapped environment's."""

    def __init__(self, env, token: str | None):
        super().__init__(env)
        self.token = token

    def reset(self, seed: int) -> str:
        obs = self.env.reset(seed)
        return f"{self.token} {obs}" if self.token else obs


class RCGRPOTrainer(AgentTrainer):
    """A warm start (SFT or RCTP), then GRPO whose rollouts carry reward tokens (RC-GRPO)."""

    config: RCGRPOConfig

    headline = ("success", "sampled_success")
    headline_definition = (
        "success: fraction of held-out tasks solved (BFCL-style state and result check), "
        "sampling at the training temperature under the evaluation token (high_token when the "
        "run uses tokens; = sampled_success); low_success: under low_token; separation: "
        "sampled_success - low_success"
    )

    def __init__(self, config: RCGRPOConfig, *, model=None, tokenizer=None):
        if tokenizer is not None:  # a given policy must already know the tokens
            for name in ("high_token", "low_token"):
                token = getattr(config, name)
                if token not in tokenizer.get_vocab():
                    why = "is not in the given tokenizer: build the policy with it"
                    raise ConfigError(name, why, token)
        #: the epoch-matched warm start's rows (segments, outcomes) waiting for a full batch
        self.warm_carry: tuple[list, list[bool]] = ([], [])
        #: what the warm start has trained on: gradient steps, rows, successful rows
        self.warm_seen = {"updates": 0, "rows": 0, "successes": 0}
        super().__init__(config, model=model, tokenizer=tokenizer)

    @property
    def added_tokens(self) -> tuple[str, ...]:
        return (self.config.high_token, self.config.low_token)

    @property
    def uses_tokens(self) -> bool:
        """Whether this run's policy is conditioned (RCTP warm start, or tokens in RL)."""
        c = self.config
        return c.warm_start == "rctp" or c.conditioning != "none"

    def make_task(self, split: str = "train"):
        check_split(split)
        c = self.config
        return FileSystemEnv(hard_fraction=c.hard_fraction, max_turns=c.max_turns)

    def conditioned_envs(self, tokens: list[str | None]) -> list[RewardConditionedEnv]:
        """A fresh environment per token, its first observation led by that reward token (``None``:
        no token): what :meth:`play` takes as ``envs`` to condition episodes."""
        return [RewardConditionedEnv(self.make_task(), t) for t in tokens]

    @functools.cached_property
    def demo_env(self) -> FileSystemEnv:
        """The warm start's environment: its tasks are hard with ``demo_hard_fraction``."""
        c = self.config
        share = c.hard_fraction if c.demo_hard_fraction is None else c.demo_hard_fraction
        return FileSystemEnv(hard_fraction=share, max_turns=c.max_turns)

    # ------------------------------------------------------------------ warm start
    @property
    def epoch_matched(self) -> bool:
        """RCTP with ``warm_start_budget="epochs"``: several gradient steps per warm-start step."""
        return self.config.warm_start == "rctp" and self.config.warm_start_budget == "epochs"

    def sft_batch(self):
        """One warm-start batch (eq. rctp) from this step's stream of demonstrations (a fraction
        ``demo_error_rate`` of them corrupted; its own stream, :func:`substream`, so that both warm
        starts leave the task stream of RL untouched): SFT keeps the successful ones, with no
        token; RCTP keeps every one, with its reward token first. The batch ends at
        ``sft_batch_size`` successes (``warm_start_budget="successes"``: RCTP's batch holds SFT's
        and the failures drawn between them; ``"epochs"``: the same, after the rows the last
        step left over, see :meth:`sft_update`) or rows (``"steps"``). ``extras``: each row's
        ``success`` and text ``segments``."""
        rows, ok = self._demonstrations()
        if self.epoch_matched:
            rows, ok = self.warm_carry[0] + rows, self.warm_carry[1] + ok
        batch = build_segments_batch(self.tokenizer, rows, self.device)
        batch.extras["success"] = torch.tensor(ok, dtype=torch.bool, device=self.device)
        batch.extras["segments"] = rows
        return batch

    def _demonstrations(self) -> tuple[list[list[tuple[str, bool]]], list[bool]]:
        """This step's rows of demonstrations (text segments) and whether each succeeded."""
        c, rows, ok, successes = self.config, [], [], 0
        env, rng = self.demo_env, substream("rcgrpo-demos", c.seed, self.step)
        count_successes = c.warm_start == "sft" or c.warm_start_budget != "steps"
        drawn = 0
        while (successes if count_successes else len(rows)) < c.sft_batch_size:
            if drawn == 100 * c.sft_batch_size:
                why = f"{successes} successes in {drawn} demonstrations: lower it"
                raise ConfigError("demo_error_rate", why, c.demo_error_rate)
            drawn += 1
            pairs = env.demonstration(train_seed(rng), rng, error_rate=c.demo_error_rate)
            successes += env.success
            if c.warm_start == "sft":
                if not env.success:
                    continue
                token = None
            else:
                token = c.high_token if env.success else c.low_token
            segments = []
            for k, (obs, call) in enumerate(pairs):
                prompt = f"{token} {obs}" if token and k == 0 else obs
                segments += [(prompt, False), (f"{call} </action>", True)]
            rows.append(segments)
            ok.append(bool(env.success))
        return rows, ok

    def sft_update(self, batch) -> float:
        """One warm-start step on ``batch``: one gradient step (the mean loss of its rows'
        tokens); epoch-matched RCTP (:attr:`epoch_matched`) takes one per ``sft_batch_size``
        rows, in the stream's order, and keeps the rows that fill no batch for the next step
        (``warm_carry``; the last step trains them as a smaller batch), so that it sees every
        demonstration of success-matched RCTP, each row weighing what an SFT row does. Counts
        what the warm start trained on (``warm_seen``). Returns the mean loss of its steps."""
        c, parts = self.config, [None]
        if self.epoch_matched:
            n, size = len(batch), c.sft_batch_size
            keep = n if self.step + 1 >= c.sft_steps else n - n % size
            rest = range(keep, n)
            self.warm_carry = (
                [batch.extras["segments"][i] for i in rest],
                batch.extras["success"][keep:].tolist(),
            )
            parts = list(torch.arange(keep).split(size))
        losses = []
        for part in parts:
            rows = batch.select(part)
            losses.append(super().sft_update(rows))
            self.warm_seen["updates"] += 1
            self.warm_seen["rows"] += len(rows)
            self.warm_seen["successes"] += int(rows.extras["success"].sum())
        return sum(losses) / len(losses)

    def extra_state(self) -> dict:
        rows, ok = self.warm_carry
        carry = {"rows": rows, "success": ok}
        return {**super().extra_state(), "warm_carry": carry, "warm_seen": dict(self.warm_seen)}

    def load_extra_state(self, state: dict) -> None:
        super().load_extra_state(state)
        carry = state.get("warm_carry") or {"rows": [], "success": []}
        self.warm_carry = ([[tuple(s) for s in row] for row in carry["rows"]], carry["success"])
        self.warm_seen = dict(state.get("warm_seen") or self.warm_seen)

    # ------------------------------------------------------------------ rollout
    def play(self, seeds, *, group_size=1, greedy=False, ref_model=None, envs=None):
        """Episodes as :meth:`AgentTrainer.play`, each with the reward token of its env
        (``envs``: :meth:`conditioned_envs`, one per episode; default: the evaluation token).
        ``extras["hard"]`` marks the hard family's rows and ``extras["high"]`` the
        high-conditioned ones."""
        c, n = self.config, len(seeds) * group_size
        if envs is None:
            envs = self.conditioned_envs([c.high_token if self.uses_tokens else None] * n)
        batch = super().play(
            seeds, group_size=group_size, greedy=greedy, ref_model=ref_model, envs=envs
        )
        hard = [env.task["family"] == "hard" for env in envs]  # each env reset to its task
        batch.extras["hard"] = torch.tensor(hard, device=batch.input_ids.device)
        high = [isinstance(e, RewardConditionedEnv) and e.token == c.high_token for e in envs]
        batch.extras["high"] = torch.tensor(high, device=batch.input_ids.device)
        return batch

    rollout_is_sharded = True

    def rollout(self):
        """``prompts_per_step`` tasks x ``num_generations`` episodes (advantages over the whole
        mixed group, eq. rc-adv, by the base trainer); the tokens by
        ``conditioning`` (RC-GRPO: :func:`draw_conditions` from a stream of their own, so that
        every arm sees the same tasks)."""
        c = self.config
        seeds = [train_seed(self.problem_rng) for _ in range(c.prompts_per_step)]
        tokens = self._draw_tokens(len(seeds), substream("rcgrpo-tokens", c.seed, self.step))
        # under torchrun: this rank's share of the tasks, each with its group's tokens
        seeds, tokens = dist.shard(seeds), dist.shard(tokens)
        envs = self.conditioned_envs(tokens)
        return self.play(seeds, group_size=c.num_generations, ref_model=self.ref_model, envs=envs)

    def _draw_tokens(self, num_groups: int, rng: random.Random | None = None) -> list:
        """The reward token of each rollout of ``num_groups`` groups, by ``conditioning``
        (``rng``: this step's own stream in training; a fixed one in evaluation)."""
        c, n = self.config, num_groups * self.config.num_generations
        if c.conditioning != "mixed":
            return [c.high_token if c.conditioning == "high" else None] * n
        rng = rng or random.Random(c.seed + CONDITION_DRAW_OFFSET)
        high = draw_conditions(num_groups, c.num_generations, c.p_high, c.token_assignment, rng)
        return [c.high_token if h else c.low_token for h in high]

    def rollout_metrics(self, batch, keep) -> dict:
        """The chapter's measurements on every rollout batch: zero-std groups (by family), mean
        |advantage|, and success under each token."""
        c, scores, gid = self.config, batch.scores, batch.group_id
        hard, high, success = batch.extras["hard"], batch.extras["high"], batch.extras["success"]

        def rate(rows):
            return success[rows].float().mean().item() if rows.any() else None

        adv = group_advantages(scores, gid, scale=c.scale_rewards)
        return dict(
            super().rollout_metrics(batch, keep),
            zero_std_easy=zero_std_fraction(scores, gid, ~hard),
            zero_std_hard=zero_std_fraction(scores, gid, hard),
            mean_abs_advantage=adv.abs().mean().item(),
            high_success=rate(high),
            low_success=rate(~high),
        )

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Greedy and sampled success on held-out tasks under the evaluation token (high when the
        run uses tokens), by family; with tokens, sampled success under the low token too and
        the separation between the two (the Delta of the variance bound)."""
        c, seeds, out = self.config, self.eval_problems, {}
        runs = [("greedy", True, 1, None), ("sampled", False, c.eval_samples, None)]
        if self.uses_tokens:
            runs.append(("low", False, c.eval_samples, c.low_token))
        with fixed_rng(eval_sampling_seed(c.seed), self.device):
            for name, greedy, g, token in runs:
                envs = None if token is None else self.conditioned_envs([token] * len(seeds) * g)
                b = self.play(seeds, group_size=g, greedy=greedy, envs=envs)
                ok, hard = b.extras["success"].float(), b.extras["hard"]
                out[f"{name}_success"] = ok.mean().item()
                out[f"{name}_success_easy"] = ok[~hard].mean().item() if (~hard).any() else None
                out[f"{name}_success_hard"] = ok[hard].mean().item() if hard.any() else None
                out[f"{name}_format_rate"] = b.format_ok.float().mean().item()
                out[f"{name}_turns"] = b.extras["num_turns"].float().mean().item()
            # groups of G on the held-out tasks, tokens drawn as in training: how many would
            # give no gradient (the same policy under GRPO's and RC-GRPO's sampling)
            envs = self.conditioned_envs(self._draw_tokens(len(seeds)))
            b = self.play(seeds, group_size=c.num_generations, envs=envs)
            hard = b.extras["hard"]
            for name, rows in (("", None), ("_easy", ~hard), ("_hard", hard)):
                out[f"zero_std{name}"] = zero_std_fraction(b.scores, b.group_id, rows)
        out["separation"] = (
            out["sampled_success"] - out["low_success"] if self.uses_tokens else None
        )
        return out


#: The fields that make a warm start: arms that agree on them share one.
WARM_START_FIELDS = ("warm_start", "warm_start_budget")


def run_arms(
    config: RCGRPOConfig, arms: dict[str, dict] = ARMS, *, warm_start=None
) -> dict[str, RCGRPOTrainer]:
    """Train the arms of the lab from shared warm starts (:func:`agentic_rl.runs.run_arms`): one
    policy per (warm_start, warm_start_budget), each trained once with ``config`` (by
    ``warm_start(trainer)``, default ``trainer.sft()``), then every arm's RL from a copy of its
    warm start. Returns the trained trainers by arm name, each with its warm start's
    ``warm_seen`` (and ``warm_curve``, where ``warm_start`` drew one)."""
    starts = {}

    def start(trainer):
        starts[_start_key(trainer.config)] = trainer
        (warm_start or RCGRPOTrainer.sft)(trainer)

    trainers = runs.run_arms(
        RCGRPOTrainer, config, arms, start_fields=WARM_START_FIELDS, warm_start=start
    )
    for trainer in trainers.values():
        warm = starts[_start_key(trainer.config)]
        trainer.warm_seen = dict(warm.warm_seen)
        if hasattr(warm, "warm_curve"):
            trainer.warm_curve = list(warm.warm_curve)
    return trainers


def _start_key(config: RCGRPOConfig) -> tuple:
    return tuple(getattr(config, f) for f in WARM_START_FIELDS)


CONFIG, TRAINER = RCGRPOConfig, RCGRPOTrainer
