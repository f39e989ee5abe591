"""Which recipe fits a 24 GB card: the memory estimate's optimizer, QLoRA, logits and autocast terms, and the shipped
24 GB recipes parsed by `train`'s own parser and checked against the table they are listed in."""

from __future__ import annotations

import os

import pytest

from llava_normaligned.diagnostics.memory import (
    CARD_RECIPES,
    LOGIT_BYTES,
    NF4_BYTES,
    card_fits,
    card_table,
    reference_config,
    training_estimate,
)
from llava_normaligned.commands.train import parse_train_args

PAPER = "SigLIP-so400m-384 + Llama-3.2-3B (paper)"
RECIPES = os.path.join(os.path.dirname(__file__), os.pardir, "trainer", "recipes")


@pytest.fixture(scope="module")
def paper():
    return reference_config(PAPER)


def test_each_term_moves_the_estimate_by_what_it_holds(paper):
    base = training_estimate(paper, stage=2, sequence=2048)
    eight = training_estimate(paper, stage=2, sequence=2048, optimizer="adamw_8bit")
    assert base.optimizer_bytes == 2 * 2 * base.trainable  # two bf16 moments a trained parameter
    assert eight.optimizer_bytes == pytest.approx(2.03125 * base.trainable, rel=1e-6)
    assert eight.weights_bytes == base.weights_bytes and eight.gradient_bytes == base.gradient_bytes

    full = training_estimate(paper, stage=2, sequence=2048, full_logits=True)
    vocab = paper.get_text_config().vocab_size
    assert full.logits_bytes == 2048 * vocab * LOGIT_BYTES and base.logits_bytes == 0
    assert full.total_bytes > base.total_bytes

    off = training_estimate(paper, stage=2, sequence=2048, checkpointing=False)
    assert off.activation_bytes > 5 * base.activation_bytes  # every layer's activations against each layer's input

    lora = training_estimate(paper, stage=2, sequence=2048, lora_rank=16)
    qlora = training_estimate(paper, stage=2, sequence=2048, lora_rank=16, quantized_llm=True)
    assert qlora.trainable == lora.trainable and qlora.optimizer_bytes == lora.optimizer_bytes
    # only the LLM's attention and MLP weights shrink (2 bytes -> NF4): 3.2B of Llama-3.2-3B's parameters
    saved = lora.weights_bytes - qlora.weights_bytes
    assert 2.7e9 * (2 - NF4_BYTES) < saved < 3.3e9 * (2 - NF4_BYTES)

    mixed = training_estimate(paper, stage=2, sequence=2048, weight_dtype="float32", compute_dtype="bfloat16")
    assert mixed.weights_bytes == base.parameters * (4 + 2)  # the float32 weights and autocast's bf16 copies
    # stage 1: only the projector trains; the frozen weights' casts are kept only where the backward saves them
    frozen = training_estimate(paper, stage=1, sequence=2048, weight_dtype="float32", compute_dtype="bfloat16")
    frozen_off = training_estimate(paper, stage=1, sequence=2048, weight_dtype="float32", compute_dtype="bfloat16",
                                   checkpointing=False)
    assert frozen.weights_bytes == frozen.parameters * 4 + frozen.trainable * 2
    assert frozen_off.weights_bytes == frozen.parameters * (4 + 2)


def test_estimate_refuses_what_it_cannot_count(paper):
    with pytest.raises(ValueError, match="optimizer must be one of"):
        training_estimate(paper, stage=2, optimizer="sgd")
    with pytest.raises(ValueError, match="lora_rank"):
        training_estimate(paper, stage=2, quantized_llm=True)


def _recipe_estimate(paper, recipe: str):
    """(per-device batch, the estimate of what ``recipe`` (a file name, then flags) runs), read from `train`'s parsed
    options."""
    name, *flags = recipe.split()
    config = parse_train_args(["--config", os.path.join(RECIPES, name), "--model", "m", "--data-path", "d.json",
                               "--output-dir", "out", *flags])
    model, sft, stage = config.model_args, config.sft_args, config.stage_args
    weight = str(model.dtype or "float32").replace("torch.", "")
    return sft.per_device_train_batch_size, training_estimate(
        paper, stage=stage.stage, weight_dtype=weight,
        # the recipe asks for bf16 autocast; on a CPU-only machine the parser turns it off, on the card it is on
        compute_dtype="bfloat16" if weight == "float32" else None,
        batch_size=sft.per_device_train_batch_size, sequence=sft.max_length,
        lora_rank=model.lora_r if model.use_peft else None, quantized_llm=bool(model.load_in_4bit),
        checkpointing=bool(sft.gradient_checkpointing),
        optimizer="adamw_8bit" if "8bit" in str(sft.optim) else "adamw")


@pytest.mark.parametrize("label,kwargs,recipe", [r for r in CARD_RECIPES if r[2]], ids=[r[0] for r in CARD_RECIPES
                                                                                          if r[2]])
def test_each_listed_recipe_runs_what_its_row_says(paper, label, kwargs, recipe):
    """The recipe file, parsed as `train` parses it, asks for the memory its row of the table states."""
    assert os.path.exists(os.path.join(RECIPES, recipe.split()[0])), recipe
    batch, parsed = _recipe_estimate(paper, recipe)
    row = training_estimate(paper, batch_size=batch, sequence=2048, **kwargs)
    assert parsed.total_bytes == row.total_bytes, (label, parsed.describe(), row.describe())


def test_the_24gb_recipes_fit_and_full_stage_2_does_not(paper):
    table = card_table()
    for line in table.splitlines()[2:]:
        label = line.split(" | ")[0].strip("| ")
        cells = line.split(" | ")[1:5]
        fits = [cell.endswith("fits") for cell in cells]
        if "_24gb" in line or label.startswith("stage 1 (projector), bf16"):
            assert all(fits), line  # every column: checkpointing and the loss at labels on or off
        if label.startswith("stage 2 full"):
            assert not any(fits), line
    for name in sorted(os.listdir(RECIPES)):
        if name.endswith("_24gb.yaml"):
            batch, estimate = _recipe_estimate(paper, name)
            assert batch == 1, name  # the table's batch
            assert card_fits(estimate, 24.0) and not card_fits(estimate, estimate.total_bytes / 2**30 - 0.5), name


def test_the_docs_table_is_the_code_s_own():
    docs = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "training.md")
    with open(docs, encoding="utf-8") as handle:
        assert card_table().strip() in handle.read(), "regenerate with `python .ci/doc_tables.py`"
