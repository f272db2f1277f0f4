"""The grader's side of a jailed submission: its functions, called over a pipe.

    with Submission(cells, assignment, release_dir) as sub:   # runs the notebook in its jail
        gae = sub.function("gae")                             # a stand-in for the student's gae
        gae(rewards, values, mask, gamma=1.0, lam=0.95)       # runs there; the result comes back

The notebook runs in ``worker.py`` inside a bubblewrap jail (:func:`agentic_rl.jail
.program_command`) that holds only the system's programs, the Python environment, read-only,
a copy of the package in which the assignment's answers are stand-ins (``standins.py``), the
student release's files, and two small writable tmpfs folders; no other submission, no autograder
file, no checkout, no network, no ``/proc``; it runs as user ``nobody`` when the grader is root.
The checks, the expected values and the comparisons stay in the grader's process: what comes
back is data (``wire.py``), the student's functions' outputs and nothing else.

A returned tensor keeps its autograd graph: its ``backward`` asks the submission for the
gradients of the inputs that required them (a check may test what the student's loss
differentiates). Arguments the student's function changed in place are changed here too.

Without bubblewrap, the worker runs as a plain process in a temporary folder, with the stand-in
package first on its path, only where the caller allows it (``allow_uncontained``): that keeps the
answers out of reach but not the grader's files.
"""

from __future__ import annotations

import builtins
import os
import pathlib
import random
import select
import signal
import subprocess
import sys
import tempfile
import time

import torch
import wire

HERE = pathlib.Path(__file__).resolve().parent
WORKDIR, RELEASE, CODE = "/jail/work", "/jail/release", "/jail/code"  # (paths in the jail)
MEMORY_MB, FILE_MB, WORK_MB, TMP_MB = 6144, 64, 128, 64
START_S = 120  # seconds for the interpreter and torch to start in the jail
_ENV = {"HOME": WORKDIR, "PATH": "/usr/local/bin:/usr/bin:/bin", "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/matplotlib",
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "TMPDIR": "/tmp"}
# Exceptions a student's function may raise that come back as themselves (a check may expect
# ValueError for bad input); any other kind comes back as StudentError.
_BUILTIN = {name: getattr(builtins, name) for name in (
    "ValueError", "TypeError", "IndexError", "KeyError", "ZeroDivisionError", "RuntimeError",
    "AssertionError", "NotImplementedError", "AttributeError", "NameError", "ArithmeticError",
    "OverflowError", "RecursionError", "LookupError", "UnboundLocalError", "StopIteration",
    "OSError", "FileNotFoundError", "PermissionError", "MemoryError")}


class GradingError(BaseException):
    """The submission could not be run or stopped answering: the row's error, never a check's
    verdict (a ``BaseException``, so that no check's ``except Exception`` can take it for one)."""


class StudentError(Exception):
    """A student's function raised an exception of a kind that does not come back as itself."""


def _raised(info: dict) -> BaseException:
    if not isinstance(info, dict):
        raise TypeError("a raised exception that is not an object")
    kind = _BUILTIN.get(info.get("type"), StudentError)
    message = str(info.get("message", ""))
    err = kind(message) if kind is not StudentError else StudentError(
        f"{info.get('type')}: {message}")
    err.student_type = str(info.get("type"))  # what gradelib.call reports
    err.cell_line = info.get("line")
    err.standin = bool(info.get("standin"))
    return err


class Submission:
    """One submission's notebook, run in its jail; :meth:`function` calls into it."""

    def __init__(self, cells: list[str], assignment: str, release_dir: pathlib.Path | None,
                 graded_package: pathlib.Path, timeout_s: float = 900,
                 allow_uncontained: bool = False):
        from agentic_rl import jail

        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.errors: list[dict] = []
        self.callables: set[str] = set()
        self._calls = 0
        self.standins_reached: list[str] = []  # what the student's functions raised from them
        self._tmp = tempfile.TemporaryDirectory(prefix="submission-")
        self._buffer = b""
        setup = {"cells": cells, "memory_mb": MEMORY_MB, "file_mb": FILE_MB}
        boundary = jail.launcher().kind == "bubblewrap"
        if boundary:
            read_only = {sys.prefix: sys.prefix, str(HERE / "wire.py"): f"{CODE}/wire.py",
                         str(HERE / "worker.py"): f"{CODE}/worker.py",
                         str(graded_package): _installed_package()}
            if release_dir is not None:
                read_only[str(release_dir)] = RELEASE
            command, fd = jail.program_command(
                [sys.executable, "-I", f"{CODE}/worker.py"], read_only,
                {WORKDIR: WORK_MB, "/tmp": TMP_MB}, "/", _ENV)
            setup.update(workdir=WORKDIR, release=RELEASE if release_dir else None)
        elif allow_uncontained or os.environ.get(jail.ALLOW_UNCONTAINED) == "1":
            work = pathlib.Path(self._tmp.name) / "work"
            work.mkdir()
            pathlib.Path(self._tmp.name).chmod(0o711)  # (the worker, as nobody, enters work/)
            command, fd = [sys.executable, "-I", str(HERE / "worker.py")], None
            setup.update(workdir=str(work), release=str(release_dir) if release_dir else None,
                         path=[str(graded_package.parent)])
        else:
            raise GradingError(jail.boundary_problem() or "no jail")
        self.isolation = "bubblewrap" if boundary else "uncontained (no bubblewrap)"
        env = dict(_ENV, HOME=self._tmp.name, TMPDIR=self._tmp.name) if not boundary else {}
        self._stderr = open(pathlib.Path(self._tmp.name) / "stderr", "w+b")  # noqa: SIM115
        self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, start_new_session=True,
                                      pass_fds=() if fd is None else (fd,), env=env)
        if fd is not None:
            os.close(fd)
        try:
            self._send(setup)
            started = self._expect("started", min(self.deadline, time.monotonic() + START_S))
            ready = self._expect("ready", self.deadline)
        except BaseException:
            self.close()
            raise
        self.uid = started.get("uid")
        if self.uid == 0:
            self.isolation += ", as root (this Python cannot be read by user nobody)"
        self.errors = [e for e in ready.get("errors", []) if isinstance(e, dict)]
        self.callables = {str(n) for n in ready.get("callables", [])}

    # --- messages ----------------------------------------------------------------------------

    def _send(self, message: dict) -> None:
        try:
            self._proc.stdin.write(wire.dumps(message))
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise GradingError(self._ended()) from None

    def _ended(self) -> str:
        try:
            code = self._proc.wait(timeout=5)  # (its output closed: it is ending)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            return "the notebook stopped answering"
        if code < 0:
            return f"the notebook's process was killed by signal {signal.Signals(-code).name}"
        self._stderr.seek(0)
        tail = self._stderr.read()[-400:].decode(errors="replace").strip()
        return (f"the notebook's process ended (exit status {code}: os._exit, exit() or a crash)"
                + (f": {tail}" if tail else ""))

    def _read(self, deadline: float) -> dict:
        out = self._proc.stdout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.close()
                raise GradingError(f"grading stopped after {self.timeout_s:g} s (an endless "
                                   "loop, or too slow?)")
            ready, _, _ = select.select([out], [], [], left)
            if ready:
                chunk = os.read(out.fileno(), 1 << 20)
                if not chunk:
                    raise GradingError(self._ended())
                self._buffer += chunk
                if len(self._buffer) > wire.MAX_MESSAGE:
                    self.close()
                    raise GradingError("the notebook sent a message over 64 MiB")
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return wire.loads(line)
        except wire.WireError as err:
            self.close()
            raise GradingError(f"the notebook's answer was not readable ({err})") from None

    def _expect(self, key: str, deadline: float) -> dict:
        message = self._read(deadline)
        if key not in message:
            raise GradingError(f"the notebook answered out of turn (expected {key!r})")
        return message

    # --- calls ---------------------------------------------------------------------------------

    def function(self, name: str) -> RemoteFunction | None:
        """The student's ``name`` as a callable here, or None when the notebook defines none."""
        return RemoteFunction(self, name) if name in self.callables else None

    def call(self, name: str, args: tuple, kwargs: dict):
        self._calls += 1
        ident = self._calls
        self._send({"call": name, "id": ident, "args": [wire.encode(a) for a in args],
                    "kwargs": [[k, wire.encode(v)] for k, v in kwargs.items()]})
        reply = self._read(self.deadline)
        if reply.get("id") != ident:
            raise GradingError("the notebook answered out of turn")
        try:
            for where, encoded in reply.get("after", []):
                _copy_back(args[where] if isinstance(where, int) else kwargs[where],
                           wire.decode(encoded, False))
            raised = _raised(reply["raised"]) if "raised" in reply else None
            result = None if raised else wire.decode(reply["result"], requires_grad=False)
        except (wire.WireError, KeyError, IndexError, TypeError, AttributeError) as err:
            raise GradingError(f"the notebook's answer was not readable ({err})") from None
        if raised is not None:
            if raised.standin:
                self.standins_reached.append(str(raised))
            raise raised
        leaves = [a for a in [*args, *kwargs.values()]
                  if isinstance(a, torch.Tensor) and a.requires_grad]
        return _attach(self, ident, leaves, result, reply["result"])

    def gradients(self, ident: int, upstream) -> list:
        self._send({"grad": ident, "upstream": [None if g is None else wire.encode(g)
                                                for g in upstream]})
        reply = self._read(self.deadline)
        if isinstance(reply.get("raised"), dict):
            raise _raised(reply["raised"])
        try:
            return [None if g is None else wire.decode(g, False) for g in reply["grads"]]
        except (wire.WireError, KeyError, TypeError) as err:
            raise GradingError(f"the notebook's gradients were not readable ({err})") from None

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._stderr.close()
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RemoteFunction:
    """A student's function, called in the submission's jail."""

    def __init__(self, submission: Submission, name: str):
        self.submission, self.__name__ = submission, name
        self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        return self.submission.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<the submission's {self.__name__}>"


def _installed_package() -> str:
    import standins

    return str(standins.package_root())


def _copy_back(target, value) -> None:
    """Make ``target`` (an argument) what the student's function left it as."""
    if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor):
        if value.shape == target.shape and not torch.equal(value.to(target.dtype), target):
            with torch.no_grad():
                target.copy_(value)
    elif isinstance(target, list) and isinstance(value, list) and value != target:
        target[:] = value
    elif isinstance(target, dict) and isinstance(value, dict) and value != target:
        target.clear()
        target.update(value)
    elif isinstance(target, set) and isinstance(value, set) and value != target:
        target.clear()
        target.update(value)
    elif isinstance(target, random.Random) and isinstance(value, random.Random):
        target.setstate(value.getstate())
    elif isinstance(target, torch.Generator) and isinstance(value, torch.Generator):
        target.set_state(value.get_state())


def _attach(submission, ident, leaves, result, encoded):
    """``result`` with its differentiable tensors joined to ``leaves`` through the submission."""
    top = list(result) if isinstance(result, (tuple, list)) else [result]
    forms = encoded.get("tuple") or encoded.get("list") if isinstance(encoded, dict) else None
    forms = forms if isinstance(forms, list) and len(forms) == len(top) else [encoded]
    wants = [k for k, (value, form) in enumerate(zip(top, forms))
             if isinstance(value, torch.Tensor) and isinstance(form, dict) and form.get("grad")
             and value.is_floating_point()]
    if not wants:
        return result
    if not leaves:  # differentiable, but of nothing the grader holds: a leaf that requires grad
        for k in wants:
            top[k].requires_grad_()
    else:
        joined = _Remote.apply(submission, ident, len(leaves), *leaves, *[top[k] for k in wants])
        for k, tensor in zip(wants, joined):
            top[k] = tensor
    if isinstance(result, (tuple, list)):
        return type(result)(top)
    return top[0]


class _Remote(torch.autograd.Function):
    """Outputs computed in the submission; their backward asks it for the leaves' gradients."""

    @staticmethod
    def forward(ctx, submission, ident, n_leaves, *tensors):
        ctx.submission, ctx.ident = submission, ident
        ctx.leaf_shapes = [(t.shape, t.dtype) for t in tensors[:n_leaves]]
        return tuple(t.clone() for t in tensors[n_leaves:])

    @staticmethod
    def backward(ctx, *upstream):
        grads = ctx.submission.gradients(ctx.ident, list(upstream))
        out = []
        for (shape, dtype), g in zip(ctx.leaf_shapes, grads):
            if g is not None and tuple(g.shape) != tuple(shape):
                raise GradingError("the notebook's gradient has the wrong shape")
            out.append(None if g is None else g.to(dtype))
        return (None, None, None, *out, *[None] * len(upstream))
