"""RAGEN's two-armed bandit as a text game: one turn, a stochastic reward.

Two arms with names, ``phoenix`` (low risk) and ``dragon`` (high risk), listed in a random order per
episode seed::

    arms dragon phoenix <action>

The policy answers one arm's name and closes the tag with ``</action>``. The order is drawn per
seed, so a policy cannot win by always answering the first (or second) word: it has to read the
names. ``success`` means it pulled the arm with the higher expected payoff, the dragon.

Payoffs (``payoffs=``), because the RAGEN paper and its code disagree:

=========  ===============================  ==========================================
           phoenix (low risk)               dragon (high risk)
=========  ===============================  ==========================================
``paper``  0.15, always (App. B.1)          1 with probability 0.25, else 0 (mean 0.25)
``code``   0.1, always (``BanditEnvConfig``) 1 with probability 0.25, else 0 (mean 0.25)
=========  ===============================  ==========================================

Either way the dragon is better on average, and its payoff is the only source of reward spread
among episodes that pull the same arm: a group that always pulls the phoenix has zero reward std.

A malformed answer (anything but exactly one arm name after stripping whitespace) ends the episode
with ``-format_penalty`` and ``format_ok = False``; ``step`` never raises on such text.
"""

from __future__ import annotations

import random

ARMS = ("phoenix", "dragon")  # low risk, high risk
LOW, HIGH = ARMS
PAYOFFS = {"paper": 0.15, "code": 0.1}  # the phoenix's fixed payoff
HIGH_PROBABILITY = 0.25  # the dragon pays 1 with this probability, else 0
ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"


class BanditEnv:
    """The two-armed bandit as a one-turn ``MultiTurnEnv`` (module docstring for the rules).

    Args:
        payoffs: ``"paper"`` (the phoenix pays 0.15) or ``"code"`` (0.1, RAGEN's config).
        format_penalty: the (positive) cost of a malformed answer, returned as ``-format_penalty``.

    ``reset(seed)`` fixes the order of the arms and the dragon's coin for that episode.
    """

    name = "bandit"
    max_turns = 1

    def __init__(self, *, payoffs: str = "paper", format_penalty: float = 0.1):
        if payoffs not in PAYOFFS:
            raise ValueError(f"payoffs must be one of {sorted(PAYOFFS)}, got {payoffs!r}")
        if not format_penalty >= 0.0:
            raise ValueError(f"format_penalty must be >= 0, got {format_penalty!r}")
        self.payoffs = payoffs
        self.low_payoff = PAYOFFS[payoffs]
        self.format_penalty = float(format_penalty)
        self.order: tuple[str, str] | None = None
        self._rng: random.Random | None = None
        self._done = True

    def vocabulary(self) -> list[str]:
        return ["arms", *ARMS, ACTION_OPEN, ACTION_CLOSE]

    def expected_payoff(self, arm: str) -> float:
        """Mean reward of pulling ``arm``."""
        return HIGH_PROBABILITY if arm == HIGH else self.low_payoff

    def reset(self, seed: int) -> str:
        self._rng = random.Random(seed)
        self.order = tuple(self._rng.sample(ARMS, 2))
        self._done = False
        return f"arms {' '.join(self.order)} {ACTION_OPEN}"

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        if self._done:
            raise RuntimeError("episode is over; call reset")
        self._done = True
        arm = action_text.strip() if isinstance(action_text, str) else None
        if arm not in ARMS:
            info = dict(terminated=True, truncated=False, format_ok=False, success=False, turn=1)
            return "", -self.format_penalty, True, info
        if arm == HIGH:
            reward = 1.0 if self._rng.random() < HIGH_PROBABILITY else 0.0
        else:
            reward = self.low_payoff
        info = dict(terminated=True, truncated=False, format_ok=True, success=arm == HIGH, turn=1)
        return "", reward, True, info

    def expert_action(self) -> str:
        """The arm with the higher expected payoff: the dragon."""
        if self._done:
            raise RuntimeError("episode is over; call reset")
        return HIGH

    def demonstration(
        self, seed: int, rng: random.Random, error_rate: float = 0.0
    ) -> list[tuple[str, str]]:
        """One ``(observation, arm)`` pair; the other arm with probability ``error_rate``."""
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate!r}")
        obs = self.reset(seed)
        arm = LOW if rng.random() < error_rate else HIGH
        self.step(arm)
        return [(obs, arm)]
