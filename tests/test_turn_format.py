"""The rollout's two turn formats (``agentic_rl.chat``): what the environment gets of a turn's
sampled ids, when a turn counts as closed, and how observations are encoded.

:class:`StopWordFormat` is the plain ``<action> ... </action>`` protocol; :class:`ChatFormat` is a
chat template's, here on a word-level tokenizer whose template ChatFormat accepts, with an
end-of-turn token (``<|im_end|>``) that is not its EOS (``<eos>``), so the two can be told apart.
"""

from __future__ import annotations

import pytest
import torch

from agentic_rl.chat import ChatFormat, StopWordFormat, TurnFormat, assistant_mask_from_markers
from agentic_rl.models import build_model, build_tokenizer
from agentic_rl.multiturn import rollout_multiturn

WORDS = ["a", "b", "left", "right", "<action>", "</action>", "Output", "of", "the", "tool:"]
#: ChatML with words split by spaces (the end-of-turn token, a special token, needs none)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
TINY = {
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "intermediate_size": 64,
}  # fmt: skip


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(WORDS)


@pytest.fixture(scope="module")
def chat(tok):
    chat_tok = build_tokenizer(WORDS)
    chat_tok.chat_template = CHAT_TEMPLATE
    return ChatFormat.from_tokenizer(chat_tok)


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_both_formats_are_turn_formats(tok, chat):
    assert isinstance(StopWordFormat(tok), TurnFormat)
    assert isinstance(chat, TurnFormat)


# ---------------------------------------------------------------- the plain stop-word protocol
def test_the_stop_word_format_strips_the_stop_word_and_reports_a_missing_one(tok):
    fmt = StopWordFormat(tok, "</action>")
    action, stop, eos = _ids(tok, "left right"), _ids(tok, "</action>"), tok.eos_token_id
    assert fmt.stop_ids == stop and len(stop) == 1
    assert fmt.split_action(action + stop) == (action, True, False)
    assert fmt.split_action(action + [eos]) == (action, True, False)  # EOS ends an action too
    # cut at the token limit: the env gets all of it, and the stop word is reported missing
    assert fmt.split_action(action) == (action, True, True)
    assert fmt.split_action(stop + action) == (stop + action, True, True)  # only at the end
    kept = StopWordFormat(tok, "</action>", keep_stop_word=True)
    assert kept.split_action(action + stop) == (action + stop, True, False)
    assert kept.split_action(action + [eos]) == (action, True, False)  # never EOS for the env
    assert kept.split_action(action) == (action, True, True)


def test_a_stop_word_of_several_tokens_counts_only_whole(tok):
    fmt = StopWordFormat(tok, "</action> </action>")
    action, stop = _ids(tok, "a b"), _ids(tok, "</action>")
    assert fmt.stop_ids == stop + stop
    assert fmt.split_action(action + stop + stop) == (action, True, False)
    assert fmt.split_action(action + stop) == (action + stop, True, True)  # half of it
    # no stop word: only EOS ends an action
    none = StopWordFormat(tok, "")
    assert none.stop_ids == []
    assert none.split_action(action + stop) == (action + stop, True, True)
    assert none.split_action(action + [tok.eos_token_id]) == (action, True, False)


def test_the_stop_word_format_encodes_plain_text(tok):
    fmt = StopWordFormat(tok)
    texts = ["pos a <action>", "b"]
    first = fmt.first_rows(texts)
    assert first == tok(texts)["input_ids"] and all(r[0] == tok.bos_token_id for r in first)
    # observations: no <bos>, and every turn counts as closed (the flag changes nothing)
    rows = fmt.observation_rows(["a b <action>", "left"], [True, False])
    assert rows == [_ids(tok, "a b <action>"), _ids(tok, "left")]
    assert rows == fmt.observation_rows(["a b <action>", "left"], [False, True])


# ---------------------------------------------------------------- a chat template
def test_the_chat_format_closes_a_turn_only_at_the_end_of_turn_token(chat):
    tok = chat.tokenizer
    eot, eos = chat.end_of_turn, tok.eos_token_id
    assert tok.convert_ids_to_tokens(eot) == "<|im_end|>" and eot != eos
    assert tuple(chat.stop_ids) == (eot,)
    action = _ids(tok, "left right")
    assert chat.split_action(action + [eot]) == (action, True, False)
    # EOS ends the action without closing the turn (the template's token is then missing)
    assert chat.split_action(action + [eos]) == (action, False, False)
    assert chat.split_action(action) == (action, False, True)  # cut at the token limit
    stop = _ids(tok, "</action>")  # a stop word means nothing in a chat turn
    assert chat.split_action(action + stop) == (action + stop, False, True)


def test_the_chat_format_encodes_turns_in_the_template(chat):
    tok = chat.tokenizer
    first = chat.first_rows(["a b", "left"])
    assert first == [chat.prompt_ids("a b"), chat.prompt_ids("left")]
    assert tok.convert_ids_to_tokens(first[0]) == [
        "<|im_start|>", "user", "a", "b", "<|im_end|>", "<|im_start|>", "assistant",
    ]  # fmt: skip
    closed, cut = chat.observation_rows(["a", "a"], [True, False])
    assert closed == chat.observation_ids("a")
    assert cut == [chat.end_of_turn, *closed]  # the template's end-of-turn token, added
    assert tok.convert_ids_to_tokens(closed) == [
        "<|im_start|>", "user", "Output", "of", "the", "tool:", "a", "<|im_end|>",
        "<|im_start|>", "assistant",
    ]  # fmt: skip


class _Echo:
    """Answers every action with ``b``; records what it got."""

    max_turns = 3

    def reset(self, seed):
        self.t, self.received = 0, []
        return "a"

    def step(self, text):
        self.t += 1
        self.received.append(text)
        return "b", 0.0, self.t >= self.max_turns, {}


class _Biased(torch.nn.Module):
    def __init__(self, model, bias):
        super().__init__()
        self.model, self.config = model, model.config
        self.register_buffer("bias", bias)

    def forward(self, **kwargs):
        out = self.model(**kwargs)
        out.logits = out.logits + self.bias
        return out


def test_a_chat_turn_cut_by_eos_gets_the_templates_end_of_turn_token(chat):
    """Through the rollout: an EOS ends the action (sampled, loss 1) and the template's
    end-of-turn token follows it with loss 0; a sampled end-of-turn token is not doubled."""
    tok = chat.tokenizer
    eot, eos = chat.end_of_turn, tok.eos_token_id
    bias = torch.zeros(len(tok))
    bias[[eot, eos, tok.convert_tokens_to_ids("left")]] = 3.0
    policy = _Biased(build_model(tok, seed=0, **TINY), bias)
    envs = [_Echo() for _ in range(8)]
    torch.manual_seed(0)
    batch = rollout_multiturn(policy, tok, envs, list(range(8)), max_action_tokens=3, chat=chat)
    ids, loss = batch.input_ids, batch.loss_mask.bool()
    # the observation after a turn starts right after its action's last sampled token
    after = torch.zeros_like(loss)
    after[:, 1:] = loss[:, :-1] & ~loss[:, 1:] & batch.attention_mask[:, 1:].bool()
    by_eos = after & torch.roll(ids == eos, 1, dims=1)
    by_eot = after & torch.roll(ids == eot, 1, dims=1)
    assert by_eos.any() and by_eot.any()  # both endings occur with this seed
    assert (ids[by_eos] == eot).all()  # the template's token, not the policy's
    assert not (ids[by_eot] == eot).any()
    assert not (~loss & (ids == eos)).any()  # EOS only where the policy sampled it
    # the markers imply the loss mask, except on the end-of-turn tokens the format added
    found = assistant_mask_from_markers(ids, batch.attention_mask, chat)
    assert ((found != loss) == (found & ~loss)).all() and (ids[found & ~loss] == eot).all()
    for env in envs:  # the environment never sees either token
        assert not any("<eos>" in t or "<|im_end|>" in t for t in env.received)
