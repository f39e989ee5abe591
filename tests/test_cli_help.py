"""``llava-normaligned COMMAND --help``: built once per installed version and source, then read; every option of
every command has a help text that states its default once."""

import argparse
import importlib
import os
import re
import subprocess
import sys

import pytest

PROBE = ("import sys; from llava_normaligned.cli import main; code = main([{command!r}, '--help']); "
         "print('IMPORTED TRL' if 'trl' in sys.modules else 'NO TRL'); sys.exit(code)")


def _help(command: str, cache: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LLAVA_NORMALIGNED_CACHE": cache, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", PROBE.format(command=command)], capture_output=True, text=True,
                          env=env, timeout=600, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", ["train"])
def test_help_is_built_once_then_read_without_importing_trl(tmp_path, command):
    first = _help(command, str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.rstrip().endswith("IMPORTED TRL") and "--per_device_train_batch_size" in first.stdout
    second = _help(command, str(tmp_path))
    assert second.returncode == 0 and second.stdout.rstrip().endswith("NO TRL")
    assert second.stdout.rsplit("\n", 2)[0] == first.stdout.rsplit("\n", 2)[0]  # the same text
    cached = os.listdir(tmp_path / "help")
    assert len(cached) == 1 and cached[0].startswith(f"{command}-") and not cached[0].endswith(".partial")


def test_the_key_follows_the_sources_and_versions(monkeypatch):
    from llava_normaligned.commands.shared import help_cache

    key = help_cache.help_key("train")
    assert key == help_cache.help_key("train") and key != help_cache.help_key("eval")
    monkeypatch.setattr(help_cache, "HELP_DEPENDS_ON", help_cache.HELP_DEPENDS_ON + ("numpy",))
    assert help_cache.help_key("train") != key


def test_another_checkout_of_the_package_has_its_own_key(monkeypatch, tmp_path):
    """Two checkouts (or environments) share ``~/.cache``: one's text is not printed for the other."""
    import llava_normaligned
    from llava_normaligned.commands.shared import help_cache

    key = help_cache.help_key("train")
    monkeypatch.setattr(llava_normaligned, "__file__", str(tmp_path / "llava_normaligned" / "__init__.py"))
    assert help_cache.help_key("train") != key


def test_the_sources_checked_are_where_python_imported_them_from():
    """In an editable checkout ``llava_normaligned.trainer`` is the top-level ``trainer/`` (pyproject.toml's
    package-dir): its folder is among those a help text is checked against, each folder once."""
    import llava_normaligned.hub_cards
    import llava_normaligned.trainer

    from llava_normaligned.commands.shared import help_cache

    folders = help_cache.source_folders()
    for package in (llava_normaligned.trainer, llava_normaligned.hub_cards):
        assert any(os.path.dirname(os.path.abspath(package.__file__)).startswith(f) for f in folders), folders
    assert not any(f.startswith(g + os.sep) for f in folders for g in folders), folders


def test_an_edited_source_rebuilds_the_help(monkeypatch, tmp_path):
    """A kept text is read while the files of the folders its build imported are unchanged, rebuilt after an edit
    (a recipe's ``.yaml`` too: a help text lists the recipes)."""
    from llava_normaligned.commands.shared import help_cache

    sources = tmp_path / "trainer"
    sources.mkdir()
    recipe = sources / "recipe.yaml"
    recipe.write_text("learning_rate: 1e-3\n")
    monkeypatch.setenv("LLAVA_NORMALIGNED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(help_cache, "source_folders", lambda: [str(sources)])
    built = []

    def run(args):
        built.append(args)
        print("usage: train [--learning_rate LR]")
        return 0

    for _ in range(2):
        assert help_cache.cached_help("train", run) == 0
    assert len(built) == 1
    recipe.write_text("learning_rate: 2e-3, longer\n")
    assert help_cache.cached_help("train", run) == 0 and len(built) == 2


# ------------------------------------------------------------------------------ every option of every command

DOUBLED_DEFAULT = re.compile(r"\(default:[^()]*(?:\([^()]*\)[^()]*)*\)\s*\(default:")


def _actions(parser: argparse.ArgumentParser):
    """Every option and positional of ``parser`` and of its sub-parsers, but --help."""
    for action in parser._actions:  # argparse's list of a parser's actions
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        elif not isinstance(action, argparse._HelpAction):
            yield parser, action


def help_problems(parser: argparse.ArgumentParser) -> list[str]:
    """What a reader of ``parser``'s --help would trip on: an option without help, an option whose help ends in two
    "(default: ...)", two options of one parser with the same help (a ``--no_X`` twin repeating ``--X``)."""
    problems, seen = [], {}
    for owner, action in _actions(parser):
        name = "/".join(action.option_strings) or action.dest
        text = " ".join(owner._get_formatter()._format_action(action).split())
        if not (action.help or "").strip():
            problems.append(f"{name}: no help")
        elif DOUBLED_DEFAULT.search(text):
            problems.append(f"{name}: two defaults: {text}")
        described = " ".join(action.help.split()) if action.help else None
        if described and (owner.prog, described) in seen:
            problems.append(f"{name}: the same help as {seen[owner.prog, described]}")
        seen.setdefault((owner.prog, described), name)
    return problems


def command_parsers(name: str) -> list[argparse.ArgumentParser]:
    """The parsers behind ``llava-normaligned NAME`` (each module's ``make_*parser``)."""
    from llava_normaligned.commands import module_name

    module = importlib.import_module(module_name(name))
    return [getattr(module, attr)() for attr in dir(module) if attr.startswith("make") and attr.endswith("parser")]


def _command_names():
    from llava_normaligned.commands import COMMANDS

    return list(COMMANDS)


@pytest.mark.parametrize("name", _command_names())
def test_every_option_of_every_command_has_one_help_text_and_one_default(name):
    parsers = command_parsers(name)
    assert parsers, f"no make_*parser for {name}"
    for parser in parsers:
        assert not help_problems(parser), (parser.prog, help_problems(parser))


def help_entries(text: str) -> dict[str, str]:
    """Each flag of an argparse ``--help`` text -> its entry's help, on one line."""
    entries, flags = {}, []
    for line in text.splitlines():
        if line.startswith("  -"):
            head, _, rest = line.strip().partition("  ")
            flags = [token.rstrip(",") for token in head.split() if token.startswith("-")]
            for flag in flags:
                entries[flag] = rest.strip()
        elif line.startswith("        ") and flags:
            for flag in flags:
                entries[flag] = f"{entries[flag]} {line.strip()}".strip()
        else:
            flags = []
    return entries


def test_train_help_states_each_default_once_and_says_what_a_no_flag_does():
    entries = help_entries(command_parsers("train")[0].format_help())
    assert entries["--lr_llm"].endswith("(default: --learning_rate)")  # not "... (default: None)"
    assert entries["--lr-llm"] == entries["--lr_llm"] and "None" not in entries["--lr_llm"]
    assert entries["--no_skip_unused_vision"].startswith("turn --skip_unused_vision off")
    # transformers' own defaults are still shown
    assert entries["--per_device_train_batch_size"].endswith("(default: 8)")


def test_the_help_check_catches_what_it_is_for():
    """``help_problems`` finds each defect in a parser built as transformers builds one (its formatter adds
    "(default: X)" to every help, and a ``--no_X`` twin copies ``--X``'s help)."""
    from dataclasses import dataclass, field

    from transformers import HfArgumentParser

    @dataclass
    class Options:
        rate: float | None = field(default=None, metadata={"help": "a rate (default: the other one)"})
        skip: bool = field(default=True, metadata={"help": "skip the unused layers"})
        steps: int = field(default=1)

    problems = help_problems(HfArgumentParser(Options))
    assert any(p.startswith("--rate: two defaults") for p in problems)
    assert any("--no_skip" in p and "the same help as --skip" in p for p in problems)
    assert any(p.startswith("--steps") and p.endswith("no help") for p in problems)


# the commands whose arguments are checked before torch is imported: a bad flag or --help is a fraction of a second
# (`python .ci/command_times.py`); the others need their libraries for their parsers' choices (demo's variants, TRL's
# dataclasses, eval's tasks) and the help cache answers their --help
LIGHT = ("make-data", "rl-data", "compose", "align", "convert", "tiny", "generate", "chat", "diagnose", "card", "push",
         "pull")


def test_the_light_commands_parse_without_torch():
    code = ("import sys, importlib\n"
            "from llava_normaligned.commands import module_name\n"
            f"for name in {LIGHT!r}:\n"
            "    importlib.import_module(module_name(name)).make_parser().format_help()\n"
            "print(sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                         stdin=subprocess.DEVNULL)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr[-2000:]
