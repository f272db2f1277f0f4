"""Grade a folder of submitted notebooks: points per question, a review column, reports, exports.

    python labs/assignments/grade.py SUBMISSIONS_DIR --out grades/ --feedback feedback/
    python labs/assignments/grade.py my_grpo.ipynb                    # one notebook, a report

Every ``*.ipynb`` under the folder is a submission; the student is the notebook's path below the
folder without its suffix (``alice/grpo_assignment.ipynb`` -> ``alice``, ``bob.ipynb`` -> ``bob``),
or their id from ``--roster`` (:mod:`gradebook`). The assignment is read from the notebook's
metadata (written by ``release.py``) or its file name.

How one submission is graded (:func:`grade_one`), in a fresh grader process of its own:

1. its notebook's code cells run in its own jail (``remote.py``, ``worker.py``): no other
   submission, no autograder file, no checkout, no network; the package's answers are stand-ins
   there (``standins.py``). A notebook that crashes, loops past ``--timeout``, forks or fills its
   disk costs only itself: one row with the reason;
2. the hidden tests of the assignment's autograder (otter's ``tests/q*.py``, their points) run
   here, in the grader's process: each check calls the student's functions in the jail and
   compares what comes back with the expected values the autograder carries. A question whose
   function reached a stand-in gets no credit and is flagged;
3. the notebook's text is read for the review column (``similarity.py``): lines that tamper or
   look things up, code that copies the package's answers.

The rows then become one CSV per assignment, reports, Canvas and Gradescope files and the written
answers to grade by hand (:mod:`gradebook`); ``--class-report`` adds the most similar pairs.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import pathlib
import re
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gradebook  # noqa: E402
import release  # noqa: E402
import similarity  # noqa: E402
import standins  # noqa: E402
from gradelib import FLAGGED  # noqa: E402

TIMEOUT_S = 900
MAX_FEEDBACK = 700  # characters of one question's paragraph


def assignment_of(notebook: pathlib.Path) -> str:
    """The assignment a submission belongs to, from otter's metadata (or its file name)."""
    try:
        meta = json.loads(notebook.read_text()).get("metadata", {})
    except (OSError, ValueError) as err:
        raise release.ReleaseError(f"{notebook}: not a readable notebook ({err})") from None
    name = meta.get("otter", {}).get("assignment_name")
    if name in release.ASSIGNMENTS:
        return name
    if assignment_of_name(notebook):
        return assignment_of_name(notebook)
    raise release.ReleaseError(f"{notebook}: cannot tell which assignment it is (no otter "
                               "metadata and no assignment name in the file name)")


def manual_questions(assignment: str) -> dict[str, float]:
    """Questions graded by hand (``manual: true`` in the master) and their points."""
    text = release.master(assignment).read_text()
    found = {}
    for config in re.findall(r"# BEGIN QUESTION\n(.*?)```", text, flags=re.S):
        fields = dict(line.split(":", 1) for line in config.strip().splitlines() if ":" in line)
        if fields.get("manual", "").strip() == "true":
            found[fields["name"].strip()] = float(fields.get("points", 0))
    return found


def notebook_cells(notebook: pathlib.Path) -> list[str]:
    """The code cells of a submitted notebook, or :class:`release.ReleaseError` saying why not."""
    try:
        nb = json.loads(notebook.read_text())
        cells = nb["cells"]
        sources = []
        for cell in cells:
            if cell.get("cell_type") == "code":
                source = cell.get("source", "")
                sources.append("".join(source) if isinstance(source, list) else str(source))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise release.ReleaseError(f"not a readable notebook ({type(err).__name__}: {err})")
    return sources


def load_tests(autograder: pathlib.Path) -> list[dict]:
    """The questions of an autograder zip (otter's OK format): name and cases, each case with its
    code and points (otter's rule: a question's points shared among cases without their own)."""
    import runpy
    import zipfile

    questions = []
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(autograder) as zf:
        for name in sorted(n for n in zf.namelist() if re.fullmatch(r"tests/[^/]+\.py", n)):
            path = pathlib.Path(tmp) / pathlib.Path(name).name
            path.write_bytes(zf.read(name))
            test = runpy.run_path(str(path))["test"]
            cases = [c for suite in test["suites"] for c in suite["cases"]]
            given = sum(c["points"] for c in cases if c.get("points") is not None)
            free = [c for c in cases if c.get("points") is None]
            share = ((test.get("points") or 0) - given) / len(free) if free else 0
            questions.append({"name": test["name"], "cases": [
                {"code": c["code"], "hidden": c.get("hidden", False),
                 "points": float(c["points"] if c.get("points") is not None else share)}
                for c in cases]})
    return sorted(questions, key=lambda q: _order(q["name"]))


def _case_source(code: str) -> str:
    return "\n".join(line[4:] if line.startswith((">>> ", "... ")) else line
                     for line in code.splitlines() if line.startswith((">>> ", "... ")))


def _checks_folder(autograder: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path:
    """The autograder's files (checks, gradelib, expected values), in the grader's own folder."""
    import zipfile

    with zipfile.ZipFile(autograder) as zf:
        for name in zf.namelist():
            if name.startswith("files/") and not name.endswith("/"):
                target = tmp / name[len("files/"):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    return tmp


def _failure(err: BaseException) -> str:
    text = str(err)
    return text if isinstance(err, AssertionError) and text else f"{type(err).__name__}: {text}"


def grade_one(notebook: pathlib.Path, autograders: pathlib.Path,
              timeout_s: float = TIMEOUT_S) -> dict:
    """Grade one submission: its notebook runs in its jail (``remote.py``), the checks here."""
    import remote

    try:
        assignment = assignment_of(notebook)
        cells = notebook_cells(notebook)
    except release.ReleaseError as err:
        return {"assignment": assignment_of_name(notebook), "questions": {}, "error": str(err)}
    zipfile = autograders / f"{assignment}-autograder.zip"
    student_dir = autograders.parent / "student" / assignment
    if not zipfile.exists() or not student_dir.exists():
        release.build(assignment, autograders.parent)
    questions = load_tests(zipfile)
    scores = {q["name"]: {"score": 0.0, "possible": sum(c["points"] for c in q["cases"]),
                          "flagged": False, "feedback": ""} for q in questions}
    row = {"assignment": assignment, "questions": scores, "error": "", "isolation": "",
           "review": review(notebook, assignment)}
    with tempfile.TemporaryDirectory(prefix="grader-") as tmp:
        tmp = pathlib.Path(tmp)
        tmp.chmod(0o711)  # (without a jail, the notebook runs as nobody: it may read the package
        (tmp / "checks").mkdir(mode=0o700)  # copy, never the checks and their expected values)
        checks = _checks_folder(zipfile, tmp / "checks")
        package = standins.graded_copy(assignment, tmp / "package")
        for path in [package.parent, *package.parent.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        sys.path.insert(0, str(checks))
        try:
            with remote.Submission(cells, assignment, student_dir, package,
                                   timeout_s=timeout_s) as sub:
                row["isolation"] = sub.isolation
                if sub.isolation != "bubblewrap":
                    row["review"].append(f"graded {sub.isolation}: not in a jail")
                _run_questions(questions, sub, scores)
        except remote.GradingError as err:
            row["error"] = str(err)
        finally:
            sys.path.remove(str(checks))
    return row


def review(notebook: pathlib.Path, assignment: str) -> list[str]:
    """What the instructor should read (``similarity.py``, the notebook's text only): lines that
    tamper, obfuscate or look things up, and code that copies the package's answers or helpers."""
    base = similarity.release_notebook(assignment)
    cells = similarity.student_cells(notebook, base)
    copies = similarity.copy_review(cells, standins.stand_ins(assignment))
    return similarity.review_flags(cells, base) + ([f"copies: {copies}"] if copies else [])


def _run_questions(questions: list[dict], sub, scores: dict) -> None:
    import torch

    base = {"torch": torch, "__builtins__": __builtins__}
    base.update({name: sub.function(name) for name in sub.callables})
    for question in questions:
        messages, got = [], scores[question["name"]]
        reached = len(sub.standins_reached)
        for case in question["cases"]:
            ns = dict(base)
            try:
                exec(compile(_case_source(case["code"]), f"<{question['name']}>", "exec"), ns)
            except Exception as err:  # a failed check (GradingError is not an Exception)
                messages.append(_failure(err))
                got["flagged"] |= str(err).startswith(FLAGGED)
            else:
                got["score"] += case["points"]
        if len(sub.standins_reached) > reached and not got["flagged"]:  # (however the check
            got["flagged"] = True  # took the error: a stand-in was reached during this question)
            which = sub.standins_reached[-1].removeprefix("NotAvailableWhileGrading: ")
            messages.insert(0, f"{FLAGGED}: no credit: the code reached the package's answer: "
                               f"{which}")
        if got["flagged"]:
            got["score"] = 0.0  # no credit for a question whose function reached the answer
        got["feedback"] = _feedback(messages, sub.errors)


def _feedback(messages: list[str], cell_errors: list[dict]) -> str:
    """The most telling failure (a hidden check's sentence), shortened, with the error of the
    cell that left a function undefined."""
    if not messages:
        return ""
    text = next((m for m in messages if m.startswith(("`", FLAGGED))), messages[0])
    if "is not defined" in text and cell_errors:
        e = cell_errors[0]
        text += (f" (Code cell {int(e.get('cell', 0)) + 1} of the notebook raised {e.get('type')}"
                 f"{' at line ' + str(e['line']) if e.get('line') else ''}: {e.get('message')})")
    return text[:MAX_FEEDBACK] + ("..." if len(text) > MAX_FEEDBACK else "")


def assignment_of_name(notebook: pathlib.Path) -> str:
    """The assignment named by the file name alone ('' when none)."""
    return next((a for a in sorted(release.ASSIGNMENTS, key=len, reverse=True)
                 if notebook.name.startswith(a)), "")


def _order(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def submissions_in(paths: list[pathlib.Path]) -> list[tuple[str, pathlib.Path]]:
    """``(student, notebook)`` for every ``*.ipynb`` under the folders (and the notebooks) given:
    the student is the path below the folder without its suffix, or its folder when the file is
    ``<assignment>_assignment.ipynb`` (``alice/grpo_assignment.ipynb`` -> ``alice``)."""
    found = []
    for path in paths:
        if path.is_dir():
            found += [(p.relative_to(path).with_suffix("").as_posix(), p)
                      for p in sorted(path.rglob("*.ipynb")) if ".ipynb_checkpoints" not in p.parts]
        else:
            found.append((path.stem, path))
    out = []
    for student, path in found:
        name = assignment_of_name(path)
        if name and student.endswith(f"/{name}_assignment"):
            student = student.rsplit("/", 1)[0]
        out.append((student, path))
    return out


def grade_folder(paths: list[pathlib.Path], autograders: pathlib.Path, jobs: int = 1,
                 timeout_s: float = TIMEOUT_S) -> list[dict]:
    """One row per submission (see :mod:`gradebook` for the rows' fields and what is made of
    them). A fresh grader process per submission (its checks' state is its own), ``jobs`` at a
    time; each submission's notebook runs in its own jail."""
    submissions = submissions_in(paths)
    rows = []
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max(1, jobs), mp_context=context,
                                                max_tasks_per_child=1) as pool:
        graded = pool.map(grade_one, [p for _, p in submissions],
                          [autograders] * len(submissions), [timeout_s] * len(submissions))
        for (student, path), result in zip(submissions, graded):
            known = result["assignment"] in release.ASSIGNMENTS
            result.update(student=student, path=str(path),
                          manual=manual_questions(result["assignment"]) if known else {})
            rows.append(result)
    return rows


def class_reports(rows: list[dict], folder: pathlib.Path) -> list[pathlib.Path]:
    """One MOSS-style report per assignment: the most similar pairs of submissions to read."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for assignment in sorted({r["assignment"] for r in rows} & set(release.ASSIGNMENTS)):
        base = similarity.release_notebook(assignment)
        cells = {r["student"]: similarity.student_cells(pathlib.Path(r["path"]), base)
                 for r in rows if r["assignment"] == assignment}
        path = folder / f"{assignment}_similar_pairs.md"
        path.write_text(f"# {assignment}: the most similar submissions\n\n"
                        + similarity.class_report(cells, release=base))
        written.append(path)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=pathlib.Path,
                        help="a folder of submissions, or notebooks")
    parser.add_argument("--autograders", type=pathlib.Path,
                        default=release.DEFAULT_OUT / "autograder")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="submissions graded at once")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S,
                        help=f"seconds a submission may take, its notebook and checks "
                             f"(default {TIMEOUT_S:g})")
    parser.add_argument("--class-report", type=pathlib.Path,
                        help="a folder: the most similar pairs of submissions, per assignment")
    gradebook.add_arguments(parser)
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        print(f"error: not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        rows = grade_folder(args.paths, args.autograders, args.jobs, args.timeout)
        warnings = gradebook.export(rows, args)
    except (release.ReleaseError, gradebook.RosterError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.class_report:
        class_reports(rows, args.class_report)
    for row in rows:
        print(gradebook.report(row))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.out:
        print(f"wrote {args.out} ({len(rows)} submission{'s' if len(rows) != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
