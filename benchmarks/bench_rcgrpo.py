"""What an RC-GRPO step costs, and how much of it the file-system environment takes.

    OMP_NUM_THREADS=1 python benchmarks/bench_rcgrpo.py [--repeats 5] [--out bench_rcgrpo.json]

1. The environment alone (microseconds per call, medians over repeats): reset (task generation),
   one whole expert episode (reset, every call, ``done`` and the state check), the state check
   alone (the golden replay and the comparison).
2. An RC-GRPO step of the quick profile (8 tasks x 8 episodes, tokens drawn per rollout) on the
   untrained quick model (speed hardly depends on the weights): the rollout, the update, the whole
   step, and the share of the rollout spent inside the environments' ``step`` (the calls and the
   final state check), timed by wrapping ``FileSystemEnv.step``. Medians over repeats.
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

from agentic_rl.config import RCGRPOConfig
from agentic_rl.envs import FileSystemEnv
from agentic_rl.rcgrpo import RCGRPOTrainer
from agentic_rl.utils import setup


def per_call_us(fn, n: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of ``n`` calls ``fn(i)``, in microseconds."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(n):
            fn(i)
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def env_costs(repeats: int) -> dict:
    env = FileSystemEnv()

    def expert_episode(i):
        env.reset(i)
        for call in env.expert_calls(i):
            env.step(call)

    def state_check(i):
        env.score()

    env.reset(0)
    return {
        "reset (task generation)": per_call_us(lambda i: env.reset(i), 5000, repeats),
        "expert episode (calls, done, state check)": per_call_us(expert_episode, 2000, repeats),
        "state check alone (golden replay + compare)": per_call_us(state_check, 5000, repeats),
    }


def step_costs(repeats: int) -> dict:
    """One RC-GRPO step, split into rollout and update, and the environments' share."""
    env_seconds = [0.0]
    original = FileSystemEnv.step

    def timed_step(self, action_text):
        t = time.perf_counter()
        try:
            return original(self, action_text)
        finally:
            env_seconds[0] += time.perf_counter() - t

    setup(0)
    cfg = RCGRPOConfig.from_profile("quick", sft_steps=0, disable_tqdm=True, device="cpu")
    trainer = RCGRPOTrainer(cfg)
    trainer.grpo_step()  # warm-up
    rollout, update, steps, env_share = [], [], [], []
    FileSystemEnv.step = timed_step
    try:
        for _ in range(repeats):
            env_seconds[0] = 0.0
            row = trainer.grpo_step()
            rows = cfg.prompts_per_step * cfg.num_generations
            t_rollout = row["completion_length"] * rows / row["tokens_per_s"]
            rollout.append(t_rollout * 1e3)
            update.append((row["step_time"] - t_rollout) * 1e3)
            steps.append(row["step_time"] * 1e3)
            env_share.append(env_seconds[0] / t_rollout)
    finally:
        FileSystemEnv.step = original
    return {
        "rollout ms": statistics.median(rollout),
        "update ms": statistics.median(update),
        "step ms": statistics.median(steps),
        "env share of the rollout": statistics.median(env_share),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "loadavg_start": os.getloadavg()[0],
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "env_us": env_costs(args.repeats),
        "step": step_costs(args.repeats),
    }
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    print(f"machine: {result['machine']}")
    print("file-system environment, microseconds per call (median of repeats):")
    for name, us in result["env_us"].items():
        print(f"  {name:45s} {us:8.1f}")
    s = result["step"]
    print("RC-GRPO step, quick profile (8 tasks x 8 episodes), median of repeats:")
    print(
        f"  rollout {s['rollout ms']:.0f} ms, update {s['update ms']:.0f} ms, "
        f"step {s['step ms']:.0f} ms"
    )
    print(f"  environment share of the rollout: {100 * s['env share of the rollout']:.1f} %")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
