"""``demo.text_drift``: the KL of a trained row's LLM on text alone from the original LLM. Zero for the LLM itself and
for a freshly composed VLM read on text (its added image token left out), positive and growing with a perturbation."""

from __future__ import annotations

import pytest
import torch

from llava_normaligned.demo.text_drift import reference_answers, text_kl
from llava_normaligned.tiny import TinyTextSpec, chatml_template, save_tiny_parts, tiny_text_model, train_tokenizer

PROMPTS = ("the red square is", "a blue circle near", "describe the scene", "what colour is it")


@pytest.fixture(scope="module")
def llm():
    tokenizer = train_tokenizer(with_image_token=False)
    tokenizer.chat_template = chatml_template("<image>")
    model = tiny_text_model(tokenizer, TinyTextSpec(), seed=1).eval()
    return model, tokenizer


def test_the_llm_against_itself_is_zero_and_a_perturbation_grows_the_kl(llm):
    model, tokenizer = llm
    refs = reference_answers(model, tokenizer, PROMPTS, answer_tokens=6)
    assert len(refs) == len(PROMPTS) and all(r["logprobs"].shape[0] == len(r["ids"]) - r["answer_start"] for r in refs)
    same = text_kl(model, refs)
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["top1_agreement"] == 1.0
    readings = []
    for scale in (0.01, 0.1):
        noisy = tiny_text_model(tokenizer, TinyTextSpec(), seed=1).eval()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in noisy.model.layers.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * scale)
        readings.append(text_kl(noisy, refs)["kl"])
    assert 0 < readings[0] < readings[1]


def test_a_composed_vlm_read_on_text_equals_its_llm(tmp_path):
    """The VLM has one more token (the image's) than its LLM; the KL is taken over the LLM's vocabulary."""
    from llava_normaligned.compose import compose

    vision_dir, text_dir = save_tiny_parts(tmp_path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    tokenizer.chat_template = chatml_template("<image>")
    llm = AutoModelForCausalLM.from_pretrained(text_dir)
    refs = reference_answers(llm, tokenizer, PROMPTS, answer_tokens=4)
    vlm, _ = compose(vision_dir, text_dir, seed=0)
    assert vlm.config.text_config.vocab_size > llm.config.vocab_size
    reading = text_kl(vlm, refs)
    assert reading["kl"] == pytest.approx(0.0, abs=1e-5) and reading["top1_agreement"] == 1.0
