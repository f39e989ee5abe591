"""Mean and 95% interval over seeds, and paired differences: the arithmetic of the demo's multi-seed tables.

    mean_interval([0.80, 0.90, 1.00])            # Interval(mean=0.9, half_width=0.2484, n=3)
    paired_difference([0.9, 0.8], [0.85, 0.8])   # the per-seed differences' mean and interval

A paired comparison also gives the smallest true difference it could have detected
(``detectable_difference``): with the paired differences' spread s over n seeds, a two-sided paired t-test at
level 1 - alpha finds a true difference of (t_{1 - alpha / 2, n - 1} + t_{power, n - 1}) * s / sqrt(n) or more with
probability ``power`` (80% here). A difference smaller than that is no evidence of "no effect": the run could not
have seen it.

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
    """A mean over ``n`` values with the half-width of its interval (None with one value); for a paired difference,
    ``detectable``: the smallest true difference it detects with 80% power (``detectable_difference``)."""

    mean: float
    half_width: float | None
    n: int
    level: float = 0.95
    detectable: float | None = None

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
        out = {"mean": self.mean, "half_width": self.half_width, "low": self.low, "high": self.high, "n": self.n,
               "level": self.level}
        if self.detectable is not None:
            out["detectable_difference"] = self.detectable
        return out

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


def detectable_difference(values, power: float = 0.8, level: float = 0.95) -> float | None:
    """The smallest true mean of ``values`` (paired differences) that a two-sided t-test at ``level`` detects with
    probability ``power``, from their measured spread: (t_{1-(1-level)/2, n-1} + t_{power, n-1}) * s / sqrt(n).
    None with fewer than two values (no spread)."""
    values = [float(v) for v in values]
    n = len(values)
    if n < 2:
        return None
    if not 0.0 < power < 1.0:
        raise ValueError(f"power must be in (0, 1), got {power}")
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return (t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)


def detectable_from_interval(half_width: float | None, n: int, level: float = 0.95, power: float = 0.8) -> float | None:
    """``detectable_difference`` from a recorded interval of paired differences (its half-width holds s / sqrt(n)
    times the t quantile), for records written before it was stored; None without an interval."""
    if half_width is None or n < 2:
        return None
    quantile = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1)
    return (quantile + t_quantile(power, n - 1)) * half_width / quantile


def seeds_for(sd: float, difference: float, power: float = 0.8, level: float = 0.95, most: int = 1000) -> int | None:
    """The fewest seeds whose paired comparison detects ``difference`` at ``power`` when the paired differences'
    standard deviation is ``sd`` (the planning inverse of ``detectable_difference``); None beyond ``most``."""
    if difference <= 0:
        raise ValueError(f"difference must be positive, got {difference}")
    for n in range(2, most + 1):
        factor = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) + t_quantile(power, n - 1)
        if factor * sd / math.sqrt(n) <= difference:
            return n
    return None


def paired_difference(values, reference, level: float = 0.95) -> Interval:
    """Mean and interval of ``values[i] - reference[i]`` (the same seeds, in the same order)."""
    values, reference = list(values), list(reference)
    if len(values) != len(reference):
        raise ValueError(f"paired_difference needs as many values as references, got {len(values)} and "
                         f"{len(reference)}")
    differences = [v - r for v, r in zip(values, reference)]
    interval = mean_interval(differences, level)
    interval.detectable = detectable_difference(differences, level=level)
    return interval
