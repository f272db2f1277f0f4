"""The multi-turn agent loop: the policy acts, the environment answers, for many episodes at once.

One row of the batch is one episode of one environment object. The context of a row grows turn by
turn::

    <bos> obs_0 ... <action>  a_0 ... </action>  obs_1 ... <action>  a_1 ... </action>  ...
    '------ loss 0 --------'  '--- loss 1 ---'   '---- loss 0 ----'  '--- loss 1 ---'

Every observation ends with the opening tag ``<action>`` (the :class:`~agentic_rl.envs.MultiTurnEnv`
turn protocol); the policy writes its action and closes it with the stop word ``</action>``. Only
the tokens the policy sampled (stop word or EOS included) get ``loss_mask`` 1; the environment's
tokens stay in the context with mask 0, the ReTool/RAGEN rule (``reference/algorithms.md`` §0).

**Batching and the KV cache.** All running episodes advance together, one token per forward pass,
and one :class:`transformers.DynamicCache` holds the keys and values of the whole batch across
turns, so each forward feeds only the new tokens (a sampled token, or a turn's observation chunk).
Rows that must not advance (their episode is over, or their action already ended this turn) are fed
the pad token with attention mask 0, and observation chunks of different lengths are left-padded
with masked pads, so the rows stay aligned. Inside the loop a row therefore looks like
``real real pad pad real real pad ...``; positions count only real tokens (the cumulative attention
mask, as ``rollout._position_ids``), so a token sees exactly the context and position it has in the
final batch, where the masked pads are removed ("compaction") and rows are right-padded. That is why
the log-probs recorded while sampling equal :func:`~agentic_rl.rollout.sequence_logprobs` on the
returned batch (the test of this module), and why PPO's ratio starts at exactly 1.

``reuse_cache=False`` is the naive baseline: at the start of every turn it drops the cache and
re-encodes the whole history. It samples the same tokens; only the speed differs
(``benchmarks/bench_multiturn.py``).

**What a decoding step costs.** On the benchmark (quick-profile model, 64 episodes, 8 turns, one
CPU thread) the model's forward passes are ~80 % of the cached loop's time, so the loop around them
is kept lean, without changing a single number the model sees: the history and the KV cache live
in preallocated storage that doubles when full (:class:`_Buffer`, :class:`_GrowingLayer`: an
append writes in place instead of ``torch.cat``-ing everything so far at every token), position ids
are kept incrementally, the end of an action (EOS, stop word) is detected on tensors, and the
tokenizer is called once per turn for the whole batch (observations in, actions out) instead of
once per row. The samples and log-probs stay bit-identical to those of the plain ``torch.cat``,
per-row version this replaced (checked on the recipes' rollouts; ``tests/test_multiturn.py``
compares the cache with transformers' own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .chat import StopWordFormat
from .rollout import Batch, sequence_logprobs

__all__ = ["rollout_multiturn", "environment_tokens", "unmask_environment_tokens"]


class _Buffer:
    """The batch's padded token history, ``[B, width]`` per field, grown column chunk by column
    chunk.

    The fields live in preallocated ``[B, capacity]`` storage that doubles when full, so appending a
    column writes in place instead of copying the whole history (as ``torch.cat`` would) at every
    decoding step. ``pos`` holds each column's position id, kept incrementally from the count of
    real tokens per row: the same numbers as ``rollout._position_ids`` over the whole buffer.
    """

    #: each field and the value its unwritten columns hold
    _FILL: ClassVar[dict[str, int | float]] = {
        "ids": 0,
        "attn": 0,
        "pos": 0,
        "loss": 0,
        "turn": -1,
        "logp": 0.0,
        "reward": 0.0,
    }

    def __init__(self, batch: int, capacity: int, device):
        self.width = 0
        self.count = torch.zeros(batch, dtype=torch.long, device=device)  # real tokens per row
        self._store = {
            name: torch.full(
                (batch, max(capacity, 1)),
                fill,
                dtype=torch.float32 if isinstance(fill, float) else torch.long,
                device=device,
            )
            for name, fill in self._FILL.items()
        }

    def _view(name: str):  # a field's filled columns, a view of its storage
        return property(lambda self: self._store[name][:, : self.width])

    ids, attn, pos = _view("ids"), _view("attn"), _view("pos")
    loss, turn, logp, reward = _view("loss"), _view("turn"), _view("logp"), _view("reward")
    del _view

    @property
    def capacity(self) -> int:
        return self._store["ids"].shape[1]

    def _reserve(self, width: int) -> None:
        capacity = self.capacity
        if width <= capacity:
            return
        capacity = max(width, 2 * capacity)
        for name, old in self._store.items():
            new = torch.full(
                (old.shape[0], capacity), self._FILL[name], dtype=old.dtype, device=old.device
            )
            new[:, : self.width] = old[:, : self.width]
            self._store[name] = new

    def append(self, ids, attn, loss=None, turn=None, logp=None) -> int:
        """Write ``ids.shape[1]`` new columns (unset fields keep their fill value: loss 0, turn -1,
        logp 0, reward 0); return the index of the first."""
        start = self.width
        end = start + ids.shape[1]
        self._reserve(end)
        store, cols = self._store, slice(start, end)
        store["ids"][:, cols] = ids
        store["attn"][:, cols] = attn
        store["pos"][:, cols] = (self.count.unsqueeze(1) + attn.cumsum(1) - 1).clamp(min=0)
        self.count += attn.sum(1)
        for name, value in (("loss", loss), ("turn", turn), ("logp", logp)):
            if value is not None:
                store[name][:, cols] = value
        self.width = end
        return start


class _GrowingLayer(DynamicLayer):
    """A :class:`~transformers.cache_utils.DynamicLayer` whose keys and values live in
    preallocated storage that doubles when full: an update writes the new columns in place and
    hands attention a view of the filled part, instead of ``torch.cat``-ing the whole cache at every
    decoding step (a copy of the cache, per layer, per forward). Attention sees the same numbers,
    only strided; on CPU SDPA's result is then bit-identical (checked), elsewhere
    :func:`_new_cache` keeps the stock layer. Only for the rollout's own cache: ``crop`` and the
    beam-search helpers are not supported."""

    _k: torch.Tensor | None = None  # the storage, [B, heads, capacity, head_dim]
    _v: torch.Tensor | None = None
    _n: int = 0  # filled columns
    _first: int = 0  # capacity of the first allocation (the history buffer's)

    def update(self, key_states, value_states, *args, **kwargs):
        if self._k is None:
            self.dtype, self.device = key_states.dtype, key_states.device
            self.is_initialized = True
        end = self._n + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2]:
            capacity = max(end, self._first, 2 * (0 if self._k is None else self._k.shape[-2]))
            k = key_states.new_empty(*key_states.shape[:-2], capacity, key_states.shape[-1])
            v = value_states.new_empty(*value_states.shape[:-2], capacity, value_states.shape[-1])
            if self._n:
                k[..., : self._n, :] = self._k[..., : self._n, :]
                v[..., : self._n, :] = self._v[..., : self._n, :]
            self._k, self._v = k, v
        self._k[..., self._n : end, :] = key_states
        self._v[..., self._n : end, :] = value_states
        self._n = end
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the rollout's cache only grows")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("the rollout's cache only grows")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("the rollout's cache only grows")


def _new_cache(config, device: torch.device, capacity: int = 0) -> DynamicCache:
    """An empty cache for ``model``; on CPU its full-attention layers are :class:`_GrowingLayer`
    (first allocated for ``capacity`` columns)."""
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    if device.type == "cpu" and config is not None:
        layers = []
        for layer in cache.layers:
            if type(layer) is DynamicLayer:
                layer = _GrowingLayer()
                layer._first = capacity
            layers.append(layer)
        cache.layers = layers
    return cache


def _left_pad(rows: list[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max((len(r) for r in rows), default=0)
    ids = torch.tensor(
        [[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=device
    ).reshape(len(rows), width)
    attn = torch.tensor(
        [[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device
    ).reshape(len(rows), width)
    return ids, attn


def _step_all(envs: list, texts: list[str]) -> list[tuple]:
    """``env.step(text)`` for each running episode, or one ``step_batch`` call when their class
    has one (the same class for all)."""
    cls = type(envs[0]) if envs else None
    if cls is not None and hasattr(cls, "step_batch") and all(type(e) is cls for e in envs):
        return list(cls.step_batch(envs, texts))
    return [env.step(text) for env, text in zip(envs, texts)]


def _compact(buf: _Buffer, pad: int):
    """Drop the masked pads inside each row, then right-pad rows to one width.

    Returns the compacted fields and, per buffer position, its column in the compacted batch.
    """
    keep = buf.attn.bool()
    # a stable sort puts each row's real tokens first, in order
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    width = int(keep.sum(1).max().item()) if keep.numel() else 0
    order = order[:, :width]
    valid = torch.gather(keep, 1, order)

    def take(x, fill):
        return torch.where(
            valid, torch.gather(x, 1, order), torch.full_like(torch.gather(x, 1, order), fill)
        )

    out = {
        "input_ids": take(buf.ids, pad),
        "attention_mask": valid.long(),
        "loss_mask": take(buf.loss, 0),
        "turn_ids": take(buf.turn, -1),
        "old_logprobs": take(buf.logp, 0.0),
        "token_rewards": take(buf.reward, 0.0),
    }
    new_col = keep.long().cumsum(1) - 1
    return out, new_col


@torch.no_grad()
def rollout_multiturn(
    model,
    tokenizer,
    envs: Sequence,
    seeds: Sequence[int],
    *,
    max_turns: int | None = None,
    max_action_tokens: int = 4,
    stop_word: str = "</action>",
    temperature: float = 1.0,
    greedy: bool = False,
    reuse_cache: bool = True,
    keep_stop_word: bool = False,
    group_ids=None,
    ref_model=None,
    chat=None,
) -> Batch:
    """Play one episode per environment (``envs[i].reset(seeds[i])``) with ``model`` as the policy.

    Each turn, every running episode samples an action token by token (ancestral sampling at
    ``temperature``, or argmax with ``greedy=True``) until it emits the stop word, EOS, or
    ``max_action_tokens`` tokens. The action text (the turn's tokens without the stop word / EOS,
    special tokens kept) goes to ``env.step``; a malformed or unfinished action is the environment's
    business (it must not raise). An episode ends when the env says ``done`` or after ``max_turns``
    turns (default: each env's ``max_turns``; stopping earlier than the env marks it truncated). A
    truncated episode keeps its final observation at the end of its row (``loss_mask`` 0): the state
    it was cut in still has a value, which a critic can bootstrap from; a terminated one has none.

    Returns a :class:`~agentic_rl.rollout.Batch`, each row the episode's real token sequence,
    right-padded: ``loss_mask`` 1 exactly on the sampled tokens; ``old_logprobs`` their log-probs at
    ``temperature`` recorded at sampling time; ``token_rewards`` each turn's reward on the last
    token of that turn's action; ``turn_ids`` the turn of each sampled token (-1 elsewhere);
    ``correct`` = the env's ``success``; ``format_ok`` = no malformed action; ``completions`` the
    actions joined with ``" ; "``; ``group_id`` = ``group_ids`` or ``arange(B)``; and ``extras``
    with ``success``, ``num_turns``, ``terminated``, ``truncated``, ``episode_return``,
    ``missing_stop`` (actions that hit ``max_action_tokens`` without stop word or EOS) as ``[B]``
    tensors, plus ``turn_end`` and ``turn_rewards`` (per row: the column of each turn's last
    action token, and the turn's reward). With ``ref_model``, ``ref_logprobs`` is filled from one
    forward of it over the final batch.

    ``keep_stop_word=True`` hands the env the action text *with* its stop word when the policy wrote
    one (so the env can tell a closed ``</code>`` from an action cut by EOS or the token limit).
    Envs whose class has a ``step_batch(envs, texts)`` static method are stepped together, once per
    turn (e.g. ReTool's, which runs the turn's code snippets concurrently in the sandbox pool).

    ``chat``: a :class:`~agentic_rl.chat.ChatFormat` for a pretrained chat model. The first
    observation is then the user's message in the template (system turn and assistant header
    included); a turn ends at the template's end-of-turn token (sampled, ``loss_mask`` 1; it
    replaces ``stop_word`` and ``keep_stop_word``); each later observation is the tool's turn,
    encoded with the template's markers around it and appended as ids, after the end-of-turn token
    the format adds when a turn was cut before it (:meth:`~agentic_rl.chat.ChatFormat.
    observation_ids`). The sampled ids are never decoded and encoded again. Without ``chat``, the
    turns follow :class:`~agentic_rl.chat.StopWordFormat` (``stop_word``, ``keep_stop_word``).
    Either is the one :class:`~agentic_rl.chat.TurnFormat` the loop asks at a turn's boundaries.

    ``reuse_cache=True`` keeps one KV cache across turns and feeds only new tokens;
    ``reuse_cache=False`` re-encodes the whole history at the start of every turn (the naive
    baseline). Both sample the same tokens for the same torch seed.

    Why one long function (the package's only one over 80 lines; ``tests/test_style.py`` caps
    it): it is the agent loop of two recipe modules, which call it (``agent``'s
    ``AgentTrainer.play``, inherited by the recipes built on that trainer, and ``retool``'s), and
    its state lives across the turn loop (the KV cache kept between turns, the preallocated token
    buffers, each episode's turn bookkeeping). Cut into helpers, each would take and return a
    dozen of those mutable pieces, and the loop would no longer read from top to bottom as the
    turn protocol does: sample to the stop word, step the environments, append their answers,
    repeat. What differs between the plain protocol and a chat template lives in the turn format.
    """
    B = len(envs)
    if len(seeds) != B:
        raise ValueError(f"got {B} envs but {len(seeds)} seeds")
    if B == 0:
        raise ValueError("rollout_multiturn needs at least one environment")
    if max_action_tokens < 1:
        raise ValueError("max_action_tokens must be >= 1")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (use greedy=True for argmax), got {temperature}")
    device = next(model.parameters()).device
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    # the turn boundaries, in ids (chat.py): the rollout never asks which format it has
    fmt = chat if chat is not None else StopWordFormat(tokenizer, stop_word, keep_stop_word)
    stop_ids = list(fmt.stop_ids)
    limits = [int(max_turns if max_turns is not None else env.max_turns) for env in envs]
    config = getattr(model, "config", None)

    was_training = model.training
    model.eval()
    try:
        # ---- reset: the context starts with the first observation (left-padded) ----
        texts = [env.reset(seed) for env, seed in zip(envs, seeds)]
        ids, attn = _left_pad(fmt.first_rows(texts), pad, device)
        buf = _Buffer(B, 2 * ids.shape[1] + 4 * max_action_tokens, device)
        buf.append(ids, attn)

        cache, fed = None, 0

        def advance() -> torch.Tensor:
            """Feed the buffer's columns the cache has not seen yet; logits of the last column."""
            nonlocal cache, fed
            width = buf.width
            # inference mode: the same kernels as no_grad, less bookkeeping per op (the cache's
            # tensors are created and used only in here)
            with torch.inference_mode():
                out = model(
                    input_ids=buf.ids[:, fed:width].contiguous(),
                    attention_mask=buf.attn.contiguous(),
                    position_ids=buf.pos[:, fed:width].contiguous(),
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
            cache = out.past_key_values
            fed = width
            return out.logits[:, -1].float()

        running = [True] * B
        num_turns = [0] * B
        terminated, truncated, success = [False] * B, [False] * B, [False] * B
        format_ok = [True] * B
        missing_stop = [0] * B
        actions: list[list[str]] = [[] for _ in range(B)]
        turn_end: list[list[int]] = [[] for _ in range(B)]  # buffer columns, mapped at the end
        turn_rewards: list[list[float]] = [[] for _ in range(B)]
        uniform = None
        stop_t = torch.tensor(stop_ids, dtype=torch.long, device=device) if stop_ids else None
        pad_t = torch.tensor(pad, dtype=torch.long, device=device)

        for turn in range(max(limits)):
            if not any(running):
                break
            if not reuse_cache or cache is None:
                # the naive baseline re-encodes everything at every turn;
                # the cached loop only at turn 0
                cache = _new_cache(config, device, buf.capacity)
                fed = 0
            logits = advance()  # cached: only the last action column + this observation chunk

            # Rows generate in lockstep: a row that is still generating at step k sampled this
            # turn's tokens at steps 0..k, in columns start..start+k; so this turn's tokens
            # are ``sampled[i, :steps[i]]`` and its last column ``start + steps[i] - 1``.
            generating = torch.tensor(running, device=device)
            sampled = torch.full((B, max_action_tokens), pad, dtype=torch.long, device=device)
            steps = torch.zeros(B, dtype=torch.long, device=device)
            start = buf.width
            for k in range(max_action_tokens):
                if k > 0:
                    logits = advance()  # the token sampled at step k-1
                logp_all = torch.log_softmax(logits / temperature, dim=-1)
                if greedy:
                    tok = logits.argmax(-1)
                else:
                    if uniform is None:
                        uniform = torch.full_like(logp_all, 1.0 / logp_all.shape[-1])
                    # rows that are not generating draw from a harmless distribution (same RNG use)
                    probs = torch.where(generating.unsqueeze(1), logp_all.exp(), uniform)
                    tok = torch.multinomial(probs, 1).squeeze(1)
                logp = logp_all.gather(1, tok.unsqueeze(1)).squeeze(1)
                g = generating.long()
                buf.append(
                    torch.where(generating, tok, pad_t).unsqueeze(1),
                    g.unsqueeze(1),
                    loss=g.unsqueeze(1),
                    turn=(g * (turn + 1) - 1).unsqueeze(1),  # turn where generating, else -1
                    logp=torch.where(generating, logp, torch.zeros_like(logp)).unsqueeze(1),
                )
                sampled[:, k] = tok
                steps += g
                # the action ends at EOS or once its tokens end with the stop word
                ended = tok == eos if eos is not None else torch.zeros_like(generating)
                if stop_t is not None and k + 1 >= len(stop_ids):
                    ended |= (sampled[:, k + 1 - len(stop_ids) : k + 1] == stop_t).all(1)
                generating &= ~ended
                if not bool(generating.any()):
                    break

            # ---- the environments answer ----
            obs_rows: list[list[int]] = [[] for _ in range(B)]
            live = [i for i in range(B) if running[i]]
            sampled_rows, steps_rows = sampled.tolist(), steps.tolist()
            last_col = {i: start + steps_rows[i] - 1 for i in live}
            action_ids, closed = [], {}
            for i in live:  # the ids the env gets, whether the turn closed, a missing stop
                ids, closed[i], missing = fmt.split_action(sampled_rows[i][: steps_rows[i]])
                missing_stop[i] += missing
                action_ids.append(ids)
            # one call for the batch: each row decoded as by ``decode``
            texts = tokenizer.batch_decode(action_ids, skip_special_tokens=False)
            for i, text in zip(live, texts):
                actions[i].append(text)
            results = _step_all([envs[i] for i in live], [actions[i][-1] for i in live])
            to_encode: list[tuple[int, str]] = []  # (row, observation text)
            rewards: list[float] = []
            for i, (obs, reward, done, info) in zip(live, results):
                info = info or {}
                reward = float(reward)
                rewards.append(reward)
                turn_end[i].append(last_col[i])
                turn_rewards[i].append(reward)
                num_turns[i] += 1
                if not info.get("format_ok", True):
                    format_ok[i] = False
                success[i] = bool(info.get("success", False))
                if done:
                    truncated[i] = bool(info.get("truncated", False))
                    terminated[i] = bool(info.get("terminated", not truncated[i]))
                    running[i] = False
                    if truncated[i] and obs:
                        # Cut by the turn limit, not ended: keep the final observation
                        # (loss_mask 0), so a critic can value the state the episode stopped
                        # in (bootstrapping).
                        to_encode.append((i, obs))
                elif num_turns[i] >= limits[i]:
                    truncated[i], terminated[i], running[i] = True, False, False
                    if obs:  # cut here by the rollout's own limit: keep the final observation too
                        to_encode.append((i, obs))
                else:
                    to_encode.append((i, obs))
            # the reward sits on the last token of the turn's action
            buf.reward.index_put_(
                (
                    torch.tensor(live, dtype=torch.long, device=device),
                    torch.tensor([last_col[i] for i in live], dtype=torch.long, device=device),
                ),
                torch.tensor(rewards, dtype=torch.float32, device=device),
                accumulate=True,
            )
            if to_encode:
                encoded = fmt.observation_rows(
                    [obs for _, obs in to_encode], [closed[i] for i, _ in to_encode]
                )
                for (i, _), ids in zip(to_encode, encoded):
                    obs_rows[i] = ids
            if any(running) or any(obs_rows):
                buf.append(*_left_pad(obs_rows, pad, device))
    finally:
        model.train(was_training)

    fields, new_col = _compact(buf, pad)
    new_col = new_col.tolist()
    turn_end = [[new_col[i][c] for c in cols] for i, cols in enumerate(turn_end)]
    if group_ids is None:
        group_id = torch.arange(B, device=device)
    else:
        group_id = torch.as_tensor(group_ids, dtype=torch.long, device=device)

    def t(x, dtype):
        return torch.tensor(x, dtype=dtype, device=device)

    batch = Batch(
        input_ids=fields["input_ids"],
        attention_mask=fields["attention_mask"],
        loss_mask=fields["loss_mask"],
        token_rewards=fields["token_rewards"],
        group_id=group_id,
        old_logprobs=fields["old_logprobs"],
        correct=t(success, torch.bool),
        format_ok=t(format_ok, torch.bool),
        completions=[" ; ".join(a) for a in actions],
        turn_ids=fields["turn_ids"],
        extras={
            "success": t(success, torch.bool),
            "num_turns": t(num_turns, torch.long),
            "terminated": t(terminated, torch.bool),
            "truncated": t(truncated, torch.bool),
            "episode_return": t([sum(r) for r in turn_rewards], torch.float32),
            "missing_stop": t(missing_stop, torch.long),
            "turn_end": turn_end,
            "turn_rewards": turn_rewards,
        },
    )
    if ref_model is not None:
        ref_training = ref_model.training
        ref_model.eval()
        try:
            batch.ref_logprobs = (
                sequence_logprobs(
                    ref_model, batch.input_ids, batch.attention_mask, temperature=temperature
                )
                * batch.loss_mask
            )
        finally:
            ref_model.train(ref_training)
    return batch


def environment_tokens(batch: Batch) -> torch.Tensor:
    """``[B, T]`` bool: the environment's tokens after the policy's first action.

    They are the real tokens (``attention_mask`` 1) that the policy did not sample (``loss_mask``
    0) and that come after its first sampled token: every observation the environment appended
    (ReTool's interpreter output, RAGEN's later states). The first observation is the prompt and is
    not included.
    """
    sampled = batch.loss_mask.bool()
    after_first = sampled.long().cumsum(1) > 0
    return batch.attention_mask.bool() & ~sampled & after_first


@torch.no_grad()
def unmask_environment_tokens(batch: Batch, model, *, temperature: float = 1.0) -> torch.Tensor:
    """Train the environment's tokens as if the policy had written them: give them ``loss_mask`` 1
    (ReTool's unmasked ablation; RAGEN's paper-era loss mask). Returns their ``[B, T]`` mask, also
    kept in ``batch.extras["env_tokens"]``.

    PPO's ratio needs their "old" log-probs: one forward of the current policy (which never chose
    them; the rollout only recorded the log-probs of the tokens it sampled).
    """
    env = environment_tokens(batch)
    old = sequence_logprobs(model, batch.input_ids, batch.attention_mask, temperature=temperature)
    batch.old_logprobs = torch.where(env, old, batch.old_logprobs)
    batch.loss_mask = batch.loss_mask | env.long()
    batch.extras["env_tokens"] = env
    return env
