"""Checkpoint files that cannot run code, and a trainer's state in them.

File format (version 2): one ASCII header line, then the bytes of ``torch.save(state)``::

    AGENTIC-RL-CHECKPOINT 1 sha256=<64 hex digits> bytes=<payload length>\\n
    <payload>

Loading reads the header, checks the length and the SHA-256 of the payload, and only then unpickles
it with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists, tuples and dicts,
nothing that can import or call anything. So a corrupt, truncated, foreign or malicious file stops
with :class:`CheckpointError` (which file, what is wrong, what to do) before any of its objects is
built, and nothing is deleted. The state must therefore hold plain types only (the trainer stores
numpy's RNG state as a tensor, for example).

Writing is atomic, and one run at a time holds an output folder: :mod:`agentic_rl.outdir`
(:func:`write_atomically`, :data:`OUTPUT_NAMES`, :func:`run_lock`, re-exported here).

A trainer's state (:data:`STATE_KEYS`) holds its RNG streams as plain types (:func:`rng_state`,
:func:`set_rng_state`); :func:`check_resumable` says whether a config may continue it (its config,
and its contents: :func:`check_contents`), :func:`check_world_size` whether this many ranks may,
and :func:`restore` continues a trainer from it.

Versions: 2 names the RL phase ``"rl"`` (version 1 called it ``"grpo"``, whatever the recipe);
a version-1 file is refused with what to do.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import stat
from contextlib import contextmanager

from .errors import ConfigError, RunError
from .outdir import (
    CHECKPOINT,
    LOCK_FILE,
    OUTPUT_NAMES,
    OutputFileError,
    RunLockedError,
    _kind,
    check_output_name,
    check_output_names,
    check_unlocked,
    csv_bytes,
    run_lock,
    write_atomically,
    write_csv,
)

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "ConfigMismatchError",
    "save",
    "load",
    "RESUMABLE_CHANGES",
    "STATE_KEYS",
    "rng_state",
    "set_rng_state",
    "state_of",
    "check_resumable",
    "check_contents",
    "restore",
    "scaler_state",
    "check_world_size",
    "policy_state",
    "load_policy_state",
    # re-exported from .outdir (the output folder)
    "CHECKPOINT",
    "LOCK_FILE",
    "OUTPUT_NAMES",
    "OutputFileError",
    "RunLockedError",
    "check_output_name",
    "check_output_names",
    "check_unlocked",
    "csv_bytes",
    "run_lock",
    "write_atomically",
    "write_csv",
]

MAGIC = b"AGENTIC-RL-CHECKPOINT"
FORMAT_VERSION = 2
#: What changed since each older format, for the message that refuses it.
_OLD_FORMATS = {1: "format 1 called the RL phase 'grpo'; format 2 calls it 'rl'"}
#: Config fields a resumed run may change (everything else must match the checkpoint's config).
RESUMABLE_CHANGES = ("output_dir", "resume", "max_steps", "save_steps", "disable_tqdm", "device")
#: What every trainer's checkpoint holds (a subclass adds its own keys: a critic).
STATE_KEYS = (
    "phase", "step", "model", "optimizer", "ref_model", "rng", "sft_history", "history",
    "evals", "wall_time", "config",
)  # fmt: skip
_HEADER = re.compile(rb"AGENTIC-RL-CHECKPOINT (\d+) sha256=([0-9a-f]{64}) bytes=(\d+)\n")
_WHAT_TO_DO = (
    "Nothing was deleted. To start this run over, move the file away (or run with --resume "
    "false, which overwrites it); or use another --output-dir."
)


class CheckpointError(RunError):
    """A checkpoint file that cannot be used: ``path`` says which."""

    def __init__(self, path: str, problem: str, advice: str = _WHAT_TO_DO):
        self.path = path
        super().__init__(f"checkpoint {path}: {problem}. {advice}")


class ConfigMismatchError(CheckpointError, ValueError):
    """The config differs from the one the checkpoint was written with.

    ``differences`` maps each differing field to ``(value in the checkpoint, value now)``.
    """

    def __init__(self, path: str, differences: dict[str, tuple]):
        self.differences = differences
        shown = "; ".join(
            f"{k}: {old!r} in the checkpoint (got {new!r})" for k, (old, new) in differences.items()
        )
        super().__init__(
            path,
            f"it was written with a different config: {shown}",
            "Resume with the checkpoint's values, use another --output-dir, or --resume "
            "false to start over (this overwrites the checkpoint).",
        )


def save(state: dict, path: str) -> None:
    """Write ``state`` atomically in the checkpoint format (header: version, length and hash)."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getbuffer()
    digest = hashlib.sha256(payload).hexdigest()
    header = b"%s %d sha256=%s bytes=%d\n" % (MAGIC, FORMAT_VERSION, digest.encode(), len(payload))
    write_atomically(path, header, payload)


def load(path: str, map_location=None) -> dict:
    """Verify and load a checkpoint written by :func:`save`; else raise :class:`CheckpointError`.

    Nothing in the file is unpickled before its header, length and SHA-256 check out, and then only
    with ``weights_only=True``.
    """
    import pickle

    import torch

    try:
        # O_NONBLOCK: a FIFO in the file's place is refused below instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise CheckpointError(path, f"is {_kind(mode)}, not a regular file")
            first = fh.readline(200)
            m = _HEADER.fullmatch(first)
            if not m:
                kind = (
                    "an older agentic_rl checkpoint or another file"
                    if not first.startswith(MAGIC)
                    else "a bad header"
                )
                raise CheckpointError(
                    path,
                    f"not an agentic_rl checkpoint of format {FORMAT_VERSION} "
                    f"(no valid header: {kind}); it was not loaded",
                )
            version, digest, size = int(m.group(1)), m.group(2).decode(), int(m.group(3))
            if version != FORMAT_VERSION:
                change = _OLD_FORMATS.get(version, "")
                raise CheckpointError(
                    path,
                    f"checkpoint format {version}; this agentic_rl reads format {FORMAT_VERSION}"
                    + (f" ({change})" if change else ""),
                    "Use the agentic_rl version that wrote it, or "
                    "another --output-dir. " + _WHAT_TO_DO,
                )
            # the file's own size first: a header may claim 10**15 bytes, too many to allocate
            held = os.fstat(fd).st_size - len(first)
            payload = fh.read(size + 1) if held == size else None
    except OSError as err:
        raise CheckpointError(path, f"cannot be read ({err.strerror or err})") from None
    if payload is None or len(payload) != size:
        got = held if payload is None else len(payload)
        raise CheckpointError(
            path,
            f"is truncated or has extra bytes ({got} payload bytes, the header says {size}): a "
            "copy or a write was cut short",
        )
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError(
            path, "is corrupt: its content does not match the SHA-256 in its header"
        )
    try:
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    except (
        pickle.UnpicklingError,
        RuntimeError,
        ValueError,
        TypeError,
        AttributeError,
        EOFError,
    ) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            path,
            f"holds objects a checkpoint never holds, refused without running "
            f"them ({first_line[:200]})",
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(path, "does not hold a checkpoint dictionary")
    return state


# ---------------------------------------------------------------------- a trainer's state
def rng_state(problem_rng: random.Random) -> dict:
    """Every RNG stream as plain types and tensors (numpy's key array becomes a tensor)."""
    import numpy as np
    import torch

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


def set_rng_state(rng: dict, problem_rng: random.Random) -> None:
    """Restore what :func:`rng_state` saved (the task stream into ``problem_rng``)."""
    import numpy as np
    import torch

    random.setstate(rng["python"])
    n = rng["numpy"]
    keys = n["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(rng["torch"].cpu())
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.cpu() for t in rng["cuda"]])
    problem_rng.setstate(rng["problems"])


#: Config fields every checkpoint's config has held (a field added later is compared as its
#: default, which is what a run written before it used).
_CORE_FIELDS = ("profile", "seed", "max_steps", "learning_rate")


def check_resumable(config, state: dict, path: str) -> None:
    """Raise a named error unless ``config`` can continue the run in ``state`` (a checkpoint).

    ``CheckpointError`` if it is not a training checkpoint or its parts disagree
    (:func:`check_contents`); ``ConfigMismatchError`` listing each differing field (the
    checkpoint's value and yours) unless only ``RESUMABLE_CHANGES`` differ; ``ConfigError`` on
    ``max_steps`` if the checkpoint has already done more RL steps.
    """
    import dataclasses

    missing = [k for k in STATE_KEYS if k not in state]
    if missing or not isinstance(state["config"], dict):
        lacks = missing or ["config"]
        raise CheckpointError(path, f"is not a training checkpoint (it lacks {lacks})")
    lacks = [k for k in _CORE_FIELDS if k not in state["config"]]
    if lacks:
        raise CheckpointError(path, f"is not a training checkpoint (its config lacks {lacks})")
    mine = config.to_dict()
    saved = {f.name: f.default for f in dataclasses.fields(config)}  # (fields added since)
    saved.update(state["config"])
    diffs = {
        k: (v, mine.get(k, "<no such field>"))
        for k, v in sorted(saved.items())
        if k not in RESUMABLE_CHANGES and mine.get(k) != v
    }
    if diffs:
        raise ConfigMismatchError(path, diffs)
    check_contents(state, config, path)
    if state["phase"] == "rl" and state["step"] > config.max_steps:
        why = (
            f"the checkpoint {path} has already done {state['step']} RL steps; ask for at least "
            "that many, or --resume false to start over"
        )
        raise ConfigError("max_steps", why, config.max_steps)


def check_contents(state: dict, config, path: str) -> None:
    """The parts of a checkpoint agree with each other and with ``config``: the phase and step
    with the histories and evaluations, RNG states that restore, finite weights; else
    :class:`CheckpointError` (one line, before anything is restored)."""
    import math

    def bad(why: str):
        raise CheckpointError(path, f"has contents that do not fit together: {why}")

    phase, step = state["phase"], state["step"]
    if phase not in ("sft", "rl"):
        bad(f"phase {phase!r} is neither 'sft' nor 'rl'")
    if type(step) is not int or step < 0:
        bad(f"step {step!r} is not a number of steps")
    if phase == "sft" and step > config.sft_steps:
        bad(f"SFT step {step} is past sft_steps ({config.sft_steps})")
    for key in ("sft_history", "history"):
        rows = state[key]
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            bad(f"{key} is not a list of rows")
        for i, row in enumerate(rows):  # (rows go to metrics.csv and the summary as numbers)
            for name, value in row.items():
                if not isinstance(name, str) or not isinstance(value, (int, float, type(None))):
                    bad(f"{key}[{i}][{name!r}] is {type(value).__name__}, not a number")
    rows = state["history" if phase == "rl" else "sft_history"]
    if len(rows) != step:
        bad(f"{phase} step {step} with {len(rows)} rows of {phase} history")
    evals = state["evals"]
    if not isinstance(evals, dict) or not set(evals) <= {"before", "after"}:
        bad("evals is not a dict of the 'before' and 'after' evaluations")
    if phase == "sft" and (evals or state["history"]):
        bad("RL history or evaluations while SFT is not finished")
    wall = state["wall_time"]
    if type(wall) not in (int, float) or not (math.isfinite(wall) and wall >= 0):
        bad(f"wall_time {wall!r} is not a number of seconds")
    rngs = state.get("rank_rng", [state["rng"]])
    if not isinstance(rngs, list):
        bad("rank_rng is not a list of RNG states")
    for rng in rngs:
        _check_rng(rng, bad)
    _check_tensors(state["model"], "model", bad)
    if state["ref_model"] is not None and not isinstance(state["ref_model"], str):
        _check_tensors(state["ref_model"], "ref_model", bad)
    elif state["ref_model"] not in (None, "adapters_off"):
        bad(f"ref_model {state['ref_model']!r} is not a model's weights")
    optimizer = state["optimizer"]
    if not isinstance(optimizer, dict) or not {"state", "param_groups"} <= set(optimizer):
        bad("optimizer is not an optimizer's state")
    if not isinstance(state.get("scaler", {}), dict):
        bad("scaler is not a gradient scaler's state")


def _check_rng(rng, bad) -> None:
    """Restore the RNG streams into throwaway generators: any that does not restore is refused."""
    import numpy as np
    import torch

    try:
        random.Random().setstate(rng["python"])
        random.Random().setstate(rng["problems"])
        n = rng["numpy"]
        keys = n["keys"].cpu().numpy().astype(np.uint32)
        state = (n["name"], keys, n["pos"], n["has_gauss"], n["cached_gaussian"])
        np.random.RandomState().set_state(state)
        torch.Generator().set_state(rng["torch"].cpu())
        if rng["cuda"] is not None and not isinstance(rng["cuda"], (list, tuple)):
            raise TypeError("cuda is not a list of states")
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError) as err:
        bad(f"its RNG state does not restore ({type(err).__name__}: {_first_line(err)})")


def _check_tensors(weights, what: str, bad) -> None:
    import torch

    if not isinstance(weights, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()
    ):
        bad(f"{what} is not a dict of tensors")
    for name, tensor in weights.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad(f"{what} weight {name} is not finite (NaN or inf)")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


@contextmanager
def _part(path: str, what: str):
    """A part of a checkpoint that does not fit this run's model or optimizer: one line."""
    try:
        yield
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, IndexError) as err:
        why = f"its {what} does not fit this run ({type(err).__name__}: {_first_line(err)})"
        raise CheckpointError(path, why) from None


def state_of(trainer, rngs: list[dict]) -> dict:
    """``trainer``'s state, as :func:`save` writes it and :func:`restore` reads it back:
    :data:`STATE_KEYS` (weights, optimizer, pi_ref, RNG streams, histories, evaluations, wall
    time, config), an fp16 run's gradient scaler and a recipe's ``extra_state()``. ``rngs``:
    every rank's :func:`rng_state` (one process: one), gathered on rank 0, which writes."""
    from .models import AdaptersOff

    ref = trainer.ref_model
    state = {
        "phase": trainer.phase,
        "step": trainer.step,
        "model": policy_state(trainer.model, lora=trainer.config.use_lora),
        "optimizer": trainer.optimizer.state_dict(),
        "ref_model": (
            "adapters_off"
            if isinstance(ref, AdaptersOff)
            else (None if ref is None else ref.state_dict())
        ),
        "rng": rngs[0],
        "sft_history": trainer.sft_history,
        "history": trainer.history,
        "evals": trainer.evals,
        "wall_time": trainer.wall_time,
        "config": trainer.config.to_dict(),
        **scaler_state(trainer.scaler),  # fp16 runs only
        **trainer.extra_state(),
    }
    if len(rngs) > 1:
        state["rank_rng"] = rngs  # rank r's streams, to resume on as many ranks
    return state


def restore(trainer, state: dict, path: str) -> None:
    """Continue ``trainer`` from ``state`` (checked by :func:`check_resumable`): weights, the
    optimizer, pi_ref, a recipe's extra state, RNG streams, an fp16 run's gradient scaler,
    histories and evaluations. A part that does not fit this run's model (names, shapes) is a
    :class:`CheckpointError` naming it."""
    from . import distributed as dist

    with _part(path, "model"):
        load_policy_state(trainer.model, state["model"], path, lora=trainer.config.use_lora)
    trainer.phase, trainer.step = state["phase"], state["step"]
    with _part(path, "recipe state"):  # before the optimizer: a subclass may add a critic
        trainer.load_extra_state(state)
    with _part(path, "optimizer"):
        trainer.optimizer = trainer.make_optimizer()
        trainer.optimizer.load_state_dict(state["optimizer"])
        for group in trainer.optimizer.param_groups:
            for p in group["params"]:
                for key, value in trainer.optimizer.state.get(p, {}).items():
                    if getattr(value, "dim", lambda: 0)() and value.shape != p.shape:
                        raise ValueError(f"{key} of shape {tuple(value.shape)}")
    with _part(path, "ref_model"):
        if state["ref_model"] == "adapters_off":
            trainer.make_ref_model(adapters_off=True)
        elif state["ref_model"] is not None:
            trainer.make_ref_model(adapters_off=False)
            trainer.ref_model.load_state_dict(state["ref_model"])
    with _part(path, "RNG state"):  # this rank's streams (the problem stream is every rank's)
        rng = state["rank_rng"][dist.rank()] if "rank_rng" in state else state["rng"]
        set_rng_state(rng, trainer.problem_rng)
    scaler = getattr(trainer, "scaler", None)
    with _part(path, "gradient scaler"):  # an fp16 run's; a scale is meaningless to bf16, fp32
        if "scaler" in state and scaler is not None and scaler.is_enabled():
            scaler.load_state_dict(state["scaler"])
    trainer.sft_history, trainer.history = state["sft_history"], state["history"]
    trainer.evals, trainer.wall_time = state["evals"], state["wall_time"]


def scaler_state(scaler) -> dict:
    """``{"scaler": its state}`` (plain numbers: the loss scale and its growth counters) for an
    fp16 run's working ``GradScaler``, else ``{}``: a bf16 or fp32 checkpoint (the CPU's) keeps
    the keys it always had."""
    return {"scaler": scaler.state_dict()} if scaler.is_enabled() else {}


def check_world_size(state: dict, path: str) -> None:
    """A checkpoint resumes on as many ranks as wrote it (it holds each rank's RNG streams)."""
    from . import distributed as dist

    saved = len(state.get("rank_rng", [None]))
    if saved != dist.world_size():
        fields = {"ranks (torchrun --nproc_per_node)": (saved, dist.world_size())}
        raise ConfigMismatchError(path, fields)


def policy_state(model, *, lora: bool) -> dict:
    """The policy's weights for a checkpoint: all of them, or with LoRA only the trainable ones
    (the frozen base is loaded again from its source: 0.1 MB-10 MB instead of 540 MB for the
    pretrained profile)."""
    state = model.state_dict()
    if not lora:
        return state
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in state.items() if k in trainable}


def load_policy_state(model, state: dict, path: str, *, lora: bool) -> None:
    """Load what :func:`policy_state` saved into ``model`` (with LoRA: its adapters must match)."""
    if not lora:
        model.load_state_dict(state)
        return
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if set(state) != trainable:
        raise CheckpointError(path, "its LoRA weights do not match this model's adapters")
    model.load_state_dict(state, strict=False)
