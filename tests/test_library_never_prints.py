"""The library never prints, exits or parses a command line (``tests.support.library_output``): the commands do.
Seen failing on a violation planted in a copy of the sources."""

from __future__ import annotations

import shutil

import pytest

from tests.support.library_output import library_output_sites
from tests.support.private_reaches import ROOT, SOURCES


def test_the_library_has_no_print_exit_or_parse():
    found = library_output_sites()
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    ("module", "code", "says"),
    [
        ("trainer/train.py", "def f(loss):\n    print(loss)", "trainer/train.py"),
        ("llava_normaligned/loading.py", "import sys\ndef f():\n    sys.exit(2)", "sys.exit"),
        ("hub_cards/push.py", "def f(parser):\n    return parser.parse_args()", "parse_args"),
        ("llava_normaligned/diagnostics/runner.py", "import sys\ndef f(t):\n    sys.stderr.write(t)", "sys.stderr.write"),
        ("modeling_llava_normaligned/modeling_normaligned_vlm.py", "def f():\n    print('hi')", "print"),
    ],
)
def test_a_planted_print_is_found(tmp_path, module, code, says):
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, tmp_path / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "assets", "recipes", "templates"))
    with open(tmp_path / module, "a", encoding="utf-8") as handle:
        handle.write(f"\n\n{code}\n")
    found = library_output_sites(tmp_path)
    assert len(found) == 1 and found[0].startswith(module) and says in found[0], found


def test_a_script_entry_and_the_commands_may_print(tmp_path):
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, tmp_path / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "assets", "recipes", "templates"))
    with open(tmp_path / "llava_normaligned/loading.py", "a", encoding="utf-8") as handle:
        handle.write('\n\nif __name__ == "__main__":\n    print("a script entry")\n')
    with open(tmp_path / "llava_normaligned/commands/train.py", "a", encoding="utf-8") as handle:
        handle.write('\n\ndef f():\n    print("a command")\n')
    assert library_output_sites(tmp_path) == []
