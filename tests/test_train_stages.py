"""The two LLaVA-1.5 stages with the real TRL SFTTrainer on a tiny model: what each stage trains, the per-part
learning rates, the norm tracking (through the Trainer's loggers and as JSON), stock LLaVA through the same path."""

from __future__ import annotations

import json
import os

import pytest
import torch

from llava_normaligned.compose import stock_llava_like
from llava_normaligned.part_metrics import text_embedding_norm, vision_text_norm_ratio
from llava_normaligned.trainer.callbacks import NORM_TRACKING_FILE
from llava_normaligned.trainer.collator import LlavaTrainingCollator
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.preprocess import prepare_dataset
from llava_normaligned.trainer.stages import freeze_stage1, unused_vision_parameters
from llava_normaligned.trainer.train import SUMMARY_FILE, StageConfig, train_stage
from tests.support.training import changed, cpu_config, snapshot, write_llava_dataset

PROJECTOR_PARAMS = {
    f"model.multi_modal_projector.{name}"
    for name in ("linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias", "norm.weight", "norm.bias")
}
GAIN_FIELDS = ("gain_abs_mean", "gain_l2", "bias_abs_mean", "gwc_factor", "gain_grad_abs_mean")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path, images = write_llava_dataset(tmp_path_factory.mktemp("stages_data"), n_rows=12, text_only=1)
    return load_llava_json(path, images)


def _batch(processor, dataset, n=2):
    prepared, _ = prepare_dataset(dataset, processor, max_length=None)
    return LlavaTrainingCollator(processor)([prepared[i] for i in range(n)])


def test_stage1_trains_only_the_projector_and_its_norm(tiny_model, tiny_processor, dataset, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForImageTextToText

    before = snapshot(tiny_model)
    args = cpu_config(tmp_path / "stage1", report_to=["tensorboard"])
    result = train_stage(tiny_model, tiny_processor, dataset, stage=1, args=args)

    assert changed(before, result.model) == PROJECTOR_PARAMS
    # the norm tracking reached the Trainer's loggers (TensorBoard here) and the JSON file
    tags = set()
    for root, _, files in os.walk(tmp_path / "stage1" / "runs"):  # the TensorBoard callback's default folder
        for name in files:
            events = EventAccumulator(os.path.join(root, name))
            events.Reload()
            tags |= set(events.Tags()["scalars"])
    assert {"train/norm/vision_text_ratio", "train/norm/projector_output_norm", "train/norm/gwc_factor",
            "train/norm/gain_grad_abs_mean"} <= tags
    with open(os.path.join(result.output_dir, NORM_TRACKING_FILE)) as handle:
        records = json.load(handle)
    assert records == result.norm_tracking and [r["step"] for r in records] == [0, 1, 2, 3]
    start, end = records[0], records[-1]
    assert start["gain_abs_mean"] == pytest.approx(tiny_model.config.norm_target
                                                   / tiny_model.config.text_config.hidden_size ** 0.5, rel=1e-5)
    assert start["gwc_factor"] == pytest.approx(1 / start["gain_abs_mean"], rel=1e-4)
    assert end["vision_text_ratio"] == pytest.approx(end["projector_output_norm"] / end["text_embedding_norm"])
    assert end["gain_grad_abs_mean"] > 0
    # the saved folder loads with from_pretrained and holds the trained weights
    with open(os.path.join(result.output_dir, SUMMARY_FILE)) as handle:
        summary = json.load(handle)
    assert summary["stage"] == 1 and summary["freeze"]["trainable_params"]["llm"] == 0
    assert summary["data"]["prepare"]["text_only_dropped"] == 1  # stage 1 cannot learn from text-only rows
    assert summary["norm"]["gain_statistics"]["gain_l2"] == pytest.approx(end["gain_l2"])
    reloaded = AutoModelForImageTextToText.from_pretrained(result.output_dir)
    for name, param in reloaded.named_parameters():
        assert torch.equal(param, dict(result.model.named_parameters())[name]), name


def test_stage1_builds_no_graph_through_the_frozen_vision_tower(tiny_model, tiny_processor, dataset):
    freeze_stage1(tiny_model)
    tiny_model.train()
    seen = {}
    hooks = [
        tiny_model.model.vision_tower.register_forward_hook(
            lambda m, i, o: seen.__setitem__("vision", o.last_hidden_state.requires_grad)),
        tiny_model.model.multi_modal_projector.register_forward_hook(
            lambda m, i, o: seen.__setitem__("projector", o.requires_grad)),
    ]
    batch = _batch(tiny_processor, dataset)
    tiny_model(**batch).loss.backward()
    for hook in hooks:
        hook.remove()
    assert seen == {"vision": False, "projector": True}
    grads = {name for name, param in tiny_model.named_parameters() if param.grad is not None}
    assert grads == PROJECTOR_PARAMS  # no weight gradient is computed for a frozen parameter


def test_stage2_trains_every_part_at_its_own_learning_rate(tiny_model, tiny_processor, dataset, tmp_path):
    before = snapshot(tiny_model)
    args = cpu_config(tmp_path / "stage2", learning_rate=1e-3)
    result = train_stage(tiny_model, tiny_processor, dataset, args=args,
                         stage=StageConfig(2, lr_llm=1e-3, lr_vision=2e-4, lr_projector=5e-4))
    never_used = set(unused_vision_parameters(tiny_model))
    assert never_used  # the last vision layer (feature layer -2), the post layernorm and SigLIP's head
    assert changed(before, result.model) == set(before) - never_used

    groups = result.trainer.optimizer.param_groups
    lrs = {g["name"]: g["initial_lr"] for g in groups}
    assert lrs == {"llm": 1e-3, "llm/no_decay": 1e-3, "projector": 5e-4, "projector/no_decay": 5e-4,
                   "vision_tower": 2e-4, "vision_tower/no_decay": 2e-4}
    by_id = {id(p): name for name, p in result.model.named_parameters()}
    for group in groups:
        part = group["name"].split("/")[0]
        names = [by_id[id(p)] for p in group["params"]]
        marker = {"llm": ("language_model", "lm_head"), "projector": ("multi_modal_projector",),
                  "vision_tower": ("vision_tower",)}[part]
        assert all(any(m in n for m in marker) for n in names), (part, names)
    logged = [e for e in result.trainer.state.log_history if "learning_rate/vision_tower" in e]
    assert logged and all(e["learning_rate/vision_tower"] == pytest.approx(0.2 * e["learning_rate/llm"])
                          for e in logged)
    # trained embeddings change T: it is recomputed at each log
    assert result.norm_tracking[-1]["text_embedding_norm"] == pytest.approx(text_embedding_norm(result.model))


def test_stock_llava_trains_through_the_same_path(tiny_model, tiny_processor, dataset, tmp_path):
    stock = stock_llava_like(tiny_model)
    before = snapshot(stock)
    result = train_stage(stock, tiny_processor, dataset, stage=1, args=cpu_config(tmp_path / "stock"))
    assert changed(before, stock) == PROJECTOR_PARAMS - {"model.multi_modal_projector.norm.weight",
                                                         "model.multi_modal_projector.norm.bias"}
    for record in result.norm_tracking:
        assert "vision_text_ratio" in record and not set(GAIN_FIELDS) & set(record)  # GWC fields absent
    assert result.summary["variant"] == {"projector_norm": None, "stock_llava": True}


def test_vision_text_norm_ratio_matches_a_direct_computation(tiny_model, tiny_processor, dataset):
    from modeling_llava_normaligned import model_norm_target

    batch = _batch(tiny_processor, dataset)
    measured = vision_text_norm_ratio(tiny_model, batch)
    with torch.no_grad():
        hidden = tiny_model.model.vision_tower(batch["pixel_values"], output_hidden_states=True).hidden_states[-2]
        tokens = tiny_model.model.multi_modal_projector(hidden)  # (N, 16, D)
    expected_image = tokens.norm(dim=-1).mean().item()
    expected_text = model_norm_target(tiny_model)  # the image token's row left out (paper §5.1)
    assert measured["projector_output_norm"] == pytest.approx(expected_image, rel=1e-5)
    assert measured["text_embedding_norm"] == pytest.approx(expected_text, rel=1e-5)
    assert measured["vision_text_ratio"] == pytest.approx(expected_image / expected_text, rel=1e-5)


def test_skipping_unused_vision_compute_changes_no_loss_or_gradient(tiny_model, tiny_processor, dataset):
    from llava_normaligned.trainer.skip_unread_layers import skip_unused_vision_compute, unused_vision_modules
    from llava_normaligned.trainer.stages import freeze_stage2

    freeze_stage2(tiny_model)
    tiny_model.train()
    batch = _batch(tiny_processor, dataset, n=3)

    def loss_and_grads():
        tiny_model.zero_grad(set_to_none=True)
        loss = tiny_model(**batch).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in tiny_model.named_parameters() if p.grad is not None}

    layers, heads = unused_vision_modules(tiny_model)
    assert len(layers) == 1 and len(heads) == 1  # feature layer -2 of 2: the last layer; SigLIP's head
    calls = []
    hook = layers[0].mlp.register_forward_hook(lambda *args: calls.append(1))
    full_loss, full_grads = loss_and_grads()
    with skip_unused_vision_compute(tiny_model):
        skipped_loss, skipped_grads = loss_and_grads()
    hook.remove()
    assert len(calls) == 1  # the last layer ran only outside the context
    assert torch.equal(full_loss, skipped_loss) and full_grads.keys() == skipped_grads.keys()
    for name, grad in full_grads.items():
        assert torch.equal(grad, skipped_grads[name]), name
    assert "forward" not in vars(layers[0]) and "forward" not in vars(heads[0])  # restored


# ------------------------------------------------------------------------------------- gradient checkpointing


@pytest.mark.parametrize("stage", [1, 2])
def test_gradient_checkpointing_trains_the_same_weights(tiny_model_dir, tiny_processor, dataset, tmp_path, stage):
    """TRL's default and every recipe turn gradient checkpointing on: same parts trained, same weights as without."""
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    trained = {}
    for checkpointing in (False, True):
        model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
        before = snapshot(model)
        # an LLM layer's first norm runs once per step, twice when checkpointing recomputes the layer in backward
        calls = []
        hook = model.model.language_model.layers[0].input_layernorm.register_forward_hook(
            lambda *_, calls=calls: calls.append(1))
        args = cpu_config(tmp_path / f"gc-{checkpointing}", gradient_checkpointing=checkpointing, max_steps=2)
        result = train_stage(model, tiny_processor, dataset, args=args,
                             stage=StageConfig(stage, lr_vision=2e-4, save_final=False))
        hook.remove()
        assert result.summary["training"]["gradient_checkpointing"] is checkpointing
        assert len(calls) == 2 * (2 if checkpointing else 1)
        moved = changed(before, result.model)
        expected = PROJECTOR_PARAMS if stage == 1 else set(before) - set(unused_vision_parameters(model))
        assert moved == expected
        trained[checkpointing] = dict(result.model.named_parameters())
    for name, param in trained[True].items():
        torch.testing.assert_close(param, trained[False][name], rtol=0, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------- logging of the parts


def test_per_part_rates_and_pre_clip_gradient_norms_are_logged(tiny_model, tiny_processor, dataset, tmp_path):
    """A zero LLM rate trains nothing there and logs 0; each part's gradient norm is logged before clipping."""
    before = snapshot(tiny_model)
    args = cpu_config(tmp_path / "rates", max_steps=2, max_grad_norm=1e-3, lr_scheduler_type="constant")
    result = train_stage(tiny_model, tiny_processor, dataset, args=args, stage=StageConfig(
        2, lr_llm=0.0, lr_vision=2e-4, lr_projector=5e-4, save_final=False))
    moved = changed(before, result.model)
    assert not {n for n in moved if "language_model" in n or n.startswith("lm_head")}
    assert any("vision_tower" in n for n in moved) and PROJECTOR_PARAMS <= moved
    logged = [e for e in result.trainer.state.log_history if "loss" in e]
    assert len(logged) == 2
    for entry in logged:
        assert (entry["learning_rate/llm"], entry["learning_rate/vision_tower"]) == (0.0, 2e-4)
        assert entry["learning_rate/projector"] == 5e-4
        parts = {k.split("/", 1)[1]: v for k, v in entry.items() if k.startswith("grad_norm/")}
        assert set(parts) == {"llm", "vision_tower", "projector", "projector_norm"}
        # the Trainer's grad_norm is the pre-clip total: the parts add up to it, far above max_grad_norm
        assert sum(v * v for v in parts.values()) ** 0.5 == pytest.approx(entry["grad_norm"], rel=1e-4)
        assert entry["grad_norm"] > 100 * args.max_grad_norm


def test_the_stage_trainer_overrides_no_private_trainer_method():
    """What LlavaStageTrainer changes goes through the Trainer's public hooks (training_step, compute_loss, log,
    create_optimizer, save_model); the two private Trainer methods it needs are ``compat.TrainerHooks``'s (pinned in
    tests/test_compat.py), so a transformers or TRL release that renames one fails there, not silently here."""
    from trl import SFTTrainer

    from llava_normaligned.compat import TrainerHooks
    from llava_normaligned.trainer.train import LlavaStageTrainer

    overridden = {name for name, value in vars(LlavaStageTrainer).items()
                  if callable(value) and name.startswith("_") and not name.startswith("__") and hasattr(SFTTrainer, name)}
    assert overridden == set(), f"private Trainer methods overridden: {sorted(overridden)}"
    assert LlavaStageTrainer.__mro__.index(TrainerHooks) < LlavaStageTrainer.__mro__.index(SFTTrainer)
    assert {"_load_optimizer_and_scheduler", "_get_train_sampler"} == {
        name for name in vars(TrainerHooks) if name.startswith("_") and not name.startswith("__")}


def test_part_gradient_norms_are_read_after_the_last_accumulated_micro_batch(tiny_model, tiny_processor, dataset,
                                                                             tmp_path):
    """With gradient accumulation the parts are read once the step's gradients are whole (their total is the
    Trainer's pre-clip grad_norm), and without clipping (max_grad_norm 0) they are logged too."""
    for accumulation, max_grad_norm in ((2, 1e-3), (1, 0.0)):
        args = cpu_config(tmp_path / f"acc{accumulation}", max_steps=2, per_device_train_batch_size=2,
                          gradient_accumulation_steps=accumulation, max_grad_norm=max_grad_norm)
        result = train_stage(tiny_model, tiny_processor, dataset, args=args,
                             stage=StageConfig(2, lr_vision=2e-4, save_final=False))
        logged = [e for e in result.trainer.state.log_history if "loss" in e]
        assert len(logged) == 2
        for entry in logged:
            parts = {k.split("/", 1)[1]: v for k, v in entry.items() if k.startswith("grad_norm/")}
            assert set(parts) == {"llm", "vision_tower", "projector", "projector_norm"}
            assert sum(v * v for v in parts.values()) ** 0.5 == pytest.approx(entry["grad_norm"], rel=1e-4)
            assert entry["learning_rate/vision_tower"] == pytest.approx(0.2 * entry["learning_rate/llm"])


def test_the_callers_sftconfig_is_not_changed(tiny_model, tiny_processor, dataset, tmp_path):
    """The fields the pipeline owns (remove_unused_columns, assistant_only_loss, ...), the chat template path it
    consumes and DDP's unused-parameter search are set on a copy: the same SFTConfig can start another stage."""
    from tests.support.templates import LLAMA_3_2

    template_file = tmp_path / "llama3.2.jinja"
    template_file.write_text(LLAMA_3_2)
    args = cpu_config(tmp_path / "own", max_steps=1, remove_unused_columns=True, assistant_only_loss=True,
                      chat_template_path=str(template_file))
    before = args.to_dict()
    result = train_stage(tiny_model, tiny_processor, dataset, args=args, stage=StageConfig(2, save_final=False))
    assert args.to_dict() == before
    used = result.trainer.args
    assert used is not args
    assert (used.remove_unused_columns, used.assistant_only_loss, used.chat_template_path) == (False, False, None)
    assert used.ddp_find_unused_parameters is True  # the dataset has a text-only row


def test_rows_skipped_counts_training_batches_only(tiny_model, tiny_processor, tmp_path):
    """A row whose image fails to decode (skip policy) is counted each time training meets it, never in eval."""
    path, images = write_llava_dataset(tmp_path / "data", n_rows=3, text_only=0, multi_turn_every=0)
    broken = tmp_path / "data" / "images" / "broken.png"
    broken.write_bytes(b"\x89PNG broken")
    with open(path) as handle:
        rows = json.load(handle) + [{"id": "late", "image": str(broken), "conversations": [
            {"from": "human", "value": "<image>\nq"}, {"from": "gpt", "value": "a"}]}]
    with open(path, "w") as handle:
        json.dump(rows, handle)
    data = load_llava_json(path, images, check_images="exists")
    args = cpu_config(tmp_path / "skips", max_steps=2, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                      eval_strategy="steps", eval_steps=1)
    result = train_stage(tiny_model, tiny_processor, data, args=args, eval_dataset=data,
                         stage=StageConfig(2, on_bad_image="skip", save_final=False))
    assert sum(1 for e in result.trainer.state.log_history if "eval_loss" in e) == 2  # the row was evaluated twice
    assert result.summary["data"]["rows_skipped_in_training"] == 2  # one epoch per step: met twice in training


# --------------------------------------------------------------------------------------------- chat template


def test_chat_template_path_is_used_for_training_and_saved(tiny_model, tiny_processor, dataset, tmp_path):
    """``--chat_template_path`` is applied before the rows are rendered (also when the processor has none), and the
    saved processor carries the template the model was trained with."""
    from transformers import AutoProcessor

    from llava_normaligned.compose import multimodal_chat_template
    from tests.support.templates import LLAMA_3_2

    template_file = tmp_path / "llama3.2.jinja"
    template_file.write_text(LLAMA_3_2)
    tiny_processor.chat_template = None
    args = cpu_config(tmp_path / "templated", max_steps=1, chat_template_path=str(template_file))
    result = train_stage(tiny_model, tiny_processor, dataset, stage=1, args=args)
    assert result.trainer.args.chat_template_path is None  # applied here; TRL does not apply it again after rendering
    assert args.chat_template_path == str(template_file)  # on a copy: the caller's SFTConfig is not changed
    rendered = result.trainer.train_dataset["rendered"]
    assert all("<|start_header_id|>assistant<|end_header_id|>" in text for text in rendered)
    saved = AutoProcessor.from_pretrained(result.output_dir)
    assert saved.chat_template == multimodal_chat_template(LLAMA_3_2, tiny_processor.tokenizer)
    batch = LlavaTrainingCollator(tiny_processor)([result.trainer.train_dataset[0]])
    labels = batch["labels"][0]
    assert tiny_processor.tokenizer.decode(batch["input_ids"][0][labels != -100]).endswith("<|eot_id|>")


def test_stage2_after_stage1_in_one_process_runs_in_the_precision_its_arguments_ask(tiny_model, tiny_processor,
                                                                                     dataset, tmp_path):
    """Stage 1 then stage 2 on the same model object (the demo, the Python API): the second Trainer prepares the model
    anew, so bf16 autocast is on in stage 2 as in stage 1 (accelerate had marked the model prepared, and stage 2 ran
    in float32, 1.7x slower a step on a CPU with AMX). The model returned runs its own forward."""
    seen: list[bool] = []
    layer = tiny_model.model.language_model.layers[0]
    hook = layer.register_forward_pre_hook(lambda module, args: seen.append(torch.is_autocast_enabled("cpu")))
    try:
        for stage in (1, 2):
            seen.clear()
            result = train_stage(tiny_model, tiny_processor, dataset, stage=StageConfig(stage, save_final=False),
                                 args=cpu_config(tmp_path / f"stage{stage}", bf16=True, max_steps=2))
            assert seen and all(seen), (stage, seen)
    finally:
        hook.remove()
    assert result.model is tiny_model and "forward" not in vars(tiny_model)
