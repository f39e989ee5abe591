"""The token count ``prepare_dataset`` gives each row (``num_tokens``: what length grouping orders by and
``max_length`` checks) is the length the collator's batch gives it, for every family ``train`` takes without
torchvision and for this package's model: the image's markers counted with its tokens (Idefics3's and SmolVLM's tile
markers, Gemma3's begin and end of image). The count is measured on a blank 64 px square: for the families whose
processors tile or grid by each image's size (InternVL's patches, Qwen-VL's resolution, SmolVLM's splitting) it is
exact for images of that size, which these rows have, and an estimate for others."""

from __future__ import annotations

import pytest

from llava_normaligned.families.anatomy import anatomy_of
from llava_normaligned.families.processors import TRAINS_WITHOUT_TORCHVISION
from llava_normaligned.loading import load_model
from llava_normaligned.tiny import save_tiny_vlm
from llava_normaligned.trainer.collator import LlavaTrainingCollator
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.preprocess import prepare_dataset
from tests.support.training import write_llava_dataset


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_llava_dataset(tmp_path_factory.mktemp("lengths_data"), n_rows=6, text_only=1, multi_turn_every=2,
                               image_size=64)


def _lengths(folder: str, data) -> tuple[list[int], list[int]]:
    model, processor = load_model(folder, for_training=True)
    rows, _ = prepare_dataset(load_llava_json(*data), processor, max_length=None)
    chosen = [rows[i] for i in range(len(rows))]
    batch = LlavaTrainingCollator(processor, images_per_text=anatomy_of(model).family.images_per_text)(chosen)
    return [int(r["num_tokens"]) for r in chosen], batch["attention_mask"].sum(dim=1).tolist()


@pytest.mark.parametrize("family", TRAINS_WITHOUT_TORCHVISION)
def test_the_prepared_count_is_the_collated_length(family, data, tmp_path):
    counted, collated = _lengths(save_tiny_vlm(family, tmp_path / family), data)
    assert counted == collated


def test_the_prepared_count_is_the_collated_length_for_this_package_s_model(tiny_model_dir, data):
    counted, collated = _lengths(tiny_model_dir, data)
    assert counted == collated
