"""Log-likelihood multiple choice on the tiny model: a constructed model's preference is picked, the numbers equal
the hand-computed log-probabilities, and batching (left padding) changes nothing."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from llava_normaligned.evaluation.batches import SampleSink
from llava_normaligned.evaluation.data import LoadedSplit
from llava_normaligned.evaluation.loglik import (
    context_length,
    encode_pair,
    run_loglik,
    score_pairs,
    score_requests,
)
from llava_normaligned.evaluation.prompts import hellaswag_request, mmlu_request
from llava_normaligned.evaluation.tasks import TASKS
from tests.support import eval_fixtures


def constant_head(model, bias: torch.Tensor) -> None:
    """Make every position predict softmax(bias), whatever the input: an LM head with zero weights and a bias."""
    hidden, vocab = model.lm_head.in_features, model.lm_head.out_features
    head = nn.Linear(hidden, vocab, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.copy_(bias)
    model.lm_head = head


def hand_loglik(tokens: list[int], bias: torch.Tensor) -> float:
    log_z = float(torch.logsumexp(bias.double(), 0))
    return sum(float(bias[t]) - log_z for t in tokens)


MMLU_ROWS = [
    {"question": "Which is a virus?", "subject": "virology", "choices": ["oak", "HIV", "salt", "quartz"], "answer": 1},
    {"question": "2 * 3 = ?", "subject": "elementary_mathematics", "choices": ["5", "8", "6", "9"], "answer": 2},
]


def test_constructed_model_preference_is_picked_with_exact_logprobs(tiny_model, tiny_processor, tmp_path):
    tokenizer = tiny_processor.tokenizer
    c_token = tokenizer(" C", add_special_tokens=False)["input_ids"][-1]
    bias = torch.zeros(tiny_model.lm_head.out_features)
    bias[c_token] = 6.0  # the model strongly expects "C"
    constant_head(tiny_model, bias)

    requests = [mmlu_request(row, i) for i, row in enumerate(MMLU_ROWS)]
    scores = score_requests(tiny_model, tokenizer, requests, batch_size=3)  # options split across batches
    for request, lls in zip(requests, scores):
        expected = [hand_loglik(encode_pair(tokenizer, request.context, c)[1], bias) for c in request.continuations]
        assert lls == pytest.approx(expected, abs=1e-4)
        assert max(range(4), key=lambda i: lls[i]) == 2

    sink = SampleSink(str(tmp_path / "samples.jsonl"))
    split = LoadedSplit(MMLU_ROWS, "local", "test")
    records = run_loglik(TASKS["mmlu"], split, tiny_model, tokenizer, sink, batch_size=2)
    sink.close()
    assert [(r["extracted"], r["correct"]) for r in records] == [(2, False), (2, True)]
    assert TASKS["mmlu"].score(records)["score"] == 50.0
    assert len((tmp_path / "samples.jsonl").read_text().splitlines()) == 2


def test_acc_norm_divides_by_characters(tiny_model, tiny_processor, tmp_path):
    """Uniform next-token probabilities: every token costs log V, so acc picks the ending with the fewest tokens and
    acc_norm the one with the fewest tokens per character; both computed here from the tokenizer alone."""
    tokenizer = tiny_processor.tokenizer
    vocab = tiny_model.lm_head.out_features
    constant_head(tiny_model, torch.zeros(vocab))
    row = eval_fixtures.hellaswag_rows()[1]
    request = hellaswag_request(row, 0)
    n_tokens = [len(encode_pair(tokenizer, request.context, c)[1]) for c in request.continuations]

    sink = SampleSink(str(tmp_path / "samples.jsonl"))
    (record,) = run_loglik(TASKS["hellaswag"], LoadedSplit([row], "local", "t"), tiny_model, tokenizer, sink, batch_size=1)
    sink.close()
    assert record["loglikelihoods"] == pytest.approx([-n * math.log(vocab) for n in n_tokens], abs=1e-3)
    assert record["extracted"] == min(range(4), key=lambda i: n_tokens[i])
    per_char = [n / len(c.strip()) for n, c in zip(n_tokens, request.continuations)]
    assert record["extracted_norm"] == min(range(4), key=lambda i: per_char[i])


def test_batched_left_padded_scores_equal_unpadded_forward(tiny_model, tiny_processor):
    tokenizer = tiny_processor.tokenizer
    pairs = [
        encode_pair(tokenizer, "What colour is the shape? Answer:", " red"),
        encode_pair(tokenizer, "How many", " shapes are there in the picture ?"),
        encode_pair(tokenizer, "one two three four five six seven eight nine", " ten"),
    ]
    batched = [ll for ll, _ in score_pairs(tiny_model, tokenizer, pairs, batch_size=len(pairs))]  # one batch
    for (ctx, cont), value in zip(pairs, batched):
        ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logprobs = torch.log_softmax(tiny_model(input_ids=ids).logits.float(), -1)[0]  # (L, V)
        reference = sum(float(logprobs[len(ctx) - 1 + k, t]) for k, t in enumerate(cont))
        assert value == pytest.approx(reference, abs=1e-4)


def test_encode_pair_moves_trailing_space_and_keeps_all_tokens(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    ctx, cont = encode_pair(tokenizer, "Answer: ", "C")
    assert tokenizer.decode(ctx + cont) == tokenizer.decode(tokenizer("Answer: C")["input_ids"])
    assert tokenizer.decode(cont).startswith(" ")


def test_context_length_reads_the_language_models_config(tiny_model):
    assert context_length(tiny_model.config) == tiny_model.config.text_config.max_position_embeddings
    assert context_length(tiny_model.config.text_config) == tiny_model.config.text_config.max_position_embeddings
