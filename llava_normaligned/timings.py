"""How long the demo and the tests take, stated once: ``assets/timings.json`` holds the measured runs, and every text
that gives a duration (the README, docs/demo.md, docs/DEVELOPING.md, ``demo --help``) says ``stated(name)``.

    stated("demo")        # 'about 4 minutes on 2 CPU cores (measured 207-238 s)'
    stated("demo_quick")  # 'about 25 s on 2 CPU cores (measured 24 s)'

Each run in the record names the machine it ran on; where the runs differ by more than ``SPREAD``, the range is
stated ('about 2-4 minutes'), since no one figure holds across machines.
"""

from __future__ import annotations

import json
import os
import statistics
from functools import lru_cache

RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "timings.json")


@lru_cache(maxsize=1)
def records() -> dict:
    with open(RECORD, encoding="utf-8") as handle:
        return json.load(handle)


SPREAD = 1.3  # runs whose slowest took more than this times the fastest are stated as a range, not one figure


def seconds_of(name: str) -> list[int]:
    """The seconds of every recorded run of ``name`` (each run also records the machine it ran on)."""
    return [run["seconds"] for run in records()["records"][name]["runs"]]


def _rounded(seconds: float, unit: str) -> int:
    return max(5, 5 * round(seconds / 5)) if unit == "s" else round(seconds / 60)


def about(name: str) -> str:
    """The measured runs as a reader wants them: 'about 25 s', 'about 4 minutes' (the median), or the range
    'about 2-4 minutes' where machines differed by more than ``SPREAD`` and no one figure can be promised."""
    seconds = seconds_of(name)
    low, high = min(seconds), max(seconds)
    unit = "s" if statistics.median(seconds) < 90 else "minutes"
    if high > SPREAD * low:
        first, last = _rounded(low, unit), _rounded(high, unit)
        if first != last:
            return f"about {first}-{last} {unit}"
    return f"about {_rounded(statistics.median(seconds), unit)} {unit}"


def measured(name: str) -> str:
    """The measured range: 'measured 207-238 s' (one run: 'measured 24 s')."""
    seconds = seconds_of(name)
    low, high = min(seconds), max(seconds)
    return f"measured {low} s" if low == high else f"measured {low}-{high} s"


def stated(name: str) -> str:
    """The sentence every text uses: 'about 4 minutes on 2 CPU cores (measured 207-238 s)'."""
    return f"{about(name)} on {records()['machine']} ({measured(name)})"


__all__ = ["about", "measured", "records", "seconds_of", "stated"]
