"""The python-tool env's JSON call format: two tools, Hermes-style calls, every bad call counted.

:class:`~agentic_rl.envs.python_tool.PythonToolEnv` with ``call_format="json"`` reads its turns
with :func:`agentic_rl.toolcalls.parse_tool_calls` and offers two tools (:data:`TOOLS`):

* ``python`` (argument ``code``, a string): runs in the sandbox exactly as the fenced block does
  (a last expression printed; the same observation: output cut, or the error's name). Each call
  is its own program in its own process: no variable survives from one call to the next, so the
  calls of a turn run concurrently and their answers come back in the turn's order;
* ``calculator`` (argument ``expression``, a string): :func:`calculate`, integer arithmetic read
  with :mod:`ast` against a whitelist, in this process (it cannot loop, import or print).

This module is the step of such a turn (:func:`step_json`); the env's docstring gives the rules.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Sequence

from .. import sandbox
from ..toolcalls import (
    CLOSE,
    OPEN,
    RESPONSE,
    ParsedTurn,
    ToolCallError,
    render_tool_call,
    render_tool_error,
    render_tool_result,
    tools_system_prompt,
)

#: The tools and their arguments (all required), as the parser checks them.
TOOLS = {"python": {"code": str}, "calculator": {"expression": str}}
DESCRIPTIONS = {
    "python": "Run a Python program; returns what it prints (a last expression is printed).",
    "python.code": "the program, e.g. print(12*34)",
    "calculator": "Integer arithmetic: + - * / // % ** and parentheses.",
    "calculator.expression": "e.g. 12*34",
}
#: The user's message in the JSON format (:func:`json_prompt`): the tools block, then the question.
TOOLS_BLOCK = tools_system_prompt(TOOLS, DESCRIPTIONS)
QUESTION = "What is {a} * {b}? Call a tool to compute it. Then reply with only the number."
#: The calculator's limits: an expression's length, and any value's size (about 1,233 digits).
MAX_EXPRESSION_CHARS, MAX_BITS = 256, 4096


def json_prompt(a: int, b: int) -> str:
    """The tools block first (the env's prompt is the user's message; the chat template adds its
    own system turn), then the question."""
    return f"{TOOLS_BLOCK}\n\n{QUESTION.format(a=a, b=b)}"


class CalculatorError(ValueError):
    """A refused expression; ``str(error)`` is ``"<Python error name>: <why>"``."""


def _exact_div(a: int, b: int) -> int:
    if b and a % b:
        raise CalculatorError("ValueError: not an integer (use // to round down)")
    return a // b


def _power(a: int, b: int) -> int:
    if b < 0:
        raise CalculatorError("ValueError: a negative exponent")
    if abs(a) > 1 and (abs(a).bit_length() - 1) * b > MAX_BITS:  # refused before it is computed
        raise CalculatorError(f"OverflowError: a result over {MAX_BITS} bits")
    return a**b


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: _exact_div,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}


def calculate(expression: str) -> int:
    """The value of an integer expression over ``+ - * / // % **`` and parentheses.

    ``/`` must divide exactly (``7/2`` is refused: ``ValueError``); a zero divisor is a
    ``ZeroDivisionError``; a value over :data:`MAX_BITS` bits an ``OverflowError`` (a power is
    refused before it is computed); anything else (names, calls, floats, strings, an expression
    over :data:`MAX_EXPRESSION_CHARS` characters) a ``SyntaxError`` or ``ValueError``. Every
    refusal is a :class:`CalculatorError`; nothing is ever evaluated as Python.
    """
    if not isinstance(expression, str) or len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"ValueError: at most {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError("SyntaxError: not an arithmetic expression") from None
    return _value(tree.body)


def _value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant):
        if type(node.value) is int:
            return node.value
        raise CalculatorError(f"ValueError: only integers, not {type(node.value).__name__}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise CalculatorError("ZeroDivisionError: division by zero")
        value = _OPERATORS[type(node.op)](left, right)
        if value.bit_length() > MAX_BITS:
            raise CalculatorError(f"OverflowError: a result over {MAX_BITS} bits")
        return value
    raise CalculatorError(f"SyntaxError: {type(node).__name__} is not arithmetic")


def run_calculator(expression: str) -> sandbox.Result:
    """:func:`calculate` as a sandbox result, so both tools' answers are rendered and counted
    alike (a refusal is a failed run whose error names it)."""
    try:
        value = calculate(expression)
    except CalculatorError as e:
        return sandbox.Result("", "", 1, False, False, 0.0, str(e))
    return sandbox.Result(f"{value}\n", "", 0, False, False, 0.0)


def demo_call(name: str, a: str, b: str, tail: str = "") -> str:
    """The teacher's call of ``name`` for ``a*b`` (``tail``: a stray ``*``, the retry's typo)."""
    if name == "python":
        return render_tool_call(name, {"code": f"print({a}*{b}{tail})"})
    return render_tool_call(name, {"expression": f"{a}*{b}{tail}"})


def hallucinates(text) -> bool:
    """Whether a JSON-format turn writes the tool's part: a ``<tool_response>``, or text after
    its last complete call (typically the output it should have waited for)."""
    if not isinstance(text, str):
        return False
    end = text.rfind(CLOSE)
    after = text[end + len(CLOSE) :] if end >= 0 else ""
    return RESPONSE in text or (OPEN not in after and bool(after.strip()))


# --------------------------------------------------------------------------- the step


def step_json(envs: Sequence, texts: Sequence[str]) -> list[tuple]:
    """Step JSON-format episodes together: their ``python`` calls run in the sandbox pool at once,
    each call's answer (or each malformed call's message) in its place in the observation."""
    parsed = [env._before_step(text) for env, text in zip(envs, texts)]
    results: list[tuple | None] = [None] * len(envs)
    answers: dict[int, list] = {}  # episode -> its observation's parts, in the turn's order
    jobs = []  # (episode, part, program)
    for i, (env, (kind, payload)) in enumerate(zip(envs, parsed)):
        if kind == "answer":
            ok, right = env._check_answer(payload)
            reward = 1.0 if right else -1.0
            results[i] = env._end(reward, success=right, format_ok=ok, answered=True)
        elif kind == "malformed":  # no tag, no number: a format failure, as in the fence format
            results[i] = env._end(-1.0, format_ok=False)
        else:
            kinds = [error.kind for error in payload.errors]
            env.malformed_calls.update(kinds)  # every malformed call counted, whatever follows
            if env.calls + len(payload.calls) > env.max_tool_calls:
                # over the tool budget: none of the turn's calls runs
                results[i] = env._end(-1.0, format_ok=not kinds)
                results[i][3]["malformed_calls"] = kinds
            else:
                answers[i] = _plan(env, payload, i, jobs)
    if jobs:
        outputs = envs[jobs[0][0]]._run_programs([program for *_, program in jobs])
        for (i, k, _), result in zip(jobs, outputs):
            answers[i][k] = _answer(envs[i], "python", result)
    for i, parts in answers.items():
        turn: ParsedTurn = parsed[i][1]
        observation, reward, done, info = envs[i]._after_tool("\n".join(parts))
        # a malformed call is a format error of the episode, but not its end (see the env)
        info.update(format_ok=not turn.errors, malformed_calls=[e.kind for e in turn.errors])
        results[i] = observation, reward, done, info
    return results


def _plan(env, turn: ParsedTurn, i: int, jobs: list) -> list:
    """One turn's items in order: a malformed call's message, a call's answer, or ``None`` where
    a ``python`` call waits for the sandbox (queued in ``jobs``)."""
    parts = []
    for item in turn.items:
        if isinstance(item, ToolCallError):
            parts.append(render_tool_error(item))
            continue
        env.calls += 1
        env._by_tool[item.name] += 1
        if not env.tool_enabled:  # the tool never answers
            parts.append(render_tool_result(item.name, ""))
        elif env._rng.random() < env.tool_error_rate:  # the flaky tool: fails without running
            env.tool_errors += 1
            parts.append(render_tool_result(item.name, env._error_text()))
        elif item.name == "python":
            jobs.append((i, len(parts), env._program(item.arguments["code"])))
            parts.append(None)
        else:
            parts.append(_answer(env, item.name, run_calculator(item.arguments["expression"])))
    return parts


def _answer(env, name: str, result: sandbox.Result) -> str:
    env.tool_errors += int(not result.ok)
    return render_tool_result(name, env._render(result))
