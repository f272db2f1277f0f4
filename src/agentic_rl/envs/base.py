"""The task interface every chapter's environment implements.

A single-turn *task* hands out problems (a prompt and the reference answer), scores a completion,
and writes demonstrations for the SFT warm start. Multi-turn environments (later chapters) add
``reset``/``step`` on top of the same vocabulary and scoring conventions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Problem:
    """One prompt and its reference answer (both plain text)."""

    prompt: str
    answer: str
    meta: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Score:
    """The outcome of one completion.

    ``reward`` is what the RL loss sees (here: correctness plus a small format term); ``correct``
    and ``format_ok`` are the two facts it is made of, logged separately.
    """

    reward: float
    correct: bool
    format_ok: bool


@runtime_checkable
class Task(Protocol):
    name: str

    def vocabulary(self) -> list[str]:
        """Every word a prompt or a completion can contain (the tokenizer is built from it)."""

    def sample(self, n: int, rng: random.Random) -> list[Problem]:
        """``n`` problems drawn with ``rng`` (so a seed fixes them)."""

    def demonstration(self, problem: Problem, rng: random.Random) -> str:
        """A teacher completion for the SFT warm start (it may be wrong on purpose)."""

    def score(self, problem: Problem, completion: str, *, truncated: bool = False) -> Score:
        """Score a completion. Must never raise on malformed text: that is a format failure."""


@runtime_checkable
class MultiTurnEnv(Protocol):
    """A text environment for the multi-turn agent loop (``agentic_rl.multiturn``).

    Turn protocol: every observation ends with the action's opening tag (``<action>``); the policy
    writes its action and closes it with ``</action>`` (the rollout's stop word); the environment
    reads the text between the two. ``step`` must never raise on malformed text: a malformed action
    costs a format penalty (``info["format_ok"] = False``) and, as each env documents, either ends
    the episode (FrozenLake, the Bandit) or is dropped while the episode goes on (RAGEN's rule:
    Sokoban, ``MultiActionEnv``).

    ``info`` of ``step`` always has ``terminated`` (a terminal state: goal, hole, malformed action),
    ``truncated`` (the turn limit ended the episode; bootstrapping would be legitimate here),
    ``format_ok`` and ``success``.
    """

    name: str
    max_turns: int

    def vocabulary(self) -> list[str]:
        """Every word an observation or an action can contain."""

    def reset(self, seed: int) -> str:
        """Start an episode (the seed fixes everything random about it);
        return the first observation."""

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        """Apply one action; return ``(observation, reward, done, info)``."""

    def expert_action(self) -> str:
        """An optimal action from the current state, as text
        (demonstrations for the SFT warm start)."""


class EnvWrapper:
    """An environment seen through a wrapper (as gymnasium's ``Wrapper``): ``reset`` and ``step``
    go to the wrapped ``env``, and every attribute the wrapper does not have is the env's
    (``name``, ``max_turns``, ``vocabulary``, ``success``, ...). A subclass overrides what it
    changes. (A wrapped env steps one episode at a time: the rollout batches the steps of an env
    *class* that defines ``step_batch``, and a wrapper does not.)"""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        if name == "env" or name.startswith("__"):  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int) -> str:
        return self.env.reset(seed)

    def step(self, action_text: str) -> tuple[str, float, bool, dict]:
        return self.env.step(action_text)


def noisy_expert_action(env, rng: random.Random, error_rate: float) -> str:
    """The env's expert action, replaced with probability ``error_rate`` by one of its other
    action words (uniformly, drawn from ``rng``): a mixed-quality teacher's choice."""
    action = env.expert_action()
    if rng.random() < error_rate:
        action = rng.choice([a for a in env.actions if a != action])
    return action


def expert_episode(env, seed: int, rng: random.Random, error_rate: float = 0.0):
    """One episode of ``(observation, action)`` pairs for the SFT warm start: reset with ``seed``,
    then step with :func:`noisy_expert_action` until done. ``env`` needs ``actions`` (its action
    words) and ``expert_action()``."""
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"error_rate must be in [0, 1], got {error_rate!r}")
    obs, done, pairs = env.reset(seed), False, []
    while not done:
        action = noisy_expert_action(env, rng, error_rate)
        pairs.append((obs, action))
        obs, _, done, _ = env.step(action)
    return pairs
