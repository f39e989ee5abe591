"""The parsed-rows cache of LLaVA JSON files: one folder spelled any way, from any working directory, serves its own
rows, and two folders that hold the same relative names never serve each other's."""

from __future__ import annotations

import json
import os

import pytest
from PIL import Image

from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.commands.train import main


def _image_set(folder, colour) -> str:
    """A LLaVA JSON file and 4 images of one colour under ``folder/images``; the rows name ``images/<i>.png``."""
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    rows = []
    for i in range(4):
        Image.new("RGB", (32, 32), colour).save(os.path.join(folder, "images", f"{i}.png"))
        rows.append({"id": f"r{i}", "image": f"images/{i}.png",
                     "conversations": [{"from": "human", "value": "<image>\nwhat colour?"},
                                       {"from": "gpt", "value": "some colour"}]})
    path = os.path.join(folder, "data.json")
    with open(path, "w") as handle:
        json.dump(rows, handle)
    return path


def _colours(dataset) -> set:
    return {Image.open(row["images"][0]["path"]).convert("RGB").getpixel((0, 0)) if isinstance(row["images"][0], dict)
            else row["images"][0].convert("RGB").getpixel((0, 0)) for row in dataset}


def test_one_folder_spelled_three_ways_from_two_directories_reads_the_cache(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    _image_set(a / "shapes", "red")
    cache = str(tmp_path / "cache")
    monkeypatch.chdir(a)
    first, report = load_llava_json("shapes/data.json", "shapes", cache_dir=cache, check_images="open",
                                    return_report=True)
    assert not report.read_from_cache and _colours(first) == {(255, 0, 0)}
    monkeypatch.chdir(b)
    for spelling in ("../a/shapes", str(a / "shapes"), "../b/../a/shapes/"):
        again, report = load_llava_json(os.path.join(spelling, "data.json"), spelling, cache_dir=cache,
                                        check_images="open", return_report=True)
        assert report.read_from_cache, spelling  # the same folder: the same cache file
        assert report.rows_kept == 4 and report.bad_images_skipped == 0
        assert _colours(again) == {(255, 0, 0)}  # and its images open from here


def test_two_folders_with_the_same_relative_names_keep_their_own_rows(tmp_path, monkeypatch):
    red = _image_set(tmp_path / "red", "red")
    blue = _image_set(tmp_path / "blue", "blue")
    with open(red, "rb") as one, open(blue, "rb") as two:
        assert one.read() == two.read()  # the same JSON bytes: only the folder tells them apart
    cache = str(tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    for _ in range(2):  # the second pass reads both from the cache
        assert _colours(load_llava_json(red, "red", cache_dir=cache)) == {(255, 0, 0)}
        assert _colours(load_llava_json(blue, "blue", cache_dir=cache)) == {(0, 0, 255)}
    assert len([name for name in os.listdir(cache) if name.endswith(".arrow")]) == 2


@pytest.mark.usefixtures("one_thread")
def test_train_runs_again_from_another_directory(tiny_model_dir, tmp_path, monkeypatch):
    """The user's report: `train` works in folder A, then the same data from folder B failed with "file not found"
    for images that were there (the cache held paths relative to A)."""
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    _image_set(a / "shapes", "red")
    fast = ["--stage", "2", "--model", tiny_model_dir, "--max_steps", "1", "--per_device_train_batch_size", "2",
            "--report_to", "none", "--save_strategy", "no", "--gradient_checkpointing", "False",
            "--disable_tqdm", "True"]
    monkeypatch.chdir(a)
    assert main([*fast, "--data-path", "shapes/data.json", "--image-folder", "shapes", "--output-dir", "out"]) == 0
    monkeypatch.chdir(b)
    assert main([*fast, "--data-path", "../a/shapes/data.json", "--image-folder", "../a/shapes",
                 "--output-dir", "out"]) == 0
    with open(b / "out" / "training_summary.json") as handle:
        assert json.load(handle)["data"]["load"]["read_from_cache"] is True
