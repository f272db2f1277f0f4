"""The few figure types the book repeats: learning curves (several runs or seeds), and advantage histograms."""

from __future__ import annotations

import numpy as np

__all__ = ["smooth", "plot_metrics", "plot_runs", "plot_advantages"]

LABELS = {
    "reward_mean": "mean reward",
    "accuracy": "sampled accuracy",
    "frac_reward_zero_std": "frac. groups with zero reward std",
    "kl": "KL(pi || pi_ref), k3",
    "entropy": "entropy (nats/token)",
    "clip_ratio": "clip ratio",
    "grad_norm": "grad norm",
    "completion_length": "completion length (tokens)",
    "success_rate": "success rate (sampled)",
    "value_loss": "value loss",
    "explained_variance": "explained variance of the returns",
    "num_turns": "turns per episode",
}


def smooth(values, window: int = 1) -> np.ndarray:
    """Trailing moving average (the first points average over what exists so far)."""
    v = np.asarray(values, dtype=float)
    if window <= 1:
        return v
    c = np.cumsum(np.insert(v, 0, 0.0))
    n = np.minimum(np.arange(1, len(v) + 1), window)
    return (c[1:] - c[np.maximum(np.arange(1, len(v) + 1) - window, 0)]) / n


def plot_metrics(history: list[dict], keys=("reward_mean", "accuracy", "frac_reward_zero_std", "kl"), *, window: int = 10, ncols: int = 2,
                 title: str | None = None, xlabel: str = "GRPO step"):
    """One panel per metric of one run: raw values faint, moving average bold. Returns the figure."""
    import matplotlib.pyplot as plt

    nrows = int(np.ceil(len(keys) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 2.8 * nrows), squeeze=False)
    steps = [r["step"] for r in history]
    for ax, key in zip(axes.flat, keys):
        vals = [r[key] for r in history]
        ax.plot(steps, vals, color="C0", alpha=0.25, lw=1)
        ax.plot(steps, smooth(vals, window), color="C0", lw=2)
        ax.set_title(LABELS.get(key, key), fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_runs(histories: dict[str, list[dict]], keys=("accuracy",), *, window: int = 10, title: str | None = None, xlabel: str = "GRPO step"):
    """Several runs (labels -> histories) on shared panels, one panel per metric. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.0), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for i, (label, hist) in enumerate(histories.items()):
            ax.plot([r["step"] for r in hist], smooth([r[key] for r in hist], window), color=f"C{i}", lw=2, label=label)
        ax.set_title(LABELS.get(key, key), fontsize=10)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


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
