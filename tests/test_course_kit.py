"""The course kit around the book: licence, citation, changelog, solution toggles and syllabus.

What an instructor reuses before teaching: the licences and the parts they cover (``LICENSE``,
as ``README.md`` states them), a valid ``CITATION.cff`` whose version is the package's, a
``CHANGELOG.md`` whose commit ids exist, exercise solutions behind a "Show solution" toggle, and a
syllabus whose twelve-week plan, project week and rubric add up.
"""

from __future__ import annotations

import datetime
import pathlib
import re
import subprocess
import tomllib

import jupytext
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"


def _toc_chapters() -> list[str]:
    """The chapters (book/*.md in the toc's numbered parts), in toc order: foundations, grpo, ..."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [
        entry["file"].removeprefix("book/")
        for part in toc["parts"]
        if part.get("numbered")
        for entry in part["chapters"]
        if entry["file"].startswith("book/")
    ]


def _list_tables(text: str) -> list[list[list[str]]]:
    """Every ``{list-table}`` of a MyST page, as rows of cells (each cell's lines joined)."""
    tables = []
    for body in re.findall(r"```\{list-table\}\n(.*?)\n```", text, re.S):
        rows: list[list[str]] = []
        for line in body.splitlines():
            if line.startswith("* - "):
                rows.append([line[4:].strip()])
            elif line.startswith("  - ") and rows:
                rows[-1].append(line[4:].strip())
            elif line.startswith("    ") and rows:
                rows[-1][-1] += " " + line.strip()
        tables.append(rows)
    return tables


def _section(text: str, heading: str) -> str:
    """The text of a ``## heading`` section, up to the next ``## ``."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


# ---------------------------------------------------------------------------------------------
# LICENSE, CITATION.cff, CHANGELOG.md


def test_license_names_both_licences_and_the_parts_they_cover():
    text = (ROOT / "LICENSE").read_text()
    readme = _section((ROOT / "README.md").read_text(), "Licence")
    assert "Code: MIT" in readme and "Text: CC BY 4.0" in readme, (
        "README.md's Licence section changed: make LICENSE say the same")
    # the MIT text in full, with the book's copyright line
    assert "Copyright (c) 2026 The Agentic RL Book authors" in text
    for sentence in ("Permission is hereby granted, free of charge, to any person obtaining a copy",
                     "The above copyright notice and this permission notice shall be included in",
                     'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND'):
        assert sentence in text, f"the MIT License text lacks: {sentence!r}"
    assert "Creative Commons Attribution 4.0 International" in text
    assert "https://creativecommons.org/licenses/by/4.0/legalcode" in text
    # which parts each covers: the scope bullets at the top
    mit = re.search(r"^- MIT License: (.*?)(?=^- |^\n)", text, re.S | re.M)
    cc = re.search(r"^- CC BY 4\.0: (.*?)(?=^- |^\n)", text, re.S | re.M)
    assert mit and cc, "LICENSE must open with one bullet per licence naming the parts it covers"
    for part in ("src/", "tests/", "labs/", "benchmarks/"):
        assert part in mit.group(1), f"the MIT scope does not name {part}"
    assert "book/" in cc.group(1) and "figures" in cc.group(1), (
        "the CC BY 4.0 scope must name the book's text and figures in book/")


def test_citation_cff_is_valid_and_carries_the_package_version():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    # CFF 1.2.0's required keys, and the ones a citing tool reads
    for key in ("cff-version", "message", "title", "authors", "type", "license", "version",
                "date-released"):
        assert key in cff, f"CITATION.cff lacks {key!r}"
    assert cff["cff-version"] == "1.2.0"
    assert cff["type"] == "software"
    assert all(isinstance(a, dict) and a.get("name") or a.get("family-names")
               for a in cff["authors"]), "each author is an entity (name) or a person"
    assert cff["license"] == ["MIT", "CC-BY-4.0"], "SPDX ids of the two licences, as in LICENSE"
    assert isinstance(cff["date-released"], datetime.date), "date-released must be YYYY-MM-DD"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    init = (ROOT / "src/agentic_rl/__init__.py").read_text()
    package = re.search(r'^__version__ = "([^"]+)"', init, re.M).group(1)
    assert str(cff["version"]) == pyproject == package, (
        f"CITATION.cff version {cff['version']}, pyproject {pyproject}, __version__ {package}")


def test_changelog_has_an_unreleased_section_and_real_commit_ids():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog")
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings and headings[0].startswith("Unreleased"), "the newest section is Unreleased"
    unreleased = _section(text, headings[0])
    for item in ("otter-grader", "python labs/assignments/release.py",
                 "python labs/assignments/grade.py SUBMISSIONS_DIR --out grades.csv",
                 "LICENSE", "CITATION.cff"):
        assert item in unreleased, f"the Unreleased section does not mention {item}"
    ids = {i for group in re.findall(r"\[([0-9a-f, ]{7,})\]", text) for i in group.split(", ")}
    assert len(ids) > 20, "the milestones cite their commits"
    git = ["git", "-C", str(ROOT)]
    probe = subprocess.run(git + ["rev-parse", "--is-shallow-repository"], capture_output=True,
                           text=True)
    if probe.returncode != 0 or probe.stdout.strip() != "false":
        pytest.skip("not a full git clone: the commit ids cannot be checked")
    missing = [i for i in sorted(ids)
               if subprocess.run(git + ["cat-file", "-e", f"{i}^{{commit}}"],
                                 capture_output=True).returncode != 0]
    assert not missing, f"CHANGELOG.md cites commits that do not exist: {missing}"


# ---------------------------------------------------------------------------------------------
# "Show solution" toggles


def _hide_cells(page: pathlib.Path) -> list[str]:
    nb = jupytext.read(page)
    return [c.source for c in nb.cells
            if c.cell_type == "code" and "hide-cell" in c.metadata.get("tags", [])]


def test_every_hidden_cell_is_an_exercise_solution():
    """The toggle says "solution", so every hide-cell cell of a chapter must be one."""
    counts = {}
    for chapter in _toc_chapters():
        cells = _hide_cells(BOOK / f"{chapter}.md")
        counts[chapter] = len(cells)
        for source in cells:
            assert source.startswith("# Solution"), (
                f"book/{chapter}.md: a hide-cell cell that does not start with '# Solution' "
                f"(the template's convention): {source[:80]!r}")
        exercises = _section((BOOK / f"{chapter}.md").read_text(), "Exercises")
        numbered = re.findall(r"^\*\*(\d+)\. ", exercises, re.M)
        assert numbered and numbered == [str(i + 1) for i in range(len(numbered))], (
            f"book/{chapter}.md: exercises are headed **1. Title.**, **2. ...**, in order")
    assert all(counts.values()), f"every chapter has hidden solutions: {counts}"


def test_solution_toggle_config():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]
    assert config["local_extensions"].get("solution_toggles") == "book/_ext"
    assert (BOOK / "_ext/solution_toggles.py").exists()
    values = config["config"]
    assert values["book_solution_prompt_show"] == "Show solution"
    assert values["book_solution_prompt_hide"] == "Hide solution"
    # the other hidden cells (a function's source, a figure's code) keep MyST-NB's generic prompt
    assert "{type}" in values["nb_code_prompt_show"] and "{type}" in values["nb_code_prompt_hide"]
    from myst_nb.core.config import NbParserConfig

    fields = NbParserConfig.__dataclass_fields__
    assert "code_prompt_show" in fields and "code_prompt_hide" in fields, (
        "MyST-NB renamed its prompt settings: update _config.yml and solution_toggles.py")


@pytest.mark.xdist_group("book")
def test_built_site_labels_every_solution_and_only_solutions(built_book):
    """On the website (the session's one build), the solutions' toggles read "Show solution"."""
    if built_book.returncode != 0:
        pytest.fail(f"the book was not built (see test_book.py):\n{built_book.log[-3000:]}")
    for chapter in _toc_chapters():
        html = (built_book.html / "book" / f"{chapter}.html").read_text()
        titles = re.findall(r'<p class="collapsed admonition-title">([^<]*)', html)
        expected = len(_hide_cells(BOOK / f"{chapter}.md"))
        assert sum(t.strip() == "Show solution" for t in titles) == expected, (chapter, titles)
        assert html.count('<p class="expanded admonition-title">Hide solution') == expected
        assert "Show code cell content" not in titles, chapter


# ---------------------------------------------------------------------------------------------
# Syllabus and intro


def test_syllabus_twelve_week_plan_with_project_weeks():
    text = (BOOK / "syllabus.md").read_text()
    plan = _list_tables(_section(text, "The twelve-week plan"))[0]
    header, rows = plan[0], plan[1:]
    assert header[0] == "week" and header[-1] == "student hours (estimate)", header
    assert [r[0] for r in rows] == [str(w) for w in range(1, 13)], "weeks 1 to 12, in order"
    assert all(re.fullmatch(r"\d+(–\d+)?", r[-1]) for r in rows), "hours are numbers"
    project = [r for r in rows if "Project week" in r[1]]
    assert project, "a project week"
    assert "estimate" in _section(text, "The twelve-week plan").split("```")[0]
    # every chapter is taught, in toc order, and foundations has no lab
    taught = [m for r in rows for m in re.findall(r"^\{doc\}`(\w+)`", r[1])]
    assert list(dict.fromkeys(taught)) == _toc_chapters()
    assert rows[0][2].startswith("no lab")
    # the opening counts what the plan holds
    chapters, labs = _toc_chapters(), sorted((ROOT / "labs").glob("*_lab.md"))
    opening = f"**{len(chapters)} chapters and {len(labs)} labs over 12 weeks**"
    assert opening in text, f"the opening must say {opening}"
    assert len(rows) - len(project) == 10 and len(project) == 2
    assert "ten teaching weeks" in text and "**two project weeks**" in text
    # the labs' parts are named by their headings, never by numbers
    assert "sections 1–4" not in text and "sections 1-4" not in text


def test_syllabus_project_spec_and_rubric():
    text = (BOOK / "syllabus.md").read_text()
    project = _section(text, "The project")
    for item in ("Deliverables", "at least 3 seeds", "mean ± sd", "A control under every claim"):
        assert item in project, f"the project spec lacks {item!r}"
    total = int(re.search(r"\*\*Rubric\*\* \((\d+) points\)", project).group(1))
    rubric = _list_tables(project)[-1]
    assert rubric[0][:2] == ["criterion", "points"]
    points = [int(r[1]) for r in rubric[1:]]
    assert len(points) >= 4 and sum(points) == total, (points, total)


def test_syllabus_grading_commands_and_slides():
    text = (BOOK / "syllabus.md").read_text()
    assert "`python labs/assignments/release.py`" in text
    assert "`python labs/assignments/grade.py SUBMISSIONS_DIR --out grades/" in text
    for flag in ("--roster", "--deadline", "--written", "--class-report", "--canvas",
                 "--gradescope", "gradescope.py"):
        assert flag in text, f"the syllabus does not say how to use {flag}"
    assert "could tamper" not in text, "grading runs the checks outside the student's process"
    assert "solutions/`; keep them out" not in text, "the release script replaces that advice"
    # the site builds the decks into <site>/slides/; the syllabus page is <site>/book/syllabus.html
    assert re.search(r'href="(\.\./)?slides/index\.html"|\]\((\.\./)?slides/index\.html\)', text)
    assert "`python book/slides/build_slides.py`" in text and "`_build/slides/`" in text
    # the cost table: a row per lab, none for foundations (it has no lab)
    costs = _list_tables(_section(text, "What each lab costs"))[0][1:]
    assert not any("foundations" in r[1] for r in costs)
    assert len(costs) == len(list((ROOT / "labs").glob("*_lab.md")))


def test_chapters_with_an_assignment_have_the_template_section():
    for chapter in _toc_chapters():
        has_assignment = (ROOT / "labs/assignments" / chapter).is_dir()
        has_section = "\n## Graded assignment\n" in (BOOK / f"{chapter}.md").read_text()
        assert has_section == has_assignment, (
            f"book/{chapter}.md: assignment folder {has_assignment}, section {has_section}")


def test_intro_does_not_claim_every_chapter_has_a_lab():
    intro = (BOOK / "intro.md").read_text()
    assert "Each chapter also has a" not in intro
    assert "Every chapter after\n{doc}`foundations` also has a lab" in intro
    # and the toc agrees: every numbered part but the first pairs its chapter with a lab
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    parts = [[e["file"] for e in p["chapters"]] for p in toc["parts"] if p.get("numbered")]
    assert parts[0] == ["book/foundations"]
    assert all(any(f.startswith("labs/") for f in files) for files in parts[1:])
