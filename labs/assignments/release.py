"""Build the student release and the autograders of the graded assignments, with otter-grader.

    python labs/assignments/release.py                 # all assignments -> _build/assignments/
    python labs/assignments/release.py grpo --out DIR  # one assignment, another folder
    python labs/assignments/release.py --update        # also refresh the repository's student
                                                       # notebooks and tests (labs/assignments/<a>/)
    python labs/assignments/release.py grpo --record   # re-record the expected values the hidden
                                                       # tests carry (from the package, once)
    python labs/assignments/release.py --repo OWNER/NAME [--ref BRANCH] --export DIR
                                                       # the student-only tree to publish

Each assignment has one master notebook, ``<a>/answer_key/<a>_assignment.md`` (a jupytext twin
in otter-assign's format: questions, solutions, public and hidden tests, model answers and
rubrics). ``otter assign`` turns it into

- ``<out>/student/<a>/``: the notebook with the solutions and hidden tests removed, its public
  tests as files (``tests/q1.py``, ...: ``tests: files: true`` in the master's config) and the
  helper files it needs. This folder is what students get; it is checked to contain no line of
  any solution and no hidden test (the build fails otherwise).
- ``<out>/autograder/<a>-autograder.zip``: every test, with the hidden checks and the expected
  values they carry; ``grade.py`` grades submissions with its tests and checks (each notebook in
  its own jail, the checks in the grader's process).

**Colab.** otter-grader 7.0.0 refuses tests kept in the notebook's metadata on Colab
(``otter.Notebook`` raises "Tests directory ./tests does not exist") and downloads tests from
``tests: url_prefix`` only on JupyterLite, so the public tests ship as files and each notebook's
set-up cell, on Colab only, installs otter-grader and the package and fetches its own folder of
the student release (notebook, ``tests/``, helper files) from GitHub's archive of ``REPO`` at
``REF``. ``tests/test_colab_assignments.py`` runs that cell and ``grader.check`` as on Colab.

**Where students' links point.** The Colab badge, the ``pip install`` and the fetch of each
student notebook name a student-only repository, never this one (its ``answer_key/`` folders hold
the solutions, the hidden checks and their expected values). ``--repo OWNER/NAME`` and ``--ref``
set it; the default, ``YOUR-ORG/agentic-rl-assignments`` at ``main``, is a placeholder, and the
repository's own student notebooks (``--update``) keep it.

**Publishing the student release.** ``--export DIR`` writes the student-only tree: one folder
per assignment (notebook, ``tests/``, helper files), ``package/`` (the ``agentic_rl`` package's
source and ``pyproject.toml``: what the set-up cell's ``pip install
git+https://github.com/OWNER/NAME@REF#subdirectory=package`` builds) and a ``README.md``; no
``answer_key/``, no autograder, no checks module and no expected values (checked). Publish it as
its own public repository (the set-up cell fetches from it without credentials):

    python labs/assignments/release.py --repo my-org/rl-assignments --export ../rl-assignments
    cd ../rl-assignments && git init -b main && git add -A && git commit -m "Student release"
    git remote add origin git@github.com:my-org/rl-assignments.git && git push -u origin main

or as a branch of its own in another public repository (``--ref student``; ``git init -b
student`` in the export, then push that branch). Not as a branch of this repository: whoever can
read the branch can read ``main`` and its answer keys. To update a published release,
export again into the same clone (only the assignment folders, ``package/`` and ``README.md``
are rewritten; ``.git`` stays), then commit and push.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ASSIGNMENTS = ("grpo", "gae", "retool", "starpo", "rcgrpo", "gcd", "gigpo", "early_experience")
DEFAULT_OUT = ROOT / "_build" / "assignments"
MIN_LEAK = 12  # a solution line this long (stripped) must not appear in the student release
# Where the student notebooks' links point (a placeholder; --repo/--ref set the real ones)
DEFAULT_REPO, DEFAULT_REF = "YOUR-ORG/agentic-rl-assignments", "main"
OTTER_VERSION = "7.0.0"  # the otter-grader the set-up cells install on Colab
SETUP = re.compile(r'^REPO, REF = "[^"\n]*", "[^"\n]*"', re.M)  # the set-up cell's target
BADGE = re.compile(r"https://colab\.research\.google\.com/github/[^)\s]+")
# never in an exported tree (they are the answer key's or the grader's)
NOT_FOR_STUDENTS = ("answer_key", "gradelib.py", "*_checks.py", "*_reference*.json", "*.zip",
                    "*-solution.ipynb", "cases.json", "otter_config.json")


class ReleaseError(RuntimeError):
    pass


def master(assignment: str) -> pathlib.Path:
    if assignment not in ASSIGNMENTS:
        raise ReleaseError(f"unknown assignment {assignment!r}: choose from "
                           f"{', '.join(ASSIGNMENTS)}")
    return HERE / assignment / "answer_key" / f"{assignment}_assignment.md"


def solution_lines(assignment: str) -> set[str]:
    """Every line of the master's solutions (code and written) long enough to be telling."""
    import jupytext

    secret, in_block = [], False
    for cell in jupytext.read(master(assignment)).cells:
        text = cell.source.strip()
        if cell.cell_type == "raw" and text in ("# BEGIN SOLUTION", "# END SOLUTION"):
            in_block = text == "# BEGIN SOLUTION"
        elif cell.cell_type == "code":  # the lines between the "# BEGIN/END SOLUTION" comments
            secret += re.findall(r"# BEGIN SOLUTION\n(.*?)# END SOLUTION", cell.source, re.S)
        elif cell.cell_type == "markdown" and in_block:  # a written model answer and rubric
            secret.append(cell.source)
    return {line.strip() for block in secret for line in block.splitlines()
            if len(line.strip()) >= MIN_LEAK}


def leaks(assignment: str, student_dir: pathlib.Path) -> list[str]:
    """Solution lines found in any file of the student release (should be none)."""
    found = []
    secret = solution_lines(assignment)
    for path in sorted(student_dir.rglob("*")):
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if "# BEGIN SOLUTION" in text or "hidden: true" in text or "'hidden': True" in text:
            found.append(f"{path.name}: a solution or hidden-test marker")
        found += [f"{path.name}: {line}" for line in sorted(secret)
                  if line in text or line.replace('"', '\\"') in text]
    return found


def not_for_students(tree: pathlib.Path) -> list[str]:
    """Files or folders of the answer key or the grader under ``tree`` (should be none)."""
    return sorted(str(path.relative_to(tree)) for pattern in NOT_FOR_STUDENTS
                  for path in tree.rglob(pattern) if ".git" not in path.relative_to(tree).parts)


def _stage(assignment: str, workdir: pathlib.Path) -> pathlib.Path:
    """Copy the master (as .ipynb) and every file it may name into one flat folder."""
    import jupytext

    folder = HERE / assignment
    for path in list(folder.glob("*.py")) + list((folder / "answer_key").glob("*")):
        if path.is_file() and path.suffix in (".py", ".json", ".txt", ".csv"):
            shutil.copy(path, workdir / path.name)
    shutil.copy(HERE / "gradelib.py", workdir / "gradelib.py")
    nb = jupytext.read(master(assignment))
    target = workdir / f"{assignment}_assignment.ipynb"
    jupytext.write(nb, target)
    return target


def _otter(*args: str, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "otter", *args], capture_output=True,
                          text=True, env=env, cwd=cwd)


def check_target(repo: str, ref: str) -> None:
    """A GitHub OWNER/NAME and a branch or tag name, safe to write into a shell command."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+", repo):
        raise ReleaseError(f"--repo {repo!r}: expected OWNER/NAME (a GitHub repository)")
    if not re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", ref) or ".." in ref:
        raise ReleaseError(f"--ref {ref!r}: expected a branch or tag name")


def colab_url(assignment: str, repo: str = DEFAULT_REPO, ref: str = DEFAULT_REF) -> str:
    """The Colab link of a student notebook in an exported tree published as REPO at REF."""
    return (f"https://colab.research.google.com/github/{repo}/blob/{ref}/{assignment}/"
            f"{assignment}_assignment.ipynb")


def _retarget(nb, assignment: str, repo: str, ref: str) -> None:
    """Point the notebook's Colab badge and set-up cell at REPO at REF (and check that cell)."""
    setup = [c for c in nb.cells if c.cell_type == "code" and SETUP.search(c.source)]
    badges = [c for c in nb.cells if c.cell_type == "markdown" and BADGE.search(c.source)]
    if len(setup) != 1 or len(badges) != 1 or len(BADGE.findall(badges[0].source)) != 1:
        raise ReleaseError(f"{assignment}: the master needs one Colab badge and one set-up cell "
                           f"setting REPO, REF (found {len(badges)} and {len(setup)})")
    needed = [f"otter-grader=={OTTER_VERSION}", f'"*/{assignment}"', "--strip-components=2",
              f'otter.Notebook("{assignment}_assignment.ipynb")',
              "git+https://github.com/{REPO}@{REF}#subdirectory=package",
              "https://github.com/{REPO}/archive/{REF}.tar.gz"]
    missing = [text for text in needed if text not in setup[0].source]
    if missing:
        raise ReleaseError(f"{assignment}: the set-up cell lacks {missing}")
    setup[0].source = SETUP.sub(f'REPO, REF = "{repo}", "{ref}"', setup[0].source)
    badges[0].source = BADGE.sub(colab_url(assignment, repo, ref), badges[0].source)


def _normalise(notebook: pathlib.Path, assignment: str, repo: str = DEFAULT_REPO,
               ref: str = DEFAULT_REF) -> None:
    """Stable cell ids and no execution residue, so a rebuild is byte-identical; the links."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    for k, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{k}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("jupytext", None)
    _retarget(nb, assignment, repo, ref)
    nbformat.write(nb, notebook)


def build(assignment: str, out: pathlib.Path = DEFAULT_OUT, repo: str = DEFAULT_REPO,
          ref: str = DEFAULT_REF) -> dict[str, pathlib.Path]:
    """otter assign one master; returns the paths of the student folder and the autograder.

    The student notebook's links point at ``repo`` at ``ref`` (see ``export``)."""
    check_target(repo, ref)
    out = pathlib.Path(out)
    with tempfile.TemporaryDirectory(prefix=f"assign-{assignment}-") as tmp:
        tmp = pathlib.Path(tmp)
        (tmp / "in").mkdir()
        nb = _stage(assignment, tmp / "in")
        done = _otter("assign", "--no-run-tests", "--no-pdfs", nb.name, str(tmp / "dist"),
                      cwd=tmp / "in")
        if done.returncode != 0:
            raise ReleaseError(f"otter assign failed on {master(assignment)}:\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        student, autograder = out / "student" / assignment, out / "autograder"
        shutil.rmtree(student, ignore_errors=True)
        shutil.copytree(tmp / "dist" / "student", student)
        _normalise(student / nb.name, assignment, repo, ref)
        autograder.mkdir(parents=True, exist_ok=True)
        (zipfile,) = (tmp / "dist" / "autograder").glob("*.zip")
        shutil.copy(zipfile, autograder / f"{assignment}-autograder.zip")
        solution = autograder / f"{assignment}-solution.ipynb"
        shutil.copy(tmp / "dist" / "autograder" / nb.name, solution)
    found = leaks(assignment, student) + not_for_students(student)
    if not list((student / "tests").glob("q*.py")):
        found.append("no tests/ folder of public tests (tests: files: true in the config)")
    if found:
        raise ReleaseError(f"the student release of {assignment} is not student-only: "
                           + "; ".join(found[:5]))
    return {"student": student, "autograder": autograder / f"{assignment}-autograder.zip",
            "solution": solution}


STUDENT_README = """# Graded assignments

The student release of the graded assignments of the textbook *{title}*. Each folder holds one
assignment: the notebook to fill in, `tests/` (the public checks that `grader.check("q1")` runs,
smoke tests only: your grade comes from hidden tests that your instructor runs) and any helper
file it uses. `package/` is the book's Python package, `agentic_rl`, which the notebooks install.

| assignment | notebook |
|---|---|
{rows}

**On Colab.** Open the assignment's link and run the set-up cell first: it installs otter-grader
{otter} and the package, and fetches the assignment's folder from this repository
(`github.com/{repo}`, `{ref}`).

**On your own machine** (Python 3.10 or later): `pip install jupyterlab otter-grader=={otter}
./package`, then open `<assignment>/<assignment>_assignment.ipynb` in Jupyter from its own folder
(next to its `tests/`).
"""

PACKAGE_README = """# agentic-rl

The Python package (`agentic_rl`) of *{title}*, as the graded assignments install it. Its code is
under the MIT License (`LICENSE`).
"""

TITLE = "Reinforcement Learning for LLM Agents: an executable textbook"


def export(target: pathlib.Path, repo: str = DEFAULT_REPO, ref: str = DEFAULT_REF,
           assignments=ASSIGNMENTS, out: pathlib.Path | None = None) -> pathlib.Path:
    """Write the student-only tree to publish as ``repo`` at ``ref`` (see the module docstring).

    ``target`` may be a clone of that repository: only ``<a>/``, ``package/`` and ``README.md``
    are rewritten. The tree is checked to hold no answer key, autograder or solution."""
    check_target(repo, ref)
    target = pathlib.Path(target).resolve()
    if (target == ROOT or ROOT in target.parents) and ROOT / "_build" not in target.parents:
        raise ReleaseError(f"--export {target}: not inside this repository (but for _build/)")
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="export-") as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            built = list(pool.map(lambda a: build(a, pathlib.Path(out or tmp), repo, ref),
                                  assignments))  # each an otter subprocess
        for a, paths in zip(assignments, built):
            shutil.rmtree(target / a, ignore_errors=True)
            shutil.copytree(paths["student"], target / a)
    copy_package(target / "package")
    rows = "\n".join(f"| `{a}` | [open in Colab]({colab_url(a, repo, ref)}) |"
                     for a in assignments)
    (target / "README.md").write_text(STUDENT_README.format(
        title=TITLE, rows=rows, repo=repo, ref=ref, otter=OTTER_VERSION))
    found = not_for_students(target)
    for a in assignments:
        found += leaks(a, target / a)
    if found:
        raise ReleaseError(f"{target} is not student-only: " + "; ".join(found[:5]))
    return target


def copy_package(package: pathlib.Path) -> pathlib.Path:
    """The package's source as ``pip install`` builds it: ``pyproject.toml``, ``src/``, a README."""
    shutil.rmtree(package, ignore_errors=True)
    shutil.copytree(ROOT / "src" / "agentic_rl", package / "src" / "agentic_rl",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "LICENSE"):
        shutil.copy(ROOT / name, package / name)
    (package / "README.md").write_text(PACKAGE_README.format(title=TITLE))
    return package


def record(assignment: str, out: pathlib.Path = DEFAULT_OUT) -> pathlib.Path:
    """Re-record the expected values of the hidden tests by grading the solution in record mode."""
    target = HERE / assignment / "answer_key" / f"{assignment}_reference.json"
    if not target.exists():
        target.write_text("{}")  # a first recording: the autograder must carry the file
    paths = build(assignment, out)
    fresh = target.with_suffix(".recording.json")
    fresh.unlink(missing_ok=True)
    env = dict(os.environ, AGENTIC_RL_RECORD=str(fresh))
    with tempfile.TemporaryDirectory() as tmp:
        done = _otter("run", "-a", str(paths["autograder"]), "-o", tmp, str(paths["solution"]),
                      env=env)
    if done.returncode != 0 or not fresh.exists():
        raise ReleaseError(f"recording {assignment} failed:\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    fresh.replace(target)
    build(assignment, out)  # the autograder now carries the new values
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", default=list(ASSIGNMENTS))
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT)
    parser.add_argument("--update", action="store_true",
                        help="copy each student notebook and its tests/ into "
                        "labs/assignments/<a>/")
    parser.add_argument("--record", action="store_true",
                        help="re-record the expected values from the package first")
    parser.add_argument("--repo", default=DEFAULT_REPO,
                        help="the student-only GitHub repository, OWNER/NAME, that the student "
                        f"notebooks' links point at (default: the placeholder {DEFAULT_REPO})")
    parser.add_argument("--ref", default=DEFAULT_REF,
                        help=f"its branch or tag (default: {DEFAULT_REF})")
    parser.add_argument("--export", type=pathlib.Path, metavar="DIR",
                        help="write the student-only tree to publish as --repo at --ref")
    args = parser.parse_args(argv)
    try:
        if args.update and (args.repo, args.ref) != (DEFAULT_REPO, DEFAULT_REF):
            raise ReleaseError("--update keeps the placeholder links in this repository's "
                               "notebooks: use --repo/--ref with --export or --out")
        for a in args.assignments:
            master(a)  # an unknown name fails before anything is built
        for a in args.assignments:
            if args.record:
                print(f"{a}: recorded {record(a, args.out).relative_to(ROOT)}")
            if args.export and not args.update:
                continue  # export builds it
            paths = build(a, args.out, args.repo, args.ref)
            if args.update:
                name = f"{a}_assignment.ipynb"
                shutil.copy(paths["student"] / name, HERE / a / name)
                shutil.rmtree(HERE / a / "tests", ignore_errors=True)
                shutil.copytree(paths["student"] / "tests", HERE / a / "tests")
            print(f"{a}: student release {paths['student']}, autograder {paths['autograder']}")
        if args.export:
            export(args.export, args.repo, args.ref, args.assignments, args.out)
            print(f"student release to publish as github.com/{args.repo} ({args.ref}): "
                  f"{args.export}")
    except ReleaseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
