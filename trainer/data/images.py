"""Image checks before training: headers opened, files stat-ed or a seeded sample of embedded bytes, by policy."""

from __future__ import annotations

import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from llava_normaligned.compat import dataset_indices

from .common import MAX_LISTED, DataError, DataReport, log_phase

logger = logging.getLogger(__name__)

AUTO_OPEN_LIMIT = 50_000  # "auto" opens every image header up to this many images, above it checks existence
AUTO_SAMPLE = 1_000  # "auto" above the limit: embedded images whose headers are opened (a seeded sample)

# ------------------------------------------------------------------------------------------------------ images


@dataclass
class ImageRefs:
    """The images of the kept rows, one entry per image: the row position, the file path (or ``None``) and, for
    embedded images, the byte count (``-1``: no bytes) and a reader of the bytes, called only for the images whose
    header is opened. The ``items`` an ``image_checker`` gets."""

    positions: np.ndarray
    paths: list
    sizes: np.ndarray | None = None
    read_bytes: object = None  # (image index) -> bytes

    def __len__(self) -> int:
        return len(self.positions)


def _header_problem(source) -> str | None:
    """Why an image (a path or a file object) cannot be opened, or ``None``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as image:
            width, height = image.size
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as err:
        return f"unreadable ({type(err).__name__}: {err})"
    if width < 1 or height < 1:
        return f"empty image ({width}x{height})"
    return None


def _file_problem(path: str | None, check: str) -> str | None:
    if not path:
        return "no image path or bytes"
    try:
        stat = os.stat(path)
    except OSError:
        return "file not found"
    if not os.path.stat.S_ISREG(stat.st_mode):
        return "not a file"
    if stat.st_size == 0:
        return "empty file (0 bytes)"
    return _header_problem(path) if check == "open" else None


def _threads() -> int:
    return min(16, (os.cpu_count() or 2) * 4)  # stat/open wait on the disk: more threads than cores


def _check_chunks(indices: list[int], probe) -> dict[int, str]:
    """``{image index: problem}`` for ``probe(index)`` over ``indices``, in chunks on a few threads."""
    if not indices:
        return {}
    size = max(256, len(indices) // (_threads() * 8))

    def run(chunk):
        return [(i, problem) for i in chunk if (problem := probe(i)) is not None]

    bad = {}
    with ThreadPoolExecutor(max_workers=_threads()) as pool:
        for found in pool.map(run, [indices[s : s + size] for s in range(0, len(indices), size)]):
            bad.update(found)
    return bad


def resolve_check(check: str, n_images: int) -> str:
    """``"auto"`` -> ``"open"`` up to ``AUTO_OPEN_LIMIT`` images, ``"exists"`` above."""
    if check != "auto":
        return check
    return "open" if n_images <= AUTO_OPEN_LIMIT else "exists"


def find_bad_images(items: ImageRefs, check: str) -> dict[int, str]:
    """``{row position: 'image PATH: reason'}`` for every unusable image (the loaders' default ``image_checker``).

    ``check``: ``"open"`` opens every header (files on a few threads; embedded bytes too); ``"exists"``: a file is
    there and not empty (one ``stat``), embedded bytes are not empty; ``"auto"``: ``"open"`` up to
    ``AUTO_OPEN_LIMIT`` images, above it ``"exists"`` plus the headers of ``AUTO_SAMPLE`` embedded images (a seeded
    sample), so that a whole column of undecodable bytes is found before training; ``"none"``: nothing.
    """
    import io

    if check == "none" or not len(items):
        return {}
    mode = resolve_check(check, len(items))
    sizes = items.sizes if items.sizes is not None else np.full(len(items), -1)
    embedded = np.flatnonzero(sizes >= 0)
    files = np.flatnonzero(sizes < 0).tolist()
    bad = _check_chunks(files, lambda i: _file_problem(items.paths[i], mode))
    bad.update({int(i): "empty image bytes" for i in embedded[sizes[embedded] == 0]})
    to_open = embedded[sizes[embedded] > 0].tolist()
    if mode != "open":  # "exists": none; "auto" above the limit: a seeded sample
        to_open = sorted(random.Random(0).sample(to_open, min(AUTO_SAMPLE, len(to_open)))) if check == "auto" else []
    bad.update(_check_chunks(to_open, lambda i: _header_problem(io.BytesIO(items.read_bytes(i)))))
    out = {}
    for i in sorted(bad):
        where = f"{items.paths[i] or ''} (embedded)".lstrip() if sizes[i] >= 0 else items.paths[i]
        out.setdefault(int(items.positions[i]), f"image {where}: {bad[i]}")
    return out


def _check_images(items: ImageRefs, check: str, image_checker, report: DataReport) -> dict[int, str]:
    start = time.perf_counter()
    checker = image_checker or find_bad_images
    bad = checker(items, check)
    mode = resolve_check(check, len(items))
    embedded = items.sizes is not None and bool((items.sizes >= 0).any())
    report.image_check = "exists+sample" if check == "auto" and mode == "exists" and embedded else mode
    if check != "none" and getattr(checker, "checks_here", True):  # False: another process opened them
        report.images_checked_here = len(items)
    report.seconds["image_check"] = log_phase(f"image check ({report.image_check})", len(items), start, "images")
    return bad


def _apply_image_policy(bad: dict[int, str], policy: str, report: DataReport, name) -> set[int]:
    """``bad``: ``{row position: problem}``; ``name(position)``: the row's name, built for the listed rows only."""
    if not bad:
        return set()
    listed_rows = list(bad)[:MAX_LISTED]
    listed = [f"{name(p)}: {bad[p]}" for p in listed_rows]
    text = "\n  ".join(listed)
    if policy == "error":
        raise DataError(f"{len(bad)} row(s) have a missing or unreadable image (fix the image paths or the image "
                        f"folder they are relative to):\n  {text}", policy="on_bad_image")
    logger.warning("skipping %d row(s) with a missing or unreadable image:\n  %s", len(bad), text)
    report.bad_images_skipped += len(bad)
    for message in listed:
        report.note(f"skipped: {message}")
    return set(bad)


def _bad_row(err: DataError, policy: str, report: DataReport) -> None:
    if policy == "error":
        raise DataError(str(err), policy="on_bad_row") from None
    report.bad_rows_skipped += 1
    report.note(f"skipped: {err}")


def _indices(dataset) -> np.ndarray | None:
    """The dataset's indices mapping (``select``) as numpy, or ``None``."""
    indices = dataset_indices(dataset)
    return None if indices is None else indices.column(0).to_numpy()


def _list_lengths(dataset, column: str) -> np.ndarray:
    """Per-row length of a list column, from the Arrow offsets (no value is read or copied); 0 for a null list."""
    import pyarrow.compute as pc

    chunks = [pc.list_value_length(chunk).fill_null(0).to_numpy(zero_copy_only=False)
              for chunk in dataset.data.column(column).chunks]
    lengths = np.concatenate(chunks).astype(np.int64) if chunks else np.zeros(0, dtype=np.int64)
    order = _indices(dataset)
    return lengths if order is None else lengths[order]


def _column(dataset, column: str):
    """A small column (ids, numbers) as a pyarrow ChunkedArray in the dataset's row order."""
    array = dataset.data.column(column)
    order = _indices(dataset)
    return array if order is None else array.take(order)


def count_images(dataset) -> np.ndarray:
    """The number of images of each row, from the Arrow list offsets of ``images`` (no image is read)."""
    return _list_lengths(dataset, "images")


def _image_refs(dataset, positions: np.ndarray) -> ImageRefs:
    """The ``ImageRefs`` of the rows at ``positions`` (sorted) of an un-indexed dataset's ``images`` column: their
    paths and byte counts, read from the Arrow buffers chunk by chunk; the bytes themselves only on demand."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if dataset_indices(dataset) is not None:
        raise ValueError("_image_refs reads an un-indexed dataset")
    rows, paths, sizes, where = [], [], [], []
    first = 0
    for number, chunk in enumerate(dataset.data.column("images").chunks):
        local = positions[(positions >= first) & (positions < first + len(chunk))] - first
        if len(local):
            offsets = chunk.offsets.to_numpy()
            valid = chunk.is_valid().to_numpy(zero_copy_only=False)
            starts, ends = offsets[local], np.where(valid[local], offsets[local + 1], offsets[local])
            lengths = ends - starts
            # the value indices of each row's images: starts[r], starts[r] + 1, ..., ends[r] - 1, all rows at once
            value_index = np.arange(lengths.sum()) + np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
            values = chunk.values
            rows.append(np.repeat(local + first, lengths))
            paths += values.field("path").take(pa.array(value_index)).to_pylist()
            data = values.field("bytes")
            size = pc.binary_length(data).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            sizes.append(size[value_index])
            where.append((number, value_index))
        first += len(chunk)
    if not rows:
        return ImageRefs(np.zeros(0, dtype=np.int64), [])
    sizes = np.concatenate(sizes)
    chunks = dataset.data.column("images").chunks
    chunk_of = np.concatenate([np.full(len(index), number) for number, index in where])
    value_of = np.concatenate([index for _, index in where])

    def read_bytes(i: int):
        return chunks[int(chunk_of[i])].values.field("bytes")[int(value_of[i])].as_py()

    return ImageRefs(np.concatenate(rows), paths, sizes if (sizes >= 0).any() else None, read_bytes)
