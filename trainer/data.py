"""Training data: LLaVA JSON conversations and Hugging Face datasets, as TRL's messages + images rows.

Two sources, one output format (what TRL's ``SFTTrainer`` takes for a vision-language model):

    {"id": str, "messages": [{"role": "user" | "assistant" | "system", "content": str}, ...], "images": [PIL, ...]}

* ``load_llava_json``: the format of LLaVA-558K and llava_v1_5_mix665k
  (``{"id", "image", "conversations": [{"from": "human", "value": "<image>\\n..."}, {"from": "gpt", ...}]}``),
  multi-turn, text-only rows (no ``image`` key) allowed.
* ``load_messages_dataset``: a saved dataset folder, a parquet/JSON folder or file, or a Hub dataset already in
  TRL's messages + images format.

Images are placed before the first user message and the ``<image>`` tags are removed from the text, which is what
LLaVA-1.5's own preprocessing does (``preprocess_multimodal`` moves the tag to the front) and what TRL expects.

Every row is checked here, before training starts, so that nothing fails hours into a run: a malformed row, a
missing or unreadable image is an error naming the row (file, index, id, image path), or, with the opt-in skip
policies, a dropped row that is counted in the returned ``DataReport``.
"""

from __future__ import annotations

import io
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

logger = logging.getLogger(__name__)

IMAGE_TAG = "<image>"
# LLaVA's role names -> chat roles.
LLAVA_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
CHAT_ROLES = ("system", "user", "assistant")
BAD_IMAGE_POLICIES = ("error", "skip")
BAD_ROW_POLICIES = ("error", "skip")
IMAGE_CHECKS = ("open", "exists", "none")
MAX_LISTED = 10  # problems quoted in an error message


class DataError(ValueError):
    """A training row that cannot be used, named by its file, index and id."""


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


# ----------------------------------------------------------------------------------------------- LLaVA JSON rows


def _read_json_rows(path: str) -> list:
    """The rows of a LLaVA JSON file (a list) or a JSON-lines file (one object per line)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data file not found: {path}")
    with open(path, encoding="utf-8") as handle:
        if path.endswith(".jsonl"):
            rows = []
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise DataError(f"{path}, line {number}: not valid JSON ({err})") from None
            return rows
        try:
            rows = json.load(handle)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(rows, list):
        raise DataError(f"{path}: expected a JSON list of rows (LLaVA format), got {type(rows).__name__}")
    return rows


def _row_name(path: str, index: int, row) -> str:
    row_id = row.get("id") if isinstance(row, dict) else None
    return f"{os.path.basename(path)} row {index}" + (f" (id {row_id!r})" if row_id is not None else "")


def _llava_images(row: dict, name: str) -> list[str]:
    image = row.get("image")
    if image is None:
        return []
    if isinstance(image, str):
        return [image]
    if isinstance(image, list) and all(isinstance(i, str) for i in image):
        return list(image)
    raise DataError(f"{name}: 'image' must be a path or a list of paths, got {type(image).__name__}")


def _llava_messages(row: dict, name: str, n_images: int, report: DataReport) -> list[dict]:
    """LLaVA ``conversations`` -> chat messages with string content and the ``<image>`` tags removed."""
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{name}: 'conversations' must be a non-empty list")
    messages = []
    for number, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str) or "from" not in turn:
            raise DataError(f"{name}: turn {number} must be an object with 'from' and a string 'value'")
        role = LLAVA_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise DataError(f"{name}: turn {number} has unknown 'from' {turn['from']!r} (expected human/gpt/system)")
        messages.append({"role": role, "content": turn["value"]})
    # LLaVA's preprocess skips a conversation's first turn when it is not the human's; so do we.
    first = 1 if messages[0]["role"] == "system" else 0
    while first < len(messages) and messages[first]["role"] == "assistant":
        messages.pop(first)
        report.leading_assistant_turns_dropped += 1
    return _clean_image_tags(messages, name, n_images)


def _clean_image_tags(messages: list[dict], name: str, n_images: int) -> list[dict]:
    tags = sum(m["content"].count(IMAGE_TAG) for m in messages)
    if any(IMAGE_TAG in m["content"] for m in messages if m["role"] != "user"):
        raise DataError(f"{name}: an {IMAGE_TAG} tag outside a user turn")
    if n_images == 0 and tags:
        raise DataError(f"{name}: the text has {tags} {IMAGE_TAG} tag(s) but the row has no image")
    if tags and tags != n_images:
        raise DataError(f"{name}: the text has {tags} {IMAGE_TAG} tag(s) for {n_images} image(s)")
    cleaned = [
        {"role": m["role"], "content": m["content"].replace(IMAGE_TAG, "").strip() if m["role"] == "user" else m["content"]}
        for m in messages
    ]
    _check_conversation(cleaned, name)
    return cleaned


def _check_conversation(messages: list[dict], name: str) -> None:
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{name}: no assistant turn, nothing to train on")
    if not any(m["role"] == "user" for m in messages):
        raise DataError(f"{name}: no user turn")


# ------------------------------------------------------------------------------------------------------ images


def _image_problem(path: str | None, data: bytes | None, check: str) -> str | None:
    """Why an image cannot be used (``None`` if it can). ``open`` parses the header, which catches non-images."""
    if check == "none":
        return None
    if data is None:
        if not path:
            return "no image path or bytes"
        if not os.path.isfile(path):
            return "file not found"
        if check == "exists":
            return None
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data) if data is not None else path) as image:
            width, height = image.size
    except (OSError, UnidentifiedImageError, ValueError) as err:
        return f"unreadable ({type(err).__name__}: {err})"
    if width < 1 or height < 1:
        return f"empty image ({width}x{height})"
    return None


def find_bad_images(items: list[tuple[int, str, str | None, bytes | None]], check: str) -> dict[int, str]:
    """``{row position: 'name: image path: reason'}`` for every unusable image, checked on a few threads (I/O).

    ``items``: ``(row position, row name, path, bytes)`` per image. The loaders' default ``image_checker``.
    """
    if check == "none" or not items:
        return {}

    def probe(item):
        position, name, path, data = item
        problem = _image_problem(path, data, check)
        return position, (f"{name}: image {path or '<bytes>'}: {problem}" if problem else None)

    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 2) * 4)) as pool:
        results = pool.map(probe, items, chunksize=256)
        bad = {}
        for position, message in results:
            if message is not None:
                bad.setdefault(position, message)
    return bad


def _apply_image_policy(bad: dict[int, str], policy: str, report: DataReport) -> set[int]:
    if not bad:
        return set()
    listed = "\n  ".join(list(bad.values())[:MAX_LISTED])
    if policy == "error":
        raise DataError(
            f"{len(bad)} row(s) have a missing or unreadable image:\n  {listed}\n"
            "Fix the paths (--image-folder) or pass on_bad_image='skip' (--on-bad-image skip) to drop these rows."
        )
    logger.warning("skipping %d row(s) with a missing or unreadable image:\n  %s", len(bad), listed)
    report.bad_images_skipped += len(bad)
    for message in list(bad.values())[:MAX_LISTED]:
        report.note(f"skipped: {message}")
    return set(bad)


def _bad_row(err: DataError, policy: str, report: DataReport) -> None:
    if policy == "error":
        raise DataError(f"{err} (pass on_bad_row='skip' / --on-bad-row skip to drop such rows)") from None
    report.bad_rows_skipped += 1
    report.note(f"skipped: {err}")


def _features():
    from datasets import Features, Image, List, Value

    return Features(
        {
            "id": Value("string"),
            "messages": List({"role": Value("string"), "content": Value("string")}),
            "images": List(Image()),
        }
    )


def _to_dataset(rows: list[dict]):
    """Rows -> a ``datasets.Dataset`` whose ``images`` column decodes to PIL images on access (lazily)."""
    from datasets import Dataset

    return Dataset.from_list(rows, features=_features())


def load_llava_json(
    data_path: str | list[str],
    image_folder: str | None,
    *,
    on_bad_image: str = "error",
    on_bad_row: str = "error",
    check_images: str = "open",
    return_report: bool = False,
    image_checker=None,
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
        check_images: ``"open"`` (default) opens each image's header up front; ``"exists"`` only checks the file is
            there (fast, for very large sets); ``"none"`` checks nothing here (the collator still names the row of an
            image that fails to decode).
        return_report: also return the ``DataReport`` of what was read, kept and dropped.
        image_checker: ``(items, check) -> {row position: problem}``, the function that checks the images
            (default ``find_bad_images``); ``train`` passes one that checks them on the main process only.

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

    report = DataReport()
    rows, image_items = [], []
    for path in split_paths(data_path):
        report.sources.append(path)
        for index, raw in enumerate(_read_json_rows(path)):
            report.rows_read += 1
            name = _row_name(path, index, raw)
            try:
                if not isinstance(raw, dict):
                    raise DataError(f"{name}: a row must be a JSON object, got {type(raw).__name__}")
                images = _llava_images(raw, name)
                messages = _llava_messages(raw, name, len(images), report)
                if images and image_folder is None and not all(os.path.isabs(i) for i in images):
                    raise DataError(f"{name}: image {images[0]!r} is a relative path but no image_folder was given")
            except DataError as err:
                _bad_row(err, on_bad_row, report)
                continue
            paths = [i if os.path.isabs(i) else os.path.join(image_folder, i) for i in images]
            image_items += [(len(rows), name, p, None) for p in paths]
            row_id = raw.get("id")
            rows.append({"id": str(row_id) if row_id is not None else f"{os.path.basename(path)}:{index}",
                         "messages": messages, "images": paths})

    dropped = _apply_image_policy(_check_images(image_items, check_images, image_checker, report), on_bad_image,
                                  report)
    rows = [row for position, row in enumerate(rows) if position not in dropped]
    if not rows:
        raise DataError(f"no usable rows in {', '.join(report.sources)} ({report.summary()})")
    report.rows_kept = len(rows)
    report.text_only_rows = sum(1 for row in rows if not row["images"])
    logger.info("LLaVA JSON %s: %s", ", ".join(report.sources), report.summary())
    dataset = _to_dataset(rows)
    return (dataset, report) if return_report else dataset


def _check_images(items, check: str, image_checker, report: DataReport) -> dict[int, str]:
    checker = image_checker or find_bad_images
    bad = checker(items, check)
    if check != "none" and getattr(checker, "checks_here", True):  # False: another process opened them
        report.images_checked_here = len(items)
    return bad


# ------------------------------------------------------------------------------------- Hugging Face datasets


def _open_hf_dataset(name_or_path: str, split: str):
    from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

    if os.path.isdir(name_or_path) and (
        os.path.isfile(os.path.join(name_or_path, "dataset_info.json"))
        or os.path.isfile(os.path.join(name_or_path, "dataset_dict.json"))
        or os.path.isfile(os.path.join(name_or_path, "state.json"))
    ):
        loaded = load_from_disk(name_or_path)  # a folder written by Dataset.save_to_disk
    elif os.path.isfile(name_or_path) and name_or_path.endswith((".parquet", ".json", ".jsonl")):
        kind = "parquet" if name_or_path.endswith(".parquet") else "json"
        loaded = load_dataset(kind, data_files=name_or_path, split=split)
    else:
        loaded = load_dataset(name_or_path, split=split)  # a parquet/json folder or a Hub dataset
    if isinstance(loaded, DatasetDict):
        if split not in loaded:
            raise ValueError(f"dataset {name_or_path!r} has no split {split!r} (splits: {list(loaded)})")
        loaded = loaded[split]
    if not isinstance(loaded, Dataset):
        raise ValueError(f"dataset {name_or_path!r}: expected a map-style Dataset, got {type(loaded).__name__}")  # noqa: TRY004
    return loaded


def _message_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict) and part.get("type") == "text")


def _hf_messages(messages, name: str, n_images: int) -> list[dict]:
    """TRL messages (string or list-of-parts content) -> messages with string content; image parts are counted."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{name}: 'messages' must be a non-empty list")
    placeholders, out = 0, []
    for number, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
            raise DataError(f"{name}: message {number} must have a role in {CHAT_ROLES}")
        content = message.get("content")
        if isinstance(content, list):
            placeholders += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image")
        elif content is not None and not isinstance(content, str):
            raise DataError(f"{name}: message {number} content must be a string or a list of parts")
        out.append({"role": message["role"], "content": _message_text(content)})
    if placeholders and placeholders != n_images:
        raise DataError(f"{name}: {placeholders} image part(s) in the messages for {n_images} image(s)")
    return _clean_image_tags(out, name, n_images) if any(IMAGE_TAG in m["content"] for m in out) else _checked(out, name)


def _checked(messages: list[dict], name: str) -> list[dict]:
    _check_conversation(messages, name)
    return messages


def count_images(dataset, batch_size: int = 4096):
    """Yield the number of images of each row, reading only the Arrow list offsets (no image is read)."""
    import pyarrow.compute as pc

    table = dataset.select_columns(["images"]).with_format("arrow")
    for start in range(0, len(dataset), batch_size):
        column = table[start : start + batch_size]["images"]
        yield from pc.list_value_length(column).fill_null(0).to_pylist()


def load_messages_dataset(
    name_or_path: str,
    *,
    split: str = "train",
    on_bad_image: str = "error",
    on_bad_row: str = "error",
    check_images: str = "open",
    return_report: bool = False,
    image_checker=None,
):
    """Load a dataset in TRL's messages + images format (a ``save_to_disk`` folder, parquet/JSON files or folder,
    or a Hub dataset id) and check it like ``load_llava_json`` does (same options). A single ``image`` column is
    accepted too.

    Returns a ``datasets.Dataset`` with the columns of ``load_llava_json`` (``id``, ``messages`` with string
    content, ``images``), and the ``DataReport`` with ``return_report=True``.
    """
    from datasets import Dataset, Features, Image, List, concatenate_datasets

    _check_policy("on_bad_image", on_bad_image, BAD_IMAGE_POLICIES)
    _check_policy("on_bad_row", on_bad_row, BAD_ROW_POLICIES)
    _check_policy("check_images", check_images, IMAGE_CHECKS)
    dataset = _open_hf_dataset(name_or_path, split)
    if "messages" not in dataset.column_names:
        raise DataError(
            f"dataset {name_or_path!r} has no 'messages' column (columns: {dataset.column_names}); "
            "expected TRL's messages + images format"
        )
    if "image" in dataset.column_names and "images" not in dataset.column_names:
        # decode=False first: the images move into the list as stored (bytes / path), never decoded to PIL and
        # encoded back
        dataset = dataset.cast_column("image", Image(decode=False))
        features = Features({**{k: v for k, v in dataset.features.items() if k != "image"},
                             "images": List(Image(decode=False))})
        dataset = dataset.map(lambda batch: {"images": [[] if i is None else [i] for i in batch["image"]]},
                              batched=True, remove_columns=["image"], features=features,
                              desc="moving the image column into a list")
    if "images" not in dataset.column_names:
        dataset = dataset.add_column("images", [[] for _ in range(len(dataset))])
    # decode=False: bytes and paths stay as stored; nothing is decoded while the rows are checked
    dataset = dataset.cast_column("images", List(Image(decode=False)))
    report = DataReport(sources=[name_or_path], rows_read=len(dataset))
    source_name = os.path.basename(name_or_path.rstrip("/"))

    # The text columns are read in batches; the image column is never copied (only its offsets are read).
    ids, messages, keep = [], [], []
    text_columns = dataset.select_columns([c for c in ("id", "messages") if c in dataset.column_names])
    counts = count_images(dataset)
    index = 0
    for batch in text_columns.iter(batch_size=1024):
        for position in range(len(batch["messages"])):
            row_id = str(batch["id"][position]) if "id" in batch else f"{source_name}:{index}"
            name = f"{name_or_path} row {index} (id {row_id!r})"
            ids.append(row_id)
            try:
                messages.append(_hf_messages(batch["messages"][position], name, next(counts)))
                keep.append(index)
            except DataError as err:
                messages.append([])
                _bad_row(err, on_bad_row, report)
            index += 1

    image_items = []
    images_column = dataset.select_columns(["images"])
    for start in range(0, len(keep), 1024):
        chunk = keep[start : start + 1024]
        for position, images in zip(chunk, images_column.select(chunk)["images"]):
            name = f"{name_or_path} row {position} (id {ids[position]!r})"
            image_items += [(position, name, img.get("path"), img.get("bytes")) for img in images if img]
    dropped = _apply_image_policy(_check_images(image_items, check_images, image_checker, report), on_bad_image,
                                  report)
    keep = [i for i in keep if i not in dropped]
    if not keep:
        raise DataError(f"no usable rows in {name_or_path} ({report.summary()})")

    text = Dataset.from_dict(
        {"id": ids, "messages": messages},
        features=Features({k: v for k, v in _features().items() if k != "images"}),
    )
    dataset = concatenate_datasets([text, images_column], axis=1).select(keep)
    dataset = dataset.cast_column("images", List(Image()))  # decoded to PIL on access, as TRL expects
    report.rows_kept = len(dataset)
    image_counts = list(count_images(dataset))
    report.text_only_rows = sum(1 for n in image_counts if n == 0)
    logger.info("dataset %s: %s", name_or_path, report.summary())
    return (dataset, report) if return_report else dataset


__all__ = [
    "DataError",
    "DataReport",
    "count_images",
    "find_bad_images",
    "load_llava_json",
    "load_messages_dataset",
    "split_paths",
]
