"""The Gradescope autograder, run as Gradescope runs it: ``setup.sh`` in a clean virtual
environment (torch, the pinned needs, the package), then ``run_autograder`` on a submission.

Gradescope's layout is rebuilt in a folder (``$AUTOGRADER`` stands for ``/autograder``): the
zip unpacked into ``source/``, the student's notebook in ``submission/``, the results read from
``results/results.json``. Slow (a clean install of torch from the local wheel): one assignment.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "labs" / "assignments"))
import gradescope  # noqa: E402
import release  # noqa: E402


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    """A Gradescope image: the zip unpacked, ``setup.sh`` run once in a clean venv."""
    out = tmp_path_factory.mktemp("zip")
    target = gradescope.build("grpo", out)
    # Outside pytest's private folder: the notebook runs as nobody, who must reach the venv.
    base = pathlib.Path(tempfile.mkdtemp(prefix="gradescope-", dir="/tmp"))
    base.chmod(0o755)
    source = base / "autograder" / "source"
    with zipfile.ZipFile(target) as zf:
        zf.extractall(source)
        for info in zf.infolist():
            if info.external_attr >> 16:
                (source / info.filename).chmod(info.external_attr >> 16)
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True)
    env = dict(os.environ, PATH=f"{base / 'venv' / 'bin'}:{os.environ['PATH']}",
               AUTOGRADER=str(base / "autograder"), TORCH_INDEX_URL="https://pypi.org/simple")
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    done = subprocess.run(["bash", str(source / "setup.sh")], env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    solution = release.build("grpo", tmp_path_factory.mktemp("release"))["solution"]
    yield base, env, solution
    shutil.rmtree(base, ignore_errors=True)


def _run(autograder, notebook: pathlib.Path) -> dict:
    base, env, _ = autograder
    submission, results = base / "autograder" / "submission", base / "autograder" / "results"
    shutil.rmtree(submission, ignore_errors=True)
    shutil.rmtree(results, ignore_errors=True)
    submission.mkdir()
    results.mkdir()
    shutil.copy(notebook, submission / "grpo_assignment.ipynb")
    done = subprocess.run(["bash", str(base / "autograder" / "source" / "run_autograder")],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((results / "results.json").read_text())


def test_the_zip_holds_what_gradescope_needs_and_no_solution(autograder):
    base, _, _ = autograder
    source = base / "autograder" / "source"
    for name in ("setup.sh", "run_autograder", "requirements.txt", "package/pyproject.toml",
                 "grading/grade.py", "autograder/grpo-autograder.zip", "student/grpo"):
        assert (source / name).exists(), name
    assert not list(source.rglob("*-solution.ipynb"))
    assert "download.pytorch.org/whl/cpu" in (source / "setup.sh").read_text()
    assert oct(source.stat().st_mode & 0o077) == "0o0"  # root's alone after setup.sh


def test_run_autograder_grades_a_submission_in_the_clean_venv(autograder):
    _, _, solution = autograder
    full = _run(autograder, solution)
    assert full["score"] == 17 and {t["name"] for t in full["tests"]} == {"q1", "q2", "q3", "q4"}
    assert all(t["score"] == t["max_score"] for t in full["tests"]), full
    stub = _run(autograder, ROOT / "labs" / "assignments" / "grpo" / "grpo_assignment.ipynb")
    assert stub["score"] == 0 and "not implemented" in json.dumps(stub["tests"])
    assert "Not graded" not in stub["output"]
