"""The tests' reaches into this package's private names (``_name``), found by reading the test sources (``ast``),
the Python that tests run in a subprocess (a string holding an import of the package) included: an imported
``_name``, or ``module._name`` / ``Class._name`` on something imported from the package. A test checks behaviour
through what the package offers; what it needs is made public, with a name and a docstring.

    python -m tests.support.own_private_names      # prints one line per reach; exit 1 if any
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path

from tests.support.layout import ROOT

OWN = ("llava_normaligned", "modeling_llava_normaligned")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _trees(source: str) -> list[ast.AST]:
    """The file and the Python in its strings that import the package (scripts a test runs in a subprocess)."""
    tree = ast.parse(source)
    trees = [tree]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value \
                and any(name in node.value for name in OWN):
            try:
                trees.append(ast.parse(textwrap.dedent(node.value)))
            except SyntaxError:
                pass  # a string that is not Python
    return trees


def reaches_in(source: str) -> list[tuple[int, str]]:
    """(line, what) of each reach in one test file's ``source``."""
    found = []
    for tree in _trees(source):
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in OWN:
                for alias in node.names:
                    if _private(alias.name):
                        found.append((node.lineno, f"from {node.module} import {alias.name}"))
                    imported.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                imported |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in OWN}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name) \
                    and node.value.id in imported:
                found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(set(found))


def reaches(root: Path = ROOT) -> list[str]:
    """``path:line: what`` for every reach in the tests under ``root``."""
    lines = []
    for path in sorted((root / "tests").rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        lines += [f"{path.relative_to(root)}:{line}: {what}" for line, what in reaches_in(path.read_text("utf-8"))]
    return lines


if __name__ == "__main__":
    found = reaches(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print("\n".join(found) or "no test reaches a private name of the package")
    sys.exit(1 if found else 0)
