"""``--config FILE.yaml`` on every command, read by one reader (``commands/shared/config_files.py``) as ``train`` and
TRL's scripts take it: the file's options are the defaults, several files merge in order, the command line overrides
them, and a key that is no option is a one-line usage error naming the file."""

from __future__ import annotations

import importlib
import re

import pytest

from llava_normaligned.cli import main
from llava_normaligned.commands import COMMANDS, module_name
from llava_normaligned.commands.shared import CommandParser
from llava_normaligned.compat import parser_actions
from llava_normaligned.loading import QUANTIZATION_MODES
from tests.support.messages import error_line, one_line

# the commands, and the check run in a vLLM environment as ``python -m llava_normaligned.commands.vllm_check``
MODULES = {**{name: module_name(name) for name in COMMANDS}, "vllm_check": "llava_normaligned.commands.vllm_check"}


def _parser(name: str):
    return importlib.import_module(MODULES[name]).make_parser()


def test_the_commands_folder_holds_the_commands_only():
    """One file per command, named as the command; what they share is in ``commands/shared/``."""
    import pkgutil

    import llava_normaligned.commands as commands

    found = {m.name for m in pkgutil.iter_modules(commands.__path__) if not m.ispkg}
    assert found == {module.rpartition(".")[2] for module in MODULES.values()}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_command_parses_with_the_one_parser_class_and_takes_a_config_file(name):
    parser = _parser(name)
    assert isinstance(parser, CommandParser), type(parser).__mro__
    options = [a for a in parser_actions(parser) if a.option_strings]
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


def _generate_refusal(config, capsys) -> str:
    """``generate`` run with ``--config config``: a usage error (exit code 2) in one line, which is returned."""
    try:
        code = main(["generate", "M", "--prompt", "hi", "--config", str(config)])
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    one_line(err)
    return error_line(err, "generate")


@pytest.mark.parametrize(("text", "says"), [
    ("max_new_token: 7\n", "'max_new_token' is no option of llava-normaligned generate"),
    ("max-new-tokens: many\n", "max-new-tokens: invalid literal"),
    ("load-in-4bit: maybe\n", "true or false is expected"),
    ("- a\n- b\n", "a mapping of option names to values is expected"),
])
def test_a_bad_file_is_one_line_naming_it(text, says, tmp_path, capsys):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    said = _generate_refusal(config, capsys)
    assert says in said and "--config" in said and str(config) in said, said


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


def test_train_reads_a_config_file_as_every_command_does(tmp_path, capsys):
    """The same reader and the same one-line answers for TRL's dataclass fields: a file's values are the defaults, the
    command line wins, a later file wins, a key no field has names the file."""
    from llava_normaligned.commands.train import read_train_args

    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("learning_rate: 3.0e-4\nmax_steps: 5\nenv:\n  SOME_SETTING: '1'\n")
    second.write_text("max-steps: 7\n")
    required = ["--stage", "1", "--model", "m", "--data-path", "d.json", "--output-dir", "out"]
    request = read_train_args([*required, "--config", str(first), "--config", str(second), "--learning_rate", "1e-3"])
    args = request.namespace
    assert (args.learning_rate, args.max_steps) == (1e-3, 7)
    assert request.environment == {"SOME_SETTING": "1"} and request.config_files == (str(first), str(second))
    assert request.recipe_keys == ("learning_rate", "max_steps")  # the options' names, however a file spells them
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_step: 5\n")
    try:
        code = main(["train", *required, "--config", str(bad)])
    except SystemExit as stop:
        code = stop.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and err == [f"llava-normaligned train: error: --config {bad}: 'max_step' is no option of "
                                 "llava-normaligned train (see llava-normaligned train --help)"], err


TRL_DATACLASSES = {"train", "dpo", "grpo", "kto"}  # their options are TRL's dataclasses (and StageArguments)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_command_s_options_are_dataclasses_read_once(name):
    """A command's options are one frozen dataclass (``option`` fields: the flags are built from it), or for train
    and TRL's commands the dataclasses TrlParser builds them from; ``main`` reads them into it once."""
    import dataclasses
    import inspect

    parser = _parser(name)
    dests = {a.dest for a in parser_actions(parser) if a.dest not in ("help", "config")}
    if name in TRL_DATACLASSES:
        fields = {f.name for cls in parser.dataclass_types for f in dataclasses.fields(cls) if f.init}
        assert dests == fields, dests ^ fields
        return
    cls = parser.config_class
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    assert dests == {f.name for f in dataclasses.fields(cls)}, dests ^ {f.name for f in dataclasses.fields(cls)}
    module = importlib.import_module(MODULES[name])
    assert "parse_config(argv)" in inspect.getsource(module.main), name
    with pytest.raises(dataclasses.FrozenInstanceError):
        config = parser.parse_config(_minimal_argv(name))
        setattr(config, next(iter(dests)), None)


def _minimal_argv(name: str) -> list[str]:
    """Arguments each command parses (what it then checks is not this test's)."""
    return {"align": ["M", "--output-dir", "o"], "card": ["F"], "chat": ["M"], "compose": [
        "--vision-model", "v", "--text-model", "t", "--output-dir", "o"], "convert": ["--from-llava", "m",
        "--output-dir", "o"], "demo": ["--output-dir", "o"], "diagnose": ["M"], "eval": [], "generate": ["M"],
        "make-data": ["--output-dir", "o"], "pull": ["a/b"], "push": ["F", "--repo-id", "a/b"],
        "rl-data": ["--data-path", "d.json", "--format", "dpo", "--output-dir", "o"],
        "tiny": ["--family", "idefics3", "--output-dir", "o"], "vllm_check": ["M", "--output", "o.json"]}[name]


@pytest.mark.parametrize(("name", "argv", "text", "expected"), [
    # an on/off option by its name: the value is the option's (false turns GWC off, as train's field does)
    ("compose", ["--vision-model", "v", "--text-model", "t", "--output-dir", "o"], "gradient_compensation: false\n",
     {"gradient_compensation": False}),
    # by its flag: true is the flag given
    ("compose", ["--vision-model", "v", "--text-model", "t", "--output-dir", "o"], "no-gradient-compensation: true\n",
     {"gradient_compensation": False}),
    ("diagnose", ["M"], "plots: false\n", {"plots": False}),
    ("generate", ["M"], "no-trust-remote-code: true\n", {"trust_remote_code": False}),
    ("generate", ["M"], "quantization: 8bit\n", {"quantization": "8bit"}),
    # a repeatable option given one value, then the command line adds to it
    ("generate", ["M", "--image", "b.png"], "image: a.png\n", {"images": ["a.png", "b.png"]}),
    ("card", ["F", "--tag", "y"], "tag: x\n", {"tag": ["x", "y"]}),
    # TRL's fields: the --no_X twin, and null for an option with choices (unset, as TRL's own reader takes it)
    ("train", ["--stage", "1", "--model", "m", "--data-path", "d.json", "--output-dir", "o"],
     "no_remove_unused_columns: true\ngradient_checkpointing: false\nprojector_norm: null\n",
     {"remove_unused_columns": False, "gradient_checkpointing": False, "projector_norm": None}),
])
def test_a_file_s_value_means_what_the_command_line_would(name, argv, text, expected, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    args = _parser(name).parse_args([*argv, "--config", str(config)])
    assert {key: getattr(args, key) for key in expected} == expected


def test_a_value_no_switch_sets_is_one_line_naming_the_file(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("quantization: 3bit\n")
    said = _generate_refusal(config, capsys)
    assert "--config" in said and str(config) in said, said  # the file, then the key and its value
    assert "quantization" in said and "'3bit'" in said, said
    choices = re.search(r"not one of (\w+(?:, \w+)*)", said)
    assert choices and choices.group(1).split(", ") == list(QUANTIZATION_MODES), said


def test_a_recipe_s_spelling_still_brings_back_its_notice(tmp_path):
    """``keep_notices_of`` compares the options' names: a dashed key counts as its option."""
    from llava_normaligned.commands.train import read_train_args

    config = tmp_path / "c.yaml"
    config.write_text("gradient-checkpointing: true\n")
    request = read_train_args(["--stage", "1", "--model", "m", "--data-path", "d.json", "--output-dir", "o",
                               "--config", str(config)])
    assert request.recipe_keys == ("gradient_checkpointing",)


def test_a_command_that_redefines_a_shared_option_keeps_its_place_and_default():
    """``chat`` takes the loading group whole and redefines ``--dtype`` (its own default): the flag stays where the
    group has it, with chat's default, and ``generate``'s is the group's."""
    chat, generate = _parser("chat"), _parser("generate")

    def loading(parser):  # the flags of --help's loading section, in order
        section = parser.format_help().split("\nloading:\n", 1)[1].split("\n\n", 1)[0]
        return re.findall(r"^  (--[a-z0-9-]+)", section, flags=re.M)

    assert loading(chat) == loading(generate)
    assert loading(chat)[:3] == ["--revision", "--device", "--dtype"]
    assert chat.parse_config(["M"]).dtype is None and generate.parse_config(["M"]).dtype == "auto"


def test_parse_config_without_a_config_class_says_what_is_missing():
    with pytest.raises(TypeError, match="config_class"):
        CommandParser(prog="llava-normaligned x").parse_config([])


def test_vllm_check_refuses_a_missing_image_in_one_usage_line(tmp_path, capsys):
    """Checked before vLLM is imported, so it runs where vLLM is not installed."""
    from llava_normaligned.commands import vllm_check

    missing = tmp_path / "nope.png"
    with pytest.raises(SystemExit) as stop:
        vllm_check.main(["M", "--output", str(tmp_path / "o.json"), "--image", str(missing), "--prompt", "hi"])
    said = one_line(capsys.readouterr().err)
    assert stop.value.code == 2 and said.startswith(f"{vllm_check.PROG}: error: --image ") and str(missing) in said
    assert not (tmp_path / "o.json").exists()
