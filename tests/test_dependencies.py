"""The tested set (constraints.txt) against what the package says it supports (pyproject.toml) and what its hooks into
other libraries were checked with (llava_normaligned/compat.py): a pin outside either fails here, so the tested set
and the hooks' ranges move forward together (`.ci/newest --update`, docs/DEVELOPING.md, Dependencies). The README's
two commands and CI install the tested set."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from llava_normaligned import compat

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"


def _versions_module():
    spec = importlib.util.spec_from_file_location("ci_versions", ROOT / ".ci" / "versions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


versions = _versions_module()
PINS = versions.read_constraints(CONSTRAINTS)


def _pyproject_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in versions.EXTRAS:
        texts += project["optional-dependencies"][extra]
    return [Requirement(text) for text in texts]


def test_the_tested_set_pins_every_requirement_within_pyproject_s_range():
    for requirement in _pyproject_requirements():
        name = canonicalize_name(requirement.name)
        if name in versions.NOT_PINNED:
            continue
        assert name in PINS, f"constraints.txt does not pin {name}, which pyproject.toml requires"
        assert Version(PINS[name]) in requirement.specifier, (
            f"constraints.txt pins {name}=={PINS[name]}, outside pyproject.toml's {requirement}")


def test_torch_is_installed_by_the_readme_not_pinned_here():
    assert "torch" not in PINS and not any(name.startswith("nvidia-") for name in PINS)


@pytest.mark.parametrize("name", sorted(compat.HOOKS))
def test_the_tested_set_is_inside_every_hook_s_checked_range(name):
    hook = compat.HOOKS[name]
    pinned = PINS.get(canonicalize_name(hook.library))
    if pinned is None:
        pytest.skip(f"{hook.library} is not in the tested set (python, torch and vllm are installed otherwise)")
    assert compat.in_checked_range(name, pinned), (
        f"constraints.txt pins {hook.library}=={pinned}, outside {name}'s checked range {hook.checked}: run "
        f"tests/test_compat.py::{hook.pin_test} with it and widen `checked` in llava_normaligned/compat.py")


def test_the_readme_and_ci_install_the_tested_set():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    for block in blocks[:2]:
        assert 'pip install -e ".[' in block and "-c constraints.txt" in block, block
    assert "-c constraints.txt" in (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/newest" in readme  # the way to try the newest releases, documented


def test_the_newest_script_diffs_then_tests_then_updates_only_on_success():
    script = (ROOT / ".ci" / "newest").read_text()
    order = [script.index(step) for step in (
        "--upgrade --upgrade-strategy eager", "versions.py diff", "python -m pytest -q \"$@\"", "versions.py write")]
    assert order == sorted(order)
    assert re.search(r'if \[ "\$status" -eq 0 \] && \[ "\$update" -eq 1 \]', script)
    # the eager upgrade keeps the torch installed first (it would otherwise take the newest, a CUDA build)
    assert re.search(r'--upgrade-strategy eager -e "\.\[dev\]" -c "\$keep_torch"', script)


def test_differences_name_each_changed_added_and_removed_version(tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text("# a comment\ntransformers==5.25.0\nkernels==0.19.1  # why\nold-thing==1.0\n")
    tested = versions.read_constraints(path)
    assert tested == {"transformers": "5.25.0", "kernels": "0.19.1", "old-thing": "1.0"}
    installed = {"transformers": "5.26.0", "kernels": "0.19.1", "new-thing": "2.0"}
    assert versions.differences(tested, installed) == [
        "new-thing: tested -, installed 2.0",
        "old-thing: tested 1.0, installed -",
        "transformers: tested 5.25.0, installed 5.26.0",
    ]
    assert versions.differences(tested, dict(tested)) == []


def test_the_closure_holds_what_the_dev_install_brings():
    closure = versions.installed_closure()
    for name in ("transformers", "trl", "accelerate", "datasets", "peft", "pytest", "huggingface-hub"):
        assert name in closure, name
    assert "torch" not in closure and versions.PACKAGE not in closure
    for name, pinned in PINS.items():  # every pin is something the install brings (no stale line)
        assert name in closure, f"constraints.txt pins {name}, which the dev install no longer brings"
