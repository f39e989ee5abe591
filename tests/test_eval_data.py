"""Local copies in each benchmark's own schema load through --data-dir; the prompts are the community's; bad or
missing data is a clear error naming the task and what was expected."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llava_normaligned.demo.synthetic import TEMPLATES as SYNTHETIC_TEMPLATES
from llava_normaligned.evaluation.batches import build_requests
from llava_normaligned.evaluation.data import EvalDataError, load_split
from llava_normaligned.evaluation.tasks import TASKS
from tests.support import eval_fixtures
from tests.support.messages import error_line


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return eval_fixtures.write_all(str(tmp_path_factory.mktemp("bench")))


def first_request(data_dir, task):
    split = load_split(TASKS[task], data_dir)
    ((_, request, error),) = list(build_requests(TASKS[task], split, [0]))
    assert error is None, error
    return split, request


@pytest.mark.parametrize("task", list(TASKS))
def test_every_task_loads_from_its_local_copy(data_dir, task):
    split = load_split(TASKS[task], data_dir)
    expected = eval_fixtures.synthetic_test_rows() if task == "synthetic" else len(eval_fixtures.ROWS[task]())
    assert (split.source, len(split)) == ("local", expected)
    built = list(build_requests(TASKS[task], split, range(len(split))))
    assert all(error is None for _, _, error in built), built
    if TASKS[task].kind == "generate":  # images arrive as RGB PIL images, whatever the copy's layout
        assert all(r.images and r.images[0].mode == "RGB" for _, r, _ in built)
    assert len(load_split(TASKS[task], data_dir, limit=2)) == 2


def test_prompts_are_lmms_eval_prompts(data_dir):
    _, pope = first_request(data_dir, "pope")
    assert pope.prompt == "Is there a cat in the image?\nAnswer the question using a single word or phrase."
    assert (pope.gold, pope.meta) == ("yes", {"category": "adversarial"})

    split, _ = first_request(data_dir, "mmbench_en_dev")
    ((_, hinted, _),) = list(build_requests(TASKS["mmbench_en_dev"], split, [1]))
    assert hinted.prompt == (
        "Look at the centre. Which shape is shown? There are several options:\nA. circle\nB. square\nC. triangle\n"
        "D. cross\nAnswer with the option's letter from the given choices directly."
    )
    ((_, copy, _),) = list(build_requests(TASKS["mmbench_en_dev"], split, [2]))
    assert copy.meta["circular_group"] == 0 and "D." not in copy.prompt  # "nan" options and hints are dropped

    _, sqa = first_request(data_dir, "scienceqa_img")
    assert sqa.prompt == ("Which object is red?\nA. ball\nB. leaf\n"
                          "Answer with the option's letter from the given choices directly.")
    assert sqa.gold == "A"

    _, mmstar = first_request(data_dir, "mmstar")
    assert mmstar.prompt.endswith("D: grey\nAnswer with the option's letter from the given choices directly")

    _, seed = first_request(data_dir, "seedbench_2_plus")
    assert seed.prompt.startswith("What is the highest bar's label?\nA. 2019\nB. 2020") and seed.meta == {"category": "Chart"}

    _, hella = first_request(data_dir, "hellaswag")
    assert hella.context == "Roof shingle removal: A man is sitting on a roof. He"
    assert hella.continuations[3] == " starts pulling up roofing on a roof." and hella.gold == 3

    _, mmlu = first_request(data_dir, "mmlu")
    assert mmlu.context == ("The following are multiple choice questions (with answers) about elementary mathematics."
                            "\n\nWhat is 2 + 2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:")
    assert mmlu.continuations == [" A", " B", " C", " D"] and mmlu.meta["category"] == "stem"

    _, synthetic = first_request(data_dir, "synthetic")
    assert "<image>" not in synthetic.prompt and synthetic.meta["category"] in {t.name for t in SYNTHETIC_TEMPLATES}


def test_make_data_folder_works_as_data_dir(data_dir):
    # `make-data --output-dir ./shapes` then `eval --tasks synthetic --data-dir ./shapes`
    split = load_split(TASKS["synthetic"], os.path.join(data_dir, "synthetic"))
    assert len(split) == eval_fixtures.synthetic_test_rows()


def test_wrong_schema_names_missing_columns(tmp_path):
    rows = [{k: v for k, v in row.items() if k != "category"} for row in eval_fixtures.pope_rows()]
    eval_fixtures.write_copy("pope", str(tmp_path), rows)
    with pytest.raises(EvalDataError) as info:
        load_split(TASKS["pope"], str(tmp_path))
    message = str(info.value)
    assert "task 'pope'" in message and "missing columns ['category']" in message and "lmms-lab/POPE" in message


def test_folder_without_data_is_a_clear_error(tmp_path):
    (tmp_path / "ai2d").mkdir()
    (tmp_path / "ai2d" / "notes.txt").write_text("not a dataset")
    with pytest.raises(EvalDataError, match=r"task 'ai2d': .* holds neither parquet files nor a save_to_disk folder"):
        load_split(TASKS["ai2d"], str(tmp_path))


def test_other_splits_files_are_never_read_for_the_split(tmp_path):
    """A Hub download with train and validation files but no test file is an error listing them, not a test score
    over train + validation rows; a folder's only parquet file, whatever its name, is the split."""
    rows = eval_fixtures.to_dataset(eval_fixtures.ai2d_rows())
    rows.to_parquet(str(tmp_path / "ai2d" / "data" / "train-00000-of-00001.parquet"))
    rows.select([0]).to_parquet(str(tmp_path / "ai2d" / "data" / "validation-00000-of-00001.parquet"))
    with pytest.raises(EvalDataError) as info:
        load_split(TASKS["ai2d"], str(tmp_path))
    message = str(info.value)
    assert "task 'ai2d'" in message and "none is named after the split 'test'" in message
    assert "data/train-00000-of-00001.parquet" in message and "data/validation-00000-of-00001.parquet" in message

    os.remove(tmp_path / "ai2d" / "data" / "validation-00000-of-00001.parquet")
    assert len(load_split(TASKS["ai2d"], str(tmp_path))) == 2


def test_dataset_dict_without_the_split(tmp_path):
    from datasets import DatasetDict

    DatasetDict({"train": eval_fixtures.to_dataset(eval_fixtures.ai2d_rows())}).save_to_disk(str(tmp_path / "ai2d"))
    with pytest.raises(EvalDataError, match=r"task 'ai2d': the DatasetDict .* has splits \['train'\], not 'test'"):
        load_split(TASKS["ai2d"], str(tmp_path))


def test_synthetic_needs_a_local_copy(tmp_path):
    with pytest.raises(EvalDataError, match=r"task 'synthetic' has no Hub copy.*make-data"):
        load_split(TASKS["synthetic"], str(tmp_path))


def test_no_network_and_no_local_copy_is_a_clear_error(tmp_path):
    """A real subprocess with the Hub unreachable (offline mode, empty cache): the error names the task, the Hub
    dataset and the --data-dir way out, and comes before the model is loaded."""
    eval_fixtures.write_copy("pope", str(tmp_path / "data"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    result = subprocess.run(
        [sys.executable, "-m", "llava_normaligned.cli", "eval", eval_fixtures.trap_model(tmp_path / "model"),
         "--tasks", "pope,mmstar",
         "--data-dir", str(tmp_path / "data"), "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    refused = error_line(result.stderr, "eval")
    assert refused.startswith("task 'mmstar': ") and "no local copy" in refused, refused
    assert str(tmp_path / "data" / "mmstar") in refused, refused  # where the copy was looked for
    assert "Lin-Chen/MMStar:val" in refused and "from the Hub" in refused, refused
    assert "--data-dir DIR" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing written: the run never started


def test_whole_hub_repo_download_reads_the_config_folder_only(tmp_path):
    """A `huggingface-cli download` of cais/mmlu holds all/ and one folder per subject: only all/ is the split."""
    from tests.support.eval_fixtures import to_dataset

    root = tmp_path / "mmlu"
    to_dataset(eval_fixtures.mmlu_rows()).to_parquet(str(root / "all" / "test-00000-of-00001.parquet"))
    decoy = [{**eval_fixtures.mmlu_rows()[0], "subject": "abstract_algebra"}] * 5
    to_dataset(decoy).to_parquet(str(root / "abstract_algebra" / "test-00000-of-00001.parquet"))
    split = load_split(TASKS["mmlu"], str(tmp_path))
    assert len(split) == 2 and split.rows["subject"] == ["elementary_mathematics", "philosophy"]


def test_save_data_writes_copies_an_offline_machine_can_read(data_dir, tmp_path, capsys):
    from llava_normaligned.commands.eval import main

    saved = str(tmp_path / "saved")
    assert main(["--tasks", "pope,mmlu,synthetic", "--data-dir", data_dir, "--save-data", saved]) == 0
    assert "evaluate offline with --data-dir" in capsys.readouterr().out
    assert sorted(os.listdir(saved)) == ["mmlu", "pope"]  # synthetic is local already: not copied
    pope = load_split(TASKS["pope"], saved)
    assert len(pope) == 6 and pope.rows.features["image"].decode is False  # decoded per sample, when asked
    ((_, request, error),) = list(build_requests(TASKS["pope"], pope, [0]))
    assert error is None and request.images[0].size == (24, 24)
    # saving over an existing copy is refused, naming the task
    assert main(["--tasks", "pope", "--data-dir", data_dir, "--save-data", saved]) == 2
    assert "task 'pope'" in capsys.readouterr().err
