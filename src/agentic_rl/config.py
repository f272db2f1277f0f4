"""What every recipe's config shares: the fields, their validation, and small field mixins.

Each recipe's own config lives in its chapter's module, beside its trainer (``grpo.GRPOConfig``,
``agent.PPOConfig``, ``retool.ReToolConfig``, ``starpo.StarPOConfig``, ``rcgrpo.RCGRPOConfig``,
``gcd.GCDConfig``, ...). It subclasses :class:`RLConfig` and the mixins of the fields it uses, so
that no recipe shows a flag it cannot use:

====================  ============================================================================
:class:`RLConfig`     the run, the model, the SFT warm start, policy optimisation, evaluation
:class:`AgentFields`  a multi-turn environment: ``env``, ``max_turns``, ``max_action_tokens``, ...
:class:`CriticFields` PPO's critic and GAE: ``advantage_estimator``, ``gamma``, ``lam``, ...
:class:`FrozenLakeFields`  the random lakes: ``map_size``, ``is_slippery``, ``p_frozen``
:class:`HouseholdFields`  the household's goals and turns: ``clean_fraction``, ``slack``
====================  ============================================================================

Names follow TRL's ``GRPOConfig`` where the concept is the same (``num_generations``, ``beta``,
``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``, ``temperature``,
``max_completion_length``, ``learning_rate``, ``num_iterations``, ``max_steps``, ``max_grad_norm``),
so the book can say "this is TRL's X". Where a default differs from TRL's it says so.

Profiles: ``quick`` (the dataclass defaults: a ~1M-parameter model, minutes on one CPU thread) and
``full`` (a larger model, more steps; for a GPU). ``GRPOConfig.from_profile("full", seed=1)``
applies the profile, then your overrides. A recipe changes an inherited default with
:func:`defaults` (the field keeps its type and help text) and writes only what differs.

This module imports no model code (no transformers): the CLI builds its flags from a config
class, and ``--help`` stays fast.
"""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass
from typing import ClassVar

from . import bounds
from .bounds import CLIP, COEF, LORA_R, LR, PASSES, TEMPERATURE
from .errors import ConfigError, RunError
from .losses import AGG_MODES, LOSS_TYPE_ALIASES
from .params import defaults, param

__all__ = [
    "RLConfig", "AgentFields", "CriticFields", "FrozenLakeFields", "HouseholdFields", "FULL_MODEL",
    "defaults", "RunError", "ConfigError",
]  # fmt: skip

#: Positions of the tiny from-scratch model (``models.build_model``'s ``max_position_embeddings``).
TINY_MAX_POSITIONS = 128

#: The ``full`` profiles' model width (each recipe adds its ``num_hidden_layers``).
FULL_MODEL = dict(
    hidden_size=256, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1024
)


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _on_cuda(device: str) -> bool:
    """Whether a run with this ``device`` setting will use a CUDA GPU."""
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


@dataclass
class RLConfig:
    """What every RL recipe shares: the run, the model, the SFT warm start,
    and policy optimisation."""

    PROFILES: ClassVar[dict[str, dict]] = {"quick": {}}
    #: What a profile adds when the run will be on a CUDA GPU (``from_profile`` applies it under
    #: your overrides): the batch and the length of run a GPU affords, same command.
    GPU_PROFILES: ClassVar[dict[str, dict]] = {}
    #: Named variants of a method (StarPO-S, DAPO...): a recipe with presets declares a ``preset``
    #: field; ``from_profile(..., preset=name)`` fills the fields you do not set with its values.
    PRESETS: ClassVar[dict[str, dict]] = {}

    # --- run
    profile: str = param(
        "quick",
        "Profile: 'quick' (CPU, minutes) or 'full' (GPU). --profile (or from_profile) fills "
        "the fields you do not set with its values.",
    )
    seed: int = param(0, "Seed for python, numpy and torch (model init, problems, sampling).")
    output_dir: str | None = param(
        None, "Folder for checkpoint.pt, metrics.csv and summary.json (None: keep nothing on disk)."
    )
    device: str = param("auto", "'auto' (CUDA, then MPS, then CPU), or 'cpu', 'cuda', 'mps'.")
    resume: bool = param(True, "Resume from output_dir/checkpoint.pt when it exists.")
    save_steps: int = param(
        25, "Write a checkpoint every this many steps (SFT and RL). 0: only at phase ends."
    )
    disable_tqdm: bool = param(False, "Hide progress bars (as TRL's disable_tqdm).")
    # --- model
    model_name_or_path: str | None = param(
        None,
        "Pretrained model: a hub name, a folder, or a packaged model's alias "
        "('smollm2-135m-instruct', installed with pip, no hub needed). None: a tiny Llama "
        "from scratch.",
    )
    hidden_size: int = param(128, "Tiny model: hidden size.")
    num_hidden_layers: int = param(4, "Tiny model: number of decoder layers.")
    num_attention_heads: int = param(4, "Tiny model: attention heads.")
    num_key_value_heads: int = param(2, "Tiny model: key/value heads (grouped-query attention).")
    intermediate_size: int = param(512, "Tiny model: MLP width.")
    use_lora: bool = param(False, "Train LoRA adapters instead of all weights (peft).")
    lora_r: int = param(8, "LoRA rank.", high=2**14, why=LORA_R)
    lora_alpha: int = param(
        16, "LoRA alpha.", high=2**16, why="the adapters' scale alpha / r multiplies their update"
    )
    lora_target_modules: str = param(
        "q_proj,k_proj,v_proj,o_proj",
        "Comma-separated names of the modules that get LoRA adapters (the attention projections).",
    )
    # --- SFT warm start
    sft_steps: int = param(600, "SFT steps on teacher demonstrations before RL (0: skip).")
    sft_batch_size: int = param(64, "Demonstrations per SFT step.")
    sft_learning_rate: float = param(1e-3, "SFT learning rate (AdamW).", high=10.0, why=LR)
    # --- policy optimisation (TRL names)
    max_steps: int = param(100, "RL steps (one rollout batch each).")
    prompts_per_step: int = param(
        32,
        "Prompts (or episode seeds) per RL step; "
        "the batch holds prompts_per_step * num_generations rollouts.",
    )
    num_generations: int = param(8, "G: rollouts sampled per prompt (the group).")
    learning_rate: float = param(1e-4, "Policy learning rate (AdamW).", high=10.0, why=LR)
    beta: float = param(
        0.0,
        "KL coefficient. 0 (TRL's default) loads no reference model; DeepSeekMath used 0.04.",
        high=1e3, why=COEF,
    )  # fmt: skip
    kl_estimator: str = param(
        "k3", "KL estimator in the loss: 'k1', 'k2' or 'k3' (DeepSeekMath and TRL use k3)."
    )
    kl_in_reward: bool = param(
        False,
        "Put the KL into the reward instead of the loss (verl's use_kl_in_reward, RAGEN's "
        "paper-era code): r - beta * k(t) on every trained token, before the advantages. As a "
        "loss term, k1's expected gradient is zero whatever beta (chapter StarPO).",
    )
    log_kl: bool = param(
        False,
        "Keep pi_ref and log the KL to it even when beta = 0 (one extra forward pass per step, "
        "15-25 %% of a quick-profile step). Off: with beta = 0 no reference model is built, as "
        "in TRL; the GRPO lab asks for it, because the drift is one of its subjects.",
    )
    epsilon: float = param(0.2, "Lower clip range: ratios below 1 - epsilon are clipped.")
    epsilon_high: float | None = param(
        None, "Upper clip range (DAPO's clip-higher). None: equal to epsilon.", high=100.0, why=CLIP
    )
    dual_clip: float | None = param(
        None,
        "Dual-clip constant c > 1 for negative advantages (verl clip_ratio_c). None: off.",
        high=100.0, why=CLIP,
    )  # fmt: skip
    loss_type: str = param(
        "grpo",
        "Loss aggregation: a verl mode (token-mean, seq-mean-token-mean, seq-mean-token-sum-norm, "
        "...) or a TRL loss_type alias (grpo, bnpo, dr_grpo, dapo). "
        "Default 'grpo' = DeepSeekMath eq. 3 (TRL's default is 'dapo').",
    )
    scale_rewards: str = param(
        "group", "Advantage scaling: 'group' (GRPO), 'batch', or 'none' (Dr. GRPO)."
    )
    temperature: float = param(
        1.0,
        "Sampling temperature (the log-probs of the loss use the same temperature).",
        low=0.01, high=100.0, why=TEMPERATURE,
    )  # fmt: skip
    num_iterations: int = param(
        1,
        "mu: passes (epochs) over each rollout batch (each reuses the same samples).",
        high=100, why=PASSES,
    )  # fmt: skip
    num_minibatches: int = param(
        1,
        "Minibatches per pass: each pass takes this many gradient steps on disjoint slices of "
        "the batch (PPO's minibatches; verl: train batch / ppo_mini_batch_size).",
    )
    max_grad_norm: float = param(
        1.0, "Gradient clipping norm.", high=3.4e38, why="gradient norms are float32"
    )
    skip_prompt_logits: bool = param(
        True,
        "Compute the loss's logits only from the first generated column on: the same log-probs, "
        "gradients equal up to float summation order, and no LM head over the prompt (on a "
        "pretrained model's 49k-word vocabulary, as costly as the transformer). False: the plain "
        "pass over every column, as the GRPO chapter first writes it.",
    )
    share_prompt_prefix: bool = param(
        True,
        "Encode each prompt once for its G samples, in sampling and in the loss (the prompt's KV "
        "cache shared by its group): the same sampler and random draws as `generate`, and the "
        "same log-probs and gradients up to float summation order (tests/test_speed.py), with "
        "41 %% fewer tokens through the transformer on the quick profile. False: the plain path "
        "(every row encoded whole), as the GRPO chapter first writes it.",
    )
    bf16: bool = param(
        False,
        "Mixed precision: bf16 where the GPU supports it, else fp16 with a gradient scaler "
        "(compute capability 7.0+, e.g. a T4), else float32. The forward passes of sampling and "
        "of the loss run under torch.autocast; weights, gradients and AdamW stay float32 (TRL's "
        "name, bf16=True). Ignored on the CPU, where runs stay float32. The GPU version of the "
        "full profile turns it on.",
    )
    entropy_coeff: float = param(
        0.0,
        "Entropy bonus: the loss subtracts entropy_coeff times the mean entropy of the generated "
        "tokens (verl's entropy_coeff; RAGEN uses 0.001). 0: off, as TRL.",
        high=1e3,
        why=COEF,
    )
    # --- evaluation
    eval_size: int = param(
        256, "Held-out problems (or episode seeds) for the before/after evaluation."
    )
    eval_samples: int = param(
        4, "Samples per held-out problem for sampled accuracy (pass@1 at temperature)."
    )

    @classmethod
    def from_profile(cls, profile: str = "quick", **overrides):
        if profile not in cls.PROFILES:
            why = f"unknown profile; choose one of {sorted(cls.PROFILES)}"
            raise ConfigError("profile", why, profile)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(
                f"unknown config field(s) {unknown}; see `python -m agentic_rl <recipe> --help`"
            )
        values = dict(cls.PROFILES[profile])
        if profile in cls.GPU_PROFILES and _on_cuda(overrides.get("device", "auto")):
            values.update(cls.GPU_PROFILES[profile])
        if cls.PRESETS:  # the preset's values over the profile's, yours over both
            preset = overrides.get("preset", cls.__dataclass_fields__["preset"].default)
            if preset not in cls.PRESETS:
                why = f"unknown preset; choose one of {sorted(cls.PRESETS)}"
                raise ConfigError("preset", why, preset)
            values.update(cls.PRESETS[preset])
        return cls(**{**values, **overrides, "profile": profile})

    # ------------------------------------------------------------------ validation
    # ``validate()`` checks the config alone (types, ranges, cross-field rules) at construction
    # and after every assignment (a rejected one is undone): change coupled fields together with
    # ``dataclasses.replace``. A recipe's ``validate`` calls ``super().validate()``, then
    # ``self._bad(name, why)``. ``check_environment()`` checks the machine, before any compute.

    def __post_init__(self):
        self.validate()
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name, value):
        if not getattr(self, "_ready", False) or name not in self._field_types():
            return object.__setattr__(self, name, value)
        old = getattr(self, name)
        object.__setattr__(self, name, value)
        try:
            self.validate()
        except ConfigError:
            object.__setattr__(self, name, old)  # undo: the config stays valid
            raise

    @classmethod
    def _field_types(cls) -> dict[str, tuple[type, bool]]:
        """``{field: (base type, None allowed)}`` from the annotations (cached per class)."""
        cache = cls.__dict__.get("_types_cache")
        if cache is None:
            hints = typing.get_type_hints(cls)
            cache = {}
            for f in dataclasses.fields(cls):
                hint = hints[f.name]
                args = typing.get_args(hint)
                base = next((a for a in args if a is not type(None)), None) if args else hint
                cache[f.name] = (base, type(None) in args)
            type.__setattr__(cls, "_types_cache", cache)
        return cache

    @property
    def agg_mode(self) -> str:
        """The aggregation mode ``loss_type`` names (TRL aliases resolved)."""
        return LOSS_TYPE_ALIASES.get(self.loss_type, self.loss_type)

    def _bad(self, name, why):
        raise ConfigError(name, why, getattr(self, name))

    def _check_types(self) -> None:
        """Every field has its annotated type (an int for a float is fine); floats are finite."""
        for name, (base, optional) in self._field_types().items():
            v = getattr(self, name)
            if v is None:
                if not optional:
                    self._bad(name, f"must be {_TYPE_WORDS[base]}, not None")
                continue
            ok = isinstance(v, base) and not (base is not bool and isinstance(v, bool))
            if base is float:
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
            if not ok:
                self._bad(name, f"must be {_TYPE_WORDS[base]}" + (" or None" if optional else ""))
            if base is float and not math.isfinite(v):
                self._bad(name, "must be a finite number")

    def _at_least(self, names, low) -> None:
        for name in names:
            if getattr(self, name) < low:
                self._bad(name, f"must be >= {low}")

    def validate(self) -> None:
        """Raise :class:`ConfigError` (a ``ValueError``) naming the first invalid field.

        A recipe (or a field mixin) extends it: ``super().validate()``, then its own rules."""
        self._check_types()
        self._check_run()
        self._check_model()
        self._check_optimisation()
        if self.PRESETS:
            self._check_preset()
        bounds.check_bounds(self)  # upper bounds, the context budget (agentic_rl.bounds)

    def memory_needs(self) -> list[tuple[int, tuple[str, ...], str]]:
        """What a run holds at once on its device: ``(bytes, fields that set it, what)``
        (:func:`agentic_rl.bounds.memory_needs`); a recipe adds its own after ``super()``."""
        return bounds.memory_needs(self)

    def host_memory_needs(self) -> list[tuple[int, tuple[str, ...], str]]:
        """The same, in the machine's RAM whatever the device (ReTool's sandbox); none here."""
        return []

    @property
    def uses_critic(self) -> bool:
        """Whether the run trains a critic (PPO + GAE): never without :class:`CriticFields`."""
        return False

    def check_data_parallel(self, world: int) -> None:
        """Refuse (:class:`ConfigError`) what does not split across ``world`` torchrun ranks,
        before any compute (:mod:`agentic_rl.distributed`): a recipe adds its own limits after
        ``super().check_data_parallel(world)``, as in ``validate``. Here: the prompts divide
        across the ranks, each share fills ``num_minibatches``; no ``scale_rewards='batch'``."""
        if self.prompts_per_step % world:
            why = (
                f"does not divide across {world} ranks (each rank plays an equal share of a "
                f"step's prompts, each with its whole group); use a multiple of {world}"
            )
            self._bad("prompts_per_step", why)
        rows = self.prompts_per_step // world * self.num_generations
        if self.num_minibatches > rows:
            why = (
                f"must be <= the rows of each rank's batch (prompts_per_step * num_generations / "
                f"{world} ranks = {rows}): a minibatch needs at least one rollout"
            )
            self._bad("num_minibatches", why)
        if self.scale_rewards == "batch":
            why = f"'batch' (the std of the whole batch, over {world} ranks) needs one process"
            self._bad("scale_rewards", why + "; use 'group' or 'none'")

    def _check_preset(self) -> None:
        if self.preset not in self.PRESETS:
            self._bad("preset", f"unknown preset; choose one of {sorted(self.PRESETS)}")
        # Config(preset="starpo-s") alone would be labelled StarPO-S but run StarPO: refused.
        values = self.PRESETS[self.preset]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        if values and all(getattr(self, k) == defaults[k] for k in values):
            self._bad(
                "preset",
                f"the {self.preset!r} preset's values are not applied; use "
                f"{type(self).__name__}.from_profile(..., preset={self.preset!r}) or "
                f"--preset {self.preset}",
            )

    def _check_run(self) -> None:
        bad = self._bad
        if self.profile not in self.PROFILES:
            bad("profile", f"unknown profile; choose one of {sorted(self.PROFILES)}")
        self._check_profile_applied()
        if not 0 <= self.seed < 2**32:
            bad("seed", "must be in [0, 2**32) (numpy's seed range)")
        if self.output_dir is not None and (not self.output_dir.strip() or "\0" in self.output_dir):
            bad("output_dir", "must be a folder name, or None to keep nothing on disk")
        if self.model_name_or_path is not None and not self.model_name_or_path.strip():
            bad("model_name_or_path", "must be a hub name or a folder, or None for the tiny model")

    def _check_model(self) -> None:
        bad = self._bad
        targets = self.lora_target_modules.split(",")
        if not all(re.fullmatch(r"[A-Za-z_][\w]*", t) for t in targets):
            bad(
                "lora_target_modules",
                "must be comma-separated module names without spaces, e.g. 'q_proj,v_proj'",
            )
        sizes = ("num_generations", "hidden_size", "num_hidden_layers", "num_attention_heads")
        sizes += ("num_key_value_heads", "intermediate_size", "lora_r", "lora_alpha")
        self._at_least(sizes, 1)
        if self.hidden_size % self.num_attention_heads:
            bad("num_attention_heads", f"must divide hidden_size ({self.hidden_size})")
        if (self.hidden_size // self.num_attention_heads) % 2:
            bad(
                "num_attention_heads",
                f"hidden_size / num_attention_heads must be even (rotary "
                f"embeddings rotate pairs), here {self.hidden_size // self.num_attention_heads}",
            )
        heads = self.num_attention_heads
        if self.num_key_value_heads > heads:
            bad("num_key_value_heads", f"must be <= num_attention_heads ({heads})")
        if heads % self.num_key_value_heads:
            bad("num_key_value_heads", f"must divide num_attention_heads ({heads})")

    def _check_optimisation(self) -> None:
        bad = self._bad
        for name in ("learning_rate", "sft_learning_rate", "temperature", "max_grad_norm"):
            if not getattr(self, name) > 0:
                bad(name, "must be positive")
        self._at_least(("max_steps", "sft_steps", "save_steps"), 0)
        counts = ("prompts_per_step", "sft_batch_size", "num_iterations", "num_minibatches")
        self._at_least(counts + ("eval_size", "eval_samples"), 1)
        rows = self.prompts_per_step * self.num_generations
        if self.num_minibatches > rows:
            bad(
                "num_minibatches",
                f"must be <= the rows of a batch (prompts_per_step * "
                f"num_generations = {rows}): a minibatch needs at least one rollout",
            )
        if self.beta < 0:
            bad("beta", "must be >= 0")
        if self.kl_in_reward and self.beta == 0:
            bad("kl_in_reward", "needs beta > 0: beta is the penalty's coefficient")
        if self.entropy_coeff < 0:
            bad("entropy_coeff", "must be >= 0 (a bonus for entropy, not a penalty)")
        if not 0 <= self.epsilon < 1:
            bad("epsilon", "must be in [0, 1) (ratios are clipped below at 1 - epsilon)")
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            bad(
                "epsilon_high",
                f"must be >= epsilon ({self.epsilon}); clip-higher widens the upper bound only",
            )
        if self.dual_clip is not None and self.dual_clip <= 1:
            bad("dual_clip", "must be > 1")
        if self.kl_estimator not in ("k1", "k2", "k3"):
            bad("kl_estimator", "must be 'k1', 'k2' or 'k3'")
        if self.loss_type not in AGG_MODES and self.loss_type not in LOSS_TYPE_ALIASES:
            bad("loss_type", f"must be one of {AGG_MODES} or {tuple(LOSS_TYPE_ALIASES)}")
        if self.scale_rewards not in ("group", "batch", "none"):
            bad("scale_rewards", "must be 'group', 'batch' or 'none'")
        dev = self.device
        known = dev in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", dev)
        if not known:
            bad("device", "must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'")

    def _check_profile_applied(self) -> None:
        # GRPOConfig(profile="full") alone would be labelled full but keep the quick model: refused.
        base = {f.name: f.default for f in dataclasses.fields(self)}
        values = {k: v for k, v in self.PROFILES[self.profile].items() if v != base[k]}
        if values and all(getattr(self, k) == base[k] for k in values):
            self._bad(
                "profile",
                f"the {self.profile!r} profile's values are not applied (every "
                f"field it sets has its quick default); use {type(self).__name__}"
                f".from_profile({self.profile!r}, ...) or --profile {self.profile}",
            )

    def _check_positions(self, name: str, tokens: int) -> None:
        """A recipe's rule: ``tokens`` (blamed on field ``name``) fit the tiny model's positions."""
        if self.model_name_or_path is None and tokens > TINY_MAX_POSITIONS:
            self._bad(
                name,
                f"a sequence would need {tokens} positions; the tiny model has "
                f"{TINY_MAX_POSITIONS}",
            )

    #: A recipe's fields that make sequences longer (blamed when memory is short).
    _size_fields: ClassVar[tuple[str, ...]] = ()

    def min_sequence_tokens(self) -> int:
        """The shortest sequence a rollout can have (a recipe says; for the memory estimate)."""
        return 1

    def check_environment(self) -> None:
        """Check what depends on the machine, before any compute; raise :class:`ConfigError`.

        The device exists; a pretrained model is a folder or reachable on the hub; the output folder
        can be created or written; and the model, batches and evaluation roughly fit in the
        device's memory (:mod:`agentic_rl.bounds`).
        """
        import torch

        from .models import device_problem, model_source_problem

        self.validate()  # (already valid unless someone bypassed __setattr__; cheap)
        dev, name = self.device, self.model_name_or_path
        if device_problem(dev):
            self._bad("device", device_problem(dev))
        if name is not None and model_source_problem(name):
            self._bad("model_name_or_path", model_source_problem(name))
        if self.output_dir is not None and bounds.output_dir_problem(self.output_dir):
            self._bad("output_dir", bounds.output_dir_problem(self.output_dir))
        if dev.startswith("cuda") or (dev == "auto" and torch.cuda.is_available()):
            index = int(dev.split(":")[1]) if ":" in dev else 0
            total, where = torch.cuda.get_device_properties(index).total_memory, "GPU memory"
        else:
            total, where = bounds.memory_limit()  # RAM, ulimit -v or a cgroup's: the smallest
        bounds.check_memory(self, self.memory_needs(), total, where)  # model, batches, ...
        host, where = bounds.memory_limit()  # ReTool's sandbox: in RAM whatever the device
        bounds.check_memory(self, self.host_memory_needs(), host, where)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class AgentFields(RLConfig):
    """A multi-turn environment (the agent recipes): which one, turns, actions, demonstrations.

    The agents' quick model is smaller than GRPO's (a 125k-parameter model, ~1-2 minutes)."""

    #: The environments the recipe's trainer can build.
    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ()

    hidden_size: int = param(64, "Tiny model: hidden size.")
    num_hidden_layers: int = param(2, "Tiny model: number of decoder layers.")
    intermediate_size: int = param(256, "Tiny model: MLP width.")
    env: str = param("frozenlake", "Environment name (see agentic_rl.envs.ENVS).")
    max_turns: int = param(
        8, "Turn limit of an episode (the environment truncates at it).", tokens=True
    )
    demo_error_rate: float = param(
        0.3,
        "Fraction of demonstration actions replaced by a random other action "
        "(mixed-quality SFT data).",
    )
    max_action_tokens: int = param(
        3, "Maximum tokens the policy may generate in one turn.", tokens=True
    )

    def validate(self) -> None:
        super().validate()
        from .envs import ENVS

        if self.env not in ENVS:
            self._bad("env", f"unknown environment; known environments are {sorted(ENVS)}")
        if self.env not in self.RECIPE_ENVS:
            self._bad("env", f"this recipe runs {' or '.join(map(repr, self.RECIPE_ENVS))}")
        if not self.uses_critic and self.num_generations < 2:  # the group is the baseline
            self._bad("num_generations", "the grpo estimator needs at least 2 episodes per seed")
        if not 0.0 <= self.demo_error_rate <= 1.0:
            self._bad("demo_error_rate", "must be in [0, 1]")
        for name in ("max_turns", "max_action_tokens"):
            if getattr(self, name) < 1:
                self._bad(name, "is too small")
        # One turn's action must fit; whole episodes may run past the tiny model's 128 positions
        # (rotary embeddings have no table; the full profile's long episodes rely on it).
        self._check_positions("max_action_tokens", self.max_action_tokens)

    def _check_new_tokens(self, names: tuple[str, str], env_words: list[str]) -> None:
        """Two fields naming special tokens a recipe adds: each one new word, and different."""
        from .models import CHAT_WORDS, SPECIAL_TOKENS

        words = set(env_words) | set(SPECIAL_TOKENS) | set(CHAT_WORDS)
        for name in names:
            token = getattr(self, name)
            if not token or any(ch.isspace() for ch in token):
                self._bad(name, "must be one non-empty word (it becomes one special token)")
            if token in words:
                self._bad(name, "is already a word or special token: the token must be new")
        if getattr(self, names[0]) == getattr(self, names[1]):
            self._bad(names[1], f"must differ from {names[0]}")


@dataclass
class CriticFields(RLConfig):
    """PPO's critic and GAE, or GRPO's group advantage instead (``advantage_estimator``)."""

    advantage_estimator: str = param(
        "gae", "'gae' (PPO with a critic) or 'grpo' (group-relative, no critic)."
    )
    gamma: float = param(1.0, "GAE discount over generated tokens, in [0, 1].")
    lam: float = param(
        1.0, "GAE lambda, in [0, 1]: 0 is one-step TD, 1 is Monte Carlo minus the value baseline."
    )
    critic_learning_rate: float = param(1e-3, "Critic learning rate (AdamW).", high=10.0, why=LR)
    vf_coef: float = param(
        1.0,
        "Weight of the value loss (the critic is a separate model, so it only scales its step).",
        high=1e3, why=COEF,
    )  # fmt: skip
    cliprange_value: float | None = param(
        0.2,
        "Value clipping around the rollout-time values (verl cliprange_value). None: off.",
        high=100.0, why="values live on the reward scale, O(1): 100 never clips",
    )  # fmt: skip
    whiten_advantages: bool = param(
        True, "Whiten GAE advantages over the batch's generated tokens (verl, RAGEN)."
    )
    bootstrap_truncated: bool = param(
        False,
        "Bootstrap truncated episodes from the critic (add gamma * V(s_T) to their last reward). "
        "Off by default: here the turn limit is part of the task, so running out of turns is "
        "terminal.",
    )

    @property
    def uses_critic(self) -> bool:
        return self.advantage_estimator == "gae"

    def validate(self) -> None:
        super().validate()
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                self._bad(name, "must be in [0, 1]")
        if self.advantage_estimator not in ("gae", "grpo"):
            self._bad("advantage_estimator", "must be 'gae' or 'grpo'")
        if not self.critic_learning_rate > 0:
            self._bad("critic_learning_rate", "must be positive")
        if self.cliprange_value is not None and self.cliprange_value <= 0:
            self._bad("cliprange_value", "must be positive (or none)")
        if self.vf_coef < 0:
            self._bad("vf_coef", "must be >= 0")


@dataclass
class FrozenLakeFields(RLConfig):
    """FrozenLake's random lakes (gymnasium's map generator)."""

    map_size: int = param(
        4, "FrozenLake: the map is map_size x map_size, drawn at random per episode seed."
    )
    is_slippery: bool = param(
        False, "FrozenLake: slippery ice (an action moves as intended only 1/3 of the time)."
    )
    p_frozen: float = param(
        0.8, "FrozenLake: probability that a tile of a random map is frozen (not a hole)."
    )

    def validate(self) -> None:
        super().validate()
        if self.map_size < 2:
            self._bad("map_size", "is too small")
        if self.map_size > 32:
            self._bad("map_size", "must be <= 32 (an observation holds map_size**2 tiles)")
        if not 0.0 < self.p_frozen <= 1.0:
            self._bad("p_frozen", "must be in (0, 1]")


@dataclass
class HouseholdFields(RLConfig):
    """The ALFWorld-style household (``envs.HouseholdEnv``): its goals and its budget of turns.
    With :class:`AgentFields` (its checks read ``max_turns`` and ``max_action_tokens``)."""

    clean_fraction: float = param(0.5, "Share of 'put clean O in T' goals (6 actions; 'put': 4).")
    slack: int = param(2, "Turns of each task's budget beyond the optimal plan.", tokens=True)

    def validate(self) -> None:
        super().validate()
        if not 0.0 <= self.clean_fraction <= 1.0:
            self._bad("clean_fraction", "must be in [0, 1]")
        if self.slack < 0:
            self._bad("slack", "must be >= 0")
        if self.max_turns < 6 + self.slack:
            self._bad("max_turns", "must be >= 6 + slack (a 'put clean' task's plan is 6 actions)")
        if self.max_action_tokens < 5:
            self._bad("max_action_tokens", "must be >= 5 (four words and the stop word)")


#: What the group-relative agent recipes (RC-GRPO, GCD) change in :class:`AgentFields`' defaults:
#: GRPO on a multi-turn environment, G = 8 episodes per task, one on-policy step per batch.
GROUP_AGENT_DEFAULTS = dict(
    num_generations=8, prompts_per_step=8, learning_rate=3e-4, eval_size=64, sft_batch_size=32
)
#: Their ``full`` profile.
GROUP_AGENT_FULL = dict(
    FULL_MODEL, num_hidden_layers=4, sft_steps=1500, max_steps=200, prompts_per_step=32,
    eval_size=256,
)  # fmt: skip
