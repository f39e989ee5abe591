"""The tested set (constraints.txt) against what the package says it supports (pyproject.toml) and what its hooks into
other libraries were checked with (llava_normaligned/compat.py): a pin outside either fails here, so the tested set
and the hooks' ranges move forward together (`.ci/newest --update`, docs/DEVELOPING.md, Dependencies). The README's
two commands and CI install the tested set."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
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


NEWEST_SHIM = """#!/usr/bin/env bash
# what the script asked for, one line a call; pytest ends with $PYTEST_STATUS
echo "$(basename "$0") $*" >> "$SHIM_LOG"
case "$(basename "$0") $*" in
  "python3 -m venv .venv-newest") mkdir -p .venv-newest/bin && echo 'PATH="'"$SHIM_DIR"':$PATH"' > .venv-newest/bin/activate ;;
  "python -c "*) echo "torch==2.13.0" ;;
  "python -m pytest"*) exit "${PYTEST_STATUS:-0}" ;;
esac
"""


def _run_newest(tmp_path, status: int, *args: str) -> tuple[int, list[str]]:
    """``.ci/newest`` in a copy of the checkout's root, with ``python3``, ``python`` and ``pip`` that only record
    what they were asked (the suite ending with ``status``): the script's decisions, not pip's work."""
    root, shims = tmp_path / "root", tmp_path / "shims"
    (root / ".ci").mkdir(parents=True)
    (root / ".ci" / "newest").write_text((ROOT / ".ci" / "newest").read_text())
    shims.mkdir()
    for name in ("python3", "python", "pip"):
        (shims / name).write_text(NEWEST_SHIM)
        (shims / name).chmod(0o755)
    log = tmp_path / "log"
    env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "SHIM_LOG": str(log),
           "SHIM_DIR": str(shims), "PYTEST_STATUS": str(status)}
    done = subprocess.run(["bash", str(root / ".ci" / "newest"), *args], env=env, capture_output=True, text=True)
    return done.returncode, log.read_text().splitlines()


@pytest.mark.parametrize(("status", "update", "writes"), [(0, True, True), (1, True, False), (0, False, False)])
def test_the_newest_script_diffs_then_tests_then_updates_only_on_success(tmp_path, status, update, writes):
    code, calls = _run_newest(tmp_path, status, *(["--update"] if update else []), "-m", "not slow")
    assert code == status
    steps = [next(i for i, c in enumerate(calls) if c.startswith(prefix)) for prefix in (
        "pip install --quiet --upgrade --upgrade-strategy eager", "python .ci/versions.py diff",
        "python -m pytest -q -m not slow")]
    assert steps == sorted(steps), calls
    # the eager upgrade keeps the torch installed first (it would otherwise take the newest, a CUDA build)
    eager = next(c for c in calls if "--upgrade-strategy eager" in c)
    assert eager.split()[-2:][0] == "-c" and calls.index(eager) > calls.index("pip install --quiet torch==2.13.0")
    assert (["python", ".ci/versions.py", "write", "constraints.txt"] in [c.split() for c in calls]) is writes, calls


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
