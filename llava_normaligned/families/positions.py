"""Token positions of a left-padded batch, per family: plain positions counted over the real tokens, or M-RoPE's
(Qwen2/2.5/3-VL: the model's own temporal/height/width positions, from its ``get_rope_index``). Used by the
diagnostics' forward passes and anything else that runs a padded batch through a model by hand.
"""

from __future__ import annotations

import torch

from .anatomy import anatomy_of


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) positions counted over the non-padding tokens (left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def _rope_index(model):
    """The base model's ``get_rope_index`` for a family with M-RoPE positions (Qwen2/2.5/3-VL), else None."""
    anatomy = anatomy_of(model)
    if anatomy.family.positions != "mrope":
        return None
    return anatomy.base.get_rope_index  # its presence is checked by probe_points.locate


def model_positions(model, input_ids: torch.Tensor, mask: torch.Tensor, inputs: dict) -> torch.Tensor:
    """The positions of a left-padded batch: (B, S) in general; with M-RoPE and an image, (4, B, S): the text
    positions, then the model's own (temporal, height, width) positions (what its ``generate`` passes)."""
    text = position_ids(mask)
    rope_index = _rope_index(model)
    if rope_index is None or inputs.get("image_grid_thw") is None:
        return text  # a batch without an image: M-RoPE's three positions are the text position
    vision, _ = rope_index(input_ids, mm_token_type_ids=inputs["mm_token_type_ids"],
                           image_grid_thw=inputs["image_grid_thw"], attention_mask=mask)
    return torch.cat([text[None], vision.to(text.device)], dim=0)


def rope_deltas(model, inputs: dict) -> torch.Tensor | None:
    """(B, 1) M-RoPE offset of the tokens after the prompt: next position = text position + delta; None when the
    model has plain positions."""
    positions = model_positions(model, inputs["input_ids"], inputs["attention_mask"], inputs)
    if positions.ndim == 2:
        return None
    real = inputs["attention_mask"].bool()
    last_vision = positions[1:].masked_fill(~real[None], -1).amax(dim=(0, 2))  # (B,)
    return (last_vision + 1 - real.sum(-1))[:, None]


__all__ = ["model_positions", "position_ids", "rope_deltas"]
