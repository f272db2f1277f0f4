"""A run's output folder: the names a run writes there, atomic writes, one run at a time.

Writing is atomic (:func:`write_atomically`: a fresh temporary file in the folder, created
exclusively and never through a symlink, then ``fsync`` and ``os.replace``): a run killed while
writing leaves the previous file intact, and a name planted in the folder cannot redirect the
write; a full disk is a :class:`RunError` naming the folder and its free space. Every name a run
writes (:data:`OUTPUT_NAMES`) must be a regular file or absent (:func:`check_output_names`): a
folder, a FIFO or a symlink in its place stops the run with :class:`OutputFileError`.

:func:`run_lock` holds an exclusive ``fcntl.flock`` on ``<output_dir>/run.lock`` while a run uses
the folder. The operating system releases it when the process ends, however it ends, so a run killed
with ``kill -9`` leaves no stale lock. (Where ``fcntl`` does not exist, Windows, there is no lock.)

The checkpoint file's own format is :mod:`agentic_rl.checkpoint`'s (which re-exports these names).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager

from .bounds import foreign_symlink
from .errors import ConfigError, RunError

__all__ = [
    "CHECKPOINT",
    "LOCK_FILE",
    "OUTPUT_NAMES",
    "RunLockedError",
    "OutputFileError",
    "check_output_name",
    "check_output_names",
    "write_atomically",
    "run_lock",
    "check_unlocked",
    "write_csv",
    "csv_bytes",
]

CHECKPOINT = "checkpoint.pt"
LOCK_FILE = "run.lock"
#: Every name a run writes in its output folder.
OUTPUT_NAMES = (CHECKPOINT, "metrics.csv", "sft_metrics.csv", "summary.json", LOCK_FILE)


class RunLockedError(RunError):
    """Another live process is running in the same output folder."""


class OutputFileError(RunError):
    """A name the run writes in its output folder is held by something else than a regular file
    (a folder, a FIFO, a symlink, a device): the run stops instead of writing through it."""


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((word for test, word in kinds if test(mode)), "a device")


def check_output_name(path: str) -> None:
    """Raise :class:`OutputFileError` unless ``path`` is absent or a regular file."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        why = f"output_dir: cannot inspect {path} ({err.strerror or err})"
        raise OutputFileError(why) from None
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)


def _not_regular(path: str, mode: int) -> OutputFileError:
    return OutputFileError(
        f"output_dir: {path} is {_kind(mode)}, not a regular file; a run writes only regular "
        f"files there: move it away, or use another --output-dir (got {os.path.dirname(path)!r})"
    )


def check_output_names(output_dir: str) -> None:
    """Every name a run writes in ``output_dir`` (:data:`OUTPUT_NAMES`) is a regular file or
    absent; else :class:`OutputFileError`, before any compute."""
    for name in OUTPUT_NAMES:
        check_output_name(os.path.join(output_dir, name))


def _temp_prefix(name: str) -> str:
    return f".{name}."


#: A full disk or an exhausted quota: the user's to fix, not a bug.
_NO_SPACE = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


@contextmanager
def _space_for(path: str):
    """A full disk or quota while writing ``path`` is a :class:`RunError` naming its folder and
    the space left there (it came hours into a run as an ``OSError`` traceback)."""
    try:
        yield
    except OSError as err:
        if err.errno not in _NO_SPACE:
            raise
        folder, name = os.path.split(os.path.abspath(path))
        where = folder  # (a folder not made yet: the space is its nearest parent's)
        while not os.path.isdir(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)
        try:
            free = shutil.disk_usage(where).free
            free = f"{free / 2**30:.1f} GiB" if free >= 2**30 else f"{free / 2**10:.0f} KiB"
        except OSError:
            free = "an unknown amount"
        raise RunError(
            f"cannot write {name} in {folder}: {err.strerror or 'no space left'} ({free} free "
            "there); the file it replaces, if any, is intact. Free some space there, or write "
            "to another folder (--output-dir)"
        ) from None


def write_atomically(path: str, *chunks) -> None:
    """Write ``chunks`` (bytes) to ``path`` atomically: a fresh temporary file in the same folder
    (``mkstemp``: ``O_CREAT | O_EXCL | O_NOFOLLOW``, so never through a planted name), ``fsync``,
    then ``os.replace``. ``path`` must be a regular file or absent (:func:`check_output_name`)."""
    check_output_name(path)
    folder, name = os.path.split(os.path.abspath(path))
    with _space_for(path):  # a full disk: one line, and the previous file stays
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=_temp_prefix(name), suffix=".tmp")
        try:
            mask = os.umask(0o022)  # mkstemp makes the file 0600: give it the usual mode
            os.umask(mask)
            os.fchmod(fd, 0o666 & ~mask)
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)  # atomic: an interrupted write never leaves a half-written file
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    with contextlib.suppress(OSError):  # make the rename itself durable (not on every platform)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_stale_temp_files(output_dir: str) -> None:
    """Delete the temporary files a killed run left (regular files of our names only); called with
    the folder's lock held, so no live run is writing them."""
    prefixes = tuple(_temp_prefix(name) for name in OUTPUT_NAMES)
    with contextlib.suppress(OSError):
        for entry in os.scandir(output_dir):
            if entry.name.startswith(prefixes) and entry.name.endswith(".tmp"):
                if entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


#: realpath -> [open file, depth]: the lock is re-entrant within a process
_held: dict[str, list] = {}


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
    if foreign_symlink(output_dir):  # (again, just before the first write in the folder)
        raise ConfigError("output_dir", foreign_symlink(output_dir), output_dir)
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here
        yield
        return
    with _space_for(os.path.join(output_dir, LOCK_FILE)):
        os.makedirs(output_dir, exist_ok=True)
    key = os.path.realpath(output_dir)
    if key in _held:
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return
    with _space_for(os.path.join(output_dir, LOCK_FILE)):
        fh = _open_lock(os.path.join(output_dir, LOCK_FILE))
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
        check_output_names(output_dir)
        _remove_stale_temp_files(output_dir)
        yield
    finally:
        _held[key][1] -= 1
        if _held[key][1] == 0:
            del _held[key]
            fh.close()  # closing the file releases the lock


def _open_lock(path: str):
    """Open (or create) the lock file: a regular file, never through a symlink."""
    check_output_name(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), 0o644)
    except OSError:  # replaced since the check: say what it is now
        check_output_name(path)
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _not_regular(path, mode)
    return os.fdopen(fd, "a")


def check_unlocked(output_dir: str | None) -> None:
    """Raise :class:`RunLockedError` now if another process holds ``output_dir``'s lock."""
    if output_dir and os.path.isdir(output_dir):
        with run_lock(output_dir):
            pass


def write_csv(rows: list[dict], path: str) -> None:
    """Write a list of metric dicts as CSV (columns: the union of keys, in first-seen order),
    atomically (a temporary file, then ``os.replace``)."""
    write_atomically(path, csv_bytes(rows))


def csv_bytes(rows: list[dict]) -> bytes:
    """What :func:`write_csv` writes for ``rows``."""
    import csv

    cols = list(dict.fromkeys(k for r in rows for k in r))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=cols)
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue().encode("utf-8")
