"""The trl floor in pyproject.toml works: that exact release, installed alone (``pip install --no-deps --target``)
and put first on the path of a fresh process over this environment, trains a tiny stage 2 with TRL's
``assistant_only_loss=True`` and a processor, and through ``train_stage``. Needs the package registry; skipped only
when it cannot be reached.

Why this floor (the check script, run by hand with each release put first on the path): trl 1.14.2 raises
"Assistant-only loss is not yet supported for vision datasets"; trl 1.15.0 accepts it but its fused LM-head loss
needs Triton (``_ChunkedLogProbFunction`` is ``None`` without it: "'NoneType' object has no attribute 'apply'"), so
it trains on no CPU-only machine; trl 1.16.0 trains."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def trl_floor() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        match = re.search(r'"trl>=([0-9][0-9.]*)', handle.read())
    assert match, "pyproject.toml states no trl floor"
    return match.group(1)


def _pip(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow  # a pip install and a fresh process: 99 s on a loaded 2-core machine
def test_the_trl_floor_trains_stage2_with_assistant_only_loss(tmp_path):
    floor = trl_floor()
    try:
        listed = _pip("index", "versions", "trl", timeout=90)
    except subprocess.TimeoutExpired:
        pytest.skip("the package registry did not answer (pip index versions trl)")
    if listed.returncode != 0:
        pytest.skip(f"the package registry cannot be reached: {listed.stderr.strip().splitlines()[-1:]}")
    released = re.search(r"Available versions:\s*(.*)", listed.stdout)
    assert released and Version(floor) in {Version(v.strip()) for v in released.group(1).split(",")}, \
        f"trl {floor} is not a released version"

    target = tmp_path / "trl-floor"
    installed = _pip("install", "-q", "--no-deps", "--target", str(target), f"trl=={floor}", timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "trl_floor_check.py"), str(tmp_path / "work")],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert Version(report["trl"]) == Version(floor) and report["trl_file"].startswith(str(target))
    assert len(report["stock_losses"]) == 2 and len(report["train_stage_losses"]) == 2
