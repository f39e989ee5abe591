"""Resuming from a checkpoint reproduces the uninterrupted run: same weights, same loss curve, same norm history."""

from __future__ import annotations

import pytest
import torch

from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.train import StageConfig, train_stage
from tests.support.training import StopAfter, cpu_config, write_llava_dataset


def test_resume_reproduces_the_uninterrupted_run(tiny_model_dir, tiny_processor, tmp_path):
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    path, images = write_llava_dataset(tmp_path / "data", n_rows=12, text_only=0)
    dataset = load_llava_json(path, images)

    def run(output_dir, callbacks=None, **overrides):
        model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
        args = cpu_config(output_dir, max_steps=6, per_device_train_batch_size=2, lr_scheduler_type="cosine",
                          warmup_steps=2, **overrides)
        return train_stage(model, tiny_processor, dataset, args=args, stage=StageConfig(2, lr_vision=2e-4),
                           callbacks=callbacks)

    straight = run(tmp_path / "straight")
    run(tmp_path / "resumed", callbacks=[StopAfter(3)], save_strategy="steps", save_steps=3)
    resumed = run(tmp_path / "resumed", resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-3"))

    assert resumed.trainer.state.global_step == 6
    expected = dict(straight.model.named_parameters())
    for name, param in resumed.model.named_parameters():
        torch.testing.assert_close(param, expected[name], rtol=0, atol=1e-6, msg=name)
    assert [r["step"] for r in resumed.norm_tracking] == list(range(7))  # the interrupted run's history is kept
    for a, b in zip(straight.norm_tracking, resumed.norm_tracking):
        assert a.get("loss") == pytest.approx(b.get("loss"), abs=1e-6)
        assert a["vision_text_ratio"] == pytest.approx(b["vision_text_ratio"], rel=1e-5)
