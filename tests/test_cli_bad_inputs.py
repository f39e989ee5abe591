"""Bad input to every command: a model or folder that is not there, a number out of range, a path that cannot be
used, parts given in the wrong order. Each is one line on stderr naming the input and the way out, exit code 2,
found before any model is loaded (the models given are traps: configs with weight files that are not weights, which
fail loudly when read), with no output folder left behind or changed. No wait for the Hub when the name can only be
a path or HF_HUB_OFFLINE is set. Ctrl-C stops `train` with one line and exit code 130, taking away the output folder
it had created. Also: the two third-party notices the user did not cause are silenced, narrowly."""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import warnings

import pytest

from llava_normaligned.checks import BadInput
from llava_normaligned.cli import main
from llava_normaligned.commands.shared import removed_unless_kept
from llava_normaligned.notices import keep_notices_of, quiet_known_notices
from tests.support import eval_fixtures
from tests.support.processes import send_or_skip, spawn_console, wait_after_signal
from tests.support.training import write_llava_dataset

# A Hub that refuses every connection at once: a command that asked it would say so, not "no such folder".
CLOSED_HUB = "http://127.0.0.1:9"


def _commands(missing: str, tmp_path, data_dir: str, vision_dir: str) -> dict[str, list[str]]:
    out = str(tmp_path / "out")
    return {
        "compose (vision)": ["compose", "--vision-model", missing, "--text-model", missing, "--output-dir", out],
        "compose (text)": ["compose", "--vision-model", vision_dir, "--text-model", missing, "--output-dir", out],
        "convert": ["convert", "--from-llava", missing, "--output-dir", out],
        "generate": ["generate", missing, "--prompt", "hi"],
        "diagnose": ["diagnose", missing, "--output-dir", out, "--no-plots"],
        "eval": ["eval", missing, "--tasks", "synthetic", "--data-dir", data_dir, "--output-dir", out],
        "train": ["train", "--stage", "1", "--model", missing, "--data-path", str(tmp_path / "d.json"),
                  "--output-dir", out],
        "card": ["card", missing],
        "push": ["push", missing, "--repo-id", "alice/x", "--dry-run"],
    }


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("eval_data"))
    eval_fixtures.write_synthetic(folder)
    return folder


@pytest.mark.parametrize("offline", [False, True], ids=["path-like", "hub-id-offline"])
def test_a_missing_model_is_one_line_and_exit_2(offline, tmp_path, data_dir, traps, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_HUB)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        missing = "nobody/no-such-model"
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        missing = "./no/such/model"
    (tmp_path / "d.json").write_text("[]")
    for name, argv in _commands(missing, tmp_path, data_dir, traps["vision"]).items():
        if offline and name in ("card", "push"):
            continue  # folders only: a Hub id is not what they take
        start = time.perf_counter()
        code = main(argv)
        seconds = time.perf_counter() - start
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and " INFO " not in line]
        assert code == 2, (name, err)
        assert len(err) == 1, (name, err)
        assert missing.strip("./") in err[0] or "no/such/model" in err[0], (name, err)
        assert ("HF_HUB_OFFLINE" in err[0]) if offline and name not in ("card", "push") else (
            "not a folder" in err[0] or "no such folder" in err[0]), (name, err)
        assert seconds < 60, (name, seconds)


def test_pull_offline_says_so(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", "nobody/no-such-model"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nobody/no-such-model" in err[0] and "unset it" in err[0]


def test_known_notices_are_silenced_narrowly(caplog):
    quiet_known_notices(["--stage", "1"])
    source = logging.getLogger("bitsandbytes.backends.cpu.ops")  # bitsandbytes' own logger, its own message
    with caplog.at_level(logging.WARNING, logger="bitsandbytes.backends.cpu.ops"):
        source.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you "
                       "already `pip install kernels` and the kernels >= 0.11.1", "ModuleNotFoundError")
        source.warning("another bitsandbytes warning")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["another bitsandbytes warning"]
    from transformers import TrainingArguments

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_known_notices(["--stage", "1"])  # TRL's default, not the user's flag
        TrainingArguments(output_dir="unused", gradient_checkpointing=True)
    assert not [w for w in caught if "gradient_checkpointing" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_known_notices(["--stage", "1", "--config", "recipe.yaml"])
        keep_notices_of(["gradient_checkpointing"])  # the recipe set it: the user's own setting
        TrainingArguments(output_dir="unused", gradient_checkpointing=True)
    assert [w for w in caught if "gradient_checkpointing" in str(w.message)]


# --------------------------------------------------------------------------------- every argument, checked first

# a log record of a command (train: "2026-... INFO name: ...", eval: "INFO name: ..."), not an error line
LOG_RECORD = re.compile(r"^(\d{4}-\d\d-\d\d [\d:,.]+ )?(DEBUG|INFO|WARNING) ")


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip() and not LOG_RECORD.match(line)]


@pytest.fixture(scope="module")
def traps(tmp_path_factory):
    """Paths the bad-input rows name: trap models (a norm-aligned LLaVA, a SigLIP vision encoder, a Llama), a model
    folder without weights, one without a config, LLaVA JSON data with its images, a prompts file, a plain file."""
    from transformers import LlamaConfig, SiglipVisionConfig

    from modeling_llava_normaligned import LlavaNormAlignedConfig

    root = tmp_path_factory.mktemp("traps")
    vision = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8)
    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128)
    llava = LlavaNormAlignedConfig(vision_config={"model_type": "siglip_vision_model", **vision},
                                   text_config={"model_type": "llama", **text}, image_token_index=127, norm_target=1.0)
    no_config = root / "no_config"
    no_config.mkdir()
    (no_config / "notes.txt").write_text("no model here")
    data, images = write_llava_dataset(str(root / "data"), n_rows=4, text_only=0)
    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "what colour is it?"}) + "\n")
    plain = root / "plain.txt"
    plain.write_text("a file, not a folder")
    return {
        "trap": eval_fixtures.trap_model(root / "llava", llava),
        "vision": eval_fixtures.trap_model(root / "vision", SiglipVisionConfig(**vision)),
        "text": eval_fixtures.trap_model(root / "text", LlamaConfig(**text)),
        "noweights": eval_fixtures.trap_model(root / "no_weights", llava, weights=False),
        "noconfig": str(no_config),
        "data": data,
        "images": images,
        "prompts": str(prompts),
        "file": str(plain),
        "missing": str(root / "no" / "such" / "thing"),
    }


def _train(*extra, model="{trap}", out="{out}", stage="1"):
    return ["train", "--stage", stage, "--model", model, "--data-path", "{data}", "--image-folder", "{images}",
            "--output-dir", out, *extra]


def _compose(vision="{vision}", text="{text}", out="{out}", *extra):
    return ["compose", "--vision-model", vision, "--text-model", text, "--output-dir", out, *extra]


def _diagnose(*extra, out="{out}"):
    return ["diagnose", "{trap}", "--output-dir", out, "--no-plots", *extra]


def _eval(*extra, model="{trap}", out="{out}"):
    return ["eval", model, "--tasks", "synthetic", "--output-dir", out, *extra]


# (what the user did, the command line, what the one error line must say). Models are traps: a row that loaded one
# would fail with a traceback or another message.
BAD_INPUTS = [
    # train: the rows
    ("train --model FOLDER without weights", _train(model="{noweights}"), ["--model", "no weights"]),
    ("train --output-dir FILE", _train(out="{file}"), ["--output-dir", "a file"]),
    ("train --per_device_train_batch_size 0", _train("--per_device_train_batch_size", "0"),
     ["--per_device_train_batch_size", "at least 1, got 0"]),
    ("train --max_steps -5", _train("--max_steps", "-5"), ["--max_steps", "-1 (train --num_train_epochs)"]),
    # train: every numeric flag that matters
    ("train --max_steps 0", _train("--max_steps", "0"), ["--max_steps", "got 0"]),
    ("train --num_train_epochs 0", _train("--num_train_epochs", "0"), ["--num_train_epochs", "above 0"]),
    ("train --learning_rate -0.001", _train("--learning_rate", "-0.001"), ["--learning_rate", "at least 0"]),
    ("train --learning_rate nan", _train("--learning_rate", "nan"), ["--learning_rate", "nan"]),
    ("train --lr-llm -1", _train("--lr-llm", "-1"), ["--lr-llm", "at least 0"]),
    ("train --global-batch-size 0", _train("--global-batch-size", "0"), ["--global-batch-size", "at least 1"]),
    ("train --gradient_accumulation_steps 0", _train("--gradient_accumulation_steps", "0"),
     ["--gradient_accumulation_steps"]),
    ("train --per_device_eval_batch_size 0", _train("--per_device_eval_batch_size", "0"),
     ["--per_device_eval_batch_size"]),
    ("train --logging_steps 2.5", _train("--logging_steps", "2.5"), ["--logging_steps", "whole number of steps"]),
    ("train --save_steps 0", _train("--save_steps", "0"), ["--save_steps", "at least 1"]),
    ("train --eval_steps -1", _train("--eval_steps", "-1"), ["--eval_steps"]),
    ("train --warmup_steps -1", _train("--warmup_steps", "-1"), ["--warmup_steps"]),
    ("train --weight_decay -0.1", _train("--weight_decay", "-0.1"), ["--weight_decay"]),
    ("train --max_grad_norm -1", _train("--max_grad_norm", "-1"), ["--max_grad_norm"]),
    ("train --adam_beta2 1", _train("--adam_beta2", "1"), ["--adam_beta2", "[0, 1)"]),
    ("train --max_length 0", _train("--max_length", "0"), ["--max_length"]),
    ("train --seed -1", _train("--seed", "-1"), ["--seed", "[0, 4294967295]"]),
    ("train --dataloader_num_workers -1", _train("--dataloader_num_workers", "-1"), ["--dataloader_num_workers"]),
    ("train --save_total_limit 0", _train("--save_total_limit", "0"), ["--save_total_limit"]),
    ("train --lora_r 0", _train("--use_peft", "--lora_r", "0", stage="2"), ["--lora_r"]),
    ("train --lora_dropout 1.5", _train("--use_peft", "--lora_dropout", "1.5", stage="2"), ["--lora_dropout"]),
    # train: flags that cannot work together
    ("train --load_in_4bit without --use_peft", _train("--load_in_4bit", stage="2"), ["--load_in_4bit", "--use_peft"]),
    ("train --use_peft in stage 1", _train("--use_peft"), ["--use_peft", "stage 2"]),
    ("train --eval_strategy steps", _train("--eval_strategy", "steps"), ["--eval_strategy", "no evaluation data"]),
    # train: every path flag
    ("train --model FOLDER without config.json", _train(model="{noconfig}"), ["--model", "no config.json"]),
    ("train --output-dir holding an earlier run", _train(out="{earlier}"),
     ["--output-dir", "earlier run", "--resume_from_checkpoint"]),
    ("train --data-path missing", ["train", "--stage", "1", "--model", "{trap}", "--data-path", "{missing}",
                                   "--output-dir", "{out}"], ["--data-path", "no such file"]),
    ("train --image-folder missing", ["train", "--stage", "1", "--model", "{trap}", "--data-path", "{data}",
                                      "--image-folder", "{missing}", "--output-dir", "{out}"],
     ["--image-folder", "no such folder"]),
    ("train --dataset-name missing", ["train", "--stage", "1", "--model", "{trap}", "--dataset-name", "{missing}",
                                      "--output-dir", "{out}"], ["--dataset-name", "no such file or folder"]),
    ("train --chat_template_path missing", _train("--chat_template_path", "{missing}"),
     ["--chat_template_path", "no such file"]),
    ("train --resume_from_checkpoint missing", _train("--resume_from_checkpoint", "{missing}"),
     ["--resume_from_checkpoint", "no such folder"]),
    ("train --config missing", _train("--config", "{missing}"), ["--config", "no such file"]),
    ("train --deepspeed missing", _train("--deepspeed", "{missing}.json"), ["--deepspeed", "no such file"]),
    ("train --fsdp_config missing", _train("--fsdp", "full_shard", "--fsdp_config", "{missing}.json"),
     ["--fsdp_config", "no such file"]),
    ("train --vision-model and --text-model swapped",
     ["train", "--stage", "1", "--vision-model", "{text}", "--text-model", "{vision}", "--data-path", "{data}",
      "--image-folder", "{images}", "--output-dir", "{out}"], ["swap"]),
    # compose and convert
    ("compose with the vision and text parts swapped", _compose("{text}", "{vision}"),
     ["--vision-model", "--text-model", "swap the two flags"]),
    ("compose with two language models", _compose("{text}", "{text}"), ["--vision-model", "not a vision encoder"]),
    ("compose with two vision encoders", _compose("{vision}", "{vision}"),
     ["--text-model", "not a causal language model"]),
    ("compose --vision-feature-layer 5", _compose("{vision}", "{text}", "{out}", "--vision-feature-layer", "5"),
     ["--vision-feature-layer", "[-3, 2]"]),
    ("compose --gradient-compensation-min 0",
     _compose("{vision}", "{text}", "{out}", "--gradient-compensation-min", "0"),
     ["--gradient-compensation-min", "above 0"]),
    ("compose --vision-model FOLDER without weights", _compose("{noweights}", "{text}"), ["no weights"]),
    ("compose --output-dir not empty", _compose(out="{nonempty}"), ["--output-dir", "not empty"]),
    ("compose --output-dir FILE", _compose(out="{file}"), ["--output-dir", "a file"]),
    ("convert a norm-aligned model", ["convert", "--from-llava", "{trap}", "--output-dir", "{out}"],
     ["--from-llava", "already a norm-aligned"]),
    ("convert a language model", ["convert", "--from-llava", "{text}", "--output-dir", "{out}"],
     ["--from-llava", "not a stock LLaVA"]),
    ("convert --output-dir not empty", ["convert", "--from-llava", "{trap}", "--output-dir", "{nonempty}"],
     ["--output-dir", "not empty"]),
    # diagnose
    ("diagnose M --baseline WRONG", _diagnose("--baseline", "{missing}"), ["--baseline", "no such folder"]),
    ("diagnose M --baseline FOLDER without weights", _diagnose("--baseline", "{noweights}"),
     ["--baseline", "no weights"]),
    ("diagnose --max-samples 0", _diagnose("--max-samples", "0"), ["--max-samples", "at least 1"]),
    ("diagnose --batch-size 0", _diagnose("--batch-size", "0"), ["--batch-size"]),
    ("diagnose --top-k 0", _diagnose("--top-k", "0"), ["--top-k"]),
    ("diagnose --max-new-tokens 0", _diagnose("--max-new-tokens", "0"), ["--max-new-tokens"]),
    ("diagnose --alphas -1", _diagnose("--alphas", "-1"), ["--alphas"]),
    ("diagnose --images missing", _diagnose("--images", "{missing}"), ["--images"]),
    ("diagnose --prompts missing", _diagnose("--prompts", "{missing}"), ["--prompts"]),
    ("diagnose --output-dir FILE", _diagnose(out="{file}"), ["--output-dir", "a file"]),
    ("diagnose --device tpu", _diagnose("--device", "tpu"), ["--device", "'tpu'"]),
    ("diagnose --dtype float8", _diagnose("--dtype", "float8"), ["--dtype", "'float8'"]),
    ("diagnose --compare-embeddings missing", ["diagnose", "{trap}", "--compare-embeddings", "{missing}"],
     ["--compare-embeddings", "no such folder"]),
    # eval
    ("eval --limit 0", _eval("--limit", "0"), ["--limit", "at least 1"]),
    ("eval --batch-size 0", _eval("--batch-size", "0"), ["--batch-size"]),
    ("eval --max-new-tokens 0", _eval("--max-new-tokens", "0"), ["--max-new-tokens"]),
    ("eval --max-error-rate 1.5", _eval("--max-error-rate", "1.5"), ["--max-error-rate", "[0, 1]"]),
    ("eval --data-dir missing", _eval("--data-dir", "{missing}"), ["--data-dir", "no such folder"]),
    ("eval --baseline missing", _eval("--baseline", "{missing}"), ["--baseline", "no such file"]),
    ("eval --output-dir FILE", _eval(out="{file}"), ["--output-dir", "a file"]),
    ("eval --device tpu", _eval("--device", "tpu"), ["--device", "'tpu'"]),
    ("eval FOLDER without weights", _eval(model="{noweights}"), ["no weights"]),
    # generate
    ("generate --max-new-tokens 0", ["generate", "{trap}", "--prompt", "hi", "--max-new-tokens", "0"],
     ["--max-new-tokens", "at least 1"]),
    ("generate --temperature -1", ["generate", "{trap}", "--prompt", "hi", "--temperature", "-1"],
     ["--temperature", "at least 0"]),
    ("generate --batch-size 0", ["generate", "{trap}", "--prompts-file", "{prompts}", "--output", "{out}",
                                 "--batch-size", "0"], ["--batch-size"]),
    ("generate --prompts-file missing", ["generate", "{trap}", "--prompts-file", "{missing}", "--output", "{out}"],
     ["--prompts-file", "no such file"]),
    ("generate --output FOLDER", ["generate", "{trap}", "--prompts-file", "{prompts}", "--output", "{nonempty}"],
     ["--output", "a folder"]),
    ("generate --image missing", ["generate", "{trap}", "--prompt", "hi", "--image", "{missing}"], ["--image"]),
    # make-data
    ("make-data into a non-empty folder", ["make-data", "--output-dir", "{nonempty}"], ["--output-dir", "not empty"]),
    ("make-data --output-dir FILE", ["make-data", "--output-dir", "{file}"], ["--output-dir", "a file"]),
    ("make-data --image-size 7", ["make-data", "--output-dir", "{out}", "--image-size", "7"], ["image_size"]),
    ("make-data --train-per-template 10", ["make-data", "--output-dir", "{out}", "--train-per-template", "10"],
     ["train_per_template"]),
    ("make-data --jitter -1", ["make-data", "--output-dir", "{out}", "--jitter", "-1"], ["jitter"]),
]


def _tree(path) -> list[tuple[str, int]]:
    """What a folder holds (relative paths and sizes), or a file's size: compared before and after a command."""
    if os.path.isfile(path):
        return [("", os.path.getsize(path))]
    return sorted((os.path.relpath(os.path.join(folder, name), path), os.path.getsize(os.path.join(folder, name)))
                  for folder, _, files in os.walk(path) for name in files)


def _places(traps, tmp_path) -> dict[str, str]:
    nonempty, earlier = tmp_path / "used", tmp_path / "earlier"
    nonempty.mkdir()
    (nonempty / "keep.txt").write_text("the user's")
    (earlier / "checkpoint-2").mkdir(parents=True)
    (earlier / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (earlier / "training_summary.json").write_text("{}")
    return {**traps, "out": str(tmp_path / "out"), "nonempty": str(nonempty), "earlier": str(earlier)}


@pytest.mark.parametrize(("argv", "says"), [row[1:] for row in BAD_INPUTS], ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_before_any_model_loads(argv, says, traps, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_HUB)
    places = _places(traps, tmp_path)
    argv = [arg.format(**places) for arg in argv]
    kept = {name: _tree(places[name]) for name in ("nonempty", "earlier", "file")}
    try:
        code = main(argv)
    except SystemExit as usage_error:  # the parser's own answer (a --config file it cannot read): as a process ends
        code = usage_error.code
    err = capsys.readouterr().err
    lines = _error_lines(err)
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"llava-normaligned {argv[0]}: error: "), lines
    for text in says:
        assert text in lines[0], (text, lines[0])
    assert "Traceback" not in err
    assert not os.path.exists(places["out"])  # nothing made
    assert {name: _tree(places[name]) for name in kept} == kept  # nothing changed


def test_the_trap_models_fail_loudly_when_loaded(traps):
    """The rows above pass only because nothing loaded their models: loading a trap raises, and not as bad input."""
    from llava_normaligned.loading import SourceNotFound, load_model

    with pytest.raises(Exception) as raised:  # noqa: PT011  (any error: safetensors' own, with a traceback)
        load_model(traps["trap"])
    assert not isinstance(raised.value, (BadInput, SourceNotFound))


CONSOLE = os.path.join(os.path.dirname(sys.executable), "llava-normaligned")  # the installed entry point


def _console_env() -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_ENDPOINT=CLOSED_HUB, OMP_NUM_THREADS="1",
                TOKENIZERS_PARALLELISM="false")


@pytest.mark.parametrize("row", ["train --max_steps -5", "make-data into a non-empty folder"])
def test_the_console_exits_2_with_one_line(row, traps, tmp_path):
    _, argv, says = next(r for r in BAD_INPUTS if r[0] == row)
    places = _places(traps, tmp_path)
    before = _tree(places["nonempty"])
    proc = subprocess.run([CONSOLE, *(arg.format(**places) for arg in argv)], capture_output=True, text=True,
                          timeout=300, env=_console_env(), check=False, stdin=subprocess.DEVNULL)
    lines = _error_lines(proc.stderr)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and all(text in lines[0] for text in says), lines
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    assert not os.path.exists(places["out"]) and _tree(places["nonempty"]) == before


# ------------------------------------------------------------------------------- a run that fails or is stopped


def test_a_failed_run_takes_away_only_what_it_wrote(tmp_path):
    """The folder a run created goes when the run fails; in a folder that was there, only the run's own entries go;
    a folder holding something worth keeping is left as it is; the error goes on."""
    new = tmp_path / "new"
    with pytest.raises(KeyboardInterrupt), removed_unless_kept(str(new)) as output:
        (new / "runs").mkdir(parents=True)
        (new / "runs" / "events").write_text("x")
        raise KeyboardInterrupt
    assert not new.exists() and output.removed and "which this run had created" in output.describe()

    used = tmp_path / "used"
    (used / "mine").mkdir(parents=True)
    (used / "notes.txt").write_text("the user's")
    with pytest.raises(ValueError, match="failed"), removed_unless_kept(str(used)) as output:
        (used / "partial.safetensors").write_text("half")
        (used / "runs").mkdir()
        raise ValueError("failed")
    assert sorted(p.name for p in used.iterdir()) == ["mine", "notes.txt"] and output.removed

    with pytest.raises(ValueError), removed_unless_kept(str(tmp_path / "kept"), keep=lambda folder: True):
        (tmp_path / "kept").mkdir()
        raise ValueError("failed")
    assert (tmp_path / "kept").is_dir()

    with removed_unless_kept(str(tmp_path / "done")):  # a run that ends well keeps what it wrote
        (tmp_path / "done").mkdir()
    assert (tmp_path / "done").is_dir()


def _read_lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def _drain(lines: queue.Queue, into: list) -> bool:
    """Move what the reader has queued into ``into``; False once the stream has ended."""
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            return True
        if line is None:
            lines.put(None)  # the end stays seen
            return False
        into.append(line)


@pytest.mark.parametrize("checkpoint", [False, True], ids=["before the first checkpoint", "after one"])
def test_ctrl_c_during_train_is_one_line_exit_130(checkpoint, tiny_model_dir, tmp_path):
    """A real `llava-normaligned train` process, sent SIGINT once training has started: one line and exit code 130.
    Before its first checkpoint the output folder it had created is gone; after one, the folder is kept and the line
    says how to continue. The child starts with SIGINT at its default disposition even when the tests were started
    with it ignored (in the background: ``cmd &``, nohup), as a user's train started from a terminal is."""
    data, images = write_llava_dataset(str(tmp_path / "data"), n_rows=8, text_only=0)
    out = tmp_path / "run"
    proc = spawn_console(
        ["train", "--stage", "1", "--model", tiny_model_dir, "--data-path", data, "--image-folder", images,
         "--output-dir", str(out), "--max_steps", "100000", "--save_steps", "1" if checkpoint else "50000",
         "--per_device_train_batch_size", "4", "--report_to", "none", "--gradient_checkpointing", "False",
         "--disable_tqdm", "True"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_console_env(),
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stderr, lines), daemon=True).start()
    seen: list[str] = []

    def said_so_far() -> str:
        _drain(lines, seen)
        return "".join(seen)

    deadline = time.monotonic() + 300
    try:
        while not any("optimizer group" in line for line in seen):  # logged as training starts
            running = _drain(lines, seen) and proc.poll() is None
            assert running, f"train ended (exit {proc.poll()}) before training started:\n{said_so_far()[-3000:]}"
            assert time.monotonic() < deadline, "train did not start training within 300 s:\n" + said_so_far()[-3000:]
            time.sleep(0.05)
        assert out.is_dir()  # the run made it
        while checkpoint and not (out / "checkpoint-2").is_dir():  # checkpoint-1 is complete once -2 is begun
            assert time.monotonic() < deadline and proc.poll() is None, said_so_far()[-3000:]
            time.sleep(0.05)
        send_or_skip(proc, signal.SIGINT)
        wait_after_signal(proc, signal.SIGINT, 120, said_so_far)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    end = time.monotonic() + 10
    while _drain(lines, seen) and time.monotonic() < end:  # the rest of what it wrote
        time.sleep(0.02)
    err = "".join(seen)
    said = [line for line in err.splitlines() if line.startswith("llava-normaligned")]
    assert proc.returncode == 130, err[-3000:]
    assert len(said) == 1 and err.rstrip().splitlines()[-1] == said[0] and "Traceback" not in err, err[-3000:]
    if checkpoint:
        assert re.fullmatch(rf"llava-normaligned train: error: interrupted \(Ctrl-C\); {re.escape(str(out))} is kept: "
                            rf"continue with --resume_from_checkpoint {re.escape(str(out))}/checkpoint-\d+", said[0])
        assert (out / "checkpoint-1" / "trainer_state.json").is_file()
    else:
        assert said[0] == (f"llava-normaligned train: error: interrupted (Ctrl-C) before the first checkpoint; "
                           f"removed {out}, which this run had created")
        assert not out.exists()
