"""Loading and generation for norm-aligned (and stock) LLaVA checkpoints, local folders or Hub repos."""

from __future__ import annotations

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor


def load_model(
    model_name_or_path: str,
    *,
    revision: str | None = None,
    quantization: str | None = None,
    device: str | None = None,
    dtype: torch.dtype | str | None = None,
    trust_remote_code: bool = True,
    attn_implementation: str | None = None,
):
    """Return ``(model, processor)`` for a local folder or a Hub repo, in eval mode.

    ``quantization``: None (full precision), "4bit" or "8bit".
    """
    if quantization is not None:
        raise NotImplementedError("quantized loading is not implemented yet")
    kwargs = {"revision": revision, "trust_remote_code": trust_remote_code}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForImageTextToText.from_pretrained(model_name_or_path, **kwargs)
    if device is not None:
        model.to(device)
    processor = AutoProcessor.from_pretrained(model_name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    return model.eval(), processor
