"""Each lab's recorded experiment: one module per lab, run by :mod:`agentic_rl.records`.

The contract a module fulfils (``agentic_rl.experiments.gigpo`` is the example):

- ``ARMS``: arm name -> the config fields the arm changes (the lab's arms, in order);
- ``SEEDS``: how many seeds the record holds (from the lab's power computation; >= 8 for a
  comparison);
- ``REPLICATE``: the main arms, re-run live for one recorded seed in the lab (CI's check);
- ``CHECKED``: the metrics the live replicate is compared on (``FLOORS``: their resolutions,
  where not 0.01);
- ``train(seed, arms, *, profile, device, **overrides)``: the trained trainers of one seed, by
  arm, from shared warm starts, exactly as the lab's own cells would train them;
- ``measure(trainer, arm, seed)``: ``{"metrics": {name: number}, "curves": {name: [...]}}``,
  everything the lab prints, asserts or plots about that trainer.

The measurement code lives here, once: the runner and the lab's live replicate both call it.
"""

from __future__ import annotations

import math

__all__ = ["evaluations", "curves", "NO_CLIP"]

#: A max_grad_norm no gradient reaches: the unclipped control arms of the ReTool and StarPO labs.
NO_CLIP = 1e9


def evaluations(trainer) -> dict[str, float]:
    """Every number of a trainer's evaluations, as ``<when>_<key>`` (``before_id_sampled_success``:
    the evaluation after the warm start, before RL); NaN where it measured nothing (None)."""
    return {
        f"{when}_{key}": math.nan if value is None else float(value)
        for when, evals in trainer.evals.items()
        for key, value in evals.items()
        if value is None or isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def curves(history: list[dict], keys) -> dict[str, list[float]]:
    """The per-step values of ``keys`` (NaN where a step did not log one)."""
    return {
        k: [math.nan if r.get(k) is None else float(r[k]) for r in history] for k in keys
    }
