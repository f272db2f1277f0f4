"""What the hidden tests of every assignment share (carried in each autograder, not in the release).

A hidden test in a master notebook is one line, e.g. ``import grpo_checks as C;
C.unbiased_std(globals())``. Each check is a function of the notebook's namespace, made with
:func:`check`, which

1. finds the student's function by name (a clear sentence when it is missing or still a stub);
2. runs the check, whose failure is an ``AssertionError`` of one short paragraph: the first
   sentence says what is wrong, the rest shows the case and the numbers.

The checks run in the grader's process (``grade.py``), never in the student's: the student's
function is a stand-in that calls it in the submission's jail (``remote.py``) and returns its
result as data. ``answers`` names the package's functions that answer the question: in the jail
they are stand-ins that raise (``standins.py``), and :func:`call` refuses credit, with a message
that starts with :data:`FLAGGED`, when the student's function reached one.

Expected values come from :class:`References`, data the autograder carries (recorded once from the
package by ``python labs/assignments/release.py --record``), never from importing the answer
functions at grading time.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import math
import numbers
import os
import pathlib
import re
import traceback

#: the first word of every integrity failure; ``grade.py`` looks for it to flag a question
FLAGGED = "FLAGGED"
#: set to a file path by ``release.py --record``: expected values are computed and written there
RECORD_ENV = "AGENTIC_RL_RECORD"


class CheckFailed(AssertionError):
    """A check failed; the message is the feedback the student reads."""


def fail(message: str) -> None:
    raise CheckFailed(message)


# --- finding and calling the student's function -------------------------------------------------


def student_function(ns: dict, name: str):
    fn = ns.get(name)
    if not callable(fn):
        fail(f"`{name}` is not defined: keep it, with its name, in the cell of its question "
             "(a syntax error in that cell also leaves it undefined).")
    return fn


def call(fn, name: str, *args, **kwargs):
    """Call the student's ``fn``; any exception becomes a one-sentence failure."""
    try:
        result = fn(*args, **kwargs)
        if result is None:
            message = (f"`{name}` returned None: it is not implemented yet (the release's stub "
                       "`...` returns None), or it lacks a `return`.")
        else:
            return result
    except CheckFailed:
        raise
    except Exception as err:
        if getattr(err, "standin", False):  # the package's answer, a stand-in while grading
            which = re.search(r"agentic_rl[\w.]+(?= is not available)", str(err))
            fail(f"{FLAGGED}: no credit for `{name}`: it calls the package's answer "
                 f"`{which.group(0) if which else 'agentic_rl'}`, which is not available while "
                 "grading. Write it yourself; the package's version is the reference your "
                 "answer is graded against.")
        kind = getattr(err, "student_type", type(err).__name__)
        if kind == "NotImplementedError":
            fail(f"`{name}` is not implemented yet (it raises NotImplementedError).")
        line = getattr(err, "cell_line", None)
        if line is None and not hasattr(err, "student_type"):  # called in this process (tests)
            frames = [f for f in traceback.extract_tb(err.__traceback__)
                      if not f.filename.endswith(("gradelib.py", "_checks.py"))]
            line = frames[-1].lineno if frames else None
        where = f" at line {line} of its cell" if line else ""
        text = str(err).removeprefix(f"{kind}: ")
        message = f"`{name}` raised {kind}{where}: {text}"
    fail(message)


def expect_tensor(name: str, got, what: str, *, shape=None, dtype=None, why: str = ""):
    """Fail unless ``got`` is a tensor, of ``shape`` and ``dtype`` when given (``why`` follows
    the expected shape in the message)."""
    import torch

    if not isinstance(got, torch.Tensor):
        fail(f"`{name}` should return a torch.Tensor for {what}, got {type(got).__name__}.")
    if shape is not None and tuple(got.shape) != tuple(shape):
        fail(f"`{name}` returned shape {tuple(got.shape)} for {what}; expected "
             f"{tuple(shape)}{why}.")
    if dtype is not None and got.dtype != dtype:
        fail(f"`{name}` should return a {dtype} tensor for {what}, got {got.dtype}.")
    return got


def expect_real(name: str, got, what: str, *, why: str = "") -> float:
    """Fail unless ``got`` is a finite real number (not a bool); returns it as a float."""
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(f"`{name}` should return a Python float for {what}, got {type(got).__name__}.")
    if not math.isfinite(float(got)):
        fail(f"`{name}` returned {got} for {what}{why}.")
    return float(got)


def expect_close(name: str, got, want, what: str, *, atol: float = 1e-6, rtol: float = 1e-5,
                 hint="") -> None:
    """Fail with a sentence unless tensor ``got`` matches ``want``; ``hint`` may be a callable."""
    import torch

    expect_tensor(name, got, what, shape=want.shape)
    got64, want64 = got.detach().double(), want.detach().double()
    if not torch.allclose(got64, want64, atol=atol, rtol=rtol, equal_nan=False):
        diff = (got64 - want64).abs().nan_to_num(float("inf"))
        idx = diff.flatten().argmax().item()
        where = f" at position {tuple(divmod(idx, got.shape[-1]))}" if got.ndim == 2 else (
            f" at index {idx}" if got.ndim == 1 else "")
        hint = hint() if callable(hint) else hint
        fail(f"`{name}` is wrong for {what}:{where} it gave {got64.flatten()[idx].item():.6g}, "
             f"expected {want64.flatten()[idx].item():.6g}.{hint}")


def convention_hint(fn, kind: str) -> str:
    """The first sentence of ``agentic_rl.check``'s diagnosis of ``fn``, or ''.

    Only an explanation, asked for once a check has failed: it never grants credit."""
    try:
        from agentic_rl.check import check_implementation

        report = check_implementation(fn, kind)
    except Exception:
        return ""
    if getattr(report, "passed", True):
        return ""
    differences = getattr(report, "differences", []) or []
    return f" The checker says: {differences[0]}" if differences else ""


def check(name: str, answers: tuple[str, ...] = ()):
    """Make ``body(fn, *params)`` a check of the student's ``name``: ``check(ns, *params)``.

    ``answers``: the package's functions (``"module:function"``) that answer the question; the
    grader replaces them, and the helpers they call, by stand-ins in the submission's jail."""
    def decorate(body):
        @functools.wraps(body)
        def run(ns: dict, *params) -> None:
            fn = student_function(ns, name)
            wants_ns = "ns" in inspect.signature(body).parameters
            body(fn, *params, **({"ns": ns} if wants_ns else {}))
        return run
    return decorate


# --- expected values the autograder carries -----------------------------------------------------


def _key(name: str, args, kwargs) -> str:
    """A stable digest of a call: tensors by dtype, shape and bytes; the rest by repr."""
    import torch

    digest = hashlib.sha256(name.encode())

    def feed(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            digest.update(t.numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, (list, tuple)):
            digest.update(f"{type(x).__name__}{len(x)}(".encode())
            for item in x:
                feed(item)
            digest.update(b")")
        elif isinstance(x, dict):
            digest.update(b"{")
            for k in sorted(x, key=repr):
                feed(k)
                feed(x[k])
            digest.update(b"}")
        else:
            digest.update(repr(x).encode())

    feed(list(args))
    feed(dict(kwargs))
    return digest.hexdigest()[:24]


def _resolve(dotted: str):
    module, _, attr = dotted.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, attr) if attr else obj


def _encode(value):
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": value.detach().cpu().tolist(), "dtype": str(value.dtype)[6:]}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": {k: _encode(v) for k, v in value.items()}}
    return {"value": value}


def _decode(obj):
    import torch

    if "tensor" in obj:
        return torch.tensor(obj["tensor"], dtype=getattr(torch, obj["dtype"]))
    if "list" in obj:
        return [_decode(v) for v in obj["list"]]
    if "dict" in obj:
        return {k: _decode(v) for k, v in obj["dict"].items()}
    return obj["value"]


class References:
    """Expected outputs of the package's reference functions on the checks' fixed inputs.

    ``References(path, {"group_advantages": "agentic_rl.advantages:group_advantages"})``;
    ``refs("group_advantages", scores, ids, scale="group")`` returns the value recorded for exactly
    those arguments. With ``$AGENTIC_RL_RECORD`` set to a file, it calls the package instead and
    writes every value there (``release.py --record`` does this on the reference solution)."""

    def __init__(self, path: str | os.PathLike, functions: dict[str, str]):
        self.path = pathlib.Path(path)
        self.functions = functions
        self.record_to = os.environ.get(RECORD_ENV)
        if self.record_to:
            target = pathlib.Path(self.record_to)
            self.table = json.loads(target.read_text()) if target.exists() else {}
        else:
            self.table = json.loads(self.path.read_text()) if self.path.exists() else {}

    def __call__(self, name: str, *args, **kwargs):
        key = f"{name}/{_key(name, args, kwargs)}"
        if self.record_to:
            value = _resolve(self.functions[name])(*args, **kwargs)
            self.table[key] = _encode(value)
            text = json.dumps(self.table, sort_keys=True, indent=1)
            pathlib.Path(self.record_to).write_text(text)
            return value
        if key not in self.table:
            raise RuntimeError(f"the autograder has no recorded value for {name} on these inputs "
                               "(a grader bug: run `python labs/assignments/release.py --record`)")
        return _decode(self.table[key])
