"""The forward passes the probes are read from: teacher-forced passes, greedy decoding, cached single steps.

All take a left-padded batch (``Batch.inputs``): position ids are counted over the real tokens only, so a padded
row is computed as it would be alone. Everything runs under ``torch.inference_mode``.
"""

from __future__ import annotations

import copy
import inspect

import torch


def _cache_kwarg(model) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` (the old name is accepted until 5.40).
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, S) positions counted over the non-padding tokens (left padding)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def _device_dtype(model):
    parameter = next(model.parameters())
    return parameter.device, parameter.dtype


PER_TOKEN_INPUTS = ("token_type_ids", "mm_token_type_ids")  # (B, S) like input_ids: cut and extended with them


def _generated_token_type(model) -> int:
    from llava_normaligned.anatomy import family_of

    family = family_of(getattr(model, "config", None))
    return family.generated_token_type if family is not None else 0


def _model_inputs(model, inputs: dict, pixel_values=None, appended: torch.Tensor | None = None) -> dict:
    device, dtype = _device_dtype(model)
    input_ids, mask = inputs["input_ids"], inputs["attention_mask"]
    kwargs = {k: v.to(device) for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "pixel_values")}
    if appended is not None:  # (B, n) tokens appended on the right, all real
        input_ids = torch.cat([input_ids, appended], dim=1)
        mask = torch.cat([mask, torch.ones_like(appended, dtype=mask.dtype)], dim=1)
        for key in PER_TOKEN_INPUTS:  # the generated tokens' types (PaliGemma: its causal suffix)
            if key in kwargs:
                fill = torch.full_like(appended, _generated_token_type(model), dtype=kwargs[key].dtype)
                kwargs[key] = torch.cat([kwargs[key], fill.to(device)], dim=1)
    if "pixel_values" in inputs:
        pixels = inputs["pixel_values"] if pixel_values is None else pixel_values
        kwargs["pixel_values"] = pixels.to(device, dtype)
    return dict(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),
        position_ids=position_ids(mask).to(device),
        **kwargs,
    )


@torch.inference_mode()
def run(model, inputs: dict, *, pixel_values=None, appended=None, logits_to_keep: int = 0, use_cache: bool = False):
    """One forward pass of the full model over the prompt (+ ``appended`` tokens); returns the model output."""
    kwargs = _model_inputs(model, inputs, pixel_values, appended)
    return model(**kwargs, use_cache=use_cache, logits_to_keep=logits_to_keep)


@torch.inference_mode()
def step(model, cache, token: torch.Tensor, attention_mask: torch.Tensor):
    """One cached decoding step: ``token`` (B, 1) after the positions held by ``cache`` (mask (B, S+1) includes it).
    Returns (logits (B, V) float32, the extended cache)."""
    device, _ = _device_dtype(model)
    out = model(
        input_ids=token.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids(attention_mask)[:, -1:].to(device),
        use_cache=True,
        **{_cache_kwarg(model): cache},
    )
    return out.logits[:, -1].float(), output_cache(out)


@torch.inference_mode()
def greedy_continuation(model, inputs: dict, max_new_tokens: int) -> torch.Tensor:
    """(B, n) greedy tokens after the prompt. Decoding does not stop at EOS: every row gets n tokens, so that the
    teacher-forced passes of the sweep score the same n positions in every row."""
    out = run(model, inputs, use_cache=True, logits_to_keep=1)
    token = out.logits[:, -1].argmax(-1, keepdim=True).cpu()  # (B, 1)
    cache, mask = output_cache(out), inputs["attention_mask"]
    tokens = [token]
    for _ in range(max_new_tokens - 1):
        mask = torch.cat([mask, torch.ones_like(token, dtype=mask.dtype)], dim=1)
        logits, cache = step(model, cache, token, mask)
        token = logits.argmax(-1, keepdim=True).cpu()
        tokens.append(token)
    return torch.cat(tokens, dim=1)


@torch.inference_mode()
def prefix_cache(model, inputs: dict, pixel_values=None):
    """The KV cache of the prompt without its last token (the blog's Experiment 3 feeds that token separately)."""
    prefix = {k: v for k, v in inputs.items()}
    prefix["input_ids"] = inputs["input_ids"][:, :-1]
    prefix["attention_mask"] = inputs["attention_mask"][:, :-1]
    for key in PER_TOKEN_INPUTS:
        if key in prefix:
            prefix[key] = inputs[key][:, :-1]
    return output_cache(run(model, prefix, pixel_values=pixel_values, use_cache=True, logits_to_keep=1))


def cache_layers(cache) -> list:
    """The per-layer entries of a transformers cache, each with ``keys`` and ``values`` of shape (B, H_kv, S, d)."""
    layers = getattr(cache, "layers", None)
    if layers is None or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        raise TypeError(f"unsupported cache type {type(cache).__name__}: expected per-layer keys/values")
    return list(layers)


def splice_cache(target, source, positions: torch.Tensor):
    """A copy of ``target`` whose keys and values at ``positions`` ((B, S) bool) are those of ``source``."""
    spliced = copy.deepcopy(target)
    for into, src in zip(cache_layers(spliced), cache_layers(source)):
        where = positions.to(into.keys.device)[:, None, :, None]  # (B, 1, S, 1)
        into.keys = torch.where(where, src.keys, into.keys)
        into.values = torch.where(where, src.values, into.values)
    return spliced
