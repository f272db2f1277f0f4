"""What a StarPO step costs, and what RAGEN's filter saves.

    OMP_NUM_THREADS=1 python benchmarks/bench_starpo.py [--repeats 5] [--out bench_starpo.json]

1. The environments alone (microseconds per call, medians over repeats): Bandit reset + step,
   FrozenLake (slippery 3 x 3) reset + one two-action turn, Sokoban reset (level generation and
   BFS check), Sokoban step (with the deadlock search), BFS from a fresh level.
2. A StarPO step of the quick profile (8 x 16 episodes) on each environment, split into the
   rollout and the update, with no filter (4 gradient steps of 32 trajectories) and with StarPO-S's
   top-25 % filter (1 gradient step): medians over repeats of ``rl_step`` on the SFT-free tiny
   model (speed hardly depends on the weights).

``--smoke``: a few-second check that the whole script runs (1 repeat, 20 calls of each kind, the
smallest tiny model and a batch of 4 x 2 episodes); its figures mean nothing.
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

from agentic_rl.starpo import StarPOConfig
from agentic_rl.envs import BanditEnv, FrozenLakeEnv, MultiActionEnv, SokobanEnv
from agentic_rl.envs.sokoban import solve
from agentic_rl.starpo import StarPOTrainer
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
    """``calls``: calls of each kind per repeat (default: 1000 to 5000 by kind)."""
    bandit = BanditEnv()
    lake = MultiActionEnv(
        FrozenLakeEnv(3, is_slippery=True, max_turns=10), max_actions_per_turn=2, max_actions=10
    )
    soko = SokobanEnv(6, max_turns=10)

    def bfs(i):
        soko.reset(i)
        solve(soko.walls, soko.box, soko.target, soko.player)

    def n(default: int) -> int:
        return calls or default

    return {
        "bandit reset + step": per_call_us(
            lambda i: (bandit.reset(i), bandit.step("dragon")), n(5000), repeats
        ),
        "frozenlake 3x3 reset + one 2-action turn": per_call_us(
            lambda i: (lake.reset(i), lake.step("right || down")), n(2000), repeats
        ),
        "sokoban reset (generate + BFS check)": per_call_us(
            lambda i: soko.reset(i), n(2000), repeats
        ),
        "sokoban reset + one step": per_call_us(
            lambda i: (soko.reset(i), soko.step("up")), n(2000), repeats
        ),
        "sokoban reset + BFS from the start": per_call_us(bfs, n(1000), repeats),
    }


def step_costs(env: str, repeats: int, **overrides) -> dict:
    """``overrides``: config fields on top of the quick profile (``--smoke``: a tiny model)."""
    out = {}
    for arm, preset in (("StarPO (no filter)", "starpo"), ("StarPO-S (top 25 %)", "starpo-s")):
        setup(0)
        cfg = StarPOConfig.from_profile(
            "quick", env=env, preset=preset, sft_steps=0, disable_tqdm=True, device="cpu",
            **overrides,
        )  # fmt: skip
        trainer = StarPOTrainer(cfg)
        trainer.rl_step()  # warm-up
        rollout, update, steps = [], [], []
        for _ in range(repeats):
            row = trainer.rl_step()
            rows = cfg.prompts_per_step * cfg.num_generations
            t_rollout = row["completion_length"] * rows / row["tokens_per_s"]
            rollout.append(t_rollout * 1e3)
            update.append((row["step_time"] - t_rollout) * 1e3)
            steps.append(row["step_time"] * 1e3)
        out[arm] = {
            "rollout ms": statistics.median(rollout),
            "update ms": statistics.median(update),
            "step ms": statistics.median(steps),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="a few-second check that the script runs: 1 repeat, 20 env calls, the "
                         "smallest tiny model, 4 x 2 episodes (figures mean nothing)")
    args = ap.parse_args()
    calls, overrides = None, {}
    if args.smoke:  # 4 groups: StarPO-S's top 25 % keeps one
        args.repeats, calls = 1, 20
        overrides = {**SMOKE_MODEL, **SMOKE_BATCH, "prompts_per_step": 4}
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
        "step_ms": {
            env: step_costs(env, args.repeats, **overrides)
            for env in ("bandit", "frozenlake", "sokoban")
        },
    }
    result["machine"]["loadavg_end"] = os.getloadavg()[0]
    print(f"environments (median of {args.repeats} repeats, microseconds per call):")
    for k, v in result["env_us"].items():
        print(f"  {k:42s} {v:8.1f}")
    print("StarPO step, quick profile, 8 x 16 episodes (medians, ms):")
    for env, arms in result["step_ms"].items():
        for arm, t in arms.items():
            print(
                f"  {env:10s} {arm:20s} rollout {t['rollout ms']:7.1f}  update "
                f"{t['update ms']:7.1f}  step {t['step ms']:7.1f}"
            )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
