"""What the docs, the README and the model's docstrings point a reader to is there: every file of the repository they
name, and every ``llava_normaligned.X.Y`` name they give (a module, or a name in one). A renamed script or function
fails here, not in a reader's shell."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests.support.layout import source_roots

ROOT = Path(__file__).resolve().parent.parent
TEXTS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "modeling_llava_normaligned").glob("*.py"),
                *(ROOT / "hub_cards" / "templates").glob("*.md")])
FOLDERS = ("tests", "benchmarks", "docs", ".ci", *source_roots())
PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w/.-]+\.(?:py|sh|md|yaml|json|txt))" % "|".join(re.escape(f) for f in FOLDERS))
DOTTED = re.compile(r"(?<![\w.])((?:llava_normaligned|modeling_llava_normaligned)(?:\.[A-Za-z_]\w*)+)")


def _paths(text: str) -> set[str]:
    return {match for match in PATH.findall(text) if "*" not in match and "<" not in match}


def _dotted(text: str) -> set[str]:
    return {name for name in DOTTED.findall(text) if not name.endswith((".py", ".md", ".json"))}


def resolves(name: str) -> bool:
    """``a.b.c``: a module, or a name in the longest module prefix (attributes followed from there)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_files_a_text_names_are_there(path):
    missing = sorted(name for name in _paths(path.read_text()) if not (ROOT / name).exists())
    assert not missing, f"{path.relative_to(ROOT)} names files that are not in the repository: {missing}"


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_python_names_a_text_gives_resolve(path):
    wrong = sorted(name for name in _dotted(path.read_text()) if not resolves(name))
    assert not wrong, f"{path.relative_to(ROOT)} gives names that do not resolve: {wrong}"


def test_the_checks_catch_the_stale_references_they_replaced():
    assert _paths("single-process ZeRO-2 run that `tests/test_gpu_paper_scale.py` now makes too") == {
        "tests/test_gpu_paper_scale.py"}
    assert not (ROOT / "tests/test_gpu_paper_scale.py").exists()
    assert _dotted("`llava_normaligned.load_model` (every command) refuses it") == {"llava_normaligned.load_model"}
    assert not resolves("llava_normaligned.load_model") and resolves("llava_normaligned.loading.load_model")
