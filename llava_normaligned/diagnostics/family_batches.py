"""Diagnostics batches for a family whose prompt is not a chat turn, or whose processor wants its images grouped per
prompt (PaliGemma, Gemma3): each registers its own ``make_batches``; every other family uses ``inputs.make_batches``.

    batches = batches_for(config)(processor, config, samples, batch_size, max_new_tokens)

A batch builder has ``inputs.make_batches``' signature and is added with ``@register_batches("family_name")``. The
processors themselves come from ``llava_normaligned.families.processors``.

PaliGemma's prompt is ``<image> x N + BOS + prefix + "\n"`` (its processor's layout), its image and prefix attend
bidirectionally (``token_type_ids`` 0) and what it generates is the causal suffix (1,
``families.anatomy.Family.generated_token_type``); Gemma3's processor takes one list of images per prompt.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from llava_normaligned.families.anatomy import family_of

from .inputs import has_chat_template, make_batches

BATCHES: dict[str, Callable] = {}  # Family.name -> its make_batches, where the generic one does not fit

def register_batches(*family_names: str):
    def add(make):
        for name in family_names:
            BATCHES[name] = make
        return make

    return add


def batches_for(config) -> Callable:
    """The ``make_batches`` of ``config``'s family: its own when it registered one, else ``inputs.make_batches``."""
    family = family_of(config)
    return BATCHES.get(family.name, make_batches) if family is not None else make_batches


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


@register_batches("paligemma")
def paligemma_batches(processor, config, samples, batch_size: int, max_new_tokens: int, prompts_path="prompts"):
    return make_batches(processor, config, samples, batch_size, max_new_tokens, prompts_path,
                        format=paligemma_format, encode=paligemma_encode)


# ------------------------------------------------------------------------------------------------- Gemma3


def nested_encode(processor, texts: list[str], images) -> dict:
    """The generic encoding with one list of images per prompt (Gemma3's processor counts images per sample)."""
    from .inputs import _encode

    return _encode(processor, texts, None if images is None else [[image] for image in images])


@register_batches("gemma3")
def gemma3_batches(processor, config, samples, batch_size: int, max_new_tokens: int, prompts_path="prompts"):
    """The chat turn writes ``<start_of_image>``; the processor expands it to ``\n\n<start_of_image>`` +
    ``<image_soft_token>`` x mm_tokens_per_image + ``<end_of_image>\n\n`` and returns token_type_ids (1 on the
    soft tokens, which attend to each other both ways)."""
    return make_batches(processor, config, samples, batch_size, max_new_tokens, prompts_path, encode=nested_encode)


__all__ = ["BATCHES", "batches_for", "register_batches"]
