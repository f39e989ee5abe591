"""How a model is loaded, said once: ``LoadOptions`` (what ``load_model`` takes), the one flag group every command
that loads a model has (the loading group of ``commands/shared/flags.py``: the same spellings, defaults and meaning
in each), and ``train``'s
configuration, built once (parse, environment set-up, validate and derive) and then only read."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import logging
import os
import re

import pytest

from llava_normaligned.checks import BadInput
from llava_normaligned.commands import COMMANDS, module_name
from llava_normaligned.loading import (
    DTYPE_DEFAULT,
    DTYPE_NAMES,
    TRUST_REMOTE_CODE_DEFAULT,
    LoadOptions,
    load_model,
    parse_dtype,
)
from tests.support.training import write_llava_dataset

# the commands that load a model, with the least argv each parses
LOADING_COMMANDS = {"generate": ["M", "--prompt", "hi"], "diagnose": ["M"], "eval": ["M"]}
SHARED_FLAGS = ("--revision", "--device", "--dtype", "--trust-remote-code", "--no-trust-remote-code")


def _parser(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(module_name(name))
    makers = [attr for attr in dir(module) if attr.startswith("make") and attr.endswith("parser")]
    assert len(makers) == 1, (name, makers)
    return getattr(module, makers[0])()


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    return next(action for action in parser._actions if flag in action.option_strings)


def test_the_loading_commands_are_all_there():
    assert set(LOADING_COMMANDS) <= set(COMMANDS)
    assert module_name("generate") == "llava_normaligned.commands.generate"


@pytest.mark.parametrize("name", list(LOADING_COMMANDS))
def test_every_loading_command_has_the_one_flag_group(name):
    parser = _parser(name)
    known = {option for action in parser._actions for option in action.option_strings}
    assert set(SHARED_FLAGS) <= known, (name, set(SHARED_FLAGS) - known)
    argv = LOADING_COMMANDS[name]
    plain = parser.parse_args(argv)
    assert (plain.revision, plain.device, plain.dtype, plain.trust_remote_code) == (
        None, "auto", DTYPE_DEFAULT, TRUST_REMOTE_CODE_DEFAULT)
    assert LoadOptions.from_args(plain) == LoadOptions("M", device="auto", quantization=None)
    for flags, expected in [
        (["--trust-remote-code"], {"trust_remote_code": True}),
        (["--no-trust-remote-code"], {"trust_remote_code": False}),
        (["--dtype", "bf16"], {"dtype": "bf16"}),
        (["--dtype", "float32", "--device", "cpu", "--revision", "v1"],
         {"dtype": "float32", "device": "cpu", "revision": "v1"}),
    ]:
        options = LoadOptions.from_args(parser.parse_args([*argv, *flags]))
        assert {key: getattr(options, key) for key in expected} == expected, (name, flags)
    with pytest.raises(SystemExit):  # the pair excludes itself
        parser.parse_args([*argv, "--trust-remote-code", "--no-trust-remote-code"])


def test_the_flags_are_one_definition_with_one_help_text():
    parsers = {name: _parser(name) for name in LOADING_COMMANDS}
    for flag in ("--device", "--dtype", "--trust-remote-code", "--no-trust-remote-code"):
        texts = {name: _option(parser, flag).help for name, parser in parsers.items()}
        assert len(set(texts.values())) == 1, (flag, texts)
    dtype_help = _option(parsers["eval"], "--dtype").help
    assert dtype_help.count("default") == 1 and all(name in dtype_help for name in DTYPE_NAMES)
    quantized = [name for name, parser in parsers.items()
                 if {"--load-in-4bit", "--load-in-8bit"} <= {o for a in parser._actions for o in a.option_strings}]
    assert sorted(quantized) == ["eval", "generate"]
    for name in quantized:
        assert parsers[name].parse_args([*LOADING_COMMANDS[name], "--load-in-8bit"]).quantization == "8bit"


def test_train_reads_the_same_spellings_with_the_same_meaning():
    from llava_normaligned.commands.train import make_parser

    parser = make_parser()
    base = ["--stage", "1", "--model", "m", "--data-path", "d.json", "--output-dir", "out"]

    def parsed(*flags):
        namespace, rest = parser.parse_known_args([*base, *flags])
        assert not rest
        return namespace

    assert parsed().trust_remote_code is TRUST_REMOTE_CODE_DEFAULT  # not TRL's False: unset is transformers' own
    assert parsed("--trust-remote-code").trust_remote_code is True
    assert parsed("--trust_remote_code", "True").trust_remote_code is True
    assert parsed("--no-trust-remote-code").trust_remote_code is False
    assert parsed("--trust_remote_code", "False").trust_remote_code is False
    assert set(_option(parser, "--dtype").choices) == {"auto", *DTYPE_NAMES}
    assert parsed().dtype == "float32"  # training keeps fp32 master weights; the help says so
    assert "default: float32" in _option(parser, "--dtype").help
    assert parsed("--dtype", "bf16").dtype == "bf16"


def test_load_options_hold_what_load_model_takes():
    taken = set(inspect.signature(load_model).parameters) - {"model_name_or_path", "return_report"}
    assert set(LoadOptions("m").load_kwargs()) == taken
    defaults = {name: p.default for name, p in inspect.signature(load_model).parameters.items() if name in taken}
    assert LoadOptions("m").load_kwargs() == defaults  # one default for each
    assert parse_dtype(DTYPE_DEFAULT) is None  # "auto": as stored
    options = LoadOptions("m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.dtype = "float16"


@pytest.mark.parametrize(("flags", "says"), [
    (["--dtype", "float8"], "--dtype: unknown value 'float8'"),
    (["--device", "tpu"], "--device: unknown device 'tpu'"),
])
def test_from_args_names_the_flag_of_a_bad_value(flags, says):
    parser = _parser("generate")
    with pytest.raises(BadInput, match=says):
        LoadOptions.from_args(parser.parse_args(["M", "--prompt", "hi", *flags]))
    with pytest.raises(ValueError, match="quantization"):
        LoadOptions("m", quantization="3bit")


def test_an_unknown_4bit_data_type_is_refused_before_anything_loads(tmp_path):
    """``load_model(..., quant_type=...)`` checked it only through ``LoadOptions``: called directly, a typo reached
    bitsandbytes after the download."""
    from llava_normaligned.loading import quantization_config

    with pytest.raises(ValueError, match="quant_type: expected one of .*'int4'"):
        load_model(str(tmp_path / "no-such-model"), quantization="4bit", quant_type="int4")  # before the source
    with pytest.raises(ValueError, match="quant_type: expected one of .*'int4'"):
        LoadOptions("m", quantization="4bit", quant_type="int4")
    with pytest.raises(ValueError, match="quant_type"):
        quantization_config("4bit", quant_type="int4")
    assert quantization_config("4bit", quant_type="fp4").bnb_4bit_quant_type == "fp4"


def test_load_options_load_a_model(tiny_model_dir):
    import torch

    options = LoadOptions(tiny_model_dir, dtype="bf16", device="cpu")
    model, processor, report = options.load(return_report=True)
    assert next(model.parameters()).dtype == torch.bfloat16 and not model.training and report.mode is None
    model, _ = dataclasses.replace(options, dtype="auto", for_training=True).load()
    assert next(model.parameters()).dtype == torch.float32 and processor is not None  # as stored


# ------------------------------------------------------------------------------------ train's configuration


def _snapshot(config) -> tuple:
    return (dataclasses.asdict(config.stage_args), config.sft_args.to_dict(), dataclasses.asdict(config.model_args),
            config.load, config.config_files, dict(config.environment))


def test_train_configuration_is_built_once_and_only_read(tiny_model_dir, tiny_processor, tmp_path, monkeypatch,
                                                         caplog):
    from llava_normaligned.commands.train import read_train_args
    from llava_normaligned.trainer.arguments import build_train_config, setup_environment
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.train import prepare_stage

    path, images = write_llava_dataset(tmp_path / "data", n_rows=6, text_only=2)
    template = tmp_path / "template.jinja"
    template.write_text(tiny_processor.chat_template)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("env:\n  LLAVA_NA_TEST_SETTING: from-the-recipe\nlearning_rate: 0.001\n")
    monkeypatch.delenv("LLAVA_NA_TEST_SETTING", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)

    request = read_train_args([
        "--config", str(recipe), "--stage", "2", "--model", tiny_model_dir, "--data-path", path, "--image-folder",
        images, "--output-dir", str(tmp_path / "out"), "--chat_template_path", str(template), "--report_to", "none",
        "--gradient_checkpointing", "False", "--per_device_train_batch_size", "2"])
    assert "LLAVA_NA_TEST_SETTING" not in os.environ  # parsing sets nothing
    assert request.environment == {"LLAVA_NA_TEST_SETTING": "from-the-recipe"}
    with caplog.at_level(logging.INFO, logger="llava_normaligned.trainer.arguments"):
        setup_environment(request.environment)  # the one step that does, and says so
    assert os.environ["LLAVA_NA_TEST_SETTING"] == "from-the-recipe"
    said = [r.getMessage() for r in caplog.records if r.name == "llava_normaligned.trainer.arguments"]
    assert dict(re.findall(r"^environment: (\w+)=(\S+)", "\n".join(said), flags=re.MULTILINE)) == request.environment

    namespace_before = dict(vars(request.namespace))
    config = build_train_config(request)
    assert vars(request.namespace) == namespace_before  # deriving writes nothing back
    assert config.sft_args.learning_rate == 0.001 and config.environment == request.environment
    assert config.load == LoadOptions(tiny_model_dir, revision="main", dtype="float32", for_training=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.sft_args = None

    before = _snapshot(config)
    model, processor = config.load.load()
    prepared = prepare_stage(model, processor, load_llava_json(path, images), args=config.sft_args,
                             stage=config.stage_args)
    assert _snapshot(config) == before  # the run's settings are read, never written
    given, used = config.sft_args, prepared.trainer.args
    assert used is not given
    assert (given.remove_unused_columns, used.remove_unused_columns) == (True, False)
    assert (given.chat_template_path, used.chat_template_path) == (str(template), None)
    assert (given.ddp_find_unused_parameters, used.ddp_find_unused_parameters) == (None, True)  # text-only rows
    assert used.learning_rate == given.learning_rate and used.output_dir == given.output_dir


def test_train_logs_its_configuration_once(tiny_model_dir, tmp_path, caplog):
    from llava_normaligned.commands.train import main

    path, images = write_llava_dataset(tmp_path / "data", n_rows=4, text_only=0)
    with caplog.at_level(logging.INFO):
        assert main(["--stage", "1", "--model", tiny_model_dir, "--data-path", path, "--image-folder", images,
                     "--output-dir", str(tmp_path / "out"), "--max_steps", "1", "--per_device_train_batch_size",
                     "2", "--report_to", "none", "--save_strategy", "no", "--gradient_checkpointing", "False",
                     "--hub_token", "hf_secret_value", "--disable_tqdm", "True"]) == 0
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("configuration: ")]
    assert len(logged) == 1
    assert '"for_training": true' in logged[0] and '"stage": 1' in logged[0]
    assert "hf_secret_value" not in caplog.text and "<HUB_TOKEN>" in logged[0]
