"""transformers' own common model tests (``ModelTesterMixin``, ``ConfigTester``), from the sdist of the installed
transformers, fetched once with pip and kept in a cache folder.

The sdist of a transformers release ships ``tests/test_modeling_common.py`` and the other ``test_*_common.py`` files,
but not the modules they import from ``tests/generation/``, ``tests/exporters/`` and ``tests/utils/``. This module
puts the shipped files in an importable package (``transformers_common_tests``) and answers those three imports with
this project's stand-ins (``stand_in_modules``):

* ``generation.test_utils.GenerationTesterMixin``: ``tests/common_generation.py``, this project's own tests of every
  generation mode transformers runs in the library (greedy, sampling, beam search, beam sampling, assisted and
  prompt-lookup decoding), since transformers' own generation tests are not in the sdist;
* ``exporters.test_export.ExportTesterMixin``: an empty mixin (the export tests are not in the sdist; no test here
  replaces them);
* ``utils.test_configuration_utils.config_common_kwargs``: an empty dict, read by ``ConfigTester`` only for configs
  without sub-configs (LLaVA's has two, so the check it feeds returns before reading it).

Cache: ``$LLAVA_NA_TEST_CACHE`` if set, else ``$XDG_CACHE_HOME/llava-normaligned`` (``~/.cache/llava-normaligned``);
one folder per transformers version. Nothing else is downloaded. When the sdist cannot be fetched,
``common_tests_dir`` raises ``CommonTestsUnavailable`` naming the version, the command and pip's answer.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

PACKAGE = "transformers_common_tests"
# The files of the sdist's tests/ folder that the common model tests import (copied; the rest is left out).
SHIPPED_FILES = ("test_modeling_common.py", "test_configuration_common.py")


class CommonTestsUnavailable(RuntimeError):
    """transformers' common test files could not be fetched or read."""


def transformers_version() -> str:
    import transformers

    return transformers.__version__


def cache_root() -> Path:
    if os.environ.get("LLAVA_NA_TEST_CACHE"):
        return Path(os.environ["LLAVA_NA_TEST_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "llava-normaligned"


def _pip_download(version: str, into: Path, isolated: bool) -> tuple[list[str], subprocess.CompletedProcess]:
    command = [sys.executable, "-m", "pip", "download", f"transformers=={version}", "--no-deps", "--no-binary",
               ":all:", "--disable-pip-version-check", "--no-input", "-q", "-d", str(into)]
    if not isolated:  # pip reads the sdist's metadata with the setuptools installed here: seconds, not a minute
        command.insert(-2, "--no-build-isolation")
    try:
        return command, subprocess.run(command, capture_output=True, text=True, timeout=600,
                                       stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CommonTestsUnavailable(
            f"fetching the transformers {version} sdist (for its common model tests) took over 600 s: "
            f"{' '.join(command[2:])}"
        ) from None


def _fetch_sdist(version: str, into: Path) -> Path:
    """``pip download`` the sdist of transformers ``version`` into ``into``; the path of the archive."""
    command, result = _pip_download(version, into, isolated=importlib.util.find_spec("setuptools") is None)
    if result.returncode != 0 and "--no-build-isolation" in command:
        command, result = _pip_download(version, into, isolated=True)
    archives = sorted(into.glob("transformers-*.tar.gz"))
    if result.returncode != 0 or not archives:
        answer = (result.stderr or result.stdout).strip().splitlines()
        raise CommonTestsUnavailable(
            f"could not fetch the transformers {version} sdist, which holds transformers' common model tests: "
            f"`{' '.join(command[2:])}` answered: {answer[-1] if answer else f'exit {result.returncode}'}. "
            "The package registry must be reachable once; the files are then cached in "
            f"{cache_root()} (set LLAVA_NA_TEST_CACHE to use another folder)."
        )
    return archives[0]


def _extract(archive: Path, version: str, package_dir: Path) -> None:
    prefix = f"transformers-{version}/tests/"
    with tarfile.open(archive) as tar:
        members = {m.name[len(prefix):]: m for m in tar.getmembers() if m.name.startswith(prefix)}
        missing = [name for name in SHIPPED_FILES if name not in members]
        if missing:
            raise CommonTestsUnavailable(
                f"the transformers {version} sdist ({archive.name}) has no tests/{', tests/'.join(missing)}: "
                "its common model tests cannot be run against this version"
            )
        package_dir.mkdir(parents=True)
        for name in SHIPPED_FILES:
            (package_dir / name).write_bytes(tar.extractfile(members[name]).read())
        if f"transformers-{version}/LICENSE" in tar.getnames():  # the files' licence travels with them
            (package_dir / "LICENSE").write_bytes(tar.extractfile(f"transformers-{version}/LICENSE").read())
    (package_dir / "__init__.py").write_text(f'"""transformers {version}: tests/ files from its sdist."""\n')


def common_tests_dir(version: str | None = None) -> Path:
    """The folder holding the ``transformers_common_tests`` package for ``version`` (default: the installed one),
    fetched and extracted on first use. Safe when several processes ask at once (the folder appears atomically)."""
    version = version or transformers_version()
    root = cache_root() / f"transformers-{version}"
    if (root / PACKAGE / "__init__.py").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".fetch-{version}-") as work:
        work = Path(work)
        archive = _fetch_sdist(version, work / "download")
        staged = work / "staged"
        _extract(archive, version, staged / PACKAGE)
        try:
            os.rename(staged, root)
        except OSError:  # another process got there first
            if not (root / PACKAGE / "__init__.py").is_file():
                shutil.rmtree(root, ignore_errors=True)
                os.rename(staged, root)
    return root


def _module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so that relative imports below it resolve
    module.__dict__.update(attributes)
    return module


def stand_in_modules(generation_mixin: type) -> dict[str, types.ModuleType]:
    """The modules ``test_modeling_common.py`` and ``test_configuration_common.py`` import that the sdist lacks."""

    class ExportTesterMixin:
        """transformers' export tests are not in the sdist: none are run."""

    return {
        f"{PACKAGE}.generation": _module(f"{PACKAGE}.generation"),
        f"{PACKAGE}.generation.test_utils": _module(
            f"{PACKAGE}.generation.test_utils", GenerationTesterMixin=generation_mixin
        ),
        f"{PACKAGE}.exporters": _module(f"{PACKAGE}.exporters"),
        f"{PACKAGE}.exporters.test_export": _module(
            f"{PACKAGE}.exporters.test_export", ExportTesterMixin=ExportTesterMixin
        ),
        f"{PACKAGE}.utils": _module(f"{PACKAGE}.utils"),
        f"{PACKAGE}.utils.test_configuration_utils": _module(
            f"{PACKAGE}.utils.test_configuration_utils", config_common_kwargs={}
        ),
    }


def import_common_tests(generation_mixin: type) -> tuple[types.ModuleType, types.ModuleType]:
    """(test_modeling_common, test_configuration_common) of the installed transformers, with the stand-ins."""
    root = str(common_tests_dir())
    if root not in sys.path:
        sys.path.insert(0, root)
    for name, module in stand_in_modules(generation_mixin).items():
        sys.modules.setdefault(name, module)
    modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    return modeling, configuration
