"""Rollouts: the Batch's masks, rewards and group layout, and that the log-probs the loss uses are
the log-probs ``generate`` sampled from (with left padding and at any temperature)."""

from __future__ import annotations

import pytest
import torch

from testkit import fake_generate

from agentic_rl.envs import Problem
from agentic_rl.rollout import (
    Batch, build_sft_batch, encode_prompts, generate_batch, sequence_logprobs,
)  # fmt: skip

# Prompts of different lengths (3, 5, 7 and 11 words), so the batch is really left-padded.
PROBLEMS = [
    Problem("3 =", "3"),
    Problem("1 + 2 =", "3"),
    Problem("7 4 + 8 3 =", "5 8"),
    Problem("5 + 5 5 5 5 5 5 5 =", "0 1"),
]


def _prompt_rows(tokenizer, problems, G):
    return [tokenizer(p.prompt)["input_ids"] for p in problems for _ in range(G)]


def _check_layout(batch: Batch, tokenizer, task, problems, G):
    """Every structural invariant of a sampled Batch; returns (prompt width, per-row completion
    lengths)."""
    B = len(problems) * G
    rows = _prompt_rows(tokenizer, problems, G)
    P = max(len(r) for r in rows)
    assert len(batch) == B
    assert (batch.input_ids.shape == batch.attention_mask.shape == batch.loss_mask.shape
            == batch.token_rewards.shape)
    # group layout: rows i*G .. i*G+G-1 answer problems[i]
    assert batch.group_id.tolist() == [i for i in range(len(problems)) for _ in range(G)]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    lengths = []
    for r in range(B):
        ids, am = batch.input_ids[r].tolist(), batch.attention_mask[r].tolist()
        lm = batch.loss_mask[r].tolist()
        # prompt part: left-padded encoding, attention on real tokens only, never in the loss
        n = len(rows[r])
        assert ids[:P] == [pad] * (P - n) + rows[r]
        assert am[:P] == [0] * (P - n) + [1] * n
        assert lm[:P] == [0] * P
        # completion part: 1 up to and including the first EOS, 0 (and pad ids) after it
        comp = ids[P:]
        k = comp.index(eos) + 1 if eos in comp else len(comp)
        truncated = eos not in comp
        assert lm[P:] == [1] * k + [0] * (len(comp) - k)
        assert am[P:] == lm[P:]
        assert comp[k:] == [pad] * (len(comp) - k)
        lengths.append(k)
        # the text is the completion's tokens before EOS, special tokens kept (a sampled <pad> or
        # <bos> is part of the answer and makes it malformed), and the task scores that text
        text = tokenizer.decode(comp[: k if truncated else k - 1], skip_special_tokens=False)
        assert batch.completions[r] == text
        s = task.score(problems[r // G], text, truncated=truncated)
        assert bool(batch.correct[r]) == s.correct and bool(batch.format_ok[r]) == s.format_ok
        if truncated:
            assert not s.format_ok
        # the reward sits on the last generated token, and only there
        last = P + k - 1
        assert batch.token_rewards[r, last].item() == pytest.approx(s.reward)
        others = torch.cat([batch.token_rewards[r, :last], batch.token_rewards[r, last + 1 :]])
        assert torch.all(others == 0)
        assert batch.scores[r].item() == pytest.approx(s.reward)
        # old log-probs live on generated tokens only
        if batch.old_logprobs is not None:
            olp = batch.old_logprobs[r]
            assert torch.all(olp[torch.tensor(lm) == 0] == 0)
            assert torch.all(olp[P : P + k] < 0)
    return P, lengths


def test_generate_batch_layout_on_sampled_completions(model, tokenizer, task):
    G = 3
    torch.manual_seed(0)
    model.train()
    batch = generate_batch(model, tokenizer, task, PROBLEMS, num_generations=G,
                           max_completion_length=6)
    assert model.training  # the caller's mode is restored
    P, lengths = _check_layout(batch, tokenizer, task, PROBLEMS, G)
    # an untrained model: both kinds of rows must be present for the check above to mean anything
    eos = tokenizer.eos_token_id
    assert any(k < 6 or batch.input_ids[r, P + k - 1] == eos for r, k in enumerate(lengths))
    assert any(eos not in batch.input_ids[r, P:].tolist() for r in range(len(batch)))
    assert batch.ref_logprobs is None and batch.values is None



def test_generate_batch_masks_and_rewards_on_known_completions(model, tokenizer, task):
    problem = task.make_problem(47, 38)  # answer "5 8"
    completions = [
        ["5", "8", "<eos>"],  # correct: 1.1
        ["5", "9", "<eos>"],  # well formed, wrong: 0.1
        ["<eos>"],  # empty: 0
        # no EOS within 4 tokens: truncated, all 4 tokens in the loss, format failure
        ["5", "8", "1", "1"],
        ["+", "<eos>", "5", "8"],  # tokens after the first EOS are not the completion
        ["5", "8", "0", "<eos>"],  # 3 digits, well formed, wrong: 0.1
    ]
    model.generate = fake_generate(tokenizer, completions, width=4)
    batch = generate_batch(model, tokenizer, task, [problem, problem, problem], num_generations=2,
                           max_completion_length=4)
    P, lengths = _check_layout(batch, tokenizer, task, [problem] * 3, 2)
    assert lengths == [3, 3, 1, 4, 2, 4]
    assert batch.scores.tolist() == pytest.approx([1.1, 0.1, 0.0, 0.0, 0.0, 0.1])
    assert batch.correct.tolist() == [True, False, False, False, False, False]
    assert batch.format_ok.tolist() == [True, True, False, False, False, True]
    assert batch.completions == ["5 8", "5 9", "", "5 8 1 1", "+", "5 8 0"]
    assert batch.group_id.tolist() == [0, 0, 1, 1, 2, 2]
    # the reward column of each row: the EOS, or the last token when truncated
    assert [int(batch.token_rewards[r].nonzero().flatten()[0]) - P for r in (0, 1, 5)] == [2, 2, 3]
    assert batch.loss_mask[3, P:].tolist() == [1, 1, 1, 1]
    assert batch.input_ids[4, P:].tolist() == [tokenizer.convert_tokens_to_ids("+"),
                                               tokenizer.eos_token_id, 0, 0]


def test_special_tokens_inside_a_completion_are_a_format_failure(model, tokenizer, task):
    problem = task.make_problem(47, 38)
    completions = [["5", "<bos>", "8", "<eos>"], ["<pad>", "5", "8", "<eos>"],
                   ["5", "<unk>", "8", "<eos>"]]
    model.generate = fake_generate(tokenizer, completions, width=4)
    batch = generate_batch(model, tokenizer, task, [problem] * 3, num_generations=1,
                           max_completion_length=4)
    assert batch.format_ok.tolist() == [False, False, False]
    assert batch.scores.tolist() == [0.0, 0.0, 0.0]


def test_truncation_keeps_all_tokens_and_fails_format(model, tokenizer, task):
    # the model can never close a completion
    model.generation_config.suppress_tokens = [tokenizer.eos_token_id]
    problems = [task.make_problem(a, b) for a, b in [(1, 2), (47, 38), (99, 99)]]
    torch.manual_seed(0)
    batch = generate_batch(model, tokenizer, task, problems, num_generations=4,
                           max_completion_length=3)
    P, lengths = _check_layout(batch, tokenizer, task, problems, 4)
    assert lengths == [3] * 12
    assert torch.all(batch.loss_mask[:, P:] == 1) and batch.input_ids.shape[1] == P + 3
    assert not batch.format_ok.any() and not batch.correct.any()
    assert torch.all(batch.scores == 0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_old_logprobs_equal_the_sampling_logprobs(model, tokenizer, task, temperature):
    """What the loss calls log pi_old is exactly what ``generate`` sampled from (left padding
    included)."""
    G, L = 3, 6
    torch.manual_seed(11)
    batch = generate_batch(model, tokenizer, task, PROBLEMS, num_generations=G,
                           max_completion_length=L, temperature=temperature)
    enc = encode_prompts(tokenizer, [p.prompt for p in PROBLEMS for _ in range(G)])
    assert (enc["attention_mask"] == 0).any()  # really left-padded
    torch.manual_seed(11)
    out = model.generate(**enc, max_new_tokens=L, do_sample=True, temperature=temperature, top_k=0,
                         top_p=1.0, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, output_scores=True,
                         return_dict_in_generate=True)
    P = enc["input_ids"].shape[1]
    comp = out.sequences[:, P:]
    mask = batch.loss_mask[:, P:].bool()
    # same seed, same samples
    assert torch.equal(torch.where(mask, comp, tokenizer.pad_token_id), batch.input_ids[:, P:])
    # scores are the processed (temperature-scaled) logits generate sampled from
    logp = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], dim=1)
    sampled = logp.gather(-1, comp.unsqueeze(-1)).squeeze(-1)
    assert mask.sum() > len(batch)  # more than one token per row on average: a real comparison
    torch.testing.assert_close(batch.old_logprobs[:, P:][mask], sampled[mask], atol=1e-5, rtol=0)


def test_ref_logprobs_and_greedy(model, tokenizer, task):
    import copy

    ref = copy.deepcopy(model)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    torch.manual_seed(0)
    a = generate_batch(model, tokenizer, task, PROBLEMS, num_generations=2, max_completion_length=5,
                       ref_model=ref)
    lm = a.loss_mask.bool()
    assert torch.all(a.ref_logprobs[~lm] == 0)
    assert not torch.allclose(a.ref_logprobs[lm], a.old_logprobs[lm])
    expected = sequence_logprobs(ref, a.input_ids, a.attention_mask) * a.loss_mask
    torch.testing.assert_close(a.ref_logprobs, expected, atol=1e-5, rtol=0)
    # greedy decoding ignores the RNG, and both completions of a group agree
    torch.manual_seed(1)
    g1 = generate_batch(model, tokenizer, task, PROBLEMS, num_generations=2,
                        max_completion_length=5, greedy=True, compute_old_logprobs=False)
    torch.manual_seed(2)
    g2 = generate_batch(model, tokenizer, task, PROBLEMS, num_generations=2,
                        max_completion_length=5, greedy=True, compute_old_logprobs=False)
    assert torch.equal(g1.input_ids, g2.input_ids) and g1.old_logprobs is None
    assert torch.equal(g1.input_ids[0::2], g1.input_ids[1::2])


# --------------------------------------------------------------------------- sequence_logprobs


def test_sequence_logprobs_convention_and_padding_invariance(model, tokenizer):
    model.eval()
    text = "7 4 + 8 3 = 5 8"
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        lp, ent = sequence_logprobs(model, ids, torch.ones_like(ids), with_entropy=True)
        logits = model(input_ids=ids).logits
    assert lp.shape == ids.shape == ent.shape
    assert lp[0, 0] == 0 and ent[0, 0] == 0  # column 0 has no predecessor
    # logprobs[:, t] = log p(ids[t] | ids[:t])
    manual = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(lp[0, 1:], manual, atol=1e-5, rtol=0)
    most = torch.log(torch.tensor(float(len(tokenizer))))  # the entropy of a uniform draw
    assert torch.all(ent[0, 1:] > 0) and torch.all(ent[0, 1:] <= most + 1e-5)
    # temperature divides the logits
    with torch.no_grad():
        lp_t = sequence_logprobs(model, ids, torch.ones_like(ids), temperature=0.5)
    manual_t = torch.log_softmax(logits[0, :-1] / 0.5, -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(lp_t[0, 1:], manual_t, atol=1e-5, rtol=0)
    # left padding changes nothing on the real tokens (positions count real tokens only)
    enc = tokenizer([text, "1 ="], return_tensors="pt", padding=True)
    enc2 = tokenizer([text, "9 9 9 9 9 9 9 9 9 9 ="], return_tensors="pt", padding=True)
    with torch.no_grad():
        short = sequence_logprobs(model, enc["input_ids"], enc["attention_mask"])
        padded = sequence_logprobs(model, enc2["input_ids"], enc2["attention_mask"])
    assert torch.all(short[:, 0] == 0) and torch.all(padded[:, 0] == 0)
    n = ids.shape[1]
    torch.testing.assert_close(short[0, -n + 1 :], lp[0, 1:], atol=1e-5, rtol=0)
    torch.testing.assert_close(padded[0, -n + 1 :], lp[0, 1:], atol=1e-5, rtol=0)
    assert enc2["attention_mask"][0, 0] == 0  # the text row was really padded in enc2


# --------------------------------------------------------------------------- SFT batch and Batch


def test_build_sft_batch_masks_completion_and_eos_only(tokenizer):
    b = build_sft_batch(tokenizer, ["7 4 + 8 3 =", "1 ="], ["5 8", "1"])
    tid = tokenizer.convert_tokens_to_ids
    bos, eos, pad = tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    assert b.input_ids.tolist() == [
        [bos, tid("7"), tid("4"), tid("+"), tid("8"), tid("3"), tid("="), tid("5"), tid("8"), eos],
        [bos, tid("1"), tid("="), tid("1"), eos, pad, pad, pad, pad, pad],
    ]
    assert b.loss_mask.tolist() == [[0] * 7 + [1, 1, 1], [0, 0, 0, 1, 1, 0, 0, 0, 0, 0]]
    assert b.attention_mask.tolist() == [[1] * 10, [1] * 5 + [0] * 5]
    assert b.group_id.tolist() == [0, 1]
    assert torch.all(b.token_rewards == 0) and b.old_logprobs is None


def test_batch_to_and_scores(model, tokenizer, task):
    torch.manual_seed(0)
    b = generate_batch(model, tokenizer, task, PROBLEMS[:2], num_generations=2,
                       max_completion_length=4)
    moved = b.to("cpu")
    assert isinstance(moved, Batch) and moved is not b
    for name in ("input_ids", "attention_mask", "loss_mask", "token_rewards", "group_id",
                 "old_logprobs", "correct", "format_ok"):
        x, y = getattr(b, name), getattr(moved, name)
        assert torch.equal(x, y) and y.device.type == "cpu"
    assert moved.ref_logprobs is None and moved.completions == b.completions and len(moved) == 4
    torch.testing.assert_close(moved.scores, b.token_rewards.sum(-1))
    if torch.cuda.is_available():  # pragma: no cover - on a GPU box
        on_gpu = b.to("cuda")
        assert on_gpu.input_ids.is_cuda and on_gpu.completions == b.completions
