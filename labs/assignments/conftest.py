"""Keep the graded assignments out of the book's own test run.

The student notebooks (``*.ipynb`` here) are stubs to fill in, and the answer key's masters are
not notebooks pytest should run: nbval never collects anything under ``labs/assignments``.
``tests/test_assignments.py`` builds every release and grades generated submissions (``grade.py``).
"""

from __future__ import annotations


def pytest_ignore_collect(collection_path, config):
    return True
