"""Where the package's sources are in the checkout, read from ``pyproject.toml`` (``[tool.setuptools] packages`` and
``package-dir``): the one list of the top-level folders an install is built from, for the tests and tools that read
the sources (the owner's folders ``trainer/`` and ``hub_cards/`` install as ``llava_normaligned.trainer`` and
``llava_normaligned.hub_cards``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

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


def linked_roots(root: Path = ROOT) -> dict[str, str]:
    """The folders mapped to another import name (``package-dir``): import name -> folder."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    return dict(setuptools.get("package-dir", {}))


__all__ = ["ROOT", "linked_roots", "package_dirs", "source_roots"]
