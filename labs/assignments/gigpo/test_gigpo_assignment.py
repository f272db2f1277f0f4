"""Autograder for the GiGPO assignment: ``pytest labs/assignments/gigpo/`` (seconds on one CPU).

It runs the code cells tagged ``graded`` of ``gigpo_assignment.ipynb`` (or of the notebook named by
``$ASSIGNMENT_NOTEBOOK``) and checks the functions they define on cases worked out by hand, whose
expected values this file carries as data (it does not call ``agentic_rl.gigpo``): the chapter's
2 × 2 grid (four episodes, anchors S, A and B) with gamma 0.9, and two episode groups that both see
a state "S". Each failure is one sentence naming the function and, where the mistake is a known
one (gamma applied the wrong way, returns leaking across episodes, step groups crossing episode
groups, statistics over rows instead of episodes), what it is.
"""

from __future__ import annotations

import math
import numbers
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _grading import SubmissionError, call, fail, load_submission

# --- the hand cases (values worked out by hand; the chapter's worked example) -----------------

#: the chapter's 2 x 2 grid: S start, A and B beside it, the goal G; one group of four episodes
GRID = dict(
    anchors=["S", "A", "S", "B", "S", "A", "S", "A", "S", "B", "S", "B"],
    rewards=[0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0],
    episodes=[1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4],
    groups=[0] * 12,
)
GRID_RETURNS = [0.9, 1.0, 0.9, 1.0, 0.729, 0.81, 0.9, 1.0, 0.0, 0.0, 0.0, 0.0]  # gamma 0.9
GRID_STEP_GROUPS = ([0, 1, 0, 2, 0, 1, 0, 1, 0, 2, 0, 2], [6, 3, 6, 3, 6, 3, 6, 3, 6, 3, 6, 3])
GRID_EPISODE = [0.25] * 8 + [-0.75] * 4  # F_norm = 1: episode returns 1, 1, 1, 0, mean 0.75
GRID_STEP = [0.3285, 0.063333, 0.3285, 0.666667, 0.1575, -0.126667, 0.3285, 0.063333,
             -0.5715, -0.333333, -0.5715, -0.333333]
GRID_EPISODE_STD = [0.499999] * 8 + [-1.499997] * 4  # unbiased std 0.5 (+ 1e-6)
GRID_STEP_STD = [0.733898, 0.577345, 0.733898, 1.154699, 0.351869, -1.15469, 0.733898, 0.577345,
                 -1.276782, -0.577349, -1.276782, -0.577349]
GRID_EPISODE_ROWS = [1 / 3] * 8 + [-2 / 3] * 4  # the mistake: statistics over the 12 step rows

#: two episode groups that both see "S"; gamma 0.5, omega 0.5
TWO = dict(
    anchors=["S", "G1", "S", "S", "X", "S", "S"],
    rewards=[0, 1, 0, 0, 1, 0, 0.5],
    episodes=[0, 0, 1, 2, 2, 3, 3],
    groups=[0, 0, 0, 1, 1, 1, 1],
)
TWO_RETURNS = [0.5, 1.0, 0.0, 0.5, 1.0, 0.25, 0.5]
TWO_STEP_GROUPS = ([0, 1, 0, 2, 3, 2, 2], [2, 1, 2, 3, 1, 3, 3])
TWO_CROSSED = ([0, 1, 0, 0, 2, 0, 0], [5, 1, 5, 5, 1, 5, 5])  # "S" of both groups in one
TWO_EPISODE = [0.5, 0.5, -0.5, 0.25, 0.25, -0.25, -0.25]
TWO_STEP = [0.25, 0.0, -0.25, 0.083333, 0.0, -0.166667, 0.083333]
TWO_COMBINED = [0.625, 0.5, -0.625, 0.291667, 0.25, -0.333333, -0.208333]
TWO_EPISODE_STD = [0.707106, 0.707106, -0.707106, 0.707105, 0.707105, -0.707105, -0.707105]
TWO_STEP_STD = [0.707105, 0.0, -0.707105, 0.577346, 0.0, -1.154693, 0.577346]
TWO_COMBINED_STD = [1.060658, 0.707106, -1.060658, 0.995778, 0.707105, -1.284451, -0.418432]

TOL = 2e-5  # the carried values are rounded to 6 decimals


@pytest.fixture(scope="module")
def ns():
    try:
        return load_submission(HERE / "gigpo_assignment.ipynb")
    except SubmissionError as err:
        problem = str(err)
    fail(problem)


def _fmt(xs) -> str:
    return ", ".join(f"{x:.4g}" for x in xs)


def _floats(name: str, got, n: int, what: str) -> list[float]:
    """The student's output as a list of n finite floats, or a one-sentence failure."""
    if hasattr(got, "tolist"):
        got = got.tolist()
    if not isinstance(got, (list, tuple)) or len(got) != n:
        size = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
        fail(f"`{name}` should return one value per row ({n}) for {what}, got {size}")
    if not all(isinstance(x, numbers.Real) and math.isfinite(x) for x in got):
        fail(f"`{name}` should return finite numbers for {what}, got {got!r}")
    return [float(x) for x in got]


def _close(got, want, tol=TOL) -> bool:
    return all(abs(a - b) <= tol for a, b in zip(got, want))


# --- Task 1: discounted_returns -----------------------------------------------------------------


def _returns_hint(got, rewards, episodes, gamma) -> str:
    forward, running = [], 0.0
    for j, r in enumerate(rewards):
        first = j == 0 or episodes[j] != episodes[j - 1]
        running = r + (0.0 if first else gamma * running)
        forward.append(running)
    if _close(got, forward):
        return (" gamma is applied the wrong way: R_t sums the rewards from step t to the end of "
                "the episode, r_t + gamma r_{t+1} + ..., computed backwards; yours sums the "
                "rewards up to step t")
    leaked, running = [], 0.0
    for j in range(len(rewards) - 1, -1, -1):
        running = rewards[j] + (0.0 if j == len(rewards) - 1 else gamma * running)
        leaked.append(running)
    if _close(got, leaked[::-1]):
        return (" the return leaks across episodes: it must stop at the last step of its episode, "
                "and the next episode's rewards are not part of it")
    return ""


@pytest.mark.parametrize(
    "rewards,episodes,gamma,want",
    [
        ([0, 0, 1], [0, 0, 0], 0.5, [0.25, 0.5, 1.0]),
        ([0, 1, 0, 0, 1], [0, 0, 1, 1, 1], 0.9, [0.9, 1.0, 0.81, 0.9, 1.0]),
        ([1, 2, 3], [5, 5, 5], 1.0, [6.0, 5.0, 3.0]),
        (GRID["rewards"], GRID["episodes"], 0.9, GRID_RETURNS),
        (TWO["rewards"], TWO["episodes"], 0.5, TWO_RETURNS),
    ],
    ids=["one-episode", "two-episodes", "gamma1", "grid", "two-groups"],
)
def test_discounted_returns(ns, rewards, episodes, gamma, want):
    ins = (list(rewards), list(episodes))
    what = f"rewards ({_fmt(rewards)}), episodes ({_fmt(episodes)}), gamma {gamma:g}"
    got = _floats("discounted_returns", call(ns, "discounted_returns", *ins, gamma),
                  len(rewards), what)
    if ins != (list(rewards), list(episodes)):
        fail(f"`discounted_returns` changed its inputs in place for {what}")
    if not _close(got, want):
        fail(f"`discounted_returns` is wrong for {what}: it gave ({_fmt(got)}), by hand "
             f"({_fmt(want)}).{_returns_hint(got, rewards, episodes, gamma)}")


# --- Task 2: anchor_groups ----------------------------------------------------------------------


def _groups(ns, anchors, groups, what):
    got = call(ns, "anchor_groups", list(anchors), list(groups))
    if not (isinstance(got, (list, tuple)) and len(got) == 2):
        fail(f"`anchor_groups` should return (step_group, sizes) for {what}, got {got!r}")
    out = []
    for part in got:
        part = part.tolist() if hasattr(part, "tolist") else part
        if not isinstance(part, (list, tuple)) or len(part) != len(anchors):
            fail(f"`anchor_groups` should return two lists of one int per row for {what}, "
                 f"got {got!r}")
        out.append([int(x) for x in part])
    return tuple(out)


def test_anchor_groups_on_the_grid(ns):
    got = _groups(ns, GRID["anchors"], GRID["groups"], "the chapter's grid")
    if got != GRID_STEP_GROUPS:
        fail(f"`anchor_groups` is wrong for the chapter's grid (anchors S A S B S A S A S B S B, "
             f"one episode group): it gave {got}, expected {GRID_STEP_GROUPS} (S, A and B "
             f"numbered in order of first appearance, sizes 6, 3 and 3)")


def test_anchor_groups_do_not_cross_episode_groups(ns):
    got = _groups(ns, TWO["anchors"], TWO["groups"], "two episode groups")
    if got == TWO_CROSSED:
        fail("`anchor_groups` is wrong for two episode groups that both reach state 'S': step "
             "groups never cross episode groups (each episode group has its own initial state "
             f"and its own step groups); it gave {got}, expected {TWO_STEP_GROUPS}")
    if got != TWO_STEP_GROUPS:
        fail(f"`anchor_groups` is wrong for two episode groups (anchors S G1 S | S X S S): it "
             f"gave {got}, expected {TWO_STEP_GROUPS}")


def test_anchor_groups_compare_exactly(ns):
    anchors = ["a b", "a  b", "A b", "a b", ("x", 1), ("x", 1)]
    want = ([0, 1, 2, 0, 3, 3], [2, 1, 1, 2, 2, 2])
    got = _groups(ns, anchors, [0] * 6, "anchors 'a b', 'a  b', 'A b', 'a b', ('x', 1) twice")
    if got != want:
        fail(f"`anchor_groups` is wrong for anchors 'a b', 'a  b', 'A b', 'a b', ('x', 1), "
             f"('x', 1): two states are the same only when exactly equal (case and spaces count; "
             f"tuples are states too); it gave {got}, expected {want}")


# --- Task 3: gigpo_advantages -------------------------------------------------------------------


def _advantages(ns, case, gamma, omega, scale_by_std, what):
    got = call(ns, "gigpo_advantages", list(case["rewards"]), list(case["anchors"]),
               list(case["groups"]), list(case["episodes"]), gamma=gamma, omega=omega,
               scale_by_std=scale_by_std)
    if not (isinstance(got, (list, tuple)) and len(got) == 3):
        fail(f"`gigpo_advantages` should return (episode_level, step_level, combined) for "
             f"{what}, got {type(got).__name__}")
    n = len(case["rewards"])
    return [_floats("gigpo_advantages", part, n, what) for part in got]


@pytest.mark.parametrize("scale_by_std", [False, True], ids=["F1", "std"])
def test_gigpo_advantages_on_the_grid(ns, scale_by_std):
    what = (f"the chapter's grid, gamma 0.9, omega 1, "
            f"{'F_norm = unbiased std + 1e-6' if scale_by_std else 'F_norm = 1'}")
    a_e, a_s, a = _advantages(ns, GRID, 0.9, 1.0, scale_by_std, what)
    want_e = GRID_EPISODE_STD if scale_by_std else GRID_EPISODE
    want_s = GRID_STEP_STD if scale_by_std else GRID_STEP
    if not _close(a_e, want_e):
        hint = ""
        if not scale_by_std and _close(a_e, GRID_EPISODE_ROWS):
            hint = (" The mean is taken over the 12 step rows (a long episode counts once per "
                    "step); eq. gigpo-episode takes it over the group's 4 episodes")
        fail(f"`gigpo_advantages` is wrong for {what}: its episode level is ({_fmt(a_e)}), by "
             f"hand ({_fmt(want_e)}).{hint}")
    if not _close(a_s, want_s):
        fail(f"`gigpo_advantages` is wrong for {what}: its step level is ({_fmt(a_s)}), by hand "
             f"({_fmt(want_s)}); the detour 'left' of episode 3 (row 5) must get "
             f"{want_s[5]:+.4f}")
    want = [x + y for x, y in zip(want_e, want_s)]
    if not _close(a, want):
        fail(f"`gigpo_advantages` is wrong for {what}: its combined advantage is ({_fmt(a)}), "
             f"A^E + omega A^S gives ({_fmt(want)})")


@pytest.mark.parametrize("scale_by_std", [False, True], ids=["F1", "std"])
def test_gigpo_advantages_on_two_groups(ns, scale_by_std):
    what = (f"two episode groups that both see 'S', gamma 0.5, omega 0.5, "
            f"{'F_norm = unbiased std + 1e-6' if scale_by_std else 'F_norm = 1'}")
    got = _advantages(ns, TWO, 0.5, 0.5, scale_by_std, what)
    want = ((TWO_EPISODE_STD, TWO_STEP_STD, TWO_COMBINED_STD) if scale_by_std
            else (TWO_EPISODE, TWO_STEP, TWO_COMBINED))
    for name, g, w in zip(("episode level", "step level", "combined advantage"), got, want):
        if not _close(g, w):
            fail(f"`gigpo_advantages` is wrong for {what}: its {name} is ({_fmt(g)}), by hand "
                 f"({_fmt(w)}) (a step group of one row, G1 or X, gets step level 0; step and "
                 f"episode groups never cross)")


def test_gigpo_advantages_with_nothing_recurring_is_grpo(ns):
    fresh = dict(GRID, anchors=[f"turn {k}: {s}" for k, s in enumerate(GRID["anchors"])])
    what = "the grid with a turn counter in every observation (no state recurs), omega 1"
    a_e, a_s, a = _advantages(ns, fresh, 0.9, 1.0, False, what)
    if any(x != 0 for x in a_s) or not _close(a, a_e, 1e-12):
        fail(f"`gigpo_advantages` is wrong for {what}: every step group has one row, so the step "
             f"level must be 0 and the combined advantage the episode level; it gave step level "
             f"({_fmt(a_s)})")


def test_gigpo_advantages_with_omega_zero_is_the_episode_level(ns):
    what = "the chapter's grid, gamma 0.9, omega 0"
    a_e, _, a = _advantages(ns, GRID, 0.9, 0.0, False, what)
    if not _close(a, GRID_EPISODE, 1e-9):
        fail(f"`gigpo_advantages` is wrong for {what}: with omega 0 the combined advantage is "
             f"GRPO's episode level ({_fmt(GRID_EPISODE)}), it gave ({_fmt(a)})")
