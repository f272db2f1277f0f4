"""The python-tool env: ReTool's multiplication in chat messages, Python run in the real sandbox."""

from __future__ import annotations

import random

import pytest

from agentic_rl import sandbox
from agentic_rl.envs import MultiplyEnv, PythonToolEnv, make_env
from agentic_rl.envs.python_tool import PROMPT, with_print


@pytest.fixture(scope="module")
def pool():
    p = sandbox.Pool(1, timeout_s=0.5)
    yield p
    p.close()


def _env(pool, **kw) -> PythonToolEnv:
    return PythonToolEnv(pool=pool, **kw)


def _block(code: str, label: str = "python") -> str:
    return f"```{label}\n{code}\n```"


# --------------------------------------------------------------------------- problems and parsing


def test_same_problems_as_multiply_and_the_prompt():
    env, words = PythonToolEnv(), MultiplyEnv()
    for seed in range(5):
        prompt = env.reset(seed)
        words.reset(seed)
        assert (env.a, env.b) == (words.a, words.b)
        assert prompt == PROMPT.format(a=env.a, b=env.b) == env.prompt
        assert prompt == (
            f"What is {env.a} * {env.b}? Run Python: reply with only a ```python code block "
            "that prints it. Then reply with only the number."
        )
    assert env.name == "python-tool" and env.chat is True
    assert env.max_turns == env.max_tool_calls + 1 == 3
    assert isinstance(make_env("python-tool", max_tool_calls=3), PythonToolEnv)
    assert make_env("python-tool", max_tool_calls=3).max_turns == 4
    with pytest.raises(NotImplementedError, match="--profile pretrained"):
        env.vocabulary()


@pytest.mark.parametrize(
    "text,kind,payload",
    [
        ("```python\nprint(347*29)\n```", "code", "print(347*29)"),
        ("```\nprint(347*29)\n```", "code", "print(347*29)"),  # no label
        ("  ```python\nprint(1)```\n ", "code", "print(1)"),  # spaces around, no last newline
        ("```python\nx = 347\nprint(x * 29)\n```", "code", "x = 347\nprint(x * 29)"),
        ("10063", "answer", "10063"),
        ("  10063 \n", "answer", "10063"),
        ("-12", "answer", "-12"),
        ("The answer is 10063", "malformed", None),
        ("10063.", "malformed", None),
        ("10 063", "malformed", None),
        ("+5", "malformed", None),
        ("--5", "malformed", None),
        ("```python\nprint(1)\n```\n1", "malformed", None),  # writes the output itself
        ("Here:\n```python\nprint(1)\n```", "malformed", None),  # text before the block
        ("```py\nprint(1)\n```", "malformed", None),  # another label
        ("```python print(1)```", "malformed", None),  # no newline after the fence
        ("```python\nprint(1)\n```\n```python\nprint(2)\n```", "malformed", None),  # two blocks
        ("```python\nprint(1)", "malformed", None),  # cut before the closing fence
        ("", "malformed", None),
        (None, "malformed", None),
    ],
)
def test_turns_are_parsed_strictly(text, kind, payload):
    assert PythonToolEnv()._parse(text) == (kind, payload)


def test_a_final_expression_is_printed():
    assert with_print("347*29") == "print(347*29)"
    assert with_print("x = 347\nx * 29") == "x = 347\nprint(x * 29)"
    assert with_print("x = 1; x + 1  # note") == "x = 1; print(x + 1)  # note"
    assert with_print("print(347*29)") == "print(347*29)"  # not print(print(...))
    assert with_print("x = 2") == "x = 2"
    assert with_print("1, 2") == "print((1, 2))"
    assert with_print("print(347*29*)") == "print(347*29*)"  # left for the interpreter


# --------------------------------------------------------------------------- episodes


def test_an_episode_with_the_real_sandbox(pool):
    env = _env(pool)
    env.reset(3)
    obs, reward, done, info = env.step(_block(f"x = {env.a}\nx * {env.b}"))  # two statements
    assert (obs, reward, done) == (str(env.a * env.b), 0.0, False)
    assert (env.calls, env.tool_errors, info["format_ok"]) == (1, 0, True)
    obs, reward, done, info = env.step(f" {env.a * env.b}\n")
    assert (obs, reward, done) == ("", 1.0, True) and info["success"] and env.answered
    assert not env.hallucinated
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step("1")


def test_wrong_negative_and_malformed_answers(pool):
    env = _env(pool)
    env.reset(0)
    assert env.step(str(env.a * env.b + 1))[1:3] == (-1.0, True) and env.answered
    env.reset(0)
    _, r, done, info = env.step(str(-env.a * env.b))
    assert (r, done, info["format_ok"], info["success"]) == (-1.0, True, True, False)
    env.reset(0)
    _, r, done, info = env.step(f"The answer is {env.a * env.b}")
    assert (r, done, info["format_ok"], env.answered) == (-1.0, True, False, False)


@pytest.mark.parametrize("text", [None, "", "   ", 12, b"10063", ["1"], "```", "```python\n```"])
def test_step_never_raises_on_bad_input(pool, text):
    env = _env(pool)
    env.reset(0)
    obs, r, done, info = env.step(text)
    if text == "```python\n```":  # an empty program: it runs and prints nothing
        assert (obs, r, done) == ("", 0.0, False)
    else:
        assert (obs, r, done, info["format_ok"]) == ("", -1.0, True, False)


def test_trailing_text_is_malformed_and_hallucinated(pool):
    env = _env(pool)
    env.reset(0)
    obs, r, done, info = env.step(f"```python\nprint({env.a}*{env.b})\n```\n{env.a * env.b}")
    assert (obs, r, done, info["format_ok"]) == ("", -1.0, True, False) and env.hallucinated
    env.reset(0)  # a clean call is not
    env.step(_block("print(1)"))
    assert not env.hallucinated


def test_every_call_runs(pool):
    """Episodes stepped together that send the same program each get their own run."""
    envs = [_env(pool) for _ in range(3)]
    for env in envs:
        env.reset(0)
    code = _block("import random\nrandom.getrandbits(60)")
    outputs = [obs for obs, *_ in PythonToolEnv.step_batch(envs, [code] * 3)]
    assert all(o.isdigit() for o in outputs) and len(set(outputs)) == 3  # not one shared result
    assert [env.calls for env in envs] == [1, 1, 1]


def test_tool_budget_and_truncation(pool):
    env = _env(pool, max_tool_calls=1)
    env.reset(0)
    assert env.step(_block("print(2)"))[:3] == ("2", 0.0, False)
    obs, r, done, info = env.step(_block("print(3)"))  # over the budget: not run
    assert (obs, r, done, env.calls, info["truncated"]) == ("", -1.0, True, 1, False)

    env = _env(pool, max_tool_calls=3)
    env.max_turns = 2  # a turn limit below the budget truncates after a call
    env.reset(0)
    env.step(_block("print(2)"))
    obs, r, done, info = env.step(_block("print(3)"))
    assert (obs, r, done, info["truncated"]) == ("3", -1.0, True, True)


def test_tool_off_and_flaky_tool(pool):
    off = _env(pool, tool_enabled=False)
    off.reset(0)
    assert off.step(_block("print(2)"))[:3] == ("", 0.0, False)
    assert off.calls == 1 and off.tool_errors == 0
    assert off.step(str(off.a * off.b))[1] == 1.0

    flaky = _env(pool, tool_error_rate=1.0)
    flaky.reset(0)
    assert flaky.step(_block("print(2)"))[:3] == ("Error", 0.0, False)
    assert flaky.tool_errors == 1


def test_errors_and_long_output(pool):
    env = _env(pool, max_tool_calls=5, max_output_chars=10)
    env.reset(0)
    assert env.step(_block("print(1 +)"))[0] == "SyntaxError"
    assert env.step(_block("undefined_name"))[0] == "NameError"
    assert env.step(_block("1 / 0"))[0] == "ZeroDivisionError"
    assert env.step(_block("9 ** 99"))[0] == str(9**99)[:10] + "..."
    assert env.step(_block("print('x' * 10)"))[0] == "x" * 10  # not longer: not cut
    assert env.tool_errors == 3 and not env._done


def test_a_program_that_runs_forever_times_out(pool):
    env = _env(pool)  # the pool's deadline: 0.5 s
    env.reset(0)
    obs, r, done, _ = env.step(_block("while True:\n    pass"))
    assert (obs, r, done) == ("TimeoutError", 0.0, False)
    alone = PythonToolEnv(timeout_s=0.3)  # no pool: a fresh sandbox with the env's deadline
    alone.reset(0)
    assert alone.step(_block("while True:\n    pass"))[0] == "TimeoutError"


def test_the_sandbox_refuses_and_the_episode_goes_on(pool):
    env = _env(pool)
    env.reset(0)
    obs, r, done, _ = env.step(_block("open('/etc/passwd').read()"))
    assert (obs, r, done) == ("blocked", 0.0, False)
    obs, r, done, _ = env.step(_block('import socket; socket.socket().connect(("1.1.1.1", 80))'))
    # blocked by the audit hook, or socket not even importable inside the jail
    assert obs in {"blocked", "ModuleNotFoundError", "ImportError", "PermissionError"}
    assert (r, done, env.tool_errors) == (0.0, False, 2)
    assert env.step(str(env.a * env.b))[1] == 1.0


# --------------------------------------------------------------------------- demonstrations


def _replay(env: PythonToolEnv, seed: int, messages):
    """Step a demonstration's assistant messages; check each tool message; the last reward."""
    env.reset(seed)
    assert messages[0] == (env.prompt, False)
    reward = None
    for k in range(1, len(messages)):
        text, trainable = messages[k]
        if not trainable:
            continue
        obs, reward, done, _ = env.step(text)
        if not done:
            assert messages[k + 1] == (obs, False)
    assert done
    return reward


def test_demonstrations_replay_through_the_real_env(pool):
    env, rng = _env(pool, max_tool_calls=2), random.Random(0)
    kinds = set()
    for seed in range(24):
        messages = env.demonstration(seed, rng, tool_fraction=0.7, error_rate=0.3, retry_rate=0.4)
        assert env._done  # a demonstration leaves no episode running
        answer = messages[-1][0]
        right = answer == str(env.a * env.b)
        if len(messages) == 2:
            kind = "direct"
            assert right
        elif len(messages) == 6:
            kind = "retry"
            assert messages[1][0] == messages[3][0].replace(")\n```", "*)\n```")
            assert messages[2] == ("SyntaxError", False)
        else:
            kind = "miscopied" if not right else "tool"
            assert [t for _, t in messages] == [False, True, False, True]
        kinds.add(kind)
        assert _replay(env, seed, messages) == (1.0 if right else -1.0)
    assert kinds == {"direct", "tool", "miscopied", "retry"}


def test_demonstration_outputs_are_cut_like_the_env(pool):
    env = _env(pool, digits=(6, 6), max_output_chars=5)
    messages = env.demonstration(1, random.Random(0), tool_fraction=1.0)
    assert messages[2][0].endswith("...") and len(messages[2][0]) == 8
    assert _replay(env, 1, messages) == 1.0  # the answer is the whole product


def test_no_retry_without_a_second_call(pool):
    env = _env(pool, max_tool_calls=1)
    rng = random.Random(0)
    for seed in range(10):
        assert len(env.demonstration(seed, rng, tool_fraction=1.0, retry_rate=1.0)) == 4
