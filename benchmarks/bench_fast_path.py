"""The fast path's effect on every recipe's RL step: ``share_prompt_prefix`` and
``skip_prompt_logits`` on (the default since the house issue) against both off (the plain path).

For each registered recipe, two trainers are built from the recipe's quick profile (the labs'
starting point) with the same seed and ``sft_steps=0``, and their RL steps are timed in turn
(plain, fast, plain, fast, ...), so that a change in the machine's load hits both alike. Reported:
the median wall time of a step of each, and their ratio. One torch thread.

    python benchmarks/bench_fast_path.py [--repeats 7] [--recipes grpo ppo ...]

The GCD recipe's judgement loss reads the logits of the whole sequence and so runs the plain pass
whatever the flags say; its figure shows what remains (sampling with each prompt encoded once is
single-turn only, so the agent recipes gain in the loss's forward pass alone).

``--smoke``: a few-second check that the script runs (every recipe on the smallest tiny model and
a 2 x 2 batch, one timed step each; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys

import torch

from agentic_rl.cli import RECIPES, recipe
from agentic_rl.utils import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grpo import SMOKE_BATCH, SMOKE_MODEL  # noqa: E402  (--smoke's sizes)


#: What a recipe needs besides ``sft_steps=0`` to be built without its warm start: Early
#: Experience counts its initial policy's steps inside ``sft_steps``, which must exceed them. The
#: warm start never runs here (the steps are timed on the untrained model), so this changes
#: nothing that is timed.
NO_WARM_START = {"early-experience": dict(sft_steps=1, initial_steps=0, world_model_steps=0)}


def time_recipe(name: str, repeats: int, **overrides) -> dict:
    """``overrides``: config fields on top of the quick profile (``--smoke``: a tiny model)."""
    chapter = recipe(name)
    fields = {"sft_steps": 0, "eval_size": 2, "disable_tqdm": True, **NO_WARM_START.get(name, {})}
    base = chapter.CONFIG.from_profile("quick", **{**fields, **overrides})
    trainers = {}
    for fast in (False, True):
        setup(0)
        config = dataclasses.replace(base, share_prompt_prefix=fast, skip_prompt_logits=fast)
        trainers[fast] = chapter.TRAINER(config)
    times = {False: [], True: []}
    try:
        for fast in (False, True):  # one warm-up step each
            trainers[fast].rl_step()
        for _ in range(repeats):
            for fast in (False, True):
                times[fast].append(trainers[fast].rl_step()["step_time"])
    finally:
        for t in trainers.values():
            t.close()
    plain, fast = statistics.median(times[False]), statistics.median(times[True])
    return dict(recipe=name, plain_s=plain, fast_s=fast, ratio=plain / fast)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--recipes", nargs="*", default=sorted(RECIPES))
    parser.add_argument("--smoke", action="store_true",
                        help="a few-second check that the script runs: every recipe on the "
                             "smallest tiny model, 2 x 2 batch, 1 step (figures mean nothing)")
    args = parser.parse_args()
    overrides = {}
    if args.smoke:
        args.repeats = 1
        overrides = {**SMOKE_MODEL, **SMOKE_BATCH, "device": "cpu"}
    torch.set_num_threads(1)
    print("| recipe | plain step (s) | fast step (s) | plain / fast |")
    print("|---|---|---|---|")
    for name in args.recipes:
        r = time_recipe(name, args.repeats, **overrides)
        print(f"| {name} | {r['plain_s']:.3f} | {r['fast_s']:.3f} | {r['ratio']:.2f}x |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
