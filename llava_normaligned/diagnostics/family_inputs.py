"""The processor a model's prompts and images go through: transformers' AutoProcessor, or the family's own builder.

Most families load their processor with ``AutoProcessor`` (the default). Some cannot on a machine without
torchvision: the processors of Qwen2-VL, Qwen2.5-VL, Qwen3-VL and SmolVLM (SmolVLM2) hold a video processor that
needs it, and SmolVLM's also needs ``num2words``. For those a builder makes an ``ExpandingProcessor`` from the
family's parts: the folder's tokenizer, its image processor (the PIL one when the fast one needs torchvision;
``AutoImageProcessor`` picks it), its chat template, and the family's placeholder expansion. It is called like a
transformers processor and returns what the model's forward takes.

    processor = load_processor("path/or/org/name", config)        # AutoProcessor, or the family's builder
    BUILDERS["qwen2_vl"]                                           # a family's builder, by ``Family.name``

A builder is ``builder(model_id, config, **hub_kwargs) -> processor``; adding one is ``@register("family_name")``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from llava_normaligned.anatomy import family_of

BUILDERS: dict[str, Callable] = {}


def register(*family_names: str):
    def add(builder):
        for name in family_names:
            BUILDERS[name] = builder
        return builder

    return add


def load_processor(model_id: str, config, *, revision: str | None = None, trust_remote_code=None):
    """The processor of ``model_id``: its family's builder when it has one, else ``AutoProcessor``'s."""
    family = family_of(config)
    builder = BUILDERS.get(family.name) if family is not None else None
    if builder is None:
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(model_id, revision=revision, trust_remote_code=trust_remote_code)
    return builder(model_id, config, revision=revision, trust_remote_code=trust_remote_code)


# ----------------------------------------------------------------------------------------------- the processor


class ExpandingProcessor:
    """A tokenizer, an image processor and a placeholder expansion, called like a transformers processor.

    ``expand(texts, images) -> (expanded texts, image tensors)`` replaces each image placeholder of each text by the
    tokens the model expects for that image. ``token_types``: also return ``mm_token_type_ids`` (1 at image tokens),
    which Qwen's M-RoPE positions need."""

    def __init__(self, tokenizer, image_processor, chat_template, image_token: str, expand, token_types=False):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.chat_template = chat_template
        self.image_token = image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self._expand = expand
        self.token_types = token_types

    def apply_chat_template(self, messages, **kwargs):
        kwargs.setdefault("tokenize", False)  # a processor's default: the formatted text
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, **kwargs)

    def expand(self, texts: list[str], images) -> tuple[list[str], dict]:
        """(texts with every placeholder expanded, the image processor's tensors)."""
        return self._expand(self, list(texts), images)

    def __call__(self, text=None, images=None, return_tensors="pt", padding=True, add_special_tokens=True, **kwargs):
        from transformers import BatchFeature

        texts = [text] if isinstance(text, str) else list(text)
        pixels = {}
        if images is not None:
            texts, pixels = self.expand(texts, images)
        encoded = dict(self.tokenizer(texts, return_tensors=return_tensors, padding=padding,
                                      add_special_tokens=add_special_tokens, **kwargs))
        if self.token_types:
            encoded["mm_token_type_ids"] = (encoded["input_ids"] == self.image_token_id).int()
        return BatchFeature({**encoded, **pixels})  # what transformers' processors return (``.to(device)``)

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)


def _replace_each(text: str, placeholder: str, replacements) -> str:
    """``text`` with its k-th ``placeholder`` replaced by ``next(replacements)``."""
    pieces = text.split(placeholder)
    return pieces[0] + "".join(next(replacements) + piece for piece in pieces[1:])


def _check_counts(texts: list[str], placeholder: str, per_text: list[int]):
    counts = [t.count(placeholder) for t in texts]
    if counts != per_text:
        raise ValueError(f"the prompts hold {counts} {placeholder} placeholders for {per_text} images (per prompt)")


# ------------------------------------------------------------------------------------------------- the parts


def _chat_template(model_id: str, tokenizer, hub_kwargs: dict) -> str | None:
    """The processor's chat template (``chat_template.jinja`` or ``chat_template.json``), else the tokenizer's."""
    from transformers.utils import cached_file

    for name in ("chat_template.jinja", "chat_template.json"):
        path = cached_file(model_id, name, revision=hub_kwargs.get("revision"),
                           _raise_exceptions_for_missing_entries=False,
                           _raise_exceptions_for_connection_errors=False)
        if path:
            with open(path, encoding="utf-8") as f:
                return f.read() if name.endswith(".jinja") else json.load(f)["chat_template"]
    return getattr(tokenizer, "chat_template", None)


def _checked(processor: ExpandingProcessor, config, model_id: str) -> ExpandingProcessor:
    """The tokenizer's image token must be the model's (``config.image_token_id``): else no image would be placed."""
    expected = getattr(config, "image_token_id", None)
    if expected is not None and processor.image_token_id != expected:
        raise ValueError(f"{model_id}: the tokenizer's image token {processor.image_token!r} has id "
                         f"{processor.image_token_id}, the model's config.image_token_id is {expected}")
    return processor


def _parts(model_id: str, hub_kwargs: dict):
    import logging

    from transformers import AutoImageProcessor, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_id, **hub_kwargs)
    # without torchvision, AutoImageProcessor falls back to the family's PIL class and says so: that is expected here
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        image_processor = AutoImageProcessor.from_pretrained(model_id, **hub_kwargs)
    finally:
        logger.setLevel(level)
    return tokenizer, image_processor, _chat_template(model_id, tokenizer, hub_kwargs)


# ------------------------------------------------------------------------------------------- Qwen2/2.5/3-VL


def _expand_qwen(processor: ExpandingProcessor, texts: list[str], images):
    """``<|image_pad|>`` -> one per merged token: prod(grid_thw) / merge_size^2 (the chat template writes the
    ``<|vision_start|>`` / ``<|vision_end|>`` around it). ``images``: one flat list, in the order of the
    placeholders."""
    flat = [im for group in images for im in (group if isinstance(group, (list, tuple)) else [group])]
    placeholders = sum(t.count(processor.image_token) for t in texts)
    if placeholders != len(flat):
        raise ValueError(f"the prompts hold {placeholders} {processor.image_token} placeholders for {len(flat)} images")
    out = processor.image_processor(images=flat, return_tensors="pt")
    merge = processor.image_processor.merge_size
    runs = iter(processor.image_token * n for n in (out["image_grid_thw"].prod(-1) // merge**2).tolist())
    expanded = [_replace_each(t, processor.image_token, runs) for t in texts]
    return expanded, {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


@register("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
def build_qwen_vl(model_id: str, config, **hub_kwargs) -> ExpandingProcessor:
    tokenizer, image_processor, template = _parts(model_id, hub_kwargs)
    image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
    processor = ExpandingProcessor(tokenizer, image_processor, template, image_token, _expand_qwen, token_types=True)
    return _checked(processor, config, model_id)


# -------------------------------------------------------------------------------------------- Idefics3, SmolVLM


def _image_prompt(rows: int, cols: int, seq_len: int, tokens: dict) -> str:
    """Idefics3's / SmolVLM's image prompt: each tile ``<fake><row_i_col_j><image>*seq_len`` (a newline after each
    row of tiles), then the downscaled global image ``<fake><global-img><image>*seq_len<fake>``. An image that was not
    split (rows = cols = 0) is the global image alone."""
    fake, image, global_image = tokens["fake"], tokens["image"], tokens["global"]
    tiles = "".join(
        "".join(f"{fake}<row_{r + 1}_col_{c + 1}>" + image * seq_len for c in range(cols)) + "\n"
        for r in range(rows)
    )
    glue = "\n" if rows or cols else ""
    return tiles + glue + f"{fake}{global_image}" + image * seq_len + fake


def _expand_idefics3(processor: ExpandingProcessor, texts: list[str], images):
    # the image processor takes one list of images per prompt; a flat list is split by the prompts' placeholders
    per_text = [t.count(processor.image_token) for t in texts]
    if all(isinstance(im, (list, tuple)) for im in images):
        nested = [list(im) for im in images]
    else:
        flat, nested = list(images), []
        for count in per_text:
            nested, flat = nested + [flat[:count]], flat[count:]
        nested[-1] += flat  # more images than placeholders: refused below
    _check_counts(texts, processor.image_token, [len(n) for n in nested])
    out = processor.image_processor(images=nested, return_tensors="pt", return_row_col_info=True)
    expanded = []
    for text, rows, cols in zip(texts, out["rows"], out["cols"]):
        prompts = (_image_prompt(r, c, processor.image_seq_len, processor.idefics_tokens) for r, c in zip(rows, cols))
        expanded.append(_replace_each(text, processor.image_token, prompts))
    return expanded, {k: v for k, v in out.items() if k in ("pixel_values", "pixel_attention_mask")}


@register("idefics3", "smolvlm")
def build_idefics3(model_id: str, config, **hub_kwargs) -> ExpandingProcessor:
    tokenizer, image_processor, template = _parts(model_id, hub_kwargs)
    image_token = getattr(tokenizer, "image_token", None) or "<image>"
    processor = ExpandingProcessor(tokenizer, image_processor, template, image_token, _expand_idefics3)
    vision = config.vision_config
    # the connector's output length per tile, as the processors compute it (and the model checks)
    processor.image_seq_len = int((vision.image_size // vision.patch_size) ** 2 / config.scale_factor**2)
    processor.idefics_tokens = {
        "image": image_token,
        "fake": getattr(tokenizer, "fake_image_token", None) or "<fake_token_around_image>",
        "global": getattr(tokenizer, "global_image_token", None) or "<global-img>",
    }
    return _checked(processor, config, model_id)


__all__ = ["BUILDERS", "ExpandingProcessor", "build_idefics3", "build_qwen_vl", "load_processor", "register"]
