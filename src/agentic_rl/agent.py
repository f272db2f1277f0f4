"""Multi-turn agents: PPO with a critic and GAE, or GRPO, on a text environment.

The GAE/PPO chapter's recipe: :class:`PPOConfig`, and :class:`AgentTrainer`, the loop
(:class:`~agentic_rl.train.Trainer`) with four pieces filled in, and nothing else copied:

- ``rollout``: the multi-turn agent loop (``agentic_rl.multiturn``) instead of single-turn sampling;
- ``compute_advantages``: GAE over generated tokens with the critic's values (eqs. gae-delta,
  gae-rec of the GAE chapter), observation tokens skipped inside the recursion; or GRPO's group
  advantage;
- ``compute_loss``: the same clipped policy loss, plus the critic's clipped value loss;
- ``sft_batch`` / ``evaluate``: whole-episode demonstrations and success rates.

The critic is a **separate small model** (:class:`ValueModel`) initialised from the SFT policy's
trunk, as verl and RAGEN do (a separate critic worker), rather than a value head on the policy
itself. Why: a shared trunk makes the value loss pull on the policy's features, with a weight
(``vf_coef``) that has to be tuned against the policy loss; a separate critic costs one more
forward/backward of a (here tiny) model and keeps the two objectives apart, which is easier to
reason about when teaching.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from . import distributed as dist
from .advantages import explained_variance, gae, masked_mean, masked_whiten
from .config import FULL_MODEL, AgentFields, CriticFields, FrozenLakeFields, defaults, param
from .envs import make_env
from .losses import aggregate
from .rollout import Batch, build_segments_batch
from .train import Trainer, check_split
from .utils import EVAL_SAMPLING_OFFSET, eval_sampling_seed, eval_seeds, fixed_rng, train_seed

__all__ = ["PPOConfig", "ValueModel", "AgentTrainer", "evaluate_agent", "CONFIG", "TRAINER"]


@dataclass
@defaults(
    sft_steps=300,
    sft_batch_size=32,
    max_steps=60,
    eval_size=128,
    loss_type="token-mean",
)
class PPOConfig(AgentFields, CriticFields, FrozenLakeFields):
    """PPO with a critic and GAE (or GRPO, for comparison) on a multi-turn text environment."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("frozenlake",)
    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(
            FULL_MODEL,
            num_hidden_layers=6,
            map_size=6,
            max_turns=14,
            sft_steps=2000,
            sft_batch_size=64,
            max_steps=300,
            prompts_per_step=128,
            eval_size=512,
            max_action_tokens=3,
        ),
    }

    num_generations: int = param(
        1,
        "Episodes per seed: 1 for PPO (the critic is the baseline); "
        ">= 2 (a group) for the grpo estimator.",
    )
    prompts_per_step: int = param(
        32,
        "Episode seeds per RL step; the batch holds prompts_per_step * num_generations episodes.",
    )
    num_minibatches: int = param(
        4,
        "Minibatches per pass over the rollout batch: 4 gradient steps per batch by default "
        "(verl's default, 1 epoch of 4 minibatches); from the second, the ratio departs from 1 "
        "and clipping acts.",
    )

    _size_fields: ClassVar[tuple[str, ...]] = ("map_size", "max_action_tokens")

    def min_sequence_tokens(self) -> int:
        # the first observation (the map, one token per tile and row separator) and one action
        return self.map_size * (self.map_size + 1) + 3 + self.max_action_tokens


class ValueModel(nn.Module):
    """A critic: a decoder trunk and a scalar head.
    ``values[:, t]`` = V(state in which token t is chosen).

    The head reads the hidden state *after* token ``t-1``, i.e. the context before token ``t``:
    the same alignment as ``sequence_logprobs`` (column 0 is 0). ``forward`` also returns the head
    on every position (``after[:, t]`` = V(state after token t)), which the bootstrap of a
    truncated episode needs.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        # V = 0 everywhere at the start: no made-up value estimates
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy) -> "ValueModel":
        """A critic whose trunk is a copy of the policy's
        (its features already know the task's text)."""
        base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
        backbone = copy.deepcopy(base.model)
        for p in backbone.parameters():
            p.requires_grad_(True)
        return cls(backbone, base.config.hidden_size)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        ).last_hidden_state
        after = self.head(hidden).squeeze(-1).float()  # [B, T]: value of the state after each token
        values = nn.functional.pad(after[:, :-1], (1, 0), value=0.0)
        return values, after


class AgentTrainer(Trainer):
    """SFT on demonstrations, then PPO+GAE (``advantage_estimator="gae"``) or GRPO,
    on a multi-turn env.

    The base of the multi-turn chapters. A chapter on it overrides some of these hooks (beside
    :class:`~agentic_rl.train.Trainer`'s, whose table is in :mod:`agentic_rl.train`):

    =======================================  =======================================================
    hook                                     what it returns; who overrides it
    =======================================  =======================================================
    ``make_task(self, split="train")``       a fresh environment of ``split`` (one per episode):
                                             every chapter (GCD, Early Experience: ``"ood"`` too)
    ``play(self, seeds, *, ...)``            keywords ``group_size=1``, ``greedy=False``,
                                             ``ref_model=None``, ``envs=None``: a ``Batch`` of
                                             ``group_size`` episodes per seed, in ``envs`` (one per
                                             episode; default: ``make_task()`` each). A chapter
                                             wraps or reads ``envs`` for its ``extras`` (GiGPO's
                                             anchors, RC-GRPO's tokens, ReTool's tool use); another
                                             split, reward token, the tool off: the caller builds
                                             ``envs`` and passes them
    ``rollout(self)``                        the step's ``Batch``: ``play`` on fresh seeds (StarPO:
                                             refilled; ReTool: resampled)
    ``compute_advantages(self, batch)``      ``[B, T]``: GAE, or GRPO's group advantage (GiGPO:
                                             per step, from anchor states)
    ``compute_loss(self, batch, adv, ...)``  ``(loss, metrics)``: + the critic's value loss (GCD:
                                             + its judgement loss)
    ``rollout_metrics(self, batch, keep)``   success and turns; a chapter adds its measurements
    ``sft_batch(self)``                      whole demonstration episodes (RC-GRPO: with tokens)
    ``evaluate(self)``                       held-out success (GCD, Early Experience: per split)
    =======================================  =======================================================
    """

    config: PPOConfig

    def __init__(self, config: PPOConfig, *, model=None, tokenizer=None, base=None):
        self.critic = None
        super().__init__(config, model=model, tokenizer=tokenizer, base=base)
        # no SFT phase: RL starts now
        if config.uses_critic and self.phase == "rl":
            self._make_critic()
            self.optimizer = self.make_optimizer()

    # ------------------------------------------------------------------ construction
    def make_task(self, split: str = "train"):
        check_split(split)
        c = self.config
        return make_env(
            c.env,
            size=c.map_size,
            is_slippery=c.is_slippery,
            p_frozen=c.p_frozen,
            max_turns=c.max_turns,
        )

    def make_eval_set(self):
        # held-out episode seeds (maps), above every training seed (utils.eval_seeds)
        return eval_seeds(self.config.seed, self.config.eval_size)

    def _make_critic(self):
        self.critic = ValueModel.from_policy(self.model).to(self.device)

    def make_optimizer(self):
        opt = super().make_optimizer()
        if self.phase == "rl" and self.critic is not None:
            opt.add_param_group(
                {"params": list(self.critic.parameters()), "lr": self.config.critic_learning_rate}
            )
        return opt

    def start_rl(self):
        if self.config.uses_critic:
            self._make_critic()  # from the SFT policy's trunk, before the RL optimizer is built
        super().start_rl()

    headline = ("success", "sampled_success")
    headline_definition = (
        "success: fraction of held-out episodes that reach the goal, "
        "sampling at the training temperature (= sampled_success); "
        "greedy_success: with greedy actions"
    )

    @property
    def max_generated_tokens(self) -> float:
        return float(self.config.max_turns * self.config.max_action_tokens)

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        critic = ("value_loss", "vf_clip_ratio", "explained_variance", "value_mean")
        return critic if self.critic is not None else ()

    def extra_state(self) -> dict:
        return {"critic": self.critic.state_dict() if self.critic is not None else None}

    def load_extra_state(self, state: dict) -> None:
        if state.get("critic") is not None:
            if self.critic is None:
                self._make_critic()
            self.critic.load_state_dict(state["critic"])

    # ------------------------------------------------------------------ SFT on demonstrations
    def sft_batch(self) -> Batch:
        """Whole expert episodes (some actions replaced at random: ``demo_error_rate``),
        actions trainable; ``extras["demo_kinds"]``: each action's kind where the environment
        labels them (``env.kinds``: good, flawed, ...), else empty lists."""
        c, env = self.config, self.task
        rows, kinds = [], []
        for _ in range(c.sft_batch_size):
            seed = train_seed(self.problem_rng)
            episode = env.demonstration(seed, self.problem_rng, error_rate=c.demo_error_rate)
            segments = []
            for obs, action in episode:
                segments += [(obs, False), (f"{action} </action>", True)]
            rows.append(segments)
            kinds.append(list(getattr(env, "kinds", [])))
        batch = build_segments_batch(self.tokenizer, rows, self.device)
        batch.extras["demo_kinds"] = kinds
        return batch

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
        """Play ``group_size`` episodes on each seed's map with the current policy
        (a fresh env per episode, or ``envs``, one per episode: another split's, a wrapped one)."""
        from .multiturn import rollout_multiturn

        c = self.config
        if envs is None:
            envs = [self.make_task() for _ in range(len(seeds) * group_size)]
        all_seeds = [s for s in seeds for _ in range(group_size)]
        group_ids = torch.arange(len(seeds)).repeat_interleave(group_size)
        return rollout_multiturn(
            self.model,
            self.tokenizer,
            envs,
            all_seeds,
            max_turns=c.max_turns,
            max_action_tokens=c.max_action_tokens,
            temperature=c.temperature,
            greedy=greedy,
            group_ids=group_ids,
            ref_model=ref_model,
        )

    rollout_is_sharded = True

    def rollout(self) -> Batch:
        """``prompts_per_step`` fresh episode seeds, ``num_generations`` episodes each;
        critic values attached. Under torchrun: this rank's share of the seeds (every rank draws
        all of them, as one process would, and plays its contiguous share, whole groups)."""
        c = self.config
        seeds = [train_seed(self.problem_rng) for _ in range(c.prompts_per_step)]
        seeds = dist.shard(seeds)
        batch = self.play(seeds, group_size=c.num_generations, ref_model=self.ref_model)
        return self._attach_values(batch)

    def _attach_values(self, batch: Batch) -> Batch:
        """The critic's values of a rollout batch (and the bootstrap of truncated episodes)."""
        c = self.config
        if batch.old_logprobs is None:
            raise RuntimeError("the multi-turn rollout must record old log-probs")
        if self.critic is not None:
            with torch.no_grad():
                batch.values, after = self.critic(batch.input_ids, batch.attention_mask)
            if c.bootstrap_truncated:
                # Truncation is not termination: the state the episode was cut in still has a value.
                # The rollout keeps that state's observation at the end of a truncated row, so the
                # critic's value after the row's last token is V(s_T) (the same kind of position
                # that values every action); add gamma * V(s_T) to the last reward of truncated
                # episodes (eq. gae-delta).
                last = _last_generated(batch.loss_mask)
                rows = torch.arange(len(batch), device=last.device)
                final = batch.attention_mask.sum(1) - 1
                bootstrap = torch.zeros_like(batch.token_rewards)
                bootstrap[rows, last] = (
                    c.gamma * after[rows, final] * batch.extras["truncated"].to(after.dtype)
                )
                # kept apart from token_rewards, which stay the environment's
                # (they are what gets logged)
                batch.extras["bootstrap_rewards"] = bootstrap
        return batch

    # ------------------------------------------------------------------ advantages and loss
    def compute_advantages(self, batch: Batch) -> torch.Tensor:
        """GAE on generated tokens (observations skipped),
        or GRPO's group advantage broadcast to them."""
        c = self.config
        mask = batch.loss_mask
        if not c.uses_critic:  # the group-relative advantage of the GRPO chapter
            return super().compute_advantages(batch)
        rewards = batch.token_rewards + batch.extras.get("bootstrap_rewards", 0.0)
        penalty = self.kl_reward_penalty(batch)  # kl_in_reward: r_t - beta * k(t), per token
        if penalty is not None:
            rewards = rewards - penalty
        advantages, returns = gae(rewards, batch.values, mask, gamma=c.gamma, lam=c.lam)
        batch.extras["returns"] = returns
        if c.whiten_advantages:
            advantages = masked_whiten(advantages, mask)
        return advantages

    def rollout_metrics(self, batch: Batch, keep: torch.Tensor | None) -> dict:
        """Success and turns per episode over the whole rollout batch, filtered rows included
        (``compute_loss`` sees one minibatch of the kept rows): one meaning in every recipe."""
        x = batch.extras
        return dict(
            success_rate=x["success"].float().mean().item(),
            num_turns=x["num_turns"].float().mean().item(),
        )

    def compute_loss(
        self, batch: Batch, advantages: torch.Tensor, *, outputs: tuple | None = None
    ) -> tuple[torch.Tensor, dict]:
        loss, metrics = super().compute_loss(batch, advantages, outputs=outputs)
        if self.critic is None:
            return loss, metrics
        c, mask = self.config, batch.loss_mask
        returns = batch.extras["returns"]
        values, _ = self.critic(batch.input_ids, batch.attention_mask)
        # Clipped value loss (verl compute_value_loss):
        # max of the plain and the clipped squared error.
        vf_loss_mat = (values - returns) ** 2
        if c.cliprange_value is not None:
            clipped = batch.values + (values - batch.values).clamp(
                -c.cliprange_value, c.cliprange_value
            )
            vf_clipped = (clipped - returns) ** 2
            metrics["vf_clip_ratio"] = masked_mean((vf_clipped > vf_loss_mat).float(), mask).item()
            vf_loss_mat = torch.maximum(vf_loss_mat, vf_clipped)
        else:
            metrics["vf_clip_ratio"] = 0.0
        value_loss = 0.5 * aggregate(vf_loss_mat, mask, "token-mean")
        with torch.no_grad():
            # 1 - Var(R - V) / Var(R) over generated tokens (verl, Stable-Baselines3)
            metrics["explained_variance"] = explained_variance(batch.values, returns, mask)
            metrics["value_mean"] = masked_mean(batch.values, mask).item()
        metrics["value_loss"] = value_loss.item()
        return loss + c.vf_coef * value_loss, metrics

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> dict:
        c = self.config
        seed = eval_sampling_seed(c.seed)
        return evaluate_agent(self, self.eval_problems, samples=c.eval_samples, seed=seed)


def _last_generated(loss_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last token with loss_mask 1 in each row (0 for rows without any)."""
    idx = torch.arange(loss_mask.shape[1], device=loss_mask.device)
    return (idx * loss_mask.long()).max(dim=1).values


@torch.no_grad()
def evaluate_agent(
    trainer: AgentTrainer, seeds: list[int], *, samples: int = 4, seed: int = EVAL_SAMPLING_OFFSET
) -> dict:
    """Greedy and sampled success rate (and format rate, mean turns) on held-out episode seeds."""
    out = {}
    with fixed_rng(seed, trainer.device):
        for name, greedy, g in (("greedy", True, 1), ("sampled", False, samples)):
            b = trainer.play(seeds, group_size=g, greedy=greedy)
            out[f"{name}_success"] = b.extras["success"].float().mean().item()
            out[f"{name}_format_rate"] = b.format_ok.float().mean().item()
            out[f"{name}_turns"] = b.extras["num_turns"].float().mean().item()
    return out


CONFIG, TRAINER = PPOConfig, AgentTrainer
