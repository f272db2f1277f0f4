"""Structured tool calls: Hermes-style ``<tool_call>`` JSON, parsed strictly, never dropped.

Production agent frameworks (TRL, verl, slime) do not read a fenced code block: the model writes
each tool call as a JSON object between two tags, the format of Hermes and of Qwen2.5's chat
template, and may write several in one turn::

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "347*29"}}
    </tool_call>

The bug class this module exists for is the *silently dropped call*: a parser that skips what it
cannot read leaves a turn that the model believes made a call and the environment believes made
none, and the reward then scores a trajectory that never happened. Here nothing is skipped:
:func:`parse_tool_calls` turns a turn into its items, in order, each either a :class:`ToolCall`
or a :class:`ToolCallError` whose one-line ``message`` is written for the model to read as the
tool's answer, and whose ``kind`` is counted. It never raises.

**What is accepted.** A turn that contains neither tag is not a tool-call turn (no items: the
caller decides, e.g. an answer). Otherwise the turn must be, as a whole, white space and calls::

    turn = ws (call ws)+        call = "<tool_call>" JSON-object "</tool_call>"

(with ``allow_thought=True``, text before the first call is kept as ``thought``, as Qwen's
template allows content before its calls). The tags are matched as text before any JSON is read,
so a JSON string that holds ``</tool_call>`` must write it ``<\\/tool_call>`` (valid JSON). Each
call's JSON is checked strictly: one value and nothing after it, no ``NaN``/``Infinity``, no
duplicate key; an object with exactly the keys ``name`` and ``arguments``; ``name`` one of the
tools; ``arguments`` an object with exactly that tool's argument names, each of its JSON type
(all arguments are required; strings must be valid Unicode). The error kinds (:data:`KINDS`):

* ``too_long``: the turn is longer than ``max_chars`` (nothing in it is read);
* ``too_many``: what follows the first ``max_calls`` items (one error for all of it);
* ``truncated``: a ``<tool_call>`` without its closing tag (a turn cut mid-call);
* ``nested``: a ``<tool_call>`` inside a call (the whole outer call is the error);
* ``stray_text``: non-space text outside the calls, or a ``</tool_call>`` that closes nothing;
* ``not_json``: the body is not one JSON value (empty, cut, trailing text, too deep, ...);
* ``not_an_object``: the body is JSON but not an object;
* ``bad_keys``: the object's keys are not exactly ``name`` and ``arguments``;
* ``unknown_tool``: ``name`` is not a string naming one of the tools;
* ``bad_arguments``: ``arguments`` is not an object, or misses, adds or mistypes an argument.

:func:`tools_system_prompt` writes the tools as Qwen2.5's template does (``<tools>`` JSON
signatures, then the call format); :func:`render_tool_result` and :func:`render_tool_error` write
each item's answer as a Hermes ``<tool_response>`` block.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

OPEN, CLOSE = "<tool_call>", "</tool_call>"
RESPONSE, END_RESPONSE = "<tool_response>", "</tool_response>"
KINDS = (
    "too_long",
    "too_many",
    "truncated",
    "nested",
    "stray_text",
    "not_json",
    "not_an_object",
    "bad_keys",
    "unknown_tool",
    "bad_arguments",
)
#: JSON's name for each argument type a tool may declare.
JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SHAPE = '{"name": ..., "arguments": {...}}'
_JSON_VALUES = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
#: Tools for the parser: tool name -> {argument name: Python type of :data:`JSON_TYPES`}.
Tools = Mapping[str, Mapping[str, type]]


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a tool's name and its checked arguments."""

    name: str
    arguments: dict


@dataclass(frozen=True)
class ToolCallError:
    """A malformed call (or stray text): its ``kind`` (one of :data:`KINDS`), counted, and a
    one-line ``message`` for the model, its observation."""

    kind: str
    message: str


@dataclass(frozen=True)
class ParsedTurn:
    """A turn's items in order: each call or error where it stood. ``has_calls`` is whether the
    turn holds a tag at all (else there are no items: not a tool-call turn)."""

    items: tuple = ()
    thought: str = ""
    has_calls: bool = False
    calls: tuple = field(init=False, repr=False)
    errors: tuple = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "calls", tuple(i for i in self.items if isinstance(i, ToolCall)))
        errors = tuple(i for i in self.items if isinstance(i, ToolCallError))
        object.__setattr__(self, "errors", errors)


def _error(kind: str, detail: str) -> ToolCallError:
    return ToolCallError(kind, f"invalid tool call ({kind}): {detail}")


def _quote(text: str, limit: int = 24) -> str:
    """``text`` as a short one-line JSON string (model text never breaks the message's line)."""
    return json.dumps(text if len(text) <= limit else text[:limit] + "...")


def parse_tool_calls(
    text: str,
    tools: Tools,
    *,
    allow_thought: bool = False,
    max_chars: int = 4096,
    max_calls: int = 16,
) -> ParsedTurn:
    """``text`` as its calls and errors, in order (see the module docstring); never raises."""
    if not isinstance(text, str) or (OPEN not in text and CLOSE not in text):
        return ParsedTurn()
    if len(text) > max_chars:
        too_long = _error("too_long", f"a turn of at most {max_chars} characters")
        return ParsedTurn((too_long,), "", True)
    items, thought, i = [], "", 0
    while i < len(text):
        start = text.find(OPEN, i)
        gap = text[i : start if start >= 0 else len(text)]
        if gap.strip():
            if i == 0 and allow_thought and start >= 0 and CLOSE not in gap:
                thought = gap.strip()
            elif CLOSE in gap:
                items.append(_error("stray_text", f"{CLOSE} without its {OPEN}"))
            else:
                items.append(_error("stray_text", f"text outside the calls: {_quote(gap.strip())}"))
        if start < 0:
            break
        if len(items) >= max_calls:
            items.append(_error("too_many", f"at most {max_calls} calls in a turn"))
            break
        end, depth = _matching_close(text, start)
        if end < 0:
            items.append(_error("truncated", f"{OPEN} without its closing {CLOSE}"))
            break
        if depth > 1:
            items.append(_error("nested", f"a {OPEN} inside a call"))
        else:
            items.append(_check_call(text[start + len(OPEN) : end], tools))
        i = end + len(CLOSE)
    return ParsedTurn(tuple(items), thought, True)


def _matching_close(text: str, start: int) -> tuple[int, int]:
    """Where the call opened at ``start`` closes (``-1``: never) and its deepest nesting."""
    depth = deepest = 0
    i = start
    while True:
        next_open, next_close = text.find(OPEN, i), text.find(CLOSE, i)
        if next_close < 0:
            return -1, deepest
        if 0 <= next_open < next_close:
            depth += 1
            deepest = max(deepest, depth)
            i = next_open + len(OPEN)
        else:
            depth -= 1
            if depth == 0:
                return next_close, deepest
            i = next_close + len(CLOSE)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs):
    value = dict(pairs)
    if len(value) < len(pairs):  # json.loads would keep the last silently
        seen = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {_quote(duplicate)}")
    return value


def _check_call(body: str, tools: Tools) -> ToolCall | ToolCallError:
    """One call's body, checked strictly: its :class:`ToolCall` or its first error."""
    if not body.strip():
        return _error("not_json", "an empty call")
    try:
        value = json.loads(body, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except RecursionError:
        return _error("not_json", "nested too deeply")
    except ValueError as e:  # json.JSONDecodeError is one: "Expecting ',' delimiter: line 1 ..."
        return _error("not_json", str(e).splitlines()[0])
    if not isinstance(value, dict):
        got = _JSON_VALUES.get(type(value), "a number")
        return _error("not_an_object", f"a call is {_SHAPE}, not {got}")
    if set(value) != {"name", "arguments"}:
        keys = ", ".join(_quote(k) for k in value)
        return _error("bad_keys", f'the keys must be "name" and "arguments", not {keys or "none"}')
    name, arguments = value["name"], value["arguments"]
    if not isinstance(name, str) or name not in tools:
        known = ", ".join(_quote(t) for t in tools)
        return _error("unknown_tool", f"no tool {_quote(str(name))}; the tools are {known}")
    problem = _argument_problem(arguments, tools[name])
    if problem:
        return _error("bad_arguments", f"{name}: {problem}")
    return ToolCall(name, arguments)


def _argument_problem(arguments, signature: Mapping[str, type]) -> str:
    """What is wrong with a call's arguments for ``signature`` (``""``: nothing)."""
    if not isinstance(arguments, dict):
        return "the arguments must be a JSON object"
    problems = [f"missing {_quote(a)}" for a in signature if a not in arguments]
    problems += [f"unexpected {_quote(a)}" for a in arguments if a not in signature]
    for a, want in signature.items():
        if a in arguments and not _has_type(arguments[a], want):
            problems.append(f"{_quote(a)} must be a {JSON_TYPES[want]}")
    return "; ".join(problems)


def _has_type(value, want: type) -> bool:
    if isinstance(value, bool) or want is bool:  # JSON's true is no number, nor 1 a boolean
        return isinstance(value, bool) and want is bool
    if want is str:
        try:
            value.encode("utf-8")  # a lone surrogate ("\\ud800") is valid JSON, not text
        except (AttributeError, UnicodeEncodeError):
            return False
        return True
    return isinstance(value, int) if want is int else isinstance(value, (int, float))


# --------------------------------------------------------------------------- rendering


def tool_schema(name: str, signature: Mapping[str, type], descriptions: Mapping[str, str]):
    """One tool as an OpenAI/Qwen function signature; ``descriptions[name]`` describes the tool,
    ``descriptions[f"{name}.{argument}"]`` an argument (either may be missing)."""
    properties = {}
    for a, kind in signature.items():
        properties[a] = {"type": JSON_TYPES[kind]}
        if f"{name}.{a}" in descriptions:
            properties[a]["description"] = descriptions[f"{name}.{a}"]
    parameters = {"type": "object", "properties": properties, "required": list(signature)}
    function = {"name": name, "description": descriptions.get(name, ""), "parameters": parameters}
    return {"type": "function", "function": function}


def tools_system_prompt(tools: Tools, descriptions: Mapping[str, str] | None = None) -> str:
    """The tools block of Qwen2.5's chat template (its Hermes format): each tool's signature as
    one JSON line inside ``<tools>``, then how to write a call."""
    lines = [json.dumps(tool_schema(n, s, descriptions or {})) for n, s in tools.items()]
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + "\n".join(lines)
        + "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def render_tool_call(name: str, arguments: dict) -> str:
    """A call as the model writes it (the demonstrations' format)."""
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def _response(body: str) -> str:
    # "<\/" is JSON's "</": a tool's output cannot close its own block
    body = body.replace(END_RESPONSE, "<\\/" + END_RESPONSE[2:])
    return f"{RESPONSE}\n{body}\n{END_RESPONSE}"


def render_tool_result(name: str, output: str) -> str:
    """One call's answer, Hermes' way: ``<tool_response>`` around ``{"name", "content"}``."""
    return _response(json.dumps({"name": name, "content": output}))


def render_tool_error(error: ToolCallError) -> str:
    """A malformed call's answer, where the tool's would be: its message as plain text (one
    line; as JSON its quotes would be escaped once more)."""
    return _response(error.message)
