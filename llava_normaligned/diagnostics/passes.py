"""The forward passes the probes are read from: teacher-forced passes, greedy decoding, cached single steps.

All take a left-padded batch (``Batch.inputs``): position ids are counted over the real tokens only, so a padded
row is computed as it would be alone (with M-RoPE, Qwen's: the model's own 3-D positions of the real tokens;
``families.positions``).
Everything runs under ``torch.inference_mode``.
"""

from __future__ import annotations

import copy
import inspect

import torch

from llava_normaligned.families.positions import model_positions, position_ids, rope_deltas


def _cache_kwarg(model) -> str:
    # transformers 5.x renamed `past_key_values` to `cache` (the old name is accepted until 5.40).
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def output_cache(output):
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


# inputs holding one entry per token besides the ids and the mask: cut and extended with them
PER_TOKEN_KEYS = ("mm_token_type_ids", "token_type_ids")


def _per_token(inputs: dict) -> list[str]:
    return [k for k in PER_TOKEN_KEYS if isinstance(inputs.get(k), torch.Tensor)]


def _device_dtype(model):
    parameter = next(model.parameters())
    return parameter.device, parameter.dtype


def _generated_token_type(model) -> int:
    from llava_normaligned.families.anatomy import family_of

    family = family_of(getattr(model, "config", None))
    return family.generated_token_type if family is not None else 0


def model_inputs(model, inputs: dict, pixel_values=None, appended: torch.Tensor | None = None) -> dict:
    """The keyword arguments of a forward pass of ``model`` over a probe batch's ``inputs``: on the model's device
    (pixels in its dtype), ``pixel_values`` replacing the batch's when given, ``appended`` (B, n) text tokens added
    on the right (the attention mask and per-token type ids extended with them), and the family's position ids."""
    device, dtype = _device_dtype(model)
    inputs = dict(inputs)
    if appended is not None:  # (B, n) tokens appended on the right, all real, all text
        for key in _per_token(inputs):  # Qwen's mm_token_type_ids: 0 (text); token_type_ids: the generated type
            fill = _generated_token_type(model) if key == "token_type_ids" else 0
            inputs[key] = torch.cat([inputs[key], torch.full_like(appended, fill, dtype=inputs[key].dtype)], dim=1)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], appended], dim=1)
        mask = inputs["attention_mask"]
        inputs["attention_mask"] = torch.cat([mask, torch.ones_like(appended, dtype=mask.dtype)], dim=1)
    input_ids, mask = inputs["input_ids"], inputs["attention_mask"]
    kwargs = {k: v.to(device) for k, v in inputs.items() if k not in ("input_ids", "attention_mask", "pixel_values")}
    if "pixel_values" in inputs:
        pixels = inputs["pixel_values"] if pixel_values is None else pixel_values
        kwargs["pixel_values"] = pixels.to(device, dtype)
    return dict(
        input_ids=input_ids.to(device),
        attention_mask=mask.to(device),
        position_ids=model_positions(model, input_ids, mask, inputs).to(device),
        **kwargs,
    )


@torch.inference_mode()
def run(model, inputs: dict, *, pixel_values=None, appended=None, logits_to_keep: int = 0, use_cache: bool = False):
    """One forward pass of the full model over the prompt (+ ``appended`` tokens); returns the model output."""
    kwargs = model_inputs(model, inputs, pixel_values, appended)
    return model(**kwargs, use_cache=use_cache, logits_to_keep=logits_to_keep)


@torch.inference_mode()
def step(model, cache, token: torch.Tensor, attention_mask: torch.Tensor, deltas: torch.Tensor | None = None):
    """One cached decoding step: ``token`` (B, 1) after the positions held by ``cache`` (mask (B, S+1) includes it).
    ``deltas``: the prompt's ``rope_deltas`` for a model with M-RoPE. Returns (logits (B, V) float32, the cache)."""
    device, _ = _device_dtype(model)
    positions = position_ids(attention_mask)[:, -1:]  # (B, 1)
    if deltas is not None:  # M-RoPE: a text token after the image is at (text position + delta) on all three axes
        positions = torch.cat([positions[None], (positions + deltas)[None].expand(3, -1, -1)], dim=0)
    out = model(
        input_ids=token.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=positions.to(device),
        use_cache=True,
        **{_cache_kwarg(model): cache},
    )
    return out.logits[:, -1].float(), output_cache(out)


def _argmax(logits: torch.Tensor, suppress) -> torch.Tensor:
    """(B, 1) argmax of (B, V) logits with the ``suppress`` ids never chosen."""
    if suppress:
        logits = logits.clone()
        logits[:, list(suppress)] = float("-inf")
    return logits.argmax(-1, keepdim=True).cpu()


@torch.inference_mode()
def greedy_continuation(model, inputs: dict, max_new_tokens: int, suppress=()) -> torch.Tensor:
    """(B, n) greedy tokens after the prompt, never one of ``suppress`` (the placeholder tokens,
    ``generation.placeholder_token_ids``: a generated image token would break the teacher-forced passes). Decoding
    does not stop at EOS: every row gets n tokens, so that the passes of the sweep score the same n positions."""
    out = run(model, inputs, use_cache=True, logits_to_keep=1)
    token = _argmax(out.logits[:, -1], suppress)  # (B, 1)
    cache, mask = output_cache(out), inputs["attention_mask"]
    deltas = rope_deltas(model, inputs)
    tokens = [token]
    for _ in range(max_new_tokens - 1):
        mask = torch.cat([mask, torch.ones_like(token, dtype=mask.dtype)], dim=1)
        logits, cache = step(model, cache, token, mask, deltas)
        token = _argmax(logits, suppress)
        tokens.append(token)
    return torch.cat(tokens, dim=1)


@torch.inference_mode()
def prefix_cache(model, inputs: dict, pixel_values=None):
    """The KV cache of the prompt without its last token (the blog's Experiment 3 feeds that token separately)."""
    prefix = dict(inputs)
    for key in ("input_ids", "attention_mask", *_per_token(inputs)):
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
