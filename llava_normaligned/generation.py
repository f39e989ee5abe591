"""Answer prompts about images with a loaded LLaVA-style model: one prompt streamed, or many in left-padded batches.

A prompt is plain text; its images become `{"type": "image"}` parts of one user message, rendered by the processor's
chat template, so the image token is placed by the template, never typed by the caller.

    model, processor = load_model("./llava-na-3b", quantization="4bit")
    generate_batch(model, processor, ["What colour is the shape?", "Describe both."], [img, [img_a, img_b]])
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence

import torch
from PIL import Image, UnidentifiedImageError

from .families.anatomy import family_of, vision_dtype
from .families.tokens import IMAGE_TOKEN

ImageLike = Image.Image | str | os.PathLike


# ------------------------------------------------------------------------------------------------------ images


def open_image(source: ImageLike) -> Image.Image:
    """Opens an image as RGB.

    Args:
        source (`PIL.Image.Image`, `str` or `os.PathLike`):
            An image, or the path of an image file.

    Returns:
        `PIL.Image.Image`: The image in RGB mode (`source` itself when it is already an RGB image).

    Raises:
        `FileNotFoundError`: If the path is not a file.
        `ValueError`: If PIL cannot read the file; the message names the path.
    """
    if isinstance(source, Image.Image):
        return source.convert("RGB") if source.mode != "RGB" else source
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"image not found: {path}")
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{path}: not an image PIL can read ({error})") from None


def check_image_path(path: str | os.PathLike) -> None:
    """Checks that a path is an image file PIL can read (its header only), so that a bad path fails before a
    model loads.

    Args:
        path (`str` or `os.PathLike`):
            The image file.

    Raises:
        `FileNotFoundError`: If the path is not a file.
        `ValueError`: If PIL cannot read the file's header.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"image not found: {path}")
    try:
        with Image.open(path):  # reads the header only
            pass
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{path}: not an image PIL can read ({error})") from None


def _images_per_prompt(images, n_prompts: int) -> list[list[ImageLike]]:
    """Normalise ``images`` to one list per prompt: None, an image, or a list of images each."""
    if images is None:
        return [[] for _ in range(n_prompts)]
    if isinstance(images, (Image.Image, str, os.PathLike)):
        raise TypeError("images: expected one entry per prompt (None, an image, or a list of images), got one image")
    images = list(images)
    if len(images) != n_prompts:
        raise ValueError(f"images: {len(images)} entries for {n_prompts} prompts; give one entry (or None) per prompt")
    per_prompt = []
    for entry in images:
        if entry is None:
            per_prompt.append([])
        elif isinstance(entry, (Image.Image, str, os.PathLike)):
            per_prompt.append([entry])
        else:
            per_prompt.append(list(entry))
    return per_prompt


# ----------------------------------------------------------------------------------------------------- prompts


def build_messages(prompt: str, n_images: int, system: str | None = None) -> list[dict]:
    """Builds the chat messages of one prompt: a user turn with the image parts, then the text (LLaVA-1.5 puts the
    image before the question).

    Args:
        prompt (`str`):
            The question.
        n_images (`int`):
            The number of `{"type": "image"}` parts.
        system (`str`, *optional*):
            A system message, put first when given (and not empty).

    Returns:
        `list[dict]`: The messages, each content a list of parts.
    """
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": prompt}]
    messages = [{"role": "user", "content": content}]
    if system:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": system}]})
    return messages


def render_prompt(processor, prompt: str, n_images: int, system: str | None = None) -> str:
    """Renders a prompt as the model sees it: the chat template applied, ending with the assistant's turn opener.

    Args:
        processor (`ProcessorMixin`):
            The model's processor, with a chat template.
        prompt (`str`):
            The question, without image tokens.
        n_images (`int`):
            The number of images that go with it.
        system (`str`, *optional*):
            A system message.

    Returns:
        `str`: The rendered prompt text.

    Raises:
        `TypeError`: If `prompt` is not a string.
        `ValueError`: If `prompt` contains the processor's image token (the template places one per image), or the
        processor has no chat template.
    """
    if not isinstance(prompt, str):
        raise TypeError(f"prompt: expected a string, got {type(prompt).__name__}")
    image_token = getattr(processor, "image_token", None) or getattr(processor.tokenizer, "image_token", None)
    if image_token and image_token in prompt:
        raise ValueError(
            f"prompt {prompt[:60]!r} contains the image token {image_token!r}: pass images separately; the chat "
            "template places one image token per image"
        )
    if not getattr(processor, "chat_template", None):
        raise ValueError("the processor has no chat template; this model cannot be prompted with chat messages")
    return processor.apply_chat_template(build_messages(prompt, n_images, system), add_generation_prompt=True)


# -------------------------------------------------------------------------------------------------- generation


def _padding_token(tokenizer) -> str | None:
    """The token to pad with when the tokenizer has none (Llama-3's): its EOS. Padding positions are masked out, so
    which token fills them does not change the answers. None when the tokenizer has a pad token."""
    if tokenizer.pad_token is not None:
        return None
    if tokenizer.eos_token is None:
        raise ValueError(
            f"the tokenizer ({type(tokenizer).__name__}) has neither a pad nor an EOS token, so prompts cannot be "
            "batched: set processor.tokenizer.pad_token"
        )
    return tokenizer.eos_token


def prepare_inputs(model, processor, prompts: Sequence[str], images: list[list[ImageLike]], system: str | None = None):
    """Tokenises a batch of prompts with their images, left-padded (generation appends on the right).

    The tokenizer's padding side, and its pad token (set to EOS for the call when it has none), are restored afterwards.

    Args:
        model (`PreTrainedModel`):
            The model; gives the device and the vision tower's dtype.
        processor (`ProcessorMixin`):
            The model's processor.
        prompts (`Sequence[str]`):
            The prompts.
        images (`list[list]`):
            One list of images (PIL images or paths) per prompt, possibly empty.
        system (`str`, *optional*):
            A system message for every prompt.

    Returns:
        `BatchFeature`: The processor's output on the model's device: `input_ids` and `attention_mask` of shape
        `(batch_size, sequence_length)`, and, when there are images, `pixel_values` in the vision tower's dtype (its
        shape is the family processor's, e.g. `(num_images, num_channels, height, width)` for LLaVA).

    Raises:
        `TypeError`, `ValueError`, `FileNotFoundError`: As `render_prompt` and `open_image` raise them, and a
        `ValueError` when the tokenizer has neither a pad nor an EOS token.
    """
    texts = [render_prompt(processor, p, len(imgs), system) for p, imgs in zip(prompts, images)]
    flat = [open_image(image) for imgs in images for image in imgs]
    tokenizer = processor.tokenizer
    side, pad = tokenizer.padding_side, _padding_token(tokenizer)
    tokenizer.padding_side = "left"
    if pad is not None:
        tokenizer.pad_token = pad
    try:
        inputs = processor(images=flat or None, text=texts, padding=True, return_tensors="pt")
    finally:
        tokenizer.padding_side = side
        if pad is not None:
            tokenizer.pad_token = None
    inputs = inputs.to(model.device)
    if "pixel_values" in inputs:
        inputs["pixel_values"] = inputs["pixel_values"].to(vision_dtype(model))
    return inputs


def _pad_token_id(model, tokenizer) -> int:
    """What ``generate`` pads finished rows with when the model's generation config names nothing: the tokenizer's
    pad token, else EOS (the tokenizer's, else the generation config's first)."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, model.generation_config.eos_token_id):
        if isinstance(candidate, (list, tuple)):
            candidate = candidate[0] if candidate else None
        if candidate is not None:
            return int(candidate)
    raise ValueError("neither the tokenizer nor the generation config has a pad or EOS token id: set one")


# Placeholders a model must never generate. A generated image token has no image features behind it, so the next
# decoding step fails ("Image features and image tokens do not match"); a small or untrained model can pick one
# greedily. The others (video, vision start/end, Idefics3's fake-token-around-image, global-image tag and tile-position
# tokens) only mean something where the processor wrote them around image features.
PLACEHOLDER_CONFIG_KEYS = (
    "image_token_id", "image_token_index", "video_token_id", "video_token_index",  # LLaVA family, Qwen-VL, Gemma3
    "vision_start_token_id", "vision_end_token_id",  # Qwen2/2.5/3-VL
    "boi_token_index", "eoi_token_index", "boi_token_id", "eoi_token_id",  # Gemma3's start/end of image
)
PLACEHOLDER_TOKEN_ATTRIBUTES = (  # on the processor or its tokenizer, each a token string
    "image_token", "video_token", "vision_start_token", "vision_end_token", "boi_token", "eoi_token",
    "fake_image_token", "global_image_tag", "start_image_token", "end_image_token", "image_start_token",
    "image_end_token", "image_break_token", "context_image_token",
)
PLACEHOLDER_TOKEN_PATTERN = re.compile(  # added tokens matched by name
    r"^(<row_\d+_col_\d+>|<fake_token_around_image>|<global-img>"  # Idefics3 / SmolVLM tiles
    r"|<\|(image|video|vision)_(pad|start|end)\|>"  # Qwen-VL
    r"|<start_of_image>|<end_of_image>|<image_soft_token>"  # Gemma3
    r"|\[IMG\]|\[IMG_BREAK\]|\[IMG_END\]"  # Mistral3 (Pixtral)
    r"|<IMG_CONTEXT>|<img>|</img>"  # InternVL
    r"|<IMG_(START|ATOM|GRID|COL|ROW|END)>"  # Ovis2's visual atoms and indicator tokens
    r"|<image>|<video>)$"
)


def placeholder_token_ids(model, processor) -> list[int]:
    """Lists the token ids decoding must never emit; `generate`, `eval` and `diagnose` all suppress exactly these.

    A generated image token has no image features behind it, so the next decoding step fails; the other placeholders
    only mean something where the processor wrote them around image features. The ids are the image and video
    placeholders, vision start/end markers, Idefics3/SmolVLM's tile tokens, Gemma3's start/end of image, Pixtral's row
    break and end, InternVL's `<img>`/`</img>` and Ovis2's indicator tokens, read from the model's config (and its
    family's `Family.placeholder_token_ids`), the processor and the tokenizer's added tokens.

    Args:
        model (`PreTrainedModel`):
            The model; its config and generation config are read.
        processor (`ProcessorMixin` or `PreTrainedTokenizerBase`):
            The processor, or a tokenizer.

    Returns:
        `list[int]`: The ids, sorted, without EOS ids and ids outside the text vocabulary (a token string that the
        tokenizer maps to its unknown token is skipped).
    """
    config = getattr(model, "config", None)
    tokenizer = getattr(processor, "tokenizer", processor)
    ids = {getattr(config, key, None) for key in PLACEHOLDER_CONFIG_KEYS}
    family = family_of(config) if config is not None else None
    if family is not None:
        ids.update(family.placeholder_token_ids(config))
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else None
    eos = set(_as_list(getattr(tokenizer, "eos_token_id", None))) | set(
        _as_list(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    )
    unknown = getattr(tokenizer, "unk_token_id", None)
    tokens = set()
    for owner in (processor, tokenizer):
        for key in PLACEHOLDER_TOKEN_ATTRIBUTES:
            token = getattr(owner, key, None)
            token = getattr(token, "content", token)  # an AddedToken
            if isinstance(token, str) and token:
                tokens.add(token)
    added = getattr(tokenizer, "get_added_vocab", None)
    if callable(added):
        tokens |= {token for token in added() if PLACEHOLDER_TOKEN_PATTERN.match(token)}
    for token in tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != unknown:
            ids.add(token_id)
    vocab = getattr(text_config, "vocab_size", None)
    return sorted(
        i for i in ids if isinstance(i, int) and i >= 0 and i not in eos and (vocab is None or i < vocab)
    )


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _generate_kwargs(model, processor, max_new_tokens: int, temperature: float, **extra) -> dict:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    suppressed = (  # the caller's, the checkpoint's generation config's, and the placeholders
        set(_as_list(extra.pop("suppress_tokens", None)))
        | set(_as_list(getattr(getattr(model, "generation_config", None), "suppress_tokens", None)))
        | set(placeholder_token_ids(model, processor))
    )
    kwargs = dict(max_new_tokens=max_new_tokens, suppress_tokens=sorted(suppressed), **extra)
    if temperature and temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature)
    else:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if getattr(model.generation_config, "pad_token_id", None) is None:
        kwargs["pad_token_id"] = _pad_token_id(model, processor.tokenizer)
    return kwargs


def _batches(n: int, batch_size: int) -> Iterator[range]:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for start in range(0, n, batch_size):
        yield range(start, min(start + batch_size, n))


def without_image_tags(text: str, *tags: str | None) -> str:
    """Takes typed image tags out of a prompt's text, as the model is given it.

    The one rule for every reader of LLaVA-format questions: the evaluation engines, the demo's scorer and `train`'s
    held-out accuracy.

    Args:
        text (`str`):
            The prompt text.
        *tags (`str` or `None`):
            Tags to remove besides LLaVA's `<image>`, e.g. a processor's own image token; `None` entries are skipped.

    Returns:
        `str`: The text without the tags, outer white space trimmed.
    """
    for tag in (IMAGE_TOKEN, *tags):
        if tag:
            text = text.replace(tag, "")
    return text.strip()


def generate_batch(
    model,
    processor,
    prompts: Sequence[str],
    images=None,
    *,
    max_new_tokens: int = 128,
    batch_size: int = 8,
    temperature: float = 0.0,
    system: str | None = None,
    **generate_kwargs,
) -> list[str]:
    """Answers prompts in batches.

    Args:
        model (`PreTrainedModel`):
            The model.
        processor (`ProcessorMixin`):
            Its processor, with a chat template.
        prompts (`Sequence[str]`):
            The prompts (a single string is refused).
        images (`Sequence`, *optional*):
            One entry per prompt: `None`, an image (PIL image or path), or a list of images.
        max_new_tokens (`int`, *optional*, defaults to 128):
            The most tokens generated per answer.
        batch_size (`int`, *optional*, defaults to 8):
            Prompts per `generate` call.
        temperature (`float`, *optional*, defaults to 0.0):
            Sampling temperature; greedy decoding unless it is > 0.
        system (`str`, *optional*):
            A system message for every prompt.
        **generate_kwargs:
            Passed to `model.generate`; `suppress_tokens` is merged with the generation config's and the placeholder
            tokens (`placeholder_token_ids`).

    Returns:
        `list[str]`: The answers, in the order of `prompts`, decoded without special tokens and stripped.

    Raises:
        `TypeError`: If `prompts` is a string, or `images` is a single image.
        `ValueError`: If `images` has not one entry per prompt, `max_new_tokens` or `batch_size` is < 1, or no pad
        token id can be found; and as `prepare_inputs` raises it (as do `FileNotFoundError` for a missing image).
    """
    if isinstance(prompts, str):
        raise TypeError("prompts: expected a list of strings, got one string")
    prompts = list(prompts)
    per_prompt = _images_per_prompt(images, len(prompts))
    kwargs = _generate_kwargs(model, processor, max_new_tokens, temperature, **generate_kwargs)
    answers: list[str] = []
    for batch in _batches(len(prompts), batch_size):
        inputs = prepare_inputs(model, processor, [prompts[i] for i in batch], [per_prompt[i] for i in batch], system)
        output = model.generate(**inputs, **kwargs)  # (B, prompt_len + new)
        new_tokens = output[:, inputs["input_ids"].shape[1] :]
        answers += [text.strip() for text in processor.batch_decode(new_tokens, skip_special_tokens=True)]
    return answers


@torch.inference_mode()
def stream_answer(
    model,
    processor,
    prompt: str,
    images: ImageLike | Sequence[ImageLike] | None = None,
    *,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    system: str | None = None,
    streamer=None,
    **generate_kwargs,
) -> str:
    """Answers one prompt, printing the answer to stdout as it is generated, or feeding `streamer`.

    Args:
        model (`PreTrainedModel`):
            The model.
        processor (`ProcessorMixin`):
            Its processor, with a chat template.
        prompt (`str`):
            The prompt.
        images (`PIL.Image.Image`, `str`, `os.PathLike` or a sequence of them, *optional*):
            `None`, one image (PIL image or path), or a list of images.
        max_new_tokens (`int`, *optional*, defaults to 256):
            The most tokens generated.
        temperature (`float`, *optional*, defaults to 0.0):
            Sampling temperature; greedy decoding unless it is > 0.
        system (`str`, *optional*):
            A system message.
        streamer (`BaseStreamer`, *optional*):
            Where the tokens go as they are generated, e.g. a `TextIteratorStreamer`; defaults to a `TextStreamer` that
            prints the answer without the prompt and special tokens.
        **generate_kwargs:
            Passed to `model.generate`, as in `generate_batch`.

    Returns:
        `str`: The whole answer, decoded without special tokens and stripped.

    Raises:
        `TypeError`: If `prompt` is not a string.
        `ValueError`: If `max_new_tokens` is < 1, or as `prepare_inputs` raises it.
    """
    from transformers import TextStreamer

    if not isinstance(prompt, str):
        raise TypeError(f"prompt: expected one string, got {type(prompt).__name__}")
    per_prompt = _images_per_prompt([images], 1)  # a single path is one image, not a sequence of characters
    if streamer is None:
        streamer = TextStreamer(processor.tokenizer, skip_prompt=True, skip_special_tokens=True)
    inputs = prepare_inputs(model, processor, [prompt], per_prompt, system)
    kwargs = _generate_kwargs(model, processor, max_new_tokens, temperature, **generate_kwargs)
    output = model.generate(**inputs, streamer=streamer, **kwargs)
    return processor.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)[0].strip()
