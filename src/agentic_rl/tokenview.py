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

from .losses import clip_region

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
        rows = self._text_rows()
        gutter = max(len(label) for label, _ in rows) + 1
        lines = [self.header, "legend: " + self.legend()]
        for block in self._text_blocks(self._text_columns(rows), len(rows), gutter):
            lines.append("")
            for (label, _), parts in zip(rows, block):
                lines.append((label.ljust(gutter) + " ".join(parts)).rstrip())
        return "\n".join(lines)

    def _text_rows(self) -> list[tuple]:
        """The rows of the text view: ``(label, token -> cell)``; the cell function of "seg" is
        None (its cells are the segment and turn starts)."""
        rows = [("tok", lambda t: f"[{t.text}]" if t.trainable else t.text), ("seg", None)]
        if self._has("advantage"):
            rows.append(("adv", lambda t: _fmt(t.advantage) if t.trainable else ""))
        if self._has("ratio"):
            rows.append(("ratio", _ratio_cell))
        if self._has("reward"):
            rows.append(("rew", lambda t: _fmt(t.reward)))
        if self._has("value"):
            rows.append(("V", lambda t: _fmt(t.value) if t.trainable else ""))
        for name in self._extra_names():
            rows.append((name[:5], lambda t, n=name: _fmt((t.extra or {}).get(n))))
        return rows

    def _text_columns(self, rows: list[tuple]) -> list[tuple[bool, list[str], int]]:
        """One column per token: ``(starts a segment after the first token, its cells padded to a
        common width, that width)``."""
        starts = self._starts()
        columns = []
        for i, t in enumerate(self.tokens):
            col = []
            for _, f in rows:
                if f is None:
                    col.append(self._start_label(i) if starts[i] else "")
                else:
                    col.append(f(t))
            w = max(len(c) for c in col)
            columns.append((starts[i] and i > 0, [c.ljust(w) for c in col], w))
        return columns

    def _text_blocks(self, columns, n_rows: int, gutter: int) -> list[list[list[str]]]:
        """The columns wrapped to ``width``: blocks of ``n_rows`` rows of cells; a boundary column
        gets a bar ("| ") on the token row, blanks beneath it."""
        blocks: list[list[list[str]]] = []
        block: list[list[str]] = [[] for _ in range(n_rows)]
        used = gutter
        for boundary, col, w in columns:
            extra = w + 1 + (2 if boundary else 0)
            if used + extra > self.width and block[0]:
                blocks.append(block)
                block = [[] for _ in range(n_rows)]
                used = gutter
            for k, c in enumerate(col):
                block[k].append(("| " if k == 0 else "  ") + c if boundary else c)
            used += extra
        if block[0]:
            blocks.append(block)
        return blocks

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
        spans = [self._token_html(i, t, starts[i], amax) for i, t in enumerate(self.tokens)]
        return (
            '<div style="font-family: ui-monospace, SFMono-Regular, Menlo, monospace; '
            'font-size: 12px; max-width: 100ch;">'
            f'<div style="font-weight: bold; margin-bottom: 2px;">{e(self.header)}</div>'
            f'{self._html_legend()}<div style="display: flex; flex-wrap: wrap; '
            f'align-items: flex-end;">{"".join(spans)}</div></div>'
        )

    def _token_html(self, i: int, t: TokenInfo, start: bool, amax: float) -> str:
        """One token as a column: its segment label (at a start), the token, its numbers."""
        e = html.escape
        color, bg, border = _token_colors(t, amax)
        label = e(self._start_label(i)) if start else "&nbsp;"
        left = "border-left: 2px solid #1f2328; padding-left: 3px;" if start and i else ""
        return (
            f'<span title="{e(" | ".join(_token_tip(t)))}" style="display: inline-flex; '
            f'flex-direction: column; align-items: flex-start; margin: 0 1px 4px 0; {left}">'
            f'<span style="font-size: 9px; color: #8c959f;">{label}</span>'
            f'<span style="color: {color}; background: {bg}; border: {border}; '
            f'border-radius: 3px; padding: 0 2px; white-space: pre;">{e(t.text)}</span>'
            f'<span style="font-size: 9px; line-height: 1.15;">'
            f"{'<br>'.join(_token_numbers_html(t))}</span>"
            "</span>"
        )

    def _html_legend(self) -> str:
        return (
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


def _ratio_cell(t: TokenInfo) -> str:
    """The text view's ratio cell: the ratio, marked v / ^ where clipped low / high."""
    if t.ratio is None:
        return ""
    return _fmt(t.ratio, False) + {"low": "v", "high": "^"}.get(t.clipped or "", "")


def _token_colors(t: TokenInfo, amax: float) -> tuple[str, str, str]:
    """``(text colour, background, border)`` of a token in the HTML view: by segment; trainable
    tokens boxed in blue and shaded by the advantage (green > 0, red < 0); clipped ones framed."""
    color, border = _SEG_STYLE.get(t.segment, ("#1f2328", "1px solid #8c959f"))
    bg = "transparent"
    if t.trainable:
        border = "1px solid #0969da"
        bg = "#ddf4ff"
        if t.advantage is not None and t.advantage == t.advantage and t.advantage != 0:
            a = 0.15 + 0.6 * min(abs(t.advantage) / amax, 1.0)
            bg = f"rgba(26,127,55,{a:.2f})" if t.advantage > 0 else f"rgba(207,34,46,{a:.2f})"
    if t.clipped:
        border = "2px solid #bf3989"
    return color, bg, border


def _token_tip(t: TokenInfo) -> list[str]:
    """The parts of a token's hover text: every number it has."""
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
    return tip


def _token_numbers_html(t: TokenInfo) -> list[str]:
    """The numbers shown under a token in the HTML view: advantage, ratio (marked where
    clipped), reward."""
    below = []
    if t.trainable and t.advantage is not None:
        below.append(html.escape(_fmt(t.advantage)))
    if t.ratio is not None:
        mark = {"low": "&#9660;", "high": "&#9650;"}.get(t.clipped or "", "")
        below.append(
            f'<span style="color:{"#bf3989" if t.clipped else "inherit"};">'
            f"{_fmt(t.ratio, False)}{mark}</span>"
        )
    if t.reward is not None:
        below.append(
            f'<span style="background:#fff8c5;border-radius:3px;">'
            f"R{html.escape(_fmt(t.reward))}</span>"
        )
    return below


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
      is the active one with bounds ``[1 - epsilon, 1 + epsilon_high]``, by the rule of
      :func:`~agentic_rl.losses.clip_region` (needs ``advantages``: a token is clipped low when
      ``A < 0`` and the ratio is below ``1 - epsilon``, high when ``A > 0`` and it is above
      ``1 + epsilon_high``; ``epsilon_high`` defaults to ``epsilon``).
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
    row = _check_row(row, B)
    epsilon_high = _check_epsilons(epsilon, epsilon_high)
    data = _row_data(batch, row, advantages, logprobs, old_logprobs, extra)
    seg = _label_segments(_default_segments(data), segments, B, T, row)
    ratios = _ratios(data)
    marks = _clip_marks(ratios, data.adv, epsilon, epsilon_high)
    texts = _token_texts(tokenizer, data.ids)
    shown = [i for i in range(T) if show_padding or data.attn[i] or data.loss[i]]
    tokens = [_token_info(data, i, texts[i], seg[i], ratios[i], marks[i]) for i in shown]
    header = _header(batch, row, data, len(tokens))
    return TokenView(tokens, header=header, epsilon=epsilon, epsilon_high=epsilon_high, width=width)


def _check_row(row, B: int) -> int:
    """``row`` as an index in ``[0, B)`` (negative rows count from the end)."""
    if not isinstance(row, int) or isinstance(row, bool):
        raise ValueError(f"row must be an int, got {type(row).__name__}")
    if not -B <= row < B:
        raise ValueError(f"row {row} is out of range for a batch of {B} rows")
    return row % B


def _check_epsilons(epsilon: float, epsilon_high: float | None) -> float:
    """``epsilon_high`` (default ``epsilon``), once ``0 <= epsilon <= epsilon_high`` holds."""
    if epsilon_high is None:
        epsilon_high = epsilon
    if not (0 <= epsilon <= epsilon_high):
        raise ValueError(
            f"epsilon: need 0 <= epsilon <= epsilon_high, got {epsilon}, {epsilon_high}"
        )
    return epsilon_high


@dataclass
class _RowData:
    """One row of the batch and of the tensors passed with it, as lists (None where absent)."""

    ids: list
    attn: list
    loss: list
    adv: list | None
    lp: list | None
    old: list | None
    rew: list | None
    val: list | None
    turns: list | None
    extras: dict


def _row_data(batch, row: int, advantages, logprobs, old_logprobs, extra) -> _RowData:
    """Take row ``row`` of the batch and of the tensors passed, checking their shapes."""
    B, T = batch.input_ids.shape
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
    return _RowData(ids, attn, loss, adv, lp, old, rew, val, turns, extras)


def _default_segments(data: _RowData) -> list[str]:
    """The default labels: "pad" (attention 0), "gen" (trainable), then "prompt" before the
    first generated token and "env" after it."""
    first_gen = next((i for i, m in enumerate(data.loss) if m), len(data.loss))
    seg = []
    for i, (attn, loss) in enumerate(zip(data.attn, data.loss)):
        if not attn:
            seg.append("pad")
        elif loss:
            seg.append("gen")
        else:
            seg.append("prompt" if i < first_gen else "env")
    return seg


def _label_segments(seg: list[str], segments, B: int, T: int, row: int) -> list[str]:
    """The default labels overridden by ``segments`` (see :func:`token_view`)."""
    if segments is None:
        return seg
    if not isinstance(segments, dict):
        segments = list(segments)
        if len(segments) != T:
            raise ValueError(f"segments must have one label per token ({T}), got {len(segments)}")
        return [s if lab is None else str(lab) for s, lab in zip(seg, segments)]
    for label, m in segments.items():
        m = torch.as_tensor(m)
        if tuple(m.shape) not in ((B, T), (T,)):
            raise ValueError(
                f"segments[{label!r}] must have shape [{B}, {T}] or [{T}], got {list(m.shape)}"
            )
        mr = (m[row] if m.ndim == 2 else m).tolist()
        seg = [str(label) if flag else s for s, flag in zip(seg, mr)]
    return seg


def _ratios(data: _RowData) -> list[float | None]:
    """The importance ratio ``exp(logprobs - old_logprobs)`` of each trainable token (the
    log-ratio clamped to [-20, 20], as :func:`~agentic_rl.losses.policy_loss` does)."""
    if data.lp is None:
        return [None] * len(data.ids)
    return [
        float(torch.exp(torch.tensor(lp - old).clamp(-20, 20))) if trainable else None
        for lp, old, trainable in zip(data.lp, data.old, data.loss)
    ]


def _clip_marks(ratios, adv, epsilon: float, epsilon_high: float) -> list[str | None]:
    """Per token, "low" / "high" where :func:`~agentic_rl.losses.policy_loss` would take the
    clipped branch (no gradient), by :func:`~agentic_rl.losses.clip_region`; None elsewhere and
    where the ratio or the advantage is not known."""
    marks: list[str | None] = [None] * len(ratios)
    pos = [i for i, r in enumerate(ratios) if r is not None]
    if adv is None or not pos:
        return marks
    low, high, _ = clip_region(
        torch.tensor([ratios[i] for i in pos], dtype=torch.float64),
        torch.tensor([adv[i] for i in pos], dtype=torch.float64),
        epsilon=epsilon,
        epsilon_high=epsilon_high,
    )
    for i, is_low, is_high in zip(pos, low.tolist(), high.tolist()):
        marks[i] = "low" if is_low else "high" if is_high else None
    return marks


def _token_info(data: _RowData, i: int, text: str, segment: str, ratio, clipped) -> TokenInfo:
    """What token ``i`` of the row gets."""
    t = TokenInfo(pos=i, token_id=data.ids[i], text=text, segment=segment, trainable=data.loss[i])
    if data.turns is not None and data.turns[i] >= 0:
        t.turn = int(data.turns[i])
    if data.adv is not None and data.loss[i]:
        t.advantage = data.adv[i]
    t.ratio, t.clipped = ratio, clipped
    if data.rew is not None and data.rew[i] != 0:
        t.reward = data.rew[i]
    if data.val is not None:
        t.value = data.val[i]
    if data.extras:
        t.extra = {k: (v[i] if v is not None else None) for k, v in data.extras.items()}
    return t


def _header(batch, row: int, data: _RowData, n_shown: int) -> str:
    """The view's title line: row, group, score, token counts, turns and the row's outcome."""
    B = batch.input_ids.shape[0]
    head = [
        f"row {row}",
        f"group {int(batch.group_id[row])}",
        f"score {float(batch.token_rewards[row].sum()):+.3g}",
        f"{n_shown} tokens shown, {sum(data.loss)} trainable",
    ]
    if data.turns is not None:
        head.append(f"{len({x for x in data.turns if x >= 0})} turns")
    ex = getattr(batch, "extras", None) or {}
    for k in ("success", "truncated"):
        v = ex.get(k)
        if isinstance(v, torch.Tensor) and v.ndim == 1 and v.shape[0] == B:
            head.append(f"{k} {bool(v[row])}")
    if getattr(batch, "correct", None) is not None and "success" not in ex:
        head.append(f"correct {bool(batch.correct[row])}")
    return " | ".join(head)
