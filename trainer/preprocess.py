"""Up-front preparation of a messages + images dataset for training: render, locate answers, count tokens, and drop
or refuse the rows that cannot be trained on whole.

Run once before training starts, so that a row too long for ``max_length`` is found now, not hours in. Truncation
is never used: cutting a row could cut its image tokens (the model then refuses the batch: "Image features and image
tokens do not match") or its only answer. A row's length is its rendered text's token count with each image tag
expanded to the image's tokens (LLaVA: (image_size / patch_size)^2, minus the CLS token for CLIP).

The prepared dataset keeps ``id``, ``messages`` and ``images`` and adds ``rendered`` (the chat-template text),
``spans`` (character spans of the assistant answers in it, see ``masking.py``) and ``num_tokens``. Pixels are not
touched here: ``images`` is left undecoded (paths/bytes) and decoded batch by batch in the collator.

In a multi-process run the rendering is done once per machine: ``train_stage`` calls ``prepare_dataset`` with a
``cache_dir`` inside ``args.main_process_first()``, so the main process renders and writes the columns to a file
named by a hash of everything they depend on (the rows, the chat template, the tokenizer), and the other processes,
released after it, read that file.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
from dataclasses import asdict, dataclass, field

from .masking import ConversationRenderer

logger = logging.getLogger(__name__)

TOO_LONG_POLICIES = ("drop", "error")
MAX_LISTED = 10
CACHE_FORMAT = "prepared-v2"  # changes whenever the rendered columns would change for the same inputs


@dataclass
class PrepareReport:
    rows_in: int = 0
    rows_out: int = 0
    too_long_dropped: int = 0
    text_only_dropped: int = 0
    text_only_rows: int = 0  # rows without an image left to train on (stage 2)
    max_length: int | None = None
    image_tokens_per_image: int = 0
    masking: str = ""
    longest_row_tokens: int = 0
    cache_file: str | None = None  # multi-process runs: where the rendered columns are shared
    read_from_cache: bool = False  # this process read them there instead of rendering
    examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        text = f"{self.rows_out}/{self.rows_in} rows to train on (answers located by {self.masking})"
        if self.too_long_dropped:
            text += f"; {self.too_long_dropped} rows longer than max_length={self.max_length} dropped"
        if self.text_only_dropped:
            text += f"; {self.text_only_dropped} text-only rows dropped (stage 1 trains only the projector)"
        return text


def image_tokens_per_image(processor) -> int:
    """How many tokens one image tag expands to, measured by running the processor on a blank image."""
    from PIL import Image

    blank = Image.new("RGB", (64, 64), (255, 255, 255))
    out = processor(text=[processor.image_token], images=[blank], add_special_tokens=False)
    ids = out["input_ids"][0]
    return int(sum(1 for token in ids if token == processor.image_token_id))


def adds_special_tokens(processor, rendered: str) -> bool:
    """Whether to let the tokenizer add its special tokens: only when the template did not write the BOS itself
    (the rule of ``processor.apply_chat_template(tokenize=True)``, so training tokenizes as inference does)."""
    bos = processor.tokenizer.bos_token
    return not (bos is not None and rendered.startswith(bos))


def _render_batch(batch: dict, *, renderer: ConversationRenderer, processor, per_image: int) -> dict:
    """datasets.map function: rendered text, answer spans and token count of each row."""
    rendered, spans = [], []
    for row_id, messages, n_images in zip(batch["id"], batch["messages"], batch["num_images"]):
        text, row_spans = renderer.render(messages, n_images, name=f"row id {row_id!r}")
        rendered.append(text)
        spans.append([list(span) for span in row_spans])
    add_special = adds_special_tokens(processor, rendered[0]) if rendered else False
    token_ids = processor.tokenizer(rendered, add_special_tokens=add_special)["input_ids"]
    # each image tag is one token here and becomes `per_image` tokens in the collator
    num_tokens = [len(ids) + n * (per_image - 1) for ids, n in zip(token_ids, batch["num_images"])]
    return {"rendered": rendered, "spans": spans, "num_tokens": num_tokens}


def _cache_key(text, renderer: ConversationRenderer, processor, per_image: int) -> str:
    """A hash of what the rendered columns depend on: the rows (their Arrow data, read in batches), the template,
    the tokenizer and the image-token count. Equal on every process that holds the same rows."""
    import pyarrow as pa

    digest = hashlib.blake2b(digest_size=16)
    tokenizer = processor.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    for part in (CACHE_FORMAT, renderer.template, renderer.method, per_image, type(tokenizer).__name__,
                 backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items())),
                 repr(sorted(renderer.template_kwargs.items(), key=str))):
        digest.update(str(part).encode("utf-8"))
    for batch in text.with_format("arrow").iter(batch_size=65536):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_table(batch)  # serialises the rows themselves (a slice's unused buffer bytes are left out)
        digest.update(sink.getvalue())
    return digest.hexdigest()


def prepare_dataset(
    dataset,
    processor,
    *,
    max_length: int | None,
    on_too_long: str = "drop",
    drop_text_only: bool = False,
    chat_template: str | None = None,
    num_proc: int | None = None,
    cache_dir: str | None = None,
):
    """Render every row, locate its answers, count its tokens; drop (or refuse) rows longer than ``max_length``.

    Args:
        dataset: rows with ``id``, ``messages`` (string content) and ``images`` (``data.load_*`` output).
        processor: the model's processor (tokenizer + image processor + chat template).
        max_length: the longest row allowed, in tokens with images expanded; ``None`` for no limit.
        on_too_long: ``"drop"`` (default): drop and count such rows, with a warning naming a few;
            ``"error"``: raise naming them.
        drop_text_only: drop rows without an image (stage 1: the projector sees no gradient from them).
        chat_template: a template to use instead of the processor's.
        num_proc: processes for the rendering (``datasets.map``).
        cache_dir: write the rendered columns to a file in this folder, named by a hash of the rows, the template and
            the tokenizer, or read them from it when it is there (``train_stage`` sets it in multi-process runs).

    Returns ``(prepared dataset, PrepareReport)``.
    """
    from datasets import Image, List, concatenate_datasets

    from .data import count_images

    if on_too_long not in TOO_LONG_POLICIES:
        raise ValueError(f"on_too_long must be one of {TOO_LONG_POLICIES}, got {on_too_long!r}")
    renderer = ConversationRenderer(processor, chat_template)
    per_image = image_tokens_per_image(processor)
    report = PrepareReport(rows_in=len(dataset), max_length=max_length, image_tokens_per_image=per_image,
                           masking=renderer.method)

    counts = list(count_images(dataset))
    # Only the text columns go through map: the images (maybe gigabytes of bytes) are neither decoded nor copied.
    text = dataset.select_columns(["id", "messages"]).add_column("num_images", counts)
    cache = {}
    if cache_dir is not None:
        key = _cache_key(text, renderer, processor, per_image)
        os.makedirs(cache_dir, exist_ok=True)
        report.cache_file = os.path.join(cache_dir, f"{key}.arrow")
        report.read_from_cache = bool(glob.glob(os.path.join(cache_dir, f"{key}*.arrow")))  # num_proc: shards
        cache = {"cache_file_name": report.cache_file, "new_fingerprint": key, "load_from_cache_file": True}
    text = text.map(
        _render_batch, batched=True, batch_size=256, num_proc=num_proc,
        fn_kwargs={"renderer": renderer, "processor": processor, "per_image": per_image},
        desc="rendering conversations", **cache,
    )
    # decode=False: images reach the collator as paths/bytes and are decoded there, where a failure names its row
    images = dataset.select_columns(["images"]).cast_column("images", List(Image(decode=False)))
    prepared = concatenate_datasets([text, images], axis=1)

    lengths = text["num_tokens"]
    report.longest_row_tokens = max(lengths) if lengths else 0
    keep = list(range(len(prepared)))
    if drop_text_only:
        keep = [i for i in keep if counts[i] > 0]
        report.text_only_dropped = len(prepared) - len(keep)
    if max_length is not None:
        too_long = [i for i in keep if lengths[i] > max_length]
        if too_long:
            ids = text.select(too_long[:MAX_LISTED])["id"]
            listed = ", ".join(f"{row_id!r} ({lengths[i]} tokens)" for row_id, i in zip(ids, too_long))
            if on_too_long == "error":
                raise ValueError(
                    f"{len(too_long)} row(s) are longer than max_length={max_length} tokens (images included): "
                    f"{listed}. Rows are never truncated (that could cut image tokens); raise --max_length or pass "
                    "--on-too-long drop to drop them."
                )
            logger.warning(
                "dropping %d row(s) longer than max_length=%d tokens (images included; rows are never truncated): %s",
                len(too_long), max_length, listed,
            )
            report.examples.append(f"too long: {listed}")
            dropped = set(too_long)
            keep = [i for i in keep if i not in dropped]
            report.too_long_dropped = len(too_long)
    if not keep:
        raise ValueError(f"no rows left to train on: {report.summary()}")
    if len(keep) < len(prepared):
        prepared = prepared.select(keep)
    report.rows_out = len(prepared)
    report.text_only_rows = sum(1 for i in keep if counts[i] == 0)
    if report.read_from_cache:
        logger.info("rendered rows read from %s (written by the main process)", report.cache_file)
    logger.info("prepared: %s", report.summary())
    return prepared, report


__all__ = ["PrepareReport", "adds_special_tokens", "image_tokens_per_image", "prepare_dataset"]
