"""Hidden checks of the GiGPO assignment (carried by the autograder; the student never sees them).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. Expected values are worked out by hand (the chapter's 2 x 2 grid, with
gamma 0.9, and two episode groups that both see a state "S") or recorded from ``agentic_rl.gigpo``
on seeded random batches (``gigpo_reference.json``). The student's functions take and return
plain lists; tensors are accepted too.
"""

from __future__ import annotations

import math
import numbers
import pathlib
import random

from gradelib import References, call, check, fail

REFS = References(pathlib.Path(__file__).with_name("gigpo_reference.json"), {
    "discounted_returns": "agentic_rl.gigpo:discounted_returns",
    "anchor_groups": "agentic_rl.gigpo:anchor_groups",
    "gigpo_advantages": "agentic_rl.gigpo:gigpo_advantages",
})
RETURNS = ("agentic_rl.gigpo:discounted_returns",)
GROUPS = ("agentic_rl.gigpo:anchor_groups",)
#: q3 uses q1 and q2: calling the package's versions of those is not the student's work either
ADVANTAGES = ("agentic_rl.gigpo:gigpo_advantages",) + RETURNS + GROUPS

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

TOL = 2e-5  # the carried hand values are rounded to 6 decimals


def _random_batch(seed: int) -> dict:
    """Three episode groups (labels 7, 2, 9) of 2 to 4 episodes of 1 to 5 steps; every episode
    starts in "S" and walks among a few states, so states recur within and across episodes."""
    rng = random.Random(seed)
    batch = dict(anchors=[], rewards=[], episodes=[], groups=[])
    episode = 100
    for group in (7, 2, 9):
        for _ in range(rng.randint(2, 4)):
            episode += rng.randint(1, 3)  # arbitrary, increasing labels
            length = rng.randint(1, 5)
            for t in range(length):
                batch["anchors"].append("S" if t == 0 else rng.choice("SABCD"))
                reward = rng.choice([1.0, 0.0]) if t == length - 1 else rng.choice([0.0, 0.0, 0.5])
                batch["rewards"].append(reward)
                batch["episodes"].append(episode)
                batch["groups"].append(group)
    return batch


def _fmt(xs) -> str:
    return ", ".join(f"{x:.4g}" for x in xs)


def _floats(name: str, got, n: int, what: str) -> list[float]:
    """The student's output as a list of n finite floats, or a one-sentence failure."""
    if hasattr(got, "tolist"):
        got = got.tolist()
    if not isinstance(got, (list, tuple)) or len(got) != n:
        size = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
        fail(f"`{name}` should return one value per row ({n}) for {what}, got {size}.")
    if not all(isinstance(x, numbers.Real) and math.isfinite(x) for x in got):
        fail(f"`{name}` should return finite numbers for {what}, got {got!r}.")
    return [float(x) for x in got]


def _close(got, want, tol=TOL) -> bool:
    return len(got) == len(want) and all(abs(a - b) <= tol for a, b in zip(got, want))


def _first_difference(got, want) -> int:
    return max(range(len(want)), key=lambda j: abs(got[j] - want[j]))


# --- q1: discounted_returns -------------------------------------------------------------------


def _returns_hint(got, rewards, episodes, gamma) -> str:
    forward, running = [], 0.0
    for j, r in enumerate(rewards):
        first = j == 0 or episodes[j] != episodes[j - 1]
        running = r + (0.0 if first else gamma * running)
        forward.append(running)
    if _close(got, forward):
        return (" Gamma is applied the wrong way: R_t sums the rewards from step t to the end of "
                "the episode, r_t + gamma r_{t+1} + ..., computed backwards; yours sums the "
                "rewards up to step t.")
    leaked, running = [], 0.0
    for j in range(len(rewards) - 1, -1, -1):
        running = rewards[j] + (0.0 if j == len(rewards) - 1 else gamma * running)
        leaked.append(running)
    if _close(got, leaked[::-1]) and len(set(episodes)) > 1:
        return (" The return leaks across episodes: it must stop at the last step of its "
                "episode, and the next episode's rewards are not part of it.")
    return ""


def _returns(fn, rewards, episodes, gamma, what) -> list[float]:
    ins = (list(rewards), list(episodes))
    got = _floats("discounted_returns", call(fn, "discounted_returns", *ins, gamma),
                  len(rewards), what)
    if ins != (list(rewards), list(episodes)):
        fail(f"`discounted_returns` changed its inputs in place for {what}.")
    return got


def _returns_by_hand(fn, cases) -> None:
    for rewards, episodes, gamma, want in cases:
        what = f"rewards ({_fmt(rewards)}), episodes ({_fmt(episodes)}), gamma {gamma:g}"
        got = _returns(fn, rewards, episodes, gamma, what)
        if not _close(got, want):
            fail(f"`discounted_returns` is wrong for {what}: it gave ({_fmt(got)}), by hand "
                 f"({_fmt(want)}).{_returns_hint(got, rewards, episodes, gamma)}")


@check("discounted_returns", RETURNS)
def returns_of_one_episode(fn):
    """One episode: the direction of the discount."""
    _returns_by_hand(fn, [([0, 0, 1], [0, 0, 0], 0.5, [0.25, 0.5, 1.0]),
                          ([1, 2, 3], [5, 5, 5], 1.0, [6.0, 5.0, 3.0])])


@check("discounted_returns", RETURNS)
def returns_stop_at_episode_end(fn):
    """Several episodes in a row: a return stops at the end of its episode."""
    _returns_by_hand(fn, [
        ([0, 1, 0, 0, 1], [0, 0, 1, 1, 1], 0.9, [0.9, 1.0, 0.81, 0.9, 1.0]),
        (GRID["rewards"], GRID["episodes"], 0.9, GRID_RETURNS),
        (TWO["rewards"], TWO["episodes"], 0.5, TWO_RETURNS),
    ])


@check("discounted_returns", RETURNS)
def returns_of_many_episodes(fn):
    for seed in range(3):
        batch = _random_batch(seed)
        n = len(set(batch["episodes"]))
        for gamma in (0.95, 0.5):
            what = f"a random batch of {n} episodes (increasing labels), gamma {gamma:g}"
            got = _returns(fn, batch["rewards"], batch["episodes"], gamma, what)
            want = REFS("discounted_returns", batch["rewards"], batch["episodes"], gamma).tolist()
            if not _close(got, want, 1e-9):
                j = _first_difference(got, want)
                fail(f"`discounted_returns` is wrong for {what}: at row {j} (episode "
                     f"{batch['episodes'][j]}) it gave {got[j]:.6g}, expected {want[j]:.6g}."
                     f"{_returns_hint(got, batch['rewards'], batch['episodes'], gamma)}")


# --- q2: anchor_groups ------------------------------------------------------------------------


def _groups(fn, anchors, groups, what):
    got = call(fn, "anchor_groups", list(anchors), list(groups))
    if not (isinstance(got, (list, tuple)) and len(got) == 2):
        fail(f"`anchor_groups` should return (step_group, sizes) for {what}, got {got!r}.")
    out = []
    for part in got:
        part = part.tolist() if hasattr(part, "tolist") else part
        if not isinstance(part, (list, tuple)) or len(part) != len(anchors):
            fail(f"`anchor_groups` should return two lists of one int per row for {what}, "
                 f"got {got!r}.")
        out.append([int(x) for x in part])
    return tuple(out)


@check("anchor_groups", GROUPS)
def groups_on_the_grid(fn):
    got = _groups(fn, GRID["anchors"], GRID["groups"], "the chapter's grid")
    if got != GRID_STEP_GROUPS:
        fail(f"`anchor_groups` is wrong for the chapter's grid (anchors S A S B S A S A S B S B, "
             f"one episode group): it gave {got}, expected {GRID_STEP_GROUPS} (S, A and B "
             "numbered in order of first appearance, sizes 6, 3 and 3).")


@check("anchor_groups", GROUPS)
def groups_do_not_cross_episode_groups(fn):
    got = _groups(fn, TWO["anchors"], TWO["groups"], "two episode groups")
    if got == TWO_CROSSED:
        fail("`anchor_groups` is wrong for two episode groups that both reach state 'S': step "
             "groups never cross episode groups (each episode group has its own initial state "
             f"and its own step groups); it gave {got}, expected {TWO_STEP_GROUPS}.")
    if got != TWO_STEP_GROUPS:
        fail(f"`anchor_groups` is wrong for two episode groups (anchors S G1 S | S X S S): it "
             f"gave {got}, expected {TWO_STEP_GROUPS}.")


@check("anchor_groups", GROUPS)
def groups_compare_exactly(fn):
    anchors = ["a b", "a  b", "A b", "a b", ("x", 1), ("x", 1)]
    want = ([0, 1, 2, 0, 3, 3], [2, 1, 1, 2, 2, 2])
    got = _groups(fn, anchors, [0] * 6, "anchors 'a b', 'a  b', 'A b', 'a b', ('x', 1) twice")
    if got != want:
        fail("`anchor_groups` is wrong for anchors 'a b', 'a  b', 'A b', 'a b', ('x', 1), "
             "('x', 1): two states are the same only when exactly equal (case and spaces count; "
             f"tuples are states too); it gave {got}, expected {want}.")


@check("anchor_groups", GROUPS)
def groups_of_many_batches(fn):
    for seed in range(3):
        batch = _random_batch(seed)
        what = ("a random batch of three episode groups (labels 7, 2, 9) that all start in "
                "'S' and walk among S, A, B, C, D")
        got = _groups(fn, batch["anchors"], batch["groups"], what)
        want = tuple(t.tolist() for t in REFS("anchor_groups", batch["anchors"],
                                              batch["groups"]))
        if got != want:
            j = next(k for k in range(len(want[0])) if (got[0][k], got[1][k]) != (
                want[0][k], want[1][k]))
            fail(f"`anchor_groups` is wrong for {what}: row {j} (state "
                 f"{batch['anchors'][j]!r}, group {batch['groups'][j]}) got step group "
                 f"{got[0][j]} of size {got[1][j]}, expected {want[0][j]} of size {want[1][j]}.")


# --- q3: gigpo_advantages ---------------------------------------------------------------------


def _advantages(fn, case, gamma, omega, scale_by_std, what):
    got = call(fn, "gigpo_advantages", list(case["rewards"]), list(case["anchors"]),
               list(case["groups"]), list(case["episodes"]), gamma=gamma, omega=omega,
               scale_by_std=scale_by_std)
    if not (isinstance(got, (list, tuple)) and len(got) == 3):
        fail(f"`gigpo_advantages` should return (episode_level, step_level, combined) for "
             f"{what}, got {type(got).__name__}.")
    n = len(case["rewards"])
    return [_floats("gigpo_advantages", part, n, what) for part in got]


def _norm(scale_by_std: bool) -> str:
    return "F_norm = unbiased std + 1e-6" if scale_by_std else "F_norm = 1"


@check("gigpo_advantages", ADVANTAGES)
def episode_level(fn, scale_by_std: bool):
    """A^E per episode (eq. gigpo-episode) on the grid and on two episode groups."""
    for case, gamma, omega, want, name in (
            (GRID, 0.9, 1.0, GRID_EPISODE_STD if scale_by_std else GRID_EPISODE,
             "the chapter's grid"),
            (TWO, 0.5, 0.5, TWO_EPISODE_STD if scale_by_std else TWO_EPISODE,
             "two episode groups of two episodes")):
        what = f"{name}, {_norm(scale_by_std)}"
        a_e, _, _ = _advantages(fn, case, gamma, omega, scale_by_std, what)
        if not _close(a_e, want):
            hint = ""
            if case is GRID and not scale_by_std and _close(a_e, GRID_EPISODE_ROWS):
                hint = (" The mean is taken over the 12 step rows (a long episode counts once "
                        "per step); eq. gigpo-episode takes it over the group's 4 episodes.")
            fail(f"`gigpo_advantages` is wrong for {what}: its episode level is ({_fmt(a_e)}), "
                 f"by hand ({_fmt(want)}).{hint}")


@check("gigpo_advantages", ADVANTAGES)
def step_level(fn, scale_by_std: bool):
    """A^S within each anchor's step group (eq. gigpo-step), the chapter's grid."""
    what = f"the chapter's grid, gamma 0.9, omega 1, {_norm(scale_by_std)}"
    _, a_s, _ = _advantages(fn, GRID, 0.9, 1.0, scale_by_std, what)
    want = GRID_STEP_STD if scale_by_std else GRID_STEP
    if not _close(a_s, want):
        fail(f"`gigpo_advantages` is wrong for {what}: its step level is ({_fmt(a_s)}), by hand "
             f"({_fmt(want)}); each step's discounted return is compared with the mean over "
             f"its anchor's step group, and the detour 'left' of episode 3 (row 5) must get "
             f"{want[5]:+.4f}.")


@check("gigpo_advantages", ADVANTAGES)
def two_episode_groups(fn):
    what = "two episode groups that both see 'S', gamma 0.5, omega 0.5, F_norm = 1"
    got = _advantages(fn, TWO, 0.5, 0.5, False, what)
    want = (TWO_EPISODE, TWO_STEP, TWO_COMBINED)
    for name, g, w in zip(("episode level", "step level", "combined advantage"), got, want):
        if not _close(g, w):
            fail(f"`gigpo_advantages` is wrong for {what}: its {name} is ({_fmt(g)}), by hand "
                 f"({_fmt(w)}) (a step group of one row, G1 or X, gets step level 0; step and "
                 "episode groups never cross).")


@check("gigpo_advantages", ADVANTAGES)
def combined(fn):
    """A = A^E + omega A^S, from the function's own two levels (eq. gigpo-combined)."""
    for case, gamma, omega, name in ((GRID, 0.9, 1.0, "the chapter's grid"),
                                     (GRID, 0.9, 0.0, "the chapter's grid"),
                                     (TWO, 0.5, 0.5, "two episode groups")):
        what = f"{name}, gamma {gamma:g}, omega {omega:g}, F_norm = 1"
        a_e, a_s, a = _advantages(fn, case, gamma, omega, False, what)
        want = [x + omega * y for x, y in zip(a_e, a_s)]
        if not _close(a, want, 1e-9):
            extra = " (with omega 0 it is GRPO's episode level)" if omega == 0 else ""
            fail(f"`gigpo_advantages` is wrong for {what}: its combined advantage "
                 f"({_fmt(a)}) is not A^E + omega A^S of its own two levels ({_fmt(want)})"
                 f"{extra}.")


@check("gigpo_advantages", ADVANTAGES)
def nothing_recurs_is_grpo(fn):
    fresh = dict(GRID, anchors=[f"turn {k}: {s}" for k, s in enumerate(GRID["anchors"])])
    what = "the grid with a turn counter in every observation (no state recurs), omega 1"
    a_e, a_s, a = _advantages(fn, fresh, 0.9, 1.0, False, what)
    if any(x != 0 for x in a_s) or not _close(a, a_e, 1e-12):
        fail(f"`gigpo_advantages` is wrong for {what}: every step group has one row, so the step "
             f"level must be 0 and the combined advantage the episode level; it gave step level "
             f"({_fmt(a_s)}).")


@check("gigpo_advantages", ADVANTAGES)
def many_batches(fn, scale_by_std: bool):
    """Seeded random batches of three episode groups, against the package (per-episode A^E)."""
    for seed in range(3):
        batch = _random_batch(seed)
        what = (f"a random batch of three episode groups (labels 7, 2, 9) with recurring states, "
                f"gamma 0.95, omega 0.7, {_norm(scale_by_std)}")
        got = _advantages(fn, batch, 0.95, 0.7, scale_by_std, what)
        want = REFS("gigpo_advantages", batch["rewards"], batch["anchors"], batch["groups"],
                    batch["episodes"], gamma=0.95, omega=0.7, scale_by_std=scale_by_std,
                    cross_steps=False)
        for name, g, w in zip(("episode level", "step level", "combined advantage"), got, want):
            w = w.tolist()
            if not _close(g, w, 1e-6):
                j = _first_difference(g, w)
                fail(f"`gigpo_advantages` is wrong for {what}: its {name} at row {j} (episode "
                     f"{batch['episodes'][j]}, state {batch['anchors'][j]!r}) is {g[j]:.6g}, "
                     f"expected {w[j]:.6g}.")
