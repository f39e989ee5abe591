"""Batches for training: decode images, tokenize the rendered conversations, and label the assistant answers only.

Rows come from ``preprocess.prepare_dataset`` (``id``, ``images``, ``rendered``, ``spans``). For a batch:

    images  --image processor-->  pixel_values (n_images, 3, H, W)
    rendered --processor (image tags expanded, offsets kept)--> input_ids, attention_mask (B, L)
    spans (characters of the answers) --shifted past expanded image tags, matched to token offsets--> labels (B, L)

A label is the token id where a token overlaps an assistant answer, -100 elsewhere: prompts, system text, padding
and every image token are never trained on.

Rescaling and normalising the pixels is most of an image processor's arithmetic after the resize. For the stock
PIL-backend processors (SigLIP, CLIP: resize, crop, then ``(x * rescale_factor - mean) / std``) the collator asks
for the resized uint8 pixels and maps them through a 256-entry table per channel, computed with the processor's own
operations in its own order (float64 rescale, float32 cast, float32 normalise), so the result is bit-for-bit the
processor's (``PixelTable``). Nothing is truncated here (``prepare_dataset`` already dropped long
rows); a row that is too long anyway is an error naming it. With ``padding_free`` the padded batch is then packed into
one row (``padding_free.py``).
"""

from __future__ import annotations

import bisect
import io
import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from llava_normaligned.compat import keeps_pil_backend_steps

from .padding_free import pack_rows
from .preprocess import adds_special_tokens

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100
SKIPPED_KEY = "skipped_rows"  # a count, added to the batch only when the trainer knows to pop it


class ImageDecodeError(ValueError):
    """An image that could not be decoded, named by its row."""


def _decode(image, row_id: str):
    """A dataset image (PIL, ``{"bytes", "path"}`` or a path) -> an RGB PIL image."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    path = image.get("path") if isinstance(image, dict) else image
    data = image.get("bytes") if isinstance(image, dict) else None
    try:
        opened = Image.open(io.BytesIO(data) if data is not None else path)
        opened.load()  # decodes now (and closes the file), so that a broken image fails here, naming its row
        return opened if opened.mode == "RGB" else opened.convert("RGB")  # an RGB image is not copied
    except Exception as err:  # PIL raises OSError, ValueError, SyntaxError, ... on broken files
        raise ImageDecodeError(
            f"row id {row_id!r}: image {path or '<bytes>'} could not be decoded ({type(err).__name__}: {err})"
        ) from err


class PixelTable:
    """``uint8 (N, C, H, W) -> float32``: the processor's rescale + normalise as one table lookup per channel.

    ``PixelTable.of(image_processor)`` is ``None`` where the lookup would not be the processor's exact arithmetic (a
    processor that overrides the PIL backend's steps, pads after normalising, or skips either step)."""

    def __init__(self, scale: float, mean, std):
        from transformers.image_transforms import normalize, rescale

        values = np.arange(256, dtype=np.uint8).reshape(1, 1, 256).repeat(len(mean), axis=0)  # (C, 1, 256)
        table = normalize(rescale(values, scale, input_data_format="channels_first"), mean, std,
                          input_data_format="channels_first")
        self.table = np.ascontiguousarray(table.reshape(len(mean), 256), dtype=np.float32)
        self.channels = np.arange(len(mean)).reshape(1, -1, 1, 1)

    @classmethod
    def of(cls, image_processor) -> PixelTable | None:
        if not keeps_pil_backend_steps(image_processor):
            return None
        if not (image_processor.do_rescale and image_processor.do_normalize) or getattr(image_processor, "do_pad", None):
            return None
        mean, std = image_processor.image_mean, image_processor.image_std
        channels = len(mean) if isinstance(mean, (list, tuple)) else 3
        mean = list(mean) if isinstance(mean, (list, tuple)) else [mean] * channels
        std = list(std) if isinstance(std, (list, tuple)) else [std] * channels
        return cls(image_processor.rescale_factor, mean, std)

    def __call__(self, pixels: np.ndarray) -> np.ndarray:
        if pixels.dtype != np.uint8 or pixels.ndim != 4 or pixels.shape[1] != self.table.shape[0]:
            raise ValueError(f"expected uint8 (N, {self.table.shape[0]}, H, W) pixels, got {pixels.dtype} {pixels.shape}")
        return self.table[self.channels, pixels]


def _shift_spans(spans, replacements) -> list[tuple[int, int]]:
    """Character spans of the text before image-tag expansion -> spans of the expanded text."""
    ends = [r["span"][1] for r in replacements]
    gained = [0] + [r["new_span"][1] - r["span"][1] for r in replacements]  # cumulative growth after each tag
    return [tuple(c + gained[bisect.bisect_right(ends, c)] for c in (start, end)) for start, end in spans]


@dataclass
class LlavaTrainingCollator:
    """Collates prepared rows into ``input_ids``, ``attention_mask``, ``pixel_values`` and answer-only ``labels``.

    Args:
        processor: the model's processor.
        max_length: the length no row may exceed (checked, never truncated); ``None`` for no check.
        on_bad_image: ``"error"``: an image that fails to decode raises ``ImageDecodeError`` naming the row;
            ``"skip"``: the row stays in the batch with a blank image and no labels (it trains nothing, and the batch
            keeps its shape on every rank), is logged and counted.
        pad_to_multiple_of: pad the sequence length to a multiple of this.
        padding_free: return the rows as one packed row without pad tokens (``padding_free.pack_rows``:
            ``input_ids``/``labels``/``position_ids`` of shape (1, N), no attention mask), for a batch that has
            padding; a batch without any (rows of one length, one row) stays as it is, where packing would remove
            nothing and the row-by-row attention would only cost.
        report_skips: add ``skipped_rows`` (a count) to each batch, for a trainer that pops it (``train.py``'s).
        images_per_text: give the processor one list of images per row (``Family.images_per_text``: Gemma3's
            processor counts the images of each sample) instead of one flat list.
    """

    processor: object
    max_length: int | None = None
    on_bad_image: str = "error"
    pad_to_multiple_of: int | None = None
    padding_free: bool = False
    report_skips: bool = False
    images_per_text: bool = False
    skipped: int = field(default=0, init=False)

    def __post_init__(self):
        if self.on_bad_image not in ("error", "skip"):
            raise ValueError(f"on_bad_image must be 'error' or 'skip', got {self.on_bad_image!r}")
        if self.padding_free and self.pad_to_multiple_of:
            raise ValueError("pad_to_multiple_of pads each row, padding_free removes every pad token: give one")
        self.image_token_id = self.processor.image_token_id
        image_processor = getattr(self.processor, "image_processor", None)
        self.pixel_table = PixelTable.of(image_processor) if image_processor is not None else None

    def _images(self, rows) -> tuple[list, list[bool]]:
        """(the batch's decoded images, flat or one list per row, whether each row's images all decoded)."""
        from PIL import Image

        flat, usable = [], []
        for row in rows:
            decoded, ok = [], True
            for image in row["images"] or []:
                try:
                    decoded.append(_decode(image, row["id"]))
                except ImageDecodeError as err:
                    if self.on_bad_image == "error":
                        raise
                    logger.warning("%s; training on the rest of the batch without this row", err)
                    decoded.append(Image.new("RGB", (64, 64), (255, 255, 255)))
                    ok = False
            if self.images_per_text:
                flat.append(decoded)
            else:
                flat += decoded
            usable.append(ok)
        if self.images_per_text and not any(flat):
            flat = []
        return flat, usable

    def _labels(self, batch, rows, usable) -> torch.Tensor:
        input_ids, offsets = batch["input_ids"], batch["offset_mapping"]  # (B, L), (B, L, 2)
        replacements = batch.get("text_replacement_offsets")
        if replacements is None and not any(row["images"] for row in rows):
            replacements = [[] for _ in rows]  # nothing was expanded
        if replacements is None:
            raise ValueError(
                f"{type(self.processor).__name__} does not report where it expanded image tags "
                "(return_text_replacement_offsets); the answers cannot be located"
            )
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        starts, ends = offsets[..., 0], offsets[..., 1]
        for b, row in enumerate(rows):
            if not usable[b]:
                continue
            in_answer = torch.zeros_like(input_ids[b], dtype=torch.bool)
            for start, end in _shift_spans(row["spans"], replacements[b]):
                in_answer |= (starts[b] < end) & (ends[b] > start)  # the token overlaps the answer
            labels[b] = torch.where(in_answer, input_ids[b], IGNORE_INDEX)
        labels[input_ids == self.image_token_id] = IGNORE_INDEX
        labels[batch["attention_mask"] == 0] = IGNORE_INDEX
        return labels

    def _check_lengths(self, batch, rows) -> None:
        if self.max_length is None:
            return
        lengths = batch["attention_mask"].sum(dim=1)
        for b, row in enumerate(rows):
            if int(lengths[b]) > self.max_length:
                raise ValueError(
                    f"row id {row['id']!r} has {int(lengths[b])} tokens, more than max_length={self.max_length}; "
                    "rows are never truncated (it could cut image tokens). prepare_dataset drops such rows: was the "
                    "dataset prepared with the same processor and max_length?"
                )

    def __call__(self, rows: list[dict]) -> dict:
        images, usable = self._images(rows)
        texts = [row["rendered"] for row in rows]
        table = self.pixel_table if images else None
        pixel_steps = {"do_rescale": False, "do_normalize": False} if table is not None else {}
        batch = self.processor(
            text=texts,
            images=images or None,
            **pixel_steps,
            padding=True,
            padding_side="right",
            pad_to_multiple_of=self.pad_to_multiple_of,
            add_special_tokens=adds_special_tokens(self.processor, texts[0]),
            return_offsets_mapping=True,
            return_text_replacement_offsets=True,
            return_tensors="np",  # numpy, then shared with torch: no copy of the pixels or the offsets
        )
        if table is not None:
            batch["pixel_values"] = table(batch["pixel_values"])
        # numeric arrays become tensors; the expansion records stay Python objects (a processor may hand them over as
        # a numpy array of objects when the rows' counts differ: Idefics3 with a text-only row first)
        batch = {key: torch.from_numpy(value) if isinstance(value, np.ndarray) and value.dtype != object else value
                 for key, value in batch.items()}
        self._check_lengths(batch, rows)
        batch["labels"] = self._labels(batch, rows, usable)
        batch.pop("offset_mapping")
        batch.pop("text_replacement_offsets", None)
        if self.padding_free and not bool(batch["attention_mask"].all()):  # nothing to remove: the padded layout
            batch = pack_rows(batch, IGNORE_INDEX)
        skipped = usable.count(False)
        self.skipped += skipped
        out = dict(batch)
        if self.report_skips:
            out[SKIPPED_KEY] = torch.tensor(skipped)
        return out


__all__ = ["IGNORE_INDEX", "SKIPPED_KEY", "ImageDecodeError", "LlavaTrainingCollator", "PixelTable"]
