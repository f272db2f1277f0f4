"""The package's source fits the book's page: no line of ``src/agentic_rl`` is over 100 characters.

The book prints package code with ``inspect.getsource``, so a long line (a comment, a docstring,
a help text) overflows the printed page. ``ruff format`` keeps code within ``line-length`` (100,
set in pyproject.toml) but leaves comments and strings alone; this test covers them too.
"""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "agentic_rl"
MAX_LINE = 100


def test_package_lines_fit_the_page():
    files = sorted(PACKAGE.rglob("*.py"))
    assert files, f"no Python files under {PACKAGE}"
    long = [
        f"{path.relative_to(ROOT)}:{number}: {len(line)} characters"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if len(line) > MAX_LINE
    ]
    assert not long, f"{len(long)} lines over {MAX_LINE} characters:\n" + "\n".join(long)
