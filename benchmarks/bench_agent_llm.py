"""The agent on a real chat model: multi-turn rollout speed and where a GRPO step's time goes.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/bench_agent_llm.py [--batch 16] [--repeats 3] [--steps 3]
        [--max-action-tokens 20] [--sft-steps 4] [--tiny-sft-steps 400] [--device auto]
        [--gpu-sizes] [--quick] [--threads 1] [--out FILE.json]

Two models, each in its ReTool profile: **SmolLM2-135M-Instruct** (the ``pretrained`` profile:
LoRA on the attention projections, the ``python-tool`` env, its chat template read by
:class:`~agentic_rl.chat.ChatFormat`) and the **tiny word-level Llama** of the ``quick`` profile
(~126k parameters, the ``multiply`` env). Each starts with a short SFT (``--sft-steps`` and
``--tiny-sft-steps`` teacher steps: the untrained policies end nearly every episode in their first
turn, SmolLM2 by chatting instead of writing a code block, so there would be no later turn to
keep a cache for), then:

1. **Rollout, cache kept vs re-encoding each turn.** :func:`~agentic_rl.multiturn.
   rollout_multiturn` on ``--batch`` episodes (fixed seeds; a sandbox pool of 1 worker; the
   real model at ``--temperature`` 0.7 with at most ``--max-action-tokens`` 20 tokens a turn, the
   tiny one with its profile's 10), once with ``reuse_cache=True`` and once with
   ``reuse_cache=False``, the same torch seed before each. As in ``bench_multiturn.py``, after one
   warm-up call of each mode every repeat times one call of each, back to back, alternating which
   goes first. Reported: sampled (policy) tokens per second (``batch.loss_mask.sum()`` / median
   wall time), the cache's speed-up (median over the repeats of each pair's ratio, with its
   range), the tool's seconds per call, turns per episode, and whether the two modes sampled the
   same ``input_ids`` (they should; a difference is reported, not hidden).
2. **A GRPO step split into rollout (of which tool) and update.** ``trainer.rl_step()`` after
   one untimed warm-up step, ``--steps`` timed steps; ``trainer.rollout`` is wrapped with a timer
   (the rollout as ``rl_step`` times it: episodes, the reference's log-probs, values) and the
   env classes' ``_run_programs`` with another (the sandbox calls of a turn, all episodes' at
   once). Update = step - rollout (advantages, loss, backward, AdamW, the history row);
   sampling = rollout - tool. Medians over the steps.

``--device`` (default ``auto``: CUDA when there is one) runs the same script on a GPU, every
timing bracketed by ``torch.cuda.synchronize()``. On CUDA the ``pretrained`` profile's GPU sizes
(bigger groups, bf16, 4 tool workers) are used only with ``--gpu-sizes`` (its batch then also sets
part 1's); by default the sizes are the CPU profile's, so the two machines run the same work.
``--quick``: a smoke run of about a minute on CPU (repeats 1, steps 1, batch 4, one prompt of 4
episodes per RL step, no warm-up step, 2 SFT steps of 4 demonstrations, 50 tiny SFT steps). One
torch thread by default.

``--smoke``: a few-second check that the whole script runs: ``--quick``'s sizes cut further (2
episodes, groups of 2, 1 SFT step each), on the CPU, with the packaged model's tokenizer and chat
template on a randomly initialised Llama of the smallest shape in place of its 135M weights
(``bench_pretrained.tiny_pretrained``), and the smallest tiny Llama in place of the quick one;
its figures mean nothing. Where the packaged model is not installed it says so and runs the tiny
Llama alone.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time

import torch

try:
    import agentic_rl  # noqa: F401
except ImportError:  # not installed: use the checkout's src/ (src layout)
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(_ROOT, "src"))

from agentic_rl import sandbox
from agentic_rl.envs.multiply import MultiplyEnv
from agentic_rl.envs.python_tool import PythonToolEnv
from agentic_rl.models import count_parameters, get_device, load_pretrained
from agentic_rl.multiturn import rollout_multiturn
from agentic_rl.retool import ReToolConfig, ReToolTrainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grpo import SMOKE_MODEL, _sync  # noqa: E402  (CUDA / MPS synchronisation, --smoke)
from bench_multiturn import machine_info  # noqa: E402  (CPU model, torch version, device name)
from bench_pretrained import tiny_pretrained  # noqa: E402  (--smoke's stand-in for SmolLM2)

# --------------------------------------------------------------------------------------------------
# the tool's clock: every sandbox call of a turn goes through an env class's _run_programs

TOOL = {"s": 0.0, "calls": 0, "programs": 0}


def _clock_tool(cls) -> None:
    run = cls.__dict__["_run_programs"]

    @functools.wraps(run)
    def timed_run(self, programs):
        t0 = time.perf_counter()
        try:
            return run(self, programs)
        finally:
            TOOL["s"] += time.perf_counter() - t0
            TOOL["calls"] += 1
            TOOL["programs"] += len(programs)

    cls._run_programs = timed_run


for _cls in (MultiplyEnv, PythonToolEnv):  # PythonToolEnv overrides it: both
    _clock_tool(_cls)


# --------------------------------------------------------------------------------------------------
# 1. rollout: cache kept vs re-encoding each turn


def bench_rollout(trainer, *, batch: int, repeats: int, max_action_tokens: int,
                  temperature: float, seed: int) -> dict:
    """Both modes of ``rollout_multiturn`` with the trainer's policy, envs and chat format."""
    c, device = trainer.config, trainer.device
    seeds = [seed + i for i in range(batch)]
    pool = sandbox.Pool(workers=1, timeout_s=c.tool_timeout_s, memory_mb=c.tool_memory_mb)

    def call(reuse: bool):
        envs = [trainer.make_task(pool=pool) for _ in range(batch)]
        torch.manual_seed(seed)
        tool0 = TOOL["s"]
        _sync(device)
        t0 = time.perf_counter()
        with trainer.mixed_precision():
            b = rollout_multiturn(
                trainer.model, trainer.tokenizer, envs, seeds,
                max_action_tokens=max_action_tokens, stop_word="</code>", keep_stop_word=True,
                chat=trainer.chat_format, temperature=temperature, reuse_cache=reuse,
            )
        _sync(device)
        return time.perf_counter() - t0, TOOL["s"] - tool0, b

    modes = {"cache": True, "nocache": False}
    try:
        samples = {name: call(reuse)[2] for name, reuse in modes.items()}  # warm-up of each
        wall = {name: [] for name in modes}
        tool = {name: [] for name in modes}
        repeatable = True
        for k in range(repeats):  # interleaved, alternating which mode goes first
            for name in list(modes)[:: 1 if k % 2 == 0 else -1]:
                t, t_tool, b = call(modes[name])
                wall[name].append(t)
                tool[name].append(t_tool)
                repeatable &= torch.equal(b.input_ids, samples[name].input_ids)
    finally:
        pool.close()
    out = {}
    for name in modes:
        b = samples[name]
        tokens, med = int(b.loss_mask.sum()), statistics.median(wall[name])
        out[name] = {
            "times_s": wall[name], "median_s": med, "min_s": min(wall[name]),
            "tool_s": tool[name], "tool_median_s": statistics.median(tool[name]),
            "tokens": tokens, "tokens_per_s": tokens / med,
            "turns_per_episode": float(b.extras["num_turns"].float().mean()),
            "seq_len": int(b.input_ids.shape[1]),
            "accuracy": float(b.correct.float().mean()),
        }
    a, b = samples["cache"].input_ids, samples["nocache"].input_ids
    out["identical_tokens"] = a.shape == b.shape and bool(torch.equal(a, b))
    out["repeatable"] = bool(repeatable)  # each mode sampled its warm-up's ids again
    out["pair_ratios"] = [n / k for k, n in zip(wall["cache"], wall["nocache"])]
    out["speedup"] = statistics.median(out["pair_ratios"])
    out.update(episodes=batch, max_action_tokens=max_action_tokens, temperature=temperature)
    if not out["identical_tokens"]:
        print("  WARNING: cache and no-cache sampled different input_ids", flush=True)
    if not out["repeatable"]:
        print("  WARNING: a mode did not repeat its own samples", flush=True)
    return out


# --------------------------------------------------------------------------------------------------
# 2. GRPO steps: rollout (of which tool) and update


def bench_steps(trainer, *, steps: int, warmup: int) -> dict:
    device, rec = trainer.device, {}
    rollout = trainer.rollout

    def timed_rollout():
        tool0 = TOOL["s"]
        _sync(device)
        t0 = time.perf_counter()
        b = rollout()
        _sync(device)
        rec.update(rollout=time.perf_counter() - t0, tool=TOOL["s"] - tool0)
        return b

    trainer.rollout = timed_rollout  # rl_step calls self.rollout()
    rows = []
    try:
        for k in range(warmup + steps):
            _sync(device)
            t0 = time.perf_counter()
            row = trainer.rl_step()
            _sync(device)
            total = time.perf_counter() - t0
            if k >= warmup:
                rows.append(dict(
                    step_s=total, rollout_s=rec["rollout"], tool_s=rec["tool"],
                    sampling_s=rec["rollout"] - rec["tool"], update_s=total - rec["rollout"],
                    tool_calls=row.get("tool_calls"), reward_mean=row["reward_mean"],
                    completion_length=row["completion_length"],
                ))
    finally:
        del trainer.rollout
    c = trainer.config
    out = {k: statistics.median(r[k] for r in rows)
           for k in ("step_s", "rollout_s", "tool_s", "sampling_s", "update_s")}
    episodes = c.prompts_per_step * c.num_generations
    out.update(
        rows=rows, steps=steps, warmup=warmup, episodes=episodes,
        sampled_tokens=statistics.median(r["completion_length"] * episodes for r in rows),
        tool_calls_per_episode=statistics.median(r["tool_calls"] for r in rows),
    )
    return out


# --------------------------------------------------------------------------------------------------
# the two trainers


def cpu_sizes(cls, profile: str) -> dict:
    """Overrides that undo the GPU profile's sizes: the CPU profile's values (or the defaults)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    cpu = cls.PROFILES[profile]
    return {k: cpu[k] if k in cpu else fields[k].default for k in cls.GPU_PROFILES.get(profile, {})}


def real_trainer(args, device: str) -> tuple[ReToolTrainer, float]:
    t0 = time.perf_counter()
    model, tok = load_pretrained(args.model)
    load_s = time.perf_counter() - t0
    over = dict(disable_tqdm=True, device=device, output_dir=None, seed=args.seed,
                model_name_or_path=args.model,
                sft_steps=args.sft_steps, max_steps=args.warmup + args.steps)
    if args.sft_batch_size:
        over["sft_batch_size"] = args.sft_batch_size
    if get_device(device).type == "cuda" and not args.gpu_sizes:
        over = {**cpu_sizes(ReToolConfig, "pretrained"), **over}
    if args.prompts_per_step:
        over["prompts_per_step"] = args.prompts_per_step
    over.update(args.real_sizes)
    config = ReToolConfig.from_profile("pretrained", **over)
    return ReToolTrainer(config, base=(copy.deepcopy(model), tok)), load_s


def tiny_trainer(args, device: str) -> ReToolTrainer:
    config = ReToolConfig.from_profile(
        "quick", disable_tqdm=True, device=device, output_dir=None, seed=args.seed,
        sft_steps=args.tiny_sft_steps, max_steps=args.warmup + args.steps, **args.tiny_sizes,
    )
    return ReToolTrainer(config)


def run_model(name: str, trainer: ReToolTrainer, args, *, batch: int) -> dict:
    c = trainer.config
    t0 = time.perf_counter()
    trainer.sft()
    sft_s = time.perf_counter() - t0
    res = {
        "name": name, "parameters": count_parameters(trainer.model),
        "trainable": count_parameters(trainer.model, trainable_only=True),
        "env": c.env, "sft_steps": c.sft_steps, "sft_s": sft_s,
        "config": {k: getattr(c, k) for k in (
            "profile", "prompts_per_step", "num_generations", "max_turns", "max_action_tokens",
            "temperature", "tool_workers", "bf16", "use_lora", "log_kl", "num_minibatches")},
    }
    print(f"{name}: {res['parameters']:,} parameters ({res['trainable']:,} trainable), "
          f"SFT {c.sft_steps} steps in {sft_s:.1f} s", flush=True)
    mat = args.max_action_tokens if c.model_name_or_path else c.max_action_tokens
    temp = args.temperature  # both models: the real model's sampling temperature
    r = res["rollout"] = bench_rollout(trainer, batch=batch, repeats=args.repeats,
                                       max_action_tokens=mat, temperature=temp, seed=args.seed)
    print(f"  rollout: cache {r['cache']['median_s']:.3f} s, no cache "
          f"{r['nocache']['median_s']:.3f} s; speed-up {r['speedup']:.2f}x; "
          f"same tokens: {'yes' if r['identical_tokens'] else 'NO'}", flush=True)
    s = res["steps"] = bench_steps(trainer, steps=args.steps, warmup=args.warmup)
    print(f"  GRPO step {s['step_s']:.2f} s: rollout {s['rollout_s']:.2f} s (tool "
          f"{s['tool_s']:.2f} s), update {s['update_s']:.2f} s", flush=True)
    trainer.close()
    return res


# --------------------------------------------------------------------------------------------------
# report


def tables(results: list[dict]) -> str:
    rows = [
        "| model | episodes | turns / episode | sampled tokens | tokens/s, cache | "
        "tokens/s, no cache | cache speed-up (range) | tool s / rollout | same tokens |",
        "|---|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for res in results:
        r = res["rollout"]
        c, nc = r["cache"], r["nocache"]
        lo, hi = min(r["pair_ratios"]), max(r["pair_ratios"])
        same = "yes" if r["identical_tokens"] else "NO"
        rows.append(
            f"| {res['name']} | {r['episodes']} | {c['turns_per_episode']:.2f} | {c['tokens']} | "
            f"{c['tokens_per_s']:,.0f} | {nc['tokens_per_s']:,.0f} | {r['speedup']:.2f}x "
            f"({lo:.2f}-{hi:.2f}) | {c['tool_median_s']:.3f} | {same} |"
        )
    rows += [
        "",
        "| model | episodes / step | sampled tokens / step | tool calls / episode | rollout s | "
        "of which tool s | update s | step s | rollout share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        s = res["steps"]
        calls = s["tool_calls_per_episode"]
        calls = "n/a" if calls is None else f"{calls:.2f}"
        rows.append(
            f"| {res['name']} | {s['episodes']} | {s['sampled_tokens']:.0f} | {calls} | "
            f"{s['rollout_s']:.3f} | {s['tool_s']:.3f} | {s['update_s']:.3f} | "
            f"{s['step_s']:.3f} | {s['rollout_s'] / s['step_s']:.0%} |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=None,
                   help="episodes per rollout call in part 1 [16; the GPU profile's with "
                        "--gpu-sizes on CUDA]")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed rollout calls per mode, interleaved, after 1 warm-up each [3]")
    p.add_argument("--steps", type=int, default=3, help="timed RL steps per model [3]")
    p.add_argument("--warmup", type=int, default=None, help="untimed RL steps first [1]")
    p.add_argument("--max-action-tokens", type=int, default=20,
                   help="real model: tokens per turn at most in part 1 [20]")
    p.add_argument("--temperature", type=float, default=0.7, help="real model, part 1 [0.7]")
    p.add_argument("--sft-steps", type=int, default=4, help="real model: SFT steps first [4]")
    p.add_argument("--sft-batch-size", type=int, default=None,
                   help="real model: demonstrations per SFT step [the profile's, 8]")
    p.add_argument("--tiny-sft-steps", type=int, default=None,
                   help="tiny model: SFT steps first [400, its profile's]")
    p.add_argument("--prompts-per-step", type=int, default=None,
                   help="real model: problems per RL step [the profile's]")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="the real model: a packaged alias or a folder (e.g. a random-weight model "
                   "of the same architecture, for timing where the packaged file is not) "
                   "[smollm2-135m-instruct]")
    p.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda', 'cuda:N' [auto]")
    p.add_argument("--gpu-sizes", action="store_true",
                   help="on CUDA, use the pretrained profile's GPU sizes (else the CPU sizes)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: repeats 1, steps 1, batch 4, 4 episodes per step, no warm-up")
    p.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default) [1]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write results and machine info as JSON here")
    p.add_argument("--smoke", action="store_true",
                   help="a few-second check that the script runs: --quick cut further, with a "
                        "tiny random model on the packaged tokenizer (figures mean nothing)")
    args = p.parse_args(argv)
    args.real_sizes, args.tiny_sizes = {}, {}  # config overrides of each model's profile
    if args.smoke:
        args.quick, args.device, args.batch, args.max_action_tokens = True, "cpu", 2, 8
        args.tiny_sft_steps, args.sft_batch_size = 1, 2
        args.real_sizes = dict(num_generations=2, eval_size=2)
        args.tiny_sizes = dict(
            SMOKE_MODEL, prompts_per_step=1, num_generations=2, sft_batch_size=2, eval_size=2
        )
    if args.quick:
        args.repeats, args.steps = 1, 1
        args.batch = args.batch or 4
        args.prompts_per_step = args.prompts_per_step or 1
        args.warmup = 0 if args.warmup is None else args.warmup
        args.tiny_sft_steps = args.tiny_sft_steps or 50
        args.sft_steps, args.sft_batch_size = 1 if args.smoke else 2, args.sft_batch_size or 4
    args.warmup = 1 if args.warmup is None else args.warmup
    args.tiny_sft_steps = 400 if args.tiny_sft_steps is None else args.tiny_sft_steps
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        if args.smoke:
            try:
                args.model = tiny_pretrained(folder)
            except FileNotFoundError as err:  # the package (or the gguf reader) is not installed
                print(f"smoke: skipped the real model: {err}", flush=True)
                args.model = None
        return run(args)


def run(args) -> int:
    """Both models' measurements and the report."""
    device = get_device(args.device)
    info = machine_info(device)
    desc = info["cuda_device_name"] or info["cpu_model"] or "unknown CPU"
    print(f"{desc}; {info['cpu_count']} CPUs, {info['torch_num_threads']} torch thread(s); "
          f"torch {info['torch']}, transformers {info['transformers']}; device {device}; "
          f"{info['date']}", flush=True)
    t_start = time.perf_counter()
    results, batch = [], args.batch
    if args.model:  # None: --smoke, and the packaged model is not installed
        real, load_s = real_trainer(args, str(device))
        info["load_s"] = load_s
        print(f"loaded {args.model} in {load_s:.1f} s", flush=True)
        c = real.config
        batch = batch or (c.prompts_per_step * c.num_generations if args.gpu_sizes else 16)
        name = "SmolLM2-135M-Instruct" if args.model == "smollm2-135m-instruct" else args.model
        if args.smoke:
            name = "tiny random Llama, SmolLM2's tokenizer"
        results.append(run_model(f"{name} + LoRA", real, args, batch=batch))
        del real
    results.append(run_model("tiny Llama (quick)", tiny_trainer(args, str(device)), args,
                             batch=batch))
    info["total_s"] = time.perf_counter() - t_start
    if hasattr(os, "getloadavg"):
        info["loadavg_end"] = os.getloadavg()
    md = tables(results)
    print(f"\n{desc}, {info['torch_num_threads']} torch thread(s), torch {info['torch']}, "
          f"device {device}; rollout: {args.repeats} interleaved repeats after 1 warm-up each; "
          f"GRPO: {args.steps} steps after {args.warmup} warm-up; load average "
          f"{info['loadavg_start']} -> {info.get('loadavg_end')}; {info['total_s']:.0f} s in all\n")
    print(md)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"machine": info, "args": vars(args), "results": results,
                       "table_markdown": md}, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
