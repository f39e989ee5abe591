"""Hugging Face datasets (a saved folder, parquet/JSON files, a Hub id) in TRL's or LLaVA's format."""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from llava_normaligned.compat import dataset_fingerprint, dataset_indices, dataset_over

from .columns import _message_type, row_features, with_decode
from .common import (
    BAD_IMAGE_POLICIES,
    BAD_ROW_POLICIES,
    IMAGE_CHECKS,
    DataError,
    DataReport,
    _check_policy,
    _RowProblem,
    log_phase,
)
from .images import _apply_image_policy, _bad_row, _check_images, _column, _image_refs, count_images
from .llava_json import _cached, _loaded_key, _store
from .rows import _hf_messages, _llava_messages

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------- Hugging Face datasets


def _is_data_file(path: str) -> bool:
    return path.endswith((".parquet", ".json", ".jsonl", ".arrow"))


def _open_hf_dataset(name_or_path: str, split: str):
    from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

    if os.path.isdir(name_or_path) and (
        os.path.isfile(os.path.join(name_or_path, "dataset_info.json"))
        or os.path.isfile(os.path.join(name_or_path, "dataset_dict.json"))
        or os.path.isfile(os.path.join(name_or_path, "state.json"))
    ):
        loaded = load_from_disk(name_or_path)  # a folder written by Dataset.save_to_disk
    elif os.path.isfile(name_or_path) and _is_data_file(name_or_path):
        kind = "parquet" if name_or_path.endswith(".parquet") else "arrow" if name_or_path.endswith(".arrow") \
            else "json"
        loaded = load_dataset(kind, data_files=name_or_path, split=split)
    elif os.path.exists(name_or_path):
        if not os.path.isdir(name_or_path):
            raise DataError(f"dataset {name_or_path!r}: not a dataset folder or a .parquet/.json/.jsonl/.arrow file")
        loaded = load_dataset(name_or_path, split=split)  # a parquet/json folder (the Hub's layout)
    else:
        loaded = _load_hub_dataset(name_or_path, split)
    if isinstance(loaded, DatasetDict):
        if split not in loaded:
            raise ValueError(f"dataset {name_or_path!r} has no split {split!r} (splits: {list(loaded)})")
        loaded = loaded[split]
    if not isinstance(loaded, Dataset):
        raise ValueError(f"dataset {name_or_path!r}: expected a map-style Dataset, got {type(loaded).__name__}")  # noqa: TRY004
    return loaded


def _load_hub_dataset(name: str, split: str):
    """A Hub dataset id through ``datasets.load_dataset`` (downloaded once into the datasets cache, then reused)."""
    from datasets import load_dataset

    try:
        return load_dataset(name, split=split)
    except (FileNotFoundError, ConnectionError, OSError, ValueError) as err:
        import datasets

        offline = " (offline mode: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set)" if datasets.config.HF_HUB_OFFLINE \
            else ""
        raise DataError(
            f"dataset {name!r}: not a local path, and it could not be loaded from the Hugging Face Hub{offline}: "
            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}. Give a local folder of its parquet "
            "files (as the Hub lays them out), or download it first (`hf download --repo-type dataset NAME`)."
        ) from err


def _image_only_dataset(images):
    """A one-column dataset ``images`` (``List(Image(decode=False))``) over a ChunkedArray of that storage."""
    import pyarrow as pa
    from datasets import Features, Image, List

    features = Features({"images": List(Image(decode=False))})
    return dataset_over(pa.table({"images": images}), features=features)


def _single_image_as_list(dataset):
    """An ``image`` column (one image or null per row) -> an ``images`` column (a list of 0 or 1), without reading
    or copying the images: the list arrays are laid over the same Arrow buffers (null lists for rows without one)."""
    import pyarrow as pa
    from datasets import concatenate_datasets

    column = dataset.data.column("image")
    chunks = [pa.ListArray.from_arrays(pa.array(np.arange(len(chunk) + 1, dtype=np.int32)), chunk,
                                       mask=chunk.is_null()) for chunk in column.chunks]
    images = pa.chunked_array(chunks, type=pa.list_(column.type))
    return concatenate_datasets([dataset.remove_columns(["image"]), _image_only_dataset(images)], axis=1)


def _no_images(n_rows: int):
    import pyarrow as pa

    storage = pa.list_(pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    offsets = pa.array(np.zeros(n_rows + 1, dtype=np.int32))
    return _image_only_dataset(pa.chunked_array([pa.ListArray.from_arrays(offsets, pa.nulls(0, storage.value_type))],
                                                type=storage))


def _conversations_to_messages(text, name_or_path: str, source_name: str, report: DataReport, on_bad_row: str,
                               counts: np.ndarray):
    """``conversations`` (LLaVA's format) or ``messages`` (TRL's) -> (ids, string-content messages, kept rows)."""
    column = "messages" if "messages" in text.column_names else "conversations"
    has_id = "id" in text.column_names
    ids, messages, keep = [], [], []
    index = 0
    for batch in text.with_format("arrow").iter(batch_size=4096):
        turns = batch.column(column).to_pylist()
        batch_ids = batch.column("id").to_pylist() if has_id else [None] * len(turns)
        for row_id, row in zip(batch_ids, turns):
            row_id = str(row_id) if row_id is not None else f"{source_name}:{index}"
            ids.append(row_id)
            try:
                if column == "messages":
                    converted = _hf_messages(row, int(counts[index]))
                else:
                    converted = _llava_messages(row, int(counts[index]), report)
                messages.append(converted)
                keep.append(index)
            except _RowProblem as err:
                messages.append([])
                _bad_row(DataError(f"{name_or_path} row {index} (id {row_id!r}): {err}"), on_bad_row, report)
            index += 1
    return ids, messages, keep


def _opened_rows(name_or_path: str, split: str):
    """The dataset opened with an ``images`` list column (a single ``image`` column as a list of one, none as empty
    lists; never decoded here), its fingerprint (the cache key of the converted rows) and its text column
    (``messages`` or LLaVA's ``conversations``)."""
    from datasets import concatenate_datasets

    dataset = _open_hf_dataset(name_or_path, split)
    if dataset_indices(dataset) is not None:
        dataset = dataset.flatten_indices()
    fingerprint = dataset_fingerprint(dataset)
    text_column = next((c for c in ("messages", "conversations") if c in dataset.column_names), None)
    if text_column is None:
        raise DataError(
            f"dataset {name_or_path!r} has neither a 'messages' column (TRL's messages + images format) nor a "
            f"'conversations' column (LLaVA's format: [{{'from', 'value'}}, ...]); columns: {dataset.column_names}"
        )
    if "image" in dataset.column_names and "images" not in dataset.column_names:
        dataset = _single_image_as_list(dataset)
    if "images" not in dataset.column_names:
        dataset = concatenate_datasets([dataset, _no_images(len(dataset))], axis=1)
    return with_decode(dataset, "images", False), fingerprint, text_column


def _converted_text(dataset, text_column: str, fingerprint: str, name_or_path: str, counts, on_bad_row: str,
                    cache_dir: str | None, report: DataReport):
    """The text columns converted to TRL's messages (cached by the dataset's fingerprint; the image column is never
    copied), and the positions of the rows kept; what was converted and dropped is counted in ``report``."""
    import pyarrow as pa

    start = time.perf_counter()
    key = _loaded_key(["dataset", fingerprint, text_column, on_bad_row], [])
    found = _cached(cache_dir, key)
    if found is not None:
        text, saved = found
        for name in ("bad_rows_skipped", "leading_assistant_turns_dropped", "examples"):
            setattr(report, name, saved[name])
        keep = np.asarray(saved["keep"], dtype=np.int64) if saved["keep"] is not None else np.arange(len(dataset))
        report.read_from_cache = True
    else:
        text_columns = dataset.select_columns([c for c in ("id", text_column) if c in dataset.column_names])
        source_name = os.path.basename(name_or_path.rstrip("/"))
        ids, messages, kept = _conversations_to_messages(text_columns, name_or_path, source_name, report, on_bad_row,
                                                         counts)
        table = pa.table({"id": pa.array(ids, type=pa.string()), "messages": pa.array(messages, type=_message_type())})
        features = row_features()
        features = type(features)({k: v for k, v in features.items() if k != "images"})
        keep = np.asarray(kept, dtype=np.int64)
        saved = {"bad_rows_skipped": report.bad_rows_skipped, "examples": report.examples,
                 "leading_assistant_turns_dropped": report.leading_assistant_turns_dropped,
                 "keep": None if len(keep) == len(dataset) else keep.tolist()}
        text = _store(cache_dir, key, table, features, saved)
    report.seconds["parse"] = log_phase(f"dataset {name_or_path}: rows converted", len(dataset), start)
    if cache_dir is not None:
        report.cache_file = os.path.join(cache_dir, f"{key}.arrow")
    return text, keep


def load_messages_dataset(
    name_or_path: str,
    *,
    split: str = "train",
    on_bad_image: str = "error",
    on_bad_row: str = "error",
    check_images: str = "auto",
    return_report: bool = False,
    image_checker=None,
    cache_dir: str | None = None,
):
    """Load a dataset (a ``save_to_disk`` folder, parquet/JSON files or folder, or a Hub dataset id) in TRL's
    messages + images format or in LLaVA's conversation format, and check it like ``load_llava_json`` does (same
    options). A single ``image`` column is accepted too (the Hub's LLaVA sets: ``lmms-lab/LLaVA-NeXT-Data``,
    ``lmms-lab/LLaVA-ReCap-558K``); its images are neither decoded nor copied (only the Arrow offsets and byte
    counts are read; ``check_images`` says which headers are opened).

    Returns a ``datasets.Dataset`` with the columns of ``load_llava_json`` (``id``, ``messages`` with string
    content, ``images``: a list of images, empty or ``None`` for a text-only row), and the ``DataReport`` with
    ``return_report=True``.
    """
    from datasets import concatenate_datasets

    _check_policy("on_bad_image", on_bad_image, BAD_IMAGE_POLICIES)
    _check_policy("on_bad_row", on_bad_row, BAD_ROW_POLICIES)
    _check_policy("check_images", check_images, IMAGE_CHECKS)
    start = time.perf_counter()
    dataset, fingerprint, text_column = _opened_rows(name_or_path, split)
    report = DataReport(sources=[name_or_path], rows_read=len(dataset))
    counts = count_images(dataset)
    report.seconds["open"] = log_phase(f"dataset {name_or_path} opened", len(dataset), start)

    text, keep = _converted_text(dataset, text_column, fingerprint, name_or_path, counts, on_bad_row, cache_dir,
                                 report)

    ids_column = _column(text, "id")
    with_images = keep[counts[keep] > 0]
    dropped = _apply_image_policy(
        _check_images(_image_refs(dataset, with_images), check_images, image_checker, report), on_bad_image, report,
        lambda position: f"{name_or_path} row {position} (id {ids_column[int(position)].as_py()!r})")
    if dropped:
        keep = np.setdiff1d(keep, np.fromiter(dropped, dtype=np.int64))
    if not len(keep):
        raise DataError(f"no usable rows in {name_or_path} ({report.summary()})")
    merged = concatenate_datasets([text, dataset.select_columns(["images"])], axis=1)
    if len(keep) < len(merged):
        merged = merged.select(keep)
    merged = with_decode(merged, "images", True)  # decoded to PIL on access, as TRL expects
    report.rows_kept = len(merged)
    report.text_only_rows = int((counts[keep] == 0).sum())
    logger.info("dataset %s: %s", name_or_path, report.summary())
    return (merged, report) if return_report else merged
