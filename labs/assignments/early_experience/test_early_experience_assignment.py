"""Autograder for the Early Experience assignment: ``pytest labs/assignments/early_experience/``
(seconds on one CPU).

It runs the code cells tagged ``graded`` of ``early_experience_assignment.ipynb`` (or of the
notebook named by ``$ASSIGNMENT_NOTEBOOK``) and checks the functions they define twice: on cases
written by hand, whose expected values this file carries as data, and against the package
(``agentic_rl.early_experience``) on the household's expert episodes, with proposals executed in
the environment and kept by the package's own ``collect_alternatives`` (its policy replaced by a
script of proposals, so no model is trained or sampled). Rows are compared word by word (one word,
one token), so any cut of a row into segments that reads the same is accepted. Each failure is one
sentence naming the function and what differs; where the mistake is a known one (the expert's
action kept as an alternative, the alternative's action trained, the stop word left out, the
rationale put before the action) it says which.
"""

from __future__ import annotations

import copy
import pathlib
import random
import sys
from collections import namedtuple

import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _grading import SubmissionError, call, fail, load_submission

STOP = "</action>"
Step = namedtuple("Step", "state action next_state kind")  # the attributes of a Transition

# --- the hand cases -----------------------------------------------------------------------------

AT_FRIDGE = "at fridge : potato . hold nothing"
NOTHING = "nothing happens . at middle . hold nothing"
#: (what, expert action, expert next state, proposals, k, the kept pairs)
KEEP_CASES = [
    ("the fridge example, with the expert's action and a repeat among the proposals, k 3",
     "go to fridge", AT_FRIDGE,
     [("go to fridge", AT_FRIDGE), ("look", "at middle . hold nothing"),
      ("go to shelf", "at shelf : empty . hold nothing"), ("look", "at middle . hold nothing"),
      ("open fridge", NOTHING), ("go to table", "at table : mug . hold nothing")],
     3,
     [("look", "at middle . hold nothing"), ("go to shelf", "at shelf : empty . hold nothing"),
      ("open fridge", NOTHING)]),
    ("fewer qualifying proposals than k = 4",
     "take mug from table", "at table : empty . hold mug",
     [("take mug from table", "at table : empty . hold mug"), ("look", "at table : mug ."),
      ("take mug from table", "at table : empty . hold mug"), ("", NOTHING)],
     4,
     [("look", "at table : mug ."), ("", NOTHING)]),
    ("a proposal with another action but the expert's next state",
     "go to shelf", "at shelf : empty . hold potato",
     [("go to shelf 1", "at shelf : empty . hold potato"), ("go to fridge", "at fridge : empty ."),
      ("put potato in fridge", "at fridge : potato . hold nothing")],
     2,
     [("go to fridge", "at fridge : empty ."),
      ("put potato in fridge", "at fridge : potato . hold nothing")]),
    ("k = 1, the expert's action proposed first",
     "look", "at middle . hold nothing",
     [("look", "at middle . hold nothing"), ("go to sinkbasin", "at sinkbasin : empty ."),
      ("go to table", "at table : mug .")],
     1,
     [("go to sinkbasin", "at sinkbasin : empty .")]),
    ("no proposal but the expert's own action",
     "go to table", "at table : mug .", [("go to table", "at table : mug .")] * 3, 2, []),
]

STATE = "goal : put potato in shelf . potato is in fridge . at middle . hold nothing <action>"
EXPERT = Step(STATE, "go to fridge", AT_FRIDGE, "good")
ALTERNATIVES = [
    Step(STATE, "go to shelf", "at shelf : empty . hold nothing", "flawed"),
    Step(STATE, "take mug from table", NOTHING, "invalid"),
    Step(STATE, "", NOTHING, "malformed"),
    Step(STATE, "go to fridge now", NOTHING, "malformed"),
    Step(STATE, "go to sinkbasin", "at sinkbasin : potato . hold nothing", "good"),
]
#: the rationale of each alternative above, written out by hand
RATIONALES = [
    "think : go to shelf gives at shelf : empty . hold nothing , no closer ; go to fridge gives "
    "at fridge : potato . hold nothing , closer .",
    "think : take mug from table gives nothing happens . at middle . hold nothing , impossible ; "
    "go to fridge gives at fridge : potato . hold nothing , closer .",
    "think : nothing gives nothing happens . at middle . hold nothing , not an action ; go to "
    "fridge gives at fridge : potato . hold nothing , closer .",
    "think : go to fridge now gives nothing happens . at middle . hold nothing , not an action ; "
    "go to fridge gives at fridge : potato . hold nothing , closer .",
    "think : go to sinkbasin gives at sinkbasin : potato . hold nothing , closer too ; go to "
    "fridge gives at fridge : potato . hold nothing , closer .",
]


def _hand_row(segments) -> list[tuple[str, bool]]:
    return [(w, t) for text, t in segments for w in text.split()]


# --- the household, with the package --------------------------------------------------------

SEEDS = [3, 7, 11, 19, 23, 42]
PROPOSALS, K = 8, 3


class _ScriptedPolicy:
    """Stands in for the trainer in ``collect_alternatives``: each branch (a fresh household
    replayed to an expert state) executes the next proposal of a script instead of a sample."""

    def __init__(self, script: list[str]):
        import torch

        self.device = torch.device("cpu")
        self.script = script
        self.outcomes: list[tuple[str, str, str]] = []

    def make_task(self):
        from agentic_rl.early_experience import ExperienceHousehold

        return ExperienceHousehold()

    def play(self, seeds, *, envs, **_):
        from agentic_rl.early_experience import next_state_text

        assert len(envs) == len(self.script)
        for env, text in zip(envs, self.script):
            env.reset(0)
            env.step(text)
            obs, info = env.outcome
            self.outcomes.append((env.action, next_state_text(obs, info), info["kind"]))


@pytest.fixture(scope="module")
def household():
    """The expert episodes of SEEDS; per expert state the proposals (action, next state) as the
    household answered them; and the alternatives the package kept (K of PROPOSALS)."""
    from agentic_rl.early_experience import (ExperienceHousehold, collect_alternatives,
                                             expert_transitions)

    env = ExperienceHousehold()
    episodes = expert_transitions(env, SEEDS)
    rng, script = random.Random(0), []
    for seed, steps in zip(SEEDS, episodes):
        for i, step in enumerate(steps):
            env.reset(seed)
            for before in steps[:i]:
                env.step(before.action)
            flawed = [env.flawed_action(rng) for _ in range(3)]
            texts = [step.action, step.action, *flawed, "take mug from table", "go", ""]
            rng.shuffle(texts)
            script += texts[:PROPOSALS]
    policy = _ScriptedPolicy(script)
    kept = collect_alternatives(policy, SEEDS, episodes, k=K, proposals=PROPOSALS, seed=0)
    states = [step for steps in episodes for step in steps]
    proposals = [policy.outcomes[n * PROPOSALS:(n + 1) * PROPOSALS] for n in range(len(states))]
    alternatives = [alts for per_episode in kept for alts in per_episode]
    return states, proposals, alternatives


@pytest.fixture(scope="module")
def ns():
    try:
        return load_submission(HERE / "early_experience_assignment.ipynb")
    except SubmissionError as err:
        problem = str(err)
    fail(problem)


def _short(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else "..." + text[-n:])


# --- Task 1: keep_alternatives ------------------------------------------------------------------


def _pairs(got, what) -> list[tuple]:
    if not isinstance(got, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in got):
        fail(f"`keep_alternatives` should return a list of (action, next_state) pairs for {what}, "
             f"got {got!r}")
    return [tuple(p) for p in got]


def _keep_hint(got, expert_action, expert_next, proposals, k) -> str:
    actions = [a for a, _ in got]
    if expert_action in actions:
        return (" It kept the expert's own action: every alternative a_i^j differs from the "
                "expert's a_i (eq. ee-data)")
    if len(set(actions)) < len(actions):
        return " It kept an action twice: an action already kept is not kept again"
    if any(n == expert_next for _, n in got):
        return (" It kept a proposal whose next state is the expert's: such a proposal teaches "
                "nothing the expert's own transition does not")
    if len(got) > k:
        return f" It kept {len(got)}, more than k = {k}"
    return " The kept proposals are the first k that qualify, in sampling order"


def _check_keep(ns, expert_action, expert_next, proposals, k, want, what):
    given = copy.deepcopy(proposals)
    got = _pairs(call(ns, "keep_alternatives", expert_action, expert_next, given, k), what)
    if given != proposals:
        fail(f"`keep_alternatives` changed its inputs in place for {what}")
    if got != [tuple(p) for p in want]:
        fail(f"`keep_alternatives` is wrong for {what}: it kept actions "
             f"{[a for a, _ in got]}, expected {[a for a, _ in want]}."
             f"{_keep_hint(got, expert_action, expert_next, proposals, k)}")


@pytest.mark.parametrize("case", KEEP_CASES, ids=lambda c: c[0])
def test_keep_alternatives_by_hand(ns, case):
    what, expert_action, expert_next, proposals, k, want = case
    _check_keep(ns, expert_action, expert_next, proposals, k, want,
                f"{what}, expert action {expert_action!r}")


def test_keep_alternatives_as_the_package_keeps_them(ns, household):
    states, proposals, alternatives = household
    for n, (step, props, alts) in enumerate(zip(states, proposals, alternatives)):
        pairs = [(action, after) for action, after, _ in props]
        want = [(a.action, a.next_state) for a in alts]
        _check_keep(ns, step.action, step.next_state, pairs, K, want,
                    f"household state {n}, expert action {step.action!r}, {PROPOSALS} proposals "
                    f"executed in the household, k = {K}, as the package's collect_alternatives "
                    f"keeps them")


# --- Tasks 2 and 3: the rows, word by word ------------------------------------------------------


def _row(name, got, what) -> list[tuple[str, bool]]:
    """The student's row as (word, trainable) pairs, or a one-sentence failure."""
    ok = isinstance(got, (list, tuple)) and all(
        isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], str)
        and isinstance(s[1], (bool, int)) for s in got)
    if not ok:
        fail(f"`{name}` should return a list of (text, trainable) pairs for {what}, got {got!r}")
    return [(w, bool(t)) for text, t in got for w in text.split()]


def _span(words) -> str:
    return repr(" ".join(words) if len(words) <= 12 else " ".join(words[:12]) + " ...")


def _compare_rows(name, got, want, what, eq, hint) -> None:
    got_words, want_words = [w for w, _ in got], [w for w, _ in want]
    if got_words != want_words:
        k = next((i for i, (a, b) in enumerate(zip(got_words, want_words)) if a != b),
                 min(len(got_words), len(want_words)))
        mine = got_words[k] if k < len(got_words) else "(the end)"
        theirs = want_words[k] if k < len(want_words) else "(the end)"
        fail(f"`{name}` is wrong for {what}: its text differs from eq. {eq}'s row at word {k + 1}, "
             f"{mine!r} where {theirs!r} is expected (the row should read "
             f"...{_span(want_words[max(k - 3, 0):])}).{hint(got, want)}")
    extra = [w for (w, t), (_, u) in zip(got, want) if t and not u]
    missing = [w for (w, t), (_, u) in zip(got, want) if u and not t]
    if extra or missing:
        parts = []
        if extra:
            parts.append(f"the words {_span(extra)} are trainable but should be context")
        if missing:
            parts.append(f"the words {_span(missing)} are context but should be trainable")
        fail(f"`{name}` is wrong for {what}: {' and '.join(parts)} (eq. {eq}).{hint(got, want)}")


def _stops(row) -> int:
    return sum(w == STOP for w, _ in row)


def _world_hint(state, action):
    def hint(got, want):
        if _stops(got) < _stops(want):
            return (" The action ends with its stop word </action>, as the policy writes it, so "
                    "that the next state's context is what the policy saw")
        first = len(state.split())
        span = got[first:first + len(action.split()) + 1]
        if [w for w, _ in span] == action.split() + [STOP] and any(t for _, t in span):
            return (" Training on the alternative's action would teach the policy to take an "
                    "action that is not the expert's: in eq. ee-iwm the state and the action are "
                    "the input, the next state the target")
        return ""
    return hint


def _reflection_hint(got, want):
    if _stops(got) < _stops(want):
        return (" The expert's action ends with its stop word </action>, as the policy writes it "
                "when it acts")
    words = [w for w, _ in got]
    last_stop = len(words) - 1 - words[::-1].index(STOP)
    if "think" in words[:last_stop]:
        return (" The rationale comes after the action in this book (a training-only target, so "
                "that the action's context in training is its context when acting); the paper's "
                "model writes it before the action")
    if any(u and not t for (_, t), (_, u) in zip(got[:last_stop + 1], want)):
        return (" Eq. ee-sr trains the expert's action together with the rationale, "
                "-log p(c, a | s): both are targets, the state alone is context")
    return ""


def _check_world(ns, state, action, next_state, want, what):
    got = _row("world_model_row", call(ns, "world_model_row", state, action, next_state), what)
    _compare_rows("world_model_row", got, want, what, "ee-iwm", _world_hint(state, action))


def _check_reflection(ns, expert, alternative, want, what):
    got = _row("reflection_row", call(ns, "reflection_row", expert, alternative), what)
    _compare_rows("reflection_row", got, want, what, "ee-sr", _reflection_hint)


@pytest.mark.parametrize("n", range(len(ALTERNATIVES)), ids=lambda n: ALTERNATIVES[n].kind)
def test_world_model_row_by_hand(ns, n):
    alt = ALTERNATIVES[n]
    want = _hand_row([(alt.state, False), (f"{alt.action} {STOP}", False),
                      (alt.next_state, True)])
    _check_world(ns, alt.state, alt.action, alt.next_state, want,
                 f"the fridge example, action {alt.action!r}")


@pytest.mark.parametrize("n", range(len(ALTERNATIVES)), ids=lambda n: ALTERNATIVES[n].kind)
def test_reflection_row_by_hand(ns, n):
    alt = ALTERNATIVES[n]
    want = _hand_row([(STATE, False), (f"go to fridge {STOP}", True), (RATIONALES[n], True)])
    _check_reflection(ns, EXPERT, alt, want,
                      f"the fridge example, expert action 'go to fridge', the {alt.kind} "
                      f"alternative {alt.action!r}")


def test_rows_as_the_package_builds_them(ns, household):
    from agentic_rl.early_experience import reflection_rows, world_model_rows

    states, _, alternatives = household
    for n, (step, alts) in enumerate(zip(states, alternatives)):
        where = f"household state {n}, expert action {step.action!r}"
        for t in (step, *alts):
            want = _hand_row(world_model_rows([t])[0])
            _check_world(ns, t.state, t.action, t.next_state, want,
                         f"{where}, action {t.action!r} leading to {_short(t.next_state)}, as the "
                         f"package's world_model_rows builds it")
        for a in alts:
            want = _hand_row(reflection_rows([(step, a)])[0])
            _check_reflection(ns, step, a, want,
                              f"{where}, the {a.kind} alternative {a.action!r}, as the "
                              f"package's reflection_rows builds it")
