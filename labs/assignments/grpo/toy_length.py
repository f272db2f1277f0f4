"""A toy policy whose only choices are "right or wrong" and "how long", to see GRPO's length bias.

Each completion is one *decision* token (right with probability ``sigmoid(theta[0])``) followed by a
run of *continue* tokens ended by one *stop* token. The stop probability per token is
``sigmoid(theta[1])`` for wrong answers and ``sigmoid(theta[2])`` for right ones; a completion
that reaches ``max_len`` tokens is truncated. The reward is 1 for a right answer, 0 for a wrong one,
so the length never changes the reward: any drift of the length is a bias of the loss, not a
preference of the task. Dr. GRPO (Liu et al., 2025) argues that ``seq-mean-token-mean`` lets wrong
answers grow longer (each of their tokens is penalised by 1/|o_i|), and that a constant normaliser
stops it.

``length_experiment(group_advantages, aggregate, scale, mode)`` trains the toy with *your* advantage
and aggregation functions and returns the mean length of the wrong answers at every step.
"""

from __future__ import annotations

import math

import torch

__all__ = ["sample", "length_experiment"]


def sample(theta: torch.Tensor, n: int, max_len: int, gen: torch.Generator):
    """Sample ``n`` completions: ``(logprobs [n, max_len], mask [n, max_len], right [n])``."""
    with torch.no_grad():
        p_right = torch.sigmoid(theta[0])
        right = torch.rand(n, generator=gen) < p_right
        p_stop = torch.where(right, torch.sigmoid(theta[2]), torch.sigmoid(theta[1]))
        u = torch.rand(n, max_len - 1, generator=gen)
        stops = u < p_stop[:, None]  # stop decision at each of the positions 1 .. max_len-1
        first = torch.where(stops.any(1), stops.float().argmax(1), torch.full((n,), max_len - 2))
        length = first + 2  # the decision token, the continue tokens, and the stop token
    pos = torch.arange(max_len)
    mask = (pos[None, :] < length[:, None]).long()
    stop_logit = torch.where(right, theta[2], theta[1])  # differentiable
    is_stop = (pos[None, :] == length[:, None] - 1) & stops.any(1)[:, None]
    step_lp = torch.where(is_stop, torch.nn.functional.logsigmoid(stop_logit)[:, None],
                          torch.nn.functional.logsigmoid(-stop_logit)[:, None])
    decision_lp = torch.where(right, torch.nn.functional.logsigmoid(theta[0]),
                              torch.nn.functional.logsigmoid(-theta[0]))
    logprobs = torch.where(pos[None, :] == 0, decision_lp[:, None], step_lp) * mask
    return logprobs, mask, right


def length_experiment(group_advantages, aggregate, *, scale: str, mode: str, steps: int = 150,
                      prompts: int = 32, group_size: int = 8, max_len: int = 40, lr: float = 2.0,
                      seed: int = 0) -> list[float]:
    """Train the toy with plain SGD; return the mean length of the sampled wrong answers per step.

    ``group_advantages(scores, group_ids, scale=...)`` and ``aggregate(loss_mat, mask, mode,
    norm_constant=...)`` are the functions under test. The loss is the clipped surrogate at ratio
    1 (one update per batch), whose gradient is the policy gradient:
    ``-A * exp(logp - logp.detach())``.
    """
    gen = torch.Generator().manual_seed(seed)
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    theta = torch.tensor([logit(0.3), logit(0.25), logit(0.25)], requires_grad=True)
    group_ids = torch.arange(prompts).repeat_interleave(group_size)
    wrong_lengths = []
    for _ in range(steps):
        logprobs, mask, right = sample(theta, prompts * group_size, max_len, gen)
        scores = right.double()
        adv = group_advantages(scores, group_ids, scale=scale).float()
        loss_mat = -adv[:, None] * torch.exp(logprobs - logprobs.detach())
        loss = aggregate(loss_mat, mask, mode, norm_constant=max_len)
        grad, = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            theta -= lr * grad
            theta[0].clamp_(max=logit(0.9))  # keep some wrong answers to measure
        lengths = mask.sum(1).float()
        wrong_lengths.append(lengths[~right].mean().item() if (~right).any() else float("nan"))
    return wrong_lengths
