"""A lab's warm start, kept for its teaching cells, and its RL arms from copies of it.

:func:`agentic_rl.runs.run_arms` trains a lab's warm start and arms in one call. A lab whose
teaching cells look at the warm start before RL (the GRPO and GAE labs) needs the two apart: the
lab calls :func:`warm_start`, shows the policy, then :func:`train_arm`, and its run is still the
record's seed, because the arm starts from a copy of the weights and from the task stream as SFT
left it, whatever the teaching cells sampled in between.
"""

from __future__ import annotations

import copy
import dataclasses

__all__ = ["warm_start", "arm_trainer", "train_arm"]


def warm_start(trainer_cls, config):
    """SFT with ``config``, then the evaluation before RL (``evals["before"]``); keeps the state
    of the task stream at the end of SFT (``rl_tasks``) for the arms."""
    start = trainer_cls(config)
    start.sft()
    start.evals["before"] = start.evaluate()
    start.rl_tasks = start.problem_rng.getstate()
    return start


def arm_trainer(start, **fields):
    """The trainer of an arm, not yet trained: a copy of ``start``'s weights, its config changed
    by ``fields``, the RL task stream that follows its SFT, and its evaluation before RL."""
    config = dataclasses.replace(start.config, sft_steps=0, **fields)
    trainer = type(start)(config, model=copy.deepcopy(start.model), tokenizer=start.tokenizer)
    trainer.sft_history = list(start.sft_history)
    trainer.problem_rng.setstate(start.rl_tasks)  # the RL tasks follow the warm start's
    trainer.evals["before"] = start.evals["before"]
    return trainer


def train_arm(start, **fields):
    """RL from a copy of ``start``'s weights with its config changed by ``fields``, on the RL task
    stream that follows its SFT, and with its evaluation before RL (not measured again)."""
    trainer = arm_trainer(start, **fields)
    trainer.train()
    return trainer
