"""Check your implementation: run an advantage, KL, policy-loss or aggregation function against
reference cases generated from verl and TRL, and say *which convention* differs, not only "wrong".

The cases ship as data (``agentic_rl/data/reference_cases.json``, made by
``tests/reference/generate_cases.py`` from verl 0.9.1 and TRL 1.16.0, see its ``metadata``), so
checking needs neither framework. Each case holds fixed inputs and the expected output under every
combination of conventions (std estimator, epsilon and its placement, group of one, mask handling,
aggregation, KL estimator and direction, clip bounds, ...): the combination your function reproduces
on every case names your conventions; comparing it with the references names the difference.
Common bugs no framework ships are added to that grid here, computed from the same inputs: for GAE
the off-by-one bootstrap from the raw next column, a non-zero terminal value, lam without gamma,
returns without the values, whitening with the biased variance or over the padding too; for group
advantages the whole-batch normalisation. A failed report names the convention first, then one case
with the first position that differs (yours vs the reference, and its row; ``·`` marks a position
that is not compared).

>>> from agentic_rl.advantages import group_advantages
>>> check_implementation(group_advantages, "group_advantages").passed
True

Kinds and the call each makes (tensors are float32, masks and group ids int64; shapes ``[B, T]``):

- ``"group_advantages"``: ``fn(scores [B], group_ids [B]) -> advantages [B]``
- ``"gae"``: ``fn(token_rewards, values, mask, gamma=..., lam=...) -> (advantages, returns)``
- ``"kl"``: ``fn(logprobs, ref_logprobs) -> per-token KL [B, T]``
- ``"policy_loss"``: ``fn(logprobs, old_logprobs, advantages, mask, epsilon=..., epsilon_high=...)
  -> loss`` (or ``(loss, metrics)``, or the per-token loss ``[B, T]``)
- ``"aggregate"``: ``fn(loss_mat, mask) -> scalar``
"""

from __future__ import annotations

import html
import inspect
import itertools
import math
from dataclasses import dataclass, field

import torch

from agentic_rl.check_grid import combos as _combos
from agentic_rl.check_grid import load_reference_cases
from agentic_rl.check_grid import spec as _spec
from agentic_rl.check_grid import tensor as _tensor

__all__ = ["check_implementation", "CheckReport", "KINDS", "load_reference_cases"]

KINDS = ("group_advantages", "gae", "kl", "policy_loss", "aggregate")

_EPS_NAMES = ("epsilon", "eps", "clip_ratio", "cliprange", "epsilon_low", "clip_eps")
_EPS_HIGH_NAMES = ("epsilon_high", "clip_ratio_high", "cliprange_high", "eps_high")


@dataclass
class CheckReport:
    """The outcome of :func:`check_implementation`.

    - ``passed``: the function reproduces one of the expected reference conventions on every case;
    - ``matches``: labels of the references it reproduces (e.g. "verl GRPO (...)"), or, when it
      reproduces none, a description of the convention it does follow;
    - ``differences``: sentences naming each convention that differs from the closest reference;
    - ``problems``: calls that raised or returned the wrong shape (named function and case);
    - ``cases``: per case, its name and whether the closest expected reference matched.
    """

    kind: str
    function: str
    passed: bool
    matches: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cases: list[dict] = field(default_factory=list)
    signature: str = ""

    def __bool__(self) -> bool:
        return self.passed

    def text(self) -> str:
        head = "PASSED" if self.passed else "FAILED"
        lines = [
            f"check_implementation({self.function}, {self.kind!r}): {head}",
            f"  expected call: {self.signature}",
        ]
        if self.matches:
            lines.append("  reproduces:")
            lines += [f"    - {m}" for m in self.matches]
        if self.differences:
            lines.append("  differences:")
            lines += [f"    - {d}" for d in self.differences]
        if self.problems:
            lines.append("  problems:")
            lines += [f"    - {p}" for p in self.problems]
        if self.notes:
            lines.append("  notes:")
            lines += [f"    - {n}" for n in self.notes]
        if self.cases:
            lines.append("  cases:")
            for c in self.cases:
                mark = {True: "ok  ", False: "DIFF", None: "ERR "}[c["ok"]]
                lines.append(f"    {mark} {c['name']}: {c['note']}")
        return "\n".join(lines)

    __str__ = text

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        color = "#1a7f37" if self.passed else "#cf222e"
        head = "PASSED" if self.passed else "FAILED"
        e = html.escape
        parts = [
            f'<div style="font-family: sans-serif; font-size: 13px; max-width: 100ch;'
            f' border-left: 4px solid {color}; padding: 4px 10px;">',
            f'<div><b style="color: {color};">{head}</b> '
            f"<code>check_implementation({e(self.function)}, {e(repr(self.kind))})</code>"
            f'</div><div style="color: #57606a;">expected call: <code>'
            f"{e(self.signature)}</code></div>",
        ]
        for title, items in [
            ("reproduces", self.matches),
            ("differences", self.differences),
            ("problems", self.problems),
            ("notes", self.notes),
        ]:
            if items:
                lis = "".join(f"<li>{e(x)}</li>" for x in items)
                parts.append(f'<div><b>{title}</b><ul style="margin: 2px 0;">{lis}</ul></div>')
        if self.cases:
            rows = "".join(
                f'<tr><td style="color: {"#1a7f37" if c["ok"] else "#cf222e"};">'
                f"{ {True: 'ok', False: 'differs', None: 'error'}[c['ok']] }</td>"
                f"<td><code>{e(c['name'])}</code></td><td>{e(c['note'])}</td></tr>"
                for c in self.cases
            )
            parts.append(f'<table style="font-size: 12px;">{rows}</table>')
        parts.append("</div>")
        return "".join(parts)


# ---------------------------------------------------------------------------- calling the function
def _fn_name(fn) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None and hasattr(fn, "func"):  # functools.partial
        name = f"partial({_fn_name(fn.func)})"
    return name or type(fn).__name__


def _accepts(fn, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    if name in params and params[name].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.VAR_POSITIONAL,
    ):
        return True
    return False


def _first_accepted(fn, names) -> str | None:
    return next((n for n in names if _accepts(fn, n)), None)


def _can_bind(fn, *args, **kwargs) -> bool:
    try:
        inspect.signature(fn).bind(*args, **kwargs)
        return True
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): just try the call
        return True


class _CallError(Exception):
    pass


def _as_tensor(x, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float64).cpu()
    try:
        return torch.as_tensor(x, dtype=torch.float64)
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        raise _CallError(f"returned {type(x).__name__} for {what}, not a tensor ({exc})") from None


def _check_shape(t: torch.Tensor, shape, what: str) -> torch.Tensor:
    if tuple(shape) == ():
        if t.numel() != 1:
            raise _CallError(f"returned {what} of shape {tuple(t.shape)}, expected a scalar")
        return t.reshape(())
    if tuple(t.shape) != tuple(shape):
        if len(shape) == 1 and tuple(t.shape) in ((shape[0], 1), (1, shape[0])):
            return t.reshape(shape)
        raise _CallError(f"returned {what} of shape {tuple(t.shape)}, expected {tuple(shape)}")
    return t


def _call_group_advantages(fn, case: dict, state: dict) -> list:
    inp = case["inputs"]
    scores, gids = _tensor(inp["scores"], torch.float32), _tensor(inp["group_ids"], torch.int64)
    out = fn(scores, gids)
    return [_check_shape(_as_tensor(out, "the advantages"), scores.shape, "advantages")]


def _call_gae(fn, case: dict, state: dict) -> list:
    inp = case["inputs"]
    r, v = _tensor(inp["token_rewards"], torch.float32), _tensor(inp["values"], torch.float32)
    m = _tensor(inp["mask"], torch.int64)
    p = case["params"]
    if _can_bind(fn, r, v, m, gamma=p["gamma"], lam=p["lam"]):
        out = fn(r, v, m, gamma=p["gamma"], lam=p["lam"])
    else:
        out = fn(r, v, m, p["gamma"], p["lam"])
    if isinstance(out, (tuple, list)):
        if len(out) < 2:
            raise _CallError(f"returned a {type(out).__name__} of length {len(out)}")
        adv, ret = out[0], out[1]
    else:
        adv, ret = out, None
        state["no_returns"] = True
    adv = _check_shape(_as_tensor(adv, "the advantages"), v.shape, "advantages")
    if ret is not None:
        ret = _check_shape(_as_tensor(ret, "the returns"), v.shape, "returns")
    return [adv, ret]


def _call_kl(fn, case: dict, state: dict) -> list:
    inp = case["inputs"]
    lp, ref = _tensor(inp["logprobs"], torch.float32), _tensor(inp["ref_logprobs"], torch.float32)
    out = fn(lp, ref)
    return [_check_shape(_as_tensor(out, "the KL"), lp.shape, "the per-token KL")]


def _call_aggregate(fn, case: dict, state: dict) -> list:
    inp = case["inputs"]
    lm, m = _tensor(inp["loss_mat"], torch.float32), _tensor(inp["mask"], torch.int64)
    out = fn(lm, m)
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    return [_check_shape(_as_tensor(out, "the loss"), (), "the loss")]


def _call_policy_loss(fn, case: dict, state: dict) -> list:
    inp = case["inputs"]
    f32, i64 = torch.float32, torch.int64
    lp, old = _tensor(inp["logprobs"], f32), _tensor(inp["old_logprobs"], f32)
    adv, m = _tensor(inp["advantages"], f32), _tensor(inp["mask"], i64)
    p = case["params"]
    kwargs = {}
    if state["eps_name"]:
        kwargs[state["eps_name"]] = p["epsilon"]
    if state["eps_high_name"]:
        kwargs[state["eps_high_name"]] = p["epsilon_high"]
    out = fn(lp, old, adv, m, **kwargs)
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    t = _as_tensor(out, "the loss")
    if tuple(t.shape) == tuple(lp.shape):  # a per-token loss matrix: check its token-mean
        state["per_token"] = True
        mf = m.to(t.dtype)
        t = (t * mf).sum() / mf.sum().clamp(min=1)
    return [_check_shape(t, (), "the loss")]


_CALLS = {
    "group_advantages": _call_group_advantages,
    "gae": _call_gae,
    "kl": _call_kl,
    "policy_loss": _call_policy_loss,
    "aggregate": _call_aggregate,
}


def _call(kind: str, fn, case: dict, state: dict) -> list[torch.Tensor | None]:
    """Run ``fn`` on one case; return its output components (None where not returned)."""
    return _CALLS[kind](fn, case, state)


# ---------------------------------------------------------------------------- comparing
def _bad(g: torch.Tensor, e, rtol: float, atol: float) -> torch.Tensor:
    """The compared positions where ``g`` differs from the expected component ``e``."""
    val, cmp, nan = e
    ok_nan = torch.isnan(g) & nan
    ok_val = torch.isfinite(g) & ~nan & (torch.abs(g - val) <= atol + rtol * val.abs())
    return cmp & ~(ok_nan | ok_val)


def _matches(got: list, expected: list, rtol: float, atol: float) -> bool:
    for g, e in zip(got, expected):
        if g is None:  # the component was not returned (GAE without returns)
            continue
        if g.shape != e[0].shape or bool(_bad(g, e, rtol, atol).any()):
            return False
    return True


def _num(v: float) -> str:
    return "nan" if math.isnan(v) else f"{v:.4g}"


def _fmt_values(x: torch.Tensor, cmp: torch.Tensor) -> str:
    """A 1-D slice as a list, ``·`` where the position is not compared (mask 0)."""
    return "[" + ", ".join(
        _num(v) if c else "·" for v, c in zip(x.tolist(), cmp.tolist())
    ) + "]"


_WINDOW = 16  # values shown around the first difference


def _first_difference(name: str, g: torch.Tensor, e, bad: torch.Tensor, label: str) -> str:
    """Where ``name`` first differs: the position, yours vs ``label``'s value, and the values of
    that row (or up to ``_WINDOW`` around it), ``·`` at positions not compared."""
    val, cmp, _ = e
    if g.ndim == 0:
        return f"{name}: yours {_num(g.item())}, {label} {_num(val.item())}"
    pos = tuple(int(k) for k in bad.nonzero()[0].tolist())
    if g.ndim == 1:
        where, row, col = f"index {pos[0]}", (slice(None),), pos[0]
    else:
        where, row, col = f"row {pos[0]}, column {pos[1]}", pos[:-1], pos[-1]
    gr, vr, cr = g[row], val[row], cmp[row]
    lo = max(0, min(col - _WINDOW // 4, gr.shape[0] - _WINDOW))
    hi = min(gr.shape[0], lo + _WINDOW)
    span = "" if (lo, hi) == (0, gr.shape[0]) else f"[{lo}:{hi}]"
    what = f"row {pos[0]}{span}" if g.ndim == 2 else (f"values {span}" if span else "values")
    legend = " (· = not compared, mask 0)" if not bool(cr[lo:hi].all()) else ""
    return (
        f"{name} first differ at {where}: yours {_num(g[pos].item())}, {label} "
        f"{_num(val[pos].item())}; {what}{legend}: yours {_fmt_values(gr[lo:hi], cr[lo:hi])}, "
        f"{label} {_fmt_values(vr[lo:hi], cr[lo:hi])}"
    )


_COMPONENTS = {
    "group_advantages": ["the advantages"],
    "gae": ["the advantages", "the returns"],
    "kl": ["the per-token KL values"],
    "policy_loss": ["the loss"],
    "aggregate": ["the loss"],
}


def _describe_difference(kind: str, got: list, expected: list, rtol, atol, label: str) -> str:
    """The first output component that differs from ``expected``, and where."""
    names = _COMPONENTS[kind]
    same = []
    for k, (g, e) in enumerate(zip(got, expected)):
        if g is None:
            continue
        bad = _bad(g, e, rtol, atol)
        if not bool(bad.any()):
            same.append(k)
            continue
        text = _first_difference(names[k], g, e, bad, label)
        if kind == "gae" and k == 1 and 0 in same:
            text = text.replace(
                "the returns first differ at",
                "the advantages match; the returns differ (returns must be advantages + values), "
                "first at",
                1,
            )
        return text
    return "the outputs differ"


def _short_label(label: str) -> str:
    return label.split(" (")[0]


def _case_title(case: dict) -> str:
    return f"{case['name']!r} ({case['note'].split(';')[0]})"


# ---------------------------------------------------------------------------- the check
def check_implementation(fn, kind: str, *, expect=None) -> CheckReport:
    """Run ``fn`` on the reference cases of ``kind`` and report which conventions it follows.

    ``kind`` is one of :data:`KINDS`; the call each kind makes is in the module docstring (and in
    the report's ``signature``). ``expect`` names the reference(s) the function should reproduce
    (keys of ``load_reference_cases()["kinds"][kind]["references"]``, e.g. ``"verl"``,
    ``"trl-k3"``, ``"verl-seq-mean-token-mean"``); by default any of the main references of the
    kind passes. Never raises because of ``fn``: an exception or a wrong shape is reported.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    spec = _spec(kind)
    expect = _expected_references(spec, kind, expect)
    name = _fn_name(fn)
    report = CheckReport(kind=kind, function=name, passed=False, signature=spec["signature"])
    state, skip = _probe_keywords(kind, fn, spec, name, report)
    runs = _run_cases(kind, fn, spec, state, skip, name, report)
    _note_outputs(state, name, report)
    ran = [i for i, g in enumerate(runs.grid_ok) if g is not None]
    if ran:
        _judge(spec, expect, runs, ran, report)
    else:
        report.problems.append(f"{name} produced no usable output on any case; nothing to compare")
    report.cases = [{k: v for k, v in c.items() if k in ("name", "note", "ok")} for c in runs.cases]
    return report


def _expected_references(spec: dict, kind: str, expect) -> list[str]:
    """``expect`` as a list of known reference keys, the book's own package first (ties between
    equally close references go to it)."""
    refs = spec["references"]
    if expect is None:
        expect = list(spec["default_expect"])
    elif isinstance(expect, str):
        expect = [expect]
    unknown = [x for x in expect if x not in refs]
    if unknown:
        raise ValueError(
            f"expect: unknown reference(s) {unknown} for kind {kind!r}; choose from {sorted(refs)}"
        )
    return sorted(dict.fromkeys(expect), key=lambda r: not r.startswith("agentic_rl"))


def _probe_keywords(kind: str, fn, spec: dict, name: str, report: CheckReport):
    """For a policy loss, the epsilon keywords ``fn`` takes, and the cases it cannot be asked
    (their epsilons need a keyword it lacks); a note for each missing keyword."""
    state = {"eps_name": None, "eps_high_name": None}
    if kind != "policy_loss":
        return state, set()
    state["eps_name"] = _first_accepted(fn, _EPS_NAMES)
    state["eps_high_name"] = _first_accepted(fn, _EPS_HIGH_NAMES)
    skip = set()
    for i, c in enumerate(spec["cases"]):
        p = c["params"]
        if state["eps_name"] is None and p["epsilon"] != 0.2:
            skip.add(i)
        if state["eps_high_name"] is None and p["epsilon_high"] != p["epsilon"]:
            skip.add(i)
    if state["eps_name"] is None:
        report.notes.append(
            f"{name} takes no epsilon keyword ({', '.join(_EPS_NAMES)}): "
            "checked only the cases with epsilon 0.2"
        )
    if state["eps_high_name"] is None:
        report.notes.append(
            f"{name} takes no epsilon_high keyword: the clip-higher cases were skipped"
        )
    return state, skip


@dataclass
class _Runs:
    """Per case: which grid points (``grid_ok``) and references (``ref_ok``) the output matches
    (None where the case was skipped or the call failed), and its row of the report (``cases``)."""

    grid_ok: list = field(default_factory=list)
    ref_ok: list = field(default_factory=list)
    cases: list = field(default_factory=list)


def _run_cases(kind: str, fn, spec: dict, state: dict, skip: set, name: str, report) -> _Runs:
    """Run ``fn`` on every case not skipped and compare its output with every expected output."""
    runs = _Runs()
    for i, case in enumerate(spec["cases"]):
        info = {"name": case["name"], "note": case["note"], "ok": None}
        runs.cases.append(info)
        result = None
        if i in skip:
            info["note"] += " (skipped)"
        else:
            result = _run_case(kind, fn, case, state, name, report)
        if result is None:
            runs.grid_ok.append(None)
            runs.ref_ok.append(None)
            continue
        info["got"], info["outs"], ok_out = result
        runs.grid_ok.append([ok_out[k] for k in case["grid"]])
        runs.ref_ok.append({r: ok_out[k] for r, k in case["refs"].items()})
    return runs


def _run_case(kind: str, fn, case: dict, state: dict, name: str, report: CheckReport):
    """``(output, expected outputs, whether each matches)`` for one case, or None with the
    exception or the wrong shape reported as a problem."""
    try:
        with torch.no_grad():
            got = _call(kind, fn, case, state)
    except _CallError as exc:
        report.problems.append(f"{name} {exc} on case {case['name']!r} ({case['note']})")
        return None
    except Exception as exc:  # noqa: BLE001 - the learner's exception is the finding
        report.problems.append(
            f"{name} raised {type(exc).__name__}: {exc} on case {case['name']!r} ({case['note']})"
        )
        return None
    outs = case["expected"]
    return got, outs, [_matches(got, o, case["rtol"], case["atol"]) for o in outs]


def _note_outputs(state: dict, name: str, report: CheckReport) -> None:
    """Notes on what the outputs let the check see (no returns, a per-token loss)."""
    if state.get("no_returns"):
        report.notes.append(f"{name} returned only the advantages; the returns were not checked")
    if state.get("per_token"):
        report.notes.append(
            f"{name} returned a per-token loss matrix: its token-mean over the "
            "mask was checked (aggregation not probed)"
        )


def _judge(spec: dict, expect: list[str], runs: _Runs, ran: list[int], report: CheckReport):
    """Fill in the matches, the verdict, each case's mark and, on a failure, the differences."""
    refs = spec["references"]
    ref_full = [r for r in refs if all(runs.ref_ok[i][r] for i in ran)]
    report.matches = [refs[r]["label"] for r in ref_full]
    report.passed = bool(set(ref_full) & set(expect)) and not report.problems
    closest = _closest(spec, expect, runs.grid_ok, ran)
    for i, info in enumerate(runs.cases):  # per case: does an expected reference match?
        if runs.ref_ok[i] is not None:
            info["ok"] = any(runs.ref_ok[i][r] for r in expect)
    if not report.passed and not report.problems:
        _explain(spec, expect, runs, ran, closest, report, matched_any=bool(ref_full))


@dataclass
class _Closest:
    """The expected reference closest to the function (``ref``), the grid point that is closest
    to it among those reproducing the most cases (``point``), the options of every grid point
    that close (``yours``, per dimension), and whether they reproduce every case (``all_cases``)."""

    ref: str
    point: int
    yours: dict[str, list[str]]
    all_cases: bool


def _closest(spec: dict, expect: list[str], grid_ok: list, ran: list[int]) -> _Closest:
    """The closest expected reference, and the grid points (conventions) nearest to it among
    those that reproduce the most cases (all of them, else as many as any does)."""
    dims, refs = spec["dims"], spec["references"]
    grid = list(itertools.product(*[[o["name"] for o in d["options"]] for d in dims]))
    counts = [sum(grid_ok[i][j] for i in ran) for j in range(len(grid))]
    best = max(counts)
    cand = [j for j in range(len(grid)) if counts[j] == best]
    near = {(d["name"], o["name"]): o.get("near") for d in dims for o in d["options"]}

    def distance(j, r):
        o = dict(zip([d["name"] for d in dims], grid[j]))
        return sum(
            0.5 if near[d, o[d]] == v else 1
            for d, v in refs[r]["dims"].items()
            if v is not None and o[d] != v
        )

    j_best, r_best = min(((j, r) for j in cand for r in expect), key=lambda jr: distance(*jr))
    target = [j for j in cand if distance(j, r_best) == distance(j_best, r_best)]
    yours = {d["name"]: sorted({grid[j][k] for j in target}) for k, d in enumerate(dims)}
    return _Closest(r_best, j_best, yours, best == len(ran))


def _option_text(dim: dict, options) -> str:
    """The prose of a dimension's option(s), joined with "or"."""
    text = {o["name"]: o["text"] for o in dim["options"]}
    return " or ".join(text[o] for o in options)


def _explain(spec, expect, runs: _Runs, ran, closest: _Closest, report, *, matched_any: bool):
    """The report's prose for a function that failed: first each convention that differs from
    the closest reference, then one case with the numbers that show it (or the first case no
    convention explains), and the function's own convention when it is no reference's."""
    dims, label = spec["dims"], spec["references"][closest.ref]["label"]
    named = _convention_differences(spec, expect, closest)
    report.differences += named
    if not closest.all_cases:
        report.differences += _unexplained_cases(spec, runs, ran, closest)
    elif named:
        shown = _evidence(spec, runs, ran, closest.ref)
        if shown:
            report.differences.append(shown)
    if not report.differences:
        report.differences.append(f"your output differs from {label} on the cases marked below")
    if not matched_any:
        moot = {dn for c in _combos(spec, closest) for dn in c[2]}
        desc = [
            f"{d['label']}: " + _option_text(d, closest.yours[d["name"]])
            for d in dims
            if len(closest.yours[d["name"]]) < len(d["options"]) and d["name"] not in moot
            and not (d.get("extra") and closest.yours[d["name"]] == [d["options"][0]["name"]])
        ]
        if closest.all_cases and desc:
            report.matches = ["no reference; your convention: " + "; ".join(desc)]
    report.notes.append(f"closest expected reference: {label}")


def _convention_differences(spec, expect, closest: _Closest) -> list[str]:
    """One sentence per dimension where the function's convention is not the closest
    reference's (or one per known combination of them), naming at most two other expected
    references that share the reference's convention."""
    dims, refs, r_best = spec["dims"], spec["references"], closest.ref
    differ = {
        d["name"]: refs[r_best]["dims"][d["name"]]
        for d in dims
        if refs[r_best]["dims"].get(d["name"]) is not None
        and refs[r_best]["dims"][d["name"]] not in closest.yours[d["name"]]
    }
    out = []
    for when, text, _ in _combos(spec, closest):
        out.append(text.format(ref=_short_label(refs[r_best]["label"])))
        for dn in when:
            differ.pop(dn, None)
    for d in dims:
        dn = d["name"]
        if dn not in differ:
            continue
        want = differ[dn]
        also = [r for r in expect if r != r_best and refs[r]["dims"].get(dn) == want]
        theirs = f"{refs[r_best]['label']} uses {_option_text(d, [want])}"
        if also:
            theirs += f" ({_also(refs, r_best, also)})"
        out.append(f"{d['label']}: yours is {_option_text(d, closest.yours[dn])}; {theirs}")
    return out


def _also(refs: dict, r_best: str, also: list[str]) -> str:
    """"so do ..." naming one reference of each other framework, then how many more agree."""
    fw, mine = {r_best.split("-")[0]}, refs[r_best]["dims"]
    named = []
    for r in sorted(also, key=lambda r: sum(v != mine.get(d) for d, v in refs[r]["dims"].items())):
        if r.split("-")[0] not in fw:
            fw.add(r.split("-")[0])
            named.append(refs[r]["label"])
    named = named[:2] or [refs[also[0]]["label"]]
    more = len(also) - len(named)
    text = ("so does " if len(also) == 1 else "so do ") + " and ".join(named)
    return text + (f", and {more} more" if more else "")


def _evidence(spec, runs: _Runs, ran, ref: str) -> str | None:
    """The first case where the function and the reference ``ref`` differ, with the numbers."""
    label = _short_label(spec["references"][ref]["label"])
    for i in ran:
        if runs.ref_ok[i][ref]:
            continue
        case, c = spec["cases"][i], runs.cases[i]
        exp = case["expected"][case["refs"][ref]]
        where = _describe_difference(spec["kind"], c["got"], exp, case["rtol"], case["atol"], label)
        return f"e.g. on case {_case_title(case)}: {where}"
    return None


def _unexplained_cases(spec, runs: _Runs, ran, closest: _Closest) -> list[str]:
    """The first case the closest convention does not reproduce: where yours and the closest
    reference first differ, with the values around it; the other such cases by name."""
    label = _short_label(spec["references"][closest.ref]["label"])
    bad = [i for i in ran if not runs.grid_ok[i][closest.point]]
    if not bad:
        return []
    i = bad[0]
    case, c = spec["cases"][i], runs.cases[i]
    exp = case["expected"][case["refs"][closest.ref]]
    where = _describe_difference(spec["kind"], c["got"], exp, case["rtol"], case["atol"], label)
    text = f"on case {_case_title(case)} your output matches no known convention: {where}"
    if len(bad) > 1:
        others = ", ".join(repr(spec["cases"][k]["name"]) for k in bad[1:])
        text += f" (nor on case{'s' if len(bad) > 2 else ''} {others})"
    return [text]
