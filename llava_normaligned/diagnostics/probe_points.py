"""Where a LLaVA-style model is probed: vision tower -> projector (-> its norm) -> language model layers.

Every LLaVA-family model in transformers (``LlavaForConditionalGeneration``, LLaVA-NeXT, LLaVA-OneVision) and this
package's ``LlavaNormAlignedForConditionalGeneration`` keep these parts under the same names in ``model.model``.
A model without one of them cannot be probed, and ``locate`` says which part is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .config import DiagnosticsError

SUPPORTED = (
    "a LLaVA-style model: model.model.vision_tower -> model.model.multi_modal_projector -> "
    "model.model.language_model (with .layers), an image-feature entry point model.model.get_image_features, "
    "and config.image_token_id"
)


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

    @property
    def num_layers(self) -> int:
        return len(self.layers)


def locate(model: nn.Module, model_id: str = "model") -> ProbePoints:
    """The probe points of ``model``, or a ``DiagnosticsError`` naming every part that is missing."""
    base = getattr(model, "model", None)
    if not isinstance(base, nn.Module):
        base = model
    missing = []
    if not callable(getattr(base, "get_image_features", None)):
        missing.append("model.model.get_image_features (image-feature entry point)")
    parts = {}
    for name in ("vision_tower", "multi_modal_projector", "language_model"):
        part = getattr(base, name, None)
        if not isinstance(part, nn.Module):
            missing.append(f"model.model.{name}")
        parts[name] = part
    layers = getattr(parts["language_model"], "layers", None)
    if parts["language_model"] is not None and not isinstance(layers, nn.ModuleList):
        missing.append("model.model.language_model.layers (the decoder layers)")
    elif isinstance(layers, nn.ModuleList) and not all(hasattr(layer, "self_attn") for layer in layers):
        missing.append("a self_attn module in every decoder layer")
    config = getattr(model, "config", None)
    image_token_id = getattr(config, "image_token_id", None)
    if image_token_id is None:
        image_token_id = getattr(config, "image_token_index", None)
    if image_token_id is None:
        missing.append("config.image_token_id")
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None or getattr(embeddings, "weight", None) is None:
        missing.append("input embeddings (model.get_input_embeddings())")
    if missing:
        raise DiagnosticsError(
            f"cannot probe {model_id!r} ({type(model).__name__}): it has no {'; no '.join(missing)}. "
            f"The diagnostics need {SUPPORTED}."
        )
    projector = parts["multi_modal_projector"]
    norm = getattr(projector, "norm", None)
    return ProbePoints(
        model=model,
        vision_tower=parts["vision_tower"],
        projector=projector,
        projector_norm=norm if isinstance(norm, nn.Module) else None,
        language_model=parts["language_model"],
        layers=layers,
        embeddings=embeddings.weight,
        image_token_id=int(image_token_id),
        vision_feature_select_strategy=getattr(config, "vision_feature_select_strategy", None),
    )
