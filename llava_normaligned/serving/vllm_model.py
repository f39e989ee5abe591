"""The norm-aligned LLaVA as a vLLM model: vLLM's own LLaVA with the aligned LayerNorm after its projector.

Everything but the projector is vLLM's ``LlavaForConditionalGeneration`` (vision tower, language model, the
multimodal processor, tensor and pipeline parallelism, LoRA). The projector is rebuilt as LLaVA's two linear layers
plus ``multi_modal_projector.norm``, with the parameter names our checkpoints carry, so vLLM's weight-name mapping
loads them unchanged. Imported by vLLM only (see ``vllm_plugin``); this module needs vLLM.

Quantization: the projector and its norm are built without vLLM's ``quant_config``, so whatever quantizes the LLM
(``--quantization fp8``, an AWQ / GPTQ / compressed-tensors checkpoint) leaves them in the model's floating-point
dtype: the norm's gain T / sqrt(D) (paper §5.1) and the projector in front of it stay exact. The vision tower is
vLLM's and follows the quantization config (a pre-quantized checkpoint's ignore list keeps it unquantized).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import torch
from vllm.model_executor.models.llava import LlavaForConditionalGeneration, LlavaMultiModalProjector
from vllm.model_executor.models.utils import WeightsMapper

from llava_normaligned.compat import vllm_llava_projector_built_as
from modeling_llava_normaligned import NormAlignedLayerNorm

PROJECTOR = "multi_modal_projector"
# The only projector tensors a checkpoint may hold: anything else (qweight, scales, ...) is a quantized projector.
PROJECTOR_TENSORS = {f"{layer}.{kind}" for layer in ("linear_1", "linear_2", "norm") for kind in ("weight", "bias")}


class NormAlignedProjector(LlavaMultiModalProjector):
    """LLaVA-1.5's projector (vLLM's layers, our parameter names), never quantized, then the aligned norm.

    Takes the arguments vLLM's LLaVA passes its projector; ``quant_config`` is accepted and ignored.
    """

    def __init__(self, *, vision_hidden_size: int, text_hidden_size: int, projector_hidden_act: str,
                 multimodal_projector_bias: bool, quant_config=None, prefix: str = "", projector_norm=None):
        super().__init__(
            vision_hidden_size=vision_hidden_size,
            text_hidden_size=text_hidden_size,
            projector_hidden_act=projector_hidden_act,
            multimodal_projector_bias=multimodal_projector_bias,
            quant_config=None,
            prefix=prefix,
        )
        if projector_norm == "layernorm":
            # The training module itself: at inference its forward is F.layer_norm (GWC acts in backward only).
            self.norm = NormAlignedLayerNorm(text_hidden_size, compensation=False)
        else:  # the paper's "w/o Norm" row: stock LLaVA
            self.norm = None

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:  # (N, D_vision) -> (N, D_text)
        hidden_states = super().forward(image_features)  # row-parallel output: full width on every rank
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        return hidden_states


class LlavaNormAlignedForConditionalGeneration(LlavaForConditionalGeneration):
    """vLLM's LLaVA with ``NormAlignedProjector`` as its projector (same multimodal processor)."""

    # transformers 5 saves the vision tower of a LLaVA without the `vision_model.` level that vLLM's (and
    # transformers 4's) SigLIP / CLIP modules have: `model.vision_tower.encoder...`. Put it back, then apply
    # vLLM's LLaVA mapping (model.language_model. -> language_model.model., lm_head. -> language_model.lm_head.).
    hf_to_vllm_mapper = (
        WeightsMapper(orig_to_new_regex={re.compile(r"^model\.vision_tower\.(?!vision_model\.)"): "model.vision_tower.vision_model."})
        | LlavaForConditionalGeneration.hf_to_vllm_mapper
    )

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        norm = getattr(vllm_config.model_config.hf_config, "projector_norm", None)
        # Built where vLLM's LLaVA would build its projector (rather than replaced afterwards), so all of vLLM's
        # bookkeeping stays right: recorded as a tower part, routed through an offloader, left out when images are
        # disabled, and never quantized (online quantization lists the layers it quantizes as they are built).
        with vllm_llava_projector_built_as(functools.partial(NormAlignedProjector, projector_norm=norm)):
            super().__init__(vllm_config=vllm_config, prefix=prefix)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(refuse_quantized_projector(weights))


def refuse_quantized_projector(weights: Iterable[tuple[str, torch.Tensor]]):
    """The checkpoint's ``(name, tensor)`` pairs as they come, refusing (``ValueError``) a quantized projector tensor:
    vLLM would load it as a full-precision weight of the wrong shape."""
    for name, tensor in weights:
        head, _, tail = name.partition(f"{PROJECTOR}.")
        if tail and tail not in PROJECTOR_TENSORS:
            raise ValueError(
                f"checkpoint tensor {name!r}: the projector must be stored unquantized (expected only "
                f"{sorted(PROJECTOR_TENSORS)} under {PROJECTOR}); quantize the language model only"
            )
        yield name, tensor
