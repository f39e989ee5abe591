"""The processor a model's prompts and images go through: transformers' AutoProcessor, or the family's own builder.

Every family loads its processor with ``AutoProcessor`` where it can: transformers' own processor is what training
needs (it reports where each image tag was expanded) and what users load. Where it cannot, a family registered here
is built otherwise (``auto_first=True``: the builder is the fallback). Without torchvision the processors of
Qwen2-VL, Qwen2.5-VL, Qwen3-VL and SmolVLM (SmolVLM2) cannot load (they hold a video processor that needs it;
SmolVLM's also needs ``num2words``). Qwen's builder makes transformers' own processor class without its video part
(``without_video``) on the folder's PIL image processor, which trains like the stock one; SmolVLM's uses Idefics3's
class (the same image prompt), saved back as SmolVLM's. Where those cannot be built, the builders make an
``ExpandingProcessor`` from the family's parts, the folder's
tokenizer, its image processor (the PIL one when the fast one needs torchvision; ``AutoImageProcessor`` picks it), its
chat template, and the family's placeholder expansion. It is called like a transformers processor and returns what
the model's forward takes: enough to diagnose and generate, not to train. LLaVA-OneVision's, InternVL's
and Mistral3's processors need torchvision too; their builders use transformers' processor classes without the
video part, or a Pixtral-layout processor written here. Idefics3's processor needs no torchvision.

    processor = load_processor("path/or/org/name", config)        # AutoProcessor, or the family's builder
    BUILDERS["qwen2_vl"]                                           # a family's builder, by ``Family.name``

A builder is ``builder(model_id, config, **hub_kwargs) -> processor``; adding one is ``@register("family_name")``.
Every command that loads a model (train, generate, eval, diagnose) takes its processor from here
(``llava_normaligned.loading``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .anatomy import family_of

# Those whose transformers processor ``train`` can build without torchvision (Qwen2/2.5/3-VL's without its video
# part, SmolVLM's images through Idefics3's class; Mistral3's imports it: ``train`` stops in one line where it is not
# installed; ``align`` and ``diagnose`` take every family).
TRAINS_WITHOUT_TORCHVISION = ("idefics3", "llava_next", "llava_onevision", "gemma3", "internvl", "qwen2_vl",
                              "qwen2_5_vl", "qwen3_vl", "smolvlm")


BUILDERS: dict[str, Callable] = {}  # Family.name -> its processor builder
AUTO_FIRST: set[str] = set()  # families whose builder is used only when AutoProcessor cannot load the folder


# what a processor that cannot be built raises (a missing package, file or attribute; a bad argument)
LOAD_ERRORS = (ImportError, ValueError, OSError, AttributeError, TypeError)


class ProcessorUnavailable(ValueError):
    """No processor can be built for a model's images (``AutoProcessor`` failed, and so did the family's builder)."""


def register(*family_names: str, auto_first: bool = False):
    def add(builder):
        for name in family_names:
            BUILDERS[name] = builder
            if auto_first:
                AUTO_FIRST.add(name)
        return builder

    return add


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def load_processor(model_id: str, config, *, revision: str | None = None, trust_remote_code=None):
    """The processor of ``model_id``: its family's builder when it has one, else ``AutoProcessor``'s. A family
    registered ``auto_first`` tries ``AutoProcessor`` first; when both fail, ``ProcessorUnavailable`` says why."""
    family = family_of(config)
    name = family.name if family is not None else None
    builder = BUILDERS.get(name)
    hub_kwargs = dict(revision=revision, trust_remote_code=trust_remote_code)
    if builder is None or name in AUTO_FIRST:
        from transformers import AutoProcessor

        try:
            return AutoProcessor.from_pretrained(model_id, **hub_kwargs)
        except LOAD_ERRORS as error:
            if builder is None:
                raise
            first = error
    if name not in AUTO_FIRST:
        return builder(model_id, config, **hub_kwargs)
    try:
        return builder(model_id, config, **hub_kwargs)
    except LOAD_ERRORS as error:
        raise ProcessorUnavailable(
            f"{model_id!r} has no processor for its images ({name}; AutoProcessor: {_one_line(first)}; built "
            f"without torchvision: {_one_line(error)})"
        ) from None


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


def read_file(model_id: str, filename: str, revision: str | None = None) -> str | None:
    """The text of ``filename`` in a folder or Hub repo; None when it has none."""
    from transformers.utils import cached_file

    path = cached_file(model_id, filename, revision=revision, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False)
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def read_json(model_id: str, filename: str, revision: str | None = None) -> dict:
    text = read_file(model_id, filename, revision)
    return json.loads(text) if text else {}


def chat_template(model_id: str, tokenizer, revision: str | None = None) -> str | None:
    """The processor's chat template (``chat_template.jinja``, or ``chat_template.json`` as older checkpoints hold
    it), else the tokenizer's."""
    template = read_file(model_id, "chat_template.jinja", revision)
    if template is None:
        template = read_json(model_id, "chat_template.json", revision).get("chat_template")
    return template or getattr(tokenizer, "chat_template", None)


def _checked(processor, config, model_id: str):
    """The tokenizer's image token must be the model's (``config.image_token_id``): else no image would be placed."""
    expected = getattr(config, "image_token_id", None)
    if expected is not None and getattr(processor, "image_token_id", expected) != expected:
        raise ValueError(f"{model_id}: the tokenizer's image token {processor.image_token!r} has id "
                         f"{processor.image_token_id}, the model's config.image_token_id is {expected}")
    return processor


def processor_parts(model_id: str, hub_kwargs: dict):
    """(tokenizer, image processor, chat template) of a folder or Hub repo, the parts every builder starts from."""
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
    return tokenizer, image_processor, chat_template(model_id, tokenizer, hub_kwargs.get("revision"))


# ------------------------------------------------------------------------------------------- Qwen2/2.5/3-VL


def expand_qwen(processor: ExpandingProcessor, texts: list[str], images):
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


QWEN_PROCESSORS = {  # family -> (module, class) of transformers' processor: its module imports no torchvision
    "qwen2_vl": ("transformers.models.qwen2_vl.processing_qwen2_vl", "Qwen2VLProcessor"),
    "qwen2_5_vl": ("transformers.models.qwen2_5_vl.processing_qwen2_5_vl", "Qwen2_5_VLProcessor"),
    "qwen3_vl": ("transformers.models.qwen3_vl.processing_qwen3_vl", "Qwen3VLProcessor"),
}


@register("qwen2_vl", "qwen2_5_vl", "qwen3_vl", auto_first=True)
def build_qwen_vl(model_id: str, config, **hub_kwargs):
    """Transformers' own Qwen2/2.5/3-VL processor without its video part (``without_video``), on the folder's PIL
    image processor and tokenizer: the processor training needs (``train``, as with torchvision), with the family's
    own placeholder expansion, ``image_grid_thw`` and ``mm_token_type_ids``. Where that class cannot be built (an
    older transformers whose processor module imports torchvision), the ``ExpandingProcessor``, which diagnoses and
    generates but does not train."""
    import importlib

    family = family_of(config)
    module, name = QWEN_PROCESSORS[family.name]
    try:
        processor_class = getattr(importlib.import_module(module), name)
        image_processor, tokenizer, kwargs = _saved_parts(model_id, hub_kwargs.get("revision"),
                                                          hub_kwargs.get("trust_remote_code"))
        processor = without_video(processor_class)(image_processor, tokenizer, **kwargs)
        processor.video_config = video_config_of(model_id, hub_kwargs.get("revision"))
    except LOAD_ERRORS:
        tokenizer, image_processor, template = processor_parts(model_id, hub_kwargs)
        image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        processor = ExpandingProcessor(tokenizer, image_processor, template, image_token, expand_qwen,
                                       token_types=True)
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


@register("smolvlm", auto_first=True)
def build_smolvlm(model_id: str, config, **hub_kwargs):
    """SmolVLM's images go through Idefics3's processor class (the same tile and global-image prompt; SmolVLM's own
    adds video and needs torchvision and ``num2words``), on the folder's PIL image processor and tokenizer, saved back
    as ``SmolVLMProcessor`` with the folder's video settings, so that the stock processor loads a trained folder where
    those packages are. Where it cannot be built, the ``ExpandingProcessor`` (diagnose and generate only)."""
    from transformers.models.idefics3.processing_idefics3 import Idefics3Processor

    try:
        image_processor, tokenizer, kwargs = _saved_parts(model_id, hub_kwargs.get("revision"),
                                                          hub_kwargs.get("trust_remote_code"))
        processor = without_video(Idefics3Processor, name="SmolVLMProcessor")(image_processor, tokenizer, **kwargs)
        processor.video_config = video_config_of(model_id, hub_kwargs.get("revision"))
    except LOAD_ERRORS:
        return build_idefics3(model_id, config, **hub_kwargs)
    return _checked(processor, config, model_id)


@register("idefics3", auto_first=True)
def build_idefics3(model_id: str, config, **hub_kwargs) -> ExpandingProcessor:
    tokenizer, image_processor, template = processor_parts(model_id, hub_kwargs)
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


# ------------------------------------------------------------------------------- the LLaVA-like families
#
# AutoProcessor cannot load every family's folder without torchvision: LLaVA-OneVision's and InternVL's processors
# build a video processor, which needs it, and Pixtral's processor (Mistral3) imports it. Their images need none of
# it, so their builders (``auto_first``: used when AutoProcessor fails) are
# - LLaVA-OneVision, InternVL: transformers' own processor class without its video part, so that the placeholder
#   expansion (anyres unpadding and newline rows; ``<img>`` + ``<IMG_CONTEXT>`` x tiles x 256 + ``</img>``) is
#   transformers' code, run on the folder's image processor and tokenizer;
# - Mistral3: a Pixtral-layout processor written here (its module imports torchvision): each image becomes rows of
#   ``[IMG]`` tokens, one per merged patch, each row ending in ``[IMG_BREAK]``, the last in ``[IMG_END]``.


def _saved_parts(name: str, revision: str | None, trust_remote_code):
    """(image processor, tokenizer, the processor's saved keyword arguments) of a folder or Hub repo."""
    tokenizer, image_processor, template = processor_parts(name, {"revision": revision,
                                                                  "trust_remote_code": trust_remote_code})
    kwargs = read_json(name, "processor_config.json", revision)
    for key in ("processor_class", "auto_map", "image_processor", "tokenizer", "video_processor", "chat_template"):
        kwargs.pop(key, None)  # not arguments (transformers 5 saves the sub-processors' configs inline)
    kwargs["chat_template"] = template
    return image_processor, tokenizer, kwargs


def without_video(processor_class, name: str | None = None):
    """``processor_class`` with an image processor and a tokenizer only. ``ProcessorMixin`` takes its parts, and the
    settings ``save_pretrained`` writes, from the ``__init__`` signature: the subclass's is the stock one without the
    video processor, so that a saved processor keeps its settings (``num_image_tokens``, ``patch_size``, ...).
    ``video_config``: the source folder's video processor settings (``video_config_of``), written back into the saved
    ``processor_config.json``, so that the folder a training run saves loads with the stock processor, video part
    included, where torchvision is installed."""
    import inspect

    class ImagesOnly(processor_class):
        video_config: dict | None = None

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)

        def save_pretrained(self, save_directory, *args, **kwargs):
            out = super().save_pretrained(save_directory, *args, **kwargs)
            if self.video_config:
                _add_to_processor_config(save_directory, "video_processor", self.video_config)
            return out

    stock = inspect.signature(processor_class.__init__)
    ImagesOnly.__init__.__signature__ = stock.replace(
        parameters=[p for name, p in stock.parameters.items() if name != "video_processor"])
    # the name ``save_pretrained`` records as ``processor_class`` (what AutoProcessor loads the folder with)
    ImagesOnly.__name__ = ImagesOnly.__qualname__ = name or processor_class.__name__
    return ImagesOnly


def _add_to_processor_config(folder: str, key: str, value) -> None:
    """Set ``key`` in ``folder/processor_config.json`` where it is absent (written to a temporary file, then moved
    into place)."""
    import os

    path = os.path.join(folder, "processor_config.json")
    data = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    if key in data:
        return
    data[key] = value
    staging = f"{path}.tmp"
    with open(staging, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(staging, path)


def video_config_of(name: str, revision: str | None = None) -> dict | None:
    """A folder's or Hub repo's video processor settings: inline in ``processor_config.json`` (transformers 5), or
    ``video_preprocessor_config.json`` (as the Hub's Qwen-VL and SmolVLM repos hold them); None without either."""
    inline = read_json(name, "processor_config.json", revision).get("video_processor")
    return inline or read_json(name, "video_preprocessor_config.json", revision) or None


def _images_only(processor_class):
    def load(name: str, config=None, revision: str | None = None, trust_remote_code=None):
        image_processor, tokenizer, kwargs = _saved_parts(name, revision, trust_remote_code)
        processor = without_video(processor_class())(image_processor, tokenizer, **kwargs)
        processor.video_config = video_config_of(name, revision)
        return processor

    return load


def _llava_onevision_class():
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    return LlavaOnevisionProcessor


def _internvl_class():
    from transformers.models.internvl.processing_internvl import InternVLProcessor

    return InternVLProcessor


llava_onevision = register("llava_onevision", auto_first=True)(_images_only(_llava_onevision_class))
internvl = register("internvl", auto_first=True)(_images_only(_internvl_class))


class PixtralLayoutProcessor:
    """Mistral3's prompts and images as Pixtral's processor makes them, without torchvision. One ``[IMG]`` per
    ``patch_size * spatial_merge_size`` square of the resized image, a ``[IMG_BREAK]`` after each row, the last one
    replaced by ``[IMG_END]``."""

    def __init__(self, image_processor, tokenizer, patch_size: int = 16, spatial_merge_size: int = 1,
                 chat_template=None, image_token="[IMG]", image_break_token="[IMG_BREAK]",
                 image_end_token="[IMG_END]", **kwargs):
        self.image_processor, self.tokenizer = image_processor, tokenizer
        self.patch_size, self.spatial_merge_size = patch_size, spatial_merge_size
        self.chat_template = chat_template or tokenizer.chat_template
        self.image_token, self.image_break_token, self.image_end_token = image_token, image_break_token, image_end_token

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, **kwargs)

    def placeholder(self, height: int, width: int) -> str:
        side = self.patch_size * self.spatial_merge_size
        row = self.image_token * (width // side) + self.image_break_token
        return (row * (height // side))[: -len(self.image_break_token)] + self.image_end_token

    def __call__(self, text=None, images=None, return_tensors="pt", **kwargs) -> dict:
        texts = [text] if isinstance(text, str) else list(text)
        out = {}
        if images is not None:
            pixels = self.image_processor(images, return_tensors="pt")
            sizes = pixels["image_sizes"].tolist()  # (h, w) after resizing, before padding
            it = iter(sizes)
            expanded = []
            for sample in texts:
                pieces = sample.split(self.image_token)
                expanded.append(pieces[0] + "".join(self.placeholder(*next(it)) + p for p in pieces[1:]))
            texts = expanded
            out.update(pixel_values=pixels["pixel_values"], image_sizes=pixels["image_sizes"])
        out.update(self.tokenizer(texts, return_tensors=return_tensors, **kwargs))
        return out


@register("mistral3", auto_first=True)
def mistral3(name: str, config=None, revision: str | None = None, trust_remote_code=None):
    image_processor, tokenizer, kwargs = _saved_parts(name, revision, trust_remote_code)
    return PixtralLayoutProcessor(image_processor, tokenizer, **kwargs)


__all__ = ["AUTO_FIRST", "BUILDERS", "ExpandingProcessor", "PixtralLayoutProcessor", "ProcessorUnavailable",
           "TRAINS_WITHOUT_TORCHVISION", "build_idefics3", "build_qwen_vl", "load_processor", "register",
           "without_video"]
