"""Comparisons over seeds: paired differences, t-intervals, the minimum detectable effect.

A lab's arms share their warm start and task stream per seed, so a comparison is the difference
*per seed* (arm B's value minus arm A's on the same seed), summarised by Student's t at its n:

- the mean difference :math:`\\bar d` and its standard error :math:`s_d / \\sqrt n`;
- the 95 % t-interval :math:`\\bar d \\pm t_{0.975,\\,n-1}\\, s_d/\\sqrt n`;
- the **minimum detectable effect** at 80 % power, two-sided 5 %:
  :math:`(t_{0.975,\\,n-1} + t_{0.80,\\,n-1})\\, s_d / \\sqrt n`. A difference smaller than it
  could have been missed, so a null ("no difference") is only as strong as its MDE;
- :func:`seeds_needed`: the n at which the MDE falls to a target, from a pilot's :math:`s_d`.

No scipy: the t quantile is computed from the density (Simpson's rule and bisection), to 1e-7.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass

__all__ = ["t_quantile", "Paired", "paired", "mde", "seeds_needed"]


def _t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with ``df`` degrees of freedom (Simpson's rule on the density)."""
    if x < 0:
        return 1.0 - _t_cdf(-x, df)
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(t: float) -> float:
        return math.exp(log_c - (df + 1) / 2 * math.log1p(t * t / df))

    n = 2000  # even; the density is smooth, so Simpson's error is far below 1e-9 here
    h = x / n
    total = density(0.0) + density(x)
    total += sum((4 if i % 2 else 2) * density(i * h) for i in range(1, n))
    return 0.5 + total * h / 3


@functools.lru_cache(maxsize=None)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``0.5 < p < 1``)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1 (got p={p}, df={df})")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def mde(sd: float, n: int, *, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest true mean difference a paired t-test at ``n`` seeds detects with ``power``
    (two-sided, level ``alpha``), given the paired differences' standard deviation ``sd``."""
    if n < 2:
        return math.inf
    df = n - 1
    return (t_quantile(1 - alpha / 2, df) + t_quantile(power, df)) * sd / math.sqrt(n)


def seeds_needed(sd: float, effect: float, *, power: float = 0.8, alpha: float = 0.05) -> int:
    """The fewest seeds whose MDE (:func:`mde`) is at most ``effect``, given a pilot's ``sd``."""
    if effect <= 0:
        raise ValueError(f"seeds_needed: the effect to detect must be positive (got {effect})")
    n = 2
    while mde(sd, n, power=power, alpha=alpha) > effect:
        n += 1
        if n > 10_000:
            raise ValueError(f"seeds_needed: more than 10,000 seeds for {effect} at sd {sd}")
    return n


@dataclass(frozen=True)
class Paired:
    """Paired differences ``b - a`` over seeds, and what they support."""

    diffs: tuple[float, ...]
    mean: float
    sd: float
    se: float
    low: float  # the 95 % t-interval
    high: float
    mde: float  # at 80 % power

    @property
    def n(self) -> int:
        return len(self.diffs)

    def excludes_zero(self) -> bool:
        """Whether the 95 % t-interval lies on one side of zero."""
        return self.low > 0 or self.high < 0

    def __str__(self) -> str:
        return (
            f"{self.mean:+.3f} (95% CI {self.low:+.3f} to {self.high:+.3f}; "
            f"MDE {self.mde:.3f}; n = {self.n})"
        )


def paired(a, b) -> Paired:
    """Paired differences ``b[i] - a[i]`` (the same seeds in the same order) and their t-summary."""
    a, b = list(a), list(b)
    if len(a) != len(b):
        raise ValueError(f"paired: the two arms have {len(a)} and {len(b)} seeds")
    if len(a) < 2:
        raise ValueError(f"paired: a t-interval needs at least 2 seeds (got {len(a)})")
    d = tuple(float(y) - float(x) for x, y in zip(a, b))
    mean, sd = statistics.mean(d), statistics.stdev(d)
    se = sd / math.sqrt(len(d))
    half = t_quantile(0.975, len(d) - 1) * se
    return Paired(d, mean, sd, se, mean - half, mean + half, mde(sd, len(d)))
