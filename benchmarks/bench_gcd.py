"""What the GCD chapter's measurements and loss cost.

    OMP_NUM_THREADS=1 python benchmarks/bench_gcd.py [--repeats 7] [--out bench_gcd.json]

1. The household environment alone (microseconds per call, medians over repeats): ``reset`` (the
   task and the expert's plan) and one whole expert episode.
2. Per-sample gradients of the 16 in-domain probe pairs' 32 rows on the quick model (130k
   parameters): one ``torch.func.vmap`` of ``grad`` (``coupling.per_sample_grads``) against a
   Python loop of one backward pass per row; the two are checked equal. And the whole coupling
   measurement of the lab (``gcd.measure_coupling``: two gradient sets, the spill-over step, two
   hidden-state passes).
3. What GCD adds to a GRPO step of the quick profile (8 tasks x 8 episodes, coupling
   measurements off): the loss stage (forward pass, loss, backward pass) of one fixed rollout batch
   with ``judge_weight`` 0 and 0.5 (timed in turn), and the difference as a share of a whole plain
   step. One batch for both, so the rollouts' lengths cannot differ. Medians over repeats, after a
   warm-up, on the untrained quick model (speed hardly depends on the weights).

``--smoke``: a few-second check that the whole script runs (1 repeat, 20 resets and 10 expert
episodes, the smallest tiny model and a 2 x 2 batch); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

try:
    import agentic_rl  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import torch

from agentic_rl import coupling
from agentic_rl.gcd import GCDConfig
from agentic_rl.envs import HouseholdEnv
from agentic_rl.gcd import GCDTrainer, measure_coupling
from agentic_rl.rollout import Batch
from agentic_rl.utils import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grpo import SMOKE_BATCH, SMOKE_MODEL  # noqa: E402  (--smoke's sizes)


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def env_costs(repeats: int, resets: int = 2000, episodes: int = 1000) -> dict:
    env = HouseholdEnv()

    def run_episodes(n):
        def run():
            for i in range(n):
                env.reset(i)
                done = False
                while not done:
                    done = env.step(env.expert_action())[2]

        return run

    def reset_many():
        for i in range(resets):
            env.reset(i)

    return {
        "reset (task and plan), us": median_s(reset_many, repeats) / resets * 1e6,
        "expert episode, us": median_s(run_episodes(episodes), repeats) / episodes * 1e6,
    }


def gradient_costs(repeats: int, **overrides) -> dict:
    """``overrides``: config fields (``--smoke``: a tiny model and batch)."""
    setup(0)
    trainer = GCDTrainer(GCDConfig(sft_steps=0, disable_tqdm=True, device="cpu", **overrides))
    model = trainer.model
    a, b = trainer.probes["train"]
    rows = Batch.cat([a, b], trainer.tokenizer.pad_token_id)  # 2 x 16 probe rows

    def loop():
        out = []
        for i in range(len(rows)):
            model.zero_grad()
            coupling.action_logprobs(model, rows.select(torch.tensor([i]))).sum().backward()
            out.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        model.zero_grad()
        return torch.stack(out)

    fast = coupling.per_sample_grads(model, rows)
    assert torch.allclose(fast, loop(), atol=1e-5)
    return {
        "rows": len(rows),
        "parameters": sum(p.numel() for p in model.parameters()),
        "per-sample grads, vmap, s": median_s(
            lambda: coupling.per_sample_grads(model, rows), repeats
        ),
        "per-sample grads, loop of backward passes, s": median_s(loop, repeats),
        "measure_coupling (all four measurements), s": median_s(
            lambda: measure_coupling(model, (a, b)), repeats
        ),
    }


def step_costs(repeats: int, **overrides) -> dict:
    """The loss stage (forward, loss, backward) of one fixed rollout batch, with and without the
    judgement; and a whole plain GRPO step for scale. ``overrides``: config fields."""
    setup(0)
    cfg = GCDConfig(sft_steps=0, coupling_every=0, disable_tqdm=True, device="cpu", **overrides)
    trainer = GCDTrainer(cfg)
    trainer.rl_step()  # warm-up
    out = {
        "GRPO step (rollout + update), s": statistics.median(
            trainer.rl_step()["step_time"] for _ in range(repeats)
        )
    }
    batch = trainer.rollout()
    adv = trainer.compute_advantages(batch)

    def loss_stage():
        trainer.model.zero_grad()
        loss, _ = trainer.compute_loss(batch, adv)
        loss.backward()

    times = {0.0: [], 0.5: []}
    for _ in range(repeats + 1):  # interleaved, so that a slow spell of the machine hits both
        for weight, spent in times.items():
            trainer.config.judge_weight = weight
            t = time.perf_counter()
            loss_stage()
            spent.append(time.perf_counter() - t)
    for weight, spent in times.items():  # the first round is the warm-up
        out[f"loss stage, judge_weight={weight}, s"] = statistics.median(spent[1:])
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument("--smoke", action="store_true",
                        help="a few-second check that the script runs: 1 repeat, few episodes, "
                             "the smallest tiny model, 2 x 2 batch (figures mean nothing)")
    args = parser.parse_args(argv)
    env_sizes, overrides = {}, {}
    if args.smoke:
        args.repeats = 1
        env_sizes = dict(resets=20, episodes=10)
        overrides = {**SMOKE_MODEL, **SMOKE_BATCH}
    torch.set_num_threads(1)
    results = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread",
        "environment": env_costs(args.repeats, **env_sizes),
        "coupling": gradient_costs(args.repeats, **overrides),
        "step": step_costs(args.repeats, **overrides),
    }
    for section, values in results.items():
        if isinstance(values, str):
            print(f"{section}: {values}")
            continue
        print(section)
        for k, v in values.items():
            print(f"  {k:48s} {v:10.4f}" if isinstance(v, float) else f"  {k:48s} {v:10d}")
    s = results["step"]
    extra = (s["loss stage, judge_weight=0.5, s"] - s["loss stage, judge_weight=0.0, s"]) / s[
        "GRPO step (rollout + update), s"
    ]
    c = results["coupling"]
    speedup = c["per-sample grads, loop of backward passes, s"] / c["per-sample grads, vmap, s"]
    print(
        f"per-sample gradients: vmap is {speedup:.2f}x the loop; the judgement loss adds "
        f"{100 * extra:+.1f} % to a step"
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
