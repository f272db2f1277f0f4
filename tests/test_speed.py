"""The fast paths of issue 12, each tested equal to the plain one it stands beside.

``share_prompt_prefix`` encodes each prompt once for its group, in sampling
(:func:`sample_shared_prefix` beside ``model.generate``) and in the loss
(:func:`shared_prefix_logprobs` beside :func:`sequence_logprobs`). Speed is measured in
``benchmarks/bench_vs_trl.py``, never here.
"""

from __future__ import annotations

import random

import pytest
import torch

from agentic_rl.models import add_lora
from agentic_rl.rollout import (
    first_scored_column,
    generate_batch,
    sequence_logprobs,
    shared_prefix_logprobs,
    shared_prompts,
)
from agentic_rl.grpo import GRPOTrainer


def _batch(model, tokenizer, task, *, greedy=False, temperature=1.0, flag=False, seed=0, n=6):
    problems = task.sample(n, random.Random(seed))
    torch.manual_seed(seed)
    return generate_batch(
        model, tokenizer, task, problems, num_generations=4, max_completion_length=6,
        temperature=temperature, greedy=greedy, share_prompt_prefix=flag, compute_old_logprobs=True,
    )  # fmt: skip


def _grads(model, logp, mask):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad((logp * mask).sum(), params)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prefix_logprobs_equal_the_plain_pass(model, tokenizer, task, temperature):
    batch = _batch(model, tokenizer, task, temperature=temperature)
    start = first_scored_column(batch.loss_mask)
    ids, att, mask = batch.input_ids, batch.attention_mask, batch.loss_mask
    plain, plain_ent = sequence_logprobs(
        model, ids, att, temperature=temperature, with_entropy=True, start=start
    )
    fast, fast_ent = shared_prefix_logprobs(
        model, ids, att, prompt_len=start, temperature=temperature, with_entropy=True
    )
    assert fast.shape == plain.shape
    torch.testing.assert_close(fast * mask, plain * mask, rtol=0, atol=1e-5)
    torch.testing.assert_close(fast_ent * mask, plain_ent * mask, rtol=0, atol=1e-5)
    for g_fast, g_plain in zip(_grads(model, fast, mask), _grads(model, plain, mask)):
        torch.testing.assert_close(g_fast, g_plain, rtol=1e-4, atol=1e-6)


def test_shared_prefix_groups_are_found_and_the_saving_is_real(model, tokenizer, task):
    batch = _batch(model, tokenizer, task)
    start = first_scored_column(batch.loss_mask)
    index, n = shared_prompts(batch.input_ids, batch.attention_mask, start)
    assert n == 6  # six prompts, four samples each
    assert torch.equal(index, batch.group_id)


def test_rows_that_share_nothing_still_get_the_plain_logprobs(model, tokenizer, task):
    batch = _batch(model, tokenizer, task)
    rows = torch.arange(0, len(batch), 4)  # one row per group: no prompt is shared
    sub = batch.select(rows)
    start = first_scored_column(sub.loss_mask)
    assert shared_prompts(sub.input_ids, sub.attention_mask, start)[1] == len(sub)
    plain = sequence_logprobs(model, sub.input_ids, sub.attention_mask, start=start)
    fast = shared_prefix_logprobs(model, sub.input_ids, sub.attention_mask, prompt_len=start)
    torch.testing.assert_close(fast * sub.loss_mask, plain * sub.loss_mask, rtol=0, atol=1e-5)


def test_one_token_completions(model, tokenizer, task):
    """No tail pass when every completion is one token: the prompt's last logits are all."""
    batch = _batch(model, tokenizer, task)
    start = first_scored_column(batch.loss_mask)
    ids, att = batch.input_ids[:, : start + 1], batch.attention_mask[:, : start + 1]
    plain = sequence_logprobs(model, ids, att, start=start)
    fast = shared_prefix_logprobs(model, ids, att, prompt_len=start)
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("greedy", [True, False])
def test_shared_prefix_sampling_draws_what_generate_draws(model, tokenizer, task, greedy):
    """The same sampler as ``generate`` (softmax at temperature, one multinomial per step): the
    same seed gives the same tokens, masks and scores."""
    plain = _batch(model, tokenizer, task, greedy=greedy, temperature=0.8, seed=3)
    fast = _batch(model, tokenizer, task, greedy=greedy, temperature=0.8, seed=3, flag=True)
    for name in ("input_ids", "attention_mask", "loss_mask", "token_rewards", "group_id"):
        assert torch.equal(getattr(fast, name), getattr(plain, name)), name
    assert fast.completions == plain.completions
    torch.testing.assert_close(fast.old_logprobs, plain.old_logprobs, rtol=0, atol=1e-5)


def test_shared_prefix_under_lora_and_with_the_adapters_off(model, tokenizer, task):
    lora = add_lora(model, r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    for p in (p for n, p in lora.named_parameters() if "lora_B" in n):
        torch.nn.init.normal_(p, std=0.1)  # a trained adapter: the two policies differ
    batch = _batch(lora, tokenizer, task)
    start = first_scored_column(batch.loss_mask)
    ids, att, mask = batch.input_ids, batch.attention_mask, batch.loss_mask
    plain = sequence_logprobs(lora, ids, att, start=start)
    fast = shared_prefix_logprobs(lora, ids, att, prompt_len=start)
    torch.testing.assert_close(fast * mask, plain * mask, rtol=0, atol=1e-5)
    for g_fast, g_plain in zip(_grads(lora, fast, mask), _grads(lora, plain, mask)):
        assert g_fast.abs().sum() > 0  # the adapters get a gradient
        torch.testing.assert_close(g_fast, g_plain, rtol=1e-4, atol=1e-6)
    with lora.disable_adapter():
        off = shared_prefix_logprobs(lora, ids, att, prompt_len=start)
    assert not torch.allclose(off * mask, fast * mask)


def test_a_grpo_run_with_the_fast_path_follows_the_plain_run(tiny_config):
    """Three GRPO steps from the same seed: the same samples and rewards, losses and gradient
    norms equal to float precision (the fast path changes the arithmetic's order, not the
    algorithm)."""
    runs = {}
    for flag in (False, True):
        trainer = GRPOTrainer(tiny_config(max_steps=3, share_prompt_prefix=flag, log_kl=True))
        trainer.train()
        runs[flag] = trainer.history
    for plain, fast in zip(runs[False], runs[True]):
        for key in ("reward_mean", "accuracy", "completion_length", "frac_reward_zero_std"):
            assert fast[key] == plain[key], key
        for key in ("loss", "grad_norm", "entropy", "kl"):
            assert fast[key] == pytest.approx(plain[key], rel=1e-4, abs=1e-6), key


def test_bf16_autocast_only_on_a_gpu_that_supports_it(monkeypatch):
    import contextlib
    import warnings

    from agentic_rl.utils import mixed_precision

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert isinstance(mixed_precision(cpu, True), contextlib.nullcontext)  # the CPU stays fp32
    assert isinstance(mixed_precision(cuda, False), contextlib.nullcontext)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert isinstance(mixed_precision(cuda, True), contextlib.nullcontext)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "CUDA is not available": this machine has no GPU
        ctx = mixed_precision(cuda, True)
    assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.bfloat16


def test_the_full_profile_asks_for_bf16_on_a_gpu_only(monkeypatch):
    from agentic_rl import config as config_mod
    from agentic_rl.grpo import GRPOConfig

    assert GRPOConfig.from_profile("full", device="cpu").bf16 is False
    monkeypatch.setattr(config_mod, "_on_cuda", lambda device: True)
    assert GRPOConfig.from_profile("full").bf16 is True
    assert GRPOConfig.from_profile("full", bf16=False).bf16 is False  # what you set wins


def test_bf16_on_the_cpu_changes_nothing(tiny_config):
    runs = []
    for flag in (False, True):  # one after the other: each seeds the global stream it samples from
        runs.append(GRPOTrainer(tiny_config(bf16=flag)))
        runs[-1].train()
    assert runs[0].history[-1]["loss"] == runs[1].history[-1]["loss"]
    assert runs[0].history[-1]["grad_norm"] == runs[1].history[-1]["grad_norm"]


@pytest.mark.parametrize("name", ["ppo", "retool", "starpo", "rcgrpo", "gcd"])
def test_the_fast_path_gives_the_plain_logprobs_on_every_agent_recipe(name):
    """The agent recipes run the fast path too (the default): on a multi-turn rollout batch,
    each distinct first observation (RC-GRPO's differ within a group: the reward token) encoded
    once gives the plain pass's log-probs, entropies and gradients up to float order."""
    import dataclasses

    from agentic_rl.cli import recipe

    chapter = recipe(name)
    config = chapter.CONFIG(sft_steps=0, prompts_per_step=4, eval_size=2, disable_tqdm=True)
    trainer = chapter.TRAINER(config)
    try:
        batch = trainer.rollout()
        results = {}
        for fast in (False, True):
            trainer.config = dataclasses.replace(
                config, share_prompt_prefix=fast, skip_prompt_logits=fast
            )
            trainer.model.zero_grad(set_to_none=True)
            logprobs, entropy = trainer.policy_logprobs(batch)
            (logprobs * batch.loss_mask).sum().backward()
            grads = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
            results[fast] = (logprobs.detach(), entropy.detach(), grads)
    finally:
        trainer.close()
    mask = batch.loss_mask.bool()
    (lp0, en0, g0), (lp1, en1, g1) = results[False], results[True]
    assert (lp0 - lp1)[mask].abs().max() < 1e-5
    assert (en0 - en1)[mask].abs().max() < 1e-5
    assert len(g0) == len(g1)
    worst = max(float((a - b).abs().max() / a.abs().max().clamp(min=1e-12)) for a, b in zip(g0, g1))
    assert worst < 1e-4, worst  # relative to each tensor's largest entry: float summation order
