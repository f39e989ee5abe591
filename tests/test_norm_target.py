"""T, the alignment target (paper §5.1), is one number for one checkpoint: compose, convert, the training's norm
tracking, the model card, diagnose and the model itself all report the same value, with the image token's row
left out (it is never an input of the LLM)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoProcessor

from llava_normaligned.compose import compose, convert_from_llava, save, stock_llava_like
from llava_normaligned.diagnostics.probes import text_embedding_norm as diagnose_text_norm
from llava_normaligned.families.probe_points import locate
from llava_normaligned.hub_cards.card import norm_statistics, read_checkpoint
from llava_normaligned.part_metrics import text_embedding_norm as tracked_text_norm
from modeling_llava_normaligned import (
    LlavaNormAlignedForConditionalGeneration,
    model_norm_target,
    text_embedding_norm_target,
)


@pytest.fixture(scope="module")
def composed(tiny_parts, tmp_path_factory):
    folder = tmp_path_factory.mktemp("t_composed")
    model, processor = compose(*tiny_parts)
    save(model, processor, str(folder))
    return folder


def test_every_command_reports_the_same_T(composed, tmp_path):
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(composed).eval()
    processor = AutoProcessor.from_pretrained(composed)
    image_id = model.config.image_token_id
    embeddings = model.get_input_embeddings().weight.detach()
    # compose added the image token (a mean-resized row): counting it would give another number, so the test can fail
    assert 0 <= image_id < embeddings.shape[0]
    with_image_row = text_embedding_norm_target(embeddings)

    reported = {
        "compose (config.norm_target)": model.config.norm_target,
        "the model (model_norm_target)": model_norm_target(model),
        "norm tracking (norm/text_embedding_norm)": tracked_text_norm(model),
        "model card (T measured)": norm_statistics(read_checkpoint(composed))[1]["T_now"],
        "diagnose (RQ1 T)": diagnose_text_norm(locate(model), processor.tokenizer, top_k=3)["T"],
    }
    # convert: a stock LLaVA with the same weights (its image row included) turned back into a norm-aligned one
    stock_dir = tmp_path / "stock"
    stock_llava_like(model).save_pretrained(stock_dir)
    processor.save_pretrained(stock_dir)
    converted, _ = convert_from_llava(str(stock_dir))
    reported["convert (config.norm_target)"] = converted.config.norm_target

    reference = reported["compose (config.norm_target)"]
    for source, value in reported.items():
        assert value == pytest.approx(reference, rel=1e-6), source
    assert with_image_row != pytest.approx(reference, rel=1e-6)


def test_the_norm_tracking_logs_it_under_peft(composed):
    """The tracked T and the projector found under PEFT's wrappers are the plain model's."""
    peft = pytest.importorskip("peft")
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(composed)
    reference = model.config.norm_target
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=r".*language_model.*\.(q_proj|v_proj)",
                             modules_to_save=["multi_modal_projector"])
    wrapped = peft.get_peft_model(model, config)
    assert tracked_text_norm(wrapped) == pytest.approx(reference, rel=1e-6)
    with torch.no_grad():
        from llava_normaligned.families.anatomy import anatomy_of

        norm = anatomy_of(wrapped).projector_norm
        assert norm is not None and norm.weight.requires_grad  # the trained copy, not the frozen original
