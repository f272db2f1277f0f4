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
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from .rollout import Batch, _position_ids, sequence_logprobs

__all__ = ["rollout_multiturn"]


class _Buffer:
    """The batch's padded token history, ``[B, L]`` per field,
    grown column chunk by column chunk."""

    def __init__(self, ids: torch.Tensor, attn: torch.Tensor):
        self.ids, self.attn = ids, attn
        zeros = torch.zeros(ids.shape, dtype=torch.long, device=ids.device)
        self.loss = zeros.clone()
        self.turn = zeros - 1
        self.logp = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
        self.reward = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)

    @property
    def width(self) -> int:
        return self.ids.shape[1]

    def append(self, ids, attn, loss=None, turn=None, logp=None):
        n = ids.shape[1]
        self.ids = torch.cat([self.ids, ids], 1)
        self.attn = torch.cat([self.attn, attn], 1)
        self.loss = torch.cat([self.loss, loss if loss is not None else torch.zeros_like(attn)], 1)
        self.turn = torch.cat(
            [self.turn, turn if turn is not None else torch.full_like(attn, -1)], 1
        )
        self.logp = torch.cat(
            [self.logp, logp if logp is not None else torch.zeros(attn.shape, device=attn.device)],
            1,
        )
        self.reward = torch.cat([self.reward, torch.zeros(attn.shape, device=attn.device)], 1)
        return n


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

    out = dict(
        input_ids=take(buf.ids, pad),
        attention_mask=valid.long(),
        loss_mask=take(buf.loss, 0),
        turn_ids=take(buf.turn, -1),
        old_logprobs=take(buf.logp, 0.0),
        token_rewards=take(buf.reward, 0.0),
    )
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

    ``reuse_cache=True`` keeps one KV cache across turns and feeds only new tokens;
    ``reuse_cache=False`` re-encodes the whole history at the start of every turn (the naive
    baseline). Both sample the same tokens for the same torch seed.
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
    stop_ids = tokenizer(stop_word, add_special_tokens=False)["input_ids"] if stop_word else []
    limits = [int(max_turns if max_turns is not None else env.max_turns) for env in envs]
    config = getattr(model, "config", None)

    was_training = model.training
    model.eval()
    try:
        # ---- reset: the context starts with <bos> + the first observation (left-padded) ----
        first = [tokenizer(env.reset(seed))["input_ids"] for env, seed in zip(envs, seeds)]
        buf = _Buffer(*_left_pad(first, pad, device))

        cache, fed = None, 0

        def advance() -> torch.Tensor:
            """Feed the buffer's columns the cache has not seen yet; logits of the last column."""
            nonlocal cache, fed
            positions = _position_ids(buf.attn)
            out = model(
                input_ids=buf.ids[:, fed:],
                attention_mask=buf.attn,
                position_ids=positions[:, fed:],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.past_key_values
            fed = buf.width
            return out.logits[:, -1].float()

        running = [True] * B
        num_turns = [0] * B
        terminated, truncated, success, format_ok = (
            [False] * B,
            [False] * B,
            [False] * B,
            [True] * B,
        )
        missing_stop = [0] * B
        actions: list[list[str]] = [[] for _ in range(B)]
        turn_end: list[list[int]] = [[] for _ in range(B)]  # buffer columns, mapped at the end
        turn_rewards: list[list[float]] = [[] for _ in range(B)]
        uniform = None

        for turn in range(max(limits)):
            if not any(running):
                break
            if not reuse_cache or cache is None:
                # the naive baseline re-encodes everything at every turn;
                # the cached loop only at turn 0
                cache = DynamicCache(config=config) if config is not None else DynamicCache()
                fed = 0
            logits = advance()  # cached: only the last action column + this observation chunk

            generating = torch.tensor(running, device=device)
            gen: list[list[int]] = [[] for _ in range(B)]
            last_col = [-1] * B
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
                    torch.where(generating, tok, torch.full_like(tok, pad)).unsqueeze(1),
                    g.unsqueeze(1),
                    loss=g.unsqueeze(1),
                    turn=torch.where(
                        generating, torch.full_like(g, turn), torch.full_like(g, -1)
                    ).unsqueeze(1),
                    logp=torch.where(generating, logp, torch.zeros_like(logp)).unsqueeze(1),
                )
                col = buf.width - 1
                tok_list = tok.tolist()
                gen_list = generating.tolist()
                for i in range(B):
                    if not gen_list[i]:
                        continue
                    gen[i].append(tok_list[i])
                    last_col[i] = col
                    if tok_list[i] == eos or (stop_ids and gen[i][-len(stop_ids) :] == stop_ids):
                        generating[i] = False
                if not bool(generating.any()):
                    break

            # ---- the environments answer ----
            obs_rows: list[list[int]] = [[] for _ in range(B)]
            live = [i for i in range(B) if running[i]]
            for i in live:
                ids = gen[i]
                if ids and ids[-1] == eos:
                    ids = ids[:-1]
                elif stop_ids and ids[-len(stop_ids) :] == stop_ids:
                    ids = ids if keep_stop_word else ids[: -len(stop_ids)]
                else:
                    missing_stop[i] += 1
                actions[i].append(tokenizer.decode(ids, skip_special_tokens=False))
            steps = _step_all([envs[i] for i in live], [actions[i][-1] for i in live])
            for i, (obs, reward, done, info) in zip(live, steps):
                info = info or {}
                reward = float(reward)
                buf.reward[i, last_col[i]] += reward
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
                        obs_rows[i] = tokenizer(obs, add_special_tokens=False)["input_ids"]
                elif num_turns[i] >= limits[i]:
                    truncated[i], terminated[i], running[i] = True, False, False
                    if obs:  # cut here by the rollout's own limit: keep the final observation too
                        obs_rows[i] = tokenizer(obs, add_special_tokens=False)["input_ids"]
                else:
                    obs_rows[i] = tokenizer(obs, add_special_tokens=False)["input_ids"]
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
        extras=dict(
            success=t(success, torch.bool),
            num_turns=t(num_turns, torch.long),
            terminated=t(terminated, torch.bool),
            truncated=t(truncated, torch.bool),
            episode_return=t([sum(r) for r in turn_rewards], torch.float32),
            missing_stop=t(missing_stop, torch.long),
            turn_end=turn_end,
            turn_rewards=turn_rewards,
        ),
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
