"""The task interface every chapter's environment implements.

A single-turn *task* hands out problems (a prompt and the reference answer), scores a completion, and
writes demonstrations for the SFT warm start. Multi-turn environments (later chapters) add
``reset``/``step`` on top of the same vocabulary and scoring conventions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Problem:
    """One prompt and its reference answer (both plain text)."""

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Score:
    """The outcome of one completion.

    ``reward`` is what the RL loss sees (here: correctness plus a small format term); ``correct`` and
    ``format_ok`` are the two facts it is made of, logged separately.
    """

    reward: float
    correct: bool
    format_ok: bool


@runtime_checkable
class Task(Protocol):
    name: str

    def vocabulary(self) -> list[str]:
        """Every word a prompt or a completion can contain (the tokenizer is built from it)."""

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        """``n`` problems drawn with ``rng`` (so a seed fixes them)."""

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        """A teacher completion for the SFT warm start (it may be wrong on purpose)."""

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Score:
        """Score a completion. Must never raise on malformed text: that is a format failure."""
