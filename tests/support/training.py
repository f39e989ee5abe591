"""Helpers shared by the training tests (no tests here): a tiny LLaVA-JSON dataset on disk, CPU SFTConfigs, and a
stock LlavaForConditionalGeneration with the same weights as the tiny norm-aligned model."""

from __future__ import annotations

import json
import os

import torch
from transformers import TrainerCallback

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30)}


def write_llava_dataset(folder, n_rows: int = 16, text_only: int = 1, multi_turn_every: int = 3,
                        image_size: int = 32) -> tuple[str, str]:
    """Solid-colour square images (``image_size`` px, default 32) and LLaVA JSON rows about them. Returns (json
    path, image folder)."""
    from PIL import Image

    image_dir = os.path.join(folder, "images")
    os.makedirs(image_dir, exist_ok=True)
    names = list(COLOURS)
    rows = []
    for i in range(n_rows):
        colour = names[i % len(names)]
        Image.new("RGB", (image_size, image_size), COLOURS[colour]).save(os.path.join(image_dir, f"{i}.png"))
        turns = [{"from": "human", "value": "<image>\nwhat colour is the shape ?"}, {"from": "gpt", "value": colour}]
        if multi_turn_every and i % multi_turn_every == 0:
            turns += [{"from": "human", "value": "is there a circle ?"}, {"from": "gpt", "value": "no"}]
        rows.append({"id": f"img-{i}", "image": f"{i}.png", "conversations": turns})
    for i in range(text_only):
        rows.append({"id": f"text-{i}", "conversations": [{"from": "human", "value": "say one"},
                                                          {"from": "gpt", "value": "one"}]})
    path = os.path.join(folder, "train.json")
    with open(path, "w") as handle:
        json.dump(rows, handle)
    return path, image_dir


def cpu_config(output_dir, **overrides):
    from trl import SFTConfig

    values = {
        "output_dir": str(output_dir), "use_cpu": True, "bf16": False, "report_to": [],
        "gradient_checkpointing": False, "max_steps": 3, "per_device_train_batch_size": 4, "logging_steps": 1,
        "save_strategy": "no", "learning_rate": 1e-3, "seed": 0, "dataloader_num_workers": 0, "disable_tqdm": True,
    }
    values.update(overrides)
    return SFTConfig(**values)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def changed(before: dict, model) -> set[str]:
    return {name for name, param in model.named_parameters() if not torch.equal(before[name], param.detach())}


class StopAfter(TrainerCallback):
    """Interrupts training after `step` optimizer steps, as a crash would (the schedule stays the full run's)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
