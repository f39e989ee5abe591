"""An estimate of the memory a diagnostics run needs, from a model's config alone (no weights are read).

    peak ~= weights + the largest activations of one pass, +10 % for the allocator

where the passes hold at most: two KV caches (the reference run's, kept while each alpha run builds its own), the
eager attention probabilities of one layer (fp32, three copies: scores, softmax, the tap's copy), three fp32
residual-stream tensors (h_0, h_{l-1}, h_l), one MLP intermediate, and fp32 logits at the scored positions. It is an
estimate: allocator fragmentation and framework buffers vary.

``training_estimate`` does the same for training a stage (weights, gradients and AdamW's moments of the trained
parameters, the activations the backward keeps).

``python .ci/doc_tables.py`` prints the table of docs/diagnostics.md for reference
architectures, built from their published dimensions on the meta device, the training table of the paper's shape
(README), and the time table: the FLOPs of one
``diagnose`` prompt of the blog's two models (``diagnose_prompt_flops``) over the CPU FLOP rate measured on tiny
models of the same classes by ``benchmarks/bench_diagnose_cpu.py`` (``assets/diagnose_cpu_rate.json``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from llava_normaligned.families.sizes import DYNAMIC_IMAGE_SIDE, IDEFICS_TILES, image_tokens

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


# ------------------------------------------------------------------------------------------ training

TRAINING_SEQUENCE = 761  # a LLaVA-558K row at 729 image tokens: the image and a caption with its template


@dataclass
class TrainingMemory:
    """What one process holds while training a stage (``training_estimate``)."""

    parameters: int
    trainable: int
    weights_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    sequence_length: int
    logits_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return int(1.1 * (self.weights_bytes + self.gradient_bytes + self.optimizer_bytes + self.activation_bytes
                          + self.logits_bytes))

    def describe(self) -> str:
        gib = 2**30
        logits = f" + logits {self.logits_bytes / gib:.1f}" if self.logits_bytes else ""
        return (f"{self.parameters / 1e9:.2f}B parameters ({self.trainable / 1e6:.1f}M trained): weights "
                f"{self.weights_bytes / gib:.1f} + gradients {self.gradient_bytes / gib:.1f} + AdamW "
                f"{self.optimizer_bytes / gib:.1f} + activations {self.activation_bytes / gib:.1f}{logits} GiB "
                f"(sequence {self.sequence_length}) ~= {self.total_bytes / gib:.1f} GiB (estimate)")


def _part_sizes(config, lora_rank: int | None) -> dict:
    """Parameters of each part of a LLaVA-style ``config`` (meta device) and, with ``lora_rank``, of LoRA adapters on
    the LLM's attention and MLP linear layers (``anatomy.LLAVA.llm_linear_names``, what ``train --use_peft``
    targets)."""
    from transformers import AutoModelForImageTextToText

    from llava_normaligned.families.anatomy import LLAVA

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    sizes = {"vision_tower": 0, "projector": 0, "llm": 0, "lora": 0, "llm_linear": 0}
    for name, param in model.named_parameters():
        sizes[LLAVA.part_of(name) or "llm"] += param.numel()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and LLAVA.part_of(name) == "llm" \
                and name.rsplit(".", 1)[-1] in LLAVA.llm_linear_names:
            sizes["llm_linear"] += module.in_features * module.out_features
            if lora_rank:
                sizes["lora"] += lora_rank * (module.in_features + module.out_features)
    return sizes


# bytes a parameter of each optimizer's state: AdamW's two moments in the parameter's dtype (as torch keeps them);
# bitsandbytes' 8-bit AdamW two 1-byte moments plus a float32 scale per block of 256 values
OPTIMIZER_STATE_BYTES = {"adamw": None, "adamw_8bit": 2 + 2 * 4 / 256}
# bitsandbytes NF4 with double quantization (``loading.quantization_config("4bit")``): 4 bits a weight, an 8-bit scale
# per block of 64, and a float32 scale per 256 of those
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)
LOGIT_BYTES = 10  # a position's logits while the loss runs: bf16 logits, their float32 copy, the float32 log-softmax


def training_estimate(config, *, stage: int, weight_dtype: str = "bfloat16", compute_dtype: str | None = None,
                      batch_size: int = 1, sequence: int = TRAINING_SEQUENCE, lora_rank: int | None = None,
                      checkpointing: bool = True, optimizer: str = "adamw", quantized_llm: bool = False,
                      full_logits: bool = False) -> TrainingMemory:
    """The memory of training one LLaVA-1.5 stage of ``config`` in one process: weights (``weight_dtype``), the
    trained parameters' gradients and AdamW's two moments (in the parameters' dtype, as torch keeps them), and the
    activations the backward keeps for ``batch_size`` rows of ``sequence`` tokens (``compute_dtype``: the autocast
    dtype, else the weights'). Stage 1 trains the projector, stage 2 everything, or the projector and LoRA adapters
    of rank ``lora_rank`` on the LLM. The LLM's activations are kept in every stage (the projector's gradient flows
    back through it); the vision tower's only when it trains. Per token and layer a Llama-style decoder keeps about
    6 x width + 2 x KV width + 4 x MLP width values (norm outputs, q/k/v, attention output, residual; gate, up and
    their product), a ViT layer 7 x width + 2 x MLP width; with ``checkpointing`` only each layer's input is kept,
    plus one layer's activations while it is recomputed. The logits are not: TRL's fused LM head scores the answer
    positions tile by tile. An estimate: allocator slack is the 10 % of ``total_bytes``.

    Args:
        optimizer: ``"adamw"`` (two moments in the parameters' dtype) or ``"adamw_8bit"`` (bitsandbytes'
            ``adamw_8bit``: about 2 bytes a parameter).
        quantized_llm: QLoRA: the LLM's attention and MLP weights in NF4 with double quantization (the vision tower,
            projector, embeddings and LM head stay in ``weight_dtype``, as ``loading.quantization_config`` keeps
            them); needs ``lora_rank``.
        full_logits: count the logits of every one of the ``sequence`` positions (stock LLaVA's forward:
            ``LOGIT_BYTES`` a position and vocabulary entry). Off (the default): the loss at labelled positions only
            (``train``'s path, and the model's own forward with ``loss_at_labels_only``), whose logits are a few
            tiles at a time, not counted.
        Where ``compute_dtype`` differs from ``weight_dtype`` (autocast), the compute-dtype copies autocast keeps of
            the weights are counted with the weights: of the trained ones always (its cast cache), of the frozen
            ones without checkpointing (saved for the backward).

    Returns:
        ``TrainingMemory`` (bytes per part; ``total_bytes`` with the allocator's slack).
    """
    if stage not in (1, 2) or (lora_rank and stage == 1):
        raise ValueError(f"stage must be 1 or 2 (LoRA: stage 2), got stage={stage!r}, lora_rank={lora_rank!r}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZER_STATE_BYTES)}, got {optimizer!r}")
    if quantized_llm and not lora_rank:
        raise ValueError("quantized_llm (QLoRA) trains LoRA adapters: give lora_rank")
    weight_size, compute_size = BYTES[weight_dtype], BYTES[compute_dtype or weight_dtype]
    sizes = _part_sizes(config, lora_rank)
    parameters = sizes["vision_tower"] + sizes["projector"] + sizes["llm"]
    if stage == 1:
        trainable = sizes["projector"]
    elif lora_rank:
        trainable = sizes["projector"] + sizes["lora"]
    else:
        trainable = parameters
    text, vision = config.get_text_config(), config.vision_config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_width = (getattr(text, "num_key_value_heads", None) or text.num_attention_heads) * head_dim
    per_llm_layer = 6 * text.hidden_size + 2 * kv_width + 4 * text.intermediate_size  # values per token
    activations = _kept(sequence, text.num_hidden_layers, per_llm_layer, text.hidden_size, checkpointing)
    if stage == 2 and not lora_rank:  # the vision tower trains: its activations are kept too
        layers, width = _vision_layers_width(vision)
        patches = (vision.image_size // vision.patch_size) ** 2
        activations += _kept(patches, layers, 7 * width + 2 * vision.intermediate_size, width, checkpointing)
    weights = (parameters + sizes["lora"]) * weight_size
    if quantized_llm:
        weights -= int(sizes["llm_linear"] * (weight_size - NF4_BYTES))
    if compute_size != weight_size:
        # autocast caches its cast of each trained weight for the whole forward; a frozen weight's cast is made per
        # use and kept only where the backward saves it (without checkpointing: every layer's)
        weights += trainable * compute_size + (0 if checkpointing else (parameters - trainable) * compute_size)
    state = OPTIMIZER_STATE_BYTES[optimizer] or 2 * weight_size
    logits = 0
    if full_logits:
        logits = batch_size * sequence * getattr(text, "vocab_size", 0) * LOGIT_BYTES
    return TrainingMemory(
        parameters=parameters, trainable=trainable, weights_bytes=int(weights),
        gradient_bytes=trainable * weight_size, optimizer_bytes=int(trainable * state),
        activation_bytes=batch_size * activations * compute_size, sequence_length=sequence, logits_bytes=logits)


def _kept(tokens: int, layers: int, per_layer: int, width: int, checkpointing: bool) -> int:
    """Values one row keeps for the backward through ``layers`` layers."""
    if checkpointing:
        return tokens * (layers * width + per_layer)  # every layer's input, one layer recomputed
    return tokens * layers * per_layer


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


def training_table(name: str = "SigLIP-so400m-384 + Llama-3.2-3B (paper)", batch_sizes=(1, 4),
                   sequence: int = 1000) -> str:
    """The memory of training each stage of a reference architecture (``training_estimate``), bf16 weights and
    compute, gradient checkpointing on, ``sequence`` tokens a row (stage 1: ``TRAINING_SEQUENCE``)."""
    config = reference_config(name)
    lines = [f"| {name} | " + " | ".join(f"batch {b}" for b in batch_sizes) + " |",
             "|---|" + "---|" * len(batch_sizes)]
    for label, kwargs in (("stage 1 (projector)", {"stage": 1, "sequence": TRAINING_SEQUENCE}),
                          ("stage 2, LoRA rank 16", {"stage": 2, "lora_rank": 16, "sequence": sequence}),
                          ("stage 2, full (bf16 weights, AdamW)", {"stage": 2, "sequence": sequence}),
                          ("stage 2, full (fp32 weights, bf16 autocast)",
                           {"stage": 2, "sequence": sequence, "weight_dtype": "float32",
                            "compute_dtype": "bfloat16"})):
        cells = [training_estimate(config, batch_size=b, **kwargs) for b in batch_sizes]
        lines.append(f"| {label} | " + " | ".join(f"{c.total_bytes / 2**30:.1f} GiB" for c in cells) + " |")
    return "\n".join(lines)


# What a 24 GB card leaves to training: its 24 GiB less the CUDA context and kernels' workspace (about 1 GiB).
CARD_GIB, CARD_RESERVED_GIB = 24.0, 1.0
# The recipes of the card table: (label, training_estimate keywords, the recipe file that runs it, if shipped)
CARD_RECIPES = (
    ("stage 1 (projector), fp32 weights + bf16 autocast (the paper's)",
     {"stage": 1, "weight_dtype": "float32", "compute_dtype": "bfloat16"}, "llama3.2-3b_siglip-so400m_stage1.yaml"),
    ("stage 1 (projector), bf16 weights", {"stage": 1},
     "llama3.2-3b_siglip-so400m_stage1.yaml --dtype bfloat16"),
    ("stage 2 full, fp32 weights + bf16 autocast, AdamW (the paper's)",
     {"stage": 2, "weight_dtype": "float32", "compute_dtype": "bfloat16"}, "llama3.2-3b_siglip-so400m_stage2.yaml"),
    ("stage 2 full, fp32 weights + bf16 autocast, 8-bit AdamW",
     {"stage": 2, "weight_dtype": "float32", "compute_dtype": "bfloat16", "optimizer": "adamw_8bit"}, None),
    ("stage 2 full, bf16 weights, AdamW", {"stage": 2}, None),
    ("stage 2 full, bf16 weights, 8-bit AdamW", {"stage": 2, "optimizer": "adamw_8bit"}, None),
    ("stage 2 LoRA r16, bf16 weights", {"stage": 2, "lora_rank": 16},
     "llama3.2-3b_siglip-so400m_stage2_lora_24gb.yaml"),
    ("stage 2 QLoRA r16, NF4 LLM", {"stage": 2, "lora_rank": 16, "quantized_llm": True},
     "llama3.2-3b_siglip-so400m_stage2_qlora_24gb.yaml"),
)


def card_fits(estimate: TrainingMemory, card_gib: float = CARD_GIB) -> bool:
    """Whether ``estimate`` fits a card of ``card_gib`` GiB after ``CARD_RESERVED_GIB``."""
    return estimate.total_bytes <= (card_gib - CARD_RESERVED_GIB) * 2**30


def card_table(name: str = "SigLIP-so400m-384 + Llama-3.2-3B (paper)", card_gib: float = CARD_GIB,
               batch_size: int = 1, sequence: int = 2048) -> str:
    """Which recipe fits a ``card_gib`` card: ``training_estimate`` of each of ``CARD_RECIPES`` at ``batch_size``
    rows of ``sequence`` tokens (the recipes' ``max_length``: the longest batch a run meets), with gradient
    checkpointing on and off, the loss at labelled positions only and over every position (stock LLaVA's logits)."""
    config = reference_config(name)
    columns = [(True, False), (True, True), (False, False), (False, True)]
    lines = [f"| {name}, {batch_size} x {sequence} tokens | "
             + " | ".join(f"checkpointing {'on' if gc else 'off'}, {'every position' if full else 'loss at labels'}"
                          for gc, full in columns) + " | recipe |",
             "|---|" + "---|" * (len(columns) + 1)]
    for label, kwargs, recipe in CARD_RECIPES:
        cells = []
        for checkpointing, full_logits in columns:
            estimate = training_estimate(config, batch_size=batch_size, sequence=sequence, checkpointing=checkpointing,
                                         full_logits=full_logits, **kwargs)
            cells.append(f"{estimate.total_bytes / 2**30:.1f} GiB {'fits' if card_fits(estimate, card_gib) else 'no'}")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {f'`{recipe}`' if recipe else '-'} |")
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


def pass_flops(shape: PassShape, sequence: int, with_image: bool = True, scored: int = 1, cached: int = 0,
               causal: bool = False) -> float:
    """Multiply-add FLOPs (2 per MAC) of one forward pass over ``sequence`` new tokens after ``cached`` ones: the
    matmuls of the vision encoder (when ``with_image``), of the decoder, its attention scores and mixing, and the LM
    head at ``scored`` positions. Norms, activations and RoPE are left out (a few per cent). ``causal``: the decoder's
    attention scores only the keys each query sees (an attention kernel that skips the masked half, as sdpa's and
    flash attention's causal paths do); otherwise every query against every key."""
    keys = cached + (sequence + 1) / 2 if causal else sequence + cached  # keys a query attends to, on average
    flops = 2.0 * shape.llm_parameters * sequence + 4.0 * shape.num_layers * sequence * keys \
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
