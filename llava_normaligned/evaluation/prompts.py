"""Benchmark rows -> model requests, with the prompts the community uses (lmms-eval's defaults, lm-eval's for text).

A generation request is one user turn (an image, then the text) answered by greedy decoding; a log-likelihood
request is a context and the candidate continuations whose summed log-probabilities are compared. Each builder
takes one dataset row (a dict in the benchmark's own Hub schema) and its position in the split.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from ..generation import without_image_tags

# lmms-eval's suffixes (tasks/*/..._yaml, `post_prompt`).
LETTER_SUFFIX = "\nAnswer with the option's letter from the given choices directly."
SHORT_ANSWER_SUFFIX = "\nAnswer the question using a single word or phrase."
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass
class GenerationRequest:
    doc_id: str
    prompt: str  # the user's text; the image goes before it
    images: list  # 0 or 1 PIL images
    gold: Any  # "A"/"yes"/a list of accepted strings, depending on the task
    choices: dict[str, str] = field(default_factory=dict)  # option letter -> option text (multiple choice)
    meta: dict = field(default_factory=dict)  # what the scorer groups by (category, circular group, ...)


@dataclass
class LoglikRequest:
    doc_id: str
    context: str
    continuations: list[str]
    gold: int  # index into continuations
    meta: dict = field(default_factory=dict)


def is_missing(value) -> bool:
    """Empty cells as the benchmarks write them: None, NaN, "nan" (MMBench's TSV heritage) or ""."""
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and value.strip().lower() in ("", "nan", "none")


def _image_list(row: dict, key: str = "image") -> list:
    image = row.get(key)
    return [] if image is None else [image]


def _lettered(options: list[str]) -> tuple[str, dict[str, str]]:
    """'A. x\\nB. y' and {'A': 'x', 'B': 'y'}."""
    choices = {LETTERS[i]: str(text) for i, text in enumerate(options)}
    return "\n".join(f"{k}. {v}" for k, v in choices.items()), choices


def _options_request(row: dict, doc_id: str, question: str, options: list, gold: str,
                     meta: dict | None = None) -> GenerationRequest:
    """``{question}\\nA. ...\\nD. ...`` and the letter instruction: the options listed under the question."""
    listing, choices = _lettered(options)
    return GenerationRequest(doc_id=doc_id, prompt=f"{question}\n{listing}{LETTER_SUFFIX}", images=_image_list(row),
                             gold=gold, choices=choices, meta=meta or {})



# ---- POPE (lmms-lab/POPE): yes/no object probing ----
def pope_request(row: dict, idx: int) -> GenerationRequest:
    return GenerationRequest(
        doc_id=str(row["question_id"]),
        prompt=f"{row['question'].strip()}{SHORT_ANSWER_SUFFIX}",
        images=_image_list(row),
        gold=str(row["answer"]).strip().lower(),
        meta={"category": row["category"]},
    )


# ---- MMBench-EN dev (lmms-lab/MMBench, config "en"): hint + question + "There are several options:" ----
MMBENCH_CIRCULAR_STRIDE = 1_000_000  # circular copies of question i carry index i + k * 1e6 (MMBench's TSVs)


def mmbench_request(row: dict, idx: int) -> GenerationRequest:
    choices = {c: str(row[c]) for c in "ABCDE" if c in row and not is_missing(row[c])}
    options = "There are several options:\n" + "\n".join(f"{k}. {v}" for k, v in choices.items())
    hint = row.get("hint")
    query = f"{row['question']} {options}" if is_missing(hint) else f"{hint} {row['question']} {options}"
    index = int(row["index"])
    return GenerationRequest(
        doc_id=str(index),
        prompt=f"{query}{LETTER_SUFFIX}",
        images=_image_list(row),
        gold=str(row["answer"]).strip(),
        choices=choices,
        meta={
            "category": row["category"],
            "l2_category": row["L2-category"],
            "circular_group": index % MMBENCH_CIRCULAR_STRIDE,
        },
    )


# ---- MMStar (Lin-Chen/MMStar, split "val"): options are written inside the question ----
def mmstar_request(row: dict, idx: int) -> GenerationRequest:
    # lmms-eval's MMStar suffix has no final period; kept as is so prompts match.
    return GenerationRequest(
        doc_id=str(row["index"]),
        prompt=f"{row['question'].strip()}{LETTER_SUFFIX.rstrip('.')}",
        images=_image_list(row),
        gold=str(row["answer"]).strip(),
        meta={"category": row["category"], "l2_category": row["l2_category"]},
    )


# ---- SEED-Bench-2-Plus (doolayer/SEED-Bench-2-Plus): charts, maps, web pages ----
def seedbench2plus_request(row: dict, idx: int) -> GenerationRequest:
    return _options_request(row, str(row["question_id"]), row["question"], [row[f"choice_{c}"] for c in "ABCD"],
                            str(row["answer"]).strip(), {"category": str(row["question_image_type"]).capitalize()})


# ---- OCRBench (echo840/OCRBench): the bare question; gold is a list of accepted strings ----
def ocrbench_request(row: dict, idx: int) -> GenerationRequest:
    answers = row["answer"]
    answers = [answers] if isinstance(answers, str) else [str(a) for a in answers]
    return GenerationRequest(
        doc_id=str(idx),
        prompt=row["question"].strip(),
        images=_image_list(row),
        gold=answers,
        meta={"category": row["question_type"], "dataset": row["dataset"]},
    )


# ---- ScienceQA-IMG (lmms-lab/ScienceQA, config "ScienceQA-IMG", split "test") ----
def scienceqa_request(row: dict, idx: int) -> GenerationRequest:
    context = "" if is_missing(row.get("hint")) else f"Context: {row['hint']}\n"
    return _options_request(row, str(idx), f"{context}{row['question']}", list(row["choices"]),
                            LETTERS[int(row["answer"])], {"category": row["subject"]})


# ---- AI2D (lmms-lab/ai2d): diagram questions; answer is the option's index as a string ----
def ai2d_request(row: dict, idx: int) -> GenerationRequest:
    return _options_request(row, str(idx), row["question"], list(row["options"]), LETTERS[int(row["answer"])])


# ---- HellaSwag (Rowan/hellaswag, split "validation"): lm-eval's preprocessing, endings scored by log-likelihood ----
def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)  # WikiHow markup such as [header], [step]
    return text.replace("  ", " ")


def hellaswag_request(row: dict, idx: int) -> LoglikRequest:
    context = _hellaswag_clean(f"{row['activity_label']}: {row['ctx_a']} {row['ctx_b'].capitalize()}")
    return LoglikRequest(
        doc_id=str(row.get("ind", idx)),
        context=context,
        continuations=[" " + _hellaswag_clean(e) for e in row["endings"]],
        gold=int(row["label"]),
    )


# ---- MMLU (cais/mmlu, config "all", split "test"): zero-shot, lm-eval's prompt, letters scored ----
# lm-eval's grouping of the 57 subjects (tasks/mmlu/_generate_configs.py).
MMLU_SUPERCATEGORY = {
    **dict.fromkeys(
        "abstract_algebra anatomy astronomy college_biology college_chemistry college_computer_science "
        "college_mathematics college_physics computer_security conceptual_physics electrical_engineering "
        "elementary_mathematics high_school_biology high_school_chemistry high_school_computer_science "
        "high_school_mathematics high_school_physics high_school_statistics machine_learning".split(),
        "stem",
    ),
    **dict.fromkeys(
        "formal_logic high_school_european_history high_school_us_history high_school_world_history "
        "international_law jurisprudence logical_fallacies moral_disputes moral_scenarios philosophy prehistory "
        "professional_law world_religions".split(),
        "humanities",
    ),
    **dict.fromkeys(
        "econometrics high_school_geography high_school_government_and_politics high_school_macroeconomics "
        "high_school_microeconomics high_school_psychology human_sexuality professional_psychology "
        "public_relations security_studies sociology us_foreign_policy".split(),
        "social_sciences",
    ),
    **dict.fromkeys(
        "business_ethics clinical_knowledge college_medicine global_facts human_aging management marketing "
        "medical_genetics miscellaneous nutrition professional_accounting professional_medicine virology".split(),
        "other",
    ),
}


def mmlu_request(row: dict, idx: int) -> LoglikRequest:
    subject = row["subject"]
    listing, _ = _lettered(list(row["choices"]))
    header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    return LoglikRequest(
        doc_id=str(idx),
        context=f"{header}{row['question'].strip()}\n{listing}\nAnswer:",
        continuations=[f" {LETTERS[i]}" for i in range(len(row["choices"]))],
        gold=int(row["answer"]),
        meta={"subject": subject, "category": MMLU_SUPERCATEGORY.get(subject, "unknown")},
    )


# ---- the demo's synthetic task (LLaVA JSON written by `llava-normaligned make-data`: test.json) ----
def synthetic_request(row: dict, idx: int) -> GenerationRequest:
    turns = row["conversations"]
    question = without_image_tags(next(t["value"] for t in turns if t["from"] == "human"))
    answer = next(t["value"] for t in turns if t["from"] == "gpt")
    meta = {"category": row["template"]} if row.get("template") else {}  # count / colour / shape / position
    return GenerationRequest(doc_id=str(row["id"]), prompt=question, images=_image_list(row), gold=answer, meta=meta)
