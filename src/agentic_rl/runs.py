"""A run from outside: the checks before any compute, a recipe run headless, and a lab's arms.

- :func:`preflight`: every check a run makes before any compute (the CLI calls it first);
- :func:`run_recipe`: train a trainer and write ``metrics.csv``, ``sft_metrics.csv`` and
  ``summary.json`` (``python -m agentic_rl <recipe>``);
- :func:`run_arms`: a lab's arms from shared warm starts, in memory.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os

from . import checkpoint as ckpt
from . import distributed as dist
from .checkpoint import CHECKPOINT, run_lock, write_csv
from .config import ConfigError, RLConfig
from .models import get_device

__all__ = ["OUTPUT_FILES", "preflight", "run_recipe", "run_arms"]

#: The files a run writes in its output folder (``run.lock`` aside).
OUTPUT_FILES = (CHECKPOINT, "metrics.csv", "sft_metrics.csv", "summary.json")


def preflight(config: RLConfig) -> None:
    """Every check a run makes before any compute, as named errors (``agentic_rl.config.RunError``).

    The config and the machine (``config.check_environment``), then, with an ``output_dir``: no
    other run holds the folder, and an existing checkpoint is sound and matches the config (when
    resuming). The CLI calls it before building anything; a trainer makes the same checks as it
    starts.
    """
    config.check_environment()
    dist.init(dist.rank_device(get_device(config.device)))  # torchrun: join; others go quiet
    dist.check_data_parallel(config)
    out = config.output_dir
    if out and os.path.isdir(out):
        if dist.is_main():  # torchrun: rank 0 takes the lock, the others leave it alone
            ckpt.check_unlocked(out)
        path = os.path.join(out, CHECKPOINT)
        if config.resume and os.path.exists(path):
            state = ckpt.load(path, map_location="cpu")
            ckpt.check_resumable(config, state, path)
            ckpt.check_world_size(state, path)


def run_recipe(trainer) -> dict:
    """Run a recipe headless: train, write ``metrics.csv``, ``sft_metrics.csv``, ``summary.json``.

    A run that was already complete writes nothing (``trainer.was_complete``).
    """
    out = trainer.config.output_dir
    with run_lock(out if dist.is_main() else None):  # torchrun: rank 0 holds it ...
        summary = trainer.train()
        if out and not trainer.was_complete and dist.is_main():  # ... and writes the files
            os.makedirs(out, exist_ok=True)
            write_csv(trainer.history, os.path.join(out, "metrics.csv"))
            write_csv(trainer.sft_history, os.path.join(out, "sft_metrics.csv"))
            tmp = os.path.join(out, "summary.json.tmp")
            with open(tmp, "w") as fh:
                json.dump(summary, fh, indent=2)
            os.replace(tmp, os.path.join(out, "summary.json"))
    return summary


def run_arms(
    trainer_cls, config: RLConfig, arms: dict[str, dict], *, start_fields: tuple[str, ...] = ()
) -> dict:
    """Train the arms of a lab from shared warm starts: ``arms`` maps an arm's name to the config
    fields it changes; arms that agree on ``start_fields`` share one warm start (SFT, trained once
    with the first such arm's config). Every arm's RL then starts from a copy of its warm start,
    with the same seed (same tasks, same sampling stream: the task stream continues from where the
    warm start left it). Returns the trained trainers by arm name; each holds its warm start's
    ``sft_history``. In memory only: for checkpoints, run one arm per CLI call."""
    if config.output_dir is not None:
        raise ConfigError(
            "output_dir", "run_arms keeps no checkpoints; run one arm per CLI call for that"
        )
    starts, out = {}, {}
    for name, fields in arms.items():
        arm = dataclasses.replace(config, **fields)
        key = tuple(getattr(arm, f) for f in start_fields)
        if key not in starts:
            warm = trainer_cls(arm)
            warm.sft()
            starts[key] = warm
        warm = starts[key]
        trainer = trainer_cls(
            dataclasses.replace(arm, sft_steps=0),
            model=copy.deepcopy(warm.model),
            tokenizer=copy.deepcopy(warm.tokenizer),
        )
        trainer.sft_history = list(warm.sft_history)
        trainer.problem_rng.setstate(warm.problem_rng.getstate())  # RL tasks follow the demos'
        trainer.train()
        out[name] = trainer
    return out
