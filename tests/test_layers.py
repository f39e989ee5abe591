"""The layers of the package (docs/DEVELOPING.md, Layers), checked with import-linter's contracts in pyproject.toml,
run on the package laid out as installed (``python -m tests.support.layers``: ``trainer/`` and ``hub_cards/`` install
as ``llava_normaligned.trainer`` and ``llava_normaligned.hub_cards``):

- cli > commands (with what they share: ``commands/shared``) > demo > chat > the applications (none imports another) >
  the core > families > compat: the library imports nothing of the commands;
- inside the core, the order the code has: tiny > compose, align > loading > checks, notices, atomic_files, public
  names, timings and the other leaves;
- the model's Hub files import only torch, transformers, safetensors and the standard library (an allow-list:
  ``tests/support/import_contracts.py``), and nothing of the package;
- the model, family knowledge and the core import no training, serving or evaluation stack (compat aside).

Each contract is seen failing on a planted violation, in a copy."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.support.layers import lint_imports
from tests.support.layout import copy_as_installed, mapped_roots, package_dirs, source_roots

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
NAMES = {key: CONTRACTS[index]["name"] for index, key in
         enumerate(("layers", "model", "model_allow_list", "core_order", "stacks"))}


def _lint(tree: Path) -> subprocess.CompletedProcess:
    try:
        return lint_imports(tree)
    except FileNotFoundError as missing:
        pytest.fail(str(missing))


def _report(result: subprocess.CompletedProcess) -> str:
    return " ".join(result.stdout.split())  # import-linter wraps long lines


def test_no_source_file_is_reachable_by_two_paths():
    """The owner's folders are mapped to their import names by pyproject.toml alone: no link in the checkout."""
    links = [str(path.relative_to(ROOT)) for folder in source_roots() for path in (ROOT / folder).rglob("*")
             if path.is_symlink()]
    assert links == []


def test_python_imports_each_mapped_folder_by_its_name():
    """The editable install maps ``llava_normaligned.trainer`` to ``trainer/`` (and so on for each package-dir)."""
    mapped = mapped_roots()
    assert mapped, "pyproject.toml maps no folder to another import name"
    for name, folder in mapped.items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and Path(spec.origin).resolve() == (ROOT / folder / "__init__.py").resolve(), name


def test_every_package_folder_is_listed_for_the_install():
    """A sub-package missing from ``[tool.setuptools] packages`` is not installed: its imports fail in a wheel."""
    listed = set(package_dirs().values())
    found = {str(init.parent.relative_to(ROOT)) for root in source_roots() for init in (ROOT / root).rglob("__init__.py")
             if "__pycache__" not in init.parts}
    assert found - listed == set(), f"add to pyproject.toml's [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but not in the checkout: {sorted(listed - found)}"


def test_the_layers_hold(tree):
    result = _lint(tree)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    counts = re.search(r"Contracts: (\d+) kept, (\d+) broken", _report(result))
    assert counts and counts.groups() == (str(len(CONTRACTS)), "0"), result.stdout[-3000:]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The package's Python files laid out as installed, with pyproject.toml and tests/support."""
    return copy_as_installed(tmp_path_factory.mktemp("installed"))


def test_the_copy_is_what_python_imports(tree):
    """The graph is built from the copy, not from the checkout the editable install points at."""
    code = "import llava_normaligned.trainer as t, llava_normaligned.hub_cards as h; print(t.__file__); print(h.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                         capture_output=True, text=True, check=True, stdin=subprocess.DEVNULL).stdout.split()
    assert all(Path(path).is_relative_to(tree) for path in out), out


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("llava_normaligned/loading.py", "from llava_normaligned.diagnostics import runner", "layers"),  # core -> app
        ("llava_normaligned/hub_cards/card.py", "from llava_normaligned.demo import stats", "layers"),  # app -> demo
        ("llava_normaligned/trainer/sampling.py", "from llava_normaligned.evaluation import scoring", "layers"),  # app -> app
        ("llava_normaligned/families/anatomy.py", "from llava_normaligned import checks", "layers"),  # families -> core
        ("llava_normaligned/commands/shared/errors.py", "from llava_normaligned import cli", "layers"),  # commands -> cli
        ("llava_normaligned/loading.py", "from llava_normaligned.commands.shared import fail", "layers"),  # core -> commands
        ("llava_normaligned/diagnostics/runner.py", "from llava_normaligned.commands.shared.flags import device_option",
         "layers"),  # an application -> what the commands share
        ("llava_normaligned/trainer/train.py", "from llava_normaligned.commands import train", "layers"),  # library -> a command
        ("llava_normaligned/demo/run.py", "from llava_normaligned.commands import demo", "layers"),  # the demo -> its command
        ("modeling_llava_normaligned/configuration_llava_normaligned.py", "import llava_normaligned", "model"),
        ("modeling_llava_normaligned/modeling_llava_normaligned.py", "import scipy", "model_allow_list"),
        ("modeling_llava_normaligned/configuration_normaligned_vlm.py", "import huggingface_hub", "model_allow_list"),
        ("llava_normaligned/atomic_files.py", "from llava_normaligned import loading", "core_order"),  # atomic_files -> loading -> atomic_files
        ("llava_normaligned/checks.py", "from llava_normaligned import compose", "core_order"),
        ("llava_normaligned/families/anatomy.py", "import trl", "stacks"),
        ("llava_normaligned/loading.py", "import datasets", "stacks"),
        ("llava_normaligned/generation.py", "import gradio", "stacks"),
    ],
)
def test_a_planted_violation_breaks_its_contract(tree, tmp_path, module, line, broken):
    broken_tree = tmp_path / "broken"
    shutil.copytree(tree, broken_tree)
    with open(broken_tree / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}  # an import against the layers\n")
    result = _lint(broken_tree)
    assert result.returncode != 0, result.stdout[-3000:]
    report = _report(result)
    assert f"{NAMES[broken]} BROKEN" in report, report[-3000:]
    assert module.removesuffix(".py").replace("/", ".") in report  # it names the module that broke it
