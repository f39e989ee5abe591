"""What results.json publishes names no local path, and what --resume compares is content, not paths."""

from __future__ import annotations

import json
import os
import shutil

from PIL import Image

from llava_normaligned.evaluation import provenance
from llava_normaligned.evaluation.data import LazyImage


def test_results_name_local_settings_by_their_own_names():  # the rule itself: tests/test_local_paths.py
    assert provenance.public_settings({"data_dir": "/data/bench", "limit": 3, "baseline": None}) == {
        "data_dir": "bench", "limit": 3, "baseline": None}


def test_model_files_digest_is_the_content_of_the_model_files(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    (a / "config.json").write_text('{"x": 1}')
    (a / "model.safetensors").write_bytes(b"weights")
    digest = provenance.model_files_digest(str(a))
    b = shutil.copytree(a, tmp_path / "elsewhere")
    (b / "README.md").write_text("a card")  # records and sub-folders are not the model
    (b / "training_summary.json").write_text("{}")
    (b / "eval").mkdir()
    (b / "eval" / "results.json").write_text("{}")
    assert provenance.model_files_digest(str(b)) == digest
    (b / "model.safetensors").write_bytes(b"weightz")
    assert provenance.model_files_digest(str(b)) != digest


def test_split_digest_hashes_images_by_content_not_path(tmp_path):
    from datasets import Dataset
    from datasets import Image as ImageFeature

    def copy(folder, colour):
        os.makedirs(folder)
        Image.new("RGB", (4, 4), colour).save(os.path.join(folder, "x.png"))
        rows = Dataset.from_dict({"q": ["what?"], "image": [os.path.join(folder, "x.png")]})
        return rows.cast_column("image", ImageFeature(decode=False))  # stored by path only

    one, two = copy(str(tmp_path / "one"), "red"), copy(str(tmp_path / "two"), "red")
    assert one[0]["image"]["bytes"] is None and one[0]["image"]["path"] != two[0]["image"]["path"]
    assert provenance.split_digest(one) == provenance.split_digest(two)
    assert provenance.split_digest(copy(str(tmp_path / "three"), "blue")) != provenance.split_digest(one)

    # the synthetic task's rows: LLaVA JSON with lazily opened images
    lazy = [{"id": "0", "image": LazyImage(str(tmp_path / "one" / "x.png"))}]
    moved = [{"id": "0", "image": LazyImage(str(tmp_path / "two" / "x.png"))}]
    assert provenance.split_digest(lazy) == provenance.split_digest(moved)
    assert provenance.split_digest(lazy) != provenance.split_digest([{"id": "1", "image": lazy[0]["image"]}])


def test_resume_mismatches_name_what_differs():
    earlier = {"model": "ckpt", "revision": None, "model_fingerprint": {"files_sha256": "a" * 64},
               "settings": {"limit": None, "batch_size": 8, "data_dir": "bench", "dtype": "auto"},
               "datasets": {"pope": {"sha256": "d1"}}}
    same = json.loads(json.dumps(earlier))
    same.update(model="copy-of-ckpt")  # another folder name, the same files
    same["settings"].update(batch_size=2, data_dir="other")  # not compared (data by content instead)
    assert provenance.resume_mismatches(earlier, same) == []
    other = json.loads(json.dumps(earlier))
    other["settings"]["dtype"] = "bfloat16"
    other["datasets"]["pope"]["sha256"] = "d2"
    assert provenance.resume_mismatches(earlier, other) == [
        "--dtype: 'auto' -> 'bfloat16'", "data of pope: another split (rows' content differs)"]
    hub = {**earlier, "model": "org/m", "revision": "main", "model_fingerprint": {"commit": "c1"}}
    before_load = {**hub, "model_fingerprint": {"commit": None}}  # the commit is known once the model has loaded
    assert provenance.resume_mismatches(hub, before_load) == []
    moved = {**hub, "model_fingerprint": {"commit": "c2"}}
    assert provenance.resume_mismatches(hub, moved) == [
        "Hub commit of 'org/m'@main: c1 -> c2 (the revision moved; pass --revision c1)"]
    assert provenance.resume_mismatches(hub, {**moved, "model": "org/other"})[0] == "model: 'org/m' -> 'org/other'"


def test_loaded_hub_commit_reads_the_cache_transformers_wrote(tmp_path, monkeypatch):
    """After a load, the revision -> commit mapping is in the Hub cache (refs/); it is read without the network."""
    from huggingface_hub import constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--org--m"
    (repo / "refs").mkdir(parents=True)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    assert provenance.loaded_hub_commit("org/m", None) == commit
    assert provenance.loaded_hub_commit("org/m", commit) == commit
    assert provenance.loaded_hub_commit("org/m", "dev") is None  # never loaded at that revision
