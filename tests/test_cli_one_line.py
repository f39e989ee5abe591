"""Bad input is one line whoever reports it: argparse's own errors (an unknown flag, a value that is not a number, a
missing argument) as this package's checks, and what other libraries print while a command's modules are imported
(an import-time notice of a new release) never comes before that line. With good input their output is kept and shown,
in order, once the command has accepted its arguments (``commands.shared.hold_library_output``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llava_normaligned.cli import main
from llava_normaligned.commands import COMMANDS, module_name

# For each command: its required arguments, and a flag that takes a number (given a word), where it has one.
REQUIRED = {
    "demo": ["--output-dir", "x"],
    "make-data": ["--output-dir", "x"],
    "train": ["--stage", "1", "--model", "m", "--data-path", "d.json", "--output-dir", "x"],
    "dpo": ["--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", "x"],
    "grpo": ["--model_name_or_path", "m", "--dataset_name", "d", "--reward_funcs", "exact_answer"],
    "kto": ["--model_name_or_path", "m", "--dataset_name", "d", "--output_dir", "x"],
    "rl-data": ["--data-path", "d.json", "--format", "dpo", "--output-dir", "x"],
    "compose": ["--vision-model", "v", "--text-model", "t", "--output-dir", "x"],
    "align": ["m", "--output-dir", "x"],
    "convert": ["--from-llava", "m", "--output-dir", "x"],
    "tiny": ["--family", "idefics3", "--output-dir", "x"],
    "generate": ["m", "--prompt", "hi"],
    "chat": ["m"],
    "diagnose": ["m", "--output-dir", "x"],
    "eval": ["m", "--tasks", "synthetic"],
    "card": ["folder"],
    "push": ["folder", "--repo-id", "a/b"],
    "pull": ["a/b"],
}
NOT_A_NUMBER = {
    "demo": ["--seeds", "two"],
    "make-data": ["--image-size", "big"],
    "train": ["--max_steps", "many"],
    "dpo": ["--beta", "high"],
    "grpo": ["--num_generations", "many"],
    "kto": ["--max_steps", "many"],
    "rl-data": ["--seed", "one"],
    "compose": ["--vision-feature-layer", "last"],
    "align": ["--gradient-compensation-min", "small"],
    "convert": ["--gradient-compensation-min", "small"],
    "tiny": ["--seed", "one"],
    "generate": ["--max-new-tokens", "many"],
    "chat": ["--port", "eighty"],
    "diagnose": ["--max-samples", "all"],
    "eval": ["--limit", "some"],
}


def _run(argv, capsys) -> tuple[int, list[str]]:
    try:
        code = main(argv)
    except SystemExit as done:
        code = done.code
    captured = capsys.readouterr()
    assert captured.out == "", captured.out
    return code, [line for line in captured.err.splitlines() if line.strip()]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_argparse_errors_are_one_line(name, capsys):
    code, lines = _run([name, *REQUIRED[name], "--no-such-flag"], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"llava-normaligned {name}: error: ") and "--no-such-flag" in lines[0], lines
    assert lines[0].endswith(f"(see llava-normaligned {name} --help)"), lines

    code, lines = _run([name], capsys)  # a required argument missing
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"llava-normaligned {name}: error: "), lines

    if name in NOT_A_NUMBER:
        code, lines = _run([name, *REQUIRED[name], *NOT_A_NUMBER[name]], capsys)
        assert code == 2 and len(lines) == 1 and lines[0].startswith(f"llava-normaligned {name}: error: "), lines
        assert NOT_A_NUMBER[name][0] in lines[0] and NOT_A_NUMBER[name][1] in lines[0], lines


def _command_parser(name: str):
    """The parser of ``llava-normaligned NAME``: the ``make_*parser`` of its module whose prog is the command's."""
    import importlib

    module = importlib.import_module(module_name(name))
    parsers = [getattr(module, attr)() for attr in dir(module) if attr.startswith("make") and attr.endswith("parser")]
    [parser] = [parser for parser in parsers if parser.prog == f"llava-normaligned {name}"]
    return parser


def _flag_and_prefix(parser) -> tuple[str, str, list[str]]:
    """A long flag of ``parser``, a prefix of it that starts no other flag (argparse's abbreviations would read it as
    the flag) and a value for it; a flag that takes no value where there is one (any value it takes is good)."""
    actions = {o: a for a in parser._actions for o in a.option_strings if o.startswith("--")}  # argparse's list
    for flag in sorted(actions, key=lambda flag: (actions[flag].nargs != 0, flag)):
        prefix = flag[:-1]
        if flag in ("--help", "--config") or len(prefix) < 5 or [f for f in actions if f.startswith(prefix)] != [flag]:
            continue
        action = actions[flag]
        value = [] if action.nargs == 0 else [str(next(iter(action.choices)))] if action.choices else ["1"]
        return flag, prefix, value
    raise AssertionError(f"{parser.prog}: no long flag with a prefix of its own")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_prefix_of_a_flag_is_not_that_flag(name, capsys, monkeypatch, tmp_path):
    """A typo that is a prefix of a flag (``--max_step 2`` for ``--max_steps``) is an unknown flag, one line and exit
    code 2, never the flag (argparse's abbreviations are off in every command's parser: ``commands.shared.parsers``)."""
    monkeypatch.chdir(tmp_path)  # were the prefix taken, a command would write its output folder here
    parser = _command_parser(name)
    flag, prefix, value = _flag_and_prefix(parser)
    code, lines = _run([name, *REQUIRED[name], prefix, *value], capsys)
    assert code == 2 and len(lines) == 1, (flag, lines)
    assert lines[0].startswith(f"llava-normaligned {name}: error: unrecognized arguments: {prefix}"), (flag, lines)
    assert parser.allow_abbrev is False


def test_train_takes_max_steps_whole_in_both_spellings_and_refuses_a_prefix(capsys, monkeypatch, tmp_path):
    """``--max_steps`` and ``--max-steps`` (TRL's parser registers both spellings of every field) are read; a prefix
    of either, with its value apart or after ``=``, is refused."""
    from llava_normaligned.commands.train import read_train_args

    monkeypatch.chdir(tmp_path)

    required = REQUIRED["train"]
    for spelling in (["--max_steps", "2"], ["--max-steps", "2"], ["--max_steps=2"], ["--max-steps=2"]):
        assert read_train_args([*required, *spelling]).namespace.max_steps == 2, spelling
    for typo in (["--max_step", "2"], ["--max-step", "2"], ["--max_step=2"], ["--max-ste", "2"]):
        code, lines = _run(["train", *required, *typo], capsys)
        assert code == 2 and len(lines) == 1 and f"unrecognized arguments: {typo[0]}" in lines[0], (typo, lines)


def test_every_command_is_in_the_table():
    assert set(REQUIRED) == set(COMMANDS) and set(NOT_A_NUMBER) <= set(COMMANDS)


# A library that speaks while it is imported: a logging record with no handler configured (Python's last-resort
# handler), a print to sys.stderr and a C-level write to file descriptor 2.
NOISY = """
import logging, os, sys
import llava_normaligned.cli as cli
real = cli.importlib.import_module
def noisy(name):
    cli.importlib.import_module = real  # the importlib module itself: noisy for the command's import only
    logging.getLogger("a.library").warning("a library notice")
    print("a library print", file=sys.stderr)
    sys.stderr.flush()
    os.write(2, b"a C-level line\\n")
    return real(name)
cli.importlib.import_module = noisy
sys.exit(cli.main(sys.argv[1:]))
"""


def _noisy(args, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", NOISY, *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, check=False)


@pytest.mark.parametrize("args", [
    ["make-data", "--output-dir", "{nonempty}"],  # the command's own check
    ["make-data", "--output-dir", "out", "--image-size", "big"],  # argparse's
    ["train", "--stage", "1", "--model", "{nonempty}", "--data-path", "none.json", "--output-dir", "out",
     "--max_steps", "-5"],  # after TRL, transformers and their dependencies were imported
], ids=["own check", "argparse", "train"])
def test_library_output_never_comes_before_the_one_line(args, tmp_path):
    nonempty = tmp_path / "full"
    nonempty.mkdir()
    (nonempty / "keep.txt").write_text("x")
    proc = _noisy([a.format(nonempty=nonempty) for a in args], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(f"llava-normaligned {args[0]}: error: "), lines
    assert not (tmp_path / "out").exists()


def test_with_good_input_library_output_is_shown_in_order(tmp_path):
    proc = _noisy(["make-data", "--output-dir", "data", "--train-per-template", "16", "--test-per-template", "16",
                   "--image-size", "32", "--no-progress"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[:3] == ["a library notice", "a library print", "a C-level line"], lines
    assert proc.stdout.startswith("wrote data"), proc.stdout


def test_a_handler_made_while_held_writes_to_the_real_stderr_afterwards(tmp_path):
    """transformers makes its logging handler when first imported, inside the hold: it must not keep writing into
    the held buffer once the command accepted its arguments."""
    code = """
import logging, sys
from llava_normaligned.commands import shared
shared.hold_library_output()
handler = logging.StreamHandler()  # takes sys.stderr as it is now, as transformers' handler does
log = logging.getLogger("made.while.held"); log.addHandler(handler); log.propagate = False
log.warning("held line")
shared.arguments_accepted()
log.warning("after line")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["held line", "after line"], proc.stderr
