"""What an RC-GRPO step costs, and how much of it the file-system environment takes.

    OMP_NUM_THREADS=1 python benchmarks/bench_rcgrpo.py [--repeats 7] [--out bench_rcgrpo.json]

1. The environment alone (microseconds per call, medians over repeats): reset (task generation),
   one whole expert episode (reset, every call, ``done`` and the state check), the state check
   alone (``score()`` on a finished, successful episode: the golden replay, the results and the
   comparison of the two trees).
2. An RC-GRPO step of the quick profile (8 tasks x 8 episodes, tokens drawn per rollout) on the
   untrained quick model (speed hardly depends on the weights): the rollout's wall time (timed
   around ``trainer.rollout``), the update (the rest of the step), the whole ``rl_step()``, and
   the share of the rollout spent in the environment, timed by wrapping ``FileSystemEnv``'s
   methods: in ``step`` alone (the calls and the final state check), and in all of its work
   (construction, ``reset``, ``task_family`` and ``step``; nested calls counted once). Medians
   over repeats, after one warm-up step.

``--smoke``: a few-second check that the whole script runs (1 repeat, 20 calls of each kind, the
smallest tiny model and a 2 x 2 batch); its figures mean nothing.
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

from agentic_rl.rcgrpo import RCGRPOConfig
from agentic_rl.envs import FileSystemEnv
from agentic_rl.rcgrpo import RCGRPOTrainer
from agentic_rl.utils import setup

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grpo import SMOKE_BATCH, SMOKE_MODEL  # noqa: E402  (--smoke's sizes)


def per_call_us(fn, n: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of ``n`` calls ``fn(i)``, in microseconds."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(n):
            fn(i)
        times.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(times)


def env_costs(repeats: int, calls: int | None = None) -> dict:
    """``calls``: calls of each kind per repeat (default: 5000 resets and state checks, 2000
    expert episodes)."""
    env = FileSystemEnv()

    def expert_episode(i):
        env.reset(i)
        done = False
        while not done:
            _, _, done, _ = env.step(env.expert_action())

    finished = []  # successful expert episodes: score() runs the replay and the full comparison
    for seed in range(64):
        e = FileSystemEnv()
        e.reset(seed)
        done = False
        while not done:
            _, _, done, _ = e.step(e.expert_action())
        assert e.success
        finished.append(e)

    def state_check(i):
        finished[i % len(finished)].score()

    many, fewer = (calls, calls) if calls else (5000, 2000)
    return {
        "reset (task generation)": per_call_us(lambda i: env.reset(i), many, repeats),
        "expert episode (calls, done, state check)": per_call_us(expert_episode, fewer, repeats),
        "state check alone (golden replay + compare)": per_call_us(state_check, many, repeats),
    }


TIMED = ("__init__", "reset", "task_family", "step")


def step_costs(repeats: int, **overrides) -> dict:
    """One RC-GRPO step, split into rollout and update, and the environment's share.
    ``overrides``: config fields on top of the quick profile (``--smoke``: a tiny model)."""
    spent = dict.fromkeys(TIMED, 0.0)
    depth = [0]  # reset calls make_task, task_family too: count the outermost call only
    originals = {name: getattr(FileSystemEnv, name) for name in TIMED}

    def timed(name):
        method = originals[name]

        def wrapper(self, *args, **kwargs):
            depth[0] += 1
            t = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[name] += time.perf_counter() - t

        return wrapper

    setup(0)
    cfg = RCGRPOConfig.from_profile(
        "quick", sft_steps=0, disable_tqdm=True, device="cpu", **overrides
    )
    trainer = RCGRPOTrainer(cfg)
    rollout_seconds = [0.0]
    rollout = trainer.rollout

    def timed_rollout():
        t = time.perf_counter()
        try:
            return rollout()
        finally:
            rollout_seconds[0] = time.perf_counter() - t

    trainer.rollout = timed_rollout
    trainer.rl_step()  # warm-up
    rollouts, updates, steps, step_share, env_share = [], [], [], [], []
    for name in TIMED:
        setattr(FileSystemEnv, name, timed(name))
    try:
        for _ in range(repeats):
            spent.update(dict.fromkeys(TIMED, 0.0))
            t = time.perf_counter()
            trainer.rl_step()
            t_step = time.perf_counter() - t
            t_rollout = rollout_seconds[0]
            rollouts.append(t_rollout * 1e3)
            updates.append((t_step - t_rollout) * 1e3)
            steps.append(t_step * 1e3)
            step_share.append(spent["step"] / t_rollout)
            env_share.append(sum(spent.values()) / t_rollout)
    finally:
        for name, method in originals.items():
            setattr(FileSystemEnv, name, method)
    return {
        "rollout ms": statistics.median(rollouts),
        "update ms": statistics.median(updates),
        "step ms": statistics.median(steps),
        "env.step share of the rollout": statistics.median(step_share),
        "all env work share of the rollout": statistics.median(env_share),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="a few-second check that the script runs: 1 repeat, 20 env calls, the "
                         "smallest tiny model, 2 x 2 batch (figures mean nothing)")
    args = ap.parse_args()
    calls, overrides = None, {}
    if args.smoke:
        args.repeats, calls = 1, 20
        overrides = {**SMOKE_MODEL, **SMOKE_BATCH}
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
        "env_us": env_costs(args.repeats, calls),
        "step": step_costs(args.repeats, **overrides),
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
    print(
        f"  share of the rollout in env.step (calls + state check): "
        f"{100 * s['env.step share of the rollout']:.1f} %; in all env work (construction, "
        f"reset, task_family, step): {100 * s['all env work share of the rollout']:.1f} %"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
