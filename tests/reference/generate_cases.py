"""Generate ``src/agentic_rl/data/reference_cases.json``: the cases ``agentic_rl.check`` runs.

Run it in a separate environment that has the reference frameworks (never the book's own venv)::

    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 trl==1.16.0
    /tmp/refvenv/bin/pip install --no-deps verl==0.9.1
    # what importing verl.trainer.ppo.core_algos needs:
    /tmp/refvenv/bin/pip install ray tensordict omegaconf codetiming orjson
    /tmp/refvenv/bin/python tests/reference/generate_cases.py

What comes from where (also written into the JSON's ``metadata``):

- verl: ``compute_grpo_outcome_advantage``, ``compute_gae_advantage_return``, ``kl_penalty``,
  ``compute_policy_loss_vanilla`` and ``agg_loss`` from ``verl.trainer.ppo.core_algos`` are
  *called*.
  The script refuses to run without verl (it never falls back to a transcription).
- TRL: the GRPO advantage and loss live inside ``GRPOTrainer``; the script calls TRL's own
  ``trl.trainer.utils.nanstd`` and reproduces the trainer's few lines (cited below, TRL 1.16.0
  ``trl/trainer/grpo_trainer.py``: advantages in ``_generate_and_score_completions``, the clipped
  loss, ``per_token_kl`` and the ``loss_type`` reductions in ``_compute_loss``).
- The convention grid (every combination of std estimator, epsilon, aggregation, ... that a
  learner's function might reproduce) is computed here in float64 by :func:`grid_*` below, and
  checked against the framework outputs wherever a grid point *is* a framework convention.

Inputs are float32 numbers on a coarse dyadic grid (so the JSON holds them exactly); expected
outputs are float64 computations on those inputs, rounded to 9 significant digits.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import numpy as np
import torch
import trl
import trl.trainer.utils as trl_utils

try:
    import verl
    import verl.trainer.ppo.core_algos as verl_core
    from omegaconf import OmegaConf
except Exception as exc:  # pragma: no cover - the script's precondition
    raise SystemExit(f"verl must be importable to generate the cases: {exc!r}")

OUT = Path(__file__).resolve().parents[2] / "src" / "agentic_rl" / "data" / "reference_cases.json"
F64 = torch.float64


def q(x, step):
    """Round to a multiple of ``step`` (a power of two) and return float32: exact in JSON."""
    return (torch.round(torch.as_tensor(x, dtype=F64) / step) * step).to(torch.float32)


def enc(x):
    """A tensor as nested lists: NaN -> "nan", None entries stay None (not compared)."""
    if isinstance(x, torch.Tensor):
        x = x.tolist()
    if isinstance(x, list):
        return [enc(v) for v in x]
    if x is None:
        return None
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, float):
        return float(f"{x:.9g}")
    return x


def masked(x, mask):
    """``x`` as lists with None where ``mask`` is 0 (positions no convention defines)."""
    return [[v if m else None for v, m in zip(r, mr)] for r, mr in zip(x.tolist(), mask.tolist())]


class Outputs:
    """Unique outputs of one case; every grid point / reference stores an index into them."""

    def __init__(self):
        self.items, self.keys = [], {}

    def add(self, components) -> int:
        e = [enc(c) for c in components]
        key = json.dumps(e)
        if key not in self.keys:
            self.keys[key] = len(self.items)
            self.items.append(e)
        return self.keys[key]


def close(a, b, tol=1e-7):
    a, b = torch.as_tensor(a, dtype=F64), torch.as_tensor(b, dtype=F64)
    return bool(torch.allclose(a, b, rtol=tol, atol=tol, equal_nan=True))


# ---------------------------------------------------------------------------- group advantages
GA_DIMS = [
    ("std", "std estimator", [
        ("unbiased", "the unbiased group std (divides by n-1, torch.std's default)"),
        ("biased", "the biased group std (divides by n)"),
        ("batch", "the std of the whole batch instead of the group's (TRL scale_rewards='batch')"),
        ("none", "no division by a std (Dr. GRPO, verl norm_adv_by_std_in_grpo=False)"),
    ]),
    ("eps", "epsilon and where it goes", [
        ("std+1e-6", "(x - mean) / (std + 1e-6)"),
        ("std+1e-4", "(x - mean) / (std + 1e-4)"),
        ("std+1e-8", "(x - mean) / (std + 1e-8)"),
        ("sqrt(var+1e-6)", "(x - mean) / sqrt(var + 1e-6), epsilon under the square root"),
        ("sqrt(var+1e-4)", "(x - mean) / sqrt(var + 1e-4), epsilon under the square root"),
        ("sqrt(var+1e-8)", "(x - mean) / sqrt(var + 1e-8), epsilon under the square root"),
        ("none", "(x - mean) / std, no epsilon (an all-equal group gives NaN)"),
    ]),
    ("singleton", "a group of one", [
        ("zero", "advantage 0"),
        ("score", "advantage = the score itself (verl: mean 0, std 1)"),
        ("nan", "NaN (the unbiased std of one sample)"),
    ]),
]


def grid_group_adv(scores, gids, std, eps, singleton):
    s = scores.to(F64)
    out = torch.empty_like(s)
    uniq = torch.unique(gids)
    batch_var = s.var(unbiased=True)
    for g in uniq.tolist():
        idx = (gids == g).nonzero().flatten()
        x = s[idx]
        n = len(x)
        mean = x.mean()
        if n == 1:
            out[idx] = {"zero": 0.0, "score": float(x[0]), "nan": float("nan")}[singleton]
            continue
        if std == "none":
            out[idx] = x - mean
            continue
        var = {"unbiased": x.var(unbiased=True), "biased": x.var(unbiased=False),
               "batch": batch_var}[std]
        if eps == "none":
            denom = var.sqrt()
        elif eps.startswith("std+"):
            denom = var.sqrt() + float(eps[4:])
        else:
            denom = (var + float(eps.split("+")[1].rstrip(")"))).sqrt()
        out[idx] = (x - mean) / denom
    return out


def verl_group_adv(scores, gids, norm=True):
    T = 3
    rewards = torch.zeros(len(scores), T, dtype=F64)
    rewards[:, 1] = scores.to(F64)
    mask = torch.ones(len(scores), T, dtype=F64)
    adv, _ = verl_core.compute_grpo_outcome_advantage(
        rewards, mask, np.array(gids.tolist()), epsilon=1e-6, norm_adv_by_std_in_grpo=norm)
    return adv[:, 0]


def trl_group_adv(scores, gids, scale):
    """TRL 1.16.0 grpo_trainer.py, _generate_and_score_completions, multi_objective_aggregation=
    'sum_then_normalize' (the default), one reward function of weight 1, applied to each group with
    num_generations = that group's size (TRL itself needs equal, contiguous groups)."""
    rewards_all = scores.to(F64)
    out = torch.empty_like(rewards_all)
    for g in torch.unique(gids).tolist():
        idx = (gids == g).nonzero().flatten()
        rewards = rewards_all[idx]
        num_generations = len(idx)
        mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
        mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
        if scale in ["group", "none"]:
            if num_generations > 1:
                std_rewards = trl_utils.nanstd(rewards.view(-1, num_generations), dim=1)
                std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
            else:
                std_rewards = torch.zeros_like(rewards)
        else:  # "batch": the std of every reward in the batch
            std_rewards = trl_utils.nanstd(rewards_all).expand_as(rewards)
        advantages = rewards - mean_grouped_rewards
        if scale != "none":
            advantages = advantages / (std_rewards + 1e-4)
        out[idx] = torch.nan_to_num(advantages, nan=0.0)
    return out


def group_adv_cases():
    g = torch.Generator().manual_seed(0)
    cases = []
    # 1. binary rewards, contiguous ragged groups, an all-equal group and a group of one
    sizes = [4, 4, 3, 5, 1, 3]
    gids = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    scores = (torch.rand(len(gids), generator=g) < 0.5).float()
    scores[4:8] = 1.0  # group 1: all equal
    cases.append(("binary", "0/1 rewards, ragged groups (sizes 4,4,3,5,1,3), an all-equal group"
                  " (rows 4-7) and a group of one (row 16)", scores, gids))
    # 2. continuous rewards, interleaved non-contiguous ids, a group of one
    gids = torch.tensor([7, 3, 7, 11, 3, 7, 11, 3, 5, 7, 11, 3])
    scores = q(torch.randn(len(gids), generator=g), 1 / 64)
    cases.append(("interleaved", "continuous rewards; group ids 7, 3, 11, 5 interleaved, not"
                  " contiguous and not sorted (row 8 is a group of one): rows are grouped by id,"
                  " not by position", scores, gids))
    # 3. a tiny spread (std ~ 4e-4): where epsilon's value and placement show
    gids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    scores = q(torch.tensor([0, 1, 2, 3, -1, 1, 1, 0, 0.5, 0.5, 0.5]) / 4096 + 0.25, 1 / 65536)
    cases.append(("tiny-spread", "rewards that differ by about 1e-4 within a group, and an"
                  " all-equal group (rows 8-10): here epsilon's value and placement matter",
                  scores, gids))
    # 4. a realistic batch: 8 prompts x 4 generations, partial-credit rewards
    gids = torch.arange(8).repeat_interleave(4)
    scores = q(torch.randint(0, 5, (32,), generator=g) / 4, 1 / 4)
    cases.append(("batch-8x4", "8 groups of 4, rewards in {0, .25, .5, .75, 1}", scores, gids))
    return cases


def build_group_advantages():
    cases = []
    grid = list(itertools.product(*[[o[0] for o in d[2]] for d in GA_DIMS]))
    for name, note, scores, gids in group_adv_cases():
        outs = Outputs()
        idx = [outs.add([grid_group_adv(scores, gids, *p)]) for p in grid]
        verl_a = verl_group_adv(scores, gids)
        verl_d = verl_group_adv(scores, gids, norm=False)
        refs = {
            "verl": outs.add([verl_a]),
            "verl-drgrpo": outs.add([verl_d]),
            "trl": outs.add([trl_group_adv(scores, gids, "group")]),
            "trl-batch": outs.add([trl_group_adv(scores, gids, "batch")]),
            "trl-none": outs.add([trl_group_adv(scores, gids, "none")]),
            "agentic_rl": idx[grid.index(("unbiased", "std+1e-6", "zero"))],
            "agentic_rl-batch": idx[grid.index(("batch", "std+1e-6", "zero"))],
            "agentic_rl-none": idx[grid.index(("none", "none", "zero"))],
        }
        # the grid reproduces the frameworks where it claims to
        assert close(verl_a, grid_group_adv(scores, gids, "unbiased", "std+1e-6", "score"), 1e-6)
        assert close(verl_d, grid_group_adv(scores, gids, "none", "none", "score"))
        assert close(trl_group_adv(scores, gids, "group"),
                     grid_group_adv(scores, gids, "unbiased", "std+1e-4", "zero"))
        assert close(trl_group_adv(scores, gids, "batch"),
                     grid_group_adv(scores, gids, "batch", "std+1e-4", "zero"))
        cases.append(dict(name=name, note=note, rtol=1e-5, atol=1e-6,
                          inputs=dict(scores=enc(scores), group_ids=enc(gids)),
                          outputs=outs.items, grid=idx, refs=refs))
    refs = {
        "verl": ("verl GRPO (unbiased std, +1e-6; a group of one keeps its score)",
                 dict(std="unbiased", eps="std+1e-6", singleton="score"),
                 "verl.trainer.ppo.core_algos.compute_grpo_outcome_advantage(epsilon=1e-6)"
                 " (called)"),
        "verl-drgrpo": ("verl Dr. GRPO (norm_adv_by_std_in_grpo=False: no std)",
                        dict(std="none", eps=None, singleton="score"),
                        "compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False) (called)"),
        "trl": ("TRL GRPO (unbiased std, +1e-4; scale_rewards='group')",
                dict(std="unbiased", eps="std+1e-4", singleton="zero"),
                "TRL GRPOTrainer advantage lines reproduced, with trl.trainer.utils.nanstd"
                " (called)"),
        "trl-batch": ("TRL GRPO scale_rewards='batch' (batch std, +1e-4)",
                      dict(std="batch", eps="std+1e-4", singleton="zero"), "as 'trl'"),
        "trl-none": ("TRL GRPO scale_rewards='none' (no std)",
                     dict(std="none", eps=None, singleton="zero"), "as 'trl'"),
        "agentic_rl": ("agentic_rl.group_advantages (unbiased std, +1e-6; a group of one gets 0)",
                       dict(std="unbiased", eps="std+1e-6", singleton="zero"), "grid"),
        "agentic_rl-batch": ("agentic_rl.group_advantages(scale='batch')",
                             dict(std="batch", eps="std+1e-6", singleton="zero"), "grid"),
        "agentic_rl-none": ("agentic_rl.group_advantages(scale='none') (Dr. GRPO)",
                            dict(std="none", eps=None, singleton="zero"), "grid"),
    }
    return dict(
        signature="fn(scores, group_ids) -> advantages",
        doc="scores: float32 [B]; group_ids: int64 [B] (any labels, not necessarily contiguous);"
            " returns one advantage per row, [B].",
        dims=dims_json(GA_DIMS), references=refs_json(refs),
        default_expect=["verl", "trl", "agentic_rl"], cases=cases)


# ---------------------------------------------------------------------------- GAE
GAE_DIMS = [
    ("mask", "masked (observation) tokens inside the recursion", [
        ("skip", "skipped: the recursion carries next value and running advantage across them"),
        ("through", "treated as ordinary steps (the mask only applied afterwards)"),
        ("reset", "treated as episode ends (next value and running advantage reset to 0)"),
    ]),
    ("whiten", "whitening of the advantages", [
        ("none", "none (raw GAE)"),
        ("masked", "whitened over the valid tokens of the batch (verl masked_whiten)"),
    ]),
]


def grid_gae(r, v, mask, gamma, lam, mode, whiten):
    r, v, m = r.to(F64), v.to(F64), mask.to(F64)
    B, T = v.shape
    adv = torch.zeros_like(v)
    nv = torch.zeros(B, dtype=F64)
    lg = torch.zeros(B, dtype=F64)
    for t in reversed(range(T)):
        mt = m[:, t] if mode != "through" else torch.ones(B, dtype=F64)
        delta = r[:, t] + gamma * nv - v[:, t]
        a = delta + gamma * lam * lg
        if mode == "reset":
            lg = mt * a
            nv = mt * v[:, t]
        else:
            lg = mt * a + (1 - mt) * lg
            nv = mt * v[:, t] + (1 - mt) * nv
        adv[:, t] = a
    ret = adv + v
    if whiten == "masked":
        n = m.sum()
        mean = (adv * m).sum() / n
        var = (((adv - mean) ** 2) * m).sum() / (n - 1)
        adv = (adv - mean) * torch.rsqrt(var + 1e-8)
    return adv, ret


def gae_cases():
    g = torch.Generator().manual_seed(1)
    # segments: (length, trainable); a multi-turn layout with prompt, actions, observations, padding
    layouts = [
        [[(3, 0), (4, 1), (3, 0), (2, 1), (2, 0)], [(2, 0), (10, 1), (2, 0)],
         [(1, 0), (1, 1), (2, 0), (3, 1), (3, 0), (1, 1), (3, 0)]],
        [[(2, 0), (2, 1), (4, 0), (2, 1), (1, 0), (3, 1)], [(4, 0), (5, 1), (5, 0)],
         [(1, 0), (3, 1), (3, 0), (3, 1), (4, 0)]],
    ]
    params = [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0), (1.0, 0.5)]
    notes = ["gamma 0.99, lam 0.95", "gamma 1, lam 1 (Monte-Carlo return minus V)",
             "gamma 0.9, lam 0 (one-step TD)", "gamma 1, lam 0.5"]
    cases = []
    for k, ((gamma, lam), note) in enumerate(zip(params, notes)):
        layout = layouts[k % 2]
        mask = torch.tensor([[m for n, m in row for _ in range(n)] for row in layout])
        B, T = mask.shape
        values = q(torch.randn(B, T, generator=g) * 0.5, 1 / 64)  # a critic outputs everywhere
        rewards = torch.zeros(B, T, dtype=torch.float32)
        for i in range(B):  # a reward on the last token of each action segment
            cols = mask[i].nonzero().flatten().tolist()
            ends = [c for c in cols if c + 1 >= T or mask[i, c + 1] == 0]
            for c in ends:
                rewards[i, c] = q(torch.randn(1, generator=g), 1 / 16)
        cases.append((f"multiturn-{k}", f"{note}; rows with prompt, 2-3 actions separated by"
                      " observation tokens (mask 0) and right padding", rewards, values, mask,
                      gamma, lam))
    return cases


def build_gae():
    cases = []
    grid = list(itertools.product(*[[o[0] for o in d[2]] for d in GAE_DIMS]))
    for name, note, r, v, mask, gamma, lam in gae_cases():
        outs = Outputs()

        def add(adv, ret):
            return outs.add([masked(adv, mask), masked(ret, mask)])

        idx = [add(*grid_gae(r, v, mask, gamma, lam, *p)) for p in grid]
        va, vr = verl_core.compute_gae_advantage_return(r.to(F64), v.to(F64), mask.to(F64),
                                                        gamma, lam)
        ga, gr = grid_gae(r, v, mask, gamma, lam, "skip", "masked")
        m = mask.bool()
        assert close(va[m], ga[m]) and close(vr[m], gr[m])
        refs = {"verl": add(va, vr), "agentic_rl": idx[grid.index(("skip", "none"))]}
        cases.append(dict(name=name, note=note, rtol=1e-5, atol=1e-5,
                          inputs=dict(token_rewards=enc(r), values=enc(v), mask=enc(mask)),
                          params=dict(gamma=gamma, lam=lam), outputs=outs.items, grid=idx,
                          refs=refs))
    refs = {
        "verl": ("verl compute_gae_advantage_return (skips masked tokens, whitens advantages)",
                 dict(mask="skip", whiten="masked"),
                 "verl.trainer.ppo.core_algos.compute_gae_advantage_return (called)"),
        "agentic_rl": ("agentic_rl.gae (skips masked tokens, no whitening)",
                       dict(mask="skip", whiten="none"), "grid"),
    }
    return dict(
        signature="fn(token_rewards, values, mask, gamma=..., lam=...) -> (advantages, returns)",
        doc="token_rewards, values: float32 [B, T]; mask: int64 [B, T] (the loss mask); returns"
            " advantages and returns [B, T] (returning only the advantages is accepted). Only"
            " positions with mask 1 are compared.",
        dims=dims_json(GAE_DIMS), references=refs_json(refs),
        default_expect=["verl", "agentic_rl"], cases=cases)


# ---------------------------------------------------------------------------- KL
KL_DIMS = [
    ("estimator", "KL estimator", [
        ("k1", "k1 = log(pi/pi_ref) (unbiased, can be negative)"),
        ("k2", "k2 = (log(pi/pi_ref))^2 / 2"),
        ("k3", "k3 = pi_ref/pi - log(pi_ref/pi) - 1 (DeepSeekMath eq. 4)"),
        ("abs", "|log(pi/pi_ref)|"),
    ]),
    ("direction", "direction", [
        ("forward", "KL(pi || pi_ref): log-ratio log(pi_ref/pi) = ref_logprobs - logprobs in k3"),
        ("reversed", "the arguments swapped (logprobs - ref_logprobs where ref - logprobs"
                     " belongs)"),
    ]),
    ("clamp", "clamping of the k3 value", [
        ("none", "none"),
        ("10", "clamped to [-10, 10] (verl low_var_kl)"),
    ]),
]


def grid_kl(lp, ref, est, direction, clamp):
    lp, ref = lp.to(F64), ref.to(F64)
    x = ref - lp if direction == "forward" else lp - ref  # log(pi_ref / pi)
    if est == "k1":
        out = -x
    elif est == "k2":
        out = 0.5 * x**2
    elif est == "abs":
        out = x.abs()
    else:
        x = x.clamp(-20, 20)
        out = torch.exp(x) - x - 1
        if clamp == "10":
            out = out.clamp(-10, 10)
    return out


def trl_kl(per_token_logps, ref_per_token_logps):
    """TRL 1.16.0 grpo_trainer.py _compute_loss, per_token_kl (no clamp)."""
    return torch.exp(ref_per_token_logps - per_token_logps) - (
        ref_per_token_logps - per_token_logps) - 1


def kl_cases():
    g = torch.Generator().manual_seed(2)
    cases = []
    for name, note, scale in [("moderate", "log-ratios of about +-0.3", 0.3),
                              ("large", "log-ratios up to about +-4 (k3 above 10 on some"
                               " tokens, where verl clamps)", 1.6),
                              ("small", "log-ratios of about +-0.02", 0.02)]:
        lp = q(-torch.rand(4, 6, generator=g) * 4 - 0.05, 1 / 256)
        ref = q(lp + torch.randn(4, 6, generator=g) * scale, 1 / 256)
        cases.append((name, note, lp, ref))
    return cases


def build_kl():
    cases = []
    grid = list(itertools.product(*[[o[0] for o in d[2]] for d in KL_DIMS]))
    for name, note, lp, ref in kl_cases():
        outs = Outputs()
        idx = [outs.add([grid_kl(lp, ref, *p)]) for p in grid]
        refs = {"trl-k3": outs.add([trl_kl(lp.to(F64), ref.to(F64))])}
        for vname, kind in [("verl-k3", "low_var_kl"), ("verl-k1", "k1"), ("verl-k2", "k2"),
                            ("verl-abs", "abs")]:
            refs[vname] = outs.add([verl_core.kl_penalty(lp.to(F64), ref.to(F64), kind)])
        assert refs["trl-k3"] == idx[grid.index(("k3", "forward", "none"))]
        assert close(outs.items[refs["verl-k3"]][0], grid_kl(lp, ref, "k3", "forward", "10"))
        refs["agentic_rl"] = idx[grid.index(("k3", "forward", "none"))]
        rtol, atol = (1e-4, 1e-6)
        cases.append(dict(name=name, note=note, rtol=rtol, atol=atol,
                          inputs=dict(logprobs=enc(lp), ref_logprobs=enc(ref)),
                          outputs=outs.items, grid=idx, refs=refs))
    refs = {
        "trl-k3": ("TRL GRPO per_token_kl (k3, no clamp)",
                   dict(estimator="k3", direction="forward", clamp="none"),
                   "TRL GRPOTrainer._compute_loss per_token_kl line reproduced"),
        "verl-k3": ("verl kl_penalty 'low_var_kl'/'k3' (k3 clamped to [-10, 10])",
                    dict(estimator="k3", direction="forward", clamp="10"),
                    "verl.trainer.ppo.core_algos.kl_penalty (called)"),
        "verl-k1": ("verl kl_penalty 'k1'", dict(estimator="k1", direction="forward",
                                                 clamp=None), "kl_penalty (called)"),
        "verl-k2": ("verl kl_penalty 'k2'/'mse'", dict(estimator="k2", direction=None,
                                                       clamp=None), "kl_penalty (called)"),
        "verl-abs": ("verl kl_penalty 'abs'", dict(estimator="abs", direction=None, clamp=None),
                     "kl_penalty (called)"),
        "agentic_rl": ("agentic_rl.kl_penalty (k3, the package default)",
                       dict(estimator="k3", direction="forward", clamp="none"), "grid"),
    }
    return dict(
        signature="fn(logprobs, ref_logprobs) -> per-token KL [B, T]",
        doc="logprobs, ref_logprobs: float32 [B, T] (log-probs of the sampled tokens under the"
            " policy and the reference); returns the per-token estimate of KL(pi || pi_ref).",
        dims=dims_json(KL_DIMS), references=refs_json(refs),
        default_expect=["trl-k3", "verl-k3", "agentic_rl"], cases=cases)


# ---------------------------------------------------------------------------- aggregation
AGG_OPTIONS = [
    ("token-mean", "token-mean: sum over valid tokens / number of valid tokens"),
    ("seq-mean-token-mean", "seq-mean-token-mean: mean over each row's valid tokens, then over"
     " the rows that have any (empty rows excluded)"),
    ("seq-mean-token-mean-all-rows", "seq-mean-token-mean with empty rows counted in the"
     " mean over rows (TRL loss_type='grpo')"),
    ("seq-mean-token-sum", "seq-mean-token-sum: sum over each row's valid tokens, mean over rows"),
    ("seq-mean-token-sum-norm", "seq-mean-token-sum-norm: token sum / (non-empty rows x padded"
     " width T)"),
    ("dr-grpo-all-rows", "token sum / (all rows x padded width T) (TRL loss_type='dr_grpo')"),
    ("token-sum", "token-sum: the plain sum over valid tokens"),
    ("unmasked-mean", "the mean over every position, padding included (the mask ignored)"),
]


def grid_agg(lm, mask, mode):
    lm, m = lm.to(F64), mask.to(F64)
    tok_sum, n_tok = (lm * m).sum(-1), m.sum(-1)
    valid = (n_tok > 0).to(F64)
    B, T = lm.shape
    if mode == "token-mean":
        return tok_sum.sum() / n_tok.sum()
    if mode == "token-sum":
        return tok_sum.sum()
    if mode == "unmasked-mean":
        return lm.mean()
    if mode == "seq-mean-token-mean":
        return (tok_sum / n_tok.clamp(min=1) * valid).sum() / valid.sum()
    if mode == "seq-mean-token-mean-all-rows":
        return (tok_sum / n_tok.clamp(min=1)).mean()
    if mode == "seq-mean-token-sum":
        return (tok_sum * valid).sum() / valid.sum()
    if mode == "seq-mean-token-sum-norm":
        return (tok_sum * valid).sum() / valid.sum() / T
    if mode == "dr-grpo-all-rows":
        return tok_sum.sum() / (B * T)
    raise ValueError(mode)


def trl_reduce(per_token_loss, mask, loss_type):
    """TRL 1.16.0 grpo_trainer.py _compute_loss reductions (one process, no accumulation;
    max_completion_length = the padded width)."""
    mask = mask.to(per_token_loss.dtype)
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * per_token_loss.size(1))
    if loss_type == "dapo":  # num_items_in_batch = the number of valid tokens (one process)
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    raise ValueError(loss_type)


VERL_AGG = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
            "token-sum"]
TRL_AGG = {"grpo": "seq-mean-token-mean-all-rows", "bnpo": "token-mean", "dapo": "token-mean",
           "dr_grpo": "dr-grpo-all-rows"}


def ragged_mask(g, B, T, empty_row=None, prompt=0):
    lengths = torch.randint(1, T - prompt + 1, (B,), generator=g)
    lengths[0] = T - prompt
    lengths[1] = 1
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        mask[i, prompt:prompt + n] = 1
    if empty_row is not None:
        mask[empty_row] = 0
    return mask


def agg_cases():
    g = torch.Generator().manual_seed(3)
    out = []
    for name, note, B, T, empty in [
            ("ragged", "rows of very different lengths (10, 1, ...): token-mean and seq-mean"
             " differ", 4, 10, None),
            ("empty-row", "ragged rows and one row with no valid token (row 3)", 5, 8, 3),
            ("wide", "6 rows, width 12", 6, 12, None)]:
        mask = ragged_mask(g, B, T, empty)
        lm = q(torch.randn(B, T, generator=g), 1 / 128)  # garbage on padding too
        out.append((name, note, lm, mask))
    return out


def agg_refs_values(lm, mask, outs):
    refs = {}
    for mode in VERL_AGG:
        v = verl_core.agg_loss(lm.to(F64), mask.to(F64), mode)
        assert close(v, grid_agg(lm, mask, mode)), mode
        refs[f"verl-{mode}"] = outs.add([v])
    for lt, mode in TRL_AGG.items():
        v = trl_reduce(lm.to(F64), mask, lt)
        assert close(v, grid_agg(lm, mask, mode)), lt
        refs[f"trl-{lt}"] = outs.add([v])
    return refs


def agg_refs_meta(prefix_dims=None):
    refs = {}
    for mode in VERL_AGG:
        refs[f"verl-{mode}"] = (f"verl agg_loss '{mode}'", dict(agg=mode),
                                "verl.trainer.ppo.core_algos.agg_loss (called)")
    for lt, mode in TRL_AGG.items():
        refs[f"trl-{lt}"] = (f"TRL GRPO loss_type='{lt}'", dict(agg=mode),
                             "TRL GRPOTrainer._compute_loss reduction reproduced")
    return refs


def build_aggregate():
    dims = [("agg", "loss aggregation", AGG_OPTIONS)]
    cases = []
    for name, note, lm, mask in agg_cases():
        outs = Outputs()
        idx = [outs.add([grid_agg(lm, mask, o[0])]) for o in AGG_OPTIONS]
        refs = agg_refs_values(lm, mask, outs)
        refs["agentic_rl"] = idx[0]
        cases.append(dict(name=name, note=note, rtol=1e-5, atol=1e-7,
                          inputs=dict(loss_mat=enc(lm), mask=enc(mask)),
                          outputs=outs.items, grid=idx, refs=refs))
    refs = agg_refs_meta()
    refs["agentic_rl"] = ("agentic_rl.aggregate (default mode 'token-mean')",
                          dict(agg="token-mean"), "grid")
    return dict(
        signature="fn(loss_mat, mask) -> scalar",
        doc="loss_mat: float32 [B, T] (padding holds garbage); mask: int64 [B, T]; returns the"
            " scalar loss. To check one mode of a multi-mode function, pass"
            " functools.partial(fn, mode=...) and expect= the reference of that mode.",
        dims=dims_json(dims), references=refs_json(refs),
        default_expect=sorted(refs), cases=cases)


# ---------------------------------------------------------------------------- policy loss
PL_DIMS = [
    ("clip", "clipped surrogate", [
        ("ppo", "max(-A*ratio, -A*clip(ratio)) (PPO's pessimistic bound)"),
        ("optimistic", "min(-A*ratio, -A*clip(ratio)) (min and max swapped)"),
        ("clip-only", "-A*clip(ratio) only"),
        ("unclipped", "-A*ratio, no clipping"),
    ]),
    ("bounds", "clip bounds", [
        ("given", "[1 - epsilon, 1 + epsilon_high]"),
        ("symmetric", "[1 - epsilon, 1 + epsilon] (epsilon_high ignored)"),
        ("swapped", "[1 - epsilon_high, 1 + epsilon] (low and high swapped)"),
    ]),
    ("dual", "dual clip for negative advantages", [
        ("none", "none"),
        ("3", "min(loss, -3*A) where A < 0 (verl's clip_ratio_c=3.0)"),
    ]),
    ("ratio", "importance ratio", [
        ("new/old", "exp(logprobs - old_logprobs)"),
        ("old/new", "exp(old_logprobs - logprobs), inverted"),
    ]),
    ("sign", "sign", [
        ("loss", "a loss to minimise (minus the objective)"),
        ("objective", "the objective itself (sign flipped: gradient ascent on a loss)"),
    ]),
    ("agg", "loss aggregation", AGG_OPTIONS),
]


def grid_pl(lp, old, adv, mask, eps, eps_high, clip, bounds, dual, ratio_kind, sign, agg):
    lp, old, adv = lp.to(F64), old.to(F64), adv.to(F64)
    lr = (lp - old) if ratio_kind == "new/old" else (old - lp)
    ratio = torch.exp(lr.clamp(-20, 20))
    lo, hi = {"given": (eps, eps_high), "symmetric": (eps, eps),
              "swapped": (eps_high, eps)}[bounds]
    l1 = -adv * ratio
    l2 = -adv * ratio.clamp(1 - lo, 1 + hi)
    lm = {"ppo": torch.maximum(l1, l2), "optimistic": torch.minimum(l1, l2),
          "clip-only": l2, "unclipped": l1}[clip]
    if dual == "3":
        lm = torch.where(adv < 0, torch.minimum(lm, -adv * 3.0), lm)
    if sign == "objective":
        lm = -lm
    return grid_agg(lm, mask, agg)


def trl_per_token_loss(per_token_logps, old_per_token_logps, advantages, eps_low, eps_high):
    """TRL 1.16.0 grpo_trainer.py _compute_loss, importance_sampling_level='token', delta=None."""
    log_ratio = per_token_logps - old_per_token_logps
    coef_1 = torch.exp(log_ratio)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss1 = coef_1 * advantages
    per_token_loss2 = coef_2 * advantages
    return -torch.min(per_token_loss1, per_token_loss2)


def pl_cases():
    g = torch.Generator().manual_seed(4)
    out = []
    specs = [
        ("symmetric", "epsilon 0.2 (epsilon_high = epsilon), log-ratios of about +-0.3, ragged"
         " rows", 0.2, 0.2, 0.3, None, False),
        ("clip-higher", "epsilon 0.2, epsilon_high 0.28 (DAPO's clip-higher)", 0.2, 0.28, 0.3,
         None, False),
        ("dual-clip", "epsilon 0.1, epsilon_high 0.3; some ratios above 3 with negative"
         " advantages (where dual clip acts), an empty row (row 4)", 0.1, 0.3, 0.9, 4, False),
        ("per-token-adv", "epsilon 0.2; advantages that vary along the row (as from GAE)", 0.2,
         0.2, 0.3, None, True),
    ]
    for name, note, eps, eps_high, spread, empty, per_token in specs:
        B, T = (5, 8) if empty is not None else (4, 9)
        mask = ragged_mask(g, B, T, empty)
        old = q(-torch.rand(B, T, generator=g) * 3 - 0.05, 1 / 256)
        lp = q(old + torch.randn(B, T, generator=g) * spread, 1 / 256)
        if per_token:
            adv = q(torch.randn(B, T, generator=g), 1 / 64)
        else:
            adv = q(torch.randn(B, 1, generator=g), 1 / 64).expand(B, T).contiguous()
        if name == "dual-clip":
            adv[0, :] = -abs(adv[0, 0]) - 0.25
            lp[0, :4] = old[0, :4] + 1.5  # ratio exp(1.5) = 4.5 > 3 with A < 0
        out.append((name, note, lp, old, adv, mask, eps, eps_high))
    return out


def build_policy_loss():
    cases = []
    grid = list(itertools.product(*[[o[0] for o in d[2]] for d in PL_DIMS]))
    for name, note, lp, old, adv, mask, eps, eps_high in pl_cases():
        outs = Outputs()
        idx = [outs.add([grid_pl(lp, old, adv, mask, eps, eps_high, *p)]) for p in grid]
        refs = {}
        cfg = OmegaConf.create(dict(clip_ratio=eps, clip_ratio_low=eps, clip_ratio_high=eps_high,
                                    clip_ratio_c=3.0, global_batch_info={}))
        for mode in VERL_AGG[:-1]:
            v, _ = verl_core.compute_policy_loss_vanilla(
                old.to(F64), lp.to(F64), adv.to(F64), mask.to(F64), loss_agg_mode=mode, config=cfg)
            refs[f"verl-{mode}"] = outs.add([v])
            p = ("ppo", "given", "3", "new/old", "loss", mode)
            assert close(v, grid_pl(lp, old, adv, mask, eps, eps_high, *p)), (name, mode)
        ptl = trl_per_token_loss(lp.to(F64), old.to(F64), adv.to(F64), eps, eps_high)
        for lt, mode in TRL_AGG.items():
            v = trl_reduce(ptl, mask, lt)
            refs[f"trl-{lt}"] = outs.add([v])
            p = ("ppo", "given", "none", "new/old", "loss", mode)
            assert close(v, grid_pl(lp, old, adv, mask, eps, eps_high, *p)), (name, lt)
        for mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
            p = ("ppo", "given", "none", "new/old", "loss", mode)
            refs[f"agentic_rl-{mode}"] = idx[grid.index(p)]
        cases.append(dict(name=name, note=note, rtol=1e-5, atol=1e-7,
                          inputs=dict(logprobs=enc(lp), old_logprobs=enc(old),
                                      advantages=enc(adv), mask=enc(mask)),
                          params=dict(epsilon=eps, epsilon_high=eps_high),
                          outputs=outs.items, grid=idx, refs=refs))
    base = dict(clip="ppo", bounds="given", ratio="new/old", sign="loss")
    refs = {}
    for mode in VERL_AGG[:-1]:
        refs[f"verl-{mode}"] = (f"verl compute_policy_loss_vanilla (dual clip 3), agg '{mode}'",
                                dict(base, dual="3", agg=mode),
                                "verl.trainer.ppo.core_algos.compute_policy_loss_vanilla (called)")
    for lt, mode in TRL_AGG.items():
        refs[f"trl-{lt}"] = (f"TRL GRPO loss, loss_type='{lt}'", dict(base, dual="none", agg=mode),
                             "TRL GRPOTrainer._compute_loss lines reproduced")
    for mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        refs[f"agentic_rl-{mode}"] = (f"agentic_rl.policy_loss(agg='{mode}')",
                                      dict(base, dual="none", agg=mode), "grid")
    return dict(
        signature="fn(logprobs, old_logprobs, advantages, mask, epsilon=..., epsilon_high=...)"
                  " -> loss",
        doc="logprobs, old_logprobs, advantages: float32 [B, T]; mask: int64 [B, T]; the clip"
            " range is passed by keyword when the function takes it (epsilon / eps / clip_ratio /"
            " cliprange; epsilon_high / clip_ratio_high / cliprange_high). Returns a scalar loss"
            " to minimise, or a (loss, metrics) tuple, or the per-token loss matrix [B, T] (then"
            " its token-mean over the mask is checked).",
        dims=dims_json(PL_DIMS), references=refs_json(refs),
        default_expect=sorted(refs), cases=cases)


# ---------------------------------------------------------------------------- assembly
def dims_json(dims):
    return [dict(name=n, label=label, options=[dict(name=o, text=t) for o, t in opts])
            for n, label, opts in dims]


def refs_json(refs):
    return {k: dict(label=label, dims=d, source=src) for k, (label, d, src) in refs.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    data = dict(
        metadata=dict(
            generator="tests/reference/generate_cases.py",
            torch=torch.__version__,
            trl=trl.__version__,
            verl=verl.__version__,
            verl_imported=True,
            provenance=(
                "Reference outputs named verl-* were computed by calling verl "
                f"{verl.__version__} (pip wheel, imported: verl.trainer.ppo.core_algos "
                "compute_grpo_outcome_advantage, compute_gae_advantage_return, kl_penalty, "
                "compute_policy_loss_vanilla, agg_loss). Outputs named trl-* reproduce the few "
                f"lines of TRL {trl.__version__} trl/trainer/grpo_trainer.py "
                "(_generate_and_score_completions: group mean, nanstd, + 1e-4; _compute_loss: "
                "the clipped loss, per_token_kl, the loss_type reductions) and call "
                "trl.trainer.utils.nanstd. Outputs named agentic_rl* and the convention grid "
                "are computed by this script's float64 transcription, which is asserted equal "
                "to the framework outputs wherever a grid point is a framework convention."),
            notes=[
                "TRL needs equal, contiguous groups; its advantage lines were applied to each "
                "group with num_generations = the group's size (a group of one takes TRL's "
                "num_generations == 1 branch: std 0, advantage 0).",
                "verl gives a group of one mean 0 and std 1, so its advantage is the score "
                "itself; agentic_rl and TRL give 0.",
                "verl 0.9.1 seq-mean-token-sum-norm divides by the number of non-empty rows and "
                "by the padded width; TRL dr_grpo divides by all rows times "
                "max_completion_length (here the padded width).",
            ],
            inputs="float32 on a dyadic grid (exact in JSON); masks and group ids int64",
            outputs="float64, 9 significant digits; 'nan' = NaN expected; null = not compared",
        ),
        kinds=dict(
            group_advantages=build_group_advantages(),
            gae=build_gae(),
            kl=build_kl(),
            policy_loss=build_policy_loss(),
            aggregate=build_aggregate(),
        ),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    args.out.write_text(text + "\n")
    print(f"wrote {args.out} ({len(text) / 1024:.1f} KiB)")


if __name__ == "__main__":
    main()
