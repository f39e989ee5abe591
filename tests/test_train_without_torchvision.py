"""Qwen2-VL, Qwen2.5-VL, Qwen3-VL and SmolVLM(2) train where torchvision cannot import: ``train`` takes a stock
checkpoint laid out as the Hub has it (a ``video_preprocessor_config.json`` beside the image processor's) and its
``align`` folder, through transformers' own processor classes built without their video part
(``families.processors.build_qwen_vl``; SmolVLM's images through Idefics3's class, ``build_smolvlm``). Qwen's batches
follow the family's published rules; every family's agree with the torchvision-free ``ExpandingProcessor``; and the
folder a run saves keeps the video processor's settings for the stock processor to load where torchvision is."""

from __future__ import annotations

import json
import os

import pytest
import torch
from PIL import Image

from llava_normaligned.cli import main as cli_main
from llava_normaligned.families.processors import ExpandingProcessor, expand_qwen, load_processor, processor_parts
from llava_normaligned.tiny import save_tiny_vlm
from tests.support.training import write_llava_dataset

FAST = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no",
        "--gradient_checkpointing", "False", "--disable_tqdm", "True"]
QWEN = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _hub_layout(family: str, folder: str) -> tuple[str, dict]:
    """A tiny stock model with the video processor file the Hub's repos hold."""
    stock = save_tiny_vlm(family, folder)
    with open(os.path.join(stock, "preprocessor_config.json"), encoding="utf-8") as handle:
        image = json.load(handle)
    kind = {"qwen3_vl": "Qwen3VLVideoProcessor", "smolvlm": "SmolVLMVideoProcessor"}.get(family,
                                                                                          "Qwen2VLVideoProcessor")
    video = {**{k: v for k, v in image.items() if k != "image_processor_type"}, "video_processor_type": kind,
             "fps": 2.0, "do_sample_frames": False}
    with open(os.path.join(stock, "video_preprocessor_config.json"), "w", encoding="utf-8") as handle:
        json.dump(video, handle)
    return stock, video


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_llava_dataset(tmp_path_factory.mktemp("qwen_data"), n_rows=6, text_only=1)


def _torchvision_imports() -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("family", QWEN)
def test_the_qwen_processor_follows_the_family_s_rules_and_matches_the_expanding_one(family, tmp_path):
    from transformers import AutoConfig, ProcessorMixin

    stock, _ = _hub_layout(family, str(tmp_path / "stock"))
    config = AutoConfig.from_pretrained(stock)
    processor = load_processor(stock, config)
    assert isinstance(processor, ProcessorMixin) and type(processor).__name__.endswith("Processor")
    images = [Image.new("RGB", (64, 48), (200, 30, 30)), Image.new("RGB", (40, 72), (30, 30, 200))]
    texts = [processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                                            "text": q}]}],
                                           add_generation_prompt=True) for q in ("what is it?", "and this?")]
    batch = processor(text=texts, images=images, return_tensors="pt", padding=True)
    merge = processor.image_processor.merge_size
    grid = batch["image_grid_thw"]
    assert grid.shape == (2, 3) and grid[0].tolist() != grid[1].tolist()  # each image its own grid
    for t, h, w in grid.tolist():
        assert t == 1 and h % merge == 0 and w % merge == 0  # an image is one frame of whole merge windows
    assert batch["pixel_values"].shape[0] == int(grid.prod(-1).sum())  # one row per patch
    per_row = (batch["input_ids"] == processor.image_token_id).sum(dim=1)
    assert per_row.tolist() == (grid.prod(-1) // merge**2).tolist()  # one token per merged patch
    assert torch.equal(batch["mm_token_type_ids"].bool(), batch["input_ids"] == processor.image_token_id)
    tokenizer, image_processor, template = processor_parts(stock, {})
    expanding = ExpandingProcessor(tokenizer, image_processor, template, processor.image_token, expand_qwen,
                                   token_types=True)
    other = expanding(text=texts, images=images, return_tensors="pt", padding=True)
    for key in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw", "mm_token_type_ids"):
        assert torch.equal(batch[key], other[key]), key


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "smolvlm"])
def test_train_takes_the_hub_layout_and_the_align_folder_and_keeps_the_video_settings(family, data, tmp_path):
    from llava_normaligned.loading import load_model

    stock, video = _hub_layout(family, str(tmp_path / "stock"))
    path, images = data
    aligned = str(tmp_path / "aligned")
    assert cli_main(["align", stock, "--output-dir", aligned]) == 0
    for source in (stock, aligned):
        out = str(tmp_path / f"out_{os.path.basename(source)}")
        assert cli_main(["train", "--stage", "2", "--model", source, "--data-path", path, "--image-folder", images,
                         "--output-dir", out, *FAST]) == 0, source
        with open(os.path.join(out, "processor_config.json"), encoding="utf-8") as handle:
            saved = json.load(handle)
        assert saved["video_processor"]["video_processor_type"] == video["video_processor_type"]
        model, processor = load_model(out)  # the saved folder loads again, here without torchvision
        assert type(processor).__name__ == type(load_processor(source, model.config)).__name__
        assert saved["processor_class"] == {"smolvlm": "SmolVLMProcessor"}.get(family, type(processor).__name__)
        with open(os.path.join(out, "training_summary.json"), encoding="utf-8") as handle:
            assert json.load(handle)["stage"] == 2


@pytest.mark.skipif(_torchvision_imports(), reason="checks the refusal where torchvision cannot import")
def test_mistral3_is_still_refused_in_one_line(data, tmp_path, capsys):
    path, images = data
    for family in ("mistral3",):
        stock = save_tiny_vlm(family, str(tmp_path / family))
        aligned = str(tmp_path / f"{family}_aligned")
        assert cli_main(["align", stock, "--output-dir", aligned]) == 0
        capsys.readouterr()
        out = tmp_path / f"never_{family}"
        assert cli_main(["train", "--stage", "2", "--model", aligned, "--data-path", path, "--image-folder", images,
                         "--output-dir", str(out), *FAST]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert family in err and "pip install torchvision" in err and not out.exists()


def test_smolvlm_s_processor_matches_the_expanding_one_and_saves_as_smolvlm_s(tmp_path):
    from transformers import AutoConfig

    from llava_normaligned.families.processors import build_idefics3

    stock, video = _hub_layout("smolvlm", str(tmp_path / "stock"))
    config = AutoConfig.from_pretrained(stock)
    processor = load_processor(stock, config)
    expanding = build_idefics3(stock, config)
    assert isinstance(expanding, ExpandingProcessor) and not isinstance(processor, ExpandingProcessor)
    images = [[Image.new("RGB", (64, 48), (200, 30, 30))], [Image.new("RGB", (40, 72), (30, 30, 200))]]
    texts = [processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                                            "text": q}]}],
                                           add_generation_prompt=True) for q in ("what is it?", "and this?")]
    batch = processor(text=texts, images=images, return_tensors="pt", padding=True)
    other = expanding(text=texts, images=images, return_tensors="pt", padding=True)
    assert batch.keys() == other.keys() and all(torch.equal(batch[k], other[k]) for k in other)
    processor.save_pretrained(str(tmp_path / "saved"))
    with open(tmp_path / "saved" / "processor_config.json", encoding="utf-8") as handle:
        saved = json.load(handle)
    assert saved["processor_class"] == "SmolVLMProcessor" and saved["video_processor"] == video
