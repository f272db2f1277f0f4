"""A text household in the style of ALFWorld, with flawed actions and an out-of-domain split.

ALFWorld (Shridhar et al. 2021) puts an agent in a room of receptacles (a cabinet, a countertop, a
fridge, a sinkbasin, ...) and gives it a goal such as *put a clean mug in the cabinet*; the agent
acts with a small verb grammar and is rewarded 1 only when the goal holds at the end. ALFWorld
itself needs game files downloaded from the internet; this module is a small, dependency-free
version of its two simplest task types, sized for a word-level model trained from scratch:

- **Goals**: ``put O in T`` (*pick and place*) and ``put clean O in T`` (*pick, clean, then
  place*). The first observation states the goal and where every object is; later observations
  only say where the agent is, what that receptacle holds and what the agent holds. So two states
  of different tasks look **nearly identical**: they differ in one word of the goal, far back.
- **Actions** (one per turn): ``go to R``, ``take O from R``, ``put O in R`` (``on`` is accepted
  too), ``clean O with sinkbasin``, ``look``. A legal action is applied; one that is impossible in
  the current state (the object is not there, the agent is elsewhere or its hands are full) is
  answered ``nothing happens`` and changes nothing, as in ALFWorld; text that is not an action of
  the grammar (an unknown verb or word, the wrong length) is answered ``nothing happens`` too and
  marked ``format_ok = False``. The episode always goes on; ``step`` never raises.
- **Reward**: 1 when the goal holds (the episode ends there, ``terminated``), else 0; an episode
  that runs out of turns is ``truncated``. Each task has a budget of turns: the expert's
  (optimal) plan plus ``slack``.
- **Flawed actions** are legal actions that do not bring the goal closer: the number of actions
  the optimal plan still needs (:meth:`HouseholdEnv.distance`) does not fall. Putting the object in
  the wrong receptacle, taking the wrong object, going somewhere useless, ``look``, cleaning what
  need not be clean: none of them ends the episode, each spends turns of the budget, so each lowers
  the chance of success (the *risk* ``r`` of Lemma 3.1 in the GCD chapter). ``step`` labels every
  action ``good``, ``flawed``, ``invalid`` (impossible here) or ``malformed`` (``info["kind"]``;
  the history is ``env.kinds``).
- **Splits**: a goal's (object, target) pair is in-domain or out-of-domain by a fixed rule
  (:func:`in_domain`): half of the pairs never occur in training, while every object and every
  receptacle does. ``split="ood"`` draws only those pairs: unseen *combinations* of seen
  words, the setting where the GCD paper claims its gains.

The expert (:meth:`HouseholdEnv.plan`) is exact: from any state it returns an optimal sequence of
actions, which gives both the demonstrations and the distance that defines a flawed action.
"""

from __future__ import annotations

import random

ACTION_OPEN = "<action>"
#: Receptacles an object can start in or be put in (the sinkbasin only cleans).
RECEPTACLES = ("cabinet", "countertop", "drawer", "fridge", "shelf", "table")
SINK = "sinkbasin"
PLACES = RECEPTACLES + (SINK,)
OBJECTS = ("apple", "bowl", "cup", "egg", "knife", "mug", "plate", "potato")
START = "middle"  # where the agent stands before its first move
KINDS = ("good", "flawed", "invalid", "malformed")
_WORDS = (
    "goal : put clean in on . is at hold nothing empty happens go to take from with look hint avoid"
).split()


def in_domain(obj: str, target: str) -> bool:
    """Whether the goal pair (object ``i``, target receptacle ``j``, by their places in
    ``OBJECTS`` and ``RECEPTACLES``) is in the training split: ``i + j`` odd. Each object is seen
    with three of the six targets and each target with four of the eight objects; the other 24
    pairs are out of domain. The split has a structure a learner can latch on to: in training,
    even objects only ever go to odd targets and odd objects to even ones."""
    return (OBJECTS.index(obj) + RECEPTACLES.index(target)) % 2 == 1


class HouseholdEnv:
    """ALFWorld-style household tasks (see the module docstring).

    ``split``: ``"train"`` (in-domain goal pairs) or ``"ood"`` (the held-out pairs).
    ``clean_fraction``: share of *put clean* goals. ``slack``: turns beyond the optimal plan.
    ``max_turns``: a hard cap on the episode (at least the longest budget, 6 + ``slack``).
    ``hint``: the prompt-based correction of the GCD paper as an option: the first observation
    ends with ``hint : avoid ...``, naming the receptacles that are *not* the target.
    """

    name = "household"

    def __init__(
        self,
        *,
        split: str = "train",
        clean_fraction: float = 0.5,
        slack: int = 2,
        max_turns: int = 8,
        hint: bool = False,
    ):
        if split not in ("train", "ood"):
            raise ValueError(f"split must be 'train' or 'ood', got {split!r}")
        if not 0.0 <= clean_fraction <= 1.0:
            raise ValueError(f"clean_fraction must be in [0, 1], got {clean_fraction!r}")
        if slack < 0:
            raise ValueError(f"slack must be >= 0, got {slack!r}")
        if max_turns < 6 + slack:
            raise ValueError(f"max_turns must be >= 6 + slack = {6 + slack}, got {max_turns!r}")
        self.split, self.clean_fraction, self.slack = split, clean_fraction, slack
        self.max_turns, self.hint = max_turns, hint
        self.task: dict | None = None
        self._done = True

    def vocabulary(self) -> list[str]:
        return sorted(set(_WORDS + list(PLACES + OBJECTS) + [START, ACTION_OPEN, "</action>"]))

    # ------------------------------------------------------------------ tasks
    def make_task(self, seed: int) -> dict:
        """The task of ``seed``: goal kind, object, target, and where every object starts."""
        rng = random.Random(f"household-{self.split}-{seed}")
        pairs = [
            (o, t)
            for o in OBJECTS
            for t in RECEPTACLES
            if in_domain(o, t) == (self.split == "train")
        ]
        obj, target = rng.choice(pairs)
        source = rng.choice([r for r in RECEPTACLES if r != target])
        others = rng.sample([o for o in OBJECTS if o != obj], 2)
        where = {obj: source} | {o: rng.choice(RECEPTACLES) for o in others}
        clean = rng.random() < self.clean_fraction
        return dict(kind="clean" if clean else "put", obj=obj, target=target, where=where)

    def goal_text(self, task: dict | None = None) -> str:
        t = task or self.task
        return f"put {'clean ' if t['kind'] == 'clean' else ''}{t['obj']} in {t['target']}"

    def reset(self, seed: int) -> str:
        self.task = self.make_task(seed)
        self.where = dict(self.task["where"])  # object -> receptacle (held objects are absent)
        self.loc, self.held, self.clean = START, None, set()
        self.turn, self._done, self.success = 0, False, False
        self.kinds: list[str] = []
        self.budget = min(len(self.plan()) + self.slack, self.max_turns)
        obj = self.task["obj"]
        layout = f"{obj} is in {self.where[obj]}"
        hint = ""
        if self.hint:
            wrong = " ".join(r for r in RECEPTACLES if r != self.task["target"])
            hint = f" . hint : avoid {wrong}"
        return f"goal : {self.goal_text()} . {layout}{hint} . {self._state()} {ACTION_OPEN}"

    def _state(self) -> str:
        if self.loc == START:
            here = f"at {START}"
        else:
            items = [
                f"clean {o}" if o in self.clean else o
                for o in sorted(o for o, r in self.where.items() if r == self.loc)
            ]
            here = f"at {self.loc} : {' '.join(items) or 'empty'}"
        held = "nothing" if self.held is None else self.held
        held = f"clean {held}" if self.held in self.clean else held
        return f"{here} . hold {held}"

    # ------------------------------------------------------------------ the expert
    def goal_holds(self) -> bool:
        t = self.task
        placed = self.where.get(t["obj"]) == t["target"]
        return placed and (t["kind"] == "put" or t["obj"] in self.clean)

    def plan(self) -> list[str]:
        """An optimal sequence of actions from the current state (empty when the goal holds)."""
        t, steps = self.task, []
        loc, held, obj = self.loc, self.held, t["obj"]
        if self.goal_holds():
            return steps
        if held is not None and held != obj:  # put the wrong object down first
            if loc not in RECEPTACLES:
                loc = self.where[obj] if obj in self.where else t["target"]
                steps.append(f"go to {loc}")
            steps.append(f"put {held} in {loc}")
            held = None
        if held is None:
            source = self.where[obj]
            if loc != source:
                steps.append(f"go to {source}")
            steps.append(f"take {obj} from {source}")
            loc = source
        if t["kind"] == "clean" and obj not in self.clean:
            if loc != SINK:
                steps.append(f"go to {SINK}")
            steps.append(f"clean {obj} with {SINK}")
            loc = SINK
        if loc != t["target"]:
            steps.append(f"go to {t['target']}")
        steps.append(f"put {obj} in {t['target']}")
        return steps

    def distance(self) -> int:
        """Actions the optimal plan still needs: a legal action that does not lower it is flawed."""
        return len(self.plan())

    def expert_action(self) -> str:
        return self.plan()[0] if not self.goal_holds() else "look"

    # ------------------------------------------------------------------ acting
    def _parse(self, text: str) -> tuple | None:
        w = text.split()
        if w == ["look"]:
            return ("look",)
        if len(w) == 3 and w[:2] == ["go", "to"] and w[2] in PLACES:
            return ("go", w[2])
        if len(w) == 4 and w[0] == "take" and w[2] == "from" and w[1] in OBJECTS and w[3] in PLACES:
            return ("take", w[1], w[3])
        if len(w) == 4 and w[0] == "put" and w[2] in ("in", "on") and w[1] in OBJECTS:
            return ("put", w[1], w[3]) if w[3] in PLACES else None
        if len(w) == 4 and w[0] == "clean" and w[2] == "with" and w[1] in OBJECTS:
            return ("clean", w[1], w[3]) if w[3] in PLACES else None
        return None

    def _apply(self, act: tuple) -> bool:
        """Apply a parsed action; False (and no change) when it is impossible here."""
        verb = act[0]
        if verb == "look":
            return True
        if verb == "go":
            self.loc = act[1]
            return True
        obj, place = act[1], act[2]
        if place != self.loc:
            return False
        if verb == "take":
            if self.held is not None or self.where.get(obj) != place:
                return False
            self.held = obj
            del self.where[obj]
            return True
        if verb == "put":
            if self.held != obj or place == SINK:
                return False
            self.where[obj], self.held = place, None
            return True
        if self.held != obj or place != SINK:  # clean
            return False
        self.clean.add(obj)
        return True

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        if self._done:
            info = dict(terminated=True, truncated=False, format_ok=False, success=False)
            return "nothing happens", 0.0, True, info | dict(kind="malformed")
        self.turn += 1
        act = self._parse(action_text) if isinstance(action_text, str) else None
        before = self.distance()
        if act is None:
            kind, ok = "malformed", False
        elif not self._apply(act):
            kind, ok = "invalid", False
        else:
            kind, ok = ("good" if self.distance() < before else "flawed"), True
        self.kinds.append(kind)
        self.success = self.goal_holds()
        terminated = self.success
        truncated = not terminated and self.turn >= self.budget
        self._done = terminated or truncated
        info = dict(
            terminated=terminated,
            truncated=truncated,
            format_ok=kind != "malformed",
            success=self.success,
            kind=kind,
        )
        msg = "" if ok else "nothing happens . "
        obs = "" if self._done else f"{msg}{self._state()} {ACTION_OPEN}"
        return obs, float(self.success), self._done, info

    # ------------------------------------------------------------------ demonstrations
    def flawed_action(self, rng: random.Random) -> str:
        """A legal action that does not bring the goal closer, drawn with ``rng``."""
        options = ["look"] + [f"go to {p}" for p in PLACES]
        if self.held is not None and self.loc in RECEPTACLES:
            options.append(f"put {self.held} in {self.loc}")
        if self.held is None and self.loc in RECEPTACLES:
            options += [f"take {o} from {self.loc}" for o, r in self.where.items() if r == self.loc]
        flawed = []
        for action in options:
            saved = (self.loc, self.held, dict(self.where), set(self.clean))
            before = self.distance()
            self._apply(self._parse(action))
            if self.distance() >= before:
                flawed.append(action)
            self.loc, self.held, self.where, self.clean = saved
        return rng.choice(flawed)

    def demonstration(
        self, seed: int, rng: random.Random, error_rate: float = 0.0
    ) -> list[tuple[str, str]]:
        """One episode of ``(observation, action)`` pairs: the expert's action, replaced with
        probability ``error_rate`` per turn by a flawed one (a mixed-quality teacher that
        recovers: it plans again from wherever the flaw left it)."""
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate!r}")
        obs, done, pairs = self.reset(seed), False, []
        while not done:
            flawed = rng.random() < error_rate
            action = self.flawed_action(rng) if flawed else self.expert_action()
            pairs.append((obs, action))
            obs, _, done, _ = self.step(action)
        return pairs


def counterfactual_goal(first_obs: str, task: dict, target: str) -> str:
    """``first_obs`` with only its goal's target receptacle replaced by ``target``: the
    near-identical state in which an action that served the real goal is flawed."""
    env = HouseholdEnv()
    old = f"goal : {env.goal_text(task)} ."
    if not first_obs.startswith(old):
        raise ValueError("first_obs does not start with the task's goal")
    return f"goal : {env.goal_text(task | dict(target=target))} ." + first_obs[len(old) :]
