"""The addition task: problem format, scoring (never raising), the noisy teacher, and the task
registry."""

from __future__ import annotations

import random

import pytest

from agentic_rl.envs import TASKS, AdditionTask, Problem, Task, make_task


def test_problem_format_is_least_significant_digit_first():
    task = AdditionTask(digits=2)
    p = task.make_problem(47, 38)
    assert p.prompt == "7 4 + 8 3 ="
    assert p.answer == "5 8"  # 85
    assert p.meta == {"a": 47, "b": 38}
    p = task.make_problem(5, 5)
    assert p.prompt == "5 0 + 5 0 ="  # operands zero-padded to `digits` digits
    assert p.answer == "0 1"  # 10, no padding on the answer
    assert task.make_problem(0, 0).answer == "0"
    assert task.make_problem(99, 99).answer == "8 9 1"  # 198: digits + 1 answer tokens
    assert AdditionTask(digits=3).make_problem(7, 5).prompt == "7 0 0 + 5 0 0 ="


def test_sample_is_seeded_and_consistent():
    task = AdditionTask(digits=2)
    a = task.sample(50, random.Random(7))
    b = task.sample(50, random.Random(7))
    assert a == b
    assert a != task.sample(50, random.Random(8))
    for p in a:
        x, y = p.meta["a"], p.meta["b"]
        assert 0 <= x <= 99 and 0 <= y <= 99
        assert p.answer == " ".join(reversed(str(x + y)))
        assert p == task.make_problem(x, y)
    assert set(task.vocabulary()) == set("0123456789+=")
    assert task.max_answer_tokens == 3


def test_task_protocol_and_registry():
    assert isinstance(AdditionTask(), Task)
    assert TASKS["addition"] is AdditionTask
    t = make_task("addition", digits=3, teacher_error_rate=0.0)
    assert isinstance(t, AdditionTask) and t.digits == 3 and t.teacher_error_rate == 0.0


def test_make_task_unknown_name_lists_known_tasks():
    with pytest.raises(ValueError, match=r"unknown task 'sudoku'.*addition"):
        make_task("sudoku")


@pytest.mark.parametrize("kwargs", [dict(digits=0), dict(digits=7), dict(teacher_error_rate=-0.1),
                                    dict(teacher_error_rate=1.5)])
def test_invalid_task_arguments(kwargs):
    with pytest.raises(ValueError):
        AdditionTask(**kwargs)


# --------------------------------------------------------------------------- score


P = AdditionTask(digits=2).make_problem(47, 38)  # answer "5 8"


@pytest.mark.parametrize(
    "completion,truncated,correct,format_ok",
    [
        ("5 8", False, True, True),
        ("  5   8 ", False, True, True),  # whitespace-split, like the tokenizer
        ("5 9", False, False, True),
        ("8 5", False, False, True),  # the usual order is wrong here
        ("5", False, False, True),
        ("5 8 0", False, False, True),  # 3 digit tokens = digits + 1: well formed, wrong
        ("5 8 0 0", False, False, False),  # too long
        ("", False, False, False),
        ("   ", False, False, False),
        ("a b", False, False, False),
        ("5 x", False, False, False),
        ("58", False, False, False),  # one word, not a digit token
        ("5 + 8", False, False, False),
        ("5 8 =", False, False, False),
        # truncated: no EOS, a format failure even if the digits are right
        ("5 8", True, False, False),
        ("5 9", True, False, False),
        ("\x00 é <eos>", False, False, False),
    ],
)
def test_score(completion, truncated, correct, format_ok):
    task = AdditionTask(digits=2)
    s = task.score(P, completion, truncated=truncated)
    assert (s.correct, s.format_ok) == (correct, format_ok)
    assert s.reward == pytest.approx(float(correct) + 0.1 * float(format_ok))


def test_reward_values_and_format_weight():
    task = AdditionTask(digits=2)
    assert task.score(P, "5 8").reward == pytest.approx(1.1)
    assert task.score(P, "1 2").reward == pytest.approx(0.1)
    assert task.score(P, "nope").reward == 0.0
    heavy = AdditionTask(digits=2, format_weight=0.5)
    assert heavy.score(P, "5 8").reward == pytest.approx(1.5)
    assert heavy.score(P, "1").reward == pytest.approx(0.5)


# --------------------------------------------------------------------------- noisy teacher


def _wrong_digits(demo: str, answer: str) -> int:
    d, a = demo.split(), answer.split()
    # a wrong demo is still well formed
    assert len(d) == len(a) and all(w in "0123456789" for w in d)
    return sum(x != y for x, y in zip(d, a))


def test_teacher_without_errors_is_always_right():
    task = AdditionTask(digits=2, teacher_error_rate=0.0)
    rng = random.Random(0)
    problems = task.sample(300, rng)
    assert all(task.demonstration(p, rng) == p.answer for p in problems)


def test_teacher_always_wrong_changes_exactly_one_digit():
    task = AdditionTask(digits=2, teacher_error_rate=1.0)
    rng = random.Random(0)
    problems = task.sample(300, rng)
    for p in problems:
        demo = task.demonstration(p, rng)
        assert _wrong_digits(demo, p.answer) == 1
        assert not task.score(p, demo).correct and task.score(p, demo).format_ok


def test_teacher_error_rate_half_is_about_half():
    task = AdditionTask(digits=2, teacher_error_rate=0.5)
    rng = random.Random(123)
    problems = task.sample(2000, rng)
    wrong = [_wrong_digits(task.demonstration(p, rng), p.answer) for p in problems]
    assert set(wrong) <= {0, 1}
    frac = sum(wrong) / len(wrong)
    assert 0.45 < frac < 0.55  # binomial(2000, .5): std 0.011
    # and the teacher is reproducible from the seed
    rng1, rng2 = random.Random(5), random.Random(5)
    first = [task.demonstration(p, rng1) for p in problems[:50]]
    assert first == [task.demonstration(p, rng2) for p in problems[:50]]


def test_problem_equality_ignores_meta():
    assert Problem("1 =", "1", {"a": 1}) == Problem("1 =", "1", {"a": 2})
