"""The layout's numbers, for a tree (default: this checkout): lines per layer, functions over 60 and 80 lines,
reaches into other libraries' private names outside compat.py (tests/support/private_reaches.py), the modules that
hold a command's entry point (a ``main`` beside a parser), and the places below the commands that print, exit or
parse a command line (tests/support/library_output.py).

    python .ci/layout_metrics.py [ROOT] [--json]
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

from tests.support.library_output import library_output_sites  # noqa: E402
from tests.support.private_reaches import private_reaches, source_files  # noqa: E402

LAYERS = [  # (layer, path prefixes relative to the root), first match wins
    ("cli", ("llava_normaligned/cli.py",)),
    ("commands", ("llava_normaligned/commands/",)),
    ("demo", ("llava_normaligned/demo/",)),
    ("chat", ("llava_normaligned/chat/",)),
    ("applications", ("trainer/", "hub_cards/", "llava_normaligned/diagnostics/", "llava_normaligned/evaluation/",
                      "llava_normaligned/serving/")),
    ("flags", ("llava_normaligned/flags.py",)),
    ("families", ("llava_normaligned/families/",)),
    ("compat", ("llava_normaligned/compat.py",)),
    ("model", ("modeling_llava_normaligned/",)),
    ("core", ("llava_normaligned/",)),
]


def layer_of(relative: str) -> str:
    return next(name for name, prefixes in LAYERS if relative.startswith(prefixes))


def long_functions(root: Path, files: list[Path]) -> list[tuple[int, str]]:
    found = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                        and isinstance(first.value.value, str):  # the docstring (item 5 asks for Args/Returns)
                    length -= first.end_lineno - first.lineno + 1
                if length > 60:
                    found.append((length, f"{path.relative_to(root).as_posix()}:{node.name}"))
    return sorted(found, reverse=True)


def command_entry_modules(root: Path, files: list[Path]) -> list[str]:
    """The modules that define a command's entry point: a ``main`` beside a parser function."""
    entries = []
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        if any(name.endswith("main") for name in names) and any("parser" in name for name in names):
            entries.append(path.relative_to(root).as_posix())
    return sorted(entries)


def metrics(root: Path) -> dict:
    files = source_files(root)
    lines: dict[str, int] = {}
    for path in files:
        layer = layer_of(path.relative_to(root).as_posix())
        lines[layer] = lines.get(layer, 0) + len(path.read_text(encoding="utf-8").splitlines())
    long = long_functions(root, files)
    return {"lines_per_layer": lines, "functions_over_60": [f"{n} {name}" for n, name in long],
            "functions_over_80": sum(n > 80 for n, _ in long), "private_reaches_outside_compat": private_reaches(root),
            "command_entry_modules": command_entry_modules(root, files),
            "library_print_exit_parse_sites": library_output_sites(root)}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--json"]
    result = metrics(Path(args[0]).resolve() if args else HERE)
    if "--json" in sys.argv:
        print(json.dumps(result, indent=1))
    else:
        print("lines per layer:", ", ".join(f"{k} {v}" for k, v in result["lines_per_layer"].items()))
        print(f"functions over 60 lines, docstrings not counted: {len(result['functions_over_60'])} (over 80: "
              f"{result['functions_over_80']})")
        for line in result["functions_over_60"]:
            print("   ", line)
        print(f"modules with a command's entry point: {len(result['command_entry_modules'])}")
        for line in result["command_entry_modules"]:
            print("   ", line)
        print(f"library sites that print, exit or parse: {len(result['library_print_exit_parse_sites'])}")
        for line in result["library_print_exit_parse_sites"]:
            print("   ", line)
        print(f"private reaches outside compat: {len(result['private_reaches_outside_compat'])}")
        for line in result["private_reaches_outside_compat"]:
            print("   ", line)
