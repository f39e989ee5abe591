"""Processors and prompts of the LLaVA-like families whose stock processor cannot be loaded here, or whose prompts are
not a chat turn.

``AutoProcessor`` cannot load every family's folder without torchvision: LLaVA-OneVision's and InternVL's processors
build a video processor, which needs it, and Pixtral's processor (Mistral3) imports it. Their images need none of it.
``load_processor`` tries ``AutoProcessor`` first, then the family's offline builder (``PROCESSORS``), one function per
family with one signature ``(name, revision=None, trust_remote_code=None) -> processor``:

- LLaVA-OneVision, InternVL: transformers' own processor class without its video part, so that the placeholder
  expansion (anyres unpadding and newline rows; ``<img>`` + ``<IMG_CONTEXT>`` x tiles x 256 + ``</img>``) is
  transformers' code, run on the folder's image processor and tokenizer;
- Mistral3: a Pixtral-layout processor written here (its module imports torchvision): each image becomes rows of
  ``[IMG]`` tokens, one per merged patch, each row ending in ``[IMG_BREAK]``, the last in ``[IMG_END]``.

``BATCHES`` holds, per family, a ``make_batches`` with that function's signature, for a family whose prompt differs
from a chat turn: PaliGemma's prompt is ``<image> x N + BOS + prefix + "\\n"`` (its processor's layout), its image and
prefix attend bidirectionally (``token_type_ids`` 0) and what it generates is the causal suffix (1,
``anatomy.Family.generated_token_type``).
"""

from __future__ import annotations

import json
import os

import torch

from .config import DiagnosticsError
from .inputs import has_chat_template, make_batches


def _read(name: str, filename: str, revision: str | None) -> str | None:
    """The text of ``filename`` in a folder or Hub repo; None when it has none."""
    if os.path.isdir(name):
        path = os.path.join(name, filename)
        if not os.path.isfile(path):
            return None
    else:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            path = hf_hub_download(name, filename, revision=revision)
        except EntryNotFoundError:
            return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def _read_json(name: str, filename: str, revision: str | None) -> dict:
    text = _read(name, filename, revision)
    return json.loads(text) if text else {}


def _chat_template(name: str, revision: str | None, tokenizer) -> str | None:
    """The processor's chat template (``chat_template.jinja``, or ``chat_template.json`` as older checkpoints hold
    it), else the tokenizer's."""
    template = _read(name, "chat_template.jinja", revision)
    if template is None:
        template = _read_json(name, "chat_template.json", revision).get("chat_template")
    return template or tokenizer.chat_template


def _parts(name: str, revision: str | None, trust_remote_code):
    """(image processor, tokenizer, the processor's saved keyword arguments) of a folder or Hub repo."""
    from transformers import AutoImageProcessor, AutoTokenizer

    options = {"revision": revision, "trust_remote_code": trust_remote_code}
    kwargs = _read_json(name, "processor_config.json", revision)
    for key in ("processor_class", "auto_map", "image_processor", "tokenizer", "video_processor", "chat_template"):
        kwargs.pop(key, None)  # not arguments (transformers 5 saves the sub-processors' configs inline)
    tokenizer = AutoTokenizer.from_pretrained(name, **options)
    kwargs["chat_template"] = _chat_template(name, revision, tokenizer)
    return AutoImageProcessor.from_pretrained(name, **options), tokenizer, kwargs


def without_video(processor_class):
    """``processor_class`` with an image processor and a tokenizer only. ``ProcessorMixin`` takes its parts from the
    ``__init__`` signature, so the subclass's signature drops the video processor the class would build."""

    class ImagesOnly(processor_class):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, chat_template=chat_template, **kwargs)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = processor_class.__name__
    return ImagesOnly


def _images_only(processor_class):
    def load(name: str, revision: str | None = None, trust_remote_code=None):
        image_processor, tokenizer, kwargs = _parts(name, revision, trust_remote_code)
        return without_video(processor_class())(image_processor, tokenizer, **kwargs)

    return load


def _llava_onevision_class():
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    return LlavaOnevisionProcessor


def _internvl_class():
    from transformers.models.internvl.processing_internvl import InternVLProcessor

    return InternVLProcessor


llava_onevision = _images_only(_llava_onevision_class)
internvl = _images_only(_internvl_class)


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


def mistral3(name: str, revision: str | None = None, trust_remote_code=None):
    image_processor, tokenizer, kwargs = _parts(name, revision, trust_remote_code)
    return PixtralLayoutProcessor(image_processor, tokenizer, **kwargs)


def _one_line(error: Exception) -> str:
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


# model_type -> the family's processor, built without what needs torchvision
PROCESSORS = {"llava_onevision": llava_onevision, "internvl": internvl, "mistral3": mistral3}


def load_processor(name: str, revision: str | None = None, trust_remote_code=None, **hub_kwargs):
    """``AutoProcessor.from_pretrained``, or, when it fails for a family of ``PROCESSORS`` (a part needs
    torchvision), that family's processor built without it. Raises DiagnosticsError naming what is missing."""
    from transformers import AutoConfig, AutoProcessor

    try:
        return AutoProcessor.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code,
                                             **hub_kwargs)
    except (ImportError, ValueError, OSError, AttributeError, TypeError) as error:
        model_type = AutoConfig.from_pretrained(name, revision=revision,
                                                trust_remote_code=trust_remote_code).model_type
        build = PROCESSORS.get(model_type)
        if build is None:
            raise DiagnosticsError(
                f"cannot probe {name!r}: its processor cannot be loaded ({_one_line(error)})"
            ) from None
        try:
            return build(name, revision=revision, trust_remote_code=trust_remote_code)
        except (ImportError, ValueError, OSError, AttributeError, TypeError) as second:
            raise DiagnosticsError(
                f"cannot probe {name!r}: no processor for its images ({model_type}; {_one_line(second)})"
            ) from None


# ---------------------------------------------------------------------------------------------- PaliGemma


def paligemma_format(processor, prompt: str, with_image: bool) -> str:
    """PaliGemma's prompt: the image token (expanded by ``paligemma_encode``), BOS, the prefix, a newline. Its
    checkpoints carry no chat template; one that does is used."""
    if has_chat_template(processor):
        from .inputs import format_prompt

        return format_prompt(processor, prompt, with_image)
    return f"{processor.image_token if with_image else ''}{processor.tokenizer.bos_token}{prompt}\n"


def paligemma_encode(processor, texts: list[str], images) -> dict:
    """input_ids (image tokens x image_seq_length in place of the image token), attention_mask, token_type_ids (0:
    the image and the prefix, which attend to each other both ways) and pixel_values."""
    tokenizer = processor.tokenizer
    if images is not None:
        run = processor.image_token * processor.image_seq_length
        texts = [t.replace(processor.image_token, run, 1) for t in texts]
    encoded = dict(tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False))
    encoded["token_type_ids"] = torch.zeros_like(encoded["input_ids"])
    if images is not None:
        encoded["pixel_values"] = processor.image_processor(images, return_tensors="pt")["pixel_values"]
    return encoded


def paligemma_batches(processor, config, samples, batch_size: int, max_new_tokens: int, prompts_path="prompts"):
    return make_batches(processor, config, samples, batch_size, max_new_tokens, prompts_path,
                        format=paligemma_format, encode=paligemma_encode)


# ------------------------------------------------------------------------------------------------- Gemma3


def nested_encode(processor, texts: list[str], images) -> dict:
    """The generic encoding with one list of images per prompt (Gemma3's processor counts images per sample)."""
    from .inputs import _encode

    return _encode(processor, texts, None if images is None else [[image] for image in images])


def gemma3_batches(processor, config, samples, batch_size: int, max_new_tokens: int, prompts_path="prompts"):
    """The chat turn writes ``<start_of_image>``; the processor expands it to ``\n\n<start_of_image>`` +
    ``<image_soft_token>`` x mm_tokens_per_image + ``<end_of_image>\n\n`` and returns token_type_ids (1 on the
    soft tokens, which attend to each other both ways)."""
    return make_batches(processor, config, samples, batch_size, max_new_tokens, prompts_path, encode=nested_encode)


# model_type -> its make_batches, for a family whose prompt or encoding is not the generic one
BATCHES = {"paligemma": paligemma_batches, "gemma3": gemma3_batches}


def batches_for(config):
    """The ``make_batches`` of ``config``'s family."""
    return BATCHES.get(getattr(config, "model_type", None), make_batches)
