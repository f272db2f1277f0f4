"""Advantage estimators: pure functions on tensors with explicit masks.

Every function here is a few lines of math, named for the estimator it computes, with its
conventions stated in the docstring because the reference frameworks disagree on them (see the GRPO
chapter, "Paper vs code"):

========================  ==============  ===============  ==============================
convention                this package    verl             TRL
========================  ==============  ===============  ==============================
std estimator             unbiased (N-1)  unbiased (N-1)   unbiased (N-1)
epsilon added to the std  1e-6 (``eps``)  1e-6             1e-4
group of size one         advantage 0     raw score (*)    NaN (needs G >= 2)
========================  ==============  ===============  ==============================

(*) verl sets the mean of a group of one to 0 and its std to 1, so its advantage is
``s / (1 + eps)``: the raw score, not 0. This package gives such a row no advantage, as a group
with no spread.

Shapes: ``B`` rows (trajectories), ``T`` token positions.
"""

from __future__ import annotations

import torch

__all__ = [
    "group_advantages",
    "rloo_advantages",
    "gae",
    "masked_mean",
    "masked_whiten",
    "group_stats",
    "explained_variance",
]

SCALES = ("group", "batch", "none")


def _group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group labels to 0..G-1 (so group ids need not be contiguous)."""
    uniq, index = torch.unique(group_ids, return_inverse=True)
    return index, len(uniq)


def group_stats(
    scores: torch.Tensor, group_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group mean, unbiased group std and group size, each of shape ``[B]``.

    A group of one has std 0 (there is no spread to estimate), not NaN.
    """
    scores = scores.to(torch.float64)
    index, n_groups = _group_index(group_ids)
    count = torch.zeros(n_groups, dtype=scores.dtype, device=scores.device).index_add_(
        0, index, torch.ones_like(scores)
    )
    total = torch.zeros_like(count).index_add_(0, index, scores)
    mean = total / count
    sq_dev = torch.zeros_like(count).index_add_(0, index, (scores - mean[index]) ** 2)
    var = sq_dev / (count - 1).clamp(min=1)  # Bessel's correction, as torch.std, verl and TRL
    return mean[index], var.sqrt()[index], count[index]


def group_advantages(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    scale: str = "group",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO's group-normalised advantage, one scalar per completion
    (eq. grpo-adv of the GRPO chapter).

    ``A_i = (r_i - mean(r_group)) / (std + eps)``, where ``std`` is

    - ``scale="group"``: the unbiased std of the row's own group (DeepSeekMath, verl, TRL default);
    - ``scale="batch"``: the unbiased std of all scores in the batch
      (TRL ``scale_rewards="batch"``);
    - ``scale="none"``: no division at all, ``A_i = r_i - mean`` (Dr. GRPO; ``eps`` unused).

    The mean is always the group mean. ``eps`` is *added to the std* (not under the square root), so
    a group whose rewards are all equal gets advantage exactly 0 for every member. Returns shape
    ``[B]`` in the dtype of ``scores``.
    """
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if scores.ndim != 1 or group_ids.shape != scores.shape:
        raise ValueError(
            "scores and group_ids must both have shape [B]; "
            f"got {tuple(scores.shape)} and {tuple(group_ids.shape)}"
        )
    mean, std, _ = group_stats(scores, group_ids)
    centred = scores.to(torch.float64) - mean
    if scale == "group":
        adv = centred / (std + eps)
    elif scale == "batch":
        adv = centred / (scores.to(torch.float64).std() + eps)
    else:
        adv = centred
    return adv.to(scores.dtype)


def rloo_advantages(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: ``A_i = r_i - mean_{j != i in group} r_j``, shape ``[B]``.

    Equal to ``G/(G-1) * (r_i - mean(r_group))``: the unscaled GRPO advantage, stretched so that the
    baseline does not depend on the sample it scores. Groups of size one get advantage 0.
    """
    mean, _, count = group_stats(scores, group_ids)
    s = scores.to(torch.float64)
    others = (mean * count - s) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, s - others, torch.zeros_like(s))
    return adv.to(scores.dtype)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the token axis, skipping masked tokens.

    ``delta_t = r_t + gamma * V(s_next) - V(s_t)`` and ``A_t = delta_t + gamma * lam * A_next``,
    where "next" is the next position *with mask 1*: positions with mask 0 (prompt, environment
    observations, tool output, padding) are skipped by the recursion, exactly as if they were not
    there, rather than merely ignored by the loss. Their advantage and return are 0. Past the last
    valid token the next value is 0 (the episode terminated). No whitening is done here: call
    :func:`masked_whiten` if you want it (verl does, RAGEN does).

    Returns ``(advantages, returns)``, both ``[B, T]``, with ``returns = advantages + values`` on
    valid tokens (the value-function target).
    """
    if not (0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if not (0.0 <= lam <= 1.0):
        raise ValueError(f"lam must be in [0, 1], got {lam}")
    if not (token_rewards.shape == values.shape == mask.shape):
        raise ValueError("token_rewards, values and mask must have the same [B, T] shape")
    mask = mask.to(values.dtype)
    B, T = values.shape
    advantages = torch.zeros_like(values)
    next_value = torch.zeros(B, dtype=values.dtype, device=values.device)
    last_gae = torch.zeros_like(next_value)
    for t in reversed(range(T)):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * last_gae
        # Where the token is masked, carry next_value and last_gae through unchanged (the skip).
        last_gae = m * adv_t + (1 - m) * last_gae
        next_value = m * values[:, t] + (1 - m) * next_value
        advantages[:, t] = m * adv_t
    returns = (advantages + values) * mask
    return advantages, returns


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (0 when there are none)."""
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, *, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x`` to mean 0, std 1 over the valid (mask 1) positions of the whole tensor.

    The variance is the unbiased (N-1) estimate over valid positions, as in verl's
    ``masked_whiten``; ``eps`` sits under the square root: ``(x - mean) / sqrt(var + eps)``. Masked
    positions return 0.
    """
    m = mask.to(x.dtype)
    n = m.sum()
    if n < 2:
        raise ValueError("masked_whiten needs at least two valid positions")
    mean = (x * m).sum() / n
    var = (((x - mean) ** 2) * m).sum() / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps) * m


@torch.no_grad()
def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """How much of the returns' spread the critic accounts for: ``1 - Var(R - V) / Var(R)``.

    Over the valid (mask 1) positions, as verl's ``vf_explained_var`` and Stable-Baselines3. It is 1
    for a perfect critic, 0 for a critic that predicts only the mean return, and negative for a
    critic worse than that. The residual's *variance* (not its mean square) is used, so a critic
    that is right up to a constant offset still scores 1. NaN when the returns do not vary (nothing
    to explain).
    """
    m = mask.to(torch.float64)
    r, v = returns.to(torch.float64), values.to(torch.float64)
    var_r = masked_mean((r - masked_mean(r, m)) ** 2, m)
    diff = r - v
    var_diff = masked_mean((diff - masked_mean(diff, m)) ** 2, m)
    if var_r <= 0:
        return float("nan")
    return (1.0 - var_diff / var_r).item()
