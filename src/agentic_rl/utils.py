"""Seeding, threads and quiet logging: set once, at the top of every notebook, test and CLI run."""

from __future__ import annotations

import os
import random
import warnings

import numpy as np
import torch

__all__ = ["seed_everything", "setup", "in_colab", "stored_outputs"]


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
