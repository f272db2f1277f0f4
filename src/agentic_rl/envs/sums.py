"""Sums asked in plain English: the task of the GRPO chapter's pretrained-model section.

``What is 7 + 5? Answer with the number only.`` is sent to an instruct model as a user turn of its
chat template (``chat = True``: the trainer applies the template). A small instruct model knows many
of these sums, but it rarely obeys the second sentence: it explains (``To solve this, we need to
...``), restates (``7 + 5 = 12``) or wanders off. So the reward has two parts, summed as TRL sums
its reward functions: ``1`` if the answer is right, plus ``format_weight`` if the completion is the
number alone.

``parse_answer`` is deliberately lenient (the last integer in the text), so that *accuracy* measures
arithmetic and *format rate* measures obedience, separately: ``The answer is 12.`` is correct and
not well formed; ``13`` is well formed and wrong. A completion cut off by the length limit has no
final answer: it is neither.
"""

from __future__ import annotations

import random
import re

from .base import Problem, Score

_INTEGER = re.compile(r"-?\d+")
_BARE_NUMBER = re.compile(r"\s*-?\d+\.?\s*")


def parse_answer(text: str) -> int | None:
    """The last integer written in ``text`` (thousands separators allowed), or ``None``; also
    ``None`` for one of more than 4,300 significant digits, which Python's ``int`` refuses to read
    (never a sum's answer: it raised a ValueError that ended the run)."""
    found = _INTEGER.findall(re.sub(r"(?<=\d),(?=\d{3}\b)", "", text))
    if not found:
        return None
    sign, digits = ("-", found[-1][1:]) if found[-1].startswith("-") else ("", found[-1])
    try:
        return int(sign + (digits.lstrip("0") or "0"))
    except ValueError:
        return None


def is_bare_number(text: str) -> bool:
    """``text`` is one integer, optionally followed by a full stop, and nothing else."""
    return _BARE_NUMBER.fullmatch(text) is not None


class SumsTask:
    """``What is a + b? Answer with the number only.``, operands with up to ``digits`` digits.

    Needs a pretrained model with a chat template: the prompts are English, not the tiny
    tokenizer's vocabulary.
    """

    name = "sums"
    chat = True  # prompts are user turns: the trainer wraps them in the model's chat template

    def __init__(self, digits: int = 1, *, format_weight: float = 0.5):
        if not 1 <= digits <= 6:
            raise ValueError(f"digits must be between 1 and 6, got {digits}")
        if format_weight < 0:
            raise ValueError(f"format_weight must be >= 0, got {format_weight}")
        self.digits = digits
        self.format_weight = format_weight

    def vocabulary(self) -> list[str]:
        raise ValueError(
            "the sums task is written in English: it needs a pretrained model and its own "
            "tokenizer (set model_name_or_path, e.g. --profile pretrained), not the tiny one"
        )

    def make_problem(self, a: int, b: int) -> Problem:
        prompt = f"What is {a} + {b}? Answer with the number only."
        return Problem(prompt=prompt, answer=str(a + b), meta={"a": a, "b": b})

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        hi = 10**self.digits - 1
        return [self.make_problem(rng.randint(0, hi), rng.randint(0, hi)) for _ in range(n)]

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        return problem.answer

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Score:
        format_ok = not truncated and is_bare_number(completion)
        correct = not truncated and parse_answer(completion) == int(problem.answer)
        return Score(
            reward=float(correct) + self.format_weight * float(format_ok),
            correct=correct,
            format_ok=format_ok,
        )
