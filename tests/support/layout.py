"""Where the package's sources are in the checkout, read from ``pyproject.toml`` (``[tool.setuptools] packages`` and
``package-dir``): the one list of the top-level folders an install is built from, for the tests and tools that read
the sources (the owner's folders ``trainer/`` and ``hub_cards/`` install as ``llava_normaligned.trainer`` and
``llava_normaligned.hub_cards``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def package_dirs(root: Path = ROOT) -> dict[str, str]:
    """Import name -> the checkout's folder of each package (``llava_normaligned.trainer`` -> ``trainer``), sub-packages
    included."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapped = setuptools.get("package-dir", {})
    folders = {}
    for name in setuptools["packages"]:
        prefix = max((p for p in mapped if name == p or name.startswith(p + ".")), key=len, default=None)
        if prefix is None:
            folders[name] = name.replace(".", "/")
        else:
            folders[name] = "/".join([mapped[prefix], *name[len(prefix) + 1:].split(".")]).strip("/")
    return folders


def source_roots(root: Path = ROOT) -> tuple[str, ...]:
    """The top-level folders the package's sources are in (``llava_normaligned``, ``trainer``, ``hub_cards``,
    ``modeling_llava_normaligned``), each once, in ``pyproject.toml``'s order."""
    return tuple(dict.fromkeys(folder.split("/")[0] for folder in package_dirs(root).values()))


def mapped_roots(root: Path = ROOT) -> dict[str, str]:
    """The folders installed under another import name (``package-dir``): import name -> folder."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    return dict(setuptools.get("package-dir", {}))


def copy_as_installed(target: Path, root: Path = ROOT) -> Path:
    """The package's Python files copied into ``target`` where an install puts them (``trainer/train.py`` ->
    ``llava_normaligned/trainer/train.py``), with ``pyproject.toml`` and ``tests/support``: a tree import-linter can
    read, whose folders are the import names. Returns ``target``."""
    for name, folder in package_dirs(root).items():
        destination = target / name.replace(".", "/")
        destination.mkdir(parents=True, exist_ok=True)
        for source in (root / folder).glob("*.py"):
            shutil.copy2(source, destination / source.name)
    shutil.copytree(root / "tests" / "support", target / "tests" / "support",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"), dirs_exist_ok=True)
    shutil.copy2(root / "pyproject.toml", target / "pyproject.toml")
    return target


__all__ = ["ROOT", "copy_as_installed", "mapped_roots", "package_dirs", "source_roots"]
