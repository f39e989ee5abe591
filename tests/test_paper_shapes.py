"""`compose` at the paper's two shapes (paper §5.2): SigLIP-SO400M-patch14-384 with Llama-3.2-3B-Instruct and with
Qwen2.5-7B, from their published configs written out here (no download). The models are built on the meta device;
only what each check reads is materialised: the LLM's input embeddings (T is measured from them) and the projector
(its norm's gain, and one pass of 729 image tokens through it). Checked: 729 image tokens per image in the processor
and the config, T from the embeddings, gain T / sqrt(D) with D = 3072 / 3584, vision tokens leaving the projector
with the text embeddings' norm, and the parameter count of the memory estimate's reference architecture."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

# google/siglip-so400m-patch14-384, vision half of config.json
SIGLIP_SO400M_384 = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                         image_size=384, patch_size=14, num_channels=3, hidden_act="gelu_pytorch_tanh",
                         layer_norm_eps=1e-6, attention_dropout=0.0)
# meta-llama/Llama-3.2-3B-Instruct config.json
LLAMA_32_3B = dict(model_type="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                   num_attention_heads=24, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                   max_position_embeddings=131072, rms_norm_eps=1e-5, hidden_act="silu", initializer_range=0.02,
                   rope_theta=500000.0, rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                   tie_word_embeddings=True, bos_token_id=128000, eos_token_id=[128001, 128008, 128009])
# Qwen/Qwen2.5-7B config.json
QWEN25_7B = dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, max_position_embeddings=131072,
                 rms_norm_eps=1e-6, hidden_act="silu", initializer_range=0.02, rope_theta=1000000.0,
                 sliding_window=131072, use_sliding_window=False, tie_word_embeddings=False,
                 bos_token_id=151643, eos_token_id=151643)

SHAPES = {
    "llama3.2-3b": (LLAMA_32_3B, "SigLIP-so400m-384 + Llama-3.2-3B (paper)", 3.65e9),
    "qwen2.5-7b": (QWEN25_7B, "SigLIP-so400m-384 + Qwen2.5-7B (paper)", 8.06e9),
}


def _parts(text_config: dict):
    """The vision tower and the LLM on the meta device, the LLM's embeddings materialised (bf16, its init)."""
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        SiglipImageProcessor,
        SiglipVisionConfig,
        SiglipVisionModel,
    )

    from llava_normaligned.tiny import train_tokenizer

    vision_config = SiglipVisionConfig(**SIGLIP_SO400M_384)
    text = dict(text_config)
    llm_config = AutoConfig.for_model(text.pop("model_type"), **text)
    with torch.device("meta"):
        vision_tower = SiglipVisionModel(vision_config)
        llm = AutoModelForCausalLM.from_config(llm_config, dtype=torch.bfloat16)
    rows = torch.empty(llm_config.vocab_size, llm_config.hidden_size, dtype=torch.bfloat16)
    rows.normal_(0.0, llm_config.initializer_range, generator=torch.Generator().manual_seed(0))
    llm.get_input_embeddings().weight = torch.nn.Parameter(rows)
    if llm_config.tie_word_embeddings:
        llm.tie_weights()
    # the image processor of google/siglip-so400m-patch14-384 (preprocessor_config.json)
    image_processor = SiglipImageProcessor(size={"height": 384, "width": 384}, resample=3, do_normalize=True,
                                           image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return vision_config, vision_tower, llm, train_tokenizer(), image_processor


@pytest.mark.slow  # 99-135 s each on the loaded 2-core machine (building and measuring 0.4-0.5G embeddings)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_compose_at_the_papers_shapes(shape):
    from llava_normaligned.compose import compose_parts
    from llava_normaligned.diagnostics.memory import count_parameters, reference_config
    from modeling_llava_normaligned import text_embedding_norm_target

    text_config, reference_name, parameters = SHAPES[shape]
    vision_config, vision_tower, llm, tokenizer, image_processor = _parts(text_config)
    embeddings = llm.get_input_embeddings().weight
    model, processor = compose_parts(vision_config, vision_tower, llm, tokenizer, image_processor,
                                     vision_name="google/siglip-so400m-patch14-384", text_name=shape,
                                     dtype=torch.bfloat16)
    config = model.config
    D = text_config["hidden_size"]

    # 729 image tokens: (384 / 14)^2 patches, SigLIP has no CLS token, all of them go to the LLM
    assert config.image_seq_length == 729 and config.vision_feature_select_strategy == "full"
    assert config.vision_feature_layer == -2 and config.text_config.hidden_size == D
    batch = processor(images=[Image.new("RGB", (640, 480), (200, 30, 30))], text=["<image>\ndescribe"],
                      return_tensors="pt")
    assert tuple(batch["pixel_values"].shape) == (1, 3, 384, 384)
    assert int((batch["input_ids"] == config.image_token_id).sum()) == 729

    # T measured from the embedding rows (non-zero rows, paper §5.1), not assumed
    norms = torch.cat([rows.float().norm(dim=-1) for rows in embeddings.detach().split(8192)])  # (V,)
    expected_t = float(norms[norms > 1e-6].mean())
    assert config.norm_target == pytest.approx(expected_t, rel=1e-6)
    assert config.norm_target == pytest.approx(text_embedding_norm_target(embeddings), rel=1e-6)
    assert config.norm_target == pytest.approx(0.02 * math.sqrt(D), rel=0.01)  # N(0, 0.02) rows: 0.02 sqrt(D)

    # gain T / sqrt(D), in the projector that compose materialised; the LLM's layers stay on the meta device
    norm = model.model.multi_modal_projector.norm
    assert norm.weight.shape == (D,) and norm.weight.device.type == "cpu"
    torch.testing.assert_close(norm.weight.float(), torch.full((D,), config.norm_target / math.sqrt(D)),
                               rtol=1e-2, atol=0)  # bf16
    assert next(model.model.language_model.layers.parameters()).device.type == "meta"
    # 729 vision features through the projector leave with the text embeddings' norm T
    projector = model.model.multi_modal_projector.float()
    features = torch.randn(1, 729, vision_config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tokens = projector(features)  # (1, 729, D)
    assert tokens.shape == (1, 729, D)
    assert float(tokens.norm(dim=-1).mean()) == pytest.approx(config.norm_target, rel=0.01)

    # the memory estimate's reference architecture (README table: stock LLaVA) plus the norm
    total = sum(p.numel() for p in model.parameters())
    assert total == count_parameters(reference_config(reference_name)) + 2 * D  # + the norm's gain and bias
    assert total == pytest.approx(parameters, rel=0.01)
