"""`benchmarks/gpu_demo.sh`: the demo's GPU version. Here (no GPU) its flags reach the demo's parser, its GPU path
stops in one line, and the demo's `--device cuda` is refused in one line without a GPU; its `--cpu-tiny` path is the
quick real-LLM demo that tests/test_demo_real_llm.py runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "gpu_demo.sh")


# a stand-in interpreter: the script's two checks (SmolLM2 installed, a CUDA GPU seen) answered yes; the demo's
# command line written to $RECORD, and the two result files the script copies written where the demo would
STAND_IN = """#!/usr/bin/env bash
[[ "$1" == "-m" ]] || exit 0
printf "%s\\n" "$@" > "$RECORD"
while [[ $# -gt 0 ]]; do
  if [[ "$1" == "--output-dir" ]]; then mkdir -p "$2" && echo "{}" > "$2/results.json" && echo "#" > "$2/results.md"; fi
  shift
done
"""


def _run(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHON": sys.executable})


def test_help_and_bad_arguments():
    done = _run("--help")
    assert done.returncode == 0 and "--cpu-tiny" in done.stdout and "--seeds N" in done.stdout
    bad = _run("--bogus")
    assert bad.returncode == 2 and "unknown argument --bogus" in bad.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_stops_in_one_line(tmp_path):
    from llava_normaligned.commands.demo import config_from_args, make_parser
    from llava_normaligned.demo.run import REAL_LLM_ROWS
    from llava_normaligned.demo.synthetic import TEMPLATES

    done = _run("--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    parser = make_parser()
    # the flags the script gives the demo, recorded by a stand-in interpreter that answers the script's two checks
    # (SmolLM2 installed, a CUDA GPU seen) with yes and writes down the demo's command line instead of running it
    record, stand_in = tmp_path / "argv.txt", tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    kept = os.path.relpath(tmp_path / "kept", os.path.join(os.path.dirname(SCRIPT), "results"))  # not in the repo
    done = subprocess.run(["bash", SCRIPT, "--output-dir", str(tmp_path / "gpu_out"), "--results", kept],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHON": str(stand_in), "RECORD": str(record)})
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(tmp_path / "kept")) == ["gpu.txt", "results.json", "results.md", "wall_seconds.txt"]
    recorded = record.read_text().splitlines()
    assert recorded[:3] == ["-m", "llava_normaligned.cli", "demo"], recorded
    given = recorded[3:]
    assert given[given.index("--device") + 1] == "cuda"
    at = given.index("--device")
    args = given[:at] + given[at + 2:]  # no GPU here: the config is read as the script gives it, on the CPU
    assert args[:2] == ["--output-dir", str(tmp_path / "gpu_out")] and "smollm2-135m-offline" in args
    config = config_from_args(parser.parse_args(args))
    assert (config.num_seeds, config.stage1_steps, config.stage2_steps) == (8, 320, 640)
    assert config.data.test_per_template == 256 and config.device is None and config.norm_gap == 40.0
    # the paper's four rows and the stock row, one pass over the 5,120 captions in stage 1
    assert config.row_keys == REAL_LLM_ROWS and config.data.train_per_template * len(TEMPLATES) == 16 * 320
    with pytest.raises(ValueError, match="--device cuda: torch sees no CUDA GPU"):
        config_from_args(parser.parse_args(given))
