"""The few figure types the book repeats: learning curves (several runs or seeds),
and advantage histograms."""

from __future__ import annotations

import numpy as np

__all__ = [
    "collapse_step",
    "plot_advantages",
    "plot_echo_trap",
    "plot_metrics",
    "plot_runs",
    "plot_seeds",
    "seed_spread",
    "smooth",
]

#: Widest figure, in inches: the book's text column shows it at full size (readable text)
#: at 100 dpi.
MAX_WIDTH = 9.0

LABELS = {
    "reward_mean": "mean reward",
    "accuracy": "sampled accuracy",
    "frac_reward_zero_std": "frac. groups with zero reward std",
    "kl": "KL(pi || pi_ref), k3",
    "entropy": "entropy (nats/token)",
    "clip_ratio": "clip ratio",
    "vf_clip_ratio": "value clip ratio",
    "approx_kl": "KL(pi_old || pi), k3",
    "grad_norm": "grad norm",
    "completion_length": "completion length (tokens)",
    "success_rate": "success rate (sampled)",
    "value_loss": "value loss",
    "explained_variance": "explained variance of the returns",
    "num_turns": "turns per episode",
    "code_ratio": "episodes that call the tool",
    "tool_calls": "tool calls per episode",
    "error_rate_in_positives": "tool errors per call (correct episodes)",
    "grad_share": "interpreter share of the gradient norm",
    "in_group_std": "in-group reward std (all groups)",
    "chosen_in_group_std": "in-group reward std (kept groups)",
    "kept_groups": "fraction of groups kept",
    "distinct_per_group": "distinct action sequences per group",
    "zero_std_easy": "zero-std groups (easy tasks)",
    "zero_std_hard": "zero-std groups (hard tasks)",
    "mean_abs_advantage": "mean |advantage|",
    "high_success": "success under the high token",
    "low_success": "success under the low token",
}


def smooth(values, window: int = 1) -> np.ndarray:
    """Trailing moving average (the first points average over what exists so far)."""
    v = np.asarray(values, dtype=float)
    if window <= 1:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    n = np.minimum(np.arange(1, len(v) + 1), window)
    return (c[1:] - c[np.maximum(np.arange(1, len(v) + 1) - window, 0)]) / n


def plot_metrics(
    history: list[dict],
    keys=("reward_mean", "accuracy", "frac_reward_zero_std", "kl"),
    *,
    window: int = 10,
    ncols: int = 2,
    title: str | None = None,
    xlabel: str = "GRPO step",
    labels: dict[str, str] | None = None,
):
    """One panel per metric of one run: raw values faint, moving average bold.
    Returns the figure."""
    import matplotlib.pyplot as plt

    nrows = int(np.ceil(len(keys) / ncols))
    width = min(4.2 * ncols, MAX_WIDTH)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(width, width / ncols * 0.67 * nrows), squeeze=False
    )
    steps = [r["step"] for r in history]
    for ax, key in zip(axes.flat, keys):
        vals = [r[key] for r in history]
        ax.plot(steps, vals, color="C0", alpha=0.25, lw=1)
        ax.plot(steps, smooth(vals, window), color="C0", lw=2)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    return _dress(fig, axes, keys, xlabel, title, labels=labels)


def collapse_step(history: list[dict], key: str, *, drop: float = 0.5, window: int = 5):
    """The first step after the peak of ``key`` (smoothed over ``window`` steps) where it falls
    to ``drop`` times that peak or below; ``None`` if it never does.

    RAGEN's reading of its curves (Finding 3): the in-group reward std and the entropy fall
    *before* success does. ``collapse_step(h, "in_group_std")`` and ``collapse_step(h,
    "accuracy")`` measure both falls the same way.
    """
    values = smooth([r[key] for r in history], window)
    if len(values) == 0:
        return None
    peak = int(values.argmax())
    if not values[peak] > 0:
        return None
    below = [i for i in range(peak, len(values)) if values[i] <= drop * values[peak]]
    return history[below[0]]["step"] if below else None


def plot_echo_trap(
    history: list[dict],
    keys=("accuracy", "in_group_std", "entropy", "grad_norm"),
    *,
    drop: float = 0.5,
    window: int = 5,
    title: str | None = None,
    xlabel: str = "RL step",
    labels: dict[str, str] | None = None,
):
    """One run's Echo-Trap indicators, a panel each, with two steps marked on every panel: where
    success (``accuracy``) and where the in-group reward std fell to ``drop`` times their peaks
    (:func:`collapse_step`). A mark that never happened is left out and said so in the legend.
    Returns the figure."""
    fig = plot_metrics(history, keys, window=window, title=title, xlabel=xlabel, labels=labels)
    marks = (("accuracy", "success falls", "C3"), ("in_group_std", "reward std falls", "C4"))
    for key, name, color in marks:
        step = collapse_step(history, key, drop=drop, window=window)
        for ax in fig.axes[: len(keys)]:
            if step is not None:
                ax.axvline(step, color=color, ls="--", lw=1.2)
        fig.axes[0].plot(
            [],
            [],
            color=color,
            ls="--",
            lw=1.2,
            label=f"{name}: step {step}" if step is not None else f"{name}: never",
        )
    fig.axes[0].legend(fontsize=8)
    return fig


def plot_runs(
    histories: dict[str, list[dict]],
    keys=("accuracy",),
    *,
    window: int = 10,
    title: str | None = None,
    xlabel: str = "GRPO step",
):
    """Several runs (labels -> histories) on shared panels, one panel per metric.
    Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(keys), figsize=(min(4.5 * len(keys), MAX_WIDTH), 3.0), squeeze=False
    )
    for ax, key in zip(axes.flat, keys):
        for i, (label, hist) in enumerate(histories.items()):
            ax.plot(
                [r["step"] for r in hist],
                smooth([r[key] for r in hist], window),
                color=f"C{i}",
                lw=2,
                label=label,
            )
    return _dress(fig, axes, keys, xlabel, title, legend=True)


def _dress(fig, axes, keys, xlabel: str, title: str | None, *, legend: bool = False, labels=None):
    """The finish every figure here shares: a titled, gridded panel per metric, then layout.
    ``labels`` overrides :data:`LABELS` for this figure (e.g. ``accuracy`` read as a success)."""
    names = {**LABELS, **(labels or {})}
    for ax, key in zip(axes.flat, keys):
        ax.set_title(names.get(key, key), fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    if legend:
        axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def seed_spread(values) -> str:
    """``"mean ± sd (min to max), n seeds"`` of one number measured on several seeds (sd: N-1)."""
    v = np.asarray(list(values), dtype=float)
    sd = v.std(ddof=1) if len(v) > 1 else 0.0
    return f"{v.mean():.3f} ± {sd:.3f} (min {v.min():.3f}, max {v.max():.3f}; {len(v)} seeds)"


def plot_seeds(
    runs: dict[str, list[list[dict]]],
    keys=("accuracy",),
    *,
    window: int = 10,
    title: str | None = None,
    xlabel: str = "GRPO step",
    labels: dict[str, str] | None = None,
):
    """Runs repeated over seeds (label -> one history per seed): the mean of the seeds' smoothed
    curves in bold, the band between the lowest and the highest seed shaded. Returns the figure.
    ``labels`` renames panels (metric -> title) for this figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(keys), figsize=(min(4.5 * len(keys), MAX_WIDTH), 3.2), squeeze=False
    )
    for ax, key in zip(axes.flat, keys):
        for i, (label, hists) in enumerate(runs.items()):
            n = min(len(h) for h in hists)
            curves = np.stack([smooth([r[key] for r in h[:n]], window) for h in hists])
            steps = [r["step"] for r in hists[0][:n]]
            ax.fill_between(steps, curves.min(0), curves.max(0), color=f"C{i}", alpha=0.2, lw=0)
            ax.plot(
                steps, curves.mean(0), color=f"C{i}", lw=2, label=f"{label} ({len(hists)} seeds)"
            )
    return _dress(fig, axes, keys, xlabel, title, legend=True, labels=labels)


def plot_advantages(advantages: dict[str, np.ndarray], *, bins: int = 30):
    """Overlaid histograms of advantage values (e.g. ``{"scale=group": a, "scale=none": b}``)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3))
    for label, a in advantages.items():
        ax.hist(np.asarray(a).ravel(), bins=bins, alpha=0.5, label=label)
    ax.set_xlabel("advantage")
    ax.set_ylabel("count")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
