"""Hidden checks of the GCD assignment (carried by the autograder; the student never sees them).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. Expected values are derived by hand in the check (the closed forms of
Lemma 3.1, eqs. gcd-lemma and gcd-lemma-group; ``torch.nn.functional.cosine_similarity``) or
recorded from ``agentic_rl`` (``gcd_reference.json``): the package's Monte-Carlo simulation
``agentic_rl.gcd.simulate_risky_action`` and its ``agentic_rl.gcd.judgement_labels`` on batches
laid out as the trainer's (through :func:`_package_labels`, run only when recording).
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import torch

from gradelib import References, call, check, expect_close, expect_real, expect_tensor, fail

REFS = References(pathlib.Path(__file__).with_name("gcd_reference.json"), {
    "simulate_risky_action": "agentic_rl.gcd:simulate_risky_action",
    "judgement_labels": "gcd_checks:_package_labels",
})
LEMMA = ("agentic_rl.gcd:lemma_value",)
LABELS = ("agentic_rl.gcd:judgement_labels",)
COSINE = ("agentic_rl.coupling:gradient_cosine",)


# --- q1: risky_advantage_weight ---------------------------------------------------------------


def _lemma(q, r, group_size=None) -> float:
    """Eq. gcd-lemma, and eq. gcd-lemma-group with ``group_size``."""
    value = q * r * (q - 1)
    return value if group_size is None else value * (group_size - 1) / group_size


def _words(q, r, group_size) -> str:
    base = ("group_size None, the expected reward as baseline" if group_size is None
            else f"group_size {group_size}")
    return f"q {q:g}, r {r:g}, {base}"


def _weight(fn, q, r, group_size) -> float:
    if group_size is None:
        got = call(fn, "risky_advantage_weight", q, r)
    else:
        got = call(fn, "risky_advantage_weight", q, r, group_size=group_size)
    return expect_real("risky_advantage_weight", got, _words(q, r, group_size))


def _weight_hint(got, q, r, group_size) -> str:
    """A sentence naming the mistake when ``got`` is a known wrong closed form."""
    value = q * r * (q - 1)
    want = _lemma(q, r, group_size)
    near = lambda a: abs(got - a) <= 1e-12 + 1e-9 * abs(a)  # noqa: E731
    if near(want):
        return ""
    G = group_size
    if G is not None and near(value):
        return (f" It is the expected-reward baseline's q r (q - 1): GRPO's group mean includes "
                f"the episode itself, which takes 1/G of its own reward out of its advantage and "
                f"leaves (G - 1) / G = {G - 1}/{G} of the value (eq. gcd-lemma-group).")
    if G is not None and G > 1 and near(value * G / (G - 1)):
        return f" The factor is upside down: it is (G - 1) / G = {G - 1}/{G}, not G / (G - 1)."
    if near(-want):
        return (" The sign is flipped: the action lowers the success probability, so for "
                "0 < q < 1 its expected advantage weight is negative, q r (q - 1) < 0.")
    if q > 0 and near(want / q):
        return (" It is E[A | a], the advantage given that the action is taken; the Lemma "
                "weights it by how often the action is taken: E[A 1{a}] = q E[A | a].")
    return ""


def _closed_form(fn, cases):
    for q, r, group_size in cases:
        got = _weight(fn, q, r, group_size)
        want = _lemma(q, r, group_size)
        if abs(got - want) > 1e-12 + 1e-9 * abs(want):
            where = "eq. gcd-lemma" if group_size is None else "eq. gcd-lemma-group"
            fail(f"`risky_advantage_weight` is wrong for {_words(q, r, group_size)}: it gave "
                 f"{got:.6g}, {where} gives {want:.6g}.{_weight_hint(got, q, r, group_size)}")


@check("risky_advantage_weight", LEMMA)
def closed_form_expected(fn):
    """Eq. gcd-lemma on a grid, the edges q = 0, q = 1 and r = 0 included."""
    _closed_form(fn, [(0.5, 0.4, None), (0.2, 0.4, None), (0.9, 1.0, None), (0.0, 0.5, None),
                      (1.0, 0.5, None), (0.3, 0.0, None)])


@check("risky_advantage_weight", LEMMA)
def closed_form_group(fn):
    """Eq. gcd-lemma-group: GRPO's factor (G - 1) / G, a group of one giving 0."""
    _closed_form(fn, [(0.5, 0.4, 8), (0.2, 0.3, 2), (0.75, 0.6, 4), (0.1, 0.9, 16),
                      (0.5, 0.4, 1), (1.0, 0.4, 8)])


def _fmt(xs) -> str:
    return ", ".join(f"{x:g}" for x in xs)


@check("risky_advantage_weight", LEMMA)
def negative_and_largest_at_one_half(fn):
    r = 0.5
    values = {q: _weight(fn, q, r, None) for q in (0.1, 0.3, 0.5, 0.7, 0.9)}
    bad = [q for q, v in values.items() if not v < 0]
    if bad:
        fail(f"`risky_advantage_weight` is wrong for r {r:g}, q {_fmt(bad)}, the expected reward "
             f"as baseline: it gave {_fmt(values[q] for q in bad)}, but a risky action taken "
             "with probability 0 < q < 1 gets a negative expected advantage weight, "
             "q r (q - 1) < 0.")
    if min(values, key=values.get) != 0.5:
        fail(f"`risky_advantage_weight` is wrong for r {r:g} and q {_fmt(values)}: it gave "
             f"{_fmt(values.values())}, but q r (q - 1) is most negative at q = 1/2.")


GROUPS = 200_000


@check("risky_advantage_weight", LEMMA)
def grpo_simulation(fn):
    """Against the package's simulation with GRPO's mean-centred advantage (recorded). Tolerance:
    six times the largest standard error: in a group of binary rewards with k successes, the
    positive advantages add up to k (1 - k/G) <= G/4, so a group's average of A_i 1{a_i} lies in
    [-1/4, 1/4] (groups are independent; odds below 1e-8)."""
    tol = 6 / (4 * math.sqrt(GROUPS))
    for p, r, q, G in ((0.8, 0.4, 0.5, 8), (0.6, 0.5, 0.3, 2), (1.0, 0.7, 0.8, 4),
                       (0.5, 0.25, 0.2, 16)):
        got = _weight(fn, q, r, G)
        mc = REFS("simulate_risky_action", p, r, q, group_size=G, groups=GROUPS,
                  baseline="group", scale="none", seed=7)
        if abs(got - mc) > tol:
            fail(f"`risky_advantage_weight` is wrong for {_words(q, r, G)}: it gave {got:.4f}, "
                 f"and agentic_rl.gcd.simulate_risky_action (p {p:g}, GRPO's mean-centred "
                 f"advantage, {GROUPS:,} groups) gives {mc:.4f} +- {tol:.4f} (six times the "
                 f"largest standard error).{_weight_hint(got, q, r, G)}")


@check("risky_advantage_weight", LEMMA)
def expected_baseline_simulation(fn):
    """Against the simulation with the expected reward as baseline (recorded): each episode is
    independent and its A 1{a} lies in [-1, 1], so six standard errors are 6 / sqrt(episodes)."""
    G = 8
    tol = 6 / math.sqrt(GROUPS * G)
    for p, r, q in ((0.8, 0.4, 0.5), (0.6, 0.5, 0.3), (0.9, 0.6, 0.85)):
        got = _weight(fn, q, r, None)
        mc = REFS("simulate_risky_action", p, r, q, group_size=G, groups=GROUPS,
                  baseline="expected", seed=7)
        if abs(got - mc) > tol:
            fail(f"`risky_advantage_weight` is wrong for {_words(q, r, None)}: it gave "
                 f"{got:.4f}, and agentic_rl.gcd.simulate_risky_action (p {p:g}, baseline "
                 f"'expected', {GROUPS * G:,} episodes) gives {mc:.4f} +- {tol:.4f} (six times "
                 f"the largest standard error).{_weight_hint(got, q, r, None)}")


# --- q2: judgement_labels ---------------------------------------------------------------------

PROMPT, ACTION, OBSERVATION = 3, 2, 2  # tokens of the prompt, of each action, of each observation


def _package_labels(successes, turns, advantages, rule):
    """The package's labels on a batch with the trainer's layout, as (episode_index,
    action_index, good) tuples. Run only by ``release.py --record``: a prompt, then per turn an
    action (loss mask 1) and the environment's observation (loss mask 0), right-padded;
    ``turn_end`` holds the column of each action's last token, and the advantages ``[B, T]`` are
    each episode's GRPO advantage on its policy tokens, as ``AgentTrainer.compute_advantages``
    broadcasts them."""
    from agentic_rl.gcd import judgement_labels
    from agentic_rl.rollout import Batch

    B = len(turns)
    T = PROMPT + (ACTION + OBSERVATION) * max(turns, default=0) + 1
    loss_mask = torch.zeros(B, T)
    attention_mask = torch.zeros(B, T, dtype=torch.long)
    token_rewards = torch.zeros(B, T)
    turn_end = []
    for i, n in enumerate(turns):
        ends = []
        for k in range(n):
            start = PROMPT + k * (ACTION + OBSERVATION)
            loss_mask[i, start : start + ACTION] = 1.0
            ends.append(start + ACTION - 1)
        turn_end.append(ends)
        attention_mask[i, : PROMPT + (ACTION + OBSERVATION) * n] = 1
        if ends:
            token_rewards[i, ends[-1]] = float(successes[i])
    gen = torch.Generator().manual_seed(B)
    batch = Batch(
        input_ids=torch.randint(5, 100, (B, T), generator=gen) * attention_mask,
        attention_mask=attention_mask, loss_mask=loss_mask, token_rewards=token_rewards,
        group_id=torch.zeros(B, dtype=torch.long),
        extras={"success": torch.tensor(successes, dtype=torch.bool), "turn_end": turn_end,
                "num_turns": torch.tensor(turns, dtype=torch.long)},
    )
    adv = torch.tensor(advantages, dtype=torch.float64)[:, None] * loss_mask
    rows, cols, good = judgement_labels(batch, rule, adv)
    return [(i, turn_end[i].index(c), bool(g)) for i, c, g in zip(rows, cols, good)]


def _labels(fn, successes, turns, advantages, rule, what):
    """The student's labels, checked for type; the inputs must come back unchanged."""
    ins = (list(successes), list(turns), list(advantages))
    got = call(fn, "judgement_labels", *ins, rule)
    if ins != (list(successes), list(turns), list(advantages)):
        fail(f"`judgement_labels` changed its inputs in place for {what}.")
    if not isinstance(got, (list, tuple)):
        fail(f"`judgement_labels` should return a list of (episode_index, action_index, good) "
             f"tuples for {what}, got {type(got).__name__}.")
    out = []
    for item in got:
        ok = isinstance(item, (list, tuple)) and len(item) == 3
        ok = (ok and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                         for x in item[:2])
              and isinstance(item[2], (bool, np.bool_)))
        if not ok:
            fail(f"`judgement_labels` should return (episode_index, action_index, good) tuples "
                 f"of two ints and a bool for {what}, but it holds {item!r}.")
        out.append((int(item[0]), int(item[1]), bool(item[2])))
    return out


def _labels_hint(got, want, successes, turns, advantages, rule) -> str:
    """A sentence naming the mistake, where it is a known one."""
    if sorted(got) == sorted(want):
        return (" The labels are right but not their order: episode after episode and, within "
                "an episode, action after action.")
    if rule != "advantage":
        return ""
    zero = [i for i, a in enumerate(advantages) if a == 0 and turns[i] > 0]
    if any(i in zero for i, _, _ in got):
        return (f" It labels the actions of episode(s) "
                f"{sorted({i for i, _, _ in got if i in zero})} whose advantage is exactly 0; "
                "they get no label (a group with no spread says nothing about its actions).")
    by_outcome = [(i, k, bool(successes[i])) for i, n in enumerate(turns) for k in range(n)]
    by_outcome = [x for x in by_outcome if x[0] not in zero]
    if got == by_outcome and got != want:
        return " It labels by the outcome; the 'advantage' rule labels by the advantage's sign."
    return ""


def _check_labels(fn, successes, turns, advantages, rule, what):
    got = _labels(fn, successes, turns, advantages, rule, what)
    want = [tuple(x) for x in REFS("judgement_labels", list(successes), list(turns),
                                   list(advantages), rule)]
    if got == want:
        return
    hint = _labels_hint(got, want, successes, turns, advantages, rule)
    extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    if extra or missing:
        detail = (f"it returned {len(got)} label(s), agentic_rl.gcd.judgement_labels "
                  f"{len(want)}; first label it gives that the package does not: "
                  f"{extra[0] if extra else 'none'}; first the package gives that it does not: "
                  f"{missing[0] if missing else 'none'}")
    else:
        detail = f"it returned {got}, agentic_rl.gcd.judgement_labels {want}"
    fail(f"`judgement_labels` is wrong for rule {rule!r} and {what}: {detail}.{hint}")


EXAMPLE = ([True, False, True, False, False, False], [2, 3, 1, 3, 2, 1],
           [0.577, -1.155, 0.577, 0.0, 0.0, 0.0])
EXAMPLE_WORDS = ("the worked example (successes 1, 0, 1 | 0, 0, 0, actions 2, 3, 1 | 3, 2, 1, "
                 "advantages 0.577, -1.155, 0.577 | 0, 0, 0)")


@check("judgement_labels", LABELS)
def labels_worked_example(fn, rule: str):
    _check_labels(fn, *EXAMPLE, rule, EXAMPLE_WORDS)


HAND_CASES = [
    ([True, False], [0, 2], [0.5, -0.5], "outcome", "an episode with no action (0 turns)"),
    ([True, False], [0, 2], [0.5, -0.5], "advantage", "an episode with no action (0 turns)"),
    ([True] * 4, [2, 1, 3, 2], [0.0] * 4, "advantage",
     "a group of 4 all solved (advantages all 0: no label at all)"),
    ([True] * 4, [2, 1, 3, 2], [0.0] * 4, "outcome", "a group of 4 all solved (every action good)"),
    ([True, False, False, True], [1, 2, 2, 1], [1e-6, -1e-6, 0.0, -0.0], "advantage",
     "tiny advantages 1e-6 and -1e-6 (still a sign) and a -0.0 (exactly 0)"),
    ([True, False, True], [2, 2, 2], [-0.3, 0.4, 0.0], "advantage",
     "advantages whose sign disagrees with the outcome (another group's rewards)"),
    ([], [], [], "outcome", "an empty batch"),
]


@check("judgement_labels", LABELS)
def labels_hand_cases(fn):
    for successes, turns, advantages, rule, what in HAND_CASES:
        _check_labels(fn, successes, turns, advantages, rule, what)


def _grpo_advantages(successes, ids, scale):
    """GRPO's advantage of binary rewards (the group's unbiased std, or none): only the inputs."""
    scores = torch.tensor(successes, dtype=torch.float64)
    out = torch.zeros_like(scores)
    for g in ids.unique():
        rows = ids == g
        centred = scores[rows] - scores[rows].mean()
        out[rows] = centred if scale == "none" else centred / (scores[rows].std() + 1e-6)
    return out.tolist()


@check("judgement_labels", LABELS)
def labels_random_batches(fn):
    """40 seeded batches of 1 to 3 groups of 2, 4 or 8 episodes with 0 to 5 actions each."""
    gen = torch.Generator().manual_seed(0)
    for k in range(40):
        G = [2, 4, 8][int(torch.randint(0, 3, (1,), generator=gen))]
        num_groups = int(torch.randint(1, 4, (1,), generator=gen))
        B = G * num_groups
        solve = torch.rand(num_groups, generator=gen).repeat_interleave(G)
        successes = (torch.rand(B, generator=gen) < solve).tolist()
        turns = torch.randint(0, 6, (B,), generator=gen).tolist()
        ids = torch.arange(num_groups).repeat_interleave(G)
        scale = "group" if k % 2 else "none"
        advantages = _grpo_advantages(successes, ids, scale)
        rule = "advantage" if k % 3 else "outcome"
        what = (f"random batch {k} ({num_groups} group(s) of {G}: successes "
                f"{[int(s) for s in successes]}, actions {turns}, GRPO advantages (scale "
                f"{scale!r}) {[round(a, 3) for a in advantages]})")
        _check_labels(fn, successes, turns, advantages, rule, what)


@check("judgement_labels", LABELS)
def labels_reject_unknown_rule(fn):
    for rule in ("oracle", "Outcome", "sign"):
        message = None
        try:
            fn(*EXAMPLE, rule)
        except ValueError as err:
            if rule in str(err):
                continue
            message = (f"`judgement_labels` raised ValueError for rule={rule!r}, but its message "
                       f"({err}) does not name the rule.")
        except NotImplementedError:
            message = "`judgement_labels` is not implemented yet (it raises NotImplementedError)."
        except Exception as err:  # noqa: BLE001
            message = (f"`judgement_labels` raised {type(err).__name__} for rule={rule!r}; "
                       "expected a ValueError naming it (only 'outcome' and 'advantage' exist "
                       "here).")
        if message is None:
            message = (f"`judgement_labels` returned for rule={rule!r}; it should raise "
                       "ValueError naming it (only 'outcome' and 'advantage' exist here).")
        fail(message)


# --- q3: gradient_cosine ----------------------------------------------------------------------


def _cosine(fn, g_a, g_b, what):
    """The student's cosine, checked for type and shape; the inputs must come back unchanged."""
    a_in, b_in = g_a.clone(), g_b.clone()
    got = call(fn, "gradient_cosine", a_in, b_in)
    if not (torch.equal(a_in, g_a) and torch.equal(b_in, g_b)):
        fail(f"`gradient_cosine` changed its inputs in place for {what}.")
    return expect_tensor("gradient_cosine", got, what, shape=(g_a.shape[0],),
                         why=": one cosine per row (pair)")


def _nan_hint(got) -> str:
    if torch.isnan(got.detach()).any():
        return (" It returns NaN: a zero gradient has no direction, and eq. gcd-cos is 0/0 "
                "there; return 0.0 wherever either row of a pair is zero.")
    return ""


@check("gradient_cosine", COSINE)
def cosine_matches_torch(fn):
    for N, P, dtype in ((16, 50, torch.float64), (8, 1000, torch.float32), (1, 3, torch.float64)):
        gen = torch.Generator().manual_seed(N + P)
        g_a = torch.randn(N, P, generator=gen, dtype=dtype)
        g_b = 0.5 * g_a + torch.randn(N, P, generator=gen, dtype=dtype)
        what = f"{N} random pair(s) of {P}-dimensional {str(dtype).split('.')[-1]} gradients"
        got = _cosine(fn, g_a, g_b, what)
        want = torch.nn.functional.cosine_similarity(g_a, g_b, dim=1)
        expect_close("gradient_cosine", got, want,
                     f"{what} (compared with torch.nn.functional.cosine_similarity)",
                     atol=1e-5, rtol=1e-5, hint=lambda: _nan_hint(got))


COSINE_CASES = [
    ([[1.0, 2.0, 0.0]], [[2.0, 4.0, 0.0]], [1.0], "two gradients in the same direction"),
    ([[1.0, 2.0, 0.0]], [[-3.0, -6.0, 0.0]], [-1.0], "two opposite gradients"),
    ([[1.0, 0.0, 0.0]], [[0.0, 3.0, 0.0]], [0.0], "two orthogonal gradients"),
    ([[2.0]], [[-0.5]], [-1.0], "one parameter of opposite signs"),
    ([[1.0, 1.0], [3.0, 4.0]], [[1.0, 0.0], [4.0, 3.0]], [0.5**0.5, 24 / 25], "two pairs"),
]


@check("gradient_cosine", COSINE)
def cosine_hand_cases(fn):
    for g_a, g_b, want, what in COSINE_CASES:
        a = torch.tensor(g_a, dtype=torch.float64)
        b = torch.tensor(g_b, dtype=torch.float64)
        got = _cosine(fn, a, b, what)
        expect_close("gradient_cosine", got, torch.tensor(want, dtype=torch.float64),
                     f"{what} ({g_a} and {g_b})", atol=1e-6, hint=lambda: _nan_hint(got))


@check("gradient_cosine", COSINE)
def cosine_of_zero_gradients(fn):
    gen = torch.Generator().manual_seed(1)
    g_a = torch.randn(5, 20, generator=gen, dtype=torch.float64)
    g_b = torch.randn(5, 20, generator=gen, dtype=torch.float64)
    g_a[0], g_b[1], g_a[2], g_b[2] = 0.0, 0.0, 0.0, 0.0
    what = ("5 pairs of 20-dimensional gradients where g_a is zero in row 0, g_b in row 1 and "
            "both in row 2 (rows 3 and 4 random)")
    got = _cosine(fn, g_a, g_b, what)
    want = torch.nn.functional.cosine_similarity(g_a, g_b, dim=1)
    want[:3] = 0.0
    expect_close("gradient_cosine", got, want, what, atol=1e-6, hint=lambda: _nan_hint(got))
    what = "3 pairs of zero gradients (float32)"
    got = _cosine(fn, torch.zeros(3, 7), torch.zeros(3, 7), what)
    expect_close("gradient_cosine", got, torch.zeros(3), what, hint=lambda: _nan_hint(got))


@check("gradient_cosine", COSINE)
def cosine_scale_invariant_and_symmetric(fn):
    gen = torch.Generator().manual_seed(2)
    g_a = torch.randn(6, 30, generator=gen, dtype=torch.float64)
    g_b = torch.randn(6, 30, generator=gen, dtype=torch.float64) + g_a
    base = _cosine(fn, g_a, g_b, "6 random pairs of 30-dimensional gradients")
    for c_a, c_b in ((1e3, 1.0), (1.0, 1e-3), (7.5, 2e4), (-1.0, 1.0), (-2.0, -0.1)):
        what = f"6 random pairs with g_a scaled by {c_a:g} and g_b by {c_b:g}"
        got = _cosine(fn, c_a * g_a, c_b * g_b, what)
        sign = 1.0 if c_a * c_b > 0 else -1.0
        expect_close("gradient_cosine", got, sign * base,
                     f"{what}: a positive factor must change nothing and a negative one flip the "
                     "sign (compared with its own value on the unscaled pairs)", atol=1e-6)
    got = _cosine(fn, g_b, g_a, "6 random pairs with g_a and g_b swapped")
    expect_close("gradient_cosine", got, base,
                 "6 random pairs with g_a and g_b swapped: the cosine is symmetric (compared "
                 "with its own value on the pairs in order)", atol=1e-9)
    if (base.abs() > 1 + 1e-6).any():
        fail(f"`gradient_cosine` returned {base.tolist()} for 6 random pairs: a cosine lies in "
             "[-1, 1].")
