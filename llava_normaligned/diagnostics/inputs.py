"""Inputs of a diagnostics run: the image folder, the prompt file, and the batches a model's processor makes of them.

Each sample is one (image, prompt) pair, formatted with the model's chat template as a single user turn (image
first, then the prompt) followed by the assistant header. Every batch also carries the two ablated versions of its
samples that the blog post uses: the same prompt with a blank white image of the same size, and the same prompt
with no image at all.

Token groups. The non-padding positions of a formatted prompt are split three ways: the image tokens, the tokens of
the prompt's own text, and the rest, the "template" tokens (BOS, chat-template markers such as ``<|im_start|>``, role
names, the newlines the template writes). Template tokens are where real LLMs put their attention sinks, with
hidden-state norms many times the text's; counted as text they would decide the text statistics. They are reported
as their own group. The prompt's tokens are found by character offsets (a fast tokenizer re-encodes the formatted
string, and the tokens overlapping the prompt's span are the text); without offsets, every token that is not a
special token counts as text, and the run records which rule it used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .config import DiagnosticsError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff")
BLANK_RGB = (255, 255, 255)


@dataclass
class Sample:
    image_path: str
    prompt: str
    prompt_line: int  # 1-based line of the prompt file, for error messages


def list_images(folder: str) -> list[str]:
    """The image files directly inside ``folder``, sorted by name."""
    if not os.path.isdir(folder):
        raise DiagnosticsError(f"--images: {folder!r} is not a folder")
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(IMAGE_EXTENSIONS))
    if not names:
        raise DiagnosticsError(
            f"--images: the folder {folder!r} holds no image files (looked for {', '.join(IMAGE_EXTENSIONS)})"
        )
    return [os.path.join(folder, n) for n in names]


def load_prompts(path: str) -> list[tuple[int, str]]:
    """(line number, prompt) for every non-blank line of ``path`` that does not start with '#'."""
    if not os.path.isfile(path):
        raise DiagnosticsError(f"--prompts: {path!r} is not a file")
    with open(path, encoding="utf-8") as f:
        prompts = [(i, line.strip()) for i, line in enumerate(f, 1) if line.strip() and not line.startswith("#")]
    if not prompts:
        raise DiagnosticsError(f"--prompts: {path!r} holds no prompt (one per line; '#' starts a comment line)")
    return prompts


def open_image(path: str):
    """The image in RGB (``generation.open_image``, shared with ``generate``), or a DiagnosticsError naming it."""
    from llava_normaligned.generation import open_image as open_rgb

    try:
        return open_rgb(path)
    except (OSError, ValueError) as err:
        raise DiagnosticsError(f"--images: cannot read image {path!r}: {err}") from err


def pair_samples(image_paths: list[str], prompts: list[tuple[int, str]], max_samples: int) -> list[Sample]:
    """At most ``max_samples`` (image, prompt) pairs. First image k with prompt k (both cycled), so that every image
    and every prompt is used before any pair repeats one; then the other pairs of the full product, each image with
    the next prompts in turn. No pair occurs twice."""
    n_images, n_prompts = len(image_paths), len(prompts)
    order = [(k % n_images, k % n_prompts) for k in range(max(n_images, n_prompts))]
    seen = set(order)
    for shift in range(n_prompts):
        for i in range(n_images):
            pair = (i, (i + shift) % n_prompts)
            if pair not in seen:
                seen.add(pair)
                order.append(pair)
    return [Sample(image_paths[i], prompts[p][1], prompts[p][0]) for i, p in order[:max_samples]]


# -------------------------------------------------------------------------------------------- formatting


def image_token(processor) -> str:
    token = getattr(processor, "image_token", None) or getattr(processor.tokenizer, "image_token", None)
    if token is None:
        raise DiagnosticsError("the processor has no image token (processor.image_token): cannot place the image")
    return token


def has_chat_template(processor) -> bool:
    return bool(getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None))


def format_prompt(processor, prompt: str, with_image: bool) -> str:
    """The prompt as the model sees it at the start of an answer: a user turn, then the assistant header."""
    if has_chat_template(processor):
        content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": prompt}]
        messages = [{"role": "user", "content": content}]
        return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    # LLaVA-1.5's own format, for stock checkpoints saved without a chat template.
    return f"USER: {image_token(processor) + chr(10) if with_image else ''}{prompt} ASSISTANT:"


# ---------------------------------------------------------------------------------------------- token groups

TEXT_RULE_SPAN = "prompt-span"  # the tokens overlapping the prompt's characters
TEXT_RULE_SPECIAL = "non-special"  # every token that is not a special token (no offsets available)


def special_token_ids(tokenizer) -> set[int]:
    """The tokenizer's special tokens: its named ones (BOS, EOS, pad...) and every added token marked special (chat
    markers such as ``<|im_start|>`` are often only the latter)."""
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if token.special)
    return ids


def _prompt_flags(tokenizer, text: str, prompt: str, row: list[int], image_token_id, special: set[int],
                  add_special_tokens: bool) -> list[bool] | None:
    """For each token of ``row`` (the processor's ids of ``text``, padding removed): does it hold the prompt's text?
    ``text`` is re-encoded with offsets; its single image token stands for the run of image tokens the processor
    expanded it to. A processor that writes other tokens around that run (Gemma3's ``<start_of_image>`` ...
    ``<end_of_image>``, InternVL's ``<img>``, Pixtral's row breaks, Ovis's indicators) lines up by the common tail
    instead: when every prompt token of the re-encoding lies in the tail that both encodings share, those are the
    prompt's tokens in ``row``. None when the offsets are unavailable or the encodings do not line up."""
    start = text.rfind(prompt)
    if start < 0 or not prompt:
        return None
    end = start + len(prompt)
    try:
        encoded = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):  # a slow tokenizer has no offsets
        return None
    ids = list(encoded["input_ids"])
    own = [token not in special and first < end and last > start  # overlaps the prompt's characters
           for token, (first, last) in zip(ids, encoded["offset_mapping"])]
    flags = _aligned_flags(ids, own, row, image_token_id)
    return flags if flags is not None else _tail_flags(ids, own, row)


def _aligned_flags(ids: list[int], own: list[bool], row: list[int], image_token_id) -> list[bool] | None:
    flags, i, previous = [], 0, None
    for token, is_prompt in zip(ids, own):
        if token == image_token_id and previous == image_token_id:
            continue  # ``text`` already expanded: its run of image tokens was consumed at the run's first token
        previous = token
        if token == image_token_id:
            run = 0
            while i < len(row) and row[i] == image_token_id:
                flags.append(False)
                i, run = i + 1, run + 1
            if run == 0:
                return None
            continue
        if i >= len(row) or row[i] != token:
            return None
        flags.append(is_prompt)
        i += 1
    return flags if i == len(row) else None


def _tail_flags(ids: list[int], own: list[bool], row: list[int]) -> list[bool] | None:
    shared = 0
    while shared < min(len(ids), len(row)) and ids[-1 - shared] == row[-1 - shared]:
        shared += 1
    if not shared or any(own[: len(ids) - shared]):
        return None
    return [False] * (len(row) - shared) + own[len(ids) - shared :]


def prompt_text_mask(processor, texts: list[str], prompts: list[str], encoded: dict, image_token_id,
                     rule: str = TEXT_RULE_SPAN) -> tuple[torch.Tensor, str]:
    """(B, S) bool over ``encoded`` (left-padded ids of ``texts``): the positions of each prompt's own text, and the
    rule that found them: ``TEXT_RULE_SPAN``, or ``TEXT_RULE_SPECIAL`` when asked or when a row cannot be aligned."""
    tokenizer = processor.tokenizer
    special = special_token_ids(tokenizer)
    ids, valid = encoded["input_ids"], encoded["attention_mask"].bool()
    fallback = valid & ~torch.isin(ids, torch.tensor(sorted(special | {image_token_id})))
    if rule == TEXT_RULE_SPECIAL:
        return fallback, TEXT_RULE_SPECIAL
    mask = torch.zeros_like(valid)
    for b, (text, prompt) in enumerate(zip(texts, prompts)):
        row = ids[b][valid[b]].tolist()
        flags = _prompt_flags(tokenizer, text, prompt, row, image_token_id, special, not has_chat_template(processor))
        if flags is None or not any(flags):
            return fallback, TEXT_RULE_SPECIAL
        mask[b, valid[b].nonzero()[:, 0]] = torch.tensor(flags)
    return mask, TEXT_RULE_SPAN


# -------------------------------------------------------------------------------------------------- batches


@dataclass
class Batch:
    samples: list[Sample]
    inputs: dict  # the processor's output for the real images: input_ids (B, S), attention_mask (B, S), pixel_values
    blank_pixel_values: torch.Tensor  # the same images, blank
    text_only: dict  # input_ids (B, S0), attention_mask (B, S0) of the prompts without the image
    image_mask: torch.Tensor  # (B, S) bool: the image-token positions of `inputs`
    text_mask: torch.Tensor  # (B, S) bool: the positions of the prompt's own text
    template_mask: torch.Tensor  # (B, S) bool: the other non-padding positions (BOS, chat-template tokens)
    text_only_mask: torch.Tensor  # (B, S0) bool: the prompt's own text in `text_only`
    text_rule: str  # how the text positions were found (TEXT_RULE_SPAN or TEXT_RULE_SPECIAL)


def _encode(processor, texts: list[str], images) -> dict:
    # A chat template writes its own BOS where the model wants one; the plain LLaVA format relies on the tokenizer's.
    special = not has_chat_template(processor)
    if images is None:
        encoded = processor.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=special)
    else:
        encoded = processor(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=special)
    return dict(encoded)


def _context_length(config) -> int | None:
    text_config = getattr(config, "text_config", config)
    return getattr(text_config, "max_position_embeddings", None)


def _check_context(batch_inputs: dict, samples: list[Sample], config, max_new_tokens: int, prompts_path: str):
    context = _context_length(config)
    if context is None:
        return
    lengths = batch_inputs["attention_mask"].sum(-1).tolist()
    for sample, length in zip(samples, lengths):
        if length + max_new_tokens > context:
            raise DiagnosticsError(
                f"--prompts: the prompt on line {sample.prompt_line} of {prompts_path!r} is {length} tokens with the "
                f"image {os.path.basename(sample.image_path)!r} (+{max_new_tokens} new tokens), longer than the "
                f"model's context of {context} tokens (text_config.max_position_embeddings)"
            )


def _image_token_id(config):
    image_token_id = getattr(config, "image_token_id", None)
    return getattr(config, "image_token_index", None) if image_token_id is None else image_token_id


def _make_batch(processor, config, chunk: list[Sample], max_new_tokens: int, prompts_path: str,
                format=format_prompt, encode=_encode) -> Batch:
    from PIL import Image

    image_token_id = _image_token_id(config)
    prompts = [s.prompt for s in chunk]
    images = [open_image(s.image_path) for s in chunk]
    blanks = [Image.new("RGB", im.size, BLANK_RGB) for im in images]
    with_image = [format(processor, p, True) for p in prompts]
    without_image = [format(processor, p, False) for p in prompts]
    inputs = encode(processor, with_image, images)
    _check_context(inputs, chunk, config, max_new_tokens, prompts_path)
    blank_inputs = encode(processor, with_image, blanks)
    text_only = encode(processor, without_image, None)
    valid = inputs["attention_mask"].bool()
    image_mask = (inputs["input_ids"] == image_token_id) & valid
    if not image_mask.any(dim=-1).all():
        raise DiagnosticsError(
            f"the processor placed no image token (id {image_token_id}) in a prompt: check the chat template"
        )
    # a processor that expands the image into more than a run of image tokens (Idefics3's tiles and row markers)
    # says how: the text is aligned in its expanded form
    expanded = processor.expand(with_image, images)[0] if callable(getattr(processor, "expand", None)) else with_image
    # the same rule for both encodings, so that the no-image ablation compares the same tokens
    text_mask, rule = prompt_text_mask(processor, expanded, prompts, inputs, image_token_id)
    text_only_mask, rule_text_only = prompt_text_mask(processor, without_image, prompts, text_only, image_token_id,
                                                      rule)
    if rule_text_only != rule:
        text_mask, rule = prompt_text_mask(processor, expanded, prompts, inputs, image_token_id, rule_text_only)
    return Batch(
        samples=chunk,
        inputs=inputs,
        blank_pixel_values=blank_inputs["pixel_values"],
        text_only=text_only,
        image_mask=image_mask,
        text_mask=text_mask,
        template_mask=valid & ~image_mask & ~text_mask,
        text_only_mask=text_only_mask,
        text_rule=rule,
    )


def make_batches(
    processor, config, samples: list[Sample], batch_size: int, max_new_tokens: int, prompts_path: str = "prompts",
    *, format=format_prompt, encode=_encode,
) -> list[Batch]:
    """Encode every sample with the model's processor (left padding, as generation appends on the right; the
    tokenizer's own padding side is restored after), checking each fits the context. ``format(processor, prompt,
    with_image)`` writes a prompt as the model sees it and ``encode(processor, texts, images or None)`` makes the
    model's inputs of them: a family whose prompts are not a chat turn (PaliGemma) passes its own."""
    tokenizer = processor.tokenizer
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        return [
            _make_batch(processor, config, samples[start : start + batch_size], max_new_tokens, prompts_path,
                        format, encode)
            for start in range(0, len(samples), batch_size)
        ]
    finally:
        tokenizer.padding_side = side
