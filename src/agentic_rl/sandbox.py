"""Run model-written Python snippets outside the training process: contained, and fast.

In the ReTool chapter the model writes code such as ``print(347*29)`` in the middle of a rollout;
the trainer runs it and feeds the output back. Thousands of snippets run per training run, so:

- :func:`run` runs one snippet (it starts a helper process, uses it once and stops it);
- :class:`Pool` keeps ``workers`` helpers alive: the "sandbox pool". Each helper is a *zygote*: a
  small Python (``python -I -S``, empty environment, standard library only) that has already
  imported what snippets need (``PRELOAD``) and forks a fresh child for every snippet, so a snippet
  costs a fork (milliseconds), not an interpreter start-up.

Every snippet runs inside these layers (:func:`isolation` says which are active on this machine):

1. the kernel's, set up around the zygote before its interpreter starts (:mod:`agentic_rl.jail`):
   with bubblewrap, a mount namespace that shows only read-only system folders and Python, with a
   size-limited tmpfs as the only writable place (the disk quota), a seccomp filter, and fresh
   PID, IPC and (empty) network namespaces; with util-linux ``unshare`` only the namespaces;
   where neither works, none of this. The zygote is PID 1 of its PID namespace: after each snippet
   it kills whatever the snippet left (daemons included), and when it dies, all of them die;
2. its own process, in its own session and process group, in a fresh temporary folder (deleted
   afterwards), with an empty environment; at the deadline the whole group gets SIGKILL;
3. when the trainer runs as root, the snippet runs as user ``nobody`` (who must be able to read the
   standard library for the snippet to import more than ``PRELOAD``);
4. resource limits (``setrlimit``): CPU time, address space, file size, open files, message
   queues, no core dumps, and no process or thread (``RLIMIT_NPROC`` 0, which the kernel enforces,
   hook or not, on all but the real root), so the memory cap, per process, bounds the snippet; and,
   as bubblewrap's tmpfs counts bytes, not inodes, at most ``MAX_FILES`` files there;
5. an audit hook (PEP 578) that refuses to start processes, signal other processes, open sockets,
   use ``ctypes``, write files outside the folder, or read or list files other than the folder's and
   the standard library's; the few unaudited functions that would get around it are deleted.

The audit hook is a tripwire, not a boundary: it sees only what CPython reports, and anything that
pokes at memory (``ctypes``, which the zygote therefore never imports; crafted bytecode; a C
extension) switches it off; the kernel's layers are what holds then. Nor is this a virtual
machine: the snippet shares the kernel with the trainer. For untrusted code at scale use a real
sandbox: gVisor, Firecracker microVMs, nsjail, E2B, or SandboxFusion (the code sandbox of ReTool's
verl recipe). Linux only.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import math
import os
import resource
import select
import shutil
import signal
import stat
import sys
import tempfile
import time
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import asdict, dataclass

if __name__ != "__main__":  # the trainer's side only: a zygote forks faster without threading
    import subprocess
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from agentic_rl import jail
    from agentic_rl.jail import DISK_MB

# No ctypes, not even in the zygote: a snippet that reaches it (through a frame's globals, or by
# walking object.__subclasses__()) can write any byte of memory and switch off the audit hook.

__all__ = ["DISK_MB", "Pool", "Result", "isolation", "run"]

# fmt: off
#: Modules every zygote imports once, so that snippets find them ready.
PRELOAD = ("math", "cmath", "fractions", "decimal", "statistics", "random", "itertools",
           "functools", "collections", "heapq", "bisect", "re", "string", "datetime", "json")
MIN_MEMORY_MB = 64  # a zygote's child already maps about 20 MB
NOBODY = 65534
#: A snippet still running after this long gives up its worker's turn (see Pool).
QUANTUM_S = 0.05
#: Snippets past their quantum that may run at once, per worker (each holds a zygote).
LONG_PER_WORKER = 4
#: Files and folders a snippet may make (counted every FILES_POLL_S, in bubblewrap's tmpfs only).
MAX_FILES, FILES_POLL_S = 4096, 0.01
_STDLIB = os.path.realpath(os.path.dirname(os.__file__))
_IMPORT_PATHS = tuple(os.path.realpath(folder) + "/" for folder in sys.path)  # (a zygote's: stdlib)
# Audit events the snippet may not raise (prefixes): processes, signals, network, ctypes, limits,
# and the ways into the hook itself (other hooks, tracing, the garbage collector, code objects).
_BLOCKED = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "subprocess.", "pty.",
            "os.kill", "signal.pthread_kill", "socket.", "ctypes.", "resource.setrlimit",
            "resource.prlimit", "sys.addaudithook", "sys.settrace", "sys.setprofile",
            "sys._current_frames", "gc.get_", "code.__new__", "os.symlink", "os.link",
            "os.unshare", "os.setns")
# Unaudited ways to start or signal processes, to make memory RLIMIT_AS does not count (memfd),
# or files that no path event reports (FIFOs, nodes): deleted in the child, not importable again.
_UNAUDITED = (("_posixsubprocess", "fork_exec"), ("_signal", "pidfd_send_signal"),
              ("signal", "pidfd_send_signal"),
              *((module, name) for module in ("posix", "os")
                for name in ("pidfd_open", "memfd_create", "mkfifo", "mknod")))
_BLOCKED_IMPORTS = frozenset({"_posixsubprocess", "posix", "_signal", "ctypes", "_ctypes"})
# Events whose path arguments must lie inside the working folder.
_PATH_EVENTS = frozenset({"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                          "os.truncate", "os.utime", "os.setxattr", "os.removexattr"})
_LIST_EVENTS = frozenset({"os.listdir", "os.scandir"})  # read rules (os.stat has no event)
# fmt: on


@dataclass(frozen=True)
class Result:
    """What one snippet did. ``error`` is a short one-line reason whenever it did not succeed:
    ``"TimeoutError: ..."``, ``"MemoryError"``, ``"SyntaxError: ..."``, ``"exit code 3"``,
    ``"blocked: socket.connect"``, ``"killed by signal 11 (Segmentation fault)"`` ..."""

    stdout: str
    stderr: str
    exit_code: int | None  # None when it was killed (deadline, output limit, signal)
    timed_out: bool
    truncated: bool  # stdout or stderr was cut at max_output_bytes
    wall_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None


def run(
    code: str, *, timeout_s: float = 1.0, memory_mb: int = 256, max_output_bytes: int = 4096,
    allow_uncontained: bool = False,
) -> Result:
    """Run one snippet in a fresh, isolated process (a one-off :class:`Pool` of one worker)."""
    _check_code(code)
    limits = dict(timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes)
    with Pool(1, **limits, allow_uncontained=allow_uncontained) as p:
        return p.run(code)


class Pool:
    """``workers`` zygotes that run snippets concurrently; a context manager.

    Every snippet gets ``timeout_s`` of wall-clock time, ``memory_mb`` of address space and
    ``max_output_bytes`` of stdout and of stderr. A snippet that hangs, crashes or kills its zygote
    never stops the others: a dead zygote is restarted and that snippet is reported as an error.
    ``isolation`` describes the active layers. Without a working bubblewrap it refuses to start
    (:class:`~agentic_rl.errors.IsolationError`) unless ``allow_uncontained`` or the environment
    variable ``AGENTIC_RL_ALLOW_UNCONTAINED_CODE=1`` opts in (:func:`jail.require_boundary`).

    Scheduling: ``workers`` snippets take their turn at once, in arrival order. One still running
    after ``QUANTUM_S`` (a busy loop, most likely) gives up its turn and goes on in an extra zygote
    (up to ``LONG_PER_WORKER * workers`` of them, started when first needed and kept), so that
    harmless snippets are not queued behind it until its deadline (head-of-line blocking). At
    most ``(1 + LONG_PER_WORKER) * workers`` snippets, each within its limits, run at once.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        timeout_s: float = 1.0,
        memory_mb: int = 256,
        max_output_bytes: int = 4096,
        allow_uncontained: bool = False,
    ):
        if not _is_int(workers) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self._limits = _check_limits(timeout_s, memory_mb, max_output_bytes)
        self._launcher = jail.require_boundary(allow_uncontained)
        # The snippets' folders go in here: others (nobody) may pass through, not list it. In a
        # bubblewrap jail it is each zygote's own tmpfs, and the trainer's disk never holds it.
        self._base = tempfile.mkdtemp(prefix="agentic_rl_sandbox_")
        if self._launcher.private_folder:
            os.rmdir(self._base)
        else:
            os.chmod(self._base, 0o711)
        self._zygotes: list[_Zygote] = []
        # Stops the zygotes on close(), garbage collection or interpreter exit, whichever is first.
        self._finalizer = weakref.finalize(self, _stop_all, self._zygotes, self._base)
        self._lock = threading.Lock()
        self._turns = threading.Semaphore(workers)
        self._long, self._max_long = 0, LONG_PER_WORKER * workers
        self._capacity = workers + self._max_long
        self._zygotes.extend(_Zygote(self._base, self._launcher) for _ in range(workers))
        self._idle = list(self._zygotes)
        self.isolation = self._zygotes[0].isolation

    def run(self, code: str) -> Result:
        """Run one snippet on the next free worker."""
        _check_code(code)
        if not self._finalizer.alive:
            raise ValueError("this Pool is closed")
        self._turns.acquire()
        turn = [True]  # still holding a turn (given up by _give_up_turn)
        try:
            zygote = self._take()
            try:
                return zygote.run(code, self._limits, lambda: self._give_up_turn(turn))
            finally:
                with self._lock:
                    self._idle.append(zygote)
        finally:
            if turn[0]:
                self._turns.release()
            else:
                with self._lock:
                    self._long -= 1

    def _take(self) -> _Zygote:
        """An idle zygote, or a new one (kept afterwards). Each running snippet holds one, so
        there are never more than ``workers`` turns + ``LONG_PER_WORKER * workers`` long ones."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        zygote = _Zygote(self._base, self._launcher)
        with self._lock:
            self._zygotes.append(zygote)
        if not self._finalizer.alive:  # closed meanwhile: _stop_all has already run
            zygote.stop()
        return zygote

    def _give_up_turn(self, turn: list) -> None:
        with self._lock:
            if not turn[0] or self._long >= self._max_long:
                return
            self._long += 1
            turn[0] = False
        self._turns.release()

    def map(self, codes: Sequence[str]) -> list[Result]:
        """Run the snippets concurrently (a thread each, up to the most that can run at once);
        results in the order of codes."""
        codes = list(codes)
        for code in codes:
            _check_code(code)
        threads = max(1, min(len(codes), self._capacity))
        with ThreadPoolExecutor(threads) as executor:
            return list(executor.map(self.run, codes))

    def close(self) -> None:
        """Stop the workers and delete their folder (idempotent)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@functools.cache
def isolation() -> str:
    """Which isolation layers this machine gives a snippet (asks a zygote once, which it may do
    without bubblewrap: it runs no model code)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the warning that no bubblewrap runs model code)
        with Pool(1, allow_uncontained=True) as pool:
            return pool.isolation


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_code(code) -> None:
    if not isinstance(code, str):
        raise ValueError(f"code must be a str, got {type(code).__name__}")  # noqa: TRY004


def _check_limits(timeout_s, memory_mb, max_output_bytes) -> dict:
    if not (_is_int(timeout_s) or isinstance(timeout_s, float)) or not 0 < timeout_s <= 3600:
        raise ValueError(f"timeout_s must be a number of seconds in (0, 3600], got {timeout_s!r}")
    if not _is_int(memory_mb) or memory_mb < MIN_MEMORY_MB:
        raise ValueError(f"memory_mb must be an int >= {MIN_MEMORY_MB}, got {memory_mb!r}")
    if not _is_int(max_output_bytes) or max_output_bytes < 1:
        raise ValueError(f"max_output_bytes must be an int >= 1, got {max_output_bytes!r}")
    return {
        "timeout_s": float(timeout_s),
        "memory_mb": memory_mb,
        "max_output_bytes": max_output_bytes,
    }


# ---- The trainer's side of a zygote: one JSON line each way per snippet. ----


class _Zygote:
    def __init__(self, base: str, launcher):
        self.base, self.launcher, self.closed = base, launcher, False
        self._start()

    def _start(self) -> None:
        # -I: isolated mode (no PYTHON* variables, no user site, no script folder on sys.path);
        # -S: no site-packages; env={}: nothing of the trainer's environment reaches the snippets.
        script = os.path.abspath(__file__)
        command, seccomp_fd = self.launcher.command(script, self.base)
        setup = {"nobody": self.launcher.nobody, "layers": self.launcher.layers}
        try:
            self.proc = subprocess.Popen(
                [*command, self.base, json.dumps(setup)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={},
                cwd="/",
                start_new_session=True,
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            )
        finally:
            if seccomp_fd is not None:
                os.close(seccomp_fd)
        self._buffer = b""
        try:
            self.isolation = json.loads(self._read_line(time.monotonic() + 60))["isolation"]
        except (OSError, EOFError, ValueError, KeyError) as err:
            self._kill()
            raise RuntimeError(f"the sandbox zygote did not start: {err!r}") from err

    def run(self, code: str, limits: dict, on_slow=None) -> Result:
        """Run one snippet; call ``on_slow()`` if it is still running after ``QUANTUM_S``."""
        if self.proc.poll() is not None and not self.closed:  # it died while idle: replace it
            self._kill()
            self._start()
        start = time.monotonic()
        try:
            self.proc.stdin.write(json.dumps(dict(limits, code=code)).encode() + b"\n")
            self.proc.stdin.flush()
            # The zygote enforces the deadline itself; this margin only catches a wedged zygote.
            deadline = start + limits["timeout_s"] + 5
            try:
                line = self._read_line(min(deadline, start + QUANTUM_S) if on_slow else deadline)
            except TimeoutError:
                on_slow()
                line = self._read_line(deadline)
            return Result(**json.loads(line))
        except (OSError, EOFError, ValueError, TimeoutError) as err:
            self._kill()
            if not self.closed:
                self._start()
            return _failure(f"sandbox worker failed: {err!r}", time.monotonic() - start)

    def _read_line(self, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise TimeoutError("no answer from the sandbox zygote")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise EOFError("the sandbox zygote exited")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def stop(self) -> None:
        self.closed = True
        self._kill()

    def _kill(self) -> None:
        """SIGKILL the zygote (and its launcher); a snippet it was running dies with it (the
        zygote is PID 1 of their PID namespace, where there is one)."""
        if self.proc.poll() is None:  # (once reaped, its pid may be another process's)
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


def _stop_all(zygotes: list[_Zygote], base: str) -> None:
    for zygote in zygotes:
        zygote.stop()
    shutil.rmtree(base, ignore_errors=True)


# ---- The zygote (this file run as ``python -I -S sandbox.py BASE``), and its children. ----


def _zygote_main() -> None:
    """Import ``PRELOAD``, say which layers are active, then serve one snippet per input line."""
    base, setup = sys.argv[1], json.loads(sys.argv[2])
    tempfile.tempdir = base
    for name in PRELOAD:
        __import__(name)
    # The children's garbage collector then leaves the zygote's objects (and memory pages) alone.
    gc.freeze()
    # As PID 1 of its namespace, the zygote ignores SIGINT from a snippet (its default action).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    pid_namespace = os.getpid() == 1  # the launcher made one (the zygote is its first process)
    nobody = setup["nobody"] and os.geteuid() == 0
    layers = ["own session", "rlimits", "audit hook", "empty env", "temp folder", *setup["layers"]]
    layers.append("PID and IPC namespaces" if pid_namespace else "no PID namespace (not permitted)")
    if nobody:
        # To import more than PRELOAD, nobody must be able to read the standard library.
        folder, readable = _STDLIB, True
        while folder != "/":
            readable &= os.stat(folder).st_mode & 0o005 == 0o005
            folder = os.path.dirname(folder)
        layers.append("runs as nobody" + ("" if readable else " (who cannot read the stdlib)"))
    _send({"isolation": ", ".join(layers)})
    try:
        for line in sys.stdin.buffer:
            try:
                _send(_supervise(json.loads(line), nobody, pid_namespace))
            except Exception as err:  # noqa: BLE001 (report it; the zygote keeps serving)
                _send(_failure(f"sandbox error: {err!r}", 0.0))
    finally:  # end of input: the trainer has gone (or this zygote could not answer it)
        shutil.rmtree(base, ignore_errors=True)


def _failure(error: str, wall_s: float) -> Result:
    """The Result when the sandbox itself failed (the snippet may not even have run)."""
    return Result("", "", None, False, False, wall_s, error)


def _send(message: dict | Result) -> None:
    data = json.dumps(message if isinstance(message, dict) else asdict(message)).encode() + b"\n"
    while data:
        data = data[os.write(1, data) :]


def _supervise(request: dict, nobody: bool, pid_namespace: bool) -> Result:
    """Run one snippet in a fresh child; collect its output; kill its group at the deadline, past
    the output cap or ``MAX_FILES`` (and, as PID 1 of a PID namespace, every process it left)."""
    start = time.monotonic()
    timeout_s, cap = request["timeout_s"], request["max_output_bytes"]
    workdir = os.path.realpath(tempfile.mkdtemp())
    # bubblewrap's tmpfs (this zygote's own) bounds bytes, not files: its free inodes count them.
    base = os.path.dirname(workdir)
    free = os.statvfs(base).f_ffree if os.path.ismount(base) else 0
    next_count = start + FILES_POLL_S if free else math.inf  # (a quick snippet waits no interval)
    pipes = [os.pipe() for _ in range(3)]  # the snippet's stdout, stderr, and its notes for us
    pid = os.fork()
    if pid == 0:
        try:
            _runner(request, workdir, [w for _, w in pipes], nobody)  # does not return
        except BaseException as err:  # noqa: BLE001 (it failed before the snippet ran)
            note = f"sandbox setup failed: {err!r}\n".encode()
            for fd in (pipes[2][1], 3):  # the notes' pipe, before or after the plumbing
                with contextlib.suppress(OSError):
                    os.write(fd, note)
                    break
        finally:
            os._exit(70)
    for _, w in pipes:
        os.close(w)
    outputs = {r: bytearray() for r, _ in pipes}
    caps = dict(zip(outputs, (cap, cap, 4096)))
    pidfd = os.pidfd_open(pid)  # becomes readable when the child exits
    poller = select.poll()
    for fd in (*outputs, pidfd):
        poller.register(fd, select.POLLIN)
    timed_out = exited = demoted = False
    over = None  # the error of a limit it went past (output, files)
    while not (exited or over or timed_out):
        now = time.monotonic()
        if not demoted and now - start >= QUANTUM_S:
            demoted = _demote(pid)
        left = start + timeout_s - now
        timed_out = left <= 0
        wait = min(left if demoted else min(left, start + QUANTUM_S - now), next_count - now)
        for fd, _ in [] if timed_out else poller.poll(max(0.0, wait) * 1000):
            if fd == pidfd:
                exited = True
            elif not _read_into(fd, outputs[fd]):
                poller.unregister(fd)  # end of file
        if any(len(outputs[fd]) > caps[fd] for fd in outputs):
            over = f"OutputLimitError: killed after {cap} bytes of output"
        elif now >= next_count:
            next_count, made = now + FILES_POLL_S, free - os.statvfs(base).f_ffree
            over = f"FileLimitError: killed after {MAX_FILES} files" if made > MAX_FILES else None
    for kill, target in ((os.killpg, pid), (os.kill, pid)):  # the whole group, what is left
        with contextlib.suppress(OSError):
            kill(target, signal.SIGKILL)
    status = os.waitpid(pid, 0)[1]
    if pid_namespace:
        _end_strays()
    wall_s = time.monotonic() - start
    for fd, out in outputs.items():  # what the child wrote just before it ended
        os.set_blocking(fd, False)
        while len(out) <= caps[fd] and _read_into(fd, out):
            pass
        os.close(fd)
    os.close(pidfd)
    shutil.rmtree(workdir, ignore_errors=True)
    return _result(request, list(outputs.values()), status, timed_out, over, wall_s)


def _demote(pid: int) -> bool:
    """A snippet past its quantum (a busy loop, most likely) runs on at the lowest priority
    (SCHED_IDLE, and nice 19 for its group): it gets the CPU that the snippets within their
    quantum, the zygotes and the trainer leave, so that they are not slowed down behind it."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, pid, 19)
    with contextlib.suppress(OSError):
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))
    return True


def _result(request: dict, outputs: list, status: int, timed_out: bool, over: str | None, wall_s):
    """The snippet's Result from what it wrote (stdout, stderr, notes) and how it ended."""
    cap = request["max_output_bytes"]
    stdout, stderr, notes = (
        bytes(out[:limit]).decode(errors="replace")
        for out, limit in zip(outputs, (cap, cap, 4096))
    )
    notes = notes.splitlines()
    exit_code = None if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    refusal = next((note for note in notes if note.startswith("blocked: ")), None)
    if refusal:  # reported even if the snippet caught it, and even if it then timed out
        error = refusal
    elif timed_out:
        error = f"TimeoutError: killed after {request['timeout_s']:g} s"
    elif notes:  # its exception
        error = notes[0]
    elif over:
        error = over
    elif exit_code is None:
        signum = os.WTERMSIG(status)
        error = f"killed by signal {signum} ({signal.strsignal(signum)})"
    else:
        error = f"exit code {exit_code}" if exit_code else None
    truncated = any(len(out) > cap for out in outputs[:2])
    return Result(stdout, stderr, exit_code, timed_out, truncated, round(wall_s, 6), error)


def _read_into(fd: int, out: bytearray) -> bool:
    """Append what can be read now; False at end of file (or when nothing more is ready)."""
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return False
    out += chunk
    return bool(chunk)


def _end_strays() -> None:
    """As PID 1 of its own PID namespace, kill every other process in it (what a snippet left
    behind, a daemon outside its group included) and reap them: nothing outlives its snippet."""
    with contextlib.suppress(OSError):  # (ESRCH: there was none)
        os.kill(-1, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)


def _runner(request: dict, workdir: str, fds: list[int], nobody: bool) -> None:
    """The snippet's own process: plumbing, limits, privileges, guards, then the snippet."""
    os.setsid()  # its own session and process group, which the deadline kills
    # stdin from /dev/null; stdout and stderr into the zygote's pipes; our notes on fd 3.
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in zip((null, *fds), range(4)):
        os.dup2(fd, target)
    os.closerange(4, 1 << 16)
    sys.stdout.reconfigure(line_buffering=True)  # so that a snippet killed later keeps its output
    cpu_s, memory = math.ceil(request["timeout_s"]) + 1, request["memory_mb"] << 20
    for limit, value in (
        (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),
        (resource.RLIMIT_AS, (memory, memory)),
        (resource.RLIMIT_FSIZE, (16 << 20, 16 << 20)),
        (resource.RLIMIT_NOFILE, (64, 64)),
        (resource.RLIMIT_MSGQUEUE, (0, 0)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(limit, value)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-big file: an OSError, not a crash
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (the zygote ignores it)
    if nobody:  # root: become nobody (who can still write the folder)
        os.chown(workdir, NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    # No fork, no thread: never needed. (After setuid: before, execve fails too, but only while
    # another process runs as nobody, as the kernel checks the count at setuid.)
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    os.chdir(workdir)
    os.umask(0o077)
    os.environ.clear()
    tempfile.tempdir = workdir
    sys.dont_write_bytecode = True
    for module, name in _UNAUDITED:
        with contextlib.suppress(KeyError, AttributeError):
            delattr(sys.modules[module], name)
    for module in _BLOCKED_IMPORTS:
        sys.modules.pop(module, None)
    main = type(sys)("__main__")  # a fresh __main__: this file's module stays out of sight
    sys.modules["__main__"] = main
    sys.addaudithook(_audit_hook(workdir))
    status = 0
    try:
        exec(compile(request["code"], "<snippet>", "exec"), main.__dict__)  # noqa: S102
    except SystemExit as stop:
        status = stop.code if _is_int(stop.code) else 0 if stop.code is None else 1
        if status == 1 and not _is_int(stop.code):
            print(stop.code, file=sys.stderr)
    except BaseException as err:  # noqa: BLE001 (the snippet's error is the result)
        try:
            line = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        except Exception:  # noqa: BLE001 (a broken __str__)
            line = type(err).__name__
        # The note first (a long traceback may hit the output limit); then no more notes.
        with contextlib.suppress(OSError):
            os.write(3, line.replace("\n", " ").encode(errors="replace")[:300] + b"\n")
            os.close(3)
        err = err.with_traceback(err.__traceback__.tb_next)  # from the snippet's frame on
        sys.excepthook(type(err), err, err.__traceback__)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(status & 0xFF)


def _audit_hook(workdir: str):
    """The snippet's audit hook: refuse ``_BLOCKED`` events, and file access outside allowed paths.

    The snippet can rebind builtins and module attributes, and pass ``str`` subclasses, so the hook
    uses only what it captures here (builtin functions, unbound ``str`` and ``bytes`` methods,
    immutable tuples) and calls no Python function: nothing the snippet can reach changes what it
    does. Each refusal is noted on fd 3 (so it is reported even if the snippet catches it), then
    raised as ``PermissionError``.
    """
    blocked, blocked_imports, path_events = _BLOCKED, _BLOCKED_IMPORTS, _PATH_EVENTS
    list_events = _LIST_EVENTS
    writable = (workdir + "/", "/dev/null/")
    # ... and where Python imports from (the standard library), and this file (for tracebacks).
    readable = (*writable, *_IMPORT_PATHS, os.path.abspath(__file__) + "/")
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    write, getcwd, stat_, is_dir = os.write, os.getcwd, os.stat, stat.S_ISDIR
    as_str, decode, startswith, split = str.__str__, bytes.decode, str.startswith, str.split
    str_, bytes_, isinstance_, os_error, refused = str, bytes, isinstance, OSError, PermissionError

    def hook(event, args):
        denied, paths, roots = None, (), writable
        if event == "open":
            paths, roots = args[:1], writable if args[2] & write_flags else readable
        elif event in path_events:
            paths = args
        elif event in list_events:  # (None: the current folder)
            paths, roots = ("." if args[0] is None else args[0],), readable
        elif startswith(event, blocked):
            denied = event
        elif event == "import" and as_str(args[0]) in blocked_imports:
            denied = "import " + as_str(args[0])
        for path in paths:  # ints among the arguments are file descriptors or modes
            if isinstance_(path, bytes_):
                path = decode(path, "utf-8", "surrogateescape")
            elif not isinstance_(path, str_):
                continue
            path = as_str(path)
            if not startswith(path, "/"):
                path = getcwd() + "/" + path
            parts = []  # normalise . and .. (no symlink can be made: os.symlink is refused)
            for part in split(path, "/"):
                if part == "..":
                    del parts[-1:]
                elif part not in ("", "."):
                    parts.append(part)
            path = "/" + "/".join(parts)
            try:  # a directory's fd would let a relative path (dir_fd=) escape this check
                directory = event == "open" and is_dir(stat_(path).st_mode)
            except os_error:
                directory = False
            if directory or not startswith(path + "/", roots):
                denied = f"{event} {path}"
        if denied is not None:
            try:
                write(3, ("blocked: " + denied + "\n").encode())
            except os_error:
                pass
            raise refused("blocked by the sandbox: " + denied)

    return hook


if __name__ == "__main__":
    _zygote_main()
