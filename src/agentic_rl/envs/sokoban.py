"""Sokoban as a text game, in the style of RAGEN's SimpleSokoban (Wang et al., 2025).

One room with a border of walls, one box, one target, one player. Each cell is one word, with
RAGEN's grid symbols: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``√`` box on the target,
``P`` player, ``S`` player on the target. Rows are separated by ``|`` and the action's opening tag
comes last, as in FrozenLake::

    # # # # # # | # _ P _ _ # | # _ X _ _ # | # _ O _ _ # | # _ _ _ _ # | # # # # # # <action>

Each ``step`` takes ONE action word, ``left down right up``. The player moves one cell; a wall
stops it (the action is spent anyway); walking into the box pushes it one cell if the cell behind
it is floor or the target, else nothing moves. The level is solved when the box is on the target.

Reward (gym-sokoban's, which RAGEN uses), summed per step:

=========================================  =========================
every valid action, a no-op bump included  ``-0.1``
a push puts the box on the target          ``+1``
a push moves the box off the target        ``-1``
the box is on the target after the action  ``+10`` (and the episode ends)
a malformed action                         ``-format_penalty`` only
=========================================  =========================

so the solving push earns ``-0.1 + 1 + 10 = 10.9``. (With one box, pushing it off the target is
only possible from a hand-loaded level that starts solved; the row is kept for fidelity.)

*Terminated*: the level is solved; the observation is ``""`` (no next state). *Truncated*: the
``max_turns``-th action (malformed ones count) ended an unsolved episode; the observation is the
final grid plus `` <action>`` (that state has a value: a critic may bootstrap from it).

A malformed action (after ``.strip()`` not exactly one of the four words; non-strings included)
is dropped, as in RAGEN: reward ``-format_penalty``, the state is unchanged, the episode goes on
(unless that was the last turn), ``info["format_ok"] = False``. This differs from FrozenLake, where
a malformed action ends the episode. ``step`` never raises on such text.

A box pushed where it can never reach the target (a corner, say) does not end the episode (moves
are irreversible; the agent just cannot win any more): ``info["deadlock"]`` reports it.

Levels: RAGEN draws rooms with gym-sokoban's reverse-play generator (``search_depth``). Here
``reset(seed)`` places target, box and player on random distinct floor cells (after optional
random interior walls), and keeps the level only if the box is off the target and the
breadth-first solver (``solve``) finds a plan of 1 to ``min(max_solution_length, max_turns)``
moves; otherwise it draws again from the same generator.
"""

from __future__ import annotations

import random

from .base import expert_episode

#: Action words (the same words and order as FrozenLake's).
ACTIONS = ("left", "down", "right", "up")
MOVES = ((0, -1), (1, 0), (0, 1), (-1, 0))  # (d_row, d_col) of each action
#: Tile words (RAGEN's order): wall, floor, target, box on target, box, player, player on target.
TILES = ("#", "_", "O", "√", "X", "P", "S")
_ROLES = {"player": ("P", "S"), "box": ("X", "√"), "target": ("O", "√", "S")}  # for load_level
ROW_SEP = "|"
ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"
MAX_ATTEMPTS = 10_000  # level draws before reset gives up (settings with no solvable level)

Cell = tuple[int, int]


def solve(
    walls: set[Cell] | frozenset[Cell],
    box: Cell,
    target: Cell,
    player: Cell,
    max_moves: int | None = None,
) -> list[str] | None:
    """A shortest list of action words that puts the box on the target, or ``None``.

    Breadth-first search over ``(player, box)`` states; cells are ``(row, col)``. ``walls`` must
    enclose the room (the env's border does). ``[]`` if the box is already on the target; ``None``
    if no plan exists (within ``max_moves`` moves, when given).
    """
    if box == target:
        return []
    start = (player, box)
    parent: dict = {start: None}
    frontier, depth = [start], 0
    while frontier and (max_moves is None or depth < max_moves):
        depth += 1
        nxt = []
        for state in frontier:
            (pr, pc), b = state
            for word, (dr, dc) in zip(ACTIONS, MOVES):
                p = (pr + dr, pc + dc)
                nb = (p[0] + dr, p[1] + dc) if p == b else b
                if p in walls or nb in walls or (p, nb) in parent:
                    continue
                parent[(p, nb)] = (state, word)
                if nb == target:  # walk the parents back to the start
                    plan, key = [], (p, nb)
                    while parent[key] is not None:
                        key, move = parent[key]
                        plan.append(move)
                    return plan[::-1]
                nxt.append((p, nb))
        frontier = nxt
    return None


class SokobanEnv:
    """Sokoban as a text ``MultiTurnEnv`` (see the module docstring for the rules).

    Args:
        size: side of the room, its border walls included (the interior is ``(size - 2)**2``
            cells); at least 5 (a 2x2 interior has only corners, where no box can be pushed).
        max_turns: actions per episode before truncation (malformed ones count); at least 1.
        format_penalty: the (positive) cost of a malformed action, returned as ``-format_penalty``.
        max_solution_length: the longest shortest-solution (in moves) a generated level may
            have; at least 1. Levels also fit in ``max_turns`` (the bound is the smaller of both).
        wall_probability: chance that each interior cell is a wall, in ``[0, 1)``.

    ``info`` of ``step`` has ``terminated``, ``truncated``, ``format_ok``, ``success`` (box on the
    target), ``turn`` (1-based count of actions taken, malformed ones included) and ``deadlock``
    (no plan solves the level from the new state, whatever the turns left).
    """

    name = "sokoban"
    actions = ACTIONS

    def __init__(
        self,
        size: int = 6,
        *,
        max_turns: int = 10,
        format_penalty: float = 0.1,
        max_solution_length: int = 8,
        wall_probability: float = 0.0,
    ):
        if not isinstance(size, int) or size < 5:
            raise ValueError(f"size must be an integer >= 5, got {size!r}")
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        if not format_penalty >= 0.0:
            raise ValueError(f"format_penalty must be >= 0, got {format_penalty!r}")
        if not isinstance(max_solution_length, int) or max_solution_length < 1:
            raise ValueError(
                f"max_solution_length must be an integer >= 1, got {max_solution_length!r}"
            )
        if not 0.0 <= wall_probability < 1.0:
            raise ValueError(f"wall_probability must be in [0, 1), got {wall_probability!r}")
        self.size = size
        self.max_turns = max_turns
        self.format_penalty = float(format_penalty)
        self.max_solution_length = max_solution_length
        self.wall_probability = float(wall_probability)

        # The current level: walls (a frozenset of (row, col)), target, box, player, grid shape.
        self.walls: frozenset[Cell] = frozenset()
        self.target = self.box = self.player = None
        self.shape: tuple[int, int] | None = None
        self._plan: tuple | None = None  # ((player, box), shortest plan) of the last solve
        self._turn = 0
        self._done = True

    def vocabulary(self) -> list[str]:
        return list(TILES) + [ROW_SEP, ACTION_OPEN, ACTION_CLOSE] + list(ACTIONS)

    # ------------------------------------------------------------------ levels
    def _generate(self, rng: random.Random) -> None:
        n, limit = self.size, min(self.max_solution_length, self.max_turns)
        interior = [(r, c) for r in range(1, n - 1) for c in range(1, n - 1)]
        border = {(r, c) for r in range(n) for c in range(n) if r in (0, n - 1) or c in (0, n - 1)}
        for _ in range(MAX_ATTEMPTS):
            walls = set(border)
            if self.wall_probability > 0.0:
                walls.update(cell for cell in interior if rng.random() < self.wall_probability)
            floor = [cell for cell in interior if cell not in walls]
            if len(floor) < 3:
                continue
            target, box, player = rng.sample(floor, 3)
            r, c = box
            if ((r - 1, c) in walls or (r + 1, c) in walls) and (
                (r, c - 1) in walls or (r, c + 1) in walls
            ):
                continue  # a box in a corner never moves again: no need to search
            plan = solve(walls, box, target, player, max_moves=limit)
            if plan:
                self.walls, self.shape = frozenset(walls), (n, n)
                self.target, self.box, self.player = target, box, player
                self._plan = ((player, box), plan)  # the search's plan is a shortest one
                return
        raise RuntimeError(
            f"no solvable level in {MAX_ATTEMPTS} draws (size={n}, "
            f"wall_probability={self.wall_probability}, solution length <= {limit})"
        )

    def load_level(self, rows: list[str]) -> str:
        """Start an episode on a hand-made level; return the first observation.

        ``rows`` are strings of tile characters (``TILES``), e.g. ``["#####", "#P_O#", ...]``:
        a rectangle with walls all around, exactly one player (``P``/``S``), one box
        (``X``/``√``) and one target (``O``/``√``/``S``). The level need not be solvable.
        """
        if not rows or any(len(row) != len(rows[0]) for row in rows) or len(rows[0]) < 3:
            raise ValueError(f"rows must be a rectangle of at least 3x3 tiles, got {rows!r}")
        cells = {(r, c): t for r, row in enumerate(rows) for c, t in enumerate(row)}
        if any(t not in TILES for t in cells.values()):
            raise ValueError(f"rows may only hold the tiles {TILES}, got {rows!r}")
        n_rows, n_cols = len(rows), len(rows[0])
        edge = [t for (r, c), t in cells.items() if r in (0, n_rows - 1) or c in (0, n_cols - 1)]
        if any(t != "#" for t in edge):
            raise ValueError(f"rows must have walls all around, got {rows!r}")
        found = {k: [rc for rc, t in cells.items() if t in ts] for k, ts in _ROLES.items()}
        if any(len(v) != 1 for v in found.values()):
            raise ValueError(f"rows need exactly one player, box and target, got {rows!r}")
        self.walls = frozenset(rc for rc, t in cells.items() if t == "#")
        self.player, self.box, self.target = (found[k][0] for k in ("player", "box", "target"))
        self.shape, self._plan = (n_rows, n_cols), None
        self._turn, self._done = 0, False
        return self._observation()

    def render_text(self) -> str:
        """The grid part of the observation: one word per cell, rows joined by ``|``."""
        if self.shape is None:
            raise RuntimeError("no episode yet; call reset")

        def tile(cell: Cell) -> str:
            if cell in self.walls:
                return "#"
            on_target = cell == self.target
            if cell == self.box:
                return "√" if on_target else "X"
            if cell == self.player:
                return "S" if on_target else "P"
            return "O" if on_target else "_"

        n_rows, n_cols = self.shape
        rows = [" ".join(tile((r, c)) for c in range(n_cols)) for r in range(n_rows)]
        return f" {ROW_SEP} ".join(rows)

    def _observation(self) -> str:
        return f"{self.render_text()} {ACTION_OPEN}"

    # ------------------------------------------------------------------ the turn protocol
    def reset(self, seed: int) -> str:
        """New episode on a random solvable level fixed by ``seed``;
        return the first observation."""
        self._generate(random.Random(seed))
        self._turn, self._done = 0, False
        return self._observation()

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        """Apply one action word; return ``(observation, reward, done, info)``
        (module docstring for the rules)."""
        if self._done:
            raise RuntimeError("episode is over; call reset")
        self._turn += 1
        word = action_text.strip() if isinstance(action_text, str) else None
        format_ok = word in ACTIONS
        if format_ok:
            was_on = self.box == self.target
            dr, dc = MOVES[ACTIONS.index(word)]
            p = (self.player[0] + dr, self.player[1] + dc)
            nb = (p[0] + dr, p[1] + dc) if p == self.box else self.box
            if p not in self.walls and nb not in self.walls:
                self.player, self.box = p, nb
            success, reward = self.box == self.target, -0.1
            if success != was_on:  # a push moved the box onto the target or off it
                reward += 1.0 if success else -1.0
            if success:
                reward += 10.0
        else:  # dropped, as in RAGEN: the state stays, the turn is spent
            success, reward = False, -self.format_penalty
        terminated = success
        truncated = self._turn >= self.max_turns and not terminated
        self._done = terminated or truncated
        obs = "" if terminated else self._observation()
        info = {
            "terminated": terminated,
            "truncated": truncated,
            "format_ok": format_ok,
            "success": success,
            "turn": self._turn,
            "deadlock": self.solution() is None,
        }
        return obs, round(float(reward), 6), self._done, info

    # ------------------------------------------------------------------ the expert
    def solution(self) -> list[str] | None:
        """A shortest plan (action words) from the current state; ``None`` if there is none."""
        if self.shape is None:
            raise RuntimeError("no episode yet; call reset")
        key = (self.player, self.box)
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, solve(self.walls, self.box, self.target, self.player))
        return self._plan[1]

    def expert_action(self) -> str:
        """The first word of a shortest plan; ``"up"`` when there is none (a deadlock)
        or the box already sits on the target (a hand-loaded level)."""
        if self._done:
            raise RuntimeError("episode is over; call reset")
        plan = self.solution()
        return plan[0] if plan else "up"

    def demonstration(
        self, seed: int, rng: random.Random, error_rate: float = 0.0
    ) -> list[tuple[str, str]]:
        """One episode of ``(observation, action)`` pairs for the SFT warm start: the expert's
        actions, each replaced by another with probability ``error_rate`` (``expert_episode``)."""
        return expert_episode(self, seed, rng, error_rate)
