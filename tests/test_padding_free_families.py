"""Padding-free batches for the 1-D-RoPE families ``train`` takes besides LLaVA (Idefics3, LLaVA-NeXT,
LLaVA-OneVision, InternVL, SmolVLM; their ``align`` folders): the packed batch gives the padded batch's loss and the gradient
of every parameter group, for eager, sdpa and the row-by-row sdpa. Gemma3, whose image tokens attend to each other
both ways, is refused in one line: measured here, packing it would train another model."""

from __future__ import annotations

import pytest

from llava_normaligned.loading import load_model
from llava_normaligned.trainer.padding_free import PACKED_SDPA, check_padding_free
from tests.support.packing import (
    VARLEN,
    aligned_folders,
    assert_packed_trains_as_padded,
    group_agreement,
    loss_and_grads,
    padded_and_packed,
    set_attention,
)
from tests.support.training import write_llava_dataset

pytestmark = pytest.mark.usefixtures("one_thread")
PACKED = ("idefics3", "llava_next", "llava_onevision", "internvl", "smolvlm")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return aligned_folders(tmp_path_factory.mktemp("pf_families"), (*PACKED, "gemma3"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_llava_dataset(tmp_path_factory.mktemp("pf_families_data"), n_rows=5, text_only=2,
                               multi_turn_every=2)


@pytest.mark.parametrize("attn", ["eager", "sdpa", PACKED_SDPA, VARLEN])
@pytest.mark.parametrize("family", PACKED)
def test_the_packed_batch_gives_the_padded_loss_and_every_group_s_gradient(family, attn, folders, data):
    """``VARLEN``: the rows flash attention's variable-length path would find in what the layers receive."""
    model, processor = load_model(folders[family], for_training=True)
    check_padding_free(model)
    set_attention(model, attn)
    padded, packed = padded_and_packed(model, processor, data)
    assert len(set(padded["attention_mask"].sum(1).tolist())) > 1 and packed["input_ids"].shape[0] == 1
    assert_packed_trains_as_padded(model, padded, packed, row_by_row=attn == PACKED_SDPA,
                                   parts=("vision_tower", "projector", "projector_norm", "llm"))


def test_gemma3_is_refused_because_packing_it_would_train_another_model(folders, data):
    model, processor = load_model(folders["gemma3"], for_training=True)
    with pytest.raises(ValueError, match=r"--padding_free: gemma3: each image's tokens attend to each other both ways"):
        check_padding_free(model)
    model.set_attn_implementation({"text_config": "eager"})
    padded, packed = padded_and_packed(model, processor, data)
    for param in model.parameters():
        param.requires_grad_(True)
    model.train()
    _, grads_padded = loss_and_grads(model, padded)
    _, grads_packed = loss_and_grads(model, packed)
    worst = max(relative for _, relative in group_agreement(model, grads_packed, grads_padded).values())
    assert worst > 1e-3  # what the refusal prevents
