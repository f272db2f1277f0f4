"""One config dataclass per recipe; its field docs are the CLI's help text.

Names follow TRL's ``GRPOConfig`` where the concept is the same (``num_generations``, ``beta``,
``epsilon``, ``epsilon_high``, ``loss_type``, ``scale_rewards``, ``temperature``,
``max_completion_length``, ``learning_rate``, ``num_iterations``, ``max_steps``, ``max_grad_norm``),
so the book can say "this is TRL's X". Where a default differs from TRL's it says so.

Profiles: ``quick`` (the dataclass defaults: a ~1M-parameter model, minutes on one CPU thread) and
``full`` (a larger model, more steps; for a GPU). ``GRPOConfig.from_profile("full", seed=1)``
applies the profile, then your overrides.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from typing import ClassVar

from .losses import AGG_MODES, LOSS_TYPE_ALIASES

__all__ = [
    "RLConfig",
    "GRPOConfig",
    "PPOConfig",
    "ReToolConfig",
    "StarPOConfig",
    "GroupAgentConfig",
    "RCGRPOConfig",
    "GCDConfig",
    "PROFILES",
    "RunError",
    "ConfigError",
    "add_dataclass_arguments",
    "config_from_args",
]

#: Positions of the tiny from-scratch model (``models.build_model``'s ``max_position_embeddings``).
TINY_MAX_POSITIONS = 128


class RunError(Exception):
    """An error in what the user asked for (a config, a folder, a checkpoint), not a bug.

    The CLI prints these as one line, ``error: <message>``, with no traceback.
    """


class ConfigError(RunError, ValueError):
    """A config field with a bad value: ``str(err)`` is ``"<field>: <why> (got <value>)"``."""

    def __init__(self, field: str, why: str, value=None):
        self.field, self.why, self.value = field, why, value
        super().__init__(f"{field}: {why} (got {value!r})")


_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _physical_memory() -> int:
    """Bytes of RAM on this machine (0 when unknown)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _on_cuda(device: str) -> bool:
    """Whether a run with this ``device`` setting will use a CUDA GPU."""
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    import torch

    return torch.cuda.is_available()


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class RLConfig:
    """What every RL recipe shares: the run, the model, the SFT warm start,
    and policy optimisation."""

    PROFILES: ClassVar[dict[str, dict]] = {"quick": {}}
    #: What a profile adds when the run will be on a CUDA GPU (``from_profile`` applies it under
    #: your overrides): the batch and the length of run a GPU affords, same command.
    GPU_PROFILES: ClassVar[dict[str, dict]] = {}

    # --- run
    profile: str = _f(
        "quick",
        "Profile: 'quick' (CPU, minutes) or 'full' (GPU). --profile (or from_profile) fills "
        "the fields you do not set with its values.",
    )
    seed: int = _f(0, "Seed for python, numpy and torch (model init, problems, sampling).")
    output_dir: str | None = _f(
        None, "Folder for checkpoint.pt, metrics.csv and summary.json (None: keep nothing on disk)."
    )
    device: str = _f("auto", "'auto' (CUDA, then MPS, then CPU), or 'cpu', 'cuda', 'mps'.")
    resume: bool = _f(True, "Resume from output_dir/checkpoint.pt when it exists.")
    save_steps: int = _f(
        25, "Write a checkpoint every this many steps (SFT and RL). 0: only at phase ends."
    )
    disable_tqdm: bool = _f(False, "Hide progress bars (as TRL's disable_tqdm).")
    # --- model
    model_name_or_path: str | None = _f(
        None,
        "Pretrained model: a hub name, a folder, or a packaged model's alias "
        "('smollm2-135m-instruct', installed with pip, no hub needed). None: a tiny Llama "
        "from scratch.",
    )
    hidden_size: int = _f(128, "Tiny model: hidden size.")
    num_hidden_layers: int = _f(4, "Tiny model: number of decoder layers.")
    num_attention_heads: int = _f(4, "Tiny model: attention heads.")
    num_key_value_heads: int = _f(2, "Tiny model: key/value heads (grouped-query attention).")
    intermediate_size: int = _f(512, "Tiny model: MLP width.")
    use_lora: bool = _f(False, "Train LoRA adapters instead of all weights (peft).")
    lora_r: int = _f(8, "LoRA rank.")
    lora_alpha: int = _f(16, "LoRA alpha.")
    lora_target_modules: str = _f(
        "q_proj,k_proj,v_proj,o_proj",
        "Comma-separated names of the modules that get LoRA adapters (the attention projections).",
    )
    # --- SFT warm start
    sft_steps: int = _f(600, "SFT steps on teacher demonstrations before RL (0: skip).")
    sft_batch_size: int = _f(64, "Demonstrations per SFT step.")
    sft_learning_rate: float = _f(1e-3, "SFT learning rate (AdamW).")
    # --- policy optimisation (TRL names)
    max_steps: int = _f(100, "RL steps (one rollout batch each).")
    prompts_per_step: int = _f(
        32,
        "Prompts (or episode seeds) per RL step; "
        "the batch holds prompts_per_step * num_generations rollouts.",
    )
    num_generations: int = _f(8, "G: rollouts sampled per prompt (the group).")
    learning_rate: float = _f(1e-4, "Policy learning rate (AdamW).")
    beta: float = _f(
        0.0, "KL coefficient. 0 (TRL's default) loads no reference model; DeepSeekMath used 0.04."
    )
    kl_estimator: str = _f(
        "k3", "KL estimator in the loss: 'k1', 'k2' or 'k3' (DeepSeekMath and TRL use k3)."
    )
    log_kl: bool = _f(
        False,
        "Keep pi_ref and log the KL to it even when beta = 0 (one extra forward pass per step, "
        "15-25 %% of a quick-profile step). Off: with beta = 0 no reference model is built, as "
        "in TRL; the GRPO lab asks for it, because the drift is one of its subjects.",
    )
    epsilon: float = _f(0.2, "Lower clip range: ratios below 1 - epsilon are clipped.")
    epsilon_high: float | None = _f(
        None, "Upper clip range (DAPO's clip-higher). None: equal to epsilon."
    )
    dual_clip: float | None = _f(
        None, "Dual-clip constant c > 1 for negative advantages (verl clip_ratio_c). None: off."
    )
    loss_type: str = _f(
        "grpo",
        "Loss aggregation: a verl mode (token-mean, seq-mean-token-mean, seq-mean-token-sum-norm, "
        "...) or a TRL loss_type alias (grpo, bnpo, dr_grpo, dapo). "
        "Default 'grpo' = DeepSeekMath eq. 3 (TRL's default is 'dapo').",
    )
    scale_rewards: str = _f(
        "group", "Advantage scaling: 'group' (GRPO), 'batch', or 'none' (Dr. GRPO)."
    )
    temperature: float = _f(
        1.0, "Sampling temperature (the log-probs of the loss use the same temperature)."
    )
    num_iterations: int = _f(
        1, "mu: passes (epochs) over each rollout batch (each reuses the same samples)."
    )
    num_minibatches: int = _f(
        1,
        "Minibatches per pass: each pass takes this many gradient steps on disjoint slices of "
        "the batch (PPO's minibatches; verl: train batch / ppo_mini_batch_size).",
    )
    max_grad_norm: float = _f(1.0, "Gradient clipping norm.")
    skip_prompt_logits: bool = _f(
        False,
        "Compute the loss's logits only from the first generated column on: the same log-probs, "
        "gradients equal up to float summation order, and no LM head over the prompt (on a "
        "pretrained model's 49k-word vocabulary, as costly as the transformer). Off by default so "
        "that the tiny-model labs stay bit-identical to their stored outputs.",
    )
    share_prompt_prefix: bool = _f(
        False,
        "Encode each prompt once for its G samples, in sampling and in the loss (the prompt's KV "
        "cache shared by its group): the same sampler and random draws as `generate`, and the "
        "same log-probs and gradients up to float summation order, with 41 %% fewer tokens "
        "through the transformer on the quick profile. Off by default only so that the labs stay "
        "bit-identical to their stored outputs (float-order differences grow over a run).",
    )
    bf16: bool = _f(
        False,
        "Mixed precision on a CUDA GPU that supports bfloat16: the forward passes of sampling and "
        "of the loss run under torch.autocast(bfloat16); weights, gradients and AdamW stay "
        "float32 (TRL's bf16=True). Ignored on the CPU, where runs stay float32. The GPU "
        "version of the full profile turns it on.",
    )
    entropy_coeff: float = _f(
        0.0,
        "Entropy bonus: the loss subtracts entropy_coeff times the mean entropy of the generated "
        "tokens (verl's entropy_coeff; RAGEN uses 0.001). 0: off, as TRL.",
    )
    # --- evaluation
    eval_size: int = _f(
        256, "Held-out problems (or episode seeds) for the before/after evaluation."
    )
    eval_samples: int = _f(
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
        return cls(**{**values, **overrides, "profile": profile})

    # ------------------------------------------------------------------ validation
    # Where it happens: ``validate()`` checks the config on its own (types, finite numbers, ranges,
    # cross-field rules). It runs at construction and again after every field assignment (see
    # ``__setattr__``; a rejected assignment is undone), so a config object is always valid. To
    # change coupled fields together, use ``dataclasses.replace(config, a=..., b=...)``.
    # ``check_environment()`` checks what depends on the machine (device, model folder or hub
    # access, output folder, memory); every run calls it before any compute (the trainer's
    # constructor, the CLI). A new recipe (a subclass) inherits all of it: its ``validate`` calls
    # ``super().validate()`` and adds its own rules with ``self._bad(name, why)``; the type of
    # every field, finite numbers and the re-validation on assignment come for free.

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
        """Raise :class:`ConfigError` (a ``ValueError``) naming the first invalid field."""
        bad = self._bad
        self._check_types()
        if self.profile not in self.PROFILES:
            bad("profile", f"unknown profile; choose one of {sorted(self.PROFILES)}")
        self._check_profile_applied()
        if not 0 <= self.seed < 2**32:
            bad("seed", "must be in [0, 2**32) (numpy's seed range)")
        if self.output_dir is not None and (not self.output_dir.strip() or "\0" in self.output_dir):
            bad("output_dir", "must be a folder name, or None to keep nothing on disk")
        if self.model_name_or_path is not None and not self.model_name_or_path.strip():
            bad("model_name_or_path", "must be a hub name or a folder, or None for the tiny model")
        targets = self.lora_target_modules.split(",")
        if not all(re.fullmatch(r"[A-Za-z_][\w]*", t) for t in targets):
            bad(
                "lora_target_modules",
                "must be comma-separated module names without spaces, e.g. 'q_proj,v_proj'",
            )
        self._at_least(
            (
                "num_generations",
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "intermediate_size",
                "lora_r",
                "lora_alpha",
            ),
            1,
        )
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
        for name in ("learning_rate", "sft_learning_rate", "temperature", "max_grad_norm"):
            if not getattr(self, name) > 0:
                bad(name, "must be positive")
        self._at_least(("max_steps", "sft_steps", "save_steps"), 0)
        self._at_least(
            (
                "prompts_per_step",
                "sft_batch_size",
                "num_iterations",
                "num_minibatches",
                "eval_size",
                "eval_samples",
            ),
            1,
        )
        rows = self.prompts_per_step * self.num_generations
        if self.num_minibatches > rows:
            bad(
                "num_minibatches",
                f"must be <= the rows of a batch (prompts_per_step * "
                f"num_generations = {rows}): a minibatch needs at least one rollout",
            )
        if self.beta < 0:
            bad("beta", "must be >= 0")
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

    def _check_profile_applied(self) -> None:
        # GRPOConfig(profile="full") alone would be labelled full but keep the quick model: refused.
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        values = {k: v for k, v in self.PROFILES[self.profile].items() if v != defaults[k]}
        if values and all(getattr(self, k) == defaults[k] for k in values):
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

    def _rough_memory_bytes(self) -> int:
        """A rough lower bound on training memory (weights, AdamW, activations) of the tiny model.

        Only used to refuse clearly impossible sizes: weights x 9 (policy, reference, gradient, two
        AdamW moments, and as much again for a critic) plus one layer-stack of activations for the
        larger of the SFT and RL batches, at the shortest sequence a rollout can have.
        """
        h, inter, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        kv = h // self.num_attention_heads * self.num_key_value_heads
        params = L * (2 * h * h + 2 * h * kv + 3 * h * inter) + 1000 * h
        batch = max(self.sft_batch_size, self.prompts_per_step * self.num_generations)
        tokens = batch * max(self.min_sequence_tokens(), 1)
        return 4 * (9 * params + tokens * L * (4 * h + 2 * inter))

    #: A recipe's fields that make sequences longer (blamed when memory is short).
    _size_fields: ClassVar[tuple[str, ...]] = ()

    def min_sequence_tokens(self) -> int:
        """The shortest sequence a rollout can have (a recipe says; for the memory estimate)."""
        return 1

    def check_environment(self) -> None:
        """Check what depends on the machine, before any compute; raise :class:`ConfigError`.

        The device exists; a pretrained model is a folder or reachable on the hub; the output folder
        can be created or written; and the model and batches roughly fit in the device's memory.
        """
        import os

        import torch

        self.validate()  # (already valid unless someone bypassed __setattr__; cheap)
        dev = self.device
        if dev.startswith("cuda"):
            if not torch.cuda.is_available():
                self._bad("device", "CUDA is not available on this machine; use 'auto' or 'cpu'")
            index = int(dev.split(":")[1]) if ":" in dev else 0
            if index >= torch.cuda.device_count():
                self._bad("device", f"this machine has {torch.cuda.device_count()} CUDA device(s)")
        mps = getattr(torch.backends, "mps", None)
        mps_ok = mps is not None and mps.is_available()
        if dev == "mps" and not mps_ok:
            self._bad("device", "MPS (Apple GPU) is not available here; use 'auto' or 'cpu'")
        name = self.model_name_or_path
        if name is not None:
            from .models import PACKAGED_MODELS, resolve_model

            if name in PACKAGED_MODELS:
                try:
                    name, _ = resolve_model(name)  # its installed folder
                except FileNotFoundError as err:
                    self._bad("model_name_or_path", str(err))
        if name is not None and not os.path.isdir(name):
            offline = any(
                os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
                for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
            )
            if os.path.exists(name):
                self._bad("model_name_or_path", "is a file; give a model folder or a hub name")
            if name.startswith((".", "/", "~")) or name.count("/") > 1:
                self._bad("model_name_or_path", "no such folder")
            if offline:
                self._bad(
                    "model_name_or_path",
                    "is not a local folder and HF_HUB_OFFLINE=1, so it "
                    "cannot be downloaded; save the model to a folder and pass the folder",
                )
        if self.output_dir is not None:
            self._check_output_dir(self.output_dir)
        if name is None:
            if dev.startswith("cuda") or (dev == "auto" and torch.cuda.is_available()):
                index = int(dev.split(":")[1]) if ":" in dev else 0
                total, where = torch.cuda.get_device_properties(index).total_memory, "GPU memory"
            else:
                total, where = _physical_memory(), "memory"
            need = self._rough_memory_bytes()
            if total and need > total:
                defaults = {f.name: f.default for f in dataclasses.fields(self)}
                sizes = (
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "prompts_per_step",
                    "num_generations",
                    "sft_batch_size",
                )
                # blame the most inflated size
                field = max(sizes + self._size_fields, key=lambda k: getattr(self, k) / defaults[k])
                self._bad(
                    field,
                    f"the model and batches need at least ~{need / 2**30:.1f} GiB, "
                    f"more than this machine's {total / 2**30:.1f} GiB of {where}",
                )

    def _check_output_dir(self, path: str) -> None:
        import os

        if os.path.exists(path):
            if not os.path.isdir(path):
                self._bad("output_dir", "exists and is not a folder")
            if not os.access(path, os.W_OK | os.X_OK):
                self._bad("output_dir", "is not writable")
            return
        parent = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            self._bad("output_dir", f"cannot be created: {parent} is a file")
        if not os.access(parent, os.W_OK | os.X_OK):
            self._bad("output_dir", f"cannot be created: {parent} is not writable")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class GRPOConfig(RLConfig):
    """GRPO on a single-turn verifiable task: SFT warm start, GRPO, before/after evaluation."""

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},  # the dataclass defaults
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
            skip_prompt_logits=True,
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
    task: str = _f("addition", "Task name (see agentic_rl.envs.TASKS).")
    digits: int = _f(2, "Addition and sums tasks: digits per operand.")
    teacher_error_rate: float = _f(
        0.5, "Fraction of SFT demonstrations with one wrong digit (the noisy teacher)."
    )
    format_weight: float = _f(
        0.1,
        "Weight of the format reward added to the 0/1 exact-match reward (sums: the bare number).",
    )
    max_completion_length: int = _f(8, "Maximum generated tokens per completion.")

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
        import random

        from .envs import make_task

        task = make_task(self.task, digits=self.digits)
        return len(task.sample(1, random.Random(0))[0].prompt.split()) + 1

    def min_sequence_tokens(self) -> int:
        return self.prompt_tokens() + 1


@dataclass
class PPOConfig(RLConfig):
    """PPO with a critic and GAE (or GRPO, for comparison) on a multi-turn text environment."""

    #: The environments this recipe's trainer can build.
    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("frozenlake",)
    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(
            map_size=6,
            max_turns=14,
            hidden_size=256,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1024,
            sft_steps=2000,
            sft_batch_size=64,
            max_steps=300,
            prompts_per_step=128,
            eval_size=512,
            max_action_tokens=3,
        ),
    }

    # --- defaults that differ from the GRPO recipe
    # (quick profile: a 125k-parameter model, ~1-2 minutes)
    hidden_size: int = _f(64, "Tiny model: hidden size.")
    num_hidden_layers: int = _f(2, "Tiny model: number of decoder layers.")
    intermediate_size: int = _f(256, "Tiny model: MLP width.")
    num_generations: int = _f(
        1,
        "Episodes per seed: 1 for PPO (the critic is the baseline); "
        ">= 2 (a group) for the grpo estimator.",
    )
    prompts_per_step: int = _f(
        32,
        "Episode seeds per RL step; the batch holds prompts_per_step * num_generations episodes.",
    )
    loss_type: str = _f(
        "token-mean", "Loss aggregation (see the GRPO recipe); PPO's usual token-mean by default."
    )
    num_minibatches: int = _f(
        4,
        "Minibatches per pass over the rollout batch: 4 gradient steps per batch by default "
        "(verl's default, 1 epoch of 4 minibatches); from the second, the ratio departs from 1 "
        "and clipping acts.",
    )
    sft_steps: int = _f(300, "SFT steps on demonstration episodes before RL (0: skip).")
    sft_batch_size: int = _f(32, "Demonstration episodes per SFT step.")
    max_steps: int = _f(60, "RL steps (one rollout batch each).")
    eval_size: int = _f(128, "Held-out episode seeds (maps) for the before/after evaluation.")
    # --- environment
    env: str = _f("frozenlake", "Environment name (see agentic_rl.envs.ENVS).")
    map_size: int = _f(
        4, "FrozenLake: the map is map_size x map_size, drawn at random per episode seed."
    )
    is_slippery: bool = _f(
        False, "FrozenLake: slippery ice (an action moves as intended only 1/3 of the time)."
    )
    p_frozen: float = _f(
        0.8, "FrozenLake: probability that a tile of a random map is frozen (not a hole)."
    )
    max_turns: int = _f(8, "Turn limit of an episode (the environment truncates at it).")
    demo_error_rate: float = _f(
        0.3,
        "Fraction of demonstration actions replaced by a random other action "
        "(mixed-quality SFT data).",
    )
    max_action_tokens: int = _f(3, "Maximum tokens the policy may generate in one turn.")
    # --- advantage estimation and the critic
    advantage_estimator: str = _f(
        "gae", "'gae' (PPO with a critic) or 'grpo' (group-relative, no critic)."
    )
    gamma: float = _f(1.0, "GAE discount over generated tokens, in [0, 1].")
    lam: float = _f(
        1.0, "GAE lambda, in [0, 1]: 0 is one-step TD, 1 is Monte Carlo minus the value baseline."
    )
    critic_learning_rate: float = _f(1e-3, "Critic learning rate (AdamW).")
    vf_coef: float = _f(
        1.0,
        "Weight of the value loss (the critic is a separate model, so it only scales its step).",
    )
    cliprange_value: float | None = _f(
        0.2, "Value clipping around the rollout-time values (verl cliprange_value). None: off."
    )
    whiten_advantages: bool = _f(
        True, "Whiten GAE advantages over the batch's generated tokens (verl, RAGEN)."
    )
    bootstrap_truncated: bool = _f(
        False,
        "Bootstrap truncated episodes from the critic (add gamma * V(s_T) to their last reward). "
        "Off by default: here the turn limit is part of the task, so running out of turns is "
        "terminal.",
    )

    def validate(self) -> None:
        super().validate()
        from .envs import ENVS

        if self.env not in ENVS:
            self._bad("env", f"unknown environment; known environments are {sorted(ENVS)}")
        if self.env not in self.RECIPE_ENVS:
            self._bad("env", f"this recipe runs {' or '.join(map(repr, self.RECIPE_ENVS))}")
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
        if self.map_size > 32:
            self._bad("map_size", "must be <= 32 (an observation holds map_size**2 tiles)")
        if not 0.0 < self.p_frozen <= 1.0:
            self._bad("p_frozen", "must be in (0, 1]")
        if not self.critic_learning_rate > 0:
            self._bad("critic_learning_rate", "must be positive")
        if self.cliprange_value is not None and self.cliprange_value <= 0:
            self._bad("cliprange_value", "must be positive (or none)")
        if self.vf_coef < 0:
            self._bad("vf_coef", "must be >= 0")
        # One turn's action must fit; whole episodes may run past the tiny model's 128 positions
        # (rotary embeddings have no table; the full profile's long episodes rely on it).
        self._check_positions("max_action_tokens", self.max_action_tokens)

    _size_fields: ClassVar[tuple[str, ...]] = ("map_size", "max_action_tokens")

    def min_sequence_tokens(self) -> int:
        # the first observation (the map, one token per tile and row separator) and one action
        return self.map_size * (self.map_size + 1) + 3 + self.max_action_tokens


@dataclass
class ReToolConfig(PPOConfig):
    """ReTool: code runs inside the rollout; the interpreter's output is masked out of the loss."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("multiply",)

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(
            digits_a=4,
            digits_b=3,
            max_action_tokens=14,
            max_output_tokens=10,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1024,
            sft_steps=1500,
            sft_batch_size=64,
            max_steps=300,
            prompts_per_step=64,
            eval_size=512,
        ),
    }

    # --- defaults that differ from the PPO recipe (quick profile: ~1 minute per run)
    env: str = _f("multiply", "Environment name (see agentic_rl.envs.ENVS).")
    advantage_estimator: str = _f(
        "grpo",
        "'grpo' (group-relative, as the verl ReTool recipe) or 'gae' (PPO with a critic, as the "
        "ReTool paper).",
    )
    num_generations: int = _f(8, "Episodes per problem (the GRPO group).")
    prompts_per_step: int = _f(16, "Problems per RL step.")
    num_minibatches: int = _f(
        2,
        "Minibatches per pass over the rollout batch (from the second, the ratio departs from 1).",
    )
    sft_steps: int = _f(400, "Cold-start SFT steps on synthetic traces before RL (0: skip).")
    max_steps: int = _f(40, "RL steps (one rollout batch each).")
    eval_size: int = _f(128, "Held-out problems for the before/after evaluation.")
    max_turns: int = _f(
        3,
        "Segments of policy text per episode; a tool call ends a segment, so the tool budget "
        "is max_turns - 1 calls.",
    )
    max_action_tokens: int = _f(10, "Maximum tokens of one segment of policy text.")
    demo_error_rate: float = _f(
        0.15,
        "Fraction of the cold-start tool traces whose code miscopies a digit (a consistent but "
        "wrong trace).",
    )
    demo_retry_rate: float = _f(
        0.0,
        "Fraction of the cold-start tool traces whose first snippet is a syntax error, followed "
        "by a correct retry (correct traces with a tool error: the GRPO-RoC demonstration).",
    )
    # --- the task and the tool
    digits_a: int = _f(3, "Digits of the first factor.")
    digits_b: int = _f(2, "Digits of the second factor.")
    sft_tool_fraction: float = _f(
        0.5, "Fraction of cold-start traces that use the tool (the rest answer directly)."
    )
    mask_interpreter: bool = _f(
        True,
        "Interpreter feedback mask: no loss on interpreter tokens (ReTool). False is the "
        "ablation: they are trained as if the policy had written them.",
    )
    max_output_tokens: int = _f(8, "Interpreter output longer than this is cut and marked '...'.")
    tool_error_rate: float = _f(
        0.0, "Probability that a tool call fails without running (the GRPO-RoC demonstration)."
    )
    tool_timeout_s: float = _f(1.0, "Sandbox: wall-clock limit per snippet, in seconds.")
    tool_memory_mb: int = _f(256, "Sandbox: address-space limit per snippet, in MiB.")
    tool_workers: int = _f(2, "Sandbox pool: snippets run concurrently.")
    resample_on_correct: bool = _f(
        False,
        "GRPO-RoC: sample 2 * num_generations episodes per problem, keep num_generations "
        "(positives with the fewest tool errors, negatives at random).",
    )
    grad_share_every: int = _f(
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
        if not self.tool_timeout_s > 0:
            self._bad("tool_timeout_s", "must be positive")
        self._at_least(("max_output_tokens", "tool_workers"), 1)
        self._at_least(("tool_memory_mb",), 32)
        self._at_least(("grad_share_every",), 0)
        if self.resample_on_correct and self.advantage_estimator != "grpo":
            self._bad("resample_on_correct", "is a GRPO method: use advantage_estimator 'grpo'")
        # the answer segment: <answer>, the product's digits, </answer>, EOS
        need = self.digits_a + self.digits_b + 3
        if self.max_action_tokens < need:
            self._bad("max_action_tokens", f"must be >= {need} to write the answer")
        # prompt, every segment, and an interpreter block (with its "...") after each tool call
        tokens = self.digits_a + self.digits_b + 3 + self.max_turns * self.max_action_tokens
        self._check_positions(
            "max_turns", tokens + (self.max_turns - 1) * (self.max_output_tokens + 3)
        )

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "max_turns")

    def min_sequence_tokens(self) -> int:
        # the prompt and one answer segment
        return self.digits_a + self.digits_b + 3 + self.max_action_tokens


@dataclass
class StarPOConfig(PPOConfig):
    """RAGEN's StarPO and StarPO-S: whole multi-turn trajectories, and an uncertainty filter."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("bandit", "frozenlake", "sokoban")

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(
            env="sokoban",
            map_size=4,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1024,
            sft_steps=1500,
            max_steps=200,
            eval_size=256,
        ),
    }
    #: StarPO-S and its three parts (RAGEN section 4.2); the dataclass defaults are vanilla StarPO.
    #: ``from_profile(..., preset="starpo-s")`` fills the fields you do not set with these.
    PRESETS: ClassVar[dict[str, dict]] = {
        "starpo": {},
        "starpo-s": dict(rollout_filter="top_k", filter_value=0.25, beta=0.0, epsilon_high=0.28),
    }

    preset: str = _f(
        "starpo",
        "'starpo' (no filter, KL k1 at 0.001, symmetric clip) or 'starpo-s' (keep the top "
        "quarter of groups by reward std, no KL, clip-higher 0.28). Fields you set override the "
        "preset: that is how the ablation removes one part at a time.",
    )
    # --- defaults that differ from the PPO recipe: RAGEN's settings, scaled down
    env: str = _f("bandit", "Environment: 'bandit', 'frozenlake' or 'sokoban'.")
    advantage_estimator: str = _f(
        "grpo",
        "'grpo' (StarPO-GRPO, eqs. 5-6) or 'gae' (StarPO-PPO with a critic, RAGEN's default).",
    )
    num_generations: int = _f(16, "N: trajectories per initial state (RAGEN: 16).")
    prompts_per_step: int = _f(8, "P: initial states (episode seeds) per RL step (RAGEN: 8).")
    mini_batch_size: int = _f(
        32,
        "Trajectories per gradient step (RAGEN's ppo_mini_batch_size 32): a batch of P * N rows "
        "takes ceil(rows / 32) steps, so a filter that keeps fewer rows takes fewer steps.",
    )
    beta: float = _f(0.001, "KL coefficient (vanilla StarPO: 0.001 with k1; StarPO-S: 0).")
    kl_estimator: str = _f("k1", "KL estimator in the loss (StarPO: 'k1', logp - ref_logp).")
    entropy_coeff: float = _f(0.001, "Entropy bonus (RAGEN: 0.001).")
    learning_rate: float = _f(1e-4, "Policy learning rate (AdamW).")
    sft_steps: int = _f(200, "SFT steps on demonstrations before RL (0: skip).")
    max_steps: int = _f(60, "RL steps (one rollout batch each).")
    demo_error_rate: float = _f(
        0.5,
        "Fraction of demonstration actions replaced by another action (a weak start leaves "
        "room for RL).",
    )
    is_slippery: bool = _f(
        True, "FrozenLake: slippery ice (RAGEN: on; the intended move 1/3 of the time)."
    )
    map_size: int = _f(
        3,
        "FrozenLake: side of the random lakes (RAGEN: 4). 3 keeps a CPU run learnable: the best "
        "policy reaches the goal within 10 slippery actions 40 %% of the time on 3 x 3 lakes, "
        "10 %% on 4 x 4.",
    )
    max_turns: int = _f(5, "Turns per episode (RAGEN: 5).")
    max_action_tokens: int = _f(
        4, "Maximum tokens of one turn (actions, separators and the stop word)."
    )
    # --- the environment
    max_actions_per_turn: int = _f(
        2, "Actions one turn may name, joined by '||' (RAGEN: 5). 1: one action per turn."
    )
    max_actions: int = _f(10, "Actions per episode (RAGEN: 10); the grid env's time limit.")
    format_penalty: float = _f(
        0.1, "Cost of a turn with an invalid action (RAGEN: 0.1); the episode goes on."
    )
    bandit_payoffs: str = _f(
        "paper", "Bandit: the phoenix pays 0.15 ('paper', App. B.1) or 0.1 ('code')."
    )
    room_size: int = _f(6, "Sokoban: side of the room, walls included (RAGEN: 6).")
    # --- the filter stage
    rollout_filter: str = _f(
        "none",
        "Which groups enter the update: 'none'; 'top_k' / 'top_p' (RAGEN's reward-std filter, "
        "filters.reward_std_filter); 'dynamic' (DAPO: drop groups whose rewards are all equal "
        "and sample more groups to refill the batch).",
    )
    filter_value: float = _f(
        0.25, "top_k: fraction of groups kept (RAGEN: 0.25); top_p: share of the total std."
    )
    filter_include_zero: bool = _f(
        True, "Let the reward-std filter keep groups with zero std (RAGEN's original: yes)."
    )
    max_sample_rounds: int = _f(
        4, "Dynamic sampling: at most this many rollout rounds per step to refill the batch."
    )

    @classmethod
    def from_profile(cls, profile: str = "quick", **overrides):
        preset = overrides.get("preset", "starpo")
        if preset not in cls.PRESETS:
            raise ConfigError(
                "preset", f"unknown preset; choose one of {sorted(cls.PRESETS)}", preset
            )
        return super().from_profile(profile, **{**cls.PRESETS[preset], **overrides})

    def validate(self) -> None:
        super().validate()
        if self.preset not in self.PRESETS:
            self._bad("preset", f"unknown preset; choose one of {sorted(self.PRESETS)}")
        if self.rollout_filter not in ("none", "top_k", "top_p", "dynamic"):
            self._bad("rollout_filter", "must be 'none', 'top_k', 'top_p' or 'dynamic'")
        if not 0.0 < self.filter_value <= 1.0:
            self._bad("filter_value", "must be in (0, 1]")
        if self.bandit_payoffs not in ("paper", "code"):
            self._bad("bandit_payoffs", "must be 'paper' or 'code'")
        if self.format_penalty < 0:
            self._bad("format_penalty", "must be >= 0 (it is subtracted)")
        self._at_least(("max_actions_per_turn", "max_actions", "mini_batch_size"), 1)
        self._at_least(("max_sample_rounds",), 1)
        if not 5 <= self.room_size <= 10:
            self._bad("room_size", "must be between 5 and 10 (a 2 x 2 inside has only corners)")
        if self.rollout_filter in ("top_k", "top_p", "dynamic") and self.num_generations < 2:
            self._bad("num_generations", "a group filter needs groups of at least 2")
        # each action is one token, separators too, and the stop word closes the turn
        need = 2 * (1 if self.env == "bandit" else self.max_actions_per_turn)
        if self.max_action_tokens < need:
            self._bad("max_action_tokens", f"must be >= {need} to write a whole turn")
        self._check_preset_applied()

    def _check_preset_applied(self) -> None:
        # StarPOConfig(preset="starpo-s") alone would be labelled StarPO-S but run StarPO: refused.
        preset = self.PRESETS[self.preset]
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        if preset and all(getattr(self, k) == defaults[k] for k in preset):
            self._bad(
                "preset",
                f"the {self.preset!r} preset's values are not applied; use "
                f"StarPOConfig.from_profile(..., preset={self.preset!r}) or --preset {self.preset}",
            )

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "room_size")

    def min_sequence_tokens(self) -> int:
        grid = {"bandit": 2, "frozenlake": self.map_size**2, "sokoban": self.room_size**2}
        side = {"bandit": 0, "frozenlake": self.map_size, "sokoban": self.room_size}
        return grid[self.env] + side[self.env] + 3 + self.max_action_tokens


@dataclass
class GroupAgentConfig(PPOConfig):
    """Defaults shared by the group-relative agent recipes (RC-GRPO, GCD): GRPO on a multi-turn
    environment, G = 8 episodes per task, one on-policy gradient step per batch. Not a recipe."""

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1024,
            sft_steps=1500,
            max_steps=200,
            prompts_per_step=32,
            eval_size=256,
        ),
    }

    # --- defaults that differ from the PPO recipe
    advantage_estimator: str = _f("grpo", "Group-relative: 'grpo' only.")
    num_generations: int = _f(8, "G: rollouts per task (the group).")
    prompts_per_step: int = _f(8, "Tasks (episode seeds) per RL step.")
    num_minibatches: int = _f(1, "Gradient steps per rollout batch (1: on-policy, as GRPO).")
    loss_type: str = _f("grpo", "Loss aggregation (see the GRPO recipe).")
    log_kl: bool = _f(False, "Keep pi_ref only to log the KL (off: one forward pass less).")
    learning_rate: float = _f(3e-4, "Policy learning rate (AdamW).")
    eval_size: int = _f(64, "Held-out tasks (episode seeds) for the before/after evaluation.")

    def validate(self) -> None:
        super().validate()
        if self.advantage_estimator != "grpo":
            self._bad("advantage_estimator", "this recipe is group-relative: use 'grpo'")


@dataclass
class RCGRPOConfig(GroupAgentConfig):
    """RC-GRPO: reward-conditioned rollouts (RCTP, then GRPO with a reward token per rollout)."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("filesystem",)

    # --- defaults that differ from the group-relative agent recipes'
    env: str = _f("filesystem", "Environment: 'filesystem' (BFCL-style tool calls).")
    sft_steps: int = _f(400, "Warm-start steps (SFT or RCTP, see warm_start) before RL.")
    sft_learning_rate: float = _f(
        3e-3, "Warm-start learning rate (the copying of names is learned at about 300 steps)."
    )
    max_steps: int = _f(50, "RL steps (one rollout batch each).")
    max_turns: int = _f(5, "Calls per episode, 'done' included (the hard tasks need 4).")
    max_action_tokens: int = _f(4, "Tokens of one call: the name, two arguments, the stop word.")
    demo_error_rate: float = _f(
        0.5,
        "Fraction of warm-start trajectories that are corrupted (a wrong argument, a skipped, "
        "swapped or extra call): 0.5 gives RCTP its 1:1 mix. SFT keeps only the successful ones.",
    )
    # --- the environment
    hard_fraction: float = _f(
        0.5, "Fraction of tasks from the hard family (a folder first, 2-3 calls)."
    )
    demo_hard_fraction: float | None = _f(
        0.05,
        "Fraction of hard tasks among the warm-start trajectories (None: hard_fraction). "
        "Small values leave the hard family mostly unlearned after the warm start.",
    )
    # --- reward conditioning
    warm_start: str = _f(
        "rctp",
        "'sft': imitate the successful warm-start trajectories, no reward token; 'rctp': "
        "imitate all of them, each with its reward token in the prompt (RCTP).",
    )
    conditioning: str = _f(
        "mixed",
        "Reward token of the RL rollouts: 'mixed' (RC-GRPO: drawn per rollout), 'high' (always "
        "high_token: GRPO on a reward-conditioned policy) or 'none' (plain GRPO).",
    )
    token_assignment: str = _f(
        "bernoulli",
        "How 'mixed' draws the tokens of a group: 'bernoulli' (each rollout high with "
        "probability p_high) or 'split' (round(p_high * G) high per group). The paper's choice "
        "is unknown.",
    )
    p_high: float = _f(0.5, "Probability (or share) of high_token in a group, in (0, 1).")
    high_token: str = _f("<|high_reward|>", "The special token that asks for a successful episode.")
    low_token: str = _f("<|low_reward|>", "The special token that asks for a failed episode.")

    def validate(self) -> None:
        super().validate()
        if self.warm_start not in ("sft", "rctp"):
            self._bad("warm_start", "must be 'sft' or 'rctp'")
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
        from .envs import FileSystemEnv

        self._check_new_tokens(("high_token", "low_token"), FileSystemEnv().vocabulary())

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "max_turns")

    def min_sequence_tokens(self) -> int:
        # the reward token, the task's first observation (at most 14 words) and one call
        return 1 + 14 + self.max_action_tokens


@dataclass
class GCDConfig(GroupAgentConfig):
    """GRPO with GCD: the actor also learns to judge its own actions good or bad."""

    RECIPE_ENVS: ClassVar[tuple[str, ...]] = ("household",)

    PROFILES: ClassVar[dict[str, dict]] = {
        "quick": {},
        "full": dict(GroupAgentConfig.PROFILES["full"], num_probes=64),
    }

    # --- defaults that differ from the group-relative agent recipes'
    env: str = _f("household", "Environment: 'household' (ALFWorld-style tasks).")
    sft_steps: int = _f(500, "SFT steps on the mixed-quality teacher's episodes before RL.")
    sft_learning_rate: float = _f(3e-3, "SFT learning rate.")
    max_steps: int = _f(30, "RL steps (one rollout batch each).")
    eval_size: int = _f(64, "Held-out tasks per split (in domain and out of domain).")
    max_turns: int = _f(8, "Cap on an episode's turns (each task's budget: its plan + slack).")
    max_action_tokens: int = _f(5, "Tokens of one action: 'take mug from table' and the stop word.")
    demo_error_rate: float = _f(
        0.1,
        "Per turn, the chance that the SFT teacher takes a flawed action (then recovers): the "
        "flawed actions that RL has to unlearn.",
    )
    # --- the environment
    clean_fraction: float = _f(0.5, "Share of 'put clean O in T' goals (6 actions; 'put': 4).")
    slack: int = _f(2, "Turns of each task's budget beyond the optimal plan.")
    hint: bool = _f(
        False,
        "Prompt-based correction: the first observation ends with 'hint : avoid ...', naming the "
        "receptacles that are not the target.",
    )
    # --- GCD
    judge_weight: float = _f(
        0.1,
        "lambda: weight of the judgement loss (generative classification of each action as good "
        "or bad); 0 is plain GRPO on the same task.",
    )
    judge_labels: str = _f(
        "outcome",
        "Label of each action for the judgement: 'outcome' (the episode's success), 'advantage' "
        "(the sign of its GRPO advantage; 0: no label) or 'oracle' (the environment's own "
        "flawed-action flag, which the paper does not have). The paper's rule is unknown.",
    )
    good_token: str = _f("<|good|>", "The special token of the judgement 'good'.")
    bad_token: str = _f("<|bad|>", "The special token of the judgement 'bad'.")
    coupling_every: int = _f(
        10, "Measure gradient coupling on the probe pairs every this many RL steps (0: off)."
    )
    num_probes: int = _f(16, "Probe pairs (one action, good in one state, flawed in another).")

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
        if not (self.judge_weight >= 0 and math.isfinite(self.judge_weight)):
            self._bad("judge_weight", "must be >= 0 and finite")
        if self.judge_labels not in ("outcome", "advantage", "oracle"):
            self._bad("judge_labels", "must be 'outcome', 'advantage' or 'oracle'")
        if self.coupling_every < 0:
            self._bad("coupling_every", "must be >= 0 (0: off)")
        if self.num_probes < 1:
            self._bad("num_probes", "must be >= 1")
        from .envs import HouseholdEnv

        self._check_new_tokens(("good_token", "bad_token"), HouseholdEnv().vocabulary())

    _size_fields: ClassVar[tuple[str, ...]] = ("max_action_tokens", "max_turns")

    def min_sequence_tokens(self) -> int:
        # the first observation (at most 37 words with the hint) and one action
        return 38 + self.max_action_tokens


#: The GRPO recipe's profiles (kept as a module name for convenience).
PROFILES = GRPOConfig.PROFILES


# --------------------------------------------------------------------------------------------------
# A CLI from the dataclass: one flag per field, help from the field's doc.


def _parse_bool(text: str) -> bool:
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false (got {text!r})")


def _parse_number(kind):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            why = f"must be {_TYPE_WORDS[kind]} (got {text!r})"
            raise argparse.ArgumentTypeError(why) from None

    parse.__name__ = kind.__name__
    return parse


def _optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "null") else kind(text)

    parse.__name__ = kind.__name__
    return parse


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line: ``error: <field>: <why> (got X)`` and exit status 2."""

    def error(self, message: str):
        m = re.match(r"argument --([\w-]+)(?:/-\w)?: (.*)", message, re.S)
        if m:
            message = f"{m.group(1).replace('-', '_')}: {m.group(2)}"
        self.exit(2, f"error: {' '.join(message.split())}\n")


def add_dataclass_arguments(
    parser: argparse.ArgumentParser, cls, defaults: dict | None = None
) -> None:
    """One ``--field-name`` flag per dataclass field, typed, with the field's help text."""
    defaults = defaults or {}
    types = cls._field_types()
    for f in dataclasses.fields(cls):
        base, optional = types[f.name]
        parsers = {
            bool: _parse_bool,
            int: _parse_number(int),
            float: _parse_number(float),
            str: str,
        }
        kind = parsers[base]
        if optional:
            kind = _optional(kind)
        default = defaults.get(f.name, f.default)
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=kind,
            default=argparse.SUPPRESS,
            metavar=base.__name__.upper(),
            help=f"{f.metadata.get('help', '')} [default: {default}]",
        )


def config_from_args(cls, argv: list[str] | None, prog: str):
    """Parse ``argv`` into ``cls.from_profile(profile, **given flags)``.

    A bad flag or value exits with status 2 and one line, ``error: <field>: <why> (got X)``.
    """
    pre = _Parser(add_help=False, prog=prog)
    pre.add_argument("--profile", default="quick")
    known, _ = pre.parse_known_args(argv)
    if known.profile not in cls.PROFILES:
        choices = sorted(cls.PROFILES)
        pre.error(f"profile: unknown profile; choose one of {choices} (got {known.profile!r})")
    parser = _Parser(prog=prog, description=cls.__doc__)
    add_dataclass_arguments(parser, cls, cls.PROFILES[known.profile])
    given = vars(parser.parse_args(argv))
    given.pop("profile", None)
    try:
        return cls.from_profile(known.profile, **given)
    except ValueError as err:
        parser.error(str(err))
