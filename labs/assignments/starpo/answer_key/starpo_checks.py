"""Hidden checks of the StarPO assignment (carried by the autograder; the student never sees them).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. The filter's and the indicator's expected values are recorded from
``agentic_rl.filters`` and ``agentic_rl.starpo`` (``starpo_reference.json``) or derived by hand in
the check. The bandit simulation that ``expected_bandit_gradient`` is graded against is not in the
package: the grader's own copy (``_bandit_reference``) is below, with the dragon's coin shared by
a group's rollouts (``coin="shared"``, as ``BanditEnv`` and RAGEN draw it from the group's seed)
or flipped per rollout (``coin="independent"``).
"""

from __future__ import annotations

import inspect
import math
import numbers
import pathlib

import numpy as np
import torch

from gradelib import References, call, check, expect_real, expect_tensor, fail

REFS = References(pathlib.Path(__file__).with_name("starpo_reference.json"), {
    "reward_std_filter": "agentic_rl.filters:reward_std_filter",
    "distinct_per_group": "agentic_rl.starpo:distinct_per_group",
})
FILTER = ("agentic_rl.filters:reward_std_filter",)
DISTINCT = ("agentic_rl.starpo:distinct_per_group",)
BANDIT = ()  # the package has no answer to this question: the simulation is the grader's own

COIN_WORDS = {"shared": "one coin per group, as the environment draws it",
              "independent": "one coin per rollout"}


# --- q1: reward_std_filter ----------------------------------------------------------------------


def _fmt(xs) -> str:
    return ", ".join(f"{x:g}" for x in xs)


def _groups_of(keep, group_ids) -> list[int]:
    return sorted(set(group_ids[keep].tolist()))


def _group_stds(scores, group_ids) -> list[float]:
    """The unbiased std of each group (0 for a group of one), groups in increasing id."""
    s = scores.double()
    return [float(s[group_ids == g].std()) if int((group_ids == g).sum()) > 1 else 0.0
            for g in torch.unique(group_ids).tolist()]


def _check_filter(fn, scores, group_ids, what, **kwargs):
    """Call the student's filter on one batch and compare it with the recorded reference."""
    s_in, g_in = scores.clone(), group_ids.clone()
    got = call(fn, "reward_std_filter", s_in, g_in, **kwargs)
    expect_tensor("reward_std_filter", got, what, shape=scores.shape, dtype=torch.bool,
                  why=" (one entry per row)")
    if not (torch.equal(s_in, scores) and torch.equal(g_in, group_ids)):
        fail(f"`reward_std_filter` changed its inputs in place for {what}.")
    got = got.cpu()
    for g in torch.unique(group_ids).tolist():
        rows = got[group_ids == g]
        if rows.any() and not rows.all():
            fail(f"`reward_std_filter` is wrong for {what}: it keeps only some rows of group "
                 f"{g}; groups are kept or dropped whole.")
    want = REFS("reward_std_filter", scores, group_ids, **kwargs)
    if torch.equal(got, want):
        return
    ids = torch.unique(group_ids).tolist()
    stds = ", ".join(f"group {g}: {s:.4g}" for g, s in zip(ids, _group_stds(scores, group_ids)))
    mine, theirs = _groups_of(got, group_ids), _groups_of(want, group_ids)
    fail(f"`reward_std_filter` is wrong for {what}: it kept group(s) {mine or 'none'}, expected "
         f"{theirs or 'none'} (the unbiased in-group stds are {stds}).")


#: the worked example: 4 groups of 2, stds 0.0707, 0, 7.07, 0
EXAMPLE = (torch.tensor([1.0, 1.1, 5.0, 5.0, 10.0, 20.0, 0.0, 0.0]),
           torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
EXAMPLE_WORDS = "4 groups of 2 (scores 1, 1.1 | 5, 5 | 10, 20 | 0, 0)"
EXAMPLE_CASES = [
    (dict(), f"the default top_k 0.25 over {EXAMPLE_WORDS}, which keeps max(1, int(0.25 * 4)) = "
     "1 group"),
    (dict(value=0.5), f"top_k 0.5 over {EXAMPLE_WORDS}"),
    (dict(value=0.75), f"top_k 0.75 over {EXAMPLE_WORDS}, where the two zero-std groups 1 and 3 "
     "tie for the third place (ties go to the lower group id)"),
    (dict(value=0.75, include_zero=False), f"top_k 0.75 with include_zero=False over "
     f"{EXAMPLE_WORDS}: k = int(0.75 * 4) = 3 counts all 4 groups, and the zero-std groups leave "
     "the ranking, so the 2 that remain are kept"),
    (dict(value=0.1), f"top_k 0.1 over {EXAMPLE_WORDS}: int(0.1 * 4) = 0, but top_k keeps at "
     "least one group"),
    (dict(strategy="top_p", value=0.9), f"top_p 0.9 over {EXAMPLE_WORDS}"),
    (dict(strategy="top_p", value=1.0), f"top_p 1.0 over {EXAMPLE_WORDS}"),
]


@check("reward_std_filter", FILTER)
def worked_example(fn):
    """The chapter's ranking (highest std first) on the worked example, top_k and top_p."""
    for kwargs, what in EXAMPLE_CASES:
        _check_filter(fn, *EXAMPLE, what, **kwargs)


@check("reward_std_filter", FILTER)
def unbiased_std(fn):
    scores = torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    ids = torch.tensor([0, 0, 0, 0, 1, 1])
    _check_filter(fn, scores, ids, "top_k 0.5 over a group of 4 (scores 0, 0, 1, 1) and a group "
                  "of 2 (scores 0, 1): the std must be the unbiased one (Bessel's correction, as "
                  "torch.std), 0.577 against 0.707, so the group of 2 ranks first", value=0.5)


@check("reward_std_filter", FILTER)
def ties_and_labels(fn):
    """Ties go to the lower id (not the earlier row); interleaved rows; a group of one."""
    scores = torch.tensor([0.0, 1.0, 2.0, 2.0, 1.0, 0.0, 0.0, 4.0])
    ids = torch.tensor([7, 7, 3, 3, 5, 5, 9, 9])
    _check_filter(fn, scores, ids, "top_k 0.5 over 4 groups where two groups tie (groups with "
                  "ids 7, 3, 5, 9 in that order of rows; 7 and 5 tie at std 0.707 for the second "
                  "place, and the lower id, 5, goes first although its rows come later)",
                  value=0.5)
    scores = torch.tensor([0.0, 2.0, 5.0, 1.0, 2.0, 0.5, 0.0, 0.5])
    ids = torch.tensor([4, 1, 8, 4, 1, 4, 1, 4])  # group 8 is a single rollout
    _check_filter(fn, scores, ids, "top_k 0.5 over 3 groups whose rows are interleaved (ids 4, "
                  "1, 8, 4, 1, 4, 1, 4), one of them a single rollout (std 0)", value=0.5)
    _check_filter(fn, scores, ids, "top_k 1.0 with include_zero=False over 3 interleaved groups, "
                  "one of them a single rollout (std 0, so it leaves the ranking)", value=1.0,
                  include_zero=False)


@check("reward_std_filter", FILTER)
def counting_and_no_spread(fn):
    """k counts all the groups; a batch with no spread keeps nothing (or the lowest ids)."""
    scores = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.5, 0.5, 2.0, 2.0, 0.0, 0.0, 3.0, 3.0])
    ids = torch.arange(6).repeat_interleave(2)
    _check_filter(fn, scores, ids, "top_k 0.5 with include_zero=False over 6 groups of which "
                  "only one has any spread: k = int(0.5 * 6) = 3 counts all the groups, and the "
                  "ranking, shorter, keeps the one", value=0.5, include_zero=False)
    _check_filter(fn, scores, ids, "top_k 0.5 over 6 groups of which only one has any spread "
                  "(include_zero=True: the zero-std groups fill the other places, lower ids "
                  "first)", value=0.5)
    flat = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.15, 0.15, 1.0, 1.0])
    flat_ids = torch.tensor([3, 3, 0, 0, 2, 2, 1, 1])
    for kwargs, what in [
        (dict(include_zero=False), "top_k 0.25 with include_zero=False over a batch with no "
         "spread at all (every group's rewards equal): no group qualifies, so the mask is all "
         "False"),
        (dict(strategy="top_p", value=0.5), "top_p 0.5 over a batch with no spread at all "
         "(every group's rewards equal): the total std is 0, so the mask is all False"),
        (dict(value=0.5), "top_k 0.5 over a batch with no spread at all (include_zero=True): "
         "every group ties at 0, so the lowest ids are kept"),
    ]:
        _check_filter(fn, flat, flat_ids, what, **kwargs)


@check("reward_std_filter", FILTER)
def top_p(fn):
    scores = torch.tensor([0.0, 4.0, 0.0, 2.0, 2.0, 0.0, 0.0, 1.0])
    ids = torch.arange(4).repeat_interleave(2)  # stds 2.83, 1.41, 1.41, 0.707
    _check_filter(fn, scores, ids, "top_p 0.5 over 4 groups with stds 2.83, 1.41, 1.41 and "
                  "0.707, where the summed std first reaches 0.5 * total - eps with the second "
                  "group (groups 1 and 2 tie: the lower id goes first)", strategy="top_p",
                  value=0.5)
    _check_filter(fn, scores, ids, "top_p 0.8 over 4 groups with stds 2.83, 1.41, 1.41 and "
                  "0.707", strategy="top_p", value=0.8)
    scores = torch.tensor([0.0, 4.0, 0.0, 2.0, 0.0, 2.0 ** -7])
    ids = torch.arange(3).repeat_interleave(2)  # stds 2.83, 1.41, 0.0055
    _check_filter(fn, scores, ids, "top_p 1.0 over 3 groups with stds 2.83, 1.41 and 0.0055: "
                  "the summed std must reach value * total - eps with eps = 0.01, which the first "
                  "two groups already do", strategy="top_p", value=1.0)
    _check_filter(fn, scores, ids, "top_p 1.0 with eps=0 over 3 groups with stds 2.83, 1.41 and "
                  "0.0055: without the slack all three groups are needed (use the eps argument)",
                  strategy="top_p", value=1.0, eps=0.0)


def _random_batch(gen):
    """Groups of 1, 2, 4 or 8 rollouts with rewards in {0, 0.25, 0.5, 1, 2}, interleaved rows and
    labels that are not 0..P-1. Dyadic rewards and power-of-two groups: every std is computed
    exactly enough that ties are ties in any precision (float32, float64, any summation order)."""
    num_groups = int(torch.randint(1, 11, (1,), generator=gen))
    labels = torch.randperm(40, generator=gen)[:num_groups]
    sizes = [[1, 2, 4, 8][int(i)] for i in torch.randint(0, 4, (num_groups,), generator=gen)]
    ids = torch.cat([torch.full((n,), int(g)) for g, n in zip(labels, sizes)])
    ids = ids[torch.randperm(len(ids), generator=gen)]
    levels = torch.tensor([0.0, 0.25, 0.5, 1.0, 2.0])
    few = torch.randint(1, 6, (1,), generator=gen)  # some batches use only 0 and 0.25: many ties
    scores = levels[torch.randint(0, int(few), ids.shape, generator=gen)]
    return scores, ids


def _clear_of_the_threshold(scores, ids, value, include_zero, eps) -> bool:
    """False when a top_p cumulative sum lands within 1e-4 of its threshold (float noise could
    then decide), so that such a batch is not used."""
    std = torch.tensor(_group_stds(scores, ids), dtype=torch.float64).sort(descending=True).values
    if not include_zero:
        std = std[std > 0]
    threshold = value * float(std.sum()) - eps
    return bool(((torch.cumsum(std, 0) - threshold).abs() > 1e-4).all())


@check("reward_std_filter", FILTER)
def random_batches(fn):
    gen = torch.Generator().manual_seed(0)
    k = 0
    while k < 60:
        scores, ids = _random_batch(gen)
        strategy = ["top_k", "top_p"][k % 2]
        value = [0.1, 0.25, 0.5, 0.75, 0.9, 1.0][int(torch.randint(0, 6, (1,), generator=gen))]
        include_zero = bool(torch.randint(0, 2, (1,), generator=gen))
        if strategy == "top_p" and not _clear_of_the_threshold(scores, ids, value, include_zero,
                                                                0.01):
            continue
        dtype = [torch.float32, torch.float64][k % 3 == 0]
        groups = sorted(set(ids.tolist()))
        _check_filter(fn, scores.to(dtype), ids, f"random batch {k} ({strategy} {value}, "
                      f"include_zero={include_zero}, {len(groups)} group(s) with ids {groups}, "
                      f"scores {_fmt(scores.tolist())} with group ids {ids.tolist()}, dtype "
                      f"{str(dtype).replace('torch.', '')})", strategy=strategy, value=value,
                      include_zero=include_zero)
        k += 1


def _train_bandit(keep_rows, steps=60, lr=0.1, seed=0, coin="shared"):
    """GRPO on the dragon's logit, 8 groups of 8 pulls a step; returns P(dragon) at the end. The
    dragon's coin is one per group (``coin="shared"``, the environment's) or one per rollout."""
    gen = torch.Generator().manual_seed(seed)
    z, ids = 0.0, torch.arange(8).repeat_interleave(8)
    for _ in range(steps):
        p = 1 / (1 + math.exp(-z))
        dragon = torch.rand(64, generator=gen, dtype=torch.float64) < p
        if coin == "shared":
            wins = (torch.rand(8, generator=gen, dtype=torch.float64) < 0.25).repeat_interleave(8)
        else:
            wins = torch.rand(64, generator=gen, dtype=torch.float64) < 0.25
        r = torch.where(dragon, wins.double(), 0.15)
        groups = r.view(8, 8)
        adv = ((groups - groups.mean(1, keepdim=True))
               / (groups.std(1, keepdim=True) + 1e-6)).flatten()
        keep = keep_rows(r, ids)
        if not isinstance(keep, torch.Tensor) or keep.shape != r.shape or keep.dtype != torch.bool:
            fail("`reward_std_filter` should return a torch.bool tensor of shape [64] for a "
                 "bandit batch of 8 groups of 8 pulls.")
        k = max(len(set(ids[keep].tolist())), 1)
        z += lr * float((adv * (dragon.double() - p))[keep].sum()) / k
        z = min(max(z, -30.0), 30.0)
    return 1 / (1 + math.exp(-z))


@check("reward_std_filter", FILTER)
def bandit_training(fn):
    """The chapter's point: keeping the most uncertain groups makes GRPO pick the dragon."""
    for coin in ("shared", "independent"):
        for kwargs in (dict(strategy="top_k", value=0.25), dict(strategy="top_p", value=0.5)):
            plain = _train_bandit(lambda r, ids: torch.ones_like(r, dtype=torch.bool), coin=coin)
            mine = _train_bandit(lambda r, ids: call(fn, "reward_std_filter", r, ids, **kwargs),
                                 coin=coin)
            name = f"{kwargs['strategy']} {kwargs['value']}"
            if not mine > 0.8:
                fail(f"`reward_std_filter` ({name}) does not make GRPO pick the dragon: 60 GRPO "
                     f"steps on the two-armed bandit (8 groups of 8 pulls a step, "
                     f"{COIN_WORDS[coin]}, std-normalised advantages, lr 0.1 on the dragon's "
                     f"logit) with your filter should raise P(dragon) from 0.5 to above 0.8, as "
                     f"the chapter's StarPO-S does; it ended at {mine:.3f} (without any filter: "
                     f"{plain:.3f}).")


# --- q2: distinct_per_group ---------------------------------------------------------------------

PLANS = ["Right Down", "Down Down", "Right Down", "Down Right",
         "Down Down", "Down Down", "Down Down", "Down Down"]


def _check_distinct(fn, completions, group_ids, what):
    c_in = list(completions)
    got = call(fn, "distinct_per_group", c_in, group_ids.clone())
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        fail(f"`distinct_per_group` should return a Python float for {what}, "
             f"got {type(got).__name__}.")
    if c_in != completions:
        fail(f"`distinct_per_group` changed the list of completions in place for {what}.")
    want = REFS("distinct_per_group", list(completions), group_ids)
    if not abs(float(got) - want) <= 1e-9:
        fail(f"`distinct_per_group` is wrong for {what}: it gave {float(got):.6g}, expected "
             f"{want:.6g} (the mean over groups of the number of distinct strings in each "
             "group).")


@check("distinct_per_group", DISTINCT)
def distinct_hand_cases(fn):
    for ids, what in [
        ([0, 0, 0, 0, 1, 1, 1, 1], "the worked example (two groups of 4 FrozenLake plans: 3 "
         "distinct, then 1)"),
        ([0] * 8, "the worked example's 8 plans in one group (3 distinct strings)"),
        (list(range(8)), "8 groups of one rollout each (one distinct string per group)"),
        ([6, 2, 6, 2, 6, 2, 6, 2], "the worked example's plans with interleaved groups 6 and 2"),
        ([0, 0, 0, 0, 0, 0, 0, 1], "a group of 7 (3 distinct plans) and a group of 1: each group "
         "counts once, whatever its size"),
    ]:
        _check_distinct(fn, PLANS, torch.tensor(ids), what)


@check("distinct_per_group", DISTINCT)
def distinct_edge_cases(fn):
    texts = ["Left", "left", "Left ", "Left", "Up Up", "Up  Up", "Up Up", "Up Up"]
    _check_distinct(fn, texts, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]), "strings that differ "
                    "only in case or whitespace (\"Left\", \"left\", \"Left \"), which count as "
                    "distinct")
    _check_distinct(fn, [], torch.tensor([], dtype=torch.long), "an empty batch (0.0)")


@check("distinct_per_group", DISTINCT)
def distinct_random_batches(fn):
    gen = torch.Generator().manual_seed(1)
    moves = ["Up", "Down", "Left", "Right"]
    for k in range(30):
        n = int(torch.randint(1, 33, (1,), generator=gen))
        ids = torch.randint(0, int(torch.randint(1, 9, (1,), generator=gen)), (n,), generator=gen)
        texts = [" ".join(moves[int(i)] for i in torch.randint(
            0, 2 + k % 3, (int(torch.randint(1, 3, (1,), generator=gen)),), generator=gen))
            for _ in range(n)]
        _check_distinct(fn, texts, ids, f"random batch {k} ({n} rollouts, group ids "
                        f"{ids.tolist()})")


# --- q3: expected_bandit_gradient ---------------------------------------------------------------


def _bandit_reference(p, group_size, *, low_payoff=0.15, scale="group", keep_fraction=1.0,
                      num_groups=8, samples=20000, seed=0, coin="shared", ddof=1):
    """The grader's simulation: ``(mean of g over the batches, its standard error)``. ``ddof=0``
    (the biased std) only to recognise that mistake."""
    rng = np.random.default_rng(seed)
    shape = (samples, num_groups, group_size)
    pulls = rng.random(shape) < p
    wins = rng.random((samples, num_groups, 1) if coin == "shared" else shape) < 0.25
    rewards = np.where(pulls, wins.astype(float), low_payoff)
    centred = rewards - rewards.mean(-1, keepdims=True)
    std = rewards.std(-1, ddof=ddof)
    adv = centred / (std[..., None] + 1e-6) if scale == "group" else centred
    g = (adv * (pulls - p)).sum(-1)
    k = max(1, int(keep_fraction * num_groups))
    top = np.argsort(-std, axis=-1, kind="stable")[:, :k]
    per_batch = np.take_along_axis(g, top, -1).mean(-1)
    return float(per_batch.mean()), float(per_batch.std(ddof=1) / math.sqrt(samples))


def _expected_pull_std(p, group_size) -> float:
    """E[s_x], the unbiased std of the group's pull indicators: k ~ Binomial(G, p) dragons give
    s_x = sqrt(k (G - k) / (G (G - 1)))."""
    n = group_size
    return sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k)
               * math.sqrt(k * (n - k) / (n * (n - 1))) for k in range(n + 1))


def _describe(p, group_size, kwargs) -> str:
    scale, keep = kwargs.get("scale", "group"), kwargs.get("keep_fraction", 1.0)
    words = "GRPO (scale='group')" if scale == "group" else "Dr. GRPO (scale='none')"
    words += " without a filter" if keep == 1.0 else (
        f" with the filter (keep_fraction={keep:g}: the most uncertain groups)")
    if "coin" in kwargs:
        words += f", {COIN_WORDS[kwargs['coin']]} (coin='{kwargs['coin']}')"
    else:
        words += ", coin left at its default (which must be 'shared': one coin per group)"
    extra = [f"{k}={v}" for k, v in kwargs.items() if k not in ("scale", "keep_fraction", "coin")]
    return (f"{words}, p={p}, group_size={group_size}"
            + (", " + ", ".join(extra) if extra else ""))


def _takes_coin(fn) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True  # not inspectable: let the call say what is wrong
    return "coin" in params or any(q.kind is q.VAR_KEYWORD for q in params.values())


def _estimate(fn, p, group_size, **kwargs) -> float:
    if "coin" in kwargs and not _takes_coin(fn):
        fail("`expected_bandit_gradient` does not take the keyword argument `coin`: add "
             "coin=\"shared\" to its signature (one coin per group, the default, as the "
             "environment draws it; \"independent\": one coin per rollout).")
    got = call(fn, "expected_bandit_gradient", p, group_size, **kwargs)
    return expect_real("expected_bandit_gradient", got, _describe(p, group_size, kwargs),
                       why=" (an all-equal group has std 0: its advantages are 0 / (0 + 1e-6) "
                           "= 0)")


def _coin_hint(got, want, tol, p, group_size, kwargs) -> str:
    """A sentence when ``got`` matches the other coin's simulation and not this one's."""
    coin = kwargs.get("coin", "shared")
    other = "independent" if coin == "shared" else "shared"
    theirs, _ = _bandit_reference(p, group_size, **dict(kwargs, coin=other))
    if abs(got - theirs) > tol or abs(theirs - want) <= 2 * tol:
        return ""
    if coin == "shared":
        return (" It matches one coin per rollout (coin='independent'): with coin='shared', the "
                "default, draw one coin per group, wins of shape (samples, num_groups, 1), and "
                "broadcast it over the group's rollouts.")
    return (" It matches one coin per group (coin='shared'): with coin='independent', draw one "
            "coin per rollout, wins of shape (samples, num_groups, group_size).")


def _scale_hint(got, exact, tol, group_size) -> str:
    """A sentence when ``got`` is the closed form divided by the group size."""
    if abs(got * group_size - exact) <= tol * group_size and abs(got - exact) > tol:
        return (" It is about group_size times too small: g sums over a group's rollouts, it "
                "does not average them.")
    return ""


def _sign(fn, p, group_size, sign, why, **kwargs):
    """The direction of the drift, the chapter's finding: only the sign of the estimate."""
    got = _estimate(fn, p, group_size, **kwargs)
    if not got * sign > 0:
        want, se = _bandit_reference(p, group_size, **kwargs)
        hint = _coin_hint(got, want, 5 * math.sqrt(2) * se + 1e-9, p, group_size, kwargs)
        fail(f"`expected_bandit_gradient` has the wrong sign for "
             f"{_describe(p, group_size, kwargs)}: it gave {got:+.4f}, expected a "
             f"{'positive' if sign > 0 else 'negative'} E[g] ({why}; the grader's simulation "
             f"gives {want:+.4f}).{hint}")


def _close(fn, p, group_size, **kwargs):
    """The estimate against the grader's simulation, within Monte-Carlo noise."""
    got = _estimate(fn, p, group_size, **kwargs)
    want, se = _bandit_reference(p, group_size, **kwargs)
    tol = 5 * math.sqrt(2) * se + 1e-9  # two independent estimates, 5 standard errors
    if abs(got - want) <= tol:
        return
    hints = [_coin_hint(got, want, tol, p, group_size, kwargs)]
    k = max(1, int(kwargs.get("keep_fraction", 1.0) * kwargs.get("num_groups", 8)))
    if hints[0]:
        pass  # the coin explains it
    elif abs(got + want) <= tol:
        hints.append(" Its sign is flipped: g uses 1{dragon} - p, the derivative of log pi(a) "
                     "with respect to the dragon's logit.")
    elif abs(got * group_size - want) <= tol * group_size:
        hints.append(" It is about group_size times too small: g sums over a group's rollouts, "
                     "it does not average them.")
    elif k > 1 and abs(got - k * want) <= tol * k:
        hints.append(" It is about k times too large: g averages over the kept groups (the "
                     "1/k), it does not sum them.")
    elif kwargs.get("scale", "group") == "group" and abs(
            got - _bandit_reference(p, group_size, **kwargs, ddof=0)[0]) <= tol:
        hints.append(" It matches the biased std (ddof=0): s must be the unbiased std of the "
                     "group's rewards (ddof=1), for the advantages and for the ranking.")
    fail(f"`expected_bandit_gradient` is wrong for {_describe(p, group_size, kwargs)}: it gave "
         f"{got:+.4f}, the grader's simulation gives {want:+.4f} +- {tol:.4f} "
         f"({kwargs.get('samples', 20000):,} batches; five standard errors of the difference of "
         f"two estimates).{''.join(hints)}")


@check("expected_bandit_gradient", BANDIT)
def grpo_drift(fn):
    """Std-normalised GRPO drifts to the phoenix (shared coin, any p and G; groups of 8)."""
    for p, group_size in ((0.5, 8), (0.9, 8), (0.5, 16), (0.9, 16)):
        _sign(fn, p, group_size, -1, "with one coin per group a group's rewards are affine in "
              "its pulls, so the std-normalised advantage keeps only the sign of the coin, which "
              "the dragon loses in three groups out of four: the drift is negative at every p "
              "and every group size", coin="shared")
    _sign(fn, 0.5, 8, -1, "with one coin per rollout and groups of 8, dividing by the group's "
          "std still makes GRPO push toward the safe arm although the dragon pays more on "
          "average", coin="independent")
    _sign(fn, 0.5, 16, +1, "with one coin per rollout, groups of 16 rarely have no paying "
          "dragon, and at p=0.5 GRPO drifts toward the dragon", coin="independent")


@check("expected_bandit_gradient", BANDIT)
def filter_reverses_the_drift(fn):
    for p, group_size, coin in ((0.5, 8, "shared"), (0.5, 8, "independent"),
                                (0.9, 16, "shared")):
        _sign(fn, p, group_size, +1, "keeping only the most uncertain quarter of the groups, "
              "StarPO-S's filter, pushes toward the dragon", keep_fraction=0.25, coin=coin)


@check("expected_bandit_gradient", BANDIT)
def dr_grpo_closed_form(fn):
    for coin in ("shared", "independent"):
        _sign(fn, 0.5, 8, +1, "without the std, the update follows the expected reward, and the "
              "dragon pays more", scale="none", coin=coin)
        for p, group_size, low in ((0.5, 8, 0.15), (0.2, 4, 0.1), (0.9, 16, 0.15)):
            kwargs = dict(low_payoff=low, scale="none", coin=coin)
            got = _estimate(fn, p, group_size, **kwargs)
            exact = (group_size - 1) * p * (1 - p) * (0.25 - low)
            _, se = _bandit_reference(p, group_size, **kwargs)
            if abs(got - exact) > 5 * se + 1e-9:
                hint = _scale_hint(got, exact, 5 * se + 1e-9, group_size)
                fail(f"`expected_bandit_gradient` is wrong for "
                     f"{_describe(p, group_size, kwargs)}: it gave {got:+.4f}, but without the "
                     f"std E[g] = (G - 1) p (1 - p) (0.25 - low_payoff) = {exact:+.4f} exactly, "
                     f"with either coin (+- {5 * se:.4f} for a 20,000-batch estimate).{hint}")


@check("expected_bandit_gradient", BANDIT)
def shared_coin_closed_form(fn):
    for p, group_size, low in ((0.5, 8, 0.15), (0.1, 16, 0.15), (0.9, 4, 0.1)):
        kwargs = dict(low_payoff=low, coin="shared")
        got = _estimate(fn, p, group_size, **kwargs)
        exact = -0.5 * (group_size - 1) * _expected_pull_std(p, group_size)
        _, se = _bandit_reference(p, group_size, **kwargs)
        tol = 5 * se + 1e-9
        if abs(got - exact) > tol:
            hint = (_coin_hint(got, exact, tol, p, group_size, kwargs)
                    or _scale_hint(got, exact, tol, group_size))
            fail(f"`expected_bandit_gradient` is wrong for {_describe(p, group_size, kwargs)}: "
                 f"it gave {got:+.4f}, but with one coin per group E[g] = -(G - 1) E[s_x] / 2 = "
                 f"{exact:+.4f} exactly, s_x the unbiased std of the group's pulls (+- "
                 f"{tol:.4f} for a 20,000-batch estimate).{hint}")


@check("expected_bandit_gradient", BANDIT)
def matches_the_simulation(fn):
    for p, group_size, kwargs in [
        (0.5, 16, dict(coin="independent")),
        (0.1, 4, dict(keep_fraction=0.5, coin="shared")),
        (0.9, 8, dict(keep_fraction=0.1, coin="independent")),
        (0.3, 8, dict(scale="none", keep_fraction=0.25, num_groups=4, coin="shared")),
        (0.5, 2, dict(low_payoff=0.1, num_groups=16, keep_fraction=0.25, samples=10000, seed=3,
                      coin="independent")),
        (0.7, 4, dict(low_payoff=0.1, keep_fraction=0.25, seed=1, coin="shared")),
        (0.5, 8, dict(keep_fraction=0.25, coin="shared")),
        (0.3, 8, dict()),
    ]:
        _close(fn, p, group_size, **kwargs)


@check("expected_bandit_gradient", BANDIT)
def seeded(fn):
    for coin in ("shared", "independent"):
        a = _estimate(fn, 0.5, 4, samples=2000, seed=5, coin=coin)
        b = _estimate(fn, 0.5, 4, samples=2000, seed=5, coin=coin)
        if a != b:
            fail(f"`expected_bandit_gradient` is not seeded: it gave {a!r} and then {b!r} for "
                 f"the same arguments, coin='{coin}' and seed=5; draw every random number from "
                 "np.random.default_rng(seed).")
        c = _estimate(fn, 0.5, 4, samples=2000, seed=6, coin=coin)
        if c == a:
            fail(f"`expected_bandit_gradient` ignores its seed: it gave the same number for "
                 f"seed=5 and seed=6 with coin='{coin}'; draw every random number from "
                 "np.random.default_rng(seed).")
