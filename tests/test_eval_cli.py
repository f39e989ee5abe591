"""`llava-normaligned eval` end to end on the tiny model: every task's score from fixed answers equals the one
computed by hand from the fixture rows; the outputs name no local path; failing samples are marked or fail their task
and the exit code says so; --resume refuses another model, data or settings and keeps the finished samples;
--baseline; the argument errors."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from llava_normaligned.cli import main as cli_main
from llava_normaligned.commands.eval import main
from tests.support import eval_fixtures
from tests.support.markdown import row_of, table_with
from tests.support.messages import number

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


def read_text(*parts) -> str:
    with open(os.path.join(*parts)) as f:
        return f.read()


def spy_load_model(monkeypatch) -> list[dict]:
    """Record the keyword arguments `eval` passes to the real `load_model`."""
    from llava_normaligned import loading

    calls, real = [], loading.load_model

    def load_model(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(loading, "load_model", load_model)
    return calls


def test_all_tasks_end_to_end(tiny_model_dir, data_dir, tmp_path, tmp_path_factory, capsys):
    """Real greedy generation and log-likelihoods of the tiny model on every task: the outputs, their layout, and
    no local path in what is published (results.json, results.md)."""
    out = str(tmp_path / "eval")
    code = cli_main(["eval", tiny_model_dir, "--tasks", "all,synthetic", "--data-dir", data_dir, "--limit", "3",
                     "--output-dir", out, "--label", "tiny", *FAST])
    assert code == 0
    results = read_results(out)
    assert results["status"] == "complete" and results["pending"] == [] and results["failed_tasks"] == {}
    assert list(results["tasks"]) == ["mmbench_en_dev", "mmstar", "pope", "seedbench_2_plus", "ocrbench",
                                      "scienceqa_img", "ai2d", "hellaswag", "mmlu", "synthetic"]
    assert results["method"] == "w/ Norm (w/ GWC)" and results["settings"]["limit"] == 3
    assert results["started_at"] and results["versions"]["transformers"]
    for name, entry in results["tasks"].items():
        assert 0.0 <= entry["score"] <= 100.0 and entry["n_errors"] == 0
        dataset = results["datasets"][name]
        assert dataset["source"] == "local" and entry["n"] == min(3, dataset["rows"]) and len(dataset["sha256"]) == 64
    assert results["average"]["complete"] is True and len(results["average"]["tasks"]) == 9

    # published records: the model by its folder's name, data by the --data-dir folder's name, no absolute path
    assert results["model"] == os.path.basename(tiny_model_dir)
    assert results["settings"]["data_dir"] == os.path.basename(data_dir)
    assert results["datasets"]["pope"]["location"] == f"{os.path.basename(data_dir)}/pope"
    root = str(tmp_path_factory.getbasetemp())
    for name in ("results.json", "results.md"):
        assert root not in read_text(out, name), name

    samples = read_samples(out)
    assert len(samples) == sum(e["n"] for e in results["tasks"].values())
    for sample in samples:
        assert {"task", "prompt", "prediction", "extracted", "gold", "correct", "error"} <= set(sample)
        assert sample["prompt"] and sample["prediction"] is not None
    pope = [s for s in samples if s["task"] == "pope"]
    assert results["tasks"]["pope"]["metrics"]["accuracy"] == pytest.approx(
        100 * sum(s["correct"] for s in pope) / len(pope))

    markdown = read_text(out, "results.md")
    columns = list(table_with(markdown, "Model")[0])
    assert columns[:5] == ["Model", "Method", "MMBench<sub>dev</sub>", "MM-Star", "POPE"] and "Avg" in columns
    assert row_of(markdown, "Model", "tiny")["Method"] == "w/ Norm (w/ GWC)" and "†" not in markdown
    assert "| tiny | w/ Norm (w/ GWC) |" in capsys.readouterr().out


# Fixed answers per fixture row (eval_fixtures), and each task's score computed by hand from them.
FIXED = {
    # rows: index 0 (gold A), 1 (gold B), 1000000 = question 0 with options rotated (gold C: "red")
    # "green" is option A of the rotated copy: wrong, so question 0 fails CircularEval; question 1 is right.
    "mmbench_en_dev": ["A", "The answer is B.", "green"],
    "mmstar": ["A", "(C)", "Option C"],  # gold A, B, C: right, wrong, right
    # gold yes, no, yes, no, yes, no -> read as yes, yes, no, no, unparsed, no
    "pope": ["Yes.", "Yes, there is.", "No.", "no", "I see a cat", "No, there is not."],
    "seedbench_2_plus": ["A", "2021", "B"],  # gold A, C (= "2021"), D: right, right, wrong
    "ocrbench": ["The word is HELLO", "x^{2}", "June 1"],  # right, right (HME100k: spaces dropped), wrong
    "scienceqa_img": ["A", "Europe"],  # gold A, C ("Africa"): right, wrong
    "ai2d": ["B", "hawk"],  # gold B, A ("rabbit"): right, wrong
    # log-likelihoods of the four endings; gold 3 and 0
    "hellaswag": [[-40.0, -40.0, -40.0, -5.0], [-30.0, -29.5, -60.0, -60.0]],
    "mmlu": [[-3.0, -1.0, -2.0, -4.0], [-2.0, -1.0, -3.0, -4.0]],  # gold 1 and 0: right, wrong
    # every other test question answered right (upper case and a full stop: normalized away)
    "synthetic": lambda idx, request: f"{request.gold.upper()}." if idx % 2 == 0 else "wrong answer",
}


def test_every_task_scores_fixed_answers_exactly(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    eval_fixtures.use_fixed_answers(monkeypatch, eval_fixtures.answer_table(data_dir, FIXED))
    loads = spy_load_model(monkeypatch)
    out = str(tmp_path / "eval")
    assert main([tiny_model_dir, "--tasks", "all,synthetic", "--data-dir", data_dir, "--output-dir", out,
                 "--label", "tiny", "--batch-size", "2"]) == 0
    assert loads[0]["trust_remote_code"] is None  # transformers' own resolution unless --trust-remote-code
    results = read_results(out)
    tasks = results["tasks"]
    scores = {name: entry["score"] for name, entry in tasks.items()}
    assert scores == pytest.approx({
        "mmbench_en_dev": 50.0,  # 1 of 2 questions
        "mmstar": 200 / 3,
        "pope": 40.0,  # TP 1, FP 1, FN 2 (a "no" and an unparsed answer): precision 1/2, recall 1/3, F1 0.4
        "seedbench_2_plus": 200 / 3,
        "ocrbench": 200 / 3,
        "scienceqa_img": 50.0,
        "ai2d": 50.0,
        # acc picks ending 1 for row 2 (-29.5 > -30): 50; acc_norm per character, 30 and 29 characters:
        # -30/30 = -1.0 > -29.5/29 = -1.017, ending 0, right: 100
        "hellaswag": 100.0,
        "mmlu": 50.0,
        "synthetic": 50.0,
    })
    assert tasks["mmbench_en_dev"]["metrics"] == pytest.approx(
        {"circular_accuracy": 50.0, "accuracy": 200 / 3, "n_questions": 2})
    assert tasks["mmbench_en_dev"]["categories"]["category"] == {
        "color_recognition": {"accuracy": 0.0, "n": 1}, "object_localization": {"accuracy": 100.0, "n": 1}}
    pope = tasks["pope"]["metrics"]
    assert (pope["accuracy"], pope["precision"], pope["recall"], pope["yes_ratio"]) == pytest.approx(
        (50.0, 50.0, 100 / 3, 100 / 3))
    assert pope["f1_lmms_eval"] == pytest.approx(50.0)  # the unparsed answer left out: recall 1/2
    assert tasks["pope"]["n_unparsed"] == 1
    assert tasks["seedbench_2_plus"]["categories"]["category"] == {
        "Chart": {"accuracy": 100.0, "n": 1}, "Map": {"accuracy": 100.0, "n": 1}, "Web": {"accuracy": 0.0, "n": 1}}
    assert (tasks["ocrbench"]["metrics"]["final_score"], tasks["ocrbench"]["metrics"]["text_recognition_points"]) == (2, 1)
    assert tasks["scienceqa_img"]["categories"]["category"]["social science"] == {"accuracy": 0.0, "n": 1}
    hella_row2 = eval_fixtures.hellaswag_rows()[1]["endings"][:2]
    assert [len(e) for e in hella_row2] == [30, 29]  # the characters acc_norm divides by
    assert tasks["hellaswag"]["metrics"] == {"acc": 50.0, "acc_norm": 100.0}
    assert tasks["mmlu"]["categories"]["category"] == {
        "humanities": {"accuracy": 0.0, "n": 1}, "stem": {"accuracy": 100.0, "n": 1}}
    assert tasks["synthetic"]["n"] == eval_fixtures.synthetic_test_rows()
    # Avg: (50 + 66.67 + 40 + 66.67 + 66.67 + 50 + 50 + 100 + 50) / 9 = 540 / 9
    assert results["average"]["score"] == pytest.approx(60.0)
    table = read_text(out, "results.md")
    assert ("| tiny | w/ Norm (w/ GWC) | 50.00 | 66.67 | 40.00 | 66.67 | 66.67 | 50.00 | 50.00 | 100.00 | 50.00 "
            "| 60.00 | 50.00 |") in table


def failing_copies(root) -> str:
    """POPE with one undecodable image, MMBench with one row that cannot become a request, AI2D intact."""
    rows = eval_fixtures.pope_rows()
    rows[1]["image"] = {"bytes": b"not an image", "path": None}
    eval_fixtures.write_copy("pope", root, rows)
    mmbench = [{**row, "index": str(row["index"])} for row in eval_fixtures.mmbench_rows()]
    mmbench[1]["index"] = "n/a"  # int("n/a") raises in the request builder: no circular group is known
    eval_fixtures.write_copy("mmbench_en_dev", root, mmbench)
    eval_fixtures.write_copy("ai2d", root)
    return root


RIGHT = {"pope": lambda idx, r: r.gold.capitalize() + ".", "mmbench_en_dev": lambda idx, r: r.gold,
         "ai2d": lambda idx, r: r.gold}


def _note(markdown: str, task: str) -> str:
    """The bullet of results.md that speaks of ``task`` (by its name or its column)."""
    notes = [line for line in markdown.splitlines() if line.startswith(f"- **{task}**: ")]
    assert len(notes) == 1, markdown
    return notes[0]


def test_sample_errors_fail_or_mark_their_task_and_resume_checks_the_run(tiny_model_dir, tmp_path, monkeypatch,
                                                                         capsys):
    data = failing_copies(str(tmp_path / "data"))
    table = eval_fixtures.answer_table(data, RIGHT)
    # a generation error for one question: its batch is retried one request at a time, and it alone fails
    eval_fixtures.use_fixed_answers(monkeypatch, table, fail=lambda r: r.doc_id == "4" and "dog" in r.prompt)
    out = str(tmp_path / "eval")
    args = [tiny_model_dir, "--tasks", "pope,mmbench,ai2d", "--data-dir", data, "--output-dir", out, *FAST]

    # default --max-error-rate 0.05: POPE (2 of 6 failed) and MMBench (1 of 3) are failed tasks, not scores
    assert main(args) == 1
    first = read_results(out)
    assert list(first["tasks"]) == ["ai2d"] and first["status"] == "complete_with_failures"
    assert first["failed_tasks"]["pope"].startswith("2 of 6 samples raised errors (33.3%, more than --max-error-rate")
    assert first["average"]["tasks"] == ["ai2d"]
    markdown = read_text(out, "results.md")
    row = row_of(markdown, "Model", os.path.basename(tiny_model_dir))
    assert (row["Method"], row["MMBench<sub>dev</sub>"], row["POPE"], row["AI2D"], _avg(row)) == (
        "w/ Norm (w/ GWC)", "failed", "failed", "100.00", "100.00")
    pope_failed = _note(markdown, "pope")  # the reason results.json records
    assert "failed" in pope_failed and first["failed_tasks"]["pope"] in pope_failed
    said = [line for line in capsys.readouterr().err.splitlines() if "mmbench_en_dev" in line]
    assert len(said) == 1 and "error" in said[0] and "failed" in said[0], said
    assert [int(n) for n in re.search(r"(\d+) of (\d+) samples", said[0]).groups()] == [1, 3], said

    # a looser threshold: scored, marked, and still exit 1 without --allow-errors
    assert main([*args, "--overwrite", "--max-error-rate", "0.5"]) == 1
    assert "pass --allow-errors" in capsys.readouterr().err
    second = read_results(out)
    pope, mmbench = second["tasks"]["pope"], second["tasks"]["mmbench_en_dev"]
    assert (pope["n"], pope["n_errors"], pope["metrics"]["accuracy"]) == (6, 2, pytest.approx(400 / 6))
    # the row without a circular group is a question of its own, wrong: 1 of 2 questions right
    assert (mmbench["score"], mmbench["metrics"]["n_questions"], mmbench["n_errors"]) == (50.0, 2, 1)
    samples = read_samples(out)
    errors = {(s["task"], s["row"]): s["error"] for s in samples if s["error"]}
    assert sorted(errors) == [("mmbench_en_dev", 1), ("pope", 1), ("pope", 3)]
    assert "cannot identify image" in errors[("pope", 1)] and "simulated" in errors[("pope", 3)]
    assert "ValueError" in errors[("mmbench_en_dev", 1)]
    failed = next(s for s in samples if (s["task"], s["row"]) == ("pope", 1))  # still says what it was
    assert failed["prompt"].startswith("Is there a dog") and failed["gold"] == "no" and failed["meta"]["category"]
    markdown = read_text(out, "results.md")
    row = row_of(markdown, "Model", os.path.basename(tiny_model_dir))  # POPE: its F1
    assert (row["MMBench<sub>dev</sub>"], row["POPE"], row["AI2D"], _avg(row)) == (
        "50.00†", "100.00†", "100.00", "83.33†")
    footnote = [line for line in markdown.splitlines() if line.startswith("† ")]
    assert len(footnote) == 1 and "raised errors" in footnote[0] and "as wrong" in footnote[0], footnote
    pope_note = _note(markdown, "POPE")
    assert number(r"(\d+) sample errors", pope_note) == pope["n_errors"] and "scored wrong" in pope_note

    assert main(args) == 2  # an earlier run's folder is never overwritten silently
    capsys.readouterr()

    # --resume after a crash: the last lines lost, the very last cut short
    with open(os.path.join(out, "samples.jsonl"), "w") as f:
        f.writelines(json.dumps(s) + "\n" for s in samples[:4])
        f.write('{"task": "pope", "row": 5, "trunc')
    resume = [*args, "--resume", "--max-error-rate", "0.5"]

    # refused: anything that changes an answer; the message names it, and nothing is touched
    for flag, change in [(["--limit", "5"], "--limit: None -> 5"), (["--dtype", "float32"], "--dtype: 'auto' -> 'float32'"),
                         (["--max-new-tokens", "5"], "--max-new-tokens: 3 -> 5"), (["--device", "cpu"], "--device"),
                         (["--load-in-8bit"], "--load-in-4bit / --load-in-8bit: None -> '8bit'"),
                         (["--trust-remote-code"], "--trust-remote-code: None -> True")]:
        assert main([*resume, *flag]) == 2, flag
        assert change in capsys.readouterr().err, flag
    assert read_text(out, "samples.jsonl").endswith('"trunc')

    model_copy = str(tmp_path / "moved" / "model")
    shutil.copytree(tiny_model_dir, model_copy)
    data_copy = shutil.copytree(data, str(tmp_path / "elsewhere"))
    retrained = shutil.copytree(tiny_model_dir, str(tmp_path / "retrained"))
    with open(os.path.join(retrained, "generation_config.json"), "a") as f:
        f.write("\n")  # any byte of the model's files
    assert main([retrained, *resume[1:]]) == 2
    assert "model: the files of 'retrained' differ" in capsys.readouterr().err
    changed = shutil.copytree(data, str(tmp_path / "changed"))
    rows = eval_fixtures.pope_rows()
    rows[0]["answer"] = "no"
    shutil.rmtree(os.path.join(changed, "pope"))
    eval_fixtures.write_copy("pope", changed, rows)
    assert main([*resume, "--data-dir", changed]) == 2
    assert "data of pope: another split" in capsys.readouterr().err

    # accepted: the same model and data under other paths, another batch size; failed and lost samples run again
    eval_fixtures.use_fixed_answers(monkeypatch, table)  # the device error is gone
    assert main([model_copy, *resume[1:], "--data-dir", data_copy, "--batch-size", "1", "--allow-errors"]) == 0
    resumed = read_samples(out)
    assert sorted((s["task"], s["row"]) for s in resumed) == sorted(
        [("ai2d", 0), ("ai2d", 1)] + [("mmbench_en_dev", i) for i in range(3)] + [("pope", i) for i in range(6)])
    assert all(s in resumed for s in samples[:4] if not s["error"])  # kept as they were, not run again
    third = read_results(out)
    assert third["tasks"]["pope"]["n_errors"] == 1 and third["model"] == "model"  # the image is still bad

    # --baseline: the resumed run as the reference, deltas in the table
    out2 = str(tmp_path / "eval2")
    assert main([tiny_model_dir, "--tasks", "pope,ai2d", "--data-dir", data, "--output-dir", out2, "--baseline",
                 os.path.join(out, "results.json"), "--label", "again", "--max-error-rate", "0.5",
                 "--allow-errors", *FAST]) == 0
    table_md = read_text(out2, "results.md")
    # both rows' Avg over this run's POPE and AI2D, though the baseline also has MMBench
    cells = ("Method", "MMBench<sub>dev</sub>", "POPE", "AI2D")
    model, again = row_of(table_md, "Model", "model"), row_of(table_md, "Model", "again")
    assert (*(model[c] for c in cells), _avg(model)) == ("w/ Norm (w/ GWC)", "50.00†", "100.00†", "100.00", "100.00†")
    assert (*(again[c] for c in cells), _avg(again)) == (
        "w/ Norm (w/ GWC)", "–", "100.00† (+0.00)", "100.00 (+0.00)", "100.00† (+0.00)")
    assert "Deltas are against model" in table_md


def _avg(row: dict) -> str:
    """The Avg cell: its header says over how many of Table 4's benchmarks ("Avg (3 of 9)")."""
    (cell,) = [value for header, value in row.items() if header.startswith("Avg")]
    return cell


def test_quantized_model_is_evaluated(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    """--load-in-4bit: bitsandbytes NF4 on CPU, generation and log-likelihood tasks alike; --trust-remote-code is
    passed on."""
    pytest.importorskip("bitsandbytes")
    loads = spy_load_model(monkeypatch)
    out = str(tmp_path / "eval4")
    assert main([tiny_model_dir, "--tasks", "pope,mmlu", "--data-dir", data_dir, "--limit", "2", "--load-in-4bit",
                 "--trust-remote-code", "--output-dir", out, *FAST]) == 0
    assert (loads[0]["quantization"], loads[0]["trust_remote_code"]) == ("4bit", True)
    results = read_results(out)
    assert results["settings"]["quantization"] == "4bit" and results["settings"]["trust_remote_code"] is True
    assert [(e["n"], e["n_errors"]) for e in results["tasks"].values()] == [(2, 0), (2, 0)]
    mmlu = [s for s in read_samples(out) if s["task"] == "mmlu"]
    assert all(len(s["loglikelihoods"]) == 4 and all(v < 0 for v in s["loglikelihoods"]) for s in mmlu)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["M", "--tasks", "pope,vqav2", "--output-dir", "O"], "unknown task 'vqav2': expected one of mmbench_en_dev"),
        (["M", "--tasks", "pope", "--output-dir", "O", "--data-dir", "/no/such/dir"], "--data-dir /no/such/dir: no such"),
        (["M", "--tasks", "pope", "--output-dir", "O", "--limit", "0"], "--limit must be at least 1, got 0"),
        (["M", "--tasks", "pope", "--output-dir", "O", "--max-error-rate", "5"],
         "--max-error-rate must be in [0, 1], got 5.0"),
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


def test_resume_without_a_readable_results_json_is_refused(tmp_path, data_dir, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "samples.jsonl").write_text("")
    assert main(["M", "--tasks", "ai2d", "--data-dir", data_dir, "--output-dir", str(out), "--resume"]) == 2
    assert "cannot tell which run the samples" in capsys.readouterr().err


def test_wrong_schema_fails_before_the_model_loads(tmp_path, capsys):
    rows = [{k: v for k, v in row.items() if k not in ("options",)} for row in eval_fixtures.ai2d_rows()]
    eval_fixtures.write_copy("ai2d", str(tmp_path / "data"), rows)
    assert main([eval_fixtures.trap_model(tmp_path / "model"), "--tasks", "ai2d", "--data-dir", str(tmp_path / "data"),
                 "--output-dir", str(tmp_path / "out")]) == 2
    assert "task 'ai2d'" in capsys.readouterr().err


def test_list_tasks(capsys):
    assert main(["--list-tasks"]) == 0
    listing = capsys.readouterr().out
    pope = row_of(listing, "task", "pope")
    assert [pope[c] for c in ("Table 4 column", "Hub dataset", "config", "split", "kind")] == [
        "POPE", "lmms-lab/POPE", "", "test", "generate"]
    assert pope["columns"].split(", ") == ["question_id", "question", "answer", "category", "image"]
