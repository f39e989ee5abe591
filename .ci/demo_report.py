"""Print the README's / docs' excerpt of a demo run's ``results.json`` (``llava_normaligned.demo.results_text``), to paste
where ``tests/test_demo.py`` says it differs; ``--write-asset`` also keeps the run's GWC finding for the demo's model
card (``llava_normaligned/assets/demo_gwc.json``).

    python .ci/demo_report.py RESULTS_JSON [--write-asset]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llava_normaligned.demo.results_text import measured_section, write_gwc_asset  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", help="a demo run's results.json")
    parser.add_argument("--write-asset", action="store_true", help="also write llava_normaligned/assets/demo_gwc.json")
    args = parser.parse_args(argv)
    try:
        with open(args.results, encoding="utf-8") as handle:
            results = json.load(handle)
    except (OSError, ValueError) as error:
        parser.error(f"cannot read {args.results}: {error}")
    print(measured_section(results))
    if args.write_asset:
        write_gwc_asset(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
