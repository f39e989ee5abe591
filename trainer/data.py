"""Training data: LLaVA JSON conversations and Hugging Face datasets, as TRL's messages + images rows.

Two sources, one output format (what TRL's ``SFTTrainer`` takes for a vision-language model):

    {"id": str, "messages": [{"role": "user" | "assistant" | "system", "content": str}, ...], "images": [PIL, ...]}

* ``load_llava_json``: the format of LLaVA-558K and llava_v1_5_mix665k
  (``{"id", "image", "conversations": [{"from": "human", "value": "<image>\\n..."}, {"from": "gpt", ...}]}``),
  multi-turn, text-only rows (no ``image`` key) allowed.
* ``load_messages_dataset``: a saved dataset folder, a parquet/JSON folder or file, or a Hub dataset id, in TRL's
  messages + images format or in LLaVA's conversation format as the Hub publishes it (``lmms-lab/LLaVA-NeXT-Data``,
  ``lmms-lab/LLaVA-ReCap-558K``: ``id``, ``conversations`` [{``from``, ``value``}], ``image`` with embedded bytes).

Images are placed before the first user message and the ``<image>`` tags are removed from the text, which is what
LLaVA-1.5's own preprocessing does (``preprocess_multimodal`` moves the tag to the front) and what TRL expects.

Every row's text is checked here, before training starts, so that nothing fails hours into a run: a malformed row
is an error naming the row (file, index, id), or, with ``on_bad_row="skip"``, a dropped row counted in the returned
``DataReport``. Images are checked as ``check_images`` says (``"auto"``: every header opened up to
``AUTO_OPEN_LIMIT`` images; above, one ``stat`` per file, or the byte count of each embedded image plus the headers
of a sample): a missing or unreadable image is an error naming its row, or a dropped row with
``on_bad_image="skip"``. An image that passes the check and still fails to decode is met by the collator.

At the paper's scale (558K-779K rows) every pass here is linear and vectorised where it can be (Arrow arrays built
in chunks, no per-row dataset indexing), and logs its count and rate. The parsed rows are cached (``cache_dir``:
an Arrow file named by a hash of the input files' bytes and the options), so the same run again memory-maps them
instead of parsing; embedded image bytes are never copied or decoded up front.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from llava_normaligned.compat import dataset_fingerprint, dataset_indices, dataset_over, write_arrow_file
from llava_normaligned.families.tokens import IMAGE_TOKEN as IMAGE_TAG  # the tag in LLaVA-format text
from llava_normaligned.io import write_json_atomic

logger = logging.getLogger(__name__)

# LLaVA's role names -> chat roles.
LLAVA_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
CHAT_ROLES = ("system", "user", "assistant")
BAD_IMAGE_POLICIES = ("error", "skip")
BAD_ROW_POLICIES = ("error", "skip")
IMAGE_CHECKS = ("auto", "open", "exists", "none")
AUTO_OPEN_LIMIT = 50_000  # "auto" opens every image header up to this many images, above it checks existence
AUTO_SAMPLE = 1_000  # "auto" above the limit: embedded images whose headers are opened (a seeded sample)
MAX_LISTED = 10  # problems quoted in an error message
CHUNK_ROWS = 65_536  # rows converted to Arrow at a time
LOADED_FORMAT = "loaded-v1"  # changes whenever the parsed columns would change for the same inputs
PROGRESS_SECONDS = 5.0  # phases longer than this log their count and rate


class DataError(ValueError):
    """A training row that cannot be used, named by its file, index and id."""


class _RowProblem(Exception):
    """What is wrong with a row; the caller names the row (names are built only for rows that fail)."""


@dataclass
class DataReport:
    """What loading did to the rows: read, kept, and dropped (with the first few examples of each)."""

    sources: list[str] = field(default_factory=list)
    rows_read: int = 0
    rows_kept: int = 0
    text_only_rows: int = 0
    leading_assistant_turns_dropped: int = 0
    bad_rows_skipped: int = 0
    bad_images_skipped: int = 0
    images_checked_here: int = 0  # images this process checked (0 on the other processes of a multi-process run)
    image_check: str = ""  # what the image check did ("open", "exists", "exists+sample", "none")
    cache_file: str | None = None  # the parsed rows' cache (None: not cached)
    read_from_cache: bool = False
    seconds: dict = field(default_factory=dict)  # time per phase
    examples: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        if len(self.examples) < MAX_LISTED:
            self.examples.append(message)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"{self.rows_kept}/{self.rows_read} rows kept ({self.text_only_rows} text-only)"]
        if self.bad_rows_skipped:
            parts.append(f"{self.bad_rows_skipped} malformed rows skipped")
        if self.bad_images_skipped:
            parts.append(f"{self.bad_images_skipped} rows with a missing/unreadable image skipped")
        if self.leading_assistant_turns_dropped:
            parts.append(f"{self.leading_assistant_turns_dropped} leading assistant turns dropped (as LLaVA does)")
        return "; ".join(parts)


def log_phase(what: str, count: int, start: float, unit: str = "rows") -> float:
    """Log ``what`` with its count and rate when it took longer than ``PROGRESS_SECONDS``; returns the seconds."""
    seconds = time.perf_counter() - start
    if seconds >= PROGRESS_SECONDS:
        logger.info("%s: %d %s in %.1f s (%.0f %s/s)", what, count, unit, seconds, count / max(seconds, 1e-9), unit)
    return round(seconds, 3)


def _check_policy(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def split_paths(data_path: str | os.PathLike | list) -> list[str]:
    """``"a.json,b.json"`` or a list of paths -> a list of paths."""
    if isinstance(data_path, (list, tuple)):
        paths = [str(p) for p in data_path]
    else:
        paths = [p.strip() for p in str(data_path).split(",")]
    paths = [p for p in paths if p]
    if not paths:
        raise ValueError("data_path: no file given")
    return paths


def default_cache_dir(kind: str) -> str:
    """Where ``train`` keeps what it computed from the data (``kind``: "loaded" rows, "prepared" columns): under
    the datasets cache (``$HF_DATASETS_CACHE``), one file per distinct input, reused by the next run."""
    import datasets

    return os.path.join(datasets.config.HF_DATASETS_CACHE, f"llava_normaligned_{kind}")


# ----------------------------------------------------------------------------------------------- row conversion


def _row_name(path: str, index: int, row_id) -> str:
    return f"{os.path.basename(path)} row {index}" + (f" (id {row_id!r})" if row_id is not None else "")


def _llava_images(row: dict) -> list[str]:
    image = row.get("image")
    if image is None:
        return []
    if isinstance(image, str):
        return [image]
    if isinstance(image, list) and all(isinstance(i, str) for i in image):
        return list(image)
    raise _RowProblem(f"'image' must be a path or a list of paths, got {type(image).__name__}")


def _llava_messages(turns, n_images: int, report: DataReport) -> list[dict]:
    """LLaVA ``conversations`` -> chat messages with string content and the ``<image>`` tags removed."""
    if not isinstance(turns, list) or not turns:
        raise _RowProblem("'conversations' must be a non-empty list")
    messages = []
    for number, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or "from" not in turn:
            raise _RowProblem(f"turn {number} must be an object with 'from' and a string 'value'")
        role = LLAVA_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise _RowProblem(f"turn {number} has unknown 'from' {turn['from']!r} (expected human/gpt/system)")
        messages.append({"role": role, "content": turn["value"]})
    # LLaVA's preprocess skips a conversation's first turn when it is not the human's; so do we.
    first = 1 if messages[0]["role"] == "system" else 0
    while first < len(messages) and messages[first]["role"] == "assistant":
        messages.pop(first)
        report.leading_assistant_turns_dropped += 1
    return _clean_image_tags(messages, n_images)


def _clean_image_tags(messages: list[dict], n_images: int) -> list[dict]:
    tags = 0
    for m in messages:
        if IMAGE_TAG in m["content"]:
            if m["role"] != "user":
                raise _RowProblem(f"an {IMAGE_TAG} tag outside a user turn")
            tags += m["content"].count(IMAGE_TAG)
    if n_images == 0 and tags:
        raise _RowProblem(f"the text has {tags} {IMAGE_TAG} tag(s) but the row has no image")
    if tags and tags != n_images:
        raise _RowProblem(f"the text has {tags} {IMAGE_TAG} tag(s) for {n_images} image(s)")
    if tags:
        messages = [{"role": m["role"], "content": m["content"].replace(IMAGE_TAG, "").strip()}
                    if m["role"] == "user" and IMAGE_TAG in m["content"] else m for m in messages]
    _check_conversation(messages)
    return messages


def _check_conversation(messages: list[dict]) -> None:
    roles = {m["role"] for m in messages}
    if "assistant" not in roles:
        raise _RowProblem("no assistant turn, nothing to train on")
    if "user" not in roles:
        raise _RowProblem("no user turn")


def _message_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict) and part.get("type") == "text")


def _hf_messages(messages, n_images: int) -> list[dict]:
    """TRL messages (string or list-of-parts content) -> messages with string content; image parts are counted."""
    if not isinstance(messages, list) or not messages:
        raise _RowProblem("'messages' must be a non-empty list")
    placeholders, out = 0, []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise _RowProblem(f"message {number} must have a role in {CHAT_ROLES}")
        content = message.get("content")
        if isinstance(content, list):
            placeholders += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image")
        elif content is not None and not isinstance(content, str):
            raise _RowProblem(f"message {number} content must be a string or a list of parts")
        out.append({"role": message["role"], "content": _message_text(content)})
    if placeholders and placeholders != n_images:
        raise _RowProblem(f"{placeholders} image part(s) in the messages for {n_images} image(s)")
    return _clean_image_tags(out, n_images)


# ------------------------------------------------------------------------------------ Arrow columns, in chunks

MESSAGE_TYPE = None  # pyarrow types, built on first use (pyarrow is imported lazily)


def _message_type():
    import pyarrow as pa

    global MESSAGE_TYPE
    if MESSAGE_TYPE is None:
        MESSAGE_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    return MESSAGE_TYPE


def _features(image_decode: bool = True, provenance: bool = False):
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


class _Columns:
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
        schema = _features(provenance=True).arrow_schema
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


def _in_memory_dataset(table, features):
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
        raise DataError(
            f"{len(bad)} row(s) have a missing or unreadable image:\n  {text}\n"
            "Fix the paths (--image-folder) or pass on_bad_image='skip' (--on-bad-image skip) to drop these rows."
        )
    logger.warning("skipping %d row(s) with a missing or unreadable image:\n  %s", len(bad), text)
    report.bad_images_skipped += len(bad)
    for message in listed:
        report.note(f"skipped: {message}")
    return set(bad)


def _bad_row(err: DataError, policy: str, report: DataReport) -> None:
    if policy == "error":
        raise DataError(f"{err} (pass on_bad_row='skip' / --on-bad-row skip to drop such rows)") from None
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


# ----------------------------------------------------------------------------------------------- LLaVA JSON


READ_BLOCK = 1 << 24  # bytes read at a time where a file is hashed: never held whole
JSON_BUFFER = 1 << 16  # bytes ijson reads at a time (its default; larger buffers parse slower)


def _check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")


def _parse_json_rows_whole(path: str) -> list:
    """The whole-file parse (``json.loads``): the reference for ``_iter_json_rows``, whose error messages it gives."""
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


def _iter_json_rows(path: str, block: int = JSON_BUFFER):
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
    yield from _parse_json_rows_whole(path)[read:]  # raises, naming the problem, for a file that is not a list


def _parse_llava_file(rows, path: str, file_index: int, image_folder, columns: _Columns, report: DataReport,
                      on_bad_row: str) -> None:
    """Check and convert each row of the iterable ``rows`` (one pass, each JSON object freed once converted). The
    common row (a human turn first, string values, known roles) takes the fused loop below; anything else goes
    through ``_llava_messages``, which names the problem."""
    base = os.path.basename(path)
    prefix = os.path.join(image_folder, "") if image_folder is not None else None
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
        return _in_memory_dataset(table, features)
    dataset = _save_dataset(table, features, os.path.join(cache_dir, f"{key}.arrow"))
    meta = os.path.join(cache_dir, f"{key}.json")
    write_json_atomic(meta, saved)
    return dataset


PARSE_FIELDS = ("rows_read", "bad_rows_skipped", "leading_assistant_turns_dropped", "examples")


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
    if image_folder is not None and not os.path.isdir(image_folder):
        raise FileNotFoundError(f"image_folder is not a folder: {image_folder}")

    paths = split_paths(data_path)
    report = DataReport(sources=list(paths))
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
        columns = _Columns()
        for file_index, path in enumerate(paths):
            _parse_llava_file(_iter_json_rows(path), path, file_index, image_folder, columns, report, on_bad_row)
        report.seconds["parse"] = log_phase("LLaVA JSON parsed", report.rows_read, start)
        loaded = _store(cache_dir, key, columns.table(), _features(provenance=True),
                        {name: getattr(report, name) for name in PARSE_FIELDS})
    if cache_dir is not None:
        report.cache_file = os.path.join(cache_dir, f"{key}.arrow")

    counts = count_images(loaded)
    refs = _image_refs(loaded, np.flatnonzero(counts > 0))
    source_file = _column(loaded, "source_file").to_numpy()
    source_row = _column(loaded, "source_row").to_numpy()

    ids = loaded.data.column("id")

    def name(position: int) -> str:
        return _row_name(paths[source_file[position]], int(source_row[position]), ids[int(position)].as_py())

    dropped = _apply_image_policy(_check_images(refs, check_images, image_checker, report), on_bad_image, report,
                                  name)
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
    import pyarrow as pa
    from datasets import concatenate_datasets

    _check_policy("on_bad_image", on_bad_image, BAD_IMAGE_POLICIES)
    _check_policy("on_bad_row", on_bad_row, BAD_ROW_POLICIES)
    _check_policy("check_images", check_images, IMAGE_CHECKS)
    start = time.perf_counter()
    dataset = _open_hf_dataset(name_or_path, split)
    if dataset_indices(dataset) is not None:
        dataset = dataset.flatten_indices()
    fingerprint = dataset_fingerprint(dataset)  # the cache key of the converted rows
    text_column = next((c for c in ("messages", "conversations") if c in dataset.column_names), None)
    if text_column is None:
        raise DataError(
            f"dataset {name_or_path!r} has neither a 'messages' column (TRL's messages + images format) nor a "
            f"'conversations' column (LLaVA's format: [{{'from', 'value'}}, ...]); columns: {dataset.column_names}"
        )
    if "image" in dataset.column_names and "images" not in dataset.column_names:
        dataset = _single_image_as_list(dataset)
    if "images" not in dataset.column_names:
        from datasets import concatenate_datasets

        dataset = concatenate_datasets([dataset, _no_images(len(dataset))], axis=1)
    dataset = with_decode(dataset, "images", False)  # bytes and paths stay as stored while the rows are checked
    report = DataReport(sources=[name_or_path], rows_read=len(dataset))
    source_name = os.path.basename(name_or_path.rstrip("/"))
    counts = count_images(dataset)
    report.seconds["open"] = log_phase(f"dataset {name_or_path} opened", len(dataset), start)

    # The text columns are converted (cached by the dataset's fingerprint); the image column is never copied.
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
        ids, messages, kept = _conversations_to_messages(text_columns, name_or_path, source_name, report, on_bad_row,
                                                         counts)
        table = pa.table({"id": pa.array(ids, type=pa.string()), "messages": pa.array(messages, type=_message_type())})
        features = _features()
        features = type(features)({k: v for k, v in features.items() if k != "images"})
        keep = np.asarray(kept, dtype=np.int64)
        saved = {"bad_rows_skipped": report.bad_rows_skipped, "examples": report.examples,
                 "leading_assistant_turns_dropped": report.leading_assistant_turns_dropped,
                 "keep": None if len(keep) == len(dataset) else keep.tolist()}
        text = _store(cache_dir, key, table, features, saved)
    report.seconds["parse"] = log_phase(f"dataset {name_or_path}: rows converted", len(dataset), start)
    if cache_dir is not None:
        report.cache_file = os.path.join(cache_dir, f"{key}.arrow")

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


__all__ = [
    "AUTO_OPEN_LIMIT",
    "DataError",
    "DataReport",
    "ImageRefs",
    "count_images",
    "default_cache_dir",
    "find_bad_images",
    "load_llava_json",
    "load_messages_dataset",
    "split_paths",
    "with_decode",
]
