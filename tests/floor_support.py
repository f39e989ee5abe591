"""What the dependency-floor tests share: read a floor from pyproject.toml, install exactly that release alone
(``pip install --no-deps --target``), and run a check script in a fresh process with it first on the path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def floor_of(package: str) -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as handle:
        match = re.search(rf'"{re.escape(package)}>=([0-9][0-9.]*)', handle.read())
    assert match, f"pyproject.toml states no {package} floor"
    return match.group(1)


def _pip(*args: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def run_with_release(package: str, version: str, check: str, tmp_path) -> dict:
    """Install ``package==version`` alone under ``tmp_path``, run ``tests/<check>`` with it first on the path, and
    return the check's JSON report (its last line). Skips only when the package registry cannot be reached."""
    try:
        listed = _pip("index", "versions", package, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the package registry did not answer (pip index versions {package})")
    if listed.returncode != 0:
        pytest.skip(f"the package registry cannot be reached: {listed.stderr.strip().splitlines()[-1:]}")
    released = re.search(r"Available versions:\s*(.*)", listed.stdout)
    assert released and Version(version) in {Version(v.strip()) for v in released.group(1).split(",")}, \
        f"{package} {version} is not a released version"
    target = tmp_path / f"{package}-floor"
    installed = _pip("install", "-q", "--no-deps", "--target", str(target), f"{package}=={version}", timeout=300)
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, os.path.join(ROOT, "tests", check), str(tmp_path / "work")],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert Version(report[package]) == Version(version) and report[f"{package}_file"].startswith(str(target))
    return report
