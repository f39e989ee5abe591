"""Arrow columns built in chunks, saved once and memory-mapped (no per-row dataset indexing)."""

from __future__ import annotations

import logging
import os

import numpy as np

from llava_normaligned.compat import dataset_indices, dataset_over, write_arrow_file

from .common import CHUNK_ROWS

logger = logging.getLogger(__name__)

# ------------------------------------------------------------------------------------ Arrow columns, in chunks

MESSAGE_TYPE = None  # pyarrow types, built on first use (pyarrow is imported lazily)


def _message_type():
    import pyarrow as pa

    global MESSAGE_TYPE
    if MESSAGE_TYPE is None:
        MESSAGE_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    return MESSAGE_TYPE


def row_features(image_decode: bool = True, provenance: bool = False):
    from datasets import Features, Image, List, Value

    columns = {
        "id": Value("string"),
        "messages": List({"role": Value("string"), "content": Value("string")}),
        "images": List(Image(decode=image_decode)),
    }
    if provenance:
        columns.update({"source_file": Value("int32"), "source_row": Value("int64")})
    return Features(columns)


def _image_list_array(paths_per_row: list[list[str]]):
    """``[[path, ...], ...]`` -> the Arrow storage of ``List(Image())`` (``{"bytes": null, "path"}`` structs)."""
    import pyarrow as pa

    lengths = np.fromiter((len(p) for p in paths_per_row), dtype=np.int32, count=len(paths_per_row))
    offsets = np.zeros(len(paths_per_row) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = pa.array([p for row in paths_per_row for p in row], type=pa.string())
    structs = pa.StructArray.from_arrays([pa.nulls(len(flat), pa.binary()), flat], names=["bytes", "path"])
    return pa.ListArray.from_arrays(pa.array(offsets), structs)


class ArrowColumns:
    """Parsed rows gathered as Arrow record batches, ``CHUNK_ROWS`` at a time (the Python objects are freed). A
    row's messages are kept as its roles and contents, flat across rows, and become the list-of-struct column at
    once (no dict per message)."""

    def __init__(self):
        self.batches = []
        self._reset()

    def _reset(self):
        self.ids, self.roles, self.contents, self.turns, self.images, self.files, self.rows = [], [], [], [], [], [], []

    def add(self, row_id: str, roles: list[str], contents: list[str], images: list[str], file_index: int,
            row_index: int) -> None:
        self.ids.append(row_id)
        self.roles += roles
        self.contents += contents
        self.turns.append(len(roles))
        self.images.append(images)
        self.files.append(file_index)
        self.rows.append(row_index)
        if len(self.ids) >= CHUNK_ROWS:
            self.flush()

    def flush(self) -> None:
        import pyarrow as pa

        if not self.ids:
            return
        offsets = np.zeros(len(self.turns) + 1, dtype=np.int32)
        np.cumsum(self.turns, out=offsets[1:])
        messages = pa.ListArray.from_arrays(pa.array(offsets), pa.StructArray.from_arrays(
            [pa.array(self.roles, type=pa.string()), pa.array(self.contents, type=pa.string())],
            names=["role", "content"]))
        self.batches.append(pa.RecordBatch.from_arrays(
            [pa.array(self.ids, type=pa.string()), messages.cast(_message_type()),
             _image_list_array(self.images), pa.array(self.files, type=pa.int32()),
             pa.array(self.rows, type=pa.int64())],
            names=["id", "messages", "images", "source_file", "source_row"],
        ))
        self._reset()

    def table(self):
        import pyarrow as pa

        self.flush()
        schema = row_features(provenance=True).arrow_schema
        return pa.Table.from_batches(self.batches, schema=schema) if self.batches else schema.empty_table()


def _save_dataset(table, features, path: str):
    """Write ``table`` as a datasets Arrow file (atomically: several processes may write the same one) and return
    the dataset memory-mapped from it."""
    from datasets import Dataset

    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = f"{path}.{os.getpid()}.tmp"
    write_arrow_file(table, features, partial, CHUNK_ROWS)
    os.replace(partial, path)
    return Dataset.from_file(path)


def in_memory_dataset(table, features):
    return dataset_over(table, features=features)


def with_decode(dataset, column: str, decode: bool):
    """The same rows with ``column`` (a ``List(Image)`` or ``Image``) decoded to PIL on access or not. No data is
    read or copied (``cast_column`` on a list of images rewrites the whole table, gigabytes for embedded images)."""
    from datasets import Image, List

    features = dataset.features.copy()
    feature = features[column]
    features[column] = List(Image(decode=decode)) if isinstance(feature, List) else Image(decode=decode)
    if features[column] == feature:
        return dataset
    return dataset_over(dataset.data, features=features, split=dataset.split, indices=dataset_indices(dataset))
