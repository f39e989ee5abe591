"""Records never name the machine: the one rule (``llava_normaligned.local_paths``), every record of a trained,
diagnosed and evaluated folder written by the real commands, and push's refusal of a folder whose records still name
a local path."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from llava_normaligned.cli import main as cli_main
from llava_normaligned.hub_cards.card import CardOptions, render_card
from llava_normaligned.commands.push import main as push_main
from llava_normaligned.hub_cards.push import push
from llava_normaligned.hub_cards.selfcheck import LocalPathError, plan_upload, safetensors_header, self_check
from llava_normaligned.local_paths import hide_local_paths, is_hub_id, local_paths_in, public_name, public_record
from llava_normaligned.trainer.data import default_cache_dir
from tests.support import eval_fixtures
from tests.support.hub_server import HubServer
from tests.support.training import write_llava_dataset

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

ALICE = "hf_" + "aliceTestToken0123456789abcdefghij"[:34]

# Local paths, each as text would hold it, with the name it is published under.
LOCAL = [
    ("/root/.cache/huggingface/datasets/llava_normaligned_prepared/6991.arrow", "6991.arrow"),
    ("/home/alice/runs/llava-na-3b/", "llava-na-3b"),
    ("~/data/train.json", "train.json"),
    ("C:\\Users\\alice\\ckpt", "ckpt"),
    ("D:/runs/ckpt", "ckpt"),
    ("\\\\fileserver\\share\\ckpt", "ckpt"),
    ("file:///home/alice/x.png", "x.png"),
]
# Text that holds no local path.
NOT_LOCAL = [
    "https://huggingface.co/docs/hub/model-cards", "hf://datasets/org/name", "org/llava-na-3b", "gpt2",
    "eval/results.md", "../data/train.json", "w/o Norm and/or w/ GWC", "ratio 1/2, 3 / 4", "</s> <|im_end|>",
    "![norms](diagnostics/norms.png)", "Options: A:\nB: green", "projector/no_decay", "--lr 1e-3",
]


# ------------------------------------------------------------------------------------------------ the rule


@pytest.mark.parametrize("path, name", LOCAL)
def test_a_local_path_is_found_and_published_by_its_own_name(path, name):
    text = f"saved to '{path}' at step 3"
    assert local_paths_in(text) == [path]
    assert hide_local_paths(text) == f"saved to '{name}' at step 3"
    assert local_paths_in(hide_local_paths(text)) == []  # what the writers hide, the self-check no longer finds
    assert public_name(path) == name


@pytest.mark.parametrize("text", NOT_LOCAL)
def test_urls_hub_ids_relative_paths_and_prose_are_not_local_paths(text):
    assert local_paths_in(text) == []
    assert hide_local_paths(text) == text


def test_public_name_keeps_hub_ids_and_names_local_folders_by_their_own_name(tmp_path, monkeypatch):
    assert public_name("org/llava-na-3b") == "org/llava-na-3b" and public_name("gpt2") == "gpt2"
    assert is_hub_id("org/llava-na-3b") and not is_hub_id("/org/x") and not is_hub_id("../x")
    assert public_name(None) is None
    (tmp_path / "runs" / "ckpt").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert public_name("runs/ckpt") == "ckpt"  # it exists here: a folder, not a Hub id
    assert public_name("./runs/ckpt/") == "ckpt" and public_name(tmp_path / "runs") == "runs"
    assert public_name(".") == tmp_path.name


def test_the_home_and_temporary_folders_are_local_paths_even_alone(monkeypatch):
    monkeypatch.setenv("HOME", "/alice-home")
    assert local_paths_in("cd /alice-home; ls") == ["/alice-home"]
    assert local_paths_in("cd /alice-homes /alice-home.d") == []  # other folders: one component alone is prose
    temp = tempfile.gettempdir()
    assert local_paths_in(f"written under {temp}.") == [temp]


def test_known_run_paths_keep_what_follows_them(tmp_path):
    data = str(tmp_path / "bench")
    message = f"FileNotFoundError: [Errno 2] No such file or directory: '{data}/synthetic/images/7.png'"
    hidden = hide_local_paths(message, [data, None, str(tmp_path / "model")])
    assert hidden == "FileNotFoundError: [Errno 2] No such file or directory: 'bench/synthetic/images/7.png'"


def test_public_record_reaches_every_string_keys_included():
    record = {"run": {"argv": ["--model", "/home/alice/m", "--data-path=/data/a/train.json"]},
              "/home/alice/x.json": [Path("/home/alice/y.json"), 3, None], "note": "see https://hf.co/a/b"}
    assert public_record(record) == {"run": {"argv": ["--model", "m", "--data-path=train.json"]},
                                     "x.json": ["y.json", 3, None], "note": "see https://hf.co/a/b"}


# ----------------------------------------------------- a trained, diagnosed, evaluated folder, then push


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)  # the server speaks LFS, not Xet
        with HubServer(tmp_path_factory.mktemp("hub"), tokens={ALICE: "alice"}) as server:
            yield server


@pytest.fixture(scope="module")
def run_folder(tiny_model_dir, tmp_path_factory):
    """`train` (stage 1, two checkpoints on the way), then `diagnose` and `eval` into the output folder, through
    the console entry point, with every input given as an absolute path."""
    root = tmp_path_factory.mktemp("records")
    path, images = write_llava_dataset(str(root / "data"), n_rows=8, text_only=1)
    out = root / "run"
    assert cli_main([
        "train", "--stage", "1", "--model", tiny_model_dir, "--data-path", path, "--image-folder", images,
        "--output-dir", str(out), "--learning_rate", "1e-3", "--max_steps", "2", "--per_device_train_batch_size", "4",
        "--report_to", "none", "--save_strategy", "steps", "--save_steps", "1", "--gradient_checkpointing", "False",
        "--disable_tqdm", "True",
    ]) == 0
    assert cli_main(["diagnose", str(out), "--output-dir", str(out / "diagnostics"), "--max-samples", "2",
                     "--batch-size", "2", "--max-new-tokens", "2", "--no-progress", "--no-plots"]) == 0
    bench = str(root / "bench")
    for task in ("pope", "mmlu"):
        eval_fixtures.write_copy(task, bench)
    assert cli_main(["eval", str(out), "--tasks", "pope,mmlu", "--data-dir", bench, "--limit", "2",
                     "--output-dir", str(out / "eval"), "--max-new-tokens", "2"]) == 0
    return out


def machine_paths(folder: Path) -> list[str]:
    """What must appear in no record: the test's temporary folders, the home folder, the datasets cache."""
    found = {str(folder.parent), str(folder.parent.parent), tempfile.gettempdir(), os.path.expanduser("~"),
             os.path.dirname(default_cache_dir("prepared"))}
    found |= {os.path.realpath(p) for p in found}
    # a home folder that is the root (HOME=/, as in some containers) names no machine: every path starts with it
    return sorted((p for p in found if p.strip(os.sep)), key=len, reverse=True)


def named_paths(data: bytes, needles: list[str]) -> list[str]:
    return [needle for needle in needles if needle.encode() in data]


def test_no_record_of_a_trained_diagnosed_evaluated_folder_names_the_machine(run_folder, tiny_model_dir):
    needles = machine_paths(run_folder)
    plan = plan_upload(run_folder)
    assert {"training_summary.json", "norm_tracking.json", "diagnostics/diagnostics.json", "diagnostics/summary.md",
            "eval/results.json", "eval/results.md", "config.json"} <= set(plan.upload)
    scanned = 0
    for path in sorted(p for p in run_folder.rglob("*") if p.is_file()):
        name = path.relative_to(run_folder).as_posix()
        if path.suffix in (".bin", ".pt", ".pth"):  # the Trainer's pickles (training_args.bin holds output_dir)
            assert name not in plan.upload
            continue
        data = json.dumps(safetensors_header(path)).encode() if path.suffix == ".safetensors" else path.read_bytes()
        assert named_paths(data, needles) == [], name
        scanned += 1
    assert scanned > 40  # the model, the records, both checkpoints, eval/samples.jsonl
    summary = json.loads((run_folder / "training_summary.json").read_text())  # each name kept, as its own name
    model = Path(tiny_model_dir).name
    assert summary["base_model"] == summary["run"]["model"] == model
    assert summary["run"]["argv"][:6] == ["--stage", "1", "--model", model, "--data-path", "train.json"]
    assert summary["data"]["load"]["sources"] == ["train.json"]
    for report, kind in (("load", "loaded"), ("prepare", "prepared")):  # the cache file, by its own name
        assert Path(default_cache_dir(kind), summary["data"][report]["cache_file"]).is_file()
    card = str(render_card(run_folder))
    assert named_paths(card.encode(), needles) == [] and local_paths_in(card) == []


def test_push_publishes_the_folder_then_refuses_it_once_a_record_names_a_local_path(run_folder, hub, tmp_path,
                                                                                     monkeypatch, capsys):
    import huggingface_hub.constants

    folder = Path(shutil.copytree(run_folder, tmp_path / "llava-na-tiny"))
    result = push(folder, "alice/records", token=ALICE, endpoint=hub.url, check_load=False, pin_card=False,
                  options=CardOptions(license="apache-2.0"))
    capsys.readouterr()  # the upload's progress bars
    head = hub.head("alice/records")
    assert head.oid == result.commit and "training_summary.json" in head.files and "eval/results.json" in head.files
    needles = machine_paths(run_folder) + [str(tmp_path)]
    for path, entry in head.files.items():
        assert named_paths(hub.store.blob_path(entry["sha256"]).read_bytes(), needles) == [], path

    # A record with the datasets cache's absolute path, as train wrote it before: refused, nothing uploaded.
    summary = json.loads((folder / "training_summary.json").read_text())
    cache_file = os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "datasets", "x", "0bb1.arrow")
    summary["data"]["prepare"]["cache_file"] = cache_file
    (folder / "training_summary.json").write_text(json.dumps(summary, indent=1))
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # where push_main would upload
    assert push_main([str(folder), "--repo-id", "alice/records", "--token", ALICE, "--skip-load-check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and repr(cache_file) in err[0], err  # the path, as the record holds it
    assert "training_summary.json" in err[0] and "local path" in err[0], err
    assert hub.head("alice/records").oid == head.oid
    with pytest.raises(LocalPathError, match="training_summary.json names the local path"):
        self_check(folder, load=False, tokens=[])


def test_records_published_from_another_folder_are_checked_too(run_folder, tmp_path):
    folder = Path(shutil.copytree(run_folder, tmp_path / "ckpt", ignore=shutil.ignore_patterns("eval")))
    evaluated = Path(shutil.copytree(run_folder / "eval", tmp_path / "eval-run"))
    text = (evaluated / "results.md").read_text()
    (evaluated / "results.md").write_text(text + f"\nData read from {tmp_path / 'bench'}\n")
    with pytest.raises(LocalPathError, match=r"eval-run/results\.md names the local path"):
        push(folder, "alice/elsewhere", token=ALICE, endpoint="http://127.0.0.1:9", check_load=False,
             options=CardOptions(eval_dir=str(evaluated)))


@pytest.mark.parametrize("record, text, refused", [
    ("training_summary.json", {"run": {"argv": ["--output-dir", "C:\\Users\\alice\\run"]}}, True),
    ("diagnostics/summary.md", "Model `/home/alice/runs/llava-na-3b` on 8 images.\n", True),
    ("eval/results.csv", "model,score\n/data/alice/ckpt,0.5\n", True),
    ("eval/results.json", {"question": "Options: A:\nB: green", "see": "https://huggingface.co/a/b"}, False),
    ("diagnostics/summary.md", "| w/o Norm | 1/2 | `eval/norms.png` | org/llava-na-3b |\n", False),
])
def test_the_self_check_refuses_local_paths_in_records_and_only_those(tiny_model_dir, tmp_path, record, text, refused):
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "ckpt"))
    (folder / record).parent.mkdir(exist_ok=True)
    (folder / record).write_text(text if isinstance(text, str) else json.dumps(text))
    if refused:
        with pytest.raises(LocalPathError, match=f"{record} names the local path"):
            self_check(folder, load=False, tokens=[])
    else:
        assert record in self_check(folder, load=False, tokens=[]).upload
