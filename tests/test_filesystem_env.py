"""The BFCL-style file-system environment: the MultiTurnEnv protocol and the vocabulary, scoring by
state plus golden results on hand-written tasks, each function's semantics (BFCL's
GorillaFileSystem), strict parsing that never raises, the turn limit, seeded task generation,
the scripted expert, ``corrupt`` and demonstrations."""

from __future__ import annotations

import itertools
import random

import pytest

from agentic_rl.envs import MultiTurnEnv, make_env
from agentic_rl.envs.filesystem import (
    CORRUPTIONS,
    DONE,
    FUNCTIONS,
    FileSystem,
    FileSystemEnv,
    _task_names,
    corrupt,
)

# A root with one folder (two files) and one file; "b.txt" and "docs/c.txt" share a content.
TREE = {"docs": {"a.txt": "hello", "c.txt": "poem"}, "b.txt": "poem"}


def hand_task(golden: list[str], tree: dict = TREE) -> dict:
    return {"family": "easy", "kind": "hand", "goal": "hand task", "tree": tree, "golden": golden}


def hand_env(task: dict, **kwargs) -> FileSystemEnv:
    """An env whose every seed gives ``task``."""
    env = FileSystemEnv(**kwargs)
    env.make_task = lambda seed: task
    return env


def run(env: FileSystemEnv, calls: list[str], seed: int = 0) -> list[tuple]:
    """Reset, then step ``calls``: the ``(obs, reward, done, info)`` of every step."""
    env.reset(seed)
    return [env.step(call) for call in calls]


# ---------------------------------------------------------------- protocol and vocabulary


def test_is_a_multiturn_env():
    env = FileSystemEnv()
    assert isinstance(env, MultiTurnEnv)
    # the expert's next call follows the golden calls, then done
    for seed in range(50):
        env.reset(seed)
        calls = []
        while not env._done:
            calls.append(env.expert_action())
            env.step(calls[-1])
        assert calls == env.expert_calls(seed) and env.success


def test_protocol_words_are_not_names_and_nothing_moves_onto_itself():
    fs = FileSystem({"docs": {"a.txt": "x"}})
    for call in ("mkdir <action>", "touch done", "touch ls", "mkdir a/b", "mkdir .."):
        assert fs.execute(call) == (f"error {call.split()[0]} invalid name {call.split()[1]}",
                                    False)
    assert fs.execute("mv docs docs") == ("error mv docs to itself", True)
    assert fs.execute("cp docs docs") == ("error cp docs to itself", True)
    assert fs.tree == {"docs": {"a.txt": "x"}}
    assert fs.execute("ls a b c d e f g h i j k")[0] == "error ls takes 0 arguments got many"


def test_protocol_members_and_registry():
    env = make_env("filesystem", max_turns=3)
    assert type(env) is FileSystemEnv and env.name == "filesystem" and env.max_turns == 3
    for member in ("name", "max_turns", "vocabulary", "reset", "step"):
        assert hasattr(env, member)
    task = env.make_task(7)
    assert env.reset(7) == f"task {task['goal']} <action>"
    assert env.task == task and env.fs == FileSystem(task["tree"])


def test_observations_end_with_the_action_tag():
    env = FileSystemEnv(max_turns=8)
    for seed in range(100):
        calls = ["ls", "cat nothing.txt", *env.expert_calls(seed)]
        steps = run(env, calls, seed)
        assert all(obs.endswith(" <action>") for obs, _, done, _ in steps if not done)
        assert [done for _, _, done, _ in steps] == [False] * (len(steps) - 1) + [True]
        assert steps[-1][0] == ""  # the final step has no observation


def test_vocabulary_covers_goals_calls_and_observations():
    env = FileSystemEnv()
    vocab = set(env.vocabulary())
    assert {"<action>", "</action>", DONE, *FUNCTIONS} <= vocab
    seen = set()
    for seed in range(500):
        task = env.make_task(seed)
        seen.update(task["goal"].split())
        for call in task["golden"]:
            seen.update(call.split())
        for demo_seed in (seed, seed + 1000):  # the expert, and half of the time a corruption
            for obs, call in env.demonstration(seed, random.Random(demo_seed), error_rate=0.5):
                seen.update(obs.split() + call.split())
    assert seen <= vocab, seen - vocab


def test_vocabulary_covers_every_error_message():
    """Every call of a function (or another vocabulary word) with up to two vocabulary words as
    arguments, at the root and in a folder: every word of the result is in the vocabulary.
    (Three or more arguments would give ``... got 3``: the count 3 is not a vocabulary word.)"""
    env = FileSystemEnv()
    vocab = sorted(env.vocabulary())
    names = [*FUNCTIONS, DONE, "task", "error", "<action>"]
    few = ["..", "/", "0", "ls", "<action>", "empty", "docs", "work", "report.txt", "memo.txt"]
    unseen, errors = set(), 0
    for seed in (0, 1):
        task = env.make_task(seed)
        folder = next(name for name, item in task["tree"].items() if isinstance(item, dict))
        calls = [name for name in names]
        calls += [f"{name} {arg}" for name in names for arg in vocab]
        calls += [f"{name} {a} {b}" for name in names for a, b in itertools.product(few, few)]
        calls += [f"{name} {a} {b}" for name in names for a, b in itertools.product(vocab, few)]
        for call, inside in itertools.product(calls, (False, True)):
            fs = FileSystem(task["tree"])
            if inside:
                fs.execute(f"cd {folder}")
            result, _ = fs.execute(call)
            errors += result.startswith("error")
            unseen.update(set(result.split()) - set(vocab))
    assert not unseen and errors > 1000


# ---------------------------------------------------------------- scoring (hand-written tasks)


def test_golden_replay_runs_on_a_fresh_copy():
    env = FileSystemEnv()
    task = hand_task(["cd docs", "mv a.txt new.txt", "cat new.txt"])
    fs, results = env.golden_replay(task)
    assert results == ["cwd docs", "moved a.txt to new.txt", "content hello"]
    assert fs.tree == {"docs": {"new.txt": "hello", "c.txt": "poem"}, "b.txt": "poem"}
    assert task["tree"] == TREE and env.golden_replay(task)[1] == results  # tree untouched


def test_the_expert_succeeds_on_the_final_step_only():
    task = hand_task(["cd docs", "mkdir old", "mv a.txt old"])
    env = hand_env(task)
    assert env.expert_calls(3) == [*task["golden"], DONE]
    steps = run(env, env.expert_calls(3))
    assert [reward for _, reward, _, _ in steps] == [0.0, 0.0, 0.0, 1.0]
    assert [info["success"] for *_, info in steps] == [False, False, False, True]
    assert steps[-1][3] == {
        "terminated": True,
        "truncated": False,
        "format_ok": True,
        "success": True,
    }
    assert env.fs.tree == {"docs": {"c.txt": "poem", "old": {"a.txt": "hello"}}, "b.txt": "poem"}
    assert env.play(3, env.expert_calls(3))[1] == 1.0 and env.success
    assert task["tree"] == TREE  # the episode worked on a copy


@pytest.mark.parametrize(
    "golden, calls, success",
    [
        (["cat b.txt"], ["cat b.txt"], True),
        (["cat b.txt"], [], False),  # the state is equal, the golden result is missing
        (["cat b.txt"], ["cat docs", "ls"], False),
        (["cat b.txt", "cat b.txt"], ["cat b.txt"], False),  # results count with multiplicity
        (["cat b.txt", "cat b.txt"], ["cat b.txt", "ls", "cat b.txt"], True),
        (["mv b.txt new.txt"], ["ls", "mv b.txt new.txt", "ls", "cat new.txt"], True),  # harmless
        (["mv b.txt new.txt"], ["mv b.txt new.txt", "rm docs"], False),  # an extra change
        (["mv b.txt new.txt"], ["mv b.txt new.txt", "touch z.txt"], False),
        (["mv b.txt new.txt"], ["cp b.txt new.txt", "rm b.txt"], False),  # same state, no result
        (["mkdir new"], ["mkdir new", "mkdir new"], True),  # a failed call changes nothing
        (["rm b.txt"], ["rm docs"], False),
        (["mv b.txt docs"], ["cd docs", "cd ..", "mv b.txt docs"], True),  # another route
        (["cp b.txt x.txt", "cp b.txt y.txt"], ["cp b.txt y.txt", "cp b.txt x.txt"], True),
        (["cd docs", "rm a.txt"], ["cd docs", "cd ..", "cd docs", "rm a.txt"], True),
        (["cd docs", "rm a.txt"], ["cd docs", "rm a.txt", "cd .."], True),  # cwd is not state
        (["cd docs", "cat a.txt"], ["cd docs", "cat a.txt", "cd .."], True),
        (["cd docs", "rm a.txt"], ["rm a.txt", "cd docs"], False),  # the order matters here
        # results are compared, not calls: b.txt holds what docs/c.txt holds
        (["cd docs", "cat c.txt"], ["cat b.txt", "cd docs"], True),
    ],
)
def test_scoring_by_state_and_golden_results(golden, calls, success):
    env = hand_env(hand_task(golden))
    steps = run(env, [*calls, DONE])
    assert all(reward == 0.0 and not done for _, reward, done, _ in steps[:-1])
    _, reward, done, info = steps[-1]
    assert done and info["terminated"] and reward == float(success) and info["success"] is success


def test_turn_limit_truncates_and_scores():
    env = hand_env(hand_task(["cd docs", "rm a.txt"]), max_turns=2)
    steps = run(env, ["cd docs", "rm a.txt"])  # the golden calls fill the limit: no done needed
    assert steps[0][1:3] == (0.0, False)
    _, reward, done, info = steps[1]
    assert (reward, done, info["success"]) == (1.0, True, True)
    assert info["truncated"] and not info["terminated"]
    _, reward, done, info = run(env, ["cd docs", "ls"])[-1]
    assert (reward, done, info["truncated"]) == (0.0, True, True)
    _, reward, done, info = run(env, ["cd docs", "rm a.txt", DONE])[-1]  # the step is refused
    assert (reward, done) == (0.0, True)
    env = FileSystemEnv(max_turns=1, hard_fraction=0.0)  # one easy golden call, no done
    assert all(env.play(seed, env.make_task(seed)["golden"])[1] == 1.0 for seed in range(50))


def test_step_after_the_episode_never_raises():
    env = FileSystemEnv()
    obs, reward, done, info = env.step("ls")  # before any reset
    assert (obs, reward, done, info["success"]) == ("error episode over", 0.0, True, False)
    env.play(0, env.expert_calls(0))
    assert env.success
    for text in ("ls", DONE, None, ""):
        obs, reward, done, info = env.step(text)
        assert (obs, reward, done) == ("error episode over", 0.0, True)
        assert not info["success"] and not info["format_ok"]


# ---------------------------------------------------------------- the functions


def test_ls_lists_sorted_names():
    fs = FileSystem({"z.txt": "poem", "b": {}, "a.txt": "poem"})
    assert fs.execute("ls") == ("result a.txt b z.txt", True)
    assert fs.execute("cd b") == ("cwd b", True)
    assert fs.execute("ls") == ("result empty", True)
    assert FileSystem({}).ls() == "result empty"


def test_cd():
    fs = FileSystem({"a": {"b": {"f.txt": "poem"}}, "g.txt": "poem"})
    assert fs.execute("cd ..") == ("error cd already root", True)
    assert fs.cd("g.txt") == "error cd g.txt no such directory"  # a file
    assert fs.cd("b") == "error cd b no such directory"  # not in the current folder
    assert fs.path == [] and fs.cd("a") == "cwd a" and fs.cd("b") == "cwd b"
    assert fs.path == ["a", "b"] and fs.cwd == {"f.txt": "poem"}
    assert fs.cd("..") == "cwd a" and fs.cd("..") == "cwd /" and fs.path == []
    moved = FileSystem(fs.tree)
    moved.cd("a")
    assert moved == fs  # equality is the tree only, not the current folder


def test_mkdir_and_touch():
    fs = FileSystem(TREE)
    assert fs.mkdir("new") == "created new" and fs.tree["new"] == {}
    assert fs.mkdir("new") == "error mkdir new exists"
    assert fs.mkdir("b.txt") == "error mkdir b.txt exists" and fs.tree["b.txt"] == "poem"
    assert fs.touch("z.txt") == "created z.txt" and fs.tree["z.txt"] == "empty"
    assert fs.touch("b.txt") == "error touch b.txt exists" and fs.tree["b.txt"] == "poem"
    assert fs.touch("docs") == "error touch docs exists" and isinstance(fs.tree["docs"], dict)
    fs.cd("docs")
    assert fs.touch("z.txt") == "created z.txt" and fs.tree["docs"]["z.txt"] == "empty"
    assert TREE == {"docs": {"a.txt": "hello", "c.txt": "poem"}, "b.txt": "poem"}  # a copy


def test_cat():
    fs = FileSystem(TREE)
    assert fs.execute("cat b.txt") == ("content poem", True)
    assert fs.cat("docs") == "error cat docs no such file"  # a folder
    assert fs.cat("a.txt") == "error cat a.txt no such file"  # not in the current folder
    fs.cd("docs")
    assert fs.cat("a.txt") == "content hello"
    assert fs.tree == TREE


def test_mv():
    fs = FileSystem(TREE)
    assert fs.execute("mv b.txt new.txt") == ("moved b.txt to new.txt", True)
    assert fs.tree == {"docs": TREE["docs"], "new.txt": "poem"}
    assert fs.mv("new.txt", "docs") == "moved new.txt to docs"  # into an existing folder
    assert fs.tree == {"docs": {**TREE["docs"], "new.txt": "poem"}}
    assert fs.mv("docs", "papers") == "moved docs to papers"  # a folder renamed, contents kept
    assert fs.tree == {"papers": {**TREE["docs"], "new.txt": "poem"}}
    assert fs.mv("nope.txt", "x.txt") == "error mv nope.txt no such file or directory"
    fs = FileSystem({"x.txt": "poem", "y.txt": "hello", "d": {"x.txt": "draft"}})
    before = FileSystem(fs.tree)
    assert fs.mv("x.txt", "y.txt") == "error mv y.txt exists"  # an existing file
    assert fs.mv("x.txt", "d") == "error mv x.txt exists"  # the folder holds the name
    assert fs == before


def test_cp_copies_independently():
    fs = FileSystem(TREE)
    assert fs.execute("cp b.txt new.txt") == ("copied b.txt to new.txt", True)
    assert fs.tree["b.txt"] == fs.tree["new.txt"] == "poem"
    assert fs.cp("b.txt", "docs") == "copied b.txt to docs"
    assert fs.tree["docs"]["b.txt"] == "poem" and fs.tree["b.txt"] == "poem"
    assert fs.cp("docs", "backup") == "copied docs to backup"
    assert fs.tree["backup"] == fs.tree["docs"] and fs.tree["backup"] is not fs.tree["docs"]
    fs.cd("backup")
    fs.rm("a.txt")
    fs.touch("z.txt")
    assert fs.tree["docs"] == {"a.txt": "hello", "c.txt": "poem", "b.txt": "poem"}
    fs.cd("..")
    before = FileSystem(fs.tree)
    assert fs.cp("nope.txt", "x.txt") == "error cp nope.txt no such file or directory"
    assert fs.cp("b.txt", "new.txt") == "error cp new.txt exists"
    assert fs.cp("b.txt", "docs") == "error cp b.txt exists"
    assert fs == before


def test_rm_files_and_folders():
    fs = FileSystem(TREE)
    assert fs.execute("rm b.txt") == ("removed b.txt", True)
    assert fs.rm("b.txt") == "error rm b.txt no such file or directory"
    assert fs.rm("a.txt") == "error rm a.txt no such file or directory"  # in docs, not here
    assert fs.rm("docs") == "removed docs" and fs.tree == {}  # a folder with its contents


# ---------------------------------------------------------------- strict parsing


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "error empty call"),
        ("   \n ", "error empty call"),
        (None, "error empty call"),
        (123, "error empty call"),
        (["ls"], "error empty call"),
        ("find", "error unknown function find"),
        ("LS", "error unknown function LS"),
        ("done now", "error unknown function done"),
        ("ls docs", "error ls takes 0 arguments got 1"),
        ("cd", "error cd takes 1 arguments got 0"),
        ("cat b.txt docs", "error cat takes 1 arguments got 2"),
        ("mv b.txt", "error mv takes 2 arguments got 1"),
        ("cd docs/a", "error cd invalid name docs/a"),
        ("cd /", "error cd invalid name /"),
        ("touch 123", "error touch invalid name 123"),
        ("mkdir ls", "error mkdir invalid name ls"),
        ("mkdir ..", "error mkdir invalid name .."),
        ("cp b.txt ..", "error cp invalid name .."),
        ("rm .", "error rm invalid name ."),
    ],
)
def test_malformed_calls_are_errors_and_the_episode_goes_on(text, message):
    task = hand_task(["cd docs", "rm a.txt"])
    env = hand_env(task)
    env.reset(0)
    obs, reward, done, info = env.step(text)
    assert obs == f"{message} <action>" and obs.startswith("error")
    assert (reward, done, info["format_ok"], info["success"]) == (0.0, False, False, False)
    assert env.fs == FileSystem(TREE) and env.fs.path == []
    steps = [env.step(call) for call in [*task["golden"], DONE]]  # the expert still succeeds
    assert steps[-1][1] == 1.0 and all(info["format_ok"] for *_, info in steps)


def test_cd_up_is_well_formed():
    env = hand_env(hand_task(["cd docs", "cd .."]))
    env.reset(0)
    assert env.step("cd ..") == (
        "error cd already root <action>",
        0.0,
        False,
        {"terminated": False, "truncated": False, "format_ok": True, "success": False},
    )
    assert env.step(" cd docs ")[0] == "cwd docs <action>"  # whitespace around is fine
    assert env.step("cd ..")[0] == "cwd / <action>" and env.step(DONE)[1] == 1.0


# ---------------------------------------------------------------- task generation


def test_tasks_are_seeded():
    a, b = FileSystemEnv(), FileSystemEnv()
    assert all(a.make_task(seed) == b.make_task(seed) for seed in range(100))
    first = a.make_task(5)
    a.make_task(6)
    assert a.make_task(5) == first
    assert a.reset(5) == b.reset(5)
    assert len({str(a.make_task(seed)) for seed in range(200)}) == 200


def test_task_shape():
    env = FileSystemEnv()
    for seed in range(200):
        task = env.make_task(seed)
        tree = task["tree"]
        folders = [name for name, item in tree.items() if isinstance(item, dict)]
        assert len(tree) == 4 and len(folders) == 2
        assert all(
            len(tree[f]) == 2 and all(isinstance(v, str) for v in tree[f].values()) for f in folders
        )
        assert set(task) == {"family", "kind", "goal", "tree", "golden"}


@pytest.mark.parametrize("hard_fraction, families", [(0.0, {"easy"}), (1.0, {"hard"})])
def test_hard_fraction_extremes(hard_fraction, families):
    env = FileSystemEnv(hard_fraction=hard_fraction)
    assert {env.make_task(seed)["family"] for seed in range(300)} == families


def test_families_and_kinds():
    env = FileSystemEnv()
    kinds = {"easy": set(), "hard": set()}
    for seed in range(1000):
        task = env.make_task(seed)
        assert env.task_family(seed) == task["family"]
        kinds[task["family"]].add(task["kind"])
        words, golden = task["goal"].split(), task["golden"]
        if task["family"] == "hard":
            assert words[0] == "in" and golden[0] == f"cd {words[1]}" and len(golden) in (2, 3)
            assert isinstance(task["tree"][words[1]], dict)
        else:
            assert words[0] != "in" and len(golden) == 1 and not golden[0].startswith("cd")
    assert kinds == {
        "easy": {"rename", "copy", "delete", "make_folder", "show", "move_into"},
        "hard": {"rename", "delete", "show", "make_folder_move"},
    }


def test_golden_replays_have_no_errors_and_the_expert_always_succeeds():
    env = FileSystemEnv()
    for seed in range(1000):
        task = env.make_task(seed)
        _, results = env.golden_replay(task)
        assert not any(result.startswith("error") for result in results), (seed, results)
        pairs, reward = env.play(seed, env.expert_calls(seed))
        assert reward == 1.0 and env.success, seed
        assert [call for _, call in pairs] == [*task["golden"], DONE]


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"hard_fraction": -0.1}, "hard_fraction"),
        ({"hard_fraction": 1.5}, "hard_fraction"),
        ({"max_turns": 0}, "max_turns"),
        ({"max_turns": -3}, "max_turns"),
    ],
)
def test_validation(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        FileSystemEnv(**kwargs)


# ---------------------------------------------------------------- corrupt and demonstrations


def test_corrupt_rejects_an_unknown_kind():
    env = FileSystemEnv()
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt(env.expert_calls(0), "typo", random.Random(0), env.make_task(0))


def test_corruption_shapes():
    env = FileSystemEnv()
    for seed in range(300):
        task, calls = env.make_task(seed), env.expert_calls(seed)
        body = calls[:-1]
        out = {kind: corrupt(calls, kind, random.Random(seed), task) for kind in CORRUPTIONS}
        for kind in ("wrong_arg", "skip", "extra"):
            assert out[kind][-1] == DONE and out[kind].count(DONE) == 1
        skipped = out["skip"][:-1]
        assert len(skipped) == len(body) - 1
        assert any(body[:i] + body[i + 1 :] == skipped for i in range(len(body)))
        extra = out["extra"][:-1]
        assert len(extra) == len(body) + 1
        assert any(extra[:i] + extra[i + 1 :] == body for i in range(len(extra)))
        swapped = out["swap"]  # two adjacent calls of body + [done] swapped
        assert sorted(swapped) == sorted(calls) and swapped != calls
        i = next(k for k, (x, y) in enumerate(zip(swapped, calls)) if x != y)
        assert swapped[i : i + 2] == calls[i : i + 2][::-1]
        assert swapped[i + 2 :] == calls[i + 2 :]
        wrong = out["wrong_arg"][:-1]
        diffs = [(w, c) for w, c in zip(wrong, body) if w != c]
        assert len(wrong) == len(body) and len(diffs) == 1
        w, c = (call.split() for call in diffs[0])
        changed = [k for k in range(len(c)) if w[k] != c[k]]
        assert len(w) == len(c) and len(changed) == 1 and changed[0] >= 1
        assert w[changed[0]] in _task_names(task)


def test_swap_on_a_one_call_task_puts_the_call_after_done():
    env = FileSystemEnv(hard_fraction=0.0)
    for seed in range(20):
        (call,) = env.make_task(seed)["golden"]
        assert corrupt([call, DONE], "swap", random.Random(seed), env.make_task(seed)) == [
            DONE,
            call,
        ]


# wrong_arg can still succeed: "cat F" (a show task) read with another file G of the same folder
# that happens to hold the same content gives the same result and cat changes nothing (e.g. seed
# 55: 1 of 500). A skipped or swapped call always loses a golden result or changes the state.
@pytest.mark.parametrize(
    "kind, min_failure_rate", [("wrong_arg", 0.95), ("skip", 1.0), ("swap", 1.0)]
)
def test_corrupted_trajectories_fail(kind, min_failure_rate):
    env = FileSystemEnv()
    failures = 0
    for seed in range(500):
        calls = corrupt(env.expert_calls(seed), kind, random.Random(seed), env.make_task(seed))
        failures += env.play(seed, calls)[1] == 0.0
    assert failures / 500 >= min_failure_rate


def test_extra_calls_succeed_or_fail_by_state():
    env = FileSystemEnv()
    outcomes = {True: 0, False: 0}
    for seed in range(500):
        calls = corrupt(env.expert_calls(seed), "extra", random.Random(seed), env.make_task(seed))
        success = env.play(seed, calls)[1] == 1.0
        outcomes[success] += 1
        if "ls" in calls:  # listing changes nothing and removes no golden result
            assert success, (seed, calls)
    assert outcomes[True] >= 50 and outcomes[False] >= 50


def test_demonstrations():
    env = FileSystemEnv()
    for seed in range(50):
        pairs = env.demonstration(seed, random.Random(seed), error_rate=0.0)
        assert pairs == env.play(seed, env.expert_calls(seed))[0] and env.success
        assert pairs[0][0] == env.reset(seed)
        assert [call for _, call in pairs] == env.expert_calls(seed)
    corrupted = [env.demonstration(s, random.Random(s), error_rate=1.0) for s in range(100)]
    assert sum(env.play(s, env.expert_calls(s))[0] != p for s, p in enumerate(corrupted)) >= 90
    for rate in (-0.1, 1.5):
        with pytest.raises(ValueError, match="error_rate"):
            env.demonstration(0, random.Random(0), error_rate=rate)
