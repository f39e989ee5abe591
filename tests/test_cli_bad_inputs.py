"""Every command given a model or folder that is not there: one line on stderr naming the input and the way out,
exit code 2, and no wait for the Hub when the name can only be a path or HF_HUB_OFFLINE is set. Also: the two
third-party notices the user did not cause are silenced, narrowly."""

from __future__ import annotations

import logging
import time
import warnings

import eval_fixtures
import pytest

from llava_normaligned.cli import main, quiet_known_notices

# A Hub that refuses every connection at once: a command that asked it would say so, not "no such folder".
CLOSED_HUB = "http://127.0.0.1:9"


def _commands(missing: str, tmp_path, data_dir: str) -> dict[str, list[str]]:
    out = str(tmp_path / "out")
    return {
        "compose (vision)": ["compose", "--vision-model", missing, "--text-model", missing, "--output-dir", out],
        "compose (text)": ["compose", "--vision-model", str(tmp_path), "--text-model", missing, "--output-dir", out],
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
def test_a_missing_model_is_one_line_and_exit_2(offline, tmp_path, data_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_ENDPOINT", CLOSED_HUB)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        missing = "nobody/no-such-model"
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        missing = "./no/such/model"
    (tmp_path / "d.json").write_text("[]")
    for name, argv in _commands(missing, tmp_path, data_dir).items():
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
