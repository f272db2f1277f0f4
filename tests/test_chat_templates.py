"""Real chat templates swapped onto SmolLM2's tokenizer: what ``ChatFormat`` serves and refuses.

The templates are verbatim copies (``tests/data/chat_templates/SOURCES.md``); the tokenizer gets
each template's special tokens, so no model is needed. For every template ``ChatFormat`` accepts,
a multi-turn tool episode built turn by turn as the rollout builds it (:meth:`ChatFormat
.conversation`) must be, id for id, the template's own rendering of the same messages, and its
``loss_mask`` the assistant tokens found from the markers alone. A template that cannot serve is
refused before any compute, with what it rewrites and what to do.
"""

from __future__ import annotations

import copy
import pathlib
import re

import pytest
import torch

from agentic_rl.chat import (
    ChatFormat,
    ChatTemplateError,
    assistant_mask_from_markers,
    template_problem,
)
from agentic_rl.models import load_pretrained

TEMPLATES = pathlib.Path(__file__).parent / "data" / "chat_templates"
#: A tool episode with the contents a rewriting template would change.
EPISODE = (
    ("What is 347 * 29?\nUse the tool.", False),
    ("```python\nprint(347 * 29)\n```", True),
    ('10063\n"done" \'ok\'\n  indented', False),
    ("```python\nprint(10063 + 1)\n```", True),
    ("10064", False),
    ("10063", True),
)


@pytest.fixture(scope="module")
def smollm2():
    return load_pretrained("smollm2-135m-instruct")[1]


def _with_template(tokenizer, name: str):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    # the template's markers as special tokens of their own (the real tokenizers have them)
    markers = set(re.findall(r"<\|[a-z_]+\|>|<(?:start|end)_of_turn>|\[/?[A-Z_]+\]",
                             tok.chat_template))
    new = sorted(m for m in markers if m not in tok.get_vocab())
    if new:
        tok.add_special_tokens({"additional_special_tokens": new})
    return tok


def _messages(fmt: ChatFormat):
    out = []
    for k, (text, policy) in enumerate(EPISODE):
        role = "assistant" if policy else ("user" if k == 0 else fmt.tool_role)
        out.append({"role": role, "content": text if policy or k == 0 else fmt.tool_text(text)})
    return out


def _template_ids(tok, fmt: ChatFormat, text: str) -> tuple[list[int], list[int]]:
    """The template's rendering of the whole episode, cut at the assistant's contents (each
    followed by its end-of-turn marker) and encoded piece by piece, as the policy samples its own
    turns: an independent derivation of the rollout's ids and mask."""
    eot = tok.decode([fmt.end_of_turn])
    ids, mask, at = [], [], 0
    for content, policy in EPISODE:
        if not policy:
            continue
        start = text.index(content + eot, at)
        piece = tok(text[at:start], add_special_tokens=False)["input_ids"]
        turn = tok(content, add_special_tokens=False)["input_ids"] + [fmt.end_of_turn]
        ids, mask, at = ids + piece + turn, mask + [0] * len(piece) + [1] * len(turn), start
        at += len(content + eot)
    return ids, mask


def _check_episode(tok, fmt: ChatFormat, **kwargs):
    ids, mask = fmt.conversation(EPISODE)
    text = tok.apply_chat_template(_messages(fmt), tokenize=False, **kwargs)
    assert (ids, mask) == _template_ids(tok, fmt, text), tok.decode(ids) + "\n---\n" + text
    assert text.startswith(tok.decode(ids))  # the same text, not only the same ids
    row = torch.tensor([ids])
    found = assistant_mask_from_markers(row, torch.ones_like(row), fmt)
    assert found[0].long().tolist() == mask
    assert sum(mask) == sum(len(tok(t, add_special_tokens=False)["input_ids"]) + 1
                            for t, policy in EPISODE if policy)


def test_chatml_and_qwen25_serve_tool_episodes_id_for_id(smollm2):
    _check_episode(smollm2, ChatFormat.from_tokenizer(smollm2))
    tok = _with_template(smollm2, "qwen2.5")
    fmt = ChatFormat.from_tokenizer(tok)
    assert fmt.tool_role == "tool"
    _check_episode(tok, fmt)


def test_llama31_renders_tool_content_as_json_and_is_followed(smollm2):
    tok = _with_template(smollm2, "llama3.1")
    fmt = ChatFormat.from_tokenizer(tok)
    tool = tok.decode(fmt.observation_ids('10063\n"done"'))
    assert '"10063\\n\\"done\\""' in tool  # | tojson: the template's rendering, not verbatim
    _check_episode(tok, fmt)


def test_qwen3_thinking_is_refused_with_what_to_do(smollm2):
    tok = _with_template(smollm2, "qwen3")
    problem = template_problem(tok)
    assert problem and "prefix" in problem and "enable_thinking" in problem
    with pytest.raises(ChatTemplateError, match="think"):
        ChatFormat.from_tokenizer(tok)


def test_qwen3_with_thinking_off_needs_trls_training_template(smollm2):
    """Qwen3's own template renders the empty <think> block on the last assistant turn only,
    thinking off or on: an earlier turn changes once a tool's turn follows. TRL's training
    template keeps the block on every turn; with it, the episode is the template's, id for id."""
    tok = _with_template(smollm2, "qwen3")
    problem = template_problem(tok, enable_thinking=False)
    assert problem and "qwen3_training.jinja" in problem and "Try enable_thinking" not in problem
    tok = _with_template(smollm2, "qwen3_training")
    fmt = ChatFormat.from_tokenizer(tok, enable_thinking=False)
    assert "<think>" in tok.decode(list(fmt.assistant_header))  # the template's, not the policy's
    _check_episode(tok, fmt, enable_thinking=False)


def test_gemma_alternates_with_the_tool_output_in_a_user_turn(smollm2):
    tok = _with_template(smollm2, "gemma")
    fmt = ChatFormat.from_tokenizer(tok)
    assert fmt.tool_role == "user"  # no tool role: the roles still alternate
    _check_episode(tok, fmt)


def test_mistral_is_refused_with_its_reason(smollm2):
    tok = _with_template(smollm2, "mistral")
    with pytest.raises(ChatTemplateError, match="call id|Tool call IDs"):
        ChatFormat.from_tokenizer(tok)
    user = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True) == (
        tok.apply_chat_template(user, tokenize=False))  # and no assistant marker to open a turn
