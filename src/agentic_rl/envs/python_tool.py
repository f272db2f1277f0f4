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

**Structured calls** (``call_format="json"``; the default ``"fence"`` is all of the above). The
calls are Hermes-style JSON (:mod:`agentic_rl.toolcalls`), the tools ``python`` and ``calculator``
(:mod:`agentic_rl.envs.tool_json`), listed in the prompt as Qwen2.5's template lists tools:

* a turn with no ``<tool_call>``/``</tool_call>`` tag is an answer or a format failure, as above
  (a fenced block too is a format failure here);
* otherwise its items, in order: each well-formed call runs (``python`` in the sandbox, as the
  fenced block does; ``calculator`` here) and counts against ``max_tool_calls``; each malformed
  one (truncated, nested, not JSON, an unknown tool, bad arguments, stray text, ...) is not run
  and its one-line message stands in its place. The observation is one ``<tool_response>`` block
  per item, in the turn's order. If the turn's well-formed calls would pass the tool budget, none
  runs: reward ``-1``, the episode ends (the fence format's rule; its malformed calls are still
  counted). Otherwise reward ``0`` and **the episode goes on**, ``info["format_ok"]`` False if any
  call was malformed (the rollout counts the episode as a format failure) and
  ``info["malformed_calls"]`` their kinds. A malformed call thus costs a turn and is counted, but
  is never dropped, nor ends the episode: the model reads why, as production frameworks return a
  parse error as the tool's message, and the reward stays ReTool's outcome reward.

**Counters.** Per episode, attributes as ``hallucinated`` is (the ReTool trainer's ``play``
copies ``calls``, ``tool_errors``, ``answered`` and ``hallucinated`` into the batch): ``calls``
(well-formed calls made), ``tool_calls`` (a Counter of those per tool), ``tool_errors`` (runs that
failed: an error, the deadline, a refusal, the flaky tool), ``malformed_calls`` (a Counter per
error kind, over-budget turns included; JSON format only) and ``limits_hit`` (``timeout``: a run
killed at the deadline; ``output``: output cut by the sandbox or to ``max_output_chars``).
``hallucinated`` in the JSON format: a ``<tool_response>`` written by the model, or text after its
last call.
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from collections.abc import Sequence

from .. import sandbox
from ..toolcalls import parse_tool_calls, render_tool_result
from .multiply import MultiplyEnv, miscopy, run_each
from .tool_json import TOOLS, demo_call, hallucinates, json_prompt, step_json

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
CALL_FORMATS = ("fence", "json")


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
        call_format: ``"fence"`` (one fenced code block) or ``"json"`` (Hermes-style calls of
            ``python`` and ``calculator``; see the module docstring).
    """

    name = "python-tool"
    chat = True  # prompts and turns are chat messages, to be wrapped in the model's template

    def __init__(
        self,
        digits: tuple[int, int] = (3, 2),
        *,
        max_output_chars: int = 32,
        call_format: str = "fence",
        **options,
    ):
        if not isinstance(max_output_chars, int) or max_output_chars < 1:
            raise ValueError(f"max_output_chars must be an int >= 1, got {max_output_chars!r}")
        if call_format not in CALL_FORMATS:
            raise ValueError(f"call_format must be one of {CALL_FORMATS}, got {call_format!r}")
        super().__init__(digits, **options)  # MultiplyEnv's checks and fields
        self.max_output_chars = max_output_chars
        self.call_format = call_format

    def vocabulary(self) -> list[str]:
        raise NotImplementedError(
            "the python-tool env is written for a pretrained model's own tokenizer "
            "(use --profile pretrained)"
        )

    def reset(self, seed: int) -> str:
        super().reset(seed)
        self.answer = str(self.a * self.b)
        self.malformed_calls, self.limits_hit, self._by_tool = Counter(), Counter(), Counter()
        return self.prompt

    @property
    def prompt(self) -> str:
        if self.call_format == "json":
            return json_prompt(self.a, self.b)
        return PROMPT.format(a=self.a, b=self.b)

    @property
    def tool_calls(self) -> Counter:
        """This episode's well-formed calls per tool (a fenced block is a ``python`` call)."""
        if self.call_format == "json":
            return Counter(self._by_tool)
        return Counter({"python": self.calls} if self.calls else {})

    # ------------------------------------------------------------------ the step's parts
    def _parse(self, text: str):
        """``("code", code)``, ``("answer", digits)`` or ``("malformed", None)``; in the JSON
        format, a turn with a tag is ``("calls", ParsedTurn)`` and a fenced block is malformed."""
        if not isinstance(text, str):
            return "malformed", None
        if self.call_format == "json":
            turn = parse_tool_calls(text, TOOLS)
            if turn.has_calls:
                return "calls", turn
        text = text.strip()
        if NUMBER.fullmatch(text):
            return "answer", text
        call = TOOL_CALL.fullmatch(text)
        if call and FENCE not in call.group(1) and self.call_format == "fence":
            return "code", call.group(1)
        return "malformed", None

    def _hallucinates(self, text: str) -> bool:
        if self.call_format == "json":
            return hallucinates(text)
        after = _BLOCK_THEN.search(text) if isinstance(text, str) else None
        return bool(after and after.group(1).strip())

    def _check_answer(self, number: str) -> tuple[bool, bool]:
        return True, same_integer(number, self.a * self.b)

    def _program(self, code: str) -> str:
        return with_print(code)

    def _run_programs(self, programs: list[str]) -> list[sandbox.Result]:
        return run_each(self, programs)  # every call: the same code may print different things

    def _render(self, result: sandbox.Result) -> str:
        long = result.ok and len(result.stdout.strip()) > self.max_output_chars
        for limit, hit in (("timeout", result.timed_out), ("output", result.truncated or long)):
            if hit:  # the sandbox's limits and the env's cut, counted
                self.limits_hit[limit] += 1
        if result.ok:
            return cut(result.stdout.strip(), self.max_output_chars)
        return error_name(result)

    def _error_text(self) -> str:
        return ERROR

    @staticmethod
    def step_batch(envs: Sequence["PythonToolEnv"], texts: Sequence[str]) -> list[tuple]:
        """Step many episodes at once, each in its call format (:meth:`MultiplyEnv.step_batch`
        for fenced blocks, :func:`~agentic_rl.envs.tool_json.step_json` for JSON calls)."""
        results: list[tuple | None] = [None] * len(envs)
        for fmt, step in (("fence", MultiplyEnv.step_batch), ("json", step_json)):
            rows = [k for k, env in enumerate(envs) if env.call_format == fmt]
            if rows:
                done = step([envs[k] for k in rows], [texts[k] for k in rows])
                for k, result in zip(rows, done):
                    results[k] = result
        return results

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

        In the JSON format the same conversation with JSON calls and ``<tool_response>`` blocks:
        the tool is ``python`` for an even ``seed``, ``calculator`` for an odd one (whose retry
        ``a*b*`` gets ``SyntaxError`` as well); the same draws from ``rng``.
        """
        self.reset(seed)
        messages = [(self.prompt, False)]
        if rng.random() < tool_fraction:
            a, b = str(self.a), str(self.b)
            if rng.random() < error_rate:
                a = miscopy(a, rng)
            product = str(int(a) * int(b))
            name = "python" if seed % 2 == 0 else "calculator"

            def call(tail=""):
                if self.call_format == "json":
                    return demo_call(name, a, b, tail)
                return f"```python\nprint({a}*{b}{tail})\n```"

            def answer(output):
                return render_tool_result(name, output) if self.call_format == "json" else output

            if retry_rate > 0 and self.max_tool_calls >= 2 and rng.random() < retry_rate:
                messages += [(call("*"), True), (answer("SyntaxError"), False)]
            messages += [
                (call(), True),
                (answer(cut(product, self.max_output_chars)), False),
                (product, True),
            ]
        else:
            messages.append((self.answer, True))
        self._done = True
        return messages
