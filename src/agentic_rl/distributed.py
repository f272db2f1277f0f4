"""Data parallelism: the recipes under ``torchrun``, one rank per process (gloo on CPU, NCCL on
CUDA).

The idea: W ranks share one RL step. Each rank plays its own share of the step's prompts (whole
groups: :func:`shard`), computes the loss of its rows, and back-propagates; then the ranks
average their gradients (:func:`average_gradients`), so every rank takes the same optimizer step
from the same weights, and the weights never drift apart. With ``L_r`` the loss of rank r's rows
and ``g_r`` its gradient, the averaged gradient

    g = (1/W) sum_r w_r g_r

is the gradient of the loss over all W ranks' rows when each rank weights its loss by ``w_r``:
1 when the loss is a mean over rows and every rank has as many (the seq-mean aggregations),
``W n_r / sum_s n_s`` for a mean over ``n_r`` tokens (token-mean), W for a sum (token-sum). The
trainer weights its loss by :func:`rank_share`.

:func:`average_gradients` is the arithmetic of ``torch.nn.parallel.DistributedDataParallel``
(sum over ranks, divide by W), in one flattened all-reduce instead of DDP's buckets overlapped
with the backward pass. The model is deliberately *not* wrapped in DDP: generation needs the bare
model, the recipes call forward passes on ``trainer.model`` in many places (rollout, reference,
evaluation, probes), and a critic is a second model; one explicit all-reduce after ``backward``
covers them all.

Who does what (``agentic_rl.train.Trainer.rl_step``): every rank draws a step's prompts from the
same task stream, as one process would, and plays its contiguous share; rank r > 0 samples from its
own stream (seed + r); the gradients are averaged before clipping; the history row is computed from
all ranks' rows; every rank evaluates the whole held-out set alike; rank 0 holds the run lock and
writes the output folder, the checkpoint holding every rank's random streams, so that a run resumes
on as many ranks. The SFT warm start runs whole on every rank.

One process (no ``torchrun``: ``WORLD_SIZE`` unset or 1) is the zero-cost path: every function
returns its input, or does nothing, without touching ``torch.distributed``.
"""

from __future__ import annotations

import atexit
import builtins
import math
import os
import warnings

import torch
import torch.distributed as tdist

from .config import ConfigError

__all__ = [
    "NO_ROWS",
    "check_data_parallel",
    "rank_share",
    "rollout_row",
    "all_gather_object",
    "average_gradients",
    "barrier",
    "broadcast",
    "gather_rows",
    "init",
    "is_main",
    "local_rank",
    "max_over_ranks",
    "mean_over_ranks",
    "pad_to_longest",
    "rank",
    "rank_device",
    "shard",
    "sum_over_ranks",
    "world_size",
]

#: A gradient step in which this rank has no rows (it still joins the step's all-reduce).
NO_ROWS = "no rows"


# ---------------------------------------------------------------------- who am I
def world_size() -> int:
    """W: the number of ranks (``torchrun`` sets ``WORLD_SIZE``; 1 without it)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank, 0 ... W-1 (``RANK``)."""
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    """This process's rank on its machine (``LOCAL_RANK``): the index of its GPU."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    """Rank 0: the one that prints, holds the run lock and writes the output folder."""
    return rank() == 0


def init(device: torch.device) -> None:
    """Join the ranks (once per process; nothing to do in one process).

    The backend follows the device: NCCL on CUDA (each rank on GPU ``LOCAL_RANK``; more ranks
    than GPUs is a :class:`ConfigError`), gloo on CPU. The other ranks go quiet (``print`` and
    warnings: rank 0 says it once); their exceptions still reach stderr.
    """
    if world_size() == 1 or tdist.is_initialized():
        return
    if not is_main():
        _quiet()
    here = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size())))  # ranks on this machine
    if device.type == "cuda" and here > torch.cuda.device_count():
        why = f"one GPU per rank, and this machine has {torch.cuda.device_count()}"
        raise ConfigError("nproc_per_node", why, here)
    if device.type == "cuda":
        torch.cuda.set_device(local_rank())
        tdist.init_process_group("nccl", device_id=torch.device("cuda", local_rank()))
    else:
        tdist.init_process_group("gloo")
    atexit.register(_leave)


def _quiet() -> None:
    def print_nothing(*args, **kwargs):
        pass

    builtins.print = print_nothing
    warnings.simplefilter("ignore")


def _leave() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()


def rank_device(device: torch.device) -> torch.device:
    """The device this rank computes on: under ``torchrun``, CUDA means GPU ``LOCAL_RANK``."""
    if world_size() > 1 and device.type == "cuda":
        return torch.device("cuda", local_rank())
    return device


def _comm_device() -> torch.device:
    """Where the small tensors of a collective live: the GPU for NCCL, else the CPU."""
    if tdist.get_backend() == "nccl":
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


# ---------------------------------------------------------------------- the data
def shard(items: list) -> list:
    """This rank's contiguous share of ``items`` (all of them in one process): rank r gets
    ``items[r n/W : (r+1) n/W]``. ``len(items)`` must divide by W (checked before any compute)."""
    n, w = len(items), world_size()
    if w == 1:
        return items
    if n % w:
        raise ValueError(f"{n} items do not divide across {w} ranks")
    size = n // w
    return items[rank() * size : (rank() + 1) * size]


# ---------------------------------------------------------------------- the gradient
@torch.no_grad()
def average_gradients(params: list[torch.Tensor], *, poison: bool = False) -> None:
    """Replace each parameter's gradient by its mean over the ranks: ``g = (1/W) sum_r g_r``.

    One all-reduce of one flat buffer: every gradient (zeros where this rank has none) and, at
    the end, one flag per parameter saying whether this rank has a gradient for it. A parameter
    no rank has a gradient for keeps ``grad = None``, as in one process (the optimizer skips it).
    ``poison``: this rank's loss was not finite; its part of the buffer is NaN, so the average is
    NaN on every rank and every rank skips the update together (the trainer's NaN guard).
    """
    if world_size() == 1:
        return
    has = [p.grad is not None for p in params]
    parts = [
        (p.grad if h else torch.zeros_like(p)).reshape(-1).float() for p, h in zip(params, has)
    ]
    flags = torch.tensor(has, dtype=torch.float32, device=parts[0].device if parts else None)
    flat = torch.cat(parts + [flags])
    if poison:
        flat[: -len(params)] = float("nan")
    tdist.all_reduce(flat)  # the sum over ranks
    grads, used = flat[: -len(params)] / world_size(), flat[-len(params) :]
    for p, g, u in zip(params, grads.split([p.numel() for p in params]), used.tolist()):
        p.grad = g.view_as(p).to(p.dtype) if u > 0 else None


@torch.no_grad()
def broadcast(tensors) -> None:
    """Copy rank 0's values into every rank's ``tensors`` (in place), as DDP does at the start."""
    if world_size() == 1:
        return
    for t in tensors:
        tdist.broadcast(t.data, src=0)


# ---------------------------------------------------------------------- the metrics
def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """All ranks' rows of a per-row tensor ``[B_r, ...]``, rank 0's first: ``[sum_r B_r, ...]``.
    Every rank must hold as many rows (every rank plays as many groups)."""
    if world_size() == 1:
        return x
    kind = x.dtype
    y = (x.to(torch.uint8) if kind == torch.bool else x).to(_comm_device()).contiguous()
    parts = [torch.empty_like(y) for _ in range(world_size())]
    tdist.all_gather(parts, y)
    return torch.cat(parts).to(device=x.device, dtype=kind)


def all_gather_object(obj) -> list:
    """Every rank's ``obj`` (anything picklable), in rank order: ``[obj]`` in one process."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    tdist.all_gather_object(out, obj)
    return out


def _all_reduce(values: list[float], op) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    tdist.all_reduce(t, op=op)
    return [type(v)(x) for v, x in zip(values, t.tolist())]


def sum_over_ranks(values: list[float]) -> list[float]:
    """Each number summed over the ranks (ints stay ints)."""
    return values if world_size() == 1 else _all_reduce(values, tdist.ReduceOp.SUM)


def max_over_ranks(values: list[float]) -> list[float]:
    """Each number's maximum over the ranks."""
    return values if world_size() == 1 else _all_reduce(values, tdist.ReduceOp.MAX)


def mean_over_ranks(metrics: dict) -> dict:
    """Each metric's mean over the ranks that have a number for it (NaN and None left out; None
    when no rank has one)."""
    if world_size() == 1:
        return metrics
    every = all_gather_object(metrics)
    out = {}
    for key, value in metrics.items():
        nums = [d.get(key) for d in every]
        nums = [v for v in nums if isinstance(v, (int, float)) and not math.isnan(v)]
        out[key] = sum(nums) / len(nums) if nums else value
    return out


def pad_to_longest(steps: list, fill=NO_ROWS) -> list:
    """``steps`` padded with ``fill`` to the longest list of any rank: every rank takes as many
    gradient steps, so that their all-reduces pair up."""
    if world_size() == 1:
        return steps
    (most,) = max_over_ranks([len(steps)])
    return steps + [fill] * (most - len(steps))


def barrier() -> None:
    """Wait until every rank gets here."""
    if world_size() > 1:
        tdist.barrier()


# ---------------------------------------------------------------------- an RL step's arithmetic
def rank_share(loss_mask: torch.Tensor | None, agg_mode: str) -> float:
    """The weight ``w_r`` of this rank's loss (1 in one process), so that the ranks' averaged
    gradient ``(1/W) sum_r w_r g_r`` is the gradient of the loss over all ranks' rows of the
    gradient step.

    The loss is a mean over tokens (token-mean: ``w_r = W n_r / N``, with ``n_r`` this rank's
    generated tokens and ``N`` all ranks'), a mean over rows (the seq-mean modes: the same with
    the rows that have a token; 1 when every rank has as many), or a sum (token-sum: ``W``).
    A second loss in the same scalar gets the same weight: a critic's value loss (a token
    mean) is exact with token-mean, PPO's default; with the other modes, it and GCD's
    judgement loss are (near) the mean of the ranks' means. ``loss_mask=None``: no rows here
    (call it anyway: the ranks' counts are summed together).
    """
    w = world_size()
    if w == 1:
        return 1.0
    mask = loss_mask if loss_mask is not None else torch.zeros(0, 0)
    tokens, rows = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    all_tokens, all_rows = sum_over_ranks([tokens, rows])
    if agg_mode == "token-sum":
        return float(w)
    mine, everyone = (tokens, all_tokens) if agg_mode == "token-mean" else (rows, all_rows)
    return w * mine / everyone if everyone else 0.0


def rollout_row(batch, t_rollout: float) -> dict:
    """The rollout side of an RL step's history row, over all ranks' rows (gathered) and counts
    (summed): rewards, accuracy, format, zero-std groups, length, tokens per second."""
    scores, gid = batch.scores, batch.group_id
    groups = torch.unique(gid)
    zero_std = sum(bool((scores[gid == g] == scores[gid == g][0]).all()) for g in groups)
    zero_std, n_groups, gen_tokens = sum_over_ranks(
        [zero_std, len(groups), int(batch.loss_mask.sum())]
    )
    (t_rollout,) = max_over_ranks([t_rollout])
    scores = gather_rows(scores)
    correct, format_ok = gather_rows(batch.correct), gather_rows(batch.format_ok)
    return {
        "reward_mean": scores.mean().item(),
        "reward_std": scores.std().item(),
        "accuracy": correct.float().mean().item(),
        "format_rate": format_ok.float().mean().item(),
        "frac_reward_zero_std": zero_std / n_groups,
        "completion_length": gen_tokens / len(scores),
        "tokens_per_s": gen_tokens / max(t_rollout, 1e-9),
    }


def check_data_parallel(config, trainer_cls: type | None = None) -> None:
    """Under torchrun (W > 1 ranks), refuse with :class:`ConfigError`, before any compute, what
    does not split across the ranks; nothing to check in one process.

    The config's own limits (:meth:`RLConfig.check_data_parallel`, which a recipe extends:
    StarPO's ``dynamic`` refill, for one), and a trainer whose ``rollout`` would play the whole
    step on every rank (the class that defines its ``rollout`` does not say
    ``rollout_is_sharded = True`` beside it).
    """
    w = world_size()
    if w == 1:
        return
    config.check_data_parallel(w)  # the config's own limits (each recipe may add to them)
    if trainer_cls is not None:
        owner = next(k for k in trainer_cls.__mro__ if "rollout" in vars(k))
        if not vars(owner).get("rollout_is_sharded", False):
            why = (
                f"{owner.__name__}.rollout draws a step's tasks and plays all of them on every "
                "rank (it does not shard them yet): this recipe runs in one process only"
            )
            raise ConfigError("nproc_per_node", why, w)
