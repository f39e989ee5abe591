"""Training data: the LLaVA JSON loader, HF messages datasets, answer-only labels for any chat template, the length
and image checks. Real processors (tiny, built in code), real datasets; nothing is mocked."""

from __future__ import annotations

import json
import os

import pytest
import torch

from llava_normaligned.trainer.collator import IGNORE_INDEX, ImageDecodeError, LlavaTrainingCollator
from llava_normaligned.trainer.data import (
    DataError,
    load_llava_json,
    load_messages_dataset,
    with_decode,
)
from llava_normaligned.trainer.masking import has_generation_markers
from llava_normaligned.trainer.preprocess import prepare_dataset
from tests.support.training import write_llava_dataset


def _write(path, rows):
    with open(path, "w") as handle:
        json.dump(rows, handle)
    return str(path)


@pytest.fixture(scope="module")
def dataset_files(tmp_path_factory):
    return write_llava_dataset(tmp_path_factory.mktemp("llava_json"), n_rows=6, text_only=1)


# ------------------------------------------------------------------------------------------------------ loader


def test_llava_json_multi_turn_text_only_and_image_placement(dataset_files, tmp_path):
    path, images = dataset_files
    extra = _write(tmp_path / "extra.json", [
        {"id": "tail-tag", "image": "1.png",
         "conversations": [{"from": "gpt", "value": "dropped lead"}, {"from": "human", "value": "colour?\n<image>"},
                           {"from": "gpt", "value": "green"}]},
    ])
    dataset, report = load_llava_json(f"{path},{extra}", images, return_report=True)
    assert len(dataset) == 8 and report.rows_kept == 8 and report.text_only_rows == 1
    assert report.leading_assistant_turns_dropped == 1  # as LLaVA's preprocess does
    first = dataset[0]
    assert first["id"] == "img-0" and len(first["images"]) == 1 and first["images"][0].size == (32, 32)
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "user", "assistant"]  # multi-turn kept
    assert "<image>" not in first["messages"][0]["content"]
    text_only = dataset[6]
    assert text_only["id"] == "text-0" and text_only["images"] == []
    assert dataset[7]["messages"][0] == {"role": "user", "content": "colour?"}  # tag removed, image goes first


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "a", "conversations": [{"from": "human", "value": "hi"}]}, "no assistant turn"),
        ({"id": "b", "conversations": [{"from": "robot", "value": "hi"}]}, "unknown 'from'"),
        ({"id": "c", "conversations": []}, "non-empty list"),
        ({"id": "d", "conversations": [{"from": "human", "value": "<image> hi"}, {"from": "gpt", "value": "x"}]},
         "has no image"),
        ({"id": "e", "image": "0.png", "conversations": [{"from": "human", "value": "<image><image>"},
                                                           {"from": "gpt", "value": "x"}]}, "2 <image> tag(s)"),
    ],
)
def test_llava_json_bad_rows_are_named_or_skipped(dataset_files, tmp_path, row, message):
    _, images = dataset_files
    good = {"id": "ok", "image": "0.png", "conversations": [{"from": "human", "value": "<image>\nq"},
                                                            {"from": "gpt", "value": "a"}]}
    path = _write(tmp_path / "rows.json", [good, row])
    with pytest.raises(DataError) as err:
        load_llava_json(path, images)
    assert message in str(err.value) and f"id {row['id']!r}" in str(err.value) and "rows.json row 1" in str(err.value)
    dataset, report = load_llava_json(path, images, on_bad_row="skip", return_report=True)
    assert len(dataset) == 1 and report.bad_rows_skipped == 1 and report.rows_read == 2


def test_missing_and_unreadable_images_name_the_row_or_are_skipped(dataset_files, tmp_path):
    _, images = dataset_files
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not an image")
    turns = [{"from": "human", "value": "<image>\nq"}, {"from": "gpt", "value": "a"}]
    path = _write(tmp_path / "rows.json", [
        {"id": "fine", "image": os.path.join(images, "0.png"), "conversations": turns},
        {"id": "gone", "image": "missing.png", "conversations": turns},
        {"id": "junk", "image": str(broken), "conversations": turns},
    ])
    with pytest.raises(DataError) as err:
        load_llava_json(path, images)
    text = str(err.value)
    assert "2 row(s)" in text and "'gone'" in text and "missing.png: file not found" in text
    assert "'junk'" in text and "unreadable" in text
    dataset, report = load_llava_json(path, images, on_bad_image="skip", return_report=True)
    assert dataset["id"] == ["fine"] and report.bad_images_skipped == 2
    # "exists" does not open files: the junk file passes up front (the collator names it later)
    dataset = load_llava_json(path, images, check_images="exists", on_bad_image="skip")
    assert dataset["id"] == ["fine", "junk"]


def test_messages_dataset_saved_and_parquet(dataset_files, tmp_path):
    path, images = dataset_files
    dataset = load_llava_json(path, images)
    dataset.save_to_disk(str(tmp_path / "saved"))
    os.makedirs(tmp_path / "pq")
    dataset.to_parquet(str(tmp_path / "pq" / "train.parquet"))
    for source in (tmp_path / "saved", tmp_path / "pq"):
        loaded, report = load_messages_dataset(str(source), return_report=True)
        assert loaded["id"] == dataset["id"] and report.text_only_rows == 1
        assert loaded[1]["messages"] == dataset[1]["messages"] and loaded[1]["images"][0].size == (32, 32)


def test_messages_dataset_with_image_parts(tmp_path):
    from datasets import Dataset
    from PIL import Image

    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "text": None},
                                                       {"type": "text", "text": "what?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "red", }]}],
             "images": [Image.new("RGB", (8, 8), "red")]},
            {"messages": [{"role": "user", "content": [{"type": "image", "text": None},
                                                       {"type": "image", "text": None}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "x"}]}],
             "images": [Image.new("RGB", (8, 8), "red")]}]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "parts"))
    with pytest.raises(DataError, match="2 image part"):
        load_messages_dataset(str(tmp_path / "parts"), return_report=True)
    loaded, report = load_messages_dataset(str(tmp_path / "parts"), on_bad_row="skip", return_report=True)
    assert len(loaded) == 1 and report.bad_rows_skipped == 1
    assert loaded[0]["messages"] == [{"role": "user", "content": "what?"}, {"role": "assistant", "content": "red"}]


def test_single_image_column_moves_as_stored(tmp_path):
    """A dataset with one ``image`` column: the images reach ``images`` as stored, never decoded while loading, so
    an unreadable one is named by the image check (or skipped), not a crash inside ``datasets.map``."""
    import io

    from datasets import Dataset, Features, Image, List, Value
    from PIL import Image as PILImage

    buffer = io.BytesIO()
    PILImage.new("RGB", (16, 16), (200, 30, 30)).save(buffer, format="JPEG", quality=75)
    jpeg = buffer.getvalue()
    turn = [{"role": "user", "content": "colour?"}, {"role": "assistant", "content": "red"}]
    features = Features({"id": Value("string"), "messages": List({"role": Value("string"), "content": Value("string")}),
                         "image": Image()})
    Dataset.from_dict({"id": ["good", "text", "broken"], "messages": [turn] * 3,
                       "image": [{"bytes": jpeg, "path": None}, None, {"bytes": b"not an image", "path": None}]},
                      features=features).save_to_disk(str(tmp_path / "single"))
    with pytest.raises(DataError, match=r"id 'broken'.*unreadable"):
        load_messages_dataset(str(tmp_path / "single"))
    loaded, report = load_messages_dataset(str(tmp_path / "single"), on_bad_image="skip", return_report=True)
    assert loaded["id"] == ["good", "text"] and report.bad_images_skipped == 1 and report.text_only_rows == 1
    stored = with_decode(loaded, "images", False)  # the same Arrow data, read undecoded
    # a row without an image holds a null list laid over the same buffers (nothing was copied)
    assert stored[0]["images"][0]["bytes"] == jpeg and stored[1]["images"] is None
    assert loaded[0]["images"][0].size == (16, 16)  # decodes on access, as TRL expects


# ---------------------------------------------------------------------------------------- answer-only labels


def _no_markers(template: str) -> str:
    stripped = template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    assert not has_generation_markers(stripped)
    return stripped


@pytest.mark.parametrize("markers", [True, False], ids=["generation-markers", "no-markers"])
def test_labels_keep_only_answers(tiny_processor, dataset_files, markers):
    path, images = dataset_files
    dataset = load_llava_json(path, images)
    template = None if markers else _no_markers(tiny_processor.chat_template)
    prepared, report = prepare_dataset(dataset, tiny_processor, max_length=128, chat_template=template)
    assert report.masking == ("generation-markers" if markers else "placeholder-rendering")
    batch = LlavaTrainingCollator(tiny_processor, max_length=128)([prepared[i] for i in (0, 1, 6)])
    tok = tiny_processor.tokenizer
    labels, ids = batch["labels"], batch["input_ids"]
    image_id = tiny_processor.image_token_id
    assert (ids == image_id).sum() == 2 * 16  # two rows with an image, 16 tokens each
    assert not ((labels == image_id).any())  # image tokens never in the labels
    trained = [tok.decode(ids[b][labels[b] != IGNORE_INDEX]) for b in range(3)]
    # every assistant turn of the multi-turn row, with the end-of-turn token; nothing of the prompts
    assert trained == ["red<|im_end|>no<|im_end|>", "green<|im_end|>", "one<|im_end|>"]
    # labels are the input ids where trained (the model shifts them itself)
    kept = labels != IGNORE_INDEX
    assert torch.equal(labels[kept], ids[kept])
    assert batch["pixel_values"].shape == (2, 3, 32, 32)


def test_both_masking_methods_agree_on_a_chatml_template(tiny_processor, dataset_files):
    path, images = dataset_files
    dataset = load_llava_json(path, images)
    with_markers, _ = prepare_dataset(dataset, tiny_processor, max_length=None)
    without, _ = prepare_dataset(dataset, tiny_processor, max_length=None,
                                 chat_template=_no_markers(tiny_processor.chat_template))
    assert with_markers["rendered"] == without["rendered"]
    assert with_markers["spans"] == without["spans"]


def test_template_that_renders_the_last_turn_differently_is_located(tiny_processor, dataset_files):
    path, images = dataset_files
    dataset = load_llava_json(path, images).select([0])
    # renders the last message differently from the same message followed by more turns (a prefix of the
    # conversation is not a prefix of its rendering): the answers are still found by position
    odd = _no_markers(tiny_processor.chat_template).replace(
        "{{ '<|im_start|>assistant\n' }}",
        "{{ '<|im_start|>assistant' + ('-last' if loop.last else '') + '\n' }}",
        1,  # the turns, not the generation prompt
    )
    assert odd != _no_markers(tiny_processor.chat_template)
    prepared, _ = prepare_dataset(dataset, tiny_processor, max_length=None, chat_template=odd)
    text = prepared[0]["rendered"]
    assert "<|im_start|>assistant-last\n" in text
    assert [text[s:e] for s, e in prepared[0]["spans"]] == ["red<|im_end|>", "no<|im_end|>"]


# --------------------------------------------------------------------------------------- length and images


def test_rows_longer_than_max_length_are_dropped_or_refused_never_cut(tiny_processor, dataset_files):
    path, images = dataset_files
    dataset = load_llava_json(path, images)
    full, _ = prepare_dataset(dataset, tiny_processor, max_length=None)
    lengths = full["num_tokens"]
    batch = LlavaTrainingCollator(tiny_processor)([full[i] for i in range(len(full))])
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths  # the up-front count is the real length
    limit = sorted(lengths)[len(lengths) // 2]
    kept, report = prepare_dataset(dataset, tiny_processor, max_length=limit)
    assert report.too_long_dropped == sum(n > limit for n in lengths) > 0
    assert max(kept["num_tokens"]) <= limit and len(kept) == len(dataset) - report.too_long_dropped
    with pytest.raises(ValueError, match="never truncated") as err:
        prepare_dataset(dataset, tiny_processor, max_length=limit, on_too_long="error")
    assert "img-0" in str(err.value)
    # the collator's guard names a row that slipped through
    with pytest.raises(ValueError, match="img-0"):
        LlavaTrainingCollator(tiny_processor, max_length=limit)([full[0]])


def test_image_that_fails_to_decode_in_training(tiny_processor, dataset_files, tmp_path):
    _, images = dataset_files
    broken = tmp_path / "late.png"
    broken.write_bytes(b"\x89PNG broken")
    rows = [{"id": "late", "image": str(broken), "conversations": [{"from": "human", "value": "<image>\nq"},
                                                                  {"from": "gpt", "value": "a"}]},
            {"id": "ok", "image": os.path.join(images, "0.png"),
             "conversations": [{"from": "human", "value": "<image>\nq"}, {"from": "gpt", "value": "b"}]}]
    dataset = load_llava_json(_write(tmp_path / "late.json", rows), None, check_images="exists")
    prepared, _ = prepare_dataset(dataset, tiny_processor, max_length=None)
    with pytest.raises(ImageDecodeError, match="'late'.*late.png"):
        LlavaTrainingCollator(tiny_processor)([prepared[0], prepared[1]])
    collator = LlavaTrainingCollator(tiny_processor, on_bad_image="skip", report_skips=True)
    batch = collator([prepared[0], prepared[1]])
    assert int(batch["skipped_rows"]) == 1 and collator.skipped == 1
    assert (batch["labels"][0] == IGNORE_INDEX).all()  # the bad row trains nothing
    assert (batch["labels"][1] != IGNORE_INDEX).any()
    assert batch["pixel_values"].shape[0] == 2  # the batch keeps its shape


@pytest.mark.parametrize("kind", ["siglip", "clip"])
def test_pixel_table_is_the_image_processors_arithmetic_bit_for_bit(tiny_processor, dataset_files, kind):
    import numpy as np
    from PIL import Image
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    from llava_normaligned.trainer.collator import PixelTable

    image_processor = (SiglipImageProcessorPil(size={"height": 40, "width": 40}) if kind == "siglip" else
                       CLIPImageProcessorPil(size={"shortest_edge": 40}, crop_size={"height": 36, "width": 36}))
    table = PixelTable.of(image_processor)
    assert table is not None
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in ((50, 70), (64, 48))]
    expected = image_processor(images, return_tensors="np")["pixel_values"]
    raw = image_processor(images, do_rescale=False, do_normalize=False, return_tensors="np")["pixel_values"]
    assert raw.dtype == np.uint8
    assert np.array_equal(table(raw), expected) and table(raw).dtype == expected.dtype == np.float32
    # where the lookup would not be the processor's own arithmetic, there is none
    assert PixelTable.of(SiglipImageProcessorPil(do_normalize=False)) is None

    # through the collator: the same pixel values as the processor's own path
    path, images_dir = dataset_files
    prepared, _ = prepare_dataset(load_llava_json(path, images_dir), tiny_processor, max_length=None)
    rows = [prepared[i] for i in range(3)]
    collator = LlavaTrainingCollator(tiny_processor)
    assert collator.pixel_table is not None
    plain = LlavaTrainingCollator(tiny_processor)
    plain.pixel_table = None
    assert torch.equal(collator(rows)["pixel_values"], plain(rows)["pixel_values"])
