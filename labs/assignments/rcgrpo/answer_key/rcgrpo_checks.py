"""Hidden checks of the RC-GRPO assignment (carried by the autograder; the student never sees them).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. Expected values are derived by hand in the check (the token draw follows
the rules the notebook states, from the same seeded ``random.Random``; the exact variance and the
bound are closed forms) or recorded from ``agentic_rl.rcgrpo`` (``rcgrpo_reference.json``: the
zero-std fractions and the Monte-Carlo estimates of the variance).
"""

from __future__ import annotations

import math
import numbers
import pathlib
import random

import torch

from gradelib import References, call, check, expect_real, fail

REFS = References(pathlib.Path(__file__).with_name("rcgrpo_reference.json"), {
    "zero_std_fraction": "agentic_rl.rcgrpo:zero_std_fraction",
    "simulate_group_variance": "agentic_rl.rcgrpo:simulate_group_variance",
})
DRAW = ("agentic_rl.rcgrpo:draw_conditions",)
ZERO_STD = ("agentic_rl.rcgrpo:zero_std_fraction",)
VARIANCE = ("agentic_rl.rcgrpo:simulate_group_variance", "agentic_rl.rcgrpo:variance_lower_bound")


def _fmt(xs) -> str:
    return ", ".join(f"{x:g}" for x in xs)


# --- q1: draw_conditions --------------------------------------------------------------------


def _split_k(group_size, p_high) -> int:
    return min(max(round(p_high * group_size), 1), group_size - 1)


def _rules(num_groups, group_size, p_high, assignment, rng):
    """The draw exactly as the notebook's rules state it (the expected tokens)."""
    if assignment == "bernoulli":
        return [rng.random() < p_high for _ in range(num_groups * group_size)]
    k = _split_k(group_size, p_high)
    tokens = []
    for _ in range(num_groups):
        group = [True] * k + [False] * (group_size - k)
        rng.shuffle(group)
        tokens += group
    return tokens


def _draw(fn, num_groups, group_size, p_high, assignment, seed, what):
    """The student's draw for ``random.Random(seed)``, checked for type and length; also returns
    the generator afterwards."""
    rng = random.Random(seed)
    got = call(fn, "draw_conditions", num_groups, group_size, p_high, assignment, rng)
    n = num_groups * group_size
    if not isinstance(got, list):
        fail(f"`draw_conditions` should return a list of bools for {what}, "
             f"got {type(got).__name__}.")
    if len(got) != n:
        fail(f"`draw_conditions` returned {len(got)} token(s) for {what}; expected num_groups * "
             f"group_size = {n}, one per rollout, group after group.")
    bad = next((x for x in got if not isinstance(x, bool) and type(x).__name__ != "bool_"), None)
    if bad is not None:
        fail(f"`draw_conditions` should return a list of bools (True: the high token) for "
             f"{what}, but it holds a {type(bad).__name__} ({bad!r}).")
    return [bool(x) for x in got], rng


def _check_draw(fn, num_groups, group_size, p_high, assignment, seed, what):
    """The student's draw must follow the rules for the same seed, and leave the generator in
    the same state."""
    got, rng = _draw(fn, num_groups, group_size, p_high, assignment, seed, what)
    ref_rng = random.Random(seed)
    want = _rules(num_groups, group_size, p_high, assignment, ref_rng)
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
                 f"group{hint}.")
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
             f"{i % G}) is {'high' if got[i] else 'low'}, and the rules make it "
             f"{'high' if want[i] else 'low'} for the same random.Random({seed}).{hint}")
    if rng.random() != ref_rng.random():
        fail(f"`draw_conditions` left the generator in another state for {what}: it drew more "
             "or fewer random numbers from rng than the rules need (the trainer draws its tasks "
             "from the same stream).")


BERNOULLI_CASES = [
    (3, 4, 0.5, 0, "3 groups of 4 at p_high 0.5 (the worked example)"),
    (10, 8, 0.3, 1, "10 groups of 8 at p_high 0.3"),
    (5, 1, 0.9, 2, "5 groups of one rollout at p_high 0.9"),
    (4, 4, 0.0, 3, "4 groups of 4 at p_high 0 (every rollout low)"),
    (4, 4, 1.0, 4, "4 groups of 4 at p_high 1 (every rollout high)"),
    (0, 8, 0.5, 5, "no group at all (num_groups 0: an empty list)"),
]
SPLIT_CASES = [
    (3, 4, 0.5, 0, "3 groups of 4 at p_high 0.5 (the worked example: k = 2)"),
    (10, 8, 0.3, 1, "10 groups of 8 at p_high 0.3 (k = round(2.4) = 2)"),
    (6, 4, 0.1, 2, "6 groups of 4 at p_high 0.1 (round(0.4) = 0, clipped up to k = 1)"),
    (6, 4, 0.95, 3, "6 groups of 4 at p_high 0.95 (round(3.8) = 4, clipped down to k = 3)"),
    (6, 5, 0.5, 4, "6 groups of 5 at p_high 0.5 (k = round(2.5) = 2)"),
    (5, 6, 0.25, 5, "5 groups of 6 at p_high 0.25 (k = round(1.5) = 2)"),
]


@check("draw_conditions", DRAW)
def draw_rules(fn, assignment: str):
    """The student's tokens and generator state against the rules, for fixed seeds."""
    cases = BERNOULLI_CASES if assignment == "bernoulli" else SPLIT_CASES
    for num_groups, group_size, p_high, seed, what in cases:
        _check_draw(fn, num_groups, group_size, p_high, assignment, seed,
                    f"assignment {assignment!r}, {what}")


@check("draw_conditions", DRAW)
def split_mixes_every_group(fn):
    G = 8
    for p_high in (0.01, 0.99):
        what = f"assignment 'split', 200 groups of 8 at p_high {p_high}"
        got, _ = _draw(fn, 200, G, p_high, "split", 7, what)
        for j in range(200):
            c = sum(got[j * G:(j + 1) * G])
            if c in (0, G):
                fail(f"`draw_conditions` is wrong for {what}: group {j} is "
                     f"all-{'high' if c else 'low'}, but a split group always holds both tokens "
                     "(k is clipped to 1..G - 1).")


@check("draw_conditions", DRAW)
def bernoulli_follows_p_high(fn):
    n = 20_000
    what = "assignment 'bernoulli', 2500 groups of 8 at p_high 0.3"
    got, _ = _draw(fn, 2500, 8, 0.3, "bernoulli", 8, what)
    share = sum(got) / n
    tol = 6 * math.sqrt(0.3 * 0.7 / n)
    if abs(share - 0.3) > tol:
        fail(f"`draw_conditions` is wrong for {what}: {share:.4f} of the rollouts are high, "
             f"expected 0.3 +- {tol:.4f}.")


@check("draw_conditions", DRAW)
def rejects_unknown_assignment(fn):
    for assignment in ("uniform", "Split", ""):
        message = None
        try:
            fn(2, 4, 0.5, assignment, random.Random(0))
        except ValueError:
            continue
        except NotImplementedError:
            message = "`draw_conditions` is not implemented yet (it raises NotImplementedError)."
        except Exception as err:  # noqa: BLE001
            message = (f"`draw_conditions` raised {type(err).__name__} for "
                       f"assignment={assignment!r}; expected a ValueError (only 'bernoulli' and "
                       "'split' exist).")
        if message is None:
            message = (f"`draw_conditions` returned for assignment={assignment!r}; it should "
                       "raise ValueError (only 'bernoulli' and 'split' exist).")
        fail(message)


# --- q2: zero_std_fraction --------------------------------------------------------------------


def _masked_rewards_only(scores, group_ids, rows) -> float:
    """The mistake of judging a group on its masked rows alone (to name it)."""
    groups = sorted(set(group_ids[rows].tolist()))
    flat = [len(set(scores[(group_ids == g) & rows].tolist())) == 1 for g in groups]
    return sum(flat) / len(groups) if groups else float("nan")


def _check_zero_std(fn, scores, group_ids, rows, what):
    """Call the student's function on one batch and compare it with the recorded value."""
    s_in, g_in = scores.clone(), group_ids.clone()
    r_in = None if rows is None else rows.clone()
    want = REFS("zero_std_fraction", scores, group_ids, rows)
    try:
        got = fn(s_in, g_in, r_in)
    except NotImplementedError:
        fail("`zero_std_fraction` is not implemented yet (it raises NotImplementedError).")
    except Exception as err:  # noqa: BLE001
        fail(f"`zero_std_fraction` raised {type(err).__name__} for {what}: {err}")
    if not (torch.equal(s_in, scores) and torch.equal(g_in, group_ids)
            and (rows is None or torch.equal(r_in, rows))):
        fail(f"`zero_std_fraction` changed its inputs in place for {what}.")
    if want is None:
        if got is not None:
            fail(f"`zero_std_fraction` returned {got!r} for {what}; expected None (there is no "
                 "group to count).")
        return
    if got is None:
        fail(f"`zero_std_fraction` returned None for {what}; expected {want:.6g} (None is only "
             "for a batch with no group to count; the release's stub `...` returns None).")
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(f"`zero_std_fraction` should return a Python float for {what}, "
             f"got {type(got).__name__}.")
    if abs(float(got) - want) > 1e-9:
        hint = ""
        if rows is not None and abs(float(got) - _masked_rewards_only(scores, group_ids, rows)) \
                <= 1e-9:
            hint = (" It judges each group on its rows in the mask only: the mask picks the "
                    "groups, and each of them is judged on all its rewards.")
        fail(f"`zero_std_fraction` is wrong for {what}: it gave {float(got):.6g}, expected "
             f"{want:.6g} (the fraction of the counted groups whose rewards are all equal)."
             f"{hint}")


EXAMPLE = (torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
           torch.arange(3).repeat_interleave(4))
EXAMPLE_WORDS = "3 groups of 4 (rewards 1, 1, 1, 1 | 0, 1, 1, 0 | 0, 0, 0, 0)"

UNMASKED_CASES = [
    ([1.0, 0.0, 1.0, 1.0], [0, 1, 1, 2], "a group of one rollout (group 0), a mixed pair and "
     "another group of one: a group of one counts as all equal (2/3)"),
    ([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], [7, 3, 7, 3, 9, 9, 12, 40], "group ids 7, 3, 9, "
     "12, 40 whose rows are interleaved (7: 1, 1; 3: 0, 1; 9: 0, 0; 12 and 40 one rollout each)"),
    ([0.1, 0.1, 0.1, 0.3, 0.3, 0.7, 0.25, 0.25], [0, 0, 0, 1, 1, 1, 2, 2], "float rewards "
     "(0.1, 0.1, 0.1 | 0.3, 0.3, 0.7 | 0.25, 0.25): 2 of the 3 groups are all equal"),
    ([0.5, 0.5, 0.5, 0.75, 0.5, 2.0, 2.0], [4, 4, 4, 4, 1, 6, 6], "float64 rewards "
     "(group 4: 0.5, 0.5, 0.5, 0.75; group 1: 0.5; group 6: 2, 2)"),
    ([], [], "an empty batch"),
]

MASK_CASES = [
    ([False] * 8 + [True] * 4, f"{EXAMPLE_WORDS} with rows marking group 2 only (1.0)"),
    ([True] * 8 + [False] * 4, f"{EXAMPLE_WORDS} with rows marking groups 0 and 1 (0.5)"),
    ([True] * 12, f"{EXAMPLE_WORDS} with rows all True (as rows=None)"),
    ([False] * 12, f"{EXAMPLE_WORDS} with rows all False"),
    ([False, False, False, False, True] + [False] * 7, f"{EXAMPLE_WORDS} with rows marking one "
     "row of group 1 only (the group counts, judged on all its rewards 0, 1, 1, 0)"),
    ([True, False, False, False, False, False, False, True, False, False, True, False],
     f"{EXAMPLE_WORDS} with rows marking one row of each group (2/3)"),
]


@check("zero_std_fraction", ZERO_STD)
def zero_std_hand_cases(fn):
    """The worked example and hand-made batches, no mask."""
    _check_zero_std(fn, *EXAMPLE, None,
                    f"the worked example, {EXAMPLE_WORDS}: 2 of the 3 groups are all equal")
    for scores, ids, what in UNMASKED_CASES:
        dtype = torch.float64 if "float64" in what else torch.float32
        _check_zero_std(fn, torch.tensor(scores, dtype=dtype),
                        torch.tensor(ids, dtype=torch.long), None, what)


@check("zero_std_fraction", ZERO_STD)
def zero_std_family_masks(fn):
    """A mask picks groups (a family of tasks); each is judged on all its rewards."""
    for rows, what in MASK_CASES:
        _check_zero_std(fn, *EXAMPLE, torch.tensor(rows), what)
    _check_zero_std(fn, torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]),
                    torch.tensor([7, 3, 7, 3, 9, 9]),
                    torch.tensor([False, True, False, False, True, False]),
                    "interleaved group ids 7, 3, 9 with rows marking one row of group 3 and one "
                    "of group 9 (3 is mixed, 9 all equal: 0.5)")


@check("zero_std_fraction", ZERO_STD)
def zero_std_random_batches(fn):
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
        _check_zero_std(fn, scores, ids, rows, f"random batch {k} (scores "
                        f"{_fmt(scores.tolist())} with group ids {ids.tolist()}, {words})")


# --- q3: expected_group_variance --------------------------------------------------------------


def _exact(G, p, qh, ql) -> float:
    """Eq. rc-variance: each reward is Bernoulli(m), and the group mean takes 1/G away."""
    m = p * qh + (1 - p) * ql
    return (G - 1) / G * m * (1 - m)


def _bound(G, p, eps) -> float:
    """Eq. rc-bound."""
    return (G - 1) / G * p * (1 - p) * eps**2


def _words(G, p, qh, ql) -> str:
    return f"group_size {G}, p_high {p:g}, success_high {qh:g}, success_low {ql:g}"


def _variance(fn, G, p, qh, ql) -> float:
    got = call(fn, "expected_group_variance", G, p, qh, ql)
    return expect_real("expected_group_variance", got, _words(G, p, qh, ql))


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
                f"around the group's own mean, which takes 1/G of it away: the expectation of "
                f"the population variance of G i.i.d. rewards is (G - 1) / G times the variance "
                f"of one.")
    if not near(_exact(G, p, qh, ql)) and near(_bound(G, p, qh - ql)):
        return (" It is the chapter's lower bound, which keeps only the spread between the "
                "tokens, p (1 - p) eps^2, and leaves out the spread within each token, "
                "p qh (1 - qh) + (1 - p) ql (1 - ql).")
    if not near(_exact(G, p, qh, ql)) and near((G - 1) / G * within):
        return (" It keeps only the spread within each token, p qh (1 - qh) + (1 - p) ql (1 - "
                "ql), and leaves out the spread between the tokens, p (1 - p) (qh - ql)^2.")
    return ""


@check("expected_group_variance", VARIANCE)
def variance_exact(fn):
    for G, p, qh, ql in ((4, 0.5, 0.9, 0.2), (8, 0.3, 0.3, 0.8), (2, 0.5, 0.5, 0.5),
                         (16, 0.0, 0.9, 0.2), (3, 1.0, 0.7, 0.1), (1, 0.5, 0.9, 0.2)):
        got = _variance(fn, G, p, qh, ql)
        want = _exact(G, p, qh, ql)
        if abs(got - want) > 1e-9 + 1e-9 * want:
            fail(f"`expected_group_variance` is wrong for {_words(G, p, qh, ql)}: it gave "
                 f"{got:.6g}, the exact expectation is {want:.6g}."
                 f"{_variance_hint(got, G, p, qh, ql)}")


@check("expected_group_variance", VARIANCE)
def variance_matches_simulation(fn):
    groups = 200_000
    # six times the largest possible standard error: a group's sigma^2 lies in [0, 1/4], so its
    # standard deviation is at most 1/8 (a difference of six of those: odds below 1e-8)
    tol = 6 / (8 * math.sqrt(groups))
    for G, p, qh, ql in ((4, 0.5, 0.9, 0.2), (8, 0.25, 0.95, 0.5), (2, 0.7, 0.6, 0.1),
                         (16, 0.5, 0.8, 0.3)):
        got = _variance(fn, G, p, qh, ql)
        mc = REFS("simulate_group_variance", G, p, qh, ql, groups=groups, seed=11)
        if abs(got - mc) > tol:
            fail(f"`expected_group_variance` is wrong for {_words(G, p, qh, ql)}: it gave "
                 f"{got:.4f}, and the simulation of {groups:,} groups (tokens drawn i.i.d.) "
                 f"gives {mc:.4f} +- {tol:.4f} (six times the largest standard error)."
                 f"{_variance_hint(got, G, p, qh, ql)}")


@check("expected_group_variance", VARIANCE)
def variance_above_bound(fn):
    for G in (2, 4, 8, 16):
        for p in (0.1, 0.5, 0.9):
            for qh in (0.0, 0.3, 0.7, 1.0):
                for ql in (0.0, 0.3, 0.7, 1.0):
                    got = _variance(fn, G, p, qh, ql)
                    bound = _bound(G, p, qh - ql)
                    if got < bound - 1e-12:
                        fail(f"`expected_group_variance` is below the chapter's bound for "
                             f"{_words(G, p, qh, ql)}: it gave {got:.6g}, and eq. rc-bound "
                             f"gives (G - 1) / G * p (1 - p) eps^2 = {bound:.6g} with eps = qh "
                             f"- ql (the bound is the spread between the tokens alone; the "
                             f"spread within each token only adds to it).")


@check("expected_group_variance", VARIANCE)
def variance_tight_bound(fn):
    for G, p, qh, ql in ((4, 0.3, 1.0, 0.0), (8, 0.5, 1.0, 0.0), (2, 0.9, 0.0, 1.0)):
        got = _variance(fn, G, p, qh, ql)
        bound = _bound(G, p, qh - ql)
        if abs(got - bound) > 1e-12:
            fail(f"`expected_group_variance` is wrong for {_words(G, p, qh, ql)}: under each "
                 f"token the outcome is certain, so a reward is its token and the bound is "
                 f"tight, E[sigma^2] = (G - 1) / G * p (1 - p) = {bound:.6g}; it gave "
                 f"{got:.6g}.{_variance_hint(got, G, p, qh, ql)}")
