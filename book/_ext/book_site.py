"""Sphinx additions for the book's website (``_config.yml``: ``sphinx.local_extensions``).

- ``author_year``: a pybtex style whose bibliography labels read like the in-text citations of
  ``bibtex_reference_style: author_year`` ("Shao et al., 2024"), instead of alpha labels ("SWZ+24").
- Launch buttons (Colab) only on pages that are notebooks (``labs/*.ipynb``). The chapters are MyST
  Markdown files; the theme would send Colab to the ``.md`` source, which Colab cannot open.
- The lecture slides (``book/slides/build_slides.py``) are built into ``<site>/slides/`` after a
  successful HTML build, loading the site's own MathJax copy (``_static/mathjax``).
"""

from __future__ import annotations

from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle


def _surname(person) -> str:
    return " ".join(person.prelast_names + person.last_names) or str(person)


class AuthorYearLabelStyle(BaseLabelStyle):
    """"Williams, 1992", "Sutton and Barto, 2018", "Shao et al., 2024"; "2024a", "2024b"."""

    def format_labels(self, sorted_entries):
        labels = [self.format_label(entry) for entry in sorted_entries]
        counts, seen = Counter(labels), Counter()
        for label in labels:
            if counts[label] > 1:
                seen[label] += 1
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label] - 1]
            else:
                yield label

    @staticmethod
    def format_label(entry) -> str:
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [_surname(p) for p in people if str(p) != "others"]
        if not names:
            who = entry.fields.get("key", entry.key)
        elif len(names) == 1 and len(people) == 1:
            who = names[0]
        elif len(names) == 2 and len(people) == 2:
            who = f"{names[0]} and {names[1]}"
        else:
            who = f"{names[0]} et al."
        return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearStyle(UnsrtStyle):
    """``unsrt`` entries, author–year labels, sorted by author, year and title."""

    default_label_style = "author_year"
    default_sorting_style = "author_year_title"


register_plugin("pybtex.style.labels", "author_year", AuthorYearLabelStyle)
register_plugin("pybtex.style.formatting", "author_year", AuthorYearStyle)


def _launch_buttons_only_on_notebooks(app, pagename, templatename, context, doctree):
    if context.get("page_source_suffix") == ".ipynb" or "header_buttons" not in context:
        return
    context["header_buttons"] = [
        button for button in context["header_buttons"] if button.get("label") != "launch-buttons"
    ]


def build_slides(app, exception):
    """``build-finished``: the lecture decks into ``<outdir>/slides/`` (HTML builds that passed)."""
    if exception is not None or app.builder.name != "html":
        return
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "slides" / "build_slides.py"
    spec = importlib.util.spec_from_file_location("build_slides", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # sphinx-mathjax-offline copies MathJax to _static/mathjax; tex-svg.js needs no font files
    module.build(out=pathlib.Path(app.outdir) / "slides", mathjax="none",
                 mathjax_src="../_static/mathjax/tex-svg.js")


def setup(app):
    # after sphinx-book-theme's add_launch_buttons (priority 501)
    app.connect("html-page-context", _launch_buttons_only_on_notebooks, priority=502)
    app.connect("build-finished", build_slides)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
