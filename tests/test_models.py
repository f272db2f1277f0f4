"""The word-level tokenizer, the tiny Llama, LoRA, and loading a saved model by folder (the offline
stand-in for loading by hub name)."""

from __future__ import annotations

import copy
import socket
from collections.abc import Mapping

import pytest
import torch

from agentic_rl.models import (
    CHAT_WORDS,
    SPECIAL_TOKENS,
    add_lora,
    build_model,
    build_tokenizer,
    count_parameters,
    get_device,
    load_pretrained,
)

from testkit import TINY_MODEL

PROMPT = "7 4 + 8 3 ="  # 47 + 38, least-significant digit first


def _ids(out):
    """``apply_chat_template(tokenize=True)`` returns a dict (BatchEncoding) in transformers v5, a
    list before."""
    return list(out["input_ids"] if isinstance(out, Mapping) else out)


# --------------------------------------------------------------------------- tokenizer


def test_vocabulary_ids_are_fixed_and_contiguous(tokenizer, task):
    vocab = tokenizer.get_vocab()
    # specials first, in their fixed order, then the sorted words (task words + chat words)
    words = sorted(set(task.vocabulary()) | set(CHAT_WORDS))
    assert [vocab[t] for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    first = len(SPECIAL_TOKENS)
    assert [vocab[w] for w in words] == list(range(first, first + len(words)))
    assert sorted(vocab.values()) == list(range(len(tokenizer)))
    # building it again gives the same ids
    assert build_tokenizer(reversed(task.vocabulary())).get_vocab() == vocab


def test_encode_prepends_bos_and_decode_round_trips(tokenizer):
    ids = tokenizer(PROMPT)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.convert_ids_to_tokens(ids) == ["<bos>", "7", "4", "+", "8", "3", "="]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == PROMPT
    # and completion text (no special tokens added) round-trips too
    c_ids = tokenizer("5 8", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(c_ids) == ["5", "8"]
    assert tokenizer.decode(c_ids + [tokenizer.eos_token_id], skip_special_tokens=True) == "5 8"


def test_unknown_word_is_unk(tokenizer):
    ids = tokenizer("7 x 4 hello")["input_ids"]
    assert ids == [tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("7"),
                   tokenizer.unk_token_id, tokenizer.convert_tokens_to_ids("4"),
                   tokenizer.unk_token_id]


def test_padding_is_on_the_left(tokenizer):
    enc = tokenizer(["1 =", PROMPT], padding=True)
    short, long = enc["input_ids"]
    assert len(short) == len(long) == 7
    assert short[:4] == [tokenizer.pad_token_id] * 4 and short[4] == tokenizer.bos_token_id
    assert enc["attention_mask"][0] == [0, 0, 0, 0, 1, 1, 1]
    assert enc["attention_mask"][1] == [1] * 7


def test_chat_template_uses_only_vocabulary_words(tokenizer):
    messages = [{"role": "system", "content": "+ ="}, {"role": "user", "content": PROMPT}]
    ids = _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "<|im_start|>", "system", "+", "=", "<|im_end|>",
        "<|im_start|>", "user", "7", "4", "+", "8", "3", "=", "<|im_end|>",
        "<|im_start|>", "assistant",
    ]
    # the check above can fail: an out-of-vocabulary role becomes <unk>
    bad = _ids(tokenizer.apply_chat_template([{"role": "tool", "content": "1"}], tokenize=True))
    assert tokenizer.unk_token_id in bad


@pytest.mark.parametrize("word", ["a b", "1\t2", "x\n", ""])
def test_vocabulary_word_with_whitespace_raises(word):
    with pytest.raises(ValueError, match="whitespace"):
        build_tokenizer(["1", word])


def test_special_token_in_words_does_not_shift_ids(task, tokenizer):
    tok = build_tokenizer(task.vocabulary() + ["<eos>"])
    assert tok.get_vocab() == tokenizer.get_vocab()
    assert tok.eos_token_id == 3
    assert max(tok.get_vocab().values()) == len(tok) - 1


def test_extra_special_tokens_get_ids_after_the_fixed_specials(task):
    tok = build_tokenizer(task.vocabulary(), extra_special_tokens=["<tool>", "<eos>"])
    assert tok.convert_tokens_to_ids("<tool>") == len(SPECIAL_TOKENS)
    assert tok.eos_token_id == 3
    assert sorted(tok.get_vocab().values()) == list(range(len(tok)))
    assert tok.decode(tok("1 <tool> 2")["input_ids"], skip_special_tokens=True) == "1 2"


# --------------------------------------------------------------------------- model


def test_count_parameters_counts_tied_embeddings_once(model, tokenizer):
    assert model.lm_head.weight is model.model.embed_tokens.weight
    V, H = len(tokenizer), TINY_MODEL["hidden_size"]
    I, L = TINY_MODEL["intermediate_size"], TINY_MODEL["num_hidden_layers"]
    kv = H // TINY_MODEL["num_attention_heads"] * TINY_MODEL["num_key_value_heads"]
    # q, k+v, o, gate/up/down, two RMSNorms
    per_layer = H * H + 2 * H * kv + H * H + 3 * H * I + 2 * H
    expected = V * H + L * per_layer + H  # one embedding matrix (tied with lm_head), final norm
    assert count_parameters(model) == expected == 19264
    with_duplicates = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert with_duplicates == expected + V * H
    assert count_parameters(model, trainable_only=True) == expected


def test_build_model_is_seeded_and_samples_from_the_policy(tokenizer):
    a = build_model(tokenizer, seed=3, **TINY_MODEL)
    b = build_model(tokenizer, seed=3, **TINY_MODEL)
    c = build_model(tokenizer, seed=4, **TINY_MODEL)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    g = a.generation_config
    assert (g.do_sample, g.temperature, g.top_k, g.top_p) == (True, 1.0, 0, 1.0)
    ids = (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id)
    assert (g.pad_token_id, g.eos_token_id, g.bos_token_id) == ids
    assert a.config.vocab_size == len(tokenizer)


def test_get_device():
    assert get_device("cpu") == torch.device("cpu")
    assert isinstance(get_device(), torch.device)
    assert get_device("auto") == get_device(None)
    if not torch.cuda.is_available():
        assert get_device().type in ("cpu", "mps")


# --------------------------------------------------------------------------- save / load by folder


def test_save_and_load_pretrained_round_trip(tmp_path, model, tokenizer):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model2, tok2 = load_pretrained(str(tmp_path))
    texts = [PROMPT, "1 =", "9 9 + 1 ="]
    assert tok2.padding_side == "left"
    assert tok2.get_vocab() == tokenizer.get_vocab()
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    enc2 = tok2(texts, return_tensors="pt", padding=True)
    assert torch.equal(enc["input_ids"], enc2["input_ids"])
    assert torch.equal(enc["attention_mask"], enc2["attention_mask"])
    assert tok2.decode(enc2["input_ids"][0], skip_special_tokens=True) == PROMPT
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**enc).logits, model2(**enc2).logits)  # bit-identical
    assert model2.lm_head.weight is model2.model.embed_tokens.weight
    g = model2.generation_config
    assert (g.do_sample, g.temperature, g.top_k, g.top_p) == (True, 1.0, 0, 1.0)
    assert (g.pad_token_id, g.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert all(p.dtype == torch.float32 for p in model2.parameters())


def test_load_pretrained_dtype_and_missing_pad_token(tmp_path, model, tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model2, tok2 = load_pretrained(str(tmp_path), device="cpu", dtype=torch.float64)
    assert tok2.pad_token == tok2.eos_token == "<eos>"
    assert model2.generation_config.pad_token_id == tokenizer.eos_token_id
    assert all(p.dtype == torch.float64 for p in model2.parameters())


def test_load_pretrained_unknown_name_offline_fails_without_network(monkeypatch):
    assert __import__("os").environ["HF_HUB_OFFLINE"] == "1"  # set by conftest

    def no_network(*args, **kwargs):
        raise AssertionError("load_pretrained tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(FileNotFoundError, match=r"no-such-org/no-such-model.*HF_HUB_OFFLINE"):
        load_pretrained("no-such-org/no-such-model")


# --------------------------------------------------------------------------- LoRA


def test_add_lora_trains_only_adapters_and_starts_as_identity(model, tokenizer):
    enc = tokenizer([PROMPT, "1 ="], return_tensors="pt", padding=True)
    model.eval()
    with torch.no_grad():
        before = model(**enc).logits.clone()
    total_before = count_parameters(model)
    lora = add_lora(model, r=8)  # (peft wraps the model in place)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    H, L = TINY_MODEL["hidden_size"], TINY_MODEL["num_hidden_layers"]
    kv = H // TINY_MODEL["num_attention_heads"] * TINY_MODEL["num_key_value_heads"]
    r = 8
    # A is r x in, B is out x r, on q (H->H), k (H->kv), v (H->kv), o (H->H)
    expected_trainable = L * (r * H + H * r + 2 * (r * H + kv * r) + r * H + H * r)
    n_trainable = count_parameters(lora, trainable_only=True)
    assert n_trainable == expected_trainable == 3584
    assert count_parameters(lora) == total_before + n_trainable
    assert n_trainable < count_parameters(lora)
    lora.eval()
    with torch.no_grad():
        # B = 0 at init: the adapter adds exactly nothing
        assert torch.equal(lora(**enc).logits, before)
        for n, p in lora.named_parameters():
            if "lora_B" in n:
                p.fill_(0.5)
        # ...and it is really in the forward pass
        assert not torch.allclose(lora(**enc).logits, before)
