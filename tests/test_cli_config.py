"""``--config FILE.yaml`` on every command, read by one reader (``commands/shared/config_files.py``) as ``train`` and
TRL's scripts take it: the file's options are the defaults, several files merge in order, the command line overrides
them, and a key that is no option is a one-line usage error naming the file."""

from __future__ import annotations

import importlib

import pytest

from llava_normaligned.cli import main
from llava_normaligned.commands import COMMANDS, module_name

TRL_PARSED = {"train", "dpo", "grpo", "kto"}  # TrlParser's own --config (tests/test_train_cli.py, test_preference)


def _parser(name: str):
    return importlib.import_module(module_name(name)).make_parser()


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - TRL_PARSED))
def test_every_command_takes_a_config_file(name):
    options = [a for a in _parser(name)._actions if a.option_strings]
    assert any(a.dest == "config" for a in options), name


def test_the_file_gives_the_defaults_and_the_command_line_overrides(tmp_path):
    config = tmp_path / "generate.yaml"
    config.write_text("max-new-tokens: 7\nload_in_4bit: true\ndtype: float32\ntrust_remote_code: false\n")
    args = _parser("generate").parse_args(["M", "--prompt", "hi", "--config", str(config)])
    assert (args.max_new_tokens, args.quantization, str(args.dtype).removeprefix("torch."), args.trust_remote_code) \
        == (7, "4bit", "float32", False)
    args = _parser("generate").parse_args(["M", "--prompt", "hi", "--config", str(config), "--max-new-tokens", "3"])
    assert args.max_new_tokens == 3 and args.quantization == "4bit"
    plain = _parser("generate").parse_args(["M", "--prompt", "hi"])
    assert plain.max_new_tokens != 7 and plain.quantization is None


def test_a_required_option_may_come_from_the_file(tmp_path):
    config = tmp_path / "demo.yaml"
    config.write_text(f"output_dir: {tmp_path / 'run'}\nseeds: 2\nquick: true\n")
    args = _parser("demo").parse_args(["--config", str(config)])
    assert args.output_dir == str(tmp_path / "run") and args.num_seeds == 2 and args.quick is True


@pytest.mark.parametrize(("text", "says"), [
    ("max_new_token: 7\n", "'max_new_token' is no option of llava-normaligned generate"),
    ("max-new-tokens: many\n", "max-new-tokens: invalid literal"),
    ("load-in-4bit: maybe\n", "true or false is expected"),
    ("- a\n- b\n", "a mapping of option names to values is expected"),
])
def test_a_bad_file_is_one_line_naming_it(text, says, tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    try:
        code = main(["generate", "M", "--prompt", "hi", "--config", str(config)])
    except SystemExit as stop:
        code = stop.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"llava-normaligned generate: error: --config {config}: ") and says in err[0], err


def test_several_files_merge_in_order_as_train_s_recipes_do(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("max-new-tokens: 7\nbatch-size: 3\n")
    second.write_text("max_new_tokens: 9\n")
    args = _parser("generate").parse_args(["M", "--prompt", "hi", "--config", str(first), f"--config={second}"])
    assert (args.max_new_tokens, args.batch_size) == (9, 3)  # the later file wins; the earlier one's other keys stay
    args = _parser("generate").parse_args(["M", "--prompt", "hi", "--config", str(second), "--config", str(first)])
    assert args.max_new_tokens == 7


@pytest.mark.parametrize("name", ["generate", "train"])
def test_a_config_flag_without_a_file_is_one_line(name, capsys):
    try:
        code = main([name, "--config"])
    except SystemExit as stop:
        code = stop.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and err == [f"llava-normaligned {name}: error: --config needs a file (see llava-normaligned "
                                 f"{name} --help)"], err
