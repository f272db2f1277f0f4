"""Three seeds of the agent LLM lab's run: SmolLM2-135M-Instruct, LoRA SFT, then GRPO, with the
Python tool in the loop (the ReTool recipe's ``pretrained`` profile).

The lab runs one seed to stay within ten minutes on a CPU thread; this script runs the same
profile on several seeds and reports, per seed and as mean ± sd (paired differences as mean ± SE),
held-out accuracy and code ratio: untrained (greedy), after the SFT warm start, after GRPO.

    OMP_NUM_THREADS=1 python benchmarks/seeds_agent_llm.py --seeds 0 1 2 --out seeds.json
    python benchmarks/seeds_agent_llm.py --device cuda --gpu-sizes   # the GPU profile

On a CPU the seeds run in parallel processes (``--jobs``), one torch thread each.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor


def run_seed(seed: int, device: str, gpu_sizes: bool) -> dict:
    import torch

    from agentic_rl.models import load_pretrained
    from agentic_rl.retool import ReToolConfig, ReToolTrainer
    from agentic_rl.utils import setup

    setup(seed=seed)
    t0 = time.perf_counter()
    base = load_pretrained("smollm2-135m-instruct")
    overrides = dict(disable_tqdm=True, seed=seed)
    if gpu_sizes:  # device auto/cuda on a GPU: the profile scales itself (GPU_PROFILES)
        config = ReToolConfig.from_profile("pretrained", device=device, **overrides)
    else:  # the CPU profile's sizes, on whatever device
        config = ReToolConfig.from_profile("pretrained", device="cpu", **overrides)
        config = dataclasses.replace(config, device=device)
    trainer = ReToolTrainer(config, base=(copy.deepcopy(base[0]), base[1]))
    untrained = trainer.play(trainer.eval_problems, greedy=True)
    summary = trainer.train()
    trainer.close()
    keys = ("greedy_accuracy", "sampled_accuracy", "sampled_code_ratio", "greedy_code_ratio")
    out = {"seed": seed, "untrained_greedy_accuracy": untrained.correct.float().mean().item()}
    for when in ("before", "after"):
        for k in keys:
            out[f"{k}_{when}"] = summary[f"{k}_{when}"]
    out["reward_per_step"] = [round(r["reward_mean"], 3) for r in trainer.history]
    out["step_time_median_s"] = statistics.median(r["step_time"] for r in trainer.history)
    out["wall_s"] = time.perf_counter() - t0
    out["sizes"] = {k: getattr(config, k) for k in (
        "sft_steps", "sft_batch_size", "max_steps", "prompts_per_step", "num_generations",
        "eval_size", "eval_samples", "bf16")}
    out["device"] = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    return out


def _mean_sd(xs):
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else float("nan"))


def report(runs: list[dict]) -> None:
    print(f"{'seed':>4} {'untrained':>9} | {'greedy acc':>15} | {'sampled acc':>15} | "
          f"{'code ratio (sampled)':>20}")
    for r in runs:
        print(f"{r['seed']:>4} {r['untrained_greedy_accuracy']:9.3f} | "
              f"{r['greedy_accuracy_before']:6.3f} -> {r['greedy_accuracy_after']:5.3f} | "
              f"{r['sampled_accuracy_before']:6.3f} -> {r['sampled_accuracy_after']:5.3f} | "
              f"{r['sampled_code_ratio_before']:9.3f} -> {r['sampled_code_ratio_after']:6.3f}")
    n = len(runs)
    for key in ("sampled_accuracy", "greedy_accuracy", "sampled_code_ratio"):
        diffs = [r[f"{key}_after"] - r[f"{key}_before"] for r in runs]
        m, sd = _mean_sd(diffs)
        before = _mean_sd([r[f"{key}_before"] for r in runs])
        after = _mean_sd([r[f"{key}_after"] for r in runs])
        print(f"{key}: after SFT {before[0]:.3f} ± {before[1]:.3f} (sd), after GRPO "
              f"{after[0]:.3f} ± {after[1]:.3f} (sd); GRPO − SFT {m:+.3f} ± "
              f"{sd / math.sqrt(n):.3f} (SE, n = {n}), per seed {[round(d, 3) for d in diffs]}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--device", default="cpu")
    p.add_argument("--gpu-sizes", action="store_true", help="the profile's GPU sizes")
    p.add_argument("--jobs", type=int, default=None, help="parallel seeds (CPU; default: all)")
    p.add_argument("--out", default=None, help="write the runs as JSON here")
    a = p.parse_args(argv)
    print(f"{time.strftime('%Y-%m-%d %H:%M')} | {platform.processor() or platform.machine()} | "
          f"python {sys.version.split()[0]} | device {a.device}", flush=True)
    t0 = time.perf_counter()
    if a.device == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"
        with ProcessPoolExecutor(a.jobs or len(a.seeds)) as ex:
            runs = list(ex.map(run_seed, a.seeds, [a.device] * len(a.seeds),
                               [a.gpu_sizes] * len(a.seeds)))
    else:
        runs = [run_seed(s, a.device, a.gpu_sizes) for s in a.seeds]
    report(runs)
    per_seed = [round(r["wall_s"]) for r in runs]
    print(f"total {time.perf_counter() - t0:.0f} s; per seed {per_seed} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(runs, f, indent=2)


if __name__ == "__main__":
    main()
