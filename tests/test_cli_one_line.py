"""Bad input is one line whoever reports it: argparse's own errors (an unknown flag, a value that is not a number, a
missing argument) as this package's checks, and what other libraries print while a command's modules are imported
(an import-time notice of a new release) never comes before that line. With good input their output is kept and shown,
in order, once the command has accepted its arguments (``console.hold_library_output``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llava_normaligned.cli import COMMANDS, main

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
from llava_normaligned import console
console.hold_library_output()
handler = logging.StreamHandler()  # takes sys.stderr as it is now, as transformers' handler does
log = logging.getLogger("made.while.held"); log.addHandler(handler); log.propagate = False
log.warning("held line")
console.arguments_accepted()
log.warning("after line")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == ["held line", "after line"], proc.stderr
