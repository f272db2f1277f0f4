"""RAGEN's rollout filters (uncertainty top-k / top-p, DAPO's nonzero-std criterion), the two-armed
bandit, and the several-actions-per-turn wrapper over FrozenLake and Sokoban.

Expected values are computed by hand in the tests. A group ``[-d, 0, d]`` has unbiased std exactly
``d`` (variance ``(d^2 + 0 + d^2) / 2``), which keeps the hand arithmetic exact.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentic_rl.envs.bandit import BanditEnv
from agentic_rl.envs.frozenlake import FrozenLakeEnv
from agentic_rl.envs.multiaction import MultiActionEnv
from agentic_rl.envs.sokoban import SokobanEnv
from agentic_rl.filters import filter_metrics, group_std, nonzero_std_filter, reward_std_filter


def spread_groups(stds_by_id: dict[int, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rollouts ``[-d, 0, d]`` (std ``d``) per group id, in the dict's order."""
    scores, ids = [], []
    for gid, d in stds_by_id.items():
        scores += [-d, 0.0, d]
        ids += [gid] * 3
    return torch.tensor(scores), torch.tensor(ids)


def kept_ids(keep: torch.Tensor, group_ids: torch.Tensor) -> set[int]:
    """The group ids whose rows are kept; asserts that groups are kept or dropped whole."""
    out = set()
    for gid in group_ids.unique().tolist():
        rows = keep[group_ids == gid]
        assert rows.all() or not rows.any(), f"group {gid} split by the filter"
        if rows.all():
            out.add(gid)
    return out


# ---------------------------------------------------------------------------------- group_std
def test_group_std_unbiased_and_group_of_one():
    # group 0: [1, 3] -> mean 2, sum of squares 2, /(n-1)=2 -> std sqrt(2)
    # group 1: [5] alone -> 0; group 2: [2, 4, 6] -> sum sq 8, /2 = 4 -> std 2
    scores = torch.tensor([1.0, 3.0, 5.0, 2.0, 4.0, 6.0])
    ids = torch.tensor([0, 0, 1, 2, 2, 2])
    std, index = group_std(scores, ids)
    assert torch.allclose(std, torch.tensor([math.sqrt(2.0), 0.0, 2.0]))
    assert index.tolist() == [0, 0, 1, 2, 2, 2]


def test_group_std_unsorted_noncontiguous_ids():
    # ids [7, 3, 7, 3]: groups ordered by id -> 3 first ([10, 14]: std 2*sqrt(2)), 7 second
    # ([1, 2]: std sqrt(0.5)).
    scores = torch.tensor([1.0, 10.0, 2.0, 14.0])
    std, index = group_std(scores, torch.tensor([7, 3, 7, 3]))
    assert torch.allclose(std, torch.tensor([2 * math.sqrt(2.0), math.sqrt(0.5)]))
    assert index.tolist() == [1, 0, 1, 0]


def test_group_std_integer_scores():
    std, _ = group_std(torch.tensor([0, 2, 4]), torch.tensor([1, 1, 1]))
    assert std.dtype.is_floating_point
    assert torch.allclose(std, torch.tensor([2.0]))


def test_group_std_matches_torch_std_on_random_groups():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6, (40,), generator=gen) * 5 + 2  # non-contiguous ids 2, 7, ...
    scores = torch.randn(40, generator=gen)
    std, index = group_std(scores, ids)
    for pos, gid in enumerate(ids.unique().tolist()):
        rows = scores[ids == gid]
        expected = rows.std() if len(rows) > 1 else torch.tensor(0.0)
        assert torch.allclose(std[pos], expected, atol=1e-6)
        assert (index[ids == gid] == pos).all()


# ---------------------------------------------------------------------------------- top_k
def test_top_k_ragen_case_keeps_two_of_eight_highest_std_groups():
    # 8 groups of 3 rollouts; group ids scrambled; the two largest stds are ids 5 (8.0) and 2 (7.0)
    stds = {0: 1.0, 1: 3.0, 2: 7.0, 3: 0.5, 4: 2.0, 5: 8.0, 6: 4.0, 7: 0.0}
    scores, ids = spread_groups(stds)
    keep = reward_std_filter(scores, ids, strategy="top_k", value=0.25)
    assert keep.dtype == torch.bool and keep.shape == scores.shape
    assert kept_ids(keep, ids) == {5, 2}
    assert int(keep.sum()) == 6  # whole groups: 2 groups x 3 rollouts


def test_top_k_int_truncates():
    stds = {0: 1.0, 1: 3.0, 2: 7.0, 3: 0.5, 4: 2.0, 5: 8.0, 6: 4.0, 7: 6.0}
    scores, ids = spread_groups(stds)
    # 0.3 * 8 = 2.4 -> 2 groups; 0.49 * 8 = 3.92 -> 3 groups (not rounded to 4)
    assert kept_ids(reward_std_filter(scores, ids, value=0.3), ids) == {5, 2}
    assert kept_ids(reward_std_filter(scores, ids, value=0.49), ids) == {5, 2, 7}
    assert kept_ids(reward_std_filter(scores, ids, value=1.0), ids) == set(range(8))


def test_top_k_keeps_at_least_one_group():
    scores, ids = spread_groups({10: 1.0, 20: 2.0})
    # int(0.25 * 2) = 0 -> max(1, 0) = 1: the higher-std group, id 20
    assert kept_ids(reward_std_filter(scores, ids, value=0.25), ids) == {20}


def test_top_k_ties_break_toward_lower_group_id():
    # all four groups have std 1, ids given in scrambled order: 0.5 * 4 = 2 -> ids 3 and 5
    scores, ids = spread_groups({9: 1.0, 5: 1.0, 7: 1.0, 3: 1.0})
    assert kept_ids(reward_std_filter(scores, ids, value=0.5), ids) == {3, 5}


def test_top_k_include_zero():
    # one group with spread (id 4), three with all-equal rewards
    scores = torch.tensor([1.0, 1.0, 0.0, 2.0, 5.0, 5.0, 0.0, 0.0])
    ids = torch.tensor([6, 6, 4, 4, 1, 1, 2, 2])
    # k = int(0.5 * 4) = 2: the spread group and, by tie-breaking, the zero group with lowest id (1)
    keep = reward_std_filter(scores, ids, value=0.5, include_zero=True)
    assert kept_ids(keep, ids) == {4, 1}
    keep = reward_std_filter(scores, ids, value=0.5, include_zero=False)
    assert kept_ids(keep, ids) == {4}
    assert keep.tolist() == [False, False, True, True, False, False, False, False]


def test_top_k_counts_all_groups_when_zero_std_groups_are_dropped():
    # 8 groups, 4 with spread: k = int(0.5 * 8) = 4 (all groups count), so all 4 spread groups stay
    scores, ids = spread_groups({0: 0.0, 1: 4.0, 2: 0.0, 3: 1.0, 4: 0.0, 5: 3.0, 6: 0.0, 7: 2.0})
    keep = reward_std_filter(scores, ids, value=0.5, include_zero=False)
    assert kept_ids(keep, ids) == {1, 3, 5, 7}


def test_top_k_no_spread():
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 3.0])
    ids = torch.tensor([2, 2, 0, 0, 1])
    keep = reward_std_filter(scores, ids, value=0.5, include_zero=False)
    assert keep.tolist() == [False] * 5
    # include_zero=True: k = max(1, int(1.5)) = 1 -> the lowest id, group 0
    keep = reward_std_filter(scores, ids, value=0.5, include_zero=True)
    assert keep.tolist() == [False, False, True, True, False]


# ---------------------------------------------------------------------------------- top_p
# stds by id: 3 -> 3.0, 1 -> 2.0, 0 -> 1.0, 2 -> 0.0; total 6.0, ranking 3, 1, 0, 2
TOP_P = {2: 0.0, 0: 1.0, 3: 3.0, 1: 2.0}


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.5, {3}),  # target 3 - 0.01: the first group (3) reaches it
        (0.8, {3, 1}),  # target 4.79: 3 < 4.79 <= 5
        (0.9, {3, 1, 0}),  # target 5.39: 5 < 5.39 <= 6
        (1.0, {3, 1, 0}),  # target 5.99: reached at 6 without the zero-std group
        (0.1, {3}),
    ],
)
def test_top_p_linear(value, expected):
    scores, ids = spread_groups(TOP_P)
    assert kept_ids(reward_std_filter(scores, ids, strategy="top_p", value=value), ids) == expected


def test_top_p_eps_tolerance():
    # stds 1, 1, 0.015 (total 2.015); value 0.5 -> target 1.0075 - eps
    scores, ids = spread_groups({0: 1.0, 1: 1.0, 2: 0.015})
    # eps 0.01: 1.0 >= 0.9975 -> one group (id 0 by tie-breaking)
    assert kept_ids(reward_std_filter(scores, ids, strategy="top_p", value=0.5), ids) == {0}
    # eps 0: 1.0 < 1.0075 -> two groups
    keep = reward_std_filter(scores, ids, strategy="top_p", value=0.5, eps=0.0)
    assert kept_ids(keep, ids) == {0, 1}


def test_top_p_no_spread_keeps_nothing():
    scores = torch.tensor([2.0, 2.0, 0.0, 0.0])
    ids = torch.tensor([0, 0, 1, 1])
    for include_zero in (True, False):
        keep = reward_std_filter(
            scores, ids, strategy="top_p", value=0.5, include_zero=include_zero
        )
        assert keep.tolist() == [False] * 4


@pytest.mark.parametrize(
    "kwargs",
    [
        {"strategy": "top_q"},
        {"value": 0.0},
        {"value": 1.5},
        {"value": -0.25},
        {"strategy": "top_p", "value": 0.0},
    ],
)
def test_reward_std_filter_bad_arguments(kwargs):
    scores, ids = spread_groups({0: 1.0, 1: 2.0})
    with pytest.raises(ValueError):
        reward_std_filter(scores, ids, **kwargs)


def test_reward_std_filter_bad_shapes():
    with pytest.raises(ValueError):
        reward_std_filter(torch.zeros(4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError):
        reward_std_filter(torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.long))


# ---------------------------------------------------------------------------------- dapo, metrics
def test_nonzero_std_filter():
    # id 5: [1, 1] equal -> dropped; id 2: [0, 1] -> kept; id 9: single rollout -> std 0, dropped
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.7])
    ids = torch.tensor([5, 2, 5, 2, 9])
    assert nonzero_std_filter(scores, ids).tolist() == [False, True, False, True, False]


def test_filter_metrics():
    # stds by id: 0 -> 3, 1 -> 1, 2 -> 0; mean over all groups 4/3
    scores, ids = spread_groups({0: 3.0, 1: 1.0, 2: 0.0})
    keep = ids == 0
    m = filter_metrics(scores, ids, keep)
    assert m["in_group_std"] == pytest.approx(4 / 3)
    assert m["chosen_in_group_std"] == pytest.approx(3.0)
    assert m["kept_groups"] == pytest.approx(1 / 3)
    m = filter_metrics(scores, ids, (ids == 1) | (ids == 2))
    assert m["chosen_in_group_std"] == pytest.approx(0.5)  # (1 + 0) / 2
    assert m["kept_groups"] == pytest.approx(2 / 3)


def test_filter_metrics_nothing_kept():
    scores, ids = spread_groups({0: 3.0, 1: 1.0})
    m = filter_metrics(scores, ids, torch.zeros(6, dtype=torch.bool))
    assert m == {"in_group_std": pytest.approx(2.0), "chosen_in_group_std": 0.0, "kept_groups": 0.0}


# ---------------------------------------------------------------------------------- bandit
ORDERS = {"arms dragon phoenix <action>", "arms phoenix dragon <action>"}


def test_bandit_observation_order_per_seed():
    env = BanditEnv()
    seen = set()
    for seed in range(40):
        obs = env.reset(seed)
        assert obs in ORDERS
        assert env.reset(seed) == obs  # deterministic per seed
        seen.add(obs)
    assert seen == ORDERS  # both orders appear


@pytest.mark.parametrize("payoffs, low", [("paper", 0.15), ("code", 0.1)])
def test_bandit_phoenix_payoff(payoffs, low):
    env = BanditEnv(payoffs=payoffs)
    for seed in range(5):
        env.reset(seed)
        obs, reward, done, info = env.step("phoenix")
        assert (obs, done) == ("", True)
        assert reward == pytest.approx(low)
        assert info["format_ok"] is True and info["success"] is False
        assert info["terminated"] is True and info["truncated"] is False
    assert env.expected_payoff("phoenix") == pytest.approx(low)
    assert env.expected_payoff("dragon") == pytest.approx(0.25)


def test_bandit_dragon_pays_one_a_quarter_of_the_time():
    env = BanditEnv()
    n = 4000
    rewards = []
    for seed in range(n):
        env.reset(seed)
        _, reward, done, info = env.step(" dragon\n")  # surrounding whitespace is fine
        assert reward in (0.0, 1.0) and done
        assert info["success"] is True and info["format_ok"] is True
        rewards.append(reward)
    rate = sum(rewards) / n
    binomial_std = math.sqrt(0.25 * 0.75 / n)  # about 0.0068
    assert abs(rate - 0.25) < 4 * binomial_std
    # the coin is fixed by the seed
    env.reset(7)
    first = env.step("dragon")[1]
    env.reset(7)
    assert env.step("dragon")[1] == first


@pytest.mark.parametrize("bad", ["", "Dragon", "dragon phoenix", "arms", None, 3])
def test_bandit_malformed_answer(bad):
    env = BanditEnv(format_penalty=0.3)
    env.reset(0)
    obs, reward, done, info = env.step(bad)
    assert (obs, reward, done) == ("", -0.3, True)
    assert info["format_ok"] is False and info["success"] is False
    with pytest.raises(RuntimeError):
        env.step("dragon")


def test_bandit_step_protocol_and_arguments():
    env = BanditEnv()
    with pytest.raises(RuntimeError):
        env.step("dragon")  # no reset yet
    env.reset(1)
    assert env.expert_action() == "dragon"
    env.step("dragon")
    with pytest.raises(RuntimeError):
        env.step("dragon")
    with pytest.raises(RuntimeError):
        env.expert_action()
    with pytest.raises(ValueError):
        BanditEnv(payoffs="book")
    with pytest.raises(ValueError):
        BanditEnv(format_penalty=-0.1)
    with pytest.raises(ValueError):
        env.demonstration(0, random.Random(0), error_rate=1.5)
    assert {"arms", "phoenix", "dragon", "<action>", "</action>"} <= set(env.vocabulary())


def test_bandit_demonstration():
    env = BanditEnv()
    for seed in range(6):
        first = env.reset(seed)
        assert env.demonstration(seed, random.Random(seed), error_rate=0.0) == [(first, "dragon")]
        assert env.demonstration(seed, random.Random(seed), error_rate=1.0) == [(first, "phoenix")]


# ---------------------------------------------------------------------------------- multi-action
# gymnasium's fixed 4x4 map: SFFF / FHFH / FFFH / HFFG, the agent starting top left
START = "P F F F | F H F H | F F F H | H F F G <action>"


def lake(*, max_turns=5, max_actions_per_turn=5, max_actions=10, format_penalty=0.1):
    inner = FrozenLakeEnv(
        random_map=False, map_name="4x4", is_slippery=False, max_turns=max_actions
    )
    env = MultiActionEnv(
        inner,
        max_turns=max_turns,
        max_actions_per_turn=max_actions_per_turn,
        max_actions=max_actions,
        format_penalty=format_penalty,
    )
    assert env.reset(0) == START
    return env


# the player, the box two cells to its right, the target two cells further
CORRIDOR = ["#######", "#P_X_O#", "#######"]


def corridor():
    env = MultiActionEnv(SokobanEnv(max_turns=10), max_turns=5, max_actions=10)
    env.reset(0)  # resets the wrapper's counters (the inner env draws a level, replaced below)
    assert (
        env.inner.load_level(CORRIDOR) == "# # # # # # # | # P _ X _ O # | # # # # # # # <action>"
    )
    return env


def test_two_actions_in_one_turn_frozenlake():
    env = lake()
    obs, reward, done, info = env.step("right || right")
    assert obs == "S F P F | F H F H | F F F H | H F F G <action>"
    assert (reward, done) == (0.0, False)
    assert info["actions"] == 2 and info["actions_total"] == 2 and info["turn"] == 1
    assert info["format_ok"] is True
    assert info["terminated"] is False and info["truncated"] is False


def test_frozenlake_goal_mid_turn_ignores_the_rest():
    env = lake(max_actions_per_turn=8)
    # shortest path: down down right right down right (6 moves); "left" after the goal is ignored
    obs, reward, done, info = env.step("down || down || right || right || down || right || left")
    assert (obs, reward, done) == ("", 1.0, True)
    assert info["success"] is True and info["terminated"] is True and info["truncated"] is False
    assert info["actions"] == 6


def test_frozenlake_hole_terminates_with_empty_observation():
    env = lake()
    obs, reward, done, info = env.step("right || down || right")  # (0,1) then the hole at (1,1)
    assert (obs, reward, done) == ("", 0.0, True)
    assert info["terminated"] is True and info["success"] is False and info["truncated"] is False
    assert info["actions"] == 2
    with pytest.raises(RuntimeError):
        env.step("right")


def test_sokoban_turn_reward_is_the_sum():
    env = corridor()
    obs, reward, done, info = env.step("right || right")  # walk, then push: two steps of -0.1
    assert obs == "# # # # # # # | # _ _ P X O # | # # # # # # # <action>"
    assert reward == pytest.approx(-0.2)
    assert done is False and info["actions"] == 2


def test_sokoban_solving_turn_stops_mid_turn():
    env = corridor()
    # -0.1 (walk) - 0.1 (push) + 10.9 (push onto the target); the final "left" never runs
    obs, reward, done, info = env.step("right || right || right || left")
    assert obs == ""
    assert reward == pytest.approx(10.7)
    assert done is True and info["terminated"] is True and info["truncated"] is False
    assert info["success"] is True and info["actions"] == 3 and info["actions_total"] == 3


def test_invalid_piece_costs_the_penalty_and_the_episode_goes_on():
    env = lake(format_penalty=0.25)
    obs, reward, done, info = env.step("right || jump")
    assert obs == "S P F F | F H F H | F F F H | H F F G <action>"  # the valid "right" ran
    assert (reward, done) == (-0.25, False)
    assert info["format_ok"] is False and info["actions"] == 1
    # the next turn is clean again
    obs, reward, done, info = env.step("right")
    assert obs == "S F P F | F H F H | F F F H | H F F G <action>"
    assert reward == 0.0 and info["format_ok"] is True


def test_sokoban_invalid_piece_with_the_penalty():
    env = corridor()
    obs, reward, done, info = env.step("Right || right")  # case-sensitive: "Right" is invalid
    assert obs == "# # # # # # # | # _ P X _ O # | # # # # # # # <action>"
    assert reward == pytest.approx(-0.2)  # -0.1 penalty, -0.1 for the step
    assert done is False and info["format_ok"] is False


@pytest.mark.parametrize("text", ["", "jump", "jump || fly", " || ", None, 3])
def test_turn_without_valid_action_leaves_the_state(text):
    env = lake()
    env.step("down")
    after_down = "S F F F | P H F H | F F F H | H F F G <action>"
    obs, reward, done, info = env.step(text)
    assert obs == after_down
    assert (reward, done) == (-0.1, False)
    assert info["format_ok"] is False and info["actions"] == 0 and info["actions_total"] == 1


def test_only_the_first_pieces_count():
    env = lake(max_actions_per_turn=2)
    obs, _, _, info = env.step("right || right || right")
    assert obs == "S F P F | F H F H | F F F H | H F F G <action>"
    assert info["actions"] == 2 and info["format_ok"] is True
    # an invalid third piece is beyond the limit: it does not count either
    env = lake(max_actions_per_turn=2)
    _, reward, _, info = env.step("right || right || jump")
    assert reward == 0.0 and info["format_ok"] is True and info["actions"] == 2


def test_parse():
    env = lake(max_actions_per_turn=3)
    assert env.parse("right ||  down||") == (["right", "down"], True)
    assert env.parse("right || jump") == (["right"], False)
    assert env.parse("a || b || c || right") == ([], False)  # "right" is the fourth piece
    assert env.parse(None) == ([], False)
    assert env.parse(3) == ([], False)
    assert env.parse(["right"]) == ([], False)


def test_action_budget_truncates():
    env = lake(max_turns=5, max_actions=3)
    obs, reward, done, info = env.step("right || left || right || right")  # only 3 run
    assert obs == "S P F F | F H F H | F F F H | H F F G <action>"
    assert (reward, done) == (0.0, True)
    assert info["truncated"] is True and info["terminated"] is False
    assert info["actions"] == 3 and info["actions_total"] == 3
    with pytest.raises(RuntimeError):
        env.step("right")


def test_action_budget_across_turns():
    env = lake(max_turns=5, max_actions=3)
    _, _, done, _ = env.step("right || left")
    assert done is False
    obs, _, done, info = env.step("down || down")  # one action left in the budget
    assert obs == "S F F F | P H F H | F F F H | H F F G <action>"
    assert done is True and info["truncated"] is True and info["terminated"] is False
    assert info["actions"] == 1 and info["actions_total"] == 3 and info["turn"] == 2


def test_max_turns_truncates():
    env = lake(max_turns=2, max_actions=10)
    assert env.step("right")[2] is False
    obs, _, done, info = env.step("left")
    assert obs == START
    assert done is True and info["truncated"] is True and info["terminated"] is False
    assert info["turn"] == 2 and info["actions_total"] == 2


def test_max_turns_truncates_a_turn_without_valid_action():
    env = lake(max_turns=1)
    obs, reward, done, info = env.step("jump")
    assert obs == START and reward == -0.1
    assert done is True and info["truncated"] is True and info["terminated"] is False


def test_constructor_checks():
    inner = FrozenLakeEnv(random_map=False, map_name="4x4", max_turns=8)
    with pytest.raises(ValueError):
        MultiActionEnv(inner, max_actions=10)  # inner max_turns 8 != 10
    MultiActionEnv(inner, max_actions=8)
    for bad in ({"max_turns": 0}, {"max_actions_per_turn": 0}, {"format_penalty": -1.0}):
        with pytest.raises(ValueError):
            MultiActionEnv(inner, max_actions=8, **bad)


def test_vocabulary_and_expert():
    env = lake()
    vocab = env.vocabulary()
    assert "||" in vocab
    assert {"left", "down", "right", "up", "<action>", "P", "H"} <= set(vocab)
    assert len(vocab) == len(set(vocab))
    assert env.expert_action() == "down"  # shortest path on the fixed map starts down (or right)


def test_demonstration_reaches_the_goal_on_random_lakes():
    """Every turn names 1..3 action words joined by " || "; replaying the turns through ``step``
    sees the same observations and ends in success (10 turns x >= 1 action >= the shortest path)."""
    per_turn = 3
    for seed in range(12):
        env = MultiActionEnv(
            FrozenLakeEnv(size=4, max_turns=10),
            max_turns=10,
            max_actions_per_turn=per_turn,
            max_actions=10,
        )
        pairs = env.demonstration(seed, random.Random(seed), error_rate=0.0)
        assert pairs
        for _, text in pairs:
            words = text.split(" || ")
            assert 1 <= len(words) <= per_turn
            assert all(w in ("left", "down", "right", "up") for w in words)
        obs = env.reset(seed)
        for i, (expected_obs, text) in enumerate(pairs):
            assert obs == expected_obs
            obs, reward, done, info = env.step(text)
            assert info["format_ok"] is True
            assert done is (i == len(pairs) - 1)
        assert info["success"] is True and reward == 1.0 and obs == ""


def test_demonstration_bad_error_rate():
    with pytest.raises(ValueError):
        lake().demonstration(0, random.Random(0), error_rate=-0.1)
