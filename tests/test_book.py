"""The book as its readers meet it: paired notebooks in sync, labs ready for Colab, the website
built.

(The labs themselves are executed and compared by nbval: ``pytest`` collects ``labs/*.ipynb``.)
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import jupytext
import pytest
from jupytext.compare import NotebookDifference, compare_notebooks

ROOT = pathlib.Path(__file__).resolve().parents[1]
LABS = sorted((ROOT / "labs").glob("*.ipynb"))


def _paired_twins(nb_path: pathlib.Path):
    fmts = jupytext.read(nb_path).metadata.get("jupytext", {}).get("formats", "")
    for fmt in fmts.split(","):
        if fmt and not fmt.startswith("ipynb"):
            ext = fmt.partition(":")[0]
            yield nb_path.with_suffix("." + ext.split(".")[-1]), fmt


def test_there_are_labs():
    assert LABS, "no labs/*.ipynb found"


@pytest.mark.parametrize("nb_path", LABS, ids=lambda p: p.name)
def test_lab_is_paired_and_in_sync(nb_path):
    twins = list(_paired_twins(nb_path))
    assert twins, (
        f"{nb_path.name} is not paired with a text twin (jupytext --set-formats ipynb,md:myst)"
    )
    for twin, fmt in twins:
        assert twin.exists(), f"{twin} is missing"
        try:
            compare_notebooks(jupytext.read(twin), jupytext.read(nb_path), fmt=fmt,
                              allow_expected_differences=True)
        except NotebookDifference as err:  # pragma: no cover - the message is the point
            pytest.fail(
                f"{twin.name} and {nb_path.name} are out of sync; "
                f"run `jupytext --sync {twin}`:\n{err}"
            )


@pytest.mark.parametrize("nb_path", LABS, ids=lambda p: p.name)
def test_lab_opens_in_colab_and_has_stored_outputs(nb_path):
    nb = json.loads(nb_path.read_text())
    first = "".join(nb["cells"][0]["source"])
    assert "colab.research.google.com" in first and nb_path.name in first, (
        "first cell must be the Open-in-Colab badge for this notebook"
    )
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    setup = "".join(code[0]["source"])
    assert '"google.colab" in sys.modules' in setup, (
        "the first code cell must guard the install with a Colab check"
    )
    for line in setup.splitlines():
        if "pip install" in line:
            assert not re.search(r"\btorch\b", line), (
                "the Colab install must never (re)install torch"
            )
    unrun = [i for i, c in enumerate(code) if c.get("execution_count") is None]
    assert not unrun, (
        f"code cells {unrun} have no stored execution (run `jupytext --sync` then "
        "`jupyter nbconvert --to notebook --execute --inplace` on the .ipynb)"
    )
    assert all(c.get("outputs") is not None for c in code)
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, "stored outputs contain an error"


def test_package_install_does_not_touch_torch(tmp_path):
    """What the Colab cell does, offline: resolving the package against this environment installs
    only itself.

    ``pyproject.toml`` declares ranges (``torch>=2.2``...), so an environment that already has
    torch, as Colab does, keeps it. ``--no-index`` makes any extra requirement fail loudly instead
    of downloading.
    """
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation",
         "--quiet", "--report", str(report), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    extra = sorted(names - {"agentic-rl"})
    assert names == {"agentic-rl"}, f"installing the package would also install {extra}"


@pytest.mark.xdist_group("book")
def test_book_builds_offline_with_warnings_as_errors(built_book):
    """``jupyter-book build -W`` executes every chapter, its asserts and exercise solutions
    included.

    The build is the session's ``built_book`` (conftest.py), which test_site.py opens in a browser.
    """
    assert built_book.returncode == 0, built_book.log[-6000:]
    html = built_book.html
    for page in ("book/intro.html", "book/foundations.html", "book/grpo.html", "labs/grpo_lab.html",
                 "book/gae.html", "labs/gae_lab.html"):
        assert (html / page).exists(), f"{page} was not built"
    lab = (html / "labs/grpo_lab.html").read_text()
    assert "colab.research.google.com" in lab
    assert "GRPO" in (html / "book/grpo.html").read_text()
