"""The paper's data as the Hub publishes it: LLaVA's conversation format with embedded images
(``lmms-lab/LLaVA-NeXT-Data``, ``lmms-lab/LLaVA-ReCap-558K``: ``id``, ``conversations`` [{``from``, ``value``}],
``data_source``, ``image``), as a local parquet folder laid out as the Hub does, through the loader and ``train``.
A Hub id goes through the same ``load_dataset`` call and fails with one clear line when it cannot be reached."""

from __future__ import annotations

import json

import pytest

from llava_normaligned.trainer.data import DataError, load_messages_dataset
from tests.support.hub_data import N_ROWS, TEXT_ONLY_EVERY, write_hub_parquet


@pytest.fixture(scope="module")
def hub_folder(tmp_path_factory):
    return write_hub_parquet(tmp_path_factory.mktemp("llava_next_like"))


def test_conversation_format_with_embedded_images(hub_folder, tmp_path):
    dataset, report = load_messages_dataset(hub_folder, return_report=True, cache_dir=str(tmp_path / "cache"))
    text_only = sum(1 for i in range(N_ROWS) if i % TEXT_ONLY_EVERY == 5)
    assert report.rows_read == report.rows_kept == N_ROWS and report.text_only_rows == text_only
    assert dataset.column_names == ["id", "messages", "images"]
    first = dataset[0]
    assert first["id"] == "row-0" and first["images"][0].size == (24, 24)  # decoded on access only
    assert first["messages"] == [{"role": "user", "content": "What is in the picture?"},
                                 {"role": "assistant", "content": "answer 0"},
                                 {"role": "user", "content": "And the colour?"},
                                 {"role": "assistant", "content": "green"}]
    assert not dataset[5]["images"]  # a text-only row
    # "auto" on 3,000 images opens every header (up to AUTO_OPEN_LIMIT); the same call again reads the cache
    assert report.image_check == "open" and report.images_checked_here == N_ROWS - text_only
    again, second = load_messages_dataset(hub_folder, return_report=True, cache_dir=str(tmp_path / "cache"))
    assert second.read_from_cache and not report.read_from_cache
    assert again["id"] == dataset["id"] and again[3]["messages"] == dataset[3]["messages"]


def test_embedded_images_are_not_read_up_front_at_scale(hub_folder, monkeypatch):
    """Above the limit, "auto" reads only the byte counts and opens a seeded sample; "exists" opens none."""
    from PIL import Image

    from llava_normaligned.trainer.data import images as data

    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda *args, **kwargs: opened.append(1) or real_open(*args, **kwargs))
    monkeypatch.setattr(data, "AUTO_OPEN_LIMIT", 100)
    monkeypatch.setattr(data, "AUTO_SAMPLE", 50)
    _, report = load_messages_dataset(hub_folder, return_report=True)
    assert report.image_check == "exists+sample" and len(opened) == 50
    opened.clear()
    _, report = load_messages_dataset(hub_folder, check_images="exists", return_report=True)
    assert report.image_check == "exists" and not opened


def test_broken_embedded_images_are_named_or_skipped(tmp_path):
    folder = write_hub_parquet(tmp_path / "broken", n_rows=200, broken=(7, 150))
    with pytest.raises(DataError, match=r"(?s)2 row\(s\).*id 'row-7'\): image 7.png \(embedded\): unreadable"):
        load_messages_dataset(folder)
    dataset, report = load_messages_dataset(folder, on_bad_image="skip", return_report=True)
    assert report.bad_images_skipped == 2 and len(dataset) == 198
    assert "row-7" not in dataset["id"] and "row-150" not in dataset["id"]


def test_hub_id_goes_through_load_dataset_and_fails_clearly_offline(monkeypatch, tmp_path):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty_cache"))
    with pytest.raises(DataError) as err:
        load_messages_dataset("lmms-lab/LLaVA-NeXT-Data")
    text = str(err.value)
    assert "lmms-lab/LLaVA-NeXT-Data" in text and "Hub" in text and "offline" in text and "\n" not in text


def test_train_on_the_hub_format_parquet_folder(hub_folder, tiny_parts, tmp_path, monkeypatch):
    """``train --dataset-name FOLDER`` on the Hub's schema: stage 1 drops the text-only rows, trains 2 steps."""
    import datasets

    from llava_normaligned.commands.train import main

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))  # train's caches
    vision, text = tiny_parts
    out = tmp_path / "run"
    code = main(["--stage", "1", "--vision-model", vision, "--text-model", text, "--dataset-name", hub_folder,
                 "--output-dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "4",
                 "--report_to", "none", "--save_strategy", "no", "--gradient_checkpointing", "False",
                 "--max_length", "256"])
    assert code == 0
    with open(out / "training_summary.json") as handle:
        summary = json.load(handle)
    text_only = sum(1 for i in range(N_ROWS) if i % TEXT_ONLY_EVERY == 5)
    assert summary["data"]["load"]["rows_kept"] == N_ROWS
    assert summary["data"]["prepare"]["text_only_dropped"] == text_only
    assert summary["data"]["prepare"]["rows_out"] == N_ROWS - text_only
    assert summary["training"]["global_steps"] == 2
