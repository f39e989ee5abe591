"""Mean and 95% interval over seeds, and paired differences: the arithmetic of the demo's multi-seed tables.

    mean_interval([0.80, 0.90, 1.00])            # Interval(mean=0.9, half_width=0.2484, n=3)
    paired_difference([0.9, 0.8], [0.85, 0.8])   # the per-seed differences' mean and interval

The interval is Student's t: mean ± t_{1 - (1 - level) / 2, n - 1} * s / sqrt(n), with s the sample standard deviation
(n - 1 in the denominator). A paired difference is the interval of the per-seed differences (same seed, same data,
same starting weights in both runs), which removes what the two runs share. With one value there is no interval
(``half_width`` is None). The t quantile is computed here (bisection on the t CDF through the regularised incomplete
beta function), so nothing beyond the standard library is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (0 < p < 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


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


# ------------------------------------------------------------------------------------- the optimizer step per part

OPTIMIZER_KEYS = ("grad_norm", "clip_coef", "grad_norm_before_part_clip")
OPTIMIZER_PREFIXES = ("grad_norm/", "update_size/", "clip_coef/")


def mean_of(values):
    """The mean of numbers; of dicts, the mean per key (recursively); otherwise the first value."""
    values = list(values)
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sum(values) / len(values)
    if values and all(isinstance(v, dict) for v in values):
        return {k: mean_of(v.get(k) for v in values) for k in values[0]}
    return values[0] if values else None


def parts_total(record: dict) -> float | None:
    """The root sum of squares of a record's per-part gradient norms (``grad_norm/<part>``, read before any
    clipping): the whole gradient's norm before clipping. The Trainer's own ``grad_norm`` is the norm its global
    clipping sees, which under per-part clipping (``clip_coef/<part>`` in the record) is taken after each part was
    clipped; this is the total before. None without per-part norms."""
    parts = [v for k, v in record.items() if k.startswith("grad_norm/") and isinstance(v, (int, float))]
    return math.sqrt(sum(v * v for v in parts)) if parts else None


def optimizer_step_stats(records: list[dict]) -> dict:
    """Per key of the norm-tracking records (pre-clip gradient norms ``grad_norm[/part]``, the clip coefficient
    ``clip_coef[/part]``, the update sizes ``update_size/<part>``), the mean over the logged training steps (step > 0)
    of one run's records, and the first logged step's values. The demo's tables and the model card's norm-tracking
    section both read a run's optimizer step through this. With per-part clipping (``clip_coef/<part>`` logged),
    ``grad_norm_before_part_clip`` is ``parts_total``: ``grad_norm`` is then the norm after the per-part clipping."""
    logged = [r for r in records if isinstance(r, dict) and (r.get("step") or 0) > 0]
    if logged and any(k.startswith("clip_coef/") for k in logged[0]):
        logged = [{**r, "grad_norm_before_part_clip": parts_total(r)} for r in logged]
    keys = [k for k in (logged[0] if logged else {}) if k in OPTIMIZER_KEYS or k.startswith(OPTIMIZER_PREFIXES)]
    return {"mean": {k: mean_of(r[k] for r in logged if k in r) for k in keys},
            "first": {k: logged[0][k] for k in keys}, "steps": len(logged)}

