"""The rules both engines share, without lmms-eval: how a prompt's text is read, how log-likelihoods are scored, the
sample record, and the head of results.json. The plugin's side of each, run inside lmms-eval on the same rows, is in
test_lmms_eval.py (test_plugin_and_runner_share_the_rules)."""

from __future__ import annotations

import pytest
import torch

from llava_normaligned.evaluation.batches import error_record, sample_record
from llava_normaligned.evaluation.loglik import continuation_scores, encode_pair, score_pairs, score_requests
from llava_normaligned.evaluation.prompts import mmlu_request, synthetic_request, without_image_tags
from llava_normaligned.evaluation.runner import EvalConfig, results_header

# (the text a row or an lmms-eval task holds, the processor's own image token, the text the model is given). The last
# two are where the plugin's earlier rule differed from the own harness's: it trimmed only when it took a tag out,
# and took out only the processor's token; the own harness's rule (docs/evaluation.md) is kept for both.
PROMPT_TEXTS = [
    ("<image>\nWhat colour is the shape?", "<image>", "What colour is the shape?"),
    ("What shape is it?\n<image>", None, "What shape is it?"),
    ("Question 1?", "<image>", "Question 1?"),
    ("  How many shapes are there?\n", "<image>", "How many shapes are there?"),
    ("<image>\n<|image_pad|>Which side is it on?", "<|image_pad|>", "Which side is it on?"),
]


def llava_row(question: str, answer: str = "red") -> dict:
    return {"id": "r0", "image": None, "template": "colour",
            "conversations": [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]}


@pytest.mark.parametrize("text, token, expected", PROMPT_TEXTS)
def test_prompt_text_rule(text, token, expected):
    assert without_image_tags(text, token) == expected
    if token in (None, "<image>"):  # the own harness's questions hold LLaVA's tag only
        assert synthetic_request(llava_row(text), 0).prompt == expected


def test_score_pairs_is_what_score_requests_picks_from(tiny_model, tiny_processor):
    """The plugin returns score_pairs' numbers to lmms-eval; the own harness picks its answer from score_requests':
    the same numbers, whatever the batch size, and greedy flags equal to a direct forward's."""
    tokenizer = tiny_processor.tokenizer
    rows = [{"question": "Which is a virus?", "subject": "virology", "choices": ["oak", "HIV", "salt", "quartz"],
             "answer": 1},
            {"question": "2 * 3 = ?", "subject": "elementary_mathematics", "choices": ["5", "8", "6", "9"], "answer": 2}]
    requests = [mmlu_request(row, i) for i, row in enumerate(rows)]
    own = score_requests(tiny_model, tokenizer, requests, batch_size=3)
    pairs = [encode_pair(tokenizer, r.context, c) for r in requests for c in r.continuations]
    for batch_size in (1, 2, 8):
        shared = score_pairs(tiny_model, tokenizer, pairs, batch_size)
        assert [ll for ll, _ in shared] == pytest.approx([ll for lls in own for ll in lls], abs=1e-4)
    greedy = [g for _, g in score_pairs(tiny_model, tokenizer, pairs, 8)]
    assert greedy == [g for pair in pairs for _, g in continuation_scores(tiny_model, tokenizer, [pair])]


def test_score_pairs_cuts_contexts_to_the_models_length(tiny_model, tiny_processor):
    tokenizer = tiny_processor.tokenizer
    limit = tiny_model.config.text_config.max_position_embeddings
    long_pair = ([1] * (limit + 40), tokenizer(" end", add_special_tokens=False)["input_ids"])
    ((ll, _),) = score_pairs(tiny_model, tokenizer, [long_pair], 1)
    cut = (long_pair[0][-(limit - len(long_pair[1]) + 1):], long_pair[1])
    assert ll == pytest.approx(continuation_scores(tiny_model, tokenizer, [cut])[0][0], abs=1e-4)


def test_sample_records_have_one_shape():
    request = synthetic_request(llava_row("<image>\nWhat colour?"), 0)
    record = sample_record("synthetic", 3, request, prediction="Red.", extracted="Red.", correct=True)
    assert list(record) == ["task", "row", "doc_id", "prompt", "prediction", "extracted", "gold", "correct", "meta",
                            "error"]
    assert (record["doc_id"], record["prompt"], record["gold"], record["meta"]) == ("r0", "What colour?", "red",
                                                                                  {"category": "colour"})
    failed = error_record("synthetic", 4, ValueError("bad image"), None)
    assert list(failed) == list(record)
    assert (failed["doc_id"], failed["prompt"], failed["correct"], failed["error"]) == ("4", None, False,
                                                                                       "ValueError: bad image")
    loglik = sample_record("mmlu", 0, mmlu_request({"question": "Q?", "subject": "virology", "choices": ["a", "b"],
                                                    "answer": 0}, 0), extracted=0, loglikelihoods=[-1.0, -2.0])
    assert loglik["prompt"].endswith("Answer:") and loglik["loglikelihoods"] == [-1.0, -2.0]


def test_both_engines_write_the_same_results_head(tiny_model, tiny_model_dir):
    """The head of results.json (model, revision, label, method, this package's version) comes from one function."""
    from llava_normaligned.evaluation import lmms_engine, runner

    cfg = EvalConfig(model=tiny_model_dir, tasks="pope", output_dir="o", label="tiny")
    identity = {"model": "m", "revision": None, "model_fingerprint": {}, "settings": {}}
    own = runner.harness_header(cfg, tiny_model, identity)
    theirs = lmms_engine.lmms_header(cfg)
    keys = ["label", "method", "revision"]
    assert [own[k] for k in keys] == [theirs[k] for k in keys] == ["tiny", "w/ Norm (w/ GWC)", None]
    assert own["versions"]["llava_normaligned"] == theirs["versions"]["llava_normaligned"]
    assert list(theirs)[:5] == ["model", "revision", "label", "method", "engine"] and "lmms_eval" in theirs["versions"]
    assert results_header(cfg, tiny_model.config, identity, {})["versions"] == {
        "llava_normaligned": own["versions"]["llava_normaligned"]}
    assert torch.__version__ == own["versions"]["torch"]
