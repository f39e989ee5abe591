"""One module knows where a VLM's parts are: stock LLaVA, this package's model, PEFT-wrapped, and a model that lacks
a part (named in the error)."""

from __future__ import annotations

import re

import pytest
from torch import nn

from llava_normaligned.compose import stock_llava_like
from llava_normaligned.families.anatomy import (
    LLAVA,
    AnatomyError,
    anatomy_of,
    family_of,
    part_of,
)


def test_parts_of_the_norm_aligned_and_the_stock_model(tiny_model):
    ours = anatomy_of(tiny_model)
    assert ours.family.name == "llava_normaligned"
    assert ours.projector is tiny_model.model.multi_modal_projector
    assert ours.projector_norm is tiny_model.model.multi_modal_projector.norm
    assert ours.vision_tower is tiny_model.model.vision_tower
    assert ours.decoder_layers is tiny_model.model.language_model.layers
    assert ours.input_embeddings is tiny_model.get_input_embeddings()
    assert ours.image_token_id == tiny_model.config.image_token_id
    stock = anatomy_of(stock_llava_like(tiny_model))
    assert stock.family is LLAVA and stock.projector_norm is None and len(stock.decoder_layers) == len(
        ours.decoder_layers)
    # the base model on its own is understood too
    assert anatomy_of(tiny_model.model).projector is ours.projector


def test_parameter_names_map_to_parts_through_wrappers(tiny_model):
    counts = {}
    for name, _ in tiny_model.named_parameters():
        counts[part_of(name)] = counts.get(part_of(name), 0) + 1
        assert part_of("base_model.model." + name) == part_of("module." + name) == part_of(name)
    assert set(counts) == {"vision_tower", "projector", "llm"}
    assert part_of("model.multi_modal_projector.modules_to_save.default.norm.weight") == "projector"
    assert part_of("vision_tower.vision_model.embeddings.patch_embedding.weight") == "vision_tower"  # base-relative
    assert part_of("model.visual_thing.weight") is None


def test_peft_wrapped_model_gives_the_trained_projector_copy(tiny_model):
    peft = pytest.importorskip("peft")
    family = family_of(tiny_model.config)
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=family.lora_targets(),
                             modules_to_save=[family.projector_module_name])
    wrapped = peft.get_peft_model(tiny_model, config)
    anatomy = anatomy_of(wrapped)
    copies = wrapped.base_model.model.model.multi_modal_projector.modules_to_save
    assert anatomy.projector is copies["default"]
    assert anatomy.projector_norm is copies["default"].norm
    targeted = [n for n, m in wrapped.named_modules() if hasattr(m, "lora_A")]
    assert targeted and all(".language_model." in n for n in targeted)


def test_lora_targets_and_skip_modules_are_full_paths(tiny_model):
    names = [n for n, _ in tiny_model.named_modules()]
    llm = [n for n in names if re.fullmatch(LLAVA.lora_targets(), n)]
    both = [n for n in names if re.fullmatch(LLAVA.lora_targets(vision=True), n)]
    assert llm and all(n.startswith("model.language_model.") for n in llm)
    assert set(llm) < set(both) and any(n.startswith("model.vision_tower.") for n in both)
    for path in LLAVA.keep_unquantized():
        assert path in names  # bitsandbytes matches these from the start of the path


def test_a_model_without_a_part_is_named(tiny_model):
    class NoProjector(nn.Module):
        def __init__(self, model):
            super().__init__()
            self.config = model.config
            self.model = nn.Module()
            self.model.vision_tower = model.model.vision_tower
            self.model.language_model = model.model.language_model

        def get_input_embeddings(self):
            return self.model.language_model.get_input_embeddings()

    with pytest.raises(AnatomyError, match=r"no model\.multi_modal_projector"):
        anatomy_of(NoProjector(tiny_model), "broken")
