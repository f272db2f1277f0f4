"""Exercise solutions behind a toggle that reads "Show solution" (``_config.yml``).

Every ``hide-cell`` code cell of the chapters is an exercise solution (``tests/test_course_kit.py``
checks it). MyST-NB's prompt, ``nb_code_prompt_show``, is one string for every hidden cell: it
would also label the ``hide-output`` cells (a function's long source) and the ``hide-input``
cell (a figure's code) "solution". So the book keeps MyST-NB's default prompt for those, and this
post-transform gives the ``hide-cell`` cells alone (MyST-NB's hide mode ``"all"``) the prompts
``book_solution_prompt_show`` and ``book_solution_prompt_hide``. It runs just before MyST-NB's
``HideInputCells`` (priority 199), which builds the toggles from these prompts. A cell that sets
its own prompt (cell metadata ``mystnb: code_prompt_show``) keeps it.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform


class SolutionPrompts(SphinxPostTransform):
    """Set the toggle prompts of the ``hide-cell`` code cells."""

    default_priority = 198  # MyST-NB's HideInputCells: 199
    formats = ("html",)

    def run(self, **kwargs) -> None:
        config = self.app.config
        for node in self.document.findall(nodes.container):
            if node.get("nb_element") != "cell_code" or node.get("hide_mode") != "all":
                continue
            own = (node.get("cell_metadata") or {}).get("mystnb", {})
            if "code_prompt_show" not in own:
                node["prompt_show"] = config.book_solution_prompt_show
            if "code_prompt_hide" not in own:
                node["prompt_hide"] = config.book_solution_prompt_hide


def setup(app):
    app.add_config_value("book_solution_prompt_show", "Show solution", "html", types=[str])
    app.add_config_value("book_solution_prompt_hide", "Hide solution", "html", types=[str])
    app.add_post_transform(SolutionPrompts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
