"""Rollouts: sample completions with ``generate`` and pack them, with their scores,
into a :class:`Batch`.

Every chapter's training step reads the same Batch, so GRPO, PPO and their variants differ only in
the functions that turn a Batch into advantages and a loss. Token axis convention:
``logprobs[:, t]`` is the log-probability of ``input_ids[:, t]`` given ``input_ids[:, :t]`` (so
column 0 is always 0, and the log-prob of a token lives at the token's own position, where its
``loss_mask`` is).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from .envs.base import Problem, Task
from .losses import entropy_from_logits, token_logprobs

__all__ = [
    "Batch",
    "chat_prompt",
    "encode_prompts",
    "sequence_logprobs",
    "shared_prefix_logprobs",
    "sample_shared_prefix",
    "first_scored_column",
    "generate_batch",
    "build_segments_batch",
    "batch_from_ids",
    "build_sft_batch",
]


@dataclass
class Batch:
    """One padded tensor per field; shape ``[B, T]`` unless noted.

    - ``input_ids``, ``attention_mask``: prompt + completion, prompts left-padded, completions
      right-padded after their EOS.
    - ``loss_mask``: 1 only on tokens the policy generated (including its EOS); 0 on prompt,
      padding, and (multi-turn) environment or tool tokens.
    - ``old_logprobs``: log pi_old of each token at sampling time (at ``temperature``).
    - ``ref_logprobs``: log pi_ref, only when a KL term is used (``beta > 0``).
    - ``token_rewards``: the sequence reward placed on the last generated token, 0 elsewhere.
    - ``values``: critic values, when a critic is used (PPO chapter).
    - ``group_id`` ``[B]``: rows with the same id answer the same prompt (a GRPO group).
    - ``correct``, ``format_ok`` ``[B]`` (bool) and ``completions`` (list of str): for metrics and
      reading.
    - ``turn_ids``: multi-turn only; the turn (0, 1, ...) each generated token belongs to, -1 on
      prompt, observation and padding tokens.
    - ``extras``: per-row facts a method needs (e.g. ``success``, ``num_turns``, ``truncated``).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    token_rewards: torch.Tensor
    group_id: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    correct: torch.Tensor | None = None
    format_ok: torch.Tensor | None = None
    completions: list[str] = field(default_factory=list)
    turn_ids: torch.Tensor | None = None
    extras: dict = field(default_factory=dict)

    @property
    def scores(self) -> torch.Tensor:
        """One reward per row, ``[B]`` (the sum of its token rewards)."""
        return self.token_rewards.sum(-1)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, rows: torch.Tensor | None) -> "Batch":
        """The rows ``rows`` (an index tensor) of every per-row field: a minibatch (``None``: all
        of them, this batch itself)."""
        if rows is None:
            return self
        idx = rows.tolist()

        def take(v):
            if isinstance(v, torch.Tensor) and v.ndim > 0 and v.shape[0] == len(self):
                return v[rows.to(v.device)]
            if isinstance(v, list) and len(v) == len(self):
                return [v[i] for i in idx]
            return v

        picked = {f.name: take(getattr(self, f.name)) for f in fields(self) if f.name != "extras"}
        return Batch(**picked, extras={k: take(v) for k, v in self.extras.items()})

    @staticmethod
    def take(values: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """The rows ``rows`` of a per-row tensor beside a batch (advantages), as :meth:`select`
        takes them (``None``: all, the tensor itself)."""
        return values if rows is None else values[rows]

    @staticmethod
    def cat(batches: list["Batch"], pad_token_id: int) -> "Batch":
        """The rows of several batches in one: ``[B, T]`` fields right-padded to the widest
        (``pad_token_id`` in ``input_ids``, -1 in ``turn_ids``, 0 elsewhere), the rest joined."""
        width = max(b.input_ids.shape[1] for b in batches)

        def join(parts, name):
            if parts[0] is None:
                return None
            if isinstance(parts[0], list):
                return [x for p in parts for x in p]
            if parts[0].dim() == 2:
                fill = {"input_ids": pad_token_id, "turn_ids": -1}.get(name, 0)
                parts = [
                    torch.nn.functional.pad(p, (0, width - p.shape[1]), value=fill) for p in parts
                ]
            return torch.cat(parts, 0)

        joined = {
            f.name: join([getattr(b, f.name) for b in batches], f.name)
            for f in fields(Batch)
            if f.name != "extras"
        }
        extras = {k: join([b.extras[k] for b in batches], k) for k in batches[0].extras}
        return Batch(**joined, extras=extras)

    def to(self, device) -> "Batch":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in moved.items():
            if isinstance(v, torch.Tensor):
                moved[k] = v.to(device)
        return Batch(**moved)


def chat_prompt(tokenizer, prompt: str) -> str:
    """``prompt`` as the user's turn of the tokenizer's chat template, with the assistant's turn
    opened: the text an instruct model was trained to continue (its default system turn
    included, when its template adds one)."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompts(
    tokenizer, prompts: list[str], device=None, *, add_special_tokens: bool = True
) -> dict[str, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` for a list of prompt strings
    (``add_special_tokens=False`` for text that a chat template already framed)."""
    enc = tokenizer(
        prompts, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens
    )
    return {
        "input_ids": enc["input_ids"].to(device),
        "attention_mask": enc["attention_mask"].to(device),
    }


def _position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    # Positions count only real tokens, so a left-padded prompt sees the same positions as unpadded:
    # the same rule ``generate`` uses, so training log-probs match sampling log-probs exactly.
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sequence_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    with_logits: bool = False,
    start: int = 1,
    entropy_grad: bool = True,
):
    """Per-token log-probs ``[B, T]`` (column 0 is 0) of ``input_ids`` under ``model``
    at ``temperature``.

    With ``with_entropy=True`` also returns the entropy ``[B, T]`` of the distribution each token
    was drawn from (without a gradient if ``entropy_grad=False``: for logging only); with
    ``with_logits=True`` also (last) the model's raw logits (column ``t`` predicts token
    ``t + 1``), for a loss that reads other tokens from the same forward pass (GCD's judgement).
    ``start``: only columns ``>= start`` are computed, the others are 0. Pass the first column a
    loss can see (:func:`first_scored_column`) to skip the prompt's logits: on a pretrained model
    the LM head over a 49k-word vocabulary, and the softmaxes after it, cost as much as the whole
    transformer. Gradients flow unless called under ``torch.no_grad()``.
    """
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=_position_ids(attention_mask),
        logits_to_keep=input_ids.shape[1] - start + 1,  # the logits at columns start-1 .. T-1
    )
    logits = out.logits[:, :-1] / temperature  # column start-1+j predicts token start+j
    logp = token_logprobs(logits, input_ids[:, start:])
    logp = torch.nn.functional.pad(logp, (start, 0), value=0.0)
    results = (logp,)
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits)
        results += (torch.nn.functional.pad(entropy, (start, 0), value=0.0),)
    if with_logits:
        results += (out.logits,)
    return results[0] if len(results) == 1 else results


def shared_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int):
    """Which rows share their first ``prompt_len`` columns with the row before them: the index
    ``[B]`` of each row's prompt among the distinct consecutive prompts, and the number of those.
    A GRPO batch is ``G`` copies of each prompt in a row (:func:`generate_batch`)."""
    head = torch.cat([input_ids[:, :prompt_len], attention_mask[:, :prompt_len]], dim=1)
    new = torch.ones(len(head), dtype=torch.bool, device=head.device)
    new[1:] = (head[1:] != head[:-1]).any(1)  # a row starts a new prompt when its head differs
    return new.cumsum(0) - 1, int(new.sum())


def shared_prefix_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    prompt_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
):
    """:func:`sequence_logprobs` (with ``start=prompt_len``) for rows that come in runs sharing one
    prompt, each prompt encoded once: the fast path beside the plain one, equal to it up to float
    summation order (``tests/test_speed.py``).

    A GRPO batch holds each prompt ``G`` times. The plain pass runs the transformer over all
    ``B x T`` tokens; this one runs it over the ``B / G`` distinct prompts, keeps their keys and
    values (with their gradients), hands each row its prompt's copy, and runs the completions on
    top, as :meth:`generate` does with its KV cache. The gradient reaching a prompt's keys and
    values is the sum over its ``G`` completions, as in the plain pass. On the quick profile
    (7-token prompts, 8-token completions, G = 8) the transformer sees 41 % fewer tokens.
    """
    index, n_prompts = shared_prompts(input_ids, attention_mask, prompt_len)
    first = torch.zeros(n_prompts, dtype=torch.long, device=input_ids.device)
    first[index.flip(0)] = torch.arange(len(index) - 1, -1, -1, device=input_ids.device)
    positions = _position_ids(attention_mask)
    head_mask = attention_mask[first, :prompt_len]
    head = model(  # each distinct prompt once; its last logits predict the first completion token
        input_ids=input_ids[first, :prompt_len],
        attention_mask=head_mask,
        position_ids=positions[first, :prompt_len],
        use_cache=True,
        logits_to_keep=1,
    )
    cache = head.past_key_values
    cache.batch_select_indices(
        index
    )  # row i gets its prompt's keys and values (a differentiable copy)
    logits = head.logits[index]  # column prompt_len - 1 + j predicts token prompt_len + j
    if input_ids.shape[1] - 1 > prompt_len:
        tail = model(  # the completions, attending to their prompt through the cache
            input_ids=input_ids[:, prompt_len:-1],
            attention_mask=attention_mask[:, :-1],
            position_ids=positions[:, prompt_len:-1],
            past_key_values=cache,
            use_cache=True,
        )
        logits = torch.cat([logits, tail.logits], dim=1)
    logits = logits / temperature
    logp = token_logprobs(logits, input_ids[:, prompt_len:])
    results = (torch.nn.functional.pad(logp, (prompt_len, 0), value=0.0),)
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = entropy_from_logits(logits)
        results += (torch.nn.functional.pad(entropy, (prompt_len, 0), value=0.0),)
    return results[0] if len(results) == 1 else results


@torch.no_grad()
def sample_shared_prefix(
    model,
    enc: dict[str, torch.Tensor],
    *,
    num_generations: int,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    temperature: float = 1.0,
    greedy: bool = False,
) -> torch.Tensor:
    """``model.generate`` for ``num_generations`` samples of each distinct prompt in ``enc``
    (left-padded), each prompt encoded once: the fast path beside ``generate``, the same sampler
    (softmax at ``temperature``, one ``torch.multinomial`` draw per step, no top-k/top-p; greedy:
    argmax) with the prompt's keys and values shared by its ``G`` rows. Returns ``[B, P + L]``
    like ``generate``: pad after a row's EOS, and it stops once every row has ended.
    """
    prompt_mask = enc["attention_mask"]
    out = model(
        input_ids=enc["input_ids"],
        attention_mask=prompt_mask,
        position_ids=_position_ids(prompt_mask),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.past_key_values
    cache.batch_repeat_interleave(num_generations)
    logits = out.logits[:, -1].repeat_interleave(num_generations, dim=0)
    mask = prompt_mask.repeat_interleave(num_generations, dim=0)
    position = mask.sum(1, keepdim=True)  # the next token's position (positions count real tokens)
    tokens, done = [], torch.zeros(len(mask), dtype=torch.bool, device=mask.device)
    ones = torch.ones_like(mask[:, :1])
    for step in range(max_new_tokens):
        if greedy:
            token = logits.argmax(-1)
        else:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            token = torch.multinomial(probs, num_samples=1).squeeze(1)
        token = token.masked_fill(done, pad_token_id)  # a finished row only pads
        tokens.append(token)
        done |= token == eos_token_id
        if step + 1 == max_new_tokens or bool(done.all()):
            break
        mask = torch.cat([mask, ones], dim=1)
        logits = model(
            input_ids=token[:, None],
            attention_mask=mask,
            position_ids=position + step,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
    prompt_ids = enc["input_ids"].repeat_interleave(num_generations, dim=0)
    return torch.cat([prompt_ids, torch.stack(tokens, dim=1)], dim=1)


def first_scored_column(loss_mask: torch.Tensor) -> int:
    """The first column where any row's ``loss_mask`` is 1 (at least 1): everything before it is
    prompt, for every row, so its log-probs are never needed."""
    scored = loss_mask.any(0).nonzero()
    return max(1, int(scored[0])) if len(scored) else 1


def _completion_mask(
    completion_ids: torch.Tensor, eos_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """1 on completion tokens up to and including the first EOS; and whether each row hit no EOS."""
    is_eos = completion_ids == eos_token_id
    # position of the first EOS, or the full width when there is none (a truncated completion)
    width = completion_ids.shape[1]
    first_eos = torch.where(
        is_eos.any(1),
        is_eos.int().argmax(1),
        torch.full_like(is_eos[:, 0], width, dtype=torch.long),
    )
    idx = torch.arange(width, device=completion_ids.device).unsqueeze(0)
    mask = (idx <= first_eos.unsqueeze(1)).long()
    truncated = ~is_eos.any(1)
    return mask, truncated


def _sample(
    model, tokenizer, texts, device, *, num_generations, max_completion_length, temperature,
    greedy, chat, share_prompt_prefix,
) -> tuple[dict, torch.Tensor]:
    """The prompts, encoded once per row (``G`` rows each), and the sampled sequences (prompt
    columns first): ``generate``, or each prompt encoded once with ``share_prompt_prefix``."""
    gen_kwargs = dict(
        max_new_tokens=max_completion_length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if share_prompt_prefix:  # the fast path: each prompt encoded once
        enc = encode_prompts(tokenizer, texts, device, add_special_tokens=not chat)
        sequences = sample_shared_prefix(
            model, enc, num_generations=num_generations, temperature=temperature, greedy=greedy,
            **gen_kwargs,
        )  # fmt: skip
        enc = {k: v.repeat_interleave(num_generations, dim=0) for k, v in enc.items()}
        return enc, sequences
    prompts = [t for t in texts for _ in range(num_generations)]
    enc = encode_prompts(tokenizer, prompts, device, add_special_tokens=not chat)
    if greedy:
        gen_kwargs.update(do_sample=False)
    else:
        gen_kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    return enc, model.generate(**enc, **gen_kwargs)


def _score(task, tokenizer, problems, completion_ids, completion_mask, truncated, group_size):
    """Each completion's text and the task's score of it (``problems[i // group_size]``)."""
    # Score the text of the generated tokens before EOS, special tokens included: a completion that
    # sampled "<pad>" or "<bos>" in the middle of its answer is malformed, not silently cleaned up.
    content_mask = completion_mask.clone()
    ended = ~truncated
    content_mask[ended.nonzero().squeeze(1), completion_mask[ended].sum(1) - 1] = 0
    texts = [
        tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=False)
        for row, m in zip(completion_ids, content_mask)
    ]
    scores = [
        task.score(problems[i // group_size], texts[i], truncated=bool(truncated[i]))
        for i in range(len(texts))
    ]
    return texts, scores


@torch.no_grad()
def generate_batch(
    model,
    tokenizer,
    task: Task,
    problems: list[Problem],
    *,
    num_generations: int = 1,
    max_completion_length: int = 8,
    temperature: float = 1.0,
    greedy: bool = False,
    ref_model=None,
    compute_old_logprobs: bool = True,
    chat: bool = False,
    share_prompt_prefix: bool = False,
) -> Batch:
    """Sample ``num_generations`` completions per problem and score them into a Batch.

    Rows ``i*G .. i*G+G-1`` answer ``problems[i]`` and share ``group_id == i``. Sampling is plain
    ancestral sampling at ``temperature`` (no top-k/top-p), with the KV cache on. A completion that
    hits ``max_completion_length`` without EOS is *truncated*: all its tokens stay in ``loss_mask``
    and the task scores it as a format failure. With ``chat=True`` each prompt is sent as a user
    turn of the model's chat template (:func:`chat_prompt`); the template's tokens, like every
    prompt token, get ``loss_mask`` 0. With ``share_prompt_prefix=True`` each prompt is encoded
    once for its ``G`` samples (:func:`sample_shared_prefix`, :func:`shared_prefix_logprobs`):
    the same sampler and random draws as ``generate``, with log-probs equal up to float
    summation order (so a token can differ only where a draw falls within that of a boundary).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    texts = [chat_prompt(tokenizer, p.prompt) if chat else p.prompt for p in problems]
    enc, sequences = _sample(
        model, tokenizer, texts, device, num_generations=num_generations,
        max_completion_length=max_completion_length, temperature=temperature, greedy=greedy,
        chat=chat, share_prompt_prefix=share_prompt_prefix,
    )  # fmt: skip
    prompt_len = enc["input_ids"].shape[1]
    completion_ids = sequences[:, prompt_len:]
    completion_mask, truncated = _completion_mask(completion_ids, tokenizer.eos_token_id)
    completion_ids = torch.where(
        completion_mask.bool(),
        completion_ids,
        torch.full_like(completion_ids, tokenizer.pad_token_id),
    )
    input_ids = torch.cat([enc["input_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([enc["attention_mask"], completion_mask], dim=1)
    loss_mask = torch.cat([torch.zeros_like(enc["attention_mask"]), completion_mask], dim=1)
    texts, scores = _score(
        task, tokenizer, problems, completion_ids, completion_mask, truncated, num_generations
    )
    rewards = torch.tensor([s.reward for s in scores], dtype=torch.float32, device=device)
    # The sequence reward sits on the last generated token
    # (the EOS, or the last token if truncated).
    last = prompt_len + completion_mask.sum(1) - 1
    token_rewards = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
    token_rewards[torch.arange(len(texts), device=device), last] = rewards

    batch = Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        token_rewards=token_rewards,
        group_id=torch.arange(len(problems), device=device).repeat_interleave(num_generations),
        correct=torch.tensor([s.correct for s in scores], device=device),
        format_ok=torch.tensor([s.format_ok for s in scores], device=device),
        completions=texts,
        extras={"truncated": truncated},  # no EOS within max_completion_length
    )

    logprobs = shared_prefix_logprobs if share_prompt_prefix else sequence_logprobs
    kwargs = dict(prompt_len=prompt_len) if share_prompt_prefix else dict(start=prompt_len)
    old = model if compute_old_logprobs else None
    for name, m in (("old_logprobs", old), ("ref_logprobs", ref_model)):
        if m is not None:
            lp = logprobs(m, input_ids, attention_mask, temperature=temperature, **kwargs)
            setattr(batch, name, lp * loss_mask)
    model.train(was_training)
    return batch


def build_segments_batch(tokenizer, rows: list[list[tuple[str, bool]]], device=None) -> Batch:
    """Teacher-forced batch from text segments:
    ``rows[i]`` is a list of ``(text, trainable)`` pieces.

    The first segment of a row is encoded with the tokenizer's special tokens (BOS), the others
    without; ``loss_mask`` is 1 exactly on the tokens of trainable segments. A multi-turn
    demonstration is ``[(obs_0, False), (action_0, True), (obs_1, False), ...]``; a single-turn one
    is ``[(prompt, False), (completion + EOS, True)]``. Rows are right-padded (teacher forcing needs
    no left alignment, and positions then start at 0 for every row).
    """
    ids_rows, mask_rows = [], []
    for segments in rows:
        ids, mask = [], []
        for k, (text, trainable) in enumerate(segments):
            piece = tokenizer(text, add_special_tokens=(k == 0))["input_ids"]
            ids += piece
            mask += [int(trainable)] * len(piece)
        ids_rows.append(ids)
        mask_rows.append(mask)
    return batch_from_ids(ids_rows, mask_rows, tokenizer.pad_token_id, device)


def batch_from_ids(ids_rows: list[list[int]], mask_rows: list[list[int]], pad: int, device=None):
    """Teacher-forced :class:`Batch` from token ids and their ``loss_mask``, one list per row;
    rows are right-padded (positions then start at 0 for every row)."""
    width = max(len(r) for r in ids_rows)
    input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in ids_rows], device=device)
    attention_mask = torch.tensor(
        [[1] * len(r) + [0] * (width - len(r)) for r in ids_rows], device=device
    )
    loss_mask = torch.tensor([m + [0] * (width - len(m)) for m in mask_rows], device=device)
    zeros = torch.zeros(input_ids.shape, dtype=torch.float32, device=device)
    return Batch(
        input_ids, attention_mask, loss_mask, zeros, torch.arange(len(ids_rows), device=device)
    )


def build_sft_batch(tokenizer, prompts: list[str], completions: list[str], device=None) -> Batch:
    """Teacher-forced batch: prompt + completion + EOS,
    with ``loss_mask`` on the completion and EOS only."""
    eos = tokenizer.eos_token
    return build_segments_batch(
        tokenizer,
        [[(p, False), (f"{c} {eos}", True)] for p, c in zip(prompts, completions)],
        device,
    )
