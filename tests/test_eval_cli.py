"""`llava-normaligned eval` end to end on the tiny model: all three outputs, partial results that survive failing
samples, --resume, --baseline, and the argument errors."""

from __future__ import annotations

import json
import os

import pytest

import eval_fixtures
from llava_normaligned.cli import main as cli_main
from llava_normaligned.evaluation import runner
from llava_normaligned.evaluation.cli import main

FAST = ["--max-new-tokens", "3", "--batch-size", "2"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return eval_fixtures.write_all(str(tmp_path_factory.mktemp("bench")))


def read_samples(out) -> list[dict]:
    with open(os.path.join(out, "samples.jsonl")) as f:
        return [json.loads(line) for line in f]


def read_results(out) -> dict:
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def test_all_tasks_end_to_end(tiny_model_dir, data_dir, tmp_path, capsys):
    out = str(tmp_path / "eval")
    code = cli_main(["eval", tiny_model_dir, "--tasks", "all,synthetic", "--data-dir", data_dir, "--limit", "3",
                     "--output-dir", out, "--label", "tiny", *FAST])
    assert code == 0
    results = read_results(out)
    assert results["status"] == "complete" and results["pending"] == [] and results["failed_tasks"] == {}
    assert list(results["tasks"]) == ["mmbench_en_dev", "mmstar", "pope", "seedbench_2_plus", "ocrbench",
                                      "scienceqa_img", "ai2d", "hellaswag", "mmlu", "synthetic"]
    assert results["method"] == "w/ Norm (w/ GWC)" and results["settings"]["limit"] == 3
    assert results["model"] == tiny_model_dir and results["started_at"] and results["versions"]["transformers"]
    for name, entry in results["tasks"].items():
        assert 0.0 <= entry["score"] <= 100.0 and entry["n_errors"] == 0
        assert entry["dataset"]["source"] == "local" and entry["n"] == min(3, entry["dataset"]["rows"])
    assert results["average"]["complete"] is True and len(results["average"]["tasks"]) == 9

    samples = read_samples(out)
    assert len(samples) == sum(e["n"] for e in results["tasks"].values())
    for sample in samples:
        assert {"task", "prompt", "prediction", "extracted", "gold", "correct", "error"} <= set(sample)
        assert sample["prompt"] and sample["prediction"] is not None
    # the scores are those of the samples written: recompute one from samples.jsonl
    pope = [s for s in samples if s["task"] == "pope"]
    assert results["tasks"]["pope"]["metrics"]["accuracy"] == pytest.approx(
        100 * sum(s["correct"] for s in pope) / len(pope))

    markdown = open(os.path.join(out, "results.md")).read()
    assert "| Model | Method | MMBench<sub>dev</sub> | MM-Star | POPE |" in markdown and "| Avg | Synthetic |" in markdown
    assert "| tiny | w/ Norm (w/ GWC) |" in markdown
    assert "| tiny | w/ Norm (w/ GWC) |" in capsys.readouterr().out


def test_failing_samples_keep_the_rest_and_resume_and_baseline(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    # a POPE copy with one undecodable image, next to good rows
    rows = eval_fixtures.pope_rows()
    rows[1]["image"] = {"bytes": b"not an image", "path": None}
    bad_dir = str(tmp_path / "data")
    eval_fixtures.write_copy("pope", bad_dir, rows)
    eval_fixtures.write_copy("ai2d", bad_dir)

    # and a generation that raises for one question: its batch is retried one request at a time
    real = runner.generate_answers

    def flaky(model, processor, requests, max_new_tokens):
        if any("dog" in r.prompt and r.doc_id == "4" for r in requests):
            raise RuntimeError("CUDA error: device-side assert (simulated)")
        return real(model, processor, requests, max_new_tokens)

    monkeypatch.setattr(runner, "generate_answers", flaky)
    out = str(tmp_path / "eval")
    args = [tiny_model_dir, "--tasks", "pope,ai2d", "--data-dir", bad_dir, "--output-dir", out, *FAST]
    assert main(args) == 0
    first = read_results(out)
    pope = first["tasks"]["pope"]
    assert (pope["n"], pope["n_errors"]) == (6, 2)
    samples = read_samples(out)
    errors = {s["row"]: s["error"] for s in samples if s["error"]}
    assert sorted(errors) == [1, 3]
    # a failed sample still says what it was: its prompt, gold answer and category
    failed = next(s for s in samples if s["row"] == 1)
    assert failed["prompt"].startswith("Is there a dog") and failed["gold"] == "no" and failed["meta"]["category"]
    assert "UnidentifiedImageError" in errors[1] or "cannot identify image" in errors[1]
    assert "simulated" in errors[3]
    assert all(s["prediction"] is not None for s in samples if not s["error"])
    assert "2 sample errors (scored wrong)" in open(os.path.join(out, "results.md")).read()

    # an earlier run's folder is never overwritten silently
    assert main(args) == 2

    # --resume after a crash: keep the finished samples, rerun the failed ones and the missing ones
    monkeypatch.setattr(runner, "generate_answers", real)
    kept = samples[:4]
    with open(os.path.join(out, "samples.jsonl"), "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in kept)
        f.write('{"task": "pope", "row": 5, "trunc')  # the cut-off last line of a killed run
    assert main([*args, "--resume", "--limit", "5"]) == 2  # not the run it claims to continue
    assert main([*args, "--resume"]) == 0
    resumed = read_samples(out)
    assert sorted((s["task"], s["row"]) for s in resumed) == [("ai2d", 0), ("ai2d", 1)] + [("pope", i) for i in range(6)]
    finished = [s for s in kept if not s["error"]]
    assert finished and all(s in resumed for s in finished)  # kept as they were, not run again
    second = read_results(out)
    assert second["tasks"]["pope"]["n_errors"] == 1  # the bad image is still bad; the flaky sample ran fine

    # --baseline: the first run as the reference, deltas in the table
    out2 = str(tmp_path / "eval2")
    assert main([*args[:-len(FAST) - 2], "--output-dir", out2, "--baseline", os.path.join(out, "results.json"),
                 "--label", "again", *FAST]) == 0
    table = open(os.path.join(out2, "results.md")).read()
    assert "| again | w/ Norm (w/ GWC) |" in table and "(+0.00)" in table and "Deltas are against" in table


def test_quantized_model_is_evaluated(tiny_model_dir, data_dir, tmp_path):
    """--load-in-4bit: bitsandbytes NF4 on CPU, generation and log-likelihood tasks alike."""
    pytest.importorskip("bitsandbytes")
    out = str(tmp_path / "eval4")
    assert main([tiny_model_dir, "--tasks", "pope,mmlu", "--data-dir", data_dir, "--limit", "2", "--load-in-4bit",
                 "--output-dir", out, *FAST]) == 0
    results = read_results(out)
    assert results["settings"]["quantization"] == "4bit"
    assert [(e["n"], e["n_errors"]) for e in results["tasks"].values()] == [(2, 0), (2, 0)]
    mmlu = [s for s in read_samples(out) if s["task"] == "mmlu"]
    assert all(len(s["loglikelihoods"]) == 4 and all(v < 0 for v in s["loglikelihoods"]) for s in mmlu)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["M", "--tasks", "pope,vqav2", "--output-dir", "O"], "unknown task 'vqav2': expected one of mmbench_en_dev"),
        (["M", "--tasks", "pope", "--output-dir", "O", "--data-dir", "/no/such/dir"], "--data-dir /no/such/dir: no such"),
        (["M", "--tasks", "pope", "--output-dir", "O", "--limit", "0"], "--limit must be a positive"),
        (["M", "--output-dir", "O"], "missing --tasks"),
        (["M", "--tasks", "pope", "--output-dir", "O", "--baseline", "/no/such/results.json"], "--baseline"),
    ],
)
def test_argument_errors(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "O").exists()


def test_wrong_schema_fails_before_the_model_loads(tmp_path, capsys):
    rows = [{k: v for k, v in row.items() if k not in ("options",)} for row in eval_fixtures.ai2d_rows()]
    eval_fixtures.write_copy("ai2d", str(tmp_path / "data"), rows)
    assert main([str(tmp_path / "not-a-model"), "--tasks", "ai2d", "--data-dir", str(tmp_path / "data"),
                 "--output-dir", str(tmp_path / "out")]) == 2
    assert "task 'ai2d'" in capsys.readouterr().err


def test_list_tasks(capsys):
    assert main(["--list-tasks"]) == 0
    listing = capsys.readouterr().out
    assert "| pope | POPE | lmms-lab/POPE |  | test | generate | question_id, question, answer, category, image |" in listing
