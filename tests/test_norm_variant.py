"""The projector norm's four options in one home (``llava_normaligned.norm_variant.NormVariant``): parsed and checked
once, the same choices and defaults as the model's config, the same flags for compose, convert and train, and every
option reaching the model a command builds (train's stage 1 included)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re

import pytest
import torch

from llava_normaligned.commands.shared.flags import NormOptions
from llava_normaligned.norm_variant import NORM_FIELDS, NormVariant
from modeling_llava_normaligned import LlavaNormAlignedConfig
from modeling_llava_normaligned.configuration_llava_normaligned import NORM_INITS, PROJECTOR_NORMS

# ------------------------------------------------------------------------------------------------ parsing


def test_defaults_and_choices_are_the_model_config_s():
    """The model file (pushed to the Hub) cannot import the package: the two are held to the same values here."""
    from llava_normaligned import norm_variant

    assert norm_variant.PROJECTOR_NORMS == PROJECTOR_NORMS and norm_variant.NORM_INITS == NORM_INITS
    config = LlavaNormAlignedConfig()
    assert NormVariant().config_kwargs() == {key: getattr(config, key) for key in NORM_FIELDS}
    assert NormVariant.from_config(config) == NormVariant()


def test_command_line_none_is_the_config_s_none():
    assert NormVariant(projector_norm="none").projector_norm is None
    assert NormVariant.from_dict({"projector_norm": "none"}).config_kwargs()["projector_norm"] is None
    assert NormVariant(gradient_compensation_min=1).gradient_compensation_min == 1.0  # an int: a float
    assert isinstance(NormVariant(gradient_compensation_min=1).gradient_compensation_min, float)


@pytest.mark.parametrize("option, value", [
    ("projector_norm", "rmsnorm"), ("projector_norm", "None"), ("norm_init", "zeros"), ("norm_init", None),
    ("gradient_compensation", "yes"), ("gradient_compensation", 1), ("gradient_compensation_min", 0.0),
    ("gradient_compensation_min", -1e-3), ("gradient_compensation_min", math.inf), ("gradient_compensation_min", True),
    ("gradient_compensation_min", "1e-3"),
])
def test_a_bad_value_is_an_error_naming_its_option(option, value):
    with pytest.raises(ValueError, match=f"^{option} must be") as error:
        NormVariant(**{option: value})
    assert repr(value) in str(error.value)
    with pytest.raises(ValueError, match=option):  # the model's config refuses it too
        LlavaNormAlignedConfig(**{option: value})


def test_from_dict_takes_a_base_and_refuses_other_keys():
    base = NormVariant(norm_init="default", gradient_compensation=False)
    assert NormVariant.from_dict({"gradient_compensation_min": 0.01}, base=base) == dataclasses.replace(
        base, gradient_compensation_min=0.01)
    assert NormVariant.from_dict({}) == NormVariant()
    with pytest.raises(ValueError, match="not a projector-norm option: norm_target, projector"):
        NormVariant.from_dict({"projector": "layernorm", "norm_target": 1.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.norm_init = "target"


def test_from_config_reads_a_config_or_its_json_and_refuses_stock_llava():
    config = LlavaNormAlignedConfig(projector_norm=None, norm_init="default", gradient_compensation=False,
                                    gradient_compensation_min=0.02)
    expected = NormVariant(None, "default", False, 0.02)
    assert NormVariant.from_config(config) == expected == NormVariant.from_config(config.to_dict())
    older = {k: v for k, v in config.to_dict().items() if k != "gradient_compensation_min"}
    assert NormVariant.from_config(older).gradient_compensation_min == 1e-3  # a missing option: its default
    from transformers import LlavaConfig

    for stock in (LlavaConfig(), LlavaConfig().to_dict()):
        with pytest.raises(ValueError, match="llava config has no projector-norm options"):
            NormVariant.from_config(stock)


def test_given_keeps_only_what_was_given():
    assert NormVariant.given({"projector_norm": None, "norm_init": None, "gradient_compensation": None}) == {}
    assert NormVariant.given(argparse.Namespace(projector_norm="none", norm_init=None, gradient_compensation=False,
                                                gradient_compensation_min=0.5)) == {
        "projector_norm": None, "gradient_compensation": False, "gradient_compensation_min": 0.5}
    with pytest.raises(ValueError, match="norm_init"):
        NormVariant.given({"norm_init": "zeros"})


def test_changes_and_description():
    paper = NormVariant()
    ablation = NormVariant(norm_init="default", gradient_compensation=False)
    assert ablation.changes_from(paper) == {"norm_init": "default", "gradient_compensation": False}
    assert paper.changes_from(paper) == {}
    assert paper.describe() == "layernorm, target init, with GWC (clamp 0.001)"
    assert ablation.describe() == "layernorm, default init, without GWC"
    assert NormVariant(projector_norm=None).describe() == "none (w/o Norm)"


@pytest.mark.parametrize("variant", [NormVariant(projector_norm=None), NormVariant("none", "default", False, 0.5)])
def test_a_variant_without_a_norm_speaks_of_no_init_or_gwc(variant):
    """Without a norm, its init and GWC are inert (the config stores them all the same): what describes the variant
    (``in_force``, ``describe``, ``report``: what compose and convert print) names only the missing norm."""
    assert variant.in_force() == {"projector_norm": None}
    assert variant.describe() == "none (w/o Norm)"
    assert variant.report() == "projector_norm=none (w/o Norm)"
    assert set(variant.config_kwargs()) == set(NORM_FIELDS)  # the config still gets every field
    assert LlavaNormAlignedConfig(**variant.config_kwargs()).projector_norm is None


def test_a_variant_with_a_norm_reports_every_option():
    assert NormVariant().in_force() == NormVariant().config_kwargs()
    assert NormVariant().report() == "projector_norm=layernorm norm_init=target GWC=True (clamp 0.001)"
    assert NormVariant(norm_init="default", gradient_compensation=False).report() == (
        "projector_norm=layernorm norm_init=default GWC=False")


# ------------------------------------------------------------------------------------------------ the flags


def test_compose_and_convert_flags_parse_into_a_variant():
    from llava_normaligned.commands.shared import CommandParser

    parser = CommandParser(config_class=NormOptions)
    assert NormVariant.from_args(parser.parse_config([])) == NormVariant()
    args = parser.parse_args(["--projector-norm", "none", "--norm-init", "default", "--no-gradient-compensation",
                              "--gradient-compensation-min", "0.25"])
    assert NormVariant.from_args(args) == NormVariant(None, "default", False, 0.25)
    assert NormVariant.from_args(parser.parse_config(["--projector-norm", "none"])) == NormVariant(None)


def test_compose_convert_and_train_offer_the_same_options():
    from llava_normaligned.commands.compose import make_parser as make_compose_parser
    from llava_normaligned.commands.convert import make_parser as make_convert_parser
    from llava_normaligned.commands.train import make_parser
    from llava_normaligned.trainer.arguments import StageArguments

    for parser in (make_compose_parser(), make_convert_parser(), make_parser()):
        dests = {action.dest for action in parser._actions}  # argparse's list of a parser's actions
        assert set(NORM_FIELDS) <= dests, parser.prog
    fields = {f.name: f for f in dataclasses.fields(StageArguments)}
    assert all(fields[key].default is None for key in NORM_FIELDS)  # train: as the model is, unless given


# ------------------------------------------------------------------------------------------------ train, stage 1


FAST = ["--max_steps", "1", "--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no",
        "--gradient_checkpointing", "False", "--disable_tqdm", "True"]


def _stage1(tiny_parts, tmp_path, *extra) -> list[str]:
    """``train`` stage 1 composing the tiny parts on the spot, on a tiny dataset."""
    from tests.support.training import write_llava_dataset

    vision, text = tiny_parts
    data, images = write_llava_dataset(tmp_path / "data", n_rows=2, text_only=0)
    return ["--stage", "1", "--vision-model", vision, "--text-model", text, "--data-path", data, "--image-folder",
            images, "--output-dir", str(tmp_path / "out"), *FAST, *extra]


@pytest.mark.parametrize("how", ["flag", "recipe"])
def test_train_stage1_composes_with_every_norm_option(tiny_parts, tmp_path, how):
    """``--gradient-compensation-min`` (or a recipe's ``gradient_compensation_min``) reaches the model ``train``
    composes for stage 1 and saves, with the other options given."""
    import json

    from llava_normaligned.commands.train import main
    from llava_normaligned.trainer.train import SUMMARY_FILE

    if how == "flag":
        extra = ["--norm-init", "default", "--gradient-compensation", "False", "--gradient-compensation-min", "0.02"]
    else:
        recipe = tmp_path / "variant.yaml"
        recipe.write_text("norm_init: default\ngradient_compensation: false\ngradient_compensation_min: 0.02\n")
        extra = ["--config", str(recipe)]
    assert main(_stage1(tiny_parts, tmp_path, *extra)) == 0
    out = tmp_path / "out"
    config = json.loads((out / "config.json").read_text())
    assert NormVariant.from_config(config) == NormVariant("layernorm", "default", False, 0.02)
    summary = json.loads((out / SUMMARY_FILE).read_text())
    assert summary["variant"]["gradient_compensation_min"] == 0.02 and summary["variant"]["gain_init"] == 1.0


def test_train_refuses_a_bad_variant_by_its_option(tiny_parts, tmp_path, capsys):
    from llava_normaligned.commands.train import main

    assert main(_stage1(tiny_parts, tmp_path, "--gradient-compensation-min", "0")) == 2
    assert "--gradient-compensation-min" in capsys.readouterr().err
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("norm_init: zeros\n")  # a recipe's value is checked against the choices, naming the file
    with pytest.raises(SystemExit) as usage_error:
        main(_stage1(tiny_parts, tmp_path, "--config", str(recipe)))
    assert usage_error.value.code == 2
    err = capsys.readouterr().err
    assert "--config" in err and str(recipe) in err and "norm_init" in err and "'zeros'" in err, err
    choices = re.search(r"not one of (\w+(?:, \w+)*)", err)
    assert choices and choices.group(1).split(", ") == list(NORM_INITS), err
    assert not (tmp_path / "out").exists()


def test_stage1_variant_on_a_checkpoint_rebuilds_the_norm_and_stage2_refuses_it(tiny_model_dir):
    from llava_normaligned.trainer.stage_model import apply_norm_variant, describe_variant
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
    T, D = model.config.norm_target, model.config.text_config.hidden_size
    with torch.no_grad():
        model.get_projector_norm().weight.fill_(5.0)  # as stage 1 may have left it
    assert apply_norm_variant(model, stage=1, gradient_compensation_min=1e-3) == {}  # the checkpoint's own value
    with pytest.raises(ValueError, match="stage 2: .* the run asks for {'gradient_compensation_min': 0.3}"):
        apply_norm_variant(model, stage=2, gradient_compensation_min=0.3)
    assert apply_norm_variant(model, stage=1, gradient_compensation_min=0.3) == {"gradient_compensation_min": 0.3}
    norm = model.get_projector_norm()
    assert model.config.gradient_compensation_min == 0.3 and norm.compensation_min == 0.3
    assert torch.allclose(norm.weight, torch.full_like(norm.weight, T / math.sqrt(D)))  # re-initialised
    assert describe_variant(model)["gradient_compensation_min"] == 0.3
    assert apply_norm_variant(model, stage=1, projector_norm=None) == {"projector_norm": None}
    assert model.get_projector_norm() is None and describe_variant(model)["projector_norm"] is None


def test_a_training_summary_of_a_model_without_a_norm_records_no_init_or_gwc(tiny_model_dir):
    from llava_normaligned.trainer.stage_model import apply_norm_variant, describe_variant
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
    assert {"norm_init", "gradient_compensation", "gain_init"} <= set(describe_variant(model))  # with the norm
    apply_norm_variant(model, stage=1, projector_norm=None)
    described = describe_variant(model)
    assert described["projector_norm"] is None
    assert not {"norm_init", "gradient_compensation", "gradient_compensation_min", "gain_init"} & set(described)
