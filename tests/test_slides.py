"""The lecture slides, built offline from the chapters' source by build_slides.py."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("build_slides",
                                              ROOT / "book" / "slides" / "build_slides.py")
build_slides = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(build_slides)


@pytest.fixture(scope="module", params=["none", "auto"])
def decks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"slides-{request.param}")
    counts = build_slides.build(out=out, mathjax=request.param)
    return out, counts


def _sections(chapter: str) -> list[str]:
    text = (ROOT / "book" / f"{chapter}.md").read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # headings inside code cells are comments
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    return [h for h in headings if h not in build_slides.SKIP_SECTIONS]


@pytest.mark.parametrize("chapter", build_slides.CHAPTERS)
def test_one_slide_per_section(decks, chapter):
    out, counts = decks
    page = (out / f"{chapter}.html").read_text()
    slides = re.findall(r'<section class="slide" id="s\d+">(.*?)</section>', page, flags=re.S)
    assert len(slides) == counts[chapter]
    titles = [re.search(r"<h[12]>(.*?)</h[12]>", s, flags=re.S).group(1) for s in slides]
    renderer = build_slides.Renderer({}, mathjax=False)
    for heading in _sections(chapter):  # a section, or its subsections ("Section: subsection")
        h = renderer.inline(heading)
        assert any(t == h or t.startswith(h + ": ") for t in titles), f"no slide for {heading!r}"
    assert any(t.startswith("Algorithm") for t in titles), "the pseudocode box has no slide"
    assert "Learning objectives" in page and "Prerequisites" in page


@pytest.mark.parametrize("chapter", build_slides.CHAPTERS)
def test_decks_load_nothing_from_the_network(decks, chapter):
    page = (decks[0] / f"{chapter}.html").read_text()
    assert not re.search(r"<(script|link|img|iframe)[^>]*\b(src|href)=[\"']?(https?:)?//", page)
    assert not re.search(r"@import|url\([\"']?(https?:)?//", page)


def test_experiment_slides_show_the_lab_figures(decks):
    out, _ = decks
    for chapter in ("grpo", "gae", "retool", "starpo", "rcgrpo", "gcd", "gigpo",
                    "early_experience"):
        assert 'src="data:image/png;base64,' in (out / f"{chapter}.html").read_text()


def test_equations_are_numbered_as_in_the_chapter(decks):
    page = (decks[0] / "grpo.html").read_text()
    number = build_slides.chapter_number("grpo")  # the website numbers equations (chapter.k)
    assert f'<span class="eqno">({number}.1)</span>' in page and "\\hat A_i" in page


@pytest.mark.parametrize("chapter", ["starpo", "rcgrpo", "gcd", "gigpo", "early_experience"])
def test_math_directive_equations_are_numbered(decks, chapter):
    """Chapters that write ```{math} with :label: (not $$ ... $$ (label)) get their equations."""
    source = (ROOT / "book" / f"{chapter}.md").read_text()
    labels = re.findall(r"^```\{math\}\n:label: (\S+)", source, flags=re.MULTILINE)
    assert labels, f"{chapter} has no labelled {{math}} equation"
    page = (decks[0] / f"{chapter}.html").read_text()
    number = build_slides.chapter_number(chapter)
    for k in range(1, len(labels) + 1):
        assert f'<span class="eqno">({number}.{k})</span>' in page
    assert ":label:" not in page
