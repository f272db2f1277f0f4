"""FrozenLake as a text game: the multi-turn chapter's environment.

The dynamics are gymnasium's ``FrozenLake-v1`` (``env.step`` and the transition table
``env.unwrapped.P``); this module only turns them into words and back. A 4x4 lake with the agent on
the start tile reads::

    P F F F | F H F H | F F F H | H F F G <action>

one word per cell, rows separated by ``|``, the agent's cell written ``P`` (over the ``S`` or ``F``
tile it stands on), and the action's opening tag last. The policy answers one of
``left down right up`` and closes the tag with ``</action>``; the rollout cuts the text at that stop
word and hands the inside to ``step``.

Turn protocol (``base.MultiTurnEnv``): ``reset(seed)`` -> first observation; then per turn
``step(action_text)`` -> ``(observation, reward, done, info)``, where the observation is the new
grid plus `` <action>`` while the episode goes on (and when the turn limit cuts it: that state still
exists, and a critic may bootstrap from it), and ``""`` once it has terminated. Stepping after the
end raises.

Reward: gymnasium's, ``1.0`` on the step that reaches the goal ``G`` and ``0.0`` otherwise (a
hole ``H`` is not punished; it just ends the episode with nothing). A malformed action costs
``-format_penalty``.

Termination vs truncation (the distinction GAE needs, ``info["terminated"]`` /
``info["truncated"]``):

* *terminated*: the episode reached a state with no future: the goal, a hole, or a malformed action
  (which ends the episode by rule). The value of what follows is zero; bootstrapping from it would
  be wrong.
* *truncated*: the ``max_turns``-th action ended the episode on the ice. The state still has a value
  (the goal may be two steps away); a critic could legitimately bootstrap from ``V(s)`` here. When
  the last allowed action also lands in a hole or on the goal, the step counts as terminated, not
  truncated.

Malformed actions: after stripping surrounding whitespace the text must be exactly one of the four
action words (case-sensitive, one word). Anything else (``""``, ``"Down"``, ``"down down"``,
``"<action>"``, control characters, very long text, a non-string) ends the episode: observation
``""``, reward ``-format_penalty``, ``terminated=True``, ``format_ok=False``. ``step`` never raises
on such text.

The expert (for SFT demonstrations and for the chapter's ceiling) plans on gymnasium's transition
table: ``optimal_success_probability`` is the finite-horizon dynamic programme over ``max_turns``
steps (eq. in the docstring of that method); ``expert_action`` picks an action that attains it from
the current state and turn, preferring shorter paths (discounted value iteration, gamma = 0.95)
among those, then the fixed order left, down, right, up.
"""

from __future__ import annotations

import random

import gymnasium as gym
import numpy as np
from gymnasium.envs.toy_text.frozen_lake import MAPS, generate_random_map

from .base import expert_episode

#: Action words in gymnasium's id order (LEFT=0, DOWN=1, RIGHT=2, UP=3).
ACTIONS = ("left", "down", "right", "up")
#: Tile words: start, frozen, hole, goal, and the agent ("player") drawn over its tile.
TILES = ("S", "F", "H", "G", "P")
ROW_SEP = "|"
ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"

#: Discount of the expert's tie-breaker: it prefers reaching the goal sooner among
#: equally likely plans.
EXPERT_GAMMA = 0.95
_TIE_TOL = 1e-9  # two plans whose success probabilities differ by less than this count as equal


class FrozenLakeEnv:
    """FrozenLake as a text ``MultiTurnEnv`` (see the module docstring for the protocol).

    Args:
        size: side of the random lakes (``random_map=True``); at least 2. Ignored for fixed maps.
        is_slippery: gymnasium's slippery ice (the intended move with probability 1/3, each
            perpendicular one with 1/3). Default ``False``: deterministic moves (gymnasium's
            default is ``True``).
        random_map: draw a new lake per ``reset(seed)`` with gymnasium's
            ``generate_random_map(size, p_frozen, seed)`` (always solvable: a path of non-hole
            tiles joins S and G). ``False``: the fixed map ``map_name``.
        p_frozen: probability that a random tile is frozen (not a hole), in ``(0, 1]``.
        map_name: gymnasium's ``"4x4"`` or ``"8x8"`` map (only with ``random_map=False``;
            default ``"4x4"``).
        max_turns: actions per episode before truncation; at least 1.
        format_penalty: the (positive) cost of a malformed action, returned as ``-format_penalty``.

    ``reset(seed)`` seeds everything random: the map (random lakes) and gymnasium's slip generator.
    ``info`` of ``step`` has ``terminated``, ``truncated``, ``format_ok``, ``success`` (reached the
    goal), ``turn`` (1-based count of actions taken, a malformed one included) and ``state``
    (gymnasium's state ``row * ncol + col``).
    """

    name = "frozenlake"
    actions = ACTIONS

    def __init__(
        self,
        size: int = 4,
        *,
        is_slippery: bool = False,
        random_map: bool = True,
        p_frozen: float = 0.8,
        map_name: str | None = None,
        max_turns: int = 8,
        format_penalty: float = 0.1,
    ):
        if random_map and (not isinstance(size, int) or size < 2):
            raise ValueError(f"size must be an integer >= 2, got {size!r}")
        if not 0.0 < p_frozen <= 1.0:
            raise ValueError(f"p_frozen must be in (0, 1], got {p_frozen!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if not format_penalty >= 0.0:
            raise ValueError(f"format_penalty must be >= 0, got {format_penalty!r}")
        if map_name is not None and map_name not in MAPS:
            raise ValueError(f"map_name must be one of {sorted(MAPS)} or None, got {map_name!r}")
        if random_map and map_name is not None:
            raise ValueError(
                f"map_name={map_name!r} needs random_map=False (random lakes have no name)"
            )
        self.size = size
        self.is_slippery = bool(is_slippery)
        self.random_map = bool(random_map)
        self.p_frozen = p_frozen
        self.map_name = map_name
        self.max_turns = max_turns
        self.format_penalty = float(format_penalty)

        self.desc: tuple[str, ...] | None = None  # the current lake, one string per row
        self._env = None  # the wrapped gymnasium env for self.desc
        self._plan = (
            None  # (success-probability Q per horizon, discounted Q), computed once per lake
        )
        self._state: int | None = None
        self._turn = 0
        self._done = True
        if not self.random_map:
            self._load_map(MAPS[map_name or "4x4"])

    # ------------------------------------------------------------------ the lake
    def _load_map(self, desc) -> None:
        desc = tuple(desc)
        if desc == self.desc:
            return  # same lake: keep the env and its plan
        self.desc = desc
        self.size = len(desc)
        # TimeLimit at max_turns, so gymnasium's own truncation agrees with ours.
        self._env = gym.make(
            "FrozenLake-v1",
            desc=list(desc),
            is_slippery=self.is_slippery,
            max_episode_steps=self.max_turns,
        )
        self._plan = None

    @property
    def gym_env(self):
        """The gymnasium env of the current lake
        (``None`` before the first reset of a random-map env)."""
        return self._env

    def vocabulary(self) -> list[str]:
        return list(TILES) + [ROW_SEP, ACTION_OPEN, ACTION_CLOSE] + list(ACTIONS)

    def render_text(self) -> str:
        """The grid part of the observation: one word per cell, rows joined by ``|``,
        the agent as ``P``."""
        if self.desc is None or self._state is None:
            raise RuntimeError("no episode yet; call reset")
        n = len(self.desc[0])
        r0, c0 = divmod(self._state, n)
        rows = [
            " ".join("P" if (r, c) == (r0, c0) else tile for c, tile in enumerate(row))
            for r, row in enumerate(self.desc)
        ]
        return f" {ROW_SEP} ".join(rows)

    def _observation(self) -> str:
        return f"{self.render_text()} {ACTION_OPEN}"

    # ------------------------------------------------------------------ the turn protocol
    def reset(self, seed: int) -> str:
        """New episode. ``seed`` fixes the lake (random maps) and gymnasium's slips;
        returns the first observation."""
        if self.random_map:
            self._load_map(generate_random_map(size=self.size, p=self.p_frozen, seed=seed))
        self._state, _ = self._env.reset(seed=seed)
        self._state = int(self._state)
        self._turn = 0
        self._done = False
        return self._observation()

    def _info(self, *, terminated: bool, truncated: bool, format_ok: bool, success: bool) -> dict:
        return dict(
            terminated=terminated,
            truncated=truncated,
            format_ok=format_ok,
            success=success,
            turn=self._turn,
            state=self._state,
        )

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        """Apply one action word; return ``(observation, reward, done, info)``
        (module docstring for the rules)."""
        if self._done:
            raise RuntimeError("episode is over; call reset")
        self._turn += 1
        word = action_text.strip() if isinstance(action_text, str) else None
        # malformed: the episode ends here, by rule (a terminal, not a time limit)
        if word not in ACTIONS:
            self._done = True
            info = self._info(terminated=True, truncated=False, format_ok=False, success=False)
            return "", -self.format_penalty, True, info
        state, reward, terminated, truncated, _ = self._env.step(ACTIONS.index(word))
        self._state = int(state)
        terminated = bool(terminated)
        # Time limit: ours and gymnasium's TimeLimit (set to max_turns) agree;
        # a terminal on the last turn wins.
        truncated = (bool(truncated) or self._turn >= self.max_turns) and not terminated
        success = terminated and "".join(self.desc)[self._state] == "G"
        self._done = terminated or truncated
        # A terminal state has no next observation;
        # a truncated episode does (the state it was cut in).
        obs = "" if terminated else self._observation()
        info = self._info(
            terminated=terminated, truncated=truncated, format_ok=True, success=success
        )
        return obs, float(reward), self._done, info

    # ---------------------------------------------------------------- planning on gymnasium's table
    def _tables(self):
        """``P[s, a, s']`` (probability of moving on to a *non-terminal* continuation) and
        ``R[s, a]`` (expected immediate reward), read from ``env.unwrapped.P``. Transitions flagged
        terminal contribute their reward and no continuation; the G and H states themselves have
        neither."""
        table = self._env.unwrapped.P
        n = len(table)
        P = np.zeros((n, 4, n))
        R = np.zeros((n, 4))
        for s in range(n):
            for a in range(4):
                for p, s2, r, done in table[s][a]:
                    R[s, a] += p * r
                    if not done:
                        P[s, a, s2] += p
        return P, R

    def _get_plan(self):
        if self._plan is None:
            P, R = self._tables()
            # Success probability within h steps (gamma = 1, reward only at the goal):
            #   Q_h(s, a) = R(s, a) + sum_s' P(s, a, s') max_a' Q_{h-1}(s', a'),   Q_0 = 0.
            q_h = np.zeros((self.max_turns + 1, *R.shape))
            for h in range(1, self.max_turns + 1):
                q_h[h] = R + P @ q_h[h - 1].max(axis=1)
            # Discounted value iteration (the tie-breaker that prefers shorter paths):
            #   Q(s, a) = R(s, a) + gamma * sum_s' P(s, a, s') max_a' Q(s', a').
            q = np.zeros_like(R)
            for _ in range(10_000):
                q_new = R + EXPERT_GAMMA * (P @ q.max(axis=1))
                if np.max(np.abs(q_new - q)) < 1e-13:
                    q = q_new
                    break
                q = q_new
            self._plan = (q_h, q)
        return self._plan

    def optimal_success_probability(self) -> float:
        """Probability that the best policy reaches the goal within ``max_turns`` actions
        from the start.

        Finite-horizon dynamic programming on gymnasium's transition table,
        ``V_h(s) = max_a Q_h(s, a)`` with ``Q_h`` as in ``_get_plan`` (gamma = 1, reward 1 at the
        goal only). On a deterministic lake it is 1.0 if the shortest path has at most ``max_turns``
        moves, else 0.0. It is the success-rate ceiling of any policy, this env's expert included
        (which attains it). Needs a lake (random maps: after ``reset``).
        """
        if self._env is None:
            raise RuntimeError("no lake yet; call reset")
        q_h, _ = self._get_plan()
        start = "".join(self.desc).index("S")  # gymnasium's state index is row * ncol + col
        return float(q_h[self.max_turns][start].max())

    def expert_action(self) -> str:
        """An optimal action word for the current state and turn.

        Among the actions that maximise the probability of reaching the goal in the
        ``max_turns - turn`` actions left (``Q_h``; ties within 1e-9), it picks the one with the
        largest discounted value (gamma = 0.95: the shortest route), then the first in the order
        left, down, right, up. On a deterministic lake this is the shortest path to the goal. On a
        slippery one the choice may depend on the turns left (a finite horizon makes the optimal
        policy non-stationary).
        """
        if self._done:
            raise RuntimeError("episode is over; call reset")
        q_h, q = self._get_plan()
        succ = q_h[self.max_turns - self._turn][self._state]
        candidates = np.flatnonzero(succ >= succ.max() - _TIE_TOL)
        disc = q[self._state, candidates]
        best = candidates[np.flatnonzero(disc >= disc.max() - 1e-12)[0]]
        return ACTIONS[int(best)]

    def solve_from_start(self, seed: int) -> list[str]:
        """Reset with ``seed`` and follow the expert until the episode ends;
        return the action words.

        For deterministic lakes only (on a slippery one the words would not be a path).
        """
        if self.is_slippery:
            raise ValueError(
                "solve_from_start needs is_slippery=False; use demonstration() on slippery lakes"
            )
        self.reset(seed)
        words, done = [], False
        while not done:
            words.append(self.expert_action())
            _, _, done, _ = self.step(words[-1])
        return words

    def demonstration(
        self, seed: int, rng: random.Random, error_rate: float = 0.0
    ) -> list[tuple[str, str]]:
        """One episode of ``(observation, action)`` pairs for the SFT warm start: the expert's
        actions, each replaced by another with probability ``error_rate`` (``expert_episode``)."""
        return expert_episode(self, seed, rng, error_rate)
