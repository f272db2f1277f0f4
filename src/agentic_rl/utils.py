"""Seeding, threads and quiet logging (set once, at the top of every notebook, test and CLI run),
and the seed streams every recipe shares.

Seed streams, in one place so that training and held-out seeds never overlap:

==============================  ===============================================================
training draws                  :func:`train_seed`: episode and problem seeds below ``10**6``
held-out episode seeds          :func:`eval_seeds`: ``10**6 + 10_000 * seed + i``
held-out problems (GRPO tasks)  ``random.Random(EVAL_PROBLEMS_OFFSET + seed)``
probe seeds (GCD's coupling)    :func:`probe_seeds`: ``3 * 10**6 + i``
a recipe's own draws per step   :func:`substream`: ``random.Random("name:seed:step")``
evaluation sampling             :func:`fixed_rng` seeded with :func:`eval_sampling_seed`
==============================  ===============================================================
"""

from __future__ import annotations

import os
import random
import warnings
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

__all__ = [
    "seed_everything",
    "setup",
    "in_colab",
    "stored_outputs",
    "fixed_rng",
    "mixed_precision",
    "train_seed",
    "eval_seeds",
    "probe_seeds",
    "substream",
    "eval_sampling_seed",
    "TRAIN_SEEDS",
    "EVAL_PROBLEMS_OFFSET",
    "CONDITION_DRAW_OFFSET",
]

#: Training episode seeds are drawn from ``range(TRAIN_SEEDS)``; held-out ones lie above it.
TRAIN_SEEDS = 10**6
#: The held-out problems of a single-turn task come from ``random.Random(10_000 + seed)``.
EVAL_PROBLEMS_OFFSET = 10_000
#: Evaluation samples from its own torch stream, ``seed + EVAL_SAMPLING_OFFSET``.
EVAL_SAMPLING_OFFSET = 1234
#: RC-GRPO's reward tokens in evaluation: ``random.Random(seed + CONDITION_DRAW_OFFSET)``.
CONDITION_DRAW_OFFSET = 4321
_PROBE_SEEDS = 3 * 10**6


def train_seed(rng: random.Random) -> int:
    """One training episode seed from the run's checkpointed task stream ``rng``."""
    return rng.randrange(TRAIN_SEEDS)


def substream(name: str, seed: int, index: int) -> random.Random:
    """A stream of its own for one step of one kind of draw (RC-GRPO's demonstrations and reward
    tokens): a function of ``(name, seed, index)`` only, so it needs no checkpoint and takes
    nothing from the task stream; arms that draw differently still see the same tasks. (A string
    seed is hashed with SHA-512 by :class:`random.Random`, whatever ``PYTHONHASHSEED`` is.)"""
    return random.Random(f"{name}:{seed}:{index}")


def eval_seeds(seed: int, n: int) -> list[int]:
    """The ``n`` held-out episode seeds of a run with config seed ``seed`` (above every training
    seed, and apart for different config seeds up to 10,000 held-out episodes)."""
    return [TRAIN_SEEDS + 10_000 * seed + i for i in range(n)]


def probe_seeds(n: int) -> list[int]:
    """Seeds of fixed probes (GCD's coupling pairs), apart from training and evaluation."""
    return [_PROBE_SEEDS + i for i in range(n)]


def eval_sampling_seed(seed: int) -> int:
    """The seed of evaluation's own sampling stream (see :func:`fixed_rng`)."""
    return seed + EVAL_SAMPLING_OFFSET


@contextmanager
def fixed_rng(seed: int, device: torch.device):
    """Run a block with its own torch RNG stream, leaving the caller's stream untouched (how an
    evaluation samples without moving the training stream)."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def mixed_precision(device: torch.device, bf16: bool):
    """``torch.autocast`` to bfloat16 when ``bf16`` is asked for and ``device`` is a CUDA GPU that
    supports it (config field ``bf16``); otherwise a context that changes nothing."""
    if bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def seed_everything(seed: int) -> None:
    """Seed python's ``random``, numpy and torch (CPU and all GPUs)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def in_colab() -> bool:
    import sys

    return "google.colab" in sys.modules


def setup(seed: int = 0, *, threads: int | None = 1, quiet: bool = True) -> None:
    """Make a run reproducible: seeds, one torch thread,
    and no download/progress noise from transformers.

    One thread is both the deterministic choice (bits depend on the thread count) and the fast one
    on a small shared CPU (two threads on two busy cores oversubscribe OpenMP; see
    ``reference/stack.md``). Pass ``threads=None`` to leave torch's default.
    """
    if threads is not None:
        torch.set_num_threads(threads)
    seed_everything(seed)
    if quiet:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        # tqdm.auto (imported by transformers) warns in a notebook without ipywidgets;
        # text bars are fine
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()


def stored_outputs(notebook: str, tag: str) -> list[tuple[str, str]]:
    """The stored outputs of a notebook's cells tagged ``tag``, in order, as ``(kind, value)``:
    ``("text", printed text)`` or ``("png", base64 image)``.

    How a chapter (and its slides) shows its lab's results without re-running the lab.
    """
    import json

    with open(notebook) as fh:
        cells = json.load(fh)["cells"]
    found = []
    for cell in cells:
        if tag not in cell.get("metadata", {}).get("tags", []):
            continue
        text = None  # a cell's printed text, in one piece however many chunks the kernel sent
        for out in cell.get("outputs", []):
            if out.get("name") == "stdout":
                if text is None:
                    text = len(found)
                    found.append(("text", ""))
                found[text] = ("text", found[text][1] + "".join(out["text"]))
            elif "image/png" in out.get("data", {}):
                found.append(("png", out["data"]["image/png"]))
    return found
