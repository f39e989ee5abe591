"""Where a vision-language model is probed: vision tower -> projector (-> its norm) -> language model layers.

The parts are found by ``families.anatomy`` (one table of model families). For Qwen the projector is the
merger inside the vision model, for Idefics3 / SmolVLM the connector, for Ovis2 its visual embedding table; Qwen3-VL's
deepstack features are probed where they enter the LLM. A model without one of them cannot be probed, and ``locate``
says which part is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .anatomy import AnatomyError, Family, anatomy_of


@dataclass
class ProbePoints:
    model: nn.Module  # the model with its LM head
    vision_tower: nn.Module
    projector: nn.Module
    projector_norm: nn.Module | None  # the norm-aligned LayerNorm (paper §5.1) when the model has one
    language_model: nn.Module
    layers: nn.ModuleList  # the decoder layers, in order
    embeddings: torch.Tensor  # (V, D) the LLM's input embedding table
    image_token_id: int
    vision_feature_select_strategy: str | None  # "default" drops the CLS token from the vision tower's output
    family: Family | None = None  # anatomy.Family: where the parts are and what else the family does (deepstack)
    deepstack_llm_layers: tuple[int, ...] = ()  # Qwen3-VL: the decoder layers after which deepstack features are added
    deepstack_vision_layers: tuple[int, ...] = ()  # the vision layers they come from
    placeholder_token_ids: tuple[int, ...] = ()  # image token and the family's others
    base: nn.Module | None = None  # the base model: its input_ids say where the image tokens are
    embed_scale: float = 1.0  # the factor embed_tokens multiplies its rows by (Gemma: sqrt(D))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def deepstack(self):
        """The family's ``anatomy.Deepstack`` (Qwen3-VL), or None."""
        return self.family.deepstack if self.family is not None else None


def locate(model: nn.Module, model_id: str = "model") -> ProbePoints:
    """The probe points of ``model`` (``families.anatomy``), or an ``AnatomyError`` naming every part that is
    missing."""
    try:
        anatomy = anatomy_of(model, repr(model_id), require_image_token=True)
    except AnatomyError as error:
        raise AnatomyError(f"cannot probe {error}") from None
    missing = []
    if not callable(getattr(anatomy.base, "get_image_features", None)):
        missing.append("an image-feature entry point (get_image_features)")
    if not all(hasattr(layer, "self_attn") for layer in anatomy.decoder_layers):
        missing.append("a self_attn module in every decoder layer")
    if anatomy.family.positions == "mrope" and not callable(getattr(anatomy.base, "get_rope_index", None)):
        missing.append("an M-RoPE position entry point (get_rope_index)")
    if missing:
        raise AnatomyError(f"cannot probe {model_id!r} ({type(model).__name__}): it has no {'; no '.join(missing)}")
    family = anatomy.family
    deepstack = family.deepstack
    return ProbePoints(
        model=model,
        vision_tower=anatomy.vision_tower,
        projector=anatomy.projector,
        projector_norm=anatomy.projector_norm,
        language_model=anatomy.language_model,
        layers=anatomy.decoder_layers,
        embeddings=anatomy.input_embeddings.weight,
        image_token_id=int(anatomy.image_token_id),
        vision_feature_select_strategy=getattr(anatomy.config, "vision_feature_select_strategy", None),
        family=family,
        deepstack_llm_layers=tuple(deepstack.llm_layers(anatomy.config)) if deepstack else (),
        deepstack_vision_layers=tuple(deepstack.vision_layers(anatomy.config)) if deepstack else (),
        placeholder_token_ids=tuple(family.placeholder_token_ids(anatomy.config)),
        base=anatomy.base,
        embed_scale=float(getattr(anatomy.input_embeddings, "scalar_embed_scale", 1.0)),
    )
