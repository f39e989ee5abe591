"""Held-out accuracy during training (``trainer/held_out.py``, ``train --held_out_data_path``): the rows read from a
LLaVA JSON file, the accuracy counted by the exact-answer rule with groups weighing the same, and the readings taken
before the first step and every N steps, logged with the step and kept in ``held_out_accuracy.json``."""

from __future__ import annotations

import json
import os

import pytest

from llava_normaligned.generation import generate_batch
from llava_normaligned.trainer.held_out import (
    HELD_OUT_FILE,
    HeldOutAccuracyCallback,
    HeldOutRow,
    held_out_accuracy,
    load_held_out,
)
from tests.support.training import cpu_config, write_llava_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_llava_dataset(tmp_path_factory.mktemp("held_out"), n_rows=8, text_only=1)


def test_rows_are_read_with_their_images_groups_and_limit(data, tmp_path):
    path, images = data
    rows = load_held_out(path, images, group_field="id")
    assert len(rows) == 9 and rows[0].question == "what colour is the shape ?" and rows[0].answer == "red"
    assert os.path.isfile(rows[0].image) and rows[-1].image is None and rows[0].group == "img-0"
    assert len(load_held_out(path, images, limit=3)) == 3 and load_held_out(path, images)[0].group is None
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}]}]))
    with pytest.raises(ValueError, match=r"bad.json row 0: not a LLaVA row"):
        load_held_out(str(bad), images)
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps([{"image": "nowhere.png", "conversations": [
        {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]))
    with pytest.raises(ValueError, match=r"row 0: image .*nowhere.png not found"):
        load_held_out(str(missing), images)


def test_the_accuracy_counts_exact_answers_and_weighs_groups_the_same(tiny_model_dir, data):
    """Answers set to what the model says (in another case, with a full stop) count; others do not. Group a has
    3 of 4 right, group b 0 of 2: the accuracy is (0.75 + 0) / 2, not 3 / 6."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    path, images = data
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    base = load_held_out(path, images)[:6]
    said = generate_batch(model, processor, [r.question for r in base], [r.image for r in base], max_new_tokens=4)
    assert all(s.strip() for s in said)
    answers = [said[0].upper() + ".", said[1], said[2], "certainly not this", "certainly not this", "nor this"]
    groups = ["a", "a", "a", "a", "b", "b"]
    rows = [HeldOutRow(r.question, a, r.image, g) for r, a, g in zip(base, answers, groups)]
    model.train()
    reading = held_out_accuracy(model, processor, rows, batch_size=4, max_new_tokens=4)
    assert reading == {"accuracy": pytest.approx(0.375), "groups": {"a": 0.75, "b": 0.0}, "rows": 6}
    assert model.training  # restored
    ungrouped = [HeldOutRow(r.question, r.answer, r.image) for r in rows]
    assert held_out_accuracy(model, processor, ungrouped, batch_size=4, max_new_tokens=4)["accuracy"] == 0.5


def test_readings_before_training_and_every_n_steps_reach_the_logs_and_the_file(tiny_model_dir, data, tmp_path):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.train import StageConfig, prepare_stage, run_stage

    path, images = data
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    rows = load_held_out(path, images, limit=4)
    out = tmp_path / "run"
    prepared = prepare_stage(model, processor, load_llava_json(path, images),
                             args=cpu_config(out, max_steps=3, logging_steps=1), stage=StageConfig(1))
    callback = HeldOutAccuracyCallback.install(prepared.trainer, rows, processor, every=2, max_new_tokens=3)
    run_stage(prepared)
    records = json.loads((out / HELD_OUT_FILE).read_text())
    assert [r["step"] for r in records] == [0, 2, 3]  # before training, every 2 steps, and the last
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["rows"] == 4 for r in records)
    logged = {e["step"]: e["held_out/accuracy"] for e in prepared.trainer.state.log_history if "held_out/accuracy" in e}
    assert logged == {r["step"]: r["accuracy"] for r in records}
    assert callback.records == records
    with pytest.raises(ValueError, match="at least 1"):
        HeldOutAccuracyCallback(rows, processor, every=0)


def test_train_takes_the_held_out_flags_and_refuses_a_missing_file(tiny_model_dir, data, tmp_path, capsys):
    from llava_normaligned.commands.train import main

    path, images = data
    fast = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none", "--save_strategy", "no",
            "--gradient_checkpointing", "False", "--disable_tqdm", "True"]
    out = tmp_path / "stage1"
    assert main(["--stage", "1", "--model", tiny_model_dir, "--data-path", path, "--image-folder", images,
                 "--output-dir", str(out), "--held_out_data_path", path, "--held_out_steps", "1",
                 "--held_out_limit", "3", *fast]) == 0
    assert [r["step"] for r in json.loads((out / HELD_OUT_FILE).read_text())] == [0, 1, 2]
    never = tmp_path / "never"
    code = main(["--stage", "1", "--model", tiny_model_dir, "--data-path", path, "--image-folder", images,
                 "--output-dir", str(never), "--held_out_data_path", str(tmp_path / "nope.json"), *fast])
    err = capsys.readouterr().err
    assert code == 2 and "--held_out_data_path" in err and "nope.json" in err and not never.exists()


def test_a_resumed_run_keeps_the_interrupted_run_s_readings(tiny_model_dir, data, tmp_path):
    """Three steps with checkpoints, then the same run resumed from step 2's checkpoint to step 4: the file holds
    every reading (0, 2, 3 read before; 4 after the resume), as one uninterrupted run's would."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.train import StageConfig, prepare_stage, run_stage

    path, images = data
    rows = load_held_out(path, images, limit=4, group_field="id")
    out = tmp_path / "run"

    def run(max_steps, resume=None):
        model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
        processor = AutoProcessor.from_pretrained(tiny_model_dir)
        args = cpu_config(out, max_steps=max_steps, logging_steps=1, save_strategy="steps", save_steps=1,
                          resume_from_checkpoint=resume)
        prepared = prepare_stage(model, processor, load_llava_json(path, images), args=args, stage=StageConfig(1))
        HeldOutAccuracyCallback.install(prepared.trainer, rows, processor, every=2, max_new_tokens=3)
        run_stage(prepared)
        return json.loads((out / HELD_OUT_FILE).read_text())

    first = run(3)
    assert [r["step"] for r in first] == [0, 2, 3] and set(first[0]["groups"]) == {r.group for r in rows}
    checkpoint = out / "checkpoint-3"
    assert json.loads((checkpoint / HELD_OUT_FILE).read_text()) == first
    resumed = run(4, str(checkpoint))
    assert [r["step"] for r in resumed] == [0, 2, 3, 4]
    assert resumed[:3] == [{**r, "epoch": resumed[i]["epoch"]} for i, r in enumerate(first)]
