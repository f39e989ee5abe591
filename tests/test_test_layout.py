"""What tests share lives in ``tests/support/`` (a package, no tests in it): no test module imports from another
test module, so each can be read, run and moved on its own."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imports_of_test_modules(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
        found += [f"{path.name}:{node.lineno}: {name}" for name in names
                  if name.split(".")[-1].startswith("test_") or name.startswith("test_")]
    return found


def test_no_test_module_imports_another():
    found = [line for path in sorted(TESTS.glob("test_*.py")) for line in _imports_of_test_modules(path)]
    assert not found, "\n".join(found)


def test_the_support_package_holds_no_tests():
    support = TESTS / "support"
    assert (support / "__init__.py").exists()
    assert not list(support.glob("test_*.py"))
    for path in support.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert not [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")], path


def test_the_check_finds_a_planted_import(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text("from test_train_stages import helper\nimport tests.support.training\n")
    assert _imports_of_test_modules(planted) == ["test_planted.py:1: test_train_stages"]
