"""How long the demo and the tests take, stated once: `assets/timings.json` holds the measured runs, and every text
that gives a duration (the README, docs/demo.md, docs/DEVELOPING.md, `demo --help`) says `stated(name)`.

    stated("demo")        # 'about 4 minutes on 2 CPU cores (measured 207-238 s)'
    stated("demo_quick")  # 'about 25 s on 2 CPU cores (measured 24 s)'

Where the runs differ by more than `SPREAD`, the range is stated ('about 2-4 minutes'), since no one figure holds across
machines.
"""

from __future__ import annotations

import json
import os
import statistics
from functools import lru_cache

RECORD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "timings.json")


@lru_cache(maxsize=1)
def records() -> dict:
    """Reads the record of measured runs (read once, then cached).

    Returns:
        `dict`: The content of `assets/timings.json`, whose `machine` is the machine the statements name and whose
        `records` maps each name to `{"runs": [{"seconds": ..., "machine": ...}, ...], ...}`.

    Raises:
        `OSError` or `json.JSONDecodeError`: If the file cannot be read or parsed.
    """
    with open(RECORD, encoding="utf-8") as handle:
        return json.load(handle)


SPREAD = 1.3  # runs whose slowest took more than this times the fastest are stated as a range, not one figure


def seconds_of(name: str) -> list[int]:
    """Returns the durations of every recorded run of one name.

    Args:
        name (`str`):
            The record's name, e.g. `"demo"`.

    Returns:
        `list[int]`: The seconds of each run (each run also records the machine it ran on).

    Raises:
        `KeyError`: If there is no record of `name`.
    """
    return [run["seconds"] for run in records()["records"][name]["runs"]]


def _rounded(seconds: float, unit: str) -> int:
    return max(5, 5 * round(seconds / 5)) if unit == "s" else round(seconds / 60)


def about(name: str) -> str:
    """States the measured runs as a reader wants them.

    Durations whose median is under 90 s are given in seconds (rounded to 5 s, at least 5), others in minutes.

    Args:
        name (`str`):
            The record's name.

    Returns:
        `str`: The median, e.g. `'about 25 s'` or `'about 4 minutes'`; or the range, e.g. `'about 2-4 minutes'`, where
        the slowest run took more than `SPREAD` times the fastest and the two round differently.
    """
    seconds = seconds_of(name)
    low, high = min(seconds), max(seconds)
    unit = "s" if statistics.median(seconds) < 90 else "minutes"
    if high > SPREAD * low:
        first, last = _rounded(low, unit), _rounded(high, unit)
        if first != last:
            return f"about {first}-{last} {unit}"
    return f"about {_rounded(statistics.median(seconds), unit)} {unit}"


def measured(name: str) -> str:
    """States the measured range.

    Args:
        name (`str`):
            The record's name.

    Returns:
        `str`: E.g. `'measured 207-238 s'`, or `'measured 24 s'` when every run took the same time.
    """
    seconds = seconds_of(name)
    low, high = min(seconds), max(seconds)
    return f"measured {low} s" if low == high else f"measured {low}-{high} s"


def stated(name: str) -> str:
    """Gives the sentence every text uses for a duration.

    Args:
        name (`str`):
            The record's name.

    Returns:
        `str`: E.g. `'about 4 minutes on 2 CPU cores (measured 207-238 s)'`.
    """
    return f"{about(name)} on {records()['machine']} ({measured(name)})"


__all__ = ["about", "measured", "records", "seconds_of", "stated"]
