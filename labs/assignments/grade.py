"""Grade a folder of submitted notebooks into one CSV row per student, with otter-grader.

    python labs/assignments/grade.py SUBMISSIONS_DIR --out grades.csv
    python labs/assignments/grade.py my_grpo.ipynb                    # one notebook, a report

Every ``*.ipynb`` under the folder is a submission; the student is the notebook's path below the
folder without its suffix (``alice/grpo_assignment.ipynb`` -> ``alice``, ``bob.ipynb`` -> ``bob``).
The assignment is read from the notebook's metadata (written by ``release.py``). Each submission
is graded by ``otter run`` with the assignment's autograder (built with ``release.py`` when it is
missing), in its own process: one notebook cannot see another's.

The CSV has, per student: the assignment, the points of every auto-graded question, the total and
the possible total, the questions flagged for using the package's answer (no credit), and empty
columns for the questions graded by hand. ``--feedback DIR`` writes one short report per student:
one paragraph per question that lost points, its first sentence saying what is wrong.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import pathlib
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import release  # noqa: E402
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
    for a in sorted(release.ASSIGNMENTS, key=len, reverse=True):
        if notebook.name.startswith(a):
            return a
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


def _message(output: str) -> str:
    """One failing case's message from otter's output for a question, shortened.

    A hidden check's message (it names the function, or says FLAGGED) is preferred to a public
    smoke test's bare assertion."""
    found = []
    for block in re.split(r"\n\s*q\S* - \d+ result:\n", output):
        if "Test case failed" not in block:
            continue
        lines = block.splitlines()
        for k in range(len(lines) - 1, -1, -1):  # the exception line: "Error: message"
            match = re.match(r"\s*(?:[\w.]+\.)?(\w+(?:Error|Failed|Exception)): (.*)", lines[k])
            if match:
                found.append(" ".join([match.group(2)] + [ln.strip() for ln in lines[k + 1:]]))
                break
        else:
            found.append("a test failed: " + " ".join(ln.strip() for ln in lines[-3:]))
    if not found:
        return ""
    text = next((m for m in found if m.startswith(("`", FLAGGED))), found[0])
    return text[:MAX_FEEDBACK] + ("..." if len(text) > MAX_FEEDBACK else "")


def grade_one(notebook: pathlib.Path, autograders: pathlib.Path) -> dict:
    """Run otter on one submission; returns points and feedback per question."""
    assignment = assignment_of(notebook)
    zipfile = autograders / f"{assignment}-autograder.zip"
    if not zipfile.exists():
        release.build(assignment, autograders.parent)
    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        try:
            done = subprocess.run([sys.executable, "-m", "otter", "run", "-a", str(zipfile),
                                   "-o", tmp, str(notebook)], capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return {"assignment": assignment, "questions": {}, "error":
                    f"grading stopped after {TIMEOUT_S} s (an endless loop?)"}
        results = pathlib.Path(tmp) / "results.json"
        if not results.exists():
            return {"assignment": assignment, "questions": {}, "error":
                    "otter could not grade it: " + (done.stderr or done.stdout)[-300:].strip()}
        tests = json.loads(results.read_text())["tests"]
    questions = {}
    for test in tests:
        if "max_score" not in test or test.get("name") == "Public Tests":
            continue
        output = test.get("output", "")
        questions[test["name"]] = {"score": float(test.get("score") or 0),
                                   "possible": float(test["max_score"]),
                                   "flagged": FLAGGED in output,
                                   "feedback": _message(output)}
    return {"assignment": assignment, "questions": questions, "error": ""}


def _order(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def grade_folder(paths: list[pathlib.Path], out: pathlib.Path | None, feedback: pathlib.Path | None,
                 autograders: pathlib.Path, jobs: int = 1) -> list[dict]:
    submissions = []
    for path in paths:
        if path.is_dir():
            submissions += [(p.relative_to(path).with_suffix("").as_posix(), p)
                            for p in sorted(path.rglob("*.ipynb"))
                            if ".ipynb_checkpoints" not in p.parts]
        else:
            submissions.append((path.stem, path))
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        graded = pool.map(lambda s: grade_one(s[1], autograders), submissions)
        for (student, path), result in zip(submissions, graded):
            if student.endswith(f"/{result['assignment']}_assignment"):
                student = student.rsplit("/", 1)[0]  # alice/grpo_assignment -> alice
            result.update(student=student, path=str(path),
                          manual=manual_questions(result["assignment"]))
            rows.append(result)
    if out is not None:
        write_csv(rows, out)
    if feedback is not None:
        feedback.mkdir(parents=True, exist_ok=True)
        for row in rows:
            (feedback / f"{row['student'].replace('/', '_')}.md").write_text(report(row))
    return rows


def write_csv(rows: list[dict], out: pathlib.Path) -> None:
    auto = sorted({q for r in rows for q in r["questions"]}, key=_order)
    manual = sorted({q for r in rows for q in r["manual"]}, key=_order)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "assignment", *auto, "total", "possible",
                         *[f"{q} (by hand, /{rows[0]['manual'].get(q, 0):g})" for q in manual],
                         "flagged", "error"])
        for r in rows:
            qs = r["questions"]
            writer.writerow([r["student"], r["assignment"],
                             *[f"{qs[q]['score']:g}" if q in qs else "" for q in auto],
                             f"{sum(v['score'] for v in qs.values()):g}",
                             f"{sum(v['possible'] for v in qs.values()):g}",
                             *["" for _ in manual],
                             " ".join(q for q in sorted(qs, key=_order) if qs[q]["flagged"]),
                             r["error"]])


def report(row: dict) -> str:
    qs = row["questions"]
    total = sum(v["score"] for v in qs.values())
    possible = sum(v["possible"] for v in qs.values())
    lines = [f"# {row['student']}: {row['assignment']}, {total:g} / {possible:g} points "
             "(auto-graded)", ""]
    if row["error"]:
        lines += [f"Not graded: {row['error']}", ""]
    for q in sorted(qs, key=_order):
        v = qs[q]
        lines.append(f"- **{q}**: {v['score']:g} / {v['possible']:g}"
                     + (" (flagged: no credit)" if v["flagged"] else ""))
        if v["score"] < v["possible"] and v["feedback"]:
            lines.append(f"  {v['feedback']}")
    for q, points in row["manual"].items():
        lines.append(f"- **{q}**: graded by hand (/{points:g})")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=pathlib.Path,
                        help="a folder of submissions, or notebooks")
    parser.add_argument("--out", type=pathlib.Path, help="the CSV to write")
    parser.add_argument("--feedback", type=pathlib.Path, help="a folder for one report a student")
    parser.add_argument("--autograders", type=pathlib.Path,
                        default=release.DEFAULT_OUT / "autograder")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="submissions graded at once")
    args = parser.parse_args(argv)
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        print(f"error: not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        rows = grade_folder(args.paths, args.out, args.feedback, args.autograders, args.jobs)
    except release.ReleaseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for row in rows:
        print(report(row))
    if args.out:
        print(f"wrote {args.out} ({len(rows)} submission{'s' if len(rows) != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
