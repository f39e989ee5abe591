"""Stock VLMs of the families people fine-tune, at a benchmark's shape: the tiny model of ``llava_normaligned.tiny``
grown to a given LLM and vision width, with about as many image tokens per image as LLaVA-1.5's SigLIP-SO400M-384
(729), and a tokenizer in which the benchmark's words are one token each (so a row's length is what it would be in
a real vocabulary). The folder is laid out as the family's Hub checkpoints are; ``train`` and TRL's ``SFTTrainer``
load it alike.

Image tokens per image, by family (the mix665k rows' images are small squares, which every processor below resizes):

* Qwen2-VL, Qwen2.5-VL (patch 14, 2 x 2 merge): 756 x 756 px -> 54 x 54 patches -> 729 tokens;
* Qwen3-VL (patch 16, 2 x 2 merge): 864 x 864 px -> 729 tokens;
* SmolVLM (Idefics3's layout): 384 px cut into 4 x 4 tiles of 96 px plus the global image, 12 x 12 patches of 8 px
  per tile, pixel shuffle 2 -> 36 tokens a tile, 612 in all (plus the tile markers).

The chat templates are the tiny families' with ``{% generation %}`` markers around the assistant's turns, which
TRL's ``assistant_only_loss`` reads (this package finds the answers itself and does not need them).
"""

from __future__ import annotations

# LLM width, layers, heads, KV heads, MLP width; vision width, layers, heads, MLP width (bench_throughput's shapes)
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "smolvlm")

QWEN_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>{% endgeneration %}\n"
    "{% else %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SMOLVLM_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<end_of_utterance>{% endgeneration %}\n"
    "{% else %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<end_of_utterance>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def _with_words(tokenizer, words) -> None:
    """Each of ``words`` one token (added after the family's own, so its special tokens keep their ids)."""
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(word, single_word=True, lstrip=True, normalized=False) for word in words])


def _text(text: dict, text_shape, vocab_size: int) -> None:
    width, layers, heads, kv_heads, mlp = text_shape
    text.update(hidden_size=width, num_hidden_layers=layers, intermediate_size=mlp, num_attention_heads=heads,
                num_key_value_heads=kv_heads, head_dim=width // heads, vocab_size=vocab_size,
                max_position_embeddings=8192)
    text.pop("layer_types", None)  # derived again from the new depth
    rope = text.get("rope_parameters")
    if isinstance(rope, dict) and "mrope_section" in rope:  # M-RoPE: sections sum to head_dim / 2 (Qwen's 2:3:3)
        half = width // heads // 2
        quarter = half // 4
        rope["mrope_section"] = [quarter, (half - quarter) // 2, half - quarter - (half - quarter) // 2]


def build_family(family: str, text_shape: tuple, vision_shape: tuple, words, folder: str) -> str:
    """Write a stock ``family`` VLM (``FAMILIES``) at the given shape to ``folder``; returns it."""
    import torch
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from llava_normaligned.tiny import tiny_vlm

    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: the benchmark builds {', '.join(FAMILIES)}")
    tiny = tiny_vlm(family)
    _with_words(tiny.tokenizer, words)
    values = tiny.model.config.to_dict()
    _text(values["text_config"], text_shape, len(tiny.tokenizer))
    v_width, v_layers, v_heads, v_mlp = vision_shape
    vision = values["vision_config"]
    if family.startswith("qwen"):
        patch = 16 if family == "qwen3_vl" else 14
        side = 27 * 2 * patch  # 27 x 27 merged tokens
        vision.update(depth=v_layers, num_heads=v_heads, patch_size=patch)
        if family == "qwen2_vl":
            vision.update(embed_dim=v_width, hidden_size=text_shape[0], mlp_ratio=v_mlp // v_width)
        else:
            vision.update(hidden_size=v_width, intermediate_size=v_mlp, out_hidden_size=text_shape[0])
            if family == "qwen2_5_vl":
                vision.update(window_size=8 * patch, fullatt_block_indexes=[v_layers - 1])
            else:
                vision.update(num_position_embeddings=48 * 48, deepstack_visual_indexes=list(range(v_layers)))
        tiny.tokenizer.chat_template = QWEN_TEMPLATE
        tiny.image_processor = Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                                        min_pixels=side * side, max_pixels=side * side)
    else:
        from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

        vision.update(hidden_size=v_width, intermediate_size=v_mlp, num_hidden_layers=v_layers,
                      num_attention_heads=v_heads, image_size=96, patch_size=8)
        tiny.tokenizer.chat_template = SMOLVLM_TEMPLATE
        tiny.image_processor = SmolVLMImageProcessorPil(do_image_splitting=True, size={"longest_edge": 384},
                                                        max_image_size={"longest_edge": 96})
        tiny.processor_config = {**tiny.processor_config, "image_seq_len": (96 // 8) ** 2 // values["scale_factor"]**2}
    torch.manual_seed(0)
    tiny.model = type(tiny.model)(type(tiny.model.config).from_dict(values))
    return tiny.save(folder)


__all__ = ["FAMILIES", "build_family"]
