"""Checkpoint files that cannot run code, and one run per output folder.

File format (version 1): one ASCII header line, then the bytes of ``torch.save(state)``::

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
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from contextlib import contextmanager

from .config import RunError

__all__ = [
    "FORMAT_VERSION",
    "CheckpointError",
    "ConfigMismatchError",
    "RunLockedError",
    "save",
    "load",
    "run_lock",
]

MAGIC = b"AGENTIC-RL-CHECKPOINT"
FORMAT_VERSION = 1
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
                raise CheckpointError(
                    path,
                    f"checkpoint format {version}; this agentic_rl reads format {FORMAT_VERSION}",
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
