"""Keep the graded assignments out of the book's own test run.

- Student notebooks (``*.ipynb`` here) are stubs that raise ``NotImplementedError``: nbval never
  collects them.
- The autograders (``test_*_assignment.py``) grade *a student's* notebook, so they run only when
  asked for by path: ``pytest labs/assignments/grpo/``. A plain ``pytest`` from the repository
  root skips them; ``tests/test_assignments.py`` runs each one against the stubs (it must fail,
  naming the functions) and against the reference solutions (it must pass).
"""

from __future__ import annotations

import pathlib

HERE = pathlib.Path(__file__).resolve().parent


def _asked_for(config) -> bool:
    for arg in config.args:
        path = pathlib.Path(str(arg).split("::")[0])
        path = (pathlib.Path(config.invocation_params.dir) / path).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path, config):
    path = pathlib.Path(collection_path)
    if path.suffix == ".ipynb":
        return True
    if path.name.startswith("test_") and path.suffix == ".py" and not _asked_for(config):
        return True
    return None
