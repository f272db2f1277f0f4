"""Speed of the multi-turn agent loop: one KV cache reused across turns vs re-encoding the history.

Usage (from the repository root)::

    python benchmarks/bench_multiturn.py [--batch 64] [--turns 2 4 8] [--repeats 3]
        [--max-action-tokens 4] [--threads 1] [--device auto] [--out FILE.json]

For each number of turns N it runs :func:`agentic_rl.multiturn.rollout_multiturn` on ``--batch``
episodes of a mock environment defined here (``Hallway``: it accepts any action and never ends
before its ``max_turns = N``, so every episode runs exactly N turns; observations are 4 to 7 words
long, so the observation chunks are padded) with the quick-profile-sized tiny Llama (hidden 128, 4
layers, 4 heads, 2 KV heads, intermediate 512; initialised from scratch: speed hardly depends on
the weights), once with ``reuse_cache=True`` (one cache for the whole episode, only new tokens fed)
and once with ``reuse_cache=False`` (the naive baseline: every turn re-encodes the whole history,
then samples the turn with a fresh cache). An untrained model ends some actions early (it samples
the stop word or EOS at random), so the token count is counted, not assumed; both modes sample the
same tokens for the same seed (the script checks it).

The two modes are timed interleaved, in one run: after one warm-up call of each, every repeat
times one call of each mode back to back (alternating which goes first), so a load that comes and
goes on the machine hits both. Reported per mode: env steps/s (``batch * N`` steps per call) and
generated tokens/s (the Batch's ``loss_mask`` sum per call), from the median wall-clock time; and
the speed-up of the cache, the median over the repeats of each pair's ratio (no-cache time /
cache time), with its range, and the same ratio of the process's CPU time (``time.process_time``:
what the rollout itself used, which another process's load disturbs less than the wall clock).
One torch thread by default.

``--smoke``: a few-second check that the whole script runs (2 episodes of 2 turns, 1 repeat, the
smallest tiny model, on the CPU); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time

import torch
import transformers

try:
    import agentic_rl  # noqa: F401
except ImportError:  # not installed: use the checkout's src/ (src layout)
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(_ROOT, "src"))

from agentic_rl.models import build_model, build_tokenizer, count_parameters, get_device
from agentic_rl.multiturn import rollout_multiturn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the one timing loop (warm-up, CUDA sync, repeats), and --smoke's model
from bench_grpo import SMOKE_MODEL, timed  # noqa: E402

#: The quick profile's model shape.
QUICK_MODEL = dict(
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=512,
)


class Hallway:
    """Accepts any action; truncates at ``max_turns`` and never terminates earlier.

    Observation: ``[note ...] room <k> <action>`` with 0-3 ``note`` words (fixed by the seed and
    turn).
    """

    name = "hallway"

    def __init__(self, max_turns: int):
        self.max_turns = max_turns

    def vocabulary(self) -> list[str]:
        words = ["note", "room", "left", "right", "<action>", "</action>"]
        return words + [str(i) for i in range(100)]

    def reset(self, seed: int) -> str:
        self.rng, self.t = random.Random(seed), 0
        return self._obs()

    def _obs(self) -> str:
        return " ".join(["note"] * self.rng.randrange(4) + ["room", str(self.t % 100), "<action>"])

    def step(self, action_text: str):
        self.t += 1
        done = self.t >= self.max_turns
        info = dict(terminated=False, truncated=done, format_ok=True, success=False)
        return self._obs(), float("right" in action_text.split()), done, info

    def expert_action(self) -> str:
        return "right"


def machine_info(device: torch.device) -> dict:
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as fh:
            lines = (line for line in fh if line.startswith("model name"))
            cpu_model = next((line.split(":", 1)[1].strip() for line in lines), None)
    except OSError:
        pass
    return dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        python=platform.python_version(),
        torch=torch.__version__,
        transformers=transformers.__version__,
        torch_num_threads=torch.get_num_threads(),
        cpu_model=cpu_model,
        cpu_count=os.cpu_count(),
        device=str(device),
        cuda_device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        loadavg_start=os.getloadavg() if hasattr(os, "getloadavg") else None,
    )


def bench(
    model, tok, *, batch: int, turns: int, repeats: int, max_action_tokens: int, device, seed=0
) -> dict:
    seeds = list(range(batch))

    def call(reuse: bool):
        torch.manual_seed(seed)
        envs = [Hallway(turns) for _ in range(batch)]
        return rollout_multiturn(
            model, tok, envs, seeds, max_action_tokens=max_action_tokens, reuse_cache=reuse
        )

    modes = {"cache": True, "nocache": False}
    # one warm-up call of each mode; its Batch is the mode's samples
    samples = {
        name: timed(lambda r=reuse: call(r), device, repeats=0)[1] for name, reuse in modes.items()
    }
    wall = {name: [] for name in modes}
    cpu = {name: [] for name in modes}
    for k in range(repeats):  # interleaved: one call of each mode per repeat, alternating the order
        for name in list(modes)[:: 1 if k % 2 == 0 else -1]:
            c0 = time.process_time()
            (t,), b = timed(lambda r=modes[name]: call(r), device, repeats=1, warmup=0)
            cpu[name].append(time.process_time() - c0)
            wall[name].append(t)
            same = torch.equal(b.input_ids, samples[name].input_ids)
            assert same, "a mode must repeat its samples"
    out = {}
    for name in modes:
        b = samples[name]
        steps, tokens = int(b.extras["num_turns"].sum()), int(b.loss_mask.sum())
        med = statistics.median(wall[name])
        out[name] = {
            "times_s": wall[name], "median_s": med, "min_s": min(wall[name]), "cpu_s": cpu[name],
            "env_steps": steps, "tokens": tokens, "steps_per_s": steps / med,
            "tokens_per_s": tokens / med, "seq_len": int(b.input_ids.shape[1]),
        }
    full = out["cache"]["env_steps"] == batch * turns
    assert full, "every episode should run the full number of turns"
    same = torch.equal(samples["cache"].input_ids, samples["nocache"].input_ids)
    out["identical_tokens"] = bool(same)
    ratios = [n / c for c, n in zip(wall["cache"], wall["nocache"])]
    out["pair_ratios"] = ratios
    out["speedup"] = statistics.median(ratios)
    out["speedup_of_medians"] = out["nocache"]["median_s"] / out["cache"]["median_s"]
    out["speedup_cpu"] = statistics.median(n / c for c, n in zip(cpu["cache"], cpu["nocache"]))
    return out


def table(results: dict) -> str:
    rows = [
        (
            "| turns | context tokens | env steps/s, cache | env steps/s, no cache | "
            "tokens/s, cache | tokens/s, no cache | speed-up (range) | speed-up, CPU time | "
            "same tokens |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for n, r in results.items():
        c, nc = r["cache"], r["nocache"]
        lo, hi = min(r["pair_ratios"]), max(r["pair_ratios"])
        same = "yes" if r["identical_tokens"] else "NO"
        rows.append(
            f"| {n} | {c['seq_len']} | {c['steps_per_s']:,.0f} | {nc['steps_per_s']:,.0f} | "
            f"{c['tokens_per_s']:,.0f} | {nc['tokens_per_s']:,.0f} | {r['speedup']:.2f}x "
            f"({lo:.2f}-{hi:.2f}) | {r['speedup_cpu']:.2f}x | {same} |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=64, help="episodes per rollout call [64]")
    p.add_argument("--turns", type=int, nargs="+", default=[2, 4, 8],
                   help="turn counts to measure [2 4 8]")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed calls per mode, interleaved, after 1 warm-up of each [3]")
    p.add_argument("--max-action-tokens", type=int, default=4, help="tokens per action at most [4]")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default) [1]")
    p.add_argument("--device", default="auto",
                   help="'auto', 'cpu', 'cuda', 'cuda:N' or 'mps' [auto]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="write results and machine info as JSON to this file")
    p.add_argument("--smoke", action="store_true",
                   help="a few-second check that the script runs: 2 episodes of 2 turns, 1 repeat, "
                        "the smallest tiny model, CPU (figures mean nothing)")
    args = p.parse_args(argv)
    shape = QUICK_MODEL
    if args.smoke:
        args.batch, args.turns, args.repeats, args.device = 2, [2], 1, "cpu"
        shape = SMOKE_MODEL
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = get_device(args.device)
    tok = build_tokenizer(Hallway(1).vocabulary())
    model = build_model(tok, seed=args.seed, **shape).to(device)
    info = machine_info(device)
    info["parameters"] = count_parameters(model)
    results = {}
    for n in args.turns:
        results[n] = bench(model, tok, batch=args.batch, turns=n, repeats=args.repeats,
                           max_action_tokens=args.max_action_tokens, device=device, seed=args.seed)
        r = results[n]
        pairs = ", ".join(f"{x:.2f}" for x in r["pair_ratios"])
        print(
            f"turns={n}: cache {r['cache']['median_s']:.3f} s, no cache "
            f"{r['nocache']['median_s']:.3f} s (medians); speed-up {r['speedup']:.2f}x (pairs: "
            f"{pairs}), CPU time {r['speedup_cpu']:.2f}x; same tokens: "
            f"{'yes' if r['identical_tokens'] else 'NO'}",
            flush=True,
        )
    if hasattr(os, "getloadavg"):
        info["loadavg_end"] = os.getloadavg()
    md = table(results)
    desc = info["cuda_device_name"] or info["cpu_model"] or platform.processor() or "unknown CPU"
    print(f"\n{desc}, {info['cpu_count']} CPUs, torch {info['torch']}, "
          f"transformers {info['transformers']}, {info['torch_num_threads']} thread(s), "
          f"device {info['device']}, {info['parameters']:,} parameters, batch {args.batch}, "
          f"<= {args.max_action_tokens} tokens per action; {args.repeats} interleaved repeats "
          f"after 1 warm-up each; load average {info['loadavg_start']} -> "
          f"{info.get('loadavg_end')}\n")
    print(md)
    if args.out:
        with open(args.out, "w") as fh:
            out = {"machine": info, "args": vars(args), "results": results, "table_markdown": md}
            json.dump(out, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
