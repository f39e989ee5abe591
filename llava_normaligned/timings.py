"""How long the demo and the tests take, stated once: ``assets/timings.json`` holds the measured runs, and every text
that gives a duration (the README, docs/demo.md, docs/DEVELOPING.md, ``demo --help``) says ``stated(name)``.

    stated("demo")        # 'about 4 minutes on 2 CPU cores (measured 207-238 s)'
    stated("demo_quick")  # 'about 25 s on 2 CPU cores (measured 24 s)'
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


def about(name: str) -> str:
    """The median of the measured runs, rounded as a reader wants it: 'about 25 s', 'about 4 minutes'."""
    seconds = statistics.median(records()["records"][name]["seconds"])
    if seconds < 90:
        return f"about {max(5, 5 * round(seconds / 5))} s"
    return f"about {round(seconds / 60)} minutes"


def measured(name: str) -> str:
    """The measured range: 'measured 207-238 s' (one run: 'measured 24 s')."""
    seconds = records()["records"][name]["seconds"]
    low, high = min(seconds), max(seconds)
    return f"measured {low} s" if low == high else f"measured {low}-{high} s"


def stated(name: str) -> str:
    """The sentence every text uses: 'about 4 minutes on 2 CPU cores (measured 207-238 s)'."""
    return f"{about(name)} on {records()['machine']} ({measured(name)})"


__all__ = ["about", "measured", "records", "stated"]
