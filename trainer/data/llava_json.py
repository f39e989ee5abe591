"""LLaVA JSON files (LLaVA-558K, mix665k): streamed, parsed, checked and cached as Arrow."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import numpy as np

from llava_normaligned.atomic_files import write_json_atomic
from llava_normaligned.families.tokens import IMAGE_TOKEN as IMAGE_TAG  # the tag in LLaVA-format text

from .columns import ArrowColumns, _save_dataset, in_memory_dataset, row_features
from .common import (
    BAD_IMAGE_POLICIES,
    BAD_ROW_POLICIES,
    IMAGE_CHECKS,
    LLAVA_ROLES,
    LOADED_FORMAT,
    DataError,
    DataReport,
    _check_policy,
    _RowProblem,
    log_phase,
    split_paths,
)
from .images import _apply_image_policy, _bad_row, _check_images, _column, _image_refs, count_images
from .rows import _llava_images, _llava_messages, _row_name

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------- LLaVA JSON


READ_BLOCK = 1 << 24  # bytes read at a time where a file is hashed: never held whole
JSON_BUFFER = 1 << 16  # bytes ijson reads at a time (its default; larger buffers parse slower)


def _check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")


def parse_json_rows_whole(path: str) -> list:
    """The whole-file parse (``json.loads``): the reference for ``iter_json_rows``, whose error messages it gives."""
    with open(path, "rb") as handle:
        raw = handle.read()
    try:
        rows = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(rows, list):
        raise DataError(f"{path}: expected a JSON list of rows (LLaVA format), got {type(rows).__name__}")
    return rows


def _opens_a_list(handle) -> bool:
    """Whether the UTF-8 text from ``handle``'s position starts with ``[`` (leading whitespace skipped); the position
    is left where it was."""
    start = handle.tell()
    while (piece := handle.read(4096)) and not piece.strip(b" \t\n\r"):
        pass
    handle.seek(start)
    return piece.lstrip(b" \t\n\r").startswith(b"[")


def iter_json_rows(path: str, block: int = JSON_BUFFER):
    """The rows of a LLaVA JSON file (a list) or a JSON-lines file (one object per line), one at a time.

    A UTF-8 ``.json`` list is parsed element by element by ijson (its C backend, yajl2_c) from ``block``-byte pieces
    of the file: memory holds one piece and one row's objects, never every row's objects at once (``json.loads`` of
    a 0.86 GB mix665k-shaped file peaks at 3.5 GB RSS, ijson at 13 MiB; ``benchmarks/bench_json_stream.py``). A file
    ijson does not read to its end as one list is handed to ``json.loads`` whole: its error names the problem, and
    what it reads that ijson does not (UTF-16/32, ``NaN``) gives its remaining rows. One difference from
    ``json.loads``: an escaped lone surrogate (``"\\ud800"``, which no UTF-8 text holds) reads as ``?``."""
    if path.endswith(".jsonl"):
        with open(path, "rb") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except (json.JSONDecodeError, UnicodeDecodeError) as err:
                        raise DataError(f"{path}, line {number}: not valid JSON ({err})") from None
        return
    import ijson

    read = 0
    with open(path, "rb") as handle:
        encoding = json.detect_encoding(handle.read(4))
        handle.seek(3 if encoding == "utf-8-sig" else 0)  # past the byte order mark, which yajl does not take
        if encoding in ("utf-8", "utf-8-sig") and _opens_a_list(handle):
            try:
                for row in ijson.items(handle, "item", use_float=True, buf_size=block):
                    yield row
                    read += 1
                return
            except (ijson.JSONError, UnicodeDecodeError):
                pass
    yield from parse_json_rows_whole(path)[read:]  # raises, naming the problem, for a file that is not a list


def parse_llava_file(rows, path: str, file_index: int, image_folder, columns: ArrowColumns, report: DataReport,
                      on_bad_row: str) -> None:
    """Check and convert each row of the iterable ``rows`` (one pass, each JSON object freed once converted). The
    common row (a human turn first, string values, known roles) takes the fused loop below; anything else goes
    through ``_llava_messages``, which names the problem."""
    base = os.path.basename(path)
    # absolute, as the cache key's folder is: the cached rows must not depend on the directory the first run was in
    prefix = os.path.join(os.path.abspath(image_folder), "") if image_folder is not None else None
    roles = LLAVA_ROLES
    add = columns.add
    index = -1
    for index, raw in enumerate(rows):  # freed as converted: the Arrow columns replace the JSON objects
        try:
            if type(raw) is not dict:
                raise _RowProblem(f"a row must be a JSON object, got {type(raw).__name__}")
            image = raw.get("image")
            images = [] if image is None else [image] if type(image) is str else _llava_images(raw)
            turns = raw.get("conversations")
            roles_of = contents = None
            if type(turns) is list and turns:
                roles_of, contents, tags, seen = [], [], 0, 0
                for turn in turns:  # fast path; any surprise falls back to the checked conversion
                    if type(turn) is not dict:
                        roles_of = None
                        break
                    role, value = roles.get(turn.get("from")), turn.get("value")
                    if role is None or type(value) is not str:
                        roles_of = None
                        break
                    if IMAGE_TAG in value:
                        if role != "user":
                            roles_of = None
                            break
                        tags += value.count(IMAGE_TAG)
                        value = value.replace(IMAGE_TAG, "").strip()
                    seen |= 1 if role == "user" else 2 if role == "assistant" else 0
                    roles_of.append(role)
                    contents.append(value)
                if roles_of is not None:
                    first = 1 if roles_of[0] == "system" else 0
                    if ((len(roles_of) > first and roles_of[first] == "assistant") or seen != 3
                            or tags != len(images) and (tags or not images)):
                        roles_of = None  # a leading answer to drop, a missing role, tags that do not match: checked
            if roles_of is None:
                messages = _llava_messages(turns, len(images), report)
                roles_of, contents = [m["role"] for m in messages], [m["content"] for m in messages]
            if images:
                if prefix is not None:
                    images = [i if i.startswith("/") else prefix + i for i in images]
                elif not all(os.path.isabs(i) for i in images):
                    raise _RowProblem(f"image {images[0]!r} is a relative path but no image_folder was given")
        except _RowProblem as err:
            row_id = raw.get("id") if isinstance(raw, dict) else None
            _bad_row(DataError(f"{_row_name(path, index, row_id)}: {err}"), on_bad_row, report)
            continue
        row_id = raw.get("id")
        add(str(row_id) if row_id is not None else f"{base}:{index}", roles_of, contents, images, file_index, index)
    report.rows_read += index + 1


def _loaded_key(parts: list, files: list[str]) -> str:
    """A hash of ``parts`` and the bytes of ``files`` (read ``READ_BLOCK`` at a time, never whole)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in [LOADED_FORMAT, *parts]:
        digest.update(repr(part).encode("utf-8"))
        digest.update(b"\0")
    for path in files:
        digest.update(os.path.getsize(path).to_bytes(8, "little"))
        with open(path, "rb") as handle:
            while block := handle.read(READ_BLOCK):
                digest.update(block)
    return digest.hexdigest()


def _cached(cache_dir: str | None, key: str):
    """(dataset, saved report fields) from the cache, or ``None``."""
    if cache_dir is None:
        return None
    path = os.path.join(cache_dir, f"{key}.arrow")
    meta = os.path.join(cache_dir, f"{key}.json")
    if not (os.path.isfile(path) and os.path.isfile(meta)):
        return None
    from datasets import Dataset

    with open(meta, encoding="utf-8") as handle:
        saved = json.load(handle)
    return Dataset.from_file(path), saved


def _store(cache_dir: str | None, key: str, table, features, saved: dict):
    """The parsed rows as a dataset: memory-mapped from the cache file when there is a cache, else in memory."""
    if cache_dir is None:
        return in_memory_dataset(table, features)
    dataset = _save_dataset(table, features, os.path.join(cache_dir, f"{key}.arrow"))
    meta = os.path.join(cache_dir, f"{key}.json")
    write_json_atomic(meta, saved)
    return dataset


PARSE_FIELDS = ("rows_read", "bad_rows_skipped", "leading_assistant_turns_dropped", "examples")


def _parsed_rows(paths: list[str], image_folder: str | None, on_bad_row: str, cache_dir: str | None,
                 report: DataReport):
    """The files' rows parsed into Arrow columns (with each row's source file and index), or read back from the
    cache when the same files, image folder and policy were parsed before; what was read is counted in ``report``."""
    if image_folder is not None and not os.path.isdir(image_folder):
        raise FileNotFoundError(f"image_folder is not a folder: {image_folder}")
    start = time.perf_counter()
    for path in paths:
        _check_file(path)
    folder = os.path.abspath(image_folder) if image_folder is not None else None
    key = _loaded_key(["llava-json", [os.path.basename(p) for p in paths], folder, on_bad_row], paths)
    found = _cached(cache_dir, key)
    if found is not None:
        loaded, saved = found
        for name in PARSE_FIELDS:
            setattr(report, name, saved[name])
        report.read_from_cache = True
        report.seconds["parse"] = log_phase("parsed rows read from the cache", len(loaded), start)
    else:
        columns = ArrowColumns()
        for file_index, path in enumerate(paths):
            parse_llava_file(iter_json_rows(path), path, file_index, image_folder, columns, report, on_bad_row)
        report.seconds["parse"] = log_phase("LLaVA JSON parsed", report.rows_read, start)
        loaded = _store(cache_dir, key, columns.table(), row_features(provenance=True),
                        {name: getattr(report, name) for name in PARSE_FIELDS})
    if cache_dir is not None:
        report.cache_file = os.path.join(cache_dir, f"{key}.arrow")
    return loaded


def _row_namer(loaded, paths: list[str]):
    """``position -> "file, row index, id"`` for the parsed rows, for the messages about a bad image."""
    source_file = _column(loaded, "source_file").to_numpy()
    source_row = _column(loaded, "source_row").to_numpy()
    ids = loaded.data.column("id")

    def name(position: int) -> str:
        return _row_name(paths[source_file[position]], int(source_row[position]), ids[int(position)].as_py())

    return name


def load_llava_json(
    data_path: str | list[str],
    image_folder: str | None,
    *,
    on_bad_image: str = "error",
    on_bad_row: str = "error",
    check_images: str = "auto",
    return_report: bool = False,
    image_checker=None,
    cache_dir: str | None = None,
):
    """Load LLaVA JSON conversation files into a ``datasets.Dataset`` in TRL's messages + images format.

    Args:
        data_path: one file, a comma-separated list (``"a.json,b.json"``) or a list of files; ``.json`` (a list of
            rows, as LLaVA-558K and llava_v1_5_mix665k ship) or ``.jsonl`` (one row per line).
        image_folder: the folder the rows' ``image`` paths are relative to (``None`` if they are absolute or every
            row is text-only).
        on_bad_image: ``"error"`` (default): a missing or unreadable image raises ``DataError`` naming the row (file,
            index, id) and the image path; ``"skip"``: such rows are dropped, counted and logged.
        on_bad_row: the same for a malformed row (no conversations, unknown role, no assistant turn, ``<image>`` tags
            that do not match the images, ...).
        check_images: ``"auto"`` (default): ``"open"`` up to ``AUTO_OPEN_LIMIT`` images, ``"exists"`` above;
            ``"open"`` opens each image's header up front; ``"exists"`` checks each file is there and not empty (one
            ``stat``: at 558K cold files, seconds instead of minutes); ``"none"`` checks nothing here. An image that
            was not opened here and fails to decode is met by the collator (its ``on_bad_image``).
        return_report: also return the ``DataReport`` of what was read, kept and dropped.
        image_checker: ``(ImageRefs, check) -> {row position: problem}``, the function that checks the images
            (default ``find_bad_images``); ``train`` passes one that checks them on the main process only.
        cache_dir: keep the parsed rows in an Arrow file here, named by a hash of the files' bytes, the image folder
            and ``on_bad_row``, and memory-map it on the next call instead of parsing (images are checked again).

    Returns:
        A ``datasets.Dataset`` (and the ``DataReport`` with ``return_report=True``) with columns ``id`` (str),
        ``messages`` (list of ``{"role", "content"}`` with string content, ``<image>`` tags removed) and ``images``
        (list of images, decoded to PIL on access; empty for text-only rows). Multi-turn rows keep every turn; every
        assistant turn is trained on.
    """
    _check_policy("on_bad_image", on_bad_image, BAD_IMAGE_POLICIES)
    _check_policy("on_bad_row", on_bad_row, BAD_ROW_POLICIES)
    _check_policy("check_images", check_images, IMAGE_CHECKS)
    paths = split_paths(data_path)
    report = DataReport(sources=list(paths))
    loaded = _parsed_rows(paths, image_folder, on_bad_row, cache_dir, report)
    counts = count_images(loaded)
    dropped = _apply_image_policy(
        _check_images(_image_refs(loaded, np.flatnonzero(counts > 0)), check_images, image_checker, report),
        on_bad_image, report, _row_namer(loaded, paths))
    dataset = loaded.select_columns(["id", "messages", "images"])
    if dropped:
        keep = np.setdiff1d(np.arange(len(loaded)), np.fromiter(dropped, dtype=np.int64))
        dataset, counts = dataset.select(keep), counts[keep]
    if not len(dataset):
        raise DataError(f"no usable rows in {', '.join(report.sources)} ({report.summary()})")
    report.rows_kept = len(dataset)
    report.text_only_rows = int((counts == 0).sum())
    logger.info("LLaVA JSON %s: %s", ", ".join(report.sources), report.summary())
    return (dataset, report) if return_report else dataset


__all__ = ["JSON_BUFFER", "iter_json_rows", "load_llava_json", "parse_json_rows_whole", "parse_llava_file"]
