"""Build the student release and the autograders of the graded assignments, with otter-grader.

    python labs/assignments/release.py                 # all assignments -> _build/assignments/
    python labs/assignments/release.py grpo --out DIR  # one assignment, another folder
    python labs/assignments/release.py --update        # also refresh the repository's student
                                                       # notebooks (labs/assignments/<a>/*.ipynb)
    python labs/assignments/release.py grpo --record   # re-record the expected values the hidden
                                                       # tests carry (from the package, once)

Each assignment has one master notebook, ``<a>/answer_key/<a>_assignment.md`` (a jupytext twin
in otter-assign's format: questions, solutions, public and hidden tests, model answers and
rubrics). ``otter assign`` turns it into

- ``<out>/student/<a>/``: the notebook with the solutions and hidden tests removed, and the helper
  files it needs. This folder is what students get; it is checked to contain no line of any
  solution (the build fails otherwise).
- ``<out>/autograder/<a>-autograder.zip``: every test, with the hidden checks and the expected
  values they carry; ``grade.py`` grades submissions with it (``otter run``, no Docker).
"""

from __future__ import annotations

import argparse
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
        if "# BEGIN SOLUTION" in text or "hidden: true" in text:
            found.append(f"{path.name}: a solution or hidden-test marker")
        found += [f"{path.name}: {line}" for line in sorted(secret)
                  if line in text or line.replace('"', '\\"') in text]
    return found


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


def _normalise(notebook: pathlib.Path) -> None:
    """Stable cell ids and no execution residue, so a rebuild is byte-identical."""
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    for k, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{k}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("jupytext", None)
    nbformat.write(nb, notebook)


def build(assignment: str, out: pathlib.Path = DEFAULT_OUT) -> dict[str, pathlib.Path]:
    """otter assign one master; returns the paths of the student folder and the autograder."""
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
        _normalise(student / nb.name)
        autograder.mkdir(parents=True, exist_ok=True)
        (zipfile,) = (tmp / "dist" / "autograder").glob("*.zip")
        shutil.copy(zipfile, autograder / f"{assignment}-autograder.zip")
        solution = autograder / f"{assignment}-solution.ipynb"
        shutil.copy(tmp / "dist" / "autograder" / nb.name, solution)
    found = leaks(assignment, student)
    if found:
        raise ReleaseError(f"the student release of {assignment} contains solution text: "
                           + "; ".join(found[:5]))
    return {"student": student, "autograder": autograder / f"{assignment}-autograder.zip",
            "solution": solution}


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
                        help="copy each student notebook into labs/assignments/<a>/")
    parser.add_argument("--record", action="store_true",
                        help="re-record the expected values from the package first")
    args = parser.parse_args(argv)
    try:
        for a in args.assignments:
            if args.record:
                print(f"{a}: recorded {record(a, args.out).relative_to(ROOT)}")
            paths = build(a, args.out)
            if args.update:
                name = f"{a}_assignment.ipynb"
                shutil.copy(paths["student"] / name, HERE / a / name)
            print(f"{a}: student release {paths['student']}, autograder {paths['autograder']}")
    except ReleaseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
