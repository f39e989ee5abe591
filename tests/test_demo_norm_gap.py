"""``demo --norm-gap``: the image tokens enter the LLM at a chosen multiple of its text norm before training
(``demo.parts.set_norm_gap``), for every row, with the norm layer's forward unchanged."""

from __future__ import annotations

import pytest
import torch

from llava_normaligned.demo.parts import (
    VARIANTS,
    Parts,
    compose_variant,
    pre_norm_image_norm,
    set_norm_gap,
)
from llava_normaligned.part_metrics import text_embedding_norm, vision_text_norm_ratio
from llava_normaligned.tiny import save_tiny_parts


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    vision, text = save_tiny_parts(tmp_path_factory.mktemp("parts"))
    return Parts(vision, text, {})


def _pixels(n: int = 4) -> torch.Tensor:
    return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("gap", [1.0, 40.0, 70.0])
def test_the_gap_before_the_norm_is_the_one_asked_for_and_the_norm_s_output_is_unchanged(parts, gap):
    pixels = _pixels()
    no_norm, _ = compose_variant(parts, VARIANTS[0], seed=3)
    target, _ = compose_variant(parts, VARIANTS[3], seed=3)  # target init + GWC: the same projector draw
    drawn = pre_norm_image_norm(no_norm, pixels) / text_embedding_norm(no_norm)
    assert drawn == pytest.approx(pre_norm_image_norm(target, pixels) / text_embedding_norm(target), rel=1e-6)
    aligned_before = vision_text_norm_ratio(target, pixels)["vision_text_ratio"]

    record = set_norm_gap(no_norm, pixels, gap)
    assert record["natural"] == pytest.approx(drawn, rel=1e-6) and record["factor"] == pytest.approx(gap / drawn)
    # without the norm layer the LLM's image inputs are the projector's output: now at `gap` x T
    assert vision_text_norm_ratio(no_norm, pixels)["vision_text_ratio"] == pytest.approx(gap, rel=1e-5)
    set_norm_gap(target, pixels, gap)
    assert pre_norm_image_norm(target, pixels) / text_embedding_norm(target) == pytest.approx(gap, rel=1e-5)
    # the LayerNorm takes the scale away: the aligned model's image inputs stay at T, up to its epsilon (1e-5 beside
    # a per-element variance of (gap * T)^2 / D: 1% at 1x the tiny LLM's T of 0.16, nothing at 40x)
    assert vision_text_norm_ratio(target, pixels)["vision_text_ratio"] == pytest.approx(
        aligned_before, rel=2e-2 if gap < 10 else 1e-4)


def test_other_images_see_the_same_scale_and_bad_gaps_are_refused(parts):
    model, _ = compose_variant(parts, VARIANTS[0], seed=1)
    others = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    before = pre_norm_image_norm(model, others)
    factor = set_norm_gap(model, _pixels(), 40.0)["factor"]
    assert pre_norm_image_norm(model, others) == pytest.approx(before * factor, rel=1e-5)  # one scale, not a fit
    with pytest.raises(ValueError, match="positive"):
        set_norm_gap(model, _pixels(), 0.0)
    with torch.no_grad():
        model.model.multi_modal_projector.linear_2.bias.fill_(0.1)
    with pytest.raises(ValueError, match="bias must be zero"):
        set_norm_gap(model, _pixels(), 40.0)


def test_the_flag_is_recorded_and_the_real_llm_default_is_llava_s_gap():
    from llava_normaligned.commands.demo import config_from_args, make_parser
    from llava_normaligned.demo.run import REAL_LLM_NORM_GAP, DemoConfig

    parser = make_parser()
    real = config_from_args(parser.parse_args(["--output-dir", "x", "--text-model", "smollm2-135m-offline"]))
    assert real.norm_gap == REAL_LLM_NORM_GAP == 40.0 and real.to_dict()["norm_gap"] == 40.0
    drawn = config_from_args(parser.parse_args(["--output-dir", "x", "--text-model", "smollm2-135m-offline",
                                                "--norm-gap", "0"]))
    assert drawn.norm_gap is None and "norm_gap" not in drawn.to_dict()
    tiny = config_from_args(parser.parse_args(["--output-dir", "x", "--norm-gap", "20"]))
    assert tiny.norm_gap == 20.0 and "norm_gap" not in DemoConfig.full().to_dict()
