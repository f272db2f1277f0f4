"""An agent on a real chat model: the conversation as token ids, turn by turn, never re-tokenized.

Every other agent chapter's policy is a tiny model with a word-level tokenizer, where text and ids
map one to one. A pretrained instruct model has a BPE tokenizer and a **chat template**, and both
change what a multi-turn trainer must do:

- **The template decides which tokens are the policy's.** SmolLM2's conversation is ChatML::

      <|im_start|>system\\n...<|im_end|>\\n<|im_start|>user\\nWhat is 347 * 29? ...<|im_end|>\\n
      <|im_start|>assistant\\n```python\\nprint(347*29)\\n```<|im_end|>\\n
      <|im_start|>user\nOutput of the tool:\n10063<|im_end|>\n
      <|im_start|>assistant\n10063<|im_end|>

  The policy writes the assistant's content *and* the end-of-turn token (``<|im_end|>``: it must
  learn to stop); everything else is the template's or the tool's (``loss_mask`` 0). The tool's
  answer goes in a ``tool`` turn where the template has that role, otherwise in a user turn that
  says it is the tool's output (SmolLM2's template has no tool role).
- **Token in, token out.** Decoding the sampled conversation to text and tokenizing it again does
  not give back the sampled ids: the policy may sample a split of a word that the tokenizer would
  not produce (``pr`` + ``int`` for ``print``), and text on both sides of a turn boundary can merge
  into one token. The loss would then score tokens that were never sampled, and PPO's ratio would
  not start at 1. So the rollout (:func:`~agentic_rl.multiturn.rollout_multiturn` with
  ``chat=``) keeps the sampled ids as they are and appends each tool answer *as ids*: the
  template's closing and opening markers around the tool's text, encoded once per observation.
  :func:`retokenization_drift` measures how often the round trip would have changed the ids.

:class:`ChatFormat` reads the markers off the tokenizer's own template (it renders small
conversations and takes their differences), so nothing here is specific to ChatML.
:func:`assistant_mask_from_markers` finds the policy's tokens from the marker ids alone: an
independent derivation that the rollout's ``loss_mask`` is checked against.

**One rollout, two turn formats.** What the rollout must know about a turn's boundaries (how the
first observation is encoded, which ids end an action, what the environment gets of the sampled
ids, how an observation is appended) is a :class:`TurnFormat`: :class:`ChatFormat` for a chat
template, :class:`StopWordFormat` for the plain ``<action> ... </action>`` protocol of the tiny
word-level models. The agent loop itself never asks which one it has.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from .rollout import Batch, batch_from_ids

__all__ = [
    "TurnFormat",
    "StopWordFormat",
    "ChatFormat",
    "ChatTemplateError",
    "chat_segments_batch",
    "assistant_mask_from_markers",
    "retokenization_drift",
    "template_problem",
]

#: What a user turn that carries the tool's answer starts with, when the template has no tool role.
TOOL_PREFIX = "Output of the tool:\n"
#: Breaks a special token's string in environment text (:meth:`ChatFormat.escape_markers`).
ZERO_WIDTH_SPACE = "\u200b"
#: message content that no template alters (a word between two invisible separators)
_SENTINEL = "\u2063SENTINEL\u2063"
#: The closed exchange each observation is rendered after (:meth:`ChatFormat.observation_ids`).
_FIRST_EXCHANGE = (
    {"role": "user", "content": _SENTINEL},
    {"role": "assistant", "content": _SENTINEL},
)


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot serve a multi-turn agent (the message says why)."""


def _render(tokenizer, messages, *, generation_prompt: bool, kwargs=()) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **dict(kwargs)
    )


#: A conversation whose contents a rewriting template would change (newlines, quotes, spaces at
#: both ends, a JSON-looking line): :func:`template_problem` renders it turn by turn.
PROBE = (
    ("user", 'What is 6 * 7?\n  "Use the tool."  '),
    ("assistant", "```python\nprint(6 * 7)\n```"),
    ("tool", '  42\n{"note": "it\'s \\"quoted\\""}\n'),
    ("assistant", "42"),
)


def template_problem(tokenizer, **template_kwargs) -> str | None:
    """Why the tokenizer's chat template cannot serve token-in/token-out training, or None.

    The one property the rollout needs (TRL checks it too) is **prefix preservation**: the text
    of a conversation must be a prefix of the text of any conversation that extends it, so that
    the ids the trainer appended turn by turn are the ids the template would give the whole.
    Checked on :data:`PROBE`, one turn added at a time (with the generation prompt before each
    assistant turn). A template that raises on such a conversation (one that demands strict
    user/assistant alternation, say) is a problem too. ``template_kwargs`` go to
    ``apply_chat_template`` (``enable_thinking=False`` for Qwen3)."""
    role = "tool" if "tool" in (tokenizer.chat_template or "") else "user"
    messages = [{"role": role if r == "tool" else r, "content": c} for r, c in PROBE]
    kw = tuple(template_kwargs.items())
    pairs = []  # (a conversation's text, the text of it with one more turn)
    try:
        for k in range(1, len(messages)):  # (with the generation prompt before the policy's turn)
            opened = messages[k]["role"] == "assistant"
            before = _render(tokenizer, messages[:k], generation_prompt=opened, kwargs=kw)
            pairs.append((before, _render(tokenizer, messages[: k + 1], generation_prompt=False,
                                          kwargs=kw)))
    except Exception as err:  # jinja2's errors, and the templates' own raise_exception
        return (
            f"the template refuses a user, assistant, {role}, assistant conversation "
            f"({type(err).__name__}: {err}): it cannot carry a tool's turns as plain messages; "
            "use a template whose tool (or user) turn needs no call id and whose turns may follow "
            "one another in that order"
        )
    for before, after in pairs:
        if not after.startswith(before):
            i = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), len(after))
            what = (
                f"the template rewrites earlier turns when a turn is added (not prefix-"
                f"preserving): at character {i}, {before[i:i + 40]!r} becomes {after[i:i + 40]!r}"
            )
            if "<think>" in before + after or "enable_thinking" in tokenizer.chat_template:
                off = template_kwargs.get("enable_thinking") is False
                return what + (
                    "; it renders the assistant's <think> block only on some turns (the last "
                    "one, or those after the last user message), so an earlier turn changes once "
                    "a tool's turn follows. "
                    + ("" if off else "Try enable_thinking=False (ChatFormat.from_tokenizer(tok, "
                       "enable_thinking=False)); if that is not enough, ")
                    + "use a training template that renders every turn the same way (TRL ships "
                    "one per model family, e.g. trl/chat_templates/qwen3_training.jinja)"
                )
            return what + "; use a template that renders each turn the same whatever follows"
    return None


@runtime_checkable
class TurnFormat(Protocol):
    """The turn boundaries as the rollout (:func:`~agentic_rl.multiturn.rollout_multiturn`)
    handles them, in ids: implemented by :class:`StopWordFormat` and :class:`ChatFormat`."""

    @property
    def stop_ids(self) -> Sequence[int]:
        """The ids that end an action once its sampled tokens end with them (as EOS always
        does); empty for none."""

    def first_rows(self, texts: list[str]) -> list[list[int]]:
        """Each episode's first observation, encoded: the start of its row."""

    def split_action(self, ids: list[int]) -> tuple[list[int], bool, bool]:
        """A turn's sampled ids (its stop ids or EOS included) as ``(ids for the environment,
        closed, missing_stop)``: ``closed`` when the turn ended the way the format closes it,
        ``missing_stop`` when it ended at the token limit, neither stop ids nor EOS."""

    def observation_rows(self, observations: list[str], closed: list[bool]) -> list[list[int]]:
        """The ids appended after each turn for its observation (``closed``: that turn's flag
        from :meth:`split_action`)."""


class StopWordFormat:
    """The plain turn protocol (:class:`~agentic_rl.envs.MultiTurnEnv`): every observation ends
    with ``<action>`` and the policy closes its action with ``stop_word`` (``</action>``) or EOS.

    The environment gets the action without its stop word, or with it when ``keep_stop_word``
    (so it can tell a closed ``</code>`` from an action cut by EOS or the token limit), never
    with EOS. Every turn counts as closed: observations are plain text, encoded as they are.
    """

    def __init__(self, tokenizer, stop_word: str = "</action>", keep_stop_word: bool = False):
        self.tokenizer, self.keep_stop_word = tokenizer, keep_stop_word
        #: the stop word's ids (several with a BPE tokenizer), empty for no stop word
        self.stop_ids = (
            tokenizer(stop_word, add_special_tokens=False)["input_ids"] if stop_word else []
        )

    def first_rows(self, texts: list[str]) -> list[list[int]]:
        """The first observations with the tokenizer's special tokens (``<bos>``), in one call
        (the same ids as one call per text)."""
        return self.tokenizer(texts)["input_ids"]

    def split_action(self, ids: list[int]) -> tuple[list[int], bool, bool]:
        """``(ids without EOS or the stop word, True, missing_stop)``, the stop word kept when
        ``keep_stop_word``."""
        n = len(self.stop_ids)
        if ids[-1:] == [self.tokenizer.eos_token_id]:
            return ids[:-1], True, False
        if n and ids[-n:] == self.stop_ids:
            return (ids if self.keep_stop_word else ids[:-n]), True, False
        return ids, True, True

    def observation_rows(self, observations: list[str], closed: list[bool]) -> list[list[int]]:
        """The observations' ids, no special tokens added, in one tokenizer call."""
        return self.tokenizer(observations, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class ChatFormat:
    """The turn markers of a tokenizer's chat template, as ids, and how to encode each turn.

    Build it with :meth:`from_tokenizer`. Fields:

    - ``assistant_header``: the ids that open an assistant turn (``<|im_start|>assistant\\n``);
    - ``end_of_turn``: the id the policy emits to end its turn (``<|im_end|>``), its stop token;
    - ``tool_role``: ``"tool"`` where the template has that role, else ``"user"`` (the tool's text
      then starts with :data:`TOOL_PREFIX`);
    - ``between``, ``after``: the template's text around a tool turn's content, from the end of
      the assistant's turn to the content, and from the content to the next assistant header
      included (the sentinel's two sides). Shown, not used to encode: a template may render the
      content itself differently (``| tojson``, ``| trim``), so each observation is rendered by the
      template, as its own message (:meth:`observation_ids`).
    """

    tokenizer: object
    assistant_header: tuple[int, ...]
    end_of_turn: int
    tool_role: str
    between: str
    after: str
    #: the text of a closed first exchange, through the assistant's end-of-turn marker: each
    #: observation is rendered after it (:meth:`observation_ids`)
    history: str = ""
    #: keyword arguments for ``apply_chat_template`` (``enable_thinking=False``), as pairs
    template_kwargs: tuple = ()

    @classmethod
    def from_tokenizer(cls, tokenizer, **template_kwargs) -> "ChatFormat":
        """Read the markers off ``tokenizer.chat_template``; refuse a template or tokenizer that
        cannot serve (no template, no assistant marker, no single end-of-turn token, no pad, not
        prefix-preserving: :func:`template_problem`), saying why and what to change.
        ``template_kwargs`` go to every ``apply_chat_template`` (``enable_thinking=False``)."""
        kw = tuple(template_kwargs.items())
        render = functools.partial(_render, kwargs=kw)
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("the tokenizer has no chat template: use an instruct model")
        if tokenizer.pad_token_id is None:
            raise ChatTemplateError(
                "the tokenizer has no pad token: set tokenizer.pad_token (e.g. to its EOS token) "
                "before batching episodes of different lengths"
            )
        problem = template_problem(tokenizer, **template_kwargs)
        if problem:
            raise ChatTemplateError(problem)
        user = [{"role": "user", "content": _SENTINEL}]
        opened = render(tokenizer, user, generation_prompt=True)
        plain = render(tokenizer, user, generation_prompt=False)
        if not opened.startswith(plain) or opened == plain:
            raise ChatTemplateError(
                "the chat template has no assistant marker: add_generation_prompt adds nothing, "
                "so the policy's turn cannot be opened"
            )
        header = opened[len(plain) :]
        reply = user + [{"role": "assistant", "content": _SENTINEL}]
        closed = render(tokenizer, reply, generation_prompt=False)
        start = plain + header + _SENTINEL
        if not closed.startswith(start):
            why = "the template renders an assistant turn differently once it is closed"
            raise ChatTemplateError(why)
        tail = closed[len(start) :]  # "<|im_end|>\n": the end-of-turn marker and what follows it
        tail_ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
        if not tail_ids:
            raise ChatTemplateError("the template does not close an assistant turn with a token")
        end_of_turn = tail_ids[0]
        if end_of_turn not in tokenizer.all_special_ids:
            raise ChatTemplateError(
                f"the assistant turn ends with {tokenizer.decode([end_of_turn])!r}, not a special "
                "token: the policy could write it inside its text, and a turn would end early"
            )
        eot_text = tokenizer.decode([end_of_turn])
        tool_role = "tool" if "tool" in tokenizer.chat_template else "user"
        answered = reply + [{"role": tool_role, "content": _SENTINEL}]
        full = render(tokenizer, answered, generation_prompt=True)
        prefix = closed[: len(closed) - len(tail)] + eot_text
        if not full.startswith(prefix) or full.count(_SENTINEL) != 3:
            raise ChatTemplateError("the template rewrites earlier turns when a turn is added")
        between, after = full[len(prefix) :].split(_SENTINEL)
        if not after.endswith(header):
            why = "the template does not reopen the assistant's turn after the tool's"
            raise ChatTemplateError(why)
        ids = tokenizer(header, add_special_tokens=False)["input_ids"]
        return cls(tokenizer, tuple(ids), end_of_turn, tool_role, between, after, prefix, kw)

    # ------------------------------------------------------------------ the rollout's turns
    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The end-of-turn token ends an action (it is often the EOS, which ends one anyway)."""
        return (self.end_of_turn,)

    def first_rows(self, texts: list[str]) -> list[list[int]]:
        """Each first observation as the user's message (:meth:`prompt_ids`)."""
        return [self.prompt_ids(text) for text in texts]

    def split_action(self, ids: list[int]) -> tuple[list[int], bool, bool]:
        """``(ids without the end-of-turn token or EOS, closed, missing_stop)``: a turn is closed
        by the template's end-of-turn token only; one cut by EOS (where it is another token) or
        at the token limit gets that token from :meth:`observation_rows`."""
        if ids[-1:] == [self.end_of_turn]:
            return ids[:-1], True, False
        if ids[-1:] == [self.tokenizer.eos_token_id]:
            return ids[:-1], False, False
        return ids, False, True

    def observation_rows(self, observations: list[str], closed: list[bool]) -> list[list[int]]:
        """Each observation as the tool's turn (:meth:`observation_ids`)."""
        return [self.observation_ids(o, closed=c) for o, c in zip(observations, closed)]

    # ------------------------------------------------------------------ encoding, once per turn
    def prompt_ids(self, user_text: str) -> list[int]:
        """The conversation's opening as the model sees it: the template's system turn (its
        default), the user's message (its marker strings escaped), and the assistant's header,
        opened for the policy."""
        user = [{"role": "user", "content": self.escape_markers(user_text)}]
        text = _render(self.tokenizer, user, generation_prompt=True, kwargs=self.template_kwargs)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def escape_markers(self, text: str) -> str:
        """``text`` with every special token's string (``<|im_end|>``, ``<|im_start|>``, ...)
        broken by a zero-width space after its first character, so that encoding it gives none of
        the tokenizer's special ids. Environment text is data: a tool that prints ``<|im_end|>``
        must not end its own turn, nor open an assistant turn inside the training data. Text
        without such strings is returned unchanged (so are its ids)."""
        tok = self.tokenizer
        added = getattr(tok, "added_tokens_decoder", {}).values()
        specials = {str(s) for s in tok.all_special_tokens}
        specials |= {t.content for t in added if getattr(t, "special", False)}
        specials = [s for s in specials if len(s) > 1]  # a one-character marker cannot be broken
        while hit := next((s for s in specials if s in text), None):
            # each replacement removes one occurrence and can create none (none holds U+200B)
            text = text.replace(hit, hit[0] + ZERO_WIDTH_SPACE + hit[1:])
        return text

    def tool_text(self, observation: str) -> str:
        """The tool turn's content: the observation (its marker strings escaped), prefixed where
        the turn is a user's."""
        observation = self.escape_markers(observation)
        return observation if self.tool_role == "tool" else TOOL_PREFIX + observation

    def observation_ids(self, observation: str, *, closed: bool = True) -> list[int]:
        """What is appended after the policy's turn: the tool's message as the template renders
        it after a closed turn, through the next assistant header, encoded as one piece (as
        verl's agent loop renders each tool message). The template is asked, not copied: one that
        renders tool content with ``| tojson`` or ``| trim`` gets its own rendering. Where it
        inserts content verbatim (ChatML), this is ``between + tool text + after``.
        ``closed=False`` (the policy's turn was cut before its end-of-turn token) puts that token
        first: the template's, not the policy's."""
        message = {"role": self.tool_role, "content": self.tool_text(observation)}
        full = _render(
            self.tokenizer,
            [*_FIRST_EXCHANGE, message],
            generation_prompt=True,
            kwargs=self.template_kwargs,
        )
        if not full.startswith(self.history):
            raise ChatTemplateError(
                "the template rewrites the earlier turns when this observation is added: "
                f"{observation[:60]!r}"
            )
        ids = self.tokenizer(full[len(self.history) :], add_special_tokens=False)["input_ids"]
        return ids if closed else [self.end_of_turn, *ids]

    def conversation(self, segments: Sequence[tuple[str, bool]]) -> tuple[list[int], list[int]]:
        """A whole demonstration as ``(ids, loss_mask)``, built turn by turn exactly as the rollout
        builds an episode: ``segments`` are message contents, ``(user prompt, False)``, then the
        assistant's turns ``(text, True)`` alternating with the tool's answers ``(text, False)``.
        Each assistant turn is its text's tokens plus the end-of-turn token (mask 1)."""
        (prompt, _), *rest = segments
        ids = self.prompt_ids(prompt)
        mask = [0] * len(ids)
        for text, trainable in rest:
            if trainable:
                piece = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                piece = [*piece, self.end_of_turn]
            else:
                piece = self.observation_ids(text)
            ids += piece
            mask += [int(trainable)] * len(piece)
        return ids, mask


def chat_segments_batch(fmt: ChatFormat, rows: Sequence[Sequence[tuple[str, bool]]], device=None):
    """Teacher-forced :class:`~agentic_rl.rollout.Batch` of demonstrations in the chat template
    (:meth:`ChatFormat.conversation` per row), right-padded."""
    encoded = [fmt.conversation(segments) for segments in rows]
    return batch_from_ids(
        [ids for ids, _ in encoded], [m for _, m in encoded], fmt.tokenizer.pad_token_id, device
    )


def assistant_mask_from_markers(input_ids: torch.Tensor, attention_mask, fmt: ChatFormat):
    """``[B, T]`` bool: the assistant's tokens found from the template's marker ids alone.

    A token is the assistant's when it follows an assistant header and comes before or at the
    next end-of-turn token. Independent of the rollout's bookkeeping: on an episode whose every
    turn the policy ended itself, it must equal the ``loss_mask``. (Where a turn was cut at the
    token limit, the rollout appends the end-of-turn token for the template, with mask 0; the
    markers alone count it as the assistant's.)"""
    header = list(fmt.assistant_header)
    out = torch.zeros_like(input_ids, dtype=torch.bool)
    for r, (row, keep) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
        inside = False
        for t, token in enumerate(row):
            if not keep[t]:
                continue
            if inside:
                out[r, t] = True
                inside = token != fmt.end_of_turn
            elif t + 1 >= len(header) and row[t + 1 - len(header) : t + 1] == header:
                inside = True
    return out


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of equal values in ``mask``."""
    runs, start = [], 0
    for t in range(1, len(mask) + 1):
        if t == len(mask) or mask[t] != mask[start]:
            runs.append((start, t))
            start = t
    return runs


def retokenization_drift(batch: Batch, tokenizer) -> dict:
    """What a trainer that decodes each episode to text and tokenizes it again would get.

    Per episode, the real ids are split into turns (runs of equal ``loss_mask``: the policy's, the
    template's and tool's). Returns counts over the batch:

    - ``episodes``, ``episodes_changed``: episodes whose re-tokenized ids differ from the sampled;
    - ``turns``, ``turns_changed``: policy turns whose own text re-tokenizes differently (the
      policy sampled a split the tokenizer would not make);
    - ``boundaries``, ``boundaries_changed``: turn boundaries where the two sides' texts, joined,
      tokenize differently from each side alone (tokens merge or split across the boundary);
    - ``tokens``, ``tokens_after_drift``: real tokens, and how many of them sit at or after the
      first position where the re-tokenized ids part from the sampled ones (what the loss would
      misalign).
    """
    counts = dict.fromkeys(
        (
            "episodes",
            "episodes_changed",
            "turns",
            "turns_changed",
            "boundaries",
            "boundaries_changed",
            "tokens",
            "tokens_after_drift",
        ),
        0,
    )

    def encode(ids):
        text = tokenizer.decode(ids, skip_special_tokens=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    for row, keep, mask in zip(
        batch.input_ids.tolist(), batch.attention_mask.tolist(), batch.loss_mask.tolist()
    ):
        ids = [t for t, k in zip(row, keep) if k]
        mask = [m for m, k in zip(mask, keep) if k]
        again = encode(ids)
        counts["episodes"] += 1
        counts["tokens"] += len(ids)
        if again != ids:
            counts["episodes_changed"] += 1
            first = next((t for t, (a, b) in enumerate(zip(ids, again)) if a != b), None)
            first = min(len(ids), len(again)) if first is None else first
            counts["tokens_after_drift"] += len(ids) - first
        runs = _runs(mask)
        for k, (start, end) in enumerate(runs):
            if mask[start]:
                counts["turns"] += 1
                counts["turns_changed"] += int(encode(ids[start:end]) != ids[start:end])
            if k + 1 < len(runs):
                left, right = ids[start:end], ids[end : runs[k + 1][1]]
                counts["boundaries"] += 1
                joined = encode(left + right)
                counts["boundaries_changed"] += int(joined != encode(left) + encode(right))
    return counts
