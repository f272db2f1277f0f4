"""Gradient coupling, measured: how much an update for one state moves the policy in another.

The GCD chapter's hypothesis (Liu et al. 2025) is that in agentic tasks two states can look almost
the same (one word of the goal differs) while the same action is good in one and flawed in the
other; then the gradient that reinforces the action in state A also reinforces it in state B. Three
measurements make that concrete, each on a pair of teacher-forced batches ``batch_a``, ``batch_b``
whose row ``i`` holds the same action after state A_i and after state B_i (the action's tokens have
``loss_mask`` 1, as :func:`agentic_rl.rollout.build_segments_batch` builds them; rows right-padded):

- :func:`gradient_cosine`: cos(grad log pi(a|A_i), grad log pi(a|B_i)) per pair (eq. gcd-cos),
  with per-sample gradients from ``torch.func`` (one ``vmap``, no Python loop over samples);
- :func:`pair_cosines`: from those same gradients, the paired cosine next to its *control*: pairs
  (A_i, B_j), i != j, of different tasks whose decisive token (the word the action is scored on)
  and probe type are the same, and pairs whose decisive tokens differ; and the first-order
  per-pair spill share (the pairs with g_A_i . g_B_i > 0, eq. gcd-spill) next to the same share
  over the control pairs;
- :func:`spillover`: one plain SGD step on the *mean* log pi(a|A) of all A rows (a batch step),
  and the change it causes in each log pi(a|B_i): to first order ``lr * g_B_i . mean_j g_A_j``,
  cross-pair terms included, measured exactly (AdamW's step would be ``g_B . D g_A``, with D
  its preconditioner; only SGD is measured here);
- :func:`hidden_cosine`: the cosine of the model's last hidden states of the two rows, at the
  action's last token (where GCD's judgement is read) or at the last state token.

``log pi(a|s)`` is the sum of the action tokens' log-probs (temperature 1).
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch.func import functional_call, grad, vmap

from .rollout import Batch, sequence_logprobs

__all__ = [
    "action_logprobs",
    "gradient_cosine",
    "hidden_cosine",
    "decisive_tokens",
    "last_block_names",
    "pair_cosines",
    "per_sample_grads",
    "spillover",
]


def action_logprobs(model, batch: Batch) -> torch.Tensor:
    """``log pi(a|s)`` of each row ``[N]``: the sum of the log-probs of its ``loss_mask`` tokens."""
    logp = sequence_logprobs(model, batch.input_ids, batch.attention_mask)
    return (logp * batch.loss_mask).sum(1)


def last_block_names(model) -> list[str]:
    """Names of the trainable parameters of the last decoder layer, the final norm and the head."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    layers = sorted({int(n.split("layers.")[1].split(".")[0]) for n in names if "layers." in n})
    last = f"layers.{layers[-1]}." if layers else None
    return [n for n in names if (last and last in n) or "layers." not in n and "embed" not in n]


def per_sample_grads(
    model, batch: Batch, names: list[str] | None = None, *, chunk_size: int | None = None
) -> torch.Tensor:
    """The gradient of ``log pi(a|s)`` of every row w.r.t. the parameters ``names`` (default: all
    trainable ones), flattened: ``[N, P]``.

    One ``torch.func.vmap`` over rows of ``grad`` of a functional call of the model. Each row is
    fed alone and without an attention mask: rows are right-padded, and under causal attention a
    token never sees the padding that follows it, so the action's log-probs are exact.
    """
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    names = list(params) if names is None else names
    missing = [n for n in names if n not in params]
    if missing:
        raise ValueError(f"not trainable parameters of the model: {missing[:3]}")
    wrt = {n: params[n] for n in names}
    rest = {n: p for n, p in params.items() if n not in wrt}

    def logprob(theta, ids, mask):
        logits = functional_call(model, {**rest, **theta}, (), dict(input_ids=ids[None])).logits
        logp = torch.log_softmax(logits[0, :-1].float(), -1)
        return (logp.gather(1, ids[1:, None]).squeeze(1) * mask[1:]).sum()

    # functional_call may leave a tied parameter swapped for one of vmap's wrappers (peft's
    # trainable-token delta, shared by the embedding and the head with LoRA): put each one back
    slots = [(m, k, p) for m in model.modules() for k, p in m._parameters.items()]
    was_training = model.training
    model.eval()
    try:
        with warnings.catch_warnings():
            # torch has no batching rule for CPU flash attention and loops over that one operator
            # (it says so in a warning); the rest is batched. Still ~2x faster than a Python loop
            # of backward passes (benchmarks/bench_gcd.py).
            warnings.filterwarnings("ignore", message="There is a performance drop")
            g = vmap(grad(logprob), in_dims=(None, 0, 0), chunk_size=chunk_size)(
                wrt, batch.input_ids, batch.loss_mask.float()
            )
    finally:
        model.train(was_training)
        for module, key, p in slots:
            module._parameters[key] = p
    return torch.cat([g[n].flatten(1) for n in names], 1)


def gradient_cosine(
    model, batch_a: Batch, batch_b: Batch, names: list[str] | None = None
) -> torch.Tensor:
    """cos(grad log pi(a_i|A_i), grad log pi(a_i|B_i)) for every pair ``i``: ``[N]``
    (eq. gcd-cos). Near 1: whatever raises the action in A raises it in B."""
    ga = per_sample_grads(model, batch_a, names)
    gb = per_sample_grads(model, batch_b, names)
    return torch.nn.functional.cosine_similarity(ga, gb, dim=1)


def decisive_tokens(batch: Batch) -> torch.Tensor:
    """``[N]``: the token id at each row's last ``loss_mask`` position (the probe's decisive
    word)."""
    cols = torch.arange(batch.loss_mask.shape[1], device=batch.loss_mask.device)
    col = (cols * batch.loss_mask.bool()).max(1).values
    return batch.input_ids[torch.arange(len(batch)), col]


def _mean(x: torch.Tensor):
    return x.double().mean().item() if x.numel() else None


def pair_cosines(ga, gb, tokens, kinds: list[str] | None = None) -> dict:
    """Paired gradient cosines next to their controls, from per-sample gradients ``ga``, ``gb``
    ``[N, P]`` of the A and the B rows, the decisive token of each pair ``tokens`` ``[N]`` and,
    optionally, each pair's kind (its probe type):

    - ``grad_cos``: mean cos(g_A_i, g_B_i) (eq. gcd-cos), the probe pairs;
    - ``grad_cos_control``: mean cos(g_A_i, g_B_j) over i != j with the same decisive token and
      the same kind (another task, the same output word in the same action); ``grad_cos_other``:
      over pairs whose decisive tokens differ;
    - ``pair_spill``: the share of pairs with g_A_i . g_B_i > 0 (a step on A_i alone raises the
      action in B_i, to first order: eq. gcd-spill); ``pair_spill_control``: the same share over
      the control pairs; ``control_pairs``: how many (ordered) there are;
    - per kind ``k``: ``grad_cos_<k>`` and ``grad_cos_control_<k>``.

    A mean over no pairs is ``None``."""
    normed_a = torch.nn.functional.normalize(ga.double(), dim=1)
    cos = normed_a @ torch.nn.functional.normalize(gb.double(), dim=1).T  # cos(g_A_i, g_B_j)
    n = len(tokens)
    kinds = list(kinds) if kinds is not None else [""] * n
    kind_of = torch.tensor([sorted(set(kinds)).index(k) for k in kinds], device=cos.device)
    same_kind = kind_of[:, None] == kind_of[None, :]
    same = (tokens[:, None] == tokens[None, :]).to(cos.device)
    control = same & same_kind & ~torch.eye(n, dtype=torch.bool, device=cos.device)
    out = dict(
        grad_cos=_mean(cos.diagonal()),
        grad_cos_control=_mean(cos[control]),
        grad_cos_other=_mean(cos[~same]),
        pair_spill=_mean(cos.diagonal() > 0),
        pair_spill_control=_mean(cos[control] > 0),
        control_pairs=int(control.sum()),
    )
    for k in sorted(set(kinds) - {""}):
        rows = torch.tensor([x == k for x in kinds], device=cos.device)
        out[f"grad_cos_{k}"] = _mean(cos.diagonal()[rows])
        out[f"grad_cos_control_{k}"] = _mean(cos[control & rows[:, None]])
    return out


def spillover(model, batch_a: Batch, batch_b: Batch, *, lr: float = 0.01) -> dict:
    """One gradient-ascent step of size ``lr`` (plain SGD) on the mean ``log pi(a|A)`` of all A
    rows (a batch step: B_i's change includes the cross-pair terms g_B_i . g_A_j), applied to a
    copy of ``model``; returns the per-pair changes ``delta_a`` (what was asked
    for) and ``delta_b`` (what leaked into the B states) of ``log pi(a|s)``, ``[N]`` each, and
    their ratio ``sum(delta_b) / sum(delta_a)`` (eq. gcd-spill)."""
    moved = copy.deepcopy(model).eval()
    with torch.no_grad():
        before_a, before_b = action_logprobs(moved, batch_a), action_logprobs(moved, batch_b)
    params = [p for p in moved.parameters() if p.requires_grad]
    objective = action_logprobs(moved, batch_a).mean()
    grads = torch.autograd.grad(objective, params)
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.add_(lr * g)
        delta_a = action_logprobs(moved, batch_a) - before_a
        delta_b = action_logprobs(moved, batch_b) - before_b
    ratio = (delta_b.sum() / delta_a.sum()).item() if delta_a.sum() != 0 else float("nan")
    return dict(delta_a=delta_a, delta_b=delta_b, ratio=ratio)


@torch.no_grad()
def hidden_cosine(
    model, batch_a: Batch, batch_b: Batch, *, at: str = "action", center: bool = True
) -> torch.Tensor:
    """Cosine of the last layer's hidden states of row ``i`` of the two batches, ``[N]``: at the
    action's last token (``at="action"``: the (state, action) representation GCD's judgement reads)
    or at the last token before the action (``at="state"``: what the action is chosen from).

    ``center=True`` first subtracts the mean hidden state over all ``2N`` rows: a transformer's
    hidden states share a large common direction, which puts the raw cosine of any two of them
    near 1; centred, the cosine says how alike the two rows are *relative to the other probes*."""
    if at not in ("action", "state"):
        raise ValueError(f"at must be 'action' or 'state', got {at!r}")

    def states(batch):
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            output_hidden_states=True,
        )
        cols = torch.arange(batch.loss_mask.shape[1], device=batch.loss_mask.device)
        trained = batch.loss_mask.bool()
        if at == "action":
            col = (cols * trained).max(1).values
        else:
            col = torch.where(trained, cols, cols.numel()).min(1).values - 1
        return out.hidden_states[-1][torch.arange(len(batch)), col].float()

    was_training = model.training
    model.eval()
    try:
        ha, hb = states(batch_a), states(batch_b)
        if center:
            mean = torch.cat([ha, hb]).mean(0)
            ha, hb = ha - mean, hb - mean
        return torch.nn.functional.cosine_similarity(ha, hb, dim=1)
    finally:
        model.train(was_training)
