"""Per-sample judgements and per-task scores, as each benchmark reports them.

A sample record is a dict (one line of samples.jsonl): ``extracted`` (the answer read from the prediction),
``gold``, ``correct``, ``meta`` (categories), ``error`` (None, or why the sample could not run; such a sample
counts as wrong). Scores are percentages, as in the paper's Table 4.
"""

from __future__ import annotations

from collections import defaultdict

from .extraction import normalize_answer, ocr_match


# ---- judges: (extracted answer, request-like record) -> correct ----
def judge_equal(extracted, gold) -> bool:
    return extracted is not None and extracted == gold


def judge_ocr(prediction: str | None, gold: list[str], meta: dict) -> bool:
    return ocr_match(prediction, gold, meta.get("dataset", ""))


def judge_normalized(prediction: str | None, gold: str) -> bool:
    return normalize_answer(prediction) != "" and normalize_answer(prediction) == normalize_answer(gold)


# ---- aggregation helpers ----
def _pct(num: float, den: float) -> float:
    return 100.0 * num / den if den else 0.0


def _counts(records: list[dict]) -> dict:
    return {
        "n": len(records),
        "n_errors": sum(1 for r in records if r.get("error")),
        "n_unparsed": sum(1 for r in records if not r.get("error") and r.get("extracted") is None),
    }


def _accuracy_by(records: list[dict], key: str) -> dict:
    groups: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        value = (r.get("meta") or {}).get(key)
        if value is not None:
            groups[str(value)].append(bool(r["correct"]))
    return {k: {"accuracy": _pct(sum(v), len(v)), "n": len(v)} for k, v in sorted(groups.items())}


def error_verdict(entry: dict, max_error_rate: float) -> str | None:
    """Why a task's score must not be reported (None when it may): every sample raised, or more than
    ``max_error_rate`` of them did. A failed sample is scored wrong, so such a score measures the failures."""
    n, errors = entry["n"], entry["n_errors"]
    if not errors:
        return None
    first = f"; first: {entry['first_error']}" if entry.get("first_error") else ""
    if errors == n:
        return f"all {n} samples raised errors{first}"
    if errors > max_error_rate * n:
        return (f"{errors} of {n} samples raised errors ({100 * errors / n:.1f}%, more than --max-error-rate "
                f"{max_error_rate:g}){first}")
    return None


def accuracy_score(records: list[dict], category_keys: tuple[str, ...] = ()) -> dict:
    """Plain accuracy, with per-category accuracies for each meta key in ``category_keys``."""
    correct = sum(1 for r in records if r["correct"])
    result = {"metric": "accuracy", "score": _pct(correct, len(records)), "metrics": {"accuracy": _pct(correct, len(records))}}
    result["categories"] = {key: _accuracy_by(records, key) for key in category_keys}
    return {**result, **_counts(records)}


# ---- POPE: F1 of "yes" (the headline, as in the POPE and LLaVA-1.5 papers), accuracy, precision, recall,
# yes-ratio, overall and per split (adversarial / popular / random). Anything but "yes" is a negative: an unparsed
# answer (or a failed sample) to a "yes" question is a false negative. lmms-eval counts only a "no" answer as one,
# leaving unparsed answers out of recall; its F1 is reported too (f1_lmms_eval), equal to ours when all parse. ----
def _f1(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return precision, recall, 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def _pope_metrics(records: list[dict]) -> dict:
    tp = sum(1 for r in records if r.get("extracted") == "yes" and r["gold"] == "yes")
    fp = sum(1 for r in records if r.get("extracted") == "yes" and r["gold"] != "yes")
    fn = sum(1 for r in records if r.get("extracted") != "yes" and r["gold"] == "yes")
    fn_no_only = sum(1 for r in records if r.get("extracted") == "no" and r["gold"] == "yes")
    precision, recall, f1 = _f1(tp, fp, fn)
    return {
        "f1": 100.0 * f1,
        "accuracy": _pct(sum(1 for r in records if r["correct"]), len(records)),
        "precision": 100.0 * precision,
        "recall": 100.0 * recall,
        "yes_ratio": _pct(sum(1 for r in records if r.get("extracted") == "yes"), len(records)),
        "f1_lmms_eval": 100.0 * _f1(tp, fp, fn_no_only)[2],
        "n": len(records),
    }


def pope_score(records: list[dict]) -> dict:
    overall = _pope_metrics(records)
    by_split: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if (r.get("meta") or {}).get("category") is not None:
            by_split[str(r["meta"]["category"])].append(r)
    categories = {"category": {k: _pope_metrics(v) for k, v in sorted(by_split.items())}}
    metrics = {k: v for k, v in overall.items() if k != "n"}
    return {"metric": "f1", "score": overall["f1"], "metrics": metrics, "categories": categories, **_counts(records)}


# ---- MMBench: CircularEval. A question counts only if every circular copy of it (same index mod 1e6, options
# rotated) is answered right; categories are computed over questions. Plain per-row accuracy is also given.
# A row that could not even become a request has no group: it is a question of its own, wrong. ----
def _circular_group(record: dict) -> tuple:
    group = (record.get("meta") or {}).get("circular_group")
    return ("index", int(group)) if group is not None else ("row", record["row"])


def mmbench_score(records: list[dict]) -> dict:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[_circular_group(r)].append(r)
    questions = [
        {"correct": all(r["correct"] for r in rows), "meta": next((r["meta"] for r in rows if r.get("meta")), {})}
        for _, rows in sorted(groups.items())
    ]
    circular = _pct(sum(q["correct"] for q in questions), len(questions))
    per_row = _pct(sum(1 for r in records if r["correct"]), len(records))
    return {
        "metric": "circular_accuracy",
        "score": circular,
        "metrics": {"circular_accuracy": circular, "accuracy": per_row, "n_questions": len(questions)},
        "categories": {key: _accuracy_by(questions, key) for key in ("category", "l2_category")},
        **_counts(records),
    }


# ---- OCRBench: 1000 questions, a point each; the score out of 1000 and per question type. Text recognition is the
# sum of its six types, as OCRBench reports it. Headline: points / questions, in percent. ----
OCR_RECOGNITION_TYPES = (
    "Regular Text Recognition",
    "Irregular Text Recognition",
    "Artistic Text Recognition",
    "Handwriting Recognition",
    "Digit String Recognition",
    "Non-Semantic Text Recognition",
)


def ocrbench_score(records: list[dict]) -> dict:
    points = sum(1 for r in records if r["correct"])
    per_type: dict[str, list[bool]] = defaultdict(list)
    for r in records:
        if (r.get("meta") or {}).get("category") is not None:
            per_type[str(r["meta"]["category"])].append(bool(r["correct"]))
    types = {k: {"points": sum(v), "n": len(v), "accuracy": _pct(sum(v), len(v))} for k, v in sorted(per_type.items())}
    recognition = [c for k, v in per_type.items() if k in OCR_RECOGNITION_TYPES for c in v]
    return {
        "metric": "accuracy",
        "score": _pct(points, len(records)),
        "metrics": {
            "accuracy": _pct(points, len(records)),
            "final_score": points,
            "text_recognition_points": sum(recognition),
        },
        "categories": {"question_type": types},
        **_counts(records),
    }


# ---- HellaSwag and MMLU: log-likelihood multiple choice. HellaSwag's headline is acc_norm (log-likelihood per
# character of the ending, lm-eval's acc_norm); MMLU's is acc over all questions, with subject and group breakdowns.
def loglik_score(records: list[dict], headline: str, category_keys: tuple[str, ...] = ()) -> dict:
    acc = _pct(sum(1 for r in records if r["correct"]), len(records))
    acc_norm = _pct(sum(1 for r in records if r.get("correct_norm")), len(records))
    metrics = {"acc": acc, "acc_norm": acc_norm}
    categories = {}
    for key in category_keys:
        categories[key] = _accuracy_by(
            [{**r, "correct": r.get("correct_norm", False) if headline == "acc_norm" else r["correct"]} for r in records],
            key,
        )
    return {"metric": headline, "score": metrics[headline], "metrics": metrics, "categories": categories, **_counts(records)}
