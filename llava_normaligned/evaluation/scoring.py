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


def accuracy_score(records: list[dict], category_keys: tuple[str, ...] = ()) -> dict:
    """Plain accuracy, with per-category accuracies for each meta key in ``category_keys``."""
    correct = sum(1 for r in records if r["correct"])
    result = {"metric": "accuracy", "score": _pct(correct, len(records)), "metrics": {"accuracy": _pct(correct, len(records))}}
    result["categories"] = {key: _accuracy_by(records, key) for key in category_keys}
    return {**result, **_counts(records)}


# ---- POPE: F1 of "yes" (the headline, as in the POPE and LLaVA-1.5 papers), accuracy, precision, recall,
# yes-ratio, overall and per split (adversarial / popular / random). Anything but "yes" is a negative. ----
def _pope_metrics(records: list[dict]) -> dict:
    tp = sum(1 for r in records if r.get("extracted") == "yes" and r["gold"] == "yes")
    fp = sum(1 for r in records if r.get("extracted") == "yes" and r["gold"] != "yes")
    fn = sum(1 for r in records if r.get("extracted") != "yes" and r["gold"] == "yes")
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "f1": 100.0 * f1,
        "accuracy": _pct(sum(1 for r in records if r["correct"]), len(records)),
        "precision": 100.0 * precision,
        "recall": 100.0 * recall,
        "yes_ratio": _pct(sum(1 for r in records if r.get("extracted") == "yes"), len(records)),
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
# rotated) is answered right; categories are computed over questions. Plain per-row accuracy is also given. ----
def mmbench_score(records: list[dict]) -> dict:
    groups: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        groups[int(r["meta"]["circular_group"])].append(r)
    questions = [
        {"correct": all(r["correct"] for r in rows), "meta": min(rows, key=lambda r: int(r["doc_id"]))["meta"]}
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
            [{**r, "correct": r["correct_norm"] if headline == "acc_norm" else r["correct"]} for r in records], key
        )
    return {"metric": headline, "score": metrics[headline], "metrics": metrics, "categories": categories, **_counts(records)}
