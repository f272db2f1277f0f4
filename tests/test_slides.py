"""The lecture slides: hand-written decks (book/slides/decks) built offline by build_slides.py, one
per teaching week of the syllabus (book/syllabus.md's twelve-week plan)."""

from __future__ import annotations

import html
import importlib.util
import pathlib
import re
import statistics
import sys
import types

import pytest
from test_course_kit import _list_tables

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLIDES = ROOT / "book" / "slides"


def _load(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_slides = _load("build_slides", SLIDES / "build_slides.py")
COURSE = ("week01-foundations", "week02-grpo", "week03-grpo-variants", "week04-gae",
          "week05-retool", "week06-starpo", "week07-rcgrpo", "week08-gcd", "week09-gigpo",
          "week10-early-experience")
CHAPTERS = {"foundations", "grpo", "gae", "retool", "starpo", "rcgrpo", "gcd", "gigpo",
            "early_experience"}
SYLLABUS = ROOT / "book" / "syllabus.md"


def _week_plan() -> list[tuple[int, str]]:
    """``[(week, chapter cell), ...]``: the rows of the syllabus's twelve-week plan (its first
    ``{list-table}`` under ``## The twelve-week plan``), each cell's lines joined."""
    text = SYLLABUS.read_text()
    start = text.index("\n## The twelve-week plan\n")
    section = text[start:text.find("\n## ", start + 1)]
    rows = _list_tables(section)[0]
    assert rows[0][:2] == ["week", "chapter and reading"], rows[0]
    return [(int(r[0]), r[1]) for r in rows[1:]]


def _slides(page: str) -> list[str]:
    return re.findall(r'<section class="slide[^"]*" id="s\d+">(.*?)</section>', page, flags=re.S)


@pytest.fixture(scope="module")
def decks(tmp_path_factory):
    """Every deck of the course, built once, maths left as LaTeX (no MathJax inlined)."""
    out = tmp_path_factory.mktemp("slides")
    return out, build_slides.build(out=out, mathjax="none")


def test_the_course_has_every_deck_in_order():
    assert build_slides.DECKS == COURSE
    missing = [n for n in COURSE if not (SLIDES / "decks" / f"{n}.md").exists()]
    assert not missing, f"no deck file for {missing} in book/slides/decks/"
    extra = sorted({p.stem for p in (SLIDES / "decks").glob("*.md")} - set(COURSE))
    assert not extra, f"deck files the course does not build: {extra}"


def test_one_deck_per_lecture_week_of_the_syllabus(decks):
    """The review: "decks do not match weeks" (two foundations decks for its one week, one GRPO
    deck for its two). Each teaching week of the syllabus's plan (a row that starts with a chapter)
    has exactly one deck: ``DECKS[w - 1]``, whose front matter names that week and that chapter,
    whose title begins "Week w:", and which that row links; the project weeks have none."""
    plan = _week_plan()
    assert [w for w, _ in plan] == list(range(1, len(plan) + 1))
    teaching = [(w, re.match(r"\{doc\}`(\w+)`", cell).group(1), cell) for w, cell in plan
                if re.match(r"\{doc\}`\w+`", cell)]
    project = [(w, cell) for w, cell in plan if not re.match(r"\{doc\}`\w+`", cell)]
    assert [w for w, _, _ in teaching] == list(range(1, len(teaching) + 1)), "weeks 1.. teach"
    assert len(teaching) == len(COURSE) == 10 and all("Project week" in c for _, c in project)
    stats = decks[1]
    for (week, chapter, cell), name in zip(teaching, COURSE):
        assert name.startswith(f"week{week:02d}-"), (week, name)
        assert stats[name]["week"] == week and stats[name]["chapter"] == chapter, (week, name)
        assert stats[name]["title"].startswith(f"Week {week}: "), stats[name]["title"]
        links = re.findall(r'href="\.\./slides/([\w-]+)\.html"', cell)
        assert links == [name], f"week {week}'s row must link its deck {name}.html, not {links}"
    for week, cell in project:
        assert "slides/" not in cell, f"project week {week} has no deck to link"
    weeks = [stats[n]["week"] for n in COURSE]
    assert weeks == sorted(set(weeks)), "one deck a week, in order"
    # GRPO's two weeks: week 2 GRPO itself, week 3 its variants
    assert "Dr. GRPO" in stats["week03-grpo-variants"]["title"]
    text = SYLLABUS.read_text()
    slides = text[text.index("\n## Slides\n"):]
    slides = slides[:slides.find("\n## ", 1)]
    assert "one per teaching week" in slides and "two for" not in slides


def test_every_deck_builds_and_the_index_lists_it(decks):
    out, stats = decks
    assert list(stats) == list(COURSE)
    index = (out / "index.html").read_text()
    for name, s in stats.items():
        page = (out / f"{name}.html").read_text()
        # a 75-90 minute lecture
        assert len(_slides(page)) == s["slides"] and 12 <= s["slides"] <= 22, name
        assert f'href="{name}.html"' in index and f"({s['slides']} slides;" in index
        assert f'href="{name}-notes.html"' in index
        assert s["chapter"] in CHAPTERS, (name, s["chapter"])
        assert f">{s['title']}</a>" in html.unescape(index), name
    assert index.index("week01-foundations.html") < index.index("week10-early-experience.html")


@pytest.mark.parametrize("name", COURSE)
def test_one_idea_per_slide(decks, name):
    words = decks[1][name]["words"]
    assert statistics.median(words) <= 40, f"{name}: median {statistics.median(words)} words"
    assert max(words) <= 70, f"{name}: slide {words.index(max(words)) + 1} has {max(words)} words"


@pytest.mark.parametrize("name", COURSE)
def test_every_content_slide_has_speaker_notes(decks, name):
    notes = decks[1][name]["notes"]
    bare = [k + 1 for k, has in enumerate(notes) if not has and k > 0]
    assert not bare, f"{name}: slides {bare} have no notes (a ??? section)"
    said = (decks[0] / f"{name}-notes.html").read_text()
    assert said.count('<aside class="notes said">') == len(notes)  # a slide and its notes each
    assert said.count('<section class="pair"') == len(notes)


@pytest.mark.parametrize("name", COURSE)
def test_nothing_projected_can_show_the_notes(decks, name):
    """The deck holds no speaker notes (review: "n" showed them on the projected slide); they are
    on the speaker's page, linked from the first slide."""
    page = (decks[0] / f"{name}.html").read_text()
    assert "<aside" not in page and 'class="notes' not in page
    assert f"speaker notes: {name}-notes.html" in _slides(page)[0]


@pytest.mark.parametrize("name", COURSE)
def test_citations_are_author_year(decks, name):
    page = (decks[0] / f"{name}.html").read_text()
    assert "[@" not in page
    visible = re.sub(r"<[^>]+>", " ", page)  # bib keys may not survive outside tags either
    keys = [k for k in build_slides.bibliography() if re.search(rf"\b{re.escape(k)}\b", visible)]
    assert not keys, f"{name}: raw citation keys {keys}"
    if "<cite" in page:
        assert re.search(r"<cite[^>]*>[^<]+, \d{4}[a-z]?</cite>", page)


@pytest.mark.parametrize("name", [n for n in COURSE if not n.startswith("week01-")])
def test_chapter_decks_show_a_figure(decks, name):
    assert decks[1][name]["figures"] >= 1
    assert re.search(r'<img [^>]*src="data:image/(png|svg\+xml);base64,', (
        decks[0] / f"{name}.html").read_text())


def test_decks_load_nothing_from_the_network(decks):
    for page in decks[0].glob("*.html"):
        text = page.read_text()
        assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)=[\"']?(https?:)?//", text)
        assert not re.search(r"@import|url\([\"']?(https?:)?//", text)


def _tmp_deck(tmp_path, body: str) -> pathlib.Path:
    path = tmp_path / "broken.md"
    path.write_text("---\ntitle: 'Week 2: Broken'\nchapter: grpo\nweek: 2\n---\n\n"
                    "# Broken\n\n---\n\n" + body)
    return path


def test_unknown_citation_key_fails_naming_key_and_deck(tmp_path):
    deck = _tmp_deck(tmp_path, "## A slide\nText [@shao2024deepseekmath; @nosuchkey2099].\n")
    with pytest.raises(build_slides.SlideError, match=r"deck broken: .*nosuchkey2099"):
        build_slides.build(["broken"], tmp_path / "out", "none", paths={"broken": deck})


@pytest.mark.parametrize("src", ["lab-figure:grpo_lab/99", "lab-figure:no_such_lab/1",
                                 "figures/no-such.svg"])
def test_missing_figure_fails_naming_it(tmp_path, src):
    deck = _tmp_deck(tmp_path, f"## A slide\n![a figure]({src})\n")
    with pytest.raises(build_slides.SlideError, match=rf"deck broken: missing figure {src}"):
        build_slides.build(["broken"], tmp_path / "out", "none", paths={"broken": deck})


def test_deck_format(tmp_path):
    deck = _tmp_deck(tmp_path, "## Two\n- one $x^2$ [@williams1992simple]\n\n???\nSaid aloud.\n"
                               "\n---\n\n```text\n---\n```\n\n???\nA fence is not a separator.\n")
    page, stats, said = build_slides.build_deck("broken", deck)
    assert stats["slides"] == 3 and stats["notes"] == [False, True, True]
    assert stats["words"][1] == 4  # Two, one, (Williams, 1992): maths and notes left out
    assert "(<cite" in page and "Williams, 1992</cite>)" in page
    assert "Said aloud." in said and "Said aloud." not in page  # the notes: the speaker's page
    assert said.index("Two") < said.index("Said aloud.") < said.index("A fence is not")
    assert stats["week"] == 2 and stats["title"] == "Week 2: Broken"


@pytest.mark.parametrize("front, error", [
    ("title: 'Week 2: Broken'\nchapter: grpo", "has no 'week'"),
    ("title: Broken\nchapter: grpo\nweek: 2", "must begin with 'Week 2: '"),
    ("title: 'Week 3: Broken'\nchapter: grpo\nweek: 2", "must begin with 'Week 2: '"),
    ("title: 'Week two: Broken'\nchapter: grpo\nweek: two", "not a week number"),
])
def test_a_deck_names_its_week(tmp_path, front, error):
    path = tmp_path / "broken.md"
    path.write_text(f"---\n{front}\n---\n\n# Broken\n")
    with pytest.raises(build_slides.SlideError, match=rf"deck broken: .*{re.escape(error)}"):
        build_slides.build_deck("broken", path)


def test_site_hook_writes_the_slides(tmp_path):
    """A real Sphinx HTML build (one page, warnings as errors) with the website's extensions runs
    the ``build-finished`` hook of ``book_site``: the site gets ``slides/index.html`` and decks
    that load the site's own MathJax copy. Another builder, or a failed build, writes nothing."""
    from sphinx.application import Sphinx

    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['sphinx-mathjax-offline', 'book_site']\n")
    (src / "index.rst").write_text("Site\n====\n\n:math:`x^2`\n")
    out = tmp_path / "html"
    app = Sphinx(str(src), str(src), str(out), str(tmp_path / "doctrees"), "html",
                 status=None, warningiserror=True)
    app.build()
    assert app.statuscode == 0
    index = (out / "slides" / "index.html").read_text()
    assert all(f'href="{name}.html"' in index for name in COURSE)
    page = (out / "slides" / "week02-grpo.html").read_text()
    assert '<script src="../_static/mathjax/tex-svg.js"></script>' in page and "\\(" in page
    assert (out / "_static" / "mathjax" / "tex-svg.js").exists()

    book_site = sys.modules["book_site"]
    fake = types.SimpleNamespace(builder=types.SimpleNamespace(name="latex"),
                                 outdir=str(tmp_path / "other"))
    book_site.build_slides(fake, None)
    fake.builder.name = "html"
    book_site.build_slides(fake, RuntimeError("the build failed"))
    assert not (tmp_path / "other").exists()
