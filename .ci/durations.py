"""The suite's measured durations, per test and per file: what the fast tier leaves out, and where the time goes.

    python -m pytest -q --durations=0 | tee /tmp/pytest.log    # the full suite, every duration printed
    python .ci/durations.py update /tmp/pytest.log             # tests/durations.json gets that run's durations
    python .ci/durations.py table                              # the per-file table of docs/DEVELOPING.md

A test is in the slow tier when its recorded setup + call + teardown (all its parameters together) took at least
``SLOW_SECONDS`` (tests/conftest.py marks it ``slow`` at collection), or when its source marks it so. A test that is
not recorded yet counts as fast until the next `update`. `update` replaces the records of the test files the log
covers (a run of one file updates that file's tests) and drops those of files that no longer exist.
"""

from __future__ import annotations

import json
import platform
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "tests" / "durations.json"
LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(tests/[^:\s]+)::(\S+)")


def read_log(path: Path) -> dict[str, float]:
    """{test id without its parameters: seconds} from a ``--durations=0`` log."""
    seconds: dict[str, float] = defaultdict(float)
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = LINE.match(line)
        if match:
            seconds[f"{match.group(3)}::{match.group(4).split('[')[0]}"] += float(match.group(1))
    return {name: round(value, 2) for name, value in sorted(seconds.items())}


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def per_file(tests: dict[str, float], slow_seconds: float) -> list[tuple[str, int, float, float]]:
    """(file, tests, seconds, seconds in the slow tier) per file, slowest first."""
    files: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for name, seconds in tests.items():
        entry = files[name.split("::")[0]]
        entry[0] += 1
        entry[1] += seconds
        entry[2] += seconds if seconds >= slow_seconds else 0.0
    rows = [(name, int(n), total, slow) for name, (n, total, slow) in files.items()]
    return sorted(rows, key=lambda row: -row[2])


def table(record: dict) -> str:
    rows = per_file(record["tests"], record["slow_seconds"])
    lines = ["| file | test functions | seconds | of which slow tier |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| `{name}` | {n} | {total:.1f} | {slow:.1f} |" for name, n, total, slow in rows if total >= 1.0]
    small = [row for row in rows if row[2] < 1.0]
    lines.append(f"| {len(small)} other files | {sum(r[1] for r in small)} | {sum(r[2] for r in small):.1f} | "
                 f"{sum(r[3] for r in small):.1f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["update"] and len(argv) == 2:
        old = json.loads(RECORD.read_text()) if RECORD.exists() else {"slow_seconds": 1.0}
        tests = read_log(Path(argv[1]))
        if not tests:
            print(f"{argv[1]}: no durations found (run pytest with --durations=0)", file=sys.stderr)
            return 2
        covered = {name.split("::")[0] for name in tests}
        kept = {name: value for name, value in old.get("tests", {}).items()
                if name.split("::")[0] not in covered and (ROOT / name.split("::")[0]).exists()}
        tests = dict(sorted({**kept, **tests}.items()))
        record = {"about": "Seconds per test (setup + call + teardown, its parameters together): written by "
                           ".ci/durations.py update from --durations=0 logs; tests/conftest.py marks a test slow at "
                           "slow_seconds or more.",
                  "cpu": _cpu(), "cores": 2, "slow_seconds": old["slow_seconds"], "tests": tests}
        RECORD.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {RECORD.relative_to(ROOT)}: {len(tests)} tests, {sum(tests.values()):.0f} s")
        return 0
    if argv == ["table"]:
        print(table(json.loads(RECORD.read_text())))
        return 0
    print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
