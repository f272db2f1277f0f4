"""Addition with a verifiable answer: the GRPO chapter's task.

``47 + 38`` is shown to the model as ``7 4 + 8 3 =`` and answered ``5 8``: every number is written
*least-significant digit first*, one digit per token. That is the order in which you add by hand
(the carry flows left to right in the text), and it is what lets a 1M-parameter model learn the task
in a minute of CPU time; written the usual way round, the same model barely learns it
(``reference/stack.md`` section 9). Operands are zero-padded to ``digits`` digits; the answer has no
padding (``5 + 5`` -> ``0 1``).

The SFT warm start uses a *noisy teacher*: with probability ``teacher_error_rate`` a demonstration
has one digit replaced by a wrong one. A model that imitates it learns the right answer as the most
likely one (high greedy accuracy) but samples a wrong digit often (low sampled accuracy). That gap
is the headroom GRPO can close, and the chapter measures it.
"""

from __future__ import annotations

import random

from .base import Problem, Score

DIGITS = [str(d) for d in range(10)]


def _rev_digits(n: int, width: int | None = None) -> str:
    s = str(n) if width is None else str(n).zfill(width)
    return " ".join(reversed(s))


class AdditionTask:
    """Sum of two ``digits``-digit numbers, least-significant digit first.

    Reward = ``1`` if the answer is exactly right, plus ``format_weight`` if the completion is well
    formed (1 to ``digits + 1`` digit tokens, ended by EOS, nothing else): the exact-match and
    format reward functions of the chapter, summed as TRL sums its reward functions.
    """

    name = "addition"

    def __init__(
        self, digits: int = 2, *, teacher_error_rate: float = 0.5, format_weight: float = 0.1
    ):
        if not 1 <= digits <= 6:
            raise ValueError(f"digits must be between 1 and 6, got {digits}")
        if not 0.0 <= teacher_error_rate <= 1.0:
            raise ValueError(f"teacher_error_rate must be in [0, 1], got {teacher_error_rate}")
        self.digits = digits
        self.teacher_error_rate = teacher_error_rate
        self.format_weight = format_weight

    def vocabulary(self) -> list[str]:
        return DIGITS + ["+", "="]

    @property
    def max_answer_tokens(self) -> int:
        return self.digits + 1

    def make_problem(self, a: int, b: int) -> Problem:
        prompt = f"{_rev_digits(a, self.digits)} + {_rev_digits(b, self.digits)} ="
        return Problem(prompt=prompt, answer=_rev_digits(a + b), meta={"a": a, "b": b})

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        hi = 10**self.digits - 1
        return [self.make_problem(rng.randint(0, hi), rng.randint(0, hi)) for _ in range(n)]

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        digits = problem.answer.split()
        if rng.random() < self.teacher_error_rate:
            i = rng.randrange(len(digits))
            digits[i] = rng.choice([d for d in DIGITS if d != digits[i]])
        return " ".join(digits)

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Score:
        words = completion.split()
        format_ok = (
            (not truncated)
            and 1 <= len(words) <= self.max_answer_tokens
            and all(w in DIGITS for w in words)
        )
        correct = format_ok and words == problem.answer.split()
        return Score(
            reward=float(correct) + self.format_weight * float(format_ok),
            correct=correct,
            format_ok=format_ok,
        )
