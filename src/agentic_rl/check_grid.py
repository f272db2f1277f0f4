"""The grid of conventions ``check_implementation`` compares a function with.

The shipped reference cases (``agentic_rl/data/reference_cases.json``, from verl and TRL) hold
each case's expected output under every combination of conventions; :func:`spec` adds to that grid
the common bugs no framework ships, computed here from the same inputs (see the section below), so
that the check can name them.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
from functools import lru_cache
from importlib import resources

import torch

def tensor(x, dtype):
    return torch.tensor(x, dtype=dtype)


@lru_cache(maxsize=1)
def load_reference_cases() -> dict:
    """The reference cases (parsed JSON): ``metadata`` and, per kind, dims, references, cases."""
    text = resources.files("agentic_rl").joinpath("data/reference_cases.json").read_text()
    return json.loads(text)


def _expected(component):
    """JSON nested lists -> (values tensor, compare mask, nan mask)."""
    flat = component

    def conv(x):
        if isinstance(x, list):
            return [conv(v) for v in x]
        if x is None:
            return (0.0, False, False)
        if x == "nan":
            return (0.0, True, True)
        return (float(x), True, False)

    c = conv(flat)

    def pick(x, i):
        return [pick(v, i) for v in x] if isinstance(x, list) else x[i]

    return (
        torch.tensor(pick(c, 0), dtype=torch.float64),
        torch.tensor(pick(c, 1)),
        torch.tensor(pick(c, 2)),
    )


# ---------------------------------------------------------------------------- added conventions
# Common bugs that no framework ships, added to the shipped grid so that the check can name them:
# new options of a shipped dimension, and new dimensions whose first option is what every reference
# does. Their outputs are computed here from each case's inputs; the shipped grid points keep the
# shipped outputs. An option's ``near`` is the reference option it is a variant of: such a
# difference counts half, so that e.g. a biased whitening is compared with the whitened reference.
_F64 = torch.float64

_EXTRA_OPTIONS = {
    "gae": {
        "mask": [
            {"name": "raw-next", "text": "an off-by-one bootstrap: V(s_next) read from the raw "
             "next column values[:, t+1], masked or not, instead of the next policy token's "
             "value (the running advantage does skip the masked tokens)", "near": "skip"},
        ],
        "whiten": [
            {"name": "biased", "text": "whitened with the biased variance (divides by n, not "
             "n-1)", "near": "masked"},
            {"name": "padded", "text": "whitened with the mean and variance of every position, "
             "padding and masked tokens included", "near": "masked"},
        ],
    },
}

_EXTRA_DIMS = {
    "gae": [
        {"name": "terminal", "label": "the value after the last token", "options": [
            {"name": "zero", "text": "0 (the episode ends there)"},
            {"name": "self", "text": "a non-zero terminal value: V(s_H) = V(s_t) of the last "
             "token itself"},
            {"name": "last", "text": "a non-zero terminal value: the row's last value "
             "values[:, -1]"},
        ]},
        {"name": "trace", "label": "the recursion's factor", "options": [
            {"name": "gamma*lam", "text": "A_t = delta_t + gamma * lam * A_next"},
            {"name": "lam", "text": "gamma missing: A_t = delta_t + lam * A_next (λ where γλ "
             "belongs)"},
        ]},
        {"name": "returns", "label": "the returns", "options": [
            {"name": "adv+values", "text": "returns = advantages + values"},
            {"name": "adv", "text": "returns = advantages (forgot + values)"},
        ]},
    ],
    "group_advantages": [
        {"name": "baseline", "label": "the mean subtracted", "options": [
            {"name": "group", "text": "the group's mean"},
            {"name": "batch", "text": "the mean of the whole batch, not the group's"},
        ]},
    ],
}

#: sentences that replace the per-dimension ones when the options together make one known bug,
#: and the dimensions that bug makes moot (left out of the description of your convention)
_COMBOS = {
    "group_advantages": [
        ({"baseline": "batch", "std": "batch"},
         "whole-batch normalisation: yours subtracts the mean and divides by the std of the whole "
         "batch; {ref} normalises each group by its own mean and std (the group ids are ignored)",
         ("singleton",)),
    ],
}


def combos(spec: dict, closest) -> list:
    """The known combinations (``_COMBOS``) the function's convention is."""
    refs = spec["references"][closest.ref]["dims"]
    return [
        c for c in _COMBOS.get(spec["kind"], [])
        if all(closest.yours[dn] == [o] and refs.get(dn) not in (None, o) for dn, o in c[0].items())
    ]


def _gae_recursion(r, v, m, gamma, lam, mode, terminal, trace):
    """Raw advantages (not masked) of one grid point, float64."""
    B, T = v.shape
    coef = gamma * lam if trace == "gamma*lam" else lam
    idx = torch.arange(T).expand(B, T)
    last = torch.where(m > 0, idx, torch.full_like(idx, -1)).max(dim=1).values
    if terminal == "zero":
        nv = torch.zeros(B, dtype=_F64)
    elif terminal == "self":
        nv = v[torch.arange(B), last.clamp(min=0)] * (last >= 0)
    else:
        nv = v[:, T - 1].clone()
    lg = torch.zeros(B, dtype=_F64)
    adv = torch.zeros_like(v)
    for t in reversed(range(T)):
        mt = torch.ones(B, dtype=_F64) if mode == "through" else m[:, t]
        if mode == "raw-next" and t + 1 < T:
            nv = v[:, t + 1]
        a = r[:, t] + gamma * nv - v[:, t] + coef * lg
        if mode == "reset":
            lg, nv = mt * a, mt * v[:, t]
        else:
            lg, nv = mt * a + (1 - mt) * lg, mt * v[:, t] + (1 - mt) * nv
        adv[:, t] = a
    return adv


def _gae_point(case: dict, p: dict, memo: dict) -> list:
    """The expected ``[advantages, returns]`` of GAE grid point ``p`` on ``case``."""
    inp, prm = case["inputs"], case["params"]
    key = (p["mask"], p["terminal"], p["trace"])
    if "inputs" not in memo:
        memo["inputs"] = tuple(tensor(inp[k], _F64) for k in ("token_rewards", "values", "mask"))
    r, v, m = memo["inputs"]
    if key not in memo:
        memo[key] = _gae_recursion(r, v, m, prm["gamma"], prm["lam"], *key)
    adv = memo[key]
    ret = adv + v if p["returns"] == "adv+values" else adv.clone()
    if p["whiten"] in ("masked", "biased"):
        n = m.sum()
        mean = (adv * m).sum() / n
        var = (((adv - mean) ** 2) * m).sum() / (n - 1 if p["whiten"] == "masked" else n)
        adv = (adv - mean) * torch.rsqrt(var + 1e-8)
    elif p["whiten"] == "padded":
        a0 = adv * m
        adv = (a0 - a0.mean()) * torch.rsqrt(a0.var() + 1e-8)
    cmp = m > 0
    return [(torch.where(cmp, x, 0.0), cmp, torch.zeros_like(cmp)) for x in (adv, ret)]


def _group_adv_point(case: dict, p: dict, memo: dict) -> list:
    """The expected advantages of group-advantage grid point ``p`` on ``case``: in float32 where
    the mean is the whole batch's (as a learner's code on the float32 scores computes it: on a
    tiny spread the float32 rounding of that mean is above the tolerance), else float64."""
    whole = p["baseline"] == "batch"
    if "groups" not in memo:
        gids = tensor(case["inputs"]["group_ids"], torch.int64)
        memo["groups"] = [(gids == g).nonzero().flatten() for g in torch.unique(gids).tolist()]
        memo[_F64] = tensor(case["inputs"]["scores"], _F64)
        memo[torch.float32] = tensor(case["inputs"]["scores"], torch.float32)
    s = memo[torch.float32 if whole else _F64]
    out = torch.empty_like(s)
    for idx in memo["groups"]:
        x = s[idx]
        mean = s.mean() if whole else x.mean()
        if len(x) == 1 and not (whole and p["std"] in ("batch", "none")):
            out[idx] = {"zero": 0.0, "score": float(x[0]), "nan": math.nan}[p["singleton"]]
            continue
        if p["std"] == "none":
            out[idx] = x - mean
            continue
        var = s.var() if p["std"] == "batch" else x.var(unbiased=p["std"] == "unbiased")
        eps = p["eps"]
        if eps == "none":
            denom = var.sqrt()
        elif eps.startswith("std+"):
            denom = var.sqrt() + float(eps[4:])
        else:
            denom = (var + float(eps.split("+")[1].rstrip(")"))).sqrt()
        out[idx] = (x - mean) / denom
    out = out.to(_F64)
    return [(torch.nan_to_num(out, nan=0.0), torch.ones_like(out, dtype=torch.bool), out.isnan())]


_EXTRA_POINT = {"gae": _gae_point, "group_advantages": _group_adv_point}


def _key(out: list) -> tuple:
    return tuple((v.numpy().tobytes(), c.numpy().tobytes(), n.numpy().tobytes()) for v, c, n in out)


@lru_cache(maxsize=None)
def spec(kind: str) -> dict:
    """The reference cases of ``kind`` with the conventions added here: a copy of the shipped
    spec whose cases hold ``expected`` (every output as tensors) and the extended ``grid``."""
    spec = copy.deepcopy(load_reference_cases()["kinds"][kind])
    spec["kind"] = kind
    old_names = [[o["name"] for o in d["options"]] for d in spec["dims"]]
    old_pos = {pt: k for k, pt in enumerate(itertools.product(*old_names))}
    for d in spec["dims"]:
        d["options"] += copy.deepcopy(_EXTRA_OPTIONS.get(kind, {}).get(d["name"], []))
    new_dims = copy.deepcopy(_EXTRA_DIMS.get(kind, []))
    for d in new_dims:
        d["extra"] = True
    spec["dims"] += new_dims
    for ref in spec["references"].values():
        for d in new_dims:
            ref["dims"].setdefault(d["name"], d["options"][0]["name"])
    names = [d["name"] for d in spec["dims"]]
    n_old = len(old_names)
    for case in spec["cases"]:
        expected = [[_expected(comp) for comp in o] for o in case["outputs"]]
        if kind not in _EXTRA_POINT:
            case["expected"] = expected
            continue
        index = {_key(o): k for k, o in enumerate(expected)}
        grid, memo = [], {}
        for pt in itertools.product(*[[o["name"] for o in d["options"]] for d in spec["dims"]]):
            shipped = all(pt[k] == new_dims[k - n_old]["options"][0]["name"]
                          for k in range(n_old, len(pt)))
            if shipped and pt[:n_old] in old_pos:
                grid.append(case["grid"][old_pos[pt[:n_old]]])
                continue
            out = _EXTRA_POINT[kind](case, dict(zip(names, pt)), memo)
            k = index.setdefault(_key(out), len(expected))
            if k == len(expected):
                expected.append(out)
            grid.append(k)
        case["expected"], case["grid"] = expected, grid
    return spec
