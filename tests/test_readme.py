"""The README's commands stay true: CI runs its test command, and every CLI call it shows parses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from llava_normaligned.commands import COMMANDS, module_name

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
        from llava_normaligned.commands.train import parse_train_args

        parse_train_args(args)
        return
    module = importlib.import_module(module_name(name))
    parsers = [getattr(module, attr)() for attr in dir(module) if attr.startswith("make") and attr.endswith("parser")]
    known = {opt for parser in parsers for action in parser._actions for opt in action.option_strings}
    assert known, f"no parser found for `llava-normaligned {name}`"
    unknown = [f for f in (a.split("=")[0] for a in args if a.startswith("--")) if f not in known]
    assert not unknown, f"`llava-normaligned {name}` has no option {unknown}"


def test_readme_memory_table_is_the_code_s_own_estimate():
    from llava_normaligned.diagnostics.memory import reference_table, time_table, training_table

    assert reference_table().strip() in README, "regenerate with `python .ci/doc_tables.py`"
    assert time_table().strip() in README, "regenerate with `python .ci/doc_tables.py`"
    indented = "\n".join("  " + line for line in training_table().splitlines())  # inside a list item
    assert indented in README, "regenerate with `python .ci/doc_tables.py`"


# ------------------------------------------------------------------------------ stated durations, from one record

# where each measured duration is stated (every one of these texts must say it as llava_normaligned.timings does)
TIMED = {
    "README.md": ("demo", "demo_quick", "tests", "tests_fast", "demo_real", "demo_real_quick"),
    "docs/demo.md": ("demo", "demo_quick", "demo_real", "demo_real_quick"),
    "docs/DEVELOPING.md": ("tests", "tests_fast"),
    "llava_normaligned/demo/run.py": ("demo", "demo_quick"),
}
DURATION = re.compile(r"(?:about|~|under|over|took|takes|in)\s*\d+(?:\.\d+)?(?:\s*[-–]\s*\d+(?:\.\d+)?)?\s*"
                      r"(?:s|sec|seconds|min|mins|minutes?)\b")
MEASURED = re.compile(r"measured \d+(?:\s*[-–]\s*\d+)? s\b")


def _timed_lines(text: str) -> list[str]:
    """The lines that speak of the demo's or the test suite's duration."""
    return [line for line in text.splitlines() if re.search(r"\bdemo\b|pytest|\btests\b", line)]


@pytest.mark.parametrize("path", sorted(TIMED))
def test_durations_are_stated_as_the_measured_record_says(path):
    from llava_normaligned.timings import about, measured, records, stated

    text = (ROOT / path).read_text()
    for name in TIMED[path]:
        assert stated(name) in text, f"{path} must state the {name!r} time as `{stated(name)}` (assets/timings.json)"
    allowed_about = {about(name) for name in records()["records"]}
    allowed_measured = {measured(name) for name in records()["records"]}
    for line in _timed_lines(text):
        for phrase in DURATION.findall(line):
            assert phrase in allowed_about, f"{path}: {phrase!r} is not a recorded duration: {line.strip()}"
        for phrase in MEASURED.findall(line):
            assert phrase in allowed_measured, f"{path}: {phrase!r} is not the recorded range: {line.strip()}"


def test_demo_help_states_the_recorded_times():
    from llava_normaligned.commands.demo import make_parser
    from llava_normaligned.timings import stated

    text = " ".join(make_parser().format_help().split())
    assert stated("demo_quick") in text and stated("demo") in text


def test_the_duration_check_catches_drift():
    """The check above fails on the statements it replaced."""
    lines = ["llava-normaligned demo --output-dir ./demo            # about 10 minutes on 2 CPU cores",
             "- `python -m pytest -q` runs everything offline on CPU in about 3-4 minutes on 2 cores",
             "demo_ci --quick   # ~20 s: every output"]
    from llava_normaligned.timings import about, records

    allowed = {about(name) for name in records()["records"]}
    for line in lines:
        found = DURATION.findall(line)
        assert found and not set(found) <= allowed, line
