"""What a new user meets on a first run: an empty answer is said to be one, a bad-row or bad-image message names the
flag of the command that printed it (and that command has it), and a malformed row is found before the model
loads."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from PIL import Image

from llava_normaligned.commands.generate import main as generate_main
from llava_normaligned.trainer.data import DataError, load_llava_json
from llava_normaligned.commands.rl_data import main as rl_data_main
from llava_normaligned.commands.train import main as train_main
from tests.support.training import write_llava_dataset

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def ends_at_once(tiny_model_dir, tmp_path):
    """The tiny model with a generation config that suppresses every token but its end of turn: each answer ends
    at its first token, as a briefly trained model's often does."""
    from transformers import AutoTokenizer, GenerationConfig

    folder = shutil.copytree(tiny_model_dir, tmp_path / "ends-at-once")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    config = GenerationConfig.from_pretrained(folder)
    stop = set(config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id])
    config.suppress_tokens = [i for i in range(len(tokenizer)) if i not in stop]
    config.save_pretrained(folder)
    Image.new("RGB", (32, 32), "red").save(tmp_path / "red.png")
    return str(folder), str(tmp_path / "red.png")


def test_generate_says_an_answer_is_empty(ends_at_once, capsys):
    model, image = ends_at_once
    assert generate_main([model, "--image", image, "--prompt", "What colour?", "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == ""  # nothing was generated ...
    assert "empty answer" in err and "ended the answer at once" in err  # ... and the command says so


def test_generate_batch_counts_the_empty_answers(ends_at_once, tmp_path, capsys):
    model, image = ends_at_once
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p, "images": [image]}) + "\n" for p in ("a?", "b?")))
    out_file = tmp_path / "answers.jsonl"
    assert generate_main([model, "--prompts-file", str(prompts), "--output", str(out_file), "--quiet",
                          "--max-new-tokens", "4"]) == 0
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["", ""]  # the rows keep their format
    err = capsys.readouterr().err
    assert "2 of 2 answers are empty" in err  # said even with --quiet


def test_generate_is_silent_about_answers_that_have_text(tiny_model_dir, tmp_path, capsys):
    """The same model made to say something (every special token suppressed): an answer, and no note."""
    from transformers import AutoTokenizer, GenerationConfig

    folder = shutil.copytree(tiny_model_dir, tmp_path / "says-something")
    config = GenerationConfig.from_pretrained(folder)
    config.suppress_tokens = sorted(AutoTokenizer.from_pretrained(folder).all_special_ids)
    config.save_pretrained(folder)
    Image.new("RGB", (32, 32), "red").save(tmp_path / "red.png")
    assert generate_main([str(folder), "--image", str(tmp_path / "red.png"), "--prompt", "What colour?",
                          "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() and "empty answer" not in err


@pytest.fixture
def malformed(tmp_path):
    path, images = write_llava_dataset(tmp_path / "data", n_rows=6, text_only=0)
    with open(path) as handle:
        rows = json.load(handle)
    del rows[3]["conversations"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(rows))
    return str(bad), images


def test_the_library_names_the_keyword_and_a_command_its_flag(malformed):
    path, images = malformed
    with pytest.raises(DataError) as caught:
        load_llava_json(path, images)
    assert "on_bad_row='skip'" in str(caught.value) and "--on-bad-row" not in str(caught.value)
    flagged = str(caught.value.as_flags())
    assert "--on-bad-row skip" in flagged and "on_bad_row=" not in flagged
    assert "img-3" in flagged and len(flagged.splitlines()) == 1  # one row, one line


def _bad_row(tmp_path):
    """6 rows, one without ``conversations`` (``img-3``)."""
    path, images = write_llava_dataset(tmp_path / "data", n_rows=6, text_only=0)
    with open(path) as handle:
        rows = json.load(handle)
    del rows[3]["conversations"]
    with open(path, "w") as handle:
        json.dump(rows, handle)
    return path, images


def _bad_image(tmp_path):
    """4 rows, the image of one (``2.png``) missing."""
    path, images = write_llava_dataset(tmp_path / "data", n_rows=4, text_only=0)
    (tmp_path / "data" / "images" / "2.png").unlink()
    return path, images


@pytest.mark.parametrize(("make", "flag", "named", "kept", "counted"), [
    (_bad_row, "--on-bad-row", "img-3", "5 rows from 5", "1 malformed rows skipped"),
    (_bad_image, "--on-bad-image", "2.png", "3 rows from 3", "1 rows with a missing or unreadable image skipped"),
], ids=["bad-row", "bad-image"])
def test_rl_data_has_the_flag_its_message_names(make, flag, named, kept, counted, tmp_path, capsys):
    path, images = make(tmp_path)
    common = ["--data-path", path, "--image-folder", images, "--format", "grpo"]
    assert rl_data_main([*common, "--output-dir", str(tmp_path / "refused")]) == 2
    err = capsys.readouterr().err
    keyword = flag.removeprefix("--").replace("-", "_") + "="
    assert named in err and f"{flag} skip" in err and keyword not in err
    assert rl_data_main([*common, "--output-dir", str(tmp_path / "kept"), flag, "skip"]) == 0
    out = capsys.readouterr().out
    assert kept in out and counted in out  # the bad row dropped and counted, the others written


def test_train_finds_a_malformed_row_before_the_model_loads(malformed, tiny_model_dir, tmp_path, capsys, caplog):
    path, images = malformed
    caplog.set_level(logging.INFO)
    code = train_main(["--stage", "2", "--model", tiny_model_dir, "--data-path", path, "--image-folder", images,
                       "--output-dir", str(tmp_path / "out"), "--max_steps", "1", "--report_to", "none"])
    assert code == 2
    err = capsys.readouterr().err
    assert "img-3" in err and "--on-bad-row skip" in err and "on_bad_row=" not in err
    loaded = [r for r in caplog.records if r.name == "llava_normaligned.loading" and "loaded" in r.getMessage()]
    assert loaded == []  # the model was never loaded
    assert not (tmp_path / "out").exists()
