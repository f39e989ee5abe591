"""The layers of the package (docs/DEVELOPING.md, Layers), checked with import-linter's contracts in pyproject.toml:
cli > demo > the applications (trainer, diagnostics, evaluation, serving, hub_cards; none imports another) > the core >
families, and the model (``modeling_llava_normaligned``) imports nothing of the package.

``trainer/`` and ``hub_cards/`` are mapped into the ``llava_normaligned`` namespace by pyproject.toml's package-dir, which
import-linter's graph builder does not follow (it walks the root package's folder). So the check runs on a copy of the
sources laid out as they are installed: ``llava_normaligned/`` with ``trainer/`` and ``hub_cards/`` inside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports", path=os.path.dirname(sys.executable))


def _installed_layout(target: Path) -> Path:
    """The package's Python sources under ``target`` as an install lays them out; returns ``target``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = config.get("package-dir", {})
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "assets")
    for package in config["packages"]:
        source = ROOT / mapped.get(package, package.replace(".", "/"))
        destination = target / package.replace(".", "/")
        if destination.exists():  # a sub-package of one already copied (diagnostics/ inside llava_normaligned/)
            continue
        shutil.copytree(source, destination, ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    return target


def _lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([LINT, str(tree / "pyproject.toml"), "--no-cache"], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    if LINT is None:
        pytest.fail("lint-imports is not installed: `pip install -e .[dev]` installs import-linter")
    return _installed_layout(tmp_path_factory.mktemp("layout"))


def test_the_copy_is_what_python_imports(tree):
    """The graph is built from the copy, not from the checkout the editable install points at."""
    code = "import llava_normaligned.trainer as t, llava_normaligned.hub_cards as h; print(t.__file__); print(h.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                         capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL).stdout.split()
    assert all(Path(path).is_relative_to(tree) for path in out), out


def test_the_layers_hold(tree):
    result = _lint(tree)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("llava_normaligned/loading.py", "from llava_normaligned.diagnostics import runner", "layers"),  # core -> app
        ("llava_normaligned/hub_cards/card.py", "from llava_normaligned.demo import stats", "layers"),  # app -> demo
        ("llava_normaligned/trainer/sampling.py", "from llava_normaligned.evaluation import scoring", "layers"),  # app -> app
        ("llava_normaligned/families/anatomy.py", "from llava_normaligned import console", "layers"),  # families -> core
        ("llava_normaligned/console.py", "from llava_normaligned import cli", "layers"),  # library -> the console entry
        ("modeling_llava_normaligned/configuration_llava_normaligned.py", "import trl", "model"),  # the Hub files
    ],
)
def test_an_import_that_runs_back_up_breaks_a_contract(tree, tmp_path, module, line, broken):
    broken_tree = tmp_path / "broken"
    shutil.copytree(tree, broken_tree)
    with open(broken_tree / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}  # an import against the layers\n")
    result = _lint(broken_tree)
    assert result.returncode != 0, result.stdout[-3000:]
    report = " ".join(result.stdout.split())  # import-linter wraps long lines
    contracts = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    names = {"layers": contracts[0]["name"], "model": contracts[1]["name"]}
    assert f"{names[broken]} BROKEN" in report, report[-3000:]
    assert "Contracts: 1 kept, 1 broken" in report
    assert module.removesuffix(".py").replace("/", ".") in report  # it names the module that broke it
