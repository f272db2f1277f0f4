"""Policy-gradient losses, KL estimators and loss aggregation,
as pure functions on ``[B, T]`` tensors.

``mask`` is the Batch's ``loss_mask``: 1 on tokens the policy generated, 0 on prompt, observation,
tool-output and padding tokens. Every loss here is a *per-token matrix* reduced by
:func:`aggregate`, so the reduction (a real design choice, see the GRPO chapter) is one argument,
named for what it computes.
"""

from __future__ import annotations

import torch

from .advantages import masked_mean

__all__ = [
    "AGG_MODES",
    "LOSS_TYPE_ALIASES",
    "resolve_agg_mode",
    "aggregate",
    "policy_loss",
    "clip_region",
    "kl_penalty",
    "entropy_from_logits",
    "token_logprobs",
]

AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

#: TRL ``GRPOConfig.loss_type`` names and the aggregation each computes
#: (on one device, no accumulation).
LOSS_TYPE_ALIASES = {
    # DeepSeekMath eq. 3: mean over tokens of a sequence, then over sequences
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",  # mean over all valid tokens of the (local) batch
    "dapo": "token-mean",  # same, over the global accumulated batch; identical without accumulation
    "dr_grpo": "seq-mean-token-sum-norm",  # token sum / (num sequences * max_completion_length)
}


def resolve_agg_mode(name: str) -> str:
    """Return the aggregation mode for a verl mode name or a TRL ``loss_type`` alias."""
    if name in AGG_MODES:
        return name
    if name in LOSS_TYPE_ALIASES:
        return LOSS_TYPE_ALIASES[name]
    raise ValueError(
        f"unknown loss aggregation {name!r}: expected one of {AGG_MODES} "
        f"or a TRL loss_type {tuple(LOSS_TYPE_ALIASES)}"
    )


def aggregate(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    *,
    norm_constant: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix ``[B, T]`` to a scalar (eq. agg of the GRPO chapter).

    With ``l_it`` the loss of token t of row i, ``m_it`` its mask, ``|o_i| = sum_t m_it`` and ``B'``
    the number of rows with at least one valid token:

    - ``token-mean``:              ``sum_it m l / sum_it m``
      (DAPO, PPO, TRL ``bnpo``/``dapo``)
    - ``token-sum``:               ``sum_it m l``
    - ``seq-mean-token-mean``:     ``1/B' sum_i (sum_t m l) / |o_i|``
      (DeepSeekMath GRPO, TRL ``grpo``)
    - ``seq-mean-token-sum``:      ``1/B' sum_i sum_t m l``
    - ``seq-mean-token-sum-norm``: ``1/B' sum_i (sum_t m l) / L``
      (Dr. GRPO, TRL ``dr_grpo``)

    ``L`` is ``norm_constant`` when given, else the padded width ``T``; keep it constant across
    steps (e.g. ``max_completion_length``) to remove the length bias for real. Rows with no valid
    token do not count in the seq-mean modes. (verl's ``seq-mean-token-sum-norm`` omitted the
    ``1/B'`` in early 2026 (commit b178a3c); verl 0.9.1 divides by it, as here and TRL. For a fixed
    batch size the two differ by a constant factor, which Adam cancels: it matters only through
    gradient clipping.)
    """
    mode = resolve_agg_mode(mode)
    mask = mask.to(loss_mat.dtype)
    token_sum = (loss_mat * mask).sum(-1)  # [B]
    n_tokens = mask.sum(-1)  # [B]
    if mode == "token-mean":
        return token_sum.sum() / n_tokens.sum().clamp(min=1)
    if mode == "token-sum":
        return token_sum.sum()
    valid_rows = (n_tokens > 0).to(loss_mat.dtype)
    n_rows = valid_rows.sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        return (token_sum / n_tokens.clamp(min=1) * valid_rows).sum() / n_rows
    if mode == "seq-mean-token-sum":
        return (token_sum * valid_rows).sum() / n_rows
    # seq-mean-token-sum-norm
    width = float(norm_constant) if norm_constant is not None else float(mask.shape[-1])
    return (token_sum * valid_rows).sum() / n_rows / width


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
    agg: str = "token-mean",
    norm_constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, as a loss to minimise (eq. clip of the foundations chapter).

    Per token, with ``rho = exp(logprobs - old_logprobs)`` (the log-ratio is clamped to [-20, 20]
    before ``exp``, as verl does, so one wild token cannot overflow)::

        l = max(-A * rho, -A * clip(rho, 1 - epsilon, 1 + epsilon_high))

    which is ``-min(rho A, clip(rho) A)``. ``epsilon_high`` defaults to ``epsilon`` (symmetric
    clip); a larger value is DAPO's clip-higher. With ``dual_clip = c > 1``, tokens with ``A < 0``
    are further bounded by ``min(l, -c A)`` (dual-clip PPO: a token whose ratio exploded cannot push
    the loss without bound). ``advantages`` has shape ``[B, T]`` (broadcast a per-sequence advantage
    with ``A[:, None]``).

    Returns ``(loss, metrics)``. Metrics (floats, over valid tokens): ``clip_ratio`` (fraction of
    tokens whose clipped term was the active one, i.e. the gradient was cut; which ones:
    :func:`clip_region`), ``clip_ratio_low`` / ``clip_ratio_high`` (split by which bound),
    ``dual_clip_ratio``, ``ratio_mean``, and ``approx_kl`` (how far the update moved the policy:
    the k3 estimate of KL(old || new) from tokens sampled by pi_old, ``rho - 1 - log rho``, whose
    expectation under pi_old is exactly that KL).
    """
    if epsilon_high is None:
        epsilon_high = epsilon
    if epsilon < 0 or epsilon_high < epsilon:
        raise ValueError(
            f"need 0 <= epsilon <= epsilon_high, got epsilon={epsilon}, epsilon_high={epsilon_high}"
        )
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    log_ratio = torch.clamp(logprobs - old_logprobs, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    loss_mat = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        bound = -advantages * dual_clip
        loss_mat = torch.where(advantages < 0, torch.minimum(loss_mat, bound), loss_mat)
    loss = aggregate(loss_mat, mask, agg, norm_constant=norm_constant)

    with torch.no_grad():
        m = mask.to(loss_mat.dtype)
        low, high, dual = clip_region(
            ratio, advantages, epsilon=epsilon, epsilon_high=epsilon_high, dual_clip=dual_clip
        )
        metrics = {
            "clip_ratio": masked_mean((low | high).to(m.dtype), m).item(),
            "clip_ratio_low": masked_mean(low.to(m.dtype), m).item(),
            "clip_ratio_high": masked_mean(high.to(m.dtype), m).item(),
            "dual_clip_ratio": masked_mean(dual.to(m.dtype), m).item(),
            "ratio_mean": masked_mean(ratio, m).item(),
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, m).item(),  # k3 of KL(old || new)
        }
    return loss, metrics


def clip_region(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which tokens :func:`policy_loss` cuts: boolean masks ``(low, high, dual)``, shaped like
    ``ratio`` (the importance ratio ``rho``) broadcast with ``advantages``.

    In ``l = max(-A * rho, -A * clip(rho, 1 - epsilon, 1 + epsilon_high))`` a token is *clipped*
    when the clipped branch is strictly the larger one: ``l`` then does not depend on ``rho`` and
    the token gets no gradient. That happens on one side only: ``low`` when ``A < 0`` and
    ``rho < 1 - epsilon`` (the update already made the bad token rarer), ``high`` when ``A > 0``
    and ``rho > 1 + epsilon_high`` (it already made the good token likelier); a token beyond a
    bound on the other side keeps its gradient. ``dual`` (all False without ``dual_clip``) marks
    the tokens with ``A < 0`` whose loss the dual-clip bound ``-dual_clip * A`` replaces (a ratio
    above ``dual_clip``): no gradient either. The comparisons are the ones :func:`policy_loss`
    makes, so its ``clip_ratio`` is the masked mean of ``low | high``.
    """
    if epsilon_high is None:
        epsilon_high = epsilon
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon_high)
    active = clipped > unclipped  # the clipped branch is the max: gradient through rho is zero
    low, high = active & (advantages < 0), active & (advantages > 0)
    if dual_clip is None:
        return low, high, torch.zeros_like(active)
    loss_mat = torch.maximum(unclipped, clipped)
    return low, high, (advantages < 0) & (loss_mat > -advantages * dual_clip)


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta
    (eqs. k1-k3, foundations).

    With ``x = ref_logprobs - logprobs`` (log of ``pi_ref / pi_theta`` at the sampled token):

    - ``k1 = -x``                 unbiased, high variance, can be negative (verl ``k1``);
    - ``k2 = x**2 / 2``           biased, low variance, always >= 0 (verl ``k2``/``mse``);
    - ``k3 = exp(x) - x - 1``     unbiased, low variance, always >= 0 (DeepSeekMath eq. 4, TRL, verl
      ``low_var_kl``/``k3``). ``x`` is clamped to [-20, 20] before ``exp`` for safety.

    Returns a ``[B, T]`` matrix; reduce it with :func:`aggregate` using the loss mask.
    """
    x = ref_logprobs - logprobs
    if kind == "k1":
        return -x
    if kind == "k2":
        return 0.5 * x**2
    if kind == "k3":
        x = torch.clamp(x, -20.0, 20.0)
        return torch.exp(x) - x - 1.0
    raise ValueError(f"kind must be 'k1', 'k2' or 'k3', got {kind!r}")


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[..., label]`` without materialising the full log-softmax twice."""
    logits = logits.float()
    return torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(
        logits, dim=-1
    )


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at every position, ``[..., V] -> [...]`` (nats)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
