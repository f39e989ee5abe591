"""LLaVA JSON rows as TRL's preference and RL datasets: GRPO prompts, DPO pairs, KTO unpaired rows.

The input is what ``train`` reads (``data.load_llava_json``: a LLaVA JSON/JSONL file, a comma-separated list of
them, or the rows themselves as a list of dicts, with the folder their ``image`` paths are relative to). Each row
gives its first image and its first exchange (the first user turn and the assistant turn after it: the question
the image is shown with, and the reference answer); later turns and text-only rows are left out and counted.

The columns are what TRL 1.16's trainers take for a vision-language model:

* ``prompt_rows`` (GRPO): ``image`` (PIL), ``prompt`` (conversational:
  ``[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]``; the trainer puts the
  image into the placeholder), ``solution`` (the reference answer, which ``rewards.exact_answer`` reads);
* ``preference_rows`` (DPO): ``image``, ``prompt``, ``chosen`` (``[{"role": "assistant", "content": answer}]``),
  ``rejected`` (another answer given to the same question text elsewhere in the data, different from the right one
  after ``rewards.normalize_answer``; rows whose question has no such answer are dropped and counted);
* ``kto_rows`` (KTO): the pairs unpaired: ``image``, ``prompt``, ``completion``, ``label`` (True for the chosen
  answer, False for the rejected one).

``save_rows`` writes one of them as a dataset folder (``train.parquet``, images embedded) that
``trl dpo --dataset_name FOLDER`` and ``llava-normaligned dpo --dataset_name FOLDER`` load offline;
``llava-normaligned rl-data`` (``llava_normaligned.commands.rl_data``) does both steps from the command line.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import asdict, dataclass

from llava_normaligned.trainer.data import (
    DataReport,
    load_llava_json,
    with_decode,
)
from llava_normaligned.trainer.data.columns import ArrowColumns, in_memory_dataset, row_features
from llava_normaligned.trainer.data.llava_json import parse_llava_file
from llava_normaligned.trainer.rewards import normalize_answer

logger = logging.getLogger(__name__)

FORMATS = ("grpo", "dpo", "kto")
TRAIN_FILE = "train.parquet"  # the name `datasets.load_dataset(FOLDER)` reads as the "train" split


@dataclass
class RLDataReport:
    """What the conversion kept and dropped."""

    rows_read: int = 0  # rows the LLaVA loader kept
    bad_rows_skipped: int = 0  # malformed rows dropped (on_bad_row="skip")
    bad_images_skipped: int = 0  # rows with a missing or unreadable image dropped (on_bad_image="skip")
    rows_kept: int = 0  # rows in the returned dataset (KTO: two per kept pair)
    text_only_dropped: int = 0  # rows with no image
    later_turns_left_out: int = 0  # rows with more than one exchange (only the first is used)
    no_rejected_dropped: int = 0  # preference rows whose question has no other, different answer in the data

    def summary(self) -> str:
        parts = [f"{self.rows_kept} rows from {self.rows_read}"]
        if self.bad_rows_skipped:
            parts.append(f"{self.bad_rows_skipped} malformed rows skipped")
        if self.bad_images_skipped:
            parts.append(f"{self.bad_images_skipped} rows with a missing or unreadable image skipped")
        if self.text_only_dropped:
            parts.append(f"{self.text_only_dropped} text-only rows dropped")
        if self.no_rejected_dropped:
            parts.append(f"{self.no_rejected_dropped} rows dropped: no other answer to the same question")
        if self.later_turns_left_out:
            parts.append(f"{self.later_turns_left_out} rows with several exchanges: the first one used")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


def load_rows(rows, image_folder, *, on_bad_row: str = "error", on_bad_image: str = "error"):
    """LLaVA JSON rows (a path, a comma-separated list or list of paths, or a list of row dicts) -> (the
    ``load_llava_json`` dataset (``id``, ``messages``, ``images``), its ``DataReport``), images checked for paths as
    ``train`` does; the policies are ``load_llava_json``'s (row dicts given here are parsed, their images not
    checked)."""
    if isinstance(rows, (str, os.PathLike)) or (isinstance(rows, (list, tuple)) and rows
                                                and all(isinstance(r, (str, os.PathLike)) for r in rows)):
        return load_llava_json(rows if isinstance(rows, (str, os.PathLike)) else [str(r) for r in rows],
                               image_folder, on_bad_row=on_bad_row, on_bad_image=on_bad_image, return_report=True)
    if not isinstance(rows, (list, tuple)) or not rows:
        raise ValueError(f"rows must be a LLaVA JSON path or a non-empty list of rows, got {type(rows).__name__}")
    if image_folder is not None and not os.path.isdir(image_folder):
        raise FileNotFoundError(f"image_folder is not a folder: {image_folder}")
    columns, report = ArrowColumns(), DataReport()
    parse_llava_file(rows, "rows", 0, None if image_folder is None else str(image_folder), columns, report,
                      on_bad_row)
    dataset = in_memory_dataset(columns.table(), row_features(provenance=True))
    return dataset.select_columns(["id", "messages", "images"]), report


def _exchanges(rows, image_folder, report: RLDataReport, policies: dict) -> list[tuple[dict, str, str]]:
    """(image reference, question, answer) per row with an image: its first image and its first exchange."""
    dataset, loaded = load_rows(rows, image_folder, **policies)
    dataset = with_decode(dataset, "images", False)
    report.rows_read = len(dataset)
    report.bad_rows_skipped, report.bad_images_skipped = loaded.bad_rows_skipped, loaded.bad_images_skipped
    out = []
    for messages, images in zip(list(dataset["messages"]), list(dataset["images"])):
        if not images:
            report.text_only_dropped += 1
            continue
        first = next(i for i, m in enumerate(messages) if m["role"] == "user")
        answer = next((m for m in messages[first + 1:] if m["role"] == "assistant"), None)
        if answer is None:  # a user turn after the only answer cannot happen (load_llava_json checks), but be sure
            report.text_only_dropped += 1
            continue
        if sum(m["role"] == "assistant" for m in messages) > 1:
            report.later_turns_left_out += 1
        out.append((images[0], messages[first]["content"], answer["content"]))
    return out


def user_prompt(question: str) -> list[dict]:
    """The conversational prompt TRL fills with the row's image."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


def _features_for(kind: str):
    from datasets import Features, Image, List, Value

    prompt = List({"role": Value("string"), "content": List({"type": Value("string"), "text": Value("string")})})
    answer = List({"role": Value("string"), "content": Value("string")})
    columns = {"image": Image(), "prompt": prompt}
    columns.update({"grpo": {"solution": Value("string")},
                    "dpo": {"chosen": answer, "rejected": answer},
                    "kto": {"completion": answer, "label": Value("bool")}}[kind])
    return Features(columns)


def _dataset(kind: str, records: list[dict], report: RLDataReport):
    from datasets import Dataset

    if not records:
        raise ValueError(f"no usable rows for {kind} ({report.summary()})")
    report.rows_kept = len(records)
    logger.info("%s rows: %s", kind, report.summary())
    columns = {name: [r[name] for r in records] for name in records[0]}
    return Dataset.from_dict(columns, features=_features_for(kind))


def _answer(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def prompt_rows(rows, image_folder, *, return_report: bool = False, **policies):
    """GRPO rows: ``image``, ``prompt``, ``solution`` (module docstring). ``policies``: ``on_bad_row``,
    ``on_bad_image`` (``load_llava_json``'s; default ``"error"``)."""
    report = RLDataReport()
    records = [{"image": image, "prompt": user_prompt(q), "solution": a}
               for image, q, a in _exchanges(rows, image_folder, report, policies)]
    dataset = _dataset("grpo", records, report)
    return (dataset, report) if return_report else dataset


def _pairs(rows, image_folder, seed: int, report: RLDataReport, policies: dict) -> list[tuple[dict, str, str, str]]:
    """(image, question, chosen, rejected): the rejected answer drawn (seeded) from the other answers the data gives
    to the same question text."""
    exchanges = _exchanges(rows, image_folder, report, policies)
    answers: dict[str, dict[str, str]] = {}  # question -> normalized answer -> first spelling seen
    for _, question, answer in exchanges:
        answers.setdefault(question.strip(), {}).setdefault(normalize_answer(answer), answer.strip())
    rng = random.Random(seed)
    pairs = []
    for image, question, answer in exchanges:
        right = normalize_answer(answer)
        others = sorted(text for norm, text in answers[question.strip()].items() if norm != right)
        if not others:
            report.no_rejected_dropped += 1
            continue
        pairs.append((image, question, answer, rng.choice(others)))
    return pairs


def preference_rows(rows, image_folder, seed: int = 0, *, return_report: bool = False, **policies):
    """DPO rows: ``image``, ``prompt``, ``chosen``, ``rejected`` (module docstring); ``policies`` as
    ``prompt_rows``'."""
    report = RLDataReport()
    records = [{"image": image, "prompt": user_prompt(q), "chosen": _answer(c), "rejected": _answer(r)}
               for image, q, c, r in _pairs(rows, image_folder, seed, report, policies)]
    dataset = _dataset("dpo", records, report)
    return (dataset, report) if return_report else dataset


def kto_rows(rows, image_folder, seed: int = 0, *, return_report: bool = False, **policies):
    """KTO rows: each preference pair as two unpaired rows, ``label`` True (chosen) and False (rejected);
    ``policies`` as ``prompt_rows``'."""
    report = RLDataReport()
    records = []
    for image, q, chosen, rejected in _pairs(rows, image_folder, seed, report, policies):
        records.append({"image": image, "prompt": user_prompt(q), "completion": _answer(chosen), "label": True})
        records.append({"image": image, "prompt": user_prompt(q), "completion": _answer(rejected), "label": False})
    dataset = _dataset("kto", records, report)
    return (dataset, report) if return_report else dataset


BUILDERS = {"grpo": prompt_rows, "dpo": preference_rows, "kto": kto_rows}


def rl_rows(kind: str, rows, image_folder, seed: int = 0, *, return_report: bool = False, **policies):
    """``prompt_rows`` / ``preference_rows`` / ``kto_rows`` by the name of the trainer that takes them."""
    if kind not in BUILDERS:
        raise ValueError(f"format must be one of {FORMATS}, got {kind!r}")
    extra = {} if kind == "grpo" else {"seed": seed}
    return BUILDERS[kind](rows, image_folder, return_report=return_report, **extra, **policies)


def save_rows(dataset, folder: str | os.PathLike) -> str:
    """Write ``dataset`` as ``FOLDER/train.parquet`` with the image bytes embedded: ``datasets.load_dataset(FOLDER)``
    (what ``trl dpo --dataset_name FOLDER`` calls) reads it back as the ``train`` split, offline and without the
    image folder. Returns the file's path."""
    from datasets.table import embed_table_storage

    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, TRAIN_FILE)
    partial = f"{path}.{os.getpid()}.tmp"
    # the image files' bytes into the table (datasets does the same before it pushes to the Hub): to_parquet alone
    # writes their paths only
    embedded = dataset.with_format("arrow").map(embed_table_storage, batched=True, desc=None)
    embedded.with_format(None).to_parquet(partial)
    os.replace(partial, path)
    return path
