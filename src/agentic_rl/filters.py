"""Which rollouts enter the update: the *filter* stage between advantages and loss.

Each filter is a pure function of per-rollout scores (the episode's total reward) and group ids,
returning a keep-mask over rows. Groups are kept or dropped whole, as RAGEN does, so a kept group's
advantages stay those computed over the full group.

- :func:`reward_std_filter`: RAGEN's uncertainty filter (StarPO-S, eq. starpo-s-filter of the
  RAGEN chapter). A group's uncertainty is the std of its rollouts' rewards; keep the most
  uncertain groups, by a fraction of groups (``top_k``, RAGEN's original ``rollout_filter_ratio``)
  or by a share of the total std (``top_p``, RAGEN's later linear top-p).
- :func:`nonzero_std_filter`: DAPO's dynamic sampling criterion: drop the groups whose rewards are
  all equal (they give GRPO no gradient); :func:`dynamic_sampling` then samples more groups to
  refill the batch, for any recipe (a rollout stage, before the filter stage).
- :func:`filter_metrics`: what RAGEN logs about a filter: the in-group std of all groups and of the
  chosen ones.

Std convention: ``torch.std`` (Bessel's correction, as RAGEN's ``rm_scores.std(dim=-1)``); a group
of one rollout has std 0.
"""

from __future__ import annotations

import torch

__all__ = [
    "group_std", "reward_std_filter", "nonzero_std_filter", "dynamic_sampling", "filter_metrics"
]


def group_std(scores: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(std[G], index[B])``: the reward std of each group (unbiased; 0 for a group of one),
    groups ordered by id (``torch.unique``), and each row's position in that order."""
    scores = scores.detach().float()
    ids, index = torch.unique(group_ids, return_inverse=True)
    n = len(ids)
    count = torch.zeros(n, device=scores.device).index_add_(0, index, torch.ones_like(scores))
    mean = torch.zeros(n, device=scores.device).index_add_(0, index, scores) / count
    sq = torch.zeros(n, device=scores.device).index_add_(0, index, (scores - mean[index]) ** 2)
    std = torch.where(count > 1, (sq / (count - 1).clamp(min=1)).sqrt(), torch.zeros_like(sq))
    return std, index


def reward_std_filter(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    strategy: str = "top_k",
    value: float = 0.25,
    include_zero: bool = True,
    eps: float = 0.01,
) -> torch.Tensor:
    """RAGEN's uncertainty filter: keep the groups whose rewards spread most. Returns ``keep[B]``.

    Groups are ranked by their reward std, highest first (ties: lower group id first).

    - ``strategy="top_k"``: keep ``max(1, int(value * num_groups))`` groups (RAGEN's original
      ``rollout_filter_ratio``: 0.25 keeps 2 of 8 groups). ``int`` truncates, as RAGEN's; the
      ``max(1, ...)`` is ours, so that a small batch keeps at least one group.
    - ``strategy="top_p"``: RAGEN's linear top-p: keep the fewest top-ranked groups whose summed
      std reaches ``value * (total std) - eps``.

    ``include_zero=False`` first removes the groups with zero std (all rewards equal), which
    ``top_k`` would otherwise keep when fewer groups than ``k`` have any spread. When no group
    qualifies (every std is zero and ``include_zero=False``, or ``top_p`` over a batch with no
    spread at all) the mask is all ``False``: the caller skips the update and says why.
    """
    if strategy not in ("top_k", "top_p"):
        raise ValueError(f"strategy must be 'top_k' or 'top_p', got {strategy!r}")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"value must be in (0, 1], got {value!r}")
    if scores.shape != group_ids.shape or scores.dim() != 1:
        raise ValueError(
            f"scores and group_ids must be 1-D and the same shape, "
            f"got {tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    std, index = group_std(scores, group_ids)
    candidates = torch.arange(len(std), device=std.device)
    if not include_zero:
        candidates = candidates[std > 0]
    # stable descending sort: ties keep the lower group id first
    order = candidates[torch.argsort(-std[candidates], stable=True)]
    if strategy == "top_k":
        kept = order[: max(1, int(value * len(std)))] if len(order) else order
    else:
        total = float(std[order].sum())
        if total <= 0.0:
            kept = order[:0]
        else:
            cumulative = torch.cumsum(std[order], 0)
            reached = (cumulative >= value * total - eps).nonzero()
            kept = order[: int(reached[0]) + 1]
    chosen = torch.zeros(len(std), dtype=torch.bool, device=std.device)
    chosen[kept] = True
    return chosen[index]


def nonzero_std_filter(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic-sampling criterion: keep the groups whose rewards are not all equal."""
    std, index = group_std(scores, group_ids)
    return (std > 0)[index]


def dynamic_sampling(
    play, *, groups: int, group_size: int, max_rounds: int, pad_token_id: int, signal=None
):
    """DAPO's dynamic sampling: call ``play()`` (one rollout batch of whole groups) up to
    ``max_rounds`` times and keep the groups whose ``signal(batch)`` (default: the rewards) is
    not all equal (:func:`nonzero_std_filter`) until ``groups`` groups of ``group_size`` rows are
    kept; return the first ``groups`` of them as one batch, and the number of rounds played.
    Where no round had a group with spread, one more batch is played and returned whole (the
    filter stage then keeps what spread it has, or the step skips); it counts as a round."""
    from .rollout import Batch

    signal = signal or (lambda batch: batch.scores)
    kept, rounds = [], 0
    while rounds < max_rounds and sum(len(b) for b in kept) < groups * group_size:
        rounds += 1
        b = play()
        rows = nonzero_std_filter(signal(b), b.group_id).nonzero().flatten()
        if len(rows):
            b = b.select(rows)
            b.group_id = b.group_id + 10_000 * rounds  # groups of different rounds stay apart
            kept.append(b)
    if not kept:
        return play(), rounds + 1
    batch = Batch.cat(kept, pad_token_id)
    first = torch.unique(batch.group_id)[:groups]
    return batch.select(torch.isin(batch.group_id, first).nonzero().flatten()), rounds


def filter_metrics(scores: torch.Tensor, group_ids: torch.Tensor, keep: torch.Tensor) -> dict:
    """RAGEN's filter logs: mean in-group reward std over all groups (``in_group_std``) and over
    the kept ones (``chosen_in_group_std``), and the fraction of groups kept."""
    std, index = group_std(scores, group_ids)
    chosen = torch.zeros(len(std), dtype=torch.bool, device=std.device)
    chosen[index[keep]] = True
    return {
        "in_group_std": std.mean().item(),
        "chosen_in_group_std": std[chosen].mean().item() if bool(chosen.any()) else 0.0,
        "kept_groups": chosen.float().mean().item(),
    }
