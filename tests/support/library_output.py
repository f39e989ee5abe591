"""The places below the commands that print, exit or parse a command line, found by reading the sources (``ast``).

The library (the model, the families, the core, compat, and the applications: ``trainer``, ``hub_cards``,
``diagnostics``, ``evaluation``, ``serving``) raises and returns; only the commands (``llava_normaligned/commands/``,
``cli.py``), the demo and the chat page turn results into output and exit codes. What counts, in a library module:
a call of ``print``, ``sys.exit``, ``sys.stdout.write`` / ``sys.stderr.write``, ``input`` or any ``parse_args``.
Code under ``if __name__ == "__main__":`` is a module's script entry, never run by an importer, and is not counted.

    python -m tests.support.library_output [ROOT]      # prints one line per site; exit 1 if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.support.private_reaches import ROOT, source_files

# path prefixes (relative to the root) of what may print: the commands (with what they share, commands/shared/), the
# console entry, the demo, the chat page
NOT_LIBRARY = ("llava_normaligned/commands/", "llava_normaligned/cli.py", "llava_normaligned/demo/",
               "llava_normaligned/chat/")


def _script_entries(tree: ast.Module) -> set[int]:
    """Line numbers inside the module's ``if __name__ == "__main__":`` blocks."""
    lines = set()
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"':
            lines.update(range(node.lineno, node.end_lineno + 1))
    return lines


def sites_in(tree: ast.Module, relative: str) -> list[str]:
    skipped = _script_entries(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node.lineno in skipped:
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
        if (name in ("print", "input") and not owner) or (owner == "sys" and name == "exit") \
                or name == "parse_args" or (owner in ("sys.stdout", "sys.stderr") and name == "write"):
            found.append(f"{relative}:{node.lineno} {owner + '.' if owner else ''}{name}")
    return found


def library_output_sites(root: Path = ROOT) -> list[str]:
    """Every print, exit or parse below the commands, as ``path:line call``."""
    sites = []
    for path in source_files(root):
        relative = path.relative_to(root).as_posix()
        if relative.startswith(NOT_LIBRARY):
            continue
        sites += sites_in(ast.parse(path.read_text(encoding="utf-8")), relative)
    return sorted(sites)


if __name__ == "__main__":
    found = library_output_sites(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
    print("\n".join(found))
    sys.exit(1 if found else 0)
