"""The `train` command end to end (stage 1, then stage 2 from stage 1's folder), its argument merging (recipes,
YAML, flags, CPU defaults, global batch), and TRL's own `trl sft` CLI on a saved checkpoint folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from llava_normaligned.commands.train import main, parse_train_args
from llava_normaligned.trainer.arguments import accumulation_steps, recipe_names
from llava_normaligned.trainer.train import SUMMARY_FILE
from tests.support.processes import console_script
from tests.support.training import write_llava_dataset

FAST = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
        "--gradient_checkpointing", "False", "--disable_tqdm", "True"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_llava_dataset(tmp_path_factory.mktemp("cli_data"), n_rows=8, text_only=1)


def test_train_cli_stage1_then_stage2_and_the_output_loads(tiny_model_dir, data, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path, images = data
    stage1, stage2 = str(tmp_path / "stage1"), str(tmp_path / "stage2")
    common = ["--data-path", path, "--image-folder", images, *FAST]
    assert main(["--stage", "1", "--model", tiny_model_dir, "--output-dir", stage1, "--learning_rate", "1e-3",
                 *common]) == 0
    recipe = tmp_path / "stage2.yaml"
    recipe.write_text("stage: 2\nlearning_rate: 1.0e-4\nlr_vision: 2.0e-6\nlr_llm: 5.0e-4\nseed: 7\n")
    # flags override the YAML (lr_llm), the YAML overrides the defaults (lr_vision, seed)
    assert main(["--config", str(recipe), "--model", stage1, "--output-dir", stage2, "--lr-llm", "1e-3",
                 *common]) == 0
    with open(os.path.join(stage2, SUMMARY_FILE)) as handle:
        summary = json.load(handle)
    assert summary["stage"] == 2 and summary["training"]["seed"] == 7
    assert summary["learning_rates"] == {"llm": 1e-3, "vision_tower": 2e-6, "projector": 1e-3}
    assert summary["run"]["config_files"] == [recipe.name]  # by its own name: the summary is published
    model = AutoModelForImageTextToText.from_pretrained(stage2)
    processor = AutoProcessor.from_pretrained(stage2)
    assert type(model).__name__ == "LlavaNormAlignedForConditionalGeneration"
    assert processor.image_token_id == model.config.image_token_id
    first = AutoModelForImageTextToText.from_pretrained(stage1)
    assert not torch.equal(first.lm_head.weight, model.lm_head.weight)  # stage 2 trained the LLM
    for name in ("norm_tracking.json", "config.json", "modeling_llava_normaligned.py", "chat_template.jinja"):
        assert os.path.exists(os.path.join(stage2, name)), name


def test_train_cli_names_the_row_of_a_missing_image(tiny_model_dir, data, tmp_path, capsys):
    path, images = data
    with open(path) as handle:
        rows = json.load(handle)
    rows[2]["image"] = "nowhere.png"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(rows))
    out = tmp_path / "never"
    code = main(["--stage", "1", "--model", tiny_model_dir, "--data-path", str(bad), "--image-folder", images,
                 "--output-dir", str(out), *FAST])
    assert code == 2
    err = capsys.readouterr().err
    assert "'img-2'" in err and "nowhere.png: file not found" in err and "--on-bad-image skip" in err
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize("name", recipe_names())
def test_every_shipped_recipe_parses_with_the_papers_values(name, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    stage = [] if "stage" in name else ["--stage", "1"]  # an ablation file only sets the variant
    config = parse_train_args(
        ["--config", name, "--model", "some/llava", "--data-path", "d.json", "--output-dir", "out", *stage])
    stage_args, sft = config.stage_args, config.sft_args
    assert config.config_files == (name,)
    if name.startswith("ablation"):
        variant = stage_args.variant()
        assert variant["projector_norm"] == (None if "no-norm" in name else "layernorm")
        if "target" in name:
            assert variant["norm_init"] == "target" and variant["gradient_compensation"] == name.endswith("gwc")
        return
    stage = 1 if name.endswith("stage1") else 2
    # paper Appendix E.1
    assert stage_args.stage == stage and sft.seed == 42 and sft.num_train_epochs == 1
    assert sft.lr_scheduler_type == "cosine" and sft.warmup_steps == 0.03 and sft.weight_decay == 0.0
    global_batch = 256 if stage == 1 else 128
    assert sft.per_device_train_batch_size * sft.gradient_accumulation_steps == global_batch  # one process
    assert accumulation_steps(global_batch, sft.per_device_train_batch_size, 8) * 8 * sft.per_device_train_batch_size \
        == global_batch
    if stage == 1:
        assert sft.learning_rate == 1e-3
    elif config.model_args.use_peft:  # the 24 GB recipes: LLaVA-1.5's LoRA rates (adapters 2e-4, projector 2e-5)
        assert name.endswith("_24gb") and config.model_args.lora_r == 16
        assert (sft.learning_rate, stage_args.lr_projector) == (2e-4, 2e-5)
        assert bool(config.model_args.load_in_4bit) == ("qlora" in name)
    else:
        assert (stage_args.lr_llm, stage_args.lr_vision) == (1e-5, 2e-6)
    if not torch.cuda.is_available():
        assert sft.use_cpu and not sft.bf16  # the recipe's bf16 turned off on a CPU-only machine


def test_recipe_plus_ablation_file_and_global_batch_check(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    config = parse_train_args([
        "--config", "llama3.2-3b_siglip-so400m_stage1", "--config", "ablation_no-norm.yaml",
        "--data-path", "d.json", "--output-dir", "out", "--per_device_train_batch_size", "4"])
    stage_args, sft = config.stage_args, config.sft_args
    assert stage_args.model is None and stage_args.vision_model == "google/siglip-so400m-patch14-384"
    assert stage_args.variant() == {"projector_norm": None} and sft.gradient_accumulation_steps == 64
    with pytest.raises(ValueError, match="not a multiple"):
        parse_train_args(["--config", "llama3.2-3b_siglip-so400m_stage1", "--data-path", "d.json",
                          "--output-dir", "out", "--per_device_train_batch_size", "3"])
    assert accumulation_steps(256, 2, 64) == 2 and accumulation_steps(128, 1, 32) == 4  # the paper: 64 / 32 GPUs
    assert accumulation_steps(256, 2, 8) == 16


def test_trl_sft_cli_fine_tunes_a_saved_checkpoint_folder(tiny_model_dir, data, tmp_path):
    from safetensors.torch import load_file

    from llava_normaligned.trainer.data import load_llava_json

    path, images = data
    parquet = tmp_path / "parquet"
    parquet.mkdir()
    load_llava_json(path, images).to_parquet(str(parquet / "train.parquet"))
    out = tmp_path / "trl_out"
    trl = console_script("trl")  # TRL's, installed with this interpreter: not another found first on PATH
    proc = subprocess.run(
        [trl, "sft", "--model_name_or_path", tiny_model_dir, "--dataset_name", str(parquet),
         "--trust_remote_code", "True", "--output_dir", str(out), "--max_steps", "2",
         "--per_device_train_batch_size", "2", "--use_cpu", "True", "--bf16", "False",
         "--gradient_checkpointing", "False", "--report_to", "none", "--save_strategy", "no"],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
        check=False, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(out / "config.json") as handle:
        config = json.load(handle)
    assert config["model_type"] == "llava_normaligned" and "AutoModelForImageTextToText" in config["auto_map"]
    before, after = load_file(os.path.join(tiny_model_dir, "model.safetensors")), load_file(out / "model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_train_cli_reads_a_messages_dataset(tiny_model_dir, data, tmp_path):
    from llava_normaligned.trainer.data import load_llava_json

    path, images = data
    saved = tmp_path / "saved"
    load_llava_json(path, images).save_to_disk(str(saved))
    out = tmp_path / "from_dataset"
    assert main(["--stage", "1", "--model", tiny_model_dir, "--dataset-name", str(saved), "--output-dir", str(out),
                 *FAST]) == 0
    with open(out / SUMMARY_FILE) as handle:
        summary = json.load(handle)
    assert summary["data"]["load"]["sources"] == [saved.name] and summary["data"]["load"]["rows_kept"] == 9


def test_train_cli_reports_what_trains_on_its_console(tiny_model_dir, data, tmp_path):
    """A fresh process with the default --log_level: the freezing, the optimizer groups and the data summaries are
    printed (transformers' passive level would hide them)."""
    path, images = data
    proc = subprocess.run(
        [sys.executable, "-m", "llava_normaligned.cli", "train", "--stage", "1", "--model", tiny_model_dir,
         "--data-path", path, "--image-folder", images, "--output-dir", str(tmp_path / "out"), *FAST],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
        check=False, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for text in ("stage 1: what trains", "projector: trains", "llm: frozen", "optimizer group projector",
                 "9/9 rows kept", "8/9 rows to train on"):
        assert text in proc.stderr, text


def test_errors_during_training_are_not_turned_into_usage_errors(tiny_model_dir, data, tmp_path, monkeypatch):
    """Bad inputs exit with code 2 and a message before training starts; an error raised while training keeps its
    type and traceback, and the output folder the run created, holding no checkpoint, is taken away."""
    from llava_normaligned.trainer.train import LlavaStageTrainer

    def fail(self, model, inputs, num_items_in_batch=None):
        raise ValueError("raised inside training_step")

    monkeypatch.setattr(LlavaStageTrainer, "training_step", fail)
    path, images = data
    with pytest.raises(ValueError, match="inside training_step"):
        main(["--stage", "1", "--model", tiny_model_dir, "--data-path", path, "--image-folder", images,
              "--output-dir", str(tmp_path / "out"), *FAST])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--stage", "2", "--lora-vision"], "only apply with --use_peft"),
    (["--stage", "2", "--merge-adapter"], "only apply with --use_peft"),
    (["--stage", "2", "--use_peft", "--train-vision", "True"], "add --lora-vision"),
    (["--stage", "2", "--use_peft", "--lora-vision", "--lora_target_modules", "q_proj"], "no effect"),
    (["--stage", "2", "--use_peft", "--lora-vision", "--train-vision", "False"], "contradict"),
    (["--stage", "1", "--train-vision", "True"], "stage 1 keeps the vision tower frozen"),
])
def test_flags_that_would_do_nothing_are_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        parse_train_args(["--model", "m", "--data-path", "d.json", "--output-dir", "out", *flags])


def test_lora_vision_puts_adapters_on_the_vision_tower():
    from llava_normaligned.trainer.lora import VISION_TARGETS, stage2_lora_config

    config = parse_train_args(
        ["--stage", "2", "--model", "m", "--data-path", "d.json", "--output-dir", "out", "--use_peft", "--lora-vision"])
    stage_args, model_args = config.stage_args, config.model_args
    assert stage_args.lora_vision and stage_args.train_vision is None
    assert VISION_TARGETS in stage2_lora_config(model_args, lora_vision=stage_args.lora_vision).target_modules


def test_summary_records_which_sources_are_hub_datasets(tmp_path):
    from llava_normaligned.trainer.train import with_hub_ids

    local = tmp_path / "rows.json"
    local.write_text("[]")
    load = {"sources": ["liuhaotian/LLaVA-Pretrain", str(local), "data/mix665k.json"], "rows_read": 3}
    assert with_hub_ids(load)["hub_ids"] == ["liuhaotian/LLaVA-Pretrain"]
    assert with_hub_ids(None) is None
