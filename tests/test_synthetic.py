"""The synthetic VQA dataset (``make-data``): deterministic, balanced, valid LLaVA JSON, held-out test split."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict

import pytest
from PIL import Image

from llava_normaligned.commands.make_data import main as make_data_main
from llava_normaligned.demo import synthetic

SMALL = {"train_per_template": 32, "test_per_template": 16}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return synthetic.make_dataset(str(tmp_path_factory.mktemp("syn") / "data"), synthetic.SyntheticSpec(**SMALL),
                                  progress=False)


def _records(path):
    with open(path) as handle:
        return json.load(handle)


def _digest_tree(root):
    digests = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                digests[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return digests


def test_same_seed_same_files_other_seed_other_files(dataset, tmp_path):
    again = synthetic.make_dataset(str(tmp_path / "again"), synthetic.SyntheticSpec(**SMALL), progress=False)
    other = synthetic.make_dataset(str(tmp_path / "other"), synthetic.SyntheticSpec(**SMALL, seed=1), progress=False)
    first = _digest_tree(dataset.root)
    assert len(first) == 5 * 32 + 5 * 16 + 4  # images + pretrain/instruct/test/dataset_info
    assert _digest_tree(again.root) == first
    assert _digest_tree(other.root) != first


def _best_text_only_accuracy(records):
    """Computed here, independently of the module: a model that sees only the question answers each distinct question
    text with its most frequent answer."""
    answers = defaultdict(Counter)
    template = {}
    for record in records:
        question = record["conversations"][0]["value"]
        answers[question][record["conversations"][1]["value"]] += 1
        template[question] = record["template"]
    hits, totals = Counter(), Counter()
    for question, counts in answers.items():
        hits[template[question]] += max(counts.values())
        totals[template[question]] += sum(counts.values())
    return {name: hits[name] / totals[name] for name in totals}


@pytest.mark.parametrize("split", ["instruct", "test"])
def test_answers_balanced_so_text_alone_scores_chance(dataset, split):
    records = _records(getattr(dataset, split))
    best = _best_text_only_accuracy(records)
    assert set(best) == {t.name for t in synthetic.TEMPLATES}
    for template in synthetic.TEMPLATES:
        assert best[template.name] == pytest.approx(1 / len(template.answers)), template.name
        rows = [r for r in records if r["template"] == template.name]
        assert {r["conversations"][1]["value"].lower() for r in rows} == set(template.answers)
    assert synthetic.text_only_accuracy(records) == pytest.approx(best)


def test_llava_json_schema(dataset):
    for split, prompt in (("pretrain", synthetic.CAPTION_PROMPT), ("instruct", None), ("test", None)):
        records = _records(getattr(dataset, split))
        assert len(records) == (5 * 16 if split == "test" else 5 * 32)
        assert len({r["id"] for r in records}) == len(records)
        for record in records:
            assert isinstance(record["id"], str) and isinstance(record["image"], str)
            human, gpt = record["conversations"]
            assert human["from"] == "human" and human["value"].startswith("<image>\n")
            assert gpt["from"] == "gpt" and gpt["value"] and "<image>" not in gpt["value"]
            if prompt:
                assert human["value"] == f"<image>\n{prompt}" and gpt["value"] == record["scene"]
            assert os.path.isfile(os.path.join(dataset.root, record["image"]))


def test_loadable_by_the_training_loader(dataset):
    from llava_normaligned.trainer.data import load_llava_json

    for split in ("pretrain", "instruct", "test"):
        loaded = load_llava_json(getattr(dataset, split), dataset.root)
        records = _records(getattr(dataset, split))
        assert len(loaded) == len(records)
        row = loaded[0]
        assert [m["role"] for m in row["messages"]] == ["user", "assistant"]
        assert "<image>" not in row["messages"][0]["content"]
        assert row["messages"][1]["content"] == records[0]["conversations"][1]["value"]
        assert len(row["images"]) == 1 and row["images"][0].size == (32, 32)


def test_test_split_is_held_out(dataset):
    train = _records(dataset.instruct)
    test = _records(dataset.test)
    train_scenes = {r["scene"] for r in train}
    test_scenes = {r["scene"] for r in test}
    assert train_scenes.isdisjoint(test_scenes)
    assert {r["image"] for r in train}.isdisjoint({r["image"] for r in test})
    # captions (stage 1) are about the training images only
    assert {r["image"] for r in _records(dataset.pretrain)} == {r["image"] for r in train}


QUADRANTS = {"top left": (0, 0), "top right": (0, 1), "bottom left": (1, 0), "bottom right": (1, 1)}


def _occupied_cells(image):
    """{(row, col): set of colours} from the pixels: which grid cells hold a shape, and in which colour."""
    size = image.size[0]
    cells = defaultdict(set)
    for y in range(size):
        for x in range(size):
            pixel = image.getpixel((x, y))
            for name, rgb in synthetic.COLOURS.items():
                if pixel == rgb:
                    cells[(y * 2 // size, x * 2 // size)].add(name)
    return cells


def test_images_show_what_the_answers_say(dataset):
    """Read the answer off the pixels, for every test question: the image, not the text, carries it."""
    for record in _records(dataset.test):
        with Image.open(os.path.join(dataset.root, record["image"])) as image:
            cells = _occupied_cells(image.convert("RGB"))
        answer = record["conversations"][1]["value"].lower()
        question = record["conversations"][0]["value"]
        if record["template"] == "count":
            assert len(cells) == synthetic.NUMBER_WORDS.index(answer)
        elif record["template"] == "colour":
            assert list(cells.values()) == [{answer}]
        elif record["template"] == "position":
            assert list(cells) == [QUADRANTS[answer]]
        elif record["template"] == "colour_at":
            place = next(p for p in QUADRANTS if p in question)
            assert cells[QUADRANTS[place]] == {answer}
        elif record["template"] == "shape":
            assert len(cells) == 1


def test_blank_image_is_the_background():
    image = synthetic.blank_image(32)
    assert image.size == (32, 32) and set(image.getdata()) == {synthetic.BACKGROUND}


def test_cli_writes_the_dataset_and_refuses_a_used_folder(tmp_path, capsys):
    out = tmp_path / "shapes"
    assert make_data_main(["--output-dir", str(out), "--train-per-template", "16", "--test-per-template", "16",
                           "--no-progress"]) == 0
    assert "instruct.json" in capsys.readouterr().out
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["rows"] == {"pretrain": 80, "instruct": 80, "test": 80}
    before = _digest_tree(out)
    assert make_data_main(["--output-dir", str(out), "--no-progress"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert _digest_tree(out) == before  # nothing overwritten
    assert [p.name for p in tmp_path.iterdir()] == ["shapes"]  # no staging folder left behind


@pytest.mark.parametrize("field,value", [("train_per_template", 24), ("test_per_template", 0), ("image_size", 31)])
def test_bad_spec_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        synthetic.SyntheticSpec(**{field: value})
