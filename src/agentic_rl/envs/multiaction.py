"""Several actions per turn, RAGEN's way: ``right || down || down``.

:class:`MultiActionEnv` wraps a one-action-per-step grid env (FrozenLake, Sokoban) so that one turn
of the policy may name up to ``max_actions_per_turn`` actions joined by the separator ``||``. The
actions run one after another inside the turn; the policy sees the state again only at its next
turn. The rules are those of RAGEN's environment manager (``es_manager.step``, ``ctx_manager``):

- the turn's text is split at ``||``; empty pieces are ignored; pieces that are not action words
  are **invalid** and dropped; only the first ``max_actions_per_turn`` pieces count (RAGEN keeps
  the first five, silently);
- the valid actions run in order until the inner episode ends or the episode's action budget
  ``max_actions`` is spent;
- a turn with an invalid piece, or with no valid action at all, costs ``-format_penalty`` and marks
  ``format_ok = False``, but the episode **goes on** (RAGEN adds the penalty to the trajectory's
  score; here it is part of the turn's reward);
- the turn's reward is the sum of the inner env's rewards (plus the penalty); the episode ends when
  the inner env terminates (goal, hole, solved), when ``max_actions`` actions have run, or after
  ``max_turns`` turns. The last two are truncations.

The inner env must have ``actions`` (its action words), ``render_text()`` (its state as words) and
the ``MultiTurnEnv`` protocol; it is built with ``max_turns = max_actions``, so that its own time
limit is the action budget.
"""

from __future__ import annotations

import itertools
import random

from .base import noisy_expert_action

SEPARATOR = "||"
ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"


class MultiActionEnv:
    """Up to ``max_actions_per_turn`` actions per turn over an inner one-action env.

    Args:
        inner: the wrapped env (built with ``max_turns=max_actions``).
        max_turns: turns per episode (RAGEN: 5).
        max_actions_per_turn: actions that count in one turn (RAGEN: 5).
        max_actions: actions per episode (RAGEN: 10); the inner env's own limit.
        format_penalty: the (positive) cost of a turn with an invalid piece.

    ``info`` of ``step`` has the inner env's ``success``, plus ``terminated``, ``truncated``,
    ``format_ok`` (of this turn), ``turn``, ``actions`` (run this turn) and ``actions_total``.
    """

    def __init__(
        self,
        inner,
        *,
        max_turns: int = 5,
        max_actions_per_turn: int = 5,
        max_actions: int = 10,
        format_penalty: float = 0.1,
    ):
        for name, v in (
            ("max_turns", max_turns),
            ("max_actions_per_turn", max_actions_per_turn),
            ("max_actions", max_actions),
        ):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if not format_penalty >= 0.0:
            raise ValueError(f"format_penalty must be >= 0, got {format_penalty!r}")
        if getattr(inner, "max_turns", None) != max_actions:
            raise ValueError(
                f"the inner env's max_turns ({getattr(inner, 'max_turns', None)!r}) must equal "
                f"max_actions ({max_actions}): its time limit is the episode's action budget"
            )
        self.inner = inner
        self.name = inner.name
        self.max_turns = max_turns
        self.max_actions_per_turn = max_actions_per_turn
        self.max_actions = max_actions
        self.format_penalty = float(format_penalty)
        self.actions = tuple(inner.actions)
        self._turn, self._used, self._done = 0, 0, True

    def vocabulary(self) -> list[str]:
        return list(dict.fromkeys(self.inner.vocabulary() + [SEPARATOR]))

    def reset(self, seed: int) -> str:
        self._turn, self._used, self._done = 0, 0, False
        return self.inner.reset(seed)

    def parse(self, text) -> tuple[list[str], bool]:
        """``(valid actions to run, format_ok)`` of one turn's text (module docstring)."""
        if not isinstance(text, str):
            return [], False
        pieces = [p.strip() for p in text.split(SEPARATOR)]
        pieces = [p for p in pieces if p][: self.max_actions_per_turn]
        valid = [p for p in pieces if p in self.actions]
        return valid, bool(valid) and len(valid) == len(pieces)

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        if self._done:
            raise RuntimeError("episode is over; call reset")
        valid, format_ok = self.parse(action_text)
        return self._turn_of(valid, format_ok)

    def _turn_of(self, words, format_ok: bool) -> tuple[str, float, bool, dict]:
        """Run ``words`` (any iterable, read one word at a time) as one turn; the turn's
        ``(observation, reward, done, info)``."""
        self._turn += 1
        reward = 0.0 if format_ok else -self.format_penalty
        ran, info, inner_done = 0, {}, False
        for word in itertools.islice(words, self.max_actions - self._used):
            _, r, inner_done, info = self.inner.step(word)
            reward += r
            ran += 1
            if inner_done:
                break
        self._used += ran
        terminated = inner_done and bool(info.get("terminated", False))
        truncated = not terminated and (
            self._used >= self.max_actions or self._turn >= self.max_turns
        )
        self._done = terminated or truncated
        # nothing ran: the state is unchanged; a terminal state has no next observation
        obs = "" if terminated else f"{self.inner.render_text()} {ACTION_OPEN}"
        out = dict(
            terminated=terminated,
            truncated=truncated,
            format_ok=format_ok,
            success=bool(info.get("success", False)),
            turn=self._turn,
            actions=ran,
            actions_total=self._used,
        )
        return obs, round(reward, 6), self._done, out

    def expert_action(self) -> str:
        """The inner expert's next action (one action: a turn's plan needs the states between)."""
        return self.inner.expert_action()

    def demonstration(
        self, seed: int, rng: random.Random, error_rate: float = 0.0
    ) -> list[tuple[str, str]]:
        """One episode of ``(observation, turn text)`` pairs for the SFT warm start.

        Each turn names ``k`` actions, ``k`` uniform in ``1 .. max_actions_per_turn``; each is the
        inner expert's choice in the state the previous one led to (the teacher sees the states
        between; the policy will not), replaced by another action with probability
        ``error_rate``.
        """
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate!r}")
        obs, done, pairs = self.reset(seed), False, []
        while not done:
            k = rng.randint(1, self.max_actions_per_turn)
            words = []

            def expert_words():  # lazy: each word is chosen in the state the last one led to
                for _ in range(k):
                    words.append(noisy_expert_action(self.inner, rng, error_rate))
                    yield words[-1]

            next_obs, _, done, _ = self._turn_of(expert_words(), True)
            pairs.append((obs, f" {SEPARATOR} ".join(words)))
            obs = next_obs
        return pairs
