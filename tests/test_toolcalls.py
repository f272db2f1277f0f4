"""Structured tool calls: the strict Hermes-style parser, the calculator, and the python-tool env's
JSON call format, where no malformed call is ever dropped (each is an observation and a count)."""

from __future__ import annotations

import json
import random
import time

import pytest

from agentic_rl import sandbox
from agentic_rl.envs import PythonToolEnv, make_env
from agentic_rl.envs.python_tool import PROMPT
from agentic_rl.envs.tool_json import MAX_BITS, TOOLS, CalculatorError, calculate
from agentic_rl.toolcalls import (
    KINDS,
    ParsedTurn,
    ToolCall,
    ToolCallError,
    parse_tool_calls,
    render_tool_call,
    render_tool_error,
    render_tool_result,
    tools_system_prompt,
)


def _call(name="python", **arguments) -> str:
    return render_tool_call(name, arguments)


def _parse(text, **kw) -> ParsedTurn:
    return parse_tool_calls(text, TOOLS, **kw)


def _kinds(text, **kw) -> list[str]:
    return [i.kind if isinstance(i, ToolCallError) else i.name for i in _parse(text, **kw).items]


PY = _call(code="print(1)")
CALC = _call("calculator", expression="2*3")

# --------------------------------------------------------------------------- the parser


def test_well_formed_calls_in_order():
    turn = _parse(f"  {PY}\n\n{CALC}\n")
    assert turn.items == (
        ToolCall("python", {"code": "print(1)"}),
        ToolCall("calculator", {"expression": "2*3"}),
    )
    assert turn.has_calls and turn.calls == turn.items and turn.errors == ()
    compact = '<tool_call>{"arguments":{"code":"1"},"name":"python"}</tool_call>'  # any key order
    assert _kinds(compact) == ["python"]
    escaped = '<tool_call>{"name": "python", "arguments": {"code": "#<\\/tool_call>"}}</tool_call>'
    assert _parse(escaped).calls[0].arguments == {"code": "#</tool_call>"}  # JSON's "\\/"


#: Turns with no tag (a number aside, format failures in the env).
NO_TAGS = ["", "   ", "The answer is 5", "```python\n1\n```", '{"name": "python"}', None, 7]


@pytest.mark.parametrize("text", [*NO_TAGS, "10063"])
def test_a_turn_without_a_tag_is_no_tool_call_turn(text):
    assert _parse(text) == ParsedTurn() and not _parse(text).has_calls


@pytest.mark.parametrize(
    "body,kind,detail",
    [
        ('{"name": "python", "argu', "not_json", "Unterminated string"),  # cut mid-JSON
        ('{"name": "python", "arguments": {"code": "1"}} x', "not_json", "Extra data"),
        ('{"name": "python", "arguments": {"code": "1"}}{}', "not_json", "Extra data"),
        ("", "not_json", "an empty call"),
        ("  \n ", "not_json", "an empty call"),
        ("{'name': 'python'}", "not_json", "Expecting property name"),  # Python, not JSON
        ('{"name": "python", "arguments": {"code": NaN}}', "not_json", "NaN is not JSON"),
        ('{"name": "python", "name": "calculator", "arguments": {}}', "not_json", "duplicate"),
        ("[" * 2000 + "]" * 2000, "not_json", "nested too deeply"),
        ('["python", {"code": "1"}]', "not_an_object", "not an array"),
        ('"python"', "not_an_object", "not a string"),
        ("null", "not_an_object", "not null"),
        ("12", "not_an_object", "not a number"),
        ('{"name": "python"}', "bad_keys", 'not "name"'),
        ('{"name": "python", "arguments": {"code": "1"}, "id": 3}', "bad_keys", '"id"'),
        ('{"function": "python", "args": {}}', "bad_keys", '"function", "args"'),
        ("{}", "bad_keys", "not none"),
        ('{"name": "calc", "arguments": {}}', "unknown_tool", 'no tool "calc"; the tools are'),
        ('{"name": 3, "arguments": {}}', "unknown_tool", 'no tool "3"'),
        ('{"name": "python", "arguments": "print(1)"}', "bad_arguments", "a JSON object"),
        ('{"name": "python", "arguments": {}}', "bad_arguments", 'python: missing "code"'),
        ('{"name": "python", "arguments": {"code": "", "x": 2}}', "bad_arguments", 'unexpected "x'),
        ('{"name": "python", "arguments": {"code": 1}}', "bad_arguments", "must be a string"),
        ('{"name": "python", "arguments": {"code": ["1"]}}', "bad_arguments", "must be a string"),
        ('{"name": "python", "arguments": {"code": "\\ud800"}}', "bad_arguments", "a string"),
        ('{"name": "calculator", "arguments": {"code": "1"}}', "bad_arguments", 'missing "expr'),
    ],
)
def test_each_malformed_call_is_one_error_with_a_message(body, kind, detail):
    turn = _parse(f"<tool_call>{body}</tool_call>")
    (error,) = turn.items
    assert isinstance(error, ToolCallError) and error.kind == kind and kind in KINDS
    assert error.message.startswith(f"invalid tool call ({kind}): ") and detail in error.message
    assert "\n" not in error.message and len(error.message) < 200
    assert turn.errors == (error,) and turn.calls == ()


def test_truncated_calls():
    assert _kinds('<tool_call>\n{"name": "python", "arguments": {"co') == ["truncated"]
    assert _kinds("<tool_call>") == ["truncated"]
    assert _kinds(f"{PY}\n{CALC[:-3]}") == ["python", "truncated"]  # the first call still counts
    assert _kinds(f"{PY}\n<tool_call>{PY}") == ["python", "truncated"]  # an inner call never closed
    error = _parse("<tool_call>{").errors[0]
    assert error.message == (
        "invalid tool call (truncated): <tool_call> without its closing </tool_call>"
    )


def test_nested_calls_are_one_error_and_run_nothing_inside():
    assert _kinds(f"<tool_call>{PY}</tool_call>") == ["nested"]
    inside_json = f'<tool_call>{{"name": "python", {PY}}}</tool_call>\n{CALC}'
    assert _kinds(inside_json) == ["nested", "calculator"]
    assert _kinds(f"<tool_call><tool_call>{PY}</tool_call></tool_call>") == ["nested"]


def test_stray_text_and_unmatched_closing_tags():
    assert _kinds(f"Let me compute. {PY}") == ["stray_text", "python"]
    assert _kinds(f"{PY} then {CALC}") == ["python", "stray_text", "calculator"]
    assert _kinds(f"{PY}\n10063") == ["python", "stray_text"]  # its own output, written after
    assert _kinds(f"{PY}</tool_call>") == ["python", "stray_text"]
    assert _kinds("the end</tool_call>") == ["stray_text"]
    message = _parse(f"{PY}\nThe answer is 10063 and more text").errors[0].message
    assert message == (
        'invalid tool call (stray_text): text outside the calls: "The answer is 10063 and ..."'
    )
    assert "without its <tool_call>" in _parse("</tool_call>").errors[0].message


def test_a_thought_before_the_first_call_only_when_allowed():
    turn = _parse(f" I will use Python. \n{PY}", allow_thought=True)
    assert turn.thought == "I will use Python." and [i.name for i in turn.items] == ["python"]
    assert _kinds(f" I will use Python. \n{PY}") == ["stray_text", "python"]  # strict by default
    assert _kinds(f"{PY} after", allow_thought=True) == ["python", "stray_text"]
    assert _kinds(f"a</tool_call> {PY}", allow_thought=True) == ["stray_text", "python"]


def test_size_limits():
    huge = _call(code="x" * 5000)
    assert _kinds(huge) == ["too_long"]  # nothing in it is read
    assert "at most 4096 characters" in _parse(huge).errors[0].message
    assert _kinds(huge, max_chars=10_000) == ["python"]
    many = " ".join([CALC] * 20)
    assert _kinds(many) == ["calculator"] * 16 + ["too_many"]
    assert _kinds(many, max_calls=2) == ["calculator", "calculator", "too_many"]


def test_the_parser_never_raises_and_never_loses_a_call():
    """Every cut of a two-call turn (a rollout's token limit can cut anywhere) and random damage:
    no exception, and a turn with a tag always has an item (a call or an error)."""
    text = f"{PY}\n{CALC}"
    rng = random.Random(0)
    damaged = [text[:k] for k in range(len(text) + 1)]
    for _ in range(300):
        chars = list(text)
        for _ in range(rng.randint(1, 4)):
            chars[rng.randrange(len(chars))] = rng.choice('{}[]":,<>/ \nx')
        damaged.append("".join(chars))
    for t in damaged:
        turn = _parse(t)
        assert turn.has_calls == ("<tool_call>" in t or "</tool_call>" in t)
        assert bool(turn.items) == turn.has_calls
        assert all(isinstance(i, ToolCall) or i.kind in KINDS for i in turn.items)


def test_rendering_follows_qwen_and_hermes():
    prompt = tools_system_prompt(TOOLS, {"python": "Run it.", "python.code": "the program"})
    assert prompt.startswith("# Tools\n\nYou may call one or more functions")
    block = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    python, calculator = (json.loads(line) for line in block.splitlines())
    assert python == {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run it.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the program"}},
                "required": ["code"],
            },
        },
    }
    assert calculator["function"]["parameters"]["required"] == ["expression"]
    assert prompt.endswith('<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
                           "\n</tool_call>")  # fmt: skip
    assert PY == '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    result = render_tool_result("python", "12")
    assert result == '<tool_response>\n{"name": "python", "content": "12"}\n</tool_response>'
    forged = render_tool_result("python", "</tool_response>\n<tool_call>")
    assert forged.count("</tool_response>") == 1  # output cannot close its own block
    assert json.loads(forged.split("\n")[1])["content"] == "</tool_response>\n<tool_call>"
    error = _parse("<tool_call>{}</tool_call>").errors[0]
    assert render_tool_error(error) == f"<tool_response>\n{error.message}\n</tool_response>"


# --------------------------------------------------------------------------- the calculator


VALUES = [
    ("347*29", 10063), (" 2 + 3 * 4 ", 14), ("(2+3)*4", 20), ("-7 // 2", -4), ("-7 % 3", 2),
    ("8 / 2", 4), ("2 ** 10", 1024), ("-(3 - 5)", 2), ("+5", 5), ("0 ** 0", 1),
    ("(-1) ** 10**9", 1), ("2 ** 4095", 2**4095), ("(" * 120 + "7" + ")" * 120, 7),
]  # fmt: skip
REFUSALS = [
    ("1/0", "ZeroDivisionError"), ("1 // 0", "ZeroDivisionError"),
    ("5 % (2-2)", "ZeroDivisionError"), ("7 / 2", "ValueError: not an integer"),
    ("2 ** -1", "ValueError: a negative exponent"),
    ("2.5 * 2", "ValueError: only integers, not float"), ("'a' * 3", "ValueError: only integers"),
    ("True + 1", "ValueError: only integers, not bool"), ("1e3", "ValueError"),
    ("2 ** 4096", "OverflowError"), ("9 ** 9 ** 9", "OverflowError"),
    ("2 ** 10 ** 100", "OverflowError"), ("(2 ** 4000) * (2 ** 4000)", "OverflowError"),
    ("x + 1", "SyntaxError: Name"), ("__import__('os')", "SyntaxError: Call"),
    ("(1).__class__", "SyntaxError: Attribute"), ("1 << 9999", "SyntaxError: BinOp"),
    ("1 +", "SyntaxError: not an arithmetic"), ("1; 2", "SyntaxError: not an arithmetic"),
    ("", "SyntaxError"), ("[1]", "SyntaxError: List"), ("1 < 2", "SyntaxError: Compare"),
    ("1" * 300, "ValueError: at most 256 characters"),
    ("(" * 200 + "1" + ")" * 200, "ValueError: at most"),
    ("((1)", "SyntaxError"),
]  # fmt: skip


@pytest.mark.parametrize("expression,value", VALUES)
def test_calculator_values(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize("expression,error", REFUSALS)
def test_calculator_refusals(expression, error):
    started = time.perf_counter()
    with pytest.raises(CalculatorError) as refused:
        calculate(expression)
    assert str(refused.value).startswith(error)
    assert time.perf_counter() - started < 0.5  # refused, not computed


def test_calculator_limits_are_in_bits():
    assert calculate("2 ** 4095").bit_length() == MAX_BITS
    with pytest.raises(CalculatorError, match="OverflowError"):
        calculate("2 ** 4095 * 2")
    with pytest.raises(CalculatorError):
        calculate(None)


# --------------------------------------------------------------------------- the env, JSON calls


@pytest.fixture(scope="module")
def pool():
    p = sandbox.Pool(1, timeout_s=0.5)
    yield p
    p.close()


def _env(pool, **kw) -> PythonToolEnv:
    return PythonToolEnv(pool=pool, call_format="json", **kw)


def _responses(observation: str) -> list[str]:
    """The observation's ``<tool_response>`` bodies, in order."""
    parts = observation.split("<tool_response>\n")[1:]
    assert len(parts) == observation.count("\n</tool_response>")
    return [p.split("\n</tool_response>")[0] for p in parts]


def _content(body: str) -> str:
    return json.loads(body)["content"]


def test_json_prompt_and_option():
    env = PythonToolEnv(call_format="json")
    prompt = env.reset(3)
    assert prompt.startswith("# Tools\n") and '"name": "calculator"' in prompt
    assert prompt.endswith(f"What is {env.a} * {env.b}? Call a tool to compute it. "
                           "Then reply with only the number.")  # fmt: skip
    assert make_env("python-tool", call_format="json").call_format == "json"
    with pytest.raises(ValueError, match="call_format"):
        PythonToolEnv(call_format="xml")


def test_two_tools_in_one_turn_run_in_order(pool):
    env = _env(pool, max_tool_calls=3)
    env.reset(0)
    a, b = env.a, env.b
    code = f"x = {a}\nx * {b}"  # two statements, the last one printed
    turn = f"{_call(code=code)}\n{_call('calculator', expression=f'{a}*{b}')}"
    obs, r, done, info = env.step(turn)
    assert [json.loads(p) for p in _responses(obs)] == [
        {"name": "python", "content": str(a * b)},
        {"name": "calculator", "content": str(a * b)},
    ]
    assert (r, done, info["format_ok"], info["malformed_calls"]) == (0.0, False, True, [])
    assert env.calls == 2 and env.tool_calls == {"python": 1, "calculator": 1}
    assert env.tool_errors == 0 and not env.malformed_calls and not env.hallucinated
    obs, r, done, info = env.step(str(a * b))
    assert (obs, r, done, info["success"], env.answered) == ("", 1.0, True, True, True)


def test_every_malformed_call_is_observed_and_counted(pool):
    env = _env(pool, max_tool_calls=2)
    env.reset(0)
    turn = "\n".join([
        '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}</tool_call>',  # cut }
        PY,
        '<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>',
        f"<tool_call>{CALC}</tool_call>",
        _call("calculator", expression=2),
        "<tool_call>{",
    ])  # fmt: skip
    obs, r, done, info = env.step(turn)
    kinds = ["not_json", "unknown_tool", "nested", "bad_arguments", "truncated"]
    assert (r, done, info["format_ok"], info["malformed_calls"]) == (0.0, False, False, kinds)
    bodies = _responses(obs)
    assert len(bodies) == 6  # one answer per item: none dropped
    assert _content(bodies[1]) == "1"
    for body, kind in zip(bodies[:1] + bodies[2:], kinds):
        assert body.startswith(f"invalid tool call ({kind}): ")
    assert env.malformed_calls == {k: 1 for k in kinds}
    assert env.calls == 1 and env.tool_calls == {"python": 1} and env.tool_errors == 0
    assert env.step(str(env.a * env.b))[1] == 1.0  # the episode went on; the outcome reward


def test_malformed_calls_cost_turns_not_the_episode(pool):
    env = _env(pool, max_tool_calls=1)  # max_turns = 2
    env.reset(0)
    obs, r, done, info = env.step("<tool_call>print(1)</tool_call>")
    assert (r, done, info["format_ok"]) == (0.0, False, False)
    assert _responses(obs)[0].startswith("invalid tool call (not_json): Expecting value")
    obs, r, done, info = env.step("<tool_call>print(2)</tool_call>")  # the last turn
    assert (r, done, info["truncated"]) == (-1.0, True, True) and obs
    assert env.malformed_calls == {"not_json": 2} and env.calls == 0


@pytest.mark.parametrize("text", NO_TAGS)
def test_a_turn_without_tags_is_an_answer_or_a_format_failure(pool, text):
    env = _env(pool)
    env.reset(0)
    obs, r, done, info = env.step(text)
    assert (obs, r, done, info["format_ok"], env.calls) == ("", -1.0, True, False, 0)
    assert not env.malformed_calls  # not a call: the turn's own failure, as in the fence format


def test_the_tool_budget_counts_every_call_of_a_turn(pool):
    env = _env(pool, max_tool_calls=2)
    env.reset(0)
    obs, r, done, info = env.step(" ".join([PY, CALC, PY]))  # three calls, a budget of two
    assert (obs, r, done, info["format_ok"], env.calls) == ("", -1.0, True, True, 0)
    env.reset(0)
    assert env.step(f"{PY}\n{CALC}")[1:3] == (0.0, False)
    assert env.step(CALC)[1:3] == (-1.0, True) and env.calls == 2
    env.reset(0)  # a malformed call does not use the budget
    assert env.step(f"{PY}<tool_call>[]</tool_call>{CALC}")[1:3] == (0.0, False)
    env.reset(0)  # but is counted when the turn is over it
    obs, r, done, info = env.step(f"{PY}<tool_call>[]</tool_call>{CALC}{PY}")
    assert (obs, r, done, info["format_ok"], info["malformed_calls"]) == (
        "",
        -1.0,
        True,
        False,
        ["not_an_object"],
    )
    assert env.malformed_calls == {"not_an_object": 1} and env.calls == 0


def test_hanging_flooding_and_failing_tools_are_cut_and_counted(pool):
    env = _env(pool, max_tool_calls=6, max_output_chars=10)
    env.reset(0)
    turn = " ".join([
        _call(code="while True:\n    pass"),
        _call(code="print('x' * 10**6)"),
        _call(code="9 ** 99"),
        _call(code="1 / 0"),
        _call("calculator", expression="1 / 0"),
        _call("calculator", expression="9 ** 9 ** 9"),
    ])  # fmt: skip
    obs, r, done, _ = env.step(turn)
    contents = [_content(b) for b in _responses(obs)]
    assert contents[0] == "TimeoutError"
    assert contents[1] == "OutputLimitError"  # the sandbox's cap (max_output_bytes)
    assert contents[2:] == [str(9**99)[:10] + "...", "ZeroDivisionError", "ZeroDivisionError",
                            "OverflowError"]  # fmt: skip
    assert (r, done) == (0.0, False)
    assert env.limits_hit == {"timeout": 1, "output": 2}  # the flood, and 9**99 cut here
    assert env.tool_errors == 5 and env.calls == 6


def test_hallucinated_tool_output(pool):
    env = _env(pool)
    env.reset(0)
    obs, r, done, info = env.step(f"{PY}\n<tool_response>\n1\n</tool_response>")
    assert env.hallucinated and info["malformed_calls"] == ["stray_text"] and not done
    env.reset(0)
    env.step(f"{PY}\n{env.a * env.b}")
    assert env.hallucinated
    env.reset(0)
    env.step(f"{PY}\n{CALC}\n")
    assert not env.hallucinated


def test_tool_off_and_flaky_tool_in_json(pool):
    off = _env(pool, tool_enabled=False)
    off.reset(0)
    obs, r, done, _ = off.step(f"{PY}{CALC}")
    assert [_content(b) for b in _responses(obs)] == ["", ""] and off.calls == 2
    flaky = _env(pool, tool_error_rate=1.0)
    flaky.reset(0)
    obs, *_ = flaky.step(f"{PY}{CALC}")
    assert [_content(b) for b in _responses(obs)] == ["Error", "Error"]
    assert flaky.tool_errors == 2


def test_a_batch_of_both_formats(pool):
    fence, js = PythonToolEnv(pool=pool), _env(pool)
    fence.reset(0)
    js.reset(0)
    (f_obs, *_), (j_obs, *_) = PythonToolEnv.step_batch([fence, js], ["```python\n6*7\n```", CALC])
    assert f_obs == "42" and _content(_responses(j_obs)[0]) == "6"


def _replay(env: PythonToolEnv, seed: int, messages):
    env.reset(seed)
    assert messages[0] == (env.prompt, False)
    reward = None
    for k in range(1, len(messages)):
        text, trainable = messages[k]
        if trainable:
            obs, reward, done, info = env.step(text)
            assert info["format_ok"] and not env.hallucinated
            if not done:
                assert messages[k + 1] == (obs, False)
    assert done
    return reward


def test_json_demonstrations_replay_through_the_env(pool):
    env, rng = _env(pool), random.Random(0)
    tools, retries = set(), 0
    for seed in range(16):
        messages = env.demonstration(seed, rng, tool_fraction=0.8, error_rate=0.3, retry_rate=0.4)
        right = messages[-1][0] == str(env.a * env.b)
        assert _replay(env, seed, messages) == (1.0 if right else -1.0)
        if len(messages) > 2:
            tools.add(json.loads(messages[1][0].split("\n")[1])["name"])
            retries += len(messages) == 6
            assert not env.malformed_calls
    assert tools == {"python", "calculator"} and retries


def test_same_draws_as_the_fence_demonstrations(pool):
    fence, js = PythonToolEnv(pool=pool), _env(pool)
    for seed in range(12):
        a = fence.demonstration(seed, random.Random(seed), error_rate=0.5, retry_rate=0.5)
        b = js.demonstration(seed, random.Random(seed), error_rate=0.5, retry_rate=0.5)
        assert len(a) == len(b) and a[-1] == b[-1]


# --------------------------------------------------------------------------- the fence format


def test_the_fence_format_is_unchanged(pool):
    env = PythonToolEnv(pool=pool)
    assert env.call_format == "fence" and env.reset(0) == PROMPT.format(a=env.a, b=env.b)
    obs, r, done, info = env.step(PY)  # a JSON call is no call here: a format failure
    assert (obs, r, done, info["format_ok"]) == ("", -1.0, True, False)
    assert "malformed_calls" not in info and not env.malformed_calls
    env.reset(0)
    obs, r, done, info = env.step("```python\nprint(6*7)\n```")
    assert (obs, r, done, set(info)) == (
        "42",
        0.0,
        False,
        {"terminated", "truncated", "success", "format_ok"},
    )
    assert env.tool_calls == {"python": 1} and env.calls == 1
