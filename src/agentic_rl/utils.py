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
from dataclasses import dataclass

import numpy as np
import torch

__all__ = [
    "seed_everything",
    "setup",
    "in_colab",
    "stored_outputs",
    "fixed_rng",
    "Precision",
    "choose_precision",
    "mixed_precision",
    "grad_scaler",
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


@dataclass(frozen=True)
class Precision:
    """How a run computes (:func:`choose_precision`): ``name`` ("bf16", "fp16" or "fp32"), the
    dtype its forward passes autocast to (None: no autocast), whether its loss goes through a
    gradient scaler (fp16 only), and ``reason``, one line that says why."""

    name: str
    autocast_dtype: torch.dtype | None
    use_grad_scaler: bool
    reason: str


#: fp16 autocast pays off from tensor cores on: compute capability 7.0 (Volta; a T4 is 7.5).
FP16_MIN_CAPABILITY = (7, 0)


def choose_precision(device: torch.device, requested: bool = True) -> Precision:
    """The precision of a run on ``device`` (``requested``: config field ``bf16``), decided here
    only. Weights, gradients and AdamW stay float32 in every case; only the forward passes'
    matmuls run in half precision, under ``torch.autocast``.

    =====================================  =====  ==============================================
    device                                 name   why
    =====================================  =====  ==============================================
    CPU, MPS, or not ``requested``         fp32   CPU autocast is slower here and changes the
                                                  numbers the tests pin; MPS: not tried
    CUDA with native bf16 (Ampere+: 8.0)   bf16   float32's range: no overflow, no scaler
    CUDA 7.0+ without bf16 (T4: 7.5)       fp16   tensor cores; a GradScaler, because small
                                                  fp16 gradients underflow to zero unscaled
    older CUDA (P100: 6.0)                 fp32   no tensor cores: fp16 gains little there
    =====================================  =====  ==============================================

    bf16 is asked ``including_emulation=False``: torch reports a T4 as bf16-capable through
    emulation, which runs far slower than its fp16 tensor cores."""
    device = torch.device(device)
    if device.type == "cpu":
        why = "autocast on CPU is slower here and changes the numbers the tests pin"
        return Precision("fp32", None, False, f"CPU: float32 ({why})")
    if device.type != "cuda":
        why = "mixed precision is used on CUDA GPUs only"
        return Precision("fp32", None, False, f"{device.type.upper()}: float32 ({why})")
    if not requested:
        return Precision("fp32", None, False, "CUDA: float32 (mixed precision not asked for)")
    if torch.cuda.is_bf16_supported(including_emulation=False):
        why = "the GPU computes bfloat16 natively; float32's range, so no gradient scaler"
        return Precision("bf16", torch.bfloat16, False, f"CUDA: bfloat16 autocast ({why})")
    if not torch.cuda.is_available():
        return Precision("fp32", None, False, "CUDA: float32 (CUDA is not available)")
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) >= FP16_MIN_CAPABILITY:
        why = f"compute capability {major}.{minor}: no native bfloat16, but fp16 tensor cores"
        return Precision("fp16", torch.float16, True, f"CUDA: float16 autocast, GradScaler ({why})")
    why = f"compute capability {major}.{minor}: no bfloat16, no tensor cores for float16"
    return Precision("fp32", None, False, f"CUDA: float32 ({why})")


def mixed_precision(device: torch.device, bf16: bool):
    """``torch.autocast`` to the dtype :func:`choose_precision` picks for ``device`` when mixed
    precision is asked for (config field ``bf16``): bfloat16 where the GPU supports it, float16
    on an older one; otherwise (CPU, fp32) a context that changes nothing."""
    dtype = choose_precision(device, bf16).autocast_dtype
    if dtype is None:
        return nullcontext()
    return torch.autocast("cuda", dtype=dtype)  # (only a CUDA device gets a dtype)


def grad_scaler(device: torch.device, requested: bool) -> torch.amp.GradScaler:
    """The run's gradient scaler: a working ``GradScaler("cuda")`` when :func:`choose_precision`
    picks fp16 (it scales the loss up so that small fp16 gradients do not underflow, unscales
    them before clipping, and skips a step whose gradients overflowed, lowering its scale), else
    a disabled one (``enabled=False``), whose ``scale(loss)`` is ``loss``, ``unscale_`` and
    ``update`` do nothing, and ``step(optimizer)`` is ``optimizer.step()``: the same computation
    as without it."""
    fp16 = choose_precision(device, requested).use_grad_scaler
    scaler = torch.amp.GradScaler("cuda", enabled=fp16)
    if scaler.is_enabled():  # its scale made now, not at the first scale(loss): a torchrun rank
        scaler.scale(torch.ones((), device=device))  # with no rows then can still unscale_
    return scaler


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
