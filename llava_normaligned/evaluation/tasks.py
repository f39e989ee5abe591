"""The benchmarks: where each one lives on the Hub, the columns it must have, how it is asked and scored.

This is the one place that records dataset ids, splits and schemas. The nine benchmarks of the paper's Table 4
(§5.2, Appendix E.1) come in the table's column order; ``synthetic`` is the CPU demo's held-out split.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable

from . import prompts, scoring
from .extraction import extract_choice, extract_yes_no


@dataclass(frozen=True)
class HubSource:
    path: str  # Hub dataset id
    config: str | None
    split: str


@dataclass(frozen=True)
class TaskSpec:
    name: str  # CLI name, also the folder under --data-dir
    column: str  # header in the Table 4 layout
    hub: HubSource | None  # None: local copies only
    columns: tuple[str, ...]  # columns a row must have (the Hub schema, as far as it is used)
    kind: str  # "generate" (greedy decoding) or "loglik" (log-likelihood multiple choice)
    build: Callable  # (row, idx) -> GenerationRequest | LoglikRequest
    score: Callable  # (records) -> task result
    extract: Callable | None = None  # (prediction, request) -> extracted answer (generate tasks)
    judge: Callable | None = None  # (extracted, prediction, request) -> bool (generate tasks)
    max_new_tokens: int = 16
    in_paper: bool = True
    notes: str = ""
    aliases: tuple[str, ...] = field(default_factory=tuple)


# ---- extraction/judging per answer format ----
def _extract_letter(prediction, request):
    letters = "".join(request.choices) if request.choices else "ABCDE"
    return extract_choice(prediction, letters, request.choices)


def _extract_yes_no(prediction, request):
    return extract_yes_no(prediction)


def _extract_text(prediction, request):
    return None if prediction is None else prediction.strip()


def _judge_equal(extracted, prediction, request):
    return scoring.judge_equal(extracted, request.gold)


def _judge_ocr(extracted, prediction, request):
    return scoring.judge_ocr(prediction, request.gold, request.meta)


def _judge_normalized(extracted, prediction, request):
    return scoring.judge_normalized(prediction, request.gold)


_LETTER = dict(extract=_extract_letter, judge=_judge_equal)

TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in [
        TaskSpec(
            name="mmbench_en_dev",
            column="MMBench<sub>dev</sub>",
            hub=HubSource("lmms-lab/MMBench", "en", "dev"),
            columns=("index", "question", "hint", "A", "B", "C", "D", "answer", "category", "L2-category", "image"),
            kind="generate",
            build=prompts.mmbench_request,
            score=scoring.mmbench_score,
            max_new_tokens=128,
            notes="CircularEval over the copies with rotated options (index mod 1e6); rule-based extraction only.",
            aliases=("mmbench", "mmbench_en", "mmbench-en", "mmbench-en-dev"),
            **_LETTER,
        ),
        TaskSpec(
            name="mmstar",
            column="MM-Star",
            hub=HubSource("Lin-Chen/MMStar", None, "val"),
            columns=("index", "question", "answer", "category", "l2_category", "image"),
            kind="generate",
            build=prompts.mmstar_request,
            score=partial(scoring.accuracy_score, category_keys=("category", "l2_category")),
            max_new_tokens=128,
            notes="Accuracy over all questions (6 balanced categories of 250, so equal to their mean).",
            aliases=("mm-star",),
            **_LETTER,
        ),
        TaskSpec(
            name="pope",
            column="POPE",
            hub=HubSource("lmms-lab/POPE", None, "test"),
            columns=("question_id", "question", "answer", "category", "image"),
            kind="generate",
            build=prompts.pope_request,
            score=scoring.pope_score,
            extract=_extract_yes_no,
            judge=_judge_equal,
            max_new_tokens=128,
            notes="F1 of 'yes' over all questions (an unparsed answer to a 'yes' question is a false negative; "
            "f1_lmms_eval leaves it out, as lmms-eval does); accuracy, precision, recall, yes-ratio per split too.",
        ),
        TaskSpec(
            name="seedbench_2_plus",
            column="SEED-Bench-2",
            hub=HubSource("doolayer/SEED-Bench-2-Plus", None, "test"),
            columns=(
                "question_id", "question", "choice_A", "choice_B", "choice_C", "choice_D", "answer",
                "question_image_type", "image",
            ),
            kind="generate",
            build=prompts.seedbench2plus_request,
            score=partial(scoring.accuracy_score, category_keys=("category",)),
            max_new_tokens=16,
            notes="Accuracy; per image type (Chart, Map, Web).",
            aliases=("seed-bench-2-plus", "seedbench2plus", "seed-bench-2", "seedbench2"),
            **_LETTER,
        ),
        TaskSpec(
            name="ocrbench",
            column="OCRBench",
            hub=HubSource("echo840/OCRBench", None, "test"),
            columns=("dataset", "question", "answer", "question_type", "image"),
            kind="generate",
            build=prompts.ocrbench_request,
            score=scoring.ocrbench_score,
            extract=_extract_text,
            judge=_judge_ocr,
            max_new_tokens=128,
            notes="An accepted answer contained in the prediction; score = points / questions (points out of 1000).",
        ),
        TaskSpec(
            name="scienceqa_img",
            column="ScienceQA",
            hub=HubSource("lmms-lab/ScienceQA", "ScienceQA-IMG", "test"),
            columns=("question", "choices", "answer", "hint", "subject", "image"),
            kind="generate",
            build=prompts.scienceqa_request,
            score=partial(scoring.accuracy_score, category_keys=("category",)),
            max_new_tokens=16,
            notes="Accuracy on the image subset of the test split; per subject.",
            aliases=("scienceqa", "scienceqa-img", "sqa"),
            **_LETTER,
        ),
        TaskSpec(
            name="ai2d",
            column="AI2D",
            hub=HubSource("lmms-lab/ai2d", None, "test"),
            columns=("question", "options", "answer", "image"),
            kind="generate",
            build=prompts.ai2d_request,
            score=scoring.accuracy_score,
            max_new_tokens=16,
            notes="Accuracy.",
            **_LETTER,
        ),
        TaskSpec(
            name="hellaswag",
            column="HellaSwag",
            hub=HubSource("Rowan/hellaswag", None, "validation"),
            columns=("activity_label", "ctx_a", "ctx_b", "endings", "label"),
            kind="loglik",
            build=prompts.hellaswag_request,
            score=partial(scoring.loglik_score, headline="acc_norm"),
            notes="Zero-shot; acc_norm (log-likelihood per character of the ending), as lm-eval reports it.",
        ),
        TaskSpec(
            name="mmlu",
            column="MMLU",
            hub=HubSource("cais/mmlu", "all", "test"),
            columns=("question", "subject", "choices", "answer"),
            kind="loglik",
            build=prompts.mmlu_request,
            score=partial(scoring.loglik_score, headline="acc", category_keys=("category", "subject")),
            notes="Zero-shot, lm-eval's prompt; log-likelihood of ' A'..' D'; accuracy over all questions.",
        ),
        TaskSpec(
            name="synthetic",
            column="Synthetic",
            hub=None,
            columns=("id", "image", "conversations"),
            kind="generate",
            build=prompts.synthetic_request,
            score=partial(scoring.accuracy_score, category_keys=("category",)),
            extract=_extract_text,
            judge=_judge_normalized,
            max_new_tokens=32,
            in_paper=False,
            notes="The demo's held-out split (LLaVA JSON); exact match of the normalized answer.",
            aliases=("demo",),
        ),
    ]
}

PAPER_TASKS = tuple(name for name, spec in TASKS.items() if spec.in_paper)


class UnknownTaskError(ValueError):
    pass


def resolve_tasks(names: str | list[str]) -> list[TaskSpec]:
    """Task specs for a comma-separated list (or a list) of names or aliases; "all"/"paper" means the nine of
    Table 4. Unknown names raise an error that lists the known ones."""
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    lookup = {}
    for spec in TASKS.values():
        for key in (spec.name, *spec.aliases):
            lookup[key.lower()] = spec
    chosen: list[TaskSpec] = []
    for raw in names:
        key = raw.strip().lower().replace(" ", "")
        if not key:
            continue
        if key in ("all", "paper"):
            chosen += [TASKS[n] for n in PAPER_TASKS]
            continue
        if key not in lookup:
            known = ", ".join(TASKS)
            raise UnknownTaskError(f"unknown task {raw.strip()!r}: expected one of {known} (or 'all' for Table 4's nine)")
        chosen.append(lookup[key])
    if not chosen:
        raise UnknownTaskError(f"no task given: expected one or more of {', '.join(TASKS)}")
    unique: dict[str, TaskSpec] = {}
    for spec in chosen:
        unique.setdefault(spec.name, spec)
    return list(unique.values())
