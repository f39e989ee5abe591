"""Load a benchmark split: from a local copy under ``--data-dir`` when there is one, else from the Hub.

A local copy of task T lives in ``DATA_DIR/T/`` and is, in the benchmark's own Hub schema, either
  - parquet files as ``datasets`` writes them (``Dataset.to_parquet``, or the Hub's ``data/<split>-*.parquet``);
    the files named after the split (``test.parquet``, ``test-00000-of-00003.parquet``) are read, or else the only
    ``*.parquet`` below the folder; several others (``train-*``, ``validation-*``) are an error, never mixed in;
    for a dataset with configs (MMBench "en", ScienceQA "ScienceQA-IMG", MMLU "all"), a subfolder named after the
    config is read alone when there is one, so a whole downloaded Hub repo works;
  - a ``save_to_disk`` folder of a ``Dataset``, or of a ``DatasetDict`` holding the split;
  - for ``synthetic``: the LLaVA JSON file of the test split (``test.json``, or the only ``*.json``), with image
    paths relative to the JSON file's folder; a `make-data` output folder given as DATA_DIR itself also works.
Every failure is an ``EvalDataError`` naming the task and what was expected.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from glob import glob

from .tasks import TaskSpec


class EvalDataError(RuntimeError):
    pass


@dataclass
class LoadedSplit:
    rows: object  # a datasets.Dataset, or a list of dicts (synthetic)
    source: str  # "local" or "hub"
    location: str  # folder/file or "hub-id[config]:split"

    def __len__(self) -> int:
        return len(self.rows)


def _expected(spec: TaskSpec) -> str:
    hub = f"{spec.hub.path}" + (f" (config {spec.hub.config!r})" if spec.hub.config else "") if spec.hub else None
    split = spec.hub.split if spec.hub else "test"
    where = f"the Hub dataset {hub}, split {split!r}, " if hub else ""
    return f"{where}with columns {list(spec.columns)}"


def check_columns(spec: TaskSpec, found: list[str], location: str) -> None:
    missing = [c for c in spec.columns if c not in found]
    if missing:
        raise EvalDataError(
            f"task {spec.name!r}: the copy at {location} is not in the expected schema: missing columns {missing} "
            f"(found {sorted(found)}); expected {_expected(spec)}"
        )


# ---- local copies ----
def _parquet_files(spec: TaskSpec, folder: str, split: str) -> list[str]:
    """The split's parquet files: those named after it, else the folder's only one. Other splits' files are never
    read in its place: a test score over train + validation rows would look like any other."""
    files = sorted(glob(os.path.join(folder, "**", "*.parquet"), recursive=True))
    named = [f for f in files if os.path.basename(f) == f"{split}.parquet" or os.path.basename(f).startswith(f"{split}-")]
    if named or len(files) <= 1:
        return named or files
    listing = [os.path.relpath(f, folder) for f in files]
    raise EvalDataError(
        f"task {spec.name!r}: {folder} holds {len(files)} parquet files and none is named after the split {split!r} "
        f"({listing[:10]}{' ...' if len(listing) > 10 else ''}): rename the {split!r} file(s) to {split}.parquet or "
        f"{split}-00000-of-0000N.parquet, or keep only them in the folder"
    )


def _load_local_datasets(spec: TaskSpec, folder: str):
    import datasets

    split = spec.hub.split if spec.hub else "test"
    if spec.hub and spec.hub.config and os.path.isdir(os.path.join(folder, spec.hub.config)):
        folder = os.path.join(folder, spec.hub.config)  # a whole Hub repo downloaded: its config's folder only
    if os.path.exists(os.path.join(folder, "dataset_dict.json")):
        loaded = datasets.load_from_disk(folder)
        if split not in loaded:
            raise EvalDataError(
                f"task {spec.name!r}: the DatasetDict at {folder} has splits {list(loaded)}, not {split!r}"
            )
        return loaded[split]
    if os.path.exists(os.path.join(folder, "state.json")):
        return datasets.load_from_disk(folder)
    files = _parquet_files(spec, folder, split)
    if not files:
        raise EvalDataError(
            f"task {spec.name!r}: {folder} holds neither parquet files nor a save_to_disk folder; expected "
            f"{_expected(spec)}"
        )
    return datasets.load_dataset("parquet", data_files={split: files}, split=split)


def _load_llava_json(spec: TaskSpec, folder: str) -> list[dict]:
    """The synthetic task's LLaVA JSON: a list of {"id", "image", "conversations"}; images opened lazily."""
    candidates = [os.path.join(folder, "test.json")] if os.path.exists(os.path.join(folder, "test.json")) else []
    candidates = candidates or sorted(glob(os.path.join(folder, "*.json")))
    if len(candidates) != 1:
        raise EvalDataError(
            f"task {spec.name!r}: expected the LLaVA JSON test split at {folder}/test.json (or exactly one *.json "
            f"there), found {[os.path.basename(c) for c in candidates] or 'none'}"
        )
    path = candidates[0]
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise EvalDataError(f"task {spec.name!r}: cannot read {path} as JSON: {exc}") from exc
    if not isinstance(records, list) or not records or not isinstance(records[0], dict):
        raise EvalDataError(f"task {spec.name!r}: {path} must hold a non-empty JSON list of records")
    check_columns(spec, list(records[0]), path)
    base = os.path.dirname(os.path.abspath(path))
    return [{**r, "image": LazyImage(os.path.join(base, r["image"])) if r.get("image") else None} for r in records]


class LazyImage:
    """An image file opened when a request is built, so that a missing file fails one sample, not the load."""

    def __init__(self, path: str):
        self.path = path

    def open(self):
        from PIL import Image

        with Image.open(self.path) as image:
            return image.convert("RGB")

    def __repr__(self) -> str:
        return f"LazyImage({self.path!r})"


def _images_undecoded(rows):
    """Image columns as {"bytes", "path"}: decoding waits for the request, so one bad image fails one sample
    rather than every read of its row."""
    import datasets

    for name, feature in rows.features.items():
        if isinstance(feature, datasets.Image) and feature.decode:
            rows = rows.cast_column(name, datasets.Image(decode=False))
    return rows


def load_local(spec: TaskSpec, folder: str) -> LoadedSplit:
    if spec.name == "synthetic":
        return LoadedSplit(_load_llava_json(spec, folder), "local", folder)
    try:
        rows = _load_local_datasets(spec, folder)
    except EvalDataError:
        raise
    except Exception as exc:  # a corrupt file or another library's error: say which task and folder
        raise EvalDataError(f"task {spec.name!r}: cannot read the local copy at {folder}: {exc}") from exc
    check_columns(spec, list(rows.column_names), folder)
    return LoadedSplit(_images_undecoded(rows), "local", folder)


# ---- the Hub ----
def load_hub(spec: TaskSpec, local_folder: str | None) -> LoadedSplit:
    import datasets

    hub = spec.hub
    where = f"{hub.path}" + (f"[{hub.config}]" if hub.config else "") + f":{hub.split}"
    try:
        rows = datasets.load_dataset(hub.path, hub.config, split=hub.split)
    except Exception as exc:  # offline, gated, renamed: all end here with the way out
        local_note = f"there is no local copy at {local_folder}, and " if local_folder else ""
        raise EvalDataError(
            f"task {spec.name!r}: {local_note}{where} could not be loaded from the Hub "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). On a machine without network, "
            f"put a copy in DIR/{spec.name}/ (parquet files of split {hub.split!r} or a save_to_disk folder) with "
            f"columns {list(spec.columns)} and pass --data-dir DIR"
        ) from exc
    check_columns(spec, list(rows.column_names), where)
    return LoadedSplit(_images_undecoded(rows), "hub", where)


def local_folder(spec: TaskSpec, data_dir: str | None) -> str | None:
    """DATA_DIR/TASK; for ``synthetic`` also DATA_DIR itself when it is a `make-data` folder (holds test.json)."""
    if not data_dir:
        return None
    folder = os.path.join(data_dir, spec.name)
    if spec.name == "synthetic" and not os.path.isdir(folder) and os.path.exists(os.path.join(data_dir, "test.json")):
        return data_dir
    return folder


def load_split(spec: TaskSpec, data_dir: str | None = None, limit: int | None = None) -> LoadedSplit:
    """The task's evaluation split, its first ``limit`` rows if given."""
    folder = local_folder(spec, data_dir)
    if folder and os.path.isdir(folder):
        loaded = load_local(spec, folder)
    elif spec.hub is None:
        raise EvalDataError(
            f"task {spec.name!r} has no Hub copy: expected a local one at DIR/{spec.name}/ "
            f"({'not found: ' + folder if folder else 'no --data-dir given'}), e.g. the test split written by "
            "`llava-normaligned make-data`"
        )
    else:
        loaded = load_hub(spec, folder)
    if len(loaded) == 0:
        raise EvalDataError(f"task {spec.name!r}: the split at {loaded.location} is empty")
    if limit is not None and limit < len(loaded):
        rows = loaded.rows[:limit] if isinstance(loaded.rows, list) else loaded.rows.select(range(limit))
        loaded = LoadedSplit(rows, loaded.source, loaded.location)
    return loaded


def save_split(spec: TaskSpec, loaded: LoadedSplit, data_dir: str) -> str:
    """Write a loaded split as DATA_DIR/TASK (a save_to_disk folder, images decodable again), the copy an
    air-gapped machine reads with --data-dir. Returns the folder."""
    import datasets

    if spec.hub is None:
        raise EvalDataError(f"task {spec.name!r} is local only: copy its folder ({loaded.location}) instead")
    folder = os.path.join(data_dir, spec.name)
    if os.path.exists(folder):
        raise EvalDataError(f"task {spec.name!r}: {folder} already exists; remove it or save elsewhere")
    rows = loaded.rows
    for name, feature in rows.features.items():
        if isinstance(feature, datasets.Image) and not feature.decode:
            rows = rows.cast_column(name, datasets.Image())
    rows.save_to_disk(folder)
    return folder
