"""Add a measured run to llava_normaligned/assets/timings.json and rewrite every text that states that duration.

    python .ci/timings.py add tests_fast 188               # this machine's CPU is recorded with the run
    python .ci/timings.py add demo_real_quick 214 --machine "2 cores (CPU model not recorded)"
    python .ci/timings.py replace tests 1490               # the record's runs become this one run

The texts (README.md, docs/demo.md, docs/DEVELOPING.md, the demo's --help) state ``timings.stated(name)``;
tests/test_readme.py checks them. This rewrites the old sentence into the new one wherever it appears.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llava_normaligned import timings  # noqa: E402

TEXTS = ["README.md", "docs/demo.md", "docs/DEVELOPING.md", "llava_normaligned/demo/run.py"]


def _this_machine() -> str:
    from durations import _cpu  # .ci/durations.py

    import os

    return f"{_cpu()}, {os.cpu_count()} cores"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("action", choices=("add", "replace"))
    parser.add_argument("name", choices=sorted(timings.records()["records"]))
    parser.add_argument("seconds", type=int)
    parser.add_argument("--machine", default=None, help="where it ran (default: this machine's CPU model and cores)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / ".ci"))
    before = {name: timings.stated(name) for name in timings.records()["records"]}
    record = json.loads(Path(timings.RECORD).read_text())
    run = {"seconds": args.seconds, "machine": args.machine or _this_machine()}
    runs = record["records"][args.name]["runs"]
    record["records"][args.name]["runs"] = [run] if args.action == "replace" else [*runs, run]
    Path(timings.RECORD).write_text(json.dumps(record, indent=1) + "\n")
    timings.records.cache_clear()
    old, new = before[args.name], timings.stated(args.name)
    for text in TEXTS:
        path = ROOT / text
        content = path.read_text()
        if old in content:
            path.write_text(content.replace(old, new))
            print(f"{text}: {old!r} -> {new!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
