"""The lecture slides: hand-written decks (book/slides/decks) built offline by build_slides.py."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import statistics
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SLIDES = ROOT / "book" / "slides"


def _load(name: str, path: pathlib.Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_slides = _load("build_slides", SLIDES / "build_slides.py")
COURSE = ("foundations-1", "foundations-2", "grpo", "gae", "retool", "starpo", "rcgrpo", "gcd",
          "gigpo", "early_experience")
CHAPTERS = {"foundations", "grpo", "gae", "retool", "starpo", "rcgrpo", "gcd", "gigpo",
            "early_experience"}


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


def test_every_deck_builds_and_the_index_lists_it(decks):
    out, stats = decks
    assert list(stats) == list(COURSE)
    index = (out / "index.html").read_text()
    for name, s in stats.items():
        page = (out / f"{name}.html").read_text()
        assert len(_slides(page)) == s["slides"] and 12 <= s["slides"] <= 20, name
        assert f'href="{name}.html"' in index and f"({s['slides']} slides;" in index
        assert f'href="{name}-notes.html"' in index
        assert s["chapter"] in CHAPTERS, (name, s["chapter"])
    assert index.index("foundations-1.html") < index.index("early_experience.html")


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


@pytest.mark.parametrize("name", [n for n in COURSE if not n.startswith("foundations")])
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
    path.write_text("---\ntitle: Broken\nchapter: grpo\n---\n\n# Broken\n\n---\n\n" + body)
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
    page = (out / "slides" / "grpo.html").read_text()
    assert '<script src="../_static/mathjax/tex-svg.js"></script>' in page and "\\(" in page
    assert (out / "_static" / "mathjax" / "tex-svg.js").exists()

    book_site = sys.modules["book_site"]
    fake = types.SimpleNamespace(builder=types.SimpleNamespace(name="latex"),
                                 outdir=str(tmp_path / "other"))
    book_site.build_slides(fake, None)
    fake.builder.name = "html"
    book_site.build_slides(fake, RuntimeError("the build failed"))
    assert not (tmp_path / "other").exists()
