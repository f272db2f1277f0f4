"""Autograder for the RC-GRPO assignment: ``pytest labs/assignments/rcgrpo/`` (seconds on one CPU).

It runs the code cells tagged ``graded`` of ``rcgrpo_assignment.ipynb`` (or of the notebook named
by ``$ASSIGNMENT_NOTEBOOK``) and checks the functions they define against ``agentic_rl.rcgrpo``
(``draw_conditions`` and ``zero_std_fraction`` exactly; ``expected_group_variance`` against the
module's Monte-Carlo simulation and its lower bound) and against the closed form of the chapter.
Each failure is one sentence naming the function. When ``agentic_rl.rcgrpo`` cannot be imported
(it pulls in the whole agent trainer), the grader's own copies of its functions stand in.
"""

from __future__ import annotations

import math
import numbers
import pathlib
import random
import sys

import numpy as np
import pytest
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _grading import SubmissionError, call, fail, load_submission  # noqa: E402

try:
    from agentic_rl.rcgrpo import (
        draw_conditions,
        simulate_group_variance,
        variance_lower_bound,
        zero_std_fraction,
    )
except Exception:  # noqa: BLE001 (the grader's copies of the package's four functions)

    def draw_conditions(num_groups, group_size, p_high, assignment, rng):
        if assignment == "bernoulli":
            return [rng.random() < p_high for _ in range(num_groups * group_size)]
        if assignment == "split":
            k = min(max(round(p_high * group_size), 1), group_size - 1)
            out = []
            for _ in range(num_groups):
                group = [True] * k + [False] * (group_size - k)
                rng.shuffle(group)
                out += group
            return out
        raise ValueError(f"assignment must be 'bernoulli' or 'split', got {assignment!r}")

    def zero_std_fraction(scores, group_ids, rows=None):
        keep = torch.ones_like(group_ids, dtype=torch.bool) if rows is None else rows
        groups = sorted(set(group_ids[keep].tolist()))
        flat = [len(set(scores[group_ids == g].tolist())) == 1 for g in groups]
        return sum(flat) / len(groups) if groups else None

    def variance_lower_bound(group_size, p_high, separation):
        return (group_size - 1) / group_size * p_high * (1 - p_high) * separation**2

    def simulate_group_variance(group_size, p_high, success_high, success_low, *,
                                groups=20_000, assignment="bernoulli", seed=0):
        rng = random.Random(seed)
        high = torch.tensor(draw_conditions(groups, group_size, p_high, assignment, rng))
        gen = torch.Generator().manual_seed(seed)
        p = torch.where(high, success_high, success_low).to(torch.float64)
        rewards = (torch.rand(p.shape, generator=gen, dtype=torch.float64) < p).double()
        return rewards.view(groups, group_size).var(dim=1, unbiased=False).mean().item()


@pytest.fixture(scope="module")
def ns():
    torch.set_num_threads(1)
    try:
        return load_submission(HERE / "rcgrpo_assignment.ipynb")
    except SubmissionError as err:
        problem = str(err)
    fail(problem)


def _fmt(xs) -> str:
    return ", ".join(f"{x:g}" for x in xs)


# --- Task 1: draw_conditions --------------------------------------------------------------------


def _split_k(group_size, p_high) -> int:
    return min(max(round(p_high * group_size), 1), group_size - 1)


def _draw(ns, num_groups, group_size, p_high, assignment, seed, what):
    """The student's draw for ``random.Random(seed)``, checked for type and length; also returns
    the generator afterwards."""
    rng = random.Random(seed)
    got = call(ns, "draw_conditions", num_groups, group_size, p_high, assignment, rng)
    n = num_groups * group_size
    if not isinstance(got, list):
        fail(f"`draw_conditions` should return a list of bools for {what}, "
             f"got {type(got).__name__}")
    if len(got) != n:
        fail(f"`draw_conditions` returned {len(got)} token(s) for {what}; expected num_groups * "
             f"group_size = {n}, one per rollout, group after group")
    bad = next((x for x in got if not isinstance(x, (bool, np.bool_))), None)
    if bad is not None:
        fail(f"`draw_conditions` should return a list of bools (True: the high token) for "
             f"{what}, but it holds a {type(bad).__name__} ({bad!r})")
    return [bool(x) for x in got], rng


def _check_draw(ns, num_groups, group_size, p_high, assignment, seed, what):
    """The student's draw must be the package's for the same seed, and leave the generator in the
    same state."""
    got, rng = _draw(ns, num_groups, group_size, p_high, assignment, seed, what)
    ref_rng = random.Random(seed)
    want = draw_conditions(num_groups, group_size, p_high, assignment, ref_rng)
    G = group_size
    if assignment == "split":
        k = _split_k(G, p_high)
        for j in range(num_groups):
            c = sum(got[j * G:(j + 1) * G])
            if c == k:
                continue
            hint = ""
            if c in (0, G):
                hint = (" (k is clipped to 1..G - 1, so that a split group always holds both "
                        "tokens)")
            elif c == math.floor(p_high * G + 0.5) and c != round(p_high * G):
                hint = (f" (Python's round sends ties to the even integer: round({p_high * G:g}) "
                        f"= {round(p_high * G)})")
            fail(f"`draw_conditions` is wrong for {what}: group {j} has {c} high rollout(s), "
                 f"expected k = min(max(round(p_high * G), 1), G - 1) = {k} in every "
                 f"group{hint}")
    if got != want:
        i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        if got == [not x for x in want]:
            hint = " True and False are swapped: a rollout is high when rng.random() < p_high."
        elif assignment == "bernoulli":
            hint = (" Draw exactly one rng.random() per rollout, in order, and make the rollout "
                    "high when it is < p_high (no other generator, nothing else drawn).")
        else:
            hint = (" The counts are right but not the positions: for each group in turn, build "
                    "[True] * k + [False] * (G - k) and rng.shuffle it (nothing else drawn).")
        fail(f"`draw_conditions` is wrong for {what}: rollout {i} (group {i // G}, position "
             f"{i % G}) is {'high' if got[i] else 'low'}, and agentic_rl.rcgrpo.draw_conditions "
             f"makes it {'high' if want[i] else 'low'} for the same random.Random({seed}).{hint}")
    if rng.random() != ref_rng.random():
        fail(f"`draw_conditions` returned the package's tokens for {what} but left the generator "
             "in another state: it drew more or fewer random numbers from rng than the rules "
             "need (the trainer draws its tasks from the same stream)")


@pytest.mark.parametrize("num_groups,group_size,p_high,seed,what", [
    (3, 4, 0.5, 0, "3 groups of 4 at p_high 0.5 (the worked example)"),
    (10, 8, 0.3, 1, "10 groups of 8 at p_high 0.3"),
    (5, 1, 0.9, 2, "5 groups of one rollout at p_high 0.9"),
    (4, 4, 0.0, 3, "4 groups of 4 at p_high 0 (every rollout low)"),
    (4, 4, 1.0, 4, "4 groups of 4 at p_high 1 (every rollout high)"),
    (0, 8, 0.5, 5, "no group at all (num_groups 0: an empty list)"),
], ids=["example", "G8", "G1", "p0", "p1", "empty"])
def test_draw_conditions_bernoulli_is_the_packages(ns, num_groups, group_size, p_high, seed,
                                                   what):
    _check_draw(ns, num_groups, group_size, p_high, "bernoulli", seed,
                f"assignment 'bernoulli', {what}")


@pytest.mark.parametrize("num_groups,group_size,p_high,seed,what", [
    (3, 4, 0.5, 0, "3 groups of 4 at p_high 0.5 (the worked example: k = 2)"),
    (10, 8, 0.3, 1, "10 groups of 8 at p_high 0.3 (k = round(2.4) = 2)"),
    (6, 4, 0.1, 2, "6 groups of 4 at p_high 0.1 (round(0.4) = 0, clipped up to k = 1)"),
    (6, 4, 0.95, 3, "6 groups of 4 at p_high 0.95 (round(3.8) = 4, clipped down to k = 3)"),
    (6, 5, 0.5, 4, "6 groups of 5 at p_high 0.5 (k = round(2.5) = 2)"),
    (5, 6, 0.25, 5, "5 groups of 6 at p_high 0.25 (k = round(1.5) = 2)"),
], ids=["example", "G8", "clip-up", "clip-down", "tie-2.5", "tie-1.5"])
def test_draw_conditions_split_is_the_packages(ns, num_groups, group_size, p_high, seed, what):
    _check_draw(ns, num_groups, group_size, p_high, "split", seed, f"assignment 'split', {what}")


@pytest.mark.parametrize("p_high", [0.01, 0.99])
def test_draw_conditions_split_never_gives_an_all_equal_group(ns, p_high):
    G = 8
    got, _ = _draw(ns, 200, G, p_high, "split", 7, f"assignment 'split', 200 groups of 8 at "
                   f"p_high {p_high}")
    for j in range(200):
        c = sum(got[j * G:(j + 1) * G])
        if c in (0, G):
            fail(f"`draw_conditions` is wrong for assignment 'split', 200 groups of 8 at p_high "
                 f"{p_high}: group {j} is all-{'high' if c else 'low'}, but a split group always "
                 f"holds both tokens (k is clipped to 1..G - 1)")


def test_draw_conditions_bernoulli_follows_p_high(ns):
    n = 20_000
    got, _ = _draw(ns, 2500, 8, 0.3, "bernoulli", 8, "assignment 'bernoulli', 2500 groups of 8 "
                   "at p_high 0.3")
    share = sum(got) / n
    tol = 6 * math.sqrt(0.3 * 0.7 / n)
    if abs(share - 0.3) > tol:
        fail(f"`draw_conditions` is wrong for assignment 'bernoulli', 2500 groups of 8 at p_high "
             f"0.3: {share:.4f} of the rollouts are high, expected 0.3 +- {tol:.4f}")


@pytest.mark.parametrize("assignment", ["uniform", "Split", ""])
def test_draw_conditions_rejects_an_unknown_assignment(ns, assignment):
    fn = ns.get("draw_conditions")
    if not callable(fn):
        fail("`draw_conditions` is not defined in the graded cells of the notebook")
    message = None
    try:
        fn(2, 4, 0.5, assignment, random.Random(0))
    except ValueError:
        return
    except NotImplementedError:
        message = "`draw_conditions` is not implemented yet (it raises NotImplementedError)"
    except Exception as err:  # noqa: BLE001
        message = (f"`draw_conditions` raised {type(err).__name__} for assignment={assignment!r}; "
                   "expected a ValueError (only 'bernoulli' and 'split' exist)")
    if message is None:
        message = (f"`draw_conditions` returned for assignment={assignment!r}; it should raise "
                   "ValueError (only 'bernoulli' and 'split' exist)")
    fail(message)  # outside the except block, so pytest shows no chained traceback


# --- Task 2: zero_std_fraction ------------------------------------------------------------------


def _check_zero_std(ns, scores, group_ids, rows, what):
    """Call the student's function on one batch and compare it with the package's."""
    s_in, g_in = scores.clone(), group_ids.clone()
    r_in = None if rows is None else rows.clone()
    got = call(ns, "zero_std_fraction", s_in, g_in, r_in)
    if not (torch.equal(s_in, scores) and torch.equal(g_in, group_ids)
            and (rows is None or torch.equal(r_in, rows))):
        fail(f"`zero_std_fraction` changed its inputs in place for {what}")
    want = zero_std_fraction(scores, group_ids, rows)
    if want is None:
        if got is not None:
            fail(f"`zero_std_fraction` returned {got!r} for {what}; expected None (there is no "
                 "group to count)")
        return
    if got is None:
        fail(f"`zero_std_fraction` returned None for {what}; expected {want:.6g}")
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(f"`zero_std_fraction` should return a Python float for {what}, "
             f"got {type(got).__name__}")
    if abs(float(got) - want) > 1e-9:
        hint = ""
        if rows is not None and abs(float(got) - _masked_rewards_only(scores, group_ids, rows)) \
                <= 1e-9:
            hint = (" It judges each group on its rows in the mask only: the mask picks the "
                    "groups, and each of them is judged on all its rewards.")
        fail(f"`zero_std_fraction` is wrong for {what}: it gave {float(got):.6g}, expected "
             f"{want:.6g} (the fraction of the counted groups whose rewards are all equal, as "
             f"agentic_rl.rcgrpo.zero_std_fraction).{hint}")


def _masked_rewards_only(scores, group_ids, rows) -> float:
    """The mistake of judging a group on its masked rows alone (to name it)."""
    groups = sorted(set(group_ids[rows].tolist()))
    flat = [len(set(scores[(group_ids == g) & rows].tolist())) == 1 for g in groups]
    return sum(flat) / len(groups) if groups else float("nan")


EXAMPLE = (torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
           torch.arange(3).repeat_interleave(4))
EXAMPLE_WORDS = "3 groups of 4 (rewards 1, 1, 1, 1 | 0, 1, 1, 0 | 0, 0, 0, 0)"


@pytest.mark.parametrize("rows,what", [
    (None, f"the worked example, {EXAMPLE_WORDS}: 2 of the 3 groups are all equal"),
    ([False] * 8 + [True] * 4, f"{EXAMPLE_WORDS} with rows marking group 2 only (1.0)"),
    ([True] * 8 + [False] * 4, f"{EXAMPLE_WORDS} with rows marking groups 0 and 1 (0.5)"),
    ([True] * 12, f"{EXAMPLE_WORDS} with rows all True (as rows=None)"),
    ([False] * 12, f"{EXAMPLE_WORDS} with rows all False"),
    ([False, False, False, False, True] + [False] * 7, f"{EXAMPLE_WORDS} with rows marking one "
     "row of group 1 only (the group counts, judged on all its rewards 0, 1, 1, 0)"),
    ([True, False, False, False, False, False, False, True, False, False, True, False],
     f"{EXAMPLE_WORDS} with rows marking one row of each group (2/3)"),
], ids=["example", "hard-only", "easy-only", "all-rows", "no-row", "part-of-a-group",
        "one-row-each"])
def test_zero_std_fraction_worked_example(ns, rows, what):
    mask = None if rows is None else torch.tensor(rows)
    _check_zero_std(ns, *EXAMPLE, mask, what)


@pytest.mark.parametrize("scores,ids,rows,what", [
    ([1.0, 0.0, 1.0, 1.0], [0, 1, 1, 2], None, "a group of one rollout (group 0), a mixed pair "
     "and another group of one: a group of one counts as all equal (2/3)"),
    ([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], [7, 3, 7, 3, 9, 9, 12, 40], None, "group ids 7, "
     "3, 9, 12, 40 whose rows are interleaved (7: 1, 1; 3: 0, 1; 9: 0, 0; 12 and 40 one rollout "
     "each)"),
    ([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [7, 3, 7, 3, 9, 9], [False, True, False, False, True, False],
     "interleaved group ids 7, 3, 9 with rows marking one row of group 3 and one of group 9 "
     "(3 is mixed, 9 all equal: 0.5)"),
    ([0.1, 0.1, 0.1, 0.3, 0.3, 0.7, 0.25, 0.25], [0, 0, 0, 1, 1, 1, 2, 2], None, "float rewards "
     "(0.1, 0.1, 0.1 | 0.3, 0.3, 0.7 | 0.25, 0.25): 2 of the 3 groups are all equal"),
    ([0.5, 0.5, 0.5, 0.75, 0.5, 2.0, 2.0], [4, 4, 4, 4, 1, 6, 6], None, "float64 rewards "
     "(group 4: 0.5, 0.5, 0.5, 0.75; group 1: 0.5; group 6: 2, 2)"),
    ([], [], None, "an empty batch"),
], ids=["group-of-one", "non-contiguous-ids", "interleaved-rows-mask", "float", "float64",
        "empty"])
def test_zero_std_fraction_hand_cases(ns, scores, ids, rows, what):
    dtype = torch.float64 if "float64" in what else torch.float32
    mask = None if rows is None else torch.tensor(rows)
    _check_zero_std(ns, torch.tensor(scores, dtype=dtype), torch.tensor(ids, dtype=torch.long),
                    mask, what)


def test_zero_std_fraction_matches_the_package_on_random_batches(ns):
    gen = torch.Generator().manual_seed(0)
    levels = torch.tensor([0.0, 1.0, 0.5, 0.25])
    for k in range(60):
        num_groups = int(torch.randint(1, 9, (1,), generator=gen))
        labels = torch.randperm(50, generator=gen)[:num_groups]
        sizes = [[1, 2, 3, 4, 8][int(i)] for i in torch.randint(0, 5, (num_groups,),
                                                                generator=gen)]
        ids = torch.cat([torch.full((n,), int(g)) for g, n in zip(labels, sizes)])
        ids = ids[torch.randperm(len(ids), generator=gen)]
        few = int(torch.randint(2, 5, (1,), generator=gen))  # 2 levels: binary rewards
        scores = levels[torch.randint(0, few, ids.shape, generator=gen)]
        kind = k % 3
        if kind == 0:
            rows, words = None, "no rows mask"
        elif kind == 1:
            rows = torch.rand(ids.shape, generator=gen) < 0.4
            words = f"rows mask {[int(r) for r in rows.tolist()]}"
        else:  # a family of tasks: whole groups
            family = labels[torch.rand(num_groups, generator=gen) < 0.5]
            rows = torch.isin(ids, family)
            words = f"rows marking the groups {sorted(family.tolist())}"
        _check_zero_std(ns, scores, ids, rows, f"random batch {k} (scores {_fmt(scores.tolist())} "
                        f"with group ids {ids.tolist()}, {words}; compared with "
                        "agentic_rl.rcgrpo.zero_std_fraction)")


# --- Task 3: expected_group_variance ------------------------------------------------------------


def _exact(G, p, qh, ql) -> float:
    m = p * qh + (1 - p) * ql
    return (G - 1) / G * m * (1 - m)


def _words(G, p, qh, ql) -> str:
    return f"group_size {G}, p_high {p:g}, success_high {qh:g}, success_low {ql:g}"


def _variance(ns, G, p, qh, ql) -> float:
    got = call(ns, "expected_group_variance", G, p, qh, ql)
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(f"`expected_group_variance` should return a Python float for {_words(G, p, qh, ql)}, "
             f"got {type(got).__name__}")
    if not math.isfinite(float(got)):
        fail(f"`expected_group_variance` returned {got} for {_words(G, p, qh, ql)}")
    return float(got)


def _variance_hint(got, G, p, qh, ql) -> str:
    """A sentence naming the mistake when ``got`` is a known wrong closed form."""
    m = p * qh + (1 - p) * ql
    within = p * qh * (1 - qh) + (1 - p) * ql * (1 - ql)
    near = lambda a: abs(got - a) <= 1e-9 + 1e-9 * abs(a)  # noqa: E731
    if G == 1 and not near(0.0):
        return " A group of one rollout has no spread: its sigma^2 is 0 whatever it scores."
    if G > 1 and not near(_exact(G, p, qh, ql)) and near(m * (1 - m)):
        return (f" It is G / (G - 1) = {G}/{G - 1} times too large: that is the variance of one "
                f"reward, m (1 - m) with m = p qh + (1 - p) ql = {m:.4g}, but sigma^2 is taken "
                f"around the group's own mean, which takes 1/G of it away: the expectation of the "
                f"population variance of G i.i.d. rewards is (G - 1) / G times the variance of "
                f"one.")
    if not near(_exact(G, p, qh, ql)) and near(variance_lower_bound(G, p, qh - ql)):
        return (" It is the chapter's lower bound, which keeps only the spread between the "
                "tokens, p (1 - p) eps^2, and leaves out the spread within each token, "
                "p qh (1 - qh) + (1 - p) ql (1 - ql).")
    if not near(_exact(G, p, qh, ql)) and near((G - 1) / G * within):
        return (" It keeps only the spread within each token, p qh (1 - qh) + (1 - p) ql (1 - "
                "ql), and leaves out the spread between the tokens, p (1 - p) (qh - ql)^2.")
    return ""


@pytest.mark.parametrize("G,p,qh,ql", [
    (4, 0.5, 0.9, 0.2),
    (8, 0.3, 0.3, 0.8),
    (2, 0.5, 0.5, 0.5),
    (16, 0.0, 0.9, 0.2),
    (3, 1.0, 0.7, 0.1),
    (1, 0.5, 0.9, 0.2),
], ids=["G4", "low-better", "no-separation", "p0", "p1", "group-of-one"])
def test_expected_group_variance_is_exact(ns, G, p, qh, ql):
    got = _variance(ns, G, p, qh, ql)
    want = _exact(G, p, qh, ql)
    if abs(got - want) > 1e-9 + 1e-9 * want:
        fail(f"`expected_group_variance` is wrong for {_words(G, p, qh, ql)}: it gave {got:.6g}, "
             f"the exact expectation is {want:.6g}.{_variance_hint(got, G, p, qh, ql)}")


def _mc_tolerance(groups: int) -> float:
    """Six times the largest possible standard error: a group's sigma^2 lies in [0, 1/4], so its
    standard deviation is at most 1/8 (a difference of six of those: odds below 1e-8)."""
    return 6 / (8 * math.sqrt(groups))


@pytest.mark.parametrize("G,p,qh,ql", [
    (4, 0.5, 0.9, 0.2),
    (8, 0.25, 0.95, 0.5),
    (2, 0.7, 0.6, 0.1),
    (16, 0.5, 0.8, 0.3),
], ids=["G4", "G8", "G2", "G16"])
def test_expected_group_variance_matches_the_simulation(ns, G, p, qh, ql):
    groups = 200_000
    got = _variance(ns, G, p, qh, ql)
    mc = simulate_group_variance(G, p, qh, ql, groups=groups, seed=11)
    tol = _mc_tolerance(groups)
    if abs(got - mc) > tol:
        fail(f"`expected_group_variance` is wrong for {_words(G, p, qh, ql)}: it gave {got:.4f}, "
             f"and agentic_rl.rcgrpo.simulate_group_variance over {groups:,} groups gives "
             f"{mc:.4f} +- {tol:.4f} (six times the largest standard error)."
             f"{_variance_hint(got, G, p, qh, ql)}")


def test_expected_group_variance_is_above_the_bound(ns):
    for G in (2, 4, 8, 16):
        for p in (0.1, 0.5, 0.9):
            for qh in (0.0, 0.3, 0.7, 1.0):
                for ql in (0.0, 0.3, 0.7, 1.0):
                    got = _variance(ns, G, p, qh, ql)
                    bound = variance_lower_bound(G, p, qh - ql)
                    if got < bound - 1e-12:
                        fail(f"`expected_group_variance` is below the chapter's bound for "
                             f"{_words(G, p, qh, ql)}: it gave {got:.6g}, and variance_lower_"
                             f"bound(G, p, eps = qh - ql) = (G - 1) / G * p (1 - p) eps^2 = "
                             f"{bound:.6g} (the bound is the spread between the tokens alone; "
                             f"the spread within each token only adds to it)")


@pytest.mark.parametrize("G,p,qh,ql", [
    (4, 0.3, 1.0, 0.0),
    (8, 0.5, 1.0, 0.0),
    (2, 0.9, 0.0, 1.0),
], ids=["G4", "G8", "reversed"])
def test_expected_group_variance_meets_the_bound_when_it_is_tight(ns, G, p, qh, ql):
    got = _variance(ns, G, p, qh, ql)
    bound = variance_lower_bound(G, p, qh - ql)
    if abs(got - bound) > 1e-12:
        fail(f"`expected_group_variance` is wrong for {_words(G, p, qh, ql)}: under each token "
             f"the outcome is certain, so a reward is its token and the bound is tight, E[sigma^2] "
             f"= variance_lower_bound = (G - 1) / G * p (1 - p) = {bound:.6g}; it gave "
             f"{got:.6g}.{_variance_hint(got, G, p, qh, ql)}")
