"""Seconds of every command's ``--help`` (cold: an empty help cache; cached: the second call) and of a bad flag's
one-line error, each a fresh process (``python -m llava_normaligned.cli`` in the checkout's root), for a checkout
(default: this one; another to compare, e.g. a clone of an earlier commit).

    python .ci/command_times.py [--root CHECKOUT] [--json FILE]

Run on an idle machine: the numbers are wall-clock seconds of whole processes (Python start, imports).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _seconds(args: list[str], env: dict, root: Path) -> tuple[float, int]:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "llava_normaligned.cli", *args], env=env, cwd=root,
                            capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - started, result.returncode


def command_names(root: Path) -> list[str]:
    code = "from llava_normaligned.cli import COMMANDS; print(' '.join(COMMANDS))"
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          check=True).stdout.split()


def measure(root: Path) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, LLAVA_NORMALIGNED_CACHE=cache, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        for name in command_names(root):
            shutil.rmtree(os.path.join(cache, "help"), ignore_errors=True)
            cold, code = _seconds([name, "--help"], env, root)
            cached, _ = _seconds([name, "--help"], env, root)
            bad, bad_code = _seconds([name, "--no-such-flag"], env, root)
            out[name] = {"help_cold_s": round(cold, 2), "help_cached_s": round(cached, 2), "help_exit": code,
                         "bad_flag_s": round(bad, 2), "bad_flag_exit": bad_code}
            print(f"{name:10s} --help {cold:5.2f} s cold, {cached:5.2f} s cached; bad flag {bad:5.2f} s "
                  f"(exit {bad_code})", flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--root", default=str(ROOT), help="the checkout (default: this one)")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    result = measure(Path(opts.root).resolve())
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
