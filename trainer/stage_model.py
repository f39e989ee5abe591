"""The model and processor a stage starts from: a checkpoint (norm-aligned or stock LLaVA), or, for stage 1, a
vision encoder and a causal LM composed on the spot; optionally one of the paper's ablation variants; optionally
with the LLM in 4-bit or 8-bit (QLoRA).

Nothing is ever re-initialised silently: the loader (``llava_normaligned.loading``) refuses any checkpoint, norm-aligned
or stock LLaVA, that lacks a weight, except a norm-aligned checkpoint's projector norm, which the model initialises
to T/sqrt(D) with a warning. A variant that changes the projector norm (paper Tables 4/5) is
applied only before stage 1, with a log line.
"""

from __future__ import annotations

import logging

from llava_normaligned.loading import TRUST_REMOTE_CODE_DEFAULT, load_model, parse_dtype
from llava_normaligned.norm_variant import NormVariant

logger = logging.getLogger(__name__)


def load_checkpoint(
    name_or_path: str,
    *,
    revision: str | None = None,
    dtype=None,
    trust_remote_code: bool | None = TRUST_REMOTE_CODE_DEFAULT,
    attn_implementation: str | None = None,
    quantization: str | None = None,
    quant_type: str = "nf4",
):
    """A LLaVA checkpoint (norm-aligned or stock) and its processor, to train: ``llava_normaligned.loading.load_model``
    with ``for_training=True`` (what that changes, and why, is in its module docstring). ``quantization``: None,
    ``"4bit"`` or ``"8bit"`` (QLoRA's base: the LLM quantized, vision tower, projector and ``lm_head`` kept)."""
    return load_model(
        name_or_path, revision=revision, dtype=dtype, trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation, quantization=quantization, quant_type=quant_type,
        for_training=True,
    )


def compose_for_stage1(
    vision_model: str, text_model: str, variant: dict, dtype=None, trust_remote_code=TRUST_REMOTE_CODE_DEFAULT
):
    """Compose a fresh norm-aligned LLaVA (projector newly initialised) with the variant's norm options (the ones
    given; the rest: ``NormVariant``'s defaults, the paper's method)."""
    from llava_normaligned.compose import compose

    norm_variant = NormVariant.from_dict(variant)
    logger.info("composing %s + %s (projector norm %s)", vision_model, text_model, norm_variant.describe())
    return compose(vision_model, text_model, norm_variant=norm_variant, dtype=parse_dtype(dtype),
                   trust_remote_code=trust_remote_code)


def apply_norm_variant(model, *, stage: int, **variant) -> dict:
    """Set the projector norm of a norm-aligned model to one of the paper's ablation variants (Tables 4/5).

    ``variant``: any of the four ``NormVariant`` options (``projector_norm`` "layernorm" or ``None``, ``norm_init``
    "target" / "default", ``gradient_compensation``, ``gradient_compensation_min``); the others stay as the model
    has them. Only before stage 1: the norm is then rebuilt and initialised per the variant
    (``LlavaNormAlignedProjector.reset_norm``: gain T/sqrt(D) or 1, bias 0; paper §5.1). In stage 2 a variant must
    match the checkpoint (the norm was trained in stage 1), otherwise it is an error. Returns the options that
    changed.
    """
    from llava_normaligned.families.anatomy import anatomy_of
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration, gain_statistics, model_norm_target

    if not variant:
        return {}
    aligned = getattr(model.config, "norm_connector", None) is not None  # a stock VLM `align` wrote
    if not isinstance(model, LlavaNormAlignedForConditionalGeneration) and not aligned:
        raise ValueError(
            f"the ablation variants need the norm-aligned model, got {type(model).__name__}; run "
            "`llava-normaligned convert` (stock LLaVA), `compose`, or `align` (another family) first"
        )
    config = model.config
    current = NormVariant.from_config(config)
    wanted = NormVariant.from_dict(variant, base=current)
    changes = wanted.changes_from(current)
    if not changes:
        return {}
    if aligned:
        raise ValueError(
            f"the {config.norm_family} model's aligned norm is {current.describe()}, the run asks for {changes}; "
            "an aligned model's norm options are chosen when it is written: `llava-normaligned align` with "
            "--norm-init / --no-gradient-compensation / --gradient-compensation-min"
        )
    if stage != 1:
        raise ValueError(
            f"stage {stage}: the checkpoint's projector norm is {current.describe()}, the run asks for {changes}; "
            "the variant is chosen before stage 1 (the norm is trained then)"
        )
    for key, value in changes.items():
        setattr(config, key, value)
    if wanted.projector_norm is not None and wanted.norm_init == "target" and config.norm_target is None:
        config.norm_target = model_norm_target(model)
    norm = anatomy_of(model).projector.reset_norm(config)
    gain = "n/a" if norm is None else f"{gain_statistics(norm.weight, None)['gain_abs_mean']:.5f}"
    logger.info("stage 1 variant: %s -> projector norm %s (mean|gain| %s)", changes, wanted.describe(), gain)
    return changes


def describe_variant(model) -> dict:
    """The model's norm variant as recorded in summaries (stock LLaVA: ``{"projector_norm": None, "stock": True}``;
    a stock VLM ``align`` wrote: its options plus ``aligned_family`` and ``norm_connector``)."""
    config = model.config
    aligned = getattr(config, "norm_connector", None) is not None
    if not hasattr(config, "projector_norm") and not aligned:
        return {"projector_norm": None, "stock_llava": True}
    from modeling_llava_normaligned import gain_init

    target = config.norm_target
    variant = NormVariant.from_config(config)
    described = {**variant.in_force(), "norm_target": target}  # no init or GWC for a model without a norm
    if variant.projector_norm is not None:
        described["gain_init"] = (gain_init(config.norm_init, target, config.get_text_config().hidden_size)
                                  if target or config.norm_init == "default" else 1.0)
    if aligned:
        described.update(aligned_family=config.norm_family, norm_connector=config.norm_connector,
                         norm_entry=config.norm_entry)
    return described


__all__ = [
    "apply_norm_variant",
    "compose_for_stage1",
    "describe_variant",
    "load_checkpoint",
]
