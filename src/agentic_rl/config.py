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

from .losses import AGG_MODES, LOSS_TYPE_ALIASES

__all__ = ["GRPOConfig", "PROFILES", "add_dataclass_arguments", "config_from_args"]


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class GRPOConfig:
    """Everything one GRPO run needs: task, model, SFT warm start, GRPO, evaluation, bookkeeping."""

    # --- run
    profile: str = _f("quick", "Profile: 'quick' (CPU, minutes) or 'full' (GPU). --profile (or GRPOConfig.from_profile) fills the fields you do not set with its values.")
    task: str = _f("addition", "Task name (see agentic_rl.envs.TASKS).")
    seed: int = _f(0, "Seed for python, numpy and torch (model init, problems, sampling).")
    output_dir: str | None = _f(None, "Folder for checkpoint.pt, metrics.csv and summary.json (None: keep nothing on disk).")
    device: str = _f("auto", "'auto' (CUDA, then MPS, then CPU), or 'cpu', 'cuda', 'mps'.")
    resume: bool = _f(True, "Resume from output_dir/checkpoint.pt when it exists.")
    save_steps: int = _f(25, "Write a checkpoint every this many GRPO steps (and after SFT). 0: only at the end.")
    disable_tqdm: bool = _f(False, "Hide progress bars (as TRL's disable_tqdm).")
    # --- task
    digits: int = _f(2, "Addition task: digits per operand.")
    teacher_error_rate: float = _f(0.5, "Fraction of SFT demonstrations with one wrong digit (the noisy teacher).")
    format_weight: float = _f(0.1, "Weight of the format reward added to the 0/1 exact-match reward.")
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
    # --- GRPO (TRL names)
    max_steps: int = _f(100, "GRPO steps (one rollout batch each).")
    prompts_per_step: int = _f(32, "Prompts per GRPO step; the batch holds prompts_per_step * num_generations completions.")
    num_generations: int = _f(8, "G: completions sampled per prompt (the group). Must be >= 2.")
    learning_rate: float = _f(1e-4, "GRPO learning rate (AdamW).")
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
    max_completion_length: int = _f(8, "Maximum generated tokens per completion.")
    num_iterations: int = _f(1, "mu: gradient steps per rollout batch (each reuses the same samples).")
    max_grad_norm: float = _f(1.0, "Gradient clipping norm.")
    # --- evaluation
    eval_size: int = _f(256, "Held-out problems for the before/after evaluation.")
    eval_samples: int = _f(4, "Samples per held-out problem for sampled accuracy (pass@1 at temperature).")

    @classmethod
    def from_profile(cls, profile: str = "quick", **overrides) -> "GRPOConfig":
        if profile not in PROFILES:
            raise ValueError(f"profile: unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}; see `python -m agentic_rl grpo --help`")
        return cls(**{**PROFILES[profile], **overrides, "profile": profile})

    def __post_init__(self):
        self.validate()

    @property
    def agg_mode(self) -> str:
        """The aggregation mode ``loss_type`` names (TRL aliases resolved)."""
        return LOSS_TYPE_ALIASES.get(self.loss_type, self.loss_type)

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field."""
        from .envs import TASKS

        def bad(name, why):
            raise ValueError(f"{name}: {why} (got {getattr(self, name)!r})")

        if self.profile not in PROFILES:
            bad("profile", f"unknown profile; choose one of {sorted(PROFILES)}")
        if self.task not in TASKS:
            bad("task", f"unknown task; known tasks are {sorted(TASKS)}")
        if self.num_generations < 2:
            bad("num_generations", "GRPO needs a group of at least 2 completions per prompt (a group of one has no baseline)")
        for name in ("learning_rate", "sft_learning_rate", "temperature", "max_grad_norm"):
            if not getattr(self, name) > 0:
                bad(name, "must be positive")
        for name in ("max_steps", "sft_steps", "save_steps"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0")
        for name in ("prompts_per_step", "sft_batch_size", "max_completion_length", "num_iterations", "eval_size", "eval_samples", "digits"):
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
        if not 0.0 <= self.teacher_error_rate <= 1.0:
            bad("teacher_error_rate", "must be in [0, 1]")
        if self.device not in ("auto", "cpu", "cuda", "mps") and not self.device.startswith("cuda:"):
            bad("device", "must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: Values that differ from the dataclass defaults (which are the quick profile).
PROFILES: dict[str, dict] = {
    "quick": {},
    "full": dict(
        digits=3,
        hidden_size=256,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1024,
        sft_steps=3000,
        sft_batch_size=128,
        sft_learning_rate=5e-4,
        max_steps=300,
        prompts_per_step=64,
        num_generations=16,
        learning_rate=5e-5,
        eval_size=1024,
    ),
}


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
    if known.profile not in PROFILES:
        pre.prog = prog
        pre.error(f"profile: unknown profile {known.profile!r}; choose one of {sorted(PROFILES)}")
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    add_dataclass_arguments(parser, cls, PROFILES[known.profile])
    given = vars(parser.parse_args(argv))
    given.pop("profile", None)
    try:
        return cls.from_profile(known.profile, **given)
    except ValueError as err:
        parser.error(str(err))
