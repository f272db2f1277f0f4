"""Speed benchmark of the GRPO recipe: rollout throughput, GRPO step, SFT step, per config profile.

Usage (from the repository root)::

    python benchmarks/bench_grpo.py [--profile quick|full|both] [--repeats N] [--threads 1]
                                    [--device auto] [--out FILE.json]

For each profile (``GRPOConfig.from_profile(profile)``) it builds a :class:`GRPOTrainer` whose tiny
Llama is initialised from scratch (``sft_steps=0``: speed hardly depends on the weights) and
measures, after one warm-up call, ``repeats`` timed calls of:

1. ``gen_cache``: ``model.generate`` with the settings of :func:`agentic_rl.rollout.generate_batch`
   (sampling, temperature 1, top_k 0, top_p 1, KV cache on) for ``prompts_per_step *
   num_generations`` sequences, forced to exactly ``max_completion_length`` new tokens with
   ``min_new_tokens`` (an untrained model emits EOS at random times, which would make the token
   count vary);
2. ``gen_nocache``: the same with ``use_cache=False`` (the naive baseline: every step recomputes the
   whole prefix);
3. ``generate_batch``: :func:`agentic_rl.rollout.generate_batch` itself, called as
   ``GRPOTrainer.rollout`` calls it (sampling + decode + scoring + old-logprob forward +
   reference-model forward); and ``generate_batch_noref``, the same without the reference model;
4. ``rl_step``: ``trainer.rl_step()`` (rollout + advantages + loss + backward + optimizer);
5. ``update``: the loss + backward + optimizer part alone (``compute_advantages``, ``compute_loss``,
   ``optimizer_step``) on one fixed rollout batch;
6. ``sft_step``: :func:`agentic_rl.train.sft_step` on ``sft_batch_size`` demonstrations.

Reported: the median and the minimum over the repeats (the machine may be shared; the minimum is
the least disturbed run, the median the typical one). Torch uses one thread by default
(``--threads``), as ``agentic_rl.utils.setup`` does. On CUDA every timing is bracketed by
``torch.cuda.synchronize()``.

``--smoke``: a few-second check that the whole script runs (the quick profile on the smallest tiny
model and a 2 x 2 batch, one repeat, on the CPU); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import random
import statistics
import sys
import time

import torch

try:
    import agentic_rl  # noqa: F401
except ImportError:  # not installed: use the checkout's src/ (src layout)
    _ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(_ROOT, "src"))

from agentic_rl.grpo import GRPOConfig
from agentic_rl.models import count_parameters, get_device
from agentic_rl.rollout import build_sft_batch, encode_prompts, generate_batch
from agentic_rl.grpo import GRPOTrainer
from agentic_rl.train import sft_step
from agentic_rl.utils import setup

DEFAULT_REPEATS = {"quick": 5, "full": 3}
MODEL_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "digits",
)  # fmt: skip

#: ``--smoke`` (and the other scripts' smoke runs): the smallest tiny Llama the configs accept
#: (the unit tests' shape) and a batch of two prompts x two completions, so that a script's whole
#: code path runs in seconds. Speed figures of such a run mean nothing.
SMOKE_MODEL = dict(
    hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    intermediate_size=64,
)
SMOKE_BATCH = dict(prompts_per_step=2, num_generations=2, sft_batch_size=4, eval_size=2)


# --------------------------------------------------------------------------------------------------
# timing


def log(msg: str) -> None:
    print(msg, file=sys.stderr)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def timed(
    fn, device: torch.device, *, repeats: int, warmup: int = 1
) -> tuple[list[float], object]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed; return (seconds, last
    result)."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times, out


def summarise(times: list[float], work: float | None = None) -> dict:
    """Median and min of the seconds; with ``work`` (e.g. tokens per call), also the rate per
    second.

    ``rate_median`` is ``work / median time`` and ``rate_max`` is ``work / min time``.
    """
    med, lo = statistics.median(times), min(times)
    out = {"median_s": med, "min_s": lo, "times_s": times}
    if work is not None:
        out.update(work=work, rate_median=work / med, rate_max=work / lo)
    return out


# --------------------------------------------------------------------------------------------------
# one profile


def bench_profile(
    profile: str, *, repeats: int, device: str, seed: int = 0, **overrides
) -> dict:
    """``overrides``: config fields on top of the profile (``--smoke``: a tiny model and batch)."""
    config = GRPOConfig.from_profile(
        profile, sft_steps=0, device=device, disable_tqdm=True, output_dir=None, seed=seed,
        **overrides,
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    dev = trainer.device
    model, tok, task = trainer.model, trainer.tokenizer, trainer.task
    c = config
    B, L = c.prompts_per_step * c.num_generations, c.max_completion_length
    res: dict = {
        "profile": profile,
        "repeats": repeats,
        "batch_sequences": B,
        "max_completion_length": L,
        "num_parameters": count_parameters(model),
        "num_trainable_parameters": count_parameters(model, trainable_only=True),
        "model": {k: getattr(c, k) for k in MODEL_FIELDS},
    }
    log(f"[{profile}] {res['num_parameters']:,} parameters, batch {B} x {L} new tokens, "
        f"device {dev}, {repeats} repeats")

    # Fixed prompts for the raw generate() timings (same layout as generate_batch: G copies of
    # each prompt).
    problems = task.sample(c.prompts_per_step, random.Random(seed))
    enc = encode_prompts(tok, [p.prompt for p in problems for _ in range(c.num_generations)], dev)
    prompt_len = enc["input_ids"].shape[1]
    res["prompt_len"] = prompt_len
    gen_kwargs = dict(
        max_new_tokens=L, min_new_tokens=L, pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id, do_sample=True, temperature=c.temperature, top_k=0,
        top_p=1.0,
    )

    def gen(use_cache: bool):
        def fn():
            with torch.no_grad():
                seqs = model.generate(**enc, **gen_kwargs, use_cache=use_cache)
            new = seqs.shape[1] - prompt_len
            assert new == L, f"expected {L} new tokens, got {new}"
            return seqs
        return fn

    model.eval()
    torch.manual_seed(seed)
    t, _ = timed(gen(True), dev, repeats=repeats)
    res["gen_cache"] = summarise(t, B * L)
    log(f"[{profile}] generate, KV cache:   median {res['gen_cache']['median_s'] * 1e3:8.1f} ms")
    t, _ = timed(gen(False), dev, repeats=repeats)
    res["gen_nocache"] = summarise(t, B * L)
    log(f"[{profile}] generate, no cache:   median {res['gen_nocache']['median_s'] * 1e3:8.1f} ms")

    # generate_batch end to end, as GRPOTrainer.rollout calls it (with log_kl on, the trainer keeps
    # a reference model even at beta = 0, for the KL metric; old log-probs only when
    # num_iterations > 1), and without the reference model.
    trainer.make_ref_model()
    rng = random.Random(seed + 1)
    computed = []  # decode steps computed (B x completion width) per call; the width varies (EOS)

    def rollout(ref):
        def fn():
            probs = task.sample(c.prompts_per_step, rng)
            b = generate_batch(
                model, tok, task, probs, num_generations=c.num_generations,
                max_completion_length=L, temperature=c.temperature,
                ref_model=trainer.ref_model if ref else None,
                compute_old_logprobs=c.num_iterations > 1,
            )  # fmt: skip
            computed.append((b.input_ids.shape[1] - _prompt_width(b)) * len(b))
            return b
        return fn

    for key, ref in (("generate_batch", True), ("generate_batch_noref", False)):
        computed.clear()
        t, b = timed(rollout(ref), dev, repeats=repeats)
        work = statistics.median(computed[1:])  # skip the warm-up call
        res[key] = summarise(t, work)
        res[key]["generated_tokens_incl_eos"] = int(b.loss_mask.sum())
        log(f"[{profile}] {key + ':':22s} median {res[key]['median_s'] * 1e3:8.1f} ms")

    # The update alone (advantages + loss + backward + optimizer) on one fixed rollout batch.
    fixed = trainer.rollout()

    def update():
        model.train()
        adv = trainer.compute_advantages(fixed)
        loss, _ = trainer.compute_loss(fixed, adv)
        trainer.optimizer_step(loss)  # returns (grad_norm, skipped): not needed for the timing
        return loss

    t, _ = timed(update, dev, repeats=repeats)
    res["update"] = summarise(t)
    res["update"]["batch_shape"] = list(fixed.input_ids.shape)
    log(f"[{profile}] loss+backward+optim:  median {res['update']['median_s'] * 1e3:8.1f} ms")

    # The whole GRPO step.
    t, row = timed(trainer.rl_step, dev, repeats=repeats)
    res["rl_step"] = summarise(t)
    res["rl_step"]["last_row"] = row
    log(f"[{profile}] rl_step:            median {res['rl_step']['median_s'] * 1e3:8.1f} ms")

    # SFT step on a copy (so the timings above and below do not share optimizer state).
    sft_model = copy.deepcopy(model).train()
    trainable = [p for p in sft_model.parameters() if p.requires_grad]
    sft_opt = torch.optim.AdamW(trainable, lr=c.sft_learning_rate, weight_decay=0.0)
    sft_rng = random.Random(seed + 2)
    sft_probs = task.sample(c.sft_batch_size, sft_rng)
    demos = [task.demonstration(p, sft_rng) for p in sft_probs]
    sft_batch = build_sft_batch(tok, [p.prompt for p in sft_probs], demos, dev)

    def sft():
        return sft_step(sft_model, sft_opt, sft_batch, max_grad_norm=c.max_grad_norm)

    t, _ = timed(sft, dev, repeats=repeats)
    res["sft_step"] = summarise(t)
    res["sft_step"]["batch_shape"] = list(sft_batch.input_ids.shape)
    log(f"[{profile}] sft_step:             median {res['sft_step']['median_s'] * 1e3:8.1f} ms")
    return res


def _prompt_width(batch) -> int:
    """Width of the (left-padded) prompt block: the columns before the first loss-mask column of
    any row."""
    cols = batch.loss_mask.any(0).nonzero()
    return int(cols[0]) if len(cols) else batch.input_ids.shape[1]


# --------------------------------------------------------------------------------------------------
# report


def machine_info(device: torch.device) -> dict:
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as fh:
            names = (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
            cpu_model = next(names, None)
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "device": str(device),
        "cuda_device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        info["loadavg_start"] = os.getloadavg()
    return info


def _ms(s: float) -> str:
    return f"{s * 1e3:,.1f}"


def _rate(r: float) -> str:
    return f"{r:,.0f}"


def markdown_table(results: list[dict]) -> str:
    """One row per measurement, two columns (median, min or max rate) per profile."""
    columns = " | ".join(f"{r['profile']} median | {r['profile']} best" for r in results)
    head = f"| measurement | {columns} |"
    sep = "|---|" + "---:|---:|" * len(results)
    rows = [head, sep]

    def row(label, cells):
        # each cell is "median | best"; a cell without " | " gets an empty best column
        cells = [cell if " | " in cell else f"{cell} | " for cell in cells]
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    def times(key):  # "median | best" of a measurement, in ms
        return [f"{_ms(r[key]['median_s'])} | {_ms(r[key]['min_s'])}" for r in results]

    def rates(key):  # "median | best" of a measurement's rate, per second
        return [f"{_rate(r[key]['rate_median'])} | {_rate(r[key]['rate_max'])}" for r in results]

    row("parameters", [f"{r['num_parameters']:,}" for r in results])
    row("rollout batch (sequences x new tokens)",
        [f"{r['batch_sequences']} x {r['max_completion_length']}" for r in results])
    row("generate, KV cache: tokens/s", rates("gen_cache"))
    row("generate, no cache: tokens/s", rates("gen_nocache"))
    row("KV-cache speed-up (median)",
        [f"{r['gen_nocache']['median_s'] / r['gen_cache']['median_s']:.2f}x" for r in results])
    row("generate, KV cache: ms", times("gen_cache"))
    row("generate_batch as the trainer calls it (+score, ref logprobs): ms",
        times("generate_batch"))
    row("generate_batch: tokens/s", rates("generate_batch"))
    row("generate_batch without ref model: ms", times("generate_batch_noref"))
    row("rl_step (rollout + update): ms", times("rl_step"))
    row("loss + backward + optimizer alone: ms", times("update"))
    row("sft_step (sft_batch_size demos): ms", times("sft_step"))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--profile", choices=["quick", "full", "both"], default="quick",
                   help="config profile(s) to benchmark [quick]")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repeats after 1 warm-up [5 for quick, 3 for full]")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads; 0 leaves torch's default [1]")
    p.add_argument("--device", default="auto",
                   help="'auto' (CUDA, then MPS, then CPU), 'cpu', 'cuda', 'cuda:N' or 'mps' "
                        "[auto]")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the model init, prompts and sampling [0]")
    p.add_argument("--out", default=None,
                   help="write the results and machine info as JSON to this file")
    p.add_argument("--smoke", action="store_true",
                   help="a few-second check that the script runs: the quick profile on the "
                        "smallest tiny model and a 2 x 2 batch, 1 repeat, on the CPU (figures "
                        "mean nothing)")
    args = p.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        p.error("--repeats must be >= 1")
    overrides = {}
    if args.smoke:
        args.profile, args.repeats, args.device = "quick", 1, "cpu"
        overrides = {**SMOKE_MODEL, **SMOKE_BATCH}

    setup(args.seed, threads=args.threads if args.threads > 0 else None)
    profiles = ["quick", "full"] if args.profile == "both" else [args.profile]

    device = get_device(args.device)
    info = machine_info(device)
    results = []
    for prof in profiles:
        repeats = args.repeats or DEFAULT_REPEATS[prof]
        results.append(
            bench_profile(prof, repeats=repeats, device=args.device, seed=args.seed, **overrides)
        )
    if hasattr(os, "getloadavg"):
        info["loadavg_end"] = os.getloadavg()

    table = markdown_table(results)
    desc = info["cuda_device_name"] or info["cpu_model"] or info["processor"] or "unknown CPU"
    reps = ", ".join(f"{r['profile']}: {r['repeats']}" for r in results)
    print(f"\n{desc}, {info['cpu_count']} CPUs, torch {info['torch']}, "
          f"{info['torch_num_threads']} thread(s), device {info['device']}, "
          f"{info['date']}; medians (and best) of repeats ({reps}) after 1 warm-up\n")
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            out = {"machine": info, "args": vars(args), "results": results,
                   "table_markdown": table}  # fmt: skip
            json.dump(out, fh, indent=2, default=str)
        print(f"\nwrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
