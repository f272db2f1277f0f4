"""What GiGPO's advantage costs next to the rollout it is computed from.

    OMP_NUM_THREADS=1 python benchmarks/bench_gigpo.py [--repeats 5] [--sft-steps 100]
        [--env frozenlake] [--out bench_gigpo.json]

The paper (GiGPO v3 §5.6, Fig. 6) reports, per iteration of a 1.5B model on ALFWorld, 0.01 s of
anchor grouping and 0.53 s of step-advantage arithmetic next to 362.83 s of shared work: 0.15 %
(the paper prints "0.002 %", a fraction written as a percentage). Here, on the recipe's quick
profile (8 seeds x 8 episodes, a tiny model after ``--sft-steps`` of SFT so that episodes last
several turns), medians over ``--repeats`` fresh rollouts of:

1. the rollout (``trainer.rollout()``: sampling and the environments);
2. the whole advantage (``trainer.compute_advantages``: step rows, both levels, the per-token
   scatter, the anchor metrics), and within it the anchor grouping alone (``anchor_groups``);
3. a whole RL step (rollout, advantage, loss, backward, optimizer), for the share.

And the pure function alone on a batch of the paper's shape (16 groups x 8 episodes x 50 steps =
6400 step rows, anchors drawn from 20 states per group), to see how it scales.

``--smoke``: a few-second check that the whole script runs (1 repeat, 1 SFT step, the smallest
tiny model and a 2 x 2 batch); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time

try:
    import agentic_rl  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from agentic_rl.gigpo import GiGPOConfig, GiGPOTrainer, anchor_groups, gigpo_advantages
from agentic_rl.utils import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grpo import SMOKE_BATCH, SMOKE_MODEL  # noqa: E402  (--smoke's sizes)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def recipe_costs(repeats: int, sft_steps: int, env: str, **overrides) -> dict:
    """``overrides``: config fields on top of the quick profile (``--smoke``: a tiny model)."""
    setup(0)
    config = GiGPOConfig.from_profile(
        "quick", env=env, sft_steps=sft_steps, disable_tqdm=True, device="cpu", **overrides
    )
    trainer = GiGPOTrainer(config)
    trainer.sft()
    rollout, advantage, grouping, step, rows, turns = [], [], [], [], [], []
    for _ in range(repeats):
        batch, t_rollout = timed(trainer.rollout)
        _, t_adv = timed(lambda: trainer.compute_advantages(batch))
        step_rows = trainer.step_rows(batch)
        anchors, groups = step_rows["anchor_states"], step_rows["group_ids"]
        _, t_group = timed(lambda: anchor_groups(anchors, groups))
        _, t_step = timed(trainer.rl_step)
        rollout.append(t_rollout)
        advantage.append(t_adv)
        grouping.append(t_group)
        step.append(t_step)
        rows.append(len(step_rows["step_rewards"]))
        turns.append(batch.extras["num_turns"].float().mean().item())
    med = statistics.median
    return {
        "env": env,
        "episodes per step": config.prompts_per_step * config.num_generations,
        "step rows per step (median)": med(rows),
        "turns per episode (median of means)": med(turns),
        "rollout, s": med(rollout),
        "advantage (all of compute_advantages), s": med(advantage),
        "anchor grouping alone, s": med(grouping),
        "RL step, s": med(step),
        "advantage / rollout, %": 100 * med(advantage) / med(rollout),
        "advantage / RL step, %": 100 * med(advantage) / med(step),
        "recurring_share (last step)": trainer.history[-1]["recurring_share"],
    }


def paper_shape_cost(repeats: int) -> dict:
    rng = random.Random(0)
    rewards, anchors, groups, episodes = [], [], [], []
    for g in range(16):
        for e in range(8):
            for t in range(50):
                rewards.append(10.0 if t == 49 and rng.random() < 0.5 else 0.0)
                anchors.append(f"group {g} state {rng.randrange(20)}")
                groups.append(g)
                episodes.append(g * 8 + e)
    def run():
        return gigpo_advantages(rewards, anchors, groups, episodes, gamma=0.95, omega=1.0)

    times = [timed(run)[1] for _ in range(repeats)]
    return {"step rows": len(rewards), "gigpo_advantages, s": statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sft-steps", type=int, default=100)
    parser.add_argument("--env", default="frozenlake")
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true",
                        help="a few-second check that the script runs: 1 repeat, 1 SFT step, "
                             "the smallest tiny model, 2 x 2 batch (figures mean nothing)")
    args = parser.parse_args()
    overrides = {}
    if args.smoke:
        args.repeats, args.sft_steps = 1, 1
        overrides = {**SMOKE_MODEL, **SMOKE_BATCH}
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}",
        "repeats": args.repeats,
        "recipe (quick profile)": recipe_costs(
            args.repeats, args.sft_steps, args.env, **overrides
        ),
        "paper-shaped batch": paper_shape_cost(args.repeats),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
