"""This package's GRPO step against TRL's ``GRPOTrainer``, side by side in one process.

Usage (from the repository root; needs ``trl``, pinned in ``requirements.txt``)::

    OMP_NUM_THREADS=1 python benchmarks/bench_vs_trl.py --profile quick [--steps 20]
        [--seeds 0 1 2] [--threads 1] [--device cpu] [--out FILE.json]
    OMP_NUM_THREADS=1 python benchmarks/bench_vs_trl.py --profile pretrained --seeds 0

What is compared, per seed:

1. One SFT warm start (this package's ``sft_steps`` of the profile), saved with
   ``save_pretrained``; **both** frameworks load that folder: the same model, weights and tokenizer.
   The ``pretrained`` profile has no warm start: each side loads the packaged SmolLM2-135M-Instruct
   and wraps it in the same LoRA adapters (same seed, so the same initial A matrices), and TRL is
   handed the ``PeftModel``.
2. The same task and reward: ``agentic_rl.trl_bridge.trl_task`` wraps the task's scoring as a TRL
   reward function; TRL's settings come from ``trl_config_kwargs`` (batch ``prompts_per_step x G``,
   completion length, temperature, learning rate, beta = 0, mu = 1, loss, reward scaling, clip
   range, gradient clipping, fp32, constant learning rate, AdamW without weight decay).
3. Steps interleaved: a ``TrainerCallback`` runs, after each TRL step, one step of this package
   with its fast path (``share_prompt_prefix``: each prompt encoded once for its group) and one
   with the plain path (the code the GRPO chapter prints), so machine load hits all three alike.
   A TRL step is the wall time from one ``on_step_begin`` to the next, minus the time of the
   package's steps run in between: everything TRL does per step (generation, reward, loss,
   backward, optimizer, logging). The first ``--warmup`` steps are not timed.
4. The learning curves: the mean reward of each step's completions, per framework, over the same
   steps and seeds (TRL logs ``reward`` every step).

Then, on one fixed rollout batch: the update (loss forward, backward, AdamW) of each path, its
FLOPs counted from the model's shapes (6 x linear weights x tokens + attention, the tokens each
path actually runs), against the matmul peak of this thread measured in the same run (a
2048 x 2048 x 2048 fp32 ``torch.mm``).

The last line reads ``TRL/agentic_rl step-time ratio: X.XX`` (median TRL step over median step
of this package's default fast settings; above 1 means this package is faster).

``--smoke``: a few-second check that the whole script runs (the quick profile on the smallest
tiny model and a 2 x 2 batch, one seed, one SFT step, one timed step, one timed update); its
figures mean nothing. Where TRL is not installed it runs this package's side (warm start, a step
and an update of each path) and says that it skipped TRL's.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings

import torch

try:
    import agentic_rl  # noqa: F401
except ImportError:  # not installed: use the checkout's src/ (src layout)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "src"))

from agentic_rl.grpo import GRPOConfig
from agentic_rl.models import add_lora, count_parameters, load_pretrained
from agentic_rl.rollout import first_scored_column, shared_prompts
from agentic_rl.grpo import GRPOTrainer
from agentic_rl.trl_bridge import trl_config_kwargs, trl_task
from agentic_rl.utils import seed_everything

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_grpo import SMOKE_BATCH, SMOKE_MODEL  # noqa: E402  (--smoke's sizes)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------- FLOPs


def matmul_peak(device: torch.device, n: int = 2048, repeats: int = 7) -> float:
    """FLOP/s of an ``n x n x n`` fp32 matrix product: this thread's practical peak."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times[1:])


def update_flops(model, batch, *, shared: bool, skip_prompt_logits: bool = False) -> float:
    """FLOPs of one update on ``batch``, counted from the shapes of the tokens the path runs.

    Forward: 2 per weight of every linear layer per token (the LM head only where logits are
    computed), plus attention's two products over the keys each query sees. Backward: the same
    again for the gradient with respect to the inputs, and once more for the weights' gradient
    where the weights train (all of them for the tiny model: 3 x forward; only the adapters
    under LoRA, where the frozen base costs 2 x its forward).
    """
    cfg = model.config
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    passes = {n: 3 if m.weight.requires_grad else 2 for n, m in linears}
    body = sum(passes[n] * m.weight.numel() for n, m in linears if "lm_head" not in n)
    head_w = model.get_output_embeddings().weight
    head = (3 if head_w.requires_grad else 2) * cfg.vocab_size * cfg.hidden_size
    hidden, layers = cfg.hidden_size, cfg.num_hidden_layers
    rows, width = batch.input_ids.shape
    start = first_scored_column(batch.loss_mask)

    def attention(queries_from: int, queries_to: int) -> int:  # keys seen: its position + 1
        return sum(k + 1 for k in range(queries_from, queries_to))

    if shared:
        n_prompts = shared_prompts(batch.input_ids, batch.attention_mask, start)[1]
        tokens = n_prompts * start + rows * (width - 1 - start)
        logits = n_prompts + rows * (width - 1 - start)
        attended = n_prompts * attention(0, start) + rows * attention(start, width - 1)
    else:
        tokens = rows * width
        logits = rows * (width - start + 1) if skip_prompt_logits else rows * width
        attended = rows * attention(0, width)
    return 2.0 * (body * tokens + head * logits + 3 * 2 * hidden * layers * attended)


# ------------------------------------------------------------------------------------- one seed


def make_config(profile: str, seed: int, device: str, **overrides) -> GRPOConfig:
    return GRPOConfig.from_profile(
        profile, seed=seed, device=device, output_dir=None, disable_tqdm=True, **overrides
    )


def warm_start(
    profile: str, seed: int, device: str, sft_steps: int | None, folder: str, **overrides
) -> None:
    """SFT from scratch with this package, then ``save_pretrained`` (model and tokenizer).
    ``overrides``: config fields on top of the profile (``--smoke``'s tiny model and batch)."""
    extra = {} if sft_steps is None else {"sft_steps": sft_steps}
    trainer = GRPOTrainer(make_config(profile, seed, device, **overrides, **extra))
    trainer.sft()
    trainer.model.save_pretrained(folder)
    trainer.tokenizer.save_pretrained(folder)


def run_info(profile: str) -> dict:
    """Where and when a benchmark ran: profile, date, CPU, threads, versions, load, command."""
    import transformers
    import trl

    return {
        "profile": profile,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "load_average": os.getloadavg(),
        "command": " ".join(sys.argv),
    }


def trl_trainer(config, model, tok, dataset, reward_fn, *, out: str, max_steps: int, callback):
    """TRL's ``GRPOTrainer`` on ``dataset``/``reward_fn`` (from ``trl_task``) with this package's
    ``config`` (``trl_config_kwargs``), writing to ``out``, quiet, with one ``callback``."""
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    args = TRLConfig(output_dir=out, max_steps=max_steps, **trl_config_kwargs(config))
    trainer = TRLTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)  # its per-step dicts would flood stdout
    return trainer


def our_trainers(args, seed: int, folder: str) -> dict:
    """This package's two sides, ``{"fast": trainer, "plain": trainer}``, each loading the warm
    start saved in ``folder`` (or the packaged model)."""
    ours = {}  # path -> GRPOTrainer, each loading the same saved model
    for path, fast in (("fast", True), ("plain", False)):
        config = make_config(
            args.profile, seed, args.device, sft_steps=0, log_kl=False, share_prompt_prefix=fast,
            **args.overrides,
        )  # fmt: skip
        if config.model_name_or_path:  # the packaged model, LoRA-wrapped by the trainer
            ours[path] = GRPOTrainer(config)
        else:
            model, tok = load_pretrained(folder)
            ours[path] = GRPOTrainer(config, model=model, tokenizer=tok)
    return ours


def smoke_without_trl(args) -> int:
    """``--smoke`` where TRL is not installed: everything of this package's side (the warm start,
    a step of each path, the timed updates), then one line saying what was skipped."""
    with tempfile.TemporaryDirectory() as folder:
        warm_start(args.profile, 0, args.device, args.sft_steps, folder, **args.overrides)
        ours = our_trainers(args, 0, folder)
        for trainer in ours.values():
            trainer.rl_step()
        time_updates(ours, args.repeats)
    print("smoke: TRL is not installed; ran this package's side, skipped TRL's GRPOTrainer")
    return 0


def run_seed(args, seed: int, folder: str) -> dict:
    from transformers import TrainerCallback

    ours = our_trainers(args, seed, folder)
    config = ours["fast"].config
    steps = args.warmup + args.steps
    dataset, reward_fn = trl_task(
        ours["fast"].task,
        steps * config.prompts_per_step,
        seed=seed,
        tokenizer=ours["fast"].tokenizer,
    )
    if config.model_name_or_path:  # the same base and adapters as the trainers above
        seed_everything(config.seed)
        model, tok = load_pretrained(config.model_name_or_path)
        model = add_lora(
            model, r=config.lora_r, lora_alpha=config.lora_alpha,
            target_modules=config.lora_target_modules.split(","),
        )  # fmt: skip
    else:
        model, tok = load_pretrained(folder)
    with tempfile.TemporaryDirectory() as out:
        times = {"trl": [], "fast": [], "plain": []}
        rewards = {"trl": [], "fast": [], "plain": []}

        class Interleave(TrainerCallback):
            begin = None
            inserted = 0.0

            def on_step_begin(self, args_, state, control, **kw):
                now = time.perf_counter()
                if self.begin is not None:
                    times["trl"].append(now - self.begin - self.inserted)
                self.begin, self.inserted = now, 0.0

            def on_step_end(self, args_, state, control, **kw):
                if len(times["fast"]) >= steps:
                    return
                t_in = time.perf_counter()
                for path, trainer in ours.items():
                    t0 = time.perf_counter()
                    row = trainer.rl_step()
                    times[path].append(time.perf_counter() - t0)
                    rewards[path].append(row["reward_mean"])
                self.inserted = time.perf_counter() - t_in

            def on_log(self, args_, state, control, logs=None, **kw):
                if logs and "reward" in logs:
                    rewards["trl"].append(float(logs["reward"]))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trl = trl_trainer(
                config, model, tok, dataset, reward_fn,
                out=out, max_steps=steps + 1, callback=Interleave(),
            )  # fmt: skip
            trl.train()
    w = args.warmup
    result = {
        "seed": seed,
        "step_s": {k: v[w : w + args.steps] for k, v in times.items()},
        "reward": {k: v[:steps] for k, v in rewards.items()},
    }
    # the update alone, on one fixed batch of the fast trainer's policy
    result["update"] = time_updates(ours, args.repeats)
    result["num_parameters"] = count_parameters(ours["fast"].model)
    result["num_trainable_parameters"] = count_parameters(ours["fast"].model, trainable_only=True)
    log(f"seed {seed}: TRL {median(times['trl'][w:]) * 1e3:.0f} ms, "
        f"fast {median(times['fast'][w:]) * 1e3:.0f} ms, "
        f"plain {median(times['plain'][w:]) * 1e3:.0f} ms per step (medians)")  # fmt: skip
    return result


def time_updates(ours: dict, repeats: int) -> dict:
    """The update of each path on one fixed batch, and the matmul peak measured just before (so
    that both see the same machine load)."""
    fast = ours["fast"]
    batch = fast.rollout()
    out = {"peak_flop_s": matmul_peak(fast.device)}
    for path, trainer in ours.items():
        trainer.model.load_state_dict(fast.model.state_dict())  # the same policy for both paths
        advantages = trainer.compute_advantages(batch)
        trainer.model.train()
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            loss, _ = trainer.compute_loss(batch, advantages)
            trainer.optimizer_step(loss)  # (grad_norm, skipped): only the time matters here
            times.append(time.perf_counter() - t0)
        shared = trainer.config.share_prompt_prefix
        out[path] = {
            "median_s": statistics.median(times[1:]),
            "flops": update_flops(
                trainer.model,
                batch,
                shared=shared,
                skip_prompt_logits=trainer.config.skip_prompt_logits,
            ),  # fmt: skip
            "batch_shape": list(batch.input_ids.shape),
        }
    return out


# ------------------------------------------------------------------------------------- report


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(args, results: list[dict], meta: dict) -> dict:
    paths = ("trl", "fast", "plain")
    names = {"trl": "TRL GRPOTrainer", "fast": "agentic_rl, share_prompt_prefix",
             "plain": "agentic_rl, plain path"}  # fmt: skip
    pooled = {k: [t for r in results for t in r["step_s"][k]] for k in paths}
    summary = {
        k: {"median_s": median(v), "min_s": min(v), "max_s": max(v)} for k, v in pooled.items()
    }
    log("")
    log(f"GRPO step, {meta['profile']} profile, {len(results)} seed(s) x {args.steps} timed steps")
    log(f"{'':34s}{'median ms':>10s}{'min ms':>9s}{'max ms':>9s}")
    for k, s in summary.items():
        log(
            f"{names[k]:34s}{s['median_s'] * 1e3:10.1f}"
            f"{s['min_s'] * 1e3:9.1f}{s['max_s'] * 1e3:9.1f}"
        )
    # learning curves: the mean reward of each step's completions, mean over seeds, in blocks
    n = min(len(r["reward"][k]) for r in results for k in paths)
    curves = {k: [statistics.mean(r["reward"][k][i] for r in results) for i in range(n)]
              for k in paths}  # fmt: skip
    block = max(1, n // 5)
    log("")
    log(f"mean reward per step, mean over {len(results)} seed(s), in blocks of {block} steps:")
    log(f"{'steps':>10s}{'TRL':>10s}{'fast':>10s}{'plain':>10s}")
    for i in range(0, n, block):
        cells = "".join(f"{statistics.mean(curves[k][i : i + block]):10.3f}" for k in paths)
        log(f"{f'{i + 1}-{min(n, i + block)}':>10s}{cells}")
    per_seed = {k: [statistics.mean(r["reward"][k][:n]) for r in results] for k in paths}
    for k, v in per_seed.items():
        spread = statistics.stdev(v) if len(v) > 1 else float("nan")
        cells = ", ".join(f"{x:.3f}" for x in v)
        log(f"run-mean reward, {names[k]}: {statistics.mean(v):.3f} +- {spread:.3f} ({cells})")
    # FLOP utilisation of the update, against the matmul peak measured beside it
    peak = median([r["update"]["peak_flop_s"] for r in results])
    log("")
    log(f"matmul peak (one {meta['device']} thread, 2048^3 fp32 mm): {peak / 1e9:.1f} GFLOP/s")
    util = {}
    for path in ("plain", "fast"):
        t = median([r["update"][path]["median_s"] for r in results])
        flops = median([r["update"][path]["flops"] for r in results])
        of_peak = median([r["update"][path]["flops"] / r["update"][path]["median_s"]
                          / r["update"]["peak_flop_s"] for r in results])  # fmt: skip
        util[path] = {"median_s": t, "flops": flops, "flop_s": flops / t, "of_peak": of_peak}
        log(f"update, {names[path]}: {t * 1e3:.1f} ms, {flops / 1e9:.2f} GFLOP, "
            f"{flops / t / 1e9:.1f} GFLOP/s = {100 * of_peak:.0f} % of peak")  # fmt: skip
    ratio = summary["trl"]["median_s"] / summary["fast"]["median_s"]
    ratio_plain = summary["trl"]["median_s"] / summary["plain"]["median_s"]
    log("")
    log(f"TRL/agentic_rl step-time ratio, plain path: {ratio_plain:.2f}")
    print(f"TRL/agentic_rl step-time ratio: {ratio:.2f}", flush=True)
    return {"meta": meta, "summary": summary, "curves": curves, "per_seed_reward": per_seed,
            "update": util, "peak_flop_s": peak, "ratio": ratio, "ratio_plain": ratio_plain,
            "seeds": results}  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="quick", choices=["quick", "full", "pretrained"])
    p.add_argument("--steps", type=int, default=None, help="timed steps per seed")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first, per seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--sft-steps", type=int, default=None, help="override the warm start's steps")
    p.add_argument("--repeats", type=int, default=5, help="timed updates on the fixed batch")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true",
                   help="a few-second check that the script runs: quick profile, smallest tiny "
                        "model, 2 x 2 batch, one seed, 1 SFT step, 1 step (figures mean nothing)")
    args = p.parse_args(argv)
    args.overrides = {}
    if args.smoke:
        args.profile, args.seeds, args.device = "quick", [0], "cpu"
        args.steps, args.warmup, args.sft_steps, args.repeats = 1, 0, 1, 1
        args.overrides = {**SMOKE_MODEL, **SMOKE_BATCH}
        if importlib.util.find_spec("trl") is None:
            return smoke_without_trl(args)
    if args.steps is None:
        args.steps = 20 if args.profile == "quick" else 5
    if args.profile == "pretrained":
        args.warmup = min(args.warmup, 1)  # a step takes seconds; the first one is the warm-up
    if args.profile == "full" and args.sft_steps is None and args.device == "cpu":
        args.sft_steps = 100  # the full profile's 3,000 SFT steps take an hour on one CPU thread
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    meta = {
        **run_info(args.profile),
        "device": args.device,
        "sft_steps_override": args.sft_steps,
    }
    t_start = time.perf_counter()
    results = []
    packaged = make_config(args.profile, 0, args.device).model_name_or_path
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as folder:
            if not packaged:
                log(f"seed {seed}: warm start ...")
                warm_start(
                    args.profile, seed, args.device, args.sft_steps, folder, **args.overrides
                )
            log(f"seed {seed}: {args.warmup} + {args.steps} steps, interleaved ...")
            results.append(run_seed(args, seed, folder))
    meta["num_parameters"] = results[0].pop("num_parameters")
    meta["num_trainable_parameters"] = results[0].pop("num_trainable_parameters")
    meta["load_average_end"] = os.getloadavg()
    meta["wall_s"] = time.perf_counter() - t_start
    out = report(args, results, meta)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(out, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
