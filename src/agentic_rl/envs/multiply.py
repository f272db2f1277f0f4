"""Multiplication with a Python interpreter as the tool: the ReTool chapter's environment.

A problem is ``a * b`` with a 3-digit ``a`` and a 2-digit ``b`` (``digits``), written one digit per
token, most significant first::

    3 4 7 * 2 9 =

A 126k-parameter model cannot multiply these in its head; it can copy digits. So it can solve the
task by *writing code*, and the environment is the interpreter of ReTool (Feng et al., 2025): the
policy writes text; when it closes a code block with ``</code>`` the rollout pauses, the snippet
runs in the sandbox (:mod:`agentic_rl.sandbox`, in another process), and its output comes back as
one observation that the rollout appends to the context before generation continues::

    3 4 7 * 2 9 =  <code> 3 4 7 * 2 9 </code>  <interpreter> 1 0 0 6 3 </interpreter>
    '-- prompt --'  '------- policy -------'   '-------- interpreter: loss 0 -------'
    <answer> 1 0 0 6 3 </answer> <eos>
    '---------- policy ---------------'

**From tokens to a program.** The tiny model's tokenizer is word-level, so the code block's text
is ``3 4 7 * 2 9``; the tool joins the words (``347*29``) and, as the verl ReTool recipe does,
wraps a final expression in ``print(...)``. Whatever the policy writes inside the block is run:
``3 4 7 * * 2 9`` is ``347**29`` (a 74-digit number: the output is cut to ``max_output_tokens``
tokens and ends with ``...``), ``9 9 * * 9 9 * * 9 9`` would run until the sandbox's deadline
(``TimeoutError``), ``1 2 *`` is a ``SyntaxError``. A failed snippet is a *tool error*: its error
name is the observation, the episode goes on, and the policy may try again.

**One episode** (``max_turns = max_tool_calls + 1`` policy segments). Each ``step`` gets one segment
of policy text, ended by the stop word ``</code>`` (kept: the rollout runs with
``keep_stop_word=True``), by EOS, or by the segment's token limit:

* a segment that ends with ``</code>``: a tool call. The words after the last ``<code>`` run in the
  sandbox; the observation is ``<interpreter> ... </interpreter>``. A call beyond
  ``max_tool_calls`` is not run: the episode ends with reward ``-1`` (the tool budget).
* otherwise, a segment holding ``<answer> d ... d </answer>``: the final answer. Reward ``+1`` if
  its digits are the product, else ``-1`` (ReTool's outcome reward; no reward for running code).
* anything else (no answer, unclosed tags, non-digits in the answer): a format failure, reward
  ``-1``, the episode ends.

``tool_enabled=False`` switches the interpreter off (the chapter's test of *hallucinated*
interpreter output): a tool call then gets an empty observation, and the policy continues on its
own. Whether it then writes the interpreter's part itself is recorded (``hallucinated``): a segment
that contains ``<interpreter>``, or that follows a tool call and starts with a word only the
interpreter writes (a digit, an error name, ``...``, the tags).
``tool_error_rate`` makes the tool fail at random (``<interpreter> Error </interpreter>``, without
running the code): the GRPO-RoC demonstration.

Many episodes step at once: :meth:`MultiplyEnv.step_batch` (called by the multi-turn rollout)
sends all of a turn's snippets to the sandbox pool together, so they run concurrently.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Sequence

from .. import sandbox

DIGITS = [str(d) for d in range(10)]
CODE, END_CODE = "<code>", "</code>"
INTERP, END_INTERP = "<interpreter>", "</interpreter>"
ANSWER, END_ANSWER = "<answer>", "</answer>"
TRUNCATED = "..."
#: Error names the interpreter can show (others are shown as ``Error``).
ERRORS = [
    "SyntaxError",
    "NameError",
    "TypeError",
    "ValueError",
    "ZeroDivisionError",
    "OverflowError",
    "MemoryError",
    "TimeoutError",
    "Error",
]
#: Words that only the interpreter writes: a segment of policy text that follows a tool call and
#: starts with one of them is hallucinated interpreter output.
INTERPRETER_WORDS = frozenset([INTERP, END_INTERP, TRUNCATED, *DIGITS, *ERRORS])
#: What a code block may contain (the tokenizer's words for code).
CODE_WORDS = DIGITS + ["*", "+", "-", "(", ")"]


def to_source(code_text: str) -> str:
    """The program a code block's words spell: words joined, a final expression printed.

    ``"3 4 7 * 2 9"`` -> ``"print(347*29)"``. Text that does not parse is returned joined and
    unwrapped, so that the interpreter itself reports the ``SyntaxError``.
    """
    source = "".join(code_text.split())
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        return f"print({source})"
    return source


def render_output(result: sandbox.Result, max_output_tokens: int) -> str:
    """A sandbox result as the observation the policy reads (one token per character of output).

    Success: stdout's characters (digits and ``-``; anything else as ``?``), cut to
    ``max_output_tokens`` tokens plus ``...`` when longer. Failure: the error's name.
    """
    if result.ok:
        words = [c if c in DIGITS or c == "-" else "?" for c in result.stdout.strip()]
        words = [w for w in words if not w.isspace()]
        if len(words) > max_output_tokens:
            words = words[:max_output_tokens] + [TRUNCATED]
    elif result.timed_out:
        words = ["TimeoutError"]
    else:
        name = (result.error or "Error").split(":")[0].strip()
        words = [name if name in ERRORS else "Error"]
    return " ".join([INTERP, *words, END_INTERP])


def _digits(n: int) -> str:
    return " ".join(str(n))


def miscopy(number: str, rng: random.Random) -> str:
    """``number`` (a string of digits) with one digit replaced by another (a leading digit never by
    ``0``): the teacher's copying error in demonstrations."""
    k = rng.randrange(len(number))
    return (
        number[:k]
        + rng.choice([d for d in DIGITS if d != number[k] and (k or d != "0")])
        + number[k + 1 :]
    )


class MultiplyEnv:
    """``a * b`` with a sandboxed Python interpreter as the tool (see the module docstring).

    Args:
        digits: digits of ``a`` and of ``b``.
        max_tool_calls: the tool budget per episode.
        tool_enabled: run the tool (``False``: a tool call gets an empty observation).
        tool_error_rate: probability that a call fails without running (a flaky tool).
        max_output_tokens: interpreter output longer than this is cut and marked ``...``.
        timeout_s, memory_mb: the sandbox's limits per snippet.
        pool: a :class:`~agentic_rl.sandbox.Pool` to run snippets in (``None``: one fresh
            sandbox process per snippet, slower).
    """

    name = "multiply"

    def __init__(
        self,
        digits: tuple[int, int] = (3, 2),
        *,
        max_tool_calls: int = 2,
        tool_enabled: bool = True,
        tool_error_rate: float = 0.0,
        max_output_tokens: int = 8,
        timeout_s: float = 1.0,
        memory_mb: int = 256,
        pool: sandbox.Pool | None = None,
    ):
        if len(digits) != 2 or not all(1 <= d <= 6 for d in digits):
            raise ValueError(f"digits must be two numbers between 1 and 6, got {digits!r}")
        if max_tool_calls < 0:
            raise ValueError(f"max_tool_calls must be >= 0, got {max_tool_calls}")
        if not 0.0 <= tool_error_rate <= 1.0:
            raise ValueError(f"tool_error_rate must be in [0, 1], got {tool_error_rate}")
        if max_output_tokens < 1:
            raise ValueError(f"max_output_tokens must be >= 1, got {max_output_tokens}")
        self.digits = tuple(digits)
        self.max_tool_calls = max_tool_calls
        self.max_turns = max_tool_calls + 1
        self.tool_enabled = tool_enabled
        self.tool_error_rate = tool_error_rate
        self.max_output_tokens = max_output_tokens
        self.timeout_s, self.memory_mb = timeout_s, memory_mb
        self.pool = pool
        self._done = True

    def vocabulary(self) -> list[str]:
        tags = [CODE, END_CODE, INTERP, END_INTERP, ANSWER, END_ANSWER]
        return CODE_WORDS + ["=", "?", TRUNCATED] + tags + ERRORS

    # ------------------------------------------------------------------ episodes
    def reset(self, seed: int) -> str:
        rng = random.Random(seed)
        da, db = self.digits
        self.a = rng.randint(10 ** (da - 1), 10**da - 1)
        self.b = rng.randint(10 ** (db - 1), 10**db - 1)
        self._rng = rng  # the flaky tool's draws
        self.answer = _digits(self.a * self.b)
        self.turns = self.calls = self.tool_errors = 0
        self.hallucinated = self.answered = self.success = False
        self._done = False
        return self.prompt

    @property
    def prompt(self) -> str:
        return f"{_digits(self.a)} * {_digits(self.b)} ="

    def _parse(self, text: str):
        """``("code", words)``, ``("answer", words)`` or ``("malformed", None)``."""
        if not isinstance(text, str):
            return "malformed", None
        words = text.split()
        if ANSWER in words:
            start = words.index(ANSWER) + 1
            if END_ANSWER in words[start:]:
                return "answer", words[start : words.index(END_ANSWER, start)]
        if words and words[-1] == END_CODE and CODE in words:
            start = len(words) - 1 - words[::-1].index(CODE)
            return "code", words[start + 1 : -1]
        return "malformed", None

    def _end(self, reward: float, *, success=False, format_ok=True, answered=False):
        self._done = True
        self.success, self.answered = success, answered
        info = dict(terminated=True, truncated=False, success=success, format_ok=format_ok)
        return "", reward, True, info

    def _hallucinates(self, text: str) -> bool:
        """Whether the policy writes the interpreter's part itself (the tag, or output right after
        a call): remembered, then the segment is parsed as usual."""
        words = text.split() if isinstance(text, str) else []
        return INTERP in words or bool(self.calls and words and words[0] in INTERPRETER_WORDS)

    def _before_step(self, text: str):
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        self.turns += 1
        if self._hallucinates(text):
            self.hallucinated = True
        return self._parse(text)

    # The parts of a step that a variant of the task (another format, another tool) replaces.
    def _check_answer(self, words) -> tuple[bool, bool]:
        """``(format_ok, right)`` for a parsed answer."""
        ok = bool(words) and all(w in DIGITS for w in words)
        return ok, ok and " ".join(words) == self.answer

    def _program(self, words) -> str:
        """The program a parsed tool call runs."""
        return to_source(" ".join(words))

    def _run_programs(self, programs: list[str]) -> list[sandbox.Result]:
        """Run one turn's programs (of all the episodes stepped together) in the sandbox."""
        return _run_all(self, programs)

    def _render(self, result: sandbox.Result) -> str:
        """The observation of a tool call that ran."""
        return render_output(result, self.max_output_tokens)

    def _error_text(self) -> str:
        """The observation of a call that the flaky tool failed without running it."""
        return f"{INTERP} Error {END_INTERP}"

    def _after_tool(self, observation: str):
        """The observation of a tool call; the turn limit truncates the episode here."""
        info = dict(terminated=False, truncated=False, success=False, format_ok=True)
        if self.turns >= self.max_turns:
            self._done = True
            info["truncated"] = True
            return observation, -1.0, True, info
        return observation, 0.0, False, info

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        """One segment of policy text (see the module docstring); never raises on bad text."""
        return self.step_batch([self], [action_text])[0]

    @staticmethod
    def step_batch(envs: Sequence["MultiplyEnv"], texts: Sequence[str]) -> list[tuple]:
        """Step many episodes at once; their snippets run together in the sandbox pool."""
        parsed = [env._before_step(text) for env, text in zip(envs, texts)]
        to_run = []  # (env index, program)
        results: list[tuple | None] = [None] * len(envs)
        for i, (env, (kind, payload)) in enumerate(zip(envs, parsed)):
            if kind == "answer":
                ok, right = env._check_answer(payload)
                results[i] = env._end(
                    1.0 if right else -1.0, success=right, format_ok=ok, answered=True
                )
            elif kind == "malformed":
                results[i] = env._end(-1.0, format_ok=False)
            elif env.calls >= env.max_tool_calls:
                results[i] = env._end(-1.0)  # over the tool budget: not run
            else:
                env.calls += 1
                if not env.tool_enabled:
                    results[i] = env._after_tool("")  # the interpreter never answers
                elif env._rng.random() < env.tool_error_rate:
                    env.tool_errors += 1
                    results[i] = env._after_tool(env._error_text())
                else:
                    to_run.append((i, env._program(payload)))
        if to_run:
            outputs = envs[to_run[0][0]]._run_programs([source for _, source in to_run])
            for (i, _), result in zip(to_run, outputs):
                env = envs[i]
                env.tool_errors += int(not result.ok)
                results[i] = env._after_tool(env._render(result))
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
        """One cold-start trace as ``(text, trainable)`` segments (a synthetic D_CI).

        With probability ``tool_fraction`` the teacher writes the code, reads the interpreter and
        copies its output into the answer; otherwise it answers directly, with the true product
        (which a tiny model cannot learn to compute: direct answers stay mostly wrong). With
        probability ``error_rate`` a tool trace's code has one operand digit miscopied, and the
        trace stays consistent with it (a wrong answer). With probability ``retry_rate`` (and a
        tool budget of at least 2) a tool trace's first snippet ends with a stray ``*``; the
        interpreter answers ``SyntaxError`` and the teacher writes the code again, correctly: a
        correct trace with a tool error in it. The interpreter segments are not trainable,
        as in RL. The teacher's own program is ``a*b`` of integers it chose, so its output is
        computed here (no model-written code runs outside the sandbox).
        """
        self.reset(seed)
        segments = [(self.prompt, False)]
        if rng.random() < tool_fraction:
            a, b = str(self.a), str(self.b)
            if rng.random() < error_rate:
                a = miscopy(a, rng)
            printed = _digits(int(a) * int(b))
            code = f"{CODE} {_digits(int(a))} * {_digits(int(b))}"
            if retry_rate > 0 and self.max_tool_calls >= 2 and rng.random() < retry_rate:
                segments += [
                    (f"{code} * {END_CODE}", True),
                    (f"{INTERP} SyntaxError {END_INTERP}", False),
                ]
            segments += [
                (f"{code} {END_CODE}", True),
                (f"{INTERP} {printed} {END_INTERP}", False),
                (f"{ANSWER} {printed} {END_ANSWER}", True),
            ]
        else:
            segments.append((f"{ANSWER} {self.answer} {END_ANSWER}", True))
        self._done = True
        return segments


def run_each(env: MultiplyEnv, programs: list[str]) -> list[sandbox.Result]:
    """Run every program (concurrently, in the env's pool; else one fresh sandbox each)."""
    if env.pool is not None:
        return env.pool.map(programs)
    limits = {"timeout_s": env.timeout_s, "memory_mb": env.memory_mb}
    return [sandbox.run(p, **limits) for p in programs]


def _run_all(env: MultiplyEnv, programs: list[str]) -> list[sandbox.Result]:
    """Run each *distinct* program once (concurrently, in the pool) and share its result.

    Safe here because the tool's language, the vocabulary's words, cannot express randomness, time
    or input: the same program always prints the same thing. A group of episodes on one problem
    mostly writes the same code, so this saves most of the calls. (With a general-purpose
    interpreter, run every call.)
    """
    distinct = list(dict.fromkeys(programs))
    by_program = dict(zip(distinct, run_each(env, distinct)))
    return [by_program[p] for p in programs]
