"""Stage 2 through PEFT: LoRA on the LLM with the projector and its norm trained fully and saved with the adapter;
QLoRA with the LLM in 4-bit (bitsandbytes on the CPU) and the vision tower, projector and LM head unquantized."""

from __future__ import annotations

import os

import pytest
import torch
from trl import ModelConfig

from llava_normaligned.trainer.collator import LlavaTrainingCollator
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.lora import stage2_lora_config
from llava_normaligned.trainer.preprocess import prepare_dataset
from llava_normaligned.trainer.stage_model import load_checkpoint
from llava_normaligned.trainer.train import train_stage
from tests.support.training import cpu_config, snapshot, write_llava_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path, images = write_llava_dataset(tmp_path_factory.mktemp("peft_data"), n_rows=8, text_only=0)
    return load_llava_json(path, images)


def _lora():
    return stage2_lora_config(ModelConfig(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0))


def test_lora_trains_adapters_and_the_full_projector_and_saves_them(tiny_model_dir, tiny_processor, dataset,
                                                                       tmp_path):
    from peft import PeftModel

    model, _ = load_checkpoint(tiny_model_dir)
    base_before = snapshot(model)
    result = train_stage(model, tiny_processor, dataset, stage=2, args=cpu_config(tmp_path / "lora"),
                         peft_config=_lora())
    peft_model = result.model
    trainable = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert any("lora_A" in n and "language_model" in n for n in trainable)
    projector = {n for n in trainable if "multi_modal_projector" in n}
    assert {n.rsplit("default.", 1)[1] for n in projector} == {
        "linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias", "norm.weight", "norm.bias"}
    # the base weights did not move; the projector copy and the adapters did
    base = peft_model.get_base_model()
    for name, param in base.named_parameters():
        if "lora_" in name or "modules_to_save" in name or "original_module" in name:
            continue
        assert torch.equal(param, base_before[name.replace(".base_layer", "")]), name
    trained_norm = peft_model.base_model.model.model.multi_modal_projector.modules_to_save["default"].norm
    assert not torch.equal(trained_norm.weight, base_before["model.multi_modal_projector.norm.weight"])
    assert "gwc_factor" in result.norm_tracking[-1]  # tracked on the trained projector copy
    lora_b = [p for n, p in peft_model.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora_b)  # LoRA B starts at zero: it moved

    # the adapter folder holds the projector and norm: reloading reproduces the trained model's outputs
    fresh, _ = load_checkpoint(tiny_model_dir)
    reloaded = PeftModel.from_pretrained(fresh, result.output_dir).eval()
    prepared, _ = prepare_dataset(dataset, tiny_processor, max_length=None)
    batch = LlavaTrainingCollator(tiny_processor)([prepared[i] for i in range(2)])
    batch.pop("labels")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, peft_model.eval()(**batch).logits)


def test_qlora_on_cpu_quantizes_only_the_llm_and_trains(tiny_model_dir, tiny_processor, dataset, tmp_path):
    import bitsandbytes as bnb

    model, _ = load_checkpoint(tiny_model_dir, quantization="4bit")
    q_proj = model.model.language_model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, bnb.nn.Linear4bit)
    assert type(model.model.multi_modal_projector.linear_1) is torch.nn.Linear
    assert type(model.model.vision_tower.encoder.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert type(model.lm_head) is torch.nn.Linear
    result = train_stage(model, tiny_processor, dataset, stage=2, args=cpu_config(tmp_path / "qlora", max_steps=2),
                         peft_config=_lora())
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in result.trainer.state.log_history if "loss" in e)
    records = result.norm_tracking
    assert records[-1]["gain_l2"] != records[0]["gain_l2"]  # the projector norm trained
    lora_b = [p for n, p in result.model.named_parameters() if "lora_B" in n and "language_model" in n]
    assert lora_b and any(p.abs().sum() > 0 for p in lora_b)  # LoRA B starts at zero: it moved


def test_train_cli_qlora_with_merged_output(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from llava_normaligned.commands.train import main

    path, images = write_llava_dataset(tmp_path / "data", n_rows=8, text_only=0)
    out = tmp_path / "qlora"
    assert main(["--stage", "2", "--model", tiny_model_dir, "--data-path", path, "--image-folder", images,
                 "--output-dir", str(out), "--use_peft", "--load_in_4bit", "--lora_r", "4", "--merge-adapter",
                 "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none",
                 "--save_strategy", "no", "--gradient_checkpointing", "False", "--disable_tqdm", "True"]) == 0
    assert (out / "adapter_config.json").exists() and (out / "training_summary.json").exists()
    merged = AutoModelForImageTextToText.from_pretrained(out / "merged")
    assert type(merged.model.language_model.layers[0].self_attn.q_proj) is torch.nn.Linear  # unquantized
    before, after = load_file(os.path.join(tiny_model_dir, "model.safetensors")), load_file(
        out / "merged" / "model.safetensors")
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert "model.multi_modal_projector.norm.weight" in moved
    assert any(k.startswith("model.language_model.layers.") and "proj" in k for k in moved)  # LoRA merged in


def test_train_vision_under_peft_follows_the_adapters(tiny_model_dir):
    """Under PEFT the vision tower trains through adapters (``lora_vision``); ``train_vision=False`` freezes them,
    ``train_vision=True`` without them is refused rather than ignored."""
    from peft import get_peft_model

    from llava_normaligned.trainer.stages import freeze_stage2

    def peft_model(lora_vision):
        model, _ = load_checkpoint(tiny_model_dir)
        config = stage2_lora_config(ModelConfig(use_peft=True, lora_r=4, lora_alpha=8), lora_vision=lora_vision)
        return get_peft_model(model, config)

    with_vision = peft_model(lora_vision=True)
    assert freeze_stage2(with_vision).trainable["vision_tower"] > 0  # default: the adapters on it train
    trained = {n for n, p in with_vision.named_parameters() if "vision_tower" in n and p.requires_grad}
    adapters = {n for n, _ in with_vision.named_parameters() if "vision_tower" in n and "lora_" in n}
    # the adapters of the layer LLaVA reads train; those of the last layer and the pooling head (never read) do not
    assert trained == {n for n in adapters if ".encoder.layers.0." in n} and len(trained) == 12
    report = freeze_stage2(with_vision, train_vision=False)
    assert report.trainable["vision_tower"] == 0 and report.trainable["llm"] > 0 and report.trainable["projector"] > 0
    without = peft_model(lora_vision=False)
    assert freeze_stage2(without).trainable["vision_tower"] == 0
    with pytest.raises(ValueError, match="no adapter on the vision tower"):
        freeze_stage2(without, train_vision=True)
