"""Batched greedy generation over a benchmark split, one sample record per row, written as it comes.

Rows become requests, requests go to the model in batches (left padding), predictions are read by the task's
extractor and judged. A batch that raises is retried one request at a time; a request that still raises becomes a
record with its ``error`` (counted as wrong), and the rest of the split goes on.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Iterable, Iterator

from .data import LazyImage, LoadedSplit
from .prompts import GenerationRequest
from .tasks import TaskSpec

logger = logging.getLogger(__name__)


class SampleSink:
    """samples.jsonl, appended and flushed one record at a time so that a crash keeps every finished sample."""

    def __init__(self, path: str):
        self.path = path
        self._file = open(path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()


def to_rgb(image):
    """A PIL RGB image from what datasets yields (PIL, {"bytes"/"path"}) or a LazyImage."""
    from PIL import Image

    if isinstance(image, LazyImage):
        return image.open()
    if isinstance(image, dict):
        if image.get("bytes"):
            import io

            return Image.open(io.BytesIO(image["bytes"])).convert("RGB")
        if image.get("path"):
            return Image.open(image["path"]).convert("RGB")
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    raise TypeError(f"cannot read an image from a {type(image).__name__}")


def chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def sample_record(task: str, row: int, request, *, prediction=None, extracted=None, correct: bool = False,
                  error: str | None = None, **extra) -> dict:
    """One line of samples.jsonl: the request's side (``doc_id``, ``prompt`` or a log-likelihood request's context,
    ``gold``, ``meta``; the row's position when there is no request) and what was read from the model's answer.
    ``extra`` holds a kind's own fields (log-likelihoods)."""
    return {
        "task": task,
        "row": row,
        "doc_id": getattr(request, "doc_id", str(row)),
        "prompt": getattr(request, "prompt", getattr(request, "context", None)),
        "prediction": prediction,
        "extracted": extracted,
        "gold": getattr(request, "gold", None),
        "correct": correct,
        **extra,
        "meta": getattr(request, "meta", {}),
        "error": error,
    }


def error_record(task: str, row: int, exc: BaseException, request=None, prediction=None) -> dict:
    """The record of a sample that could not run (or be judged): kept, counted as wrong, with the reason."""
    return sample_record(task, row, request, prediction=prediction, error=f"{type(exc).__name__}: {exc}")


def build_requests(spec: TaskSpec, split: LoadedSplit, indices: Iterable[int]) -> Iterator[tuple[int, object, object]]:
    """(row index, request, None) per row, or (row index, request or None, the exception) for a row that cannot
    become a request or whose image cannot be read: that row is one failed sample, not the end of the run."""
    for idx in indices:
        request = None
        try:
            request = spec.build(split.rows[idx], idx)
            if isinstance(request, GenerationRequest):
                request.images = [to_rgb(im) for im in request.images]  # decoded here: a bad image fails this row
        except Exception as exc:
            yield idx, request, exc
        else:
            yield idx, request, None


# ---- the model side ----
def generate_answers(model, processor, requests: list[GenerationRequest], max_new_tokens: int) -> list[str]:
    """Greedy answers to one batch of requests (image first, then text, in one user turn; left-padded), through
    the package's own generation path, so that scores are those of what `generate` would answer."""
    from llava_normaligned.generation import generate_batch

    return generate_batch(
        model,
        processor,
        [r.prompt for r in requests],
        [r.images for r in requests],
        max_new_tokens=max_new_tokens,
        batch_size=len(requests),
    )  # generate_batch suppresses the placeholder tokens (generation.placeholder_token_ids)


def _judged(spec: TaskSpec, row: int, request: GenerationRequest, prediction: str) -> dict:
    try:
        extracted = spec.extract(prediction, request)
        correct = bool(spec.judge(extracted, prediction, request))
    except Exception as exc:  # an answer the rules choke on is that sample's error, not the run's
        return error_record(spec.name, row, exc, request, prediction)
    return sample_record(spec.name, row, request, prediction=prediction, extracted=extracted, correct=correct)


def run_batches(spec: TaskSpec, split: LoadedSplit, sink: SampleSink, *, batch_size: int, score_batch, score_one,
                judge, skip: frozenset[int] = frozenset(), progress=None) -> list[dict]:
    """The loop every kind of task shares: build ``batch_size`` requests, score them at once with
    ``score_batch(requests)``; if that fails, score them one by one with ``score_one(request)``, so a bad sample
    loses only itself. Each result goes through ``judge(spec, row, request, result)``; records are written to
    ``sink`` as each batch finishes. Rows in ``skip`` (done by an earlier run) are left out."""
    records: list[dict] = []

    def emit(record: dict) -> None:
        records.append(record)
        sink.write(record)

    todo = [i for i in range(len(split)) if i not in skip]
    for indices in chunks(todo, batch_size):
        batch = []
        for idx, request, exc in build_requests(spec, split, indices):
            if exc is not None:
                emit(error_record(spec.name, idx, exc, request))
            else:
                batch.append((idx, request))
        results = None
        if batch:
            try:
                results = score_batch([r for _, r in batch])
            except Exception as exc:
                logger.warning("%s: a batch of %d failed (%s); retrying one by one", spec.name, len(batch), exc)
        for k, (idx, request) in enumerate(batch):
            try:
                record = judge(spec, idx, request, results[k] if results is not None else score_one(request))
            except Exception as exc:
                record = error_record(spec.name, idx, exc, request)
            emit(record)
        if progress is not None:
            progress(len(indices))
    return records


def run_generation(spec: TaskSpec, split: LoadedSplit, model, processor, sink: SampleSink, *, batch_size: int,
                   max_new_tokens: int, skip: frozenset[int] = frozenset(), progress=None) -> list[dict]:
    """Every row of ``split`` (but those in ``skip``) answered by greedy generation and judged."""
    return run_batches(
        spec, split, sink, batch_size=batch_size, skip=skip, progress=progress, judge=_judged,
        score_batch=lambda requests: generate_answers(model, processor, requests, max_new_tokens),
        score_one=lambda request: generate_answers(model, processor, [request], max_new_tokens)[0],
    )
