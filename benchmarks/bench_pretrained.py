"""What a GRPO step of the ``pretrained`` profile costs (SmolLM2-135M-Instruct + LoRA), and where.

    OMP_NUM_THREADS=1 python benchmarks/bench_pretrained.py [--steps 6]
        [--out bench_pretrained.json]

1. Loading the packaged model (GGUF, dequantized to float32): seconds, once.
2. Whole GRPO steps of the profile (4 prompts x 4 answers, 12 tokens at most, KL to the base
   logged): median step time, the rollout's generated tokens per second (sampling, scoring and the
   reference's log-probs), and the update (loss forward, backward, AdamW) as the rest.
3. The loss stage (forward, loss, backward) on one fixed rollout batch with ``skip_prompt_logits``
   on and off, timed in turn: what leaving out the LM head over the prompt saves.

Medians over the steps (after one warm-up step); the machine is shared, so quote medians, and run
with one thread. Runs on CUDA when one is available (``--device``).

``--smoke``: a few-second check that the whole script runs: the packaged model's tokenizer and
chat template on a randomly initialised Llama of the smallest shape (:func:`tiny_pretrained`:
dequantizing the real 135M weights alone takes 15-20 s), 2 prompts x 2 answers, one timed step,
on the CPU; its figures mean nothing. Where the packaged model is not installed it says so and
skips the rest.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time

try:
    import agentic_rl  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import torch

from agentic_rl.grpo import GRPOConfig
from agentic_rl.models import load_pretrained, resolve_model
from agentic_rl.grpo import GRPOTrainer

PACKAGED = "smollm2-135m-instruct"


def tiny_pretrained(folder: str, name: str = PACKAGED) -> str:
    """Save to ``folder`` a stand-in for the packaged model ``name`` and return the folder: its
    tokenizer and chat template (read from the package's GGUF file: the package must be installed)
    on a randomly initialised Llama of the smallest shape. ``load_pretrained(folder)`` and
    ``model_name_or_path=folder`` then take the pretrained path in seconds (the ``--smoke`` runs of
    this script and of ``bench_agent_llm.py``)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    where, gguf_file = resolve_model(name)
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=gguf_file)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="timed steps (after one warm-up)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--smoke", action="store_true",
                    help="a few-second check that the script runs: a tiny random model with the "
                         "packaged tokenizer, 2 x 2 answers, 1 step (figures mean nothing)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        run(args, folder)


def run(args, folder: str) -> None:
    """The measurements; ``folder``: a scratch folder (``--smoke`` saves its stand-in there)."""
    name, sizes = PACKAGED, {}
    if args.smoke:
        args.steps, args.device = 1, "cpu"
        try:
            name = tiny_pretrained(folder)
        except FileNotFoundError as err:  # the package (or the gguf reader) is not installed
            print(f"smoke: skipped the measurements: {err}")
            return
        sizes = dict(model_name_or_path=name, prompts_per_step=2, num_generations=2, eval_size=2)

    t0 = time.perf_counter()
    base = load_pretrained(name)
    load_s = time.perf_counter() - t0

    config = GRPOConfig.from_profile(
        "pretrained", disable_tqdm=True, device=args.device, max_steps=args.steps + 1, **sizes
    )
    trainer = GRPOTrainer(config, base=(copy.deepcopy(base[0]), base[1]))
    trainer.rl_step()  # warm-up
    rows = [trainer.rl_step() for _ in range(args.steps)]
    step = statistics.median(r["step_time"] for r in rows)
    tok_s = statistics.median(r["tokens_per_s"] for r in rows)
    gen_tokens = [
        r["completion_length"] * config.prompts_per_step * config.num_generations for r in rows
    ]
    rollout = statistics.median(n / r["tokens_per_s"] for n, r in zip(gen_tokens, rows))

    batch = trainer.rollout()
    adv = trainer.compute_advantages(batch)
    times = {True: [], False: []}
    for _ in range(args.steps):
        for skip in (True, False):
            trainer.config = dataclasses.replace(config, skip_prompt_logits=skip)
            trainer.model.zero_grad(set_to_none=True)
            t = time.perf_counter()
            loss, _ = trainer.compute_loss(batch, adv)
            loss.backward()
            times[skip].append(time.perf_counter() - t)
    loss_on, loss_off = (statistics.median(times[k]) for k in (True, False))

    figures = {
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} thread(s)",
        "device": str(trainer.device),
        "load_s": round(load_s, 1),
        "step_s": round(step, 2),
        "rollout_s": round(rollout, 2),
        "update_s": round(step - rollout, 2),
        "generated_tokens_per_s": round(tok_s, 1),
        "sequences_per_step": config.prompts_per_step * config.num_generations,
        "batch_shape": list(batch.input_ids.shape),
        "loss_stage_skip_prompt_logits_s": round(loss_on, 2),
        "loss_stage_all_logits_s": round(loss_off, 2),
    }
    for k, v in figures.items():
        print(f"{k:34} {v}")
    print(f"skip_prompt_logits saves {1 - loss_on / loss_off:.0%} of the loss stage")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(figures, fh, indent=2)


if __name__ == "__main__":
    main()
