"""How many image tokens one image of a family puts into the LLM, read from its config (memory estimates and
the training-shape figures use it; the sizes assumed for dynamic-resolution families are stated in
docs/diagnostics.md).
"""

from __future__ import annotations

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


__all__ = ["DEFAULT_IMAGE_TOKENS", "DYNAMIC_IMAGE_SIDE", "IDEFICS_TILES", "image_tokens"]
