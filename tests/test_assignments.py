"""The graded assignments, graded themselves: the release, then a class of generated submissions.

For every assignment (``labs/assignments/<a>/answer_key/``):

- ``release.py`` builds the student release from the master with otter assign: the repository's
  student notebook is that release, up to date, and no line of any solution is in it;
- ``grade.py`` grades a folder of generated submissions into a CSV, through ``otter run``:
  the reference solution gets every point, the notebook as shipped none; each planted typical bug
  gets exactly the points its ``cases.json`` states (and its feedback names the bug); a syntax
  error in one question's cell costs only that question (and those stated to use its function);
  a submission that imports the package's answer gets no credit for it and is flagged.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import pathlib

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSIGNMENTS = ROOT / "labs" / "assignments"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ASSIGNMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = _load("release")
grade = _load("grade")
NAMES = [a for a in release.ASSIGNMENTS if release.master(a).exists()]


def _cases(assignment: str) -> dict:
    return json.loads((ASSIGNMENTS / assignment / "answer_key" / "cases.json").read_text())


@pytest.fixture(scope="module", params=NAMES)
def built(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"release-{request.param}")
    return request.param, release.build(request.param, out)


def _cells(path: pathlib.Path):
    nb = nbformat.read(path, as_version=4)
    return [(c.cell_type, c.source) for c in nb.cells], nb.metadata.get("otter")


def test_student_notebook_is_the_release_and_has_no_solution(built):
    assignment, paths = built
    name = f"{assignment}_assignment.ipynb"
    committed = ASSIGNMENTS / assignment / name
    assert _cells(committed) == _cells(paths["student"] / name), (
        f"{committed.relative_to(ROOT)} is not the release of its master: run "
        f"`python labs/assignments/release.py {assignment} --update`")
    assert not release.leaks(assignment, paths["student"])
    text = committed.read_text()
    assert not [line for line in release.solution_lines(assignment) if line in text]
    assert "hidden" not in json.dumps(_cells(committed)[1] or {}).replace('"hidden": false', "")
    assert not (paths["student"] / "answer_key").exists()
    assert not list(paths["student"].glob("*_checks.py"))
    assert not list(paths["student"].glob("*_reference.json"))


def _edit(solution: dict, function: str, edit) -> dict:
    nb = json.loads(json.dumps(solution))
    hits = 0
    for cell in nb["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code" and f"def {function}(" in source:
            cell["source"] = edit(source)
            hits += 1
    assert hits == 1, f"{hits} cells define {function}"
    return nb


def _submissions(assignment: str, solution: pathlib.Path, folder: pathlib.Path) -> dict:
    """Write the reference, each planted bug, a syntax error and a cheat; return expectations."""
    cases = _cases(assignment)
    sol = json.loads(solution.read_text())
    expect = {"reference": {"bug": None}, "stubs": {"bug": None}}
    (folder / "reference.ipynb").write_text(json.dumps(sol))
    shipped = ASSIGNMENTS / assignment / f"{assignment}_assignment.ipynb"
    (folder / "stubs.ipynb").write_text(shipped.read_text())
    for k, bug in enumerate(cases["bugs"]):
        def edit(source, bug=bug):
            if "replace" in bug:
                return bug["replace"]
            assert bug["old"] in source, f"{assignment}: {bug['name']}: {bug['old']!r} not found"
            return source.replace(bug["old"], bug["new"])
        nb = _edit(sol, bug["function"], edit)
        (folder / f"bug{k}.ipynb").write_text(json.dumps(nb))
        expect[f"bug{k}"] = {"bug": bug}
    syntax = cases["syntax"]
    nb = _edit(sol, syntax["function"], lambda s: s.rstrip() + "\n    return (\n")
    (folder / "syntax.ipynb").write_text(json.dumps(nb))
    expect["syntax"] = {"lost": syntax["lost"]}
    cheat = cases["cheat"]
    nb = _edit(sol, cheat["function"], lambda s: cheat["code"])
    (folder / "cheat.ipynb").write_text(json.dumps(nb))
    expect["cheat"] = {"flagged": cheat["flagged"]}
    return expect


def test_a_class_is_graded_into_a_csv(built, tmp_path):
    assignment, paths = built
    folder = tmp_path / "submissions"
    folder.mkdir()
    expect = _submissions(assignment, paths["solution"], folder)
    out = tmp_path / "grades.csv"
    rows = grade.grade_folder([folder], out, tmp_path / "feedback",
                              paths["autograder"].parent, jobs=2)  # two otter processes
    by_student = {r["student"]: r for r in rows}
    assert set(by_student) == set(expect)
    full = {q: v["possible"] for q, v in by_student["reference"]["questions"].items()}
    assert full and all(v > 0 for v in full.values())
    got = {s: {q: v["score"] for q, v in r["questions"].items()} for s, r in by_student.items()}
    assert all(not r["error"] for r in rows), [r["error"] for r in rows]

    assert got["reference"] == full, "the reference solution must get every point"
    assert set(got["stubs"].values()) == {0.0}, f"the stubs as shipped earned {got['stubs']}"
    for student, e in expect.items():
        if e.get("bug"):
            bug = e["bug"]
            assert got[student] == {q: float(p) for q, p in bug["points"].items()}, (
                f"{assignment}: the planted bug '{bug['name']}' earned {got[student]}")
            for q, words in bug.get("feedback", {}).items():
                feedback = by_student[student]["questions"][q]["feedback"]
                assert words in feedback.split(". ")[0] + feedback, (q, feedback)
    lost = {q for q in full if got["syntax"][q] < full[q]}
    assert lost == set(expect["syntax"]["lost"]), f"a syntax error cost {sorted(lost)}"
    flagged = {q for q, v in by_student["cheat"]["questions"].items() if v["flagged"]}
    assert flagged == set(expect["cheat"]["flagged"])
    assert all(got["cheat"][q] == 0 for q in flagged)
    assert all(got["cheat"][q] == full[q] for q in full if q not in flagged)

    with out.open() as handle:
        table = list(csv.DictReader(handle))
    assert {r["student"] for r in table} == set(expect)
    ref = next(r for r in table if r["student"] == "reference")
    assert float(ref["total"]) == float(ref["possible"]) == sum(full.values())
    assert next(r for r in table if r["student"] == "cheat")["flagged"] == " ".join(
        sorted(expect["cheat"]["flagged"], key=grade._order))
    report = (tmp_path / "feedback" / "cheat.md").read_text()
    assert "flagged" in report and grade.FLAGGED in report


def test_grade_refuses_what_it_cannot_grade(tmp_path, capsys):
    assert grade.main([str(tmp_path / "nowhere")]) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "mystery.ipynb").write_text(json.dumps(nbformat.v4.new_notebook()))
    assert grade.main([str(tmp_path / "mystery.ipynb")]) == 1
    assert "which assignment" in capsys.readouterr().err
    with pytest.raises(release.ReleaseError, match="unknown assignment"):
        release.master("nope")


def test_integrity_flags_the_package_answer_and_nothing_else(tmp_path):
    import inspect
    import sys

    sys.path.insert(0, str(ASSIGNMENTS))
    try:
        import gradelib
    finally:
        sys.path.pop(0)
    answers = ("agentic_rl.advantages:group_advantages",)

    def flagged(source: str, name: str = "group_advantages") -> str:
        namespace: dict = {"__name__": "__main__"}
        exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - test code
        try:
            gradelib.integrity(namespace[name], name, answers)
        except AssertionError as err:
            return str(err)
        return ""

    from agentic_rl import advantages

    assert "package's own" in flagged("from agentic_rl.advantages import group_advantages")
    assert "calls the package's answer" in flagged(
        "import agentic_rl.advantages as A\n"
        "def group_advantages(s, g):\n    return A.group_advantages(s, g)\n")
    assert "calls the package's answer" in flagged(  # through a helper of the notebook
        "from agentic_rl.advantages import group_advantages as ref\n"
        "def helper(s, g):\n    return ref(s, g)\n"
        "def group_advantages(s, g):\n    return helper(s, g)\n")
    copied = inspect.getsource(advantages.group_advantages).replace("scores", "rewards")
    path = tmp_path / "student_copy.py"  # the copy check reads the source: give it a file
    path.write_text("import torch\nfrom agentic_rl.advantages import _group_index, group_stats\n"
                    + copied)
    spec = importlib.util.spec_from_file_location("student_copy", path)
    student = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(student)
    with pytest.raises(AssertionError, match="copy of the package"):
        gradelib.integrity(student.group_advantages, "group_advantages", answers)
    # the package's other objects (a helper, a dataclass) are allowed, and honest code passes
    assert not flagged("from agentic_rl.advantages import masked_mean\n"
                       "def group_advantages(s, g):\n    return masked_mean(s, g)\n")
    assert not flagged("def group_advantages(s, g):\n    return s - s.mean()\n")
    assert flagged("from agentic_rl.advantages import group_advantages").startswith(
        gradelib.FLAGGED)
