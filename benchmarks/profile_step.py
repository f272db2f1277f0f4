"""Where the time of a GRPO step goes: ``torch.profiler`` on one CPU thread, three implementations.

Usage (from the repository root; needs ``trl``, pinned in ``requirements.txt``)::

    OMP_NUM_THREADS=1 python benchmarks/profile_step.py [--seed 0] [--steps 5] [--warmup 2]
        [--sft-steps 300] [--out FILE.json]

The three sides are the ones ``benchmarks/bench_vs_trl.py`` compares, built with its functions
(quick profile): one SFT warm start of this package saved with ``save_pretrained`` (``--sft-steps``
defaults to 300, half the profile's 600, which take ~90 s on one thread; the step's cost hardly
depends on it: completions are capped at 8 tokens), which every side loads; then, one side after
the other (not interleaved):

- ``TRL``: TRL's ``GRPOTrainer`` with ``agentic_rl.trl_bridge``'s task, reward and settings. One
  TRL optimizer step is one GRPO step (one generation batch, one gradient step). A step is timed
  from one ``on_step_begin`` callback to the next: the batch fetch, generation, reward, loss,
  backward, AdamW, and TRL's and transformers' per-step metrics and logging
  (``logging_steps = 1``; the printer callback is removed, nothing is printed).
- ``plain``: this package's ``GRPOTrainer.rl_step`` with ``share_prompt_prefix=False``.
- ``fast``: the same with ``share_prompt_prefix=True`` (each prompt encoded once for its group).

Per side: ``--warmup`` steps untimed, ``--steps`` steps timed without the profiler (the reference
step time, to show the profiler's overhead), then ``--steps`` steps under
``torch.profiler.profile(activities=[CPU])``, timed with ``perf_counter`` from just after the
profiler starts to just before it stops. Every number below is per step of that profiled window.

Categories. Each profiler event's **self CPU time** (its time minus its children's) goes to one
category, by the rules below applied to the event and its enclosing events: the category of the
outermost enclosing event with a *strong* claim (optimizer, attention: their whole subtree), else
that of the innermost with a *weak* claim (the other three), else "other aten ops" for an
``aten::`` op and "autograd engine, other scopes" for any other event. So the ``aten::t`` inside
``aten::linear`` counts as a matrix product, a product inside ``scaled_dot_product_attention``'s
math path as attention, and the ``mm`` inside TRL's fused log-prob scope as a matrix product:

- ``matrix products``: ``aten::linear``, ``matmul``, ``mm``, ``addmm(_)``, ``bmm``,
  ``baddbmm(_)``, ``mv``, ``addmv``, ``dot``, ``einsum`` (with the views and transposes they call);
- ``attention kernel``: ``aten::scaled_dot_product_attention`` and every
  ``aten::_scaled_dot_product_*`` (flash / math kernels, forward and backward);
- ``softmax/log-softmax/gather/CE``: ``softmax``, ``log_softmax`` and their backward kernels,
  ``logsumexp``, ``gather``, ``take_along_dim``, ``scatter_add`` (``gather``'s backward),
  ``cross_entropy_loss``, ``nll_loss*``, and TRL's fused LM head + log-softmax
  (``trl.kernels.chunked_logprob``: the ``ChunkedLogProbFunction`` forward and backward scopes,
  their own Python time and the ops of their online logsumexp, its products excepted);
- ``sampling``: ``multinomial`` (with the ``exponential_``/``div``/``argmax`` it runs), ``topk``,
  ``sort``, ``argsort``. Both frameworks sample with top-k and top-p off, so there is no
  sort/cumsum in sampling; a ``cumsum`` elsewhere (position ids) counts under "other aten ops";
- ``optimizer``: everything under the ``Optimizer.step#AdamW.step`` and
  ``Optimizer.zero_grad#AdamW.zero_grad`` scopes that ``torch.optim`` records (its aten ops *and*
  its own Python time), and every ``aten::_foreach_*`` outside them (gradient clipping);
- ``other aten ops``: the self time of every other ``aten::`` op: elementwise, reductions, copies,
  views, indexing, embedding, ``cat``, ``where``, ``item`` (a sync point: ``_local_scalar_dense``);
- ``autograd engine, other scopes``: the self time of the other non-aten events: the autograd
  engine's ``autograd::engine::evaluate_function: XBackward0`` and ``XBackward0`` nodes,
  ``torch::autograd::AccumulateGrad``, ``detach_``, and the Python time inside other profiler
  scopes (TRL's ``enumerate(DataLoader)#...`` batch fetch); their children count in the rows
  above;
- ``outside torch operators`` = wall time minus every row above: Python (this package's, TRL's,
  transformers' and accelerate's bookkeeping, the reward function, tokenizer encode/decode,
  TRL's logging), and the profiler's own per-event cost.

So the rows add up to the profiled wall time per step, exactly: the last row is the rest. (The
autograd engine runs a CPU backward on the calling thread, so events never overlap in time; the
script warns if the profile holds events of several threads, whose times could.) "autograd
engine" + "outside" is the wall time minus the aten ops' self time, less the Python time of the
optimizer's and TRL's log-prob scopes.

Also printed: the phase split, rollout vs the rest of the step (``GRPOTrainer.rollout`` here,
TRL's ``_generate_and_score_completions``: sampling, decoding, reward; each call wrapped in a
``perf_counter`` and a ``profile_step::rollout`` profiler scope, whose events give the rollout's
part of each row, its "outside" again the rest of its wall time), the tokens the transformer
processes in the update's forward pass (plain: every row's prompt and completion; fast: each
distinct prompt once plus every row's completion, counted as ``update_flops`` in
``bench_vs_trl.py`` does; TRL: its ``prompt_ids`` and ``completion_ids`` columns), the generated
tokens per step, the profiler events per step, and the five ops with the most self time per side.
``--out`` writes all of it, with each category's eight largest ops, as JSON. The sides sample
their own completions (same prompts, different random streams), so their batches differ a little.

``--smoke``: a few-second check that the whole script runs (the smallest tiny model and a 2 x 2
batch, one SFT step, no warm-up, one unprofiled and one profiled step per side); its figures mean
nothing. Where TRL is not installed it profiles this package's two sides and says that it skipped
TRL's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import warnings
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# bench_grpo and bench_vs_trl put the checkout's src/ on sys.path when agentic_rl is not installed
from bench_grpo import SMOKE_BATCH, SMOKE_MODEL  # --smoke's sizes
from bench_vs_trl import log, make_config, run_info, trl_trainer, warm_start

from agentic_rl.models import load_pretrained
from agentic_rl.rollout import first_scored_column, shared_prompts
from agentic_rl.grpo import GRPOTrainer
from agentic_rl.trl_bridge import trl_task

PROFILE = "quick"
SIDES = ("trl", "plain", "fast")
NAMES = {"trl": "TRL GRPOTrainer", "plain": "agentic_rl plain", "fast": "agentic_rl fast"}

# ------------------------------------------------------------------------------------- categories

CATEGORIES = (
    ("matmul", "matrix products"),
    ("attention", "attention kernel"),
    ("softmax", "softmax/log-softmax/gather/CE"),
    ("sampling", "sampling"),
    ("optimizer", "optimizer (AdamW, clipping)"),
    ("other_aten", "other aten ops"),
    ("autograd", "autograd engine, other scopes"),
    ("outside", "outside torch operators"),
)
MATMUL = {
    "aten::linear", "aten::matmul", "aten::mm", "aten::addmm", "aten::addmm_",
    "aten::_addmm_activation", "aten::bmm", "aten::baddbmm", "aten::baddbmm_", "aten::addbmm",
    "aten::addbmm_", "aten::mv", "aten::addmv", "aten::dot", "aten::einsum",
}  # fmt: skip
SOFTMAX = {
    "aten::softmax", "aten::_softmax", "aten::_softmax_backward_data", "aten::log_softmax",
    "aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::logsumexp", "aten::gather",
    "aten::take_along_dim", "aten::scatter_add", "aten::scatter_add_", "aten::cross_entropy_loss",
    "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward", "aten::nll_loss_backward",
    "aten::nll_loss2d_forward", "aten::nll_loss2d_backward",
}  # fmt: skip
SAMPLING = {"aten::multinomial", "aten::topk", "aten::sort", "aten::argsort"}
# TRL's fused LM head + log-softmax (trl.kernels.chunked_logprob, a torch.autograd.Function; its
# forward and backward are profiler scopes): its logsumexp folds count here, its mm as a product
LOGPROB_SCOPES = ("ChunkedLogProbFunction",)
ROLLOUT_SCOPE = "profile_step::rollout"  # this script's marker around each side's rollout


def claim(name: str) -> tuple[str | None, bool]:
    """The category an event claims for its subtree, or None; and whether the claim is strong
    (it holds for the whole subtree) or weak (an inner claim overrides it)."""
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#", "aten::_foreach_")):
        return "optimizer", True
    if name.startswith(("aten::scaled_dot_product_attention", "aten::_scaled_dot_product")):
        return "attention", True
    if name in MATMUL:
        return "matmul", False
    if name in SOFTMAX or name.startswith(LOGPROB_SCOPES):
        return "softmax", False
    if name in SAMPLING:
        return "sampling", False
    return None, False


def breakdown(events) -> dict:
    """Self CPU seconds of a profile's events: ``categories`` (all but ``outside``), the same for
    the events inside the ``ROLLOUT_SCOPE`` marker (``rollout``), per op name (``ops``), and per
    op name within each category (``category_ops``). An event's category is that of its
    outermost strong claimer (itself included), else of its innermost claimer, else
    ``other_aten`` for an ``aten::`` op and ``autograd`` for any other event. The marker's own
    self time is Python, left to "outside"."""
    cats: dict[str, float] = defaultdict(float)
    rollout: dict[str, float] = defaultdict(float)
    ops: dict[str, float] = defaultdict(float)
    cat_ops: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stack = [(e, None, False, False) for e in events if e.cpu_parent is None]
    while stack:
        event, cat, strong, in_rollout = stack.pop()
        if event.name == ROLLOUT_SCOPE:
            stack.extend((child, cat, strong, True) for child in event.cpu_children)
            continue
        if not strong:
            mine, mine_strong = claim(event.name)
            if mine is not None:
                cat, strong = mine, mine_strong
        self_s = event.self_cpu_time_total * 1e-6  # the profiler counts microseconds
        own = cat or ("other_aten" if event.name.startswith("aten::") else "autograd")
        cats[own] += self_s
        if in_rollout:
            rollout[own] += self_s
        ops[event.name] += self_s
        cat_ops[own][event.name] += self_s
        stack.extend((child, cat, strong, in_rollout) for child in event.cpu_children)
    return {
        "categories": dict(cats),
        "rollout": dict(rollout),
        "ops": dict(ops),
        "category_ops": {k: dict(v) for k, v in cat_ops.items()},
    }


def top(times: dict[str, float], n: int, scale: float) -> dict[str, float]:
    """The ``n`` largest entries of ``times``, largest first, each times ``scale``."""
    return {k: v * scale for k, v in sorted(times.items(), key=lambda kv: -kv[1])[:n]}


def short(name: str) -> str:
    """An op's name for the printed table (the JSON keeps the profiler's)."""
    name = name.removeprefix("aten::").removeprefix("autograd::engine::evaluate_function: ")
    name = name.replace("_scaled_dot_product_flash_attention_for_cpu", "sdpa_flash")
    return name.replace("_backward", "_bwd")


# ------------------------------------------------------------------------------------- the sides


class Window:
    """Times ``steps`` unprofiled steps, then profiles ``steps`` more: ``mark(i)`` is called at
    the start of step ``i`` (0-based, warm-up steps included) and once more after the last."""

    def __init__(self, warmup: int, steps: int):
        self.warmup, self.steps = warmup, steps
        self.reference_s = self.profiled_s = None
        self.prof = None
        self._t = 0.0

    def mark(self, i: int) -> None:
        w, s = self.warmup, self.steps
        if i == w:  # the unprofiled reference steps begin
            self._t = time.perf_counter()
        elif i == w + s:  # ... end; the profiled steps begin
            self.reference_s = time.perf_counter() - self._t
            self.prof = profile(activities=[ProfilerActivity.CPU], record_shapes=False)
            self.prof.start()
            self._t = time.perf_counter()
        elif i == w + 2 * s:  # the profiled steps end
            self.profiled_s = time.perf_counter() - self._t
            self.prof.stop()

    @property
    def total(self) -> int:  # steps run while marking; mark(total) ends the window
        return self.warmup + 2 * self.steps


class Phases:
    """Wraps a rollout method on its instance: in the profiled window, each call runs inside the
    ``ROLLOUT_SCOPE`` profiler scope, and its wall time and what it returned (a ``Batch`` here,
    TRL's dict of tensors) are kept."""

    def __init__(self, owner, attribute: str, window: Window):
        self.seconds, self.outputs = [], []
        inner = getattr(owner, attribute)

        def timed(*a, **kw):
            if window.prof is None or window.profiled_s is not None:  # outside the window
                return inner(*a, **kw)
            t0 = time.perf_counter()
            with record_function(ROLLOUT_SCOPE):  # marks the rollout's events for breakdown()
                out = inner(*a, **kw)
            self.seconds.append(time.perf_counter() - t0)
            self.outputs.append(out)
            return out

        setattr(owner, attribute, timed)


def update_tokens(batch, shared: bool) -> int:
    """Tokens the transformer runs in the loss's forward pass on ``batch`` (as ``update_flops``
    in ``bench_vs_trl.py`` counts them): every row whole, or each distinct prompt once plus the
    completions (the last column's logits are never needed, so it is not run)."""
    rows, width = batch.input_ids.shape
    if not shared:
        return rows * width
    start = first_scored_column(batch.loss_mask)
    n_prompts = shared_prompts(batch.input_ids, batch.attention_mask, start)[1]
    return n_prompts * start + rows * (width - 1 - start)


def run_ours(args, folder: str, fast: bool) -> dict:
    config = make_config(
        PROFILE, args.seed, "cpu", sft_steps=0, log_kl=False, share_prompt_prefix=fast,
        **args.overrides,
    )  # fmt: skip
    model, tok = load_pretrained(folder)
    trainer = GRPOTrainer(config, model=model, tokenizer=tok)
    window = Window(args.warmup, args.steps)
    phases = Phases(trainer, "rollout", window)
    for i in range(window.total):
        window.mark(i)
        trainer.rl_step()
    window.mark(window.total)
    batches = phases.outputs
    return finish(
        window,
        rollout_s=sum(phases.seconds),
        update_tokens=sum(update_tokens(b, fast) for b in batches),
        generated_tokens=sum(int(b.loss_mask.sum()) for b in batches),
    )


def run_trl(args, folder: str) -> dict:
    from transformers import TrainerCallback

    # this package's trainer only for its config and task (the ones bench_vs_trl hands TRL)
    config = make_config(PROFILE, args.seed, "cpu", sft_steps=0, log_kl=False, **args.overrides)
    model, tok = load_pretrained(folder)
    ours = GRPOTrainer(config, model=model, tokenizer=tok)
    window = Window(args.warmup, args.steps)
    steps = window.total + 1  # one step more: its on_step_begin ends the window
    dataset, reward_fn = trl_task(
        ours.task, steps * config.prompts_per_step, seed=args.seed, tokenizer=ours.tokenizer
    )
    del ours
    model, tok = load_pretrained(folder)

    class Mark(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            window.mark(state.global_step)  # optimizer steps done so far = this step's index

    with tempfile.TemporaryDirectory() as out, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl_trainer(
            config, model, tok, dataset, reward_fn, out=out, max_steps=steps, callback=Mark()
        )
        phases = Phases(trainer, "_generate_and_score_completions", window)
        trainer.train()
    outs = phases.outputs
    return finish(
        window,
        rollout_s=sum(phases.seconds),
        update_tokens=sum(
            o["prompt_ids"].numel() + o["completion_ids"].numel() for o in outs
        ),  # the loss runs torch.cat([prompt_ids, completion_ids], 1)
        generated_tokens=sum(int(o["completion_mask"].sum()) for o in outs),
    )


def finish(window: Window, **totals) -> dict:
    """Per-step numbers of one side's profiled window."""
    s = window.steps
    wall = window.profiled_s / s
    events = window.prof.events()
    threads = {e.thread for e in events}
    if len(threads) > 1:  # their self times could overlap, and "outside" would be too small
        log(f"warning: profiler events on {len(threads)} threads")
    b = breakdown(events)
    cats = {k: b["categories"].get(k, 0.0) / s for k, _ in CATEGORIES if k != "outside"}
    cats["outside"] = wall - sum(cats.values())
    rollout_s = totals["rollout_s"] / s
    in_rollout = {k: b["rollout"].get(k, 0.0) / s for k, _ in CATEGORIES if k != "outside"}
    in_rollout["outside"] = rollout_s - sum(in_rollout.values())
    return {
        "step_s_unprofiled": window.reference_s / s,
        "step_s": wall,
        "categories_s": cats,
        "rollout_s": rollout_s,
        "rollout_categories_s": in_rollout,
        "rest_s": wall - rollout_s,
        "update_tokens": totals["update_tokens"] / s,
        "generated_tokens": totals["generated_tokens"] / s,
        "events": len(events) / s,
        "threads": len(threads),
        "top_ops_s": top(b["ops"], 10, 1 / s),
        "top_ops_by_category_s": {k: top(v, 8, 1 / s) for k, v in b["category_ops"].items()},
    }


# ------------------------------------------------------------------------------------- report


def report(args, results: dict, meta: dict) -> None:
    col = 20

    def row(label: str, cells) -> None:
        print(f"{label:36s}" + "".join(f"{c:>{col}s}" for c in cells))

    def share(label: str, seconds, whole: str) -> None:  # ms per step and % of results[k][whole]
        cells = []
        for k in SIDES:
            t, wall = seconds(results[k]), results[k][whole]
            cells.append(f"{t * 1e3:.1f} {100 * t / wall:5.1f}%")
        row(f"  {label}", cells)

    print(
        f"GRPO step, {PROFILE} profile, seed {args.seed}, 1 CPU thread: {args.warmup} warm-up + "
        f"{args.steps} unprofiled + {args.steps} profiled steps per side"
    )
    row("", [NAMES[k] for k in SIDES])
    row("ms/step unprofiled", [f"{results[k]['step_s_unprofiled'] * 1e3:.1f}" for k in SIDES])
    row("ms/step profiled (wall, = 100 %)", [f"{results[k]['step_s'] * 1e3:.1f}" for k in SIDES])
    print("self CPU time per step, ms and % of the profiled wall time:")
    for key, label in CATEGORIES:
        share(label, lambda r, key=key: r["categories_s"][key], "step_s")
    row(
        "  sum of the rows",
        [f"{sum(results[k]['categories_s'].values()) * 1e3:.1f} 100.0%" for k in SIDES],
    )
    print("phases, ms per step and % of the step (rest: update, advantages, bookkeeping, logs):")
    for key, label in (("rollout_s", "rollout (generate, score)"), ("rest_s", "rest")):
        share(label, lambda r, key=key: r[key], "step_s")
    print("the rollout's part of each row above, ms per step and % of the rollout's wall time:")
    for key, label in CATEGORIES:
        share(label, lambda r, key=key: r["rollout_categories_s"][key], "rollout_s")
    row("update forward tokens/step", [f"{results[k]['update_tokens']:.0f}" for k in SIDES])
    row("generated tokens/step", [f"{results[k]['generated_tokens']:.0f}" for k in SIDES])
    row("profiler events/step", [f"{results[k]['events']:.0f}" for k in SIDES])
    print("top ops by self CPU time, ms per step:")
    for k in SIDES:
        top = list(results[k]["top_ops_s"].items())[:5]
        cells = ", ".join(f"{short(name)} {t * 1e3:.1f}" for name, t in top)
        print(f"  {k}: {cells}")
    print(f"total runtime {meta['wall_s']:.0f} s (warm start {meta['warm_start_s']:.0f} s)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=5, help="profiled (and unprofiled) steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first, per side")
    p.add_argument("--sft-steps", type=int, default=300, help="the warm start's SFT steps")
    p.add_argument("--out", default=None, help="write the raw numbers to this JSON file")
    p.add_argument("--smoke", action="store_true",
                   help="a few-second check that the script runs: smallest tiny model, 2 x 2 "
                        "batch, 1 SFT step, 1 + 1 steps per side (figures mean nothing)")
    args = p.parse_args(argv)
    args.overrides = {}
    if args.smoke:
        args.steps, args.warmup, args.sft_steps = 1, 0, 1
        args.overrides = {**SMOKE_MODEL, **SMOKE_BATCH}
    torch.set_num_threads(1)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.smoke and importlib.util.find_spec("trl") is None:
        with tempfile.TemporaryDirectory() as folder:
            warm_start(PROFILE, args.seed, "cpu", args.sft_steps, folder, **args.overrides)
            for side in ("plain", "fast"):
                run_ours(args, folder, fast=side == "fast")
        print("smoke: TRL is not installed; profiled this package's sides, skipped TRL's")
        return 0
    meta = {**run_info(PROFILE), "args": vars(args)}
    t_start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        log(f"warm start ({args.sft_steps} SFT steps) ...")
        warm_start(PROFILE, args.seed, "cpu", args.sft_steps, folder, **args.overrides)
        meta["warm_start_s"] = time.perf_counter() - t_start
        for side in SIDES:
            log(f"{NAMES[side]}: {args.warmup} + {args.steps} + {args.steps} steps ...")
            if side == "trl":
                results[side] = run_trl(args, folder)
            else:
                results[side] = run_ours(args, folder, fast=side == "fast")
    meta["load_average_end"] = os.getloadavg()
    meta["wall_s"] = time.perf_counter() - t_start
    report(args, results, meta)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"meta": meta, "sides": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
