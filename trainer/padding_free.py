"""Padding-free batches for a LLaVA-style VLM: the rows of a batch as one sequence, no pad tokens.

TRL refuses packing and padding-free batches for vision data; for a model with 1-D RoPE they are exact. The collator
builds the padded batch as usual (answer-only labels, image tags expanded) and ``pack_rows`` then keeps only the real
tokens, row after row:

    input_ids (B, L) + attention_mask (B, L)  ->  input_ids (1, N), N = sum of the rows' lengths
    position_ids                              ->  (1, N): 0, 1, ..., len_0 - 1, 0, 1, ..., len_1 - 1, ...
    labels                                    ->  (1, N), -100 at each row's first token (never predicted from the
                                                  row before it)
    pixel_values                              ->  unchanged: LLaVA scatters the image features over the image tokens
                                                  in order, and the order is the padded batch's
    use_cache                                 ->  False (with a cache, transformers does not look for packed rows)

There is no attention mask: transformers finds the rows from the restarting ``position_ids``
(``masking_utils.find_packed_sequence_indices``). For eager attention it builds the block-diagonal causal mask; flash
attention takes its variable-length path from the same ``position_ids``. For sdpa, whose dense block-diagonal mask
costs (sum of lengths)^2 where the rows need the sum of their squares, the LLM's attention is switched, while
training, to ``PACKED_SDPA``: transformers' own sdpa run row by row (``is_causal``, no mask), registered with
transformers' public ``AttentionInterface``. The vision tower is not touched (it sees whole images, never packed).

A batch without padding (rows of one length) is left as it is: packing would remove nothing, and the row-by-row
attention costs where the padded batch runs one sdpa call (stage-1 rows at the paper's shape, all 729 image tokens and
a caption, measured 0.94x when packed). Such a batch runs exactly the padded path.

The losses and gradients are the padded batch's: the loss is summed over the same answer tokens and divided by the
same count (the Trainer's ``num_items_in_batch``, which counts ``labels[..., 1:]`` across the accumulated batches
exactly as for padded batches).

Multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): an image's tokens take 3-D positions (temporal, height, width)
from its grid, and the text after it continues from the image's largest position, so a row's positions are not an
``arange``. ``multimodal_positions`` gives each packed row the positions it has alone, computed by the model's own
``get_rope_index`` on the rows laid out padded again (each row's valid tokens, its own image grids in order), under the
restarting text positions transformers reads packed rows from: ``position_ids`` (4, 1, N), row 0 the text positions,
rows 1-3 M-RoPE's (the layout transformers' Qwen-VL models take for packed rows). ``train`` applies it before each
forward (``LlavaStageTrainer``); the attention is as above (the text positions mark the rows). Qwen3-VL's deepstack
features are added at the image tokens wherever they are, packed or not.

Refused with one line: a family whose packed rows cannot be exact (``Family.packing_refusal``: Gemma3, whose image
tokens attend to each other both ways), a multimodal-RoPE family without ``get_rope_index`` and an attention
implementation that ignores packed positions (the paged ones, which read a cache's layout instead).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from llava_normaligned.compat import attn_implementation

logger = logging.getLogger(__name__)

PACKED_SDPA = "llava_normaligned_packed_sdpa"
# implementations that find the rows from packed position_ids (transformers' masks, or flash attention's varlen path)
PACKED_AWARE = ("eager", "sdpa", "flex_attention", PACKED_SDPA)


def pack_rows(batch: dict, ignore_index: int) -> dict:
    """A right-padded batch -> one packed row (module docstring). Every (B, L) tensor is packed alike; the others
    (``pixel_values``, counts) pass through. ``ignore_index``: the label of a token that is not trained on."""
    mask = batch["attention_mask"].bool()  # (B, L)
    shape = mask.shape
    lengths = mask.sum(dim=1)  # (B,)
    packed = {}
    for key, value in batch.items():
        if key == "attention_mask":
            continue
        if isinstance(value, torch.Tensor) and value.shape[:2] == shape:
            value = value[mask].unsqueeze(0)  # (1, N), rows in order (boolean indexing is row-major)
        packed[key] = value
    starts = torch.cumsum(lengths, dim=0) - lengths  # (B,) where each row begins in the packed row
    if "labels" in packed:
        packed["labels"] = packed["labels"].clone()
        packed["labels"][0, starts] = ignore_index
    offsets = torch.repeat_interleave(starts, lengths)  # (N,)
    packed["position_ids"] = (torch.arange(int(lengths.sum())) - offsets).unsqueeze(0)  # (1, N)
    # transformers looks for packed rows only when there is no cache: a forward that made one (use_cache defaults to
    # the config's True outside the trainers) would let the rows attend to each other
    packed["use_cache"] = False
    return packed


# ------------------------------------------------------------------------------------ which models can take it


def uses_multimodal_rope(model) -> bool:
    """Whether the LLM places image tokens with multimodal RoPE (3-D positions)."""
    from llava_normaligned.families.anatomy import family_of, unwrap

    config = unwrap(model).config
    family = family_of(config)
    text = config.get_text_config()
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    return (family is not None and family.positions != "1d") or (isinstance(rope, dict) and "mrope_section" in rope)


def _rope_index_owner(model):
    """The module holding the model's ``get_rope_index`` (the Qwen-VL ``...Model`` under the generation head)."""
    from llava_normaligned.families.anatomy import unwrap

    core = unwrap(model)
    for candidate in (getattr(core, "model", None), core):
        if candidate is not None and callable(getattr(candidate, "get_rope_index", None)):
            return candidate
    return None


def check_padding_free(model) -> None:
    """Raise ``ValueError`` (one line) where packed rows would be wrong: multimodal RoPE without the model's own
    position function, or an attention implementation that ignores packed positions."""
    from llava_normaligned.families.anatomy import family_of, unwrap

    config = unwrap(model).config
    family = family_of(config)
    text = config.get_text_config()
    refusal = getattr(family, "packing_refusal", None)
    if refusal:
        raise ValueError(f"--padding_free: {family.name}: {refusal}; train it with padded batches")
    if uses_multimodal_rope(model) and _rope_index_owner(model) is None:
        name = family.name if family is not None else config.model_type
        raise ValueError(f"--padding_free: {name} places image tokens with multimodal RoPE (3-D positions) and has no "
                         "get_rope_index to compute each packed row's; train it with padded batches")
    implementation = attn_implementation(text)
    if not (implementation in PACKED_AWARE or "flash" in str(implementation)):
        raise ValueError(f"--padding_free: the LLM's attention implementation {implementation!r} ignores packed "
                         f"positions (rows would attend to each other); use one of {', '.join(PACKED_AWARE[:3])} or "
                         "flash_attention_2")


def _plain_causal(text_config) -> bool:
    """Full causal attention in every layer (no sliding window, no soft-capping): what ``PACKED_SDPA`` computes."""
    window = getattr(text_config, "sliding_window", None)
    if window and getattr(text_config, "use_sliding_window", True):
        return False
    layer_types = getattr(text_config, "layer_types", None) or ()
    return all(kind == "full_attention" for kind in layer_types) and not getattr(
        text_config, "attn_logit_softcapping", None)


def row_bounds(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each row of a packed (1, N) ``position_ids``: a row starts where positions do not step by 1."""
    ids = position_ids[0]
    starts = torch.nonzero(ids[1:] != ids[:-1] + 1).flatten() + 1
    edges = [0, *starts.tolist(), ids.numel()]
    return list(zip(edges[:-1], edges[1:]))


def multimodal_positions(model, batch: dict) -> dict:
    """A packed batch of a multimodal-RoPE model with each row's positions as it has them alone (module docstring):
    ``position_ids`` (1, N) -> (4, 1, N). Batches that are not packed (no ``position_ids``, or already 3-D) and the
    batches of a model with 1-D RoPE are returned as they are."""
    position_ids = batch.get("position_ids")
    if position_ids is None or position_ids.ndim != 2 or not uses_multimodal_rope(model):
        return batch
    if "mm_token_type_ids" not in batch:  # without it the model would give every packed row 1-D positions
        raise ValueError("padding-free batches of a multimodal-RoPE model need the processor's mm_token_type_ids, and "
                         "this batch has none; train it with padded batches or a processor that returns them")
    owner = _rope_index_owner(model)
    if owner is None:
        raise ValueError("multimodal_positions: the model has no get_rope_index")
    ids, types = batch["input_ids"], batch["mm_token_type_ids"]
    bounds = row_bounds(position_ids)
    width = max(end - start for start, end in bounds)
    padded_ids = ids.new_zeros(len(bounds), width)
    padded_types = types.new_zeros(len(bounds), width)
    mask = torch.zeros(len(bounds), width, dtype=torch.bool, device=ids.device)
    for row, (start, end) in enumerate(bounds):
        padded_ids[row, :end - start] = ids[0, start:end]
        padded_types[row, :end - start] = types[0, start:end]
        mask[row, :end - start] = True
    three, _ = owner.get_rope_index(padded_ids, mm_token_type_ids=padded_types,
                                    image_grid_thw=batch.get("image_grid_thw"),
                                    video_grid_thw=batch.get("video_grid_thw"), attention_mask=mask.long())
    out = dict(batch)
    out["position_ids"] = torch.cat([position_ids.unsqueeze(0), three[:, mask].unsqueeze(1)], dim=0)  # (4, 1, N)
    return out


# ------------------------------------------------------------------------------------ row-by-row sdpa


class _Rows:
    """The rows of the last packed ``position_ids`` seen: every layer of one forward reads the same tensor, so the
    boundaries are found once per forward (one device-to-host copy)."""

    def __init__(self):
        self.position_ids = None
        self.bounds = None

    def of(self, position_ids: torch.Tensor | None) -> list[tuple[int, int]] | None:
        if position_ids is None or position_ids.ndim != 2 or position_ids.shape[0] != 1:
            return None
        if position_ids is not self.position_ids:
            self.position_ids, self.bounds = position_ids, row_bounds(position_ids)
        return self.bounds if len(self.bounds) > 1 else None


_ROWS = _Rows()


def packed_sdpa_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                                  scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers' sdpa, row by row on a packed row (batch 1, no mask, no cache); otherwise transformers' sdpa as is.
    query/key/value: (1, heads, N, head_dim) -> (1, N, heads, head_dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = None
    if attention_mask is None and query.shape[0] == 1 and query.shape[2] == key.shape[2] > 1:
        bounds = _ROWS.of(kwargs.get("position_ids"))
    if bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    # split, not sliced: the backward of a split is one concatenation, a slice's backward a zero-filled full-size
    # gradient per row
    sizes = [b - a for a, b in bounds]
    rows = [sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=is_causal,
                                   **kwargs)[0]
            for q, k, v in zip(query.split(sizes, dim=2), key.split(sizes, dim=2), value.split(sizes, dim=2))]
    return torch.cat(rows, dim=1), None


def _packed_sdpa_mask(*args, attention_mask=None, **kwargs):
    """No mask for a batch without padding (packed or not: the attention runs causally row by row); sdpa's own mask
    for a padded one."""
    from transformers.masking_utils import sdpa_mask

    return None if attention_mask is None else sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register_packed_sdpa() -> None:
    """Register ``PACKED_SDPA`` with transformers' attention and mask interfaces (what ``packed_attention`` switches
    an LLM to; idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention_forward)
    AttentionMaskInterface.register(PACKED_SDPA, _packed_sdpa_mask)


@contextlib.contextmanager
def packed_attention(model, enabled: bool = True):
    """While training padding-free: an sdpa LLM with plain causal attention runs it row by row (``PACKED_SDPA``);
    its implementation is restored on exit (what is saved names transformers' own). Other implementations already
    handle packed rows and are left as they are."""
    from llava_normaligned.families.anatomy import unwrap

    core = unwrap(model)
    text = core.config.get_text_config() if enabled else None
    if text is None or attn_implementation(text) != "sdpa" or not _plain_causal(text) or text is core.config:
        yield
        return
    register_packed_sdpa()
    core.set_attn_implementation({"text_config": PACKED_SDPA})
    logger.info("padding-free: the LLM's sdpa attention runs row by row on packed batches")
    try:
        yield
    finally:
        core.set_attn_implementation({"text_config": "sdpa"})


__all__ = ["PACKED_SDPA", "check_padding_free", "multimodal_positions", "pack_rows", "packed_attention",
           "packed_sdpa_attention_forward", "register_packed_sdpa", "row_bounds", "uses_multimodal_rope"]
