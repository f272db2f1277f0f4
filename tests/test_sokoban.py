"""Sokoban as text: the reward table on hand-built levels, pushes against walls, malformed actions
(dropped, never raising), truncation, seeded generation, the BFS expert and deadlocks."""

from __future__ import annotations

import random

import pytest

from agentic_rl.envs import MultiTurnEnv
from agentic_rl.envs.sokoban import ACTIONS, TILES, SokobanEnv, solve

# The box two cells above the target, the player above the box: "down" twice solves it.
LINE = ["######", "#_P__#", "#_X__#", "#____#", "#_O__#", "######"]


def grid(obs: str) -> list[list[str]]:
    """The observation's cells, row by row (the trailing ``<action>`` checked and dropped)."""
    words = obs.split()
    assert words[-1] == "<action>"
    return [row.split() for row in " ".join(words[:-1]).split(" | ")]


def test_observation_text_and_protocol():
    env = SokobanEnv()
    assert isinstance(env, MultiTurnEnv) and env.name == "sokoban"
    obs = env.load_level(LINE)
    rows = [
        "# # # # # #",
        "# _ P _ _ #",
        "# _ X _ _ #",
        "# _ _ _ _ #",
        "# _ O _ _ #",
        "# # # # # #",
    ]
    assert obs == " | ".join(rows) + " <action>"
    assert env.render_text() + " <action>" == obs
    assert (env.player, env.box, env.target) == ((1, 2), (2, 2), (4, 2))
    assert env.solution() == ["down", "down"] and env.expert_action() == "down"
    with pytest.raises(RuntimeError, match="reset"):
        SokobanEnv().render_text()
    with pytest.raises(RuntimeError, match="episode is over"):
        SokobanEnv().step("up")


def test_reward_table():
    env = SokobanEnv()
    env.load_level(LINE)
    obs, reward, done, info = env.step("down")  # a push, not yet on the target
    assert (reward, done) == (-0.1, False)
    assert grid(obs)[2][2] == "P" and grid(obs)[3][2] == "X"
    assert info == {
        "terminated": False,
        "truncated": False,
        "format_ok": True,
        "success": False,
        "turn": 1,
        "deadlock": False,
    }
    obs, reward, done, info = env.step("down")  # the box onto the target: -0.1 + 1 + 10
    assert (obs, reward, done) == ("", 10.9, True)
    assert info["terminated"] and info["success"] and not info["truncated"] and not info["deadlock"]
    with pytest.raises(RuntimeError, match="episode is over; call reset"):
        env.step("down")

    obs = env.load_level(["######", "#_P__#", "#_√__#", "#____#", "######"])  # starts solved
    assert grid(obs)[2][2] == "√" and env.solution() == []
    obs, reward, done, info = env.step("down")  # the box off the target: -0.1 - 1
    assert (reward, done, info["success"]) == (-1.1, False, False)
    assert grid(obs)[2][2] == "S" and grid(obs)[3][2] == "X"
    obs, reward, done, info = env.step("up")  # the player leaves the target: no push, no change
    assert (reward, done) == (-0.1, False) and grid(obs)[2][2] == "O"
    env.load_level(["######", "#_P__#", "#_√__#", "#____#", "######"])
    assert env.step("right")[1:3] == (9.9, True)  # gym-sokoban: +10 whenever the box ends on it


def test_walls_stop_the_player_and_the_box():
    env = SokobanEnv()
    env.load_level(LINE)
    before = env.render_text()
    _obs, reward, done, info = env.step("up")  # a wall bump: the step costs, nothing moves
    assert (reward, done, info["format_ok"]) == (-0.1, False, True) and env.render_text() == before
    # the box against the border: pushing it into the wall (out of the room) moves nothing
    env.load_level(["######", "#_X__#", "#_P__#", "#___O#", "######"])
    assert env.box == (1, 2)
    env.step("up")
    assert env.box == (1, 2) and env.player == (2, 2)
    env.load_level(["######", "#____#", "#XP__#", "#___O#", "######"])
    env.step("left")
    assert env.box == (2, 1) and env.player == (2, 2)
    # the box against an interior wall
    env.load_level(["######", "#_#__#", "#_X__#", "#_P_O#", "######"])
    env.step("up")
    assert env.box == (2, 2) and env.player == (3, 2)


@pytest.mark.parametrize(
    "text", ["", "  ", "Up", "UP", "up up", "up.", "<action>", "</action>", None, 123, ["up"]]
)
def test_malformed_actions_are_dropped_with_a_penalty(text):
    env = SokobanEnv(format_penalty=0.25)
    obs0 = env.load_level(LINE)
    obs, reward, done, info = env.step(text)
    assert (obs, reward, done) == (obs0, -0.25, False)
    assert info == {
        "terminated": False,
        "truncated": False,
        "format_ok": False,
        "success": False,
        "turn": 1,
        "deadlock": False,
    }
    _, _, done, info2 = env.step(" down\n")  # whitespace around the word is fine
    assert not done and info2 == {**info, "format_ok": True, "turn": 2}


def test_truncation_keeps_the_final_observation():
    env = SokobanEnv(max_turns=3)
    env.load_level(LINE)
    env.step("left")
    env.step("nonsense")
    obs, reward, done, info = env.step("right")
    assert done and info["truncated"] and not info["terminated"] and not info["success"]
    assert obs == env.render_text() + " <action>" and grid(obs)[1][2] == "P" and info["turn"] == 3
    env.load_level(LINE)
    env.step("left")
    env.step("left")
    assert env.step("?")[1:3] == (-0.1, True)  # a malformed last action truncates too
    env = SokobanEnv(max_turns=2)  # solved on the last turn: terminated, not truncated
    env.load_level(LINE)
    env.step("down")
    obs, reward, done, info = env.step("down")
    assert (obs, reward, done) == ("", 10.9, True)
    assert info["terminated"] and not info["truncated"]


def test_levels_are_seeded_and_varied():
    a, b = SokobanEnv(), SokobanEnv()
    assert a.reset(5) == b.reset(5)
    first = a.reset(5)
    a.reset(6)
    assert a.reset(5) == first
    levels = {a.reset(seed) for seed in range(50)}
    assert len(levels) > 40
    env = SokobanEnv(size=7, wall_probability=0.3)
    cells = grid(env.reset(3))
    assert len(cells) == 7 and all(len(row) == 7 for row in cells)
    assert all(word == "#" for word in cells[0] + cells[-1] + [row[0] for row in cells])


@pytest.mark.parametrize(
    "kwargs", [{}, {"wall_probability": 0.2}, {"size": 5, "max_solution_length": 4}]
)
def test_every_level_is_solved_by_the_expert(kwargs):
    env = SokobanEnv(**kwargs)
    bound = min(env.max_solution_length, env.max_turns)
    for seed in range(300):
        obs = env.reset(seed)
        assert env.box != env.target and 1 <= len(env.solution()) <= bound
        assert obs.split().count("X") == 1 and obs.split().count("O") + obs.split().count("S") == 1
        for _ in range(bound):
            obs, reward, done, info = env.step(env.expert_action())
            if done:
                break
        assert info["success"] and info["terminated"] and reward == 10.9, seed
        assert info["turn"] <= bound


def test_solver_and_deadlock():
    walls = {(r, c) for r in range(5) for c in range(5) if r in (0, 4) or c in (0, 4)}
    assert solve(walls, (2, 2), (2, 3), (2, 1)) == ["right"]
    assert solve(walls, (2, 3), (2, 3), (2, 1)) == []
    assert solve(walls, (1, 1), (3, 3), (2, 2)) is None  # the box in a corner
    assert solve(walls, (1, 2), (3, 2), (2, 2)) is None  # against a wall, the target off its line
    assert solve(walls, (2, 2), (1, 2), (2, 3), max_moves=2) is None  # needs 3 moves
    assert len(solve(walls, (2, 2), (1, 2), (2, 3))) == 3

    env = SokobanEnv()
    env.load_level(["######", "#_XPO#", "#____#", "#____#", "#____#", "######"])
    assert len(env.solution()) == 6  # walk round the box, then push it right twice
    obs, reward, done, info = env.step("left")  # the box into the corner
    assert grid(obs)[1][1] == "X" and (reward, done) == (-0.1, False)
    assert info["deadlock"] and env.solution() is None
    assert env.expert_action() == "up"  # the documented fallback
    for _ in range(env.max_turns - 2):
        obs, reward, done, info = env.step(env.expert_action())  # the episode goes on
    assert not done and info["deadlock"]
    obs, reward, done, info = env.step("down")
    assert done and info["truncated"] and info["deadlock"]  # until the turn limit
    env.load_level(["######", "#____#", "#_X__#", "#_P__#", "#O___#", "######"])
    assert env.solution() is not None
    obs, reward, done, info = env.step("up")  # the box into the top row: the target is below
    assert grid(obs)[1][2] == "X" and info["deadlock"] and not done


def test_demonstrations():
    env = SokobanEnv()
    pairs = env.demonstration(0, random.Random(0))
    assert 1 <= len(pairs) <= env.max_solution_length
    assert all(obs.endswith("<action>") and action in ACTIONS for obs, action in pairs)
    assert pairs[0][0] == SokobanEnv().reset(0)
    assert env.box == env.target
    noisy = [env.demonstration(seed, random.Random(seed), error_rate=0.5) for seed in range(20)]
    assert all(1 <= len(p) <= env.max_turns for p in noisy)
    with pytest.raises(ValueError, match="error_rate"):
        env.demonstration(0, random.Random(0), error_rate=1.5)


def test_vocabulary_covers_every_observation_and_action():
    env = SokobanEnv(wall_probability=0.2)
    vocab = set(env.vocabulary())
    assert set(TILES) | set(ACTIONS) | {"|", "<action>", "</action>"} == vocab
    seen = set()
    for seed in range(100):
        for obs, action in env.demonstration(seed, random.Random(seed), error_rate=0.3):
            seen.update(obs.split())
            seen.add(action)
    assert seen <= vocab and {"#", "_", "O", "X", "P"} <= seen


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        ({"size": 4}, "size"),
        ({"size": 6.0}, "size"),
        ({"max_turns": 0}, "max_turns"),
        ({"format_penalty": -0.1}, "format_penalty"),
        ({"max_solution_length": 0}, "max_solution_length"),
        ({"wall_probability": 1.0}, "wall_probability"),
        ({"wall_probability": -0.1}, "wall_probability"),
    ],
)
def test_validation(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        SokobanEnv(**kwargs)


@pytest.mark.parametrize(
    "rows",
    [
        [],
        ["#####", "#P_O#", "#####"],  # no box
        ["#####", "#PXO#", "#_X_#", "#####"],  # two boxes
        ["#####", "#PXO_", "#####"],  # a gap in the border
        ["#####", "#PXO#", "####"],  # not a rectangle
        ["#####", "#PXa#", "#####"],  # an unknown tile
    ],
)
def test_load_level_validation(rows):
    with pytest.raises(ValueError, match="rows"):
        SokobanEnv().load_level(rows)
