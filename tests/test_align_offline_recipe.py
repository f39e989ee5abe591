"""docs/align.md, "Offline, with nothing downloaded": the shell block under that heading run as written, command by
command, in an empty folder, with the Hub switched off (``HF_HUB_OFFLINE=1``, and an endpoint that refuses every
connection). What each command must have written is known by construction: the tiny stock Idefics3 folder with its
processor; the aligned folder with the norm at the connector, its gain T / sqrt(D); two training steps that moved the
norm; a diagnosis naming the family with the vision tokens at the text norm (ratio 1 up to LayerNorm's eps on a tiny
random connector) while the stock baseline's is not.

Also: ``llava_normaligned.tiny``'s command line answers bad input in one line with exit code 2.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from llava_normaligned.commands.tiny import main
from llava_normaligned.families.processors import TRAINS_WITHOUT_TORCHVISION
from llava_normaligned.tiny import TINY_VLM_FAMILIES
from tests.support.markdown import cell_rows

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "align.md")
HEADING = "## Offline, with nothing downloaded"
BIN = os.path.dirname(sys.executable)  # the environment's python and llava-normaligned, as a user's shell finds them
CLOSED_HUB = "http://127.0.0.1:9"  # a Hub that refuses every connection at once
NORM = "model.connector.aligned_norm"  # Idefics3's connector (the table under "Where the norm goes")

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: the in-process builds


def _section() -> str:
    with open(DOCS, encoding="utf-8") as f:
        text = f.read()
    assert text.count(HEADING + "\n") == 1, f"docs/align.md has no single '{HEADING}' section"
    return text.split(HEADING + "\n", 1)[1].split("\n## ", 1)[0]


def recipe_commands() -> list[str]:
    """The section's ```bash block, one command per entry (continued lines joined, comments and blanks left out)."""
    blocks = re.findall(r"```bash\n(.*?)```", _section(), flags=re.S)
    assert len(blocks) == 1, "the section has one bash block: the recipe"
    commands, current = [], ""
    for line in blocks[0].splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1].strip() + " "
            continue
        commands.append(current + line)
        current = ""
    assert not current, "a continued line ends the block"
    return commands


def _argument(command: str, flag: str) -> str:
    words = shlex.split(command)
    return words[words.index(flag) + 1]


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """Each command of the block, run in a new folder: {program word: (command, completed process, seconds)}."""
    folder = tmp_path_factory.mktemp("offline_recipe")
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "HF_HUB_OFFLINE": "1",
           "HF_ENDPOINT": CLOSED_HUB, "HF_HOME": str(folder / ".hf_home"), "OMP_NUM_THREADS": "1"}
    ran = {}
    for command in recipe_commands():
        start = time.perf_counter()
        done = subprocess.run(["bash", "-c", command], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=300)
        seconds = time.perf_counter() - start
        words = shlex.split(command)
        key = words[1] if words[0] == "llava-normaligned" else words[2]  # the subcommand, or the module run
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-4000:])
        ran[key] = (command, done, seconds)
    return folder, ran


def _read(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_the_block_is_the_recipe_in_order():
    programs = [shlex.split(c)[:3] for c in recipe_commands()]
    assert [p[1] for p in programs] == ["tiny", "align", "make-data", "train", "diagnose"]
    assert all(p[0] == "llava-normaligned" for p in programs)
    train = next(c for c in recipe_commands() if c.startswith("llava-normaligned train"))
    assert _argument(train, "--stage") == "2" and _argument(train, "--max_steps") == "2"


def test_the_tiny_model_is_a_stock_folder_with_its_processor(recipe):
    folder, ran = recipe
    command, done, _ = ran["tiny"]
    stock = folder / _argument(command, "--output-dir")
    assert done.stdout.startswith(f"wrote {_argument(command, '--output-dir')}: ")
    assert _read(stock / "config.json")["model_type"] == _argument(command, "--family") == "idefics3"
    for name in ("model.safetensors", "tokenizer.json", "preprocessor_config.json", "processor_config.json",
                 "chat_template.jinja"):
        assert (stock / name).is_file(), name


def test_align_put_the_norm_at_the_connector(recipe):
    folder, ran = recipe
    command, done, _ = ran["align"]
    aligned = folder / _argument(command, "--output-dir")
    config = _read(aligned / "config.json")
    assert config["model_type"] == "normaligned_idefics3" and config["norm_family"] == "idefics3"
    assert config["norm_connector"] == "model.connector"
    weights = load_file(aligned / "model.safetensors")
    gain = weights[f"{NORM}.weight"]
    d = config["text_config"]["hidden_size"]
    assert gain.numel() == d and torch.equal(weights[f"{NORM}.bias"], torch.zeros(d))
    torch.testing.assert_close(gain, torch.full((d,), config["norm_target"] / d**0.5), rtol=1e-6, atol=0)
    wrote = re.search(r"family=(\w+) norm at (\S+)", done.stdout)
    assert wrote and wrote.groups() == (config["norm_family"], config["norm_connector"]), done.stdout


def test_train_wrote_a_checkpoint_two_steps_on(recipe):
    folder, ran = recipe
    command, done, _ = ran["train"]
    aligned = folder / _argument(command, "--model")
    trained = folder / _argument(command, "--output-dir")
    summary = _read(trained / "training_summary.json")
    assert summary["training"]["global_steps"] == 2
    assert summary["variant"]["aligned_family"] == "idefics3"
    assert summary["data"]["load"]["rows_kept"] == 80  # make-data --train-per-template 16: 5 templates x 16
    assert [r["step"] for r in _read(trained / "norm_tracking.json")] == [0, 1, 2]
    before, after = load_file(aligned / "model.safetensors"), load_file(trained / "model.safetensors")
    assert set(before) == set(after)
    assert not torch.equal(before[f"{NORM}.weight"], after[f"{NORM}.weight"])  # the norm trained
    assert _read(trained / "config.json")["model_type"] == "normaligned_idefics3"
    assert "stage 2 done" in done.stdout + done.stderr


def test_diagnose_wrote_its_report_with_the_vision_tokens_at_the_text_norm(recipe):
    folder, ran = recipe
    command, done, _ = ran["diagnose"]
    out = folder / _argument(command, "--output-dir")
    report = _read(out / "diagnostics.json")
    assert report["family"] == "idefics3"
    assert report["num_samples"] == int(_argument(command, "--max-samples"))
    # LayerNorm's eps against the spread of a random tiny connector's outputs: 1 up to a few hundredths
    assert report["vision_text_norm_ratio"] == pytest.approx(1.0, abs=0.05)
    assert report["baseline"]["vision_text_norm_ratio"] > 2  # the stock model, without the norm
    summary = (out / "summary.md").read_text(encoding="utf-8")
    (ratios,) = [row[1:] for row in cell_rows(summary) if "norm ratio at the LLM input" in row[0]]  # model, stock
    assert [float(cell.strip("*")) for cell in ratios] == pytest.approx(
        [report["vision_text_norm_ratio"], report["baseline"]["vision_text_norm_ratio"]], rel=1e-3, abs=5e-4)
    assert "vision/text norm ratio 1" in done.stdout


def test_the_recipe_takes_about_as_long_as_the_docs_say(recipe):
    _, ran = recipe
    seconds = {key: round(value[2], 1) for key, value in ran.items()}
    print("recipe seconds:", seconds)
    assert sum(seconds.values()) < 180, seconds  # docs: 20-50 s on a busy 2-core CPU


def test_the_docs_name_the_families_that_train_without_torchvision():
    section = _section()
    for family in TRAINS_WITHOUT_TORCHVISION:
        assert f"`{family}`" in section, family
    assert set(TRAINS_WITHOUT_TORCHVISION) < set(TINY_VLM_FAMILIES)


# ------------------------------------------------------------------------------------------ the tiny command itself


@pytest.mark.parametrize("argv, says", [
    (["--family", "blip2", "--output-dir", "{tmp}/out"], "invalid choice: 'blip2'"),
    (["--output-dir", "{tmp}/out"], "required: --family"),
    (["--family", "idefics3", "--output-dir", "{tmp}/full"], "--output-dir"),
    (["--family", "idefics3", "--output-dir", "{tmp}/a-file"], "a file, not a folder"),
    (["--family", "idefics3", "--output-dir", "{tmp}/out", "--seed", "-1"], "--seed must be"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    (tmp_path / "a-file").write_text("mine")
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own usage errors
        code = stop.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert err[0].startswith("llava-normaligned tiny: error: ")
    assert not (tmp_path / "out").exists()
    assert os.listdir(tmp_path / "full") == ["keep.txt"]


def test_a_family_name_may_be_written_with_hyphens(tmp_path, capsys):
    assert main(["--family", "LLaVA-NeXT", "--output-dir", str(tmp_path / "out")]) == 0
    assert _read(tmp_path / "out" / "config.json")["model_type"] == "llava_next"
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 'out'}: a tiny random LlavaNextForConditionalGeneration")


def test_the_earlier_module_command_line_still_runs_with_a_notice(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "llava_normaligned.tiny", "--family", "idefics3", "--output-dir",
                           str(out)], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    notice = "python -m llava_normaligned.tiny is now `llava-normaligned tiny` (the same flags)"
    assert notice in done.stderr.splitlines(), done.stderr[-2000:]
    assert _read(out / "config.json")["model_type"] == "idefics3" and done.stdout.startswith(f"wrote {out}: ")

