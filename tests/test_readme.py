"""The README's commands stay true: CI runs its test command, and every CLI call it shows parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from llava_normaligned.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _code_blocks(text: str) -> list[str]:
    """The shell blocks of a Markdown text, in order."""
    return [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S) if lang in ("bash", "sh", "")]


def test_readme_starts_with_the_demo_and_test_commands():
    blocks = _code_blocks(README)
    setup_demo, setup_tests = blocks[0].strip(), blocks[1].strip()
    assert setup_demo.endswith("llava-normaligned demo --output-dir demo_out")
    assert "pip install torch==2.13.0" in setup_demo and "pip install -e" in setup_demo
    assert "pytest" in setup_tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert setup_tests in ci.splitlines(), ".ci/run must run the README's test command verbatim"


def _cli_calls(text: str) -> list[list[str]]:
    calls = []
    for block in _code_blocks(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if "llava-normaligned " not in line:
                continue
            words = shlex.split(line[line.index("llava-normaligned "):].split("&&")[0])
            calls.append(words[1:])
    return calls


@pytest.mark.parametrize("call", _cli_calls(README), ids=lambda c: " ".join(c)[:60])
def test_readme_cli_calls_name_real_commands_and_flags(call):
    import importlib

    name, args = call[0], call[1:]
    assert name in COMMANDS, f"README shows an unknown command: {name}"
    if name == "train":  # YAML recipes + SFTConfig flags: parse them with the command's own parser
        from llava_normaligned.trainer.arguments import parse_train_args

        parse_train_args(args)
        return
    module = importlib.import_module(COMMANDS[name][0])
    parsers = [getattr(module, attr)() for attr in dir(module) if attr.startswith("make") and attr.endswith("parser")]
    known = {opt for parser in parsers for action in parser._actions for opt in action.option_strings}
    assert known, f"no parser found for `llava-normaligned {name}`"
    unknown = [f for f in (a.split("=")[0] for a in args if a.startswith("--")) if f not in known]
    assert not unknown, f"`llava-normaligned {name}` has no option {unknown}"


def test_readme_memory_table_is_the_code_s_own_estimate():
    from llava_normaligned.diagnostics.memory import reference_table

    assert reference_table().strip() in README, "regenerate with `python -m llava_normaligned.diagnostics.memory`"
