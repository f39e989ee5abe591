"""Up-front preparation of a messages + images dataset for training: render, locate answers, count tokens, and drop
or refuse the rows that cannot be trained on whole.

Run once before training starts, so that a row too long for ``max_length`` is found now, not hours in. Truncation
is never used: cutting a row could cut its image tokens (the model then refuses the batch: "Image features and image
tokens do not match") or its only answer. A row's length is its rendered text's token count with each image tag
expanded to the image's tokens (LLaVA: (image_size / patch_size)^2, minus the CLS token for CLIP).

The prepared dataset keeps ``id``, ``messages`` and ``images`` and adds ``rendered`` (the chat-template text),
``spans`` (character spans of the assistant answers in it, see ``masking.py``), ``num_tokens`` and ``num_images``
(what length grouping, ``sampling.py``, orders the rows by). Pixels are not
touched here: ``images`` is left undecoded (paths/bytes) and decoded batch by batch in the collator.

``train`` calls ``prepare_dataset`` with a ``cache_dir`` (under the datasets cache) inside
``args.main_process_first()``: the main process renders and writes the columns to a file named by a hash of
everything they depend on (the rows, the chat template, the tokenizer), the other processes of a multi-process run,
released after it, read that file, and so does the next run with the same rows.

Every pass is linear in the rows: the rendering is one ``datasets.map`` (on every core from ``PARALLEL_ROWS`` rows
up), the token counts come from the fast tokenizer's backend, and the length and text-only filters are numpy over
whole columns (never a datasets ``Column`` indexed row by row). A dataset with a ``select`` indices mapping is
rendered over its underlying table (unselected rows left empty) so that its image column is never rewritten.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from llava_normaligned.compat import dataset_fingerprint, dataset_indices, dataset_over

from .masking import ConversationRenderer, FastRenderMismatch

logger = logging.getLogger(__name__)

TOO_LONG_POLICIES = ("drop", "error")
MAX_LISTED = 10
CACHE_FORMAT = "prepared-v5"  # changes whenever the rendered columns would change for the same inputs
PARALLEL_ROWS = 20_000  # from this many rows up the rendering uses every core (default_num_proc)
MAX_NUM_PROC = 8


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
    rendering: str = ""  # "fast" (skeleton + jinja for the rest, trainer/masking.py) or "jinja" (every row)
    rows_rendered_fast: int = 0  # rows laid into their shape's skeleton instead of rendered by jinja
    longest_row_tokens: int = 0
    cache_file: str | None = None  # where the rendered columns are kept (and shared in a multi-process run)
    read_from_cache: bool = False  # this process read them there instead of rendering
    seconds: dict = field(default_factory=dict)  # time per phase
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


def image_tokens_per_image(processor, renderer=None) -> int:
    """How many tokens one image makes in a prepared row, as the count of its rendered text has it once (a row's
    ``num_tokens`` adds this - 1 per image), measured with a blank 64 px image. With ``renderer`` (what
    ``prepare_dataset`` passes): a one-image turn rendered with the chat template, then run through the processor as
    the collator runs it: everything the image adds is counted (the image tokens and the markers around them:
    Idefics3's and SmolVLM's tile markers, Gemma3's begin and end of image). Without: the image token's count in the
    processor's expansion of the tag alone (the image tokens only)."""
    from PIL import Image

    blank = Image.new("RGB", (64, 64), (255, 255, 255))
    if renderer is not None:
        text, _ = renderer.render([{"role": "user", "content": "What is it?"},
                                   {"role": "assistant", "content": "A square."}], 1, name="the image probe")
        add = adds_special_tokens(processor, text)
        rendered = _token_counter(processor)([text], add)[0]
        processed = processor(text=[text], images=[blank], add_special_tokens=add)["input_ids"][0]
        return int(len(processed) - rendered + 1)
    out = processor(text=[processor.image_token], images=[blank], add_special_tokens=False)
    ids = out["input_ids"][0]
    return int(sum(1 for token in ids if token == processor.image_token_id))


def adds_special_tokens(processor, rendered: str) -> bool:
    """Whether to let the tokenizer add its special tokens: only when the template did not write the BOS itself
    (the rule of ``processor.apply_chat_template(tokenize=True)``, so training tokenizes as inference does)."""
    bos = processor.tokenizer.bos_token
    return not (bos is not None and rendered.startswith(bos))


def _token_counter(processor):
    """``(texts, add_special_tokens) -> token counts``: the fast tokenizer's Rust backend when there is one (the
    same encoding the tokenizer's ``__call__`` returns, without building id lists), else the tokenizer."""
    tokenizer = processor.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "encode_batch_fast"):
        return _BackendCounter(backend)
    return _TokenizerCounter(tokenizer)


@dataclass
class _BackendCounter:
    backend: object

    def __call__(self, texts: list[str], add_special: bool) -> list[int]:
        return [len(encoding) for encoding in self.backend.encode_batch_fast(texts, add_special_tokens=add_special)]


@dataclass
class _TokenizerCounter:
    tokenizer: object

    def __call__(self, texts: list[str], add_special: bool) -> list[int]:
        return [len(ids) for ids in self.tokenizer(texts, add_special_tokens=add_special)["input_ids"]]


def _render_batch(batch: dict, *, renderer: ConversationRenderer, processor, count_tokens, per_image: int) -> dict:
    """datasets.map function: rendered text, answer spans and token count of each row (``use`` False: a row that is
    not trained on, left empty)."""
    rendered, spans, fast = [], [], []
    for row_id, messages, n_images, use in zip(batch["id"], batch["messages"], batch["num_images"], batch["use"]):
        if not use:
            rendered.append("")
            spans.append([])
            fast.append(False)
            continue
        before = renderer.rows_fast
        text, row_spans = renderer.render(messages, n_images, name=f"row id {row_id!r}")
        rendered.append(text)
        spans.append([list(span) for span in row_spans])
        fast.append(renderer.rows_fast > before)
    first = next((text for text in rendered if text), None)
    add_special = adds_special_tokens(processor, first) if first is not None else False
    counts = count_tokens(rendered, add_special)
    # each image tag is one token here and becomes `per_image` tokens in the collator
    num_tokens = [n + k * (per_image - 1) if use else 0 for n, k, use in zip(counts, batch["num_images"], batch["use"])]
    return {"rendered": rendered, "spans": spans, "num_tokens": num_tokens, "rendered_fast": fast}


def _cache_key(text, renderer: ConversationRenderer, processor, per_image: int) -> str:
    """A hash of what the rendered columns depend on: the rows (their Arrow data, read in batches), the template,
    the tokenizer and the image-token count. Equal on every process that holds the same rows."""
    import pyarrow as pa

    digest = hashlib.blake2b(digest_size=16)
    tokenizer = processor.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    for part in (CACHE_FORMAT, renderer.template, renderer.method, renderer.fast, per_image, type(tokenizer).__name__,
                 backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items())),
                 repr(sorted(((k, v) for k, v in renderer.template_kwargs.items() if k != "date_string"), key=str))):
        digest.update(str(part).encode("utf-8"))
    for batch in text.with_format("arrow").iter(batch_size=65536):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_table(batch)  # serialises the rows themselves (a slice's unused buffer bytes are left out)
        digest.update(sink.getvalue())
    return digest.hexdigest()


def default_num_proc(n_rows: int) -> int | None:
    """Processes for the rendering when none are asked for: every core from ``PARALLEL_ROWS`` rows up (rendering
    is CPU-bound Python; below that, starting the processes costs more than it saves)."""
    if n_rows < PARALLEL_ROWS:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cores, MAX_NUM_PROC) if cores > 1 else None


def unindexed(dataset):
    """(the dataset without its ``select`` indices mapping, the rows it selects in order): the columns are then
    lined up without ``flatten_indices`` (which would copy every image byte)."""
    indices = dataset_indices(dataset)
    if indices is None:
        return dataset, np.arange(len(dataset))
    order = indices.column(0).to_numpy().astype(np.int64)
    base = dataset_over(dataset.data, info=dataset.info.copy(), split=dataset.split,
                        fingerprint=hashlib.blake2b(f"{dataset_fingerprint(dataset)}-base".encode(),
                                                    digest_size=8).hexdigest())
    return base, order


def _render(rows, renderer: ConversationRenderer, processor, per_image: int, num_proc, cache_dir, report):
    """(when the map started, the ``datasets.map`` over every row or the cached result of an earlier one with the
    same key)."""
    from .data import log_phase

    cache = {}
    if cache_dir is not None:
        start = time.perf_counter()
        key = _cache_key(rows, renderer, processor, per_image)
        report.seconds["hash"] = log_phase("rows hashed (the rendered-rows cache key)", len(rows), start)
        os.makedirs(cache_dir, exist_ok=True)
        report.cache_file = os.path.join(cache_dir, f"{key}.arrow")
        report.read_from_cache = bool(glob.glob(os.path.join(cache_dir, f"{key}*.arrow")))  # num_proc: shards
        cache = {"cache_file_name": report.cache_file, "new_fingerprint": key, "load_from_cache_file": True}
    return time.perf_counter(), rows.map(
        _render_batch, batched=True, batch_size=256, num_proc=num_proc, remove_columns=["messages", "num_images"],
        fn_kwargs={"renderer": renderer, "processor": processor, "count_tokens": _token_counter(processor),
                   "per_image": per_image},
        desc="rendering conversations", **cache,
    )


def _render_checked(rows, renderer, processor, chat_template, per_image, num_proc, cache_dir, report: PrepareReport):
    """``_render``, by jinja for every row when the fast path's sample check finds a difference; the rendering used
    and the rows rendered fast counted in ``report``. Returns ``(start time, rendered columns)``."""
    try:
        start, text = _render(rows, renderer, processor, per_image, num_proc, cache_dir, report)
    except FastRenderMismatch as err:
        logger.warning("%s; rendering every row with the chat template instead (slower; --render exact skips the "
                       "fast path)", err)
        renderer = ConversationRenderer(processor, chat_template, fast=False)
        start, text = _render(rows, renderer, processor, per_image, num_proc, cache_dir, report)
    report.rows_rendered_fast = int(np.count_nonzero(text.data.column("rendered_fast").to_numpy()))
    report.rendering = "fast" if renderer.fast else "jinja"
    return start, text.remove_columns(["rendered_fast"])


def _kept_rows(text, counts, order, report: PrepareReport, *, max_length, on_too_long: str, drop_text_only: bool):
    """The positions of the rows ``prepare_dataset`` keeps, in ``order``: text-only rows dropped when asked, rows
    longer than ``max_length`` dropped with a warning naming a few (or refused, ``on_too_long="error"``); counted in
    ``report``."""
    lengths = text.data.column("num_tokens").to_numpy()
    report.longest_row_tokens = int(lengths[order].max()) if len(order) else 0
    rows = order
    if drop_text_only:
        rows = rows[counts[rows] > 0]
        report.text_only_dropped = len(order) - len(rows)
    if max_length is not None:
        too_long = rows[lengths[rows] > max_length]
        if len(too_long):
            ids = text.data.column("id").take(too_long[:MAX_LISTED]).to_pylist()
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
            rows = rows[lengths[rows] <= max_length]
            report.too_long_dropped = len(too_long)
    return rows


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
    fast_render: bool = True,
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
        num_proc: processes for the rendering (``datasets.map``); ``None``: ``default_num_proc`` (every core from
            ``PARALLEL_ROWS`` rows up).
        cache_dir: write the rendered columns to a file in this folder, named by a hash of the rows, the template and
            the tokenizer, or read them from it when it is there (``train`` sets it: the next run with the same rows
            reads them instead of rendering, and in a multi-process run the other processes read what the main
            process wrote).
        fast_render: lay rows into their conversation shape's rendered skeleton where that gives jinja's text
            exactly (``masking.py``'s fast path, checked on a sample of rows: any difference re-renders every row by
            jinja); ``False``: every row through jinja.

    Returns ``(prepared dataset, PrepareReport)``.
    """
    from datasets import Dataset, concatenate_datasets

    from .data import count_images, log_phase, with_decode

    if on_too_long not in TOO_LONG_POLICIES:
        raise ValueError(f"on_too_long must be one of {TOO_LONG_POLICIES}, got {on_too_long!r}")
    renderer = ConversationRenderer(processor, chat_template, fast=fast_render)
    per_image = image_tokens_per_image(processor, ConversationRenderer(processor, chat_template, fast=False))
    report = PrepareReport(rows_in=len(dataset), max_length=max_length, image_tokens_per_image=per_image,
                           masking=renderer.method)

    # Only the text columns go through map: the images (maybe gigabytes of bytes) are neither decoded nor copied.
    # The rows are rendered in the order of the underlying table; `use` marks the ones the dataset selects.
    base, order = unindexed(dataset)
    counts = count_images(base)
    use = np.zeros(len(base), dtype=bool)
    use[order] = True
    rows = concatenate_datasets([base.select_columns(["id", "messages"]),
                                 Dataset.from_dict({"num_images": counts, "use": use})], axis=1)
    if num_proc is None:
        num_proc = default_num_proc(int(use.sum()))
    start, text = _render_checked(rows, renderer, processor, chat_template, per_image, num_proc, cache_dir, report)
    what = "rendered rows read from the cache" if report.read_from_cache else "rows rendered and tokenized"
    report.seconds["render"] = log_phase(what, len(order), start)
    # decode=False: images reach the collator as paths/bytes and are decoded there, where a failure names its row
    images = with_decode(base.select_columns(["images"]), "images", False)
    # the map wrote only the new columns (and id, use): the messages are the loaded rows' own column, not a copy
    prepared = concatenate_datasets([text.select_columns(["id"]), base.select_columns(["messages"]),
                                     text.select_columns(["rendered", "spans", "num_tokens"]), images,
                                     Dataset.from_dict({"num_images": counts})], axis=1)

    start = time.perf_counter()
    rows = _kept_rows(text, counts, order, report, max_length=max_length, on_too_long=on_too_long,
                      drop_text_only=drop_text_only)
    if not len(rows):
        raise ValueError(f"no rows left to train on: {report.summary()}")
    if len(rows) < len(prepared) or not np.array_equal(rows, np.arange(len(prepared))):
        prepared = prepared.select(rows)
    report.rows_out = len(prepared)
    report.text_only_rows = int((counts[rows] == 0).sum())
    report.seconds["filter"] = log_phase("length and text-only filters", len(order), start)
    if report.read_from_cache:
        logger.info("rendered rows read from %s", report.cache_file)
    logger.info("prepared: %s", report.summary())
    return prepared, report


__all__ = ["PrepareReport", "adds_special_tokens", "default_num_proc", "image_tokens_per_image", "prepare_dataset",
           "unindexed"]
