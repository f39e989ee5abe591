"""An estimate of the memory a diagnostics run needs, from a model's config alone (no weights are read).

    peak ~= weights + the largest activations of one pass, +10 % for the allocator

where the passes hold at most: two KV caches (the reference run's, kept while each alpha run builds its own), the
eager attention probabilities of one layer (fp32, three copies: scores, softmax, the tap's copy), three fp32
residual-stream tensors (h_0, h_{l-1}, h_l), one MLP intermediate, and fp32 logits at the scored positions. It is an
estimate: allocator fragmentation and framework buffers vary.

``python -m llava_normaligned.diagnostics.memory`` prints the table of docs/diagnostics.md for reference
architectures, built from their published dimensions on the meta device, and the time table: the FLOPs of one
``diagnose`` prompt of the blog's two models (``diagnose_prompt_flops``) over the CPU FLOP rate measured on tiny
models of the same classes by ``benchmarks/bench_diagnose_cpu.py`` (``assets/diagnose_cpu_rate.json``).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

import torch

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PROMPT_TOKENS = 64  # chat template + a one-line prompt


@dataclass
class MemoryEstimate:
    parameters: int
    weights_bytes: int
    activation_bytes: int
    sequence_length: int

    @property
    def total_bytes(self) -> int:
        return int(1.1 * (self.weights_bytes + self.activation_bytes))

    def describe(self) -> str:
        gib = 2**30
        return (
            f"{self.parameters / 1e9:.2f}B parameters: weights {self.weights_bytes / gib:.1f} GiB + activations "
            f"{self.activation_bytes / gib:.1f} GiB (sequence {self.sequence_length}) ~= {self.total_bytes / gib:.1f} "
            "GiB (estimate)"
        )


def count_parameters(config, trust_remote_code: bool = True) -> int:
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config, trust_remote_code=trust_remote_code)
    return sum(p.numel() for p in model.parameters())


# Image sizes assumed where the number of image tokens depends on the image (stated in docs/diagnostics.md):
DYNAMIC_IMAGE_SIDE = 768  # Qwen2/2.5/3-VL: a 768 x 768 image
IDEFICS_TILES = 17  # Idefics3 / SmolVLM: the processor's default split of a large image, 4 x 4 tiles + the global one
DEFAULT_IMAGE_TOKENS = 576


def image_tokens(config) -> int:
    """Image tokens of one image entering the LLM, from the config: LLaVA/PaliGemma ``image_seq_length``, Gemma3
    ``mm_tokens_per_image``, Idefics3/SmolVLM (patches per tile / scale_factor^2) x ``IDEFICS_TILES``, Qwen-VL
    (``DYNAMIC_IMAGE_SIDE`` / (patch x spatial merge))^2; otherwise ``DEFAULT_IMAGE_TOKENS``."""
    for owner in (config, config.get_text_config()):  # PaliGemma keeps num_image_tokens in its text config
        for key in ("image_seq_length", "mm_tokens_per_image", "num_image_tokens"):
            value = getattr(owner, key, None)
            if isinstance(value, int) and value > 0:
                return value
    vision = getattr(config, "vision_config", None)
    patch = getattr(vision, "patch_size", None)
    if isinstance(getattr(config, "scale_factor", None), int) and patch:  # Idefics3, SmolVLM: pixel shuffle
        per_tile = (vision.image_size // patch) ** 2 // config.scale_factor**2
        return per_tile * IDEFICS_TILES
    # Qwen2/2.5/3-VL (vision_config) and Mistral3 (top level): dynamic resolution, merge x merge patches per token
    merge = getattr(vision, "spatial_merge_size", None) or getattr(config, "spatial_merge_size", None)
    if merge and patch:
        return (DYNAMIC_IMAGE_SIDE // (patch * merge)) ** 2
    stride = getattr(vision, "hidden_stride", None)
    if stride and patch:  # Ovis2: one fixed-size image, stride x stride patches per visual token
        return (vision.image_size // patch // stride) ** 2
    return DEFAULT_IMAGE_TOKENS


def estimate(config, dtype: str = "bfloat16", batch_size: int = 1, new_tokens: int = 8, parameters=None):
    """A ``MemoryEstimate`` for a vision-language ``config`` of any family (its text config by
    ``get_text_config()``, its image tokens by ``image_tokens``)."""
    if dtype not in BYTES:
        raise ValueError(f"dtype must be one of {sorted(BYTES)}, got {dtype!r}")
    size = BYTES[dtype]
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    sequence = image_tokens(config) + PROMPT_TOKENS + new_tokens
    b = batch_size
    kv_caches = 2 * (2 * text.num_hidden_layers * b * kv_heads * sequence * head_dim * size)
    attention = 3 * b * heads * sequence * sequence * 4
    residual = 3 * b * sequence * text.hidden_size * 4
    mlp = 3 * b * sequence * text.intermediate_size * size
    logits = 3 * b * new_tokens * text.vocab_size * 4
    parameters = parameters if parameters is not None else count_parameters(config)
    return MemoryEstimate(
        parameters=parameters,
        weights_bytes=parameters * size,
        activation_bytes=kv_caches + attention + residual + mlp + logits,
        sequence_length=sequence,
    )


# ------------------------------------------------------------------------------------- reference architectures


def _siglip_so400m_384() -> dict:
    return dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                num_attention_heads=16, image_size=384, patch_size=14)


def _clip_l_336() -> dict:
    return dict(model_type="clip_vision_model", hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                num_attention_heads=16, image_size=336, patch_size=14, projection_dim=768)


REFERENCE_ARCHITECTURES = {
    # name: (vision config, text config, image tokens) from the models' published config.json values
    "SigLIP-so400m-384 + Qwen2.5-1.5B": (_siglip_so400m_384(), dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True), 729),
    "SigLIP-so400m-384 + Llama-3.2-3B (paper)": (_siglip_so400m_384(), dict(
        model_type="llama", hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=True), 729),
    "LLaVA-1.5-7B (CLIP-L-336 + Vicuna-7B)": (_clip_l_336(), dict(
        model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32064), 576),
    "SigLIP-so400m-384 + Qwen2.5-7B (paper)": (_siglip_so400m_384(), dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064), 729),
}


def _smolvlm2_2b():
    """SmolVLM2-2.2B-Instruct (the blog's first model): transformers' ``SmolVLMConfig`` with the published values of
    HuggingFaceTB/SmolVLM2-2.2B-Instruct: a SigLIP-so400m encoder at 384 px, patch 14 (its model card: "81 visual
    tokens to encode image patches of size 384x384", i.e. 27 x 27 patches / scale_factor 3 squared), and the
    SmolLM2-1.7B decoder (Llama: 2048 wide, 24 layers, 32 heads, no GQA, vocabulary 49280)."""
    from transformers import SmolVLMConfig

    return SmolVLMConfig(
        vision_config=dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16,
                           image_size=384, patch_size=14),
        text_config=dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=49280,
                         max_position_embeddings=16384, tie_word_embeddings=False),
        scale_factor=3,
        tie_word_embeddings=False,
    )


def _qwen3_vl_2b():
    """Qwen3-VL-2B-Instruct (the blog's second model): transformers' ``Qwen3VLConfig`` with the published values of
    Qwen/Qwen3-VL-2B-Instruct's config.json: a 24-layer, 1024-wide ViT (patch 16, 2 x 2 spatial merge, deepstack
    from vision layers 5, 11, 17, 2304 position embeddings) and a Qwen3-1.7B-sized decoder (2048 wide, 28 layers,
    16 heads, 8 KV heads, head_dim 128, MLP 6144, vocabulary 151936, tied embeddings)."""
    from transformers import Qwen3VLConfig

    return Qwen3VLConfig(
        vision_config=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=2048,
                           num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17]),
        text_config=dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                         num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=262144,
                         tie_word_embeddings=True),
        tie_word_embeddings=True,
    )


# the blog's two models, built with their own families' config classes
OTHER_ARCHITECTURES = {
    "SmolVLM2-2.2B-Instruct (blog; 17 tiles of 81 tokens)": _smolvlm2_2b,
    f"Qwen3-VL-2B-Instruct (blog; {DYNAMIC_IMAGE_SIDE} px image)": _qwen3_vl_2b,
}


def reference_names() -> list[str]:
    return list(REFERENCE_ARCHITECTURES) + list(OTHER_ARCHITECTURES)


def reference_config(name: str):
    from transformers import LlavaConfig

    if name in OTHER_ARCHITECTURES:
        return OTHER_ARCHITECTURES[name]()
    vision, text, tokens = REFERENCE_ARCHITECTURES[name]
    strategy = "full" if vision["model_type"].startswith("siglip") else "default"
    return LlavaConfig(vision_config=vision, text_config=text, image_seq_length=tokens,
                       vision_feature_select_strategy=strategy)


def reference_table(batch_sizes=(1, 4)) -> str:
    lines = ["| architecture | parameters | " + " | ".join(f"bf16, batch {b}" for b in batch_sizes)
             + f" | fp32, batch {batch_sizes[0]} |", "|---|---|" + "---|" * (len(batch_sizes) + 1)]
    for name in reference_names():
        config = reference_config(name)
        parameters = count_parameters(config)
        cells = [estimate(config, "bfloat16", b, parameters=parameters) for b in batch_sizes]
        cells.append(estimate(config, "float32", batch_sizes[0], parameters=parameters))
        lines.append(f"| {name} | {parameters / 1e9:.2f}B | "
                     + " | ".join(f"{c.total_bytes / 2**30:.1f} GiB" for c in cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ time (FLOPs)

VISION_PREFIXES = ("visual.", "vision_tower.", "vision_model.", "vision_encoder.")
# the measured CPU FLOP rate of tiny models of each family (benchmarks/bench_diagnose_cpu.py writes it)
CPU_RATE_RECORD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets",
                               "diagnose_cpu_rate.json")


@dataclass
class PassShape:
    """What one forward pass of ``config`` multiplies, counted on the meta device."""

    vision_parameters: int  # the vision encoder (Qwen's merger included)
    llm_parameters: int  # decoder layers and connector: every parameter that multiplies each token, no embeddings
    vocab_size: int
    hidden_size: int
    num_layers: int
    attention_width: int  # heads x head_dim
    vision_layers: int
    vision_width: int
    image_tokens: int  # entering the LLM
    patches_per_block: int  # vision tokens attending to each other (one tile, or the whole image)
    vision_blocks: int


def _vision_layers_width(vision) -> tuple[int, int]:
    layers = getattr(vision, "num_hidden_layers", None) or getattr(vision, "depth", None) or 0
    return int(layers), int(getattr(vision, "hidden_size", 0) or 0)


def pass_shape(config) -> PassShape:
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    embeddings = {id(p) for p in model.get_input_embeddings().parameters()}
    embeddings |= {id(p) for p in model.get_output_embeddings().parameters()}
    vision = llm = 0
    for name, p in model.named_parameters():
        if id(p) in embeddings:
            continue
        if any(f".{prefix}" in f".{name}" for prefix in VISION_PREFIXES):
            vision += p.numel()
        else:
            llm += p.numel()
    text, vision_config = config.get_text_config(), config.vision_config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    tokens = image_tokens(config)
    patch = vision_config.patch_size
    if isinstance(getattr(config, "scale_factor", None), int):  # Idefics3 / SmolVLM: tiles, pixel shuffle
        per_block, blocks = (vision_config.image_size // patch) ** 2, IDEFICS_TILES
    elif merge := getattr(vision_config, "spatial_merge_size", None) or getattr(config, "spatial_merge_size", None):
        per_block, blocks = tokens * merge**2, 1  # Qwen-VL, Mistral3: one image, merge^2 patches per token
    else:  # LLaVA, Gemma3, ...: one fixed-size image
        per_block, blocks = (vision_config.image_size // patch) ** 2, 1
    layers, width = _vision_layers_width(vision_config)
    return PassShape(vision, llm, text.vocab_size, text.hidden_size, text.num_hidden_layers, heads * head_dim,
                     layers, width, tokens, per_block, blocks)


def pass_flops(shape: PassShape, sequence: int, with_image: bool = True, scored: int = 1, cached: int = 0) -> float:
    """Multiply-add FLOPs (2 per MAC) of one forward pass over ``sequence`` new tokens after ``cached`` ones: the
    matmuls of the vision encoder (when ``with_image``), of the decoder, its attention scores and mixing, and the LM
    head at ``scored`` positions. Norms, activations and RoPE are left out (a few per cent)."""
    flops = 2.0 * shape.llm_parameters * sequence + 4.0 * shape.num_layers * sequence * (sequence + cached) \
        * shape.attention_width + 2.0 * shape.vocab_size * shape.hidden_size * scored
    if with_image:
        patches = shape.patches_per_block * shape.vision_blocks
        flops += 2.0 * shape.vision_parameters * patches
        flops += 4.0 * shape.vision_layers * shape.vision_blocks * shape.patches_per_block**2 * shape.vision_width
    return flops


def diagnose_prompt_flops(shape: PassShape, new_tokens: int = 8, alphas: int = 8) -> float:
    """FLOPs of one prompt of ``diagnose`` (runner.py's passes): the greedy prefill and n-1 cached steps; the
    reference pass and one pass per alpha over prompt + n-1 tokens; the blank-image and no-image passes; the KV
    substitution's two prefix passes and three cached steps."""
    prompt = shape.image_tokens + PROMPT_TOKENS
    forced = prompt + new_tokens - 1
    flops = pass_flops(shape, prompt)  # greedy prefill
    flops += (new_tokens - 1) * pass_flops(shape, 1, False, cached=prompt)
    flops += (1 + alphas) * pass_flops(shape, forced, scored=new_tokens)
    flops += pass_flops(shape, prompt) + pass_flops(shape, PROMPT_TOKENS, with_image=False)  # blank, no image
    flops += 2 * pass_flops(shape, prompt - 1) + 3 * pass_flops(shape, 1, False, cached=prompt - 1)
    return flops


def cpu_rates() -> dict:
    """family model_type -> the measured record (``benchmarks/bench_diagnose_cpu.py``); {} before it has run."""
    if not os.path.isfile(CPU_RATE_RECORD):
        return {}
    with open(CPU_RATE_RECORD, encoding="utf-8") as f:
        return json.load(f)["families"]


def time_table() -> str:
    """Extrapolated CPU seconds per ``diagnose`` prompt of the blog's two models: the FLOPs of one prompt at full
    size over the FLOP rate measured on a tiny model of the same classes (an extrapolation, not a measurement)."""
    rates = cpu_rates()
    lines = ["| model | FLOPs per prompt | tiny model of the same classes: measured s per pass (GFLOP/s) "
             "| CPU time per prompt, extrapolated |", "|---|---|---|---|"]
    for name in OTHER_ARCHITECTURES:
        config = reference_config(name)
        record = rates.get(config.model_type)
        flops = diagnose_prompt_flops(pass_shape(config))
        if record is None:
            lines.append(f"| {name} | {flops / 1e12:.1f} TFLOP | not measured | n/a |")
            continue
        rate = record["flops_per_pass"] / record["seconds_per_pass"]
        lines.append(f"| {name} | {flops / 1e12:.1f} TFLOP | {record['seconds_per_pass']:.3f} s "
                     f"({rate / 1e9:.1f}) | {flops / rate / 60:.0f} min |")
    return "\n".join(lines)


def make_parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description="Print the memory table of docs/diagnostics.md (estimates).")


def main(argv: list[str] | None = None) -> int:
    make_parser().parse_args(argv)
    print(reference_table())
    print()
    print(time_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
