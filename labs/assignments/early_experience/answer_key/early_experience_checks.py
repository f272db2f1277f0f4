"""Hidden checks of the Early Experience assignment (carried by the autograder; never released).

Each check is called from one hidden test of the master notebook, ``C.<check>(globals(), ...)``;
its points are set there. The hand cases carry their expected values as data, written out by hand.
The household cases (expert episodes of the book's household, with scripted proposals executed in
it, kept by the package's ``collect_alternatives``, and the package's rows) are recorded once from
``agentic_rl`` into ``early_experience_reference.json`` (``release.py --record``): grading imports
nothing from the package. Rows are compared word by word (one word, one token), so any cut of a
row into segments that reads the same is accepted. Where the mistake is a known one (the expert's
action kept as an alternative, the alternative's action trained, the stop word left out, the
rationale put before the action) the message says which.
"""

from __future__ import annotations

import copy
import pathlib
import random
from collections import namedtuple

from gradelib import References, call, check, fail

REFS = References(pathlib.Path(__file__).with_name("early_experience_reference.json"), {
    "household": "early_experience_checks:household_data",
    "world_model_rows": "agentic_rl.early_experience:world_model_rows",
    "reflection_rows": "agentic_rl.early_experience:reflection_rows",
})
KEEP = ("agentic_rl.early_experience:collect_alternatives",)
WORLD = ("agentic_rl.early_experience:world_model_rows",)
REFLECT = ("agentic_rl.early_experience:reflection_rows",
           "agentic_rl.early_experience:reflection_text")

STOP = "</action>"
Step = namedtuple("Step", "state action next_state kind")  # the attributes of a Transition

# --- the hand cases -----------------------------------------------------------------------------

AT_FRIDGE = "at fridge : potato . hold nothing"
NOTHING = "nothing happens . at middle . hold nothing"
#: per group: (what, expert action, expert next state, proposals, k, the kept pairs)
KEEP_CASES = {
    "new action": [
        ("the fridge example, with the expert's action and a repeat among the proposals, k 3",
         "go to fridge", AT_FRIDGE,
         [("go to fridge", AT_FRIDGE), ("look", "at middle . hold nothing"),
          ("go to shelf", "at shelf : empty . hold nothing"), ("look", "at middle . hold nothing"),
          ("open fridge", NOTHING), ("go to table", "at table : mug . hold nothing")],
         3,
         [("look", "at middle . hold nothing"), ("go to shelf", "at shelf : empty . hold nothing"),
          ("open fridge", NOTHING)]),
        ("k = 1, the expert's action proposed first",
         "look", "at middle . hold nothing",
         [("look", "at middle . hold nothing"), ("go to sinkbasin", "at sinkbasin : empty ."),
          ("go to table", "at table : mug .")],
         1,
         [("go to sinkbasin", "at sinkbasin : empty .")]),
        ("no proposal but the expert's own action",
         "go to table", "at table : mug .", [("go to table", "at table : mug .")] * 3, 2, []),
    ],
    "new next state": [
        ("a proposal with another action but the expert's next state",
         "go to shelf", "at shelf : empty . hold potato",
         [("go to shelf 1", "at shelf : empty . hold potato"),
          ("go to fridge", "at fridge : empty ."),
          ("put potato in fridge", "at fridge : potato . hold nothing")],
         2,
         [("go to fridge", "at fridge : empty ."),
          ("put potato in fridge", "at fridge : potato . hold nothing")]),
        ("the last step, where 'put egg on fridge' is the expert's 'put egg in fridge'",
         "put egg in fridge", "success",
         [("put egg on fridge", "success"), ("look", "at fridge : empty . hold egg"),
          ("put egg in fridge", "success"), ("go to shelf", "at shelf : empty . hold egg")],
         2,
         [("look", "at fridge : empty . hold egg"),
          ("go to shelf", "at shelf : empty . hold egg")]),
    ],
    "at most k": [
        ("fewer qualifying proposals than k = 4",
         "take mug from table", "at table : empty . hold mug",
         [("take mug from table", "at table : empty . hold mug"), ("look", "at table : mug ."),
          ("take mug from table", "at table : empty . hold mug"), ("", NOTHING)],
         4,
         [("look", "at table : mug ."), ("", NOTHING)]),
        ("six qualifying proposals and k = 2",
         "go to fridge", AT_FRIDGE,
         [(f"go to {place}", f"at {place} : empty . hold nothing")
          for place in ("shelf", "table", "cabinet", "sinkbasin", "countertop", "drawer")],
         2,
         [("go to shelf", "at shelf : empty . hold nothing"),
          ("go to table", "at table : empty . hold nothing")]),
    ],
}

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
    return [(w, bool(t)) for text, t in segments for w in text.split()]


# --- the household: recorded once from the package ----------------------------------------------

SEEDS = [3, 7, 11, 19, 23, 42]
PROPOSALS, K = 8, 3


class _ScriptedPolicy:
    """Stands in for the trainer in ``collect_alternatives``: each branch (a fresh household
    replayed to an expert state) executes the next proposal of a script instead of a sample."""

    def __init__(self, script: list[str]):
        import torch

        self.device = torch.device("cpu")
        self.script = script
        self.outcomes: list[list[str]] = []

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
            self.outcomes.append([env.action, next_state_text(obs, info), info["kind"]])


def household_data(seeds: list[int], proposals: int, k: int) -> dict:
    """Only called by ``release.py --record`` (through ``REFS``): the expert's steps of the
    episodes of ``seeds``; per step, ``proposals`` scripted proposals (the expert's action, its
    text with ``on`` for ``in`` (the same action to the household's grammar), three flawed ones,
    an impossible one, a malformed one, an empty one, shuffled) as the household
    answered them; and the alternatives the package's ``collect_alternatives`` kept (``k``). All
    plain lists of strings, so that the recorded and the replayed values are the same."""
    from agentic_rl.early_experience import (ExperienceHousehold, collect_alternatives,
                                             expert_transitions)

    env = ExperienceHousehold()
    episodes = expert_transitions(env, seeds)
    rng, script = random.Random(0), []
    for seed, steps in zip(seeds, episodes):
        for i, step in enumerate(steps):
            env.reset(seed)
            for before in steps[:i]:
                env.step(before.action)
            flawed = [env.flawed_action(rng) for _ in range(3)]
            same = step.action.replace(" in ", " on ")  # another text, the same action: put only
            texts = [step.action, same, *flawed, "take mug from table", "go", ""]
            rng.shuffle(texts)
            script += texts[:proposals]
    policy = _ScriptedPolicy(script)
    kept = collect_alternatives(policy, seeds, episodes, k=k, proposals=proposals, seed=0)
    return {
        "states": [[s.state, s.action, s.next_state, s.kind] for steps in episodes
                   for s in steps],
        "proposals": [policy.outcomes[n * proposals:(n + 1) * proposals]
                      for n in range(len(policy.outcomes) // proposals)],
        "kept": [[[a.state, a.action, a.next_state, a.kind] for a in alts]
                 for per_episode in kept for alts in per_episode],
    }


def _household():
    """The expert steps, the proposals per step and the package's alternatives per step."""
    data = REFS("household", SEEDS, PROPOSALS, K)
    states = [Step(*s) for s in data["states"]]
    proposals = [[tuple(p) for p in props] for props in data["proposals"]]
    kept = [[Step(*a) for a in alts] for alts in data["kept"]]
    return states, proposals, kept


def _short(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else "..." + text[-n:])


# --- q1: keep_alternatives ----------------------------------------------------------------------


def _pairs(got, what) -> list[tuple]:
    if not isinstance(got, (list, tuple)) or not all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in got):
        fail(f"`keep_alternatives` should return a list of (action, next_state) pairs for {what}, "
             f"got {got!r}.")
    return [tuple(p) for p in got]


def _keep_hint(got, expert_action, expert_next, k) -> str:
    actions = [a for a, _ in got]
    if expert_action in actions:
        return (" It kept the expert's own action: every alternative a_i^j differs from the "
                "expert's a_i (eq. ee-data).")
    if len(set(actions)) < len(actions):
        return " It kept an action twice: an action already kept is not kept again."
    if any(n == expert_next for _, n in got):
        return (" It kept a proposal whose next state is the expert's: such a proposal teaches "
                "nothing the expert's own transition does not.")
    if len(got) > k:
        return f" It kept {len(got)}, more than k = {k}."
    return " The kept proposals are the first k that qualify, in sampling order."


def _check_keep(fn, expert_action, expert_next, proposals, k, want, what):
    given = copy.deepcopy(proposals)
    got = _pairs(call(fn, "keep_alternatives", expert_action, expert_next, given, k), what)
    if given != proposals:
        fail(f"`keep_alternatives` changed its inputs in place for {what}.")
    if got != [tuple(p) for p in want]:
        fail(f"`keep_alternatives` is wrong for {what}: it kept actions "
             f"{[a for a, _ in got]}, expected {[a for a, _ in want]}."
             f"{_keep_hint(got, expert_action, expert_next, k)}")


@check("keep_alternatives", KEEP)
def keep_by_hand(fn, group: str):
    """One group of hand cases: 'new action', 'new next state' or 'at most k'."""
    for what, expert_action, expert_next, proposals, k, want in KEEP_CASES[group]:
        _check_keep(fn, expert_action, expert_next, proposals, k, want,
                    f"{what}, expert action {expert_action!r}")


@check("keep_alternatives", KEEP)
def keep_in_household(fn):
    states, proposals, kept = _household()
    for n, (step, props, alts) in enumerate(zip(states, proposals, kept)):
        pairs = [(action, after) for action, after, _ in props]
        want = [(a.action, a.next_state) for a in alts]
        _check_keep(fn, step.action, step.next_state, pairs, K, want,
                    f"household state {n}, expert action {step.action!r}, {PROPOSALS} proposals "
                    f"executed in the household, k = {K}, as the package's collect_alternatives "
                    "keeps them")


# --- q2 and q3: the rows, word by word ----------------------------------------------------------


def _row(name, got, what) -> list[tuple[str, bool]]:
    """The student's row as (word, trainable) pairs, or a one-sentence failure."""
    ok = isinstance(got, (list, tuple)) and all(
        isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], str)
        and isinstance(s[1], (bool, int)) for s in got)
    if not ok:
        fail(f"`{name}` should return a list of (text, trainable) pairs for {what}, got {got!r}.")
    return [(w, bool(t)) for text, t in got for w in text.split()]


def _span(words) -> str:
    return repr(" ".join(words) if len(words) <= 12 else " ".join(words[:12]) + " ...")


def _compare_text(name, got, want, what, eq, hint) -> None:
    got_words, want_words = [w for w, _ in got], [w for w, _ in want]
    if got_words != want_words:
        k = next((i for i, (a, b) in enumerate(zip(got_words, want_words)) if a != b),
                 min(len(got_words), len(want_words)))
        mine = got_words[k] if k < len(got_words) else "(the end)"
        theirs = want_words[k] if k < len(want_words) else "(the end)"
        fail(f"`{name}` is wrong for {what}: its text differs from eq. {eq}'s row at word {k + 1}, "
             f"{mine!r} where {theirs!r} is expected (the row should read "
             f"...{_span(want_words[max(k - 3, 0):])}).{hint(got, want)}")


def _compare_rows(name, got, want, what, eq, hint) -> None:
    _compare_text(name, got, want, what, eq, hint)
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
                    "that the next state's context is what the policy saw.")
        first = len(state.split())
        span = got[first:first + len(action.split()) + 1]
        if [w for w, _ in span] == action.split() + [STOP] and any(t for _, t in span):
            return (" Training on the alternative's action would teach the policy to take an "
                    "action that is not the expert's: in eq. ee-iwm the state and the action are "
                    "the input, the next state the target.")
        return ""
    return hint


def _reflection_hint(got, want):
    if _stops(got) < _stops(want):
        return (" The expert's action ends with its stop word </action>, as the policy writes it "
                "when it acts.")
    words = [w for w, _ in got]
    last_stop = len(words) - 1 - words[::-1].index(STOP) if STOP in words else len(words) - 1
    if "think" in words[:last_stop]:
        return (" The rationale comes after the action in this book (a training-only target, so "
                "that the action's context in training is its context when acting); the paper's "
                "model writes it before the action.")
    if any(u and not t for (_, t), (_, u) in zip(got[:last_stop + 1], want)):
        return (" Eq. ee-sr trains the expert's action together with the rationale, "
                "-log p(c, a | s): both are targets, the state alone is context.")
    return ""


def _world_case(fn, alt: Step, what: str):
    got = _row("world_model_row", call(fn, "world_model_row", alt.state, alt.action,
                                       alt.next_state), what)
    want = _hand_row([(alt.state, False), (f"{alt.action} {STOP}", False),
                      (alt.next_state, True)])
    return got, want


@check("world_model_row", WORLD)
def world_model_mask(fn):
    """Only the next state is trainable: the last words are the next state's, the rest context."""
    for alt in ALTERNATIVES:
        what = f"the fridge example, action {alt.action!r}"
        got, _ = _world_case(fn, alt, what)
        target = alt.next_state.split()
        trained = [w for w, t in got if t]
        tail = got[-len(target):]
        if trained != target or [w for w, _ in tail] != target or not all(t for _, t in tail):
            hint = _world_hint(alt.state, alt.action)(got, got)
            fail(f"`world_model_row` trains the wrong words for {what}: the trainable words are "
                 f"{_span(trained)}, expected only the next state's {_span(target)}, at the end "
                 f"of the row (eq. ee-iwm: the state and the action are context).{hint}")


@check("world_model_row", WORLD)
def world_model_text(fn):
    """The row reads state, action, stop word, next state (the trainable flags aside)."""
    for alt in ALTERNATIVES:
        what = f"the fridge example, action {alt.action!r}"
        got, want = _world_case(fn, alt, what)
        _compare_text("world_model_row", got, want, what, "ee-iwm",
                      _world_hint(alt.state, alt.action))


@check("world_model_row", WORLD)
def world_model_in_household(fn):
    states, _, kept = _household()
    transitions = [t for step, alts in zip(states, kept) for t in (step, *alts)]
    wants = REFS("world_model_rows", transitions)
    for n, (t, want) in enumerate(zip(transitions, wants)):
        what = (f"household transition {n}, action {t.action!r} leading to "
                f"{_short(t.next_state)}, as the package's world_model_rows builds it")
        got = _row("world_model_row", call(fn, "world_model_row", t.state, t.action,
                                           t.next_state), what)
        _compare_rows("world_model_row", got, _hand_row(want), what, "ee-iwm",
                      _world_hint(t.state, t.action))


def _reflection_case(fn, n: int, what: str):
    got = _row("reflection_row", call(fn, "reflection_row", EXPERT, ALTERNATIVES[n]), what)
    want = _hand_row([(STATE, False), (f"go to fridge {STOP}", True), (RATIONALES[n], True)])
    return got, want


def _reflection_what(n: int) -> str:
    alt = ALTERNATIVES[n]
    return (f"the fridge example, expert action 'go to fridge', the {alt.kind} alternative "
            f"{alt.action!r}")


@check("reflection_row", REFLECT)
def reflection_mask(fn):
    """The state alone is context; everything after it (action, stop word, rationale) trained."""
    for n in range(len(ALTERNATIVES)):
        what = _reflection_what(n)
        got, want = _reflection_case(fn, n, what)
        context = STATE.split()
        head, rest = got[:len(context)], got[len(context):]
        if ([w for w, _ in head] != context or any(t for _, t in head) or not rest
                or not all(t for _, t in rest)):
            trained = [w for w, t in got if t]
            fail(f"`reflection_row` trains the wrong words for {what}: the row should start with "
                 f"the state as its only context and train every word after it (the expert's "
                 f"action, its stop word and the rationale); its trainable words are "
                 f"{_span(trained)} (eq. ee-sr).{_reflection_hint(got, want)}")


@check("reflection_row", REFLECT)
def reflection_text(fn):
    """The row reads state, expert action, stop word, then the rationale of the template."""
    for n in range(len(ALTERNATIVES)):
        what = _reflection_what(n)
        got, want = _reflection_case(fn, n, what)
        _compare_text("reflection_row", got, want, what, "ee-sr", _reflection_hint)


@check("reflection_row", REFLECT)
def reflection_in_household(fn):
    states, _, kept = _household()
    pairs = [(step, a) for step, alts in zip(states, kept) for a in alts]
    wants = REFS("reflection_rows", pairs)
    for n, ((step, a), want) in enumerate(zip(pairs, wants)):
        what = (f"household pair {n}, expert action {step.action!r}, the {a.kind} alternative "
                f"{a.action!r}, as the package's reflection_rows builds it")
        got = _row("reflection_row", call(fn, "reflection_row", step, a), what)
        want = _hand_row(want)
        if got == _paper_order(want, len(step.state.split())):
            continue  # the order is reflection_text's to charge, once (the points say so)
        _compare_rows("reflection_row", got, want, what, "ee-sr", _reflection_hint)


def _paper_order(row, n_state: int):
    """``row`` with the rationale before the expert's action, as the paper's model writes it."""
    words = [w for w, _ in row]
    end = words.index(STOP, n_state) + 1 if STOP in words[n_state:] else len(row)
    return row[:n_state] + row[end:] + row[n_state:end]
