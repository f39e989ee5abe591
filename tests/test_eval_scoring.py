"""Scores equal hand-computed values for fixed predictions; the Table 4 layout reproduces the paper's own rows."""

from __future__ import annotations

import json

import pytest

from llava_normaligned.evaluation import scoring
from llava_normaligned.evaluation.results_files import (
    BaselineError,
    ResultsWriter,
    average,
    load_baseline,
    render_markdown,
    table_markdown,
)
from llava_normaligned.evaluation.tasks import PAPER_TASKS, TASKS, UnknownTaskError, resolve_tasks


def rec(correct, extracted=None, gold=None, error=None, **meta):
    return {"correct": correct, "extracted": extracted, "gold": gold, "error": error, "meta": meta, "doc_id": "0"}


def test_pope_metrics_by_hand():
    records = [
        rec(True, "yes", "yes", category="adversarial"),
        rec(False, "yes", "no", category="adversarial"),
        rec(False, "no", "yes", category="popular"),
        rec(True, "no", "no", category="popular"),
        rec(False, None, "yes", category="random"),  # unparsed: a negative, and wrong
        rec(True, "no", "no", category="random"),
    ]
    result = scoring.pope_score(records)
    # TP=1 FP=1 FN=2: precision 1/2, recall 1/3, F1 = 2 * (1/6) / (5/6) = 0.4
    assert result["metric"] == "f1"
    assert result["score"] == pytest.approx(40.0)
    m = result["metrics"]
    assert (m["precision"], m["recall"], m["accuracy"]) == pytest.approx((50.0, 100 / 3, 50.0))
    assert m["yes_ratio"] == pytest.approx(100 * 2 / 6)  # share of predictions that are "yes"
    adversarial = result["categories"]["category"]["adversarial"]
    assert (adversarial["f1"], adversarial["accuracy"], adversarial["n"]) == pytest.approx((200 / 3, 50.0, 2))
    assert result["n_unparsed"] == 1
    # lmms-eval's count: only a "no" is a false negative, the unparsed answer is left out: recall 1/2, F1 0.5
    assert m["f1_lmms_eval"] == pytest.approx(50.0)
    assert result["categories"]["category"]["random"]["f1_lmms_eval"] == 0.0  # no "yes" at all there


def test_mmbench_circular_eval_by_hand():
    def row(doc_id, group, correct, category):
        return {**rec(correct, "A", "A", category=category, l2_category="p", circular_group=group), "doc_id": str(doc_id)}

    records = [
        row(0, 0, True, "colour"), row(1_000_000, 0, True, "colour"),  # both copies right: counts
        row(1, 1, True, "shape"),  # no copies: counts
        row(2, 2, True, "shape"), row(1_000_002, 2, False, "shape"),  # one copy wrong: the question is wrong
    ]
    result = scoring.mmbench_score(records)
    assert result["score"] == pytest.approx(200 / 3)
    assert result["metrics"]["accuracy"] == pytest.approx(80.0)  # per row
    assert result["metrics"]["n_questions"] == 3
    assert result["categories"]["category"] == {
        "colour": {"accuracy": 100.0, "n": 1},
        "shape": {"accuracy": 50.0, "n": 2},
    }
    # a row that could not become a request (no circular group known): a question of its own, wrong
    failed = {**rec(False, error="ValueError: invalid literal for int()"), "row": 7, "doc_id": "7"}
    result = scoring.mmbench_score([*records, failed])
    assert (result["score"], result["metrics"]["n_questions"], result["n_errors"]) == (50.0, 4, 1)


def test_ocrbench_points_and_types():
    records = [
        rec(True, category="Regular Text Recognition"),
        rec(False, category="Regular Text Recognition"),
        rec(True, category="Doc-oriented VQA"),
    ]
    result = scoring.ocrbench_score(records)
    assert result["score"] == pytest.approx(200 / 3)
    assert result["metrics"]["final_score"] == 2
    assert result["metrics"]["text_recognition_points"] == 1
    assert result["categories"]["question_type"]["Regular Text Recognition"] == {"points": 1, "n": 2, "accuracy": 50.0}


def test_accuracy_with_categories_and_errors():
    records = [rec(True, "A", category="x"), rec(False, "B", category="x"), rec(False, error="ValueError: bad image")]
    result = scoring.accuracy_score(records, category_keys=("category",))
    assert result["score"] == pytest.approx(100 / 3)  # the failed sample counts as wrong
    assert (result["n"], result["n_errors"], result["n_unparsed"]) == (3, 1, 0)
    assert result["categories"]["category"]["x"] == {"accuracy": 50.0, "n": 2}


def test_loglik_acc_and_acc_norm():
    records = [
        {**rec(True, 0, 0, category="stem"), "correct_norm": False},
        {**rec(False, 1, 0, category="stem"), "correct_norm": True},
        {**rec(True, 2, 2, category="other"), "correct_norm": True},
        {**rec(False, 3, 0, category="other"), "correct_norm": False},
    ]
    hella = scoring.loglik_score(records, headline="acc_norm")
    assert (hella["score"], hella["metrics"]["acc"]) == (50.0, 50.0)
    mmlu = scoring.loglik_score(records, headline="acc", category_keys=("category",))
    assert mmlu["categories"]["category"] == {"other": {"accuracy": 50.0, "n": 2}, "stem": {"accuracy": 50.0, "n": 2}}


def test_error_verdict():
    def entry(n, errors):
        return {"n": n, "n_errors": errors, "first_error": "OSError: disk" if errors else None}

    assert scoring.error_verdict(entry(100, 0), 0.0) is None
    assert scoring.error_verdict(entry(100, 5), 0.05) is None  # at the threshold: scored (and marked)
    assert scoring.error_verdict(entry(100, 6), 0.05) == (
        "6 of 100 samples raised errors (6.0%, more than --max-error-rate 0.05); first: OSError: disk")
    assert scoring.error_verdict(entry(4, 4), 1.0) == "all 4 samples raised errors; first: OSError: disk"


def test_judges():
    assert scoring.judge_equal("B", "B") and not scoring.judge_equal(None, "B")
    assert scoring.judge_normalized("two.", "Two") and not scoring.judge_normalized("", "")


def test_resolve_tasks():
    assert [s.name for s in resolve_tasks("all")] == list(PAPER_TASKS)
    assert [s.name for s in resolve_tasks("POPE, mmbench,pope")] == ["pope", "mmbench_en_dev"]
    with pytest.raises(UnknownTaskError, match=r"unknown task 'vqav2'.*mmbench_en_dev.*synthetic"):
        resolve_tasks("pope,vqav2")


# ---- the Table 4 layout, checked against the paper's own rows (Table 4, Llama-3.2-3B) ----
PAPER_LLAMA = {
    "w/o Norm": [71.39, 37.72, 88.14, 42.86, 40.70, 78.99, 60.17, 65.96, 45.19],
    "w/ Norm (w/o GWC)": [72.16, 41.19, 88.88, 47.26, 45.60, 80.83, 63.24, 66.01, 53.21],
}


def paper_results(method: str, label: str) -> dict:
    scores = dict(zip(PAPER_TASKS, PAPER_LLAMA[method]))
    return {"label": label, "method": method, "status": "complete",
            "tasks": {name: {"score": s, "metric": "x", "n": 1} for name, s in scores.items()}}


def test_table_reproduces_paper_average_and_deltas():
    baseline = paper_results("w/o Norm", "Llama")
    aligned = paper_results("w/ Norm (w/o GWC)", "Llama")
    assert average(baseline)["score"] == pytest.approx(59.01, abs=0.005)  # the paper's Avg column
    table = table_markdown(aligned, baseline)
    header, _, base_row, row = table.splitlines()
    assert header.split(" | ")[2:] == [TASKS[n].column for n in PAPER_TASKS] + ["Avg |"]
    assert base_row.startswith("| Llama | w/o Norm | 71.39 | 37.72 |") and base_row.endswith("| 59.01 |")
    assert "| 72.16 (+0.77) | 41.19 (+3.47) |" in row
    assert row.endswith("| 53.21 (+8.02) | 62.04 (+3.03) |")  # paper: 62.04 (+3.03)


def test_partial_table_marks_avg_and_extra_tasks_come_after():
    results = {"label": "m", "method": "w/ Norm (w/ GWC)", "status": "complete",
               "tasks": {"pope": {"score": 80.0}, "mmlu": {"score": 40.0}, "synthetic": {"score": 90.0}}}
    header, _, row = table_markdown(results).splitlines()
    assert header == "| Model | Method | POPE | MMLU | Avg (2 of 9) | Synthetic |"
    assert row == "| m | w/ Norm (w/ GWC) | 80.00 | 40.00 | 60.00 | 90.00 |"
    # a baseline without MMLU: no Avg over this model's tasks (its own 70.00 would sit under "Avg (2 of 9)"),
    # no delta, a dash where it has no score
    baseline = {"label": "b", "tasks": {"pope": {"score": 70.0}}}
    lines = table_markdown(results, baseline).splitlines()
    assert lines[2] == "| b |  | 70.00 | – | – | – |"
    assert lines[3] == "| m | w/ Norm (w/ GWC) | 80.00 (+10.00) | 40.00 | 60.00 | 90.00 |"
    # a baseline with more tasks: its Avg over this model's two, and the delta on it
    baseline["tasks"].update(mmlu={"score": 30.0}, mmstar={"score": 99.0})
    lines = table_markdown(results, baseline).splitlines()
    assert lines[0] == "| Model | Method | MM-Star | POPE | MMLU | Avg (2 of 9) | Synthetic |"
    assert lines[2] == "| b |  | 99.00 | 70.00 | 30.00 | 50.00 | – |"
    assert lines[3] == "| m | w/ Norm (w/ GWC) | – | 80.00 (+10.00) | 40.00 (+10.00) | 60.00 (+10.00) | 90.00 |"


def test_scores_with_errors_are_marked_and_failed_tasks_say_so():
    results = {"label": "m", "method": "x", "failed_tasks": {"ai2d": "all 3 samples raised errors"},
               "tasks": {"pope": {"score": 80.0, "n_errors": 2}, "mmlu": {"score": 40.0, "n_errors": 0}}}
    table = table_markdown(results)
    header, _, row, _, footnote = table.splitlines()
    assert header == "| Model | Method | POPE | AI2D | MMLU | Avg (2 of 9) |"
    assert row == "| m | x | 80.00† | failed | 40.00 | 60.00† |"  # the Avg counts the errors too
    assert footnote.startswith("† counts samples that raised errors as wrong")
    assert "†" not in table_markdown({"tasks": {"pope": {"score": 80.0, "n_errors": 0}}})


def test_results_writer_rewrites_after_each_task(tmp_path):
    writer = ResultsWriter(str(tmp_path), {"model": "m", "label": "m", "settings": {"limit": 5}}, ["pope", "ai2d"])
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["status"] == "running" and on_disk["pending"] == ["pope", "ai2d"] and on_disk["tasks"] == {}
    writer.task_done("pope", {"score": 50.0, "metric": "f1", "n": 5, "categories": {}})
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["tasks"]["pope"]["score"] == 50.0 and on_disk["pending"] == ["ai2d"]
    writer.task_failed("ai2d", "RuntimeError: boom")
    writer.close()
    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["status"] == "complete_with_failures" and on_disk["failed_tasks"] == {"ai2d": "RuntimeError: boom"}
    markdown = (tmp_path / "results.md").read_text()
    assert "Smoke run: the first 5 samples" in markdown and "**ai2d**: failed: RuntimeError: boom" in markdown
    assert markdown == render_markdown(on_disk)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not JSON"),
        ('{"tasks": {}}', "non-empty 'tasks'"),
        ('{"tasks": {"pope": {"score": "high"}}}', "task 'pope' has no numeric 'score'"),
    ],
)
def test_bad_baseline_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "results.json"
    path.write_text(content)
    with pytest.raises(BaselineError, match=message):
        load_baseline(str(path))
    with pytest.raises(BaselineError, match="cannot read"):
        load_baseline(str(tmp_path / "missing.json"))
