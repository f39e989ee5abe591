"""Reaches into another library's private names, and ``__class__`` swaps, found by reading the sources (``ast``).

compat.py is the one module allowed them: each of its hooks names the library versions it was checked with
(``llava_normaligned.compat``), so a release that moves the private name fails one known place. Anywhere else such a
reach breaks silently. The model's Hub files, which run without the package, keep theirs in one file of their own,
``modeling_llava_normaligned/transformers_hooks.py``. What counts as a reach, outside these two:

- ``obj._name`` (load or store), ``getattr/setattr/hasattr/delattr(obj, "_name")``, where ``_name`` is not a dunder and
  is defined nowhere in the package's own sources (a method, attribute, function, class, variable or parameter of
  ours is ours to touch), or is a library method the model overrides (``_init_weights``) reached other than through
  ``self`` or ``super()``;
- ``from library import _name`` or ``import library._module`` of a module outside the package;
- an assignment to ``something.__class__``.

Python's own names with a leading underscore that are documented public API (``os._exit``, a named tuple's
``_asdict``/``_replace``/``_fields``/``_make``) are not reaches.

    python -m tests.support.private_reaches [ROOT]      # prints one line per reach; exit 1 if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.support.layout import ROOT, source_roots

SOURCES = source_roots()
OWN_PACKAGES = ("llava_normaligned", "modeling_llava_normaligned")
# the package's hooks, and the model's own (its Hub files cannot import the package)
COMPAT = ("llava_normaligned/compat.py", "modeling_llava_normaligned/transformers_hooks.py")
DOCUMENTED = {"_exit", "_asdict", "_replace", "_fields", "_make", "_field_defaults"}
# Library methods the model overrides (transformers' protocol): defined in our sources, but called on a model from
# outside it (not through ``self`` or ``super()``) they are still the library's private API
OVERRIDDEN = {"_init_weights"}


def source_files(root: Path = ROOT) -> list[Path]:
    """The package's Python files, from the source folders pyproject.toml lists."""
    files = []
    for folder in SOURCES:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root)
            if "__pycache__" in relative.parts:
                continue
            files.append(path)
    return files


def own_names(trees: list[ast.AST]) -> set[str]:
    """Every name the package's own sources define."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def _private(name: str, own: set[str]) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in own and name not in DOCUMENTED


def _through_self(value: ast.expr) -> bool:
    return (isinstance(value, ast.Name) and value.id in ("self", "cls")) or \
        (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super")


def _overrides(tree: ast.AST) -> set[int]:
    """ids of the ``X.name`` nodes inside a method ``name``: an override calling the class it overrides."""
    ids = set()
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            ids |= {id(node) for node in ast.walk(function) if isinstance(node, ast.Attribute)
                    and node.attr == function.name}
    return ids


def _reaches_in(tree: ast.AST, own: set[str]) -> list[tuple[int, str]]:
    found = []
    overrides = _overrides(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if node.attr == "__class__" and isinstance(node.ctx, ast.Store):
                found.append((node.lineno, "assigns __class__"))
            elif _private(node.attr, own) or (node.attr in OVERRIDDEN and not _through_self(node.value)
                                                   and id(node) not in overrides):
                found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and _private(node.args[1].value, own):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and not node.module.startswith(OWN_PACKAGES):
            if any(_private(part, set()) for part in node.module.split(".")):
                found.append((node.lineno, f"from {node.module} import ..."))
            found += [(node.lineno, f"from {node.module} import {alias.name}") for alias in node.names
                      if _private(alias.name, set())]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {alias.name}") for alias in node.names
                      if not alias.name.startswith(OWN_PACKAGES)
                      and any(_private(part, set()) for part in alias.name.split("."))]
    return found


def private_reaches(root: Path = ROOT) -> list[str]:
    """``path:line: what`` for each reach outside compat.py."""
    files = source_files(root)
    trees = {path: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for path in files}
    own = own_names(list(trees.values()))
    lines = []
    for path, tree in trees.items():
        relative = path.relative_to(root).as_posix()
        if relative in COMPAT:
            continue
        lines += [f"{relative}:{line}: {what}" for line, what in sorted(_reaches_in(tree, own))]
    return lines


if __name__ == "__main__":
    reaches = private_reaches(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
    print("\n".join(reaches) if reaches else "no reach into another library's private names outside compat.py")
    sys.exit(1 if reaches else 0)
