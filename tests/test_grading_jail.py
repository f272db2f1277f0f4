"""Grading in a jail: what a submission's notebook can reach while it is graded, and what it costs.

``remote.Submission`` runs a notebook's code cells in ``worker.py`` inside bubblewrap; the checks
stay in this process and call the student's functions over a pipe. These tests run small notebooks
there and ask them what they can see and do: no other submission, no autograder file, no checkout,
no network, no ``/proc``, the package's answers as stand-ins; tampering with the checker or otter
changes nothing here; a notebook that exits, loops, forks or fills the disk costs only itself.
"""

from __future__ import annotations

import json
import pathlib
import random
import sys
import zipfile

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSIGNMENTS = ROOT / "labs" / "assignments"
sys.path.insert(0, str(ASSIGNMENTS))
import grade  # noqa: E402
import remote  # noqa: E402
import standins  # noqa: E402
import wire  # noqa: E402

from agentic_rl import jail  # noqa: E402

needs_jail = pytest.mark.skipif(jail.launcher().kind != "bubblewrap",
                                reason="no working bubblewrap here: the jail cannot be built")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return standins.graded_copy("grpo", tmp_path_factory.mktemp("graded"))


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """Files a grader has and a submission must not see: another student's notebook, an
    autograder with expected values."""
    folder = tmp_path_factory.mktemp("class")
    (folder / "bob.ipynb").write_text("{}")
    with zipfile.ZipFile(folder / "grpo-autograder.zip", "w") as zf:
        zf.writestr("files/grpo_reference.json", "{}")
    return folder


def _run(cells, package, release=None, timeout_s=60):
    return remote.Submission(cells, "grpo", release, package, timeout_s=timeout_s)


def test_values_cross_as_data_and_come_back_unchanged():
    values = [None, True, 3, 2 ** 60, -0.5, float("inf"), "é", (1, [2, {3: "x"}]), {1, 2},
              torch.arange(6, dtype=torch.float64).reshape(2, 3), torch.tensor([True, False]),
              torch.zeros(0, 4), torch.tensor([1.5], dtype=torch.bfloat16), random.Random(3),
              np.arange(4, dtype=np.int64).reshape(2, 2), np.float32(0.25), np.int64(7)]
    for value in values:
        back = wire.decode(json.loads(json.dumps(wire.encode(value))))
        if isinstance(value, torch.Tensor):
            assert torch.equal(back, value) and back.dtype == value.dtype
        elif isinstance(value, np.ndarray):
            assert np.array_equal(back, value) and back.dtype == value.dtype
        elif isinstance(value, random.Random):
            assert back.getstate() == value.getstate()
        else:
            assert back == value and type(back) is type(value)
    for bad in ({"tensor": "AAAA", "dtype": "object", "shape": [1]}, {"evil": 1}, [1, 2],
                {"dict": [[1]]}, {"tensor": "AAAA", "dtype": "float32", "shape": [5]}):
        with pytest.raises(wire.WireError):
            wire.decode(bad)
    assert isinstance(wire.decode(wire.encode(object())), wire.Opaque)  # its repr, not itself


@needs_jail
def test_a_notebook_sees_only_its_release_and_a_scratch_folder(package, secrets, tmp_path):
    release = tmp_path / "release"
    release.mkdir()
    (release / "toy_length.py").write_text("X = 1\n")
    probe = ("import os\n"
             "def exists(paths):\n    return [os.path.exists(p) for p in paths]\n"
             "def listing(p):\n    return sorted(os.listdir(p))\n"
             "def write(p):\n    open(p, 'w').write('x')\n    return True\n"
             "def who():\n    return os.getuid()\n"
             "def connect():\n    import socket\n"
             "    try:\n        socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
             "    except OSError as err:\n        return str(err)\n    return 'reached'\n")
    with _run([probe], package, release) as sub:
        exists = sub.function("exists")
        hidden = [str(secrets / "bob.ipynb"), str(secrets / "grpo-autograder.zip"), str(secrets),
                  str(ASSIGNMENTS / "grpo" / "answer_key"), str(ROOT / "README.md"), "/proc/1",
                  str(pathlib.Path.home() / ".cache")]
        assert exists(hidden) == [False] * len(hidden), hidden
        assert exists(["toy_length.py", str(package)]) == [True, False]
        assert sub.function("listing")(".") == ["toy_length.py"]
        assert sub.function("write")("notes.txt") is True
        with pytest.raises(OSError):  # read-only everywhere else, the package included
            sub.function("write")(str(standins.package_root() / "x.py"))
        assert sub.function("connect")() != "reached"
        assert sub.function("who")() == (65534 if jail.launcher().nobody else sub.function(
            "who")())
        assert sub.isolation == "bubblewrap"


@needs_jail
def test_the_package_answers_are_stand_ins_however_they_are_reached(package):
    cells = ["import functools, importlib, inspect\nimport agentic_rl.advantages as A\n",
             "direct = A.group_advantages\n",
             "partial = functools.partial(getattr(importlib.import_module('agentic_rl.'"
             " + 'advantages'), 'group_' + 'advantages'))\n",
             "class Wrapper:\n    def __call__(self, *a):\n        return A.group_advantages(*a)\n"
             "wrapped = Wrapper()\n",
             "TABLE = {'f': A.group_advantages}\ndef held(*a):\n    return TABLE['f'](*a)\n",
             "exec(inspect.getsource(A.group_advantages))\ncopied = group_advantages\n",
             "def helper(s, g):\n    return A.group_stats(s, g)\n",
             "def source():\n    return inspect.getsource(A.group_advantages)\n"]
    scores, ids = torch.tensor([1.0, 0.0]), torch.zeros(2)
    with _run(cells, package) as sub:
        assert not sub.errors, sub.errors
        for name in ("direct", "partial", "wrapped", "held", "copied", "helper"):
            with pytest.raises(remote.StudentError, match="not available while grading") as err:
                sub.function(name)(scores, ids)
            assert err.value.standin, name
        assert "torch" not in sub.function("source")()  # the stand-in's source, not the answer


@needs_jail
def test_tampering_with_the_checker_or_otter_has_nothing_to_act_on(package):
    cells = ["try:\n    import gradelib\n    gradelib.check = None\n    GRADELIB = 'patched'\n"
             "except ImportError as err:\n    GRADELIB = str(err)\n",
             "import otter\notter.Notebook = None\n"
             "try:\n    import otter.test_files.ok_test as t\n    t.run_doctest = None\n"
             "except ImportError:\n    pass\n",
             "def answer():\n    return GRADELIB\n"]
    with _run(cells, package) as sub:
        assert "No module named 'gradelib'" in sub.function("answer")()
    sys.path.insert(0, str(ASSIGNMENTS))
    import gradelib  # the grader's own copy is untouched
    assert callable(gradelib.check)


@needs_jail
def test_gradients_flow_back_through_the_jail_and_arguments_change_in_place(package):
    cells = ["import torch\n"
             "def loss(x, w):\n    return (x * x * w).sum()\n"
             "def detached(x):\n    return (x * 2).detach()\n"
             "def shuffle(items, rng):\n    rng.shuffle(items)\n    return items[0]\n"
             "def inplace(t):\n    t.add_(1)\n    return t.sum()\n"]
    with _run(cells, package) as sub:
        x = torch.tensor([1.0, -2.0], requires_grad=True)
        out = sub.function("loss")(x, w=torch.tensor([3.0, 0.5]))
        out.backward()
        assert torch.allclose(x.grad, torch.tensor([6.0, -2.0]))
        assert not sub.function("detached")(x).requires_grad
        items, rng, mine = list(range(8)), random.Random(5), list(range(8))
        sub.function("shuffle")(items, rng)
        random.Random(5).shuffle(mine)
        assert items == mine and rng.getstate() != random.Random(5).getstate()
        t = torch.zeros(3)
        assert sub.function("inplace")(t).item() == 3 and t.tolist() == [1.0, 1.0, 1.0]


@needs_jail
@pytest.mark.parametrize("cell, error", [
    ("import os\nos._exit(0)\n", "process ended"),
    ("while True:\n    pass\n", "stopped after"),
    ("import sys\nsys.stdout.buffer.write(b'{\"ready\": 1}\\n' * 3)\nprint('noise')\n", None),
])
def test_a_notebook_that_exits_loops_or_prints_costs_only_itself(package, cell, error):
    cells = ["def f():\n    return 1\n", cell]
    if error is None:  # prints go nowhere: the protocol is on other descriptors
        with _run(cells, package) as sub:
            assert sub.function("f")() == 1
        return
    with pytest.raises(remote.GradingError, match=error):
        _run(cells, package, timeout_s=8)


@needs_jail
def test_forks_and_big_files_stay_inside_their_limits(package):
    # (short-lived: nobody's process count is shared with any other jail running meanwhile)
    cells = ["import os\nSTARTED = 0\n"
             "try:\n    for _ in range(2000):\n        if os.fork() == 0:\n"
             "            import time\n            time.sleep(2)\n            os._exit(0)\n"
             "        STARTED += 1\nexcept OSError:\n    pass\n",
             "try:\n    with open('big', 'wb') as f:\n        for _ in range(400):\n"
             "            f.write(b'x' * (1 << 20))\n    DISK = 'wrote 400 MiB'\n"
             "except OSError as err:\n    DISK = type(err).__name__\n",
             "def report():\n    return STARTED, DISK\n"]
    with _run(cells, package, timeout_s=60) as sub:
        started, disk = sub.function("report")()
    assert disk != "wrote 400 MiB"
    if jail.launcher().nobody:  # as nobody, RLIMIT_NPROC holds
        assert started < 2000


def test_a_malformed_notebook_is_a_row_with_its_reason(tmp_path):
    bad = tmp_path / "grpo_assignment.ipynb"
    bad.write_text("{not json")
    row = grade.grade_one(bad, tmp_path / "autograder")
    assert row["assignment"] == "grpo" and "not a readable notebook" in row["error"]
    assert row["questions"] == {}


def test_without_bubblewrap_the_notebook_runs_as_nobody_with_the_stand_ins(package, monkeypatch,
                                                                           tmp_path):
    """Gradescope's containers (and some others) have no working bubblewrap: the notebook then
    runs as a plain process, only where the grader allows it, as nobody when the grader is
    root (who cannot read root's files: the checks, the expected values)."""
    import os

    monkeypatch.setattr(jail, "launcher", lambda: jail.Launcher("none", (), os.geteuid() == 0))
    monkeypatch.delenv(jail.ALLOW_UNCONTAINED, raising=False)
    cells = ["import agentic_rl.advantages as A\nimport os\n"
             "def answer(s, g):\n    return A.group_advantages(s, g)\n"
             "def readable(p):\n    return os.access(p, os.R_OK)\n"]
    with pytest.raises(remote.GradingError, match="bubblewrap"):
        remote.Submission(cells, "grpo", None, package)
    # (as grade.py does: the copy readable by nobody, in a folder nobody may enter, not list)
    import shutil
    import tempfile

    folder = pathlib.Path(tempfile.mkdtemp(prefix="graded-", dir="/tmp"))
    folder.chmod(0o711)
    package = pathlib.Path(shutil.copytree(package, folder / "agentic_rl"))
    for path in [package, *package.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    secret = tmp_path / "grpo_reference.json"
    secret.write_text("{}")
    secret.chmod(0o600)
    with remote.Submission(cells, "grpo", None, package, allow_uncontained=True) as sub:
        assert sub.isolation.startswith("uncontained")
        with pytest.raises(remote.StudentError, match="not available while grading"):
            sub.function("answer")(torch.ones(2), torch.zeros(2))
        if sub.uid == 65534:
            assert sub.function("readable")(str(secret)) is False
        else:  # a grader not root, or a Python under /root: said in the row's isolation
            assert sub.uid != 0 or "as root" in sub.isolation
    shutil.rmtree(folder)
