"""What the autograders share: load a student's notebook, call its functions, report sentences.

The grader runs only the code cells tagged ``graded`` of the notebook, in a fresh namespace, and
then calls the functions they define. Every failure is reported with
``pytest.fail(..., pytrace=False)``: a sentence that names the function and the expectation it
missed, never a traceback of the grader.

Which notebook: ``$ASSIGNMENT_NOTEBOOK`` when set (a ``.ipynb`` or its ``.md`` twin), else the
student notebook next to the grader. CI sets it to the reference solution.
"""

from __future__ import annotations

import os
import pathlib
import sys
import traceback

import pytest

GRADED_TAG = "graded"


class SubmissionError(Exception):
    """The notebook could not be read or one of its graded cells failed to run."""


def load_submission(default: pathlib.Path) -> dict:
    """Execute the ``graded`` code cells of the notebook and return their namespace."""
    import jupytext

    path = pathlib.Path(os.environ.get("ASSIGNMENT_NOTEBOOK", default))
    if not path.exists():
        raise SubmissionError(f"notebook {path} not found")
    try:
        nb = jupytext.read(path)
    except Exception as err:  # a notebook damaged by hand
        raise SubmissionError(f"could not read {path.name}: {err}") from None
    cells = [c for c in nb.cells
             if c.cell_type == "code" and GRADED_TAG in c.get("metadata", {}).get("tags", [])]
    if not cells:
        raise SubmissionError(f"{path.name} has no code cell tagged '{GRADED_TAG}'")
    sys.path.insert(0, str(default.parent))  # helper modules next to the notebook (toy models)
    namespace: dict = {"__name__": "submission"}
    for k, cell in enumerate(cells, 1):
        source = "\n".join(line for line in cell.source.splitlines()
                           if not line.lstrip().startswith(("%", "!")))  # no magics or shell lines
        try:
            exec(compile(source, f"<{path.name}: graded cell {k}>", "exec"), namespace)
        except Exception as err:
            tb_line = traceback.extract_tb(err.__traceback__)[-1].lineno
            line = getattr(err, "lineno", None) or tb_line
            problem = f"graded cell {k} of {path.name} raised {type(err).__name__}: {err} " \
                      f"(line {line} of that cell)"
            break
    else:
        return namespace
    raise SubmissionError(problem)


def fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


def call(ns: dict, name: str, *args, **kwargs):
    """Call the student's ``name``; turn any exception into a one-sentence failure."""
    fn = ns.get(name)
    if not callable(fn):
        fail(f"`{name}` is not defined in the graded cells of the notebook")
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        message = f"`{name}` is not implemented yet (it raises NotImplementedError)"
    except Exception as err:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if "graded cell" in f.filename]
        where = f" at line {frames[-1].lineno} of its cell" if frames else ""
        message = f"`{name}` raised {type(err).__name__}{where}: {err}"
    fail(message)  # outside the except block, so pytest shows no chained traceback


def convention_hints(fn, kind: str) -> str:
    """Sentences from ``agentic_rl.check.check_implementation`` naming the convention that differs.

    ``fn`` must take the arguments that ``kind`` passes (see ``agentic_rl.check``); wrap the
    student's function in a lambda where its signature differs. The checker is optional: when the
    package does not have it, or it cannot run ``fn``, this returns an empty string and the
    grader's own sentence stands alone. It is called only once a check has failed, to explain it.
    """
    try:
        from agentic_rl.check import check_implementation
    except ImportError:
        return ""
    try:
        report = check_implementation(fn, kind)
    except Exception:
        return ""
    if getattr(report, "passed", True):
        return ""
    differences = getattr(report, "differences", []) or []
    return (" The package's checker says: " + " ".join(differences)) if differences else ""


def expect_close(name: str, got, want, what: str, *, atol: float = 1e-6, rtol: float = 1e-5,
                 hint="") -> None:
    """Fail with a sentence unless ``got`` matches ``want`` (tensors of the same shape).

    ``hint`` is a string, or a function returning one that is called only on failure (e.g. a
    ``convention_hints`` call, which runs the package's checker)."""
    import torch

    if not isinstance(got, torch.Tensor):
        fail(f"`{name}` should return a torch.Tensor for {what}, got {type(got).__name__}")
    if tuple(got.shape) != tuple(want.shape):
        fail(f"`{name}` returned shape {tuple(got.shape)} for {what}; expected {tuple(want.shape)}")
    got64, want64 = got.detach().double(), want.detach().double()
    if not torch.allclose(got64, want64, atol=atol, rtol=rtol, equal_nan=False):
        diff = (got64 - want64).abs()
        idx = diff.flatten().argmax().item()
        where = f" at position {tuple(divmod(idx, got.shape[-1]))}" if got.ndim == 2 else (
            f" at index {idx}" if got.ndim == 1 else "")
        hint = hint() if callable(hint) else hint
        fail(f"`{name}` is wrong for {what}:{where} it gave {got64.flatten()[idx].item():.6g}, "
             f"expected {want64.flatten()[idx].item():.6g} (max |difference| "
             f"{diff.max().item():.3g}).{hint}")
