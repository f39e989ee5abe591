"""The checkpoint a stage starts from: ``load_checkpoint`` (the package's loader) refuses a checkpoint that lacks
weights, norm-aligned or stock LLaVA; only a norm-aligned checkpoint's projector norm may be missing (it is initialised
to T/sqrt(D))."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from llava_normaligned.compose import stock_llava_like
from llava_normaligned.trainer.stage_model import load_checkpoint


def _drop_weights(folder, predicate) -> list[str]:
    path = folder / "model.safetensors"
    weights = load_file(path)
    dropped = sorted(k for k in weights if predicate(k))
    save_file({k: v for k, v in weights.items() if k not in dropped}, path, metadata={"format": "pt"})
    return dropped


def test_norm_aligned_checkpoint_without_its_norm_loads_with_the_target_gain(tiny_model_dir, tmp_path):
    folder = tmp_path / "no_norm"
    shutil.copytree(tiny_model_dir, folder)
    dropped = _drop_weights(folder, lambda k: "multi_modal_projector.norm." in k)
    assert dropped == ["model.multi_modal_projector.norm.bias", "model.multi_modal_projector.norm.weight"]
    model, _ = load_checkpoint(str(folder))
    norm = model.model.multi_modal_projector.norm
    gain = model.config.norm_target / math.sqrt(model.config.text_config.hidden_size)  # paper §5.1
    torch.testing.assert_close(norm.weight, torch.full_like(norm.weight, gain))
    assert not norm.bias.any()


def test_norm_aligned_checkpoint_missing_another_weight_is_refused(tiny_model_dir, tmp_path):
    folder = tmp_path / "no_linear"
    shutil.copytree(tiny_model_dir, folder)
    _drop_weights(folder, lambda k: k.endswith("multi_modal_projector.linear_1.weight"))
    with pytest.raises(ValueError, match="linear_1.weight"):
        load_checkpoint(str(folder))


def test_stock_llava_checkpoint_missing_a_weight_is_refused(tiny_model, tiny_processor, tmp_path):
    folder = tmp_path / "stock"
    stock_llava_like(tiny_model).save_pretrained(folder)
    tiny_processor.save_pretrained(folder)
    assert type(load_checkpoint(str(folder))[0]).__name__ == "LlavaForConditionalGeneration"  # whole: loads
    dropped = _drop_weights(folder, lambda k: "linear_1.weight" in k)
    assert len(dropped) == 1
    with pytest.raises(ValueError, match="lacks weights the model needs"):
        load_checkpoint(str(folder))
