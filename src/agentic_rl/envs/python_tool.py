"""ReTool's multiplication task for a real instruct model: Python code blocks in chat turns.

:class:`PythonToolEnv` is :class:`~agentic_rl.envs.multiply.MultiplyEnv` (the same ``a * b``
problems from the same seeds, the same rewards, tool budget, turn limit, switched-off and flaky
tool, sandbox pool) written for a pretrained chat model such as SmolLM2-135M-Instruct, with its own
BPE tokenizer and chat template. The env deals in *message contents* only: the prompt is the
user's message, each ``step`` gets one assistant message (without its end-of-turn token), and each
observation is the content of the tool's message; wrapping them in the chat template is the
rollout's job. An episode (``a = 347``, ``b = 29``)::

    user:       What is 347 * 29? Run Python: reply with only a ```python code block that
                prints it. Then reply with only the number.
    assistant:  ```python
                print(347*29)
                ```
    tool:       10063
    assistant:  10063                                           -> reward +1, done

**Parse rules.** A turn is stripped of surrounding white space, then it must be, as a whole,
exactly one of (anything else is a format failure: reward ``-1``, the episode ends):

* a tool call: one fenced block (three backticks, optionally ``python``, a newline, the code, three
  backticks); nothing before or after it, and no other fence inside. The code runs in the
  sandbox (:mod:`agentic_rl.sandbox`); as in the verl ReTool recipe, a last statement that is an
  expression (other than a ``print(...)`` call) is wrapped in ``print(...)``, so ``347*29`` prints
  its value. Code that does not parse runs as it is, and the interpreter reports the
  ``SyntaxError``. A call beyond ``max_tool_calls`` is not run: reward ``-1``, the episode ends.
* an answer: an integer in ASCII digits, optionally negative (``10063``, ``-5``); reward ``+1``
  if it is ``a * b``, else ``-1``. ``The answer is 10063`` is a format failure.

**Observations.** On success the program's stdout, stripped, cut to ``max_output_chars``
characters and then marked ``...``; a program that prints nothing gets an empty observation. On
failure only the error's name, the part of the sandbox's one-line error before its first ``:``
(``SyntaxError``, ``NameError``, ``blocked`` for what the sandbox refuses, ``TimeoutError`` at the
deadline): short, and the same on every Python version. With the tool off (``tool_enabled=False``)
a call gets an empty observation; a call that the flaky tool (``tool_error_rate``) fails without
running gets ``Error``.

**Every call runs.** MultiplyEnv runs each distinct program of a turn once and shares the result,
which is safe only because its word-level code cannot express randomness, time or input. Real
Python can (``import random``): the same program may print different things, so here every call
runs in the sandbox, concurrently across the episodes stepped together (``step_batch``).

**Hallucination.** ``hallucinated`` is set when a turn contains a complete fenced block followed by
more non-space text: the model goes on after its code instead of waiting for the tool, typically by
writing the output itself (such a turn is also malformed). With the tool off, a model that writes
the number it did not get is not told apart from one that answers.
"""

from __future__ import annotations

import ast
import random
import re

from .. import sandbox
from .multiply import MultiplyEnv, miscopy, run_each

#: The user's message; the chapter prints it.
PROMPT = (
    "What is {a} * {b}? Run Python: reply with only a ```python code block that prints it. "
    "Then reply with only the number."
)
FENCE = "```"
#: A whole turn that is one tool call; group 1 is the code.
TOOL_CALL = re.compile(r"```(?:python)?\n(.*?)\n?```", re.DOTALL)
#: A whole turn that is an answer.
NUMBER = re.compile(r"-?[0-9]+")
#: A complete fenced block (any label) and what follows it.
_BLOCK_THEN = re.compile(r"```[^\n]*\n.*?```(.*)", re.DOTALL)
ERROR = "Error"


def with_print(code: str) -> str:
    """``code`` with its last statement wrapped in ``print(...)`` when that is an expression.

    ``"x = 3\\nx * 2"`` -> ``"x = 3\\nprint(x * 2)"``; the text before and after the expression is
    kept as written. A ``print(...)`` call is left alone (no ``None`` printed after it), an
    unparenthesised tuple is printed as a tuple, and code that does not parse is returned as it
    is, for the interpreter to report the ``SyntaxError``.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    value = last.value
    func = value.func if isinstance(value, ast.Call) else None
    if isinstance(func, ast.Name) and func.id == "print":
        return code
    data = code.encode()  # ast's column offsets count UTF-8 bytes
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    begin = starts[last.lineno - 1] + last.col_offset
    end = starts[last.end_lineno - 1] + last.end_col_offset
    left, right = (b"print((", b"))") if isinstance(value, ast.Tuple) else (b"print(", b")")
    return (data[:begin] + left + data[begin:end] + right + data[end:]).decode()


def same_integer(number: str, value: int) -> bool:
    """Whether ``number`` (ASCII digits, optionally after a ``-``) writes ``value``: compared as
    digit strings, not with ``int(number)``, which refuses more than 4,300 digits (a ValueError
    that ended a run when a model wrote a long answer)."""
    negative, digits = number.startswith("-"), number.lstrip("-").lstrip("0") or "0"
    return digits == str(abs(value)) and (negative == (value < 0) or digits == "0")


def error_name(result: sandbox.Result) -> str:
    """A failed run's name: ``TimeoutError``, else its one-line error up to the first ``:``."""
    if result.timed_out:
        return "TimeoutError"
    return (result.error or ERROR).split(":")[0].strip() or ERROR


def cut(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars`` characters, then ``...`` when it was longer."""
    return text if len(text) <= max_chars else text[:max_chars] + "..."


class PythonToolEnv(MultiplyEnv):
    """``a * b`` with Python code blocks in chat messages (see the module docstring).

    Args:
        digits, and the keyword ``options`` (max_tool_calls, tool_enabled, tool_error_rate,
            timeout_s, memory_mb, pool): as in :class:`~agentic_rl.envs.multiply.MultiplyEnv`.
        max_output_chars: program output longer than this is cut and marked ``...``.
    """

    name = "python-tool"
    chat = True  # prompts and turns are chat messages, to be wrapped in the model's template

    def __init__(
        self, digits: tuple[int, int] = (3, 2), *, max_output_chars: int = 32, **options
    ):
        if not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise ValueError(f"max_output_chars must be an int >= 1, got {max_output_chars!r}")
        super().__init__(digits, **options)  # MultiplyEnv's checks and fields
        self.max_output_chars = max_output_chars

    def vocabulary(self) -> list[str]:
        raise NotImplementedError(
            "the python-tool env is written for a pretrained model's own tokenizer "
            "(use --profile pretrained)"
        )

    def reset(self, seed: int) -> str:
        super().reset(seed)
        self.answer = str(self.a * self.b)
        return self.prompt

    @property
    def prompt(self) -> str:
        return PROMPT.format(a=self.a, b=self.b)

    # ------------------------------------------------------------------ the step's parts
    def _parse(self, text: str):
        """``("code", code)``, ``("answer", digits)`` or ``("malformed", None)``."""
        if not isinstance(text, str):
            return "malformed", None
        text = text.strip()
        if NUMBER.fullmatch(text):
            return "answer", text
        call = TOOL_CALL.fullmatch(text)
        if call and FENCE not in call.group(1):
            return "code", call.group(1)
        return "malformed", None

    def _hallucinates(self, text: str) -> bool:
        after = _BLOCK_THEN.search(text) if isinstance(text, str) else None
        return bool(after and after.group(1).strip())

    def _check_answer(self, number: str) -> tuple[bool, bool]:
        return True, same_integer(number, self.a * self.b)

    def _program(self, code: str) -> str:
        return with_print(code)

    def _run_programs(self, programs: list[str]) -> list[sandbox.Result]:
        return run_each(self, programs)  # every call: the same code may print different things

    def _render(self, result: sandbox.Result) -> str:
        if result.ok:
            return cut(result.stdout.strip(), self.max_output_chars)
        return error_name(result)

    def _error_text(self) -> str:
        return ERROR

    # ------------------------------------------------------------------ demonstrations
    def demonstration(
        self,
        seed: int,
        rng: random.Random,
        *,
        tool_fraction: float = 0.5,
        error_rate: float = 0.0,
        retry_rate: float = 0.0,
    ) -> list[tuple[str, bool]]:
        """One cold-start conversation as ``(message content, trainable)`` pairs, in order.

        As :meth:`MultiplyEnv.demonstration` (the same draws from ``rng``): with probability
        ``tool_fraction`` the teacher sends ``print(a*b)`` in a code block, reads the tool's
        message and answers with the product; otherwise it answers directly. ``error_rate``: one
        digit of ``a`` miscopied in the code, the trace consistent with it (a wrong answer).
        ``retry_rate`` (with ``max_tool_calls >= 2``): a first snippet ``print(a*b*)`` gets
        ``SyntaxError``, then the correct one. The tool's messages are not trainable. The
        teacher's program multiplies integers it chose, so its output is computed here, cut as
        the env cuts it (no model-written code runs outside the sandbox).
        """
        self.reset(seed)
        messages = [(self.prompt, False)]
        if rng.random() < tool_fraction:
            a, b = str(self.a), str(self.b)
            if rng.random() < error_rate:
                a = miscopy(a, rng)
            product = str(int(a) * int(b))
            if retry_rate > 0 and self.max_tool_calls >= 2 and rng.random() < retry_rate:
                messages += [(f"```python\nprint({a}*{b}*)\n```", True), ("SyntaxError", False)]
            messages += [
                (f"```python\nprint({a}*{b})\n```", True),
                (cut(product, self.max_output_chars), False),
                (product, True),
            ]
        else:
            messages.append((self.answer, True))
        self._done = True
        return messages
