"""Log-likelihood multiple choice (HellaSwag, MMLU), text only, as lm-eval scores it.

Each option's score is the summed log-probability of its continuation tokens given the context. ``acc`` picks the
highest sum; ``acc_norm`` divides by the choice's length in characters first. Text goes to the LLM without a
chat template and with the tokenizer's own special tokens (a BOS where the tokenizer adds one), as lm-eval does.
"""

from __future__ import annotations

import torch

from .batches import SampleSink, chunks, run_batches, sample_record
from .data import LoadedSplit
from .prompts import LoglikRequest
from .tasks import TaskSpec


def _device_of(model) -> torch.device:
    return next(p.device for p in model.parameters() if p.device.type != "meta")


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids). The pair is encoded whole and split where the context's encoding ends, so
    that a merge across the boundary is credited to the continuation; a space ending the context moves over."""
    if context.endswith(" "):
        stripped = context.rstrip(" ")
        continuation = context[len(stripped) :] + continuation
        context = stripped
    whole = tokenizer(context + continuation, add_special_tokens=True)["input_ids"]
    ctx = tokenizer(context, add_special_tokens=True)["input_ids"]
    cont = whole[len(ctx) :]
    if not cont:
        raise ValueError(f"continuation {continuation!r} encodes to no tokens after the context")
    return whole[: len(ctx)], cont


@torch.no_grad()
def continuation_scores(model, tokenizer, pairs: list[tuple[list[int], list[int]]],
                        max_length: int | None = None) -> list[tuple[float, bool]]:
    """(summed log p(continuation | context), whether greedy decoding would produce the continuation) for each
    (context ids, continuation ids), in one left-padded batch.

    Row i is (context + continuation)[:-1]; with left padding its continuation is predicted by its last
    len(continuation) positions, so only the last max(len(continuation)) logits are computed.
    """
    rows, conts = [], []
    for ctx, cont in pairs:
        ids = (ctx + cont)[:-1]
        if max_length is not None and len(ids) > max_length:
            ids = ids[-max_length:]  # drop the oldest context tokens, as lm-eval does
        rows.append(ids)
        conts.append(cont)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :] = torch.tensor(ids)
        attention_mask[i, width - len(ids) :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)  # positions count real tokens only
    keep = max(len(c) for c in conts)
    device = _device_of(model)
    logits = model(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids.to(device),
        logits_to_keep=keep,
    ).logits  # (B, keep, V)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    scores = []
    for i, cont in enumerate(conts):
        target = torch.tensor(cont, device=logprobs.device)
        rows = logprobs[i, keep - len(cont) :]  # (len(cont), V)
        picked = rows.gather(-1, target[:, None])  # (len(cont), 1)
        scores.append((float(picked.sum()), bool((rows.argmax(-1) == target).all())))
    return scores


def context_length(config) -> int | None:
    """The language model's context in tokens (``text_config.max_position_embeddings``; a text-only config's own),
    None when the config does not say."""
    text_config = getattr(config, "text_config", None) or config
    return getattr(text_config, "max_position_embeddings", None)


def score_pairs(model, tokenizer, pairs: list[tuple[list[int], list[int]]], batch_size: int) -> list[tuple[float, bool]]:
    """(summed log p(continuation | context), greedy) per (context ids, continuation ids), ``batch_size`` pairs per
    forward, contexts cut to the model's context length. Both engines score through it: the own harness's
    :func:`score_requests` and the lmms-eval plugin's ``loglikelihood``."""
    limit = context_length(model.config)
    return [score for batch in chunks(pairs, batch_size) for score in continuation_scores(model, tokenizer, batch, limit)]


def score_requests(model, tokenizer, requests: list[LoglikRequest], batch_size: int) -> list[list[float]]:
    """Per request, the log-likelihood of each continuation; option pairs are batched across requests."""
    flat = [(r_i, encode_pair(tokenizer, r.context, c)) for r_i, r in enumerate(requests) for c in r.continuations]
    scores: list[list[float]] = [[] for _ in requests]
    for (r_i, _), (value, _) in zip(flat, score_pairs(model, tokenizer, [pair for _, pair in flat], batch_size)):
        scores[r_i].append(value)
    return scores


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: values[i])


def judged(spec: TaskSpec, row: int, request: LoglikRequest, lls: list[float]) -> dict:
    """The sample record of one multiple-choice question scored by log-likelihood: the choice with the highest
    ``lls`` (and, as lm-eval's ``acc_norm``, the highest per character), and whether each is the gold one. The
    lmms-eval plugin's scores go through it too, so both engines judge alike."""
    choice = _argmax(lls)
    # lm-eval's acc_norm: per character of the choice itself, without the space that joins it to the context
    choice_norm = _argmax([ll / max(len(c.lstrip()), 1) for ll, c in zip(lls, request.continuations)])
    return sample_record(spec.name, row, request, prediction=request.continuations[choice], extracted=choice,
                         correct=choice == request.gold, extracted_norm=choice_norm,
                         correct_norm=choice_norm == request.gold, loglikelihoods=lls)


def run_loglik(spec: TaskSpec, split: LoadedSplit, model, tokenizer, sink: SampleSink, *, batch_size: int,
               skip: frozenset[int] = frozenset(), progress=None) -> list[dict]:
    """Every row of ``split`` (but those in ``skip``) scored, ``batch_size`` requests at a time; a request's
    options go through the model together with the other requests' options."""
    return run_batches(
        spec, split, sink, batch_size=batch_size, skip=skip, progress=progress, judge=judged,
        score_batch=lambda requests: score_requests(model, tokenizer, requests, batch_size * 4),
        score_one=lambda request: score_requests(model, tokenizer, [request], 4)[0],
    )
