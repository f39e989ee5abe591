"""Held-out accuracy during training: does the norm change how fast the model learns to answer?

``train --held_out_data_path FILE --held_out_steps N`` answers the questions of a LLaVA-format JSON file (the first
human turn, its ``<image>`` taken out, with the row's image; the first gpt turn is the answer) by greedy generation
every N optimizer steps and before the first, and counts exact matches after the rule GRPO's reward and the demo's
scorer use (``rewards.normalize_answer``). Where the rows carry a group field (``--held_out_group_field``, default
``template``, as the demo's data has), the accuracy is the mean of the groups' accuracies, each group's also logged.

The readings go into the Trainer's logs (``held_out/accuracy``, ``held_out/<group>``: TensorBoard, W&B and
``trainer_state.json`` get them like the loss) and into ``held_out_accuracy.json`` in the output folder, one record
per reading: ``{"step", "epoch", "accuracy", "groups": {...}, "rows"}``. Every process answers the same rows (a
sharded model needs every rank in each forward); the first writes the file.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from dataclasses import dataclass

import torch
from transformers import TrainerCallback

from llava_normaligned.atomic_files import write_json_atomic
from llava_normaligned.compat import put_callback_first
from llava_normaligned.generation import generate_batch, without_image_tags

from .rewards import normalize_answer

logger = logging.getLogger(__name__)

HELD_OUT_FILE = "held_out_accuracy.json"
PREFIX = "held_out/"


@dataclass(frozen=True)
class HeldOutRow:
    question: str
    answer: str
    image: str | None  # a path; None: a text-only question
    group: str | None = None


def load_held_out(path: str, image_folder: str | None, limit: int | None = None,
                  group_field: str | None = "template") -> list[HeldOutRow]:
    """The first ``limit`` rows of a LLaVA-format JSON file as ``HeldOutRow``s; ``ValueError`` naming the file and
    row when one is not a question with an answer, or its image is missing."""
    try:
        with open(path, encoding="utf-8") as handle:
            records = json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"--held_out_data_path {path}: cannot read it as JSON ({error})") from None
    if not isinstance(records, list) or not records:
        raise ValueError(f"--held_out_data_path {path}: expected a non-empty JSON list of LLaVA rows")
    rows = []
    for index, record in enumerate(records[:limit] if limit else records):
        try:
            turns = record["conversations"]
            question = next(t["value"] for t in turns if t["from"] == "human")
            answer = next(t["value"] for t in turns if t["from"] == "gpt")
        except (KeyError, TypeError, StopIteration):
            raise ValueError(f"--held_out_data_path {path} row {index}: not a LLaVA row with a human question and a "
                             "gpt answer") from None
        image = record.get("image")
        if image is not None:
            image = os.path.join(image_folder, image) if image_folder and not os.path.isabs(image) else image
            if not os.path.isfile(image):
                raise ValueError(f"--held_out_data_path {path} row {index}: image {image} not found "
                                 "(--held_out_image_folder)")
        group = record.get(group_field) if group_field else None
        rows.append(HeldOutRow(without_image_tags(question), answer, image, None if group is None else str(group)))
    return rows


@torch.no_grad()
def held_out_accuracy(model, processor, rows: list[HeldOutRow], *, batch_size: int = 16,
                      max_new_tokens: int = 16) -> dict:
    """``{"accuracy", "groups": {group: accuracy}, "rows"}``: greedy answers to ``rows``, exact match after
    ``normalize_answer``; with groups, ``accuracy`` is their mean (each group weighs the same). The model is put in
    eval mode for the call and restored."""
    was_training = model.training
    model.eval()
    try:
        predictions = generate_batch(model, processor, [r.question for r in rows], [r.image for r in rows],
                                     max_new_tokens=max_new_tokens, batch_size=batch_size)
    finally:
        model.train(was_training)
    hits, totals = defaultdict(int), defaultdict(int)
    for row, predicted in zip(rows, predictions):
        key = row.group if row.group is not None else ""
        hits[key] += normalize_answer(predicted) == normalize_answer(row.answer)
        totals[key] += 1
    groups = {k: hits[k] / totals[k] for k in sorted(totals) if k != ""}
    accuracy = sum(groups.values()) / len(groups) if groups and "" not in totals else sum(hits.values()) / len(rows)
    return {"accuracy": accuracy, "groups": groups, "rows": len(rows)}


class HeldOutAccuracyCallback(TrainerCallback):
    """Held-out accuracy before the first step and every ``every`` optimizer steps (and at the last), logged with the
    step's other values and kept in ``held_out_accuracy.json``. Install with ``install`` (first among the callbacks,
    so the loggers after it see the values)."""

    def __init__(self, rows: list[HeldOutRow], processor, every: int, batch_size: int = 16, max_new_tokens: int = 16,
                 output_dir: str | None = None):
        if every < 1:
            raise ValueError(f"held-out accuracy every {every} steps: must be at least 1")
        if not rows:
            raise ValueError("held-out accuracy needs at least one row")
        self.rows, self.processor, self.every = rows, processor, every
        self.batch_size, self.max_new_tokens, self.output_dir = batch_size, max_new_tokens, output_dir
        self.records: list[dict] = []
        self._pending: dict | None = None

    @classmethod
    def install(cls, trainer, *args, **kwargs) -> HeldOutAccuracyCallback:
        callback = cls(*args, **kwargs)
        trainer.callback_handler.callbacks.insert(0, callback)
        return callback

    def on_init_end(self, args, state, control, **kwargs):
        put_callback_first(self)  # its values must be in the logs the reporting callbacks receive

    def _read(self, model, state) -> dict:
        reading = held_out_accuracy(model, self.processor, self.rows, batch_size=self.batch_size,
                                    max_new_tokens=self.max_new_tokens)
        record = {"step": state.global_step, "epoch": state.epoch or 0.0, **reading}
        self.records = [r for r in self.records if r["step"] != state.global_step] + [record]
        logger.info("held-out accuracy at step %d: %.4f (%d rows)", state.global_step, reading["accuracy"],
                    reading["rows"])
        return record

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        put_callback_first(self)
        if state.global_step > 0:  # resumed: the interrupted run's readings are in the checkpoint's log history
            self.records = self.from_log_history(state.log_history, len(self.rows))
        elif model is not None:
            record = self._read(model, state)
            state.log_history.append({"step": 0, "epoch": 0.0, **self._logged(record)})

    @staticmethod
    def from_log_history(log_history: list[dict], rows: int) -> list[dict]:
        """The records of the readings a Trainer's ``log_history`` holds (``held_out/...`` entries)."""
        key = PREFIX + "accuracy"
        return [{"step": entry["step"], "epoch": entry.get("epoch", 0.0), "accuracy": entry[key],
                 "groups": {k[len(PREFIX):]: v for k, v in entry.items() if k.startswith(PREFIX) and k != key},
                 "rows": rows} for entry in log_history if key in entry]

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is None:
            return
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self._pending = self._logged(self._read(model, state))
            control.should_log = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or self._pending is None:
            return
        logs.update(self._pending)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self._pending)  # the Trainer copied `logs` into the history before this call
        self._pending = None

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(folder):
                self.write(folder)

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.write(self.output_dir or args.output_dir)

    def write(self, folder: str) -> str:
        path = os.path.join(folder, HELD_OUT_FILE)
        write_json_atomic(path, self.records)
        return path

    @staticmethod
    def _logged(record: dict) -> dict:
        return {PREFIX + "accuracy": record["accuracy"],
                **{f"{PREFIX}{group}": value for group, value in record["groups"].items()}}
