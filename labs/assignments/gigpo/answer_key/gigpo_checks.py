"""Hidden checks of the GiGPO assignment (carried by the autograder; the student never sees them).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. Expected values are worked out by hand (the chapter's 2 x 2 grid, with
gamma 0.9, and two episode groups that both see a state "S") or recorded from ``agentic_rl.gigpo``
on seeded random batches (``gigpo_reference.json``). The student's functions take and return
plain lists; tensors are accepted too.

q3's checks grade `gigpo_advantages` alone (:class:`_Upstream`): its step level is accepted when it
is right or when it is what the student's own `discounted_returns` (q1) and `anchor_groups` (q2)
give, so that a slip in q1 or q2 costs there, once, and not again in q3.
"""

from __future__ import annotations

import math
import numbers
import pathlib
import random

from gradelib import FLAGGED, CheckFailed, References, call, check, fail

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


def _members(ids, j) -> str:
    """The rows in row j's step group, as text."""
    return ", ".join(str(k) for k, i in enumerate(ids) if i == ids[j])


def _renumbered(got):
    """``got``'s step groups numbered 0, 1, 2, ... in order of first appearance."""
    first: dict = {}
    return [first.setdefault(i, len(first)) for i in got[0]], got[1]


# --- q2's points (master, 4 in all), argued from what each slip breaks in training:
# - groups_on_the_grid 1.5: the basic grouping and sizes, and the numbering the spec asks for
#   (order of first appearance); a numbering slip alone breaks nothing in training (only which
#   rows share a group matters), so the three other checks compare the groups up to numbering.
# - groups_do_not_cross_episode_groups 1.5 (with groups_of_many_batches 0.5): groups crossing
#   episode groups compare steps of different tasks: the step level then rewards an easy task,
#   not a good action. 2 of 4.
# - groups_compare_exactly 0.5: normalised states merge states the environment tells apart.


@check("anchor_groups", GROUPS)
def groups_on_the_grid(fn):
    got = _groups(fn, GRID["anchors"], GRID["groups"], "the chapter's grid")
    if _renumbered(got) == GRID_STEP_GROUPS and got != GRID_STEP_GROUPS:
        fail(f"`anchor_groups` numbers the step groups of the chapter's grid wrongly: it gave "
             f"{got}, expected {GRID_STEP_GROUPS}; the groups are right, but they are numbered "
             "0, 1, 2, ... in the order in which they first appear in the rows.")
    if got != GRID_STEP_GROUPS:
        fail(f"`anchor_groups` is wrong for the chapter's grid (anchors S A S B S A S A S B S B, "
             f"one episode group): it gave {got}, expected {GRID_STEP_GROUPS} (S, A and B "
             "numbered in order of first appearance, sizes 6, 3 and 3).")


@check("anchor_groups", GROUPS)
def groups_do_not_cross_episode_groups(fn):
    raw = _groups(fn, TWO["anchors"], TWO["groups"], "two episode groups")
    got = _renumbered(raw)  # the numbering is groups_on_the_grid's business
    if got == TWO_CROSSED:
        fail("`anchor_groups` is wrong for two episode groups that both reach state 'S': step "
             "groups never cross episode groups (each episode group has its own initial state "
             f"and its own step groups); it gave {raw}, expected {TWO_STEP_GROUPS}.")
    if got != TWO_STEP_GROUPS:
        fail(f"`anchor_groups` is wrong for two episode groups (anchors S G1 S | S X S S): it "
             f"gave {raw}, expected {TWO_STEP_GROUPS}.")


@check("anchor_groups", GROUPS)
def groups_compare_exactly(fn):
    anchors = ["a b", "a  b", "A b", "a b", ("x", 1), ("x", 1)]
    want = ([0, 1, 2, 0, 3, 3], [2, 1, 1, 2, 2, 2])
    raw = _groups(fn, anchors, [0] * 6, "anchors 'a b', 'a  b', 'A b', 'a b', ('x', 1) twice")
    if _renumbered(raw) != want:
        fail("`anchor_groups` is wrong for anchors 'a b', 'a  b', 'A b', 'a b', ('x', 1), "
             "('x', 1): two states are the same only when exactly equal (case and spaces count; "
             f"tuples are states too); it gave {raw}, expected {want}.")


@check("anchor_groups", GROUPS)
def groups_of_many_batches(fn):
    for seed in range(3):
        batch = _random_batch(seed)
        what = ("a random batch of three episode groups (labels 7, 2, 9) that all start in "
                "'S' and walk among S, A, B, C, D")
        raw = _groups(fn, batch["anchors"], batch["groups"], what)
        got = _renumbered(raw)
        want = tuple(t.tolist() for t in REFS("anchor_groups", batch["anchors"],
                                              batch["groups"]))
        if got != want:
            j = next(k for k in range(len(want[0])) if (got[0][k], got[1][k]) != (
                want[0][k], want[1][k]))
            fail(f"`anchor_groups` is wrong for {what}: row {j} (state "
                 f"{batch['anchors'][j]!r}, group {batch['groups'][j]}) got a step group of "
                 f"size {got[1][j]}"
                 + ("" if got[1][j] != want[1][j] else f" (rows {_members(got[0], j)})")
                 + f", expected size {want[1][j]} (rows {_members(want[0], j)}).")


# --- q3: gigpo_advantages ---------------------------------------------------------------------
# Points (master, 10 in all), argued from what each slip breaks in training:
# - No second charge for q1 or q2: q3's step level is accepted when it is right, or when it is
#   what the student's own `discounted_returns` and `anchor_groups` give (a leaking return already
#   costs q1 2 of 3, groups crossing episode groups q2 2 of 4; charging q3 again cost 8.5 of 17
#   for one discount slip). A q1 or q2 that does not run (undefined, a stub, an error) still costs
#   q3, in a message that names it: the master says "q3 uses q1 and q2".
# - step_level 2.5 + 1, with two_episode_groups 1.5 and many_batches 1 + 0.5: 6.5 for a missing
#   or wrong step level, GiGPO's contribution (without it GiGPO is GRPO). The most points.
# - episode_level 1.5 + 0.5: statistics over the group's step rows instead of its episodes (the
#   reference code's convention: a long episode weighs more in the baseline) is close to right,
#   so it costs these 2 only; two_episode_groups and many_batches accept it.
# - combined 1 (A = A^E + omega A^S) and nothing_recurs_is_grpo 0.5 (singleton step groups).


def _rows(x) -> list:
    return list(x.tolist() if hasattr(x, "tolist") else x)


def _right_returns(rewards, episodes, gamma) -> list[float]:
    """Eq. gigpo-return by hand: R_t = r_t + gamma R_{t+1}, stopping at an episode's end."""
    out, running = [0.0] * len(rewards), 0.0
    for j in range(len(rewards) - 1, -1, -1):
        last = j == len(rewards) - 1 or episodes[j + 1] != episodes[j]
        running = float(rewards[j]) + (0.0 if last else gamma * running)
        out[j] = running
    return out


def _right_step_ids(anchors, groups) -> list[int]:
    """Eq. gigpo-anchor by hand: one id per (episode group, exact state)."""
    index: dict = {}
    return [index.setdefault((g, a), len(index)) for a, g in zip(anchors, groups)]


def _normalise_by_hand(values, keys, scale_by_std: bool, eps: float = 1e-6) -> list[float]:
    """(v - mean) / F_norm within each key; a key with one member gives 0."""
    members: dict = {}
    for v, k in zip(values, keys):
        members.setdefault(k, []).append(v)
    out = []
    for v, k in zip(values, keys):
        vs = members[k]
        if len(vs) == 1:
            out.append(0.0)
            continue
        mean = sum(vs) / len(vs)
        std = math.sqrt(sum((x - mean) ** 2 for x in vs) / (len(vs) - 1))
        out.append((v - mean) / (std + eps) if scale_by_std else v - mean)
    return out


class _Upstream:
    """What the student's q1 and q2 functions give on q3's cases, called like any student function
    (through ``call``), so that q3 is graded on `gigpo_advantages` alone."""

    QUESTION = {"discounted_returns": "q1", "anchor_groups": "q2"}

    def __init__(self, ns: dict):
        self.ns, self.notes = ns, {}

    def _run(self, name: str, *args):
        fn = self.ns.get(name)
        if not callable(fn):
            self.notes[name] = "is not defined (a cell that fails leaves it undefined)"
            return None
        try:
            return call(fn, name, *args)
        except CheckFailed as err:
            self.notes[name] = (f"is the package's answer (flagged in {self.QUESTION[name]})"
                                if str(err).startswith(FLAGGED) else
                                f"does not run on q3's cases (see {self.QUESTION[name]})")
            return None

    def returns(self, case, gamma) -> list[list[float]]:
        """The right returns, and the student's when they run and differ."""
        rewards, episodes = list(case["rewards"]), list(case["episodes"])
        right = _right_returns(rewards, episodes, gamma)
        got = self._run("discounted_returns", rewards, episodes, gamma)
        try:
            mine = [float(x) for x in _rows(got)] if got is not None else right
        except (TypeError, ValueError):
            mine = right
        if len(mine) != len(right) or _close(mine, right, 1e-9):
            return [right]
        self.notes.setdefault("discounted_returns", "is wrong here")
        return [right, mine]

    def step_ids(self, case) -> list[list]:
        """The right step groups, and the student's when they run and differ."""
        anchors, groups = list(case["anchors"]), list(case["groups"])
        right = _right_step_ids(anchors, groups)
        got = self._run("anchor_groups", anchors, groups)
        try:
            mine = _rows(got[0]) if got is not None else right
        except (TypeError, IndexError, KeyError):
            mine = right
        if len(mine) != len(right) or _renumbered((mine, []))[0] == right:
            return [right]
        self.notes.setdefault("anchor_groups", "is wrong here")
        return [right, mine]

    def step_levels(self, case, gamma, scale_by_std) -> list[list[float]]:
        """The step levels of every mix of right and student returns and step groups."""
        return [_normalise_by_hand(r, ids, scale_by_std) for r in self.returns(case, gamma)
                for ids in self.step_ids(case)]

    def note(self) -> str:
        if not self.notes:
            self.returns(GRID, 0.9)  # q3 failed before a comparison: do q1 and q2 run?
            self.step_ids(GRID)
        if not self.notes:
            return ""
        parts = " and ".join(f"`{n}` ({self.QUESTION[n]}) {why}" for n, why in self.notes.items())
        them = "them" if len(self.notes) > 1 else "it"
        if any(not why.startswith("is wrong") for why in self.notes.values()):
            return (f" (Your {parts}: q3 uses {them}, so a function that does not run costs q3 "
                    "too.)")
        gives = "they give" if len(self.notes) > 1 else "it gives"
        return (f" (Your {parts}: q3 accepts the step level that {gives} as well as the right "
                "one, so this difference is in `gigpo_advantages` itself.)")


_UNWRITTEN = ("is not defined", "returned None", "is not implemented yet")


def _graded_alone(body):
    """A q3 check ``body(fn, up, *params)``, given the student's q1 and q2 as ``up``; a failure
    says how they stand."""
    def run(fn, *params, ns):
        up = _Upstream(ns)
        try:
            body(fn, up, *params)
        except CheckFailed as err:
            text = str(err)
            if text.startswith(FLAGGED) or text.startswith(tuple(
                    f"`gigpo_advantages` {w}" for w in _UNWRITTEN)):
                raise  # q3's own: it is not written yet, or it is flagged
            raise CheckFailed(f"{text}{up.note()}") from None

    run.__name__, run.__doc__ = body.__name__, body.__doc__
    return run


def _expected(got, right, case, gamma, omega, scale_by_std, up, tol):
    """The levels ``got`` is compared with: ``right`` (lists), with the episode level of the
    reference code's convention (statistics over the group's step rows) when ``got`` has it, and
    the step level that the student's own q1 and q2 give when ``got`` has that; the combined
    advantage follows from the two."""
    right = [_rows(w) for w in right]
    episode, step = right[0], right[1]
    if not _close(got[0], episode, tol):
        totals: dict = {}
        for r, e in zip(case["rewards"], case["episodes"]):
            totals[e] = totals.get(e, 0.0) + float(r)
        rows = _normalise_by_hand([totals[e] for e in case["episodes"]], case["groups"],
                                  scale_by_std)
        episode = rows if _close(got[0], rows, tol) else episode
    if not _close(got[1], step, tol):
        step = next((s for s in up.step_levels(case, gamma, scale_by_std)
                     if _close(got[1], s, tol)), step)
    if (episode, step) == (right[0], right[1]):
        return right
    return [episode, step, [a + omega * b for a, b in zip(episode, step)]]


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
@_graded_alone
def episode_level(fn, up, scale_by_std: bool):
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
@_graded_alone
def step_level(fn, up, scale_by_std: bool):
    """A^S within each anchor's step group (eq. gigpo-step), the chapter's grid."""
    what = f"the chapter's grid, gamma 0.9, omega 1, {_norm(scale_by_std)}"
    got = _advantages(fn, GRID, 0.9, 1.0, scale_by_std, what)
    want = GRID_STEP_STD if scale_by_std else GRID_STEP
    a_s = got[1]
    mine = _expected(got, (got[0], want, got[2]), GRID, 0.9, 1.0, scale_by_std, up, TOL)[1]
    if not _close(a_s, mine):
        fail(f"`gigpo_advantages` is wrong for {what}: its step level is ({_fmt(a_s)}), by hand "
             f"({_fmt(want)}); each step's discounted return is compared with the mean over "
             f"its anchor's step group, and the detour 'left' of episode 3 (row 5) must get "
             f"{want[5]:+.4f}.")


@check("gigpo_advantages", ADVANTAGES)
@_graded_alone
def two_episode_groups(fn, up):
    what = "two episode groups that both see 'S', gamma 0.5, omega 0.5, F_norm = 1"
    got = _advantages(fn, TWO, 0.5, 0.5, False, what)
    want = _expected(got, (TWO_EPISODE, TWO_STEP, TWO_COMBINED), TWO, 0.5, 0.5, False, up, TOL)
    for name, g, w in zip(("episode level", "step level", "combined advantage"), got, want):
        if not _close(g, w):
            fail(f"`gigpo_advantages` is wrong for {what}: its {name} is ({_fmt(g)}), by hand "
                 f"({_fmt(w)}) (a step group of one row, G1 or X, gets step level 0; step and "
                 "episode groups never cross).")


@check("gigpo_advantages", ADVANTAGES)
@_graded_alone
def combined(fn, up):
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
@_graded_alone
def nothing_recurs_is_grpo(fn, up):
    fresh = dict(GRID, anchors=[f"turn {k}: {s}" for k, s in enumerate(GRID["anchors"])])
    what = "the grid with a turn counter in every observation (no state recurs), omega 1"
    a_e, a_s, a = _advantages(fn, fresh, 0.9, 1.0, False, what)
    if any(x != 0 for x in a_s) or not _close(a, a_e, 1e-12):
        fail(f"`gigpo_advantages` is wrong for {what}: every step group has one row, so the step "
             f"level must be 0 and the combined advantage the episode level; it gave step level "
             f"({_fmt(a_s)}).")


@check("gigpo_advantages", ADVANTAGES)
@_graded_alone
def many_batches(fn, up, scale_by_std: bool):
    """Seeded random batches of three episode groups, against the package (per-episode A^E)."""
    for seed in range(3):
        batch = _random_batch(seed)
        what = (f"a random batch of three episode groups (labels 7, 2, 9) with recurring states, "
                f"gamma 0.95, omega 0.7, {_norm(scale_by_std)}")
        got = _advantages(fn, batch, 0.95, 0.7, scale_by_std, what)
        want = REFS("gigpo_advantages", batch["rewards"], batch["anchors"], batch["groups"],
                    batch["episodes"], gamma=0.95, omega=0.7, scale_by_std=scale_by_std,
                    cross_steps=False)
        want = _expected(got, want, batch, 0.95, 0.7, scale_by_std, up, 1e-6)
        for name, g, w in zip(("episode level", "step level", "combined advantage"), got, want):
            if not _close(g, w, 1e-6):
                j = _first_difference(g, w)
                fail(f"`gigpo_advantages` is wrong for {what}: its {name} at row {j} (episode "
                     f"{batch['episodes'][j]}, state {batch['anchors'][j]!r}) is {g[j]:.6g}, "
                     f"expected {w[j]:.6g}.")
