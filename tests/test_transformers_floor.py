"""The transformers floor in pyproject.toml works: that exact release, installed alone (``pip install --no-deps
--target``) and put first on the path of a fresh process over this environment, composes a tiny model, trains a
stage 2 through TRL's SFTTrainer with a processor and through ``train_stage`` (whose collator asks the processor for
``return_text_replacement_offsets``), and loads the saved stage back with ``load_model`` and generates
(tests/transformers_floor_check.py). Needs the package registry; skipped only when it cannot be reached.

Why this floor (the check script, run by hand with each release put first on the path; releases before 5.18 require
huggingface-hub<2, so they were run with their own dependencies installed beside them): 5.0.0 and 5.3.0 have no
``return_text_replacement_offsets`` (nor ``image_processing_backends``), which the collator needs; 5.10.4, 5.13.1,
5.15.1 and 5.17.0 stop in ``compose``: "AutoImageProcessor requires the Torchvision library" (the PIL image
processor is not yet the default without torchvision); 5.18.0 passes, as does 5.24.0 (the tested stack)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def transformers_floor() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        match = re.search(r'"transformers>=([0-9][0-9.]*)', handle.read())
    assert match, "pyproject.toml states no transformers floor"
    return match.group(1)


def _pip(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow  # a pip install, then a fresh process: trains twice, saves, loads, generates (112 s, loaded)
def test_the_transformers_floor_trains_loads_and_generates(tmp_path):
    floor = transformers_floor()
    try:
        listed = _pip("index", "versions", "transformers", timeout=90)
    except subprocess.TimeoutExpired:
        pytest.skip("the package registry did not answer (pip index versions transformers)")
    if listed.returncode != 0:
        pytest.skip(f"the package registry cannot be reached: {listed.stderr.strip().splitlines()[-1:]}")
    released = re.search(r"Available versions:\s*(.*)", listed.stdout)
    assert released and Version(floor) in {Version(v.strip()) for v in released.group(1).split(",")}, \
        f"transformers {floor} is not a released version"

    target = tmp_path / "transformers-floor"
    installed = _pip("install", "-q", "--no-deps", "--target", str(target), f"transformers=={floor}", timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "transformers_floor_check.py"),
                          str(tmp_path / "work")], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert Version(report["transformers"]) == Version(floor)
    assert report["transformers_file"].startswith(str(target))
    assert len(report["stock_losses"]) == 2 and len(report["train_stage_losses"]) == 2
    assert report["collator_labelled"] > 0 and report["loaded"] == "LlavaNormAlignedForConditionalGeneration"
