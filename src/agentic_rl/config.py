"""One config dataclass per recipe; its field docs are the CLI's help text.

Names follow TRL's ``GRPOConfig`` where the concept is the same (``num_generations``, ``beta``,
``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``, ``temperature``,
``max_completion_length``, ``learning_rate``, ``num_iterations``, ``max_steps``, ``max_grad_norm``), so the
book can say "this is TRL's X". Where a default differs from TRL's it says so.

Profiles: ``quick`` (the dataclass defaults: a ~1M-parameter model, minutes on one CPU thread) and ``full``
(a larger model, more steps; for a GPU). ``GRPOConfig.from_profile("full", seed=1)`` applies the profile,
then your overrides.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import ClassVar

from .losses import AGG_MODES, LOSS_TYPE_ALIASES

__all__ = ["RLConfig", "GRPOConfig", "PPOConfig", "PROFILES", "add_dataclass_arguments", "config_from_args"]


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class RLConfig:
    """What every RL recipe shares: the run, the model, the SFT warm start, and policy optimisation."""

    PROFILES: ClassVar[dict[str, dict]] = {"quick": {}}

    # --- run
    profile: str = _f("quick", "Profile: 'quick' (CPU, minutes) or 'full' (GPU). --profile (or from_profile) fills the fields you do not set with its values.")
    seed: int = _f(0, "Seed for python, numpy and torch (model init, problems, sampling).")
    output_dir: str | None = _f(None, "Folder for checkpoint.pt, metrics.csv and summary.json (None: keep nothing on disk).")
    device: str = _f("auto", "'auto' (CUDA, then MPS, then CPU), or 'cpu', 'cuda', 'mps'.")
    resume: bool = _f(True, "Resume from output_dir/checkpoint.pt when it exists.")
    save_steps: int = _f(25, "Write a checkpoint every this many steps (SFT and RL). 0: only at phase ends.")
    disable_tqdm: bool = _f(False, "Hide progress bars (as TRL's disable_tqdm).")
    # --- model
    model_name_or_path: str | None = _f(None, "Pretrained model (hub name or folder). None: a tiny Llama from scratch.")
    hidden_size: int = _f(128, "Tiny model: hidden size.")
    num_hidden_layers: int = _f(4, "Tiny model: number of decoder layers.")
    num_attention_heads: int = _f(4, "Tiny model: attention heads.")
    num_key_value_heads: int = _f(2, "Tiny model: key/value heads (grouped-query attention).")
    intermediate_size: int = _f(512, "Tiny model: MLP width.")
    use_lora: bool = _f(False, "Train LoRA adapters instead of all weights (peft).")
    lora_r: int = _f(8, "LoRA rank.")
    lora_alpha: int = _f(16, "LoRA alpha.")
    # --- SFT warm start
    sft_steps: int = _f(600, "SFT steps on teacher demonstrations before RL (0: skip).")
    sft_batch_size: int = _f(64, "Demonstrations per SFT step.")
    sft_learning_rate: float = _f(1e-3, "SFT learning rate (AdamW).")
    # --- policy optimisation (TRL names)
    max_steps: int = _f(100, "RL steps (one rollout batch each).")
    prompts_per_step: int = _f(32, "Prompts (or episode seeds) per RL step; the batch holds prompts_per_step * num_generations rollouts.")
    num_generations: int = _f(8, "G: rollouts sampled per prompt (the group).")
    learning_rate: float = _f(1e-4, "Policy learning rate (AdamW).")
    beta: float = _f(0.0, "KL coefficient. 0 (TRL's default) loads no reference model; DeepSeekMath used 0.04.")
    kl_estimator: str = _f("k3", "KL estimator in the loss: 'k1', 'k2' or 'k3' (DeepSeekMath and TRL use k3).")
    log_kl: bool = _f(True, "Keep pi_ref and log the KL to it even when beta = 0 (one extra forward pass per step).")
    epsilon: float = _f(0.2, "Lower clip range: ratios below 1 - epsilon are clipped.")
    epsilon_high: float | None = _f(None, "Upper clip range (DAPO's clip-higher). None: equal to epsilon.")
    dual_clip: float | None = _f(None, "Dual-clip constant c > 1 for negative advantages (verl clip_ratio_c). None: off.")
    loss_type: str = _f(
        "grpo",
        "Loss aggregation: a verl mode (token-mean, seq-mean-token-mean, seq-mean-token-sum-norm, ...) or a TRL "
        "loss_type alias (grpo, bnpo, dr_grpo, dapo). Default 'grpo' = DeepSeekMath eq. 3 (TRL's default is 'dapo').",
    )
    scale_rewards: str = _f("group", "Advantage scaling: 'group' (GRPO), 'batch', or 'none' (Dr. GRPO).")
    temperature: float = _f(1.0, "Sampling temperature (the log-probs of the loss use the same temperature).")
    num_iterations: int = _f(1, "mu: gradient steps per rollout batch (each reuses the same samples).")
    max_grad_norm: float = _f(1.0, "Gradient clipping norm.")
    # --- evaluation
    eval_size: int = _f(256, "Held-out problems (or episode seeds) for the before/after evaluation.")
    eval_samples: int = _f(4, "Samples per held-out problem for sampled accuracy (pass@1 at temperature).")

    @classmethod
    def from_profile(cls, profile: str = "quick", **overrides):
        if profile not in cls.PROFILES:
            raise ValueError(f"profile: unknown profile {profile!r}; choose one of {sorted(cls.PROFILES)}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}; see `python -m agentic_rl <recipe> --help`")
        return cls(**{**cls.PROFILES[profile], **overrides, "profile": profile})

    def __post_init__(self):
        self.validate()

    @property
    def agg_mode(self) -> str:
        """The aggregation mode ``loss_type`` names (TRL aliases resolved)."""
        return LOSS_TYPE_ALIASES.get(self.loss_type, self.loss_type)

    def _bad(self, name, why):
        raise ValueError(f"{name}: {why} (got {getattr(self, name)!r})")

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""
        bad = self._bad
        if self.profile not in self.PROFILES:
            bad("profile", f"unknown profile; choose one of {sorted(self.PROFILES)}")
        if self.num_generations < 1:
            bad("num_generations", "must be >= 1")
        for name in ("learning_rate", "sft_learning_rate", "temperature", "max_grad_norm"):
            if not getattr(self, name) > 0:
                bad(name, "must be positive")
        for name in ("max_steps", "sft_steps", "save_steps"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0")
        for name in ("prompts_per_step", "sft_batch_size", "num_iterations", "eval_size", "eval_samples"):
            if getattr(self, name) < 1:
                bad(name, "must be >= 1")
        if self.beta < 0:
            bad("beta", "must be >= 0")
        if self.epsilon < 0:
            bad("epsilon", "must be >= 0")
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            bad("epsilon_high", f"must be >= epsilon ({self.epsilon}); clip-higher widens the upper bound only")
        if self.dual_clip is not None and self.dual_clip <= 1:
            bad("dual_clip", "must be > 1")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            bad("kl_estimator", "must be 'k1', 'k2' or 'k3'")
        if self.loss_type not in AGG_MODES and self.loss_type not in LOSS_TYPE_ALIASES:
            bad("loss_type", f"must be one of {AGG_MODES} or {tuple(LOSS_TYPE_ALIASES)}")
        if self.scale_rewards not in ("group", "batch", "none"):
            bad("scale_rewards", "must be 'group', 'batch' or 'none'")
        if self.device not in ("auto", "cpu", "cuda", "mps") and not self.device.startswith("cuda:"):
            bad("device", "must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class GRPOConfig(RLConfig):
    """GRPO on a single-turn verifiable task: SFT warm start, GRPO, before/after evaluation."""

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},  # the dataclass defaults
        "full": dict(
            digits=3, hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1024,
            sft_steps=3000, sft_batch_size=128, sft_learning_rate=5e-4, max_steps=300, prompts_per_step=64, num_generations=16,
            learning_rate=5e-5, eval_size=1024,
        ),
    }

    # --- task
    task: str = _f("addition", "Task name (see agentic_rl.envs.TASKS).")
    digits: int = _f(2, "Addition task: digits per operand.")
    teacher_error_rate: float = _f(0.5, "Fraction of SFT demonstrations with one wrong digit (the noisy teacher).")
    format_weight: float = _f(0.1, "Weight of the format reward added to the 0/1 exact-match reward.")
    max_completion_length: int = _f(8, "Maximum generated tokens per completion.")

    def validate(self) -> None:
        super().validate()
        from .envs import TASKS

        if self.task not in TASKS:
            self._bad("task", f"unknown task; known tasks are {sorted(TASKS)}")
        if self.num_generations < 2:
            self._bad("num_generations", "GRPO needs a group of at least 2 completions per prompt (a group of one has no baseline)")
        for name in ("max_completion_length", "digits"):
            if getattr(self, name) < 1:
                self._bad(name, "must be >= 1")
        if not 0.0 <= self.teacher_error_rate <= 1.0:
            self._bad("teacher_error_rate", "must be in [0, 1]")


@dataclass
class PPOConfig(RLConfig):
    """PPO with a critic and GAE (or GRPO, for comparison) on a multi-turn text environment."""

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(
            map_size=6, max_turns=14, hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4,
            intermediate_size=1024, sft_steps=2000, sft_batch_size=64, max_steps=300, prompts_per_step=128, eval_size=512,
            max_action_tokens=3,
        ),
    }

    # --- defaults that differ from the GRPO recipe (quick profile: a 125k-parameter model, ~1-2 minutes)
    hidden_size: int = _f(64, "Tiny model: hidden size.")
    num_hidden_layers: int = _f(2, "Tiny model: number of decoder layers.")
    intermediate_size: int = _f(256, "Tiny model: MLP width.")
    num_generations: int = _f(1, "Episodes per seed: 1 for PPO (the critic is the baseline); >= 2 (a group) for the grpo estimator.")
    prompts_per_step: int = _f(32, "Episode seeds per RL step; the batch holds prompts_per_step * num_generations episodes.")
    loss_type: str = _f("token-mean", "Loss aggregation (see the GRPO recipe); PPO's usual token-mean by default.")
    sft_steps: int = _f(300, "SFT steps on demonstration episodes before RL (0: skip).")
    sft_batch_size: int = _f(32, "Demonstration episodes per SFT step.")
    max_steps: int = _f(60, "RL steps (one rollout batch each).")
    eval_size: int = _f(128, "Held-out episode seeds (maps) for the before/after evaluation.")
    # --- environment
    env: str = _f("frozenlake", "Environment name (see agentic_rl.envs.ENVS).")
    map_size: int = _f(4, "FrozenLake: the map is map_size x map_size, drawn at random per episode seed.")
    is_slippery: bool = _f(False, "FrozenLake: slippery ice (an action moves as intended only 1/3 of the time).")
    p_frozen: float = _f(0.8, "FrozenLake: probability that a tile of a random map is frozen (not a hole).")
    max_turns: int = _f(8, "Turn limit of an episode (the environment truncates at it).")
    demo_error_rate: float = _f(0.3, "Fraction of demonstration actions replaced by a random other action (mixed-quality SFT data).")
    max_action_tokens: int = _f(3, "Maximum tokens the policy may generate in one turn.")
    # --- advantage estimation and the critic
    advantage_estimator: str = _f("gae", "'gae' (PPO with a critic) or 'grpo' (group-relative, no critic).")
    gamma: float = _f(1.0, "GAE discount over generated tokens, in [0, 1].")
    lam: float = _f(1.0, "GAE lambda, in [0, 1]: 0 is one-step TD, 1 is Monte Carlo minus the value baseline.")
    critic_learning_rate: float = _f(1e-3, "Critic learning rate (AdamW).")
    vf_coef: float = _f(1.0, "Weight of the value loss (the critic is a separate model, so it only scales its step).")
    cliprange_value: float | None = _f(0.2, "Value clipping around the rollout-time values (verl cliprange_value). None: off.")
    whiten_advantages: bool = _f(True, "Whiten GAE advantages over the batch's generated tokens (verl, RAGEN).")
    bootstrap_truncated: bool = _f(
        False,
        "Bootstrap truncated episodes from the critic (add gamma * V(s_T) to their last reward). Off by default: "
        "here the turn limit is part of the task, so running out of turns is terminal.",
    )

    def validate(self) -> None:
        super().validate()
        from .envs import ENVS

        if self.env not in ENVS:
            self._bad("env", f"unknown environment; known environments are {sorted(ENVS)}")
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                self._bad(name, "must be in [0, 1]")
        if self.advantage_estimator not in ("gae", "grpo"):
            self._bad("advantage_estimator", "must be 'gae' or 'grpo'")
        if self.advantage_estimator == "grpo" and self.num_generations < 2:
            self._bad("num_generations", "the grpo estimator needs at least 2 episodes per seed")
        if not 0.0 <= self.demo_error_rate <= 1.0:
            self._bad("demo_error_rate", "must be in [0, 1]")
        for name in ("map_size", "max_turns", "max_action_tokens"):
            if getattr(self, name) < (2 if name == "map_size" else 1):
                self._bad(name, "is too small")
        if not 0.0 < self.p_frozen <= 1.0:
            self._bad("p_frozen", "must be in (0, 1]")
        if not self.critic_learning_rate > 0:
            self._bad("critic_learning_rate", "must be positive")
        if self.cliprange_value is not None and self.cliprange_value <= 0:
            self._bad("cliprange_value", "must be positive (or none)")


#: The GRPO recipe's profiles (kept as a module name for convenience).
PROFILES = GRPOConfig.PROFILES


# ----------------------------------------------------------------------------------------------------
# A CLI from the dataclass: one flag per field, help from the field's doc.


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "null") else kind(text)

    parse.__name__ = kind.__name__
    return parse


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, defaults: dict | None = None) -> None:
    """One ``--field-name`` flag per dataclass field, typed, with the field's help text."""
    hints = typing.get_type_hints(cls)
    defaults = defaults or {}
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        args = typing.get_args(hint)
        optional = type(None) in args
        base = next((a for a in args if a is not type(None)), hint) if args else hint
        kind = {bool: _parse_bool, int: int, float: float, str: str}[base]
        if optional:
            kind = _optional(kind)
        default = defaults.get(f.name, f.default)
        parser.add_argument(
            "--" + f.name.replace("_", "-"), dest=f.name, type=kind, default=argparse.SUPPRESS,
            metavar=base.__name__.upper(), help=f"{f.metadata.get('help', '')} [default: {default}]",
        )


def config_from_args(cls, argv: list[str] | None, prog: str):
    """Parse ``argv`` into ``cls.from_profile(profile, **given flags)``."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--profile", default="quick")
    known, _ = pre.parse_known_args(argv)
    if known.profile not in cls.PROFILES:
        pre.prog = prog
        pre.error(f"profile: unknown profile {known.profile!r}; choose one of {sorted(cls.PROFILES)}")
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    add_dataclass_arguments(parser, cls, cls.PROFILES[known.profile])
    given = vars(parser.parse_args(argv))
    given.pop("profile", None)
    try:
        return cls.from_profile(known.profile, **given)
    except ValueError as err:
        parser.error(str(err))
