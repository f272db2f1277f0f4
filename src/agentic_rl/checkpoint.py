"""Checkpoint files that cannot run code, one run per output folder, and a trainer's state.

File format (version 2): one ASCII header line, then the bytes of ``torch.save(state)``::

    AGENTIC-RL-CHECKPOINT 1 sha256=<64 hex digits> bytes=<payload length>\\n
    <payload>

Loading reads the header, checks the length and the SHA-256 of the payload, and only then unpickles
it with ``torch.load(weights_only=True)``: tensors, numbers, strings, lists, tuples and dicts,
nothing that can import or call anything. So a corrupt, truncated, foreign or malicious file stops
with :class:`CheckpointError` (which file, what is wrong, what to do) before any of its objects is
built, and nothing is deleted. The state must therefore hold plain types only (the trainer stores
numpy's RNG state as a tensor, for example).

Writing is atomic (a temporary file, ``fsync``, ``os.replace``): a run killed while writing leaves
the previous checkpoint intact.

:func:`run_lock` holds an exclusive ``fcntl.flock`` on ``<output_dir>/run.lock`` while a run uses
the folder. The operating system releases it when the process ends, however it ends, so a run killed
with ``kill -9`` leaves no stale lock. (Where ``fcntl`` does not exist, Windows, there is no lock.)

A trainer's state (:data:`STATE_KEYS`) holds its RNG streams as plain types (:func:`rng_state`,
:func:`set_rng_state`); :func:`check_resumable` says whether a config may continue it, and
:func:`check_world_size` whether this many ranks may.

Versions: 2 names the RL phase ``"rl"`` (version 1 called it ``"grpo"``, whatever the recipe);
a version-1 file is refused with what to do.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
from contextlib import contextmanager

from .config import ConfigError, RunError

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "ConfigMismatchError",
    "RunLockedError",
    "save",
    "load",
    "run_lock",
    "CHECKPOINT",
    "RESUMABLE_CHANGES",
    "STATE_KEYS",
    "rng_state",
    "set_rng_state",
    "check_resumable",
    "check_world_size",
    "policy_state",
    "load_policy_state",
    "write_csv",
]

MAGIC = b"AGENTIC-RL-CHECKPOINT"
FORMAT_VERSION = 2
#: What changed since each older format, for the message that refuses it.
_OLD_FORMATS = {1: "format 1 called the RL phase 'grpo'; format 2 calls it 'rl'"}
CHECKPOINT = "checkpoint.pt"
#: Config fields a resumed run may change (everything else must match the checkpoint's config).
RESUMABLE_CHANGES = ("output_dir", "resume", "max_steps", "save_steps", "disable_tqdm", "device")
#: What every trainer's checkpoint holds (a subclass adds its own keys: a critic).
STATE_KEYS = (
    "phase", "step", "model", "optimizer", "ref_model", "rng", "sft_history", "history",
    "evals", "wall_time", "config",
)  # fmt: skip
LOCK_FILE = "run.lock"
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


class RunLockedError(RunError):
    """Another live process is running in the same output folder."""


def save(state: dict, path: str) -> None:
    """Write ``state`` atomically in the checkpoint format (header: version, length and hash)."""
    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getbuffer()
    digest = hashlib.sha256(payload).hexdigest()
    header = b"%s %d sha256=%s bytes=%d\n" % (MAGIC, FORMAT_VERSION, digest.encode(), len(payload))
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(header)
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)  # atomic: an interrupted save never leaves a half-written checkpoint
    try:  # make the rename itself durable (not possible on every platform)
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def load(path: str, map_location=None) -> dict:
    """Verify and load a checkpoint written by :func:`save`; else raise :class:`CheckpointError`.

    Nothing in the file is unpickled before its header, length and SHA-256 check out, and then only
    with ``weights_only=True``.
    """
    import pickle

    import torch

    try:
        with open(path, "rb") as fh:
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
            payload = fh.read(size + 1)
    except OSError as err:
        raise CheckpointError(path, f"cannot be read ({err.strerror or err})") from None
    if len(payload) != size:
        raise CheckpointError(
            path,
            f"is truncated or has extra bytes ({len(payload)} payload bytes, the "
            f"header says {size}): a copy or a write was cut short",
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


_held: dict[
    str, list
] = {}  # realpath -> [open file, depth]: the lock is re-entrant within a process


@contextmanager
def run_lock(output_dir: str | None):
    """Hold ``output_dir``'s run lock for the block (:class:`RunLockedError` if another has it).

    No-op without an output folder. Creates the folder (and an empty ``run.lock``, which stays:
    deleting a lock file while another process opens it would let two runs lock two different
    files).
    """
    if not output_dir:
        yield
        return
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here
        yield
        return
    os.makedirs(output_dir, exist_ok=True)
    key = os.path.realpath(output_dir)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    fh = open(os.path.join(output_dir, LOCK_FILE), "a")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise RunLockedError(
            f"output_dir: another run is using {output_dir} (it holds "
            f"{os.path.join(output_dir, LOCK_FILE)}); wait for it to finish, or use "
            f"another --output-dir (got {output_dir!r})"
        ) from None
    _held[key] = [fh, 1]
    try:
        yield
    finally:
        _held[key][1] -= 1
        if _held[key][1] == 0:
            del _held[key]
            fh.close()  # closing the file releases the lock


def check_unlocked(output_dir: str | None) -> None:
    """Raise :class:`RunLockedError` now if another process holds ``output_dir``'s lock."""
    if output_dir and os.path.isdir(output_dir):
        with run_lock(output_dir):
            pass


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


def check_resumable(config, state: dict, path: str) -> None:
    """Raise a named error unless ``config`` can continue the run in ``state`` (a checkpoint).

    ``CheckpointError`` if it is not a training checkpoint; ``ConfigMismatchError`` listing each
    differing field (the checkpoint's value and yours) unless only ``RESUMABLE_CHANGES`` differ;
    ``ConfigError`` on ``max_steps`` if the checkpoint has already done more RL steps.
    """
    missing = [k for k in STATE_KEYS if k not in state]
    if missing or not isinstance(state["config"], dict):
        lacks = missing or ["config"]
        raise CheckpointError(path, f"is not a training checkpoint (it lacks {lacks})")
    mine = config.to_dict()
    saved = {k: v for k, v in state["config"].items() if k not in RESUMABLE_CHANGES}
    diffs = {
        k: (v, mine.get(k, "<no such field>")) for k, v in sorted(saved.items()) if mine.get(k) != v
    }
    if diffs:
        raise ConfigMismatchError(path, diffs)
    if state["phase"] == "rl" and state["step"] > config.max_steps:
        why = (
            f"the checkpoint {path} has already done {state['step']} RL steps; ask for at least "
            "that many, or --resume false to start over"
        )
        raise ConfigError("max_steps", why, config.max_steps)


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


def write_csv(rows: list[dict], path: str) -> None:
    """Write a list of metric dicts as CSV (columns: the union of keys, in first-seen order),
    atomically (a temporary file, then ``os.replace``)."""
    import csv

    cols = list(dict.fromkeys(k for r in rows for k in r))
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=cols)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
