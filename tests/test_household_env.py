"""The ALFWorld-style household environment of the GCD chapter: tasks, the exact expert, flawed
actions, the budget, the splits, and bad input."""

from __future__ import annotations

import random
from collections import deque

import pytest

from agentic_rl.envs import ENVS, HouseholdEnv, make_env
from agentic_rl.envs.household import (
    OBJECTS,
    PLACES,
    RECEPTACLES,
    START,
    counterfactual_goal,
    in_domain,
)
from agentic_rl.models import build_tokenizer


def _legal_actions(env):
    acts = ["look"] + [f"go to {p}" for p in PLACES]
    acts += [f"take {o} from {p}" for o in OBJECTS for p in PLACES]
    acts += [f"put {o} in {p}" for o in OBJECTS for p in PLACES]
    acts += [f"clean {o} with {p}" for o in OBJECTS for p in PLACES]
    return acts


def _snapshot(env):
    return (env.loc, env.held, tuple(sorted(env.where.items())), tuple(sorted(env.clean)))


def _restore(env, snap):
    env.loc, env.held, env.where, env.clean = snap[0], snap[1], dict(snap[2]), set(snap[3])


def _bfs_distance(env) -> int:
    """Shortest number of actions to the goal, by breadth-first search over every action."""
    start = _snapshot(env)
    seen, queue = {start}, deque([(start, 0)])
    try:
        while queue:
            snap, d = queue.popleft()
            _restore(env, snap)
            if env.goal_holds():
                return d
            for action in _legal_actions(env):
                _restore(env, snap)
                if env._apply(env._parse(action)):
                    nxt = _snapshot(env)
                    if nxt not in seen:
                        seen.add(nxt)
                        queue.append((nxt, d + 1))
        raise AssertionError("goal unreachable")
    finally:
        _restore(env, start)


def test_registered_and_the_tokenizer_covers_every_observation():
    assert ENVS["household"] is HouseholdEnv
    env = make_env("household", hint=True)
    tok = build_tokenizer(env.vocabulary())
    rng = random.Random(0)
    for seed in range(200):
        for obs, action in env.demonstration(seed, rng, error_rate=0.3):
            ids = tok(f"{obs} {action} </action>")["input_ids"]
            assert tok.unk_token_id not in ids, (obs, action)


@pytest.mark.parametrize("seed", range(12))
def test_the_expert_plan_is_optimal_from_every_state_it_meets(seed):
    env = HouseholdEnv(clean_fraction=0.5)
    env.reset(seed)
    rng = random.Random(seed)
    done = False
    while not done:  # also from the states a flawed teacher leads to
        assert env.distance() == _bfs_distance(env)
        action = env.flawed_action(rng) if rng.random() < 0.4 else env.expert_action()
        _, _, done, _ = env.step(action)


def test_the_expert_succeeds_in_exactly_its_plan_and_is_rewarded_once():
    env = HouseholdEnv()
    for seed in range(300):
        env.reset(seed)
        n = env.distance()
        assert n == (6 if env.task["kind"] == "clean" else 4) or n < 4  # plan length by kind
        rewards, done = [], False
        while not done:
            _, r, done, info = env.step(env.expert_action())
            rewards.append(r)
            assert info["kind"] == "good"
        assert len(rewards) == n and rewards[-1] == 1.0 and sum(rewards) == 1.0
        assert info["terminated"] and not info["truncated"] and info["success"]


def test_flawed_actions_keep_the_episode_going_and_cost_the_budget():
    env = HouseholdEnv(slack=2)
    rng = random.Random(1)
    for seed in range(100):
        env.reset(seed)
        budget = env.budget
        assert budget == env.distance() + 2
        turns, done = 0, False
        while not done:
            before = env.distance()
            _, r, done, info = env.step(env.flawed_action(rng))
            turns += 1
            assert info["kind"] == "flawed" and info["format_ok"] and r == 0.0
            assert env.distance() >= before
        assert turns == budget and info["truncated"] and not info["success"]


def test_a_wrong_put_costs_three_turns_a_useless_move_one():
    # going to the wrong receptacle and putting the object there: +3 turns (go, put, take back)
    for slack, expect in ((3, True), (2, False)):
        env = HouseholdEnv(slack=slack, clean_fraction=0.0, max_turns=9)
        env.reset(0)
        t = env.task
        wrong = next(r for r in RECEPTACLES if r != t["target"])
        script = [f"go to {t['where'][t['obj']]}", f"take {t['obj']} from {t['where'][t['obj']]}"]
        script += [f"go to {wrong}", f"put {t['obj']} in {wrong}"]
        kinds = []
        for action in script:
            kinds.append(env.step(action)[3]["kind"])
        assert kinds == ["good", "good", "flawed", "flawed"]
        done = False
        while not done:
            _, _, done, info = env.step(env.expert_action())
        assert info["success"] is expect
    env = HouseholdEnv(slack=1, clean_fraction=0.0)
    env.reset(0)
    assert env.step("look")[3]["kind"] == "flawed"
    done = False
    while not done:
        _, _, done, info = env.step(env.expert_action())
    assert info["success"]


def test_bad_input_never_raises_and_is_labelled():
    env = HouseholdEnv()
    obs = env.reset(3)
    t = env.task
    absent = next(o for o in OBJECTS if o not in t["where"])
    cases = {
        "": "malformed",
        "fly to moon": "malformed",
        "go to": "malformed",
        "go to garage": "malformed",
        "take": "malformed",
        "put mug in": "malformed",
        "look around": "malformed",
        f"take {absent} from {t['where'][t['obj']]}": "invalid",  # not here
        f"put {t['obj']} in {t['target']}": "invalid",  # not held
        f"clean {t['obj']} with {RECEPTACLES[0]}": "invalid",
    }
    for text, kind in cases.items():
        env.reset(3)
        obs, r, done, info = env.step(text)
        assert info["kind"] == kind, text
        assert info["format_ok"] is (kind != "malformed")
        assert obs.startswith("nothing happens . at middle . hold nothing") and not done
        assert r == 0.0 and env.loc == START and env.held is None
    env.reset(3)
    assert env.step(None)[3]["kind"] == "malformed"
    env.reset(3)
    for _ in range(env.budget - 1):
        env.step("look")
    obs, r, done, info = env.step("look")
    assert done and info["truncated"]
    obs, r, done, info = env.step("look")  # after the end: an answer, not an exception
    assert done and r == 0.0 and info["format_ok"] is False


def test_observations_of_two_tasks_differ_only_in_the_goal_after_the_first_turn():
    env = HouseholdEnv(clean_fraction=0.0)
    first = env.reset(5)
    t = env.task
    other = next(r for r in RECEPTACLES if r not in (t["target"], t["where"][t["obj"]]))
    b = counterfactual_goal(first, t, other)
    diff = [(x, y) for x, y in zip(first.split(), b.split()) if x != y]
    assert diff == [(t["target"], other)] and len(first.split()) == len(b.split())
    with pytest.raises(ValueError, match="goal"):
        counterfactual_goal("goal : put x in y . rest", t, other)


def test_splits_hold_different_pairs_of_the_same_words():
    pairs = [(o, r) for o in OBJECTS for r in RECEPTACLES]
    train = {p for p in pairs if in_domain(*p)}
    assert len(train) == 24
    assert {o for o, _ in train} == set(OBJECTS) and {r for _, r in train} == set(RECEPTACLES)
    for split, inside in (("train", True), ("ood", False)):
        env = HouseholdEnv(split=split)
        seen = set()
        for seed in range(400):
            t = env.make_task(seed)
            assert in_domain(t["obj"], t["target"]) is inside
            assert t["where"][t["obj"]] != t["target"]
            seen.add((t["obj"], t["target"]))
        assert len(seen) == 24
    # the same seed, the same task, in any instance
    assert HouseholdEnv().make_task(7) == HouseholdEnv().make_task(7)


def test_hint_names_every_receptacle_but_the_target():
    env = HouseholdEnv(hint=True)
    obs = env.reset(2)
    hint = obs.split("hint : avoid ")[1].split(" . ")[0].split()
    assert sorted(hint + [env.task["target"]]) == sorted(RECEPTACLES)


def test_clean_tasks_need_cleaning_and_put_tasks_do_not():
    env = HouseholdEnv(clean_fraction=1.0)
    env.reset(0)
    t = env.task
    src = t["where"][t["obj"]]
    for a in (f"go to {src}", f"take {t['obj']} from {src}", f"go to {t['target']}"):
        env.step(a)
    _, r, done, info = env.step(f"put {t['obj']} in {t['target']}")
    assert r == 0.0 and not done and info["kind"] == "flawed"  # placed, but not clean
    plain = HouseholdEnv(clean_fraction=0.0)
    plain.reset(0)
    assert "clean" not in plain.goal_text()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(split="test"), "split"),
        (dict(clean_fraction=2.0), "clean_fraction"),
        (dict(slack=-1), "slack"),
        (dict(slack=4, max_turns=8), "max_turns"),
    ],
)
def test_bad_constructor_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HouseholdEnv(**kwargs)


def test_error_rate_is_checked_and_one_gives_only_flawed_actions():
    env = HouseholdEnv()
    with pytest.raises(ValueError, match="error_rate"):
        env.demonstration(0, random.Random(0), error_rate=1.5)
    env.demonstration(0, random.Random(0), error_rate=1.0)
    assert set(env.kinds) == {"flawed"} and not env.success
