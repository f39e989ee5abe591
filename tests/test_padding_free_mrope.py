"""Padding-free batches for the multimodal-RoPE families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): each packed row gets the
3-D positions it has alone (``padding_free.multimodal_positions``), and the packed batch gives the padded batch's
loss and the gradient of every parameter group (vision tower, projector and its norm, LLM), for eager attention,
transformers' sdpa (block-diagonal mask) and the row-by-row sdpa; on the ``align`` folders and on a stock Qwen2-VL,
with rows of different lengths, several images and a text-only row, made by the family's real processor."""

from __future__ import annotations

import pytest
import torch

from llava_normaligned.cli import main as cli_main
from llava_normaligned.loading import load_model
from llava_normaligned.trainer.padding_free import (
    PACKED_SDPA,
    check_padding_free,
    multimodal_positions,
    row_bounds,
)
from tests.support.packing import (
    VARLEN,
    aligned_folders,
    assert_packed_trains_as_padded,
    padded_and_packed,
    set_attention,
)
from tests.support.training import write_llava_dataset

pytestmark = pytest.mark.usefixtures("one_thread")
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> its align folder; "stock_qwen2_vl" -> the stock model as transformers builds it."""
    return aligned_folders(tmp_path_factory.mktemp("mrope"), FAMILIES)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Image rows of one and two turns (different lengths) and text-only rows."""
    return write_llava_dataset(tmp_path_factory.mktemp("mrope_data"), n_rows=5, text_only=2, multi_turn_every=2)


@pytest.mark.parametrize("attn", ["eager", "sdpa", PACKED_SDPA, VARLEN])
@pytest.mark.parametrize("family", [*FAMILIES, "stock_qwen2_vl"])
def test_the_packed_batch_gives_the_padded_loss_and_every_group_s_gradient(family, attn, folders, data):
    """``VARLEN``: the rows flash attention's variable-length path would find in what the layers receive."""
    model, processor = load_model(folders[family], for_training=True)
    check_padding_free(model)
    set_attention(model, attn)
    padded, packed = padded_and_packed(model, processor, data)
    assert packed["input_ids"].shape[0] == 1 and packed["position_ids"].shape == packed["input_ids"].shape
    lengths = padded["attention_mask"].sum(1).tolist()
    assert len(set(lengths)) > 1 and int(padded["image_grid_thw"].shape[0]) == 3  # three images, uneven rows
    placed = multimodal_positions(model, packed)
    assert placed["position_ids"].shape == (4, 1, sum(lengths))
    # each row's 3-D positions are those it has in the padded batch (the model's own, row by row)
    own, _ = model.model.get_rope_index(padded["input_ids"], mm_token_type_ids=padded["mm_token_type_ids"],
                                        image_grid_thw=padded["image_grid_thw"],
                                        attention_mask=padded["attention_mask"])
    assert torch.equal(placed["position_ids"][1:, 0], own[:, padded["attention_mask"].bool()])
    assert [end - start for start, end in row_bounds(packed["position_ids"])] == lengths
    parts = ("vision_tower", "projector", "llm") + (() if family.startswith("stock") else ("projector_norm",))
    assert_packed_trains_as_padded(model, padded, placed, row_by_row=attn == PACKED_SDPA, parts=parts)


def test_without_its_own_positions_a_packed_row_trains_another_model(folders, data):
    """The check the parity rests on: the packed row with plain restarting positions (what the LLaVA path uses) is
    not the padded batch for M-RoPE."""
    model, processor = load_model(folders["qwen2_vl"], for_training=True)
    model.set_attn_implementation({"text_config": "eager"})
    padded, packed = padded_and_packed(model, processor, data)
    model.train()
    with torch.no_grad():
        plain = model(**packed).loss
        placed = model(**multimodal_positions(model, packed)).loss
        reference = model(**padded).loss
    torch.testing.assert_close(placed, reference, rtol=1e-5, atol=1e-6)
    assert abs(float(plain) - float(reference)) > 1e-4


def test_a_multimodal_rope_model_without_its_position_function_is_refused(folders, monkeypatch):
    model, _ = load_model(folders["stock_qwen2_vl"])
    monkeypatch.setattr(type(model.model), "get_rope_index", None)
    with pytest.raises(ValueError, match=r"--padding_free: qwen2_vl places image tokens with multimodal RoPE"):
        check_padding_free(model)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl", "stock_qwen2_vl"])
def test_train_runs_padding_free_and_length_grouped(family, folders, data, tmp_path):
    import json
    import os

    path, images = data
    out = str(tmp_path / "out")
    assert cli_main(["train", "--stage", "2", "--model", folders[family], "--data-path", path, "--image-folder",
                     images, "--output-dir", out, "--padding_free", "True", "--train_sampling_strategy",
                     "group_by_modality_length", "--max_steps", "2", "--per_device_train_batch_size", "3",
                     "--report_to", "none", "--save_strategy", "no", "--gradient_checkpointing", "False",
                     "--disable_tqdm", "True", "--logging_steps", "1"]) == 0
    with open(os.path.join(out, "training_summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    assert summary["training"]["padding_free"] is True
    assert summary["training"]["train_sampling_strategy"] == "group_by_modality_length"


def test_a_packed_batch_without_token_types_is_refused_not_placed_wrong(folders, data):
    model, processor = load_model(folders["qwen2_vl"], for_training=True)
    _, packed = padded_and_packed(model, processor, data)
    packed.pop("mm_token_type_ids")
    with pytest.raises(ValueError, match="need the processor's mm_token_type_ids"):
        multimodal_positions(model, packed)
