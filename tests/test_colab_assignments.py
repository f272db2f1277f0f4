"""The graded assignments as students get them: on Colab, from a student-only repository.

otter-grader 7.0.0 tells Colab by ``str(IPython.get_ipython())`` naming ``google.colab`` (Colab's
shell is ``google.colab._shell.Shell``), and there it refuses tests kept in the notebook's
metadata: ``otter.Notebook`` raises "Tests directory ./tests does not exist" and ``check`` "Test q1
does not exist". So the public tests ship as files (``tests/``) and each notebook's set-up cell
fetches its own folder of the student release. These tests run that cell and ``grader.check``
as on Colab, without Colab or the network, in a subprocess of this project's Python (torch and
otter already installed, as on Colab once the set-up cell's ``%pip`` has run):

- a fake ``google/colab/_shell.py`` (``Shell``, an IPython ``InteractiveShell``) on the path:
  ``"google.colab" in sys.modules`` and otter's ``IPythonInterpreter.COLAB.running()`` are true;
- no network: socket connections raise; the cell's ``%pip`` line goes to a magic that only
  records it (the package is already installed); its ``!wget -qO- URL | tar ...`` goes to a fake
  shell that serves GitHub's archive URL of the student repository from a tarball of the exported
  tree (``cat FILE | tar ...``, the ``tar`` part run as written) and fails any other download.

Also: the export holds no answer key, autograder or expected value, and every link in it names
the student repository; the notebooks of the previous layout (tests in the metadata) fail on the
fake Colab as the review reproduced, and pass off it.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tarfile

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSIGNMENTS = ROOT / "labs" / "assignments"
REPO, REF = "test-org/rl-assignments", "spring"
ARCHIVE_URL = f"https://github.com/{REPO}/archive/{REF}.tar.gz"
NAME = "grpo_assignment.ipynb"

spec = importlib.util.spec_from_file_location("release", ASSIGNMENTS / "release.py")
release = importlib.util.module_from_spec(spec)
spec.loader.exec_module(release)

FAKE_SHELL = '''"""Stands for Colab's shell: otter reads "google.colab" in its str()."""
from IPython.core.interactiveshell import InteractiveShell


class Shell(InteractiveShell):
    pass
'''

HARNESS = r'''
import json, os, re, shlex, socket, subprocess, sys

config = json.loads(open(sys.argv[1]).read())


def no_network(*args, **kwargs):
    raise OSError("this test has no network")


socket.socket.connect = no_network
socket.create_connection = no_network
if config["colab"]:
    from google.colab._shell import Shell
else:
    from IPython.core.interactiveshell import InteractiveShell as Shell
shell = Shell.instance()
log = {"pip": [], "system": [], "cells": []}


def fake_system(cmd):  # what `!cmd` calls; expands {VAR} from the cell, as IPython's does
    cmd = shell.var_expand(cmd, depth=1)
    log["system"].append(cmd)
    match = re.fullmatch(r"\s*wget -qO- (\S+) \|(.*)", cmd, re.S)
    if match and match.group(1) in config["archives"]:
        local = f"cat {shlex.quote(config['archives'][match.group(1)])} |{match.group(2)}"
        shell.user_ns["_exit_code"] = subprocess.call(local, shell=True)
    else:  # any other download fails, as without a network
        shell.user_ns["_exit_code"] = 1


def fake_pip(line):  # %pip: the package and otter are installed already
    log["pip"].append(line)


shell.system = fake_system
shell.register_magic_function(fake_pip, "line", "pip")
from otter.check.utils import IPythonInterpreter

log["colab"] = IPythonInterpreter.COLAB.value.running()
log["colab_module"] = "google.colab" in sys.modules
for source in config["cells"]:
    result = shell.run_cell(source, store_history=False)
    error = result.error_before_exec or result.error_in_exec
    check = shell.user_ns.pop("_check", None)
    log["cells"].append({"error": f"{type(error).__name__}: {error}" if error else None,
                         "passed": None if check is None else bool(check.passed_all)})
log["files"] = sorted(os.path.relpath(os.path.join(d, f)) for d, _, fs in os.walk(".")
                      for f in fs if not f.startswith("."))
print("RESULT " + json.dumps(log))
'''


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The student-only tree for REPO at REF (a clone's .git kept), and its GitHub archive."""
    tmp = tmp_path_factory.mktemp("colab")
    tree = tmp / "rl-assignments"
    (tree / ".git").mkdir(parents=True)
    (tree / ".git" / "HEAD").write_text("ref: refs/heads/spring\n")
    release.export(tree, REPO, REF, out=tmp / "build")
    archive = tmp / "archive.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:  # GitHub's layout: one folder, NAME-REF/
        for path in sorted(tree.rglob("*")):
            if ".git" not in path.relative_to(tree).parts and path.is_file():
                tar.add(path, arcname=f"rl-assignments-{REF}/{path.relative_to(tree)}")
    fake = tmp / "fake"  # google/ without __init__.py: a namespace package, like Colab's
    (fake / "google" / "colab").mkdir(parents=True)
    (fake / "google" / "colab" / "__init__.py").write_text('"""A stand-in for Colab."""\n')
    (fake / "google" / "colab" / "_shell.py").write_text(FAKE_SHELL)
    return {"tree": tree, "archive": archive, "fake": fake, "tmp": tmp}


def _run(exported, workdir: pathlib.Path, cells: list[str], colab: bool = True) -> dict:
    """Run cells in one IPython shell (the fake Colab's or a plain one) in workdir."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir.parent / f"{workdir.name}.json"
    config.write_text(json.dumps({"colab": colab, "cells": cells,
                                  "archives": {ARCHIVE_URL: str(exported["archive"])}}))
    path = [str(exported["fake"])] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                      if p]
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg", PYTHONPATH=os.pathsep.join(path))
    done = subprocess.run([sys.executable, "-c", HARNESS, str(config)], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    log = json.loads(lines[-1][len("RESULT "):])
    assert log["colab"] is colab and log["colab_module"] is colab, "otter must see (no) Colab"
    return log


def _cell(notebook: pathlib.Path, needle: str) -> str:
    (source,) = [c.source for c in nbformat.read(notebook, as_version=4).cells
                 if c.cell_type == "code" and needle in c.source]
    return source


def _correct_q1() -> str:
    import jupytext

    (source,) = [c.source for c in jupytext.read(release.master("grpo")).cells
                 if c.cell_type == "code" and "def group_advantages(" in c.source]
    return source


CHECK_Q1 = '\n_check = grader.check("q1")\n'


def test_export_is_student_only_and_names_the_student_repository(exported):
    tree = exported["tree"]
    assert (tree / ".git" / "HEAD").exists(), "a clone's .git is left alone"
    files = [p.relative_to(tree) for p in tree.rglob("*") if ".git" not in p.parts]
    forbidden = ["answer_key", "*_checks.py", "*_reference*.json", "gradelib.py", "*.zip",
                 "*autograder*", "*-solution.ipynb", "cases.json", "otter_config.json"]
    bad = [str(p) for p in files for pat in forbidden if any(fnmatch.fnmatch(part, pat)
                                                             for part in p.parts)]
    assert not bad, f"the student tree holds the answer key or the grader's files: {bad}"
    assert {p.parts[0] for p in files} == set(release.ASSIGNMENTS) | {"package", "README.md"}
    readme = (tree / "README.md").read_text()
    for a in release.ASSIGNMENTS:
        folder = tree / a
        assert not release.leaks(a, folder), a
        tests = sorted(p.name for p in (folder / "tests").glob("*.py"))
        assert tests and "q1.py" in tests, f"{a}: no public tests shipped as files"
        assert not any("'hidden': True" in p.read_text() for p in (folder / "tests").glob("*"))
        nb = nbformat.read(folder / f"{a}_assignment.ipynb", as_version=4)
        assert "tests" not in nb.metadata.get("otter", {}), f"{a}: tests in the metadata"
        text = json.dumps(nb.dict())
        assert "agentic-rl-book/agentic-rl" not in text and release.DEFAULT_REPO not in text, a
        setup = _cell(folder / f"{a}_assignment.ipynb", "REPO, REF =")
        assert f'REPO, REF = "{REPO}", "{REF}"' in setup and f'"*/{a}"' in setup
        assert release.colab_url(a, REPO, REF) in text and release.colab_url(a, REPO, REF) in readme
    package = tree / "package"
    assert (package / "pyproject.toml").exists()
    assert (package / "src" / "agentic_rl" / "__init__.py").exists()
    assert not list(package.rglob("__pycache__"))


def test_the_set_up_cell_and_check_work_on_colab(exported):
    """Fetch, install (faked) and self-check from an empty folder, as on a fresh Colab VM."""
    notebook = exported["tree"] / "grpo" / NAME
    stub = _cell(notebook, "def group_advantages(")
    assert "    ...\n" in stub + "\n", "the shipped cell is a stub"
    log = _run(exported, exported["tmp"] / "content", [
        _cell(notebook, "REPO, REF ="), _correct_q1() + CHECK_Q1, stub + CHECK_Q1])
    assert [c["error"] for c in log["cells"]] == [None, None, None], log["cells"]
    assert [c["passed"] for c in log["cells"]] == [None, True, False], log["cells"]
    (pip,) = log["pip"]
    assert pip == ('install -q otter-grader==7.0.0 "agentic-rl @ '
                   f'git+https://github.com/{REPO}@{REF}#subdirectory=package"')
    assert (exported["tree"] / "package" / "pyproject.toml").exists()
    (fetch,) = log["system"]
    assert fetch.split()[2] == ARCHIVE_URL, fetch
    shipped = sorted(str(p.relative_to(exported["tree"] / "grpo"))
                     for p in (exported["tree"] / "grpo").rglob("*") if p.is_file())
    assert set(shipped) <= set(log["files"]), (shipped, log["files"])
    assert not [f for f in log["files"] if f.startswith(("package", "gae", "answer_key"))]


def test_notebook_metadata_tests_fail_on_colab_as_the_review_found(exported, tmp_path):
    """The previous layout (public tests in the notebook's metadata, no tests/): otter 7.0.0
    refuses it on Colab and only there, so the test above would have caught it."""
    old = tmp_path / "old"
    old.mkdir()
    nb = nbformat.read(exported["tree"] / "grpo" / NAME, as_version=4)
    tests = {}
    for path in sorted((exported["tree"] / "grpo" / "tests").glob("q*.py")):
        scope: dict = {}
        exec(path.read_text(), scope)
        tests[scope["test"]["name"]] = scope["test"]
    nb.metadata["otter"].update(OK_FORMAT=True, tests=tests)
    nbformat.write(nb, old / NAME)
    init = f'import otter\nimport torch\ngrader = otter.Notebook("{NAME}")\n'
    correct = _correct_q1() + CHECK_Q1
    log = _run(exported, old, [init, "import os\nos.makedirs('tests')\n" + init, correct])
    errors = [c["error"] for c in log["cells"]]
    assert errors[0] == "ValueError: Tests directory ./tests does not exist", errors
    assert errors[1] is None and "Test q1 does not exist" in (errors[2] or ""), errors
    os.rmdir(old / "tests")
    log = _run(exported, old, [init, correct], colab=False)  # off Colab the metadata is read
    assert [(c["error"], c["passed"]) for c in log["cells"]] == [(None, None), (None, True)]


def test_the_repository_notebooks_ship_their_tests_and_name_no_answer_key(exported):
    for a in release.ASSIGNMENTS:
        folder = ASSIGNMENTS / a
        nb = nbformat.read(folder / f"{a}_assignment.ipynb", as_version=4)
        assert "tests" not in nb.metadata.get("otter", {}), f"{a}: run release.py --update"
        text = json.dumps(nb.dict())
        assert "agentic-rl-book/agentic-rl" not in text, f"{a}: a link to this repository"
        assert release.colab_url(a) in text and release.DEFAULT_REPO in text
        shipped = {p.name: p.read_text() for p in (exported["tree"] / a / "tests").glob("*")}
        committed = {p.name: p.read_text() for p in (folder / "tests").glob("*")}
        assert committed == shipped, f"{a}: tests/ is not the release's: run release.py --update"


def test_release_refuses_bad_targets(tmp_path, capsys):
    for repo, ref in (("a/b;rm -rf ~", "main"), ("a", "main"), ("a/b", "x y"), ("a/b", "../x")):
        with pytest.raises(release.ReleaseError):
            release.check_target(repo, ref)
    assert release.main(["--update", "--repo", "a/b"]) == 1
    assert release.main(["--export", str(ROOT / "labs"), "grpo"]) == 1
    assert "not inside this repository" in capsys.readouterr().err
