"""Lecture slides: hand-written decks (``book/slides/decks/*.md``) to self-contained HTML, offline.

    python book/slides/build_slides.py                               # every deck -> _build/slides/
    python book/slides/build_slides.py week02-grpo --out /tmp/s      # one deck, another folder

The website build (``book/_ext/book_site.py``) runs the same builder into ``<site>/slides/``.

One deck per teaching week of the syllabus (``book/syllabus.md``'s twelve-week plan: weeks 1 to
10; the two project weeks have none), named ``weekNN-<topic>``, in the order of the weeks
(``DECKS``).
A deck is Markdown with a front matter (``title``, ``chapter``: the chapter it teaches, ``week``:
its week, with which the title begins, "Week 3: ..."); a line ``---`` separates slides and a line
``???`` starts a slide's speaker notes. In a slide:

- ``[@key]`` or ``[@key1; @key2]``: citations of ``book/references.bib``, shown author-year,
  "(Shao et al., 2024)"; an unknown key stops the build;
- ``![caption](lab-figure:grpo_lab/1)``: the 1st figure stored by the cells tagged
  ``chapter-figure`` in ``labs/grpo_lab.ipynb``; ``![caption](figures/x.svg)``: a file of
  ``book/slides/figures/``. Both are inlined; a missing figure stops the build;
- ``$...$`` and ``$$...$$`` maths; raw HTML, such as a token row
  ``<div class="tokens"><span class="t prompt">Q:</span><span class="t policy">42</span></div>``
  (classes ``prompt``, ``policy``, ``tool``, ``pad``; a mask row uses ``m1`` and ``m0``) with a
  ``<div class="legend">``.

Each deck is one HTML file with inline CSS and a few lines of JavaScript (arrow keys move,
printing gives a page per slide); it loads nothing from the network. The speaker notes are not in
it, so nothing projected can show them: they go to a page of their own, ``<deck>-notes.html`` (each
slide, small, above its notes, in large type; a page per slide when printed), for the speaker's
screen or paper.
Maths: MathJax ``tex-svg.js`` from the ``sphinx-mathjax-offline`` package is inlined when installed
(``--mathjax none`` leaves the LaTeX as code; the website links its own copy instead).
"""

from __future__ import annotations

import argparse
import base64
import html
import pathlib
import re
import statistics
import sys

from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin

BOOK = pathlib.Path(__file__).resolve().parents[1]
ROOT = BOOK.parent
DECKS_DIR = BOOK / "slides" / "decks"
FIGURES_DIR = BOOK / "slides" / "figures"
#: The decks in the order of the course: one per teaching week, ``DECKS[k]`` for week ``k + 1``.
DECKS = ("week01-foundations", "week02-grpo", "week03-grpo-variants", "week04-gae", "week05-retool",
         "week06-starpo", "week07-rcgrpo", "week08-gcd", "week09-gigpo", "week10-early-experience")
KEYS_HINT = "← → move · print: a page per slide"

CSS = """
body { margin: 0; font: 22px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f;
       background: #e9ecef; }
.slide { box-sizing: border-box; width: 100%; min-height: 100vh; padding: 4vh 6vw;
         background: #fff; border-bottom: 2px solid #ced4da; scroll-snap-align: start;
         display: flex; flex-direction: column; }
.slide.title > :first-child { margin-top: auto; }
.slide.title h1 { font-size: 2.3em; }
html { scroll-snap-type: y proximity; }
h1 { font-size: 1.9em; margin: 0 0 .4em; color: #0b3d91; }
h2 { font-size: 1.45em; margin: 0 0 .5em; color: #0b3d91; border-bottom: 3px solid #0b3d91; }
h3 { font-size: 1.05em; margin: .6em 0 .2em; color: #444; }
ul, ol { margin: .2em 0; } li { margin: .25em 0; }
.math { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: .8em;
        white-space: pre-wrap; background: #f4f6fb; border-left: 4px solid #0b3d91;
        padding: .35em .7em; margin: .35em 0; overflow-x: auto; }
div.math mjx-container { font-size: 1.25em; }
span.math { display: inline; border: 0; padding: 0 .1em; background: none; font-size: .9em; }
pre { font-size: .66em; background: #f8f9fa; border: 1px solid #dee2e6; padding: .6em;
      overflow-x: auto; }
pre code { background: none; padding: 0; font-size: 1em; }
code { font-size: .9em; background: #f1f3f5; padding: 0 .2em; }
table { border-collapse: collapse; font-size: .7em; margin: .4em 0; }
td, th { border: 1px solid #ced4da; padding: .2em .45em; vertical-align: top; }
.fig { display: block; margin: .3em 0; }
.fig img { display: block; height: 58vh; width: auto; max-width: 88vw; object-fit: contain;
           object-position: left; }
.fig .cap { display: block; font-size: .6em; color: #555; }
cite { font-style: normal; color: #555; }
.tokens { display: flex; flex-wrap: wrap; gap: 3px; margin: .25em 0;
          font: .75em/1.2 "DejaVu Sans Mono", Menlo, Consolas, monospace; }
.tokens .t { box-sizing: border-box; padding: .15em .4em; border-radius: 4px;
             border: 2px solid transparent;
             min-width: 1.8em; text-align: center; }
.t.prompt { background: #dee2e6; color: #343a40; }
.t.policy { background: #1c64d1; color: #fff; }
.t.tool { background: #f08c00; color: #fff; }
.t.pad { background: #f8f9fa; color: #adb5bd; border-color: #e9ecef; }
.t.m1 { background: #0b3d91; color: #fff; }
.t.m0 { background: #fff; color: #0b3d91; border-color: #0b3d91; }
.legend { font-size: .6em; color: #555; margin: .2em 0 .4em; }
.footer { margin-top: auto; font-size: .55em; color: #888; }
@media print { .slide { min-height: 100vh; page-break-after: always; border: 0; }
               body { background: #fff; }
               .tokens .t { -webkit-print-color-adjust: exact; print-color-adjust: exact; } }
"""

NAV_JS = """
document.addEventListener('keydown', function (e) {
  var s = Array.from(document.querySelectorAll('.slide')), y = window.scrollY + 5, i = 0;
  while (i + 1 < s.length && s[i + 1].offsetTop <= y) i++;
  var next = ['ArrowRight', 'ArrowDown', 'PageDown', ' '];
  var back = ['ArrowLeft', 'ArrowUp', 'PageUp'];
  if (next.includes(e.key)) i = Math.min(i + 1, s.length - 1);
  else if (back.includes(e.key)) i = Math.max(i - 1, 0);
  else return;
  e.preventDefault(); s[i].scrollIntoView();
});
function alignTokens() {  // a mask row under a token row: one column per token
  document.querySelectorAll('.tokens + .tokens').forEach(function (row) {
    var above = row.previousElementSibling.children, cells = row.children;
    if (above.length !== cells.length) return;
    for (var k = 0; k < cells.length; k++) {
      above[k].style.minWidth = cells[k].style.minWidth = '';
      var w = Math.max(above[k].offsetWidth, cells[k].offsetWidth) + 'px';
      above[k].style.minWidth = cells[k].style.minWidth = w;
    }
  });
}
alignTokens(); window.addEventListener('load', alignTokens);
"""

MATHJAX_CONFIG = "window.MathJax = { tex: { inlineMath: [['\\\\(', '\\\\)']] } };"


class SlideError(ValueError):
    """A deck that cannot be built: an unknown citation key, a missing figure, a bad format."""


# --- reading a deck -----------------------------------------------------------------------------


def parse_deck(text: str, name: str) -> tuple[dict, list[tuple[str, str]]]:
    """``(front matter, [(slide markdown, notes markdown), ...])``. ``---`` lines inside code
    fences do not split slides."""
    import yaml

    lines = text.splitlines()
    if not lines or lines[0].strip() != "---" or "---" not in lines[1:]:
        raise SlideError(f"deck {name}: no front matter "
                         f"(--- title: ... chapter: ... week: ... ---)")
    end = lines.index("---", 1)
    meta = yaml.safe_load("\n".join(lines[1:end])) or {}
    for field in ("title", "chapter", "week"):
        if not meta.get(field):
            raise SlideError(f"deck {name}: the front matter has no {field!r}")
    if not isinstance(meta["week"], int) or meta["week"] < 1:
        raise SlideError(f"deck {name}: week {meta['week']!r} is not a week number")
    if not str(meta["title"]).startswith(f"Week {meta['week']}: "):
        raise SlideError(f"deck {name}: the title must begin with 'Week {meta['week']}: ' "
                         f"(its week), not {str(meta['title'])!r}")
    chunks, current, fence = [], [], None
    for line in lines[end + 1:]:
        marker = re.match(r"^\s*(`{3,}|~{3,})", line)
        if marker and (fence is None or marker.group(1).startswith(fence)):
            fence = None if fence else marker.group(1)
        if line == "---" and fence is None:
            chunks.append(current)
            current = []
        else:
            current.append(line)
    chunks.append(current)
    slides = []
    for chunk in chunks:
        notes = chunk.index("???") if "???" in chunk else len(chunk)
        body, note = "\n".join(chunk[:notes]).strip(), "\n".join(chunk[notes + 1:]).strip()
        if body or note:
            slides.append((body, note))
    if not slides:
        raise SlideError(f"deck {name}: no slides")
    return meta, slides


# --- citations ----------------------------------------------------------------------------------

_BIB: dict | None = None


def bibliography() -> dict:
    """``{key: (author-year label, title)}`` for ``book/references.bib``, labelled as the website
    labels them (``book/_ext/book_site.py``)."""
    global _BIB
    if _BIB is None:
        from pybtex.database import parse_file

        sys.path.insert(0, str(BOOK / "_ext"))
        try:
            from book_site import AuthorYearLabelStyle
        finally:
            sys.path.remove(str(BOOK / "_ext"))
        entries = parse_file(str(BOOK / "references.bib")).entries
        _BIB = {key: (AuthorYearLabelStyle.format_label(entry),
                      re.sub(r"[{}]", "", entry.fields.get("title", "")))
                for key, entry in entries.items()}
    return _BIB


def cite(text: str, name: str) -> str:
    """Replace ``[@a; @b]`` with ``(Author, 2024; Other et al., 2025)``."""
    bib = bibliography()

    def one(match: re.Match) -> str:
        keys = [k.strip().lstrip("@") for k in match.group(1).split(";")]
        unknown = [k for k in keys if k not in bib]
        if unknown:
            raise SlideError(f"deck {name}: unknown citation key(s) {', '.join(unknown)} "
                             f"(not in book/references.bib)")
        parts = [f'<cite title="{html.escape(bib[k][1])}">{html.escape(bib[k][0])}</cite>'
                 for k in keys]
        return "(" + "; ".join(parts) + ")"

    return re.sub(r"\[(@[\w:.-]+(?:\s*;\s*@[\w:.-]+)*)\]", one, text)


# --- figures ------------------------------------------------------------------------------------


def figure_src(src: str, name: str) -> str:
    """A data URI for ``lab-figure:<lab>/<k>`` or ``figures/<file>``."""
    if src.startswith("lab-figure:"):
        from agentic_rl.utils import stored_outputs

        found = re.fullmatch(r"lab-figure:(\w+)/(\d+)", src)
        lab = ROOT / "labs" / f"{found.group(1)}.ipynb" if found else None
        pngs = [v for k, v in stored_outputs(str(lab), "chapter-figure") if k == "png"] if (
            lab and lab.exists()) else []
        k = int(found.group(2)) if found else 0
        if not 1 <= k <= len(pngs):
            raise SlideError(f"deck {name}: missing figure {src} ({len(pngs)} chapter-figure "
                             f"image(s) stored in labs/{found.group(1) if found else '?'}.ipynb)")
        return f"data:image/png;base64,{pngs[k - 1]}"
    path = (BOOK / "slides" / src).resolve()
    if not src.startswith("figures/") or not path.is_file():
        raise SlideError(f"deck {name}: missing figure {src} (expected under book/slides/figures/)")
    mime = {".svg": "image/svg+xml", ".png": "image/png", ".jpg": "image/jpeg"}.get(
        path.suffix.lower())
    if mime is None:
        raise SlideError(f"deck {name}: figure {src} is not .svg, .png or .jpg")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


# --- rendering ----------------------------------------------------------------------------------


class Renderer:
    """Markdown to HTML; maths as TeX in delimiters (MathJax) or as plain source set as code."""

    def __init__(self, name: str, mathjax: bool):
        self.name, self.mathjax, self.figures = name, mathjax, 0
        self.md = MarkdownIt("commonmark").enable("table").use(
            dollarmath_plugin, renderer=lambda tex, opts: self.tex(tex, opts["display_mode"]))
        self.md.renderer.rules["image"] = self.image

    def tex(self, latex: str, display: bool) -> str:
        latex = html.escape(latex.strip())
        if self.mathjax:
            latex = ("\\[" + latex + "\\]") if display else ("\\(" + latex + "\\)")
        tag = "div" if display else "span"
        return f'<{tag} class="math">{latex}</{tag}>'

    def image(self, tokens, idx, options, env):
        token = tokens[idx]
        caption = self.md.renderer.renderInline(token.children or [], options, env)
        self.figures += 1
        return (f'<span class="fig"><img alt="{html.escape(token.content)}" '
                f'src="{figure_src(token.attrGet("src"), self.name)}">'
                f'<span class="cap">{caption}</span></span>')

    def render(self, text: str) -> str:
        out = self.md.render(cite(text, self.name))  # the plugin wraps display maths once more
        return re.sub(r'<div class="math block">\s*(<div class="math">.*?</div>)\s*</div>', r"\1",
                      out, flags=re.S)


def visible_words(body_html: str) -> int:
    """Words a reader sees on a slide: tags, maths and token diagrams left out."""
    text = re.sub(r'<(div|span) class="math">.*?</\1>', " ", body_html, flags=re.S)
    text = re.sub(r'<div class="tokens">.*?</div>', " ", text, flags=re.S)
    text = html.unescape(re.sub(r"<[^>]+>", " ", text))
    return sum(1 for w in text.split() if re.search(r"\w", w))


#: The speaker's page: each slide at half size above its notes, in large type.
NOTES_CSS = """
html { scroll-snap-type: none; }
body { font: 24px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1em 4vw;
       color: #212529; background: #fff; }
.pair { border-top: 2px solid #0b3d91; padding: .6em 0 1em; }
.pair .slide { font-size: 50%; min-height: 0; border: 1px solid #ced4da; padding: .6em 1em;
               scroll-snap-align: none; }
.pair h2.num { font-size: .8em; color: #0b3d91; margin: 0 0 .3em; }
.said { margin-top: .6em; }
@media print { .pair { page-break-after: always; border: 0; } }
"""


def build_deck(name: str, path: pathlib.Path | None = None, mathjax_js: str | None = None,
               mathjax_src: str | None = None) -> tuple[str, dict, str]:
    """``(html, statistics, notes html)`` for one deck: the projected deck (no notes in it), its
    ``{"title", "chapter", "week", "slides", "words" (per slide), "notes" (per slide: has notes),
    "figures"}``, and the speaker's page (each slide above its notes)."""
    path = path or DECKS_DIR / f"{name}.md"
    if not path.exists():
        raise SlideError(f"deck {name}: no file {path}")
    meta, slides = parse_deck(path.read_text(), name)
    r = Renderer(name, mathjax=bool(mathjax_js or mathjax_src))
    title = str(meta["title"])
    stats = {"title": title, "chapter": meta["chapter"], "week": meta["week"],
             "slides": len(slides), "words": [], "notes": [], "figures": 0}
    sections, pairs = [], []
    for n, (body, notes) in enumerate(slides, 1):
        body_html = r.render(body)
        stats["words"].append(visible_words(body_html))
        stats["notes"].append(bool(notes))
        hint = f" · {KEYS_HINT} · speaker notes: {name}-notes.html" if n == 1 else ""
        sections.append(
            f'<section class="slide{" title" if n == 1 else ""}" id="s{n}">{body_html}'
            f'<div class="footer">{html.escape(title)} — {n}/{len(slides)}{hint}</div></section>')
        said = r.render(notes) if notes else "<p>(no notes)</p>"
        pairs.append(f'<section class="pair" id="n{n}"><h2 class="num">{n}/{len(slides)}</h2>'
                     f'<div class="slide">{body_html}</div>'
                     f'<aside class="notes said">{said}</aside></section>')
    stats["figures"] = r.figures
    head = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style>")
    if mathjax_src:
        head += f'<script>{MATHJAX_CONFIG}</script><script src="{mathjax_src}"></script>'
    elif mathjax_js:
        head += f"<script>{MATHJAX_CONFIG}</script><script>{mathjax_js}</script>"
    page = (head + "</head><body>\n" + "\n".join(sections) + f"\n<script>{NAV_JS}</script>"
            "</body></html>\n")
    notes_page = (head.replace(f"<title>{html.escape(title)}</title>",
                               f"<title>{html.escape(title)}: speaker notes</title>")
                  + f"<style>{NOTES_CSS}</style></head><body>\n<h1>{html.escape(title)}: speaker "
                  f"notes</h1>\n" + "\n".join(pairs) + "\n</body></html>\n")
    return page, stats, notes_page


def find_mathjax(choice: str) -> str | None:
    """The text of a local MathJax ``tex-svg.js``: from ``choice`` (a path), or found (``auto``)."""
    if choice == "none":
        return None
    if choice != "auto":
        return pathlib.Path(choice).read_text()
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        dist = distribution("sphinx-mathjax-offline")
    except (ImportError, PackageNotFoundError):
        return None
    for rel in ("sphinx-mathjax-offline/static/mathjax/tex-svg.js",
                "sphinx_mathjax_offline/static/mathjax/tex-svg.js"):
        path = pathlib.Path(dist.locate_file(rel))
        if path.exists():
            return path.read_text()
    return None


def build(decks=DECKS, out: pathlib.Path = ROOT / "_build" / "slides", mathjax: str = "auto",
          mathjax_src: str | None = None, paths: dict | None = None) -> dict[str, dict]:
    """Write ``<out>/<deck>.html`` and ``<out>/<deck>-notes.html`` (the speaker's notes) per deck
    and an ``index.html``; return each deck's statistics.

    ``mathjax_src``: a URL (relative to ``out``) of a MathJax ``tex-svg.js`` to load instead of
    inlining one (the website's own copy). ``paths``: deck files other than ``decks/<name>.md``.
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mathjax_js = None if mathjax_src else find_mathjax(mathjax)
    stats = {}
    for name in decks:
        page, stats[name], notes = build_deck(name, (paths or {}).get(name), mathjax_js,
                                              mathjax_src)
        (out / f"{name}.html").write_text(page)
        (out / f"{name}-notes.html").write_text(notes)
    rows = "".join(f'<li><a href="{n}.html">{html.escape(s["title"])}</a> '
                   f'({s["slides"]} slides; <a href="{n}-notes.html">speaker notes</a>)</li>'
                   for n, s in stats.items())
    (out / "index.html").write_text(
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Lecture slides'
        f"</title><style>body {{ font: 20px/1.5 system-ui, sans-serif; margin: 2em 8vw; }}"
        f"</style></head><body><h1>Lecture slides</h1><p>One deck per teaching week of the "
        f"syllabus; the project weeks have none.</p><ul>{rows}</ul>"
        f"<p>In a deck: {html.escape(KEYS_HINT)}. The speaker notes are on a page of their own, "
        f"for the presenter's screen or paper: nothing projected shows them.</p></body></html>\n")
    return stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("decks", nargs="*", default=list(DECKS), help="deck names in decks/")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "_build" / "slides")
    parser.add_argument("--mathjax", default="auto",
                        help="'auto' (inline a local MathJax if installed), 'none', "
                             "or the path of a tex-svg.js")
    args = parser.parse_args(argv)
    try:
        stats = build(args.decks, args.out, args.mathjax)
    except SlideError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name, s in stats.items():
        print(f"{args.out / (name + '.html')}: {s['slides']} slides, "
              f"median {statistics.median(s['words']):g} words a slide (max {max(s['words'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
