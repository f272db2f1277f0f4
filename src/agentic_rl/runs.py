"""A run from outside: the checks before any compute, a recipe run headless, and a lab's arms.

- :func:`preflight`: every check a run makes before any compute (the CLI calls it first);
- :func:`run_recipe`: train a trainer and write ``metrics.csv``, ``sft_metrics.csv`` and
  ``summary.json`` (``python -m agentic_rl <recipe>``); a finished run rewrites those of them that
  are missing or differ from its checkpoint, and a run whose every update was skipped is an error;
- :func:`run_arms`: a lab's arms from shared warm starts, in memory.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os

from . import checkpoint as ckpt
from . import distributed as dist
from .checkpoint import CHECKPOINT, RESUMABLE_CHANGES, csv_bytes, run_lock, write_atomically
from .config import ConfigError, RLConfig, RunError
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
        ckpt.check_output_names(out)  # regular files or absent: no FIFO, folder or symlink
        if dist.is_main():  # torchrun: rank 0 takes the lock, the others leave it alone
            ckpt.check_unlocked(out)
        path = os.path.join(out, CHECKPOINT)
        if config.resume and os.path.exists(path):
            state = ckpt.load(path, map_location="cpu")
            ckpt.check_resumable(config, state, path)
            ckpt.check_world_size(state, path)


def run_recipe(trainer) -> dict:
    """Run a recipe headless: train, write ``metrics.csv``, ``sft_metrics.csv``, ``summary.json``.

    A run that was already complete (``trainer.was_complete``) rewrites only the files that are
    missing or differ from its checkpoint (a kill after the final checkpoint, an edited or
    deleted file) and lists them in ``trainer.rewritten``. A run whose every RL step skipped its
    update raises :class:`~agentic_rl.config.RunError` after writing its files.
    """
    out = trainer.config.output_dir
    trainer.rewritten = []
    with run_lock(out if dist.is_main() else None):  # torchrun: rank 0 holds it ...
        summary = trainer.train()
        if out and dist.is_main():  # ... and writes the files
            os.makedirs(out, exist_ok=True)
            files = {
                "metrics.csv": csv_bytes(trainer.history),
                "sft_metrics.csv": csv_bytes(trainer.sft_history),
                "summary.json": json.dumps(summary, indent=2).encode(),
            }
            for name, data in files.items():
                path = os.path.join(out, name)
                if not trainer.was_complete or _differs(path, data):
                    write_atomically(path, data)
                    trainer.rewritten.append(name)
            if not trainer.was_complete:
                trainer.rewritten = []
    _check_updates(trainer)
    return summary


#: How much longer than the new summary an old one may be and still say the same: its config's
#: resumable fields (an output folder's path, at most 4,096 bytes, escaped for JSON) may differ.
_SUMMARY_SLACK = 1 << 16


def _differs(path: str, data: bytes) -> bool:
    """Whether the file at ``path`` is missing or says something else than ``data`` (a summary's
    config may differ in the fields a resumed run may change: ``--device``, ``--output-dir``...).

    Sizes first, and never more read than could match: a 3 GB ``summary.json`` left in the folder
    was read whole (a ``MemoryError`` under an address-space limit)."""
    slack = _SUMMARY_SLACK if path.endswith(".json") else 0
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if not len(data) - slack <= size <= len(data) + slack:
                return True
            old = fh.read(len(data) + slack + 1)
    except OSError:
        return True
    if old == data or not path.endswith(".json"):
        return old != data
    try:
        old, new = json.loads(old), json.loads(data)
    except ValueError:
        return True
    if not isinstance(old, dict) or not isinstance(old.get("config"), dict):
        return True
    for summary in (old, new):
        summary["config"] = {
            k: v for k, v in summary["config"].items() if k not in RESUMABLE_CHANGES
        }
    return old != new


def _check_updates(trainer) -> None:
    """A run whose every RL step skipped its update learned nothing: an error, with the reason."""
    rows = trainer.history
    if not rows or not all(row.get("skipped") for row in rows):
        return
    reason = getattr(trainer, "skip_reason", None)
    if reason is None:  # (a finished run: the last row says what happened)
        loss, norm = rows[-1].get("loss", math.nan), rows[-1].get("grad_norm", math.nan)
        reason = f"loss {loss}, gradient norm {norm}"
    where = f"; its files are in {trainer.config.output_dir}" if trainer.config.output_dir else ""
    raise RunError(
        f"every one of the run's {len(rows)} RL steps skipped its update (the last: {reason}): "
        f"it learned nothing{where}. A loss or gradient that is not finite comes from a setting "
        "too large (a learning rate, a coefficient); a filter that keeps nothing, from groups "
        "whose rewards are all equal"
    )


def run_arms(
    trainer_cls,
    config: RLConfig,
    arms: dict[str, dict],
    *,
    start_fields: tuple[str, ...] = (),
    warm_start=None,
) -> dict:
    """Train the arms of a lab from shared warm starts: ``arms`` maps an arm's name to the config
    fields it changes; arms that agree on ``start_fields`` share one warm start (SFT, trained once
    with the first such arm's config, by ``warm_start(trainer)``: default ``trainer.sft()``, all
    ``sft_steps``; a lab may stop it earlier by a rule of its own). Every arm's RL then starts
    from a copy of its warm start, with the same seed (same tasks, same sampling stream: the task
    stream continues from where the warm start left it). Returns the trained trainers by arm
    name; each holds its warm start's ``sft_history``. In memory only: for checkpoints, run one
    arm per CLI call."""
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
            (warm_start or trainer_cls.sft)(warm)
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
