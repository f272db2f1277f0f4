"""FrozenLake as text: the exact observation, gymnasium's transitions replayed side by side,
termination vs truncation, malformed actions (never raising), the expert against an independent
BFS, and the ceiling."""

from __future__ import annotations

import math
import random
from collections import deque

import gymnasium as gym
import pytest

from agentic_rl.envs import ENVS, FrozenLakeEnv, MultiTurnEnv, make_env
from agentic_rl.envs.frozenlake import ACTIONS

# gymnasium's 4x4 map, reference/stack.md §5
WIN_4X4 = ["down", "down", "right", "right", "down", "right"]


def shortest_path_length(desc) -> int | None:
    """BFS over the lake: moves that leave the grid are no moves, holes are closed, None if G is
    unreachable."""
    n_rows, n_cols = len(desc), len(desc[0])
    start = next((r, c) for r in range(n_rows) for c in range(n_cols) if desc[r][c] == "S")
    dist, queue = {start: 0}, deque([start])
    while queue:
        r, c = queue.popleft()
        if desc[r][c] == "G":
            return dist[(r, c)]
        for dr, dc in [(0, -1), (1, 0), (0, 1), (-1, 0)]:
            nxt = (min(max(r + dr, 0), n_rows - 1), min(max(c + dc, 0), n_cols - 1))
            if nxt not in dist and desc[nxt[0]][nxt[1]] != "H":
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    return None


def check_grid(obs: str, desc, state: int) -> None:
    """The observation is the lake word by word with P on gymnasium's state, then ``<action>``."""
    words = obs.split()
    assert words[-1] == "<action>"
    rows = " ".join(words[:-1]).split(" | ")
    assert len(rows) == len(desc)
    cells = [w for row in rows for w in row.split()]
    flat = "".join(desc)
    assert len(cells) == len(flat)
    assert cells.index("P") == state and cells.count("P") == 1
    assert all(w == t for i, (w, t) in enumerate(zip(cells, flat)) if i != state)


def test_reset_text_on_the_fixed_4x4_map():
    env = FrozenLakeEnv(map_name="4x4", random_map=False)
    assert isinstance(env, MultiTurnEnv) and env.name == "frozenlake"
    obs = env.reset(0)
    assert obs == "P F F F | F H F H | F F F H | H F F G <action>"
    assert env.render_text() == "P F F F | F H F H | F F F H | H F F G"
    assert FrozenLakeEnv(random_map=False).reset(0) == obs  # the default map is gymnasium's 4x4
    obs, reward, done, info = env.step("right")
    # the start tile shows once the agent left it
    assert obs == "S P F F | F H F H | F F F H | H F F G <action>"
    assert (reward, done) == (0.0, False)
    assert info == dict(terminated=False, truncated=False, format_ok=True, success=False, turn=1,
                        state=1)
    first_row = FrozenLakeEnv(map_name="8x8", random_map=False).reset(0).split()[:9]
    assert first_row == ["P"] + ["F"] * 7 + ["|"]


def test_random_maps_are_seeded():
    a, b = FrozenLakeEnv(), FrozenLakeEnv()
    assert a.reset(5) == b.reset(5) and a.desc == b.desc
    first = a.desc
    a.reset(6)
    assert a.reset(5) and a.desc == first
    maps = set()
    for seed in range(20):
        a.reset(seed)
        maps.add(a.desc)
        assert a.desc[0][0] == "S" and a.desc[-1][-1] == "G"
        assert shortest_path_length(a.desc) is not None
    assert len(maps) > 5
    env = FrozenLakeEnv(size=6, p_frozen=0.6)
    env.reset(1)
    assert len(env.desc) == 6 and all(len(row) == 6 for row in env.desc)


def test_winning_path_and_hole():
    env = FrozenLakeEnv(random_map=False)
    env.reset(0)
    for i, action in enumerate(WIN_4X4):
        obs, reward, done, info = env.step(action)
        if i < len(WIN_4X4) - 1:
            assert (reward, done, info["terminated"]) == (0.0, False, False)
            assert obs.endswith(" <action>")
    assert (obs, reward, done) == ("", 1.0, True)
    assert info == dict(terminated=True, truncated=False, format_ok=True, success=True, turn=6,
                        state=15)

    env.reset(0)
    env.step("down")
    obs, reward, done, info = env.step("right")  # state 5 is a hole
    assert (obs, reward, done) == ("", 0.0, True)
    assert info == dict(terminated=True, truncated=False, format_ok=True, success=False, turn=2,
                        state=5)


@pytest.mark.parametrize("slippery", [False, True])
def test_transitions_match_gymnasium(slippery):
    """Random actions on random lakes: state, reward and termination equal a separately built
    gymnasium env's."""
    rng = random.Random(0)
    for seed in range(12):
        size = 4 if seed % 2 else 5
        env = FrozenLakeEnv(size=size, is_slippery=slippery, p_frozen=0.75, max_turns=50)
        obs = env.reset(seed)
        ref = gym.make("FrozenLake-v1", desc=list(env.desc), is_slippery=slippery)
        state, _ = ref.reset(seed=seed)
        check_grid(obs, env.desc, state)
        done = False
        while not done:
            action = rng.randrange(4)
            obs, reward, done, info = env.step(ACTIONS[action])
            state, ref_reward, terminated, _, _ = ref.step(action)
            assert info["state"] == state and reward == float(ref_reward)
            assert info["terminated"] == terminated
            assert info["success"] == (terminated and "".join(env.desc)[state] == "G")
            assert done == (terminated or info["turn"] == 50)
            if not done:
                check_grid(obs, env.desc, state)


def test_truncation_is_not_termination():
    env = FrozenLakeEnv(random_map=False, max_turns=3)
    env.reset(0)
    for _ in range(2):
        assert env.step("left")[2] is False  # bumping into the wall: stays on the start tile
    obs, reward, done, info = env.step("left")
    # cut by the turn limit: the state still exists, so its observation comes back (for
    # bootstrapping)
    assert (obs, reward, done) == ("P F F F | F H F H | F F F H | H F F G <action>", 0.0, True)
    assert info["truncated"] is True and info["terminated"] is False
    assert info["turn"] == 3 and info["state"] == 0

    # the goal on the last allowed turn: terminated
    env = FrozenLakeEnv(random_map=False, max_turns=6)
    env.reset(0)
    for action in WIN_4X4:
        _, reward, done, info = env.step(action)
    assert done and reward == 1.0 and info["terminated"] is True and info["truncated"] is False

    # a hole on the last allowed turn: terminated
    env = FrozenLakeEnv(random_map=False, max_turns=2)
    env.reset(0)
    env.step("down")
    _, _, done, info = env.step("right")
    assert done and info["terminated"] is True and info["truncated"] is False


@pytest.mark.parametrize(
    "text",
    ["", "jump", "down down", "Down", "<action>", "down</action>", "\x00", "dow\x00n",
     "left" * 10_000, " " * 5000, None],
)
def test_malformed_actions_end_the_episode_with_a_penalty(text):
    env = FrozenLakeEnv(random_map=False, format_penalty=0.25)
    env.reset(0)
    env.step("right")
    obs, reward, done, info = env.step(text)
    assert (obs, reward, done) == ("", -0.25, True)
    assert info == dict(terminated=True, truncated=False, format_ok=False, success=False, turn=2,
                        state=1)
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("down")


def test_whitespace_around_a_valid_word_is_fine_and_stepping_after_done_raises():
    env = FrozenLakeEnv(random_map=False)
    env.reset(0)
    assert env.step("  down\n")[3]["state"] == 4
    env.reset(0)
    for action in WIN_4X4:
        env.step(action)
    with pytest.raises(RuntimeError, match="episode is over; call reset"):
        env.step("left")
    with pytest.raises(RuntimeError, match="episode is over"):
        env.expert_action()
    assert env.reset(0).startswith("P ")  # a reset starts over


def test_expert_takes_a_shortest_path_on_deterministic_lakes():
    env = FrozenLakeEnv(size=4, max_turns=8)
    solvable = 0
    for seed in range(50):
        env.reset(seed)
        bfs = shortest_path_length(env.desc)
        assert env.optimal_success_probability() == (1.0 if bfs <= 8 else 0.0)
        path = env.solve_from_start(seed)
        if bfs > 8:
            assert len(path) == 8  # it still heads for the goal, and the time limit ends it
            continue
        solvable += 1
        assert len(path) == bfs
        ref = gym.make("FrozenLake-v1", desc=list(env.desc), is_slippery=False)
        ref.reset(seed=seed)
        for action in path:
            state, reward, terminated, _, _ = ref.step(ACTIONS.index(action))
        assert (reward, terminated, "".join(env.desc)[state]) == (1, True, "G")
    assert solvable > 40

    # Ties between equally short routes go to the earlier word of left, down, right, up: on
    # gymnasium's 4x4 map both down and right start a 6-move route from S, so down; from state 9,
    # down (13) beats right (10).
    route = FrozenLakeEnv(random_map=False).solve_from_start(0)
    assert route == ["down", "down", "right", "down", "right", "right"]
    big = FrozenLakeEnv(map_name="8x8", random_map=False, max_turns=20)
    assert len(big.solve_from_start(0)) == shortest_path_length(big.desc) == 14
    env = FrozenLakeEnv(random_map=False, max_turns=6)
    env.reset(0)
    assert env.optimal_success_probability() == 1.0
    assert FrozenLakeEnv(random_map=False, max_turns=5).optimal_success_probability() == 0.0
    with pytest.raises(ValueError, match="is_slippery"):
        FrozenLakeEnv(is_slippery=True).solve_from_start(0)


def test_optimal_success_probability_matches_gymnasiums_stated_optimum():
    # gymnasium registers FrozenLake-v1 with max_episode_steps=100 and notes "optimum = 0.74".
    env = FrozenLakeEnv(random_map=False, is_slippery=True, max_turns=100)
    assert env.optimal_success_probability() == pytest.approx(0.74, abs=0.005)
    with pytest.raises(RuntimeError, match="reset"):
        FrozenLakeEnv().optimal_success_probability()  # a random lake exists only after reset


def test_expert_attains_the_optimum_on_a_slippery_lake():
    env = FrozenLakeEnv(random_map=False, is_slippery=True, max_turns=16)
    p = env.optimal_success_probability()
    n, wins = 2000, 0
    for seed in range(n):
        env.reset(seed)
        done = False
        while not done:
            _, reward, done, info = env.step(env.expert_action())
        wins += info["success"]
        assert reward == float(info["success"])
    assert 0.05 < p < 0.95
    assert abs(wins / n - p) < 3 * math.sqrt(p * (1 - p) / n)


def test_demonstrations():
    env = FrozenLakeEnv(max_turns=8)
    for seed in range(10):
        demo = env.demonstration(seed, random.Random(seed))
        assert [a for _, a in demo] == env.solve_from_start(seed)
        env.reset(seed)
        for obs, action in demo:  # the observations are the ones the env shows along the way
            assert obs == f"{env.render_text()} <action>"
            env.step(action)

        noisy = env.demonstration(seed, random.Random(seed), error_rate=1.0)
        assert noisy == env.demonstration(seed, random.Random(seed), error_rate=1.0)  # rng fixes it
        env.reset(seed)
        for obs, action in noisy:
            assert obs == f"{env.render_text()} <action>" and action in ACTIONS
            assert action != env.expert_action()
            env.step(action)
    with pytest.raises(ValueError, match="error_rate"):
        env.demonstration(0, random.Random(0), error_rate=1.5)


def test_vocabulary_covers_every_observation_and_action():
    vocab = set(FrozenLakeEnv().vocabulary())
    assert vocab == {"S", "F", "H", "G", "P", "|", "<action>", "</action>", "left", "down", "right",
                     "up"}
    rng, seen = random.Random(1), set()
    for slippery in (False, True):
        env = FrozenLakeEnv(size=5, is_slippery=slippery, max_turns=20)
        for seed in range(30):
            obs, done = env.reset(seed), False
            while not done:
                seen.update(obs.split())
                obs, _, done, _ = env.step(rng.choice(ACTIONS))
    assert {"S", "F", "H", "G", "P", "|", "<action>"} <= seen <= vocab


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(size=1), "size"),
        (dict(p_frozen=0.0), "p_frozen"),
        (dict(p_frozen=1.5), "p_frozen"),
        (dict(max_turns=0), "max_turns"),
        (dict(format_penalty=-0.1), "format_penalty"),
        (dict(map_name="5x5", random_map=False), "map_name"),
        (dict(map_name="8x8"), "map_name"),  # a named map needs random_map=False
    ],
)
def test_validation(kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        FrozenLakeEnv(**kwargs)


def test_registry():
    assert ENVS["frozenlake"] is FrozenLakeEnv
    env = make_env("frozenlake", size=5, max_turns=12)
    assert isinstance(env, FrozenLakeEnv) and env.max_turns == 12
    with pytest.raises(ValueError, match="frozenlake"):
        make_env("cartpole")
