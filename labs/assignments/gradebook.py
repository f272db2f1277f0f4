"""The gradebook: what becomes of ``grade.py``'s rows (one per submission) once they are graded.

``grade.py`` imports this module; its flags (``add_arguments``; ``export`` runs them in order)::

    python labs/assignments/grade.py SUBMISSIONS_DIR --out grades/ --feedback feedback/ \\
        --roster roster.csv --deadline 2026-10-01T23:59 --late-penalty 0.1 --max-late-days 3 \\
        --written written/ --canvas canvas.csv --gradescope gradescope/

    --roster CSV          students: an ``id`` column (also read: ``student_id``, ``sid``) and,
                          optionally, name, email, sis_id/SIS User ID, login/SIS Login ID, section,
                          canvas_id, ``file`` (or ``submission``: the submission's student key, as
                          below) and ``submitted_at``. A Canvas gradebook export is a roster as is.
    --out DIR|FILE.csv    one CSV per assignment, ``DIR/<assignment>.csv`` (``FILE.csv`` itself
                          when the folder holds one assignment, else ``FILE_<assignment>.csv``)
    --feedback DIR        one report per submission, ``DIR/<student>__<assignment>.md``
    --deadline [A=]ISO    e.g. ``2026-10-01T23:59`` (local time) or ``...T23:59+02:00``; repeat
                          as ``grpo=...`` for a deadline per assignment
    --late-penalty F      fraction of the points lost per started day late (default 0.1)
    --max-late-days N     later than N days: no credit (default 3)
    --manifest CSV        submission times: a ``file``/``student``/``path`` column, ``submitted_at``
    --written DIR         the written answers to grade by hand, ``DIR/<assignment>_<q>.md``, and
                          ``DIR/<assignment>_written.csv`` to fill in with their points
    --manual-scores CSV   that filled-in CSV (repeatable): the points enter the totals
    --canvas FILE         Canvas gradebook import (``--canvas-title grpo="GRPO (1234)"``)
    --gradescope DIR      one Gradescope score CSV per assignment, ``DIR/<assignment>.csv``

The student key is the notebook's path below the submissions folder without its suffix, or its
folder when the file is ``<assignment>_assignment.ipynb`` (``alice/grpo_assignment.ipynb`` ->
``alice``). :func:`resolve_ids` gives every row its ``student_id``, ``name`` and ``email`` from the
roster (``id_source`` "roster"), or the key itself ("file name") for a student not on it; with an
assignment given, a roster entry without a submission gets a row ("no submission", 0 points).

Per assignment (:func:`write_assignment_csvs`): ``q1 (/6)``..., the by-hand questions ``q5 (by
hand, /3)`` (empty until ``--manual-scores``), ``total`` and ``possible`` (auto-graded; possible is
the assignment's full auto-graded points even for a submission that could not be graded: from the
other rows, a ``possible`` map, or the master notebook), ``submitted (source)`` (roster, manifest
or the file's modification time; a copy that does not keep file times makes the last one
meaningless), ``late days``, ``penalty`` (the fraction lost, :func:`late_penalty`: each started day
after the deadline costs ``--late-penalty``, beyond ``--max-late-days`` all), ``final`` ((total +
by-hand points) x (1 - penalty)), ``flagged``, ``review`` and ``error``.

Written answers (:func:`collect_written`): per assignment and by-hand question, one markdown file
with the question, the answer key's model answer and rubric, and every student's answer (the cells
between otter's ``<!-- BEGIN QUESTION -->`` and ``<!-- END QUESTION -->``) under the student's id;
the grader fills ``<assignment>_written.csv`` and gives it back with ``--manual-scores``
(:func:`load_manual_scores`, :func:`apply_manual_scores`). A notebook that cannot be read is a line
saying why. Reports (:func:`report`, :func:`write_reports`): one per submission, with the id, the
late penalty, and "not graded: <reason>" with 0 / the full points when it could not be graded.

Exports. :func:`canvas_csv`: Canvas's gradebook import, written to what Canvas's own importer
reads (its source, see the comment there; not tried on a Canvas instance). :func:`gradescope_csv`:
Name, Email, SID, Score. **Not verified**: no Gradescope page on uploading scores was found; the
columns are those of Gradescope's roster upload (Name, Email: unique, how it matches students;
SID) plus the score, so check the first upload.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import pathlib
import re

HERE = pathlib.Path(__file__).resolve().parent
BEGIN, END = "<!-- BEGIN QUESTION -->", "<!-- END QUESTION -->"
PLACEHOLDER = "_Type your answer here, replacing this text._"  # otter's empty written answer
NO_SUBMISSION = "no submission"
ROSTER_COLUMNS = {  # normalised header -> field (the first found wins)
    "id": ("id", "student_id", "studentid", "sid", "student_number"),
    "name": ("name", "student", "student_name", "full_name"),
    "email": ("email", "e_mail", "email_address"),
    "sis_id": ("sis_id", "sis_user_id"),
    "login": ("login", "sis_login_id", "login_id", "username"),
    "section": ("section", "section_name"),
    "canvas_id": ("canvas_id", "canvas_user_id"),
    "file": ("file", "submission", "key"),
    "submitted_at": ("submitted_at", "submission_time", "submitted"),
}
IDENTITY = ("name", "email", "sis_id", "login", "section", "canvas_id")


class RosterError(ValueError):
    pass


class NotebookError(ValueError):
    pass


def _n(x: float) -> str:
    return f"{round(float(x), 4):g}"


def _order(name: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _safe(name: str) -> str:
    return re.sub(r"[^\w.-]+", "_", name).strip("._") or "student"


def _norm(header: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", header.strip().lower()).strip("_")


# --------------------------------------------------------------------------- roster and ids


def _read_csv(path: pathlib.Path) -> tuple[list[str], list[list[str]]]:
    with pathlib.Path(path).open(newline="", encoding="utf-8-sig") as handle:
        lines = [line for line in csv.reader(handle)]
    if not lines:
        raise RosterError(f"{path}: empty file (a header row is needed)")
    return lines[0], lines[1:]


def load_roster(path) -> list[dict]:
    """The roster's students, one dict each: ``id`` and the fields of ROSTER_COLUMNS ("" if none).

    Raises RosterError, naming the column or line, when there is no id column, a student has no
    id, or an id or ``file`` repeats. Canvas's "Points Possible" and "Muted" rows are skipped."""
    header, lines = _read_csv(path)
    names = [_norm(h) for h in header]
    where = {}
    for field, aliases in ROSTER_COLUMNS.items():
        where[field] = next((names.index(a) for a in aliases if a in names), None)
    if where["id"] is None:
        raise RosterError(f"{path}: no id column: the roster needs a column named 'id' (or "
                          f"student_id, sid); its columns are {', '.join(header) or 'none'}")
    canvas_export = names[:2] == ["student", "id"]  # Canvas's gradebook export: ID is Canvas's
    roster, seen = [], {"id": {}, "file": {}}
    for number, cells in enumerate(lines, start=2):
        entry = {f: (cells[i].strip() if i is not None and i < len(cells) else "")
                 for f, i in where.items()}
        if not entry["id"] and (not entry["name"] or "Points Possible" in entry["name"]):
            continue  # a blank line, or Canvas's "Points Possible" / "Muted" rows
        if not entry["id"]:
            raise RosterError(f"{path}, line {number}: {entry['name']!r} has no id")
        if canvas_export and not entry["canvas_id"]:
            entry["canvas_id"] = entry["id"]
        for field in ("id", "file"):
            if entry[field] and entry[field].lower() in seen[field]:
                raise RosterError(f"{path}, line {number}: {field} {entry[field]!r} is already "
                                  f"on line {seen[field][entry[field].lower()]}")
            seen[field][entry[field].lower()] = number
        roster.append(entry)
    return roster


def _roster_index(roster: list[dict]) -> dict:
    """Lower-cased key -> entry; a key two entries share maps to None (never a wrong match)."""
    index = {}
    for entry in roster:
        if entry.get("file"):
            keys = {entry["file"]}
        else:
            email = entry.get("email", "")
            keys = {entry["id"], entry.get("login", ""), entry.get("sis_id", ""), email,
                    email.split("@")[0]}
        for key in {k.lower() for k in keys if k}:
            index[key] = entry if index.get(key, entry) is entry else None
    return index


def _identify(row: dict, entry: dict | None) -> None:
    if entry is None:
        row.update({f: "" for f in IDENTITY}, student_id=row["student"], id_source="file name")
    else:
        row.update({f: entry.get(f, "") for f in IDENTITY}, student_id=entry["id"],
                   id_source="roster", roster_submitted_at=entry.get("submitted_at", ""))


def _missing_row(entry: dict, assignment: str, rows: list[dict]) -> dict:
    manual = next((r["manual"] for r in rows if r["assignment"] == assignment), None)
    row = {"student": entry.get("file") or entry["id"], "path": "", "assignment": assignment,
           "questions": {}, "manual": dict(manual if manual is not None
                                            else master_points(assignment)[1]),
           "error": NO_SUBMISSION, "review": []}
    _identify(row, entry)
    return row


def resolve_ids(rows: list[dict], roster: list[dict] | None = None, assignments=None) -> list:
    """Give every row ``student_id``, ``name``, ``email`` (and the roster's other fields) and
    ``id_source``; returns the warnings. ``rows`` changes in place: with ``assignments`` (a name or
    several), every roster entry without a submission of one gets a "no submission" row.

    A row matches an entry by its ``file`` column or, without one, by id, login, SIS id, email or
    the email's user name (the key, or its last folder, compared without case)."""
    warnings, index = [], _roster_index(roster or [])
    for row in rows:
        key = row["student"].lower()
        entry = index.get(key, index.get(key.rsplit("/", 1)[-1]))
        _identify(row, entry)
        if roster is not None and entry is None:
            why = "matches several roster entries" if key in index else "is not on the roster"
            warnings.append(f"{row['student']} ({row['assignment']}) {why}: its id is its file "
                            "name")
    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault((row["student_id"], row["assignment"]), []).append(row)
    for (sid, assignment), group in groups.items():
        if len(group) > 1:
            warnings.append(f"{sid} has {len(group)} submissions of {assignment}: "
                            + ", ".join(r["path"] or r["student"] for r in group))
    if roster is None:
        return warnings
    wanted = [assignments] if isinstance(assignments, str) else list(assignments or [])
    for entry in roster:
        who = f"{entry['id']}" + (f" ({entry['name']})" if entry.get("name") else "")
        if not wanted and not any(sid == entry["id"] for sid, _ in groups):
            warnings.append(f"{who}: on the roster, no submission")
        for assignment in wanted:
            if (entry["id"], assignment) not in groups:
                rows.append(_missing_row(entry, assignment, rows))
                warnings.append(f"{who}: no submission of {assignment} (0 points)")
    return warnings


# --------------------------------------------------------------------------- points


def master_points(assignment: str, root: pathlib.Path = HERE) -> tuple[dict, dict]:
    """(auto-graded, by hand): question -> points, read from the assignment's master notebook
    (``{}, {}`` when there is none). A question's points are its tests' points."""
    path = root / assignment / "answer_key" / f"{assignment}_assignment.md"
    if not path.exists():
        return {}, {}
    auto, manual = {}, {}
    for block in re.findall(r"# BEGIN QUESTION\n(.*?)# END QUESTION", path.read_text(),
                             re.DOTALL):
        lines = block.split("```", 1)[0].splitlines()
        fields = {k.strip(): v.strip() for k, v in (ln.split(":", 1) for ln in lines if ":" in ln)}
        if fields.get("manual") == "true":
            manual[fields["name"]] = float(fields.get("points", 0))
            continue
        tests = re.findall(r"# BEGIN TEST CONFIG\n(.*?)# END TEST CONFIG", block, re.DOTALL)
        found = [re.search(r"^points:\s*([\d.]+)", t, re.MULTILINE) for t in tests]
        auto[fields["name"]] = (float(fields["points"]) if "points" in fields
                                else sum(float(m.group(1)) for m in found if m))
    return auto, manual


def possible_points(rows: list[dict], possible: dict | None = None) -> dict[str, dict]:
    """assignment -> {question: auto-graded points}: ``possible`` first, then the most any row of
    the assignment was graded out of, then the master (for a question no row has: all of them
    when no submission of the assignment could be graded)."""
    table: dict[str, dict] = {}
    for row in rows:
        qs = table.setdefault(row["assignment"], {})
        for q, v in row["questions"].items():
            qs[q] = max(qs.get(q, 0.0), float(v["possible"]))
    table = {a: {**master_points(a)[0], **qs} for a, qs in table.items()}
    table.update({a: dict(qs) for a, qs in (possible or {}).items()})
    return table


def _manual_possible(rows: list[dict], assignment: str) -> dict:
    found: dict[str, float] = {}
    for row in rows:
        if row["assignment"] == assignment:
            for q, p in row["manual"].items():
                found[q] = max(found.get(q, 0.0), float(p))
    return dict(sorted(found.items(), key=lambda kv: _order(kv[0])))


def _scores(row: dict, auto: dict) -> dict:
    """The numbers of one row: auto total and possible, by-hand points, penalty and final."""
    total = sum(v["score"] for v in row["questions"].values())
    by_hand = sum((row.get("manual_scores") or {}).values())
    factor = row.get("late_factor", 1.0)
    return {"total": total, "possible": sum(auto.values()), "by_hand": by_hand,
            "penalty": 1.0 - factor, "final": (total + by_hand) * factor}


# --------------------------------------------------------------------------- late days


def parse_time(value) -> dt.datetime:
    """An aware datetime from ISO text (``2026-10-01T23:59``, ``...Z``, ``...+02:00``) or a
    datetime; without a timezone it is the local time."""
    if isinstance(value, dt.datetime):
        when = value
    else:
        text = str(value).strip()
        text = text[:-1] + "+00:00" if text.endswith("Z") else text
        try:
            when = dt.datetime.fromisoformat(text)
        except ValueError:
            try:
                when = dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S %z")  # Gradescope's export
            except ValueError:
                raise ValueError(f"not an ISO date and time: {value!r}") from None
    return when if when.tzinfo else when.astimezone()


def late_penalty(submitted, deadline, per_day: float, max_days: int | None) -> tuple[int, float]:
    """(days late, factor on the points). Every started day after the deadline counts (one second
    late is one day); each costs ``per_day`` of the points; more than ``max_days``: factor 0."""
    if not 0 <= per_day <= 1:
        raise ValueError(f"the late penalty is a fraction per day, in [0, 1]: got {per_day}")
    if max_days is not None and max_days < 0:
        raise ValueError(f"the most late days is not negative: got {max_days}")
    late_us = (parse_time(submitted) - parse_time(deadline)) // dt.timedelta(microseconds=1)
    if late_us <= 0:
        return 0, 1.0
    days = -(-late_us // 86_400_000_000)  # started days, in exact integers
    if max_days is not None and days > max_days:
        return days, 0.0
    return days, max(0.0, round(1.0 - per_day * days, 10))


def load_manifest(path) -> dict[str, str]:
    """Submission times: key (a ``file``/``student``/``path``/``id`` column) -> ``submitted_at``."""
    header, lines = _read_csv(path)
    names = [_norm(h) for h in header]
    key = next((names.index(k) for k in ("file", "submission", "student", "path", "id")
                if k in names), None)
    when = next((names.index(k) for k in ROSTER_COLUMNS["submitted_at"] if k in names), None)
    if key is None or when is None:
        raise RosterError(f"{path}: a manifest needs a 'file' (or student, path, id) column and "
                          f"a 'submitted_at' column; its columns are {', '.join(header)}")
    return {c[key].strip().lower(): c[when].strip() for c in lines if len(c) > max(key, when)}


def _deadlines(deadline) -> dict[str, dt.datetime]:
    """'' (every assignment) or an assignment -> its deadline, from ISO, ``a=ISO``, lists, maps."""
    if deadline is None:
        return {}
    if isinstance(deadline, dict):
        return {a: parse_time(t) for a, t in deadline.items()}
    found = {}
    for item in [deadline] if isinstance(deadline, (str, dt.datetime)) else deadline:
        name, _, text = str(item).rpartition("=") if isinstance(item, str) else ("", "", item)
        found[name] = parse_time(text)
    return found


def _submission_time(row: dict, manifest: dict, warnings: list) -> tuple:
    path = pathlib.Path(row["path"]) if row.get("path") else None
    keys = [row.get("path", ""), path.name if path else "", row["student"],
            row.get("student_id", "")]
    candidates = [(manifest.get(k.lower()), "manifest") for k in keys if k]
    candidates.append((row.get("roster_submitted_at"), "roster"))
    for text, source in candidates:
        if text:
            try:
                return parse_time(text), source
            except ValueError as err:
                warnings.append(f"{row['student']} ({row['assignment']}): {source} time: {err}")
    if path is not None and path.exists():
        return dt.datetime.fromtimestamp(path.stat().st_mtime).astimezone(), "file time"
    return None, ""


def apply_late(rows: list[dict], deadline=None, per_day: float = 0.1, max_days: int | None = 3,
               manifest: dict | None = None) -> list[str]:
    """Set every row's ``submitted``, ``submitted_source``, ``late_days`` and ``late_factor``;
    returns the warnings. The time comes from the manifest, the roster, or the notebook's file."""
    warnings, deadlines = [], _deadlines(deadline)
    manifest = {k.lower(): v for k, v in (manifest or {}).items()}
    for row in rows:
        row["submitted"], row["submitted_source"] = _submission_time(row, manifest, warnings)
        due = deadlines.get(row["assignment"], deadlines.get(""))
        row["late_days"], row["late_factor"] = 0, 1.0
        if due is not None and row["submitted"] is not None and row["error"] != NO_SUBMISSION:
            row["late_days"], row["late_factor"] = late_penalty(row["submitted"], due, per_day,
                                                                max_days)
    return warnings


# --------------------------------------------------------------------------- CSVs and exports


def _by_assignment(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: (_order(str(r.get("student_id") or r["student"])))):
        groups.setdefault(row["assignment"], []).append(row)
    return dict(sorted(groups.items()))


def _submitted(row: dict, form: str = "{when} ({source})") -> str:
    when = row.get("submitted")
    if when is None:
        return ""
    return form.format(when=when.isoformat(timespec="minutes"),
                       source=row.get("submitted_source", ""))


def write_assignment_csvs(rows: list[dict], out, possible: dict | None = None) -> list:
    """One CSV per assignment, from that assignment's rows only; returns the files written.

    ``out`` is a folder (``out/<assignment>.csv``) or a ``.csv`` path (itself for one assignment,
    ``<stem>_<assignment>.csv`` for several). Columns: see the module's docstring."""
    out, table, written = pathlib.Path(out), possible_points(rows, possible), []
    groups = _by_assignment(rows)
    for assignment, group in groups.items():
        auto = dict(sorted(table.get(assignment, {}).items(), key=lambda kv: _order(kv[0])))
        manual = _manual_possible(rows, assignment)
        if out.suffix == ".csv":
            path = out if len(groups) == 1 else out.with_name(f"{out.stem}_{assignment}.csv")
        else:
            path = out / f"{assignment}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(["student_id", "name", "email", "id source", "file",
                             *[f"{q} (/{_n(p)})" for q, p in auto.items()],
                             *[f"{q} (by hand, /{_n(p)})" for q, p in manual.items()],
                             "total", "possible", "submitted (source)", "late days", "penalty",
                             "final", "flagged", "review", "error"])
            for r in group:
                qs, s, hand = r["questions"], _scores(r, auto), r.get("manual_scores") or {}
                writer.writerow([r.get("student_id", r["student"]), r.get("name", ""),
                                 r.get("email", ""), r.get("id_source", "file name"),
                                 r["student"], *[_n(qs[q]["score"]) if q in qs else ""
                                                 for q in auto],
                                 *[_n(hand[q]) if q in hand else "" for q in manual],
                                 _n(s["total"]), _n(s["possible"]), _submitted(r),
                                 r.get("late_days", 0), _n(s["penalty"]), _n(s["final"]),
                                 " ".join(q for q in sorted(qs, key=_order) if qs[q]["flagged"]),
                                 " | ".join(r.get("review") or []), r["error"]])
        written.append(path)
    return written


def _one_assignment(rows: list[dict], what: str) -> str:
    found = sorted({r["assignment"] for r in rows})
    if len(found) != 1:
        raise ValueError(f"{what} takes the rows of one assignment: got {', '.join(found) or 0}")
    return found[0]


def _unscored_manual(rows: list[dict], assignment: str) -> list[str]:
    manual = _manual_possible(rows, assignment)
    if manual and not any(r.get("manual_scores") for r in rows if r["assignment"] == assignment):
        return [(f"{assignment}: the questions graded by hand ({', '.join(manual)}) have no "
                 "points yet (--manual-scores): the scores exported are the auto-graded part")]
    return []


# Canvas's gradebook import, as Canvas's own importer reads it: class GradebookImporter of
# instructure/canvas-lms (app/models/gradebook_importer.rb, read 2026-11, with an older version
# of Canvas's CSV exporter and Assignment.title_and_id). The header starts "Student",
# "ID", then optionally "SIS User ID", "SIS Login ID", and a "Section" column ends the student
# columns; every later column is an assignment, "Title (canvas id)" or the exact title
# (/\A(.*)\s\((\d+)\)\z/), an unknown title being a new assignment. A row whose first cell holds
# "Points Possible" gives the points. A student is found by ID (Canvas's numeric user id), else
# SIS User ID, else SIS Login ID, else by name; an empty score changes nothing. So ID stays empty
# unless the roster holds Canvas ids (canvas_id, or a Canvas export as the roster). Users report
# the same (github.com/PrairieLearn/PrairieLearn/issues/4547: Student, SIS Login ID and Section
# suffice; the Canvas Community guide "How do I import grades in the Gradebook?" was not read).
def canvas_csv(rows: list[dict], assignment_title, out, possible: dict | None = None) -> list:
    """Canvas's gradebook import file: one line per student, one column per assignment (its
    final points: by hand, late penalty included). ``assignment_title``: a title (rows of one
    assignment), a map assignment -> title, or None (the assignment's name). Returns warnings."""
    groups, table = _by_assignment(rows), possible_points(rows, possible)
    if isinstance(assignment_title, str):
        titles = {_one_assignment(rows, "a Canvas title for one assignment"): assignment_title}
    else:
        titles = {a: (assignment_title or {}).get(a, a) for a in groups}
    students: dict[str, dict] = {}
    scores: dict[tuple, float] = {}
    for assignment, group in groups.items():
        for r in group:
            key = str(r.get("student_id") or r["student"])
            students.setdefault(key, r)
            final = _scores(r, table.get(assignment, {}))["final"]
            scores[key, assignment] = max(final, scores.get((key, assignment), final))
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                         *[titles[a] for a in groups]])
        writer.writerow(["Points Possible", "", "", "", "",
                         *[_n(sum(table.get(a, {}).values())
                              + sum(_manual_possible(rows, a).values())) for a in groups]])
        for key, r in students.items():
            writer.writerow([r.get("name") or r["student"], r.get("canvas_id", ""),
                             r.get("sis_id", ""), r.get("login", ""), r.get("section", ""),
                             *[_n(scores[key, a]) if (key, a) in scores else "" for a in groups]])
    by_name = [k for k, r in students.items()
               if not any(r.get(f) for f in ("canvas_id", "sis_id", "login"))]
    warnings = [w for a in groups for w in _unscored_manual(rows, a)]
    if by_name:
        warnings.append(f"canvas: no Canvas id, SIS User ID or SIS Login ID for {len(by_name)} "
                        f"student(s), Canvas matches them by name: {', '.join(by_name[:5])}")
    return warnings


def gradescope_csv(rows: list[dict], out, possible: dict | None = None) -> list[str]:
    """A score upload for Gradescope, rows of one assignment: Name, Email, SID, Score (the final
    points). The format is NOT verified (see the module's docstring). Returns warnings."""
    assignment = _one_assignment(rows, "a Gradescope score file")
    auto = possible_points(rows, possible).get(assignment, {})
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Name", "Email", "SID", "Score"])
        for r in _by_assignment(rows)[assignment]:
            writer.writerow([r.get("name") or r["student"], r.get("email", ""),
                             r.get("student_id", r["student"]), _n(_scores(r, auto)["final"])])
    no_email = [r["student"] for r in rows if not r.get("email")]
    warnings = _unscored_manual(rows, assignment)
    if no_email:
        warnings.append(f"gradescope: no email for {len(no_email)} student(s) (Gradescope "
                        f"identifies students by email): {', '.join(no_email[:5])}")
    return warnings


# --------------------------------------------------------------------------- reports


def report(row: dict, possible: dict | None = None) -> str:
    """One submission's report: id, points per question (with the first sentence of what is wrong
    when one lost points), by-hand questions and late penalty. ``possible``: this assignment's
    question -> auto-graded points (default: the row's own, or the master's)."""
    qs = row["questions"]
    auto = dict(possible) if possible is not None else possible_points([row])[row["assignment"]]
    s, hand = _scores(row, auto), row.get("manual_scores") or {}
    who = str(row.get("student_id") or row["student"])
    extra = [x for x in (row.get("name"), row["student"] if who != row["student"] else "") if x]
    title = f"# {who}" + (f" ({', '.join(extra)})" if extra else "") + f": {row['assignment']}"
    if row["error"]:
        lines = [f"{title}, not graded: {row['error']}", "",
                 f"0 / {_n(s['possible'])} points (auto-graded)", ""]
    else:
        lines = [f"{title}, {_n(s['total'])} / {_n(s['possible'])} points (auto-graded)", ""]
    for q in sorted(qs, key=_order):
        v = qs[q]
        lines.append(f"- **{q}**: {_n(v['score'])} / {_n(v['possible'])}"
                     + (" (flagged: no credit)" if v["flagged"] else ""))
        if v["score"] < v["possible"] and v["feedback"]:
            lines.append(f"  {v['feedback']}")
    for q, points in sorted(row["manual"].items(), key=lambda kv: _order(kv[0])):
        lines.append(f"- **{q}**: " + (f"{_n(hand[q])} / {_n(points)} (graded by hand)" if q in hand
                                       else f"graded by hand (/{_n(points)})"))
    days = row.get("late_days", 0)
    if days:
        lines += ["", (f"Submitted {days} day{'s' if days != 1 else ''} late "
                       + _submitted(row, "({when}, from the {source})")
                       + f": penalty {_n(100 * s['penalty'])}%, final {_n(s['final'])} points.")]
    return "\n".join(lines) + "\n"


def write_reports(rows: list[dict], out_dir, possible: dict | None = None) -> list[pathlib.Path]:
    """``out_dir/<student>__<assignment>.md`` per row (two assignments never share a file)."""
    out_dir, table, written = pathlib.Path(out_dir), possible_points(rows, possible), []
    out_dir.mkdir(parents=True, exist_ok=True)
    for row in rows:
        stem = f"{_safe(row['student'])}__{_safe(row['assignment'])}"
        path, k = out_dir / f"{stem}.md", 1
        while path in written:  # two keys that read the same once made safe
            k += 1
            path = out_dir / f"{stem}-{k}.md"
        path.write_text(report(row, table.get(row["assignment"])), encoding="utf-8")
        written.append(path)
    return written


# --------------------------------------------------------------------------- written answers


def _notebook_cells(path: pathlib.Path) -> list[dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise NotebookError(f"not a readable notebook ({type(err).__name__}: "
                            f"{str(err)[:120]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise NotebookError("not a notebook of format 4 (no list of cells)")
    cells = []
    for cell in data["cells"]:
        if not isinstance(cell, dict):
            raise NotebookError("a cell that is not a JSON object")
        source = cell.get("source") or ""
        source = "".join(map(str, source)) if isinstance(source, list) else str(source)
        meta = cell.get("metadata") if isinstance(cell.get("metadata"), dict) else {}
        cells.append({"type": cell.get("cell_type", ""), "source": source, "metadata": meta,
                      "attachments": bool(cell.get("attachments"))})
    return cells


def _render(cells: list[dict]) -> str:
    parts = []
    for cell in cells:
        text = cell["source"].strip()
        if text and text != PLACEHOLDER:
            parts.append(f"```python\n{text}\n```" if cell["type"] == "code" else text)
        if cell["attachments"]:
            parts.append("_(an attached image: open the notebook to see it)_")
    return "\n\n".join(parts)


def written_answers(path, questions: list[str]) -> dict[str, str | None]:
    """question -> the student's answer (markdown, code in fences; "" when none was typed), for
    the by-hand questions in ``questions``; None for one whose cells were not found.

    otter's student notebook marks a by-hand question with a prompt cell that starts with
    ``<!-- BEGIN QUESTION -->`` (it holds the heading "Question 5"), the answer cell(s) (tag
    ``otter_answer_cell``; cells a student adds are kept too) and ``<!-- END QUESTION -->``.
    Read-only cells inside (``editable: false``) are not answers. Raises NotebookError."""
    blocks, current = [], None
    for cell in _notebook_cells(pathlib.Path(path)):
        meta, source = cell["metadata"], cell["source"]
        if BEGIN in source:
            current = {"prompt": source, "cells": []}
            blocks.append(current)
        elif current is not None and (END in source or (
                meta.get("editable") is False and source.lstrip().startswith("#"))):
            current = None  # its end, or the next question's prompt when the end was deleted
        elif current is not None and ("otter_answer_cell" in (meta.get("tags") or [])
                                      or meta.get("editable") is not False):
            current["cells"].append(cell)
    found: dict[str, dict] = {}
    for block in blocks:
        heading = re.search(r"Question\s+(\d+)", block["prompt"])
        name = f"q{heading.group(1)}" if heading else None
        if name in questions and name not in found:
            found[name] = block
    rest = [b for b in blocks if all(b is not v for v in found.values())]
    for q in questions:
        if q not in found and rest:
            found[q] = rest.pop(0)
    return {q: _render(found[q]["cells"]) if q in found else None for q in questions}


def master_question(assignment: str, question: str, root: pathlib.Path = HERE) -> tuple[str, str]:
    """(prompt, model answer and rubric) of a by-hand question, from the master; "" if none."""
    path = root / assignment / "answer_key" / f"{assignment}_assignment.md"
    text = path.read_text() if path.exists() else ""
    pattern = rf"# BEGIN QUESTION\nname: {re.escape(question)}\n.*?```\n(.*?)```{{raw-cell}}\n# END"
    match = re.search(pattern + " QUESTION", text, re.DOTALL)
    if not match:
        return "", ""
    prompt, _, rest = match.group(1).partition("```{raw-cell}\n# BEGIN SOLUTION\n```\n")
    return prompt.strip(), rest.partition("```{raw-cell}\n# END SOLUTION\n```")[0].strip()


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines())


def collect_written(rows: list[dict], out_dir) -> list[str]:
    """For every assignment and by-hand question, ``out_dir/<assignment>_<q>.md``: the prompt, the
    model answer and rubric (instructors only), then each student's answer under a heading with
    the student id; and ``out_dir/<assignment>_written.csv`` to fill in with the points (points
    already entered there are kept). Returns one line per notebook that could not be read."""
    out_dir, problems = pathlib.Path(out_dir), []
    out_dir.mkdir(parents=True, exist_ok=True)
    for assignment, group in _by_assignment(rows).items():
        manual = _manual_possible(rows, assignment)
        if not manual:
            continue
        answers = {}
        for i, r in enumerate(group):
            if not r.get("path"):
                answers[i] = NO_SUBMISSION
                continue
            try:
                answers[i] = written_answers(r["path"], list(manual))
            except Exception as err:  # noqa: BLE001 - a bad notebook is a line, never a crash
                why = err if isinstance(err, NotebookError) else f"{type(err).__name__}: {err}"
                answers[i] = f"could not read {r['path']}: {why}"
                problems.append(f"{r.get('student_id', r['student'])} ({assignment}): "
                                f"{answers[i]}")
        for q, points in manual.items():
            _write_answers(out_dir / f"{assignment}_{q}.md", assignment, q, points, group,
                           answers, problems)
        _write_template(out_dir / f"{assignment}_written.csv", assignment, manual, group)
    return problems


def _write_answers(path, assignment, q, points, group, answers, problems) -> None:
    prompt, model = master_question(assignment, q)
    lines = [f"# {assignment} {q}: the written answers (graded by hand, /{_n(points)})", "",
             (f"{len(group)} students. Enter the points in `{assignment}_written.csv` (column "
              f"`{q} (/{_n(points)})`), then give it to grade.py with `--manual-scores`."), ""]
    if prompt:
        lines += ["## The question", "", prompt, ""]
    if model:
        lines += ["## Model answer and rubric (from the answer key: not for students)", "",
                  model, ""]
    for i, r in enumerate(group):
        who = str(r.get("student_id") or r["student"])
        lines += ["---", "", f"## {who}" + (f" ({r['name']})" if r.get("name") else ""), "",
                  f"`{r.get('path') or r['student']}`"
                  + _submitted(r, ", submitted {when} (from the {source})"), ""]
        found = answers[i]
        if isinstance(found, str):
            lines.append(f"_{found}_")
        elif found[q] is None:
            lines.append(f"_no cells for {q} in this notebook (its `{BEGIN}` cell is gone)_")
            problems.append(f"{who} ({assignment}): no cells for {q} in {r['path']}")
        else:
            lines.append(_quote(found[q]) if found[q] else "_no answer typed_")
        lines += ["", f"**Points:** ____ / {_n(points)}", ""]
    path.write_text("\n".join(lines), encoding="utf-8")


def _write_template(path, assignment, manual, group) -> None:
    columns = [f"{q} (/{_n(p)})" for q, p in manual.items()]
    kept = {}
    if path.exists():  # keep what a grader entered already
        with path.open(newline="", encoding="utf-8-sig") as handle:
            kept = {(r.get("file") or "").lower(): r for r in csv.DictReader(handle)}
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["assignment", "file", "student_id", "name", *columns, "comment"])
        for r in group:
            if r["error"] == NO_SUBMISSION:
                continue
            old = kept.get(r["student"].lower(), {})
            writer.writerow([assignment, r["student"], r.get("student_id", r["student"]),
                             r.get("name", ""), *[old.get(c, "") for c in columns],
                             old.get("comment", "")])


def load_manual_scores(path) -> dict[tuple, dict]:
    """(assignment, file key) -> {question: points} from a filled-in ``<a>_written.csv``."""
    header, lines = _read_csv(path)
    if "assignment" not in header or "file" not in header:
        raise RosterError(f"{path}: not a written-answers sheet (no 'assignment' and 'file' "
                          "columns)")
    qcols = {i: m.group(1) for i, h in enumerate(header) if (m := re.match(r"(\S+) \(/", h))}
    a, f = header.index("assignment"), header.index("file")
    table = {}
    for number, cells in enumerate(lines, start=2):
        cells += [""] * (len(header) - len(cells))
        points = {}
        for i, q in qcols.items():
            text = cells[i].strip().replace(",", ".")
            if text:
                try:
                    points[q] = float(text)
                except ValueError:
                    raise RosterError(f"{path}, line {number}: {q} is {cells[i]!r}, not a "
                                      "number") from None
        if points:
            table[cells[a].strip(), cells[f].strip().lower()] = points
    return table


def apply_manual_scores(rows: list[dict], table: dict[tuple, dict]) -> list[str]:
    """Put the by-hand points into the rows (``manual_scores``); returns the warnings: points over
    a question's maximum (not used) and sheet lines that match no submission."""
    warnings, used = [], set()
    for row in rows:
        key = (row["assignment"], row["student"].lower())
        for q, points in table.get(key, {}).items():
            top = row["manual"].get(q)
            if top is None or not 0 <= points <= top:
                warnings.append(f"{row['student']} ({row['assignment']}): {q} = {_n(points)} is "
                                f"not within 0..{_n(top or 0)} (not used)")
                continue
            row.setdefault("manual_scores", {})[q] = points
            used.add(key)
    warnings += [f"{f} ({a}): by-hand points for no submission" for a, f in table
                 if (a, f) not in used and not any(
                     (r["assignment"], r["student"].lower()) == (a, f) for r in rows)]
    return warnings


# --------------------------------------------------------------------------- grade.py's flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The gradebook's flags (grade.py keeps ``paths``, ``--autograders`` and ``-j``)."""
    path = pathlib.Path
    parser.add_argument("--out", type=path,
                        help="a folder for one CSV per assignment (or a .csv path)")
    parser.add_argument("--feedback", type=path, help="a folder: one report per submission")
    parser.add_argument("--roster", type=path, help="a CSV of students (an id column)")
    parser.add_argument("--deadline", action="append",
                        help="ISO time, e.g. 2026-10-01T23:59[+02:00]; or ASSIGNMENT=TIME")
    parser.add_argument("--late-penalty", type=float, default=0.1,
                        help="fraction of the points lost per started day late (default 0.1)")
    parser.add_argument("--max-late-days", type=int, default=3,
                        help="later than this many days: no credit (default 3)")
    parser.add_argument("--manifest", type=path, help="a CSV of submission times (submitted_at)")
    parser.add_argument("--written", type=path,
                        help="a folder: the written answers to grade by hand, and their sheet")
    parser.add_argument("--manual-scores", type=path, action="append", default=[],
                        help="a filled-in <assignment>_written.csv (repeatable)")
    parser.add_argument("--canvas", type=path, help="a Canvas gradebook import CSV to write")
    parser.add_argument("--canvas-title", action="append", default=[],
                        help='ASSIGNMENT="Canvas title (id)" (default: the assignment name)')
    parser.add_argument("--gradescope", type=path,
                        help="a folder: one Gradescope score CSV per assignment")


def export(rows: list[dict], args: argparse.Namespace) -> list[str]:
    """Everything the flags ask for, in order (ids, by-hand points, late days, files); returns
    the warnings for grade.py to print. RosterError for a bad roster, manifest or sheet."""
    assignments = sorted({r["assignment"] for r in rows})
    roster = load_roster(args.roster) if args.roster else None
    warnings = resolve_ids(rows, roster, assignments if roster else None)
    for sheet in args.manual_scores:
        warnings += apply_manual_scores(rows, load_manual_scores(sheet))
    manifest = load_manifest(args.manifest) if args.manifest else None
    warnings += apply_late(rows, args.deadline, args.late_penalty, args.max_late_days, manifest)
    if args.out:
        write_assignment_csvs(rows, args.out)
    if args.feedback:
        write_reports(rows, args.feedback)
    if args.written:
        warnings += collect_written(rows, args.written)
    if args.canvas:
        titles = dict(t.split("=", 1) for t in args.canvas_title if "=" in t)
        warnings += canvas_csv(rows, titles, args.canvas)
    if args.gradescope:
        for a in assignments:
            warnings += gradescope_csv([r for r in rows if r["assignment"] == a],
                                       args.gradescope / f"{a}.csv")
    return warnings

