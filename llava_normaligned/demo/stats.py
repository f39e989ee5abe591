"""Mean and 95% interval over seeds, and paired differences: the arithmetic of the demo's multi-seed tables.

    mean_interval([0.80, 0.90, 1.00])            # Interval(mean=0.9, half_width=0.2484, n=3)
    paired_difference([0.9, 0.8], [0.85, 0.8])   # the per-seed differences' mean and interval

The interval is Student's t: mean ± t_{1 - (1 - level) / 2, n - 1} * s / sqrt(n), with s the sample standard deviation
(n - 1 in the denominator). A paired difference is the interval of the per-seed differences (same seed, same data,
same starting weights in both runs), which removes what the two runs share. With one value there is no interval
(``half_width`` is None). The t quantile is scipy's (``scipy.stats.t.ppf``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0 < p < 1): ``scipy.stats.t.ppf``."""
    from scipy.stats import t

    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    return float(t.ppf(p, df))


@dataclass
class Interval:
    """A mean over ``n`` values with the half-width of its interval (None with one value)."""

    mean: float
    half_width: float | None
    n: int
    level: float = 0.95

    @property
    def low(self) -> float | None:
        return None if self.half_width is None else self.mean - self.half_width

    @property
    def high(self) -> float | None:
        return None if self.half_width is None else self.mean + self.half_width

    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly on one side of 0 (False without an interval)."""
        return self.half_width is not None and (self.low > 0 or self.high < 0)

    def to_dict(self) -> dict:
        return {"mean": self.mean, "half_width": self.half_width, "low": self.low, "high": self.high, "n": self.n,
                "level": self.level}

    def text(self, digits: int = 3, signed: bool = False) -> str:
        mean = f"{self.mean:+.{digits}f}" if signed else f"{self.mean:.{digits}f}"
        return mean if self.half_width is None else f"{mean} ± {self.half_width:.{digits}f}"


def mean_interval(values, level: float = 0.95) -> Interval:
    """Mean of ``values`` with its Student-t interval at ``level`` (two-sided)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("mean_interval needs at least one value")
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return Interval(mean, None, 1, level)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(mean, t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * sd / math.sqrt(n), n, level)


def paired_difference(values, reference, level: float = 0.95) -> Interval:
    """Mean and interval of ``values[i] - reference[i]`` (the same seeds, in the same order)."""
    values, reference = list(values), list(reference)
    if len(values) != len(reference):
        raise ValueError(f"paired_difference needs as many values as references, got {len(values)} and "
                         f"{len(reference)}")
    return mean_interval([v - r for v, r in zip(values, reference)], level)
