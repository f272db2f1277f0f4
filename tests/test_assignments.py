"""The graded assignments, graded themselves: the release, then a class of generated submissions.

For every assignment (``labs/assignments/<a>/answer_key/``):

- ``release.py`` builds the student release from the master with otter assign: the repository's
  student notebook is that release, up to date, and no line of any solution is in it;
- ``grade.py`` grades a folder of generated submissions (each notebook in its own jail, the checks
  in the grader's process): the reference solution gets every point and nothing to review, the
  notebook as shipped none; each planted typical bug gets exactly the points its ``cases.json``
  states (and its feedback names the bug); a syntax error in one question's cell costs only that
  question (and those stated to use its function); the package's answer, however it is reached
  (imported, wrapped in a ``functools.partial``, a class or a dict, ``exec``-ed from its source,
  found with ``importlib`` and ``getattr``, a helper it calls), earns no credit and is flagged;
  its body pasted under the stub's ``def`` line is named in the review column; the stubs with the
  checker and otter patched and the grader's files and the other submissions looked for earn
  nothing. (``tests/test_grading_jail.py``: what a notebook can reach in its jail.)
"""

from __future__ import annotations

import ast
import csv
import json
import pathlib
import re
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
ASSIGNMENTS = ROOT / "labs" / "assignments"


sys.path.insert(0, str(ASSIGNMENTS))  # (grade.py's worker processes import it by name)
import grade  # noqa: E402
import gradebook  # noqa: E402
import release  # noqa: E402
import similarity  # noqa: E402
import standins  # noqa: E402

#: How a cheat reaches the package's answer ``module:function`` for the student's ``name``.
WRAPPERS = {
    "partial": "import functools, importlib\n{name} = functools.partial(getattr("
               "importlib.import_module({module!r}), {function!r}))\n",
    "class": "import {module} as _pkg_{name}\nclass _Answer:\n    def __call__(self, *a, **k):\n"
             "        return _pkg_{name}.{function}(*a, **k)\n{name} = _Answer()\n",
    "dict": "from {module} import {function} as _f\n_TABLE = {{'f': _f}}\n"
            "def {name}(*a, **k):\n    return _TABLE['f'](*a, **k)\n",
    "exec": "import inspect, {module} as _pkg_{name}\n"
            "exec(inspect.getsource(_pkg_{name}.{function}))\n{name} = {function}\n",
    "getattr": "_m_{name} = __import__({module!r}, fromlist=['_'])\n"
               "def {name}(*a, **k):\n    return getattr(_m_{name}, {function!r})(*a, **k)\n",
    "helper": "import {module} as _pkg_{name}\n"  # a helper the answer calls (or the answer)
              "def {name}(*a, **k):\n    return _pkg_{name}.{helper}(*a, **k)\n",
}
#: Appended to the stubs as shipped: tampering with the grader, reading its files, looking for
#: the other submissions. Nothing to act on in the jail: the stubs must still earn nothing.
TAMPER = """import glob, os
try:
    import gradelib
    gradelib.check = lambda *a, **k: (lambda body: (lambda *x, **y: None))
except ImportError:
    pass
try:
    import otter.test_files.ok_test as _ok
    _ok.run_doctest = lambda *a, **k: (True, "")
except ImportError:
    pass
FOUND = [p for p in {paths!r} if os.path.exists(p)] + glob.glob({pattern!r})
"""
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
    answers = {n: d for n, d in similarity.package_answers(assignment).items() if d}
    helpers = sorted(set(standins.stand_ins(assignment)) - set(standins.answers(assignment)))
    kinds = list(WRAPPERS)
    for variant in (0, 1):  # two notebooks, so that each assignment meets most kinds
        wrapped = sol
        for k, (name, dotted) in enumerate(sorted(answers.items())):
            module, _, function = dotted[0].partition(":")
            kind = kinds[(k + 3 * variant + len(assignment)) % len(kinds)]
            helper = next((h.partition(":")[2] for h in helpers if h.startswith(module + ":")),
                          function)
            code = WRAPPERS[kind].format(name=name, module=module, function=function,
                                         helper=helper)
            wrapped = _edit(wrapped, name, lambda s, code=code: code)
        (folder / f"wrapped{variant}.ipynb").write_text(json.dumps(wrapped))
        expect[f"wrapped{variant}"] = {"functions": set(answers)}
    pasted = sol
    for name, dotted in sorted(answers.items()):
        body = _body(dotted[0])
        pasted = _edit(pasted, name, lambda s, name=name, body=body: _paste(s, name, body))
    (folder / "pasted.ipynb").write_text(json.dumps(pasted))
    expect["pasted"] = {"functions": set(answers) - _not_telling(answers)}
    tampered = json.loads(shipped.read_text())
    secrets = [str(ASSIGNMENTS / assignment / "answer_key" / f"{assignment}_reference.json"),
               str(solution.parent / f"{assignment}-autograder.zip"), str(folder / "bug0.ipynb")]
    tampered["cells"].append(nbformat.v4.new_code_cell(TAMPER.format(
        paths=secrets, pattern=str(folder / "*.ipynb"))))
    (folder / "tampered.ipynb").write_text(json.dumps(tampered))
    expect["tampered"] = {}
    return expect


def _body(dotted: str) -> str:
    """The package function's body, as it reads in the package (its docstring dropped)."""
    source = similarity.package_sources([dotted])[dotted]
    node = ast.parse(source).body[0]
    start = node.body[1 if ast.get_docstring(node) else 0].lineno - node.lineno
    return "\n".join(source.splitlines()[start:]) + "\n"


def _paste(cell: str, name: str, body: str) -> str:
    """The cell with ``name``'s body replaced by ``body`` under the stub's own ``def`` line."""
    lines = cell.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {name}("))
    head = start
    while not lines[head].rstrip().endswith(":"):  # a def line that spans lines
        head += 1
    stop = next((i for i in range(head + 1, len(lines)) if lines[i] and not lines[i][0].isspace()
                 and not lines[i].startswith(("#", ")"))), len(lines))
    return "\n".join(lines[:head + 1] + body.rstrip().splitlines() + lines[stop:]) + "\n"


def _not_telling(answers: dict) -> set:
    return {n for n, d in answers.items() if set(d) <= set(similarity.NOT_TELLING)}


def _question_functions(autograder: pathlib.Path) -> dict[str, set[str]]:
    """The student functions each question's hidden checks call (from the checks' decorators)."""
    import zipfile

    with zipfile.ZipFile(autograder) as zf:
        name = next(n for n in zf.namelist() if n.endswith("_checks.py"))
        tree = ast.parse(zf.read(name).decode())
    checks = {node.name: dec.args[0].value for node in tree.body
              if isinstance(node, ast.FunctionDef) for dec in node.decorator_list
              if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "check"}
    calls = {}  # a check that calls another check (grpo q4) uses that one's function too
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in checks:
            calls[node.name] = {checks[n.func.id] for n in ast.walk(node) if isinstance(
                n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in checks}
    out = {}
    for question in grade.load_tests(autograder):
        used = set()
        for case in question["cases"]:
            for check in re.findall(r"C\.(\w+)\(", case["code"]):
                used |= {checks[check]} | calls.get(check, set())
        out[question["name"]] = used
    return out


def test_a_class_is_graded_into_a_csv(built, tmp_path):
    assignment, paths = built
    folder = tmp_path / "submissions"
    folder.mkdir()
    expect = _submissions(assignment, paths["solution"], folder)
    rows = grade.grade_folder([folder], paths["autograder"].parent, jobs=2)
    by_student = {r["student"]: r for r in rows}
    assert set(by_student) == set(expect)
    full = {q: v["possible"] for q, v in by_student["reference"]["questions"].items()}
    assert full and all(v > 0 for v in full.values())
    got = {s: {q: v["score"] for q, v in r["questions"].items()} for s, r in by_student.items()}
    errors = [(r["student"], r["error"]) for r in rows if r["error"]]
    assert not errors, errors

    assert got["reference"] == full, "the reference solution must get every point"
    assert by_student["reference"]["review"] == [], by_student["reference"]["review"]
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

    # every other way to the package's answer: no credit, and flagged or up for review
    uses = _question_functions(paths["autograder"])
    for student in ("wrapped0", "wrapped1"):
        for q, functions in uses.items():
            if functions & expect[student]["functions"]:
                assert got[student][q] == 0, f"{assignment} {q}: a {student} answer earned points"
                assert by_student[student]["questions"][q]["flagged"], (student, q)
            else:
                assert got[student][q] == full[q], (q, got[student])
        assert by_student[student]["review"], student
    # tampering with the checker or otter, reading the grader's files: the stubs earn nothing
    assert set(got["tampered"].values()) == {0.0} and by_student["tampered"]["review"]
    review = " ".join(by_student["pasted"]["review"])
    for name in expect["pasted"]["functions"]:
        assert f"{name} ~ agentic_rl." in review or "(whole code) ~" in review, (name, review)

    out = tmp_path / "grades"
    gradebook.write_assignment_csvs(rows, out)
    gradebook.write_reports(rows, tmp_path / "feedback")
    with (out / f"{assignment}.csv").open() as handle:
        table = {r["student_id"]: r for r in csv.DictReader(handle)}
    assert set(table) == set(expect)
    assert float(table["reference"]["total"]) == float(table["reference"]["possible"]) == sum(
        full.values())
    assert table["cheat"]["flagged"] == " ".join(sorted(expect["cheat"]["flagged"],
                                                        key=grade._order))
    assert table["pasted"]["review"] and not table["reference"]["review"]
    report = (tmp_path / "feedback" / f"cheat__{assignment}.md").read_text()
    assert "flagged" in report and grade.FLAGGED in report


def test_grade_refuses_what_it_cannot_grade(tmp_path, capsys):
    assert grade.main([str(tmp_path / "nowhere")]) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "mystery.ipynb").write_text(json.dumps(nbformat.v4.new_notebook()))
    assert grade.main([str(tmp_path / "mystery.ipynb")]) == 0  # a row with its reason
    assert "cannot tell which assignment" in capsys.readouterr().out
    with pytest.raises(release.ReleaseError, match="unknown assignment"):
        release.master("nope")
