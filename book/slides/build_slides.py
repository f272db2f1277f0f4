"""Lecture slides from a chapter's own source: one self-contained HTML deck per chapter, offline.

    python book/slides/build_slides.py                      # all chapters -> _build/slides/
    python book/slides/build_slides.py grpo --out /tmp/s    # one chapter, another folder

What goes on the slides, in the chapter's order:

- a title slide: the title, the opening paragraph, the learning objectives and the prerequisites;
- one slide per ``##`` section (and one per ``###`` subsection): the first sentence of each
  paragraph as a bullet, the first line of each list item, every display equation with its
  number (``$$ ... $$ (label)`` or a ``{math}`` directive with ``:label:``), tables;
- one slide per ``Algorithm`` admonition (the pseudocode box), whole;
- on "The experiment": the figures the chapter shows from its lab, read from the stored outputs of
  the lab notebook's cells tagged ``chapter-figure`` and inlined as PNG data.

Code cells and exercise solutions are left out (the website has them). The deck is one HTML file
with inline CSS and a few lines of inline JavaScript (arrow keys, page per slide when printed); it
loads nothing from the network. Maths: when the ``sphinx-mathjax-offline`` package (or a MathJax
``tex-svg.js`` given with ``--mathjax``) is installed, MathJax is inlined into the deck and typesets
the equations; otherwise the equations stay LaTeX source, set as code (``--mathjax none``
forces it).
"""

from __future__ import annotations

import argparse
import base64
import html
import pathlib
import re
import sys

from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin

from agentic_rl.utils import stored_outputs

BOOK = pathlib.Path(__file__).resolve().parents[1]
ROOT = BOOK.parent
CHAPTERS = ("foundations", "grpo", "gae", "retool", "starpo", "rcgrpo", "gcd", "gigpo",
            "early_experience")
MAX_BULLETS = 7  # per slide; a longer section continues on the next slide
SKIP_SECTIONS = ("References",)

CSS = """
body { margin: 0; font: 22px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f;
       background: #e9ecef; }
.slide { box-sizing: border-box; width: 100%; min-height: 100vh; padding: 4vh 6vw;
         background: #fff; border-bottom: 2px solid #ced4da; scroll-snap-align: start;
         display: flex; flex-direction: column; }
html { scroll-snap-type: y proximity; }
h1 { font-size: 1.9em; margin: 0 0 .4em; color: #0b3d91; }
h2 { font-size: 1.45em; margin: 0 0 .5em; color: #0b3d91; border-bottom: 3px solid #0b3d91; }
h3 { font-size: 1.05em; margin: .6em 0 .2em; color: #444; }
ul, ol { margin: .2em 0; } li { margin: .25em 0; }
.math { font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: .8em;
        white-space: pre-wrap; background: #f4f6fb; border-left: 4px solid #0b3d91;
        padding: .35em .7em; margin: .35em 0; overflow-x: auto; }
span.math { display: inline; border: 0; padding: 0 .1em; background: none; font-size: .9em; }
pre code { background: none; padding: 0; font-size: 1em; }
.eqno { float: right; color: #666; font-family: system-ui, sans-serif; }
pre { font-size: .66em; background: #f8f9fa; border: 1px solid #dee2e6; padding: .6em;
      overflow-x: auto; }
code { font-size: .9em; background: #f1f3f5; padding: 0 .2em; }
table { border-collapse: collapse; font-size: .62em; margin: .4em 0; }
td, th { border: 1px solid #ced4da; padding: .2em .45em; vertical-align: top; }
img { max-width: 88vw; max-height: 62vh; object-fit: contain; margin: .3em 0; }
.box { border: 2px solid #0b3d91; border-radius: 6px; padding: .3em .8em; margin: .3em 0; }
.box-title { font-weight: 600; color: #0b3d91; }
.footer { margin-top: auto; font-size: .55em; color: #888; }
@media print { .slide { height: 100vh; page-break-after: always; border: 0; }
               body { background: #fff; } }
"""

NAV_JS = """
document.addEventListener('keydown', function (e) {
  var s = Array.from(document.querySelectorAll('.slide')), y = window.scrollY + 5, i = 0;
  while (i + 1 < s.length && s[i + 1].offsetTop <= y) i++;
  if (['ArrowRight', 'PageDown', ' '].includes(e.key)) i = Math.min(i + 1, s.length - 1);
  else if (['ArrowLeft', 'PageUp'].includes(e.key)) i = Math.max(i - 1, 0);
  else return;
  e.preventDefault(); s[i].scrollIntoView();
});
"""

MATHJAX_CONFIG = "window.MathJax = { tex: { inlineMath: [['\\\\(', '\\\\)']] } };"


# --- reading the chapter ------------------------------------------------------------------------


def _blocks(text: str) -> list[tuple[str, object]]:
    """Split MyST source into ``(kind, payload)`` blocks, in order.

    kinds: ``h1``/``h2``/``h3`` (text), ``para`` (text), ``list`` (item texts), ``math`` ((latex,
    label)), ``table`` (text), ``admonition`` ((title, body text)), ``code`` (source), ``fence``
    (text of a plain code fence).
    """
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        fence = re.match(r"^(`{3,}|:{3,})\s*(\{[^}]*\})?\s*(.*)$", stripped)
        if fence:
            marker, directive, arg = fence.groups()
            j = i + 1
            while j < len(lines) and lines[j].strip() != marker:
                j += 1
            body = "\n".join(lines[i + 1:j])
            if directive == "{code-cell}":
                out.append(("code", body))
            elif directive == "{math}":  # a labelled display equation: ```{math} + :label: x
                options = dict(re.findall(r"^\s*:([\w-]+):\s*(.*?)\s*$", body, flags=re.MULTILINE))
                latex = "\n".join(
                    [arg] * bool(arg) + [ln for ln in body.splitlines()
                                         if not re.match(r"^\s*:[\w-]+:", ln)])
                out.append(("math", (latex.strip(), options.get("label"))))
            elif directive == "{admonition}":
                body = "\n".join(ln for ln in body.splitlines() if not ln.startswith(":class:"))
                out.append(("admonition", (arg, body.strip())))
            elif directive in (None, "") or directive == "{code-block}":
                out.append(("fence", body))
            i = j + 1
            continue
        if stripped.startswith("$$"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("$$"):
                j += 1
            label = re.search(r"\$\$\s*\(([^)]+)\)", lines[j]) if j < len(lines) else None
            out.append(("math", ("\n".join(lines[i + 1:j]).strip(), label and label.group(1))))
            i = j + 1
            continue
        heading = re.match(r"^(#{1,3}) (.*)$", line)
        if heading:
            out.append((f"h{len(heading.group(1))}", heading.group(2).strip()))
            i += 1
            continue
        if stripped.startswith("|"):
            j = i
            while j < len(lines) and lines[j].strip().startswith("|"):
                j += 1
            out.append(("table", "\n".join(lines[i:j])))
            i = j
            continue
        if re.match(r"^(\s*)([-*]|\d+\.) ", line):
            items, j = [], i
            while j < len(lines) and lines[j].strip():
                if re.match(r"^([-*]|\d+\.) ", lines[j]):
                    items.append(re.sub(r"^([-*]|\d+\.) ", "", lines[j]).strip())
                elif items:
                    items[-1] += " " + lines[j].strip()
                j += 1
            out.append(("list", items))
            i = j
            continue
        if stripped and not stripped.startswith(("(", "%", "```", ":::")):
            j = i
            while j < len(lines) and lines[j].strip() and not re.match(
                    r"^(#{1,3} |\$\$|```|:::|\||\s*([-*]|\d+\.) )", lines[j]):
                j += 1
            out.append(("para", " ".join(ln.strip() for ln in lines[i:j])))
            i = max(j, i + 1)
            continue
        i += 1
    return out


def _first_sentence(text: str) -> str:
    """The first sentence of a paragraph, with its bold lead-in (not cut inside maths, code, a
    role, brackets or bold text)."""
    depth, bold, i = 0, False, 0
    while i < len(text):
        ch = text[i]
        if text.startswith("**", i):
            bold, i = not bold, i + 2
            continue
        if ch in "$`":
            j = text.find(ch, i + 1)
            i = j + 1 if j > 0 else len(text)
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch in ".?!" and depth == 0 and not bold and (i + 1 == len(text) or text[i + 1] == " "):
            head = text[: i + 1]
            lead_only = re.fullmatch(r"\*\*[^*]+\*\*\.?", head.strip())
            if not lead_only and not re.search(r"\b(e\.g|i\.e|eq|vs|cf|Dr|al)\.$", head):
                return head
        i += 1
    return text


class Renderer:
    """Markdown to HTML; maths as TeX in delimiters (MathJax) or as plain source set as code."""

    def __init__(self, equation_numbers: dict[str, str], mathjax: bool):
        self.eq, self.mathjax = equation_numbers, mathjax
        self.md = MarkdownIt("commonmark").enable("table").use(
            dollarmath_plugin, renderer=lambda tex, opts: self.tex(tex, opts["display_mode"]))

    def tex(self, latex: str, display: bool) -> str:
        latex = html.escape(latex.strip())
        if self.mathjax:  # MathJax's delimiters; without MathJax the source is shown as it is
            latex = ("\\[" + latex + "\\]") if display else ("\\(" + latex + "\\)")
        if display:
            return f'<div class="math">{latex}</div>'
        return f'<span class="math">{latex}</span>'

    def roles(self, text: str) -> str:
        """Turn MyST roles into plain text: equation numbers, citation keys, page names."""
        text = re.sub(r"\{eq\}`([^`]+)`",
                      lambda m: f"({self.eq.get(m.group(1), m.group(1))})", text)
        text = re.sub(r"\{cite(:[pt])?\}`([^`]+)`", lambda m: "[" + ", ".join(
            k.strip() for k in m.group(2).split(",")) + "]", text)
        text = re.sub(r"\{doc\}`([^`]+)`",
                      lambda m: m.group(1).rsplit("/", 1)[-1].replace("_", " "), text)
        return re.sub(r"\{[a-z:-]+\}`([^`]+)`", r"\1", text)

    def inline(self, text: str) -> str:
        return self.md.renderInline(self.roles(text))

    def block(self, text: str) -> str:
        return self.md.render(self.roles(text))

    def math(self, latex: str, label: str | None) -> str:
        number = f'<span class="eqno">({self.eq[label]})</span>' if label in self.eq else ""
        div = '<div class="math">'
        return self.tex(latex, display=True).replace(div, div + number)


def _lab_figures(source: str) -> list[str]:
    """PNG outputs of the lab's ``chapter-figure`` cells, for the chapter's experiment slide."""
    found = re.search(r"\{doc\}`\.\./labs/(\w+)`", source)
    lab = ROOT / "labs" / f"{found.group(1)}.ipynb" if found else None
    if lab is None or not lab.exists():
        return []
    return [png for kind, png in stored_outputs(str(lab), "chapter-figure") if kind == "png"]


def chapter_number(name: str) -> str:
    """The chapter's number in ``_toc.yml`` (as the website numbers it), or "" when unnumbered."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    n = 0
    for part in toc.get("parts", []):
        for entry in part.get("chapters", []):
            if part.get("numbered"):
                n += 1
                if pathlib.PurePath(entry["file"]).stem == name:
                    return str(n)
    return ""


def build_deck(chapter_md: pathlib.Path, mathjax_js: str | None = None) -> tuple[str, int]:
    """Return ``(html, number of slides)`` for one chapter."""
    source = chapter_md.read_text()
    blocks = _blocks(source)
    labels = [b[1][1] for b in blocks if b[0] == "math" and b[1][1]]
    prefix = chapter_number(chapter_md.stem)  # equations are (chapter.k), as on the website
    numbers = {label: f"{prefix}.{k}" if prefix else str(k) for k, label in enumerate(labels, 1)}
    r = Renderer(numbers, mathjax=bool(mathjax_js))
    title, slides, current = chapter_md.stem, [], None
    section = ""

    def new_slide(heading: str, kind: str = "h2") -> dict:
        slide = {"title": heading, "kind": kind, "items": [], "bullets": 0}
        slides.append(slide)
        return slide

    for kind, payload in blocks:
        if kind == "h1":
            title = payload
            current = new_slide(payload, "h1")
        elif kind in ("h2", "h3"):
            if kind == "h2":
                section = payload
            skip = section in SKIP_SECTIONS
            current = None if skip else new_slide(
                payload if kind == "h2" else f"{section}: {payload}")
        elif current is None:
            continue
        elif kind == "admonition":
            name, body = payload
            box = (f'<div class="box"><div class="box-title">{r.inline(name)}</div>'
                   f"{r.block(body)}</div>")
            if name.startswith("Algorithm"):  # a pseudocode box gets a slide of its own
                new_slide(name)["items"].append(box)
                current = new_slide(f"{current['title']} (continued)")
            elif current["kind"] == "h1":  # objectives and prerequisites: one slide after the title
                if slides[-1] is current:
                    new_slide("Learning objectives and prerequisites", "h2")
                slides[-1]["items"].append(box)
            else:
                current["items"].append(box)
        elif kind == "math":
            current["items"].append(r.math(*payload))
        elif kind == "table":
            current["items"].append(r.block(payload))
        elif kind in ("para", "list"):
            if current["kind"] == "h1" and kind == "para":
                current["items"].append(f"<p>{r.inline(payload)}</p>")
                continue
            texts = [_first_sentence(payload)] if kind == "para" else [
                _first_sentence(t) for t in payload]
            for text in texts:
                if current["bullets"] >= MAX_BULLETS:
                    base = current["title"].removesuffix(" (continued)")
                    current = new_slide(f"{base} (continued)")
                current["items"].append(f"<ul><li>{r.inline(text)}</li></ul>")
                current["bullets"] += 1
        if current is not None and kind == "h2" and payload.lower().startswith("the experiment"):
            for png in _lab_figures(source):
                current["items"].append(f'<img alt="figure from the lab" '
                                        f'src="data:image/png;base64,{png}">')
    slides = [s for s in slides if s["items"] or s["kind"] == "h1"]
    html_slides = []
    for n, s in enumerate(slides, 1):
        tag = "h1" if s["kind"] == "h1" else "h2"
        body = "".join(s["items"]).replace("</ul><ul>", "")
        html_slides.append(
            f'<section class="slide" id="s{n}"><{tag}>{r.inline(s["title"])}</{tag}>{body}'
            f'<div class="footer">{html.escape(title)} — {n}/{len(slides)}</div></section>')
    head = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{CSS}</style>")
    if mathjax_js:
        head += f"<script>{MATHJAX_CONFIG}</script><script>{mathjax_js}</script>"
    page = (head + "</head><body>\n" + "\n".join(html_slides) + f"\n<script>{NAV_JS}</script>"
            "</body></html>\n")
    return page, len(slides)


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


def build(chapters=CHAPTERS, out: pathlib.Path = ROOT / "_build" / "slides",
          mathjax: str = "auto") -> dict[str, int]:
    """Write ``<out>/<chapter>.html`` per chapter and an ``index.html``; return slide counts."""
    out.mkdir(parents=True, exist_ok=True)
    mathjax_js = find_mathjax(mathjax)
    counts = {}
    for name in chapters:
        page, counts[name] = build_deck(BOOK / f"{name}.md", mathjax_js)
        (out / f"{name}.html").write_text(page)
    links = "".join(f'<li><a href="{n}.html">{n}</a> ({c} slides)</li>' for n, c in counts.items())
    (out / "index.html").write_text(f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>"
                                    f"Slides</title></head><body><h1>Lecture slides</h1><ul>{links}"
                                    f"</ul></body></html>\n")
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", default=list(CHAPTERS),
                        help="chapter names in book/")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "_build" / "slides")
    parser.add_argument("--mathjax", default="auto",
                        help="'auto' (inline a local MathJax if installed), 'none', "
                             "or the path of a tex-svg.js")
    args = parser.parse_args(argv)
    counts = build(args.chapters, args.out, args.mathjax)
    for name, n in counts.items():
        print(f"{args.out / (name + '.html')}: {n} slides")


if __name__ == "__main__":
    sys.exit(main())
