"""A token view of one row of a :class:`~agentic_rl.rollout.Batch`: what each token gets.

Every token of the row is shown with its segment (prompt, generated, environment / tool output,
padding, or any label you pass), whether it is trainable (``loss_mask``), its advantage, its
importance ratio and whether clipping cut its gradient, and the reward placed on it. Multi-turn rows
(:func:`~agentic_rl.multiturn.rollout_multiturn`) also show where each turn starts.

In a notebook the returned :class:`TokenView` displays as HTML (inline CSS only: no script, readable
offline and on the website); in a terminal ``print(view)`` gives text: trainable tokens in
``[brackets]`` with aligned rows of numbers beneath, wrapped to 100 characters::

    view = token_view(batch, 0, tokenizer, advantages=adv, logprobs=new_logprobs)
    print(view)
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import torch

__all__ = ["token_view", "TokenView", "TokenInfo"]


@dataclass
class TokenInfo:
    """One token of the row and what it gets (``None`` where not given)."""

    pos: int
    token_id: int
    text: str
    segment: str
    trainable: bool
    turn: int | None = None
    advantage: float | None = None
    ratio: float | None = None
    clipped: str | None = None  # "low" / "high": the clipped branch is active (no gradient)
    reward: float | None = None
    value: float | None = None
    extra: dict | None = None


def _fmt(x: float | None, signed: bool = True) -> str:
    if x is None:
        return ""
    if x != x:  # NaN
        return "nan"
    if abs(x) >= 100:
        return f"{x:+.0e}" if signed else f"{x:.0e}"
    if abs(x) >= 10:
        return f"{x:+.1f}" if signed else f"{x:.1f}"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


_SEG_STYLE = {  # segment -> (text colour, border style) for the HTML view
    "prompt": ("#57606a", "1px solid #d0d7de"),
    "env": ("#57606a", "1px dashed #8c959f"),
    "pad": ("#afb8c1", "1px dotted #d0d7de"),
}


class TokenView:
    """The per-token facts of one Batch row: ``text()`` for terminals, ``_repr_html_`` for
    notebooks.

    ``tokens`` holds one :class:`TokenInfo` per shown position; ``records()`` gives them as dicts.
    """

    def __init__(
        self,
        tokens: list[TokenInfo],
        *,
        header: str,
        epsilon: float,
        epsilon_high: float,
        width: int = 100,
    ):
        self.tokens, self.header, self.width = tokens, header, width
        self.epsilon, self.epsilon_high = epsilon, epsilon_high

    def records(self) -> list[dict]:
        return [dict(vars(t)) for t in self.tokens]

    # ------------------------------------------------------------------ text
    def _has(self, attr: str) -> bool:
        return any(getattr(t, attr) is not None for t in self.tokens)

    def _extra_names(self) -> list[str]:
        names: list[str] = []
        for t in self.tokens:
            for k in t.extra or {}:
                if k not in names:
                    names.append(k)
        return names

    def legend(self) -> str:
        parts = ["[tok] trainable (loss_mask 1)", "| segment or turn starts (label in 'seg')"]
        if self._has("advantage"):
            parts.append("adv: advantage")
        if self._has("ratio"):
            parts.append(
                f"ratio: pi/pi_old, v = clipped at 1-{self.epsilon:g}, "
                f"^ = clipped at 1+{self.epsilon_high:g} (no gradient)"
            )
        if self._has("reward"):
            parts.append("rew: token reward")
        if self._has("value"):
            parts.append("V: critic value")
        return "; ".join(parts)

    def text(self) -> str:
        rows = [("tok", lambda t: f"[{t.text}]" if t.trainable else t.text)]
        rows.append(("seg", None))
        if self._has("advantage"):
            rows.append(("adv", lambda t: _fmt(t.advantage) if t.trainable else ""))
        if self._has("ratio"):
            rows.append(
                (
                    "ratio",
                    lambda t: (
                        ""
                        if t.ratio is None
                        else _fmt(t.ratio, False)
                        + {"low": "v", "high": "^"}.get(t.clipped or "", "")
                    ),
                )
            )
        if self._has("reward"):
            rows.append(("rew", lambda t: _fmt(t.reward)))
        if self._has("value"):
            rows.append(("V", lambda t: _fmt(t.value) if t.trainable else ""))
        for name in self._extra_names():
            rows.append((name[:5], lambda t, n=name: _fmt((t.extra or {}).get(n))))
        starts = self._starts()
        cells = []
        for i, t in enumerate(self.tokens):
            col = []
            for label, f in rows:
                if f is None:
                    col.append(self._start_label(i) if starts[i] else "")
                else:
                    col.append(f(t))
            w = max(len(c) for c in col)
            cells.append((starts[i] and i > 0, [c.ljust(w) for c in col], w))
        gutter = max(len(r[0]) for r in rows) + 1
        lines = [self.header, "legend: " + self.legend()]
        block: list[list[str]] = [[] for _ in rows]
        used = gutter

        def flush():
            if block[0]:
                lines.append("")
                for (label, _), parts in zip(rows, block):
                    lines.append((label.ljust(gutter) + " ".join(parts)).rstrip())

        for boundary, col, w in cells:
            extra = w + 1 + (2 if boundary else 0)
            if used + extra > self.width and block[0]:
                flush()
                block = [[] for _ in rows]
                used = gutter
            for k, c in enumerate(col):
                block[k].append(("| " if k == 0 else "  ") + c if boundary else c)
            used += extra
        flush()
        return "\n".join(lines)

    def _starts(self) -> list[bool]:
        out = []
        for i, t in enumerate(self.tokens):
            prev = self.tokens[i - 1] if i else None
            out.append(prev is None or prev.segment != t.segment or prev.turn != t.turn)
        return out

    def _start_label(self, i: int) -> str:
        t = self.tokens[i]
        return t.segment if t.turn is None else f"{t.segment}{t.turn}"

    __str__ = text

    def __repr__(self) -> str:
        return self.text()

    # ------------------------------------------------------------------ HTML
    def _repr_html_(self) -> str:
        return self.to_html()

    def to_html(self) -> str:
        """A static render: inline CSS only, wraps to a ~100-character column, with a legend."""
        e = html.escape
        amax = max(
            [
                abs(t.advantage)
                for t in self.tokens
                if t.advantage is not None and t.advantage == t.advantage
            ]
            + [1e-12]
        )
        starts = self._starts()
        spans = []
        for i, t in enumerate(self.tokens):
            color, border = _SEG_STYLE.get(t.segment, ("#1f2328", "1px solid #8c959f"))
            bg = "transparent"
            if t.trainable:
                border = "1px solid #0969da"
                bg = "#ddf4ff"
                if t.advantage is not None and t.advantage == t.advantage and t.advantage != 0:
                    a = 0.15 + 0.6 * min(abs(t.advantage) / amax, 1.0)
                    bg = (
                        f"rgba(26,127,55,{a:.2f})"
                        if t.advantage > 0
                        else f"rgba(207,34,46,{a:.2f})"
                    )
            if t.clipped:
                border = "2px solid #bf3989"
            tip = [
                f"pos {t.pos}",
                f"id {t.token_id}",
                f"segment {t.segment}",
                f"loss_mask {int(t.trainable)}",
            ]
            if t.turn is not None:
                tip.append(f"turn {t.turn}")
            for name, v in [
                ("advantage", t.advantage),
                ("ratio", t.ratio),
                ("reward", t.reward),
                ("value", t.value),
            ]:
                if v is not None:
                    tip.append(f"{name} {v:.4g}")
            if t.clipped:
                tip.append(f"clipped ({t.clipped}): no gradient")
            for k, v in (t.extra or {}).items():
                if v is not None:
                    tip.append(f"{k} {v:.4g}")
            below = []
            if t.trainable and t.advantage is not None:
                below.append(e(_fmt(t.advantage)))
            if t.ratio is not None:
                mark = {"low": "&#9660;", "high": "&#9650;"}.get(t.clipped or "", "")
                below.append(
                    f'<span style="color:{"#bf3989" if t.clipped else "inherit"};">'
                    f"{_fmt(t.ratio, False)}{mark}</span>"
                )
            if t.reward is not None:
                below.append(
                    f'<span style="background:#fff8c5;border-radius:3px;">'
                    f"R{e(_fmt(t.reward))}</span>"
                )
            label = e(self._start_label(i)) if starts[i] else "&nbsp;"
            left = "border-left: 2px solid #1f2328; padding-left: 3px;" if starts[i] and i else ""
            spans.append(
                f'<span title="{e(" | ".join(tip))}" style="display: inline-flex; '
                f'flex-direction: column; align-items: flex-start; margin: 0 1px 4px 0; {left}">'
                f'<span style="font-size: 9px; color: #8c959f;">{label}</span>'
                f'<span style="color: {color}; background: {bg}; border: {border}; '
                f'border-radius: 3px; padding: 0 2px; white-space: pre;">{e(t.text)}</span>'
                f'<span style="font-size: 9px; line-height: 1.15;">{"<br>".join(below)}</span>'
                "</span>"
            )
        legend = (
            '<div style="font-size: 11px; color: #57606a; margin-bottom: 4px;">'
            '<span style="border: 1px solid #0969da; background: #ddf4ff; padding: 0 3px;">'
            "trainable</span> loss_mask 1, shaded "
            '<span style="background: rgba(26,127,55,0.5); padding: 0 3px;">A&gt;0</span> / '
            '<span style="background: rgba(207,34,46,0.5); padding: 0 3px;">A&lt;0</span> by '
            "the advantage (numbers below: advantage, ratio, reward); "
            '<span style="border: 1px dashed #8c959f; padding: 0 3px;">env</span> '
            "environment / tool tokens; "
            '<span style="border: 2px solid #bf3989; padding: 0 3px;">clipped</span> '
            f"ratio outside [1-{self.epsilon:g}, 1+{self.epsilon_high:g}] on the side that "
            "cuts the gradient (&#9660; low, &#9650; high); "
            '<span style="background: #fff8c5; padding: 0 3px;">R</span> reward; a bar starts '
            "a segment or turn. Hover a token for all its numbers.</div>"
        )
        return (
            '<div style="font-family: ui-monospace, SFMono-Regular, Menlo, monospace; '
            'font-size: 12px; max-width: 100ch;">'
            f'<div style="font-weight: bold; margin-bottom: 2px;">{e(self.header)}</div>'
            f'{legend}<div style="display: flex; flex-wrap: wrap; align-items: flex-end;">'
            f"{''.join(spans)}</div></div>"
        )


# ---------------------------------------------------------------------------- building
def _row_tensor(x, name: str, B: int, T: int, row: int, *, per_row_ok: bool = False):
    """The row's values of a ``[B, T]`` (or, if allowed, ``[B]``) tensor, as a list of floats."""
    if x is None:
        return None
    x = torch.as_tensor(x)
    if x.ndim == 2 and tuple(x.shape) == (B, T):
        return x[row].detach().double().cpu().tolist()
    if per_row_ok and x.ndim == 1 and x.shape[0] == B:
        return [float(x[row])] * T
    want = f"[{B}, {T}]" + (f" or [{B}]" if per_row_ok else "")
    raise ValueError(f"{name} must have shape {want} (the batch's), got {list(x.shape)}")


def _token_texts(tokenizer, ids: list[int]) -> list[str]:
    if tokenizer is None:
        return [str(i) for i in ids]
    if callable(tokenizer) and not hasattr(tokenizer, "convert_ids_to_tokens"):
        texts = [tokenizer(i) for i in ids]
    elif hasattr(tokenizer, "convert_ids_to_tokens"):
        texts = tokenizer.convert_ids_to_tokens(ids)
    else:
        texts = [tokenizer.decode([i]) for i in ids]
    return [
        str(t).replace("\n", "\\n").replace("\t", "\\t") if t is not None else "?" for t in texts
    ]


def token_view(
    batch,
    row: int,
    tokenizer=None,
    *,
    advantages=None,
    logprobs=None,
    old_logprobs=None,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    segments=None,
    extra: dict | None = None,
    show_padding: bool = False,
    width: int = 100,
) -> TokenView:
    """What each token of ``batch`` row ``row`` gets, as a :class:`TokenView`.

    - ``tokenizer``: turns ids into text (``convert_ids_to_tokens``, or any ``id -> str``
      callable); without one the ids are shown.
    - ``advantages``: ``[B, T]`` per token, or ``[B]`` per row (shown on trainable tokens).
    - ``logprobs`` (``[B, T]``, the current policy's) with ``old_logprobs`` (default the batch's):
      the ratio ``exp(logprobs - old_logprobs)`` on trainable tokens, and whether the clipped term
      is the active one with bounds ``[1 - epsilon, 1 + epsilon_high]`` (needs ``advantages``: a
      token is clipped low when ``A < 0`` and the ratio is below ``1 - epsilon``, high when
      ``A > 0`` and it is above ``1 + epsilon_high``; ``epsilon_high`` defaults to ``epsilon``).
    - ``segments``: a label per token, to override the default ones ("prompt", "gen", "env" for
      non-trainable tokens after the first generated one, "pad"): either a list of ``T`` strings
      (``None`` keeps the default) for this row, or a dict ``{label: bool tensor [B, T]}`` (later
      labels win), e.g. ``{"tool": interpreter_mask}`` for ReTool's masked interpreter output.
    - ``extra``: more per-token rows to show, ``{name: tensor [B, T]}`` (e.g. returns).
    - The rewards (``token_rewards`` non-zero), the critic ``values`` and the multi-turn
      ``turn_ids`` come from the batch itself.

    Bad input (a row out of range, a tensor whose shape is not the batch's) raises ``ValueError``
    naming the argument.
    """
    B, T = batch.input_ids.shape
    if not isinstance(row, int) or isinstance(row, bool):
        raise ValueError(f"row must be an int, got {type(row).__name__}")
    if not -B <= row < B:
        raise ValueError(f"row {row} is out of range for a batch of {B} rows")
    row = row % B
    if epsilon_high is None:
        epsilon_high = epsilon
    if not (0 <= epsilon <= epsilon_high):
        raise ValueError(
            f"epsilon: need 0 <= epsilon <= epsilon_high, got {epsilon}, {epsilon_high}"
        )
    ids = batch.input_ids[row].tolist()
    attn = batch.attention_mask[row].tolist()
    loss = [bool(m) for m in batch.loss_mask[row].tolist()]
    adv = _row_tensor(advantages, "advantages", B, T, row, per_row_ok=True)
    if logprobs is not None and old_logprobs is None:
        old_logprobs = batch.old_logprobs
        if old_logprobs is None:
            raise ValueError("old_logprobs: the batch has none; pass old_logprobs= with logprobs=")
    lp = _row_tensor(logprobs, "logprobs", B, T, row)
    old = _row_tensor(old_logprobs, "old_logprobs", B, T, row) if lp is not None else None
    rew = _row_tensor(batch.token_rewards, "token_rewards", B, T, row)
    val = _row_tensor(batch.values, "values", B, T, row)
    turns = batch.turn_ids[row].tolist() if getattr(batch, "turn_ids", None) is not None else None
    extras = {k: _row_tensor(v, f"extra[{k!r}]", B, T, row) for k, v in (extra or {}).items()}

    # default segments
    first_gen = next((i for i, m in enumerate(loss) if m), T)
    seg = []
    for i in range(T):
        if not attn[i]:
            seg.append("pad")
        elif loss[i]:
            seg.append("gen")
        else:
            seg.append("prompt" if i < first_gen else "env")
    if segments is not None:
        if isinstance(segments, dict):
            for label, m in segments.items():
                m = torch.as_tensor(m)
                if tuple(m.shape) not in ((B, T), (T,)):
                    raise ValueError(
                        f"segments[{label!r}] must have shape [{B}, {T}] or [{T}], "
                        f"got {list(m.shape)}"
                    )
                mr = (m[row] if m.ndim == 2 else m).tolist()
                seg = [str(label) if flag else s for s, flag in zip(seg, mr)]
        else:
            segments = list(segments)
            if len(segments) != T:
                raise ValueError(
                    f"segments must have one label per token ({T}), got {len(segments)}"
                )
            seg = [s if lab is None else str(lab) for s, lab in zip(seg, segments)]

    texts = _token_texts(tokenizer, ids)
    tokens = []
    for i in range(T):
        if not show_padding and not attn[i] and not loss[i]:
            continue
        t = TokenInfo(pos=i, token_id=ids[i], text=texts[i], segment=seg[i], trainable=loss[i])
        if turns is not None and turns[i] >= 0:
            t.turn = int(turns[i])
        if adv is not None and loss[i]:
            t.advantage = adv[i]
        if lp is not None and loss[i]:
            r = float(torch.exp(torch.tensor(lp[i] - old[i]).clamp(-20, 20)))
            t.ratio = r
            a = adv[i] if adv is not None else None
            if a is not None and a < 0 and r < 1 - epsilon:
                t.clipped = "low"
            elif a is not None and a > 0 and r > 1 + epsilon_high:
                t.clipped = "high"
        if rew is not None and rew[i] != 0:
            t.reward = rew[i]
        if val is not None:
            t.value = val[i]
        if extras:
            t.extra = {k: (v[i] if v is not None else None) for k, v in extras.items()}
        tokens.append(t)

    n_train = sum(loss)
    head = [
        f"row {row}",
        f"group {int(batch.group_id[row])}",
        f"score {float(batch.token_rewards[row].sum()):+.3g}",
        f"{len(tokens)} tokens shown, {n_train} trainable",
    ]
    if turns is not None:
        head.append(f"{len({x for x in turns if x >= 0})} turns")
    ex = getattr(batch, "extras", None) or {}
    for k in ("success", "truncated"):
        v = ex.get(k)
        if isinstance(v, torch.Tensor) and v.ndim == 1 and v.shape[0] == B:
            head.append(f"{k} {bool(v[row])}")
    if getattr(batch, "correct", None) is not None and "success" not in ex:
        head.append(f"correct {bool(batch.correct[row])}")
    return TokenView(
        tokens, header=" | ".join(head), epsilon=epsilon, epsilon_high=epsilon_high, width=width
    )
