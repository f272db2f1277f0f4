"""A Gradescope autograder for an assignment, grading as ``grade.py`` does.

    python labs/assignments/gradescope.py grpo --out DIR    # DIR/grpo-gradescope.zip

Upload the zip as a Gradescope programming assignment's autograder (Ubuntu base image). Gradescope
runs ``setup.sh`` once when it builds the image, then ``run_autograder`` in a fresh container for
every submission, with the student's files in ``/autograder/submission`` and the results expected
in ``/autograder/results/results.json`` (Gradescope's autograder specification).

- ``setup.sh`` installs torch's CPU build (``download.pytorch.org/whl/cpu``: the default PyPI
  wheel would bring gigabytes of CUDA libraries), the pinned versions of what the package needs,
  and the package itself (``package/``), then makes ``/autograder/source`` (the checks and their
  expected values) readable by root alone.
- ``run_autograder`` grades the submitted notebook with :func:`grade.grade_one`. Gradescope's
  containers have no working bubblewrap, so the notebook runs there without the jail (the
  container is the boundary: one submission a container) as user ``nobody``, who can read neither
  the checks nor the expected values; the package's answers are stand-ins as everywhere.
  Each question is one Gradescope test; what the instructor should read (``similarity.py``) is a
  test hidden from the student.

The zip holds the grading modules with the assignment's answer key (checks, master, release
notebook), the otter autograder (its tests), the student release and the package's source. It is
an instructor's file: it holds every answer.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import sys
import tempfile
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import release  # noqa: E402

MODULES = ("grade.py", "gradebook.py", "gradelib.py", "gradescope.py", "release.py", "remote.py",
           "similarity.py", "standins.py", "wire.py", "worker.py")
#: What the package needs, at the versions the book is tested with (requirements.txt's pins).
NEEDS = ("transformers", "peft", "accelerate", "matplotlib", "gymnasium", "numpy", "tqdm")
SETUP = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image.
set -euo pipefail
cd "${{AUTOGRADER:-/autograder}}/source"
# torch's CPU build first: the default wheel would pull gigabytes of CUDA libraries.
python3 -m pip install -q torch=={torch} \\
  --index-url "${{TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}}"
python3 -m pip install -q -r requirements.txt
python3 -m pip install -q --no-deps ./package
chmod -R go-rwx .  # the checks and their expected values: root's alone
"""
RUN = """#!/usr/bin/env bash
# Gradescope runs this in a fresh container for every submission.
set -euo pipefail
ROOT="${{AUTOGRADER:-/autograder}}"
cd "$ROOT/source"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 AGENTIC_RL_ALLOW_UNCONTAINED_CODE=1
python3 grading/gradescope.py --run {assignment} --submission "$ROOT/submission" \\
  --results "$ROOT/results/results.json"
"""


def _pins() -> dict[str, str]:
    pins = {}
    for line in (release.ROOT / "requirements.txt").read_text().splitlines():
        name, _, version = line.split("#")[0].strip().partition("==")
        if version:
            pins[name] = version.strip()
    return pins


def build(assignment: str, out: pathlib.Path) -> pathlib.Path:
    """``<out>/<assignment>-gradescope.zip``."""
    out = pathlib.Path(out)
    with tempfile.TemporaryDirectory(prefix="gradescope-") as tmp:
        source = pathlib.Path(tmp) / "source"
        paths = release.build(assignment, source)  # source/autograder/, source/student/<a>/
        for name in paths["autograder"].parent.glob("*-solution.ipynb"):
            name.unlink()  # (the solution notebook is not needed to grade)
        grading = source / "grading"
        grading.mkdir()
        for name in MODULES:
            shutil.copy(HERE / name, grading / name)
        key = grading / assignment / "answer_key"
        key.mkdir(parents=True)
        for name in (f"{assignment}_checks.py", f"{assignment}_assignment.md"):
            shutil.copy(HERE / assignment / "answer_key" / name, key / name)
        notebook = f"{assignment}_assignment.ipynb"
        shutil.copy(HERE / assignment / notebook, grading / assignment / notebook)
        release.copy_package(source / "package")
        pins = _pins()
        (source / "requirements.txt").write_text("".join(
            f"{name}=={pins[name]}\n" if name in pins else f"{name}\n" for name in NEEDS))
        (source / "setup.sh").write_text(SETUP.format(torch=pins["torch"]))
        (source / "run_autograder").write_text(RUN.format(assignment=assignment))
        out.mkdir(parents=True, exist_ok=True)
        target = out / f"{assignment}-gradescope.zip"
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in sorted(source.rglob("*")):
                if path.is_file():
                    info = zipfile.ZipInfo.from_file(path, path.relative_to(source).as_posix())
                    if path.name in ("setup.sh", "run_autograder"):
                        info.external_attr = 0o755 << 16
                    zf.writestr(info, path.read_bytes(), zipfile.ZIP_DEFLATED)
    return target


def results(row: dict) -> dict:
    """Gradescope's ``results.json`` for a graded row (``grade.grade_one``)."""
    tests = [{"name": q, "score": v["score"], "max_score": v["possible"],
              "output": ("FLAGGED: no credit. " if v["flagged"] else "") + v["feedback"]}
             for q, v in row["questions"].items()]
    if row.get("review"):
        tests.append({"name": "for the instructor: to review", "score": 0, "max_score": 0,
                      "visibility": "hidden", "output": "\n".join(row["review"])})
    output = f"Not graded: {row['error']}" if row["error"] else (
        "Auto-graded questions; the written answers are graded by hand.")
    return {"score": sum(v["score"] for v in row["questions"].values()), "output": output,
            "tests": tests, "visibility": "after_published"}


def run(assignment: str, submission: pathlib.Path, out: pathlib.Path) -> dict:
    """Grade the notebook in ``submission`` and write Gradescope's results to ``out``."""
    import grade

    notebooks = sorted(submission.rglob("*.ipynb"))
    named = [p for p in notebooks if p.name == f"{assignment}_assignment.ipynb"]
    if len(named) == 1 or len(notebooks) == 1:
        row = grade.grade_one((named or notebooks)[0], HERE.parent / "autograder")
    else:
        row = {"questions": {}, "review": [], "error": (
            f"expected one notebook, {assignment}_assignment.ipynb; found "
            f"{', '.join(p.name for p in notebooks) or 'none'}")}
    data = results(row)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))
    return data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assignments", nargs="*", default=list(release.ASSIGNMENTS))
    parser.add_argument("--out", type=pathlib.Path, default=release.DEFAULT_OUT / "gradescope")
    parser.add_argument("--run", metavar="ASSIGNMENT", help="grade (inside Gradescope)")
    parser.add_argument("--submission", type=pathlib.Path)
    parser.add_argument("--results", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.run:
        data = run(args.run, args.submission, args.results)
        print(f"{data['score']:g} points; {data['output']}")
        return 0
    try:
        for a in args.assignments:
            print(f"{a}: {build(a, args.out)}")
    except release.ReleaseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
