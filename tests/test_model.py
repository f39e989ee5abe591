"""The model: equivalence with stock LLaVA, the aligned init, GWC's gradients, save/load, generation."""

from __future__ import annotations

import math
import re

import pytest
import torch
from PIL import Image
from transformers import LlavaForConditionalGeneration

from modeling_llava_normaligned import (
    LlavaNormAlignedConfig,
    LlavaNormAlignedForConditionalGeneration,
    LlavaNormAlignedModel,
    NormAlignedLayerNorm,
    model_norm_target,
    text_embedding_norm_target,
)
from tests.support.messages import number
from tests.support.numerics import F32_EPS, F64_EPS, assert_close_scaled

VISION = dict(
    model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, image_size=32, patch_size=8,
)
TEXT = dict(
    model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=120, max_position_embeddings=256, pad_token_id=0,
)
IMAGE_TOKEN_ID = 119
N_IMAGE_TOKENS = 16  # (32 / 8) ** 2, SigLIP has no CLS token


def make_config(**overrides) -> LlavaNormAlignedConfig:
    kwargs = dict(
        vision_config=VISION, text_config=TEXT, image_token_index=IMAGE_TOKEN_ID,
        image_seq_length=N_IMAGE_TOKENS, vision_feature_select_strategy="full", vision_feature_layer=-2,
    )
    kwargs.update(overrides)
    return LlavaNormAlignedConfig(**kwargs)


def make_inputs(batch: int = 2, text_len: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(1, IMAGE_TOKEN_ID, (batch, text_len), generator=g)
    image = torch.full((batch, N_IMAGE_TOKENS), IMAGE_TOKEN_ID)
    input_ids = torch.cat([text[:, :2], image, text[:, 2:]], dim=1)
    pixel_values = torch.randn(batch, 3, 32, 32, generator=g)
    return input_ids, pixel_values


# ------------------------------------------------------------------------------------------------ config


@pytest.mark.parametrize(
    "field, value",
    [
        ("projector_norm", "rmsnorm"),
        ("norm_init", "zeros"),
        ("gradient_compensation", "yes"),
        ("gradient_compensation_min", 0.0),
        ("gradient_compensation_min", -1e-3),
        ("norm_target", -1.0),
        ("norm_target", float("nan")),
    ],
)
def test_bad_config_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        make_config(**{field: value})


def test_bad_stock_llava_field_is_refused_by_name():
    # LlavaConfig's own fields are validated by transformers' strict dataclass, which names the field too.
    with pytest.raises(Exception, match="vision_feature_select_strategy"):
        make_config(vision_feature_select_strategy="cls")


def test_config_round_trip_keeps_norm_fields(tmp_path):
    config = make_config(projector_norm=None, norm_target=0.7, norm_init="default", gradient_compensation=False)
    config.save_pretrained(tmp_path)
    loaded = LlavaNormAlignedConfig.from_pretrained(tmp_path)
    assert (loaded.projector_norm, loaded.norm_target, loaded.norm_init, loaded.gradient_compensation) == (
        None, 0.7, "default", False,
    )
    assert loaded.auto_map["AutoModel"].endswith("LlavaNormAlignedModel")


# ------------------------------------------------------------------------------------------------ T


def test_norm_target_ignores_zero_rows():
    weight = torch.randn(10, 8)
    weight[[0, 3, 7]] = 0.0
    expected = weight[[i for i in range(10) if i not in (0, 3, 7)]].norm(dim=-1).mean()
    assert text_embedding_norm_target(weight) == pytest.approx(float(expected), rel=1e-6)


def test_norm_target_rejects_all_zero_embeddings():
    with pytest.raises(ValueError, match="every row"):
        text_embedding_norm_target(torch.zeros(5, 4))


def test_norm_target_says_when_the_excluded_rows_left_none():
    """A vocabulary whose only non-zero rows are excluded (an image token's, say) was told "every row has L2 norm
    <= eps", which was not so."""
    weight = torch.zeros(5, 4)
    weight[2] = 1.0
    with pytest.raises(ValueError, match=r"no row is left: 4 row\(s\) have L2 norm <= .* and 1 are excluded"):
        text_embedding_norm_target(weight, exclude_token_ids=[2])
    assert text_embedding_norm_target(weight) == pytest.approx(2.0)


# ------------------------------------------------------------------------------------------------ equivalence


def test_without_norm_logits_equal_stock_llava(seed):
    from llava_normaligned.compose import stock_llava_like

    ours = LlavaNormAlignedForConditionalGeneration(make_config(projector_norm=None)).eval()
    stock = stock_llava_like(ours)
    assert type(stock) is LlavaForConditionalGeneration
    input_ids, pixel_values = make_inputs()
    with torch.no_grad():
        a = ours(input_ids=input_ids, pixel_values=pixel_values).logits
        b = stock(input_ids=input_ids, pixel_values=pixel_values).logits
    assert torch.equal(a, b)
    # and with the norm the outputs differ: the comparison above is not vacuous
    aligned = LlavaNormAlignedForConditionalGeneration(make_config()).eval()
    aligned.load_state_dict(ours.state_dict(), strict=False)
    with torch.no_grad():
        assert not torch.allclose(aligned(input_ids=input_ids, pixel_values=pixel_values).logits, b)


# ------------------------------------------------------------------------------------------------ init


def _projected_norms(model, pixel_values):
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values=pixel_values, return_dict=True).pooler_output
    return torch.cat(list(features)).norm(dim=-1)  # (B * N,)


def test_target_init_puts_projector_outputs_at_text_norm(seed):
    model = LlavaNormAlignedForConditionalGeneration(make_config()).eval()
    T = model.config.norm_target
    assert T == pytest.approx(model_norm_target(model))  # the image token's row left out (paper §5.1)
    gain = model.model.multi_modal_projector.norm.weight
    assert torch.allclose(gain, torch.full_like(gain, T / math.sqrt(TEXT["hidden_size"])))  # paper §5.1
    norms = _projected_norms(model, make_inputs()[1])
    # ||LN(x)|| = T * sqrt(var / (var + eps)): within a few % of T even for this random, low-variance projector
    assert norms.mean().item() == pytest.approx(T, rel=0.05)
    stock_like = LlavaNormAlignedForConditionalGeneration(make_config(projector_norm=None)).eval()
    # the gap the norm closes: the random stock projector's outputs are not at T
    assert abs(_projected_norms(stock_like, make_inputs()[1]).mean().item() - T) > 0.1 * T


def test_default_init_is_gain_one(seed):
    model = LlavaNormAlignedForConditionalGeneration(make_config(norm_init="default", norm_target=0.5))
    norm = model.model.multi_modal_projector.norm
    assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and torch.equal(norm.bias, torch.zeros_like(norm.bias))
    norms = _projected_norms(model.eval(), make_inputs()[1])
    assert norms.mean().item() == pytest.approx(math.sqrt(TEXT["hidden_size"]), rel=0.05)


def test_given_norm_target_is_used(seed):
    model = LlavaNormAlignedForConditionalGeneration(make_config(norm_target=3.2))
    gain = model.model.multi_modal_projector.norm.weight
    assert torch.allclose(gain, torch.full_like(gain, 3.2 / 8.0))


# ------------------------------------------------------------------------------------------------ reset_norm


def _trained_looking(projector):
    """The projector's norm moved away from any init, as training leaves it."""
    with torch.no_grad():
        projector.norm.weight.uniform_(2.0, 3.0)
        projector.norm.bias.uniform_(-1.0, 1.0)


@pytest.mark.parametrize("norm_init, expected_gain", [("target", 3.2 / 8.0), ("default", 1.0)])
def test_reset_norm_rebuilds_and_initialises_the_norm_from_the_config(seed, norm_init, expected_gain):
    model = LlavaNormAlignedForConditionalGeneration(make_config(norm_target=3.2))
    projector = model.model.multi_modal_projector
    _trained_looking(projector)
    old = projector.norm
    model.config.norm_init, model.config.gradient_compensation_min = norm_init, 0.05
    norm = projector.reset_norm()  # the model's config as it reads now
    assert norm is projector.norm and norm is not old and isinstance(norm, NormAlignedLayerNorm)
    assert torch.equal(norm.weight, torch.full_like(norm.weight, expected_gain))  # paper §5.1 / Table 5
    assert torch.equal(norm.bias, torch.zeros_like(norm.bias))
    assert norm.compensation and norm.compensation_min == 0.05 and norm.normalized_shape == (TEXT["hidden_size"],)
    assert model.get_projector_norm() is norm


def test_reset_norm_with_no_norm_or_without_gwc(seed):
    model = LlavaNormAlignedForConditionalGeneration(make_config(norm_target=3.2)).eval()
    projector = model.model.multi_modal_projector
    off = projector.reset_norm(make_config(norm_target=3.2, gradient_compensation=False, gradient_compensation_min=0.2))
    assert not off.compensation and off.compensation_min == 0.2
    assert projector.reset_norm(make_config(projector_norm=None)) is None and projector.norm is None
    from llava_normaligned.compose import stock_llava_like

    assert not any("multi_modal_projector.norm" in key for key in model.state_dict())
    stock = stock_llava_like(model)  # the same weights: with the norm gone, the same logits
    input_ids, pixel_values = make_inputs()
    with torch.no_grad():
        assert torch.equal(model(input_ids=input_ids, pixel_values=pixel_values).logits,
                           stock(input_ids=input_ids, pixel_values=pixel_values).logits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reset_norm_keeps_the_projector_s_dtype_and_device(seed, dtype):
    model = LlavaNormAlignedForConditionalGeneration(make_config(norm_target=3.2)).to(dtype)
    norm = model.model.multi_modal_projector.reset_norm()
    assert norm.weight.dtype == norm.bias.dtype == dtype
    assert torch.equal(norm.weight, torch.full_like(norm.weight, 3.2 / 8.0))
    with torch.device("meta"):
        on_meta = LlavaNormAlignedForConditionalGeneration(make_config(norm_target=3.2))
    projector = on_meta.model.multi_modal_projector.to(dtype)
    assert projector.reset_norm().weight.device.type == "meta" and projector.norm.weight.dtype == dtype


def test_reset_norm_without_t_names_it(seed):
    model = LlavaNormAlignedForConditionalGeneration(make_config(norm_target=3.2))
    with pytest.raises(ValueError, match="norm_target"):
        model.model.multi_modal_projector.reset_norm(make_config())  # target init, T not set


def test_gain_survives_post_init_from_pretrained_and_resize(tmp_path, seed, caplog):
    model = LlavaNormAlignedForConditionalGeneration(make_config(norm_target=2.0))
    norm = model.model.multi_modal_projector.norm
    with torch.no_grad():  # a trained gain, not the init value
        norm.weight.copy_(torch.linspace(0.01, 0.5, norm.weight.numel()))
        norm.bias.fill_(0.03)
    trained = (norm.weight.clone(), norm.bias.clone())
    model.post_init()
    assert torch.equal(norm.weight, trained[0]) and torch.equal(norm.bias, trained[1])
    model.save_pretrained(tmp_path)
    loaded = LlavaNormAlignedForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(loaded.model.multi_modal_projector.norm.weight, trained[0])
    loaded.resize_token_embeddings(TEXT["vocab_size"] + 8)
    assert torch.equal(loaded.model.multi_modal_projector.norm.weight, trained[0])
    assert torch.equal(loaded.model.multi_modal_projector.norm.bias, trained[1])
    # a checkpoint without the norm (a stock layout) gets the target gain, not 1.0
    state = {k: v for k, v in model.state_dict().items() if "multi_modal_projector.norm." not in k}
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()  # let caplog see transformers' logger
    try:
        with caplog.at_level("WARNING"):
            reloaded = LlavaNormAlignedForConditionalGeneration.from_pretrained(tmp_path)
    finally:
        hf_logging.disable_propagation()
    assert "no projector norm weights" in caplog.text  # said, not silent
    gain = reloaded.model.multi_modal_projector.norm.weight
    assert torch.allclose(gain, torch.full_like(gain, 2.0 / 8.0))


def _hf_warnings(caplog):
    """Capture transformers' logger (and this model's, which logs through it) in ``caplog`` at WARNING."""
    from contextlib import contextmanager

    from transformers.utils import logging as hf_logging

    @contextmanager
    def capture():
        hf_logging.enable_propagation()
        try:
            with caplog.at_level("WARNING"):
                yield
        finally:
            hf_logging.disable_propagation()

    return capture()


def _drop_from_checkpoint(folder, predicate) -> list[str]:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    dropped = sorted(k for k in state if predicate(k))
    save_file({k: v for k, v in state.items() if k not in dropped}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return dropped


def _missing_weights_warning(caplog) -> str:
    """The one warning ``from_pretrained`` logged of weights the checkpoint lacks."""
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "lacks" in r.getMessage()]
    assert len(said) == 1, caplog.text
    return said[0]


def _convert_command(message: str) -> list[str]:
    """The ``llava-normaligned convert`` command line a refusal suggests (in backticks), as its arguments."""
    command = re.search(r"`(llava-normaligned convert [^`]*)`", message)
    assert command, message
    return command.group(1).split()


def test_missing_weights_load_as_in_transformers_and_the_loader_refuses(tmp_path, seed, caplog):
    """The class follows transformers: a missing weight is initialised (the vision model's own init) and reported,
    with a warning naming the checkpoint; the package's loader, behind every command, refuses the checkpoint."""
    from transformers import AutoModelForImageTextToText

    from llava_normaligned.loading import load_model

    config = make_config(norm_target=1.0, vision_config=dict(VISION, hidden_size=64, intermediate_size=128))
    LlavaNormAlignedForConditionalGeneration(config).save_pretrained(tmp_path)
    dropped = _drop_from_checkpoint(tmp_path, lambda k: ".layers.0.self_attn.q_proj.weight" in k and "vision" in k)
    assert len(dropped) == 1

    with _hf_warnings(caplog):
        model, info = LlavaNormAlignedForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == {"model.vision_tower.encoder.layers.0.self_attn.q_proj.weight"}
    said = _missing_weights_warning(caplog)
    assert repr(str(tmp_path)) in said and number(r"lacks (\d+) weight", said) == len(dropped) and "q_proj" in said
    # SigLIP initialises q_proj with xavier_uniform: std sqrt(2 / (64 + 64)) = 0.125; the generic init was std 0.02
    q_proj = model.model.vision_tower.encoder.layers[0].self_attn.q_proj.weight
    assert 0.11 < float(q_proj.detach().std()) < 0.14, float(q_proj.detach().std())

    caplog.clear()  # what a Hub user gets: the Auto class, the same code
    with _hf_warnings(caplog):
        AutoModelForImageTextToText.from_pretrained(tmp_path)
    said = _missing_weights_warning(caplog)
    assert repr(str(tmp_path)) in said and number(r"lacks (\d+) weight", said) == len(dropped) and "at random" in said

    with pytest.raises(ValueError) as refused:
        load_model(str(tmp_path))
    message = str(refused.value)
    assert "\n" not in message and str(tmp_path) in message and "q_proj.weight" in message
    assert "lacks weights the model needs" in message and "llava-normaligned convert --from-llava" in message


@pytest.mark.parametrize("vision_type", ["clip_vision_model", "siglip_vision_model"])
def test_weights_filled_in_by_from_pretrained_are_initialised_as_in_stock_llava(vision_type):
    """``from_pretrained`` with nothing to load initialises every weight as stock LLaVA does (same seed, same
    numbers): the vision model's attention and MLP get its own init, not the generic std 0.02."""
    from transformers import LlavaConfig

    vision = dict(VISION, model_type=vision_type, hidden_size=64, intermediate_size=128, num_attention_heads=4)
    common = dict(vision_config=vision, text_config=TEXT, image_token_index=IMAGE_TOKEN_ID)
    torch.manual_seed(0)
    stock = LlavaForConditionalGeneration.from_pretrained(None, config=LlavaConfig(**common), state_dict={})
    torch.manual_seed(0)
    ours = LlavaNormAlignedForConditionalGeneration.from_pretrained(
        None, config=LlavaNormAlignedConfig(norm_target=1.0, **common), state_dict={}
    )
    expected, actual = stock.state_dict(), ours.state_dict()
    assert set(actual) - set(expected) == {"model.multi_modal_projector.norm.weight",
                                           "model.multi_modal_projector.norm.bias"}
    differ = [k for k in expected if not torch.equal(expected[k], actual[k])]
    assert not differ, differ
    q_proj = actual["model.vision_tower.encoder.layers.0.self_attn.q_proj.weight"]
    fc1 = actual["model.vision_tower.encoder.layers.0.mlp.fc1.weight"]
    if vision_type == "clip_vision_model":  # CLIP: D^-0.5 (2L)^-0.5 = 0.0625 and (2D)^-0.5 = 0.088
        assert 0.055 < float(q_proj.std()) < 0.07 and 0.08 < float(fc1.std()) < 0.097
    else:  # SigLIP: xavier_uniform, sqrt(2 / (64 + 64)) = 0.125 and sqrt(2 / (64 + 128)) = 0.102
        assert 0.11 < float(q_proj.std()) < 0.14 and 0.09 < float(fc1.std()) < 0.115


def _legacy_layout(state: dict) -> dict:
    """A LLaVA state dict (current key names) in LLaVA's legacy layout: the LM whole under ``language_model``."""
    renamed = {}
    for key, value in state.items():
        if key.startswith("lm_head."):
            key = "language_model." + key
        elif key.startswith("model.language_model."):
            key = "language_model.model." + key[len("model.language_model."):]
        else:
            key = key.removeprefix("model.")
        renamed[key] = value.contiguous()
    return renamed


@pytest.mark.parametrize("layout", ["legacy", "current"])
@pytest.mark.parametrize("config_type", ["llava", "llava_normaligned"])
@pytest.mark.parametrize("model_class", [LlavaNormAlignedForConditionalGeneration, LlavaNormAlignedModel])
def test_stock_llava_checkpoints_are_refused_with_the_convert_hint(tmp_path, seed, layout, config_type, model_class):
    """A stock LLaVA checkpoint loaded directly: under LLaVA's config transformers would map its keys in and write
    them back in LLaVA's legacy layout under this model's config (unreadable); under this model's config its legacy
    keys would leave the language model random. Both are refused, naming ``convert`` (which reads either layout:
    test_compose). This model's own layout under its own config loads."""
    from safetensors.torch import save_file
    from transformers import LlavaConfig

    common = dict(vision_config=VISION, text_config=TEXT, image_token_index=IMAGE_TOKEN_ID)
    stock = LlavaForConditionalGeneration(LlavaConfig(**common))
    config = stock.config if config_type == "llava" else LlavaNormAlignedConfig(norm_target=1.0, **common)
    config.save_pretrained(tmp_path)
    state = {k: v.contiguous() for k, v in stock.state_dict().items()}
    if layout == "legacy":
        state = _legacy_layout(state)
        assert any(k.startswith("language_model.model.layers.") for k in state)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    if layout == "current" and config_type == "llava_normaligned":
        model = model_class.from_pretrained(tmp_path)  # a stock LLaVA's weights in this model's layout: the norm is new
        base = getattr(model, "model", model)
        assert torch.equal(base.language_model.embed_tokens.weight, stock.model.language_model.embed_tokens.weight)
        return
    reason = "legacy key names" if config_type == "llava_normaligned" else "is a 'llava' checkpoint"
    with pytest.raises(ValueError, match=reason) as refused:
        model_class.from_pretrained(tmp_path)
    message = str(refused.value)
    assert "\n" not in message and _convert_command(message) == [
        "llava-normaligned", "convert", "--from-llava", str(tmp_path), "--output-dir", "OUT"], message


def test_a_legacy_state_dict_given_without_a_path_gets_a_hint_that_names_no_none(seed):
    """``from_pretrained(None, config=..., state_dict=...)``: the hint cannot name a folder; it said
    ``--from-llava None``."""
    from transformers import LlavaConfig

    common = dict(vision_config=VISION, text_config=TEXT, image_token_index=IMAGE_TOKEN_ID)
    stock = LlavaForConditionalGeneration(LlavaConfig(**common))
    state = _legacy_layout({k: v.contiguous() for k, v in stock.state_dict().items()})
    config = LlavaNormAlignedConfig(norm_target=1.0, **common)
    with pytest.raises(ValueError, match="legacy key names") as refused:
        LlavaNormAlignedForConditionalGeneration.from_pretrained(None, config=config, state_dict=state)
    message = str(refused.value)
    assert message.startswith("the given state_dict ") and "None" not in message, message
    assert _convert_command(message)[2:] == ["--from-llava", "CHECKPOINT", "--output-dir", "OUT"], message
    assert "Hub id" in message.rpartition("`")[2], message  # what to put for CHECKPOINT, after the command


# ------------------------------------------------------------------------------------------------ GWC


def _hand_gradients(x, weight, bias, grad_y, eps, clamp_min, compensate):
    """dL/dx and dL/dg for y = LN(x) * g + b, written out (paper §5.1, Appendix D)."""
    mu = x.mean(-1, keepdim=True)
    var = x.var(-1, unbiased=False, keepdim=True)
    rstd = (var + eps).rsqrt()
    x_hat = (x - mu) * rstd
    grad_x_hat = grad_y * weight
    if compensate:  # GWC: scale the gradient w.r.t. the normalized tensor by 1 / clamp(mean|g|, delta)
        grad_x_hat = grad_x_hat / weight.abs().mean().clamp_min(clamp_min)
    D = x.shape[-1]
    grad_x = rstd / D * (D * grad_x_hat - grad_x_hat.sum(-1, keepdim=True)
                         - x_hat * (grad_x_hat * x_hat).sum(-1, keepdim=True))
    grad_g = (grad_y * x_hat).reshape(-1, D).sum(0)
    grad_b = grad_y.reshape(-1, D).sum(0)
    return grad_x, grad_g, grad_b


@pytest.mark.parametrize("gain_value, compensate", [(0.02, True), (0.02, False), (1e-5, True), (0.8, True)])
def test_gwc_gradients_equal_hand_computation(gain_value, compensate):
    torch.manual_seed(0)
    D = 16
    norm = NormAlignedLayerNorm(D, compensation=compensate, compensation_min=1e-3).double()
    with torch.no_grad():
        norm.weight.copy_(gain_value * (1 + 0.1 * torch.randn(D, dtype=torch.float64)))
        norm.bias.copy_(0.01 * torch.randn(D, dtype=torch.float64))
    x = (5 * torch.randn(3, 7, D, dtype=torch.float64)).requires_grad_()
    grad_y = torch.randn(3, 7, D, dtype=torch.float64)
    norm(x).backward(grad_y)
    expected_x, expected_g, expected_b = _hand_gradients(
        x.detach(), norm.weight.detach(), norm.bias.detach(), grad_y, norm.eps, 1e-3, compensate
    )
    # float64; the longest reduction on either side is the gain's and bias's gradient over 3 x 7 = 21 rows (D = 16
    # for dL/dx): a few eps of the largest term each, 4 * 21 eps allows for both sides and leaves a margin
    rtol = 4 * 21 * F64_EPS
    assert_close_scaled(x.grad, expected_x, rtol=rtol, what="dL/dx")
    assert_close_scaled(norm.weight.grad, expected_g, rtol=rtol, what="dL/dg")
    assert_close_scaled(norm.bias.grad, expected_b, rtol=rtol, what="dL/db")
    factor = float(norm.compensation_factor())
    assert factor == pytest.approx(1 / max(float(norm.weight.detach().abs().mean()), 1e-3))
    if gain_value == 1e-5:
        assert factor == pytest.approx(1e3)  # the clamp


def test_gwc_forward_is_plain_layernorm():
    torch.manual_seed(0)
    norm = NormAlignedLayerNorm(16)
    with torch.no_grad():
        norm.weight.fill_(0.03)
    x = torch.randn(2, 5, 16, requires_grad=True)
    expected = torch.nn.functional.layer_norm(x, (16,), norm.weight, norm.bias, norm.eps)
    assert torch.equal(norm(x), expected)


def test_gwc_under_torch_compile():
    torch.manual_seed(0)
    eager = NormAlignedLayerNorm(16)
    with torch.no_grad():
        eager.weight.fill_(0.02)
    compiled_module = NormAlignedLayerNorm(16)
    compiled_module.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_module, fullgraph=True)  # fullgraph: no graph break allowed
    x = torch.randn(2, 5, 16)
    grad_y = torch.randn(2, 5, 16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    eager(xa).backward(grad_y)
    compiled(xb).backward(grad_y)
    # inductor's fused kernels reduce over D = 16 (and 2 x 5 rows) in another order than eager's layer_norm backward
    rtol = 4 * 16 * F32_EPS
    assert_close_scaled(xb.grad, xa.grad, rtol=rtol, what="dL/dx, compiled vs eager")
    assert_close_scaled(compiled_module.weight.grad, eager.weight.grad, rtol=rtol, what="dL/dg, compiled vs eager")
    # the compensation is really applied under compile: 1/mean|g| = 50 times the plain LayerNorm's gradient
    plain = NormAlignedLayerNorm(16, compensation=False)
    plain.load_state_dict(eager.state_dict())
    xc = x.clone().requires_grad_()
    plain(xc).backward(grad_y)
    assert_close_scaled(xb.grad, 50.0 * xc.grad, rtol=rtol, what="compiled GWC vs 50 x plain LayerNorm")


def test_gwc_reaches_vision_tower_with_gradient_checkpointing(seed):
    config = make_config()
    plain = LlavaNormAlignedForConditionalGeneration(config).train()
    ckpt = LlavaNormAlignedForConditionalGeneration(config).train()
    ckpt.load_state_dict(plain.state_dict())
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    input_ids, pixel_values = make_inputs()
    for model in (plain, ckpt):
        model(input_ids=input_ids, pixel_values=pixel_values, labels=input_ids).loss.backward()
    # the same kernels recompute the same forward on the same inputs; at most the order in which a parameter's few
    # gradient contributions are accumulated differs. Scaled per parameter: some gradients here are ~1e-7 in all,
    # others ~100, so no one absolute tolerance fits
    for name, param in plain.named_parameters():
        other = dict(ckpt.named_parameters())[name]
        if param.grad is None:
            assert other.grad is None, name
            continue
        assert_close_scaled(other.grad, param.grad, rtol=16 * F32_EPS, what=f"{name}.grad, checkpointed")
    # GWC: with gain ~ T/sqrt(D), the vision tower's gradient is the uncompensated one times 1/mean|g|
    no_gwc = LlavaNormAlignedForConditionalGeneration(make_config(gradient_compensation=False)).train()
    no_gwc.load_state_dict(plain.state_dict())
    no_gwc(input_ids=input_ids, pixel_values=pixel_values, labels=input_ids).loss.backward()
    factor = float(plain.model.multi_modal_projector.norm.compensation_factor())
    w = "model.vision_tower.encoder.layers.0.mlp.fc1.weight"
    g_plain = dict(plain.named_parameters())[w].grad
    g_none = dict(no_gwc.named_parameters())[w].grad
    # scaling the gradient before the vision tower's backward or after it differs by the rounding of that backward
    # (reductions of up to 64 terms: SigLIP's MLP), relative to the gradient's largest element: elements near zero
    # by cancellation carry it too, so the tolerance is scaled to max|g|, not to each element
    assert_close_scaled(g_plain, g_none * factor, rtol=4 * 64 * F32_EPS, what=f"{w}.grad, GWC vs factor x plain")
    assert factor > 5


# ------------------------------------------------------------------------------------------------ forward/generate


def test_image_token_count_mismatch_is_a_clear_error(seed):
    model = LlavaNormAlignedForConditionalGeneration(make_config()).eval()
    input_ids, pixel_values = make_inputs()
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        model(input_ids=input_ids[:, 3:], pixel_values=pixel_values)  # one image token per row cut off


def test_sdpa_and_eager_agree(seed):
    config = make_config()
    from transformers import AutoModelForImageTextToText

    eager = AutoModelForImageTextToText.from_config(config, attn_implementation="eager").eval()
    sdpa = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa").eval()
    assert isinstance(eager, LlavaNormAlignedForConditionalGeneration)
    sdpa.load_state_dict(eager.state_dict())
    input_ids, pixel_values = make_inputs()
    with torch.no_grad():
        a = eager(input_ids=input_ids, pixel_values=pixel_values).logits
        b = sdpa(input_ids=input_ids, pixel_values=pixel_values).logits
    # two attention implementations: softmax(QK^T)V in another order; the longest reduction is the LLM MLP's 128
    assert_close_scaled(b, a, rtol=4 * 128 * F32_EPS, what="sdpa vs eager logits")


def test_base_model_is_the_auto_model(tiny_model_dir):
    from transformers import AutoModel

    base = AutoModel.from_pretrained(tiny_model_dir)
    assert isinstance(base, LlavaNormAlignedModel)
    assert base.multi_modal_projector.norm is not None


def _chat(processor, question: str, n_images: int = 1) -> str:
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": question}]
    return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)


def _images():
    return [Image.new("RGB", (40, 40), c) for c in ((255, 0, 0), (0, 0, 255), (0, 200, 0))]


def test_generate_with_cache_equals_without(tiny_model, tiny_processor):
    inputs = tiny_processor(images=_images()[:1], text=[_chat(tiny_processor, "what colour")], return_tensors="pt")
    with torch.no_grad():
        cached = tiny_model.generate(**inputs, max_new_tokens=6, do_sample=False, use_cache=True)
        uncached = tiny_model.generate(**inputs, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


def test_batched_padded_generation_equals_one_by_one(tiny_model, tiny_processor):
    prompts = [_chat(tiny_processor, "what colour"), _chat(tiny_processor, "how many shapes are there in the image")]
    images = _images()[:2]
    tiny_processor.tokenizer.padding_side = "left"
    batch = tiny_processor(images=images, text=prompts, return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()  # the prompts really differ in length
    with torch.no_grad():
        out = tiny_model.generate(**batch, max_new_tokens=5, do_sample=False)
    new = out[:, batch["input_ids"].shape[1]:]
    for i, (prompt, image) in enumerate(zip(prompts, images)):
        single = tiny_processor(images=[image], text=[prompt], return_tensors="pt")
        with torch.no_grad():
            ref = tiny_model.generate(**single, max_new_tokens=5, do_sample=False)
        assert torch.equal(new[i], ref[0, single["input_ids"].shape[1]:]), i


def test_several_images_per_prompt(tiny_model, tiny_processor):
    images = _images()
    inputs = tiny_processor(images=images, text=[_chat(tiny_processor, "compare", n_images=3)], return_tensors="pt")
    n_tokens = (inputs["input_ids"] == tiny_model.config.image_token_id).sum().item()
    assert n_tokens == 3 * tiny_model.config.image_seq_length
    with torch.no_grad():
        logits = tiny_model(**inputs).logits
        swapped = tiny_processor(images=images[::-1], text=[_chat(tiny_processor, "compare", 3)], return_tensors="pt")
        logits_swapped = tiny_model(**swapped).logits
    assert not torch.allclose(logits[0, -1], logits_swapped[0, -1])  # every image reaches the LLM, in order


def test_pipeline_image_text_to_text(tiny_model_dir):
    from transformers import pipeline

    pipe = pipeline("image-text-to-text", model=tiny_model_dir)
    messages = [{"role": "user", "content": [{"type": "image", "image": _images()[0]},
                                              {"type": "text", "text": "what colour"}]}]
    out = pipe(text=messages, max_new_tokens=4, do_sample=False)
    assert isinstance(out[0]["generated_text"], list)
    assert out[0]["generated_text"][-1]["role"] == "assistant"
