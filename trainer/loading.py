"""The model and processor a stage starts from: a checkpoint (norm-aligned or stock LLaVA), or, for stage 1, a
vision encoder and a causal LM composed on the spot; optionally one of the paper's ablation variants; optionally
with the LLM in 4-bit or 8-bit (QLoRA).

Nothing is ever re-initialised silently. A norm-aligned checkpoint is checked by the model's own ``from_pretrained``
(it refuses any missing weight but the projector norm's, which it initialises to T/sqrt(D) with a warning); a stock
LLaVA checkpoint that lacks weights is refused here. A variant that changes the projector norm (paper Tables 4/5) is
applied only before stage 1, with a log line.
"""

from __future__ import annotations

import logging
import math

import torch

logger = logging.getLogger(__name__)

# Kept in full precision under 4/8-bit loading: only the LLM's linear layers are quantized. Full module paths:
# bitsandbytes matches these from the start of the path or as a suffix (bare "vision_tower" matches nothing).
QUANTIZATION_SKIP_MODULES = ["model.vision_tower", "model.multi_modal_projector", "lm_head"]


def _torch_dtype(name):
    if name in (None, "auto"):
        return name
    if isinstance(name, torch.dtype):
        return name
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")  # noqa: TRY004 (a bad flag value: a usage error)
    return dtype


def quantization_config(bits: int | None, compute_dtype=None, quant_type: str = "nf4", double_quant: bool = False):
    """A ``BitsAndBytesConfig`` that quantizes the LLM only (vision tower, projector and LM head stay as loaded)."""
    if bits is None:
        return None
    from transformers import BitsAndBytesConfig

    if bits == 4:
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=quant_type,
            bnb_4bit_compute_dtype=_torch_dtype(compute_dtype) if compute_dtype not in (None, "auto") else torch.float32,
            bnb_4bit_use_double_quant=double_quant,
            llm_int8_skip_modules=list(QUANTIZATION_SKIP_MODULES),
        )
    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=list(QUANTIZATION_SKIP_MODULES))
    raise ValueError(f"quantization bits must be 4 or 8, got {bits!r}")


def load_checkpoint(
    name_or_path: str,
    *,
    revision: str | None = None,
    dtype=None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    quantization=None,
    device_map=None,
):
    """Load a LLaVA checkpoint (norm-aligned or stock) and its processor; refuse one with missing weights (see the
    module docstring: the norm-aligned model checks its own)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    # importing the package registers the norm-aligned model with the Auto classes
    from modeling_llava_normaligned import LlavaNormAlignedConfig

    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code, "output_loading_info": True}
    if dtype is not None:
        kwargs["dtype"] = _torch_dtype(dtype)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if quantization is not None:
        kwargs["quantization_config"] = quantization
        kwargs["device_map"] = device_map or ("cuda" if torch.cuda.is_available() else "cpu")
    model, info = AutoModelForImageTextToText.from_pretrained(name_or_path, **kwargs)
    missing = sorted(info.get("missing_keys") or [])
    checks_itself = model.config.model_type == LlavaNormAlignedConfig.model_type  # its from_pretrained (remote too)
    if missing and not checks_itself:
        shown = ", ".join(missing[:8]) + (f" ... ({len(missing)} in all)" if len(missing) > 8 else "")
        raise ValueError(
            f"{name_or_path}: the checkpoint lacks weights the model needs ({shown}); they would be randomly "
            "initialised. For a stock LLaVA checkpoint use `llava-normaligned convert`."
        )
    if getattr(getattr(model, "model", None), "multi_modal_projector", None) is None:
        raise ValueError(f"{name_or_path}: {type(model).__name__} is not a LLaVA-style model (no multi_modal_projector)")
    processor = AutoProcessor.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    return model, processor


def compose_for_stage1(vision_model: str, text_model: str, variant: dict, dtype=None, trust_remote_code=False):
    """Compose a fresh norm-aligned LLaVA (projector newly initialised) with the variant's norm settings."""
    from llava_normaligned.compose import compose

    kwargs = {key: variant[key] for key in ("projector_norm", "norm_init", "gradient_compensation") if key in variant}
    logger.info("composing %s + %s (%s)", vision_model, text_model, kwargs or "default variant")
    return compose(vision_model, text_model, dtype=_torch_dtype(dtype) if dtype != "auto" else None,
                   trust_remote_code=trust_remote_code, **kwargs)


def apply_norm_variant(model, *, stage: int, **variant) -> dict:
    """Set the projector norm of a norm-aligned model to one of the paper's ablation variants (Tables 4/5).

    ``variant`` keys: ``projector_norm`` ("layernorm" or ``None``), ``norm_init`` ("target" / "default"),
    ``gradient_compensation`` (bool). Only before stage 1: the norm is then (re)built and initialised per the
    variant (gain T/sqrt(D) or 1, bias 0; paper §5.1). In stage 2 a variant must match the checkpoint (the norm was
    trained in stage 1), otherwise it is an error. Returns the fields that changed.
    """
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration, NormAlignedLayerNorm

    if not variant:
        return {}
    config = model.config
    if not isinstance(model, LlavaNormAlignedForConditionalGeneration):
        raise ValueError(  # noqa: TRY004 (the wrong checkpoint for the flags given: a usage error)
            f"the ablation variants need the norm-aligned model, got {type(model).__name__}; run "
            "`llava-normaligned convert` (stock LLaVA) or `compose` first"
        )
    changes = {k: v for k, v in variant.items() if getattr(config, k) != v}
    if not changes:
        return {}
    if stage != 1:
        raise ValueError(
            f"stage {stage}: the checkpoint's projector norm is {_describe(config)}, the run asks for {changes}; "
            "the variant is chosen before stage 1 (the norm is trained then)"
        )
    for key, value in changes.items():
        setattr(config, key, value)
    projector = model.model.multi_modal_projector
    reference = projector.linear_2.weight
    if config.projector_norm is None:
        projector.norm = None
    else:
        if config.norm_init == "target" and config.norm_target is None:
            from modeling_llava_normaligned import text_embedding_norm_target

            config.norm_target = text_embedding_norm_target(model.get_input_embeddings().weight)
        norm = NormAlignedLayerNorm(
            config.text_config.hidden_size,
            compensation=config.gradient_compensation,
            compensation_min=config.gradient_compensation_min,
        ).to(device=reference.device, dtype=reference.dtype)
        model._init_weights(norm)  # gain T / sqrt(D) ("target") or 1 ("default"), bias 0 (paper §5.1)
        projector.norm = norm
    gain = "n/a" if projector.norm is None else f"{float(projector.norm.weight.float().abs().mean()):.5f}"
    logger.info("stage 1 variant: %s -> projector norm %s (mean|gain| %s)", changes, _describe(config), gain)
    return changes


def _describe(config) -> str:
    if config.projector_norm is None:
        return "none (w/o Norm)"
    gwc = "with GWC" if config.gradient_compensation else "without GWC"
    return f"{config.projector_norm}, {config.norm_init} init, {gwc}"


def describe_variant(model) -> dict:
    """The model's norm variant as recorded in summaries (stock LLaVA: ``{"projector_norm": None, "stock": True}``)."""
    config = model.config
    if not hasattr(config, "projector_norm"):
        return {"projector_norm": None, "stock_llava": True}
    target = config.norm_target
    return {
        "projector_norm": config.projector_norm,
        "norm_init": config.norm_init,
        "gradient_compensation": config.gradient_compensation,
        "norm_target": target,
        "gain_init": (target / math.sqrt(config.text_config.hidden_size)) if target and config.norm_init == "target"
        else 1.0,
    }


__all__ = [
    "QUANTIZATION_SKIP_MODULES",
    "apply_norm_variant",
    "compose_for_stage1",
    "describe_variant",
    "load_checkpoint",
    "quantization_config",
]
