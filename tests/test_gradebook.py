"""The gradebook (``labs/assignments/gradebook.py``) on hand-made rows and tiny notebooks: no otter.

Rows are what ``grade.py`` produces, one per submission. Checked: ids from a roster (and the
warnings for a student not on it and one without a submission), a mixed folder (two assignments of
one student: two CSVs with their own headers, two reports), an ungraded submission's possible
points, the late policy at its boundaries, the Canvas and Gradescope files, the written answers
collected from the student release with an answer typed in, and bad input (a roster without an id
column, a malformed notebook).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import importlib.util
import os
import pathlib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSIGNMENTS = ROOT / "labs" / "assignments"
_spec = importlib.util.spec_from_file_location("gradebook", ASSIGNMENTS / "gradebook.py")
gb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gb)

GRPO = {"q1": 6.0, "q2": 5.0, "q3": 3.0, "q4": 3.0}  # auto-graded; q5 is by hand (3)
GAE = {"q1": 9.0, "q2": 3.0, "q3": 3.0}  # q4 is by hand (3)
UTC = dt.timezone.utc
DEADLINE = dt.datetime(2026, 10, 1, 23, 59, tzinfo=UTC)


def _row(student, assignment="grpo", lost=None, error="", path="", flagged=()):
    """A graded row: full points except ``lost`` ({question: points lost}); none if ``error``."""
    points, manual = (GRPO, {"q5": 3.0}) if assignment == "grpo" else (GAE, {"q4": 3.0})
    lost = lost or {}
    questions = {} if error else {
        q: {"score": p - lost.get(q, 0.0), "possible": p, "flagged": q in flagged,
            "feedback": "`group_advantages` divides by the biased std." if q in lost else ""}
        for q, p in points.items()}
    return {"student": student, "path": str(path), "assignment": assignment,
            "questions": questions, "manual": dict(manual), "error": error,
            "review": ["q1: similar to agentic_rl.advantages:group_advantages (0.97)"]
            if flagged else []}


def _csv(path):
    with pathlib.Path(path).open(newline="", encoding="utf-8") as handle:
        return list(csv.reader(handle))


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def _roster(tmp_path):
    return gb.load_roster(_write(tmp_path / "roster.csv", (
        "id,name,email,SIS User ID,login,section,file\n"
        "1001,Alice Liddell,alice@uni.edu,S-1,aliddell,A,alice\n"
        "1002,Bob Brown,bob@uni.edu,S-2,bbrown,B,bob\n")))


# --------------------------------------------------------------------------- roster and ids


def test_roster_gives_ids_and_reports_unknown_and_missing_students(tmp_path):
    rows = [_row("alice"), _row("carol")]
    warnings = gb.resolve_ids(rows, _roster(tmp_path), assignments="grpo")
    alice, carol, bob = rows
    assert (alice["student_id"], alice["name"], alice["email"], alice["id_source"]) == (
        "1001", "Alice Liddell", "alice@uni.edu", "roster")
    assert (alice["sis_id"], alice["login"], alice["section"]) == ("S-1", "aliddell", "A")
    assert (carol["student_id"], carol["id_source"]) == ("carol", "file name")
    assert (bob["student_id"], bob["error"], bob["assignment"]) == ("1002", "no submission", "grpo")
    assert any("carol" in w and "not on the roster" in w for w in warnings), warnings
    assert any("1002" in w and "no submission of grpo" in w for w in warnings), warnings
    gb.write_assignment_csvs(rows, tmp_path / "out")
    table = {r[0]: r for r in _csv(tmp_path / "out" / "grpo.csv")}
    header = _csv(tmp_path / "out" / "grpo.csv")[0]
    assert header[:5] == ["student_id", "name", "email", "id source", "file"]
    assert table["1001"][3] == "roster" and table["carol"][3] == "file name"
    bob_row = dict(zip(header, table["1002"]))
    assert (bob_row["total"], bob_row["possible"], bob_row["final"]) == ("0", "17", "0")
    assert bob_row["error"] == "no submission"


def test_roster_without_file_column_matches_login_or_email_and_reads_a_canvas_export(tmp_path):
    roster = gb.load_roster(_write(tmp_path / "canvas.csv", (
        "Student,ID,SIS User ID,SIS Login ID,Section,GRPO (77)\n"
        "    Points Possible,,,,,20\n"
        '"Liddell, Alice",5551,S-1,aliddell,A,\n'
        '"Brown, Bob",5552,S-2,bbrown,B,\n')))
    assert [e["canvas_id"] for e in roster] == ["5551", "5552"]  # Canvas's ID is Canvas's id
    rows = [_row("submissions/aliddell"), _row("BBROWN")]  # a folder, and another case
    assert gb.resolve_ids(rows, roster) == []
    assert [r["student_id"] for r in rows] == ["5551", "5552"]
    plain = gb.load_roster(_write(tmp_path / "plain.csv", "id,email\n7,dana@uni.edu\n"))
    rows = [_row("dana")]
    gb.resolve_ids(rows, plain)
    assert (rows[0]["student_id"], rows[0]["canvas_id"]) == ("7", "")  # not a Canvas export


def test_bad_roster_is_a_clear_error(tmp_path):
    path = _write(tmp_path / "roster.csv", "name,email\nAlice,alice@uni.edu\n")
    with pytest.raises(gb.RosterError, match=r"no id column.*'id'.*name, email"):
        gb.load_roster(path)
    with pytest.raises(gb.RosterError, match=r"line 3: id '1' is already on line 2"):
        gb.load_roster(_write(tmp_path / "twice.csv", "id,name\n1,Alice\n1,Bob\n"))
    with pytest.raises(gb.RosterError, match=r"line 2: 'Alice' has no id"):
        gb.load_roster(_write(tmp_path / "blank.csv", "id,name\n,Alice\n"))


# --------------------------------------------------------------------------- CSVs and reports


def test_mixed_folder_gives_one_csv_and_one_report_per_assignment(tmp_path):
    rows = [_row("alice", "grpo", lost={"q1": 1.5}, flagged=("q2",)),
            _row("alice", "gae", lost={"q3": 1.0}),
            _row("bob", "grpo", error="the kernel died")]
    gb.resolve_ids(rows)
    written = gb.write_assignment_csvs(rows, tmp_path / "grades")
    assert sorted(p.name for p in written) == ["gae.csv", "grpo.csv"]
    grpo, gae = _csv(tmp_path / "grades" / "grpo.csv"), _csv(tmp_path / "grades" / "gae.csv")
    assert grpo[0][5:10] == ["q1 (/6)", "q2 (/5)", "q3 (/3)", "q4 (/3)", "q5 (by hand, /3)"]
    assert gae[0][5:9] == ["q1 (/9)", "q2 (/3)", "q3 (/3)", "q4 (by hand, /3)"]
    assert grpo[0][10:] == ["total", "possible", "submitted (source)", "late days", "penalty",
                            "final", "flagged", "review", "error"]
    alice, bob = (dict(zip(grpo[0], line)) for line in grpo[1:])
    assert (alice["q1 (/6)"], alice["total"], alice["possible"]) == ("4.5", "15.5", "17")
    assert alice["flagged"] == "q2" and "group_advantages (0.97)" in alice["review"]
    assert (bob["q1 (/6)"], bob["total"], bob["possible"], bob["error"]) == (
        "", "0", "17", "the kernel died")  # 0 / 17, not 0 / 0
    assert [line[0] for line in gae[1:]] == ["alice"]

    reports = gb.write_reports(rows, tmp_path / "feedback")
    assert sorted(p.name for p in reports) == ["alice__gae.md", "alice__grpo.md", "bob__grpo.md"]
    text = (tmp_path / "feedback" / "alice__grpo.md").read_text()
    assert text.startswith("# alice: grpo, 15.5 / 17 points (auto-graded)")
    assert "- **q1**: 4.5 / 6\n  `group_advantages` divides" in text
    assert "- **q5**: graded by hand (/3)" in text
    dead = (tmp_path / "feedback" / "bob__grpo.md").read_text()
    assert dead.startswith("# bob: grpo, not graded: the kernel died\n\n0 / 17 points")
    single = tmp_path / "grades.csv"  # --out grades.csv keeps working for one assignment
    assert gb.write_assignment_csvs(rows[1:2], single) == [single]
    assert [p.name for p in gb.write_assignment_csvs(rows, single)] == [
        "grades_gae.csv", "grades_grpo.csv"]


def test_possible_points_of_an_ungraded_assignment(tmp_path):
    rows = [_row("bob", "grpo", error="the kernel died")]  # no graded row to learn from
    assert gb.possible_points(rows) == {"grpo": GRPO}  # the master's points
    assert "0 / 17 points" in gb.report(rows[0])
    partial = _row("alice")
    del partial["questions"]["q4"]  # a question otter did not report
    assert gb.possible_points([partial])["grpo"] == GRPO
    assert "14 / 17 points" in gb.report(partial)
    toy = [dict(_row("bob", "grpo", error="timeout"), assignment="toy")]
    assert gb.possible_points(toy, possible={"toy": {"q1": 2.0, "q2": 2.0}}) == {
        "toy": {"q1": 2.0, "q2": 2.0}}
    gb.write_assignment_csvs(toy, tmp_path, possible={"toy": {"q1": 2.0, "q2": 2.0}})
    header, line = _csv(tmp_path / "toy.csv")
    assert header[5:7] == ["q1 (/2)", "q2 (/2)"] and dict(zip(header, line))["possible"] == "4"


# --------------------------------------------------------------------------- late days


@pytest.mark.parametrize("late, expected", [
    (dt.timedelta(seconds=-1), (0, 1.0)),
    (dt.timedelta(0), (0, 1.0)),  # at the deadline: on time
    (dt.timedelta(microseconds=1), (1, 0.9)),  # any started day counts
    (dt.timedelta(days=1), (1, 0.9)),
    (dt.timedelta(days=1, seconds=1), (2, 0.8)),
    (dt.timedelta(days=3), (3, 0.7)),  # the last day that earns credit
    (dt.timedelta(days=3, microseconds=1), (4, 0.0)),  # beyond the most late days: nothing
])
def test_late_penalty_boundaries(late, expected):
    assert gb.late_penalty(DEADLINE + late, DEADLINE, 0.1, 3) == expected


def test_late_penalty_without_cap_timezones_and_bad_input():
    assert gb.late_penalty(DEADLINE + dt.timedelta(days=12), DEADLINE, 0.1, None) == (12, 0.0)
    # 22:00 UTC is 00:00 the next day at +02:00: one minute after 23:59 there
    assert gb.late_penalty("2026-10-01T22:00Z", "2026-10-01T23:59+02:00", 0.25, 3) == (1, 0.75)
    assert gb.parse_time("2026-10-01T23:59").tzinfo is not None  # no zone: local time
    assert gb.parse_time("2026-10-01 23:59:00 -0700").utcoffset() == dt.timedelta(hours=-7)
    with pytest.raises(ValueError, match="fraction per day"):
        gb.late_penalty(DEADLINE, DEADLINE, 10, 3)
    with pytest.raises(ValueError, match="not an ISO date"):
        gb.parse_time("next Tuesday")


def test_submission_time_from_manifest_roster_or_file(tmp_path):
    notebook = _write(tmp_path / "carol.ipynb", "{}")
    stamp = (DEADLINE + dt.timedelta(hours=30)).timestamp()
    os.utime(notebook, (stamp, stamp))
    rows = [_row("alice"), _row("bob"), _row("carol", path=notebook), _row("dana")]
    gb.resolve_ids(rows)
    rows[0]["roster_submitted_at"] = "2026-10-01T12:00Z"
    manifest = gb.load_manifest(_write(tmp_path / "manifest.csv", (
        "file,submitted_at\nbob,2026-10-02T00:30+00:00\n")))
    assert gb.apply_late(rows, "2026-10-01T23:59Z", 0.1, 3, manifest) == []
    got = {r["student"]: (r["submitted_source"], r["late_days"], r["late_factor"]) for r in rows}
    assert got == {"alice": ("roster", 0, 1.0), "bob": ("manifest", 1, 0.9),
                   "carol": ("file time", 2, 0.8), "dana": ("", 0, 1.0)}
    gb.write_assignment_csvs(rows, tmp_path / "out")
    header, *lines = _csv(tmp_path / "out" / "grpo.csv")
    bob = dict(zip(header, lines[1]))
    assert bob["submitted (source)"] == "2026-10-02T00:30+00:00 (manifest)"
    assert (bob["late days"], bob["penalty"], bob["total"], bob["final"]) == ("1", "0.1", "17",
                                                                             "15.3")
    assert "Submitted 2 days late" in gb.report(rows[2]) and "penalty 20%" in gb.report(rows[2])
    per_assignment = [_row("erin", "grpo"), _row("erin", "gae")]
    for r in per_assignment:
        r["roster_submitted_at"] = "2026-10-03T10:00Z"
    gb.resolve_ids(per_assignment)
    gb.apply_late(per_assignment, ["2026-10-01T23:59Z", "gae=2026-10-05T23:59Z"])
    assert [r["late_days"] for r in per_assignment] == [2, 0]


# --------------------------------------------------------------------------- exports


def test_canvas_import_file(tmp_path):
    rows = [_row("alice", lost={"q1": 2.0}), _row("carol")]
    gb.resolve_ids(rows, _roster(tmp_path), assignments="grpo")
    rows[0]["manual_scores"] = {"q5": 2.0}
    out = tmp_path / "canvas.csv"
    warnings = gb.canvas_csv(rows, "GRPO assignment (4242)", out)
    lines = _csv(out)
    assert lines[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                        "GRPO assignment (4242)"]
    assert lines[1] == ["Points Possible", "", "", "", "", "20"]  # 17 auto-graded + 3 by hand
    assert lines[2:] == [["Alice Liddell", "", "S-1", "aliddell", "A", "17"],
                         ["Bob Brown", "", "S-2", "bbrown", "B", "0"],  # no submission
                         ["carol", "", "", "", "", "17"]]
    assert any("by name: carol" in w for w in warnings), warnings
    mixed = [_row("alice", "grpo"), _row("alice", "gae")]
    gb.resolve_ids(mixed)
    gb.canvas_csv(mixed, {"grpo": "GRPO (1)"}, out)
    assert _csv(out)[0][5:] == ["gae", "GRPO (1)"] and _csv(out)[2][5:] == ["15", "17"]
    with pytest.raises(ValueError, match="one assignment: got gae, grpo"):
        gb.canvas_csv(mixed, "GRPO (1)", out)


def test_gradescope_scores_file(tmp_path):
    rows = [_row("alice", lost={"q2": 5.0}), _row("carol")]
    gb.resolve_ids(rows, _roster(tmp_path), assignments="grpo")
    out = tmp_path / "gs" / "grpo.csv"
    warnings = gb.gradescope_csv(rows, out)
    assert _csv(out) == [["Name", "Email", "SID", "Score"],
                         ["Alice Liddell", "alice@uni.edu", "1001", "12"],
                         ["Bob Brown", "bob@uni.edu", "1002", "0"],
                         ["carol", "", "carol", "17"]]
    assert any("no email for 1 student(s)" in w for w in warnings), warnings
    with pytest.raises(ValueError, match="one assignment"):
        gb.gradescope_csv(rows + [_row("alice", "gae")], out)


# --------------------------------------------------------------------------- written answers


def _submission(folder, answer=None, drop_marker=False):
    """The student release of grpo, with ``answer`` typed into q5's answer cell."""
    nb = nbformat.read(ASSIGNMENTS / "grpo" / "grpo_assignment.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown" and "otter_answer_cell" in cell.metadata.get("tags", []):
            cell.source = answer if answer is not None else cell.source
    if drop_marker:
        nb.cells = [c for c in nb.cells if gb.BEGIN not in c.source]
    folder.mkdir(parents=True)
    path = folder / "grpo_assignment.ipynb"
    nbformat.write(nb, path)
    return path


def test_written_answers_are_collected_for_hand_grading(tmp_path):
    subs = tmp_path / "subs"
    answer = "# My derivation\n\nThe score sum is $1 - np$, and $E[1/n] > p$ by Jensen."
    rows = [_row("alice", path=_submission(subs / "alice", answer)),
            _row("bob", path=_submission(subs / "bob")),  # the placeholder, untouched
            _row("dana", path=_submission(subs / "dana", "x", drop_marker=True)),
            _row("carol", path=_write(tmp_path / "carol.ipynb", '{"cells": [oops')),
            _row("erin", "gae", path=_write(tmp_path / "erin.ipynb", '{"nbformat": 3}'))]
    gb.resolve_ids(rows, _roster(tmp_path))
    problems = gb.collect_written(rows, tmp_path / "written")
    assert len(problems) == 3, problems
    assert any(p.startswith("carol (grpo): could not read") and "JSONDecodeError" in p
               for p in problems), problems
    assert any(p.startswith("erin (gae)") and "format 4" in p for p in problems), problems
    assert any(p.startswith("dana (grpo): no cells for q5") for p in problems), problems
    text = (tmp_path / "written" / "grpo_q5.md").read_text()
    assert text.startswith("# grpo q5: the written answers (graded by hand, /3)")
    assert "## The question\n\n## Question 5 (written, graded by hand)" in text
    assert "**Rubric (3 points).**" in text  # the answer key's rubric, for the grader
    alice = text.split("## 1001 (Alice Liddell)\n", 1)[1].split("---", 1)[0]
    assert "> # My derivation\n>\n> The score sum is $1 - np$" in alice
    assert "**Points:** ____ / 3" in alice
    assert "## 1002 (Bob Brown)" in text and "_no answer typed_" in text
    assert "_could not read" in text and (tmp_path / "written" / "gae_q4.md").exists()
    sheet = tmp_path / "written" / "grpo_written.csv"
    lines = _csv(sheet)
    assert lines[0] == ["assignment", "file", "student_id", "name", "q5 (/3)", "comment"]
    assert [line[:3] for line in lines[1:]] == [
        ["grpo", "alice", "1001"], ["grpo", "bob", "1002"], ["grpo", "carol", "carol"],
        ["grpo", "dana", "dana"]]

    lines[1][4], lines[1][5], lines[2][4] = "2,5", "sign slip", "4"  # a grader fills it in
    with sheet.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(lines)
    warnings = gb.apply_manual_scores(rows, gb.load_manual_scores(sheet))
    assert warnings == ["bob (grpo): q5 = 4 is not within 0..3 (not used)"]
    assert rows[0]["manual_scores"] == {"q5": 2.5}
    gb.write_assignment_csvs(rows, tmp_path / "grades")
    header, *table = _csv(tmp_path / "grades" / "grpo.csv")
    alice_line = dict(zip(header, table[0]))
    assert (alice_line["q5 (by hand, /3)"], alice_line["final"]) == ("2.5", "19.5")
    assert "- **q5**: 2.5 / 3 (graded by hand)" in gb.report(rows[0])
    gb.collect_written(rows, tmp_path / "written")  # collected again: the points stay
    assert _csv(sheet)[1][4:] == ["2,5", "sign slip"] and _csv(sheet)[2][4] == "4"


def test_grade_py_flags_run_everything(tmp_path):
    parser = argparse.ArgumentParser()
    gb.add_arguments(parser)
    roster = _write(tmp_path / "roster.csv", "id,name,email,file\n1001,Alice,a@uni.edu,alice\n")
    notebook = _submission(tmp_path / "subs" / "alice", "my answer")
    args = parser.parse_args([
        "--out", str(tmp_path / "grades"), "--feedback", str(tmp_path / "feedback"),
        "--roster", str(roster), "--deadline", "2020-10-01T23:59Z", "--written",
        str(tmp_path / "written"), "--canvas", str(tmp_path / "canvas.csv"), "--canvas-title",
        "grpo=GRPO (9)", "--gradescope", str(tmp_path / "gs")])
    rows = [_row("alice", path=notebook), _row("zed", "gae")]
    warnings = gb.export(rows, args)
    assert any("1001 (Alice): no submission of gae" in w for w in warnings), warnings
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()
                  and "subs" not in p.parts)
    assert made == ["canvas.csv", "feedback/alice__gae.md", "feedback/alice__grpo.md",
                    "feedback/zed__gae.md", "grades/gae.csv", "grades/grpo.csv", "gs/gae.csv",
                    "gs/grpo.csv", "roster.csv", "written/gae_q4.md", "written/gae_written.csv",
                    "written/grpo_q5.md", "written/grpo_written.csv"]
    assert _csv(tmp_path / "canvas.csv")[0][5:] == ["gae", "GRPO (9)"]
    late = dict(zip(*_csv(tmp_path / "grades" / "grpo.csv")))  # written years after 2020
    assert int(late["late days"]) > 3 and (late["penalty"], late["final"]) == ("1", "0")
    assert late["submitted (source)"].endswith("(file time)")
