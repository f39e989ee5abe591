"""Redraw the default images of ``diagnose`` (``llava_normaligned.diagnostics.default_inputs``: scenes drawn in code)
into the package's assets, or another folder.

    python .ci/default_images.py [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llava_normaligned.diagnostics.default_inputs import default_images_dir, write_default_images  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--output-dir", default=None, help="default: the package's assets/diagnostics/images")
    args = parser.parse_args(argv)
    for path in write_default_images(args.output_dir or default_images_dir()):
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
