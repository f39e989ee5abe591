"""Score a model on the synthetic test split, once with the real images and once with blank ones.

Greedy generation, batched with left padding (``llava_normaligned.generation.generate_batch``), and exact match
after case and a trailing full stop are normalised. Greedy decoding is what a user of the model gets, and every
answer of the dataset is one or two words the model was trained to emit followed by ``<|im_end|>``, so a miss is a
wrong answer, not a formatting quirk; a closed-set likelihood choice would also credit a model that ranks the right
word first but would never say it.

The same questions with a blank canvas instead of the image give what the model answers from the text alone.
The answers are balanced within every question (``synthetic``), so that score is at most chance (1/4 per template)
and the difference, the *visual gain*, is what the model read from the image.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from tqdm.auto import tqdm

from llava_normaligned.generation import generate_batch, without_image_tags
from llava_normaligned.trainer.rewards import normalize_answer

from . import synthetic

IMAGE_CONDITIONS = ("real", "blank")


@dataclass
class TestRow:
    template: str
    question: str
    answer: str
    image_path: str


def load_test_rows(test_json: str, image_folder: str) -> list[TestRow]:
    """The rows of ``test.json`` (written by ``synthetic.make_dataset``)."""
    with open(test_json, encoding="utf-8") as handle:
        records = json.load(handle)
    rows = []
    for index, record in enumerate(records):
        try:
            question = without_image_tags(record["conversations"][0]["value"])
            answer = record["conversations"][1]["value"]
            rows.append(TestRow(record["template"], question, answer, os.path.join(image_folder, record["image"])))
        except (KeyError, IndexError, TypeError) as err:
            raise ValueError(f"{test_json} row {index}: not a synthetic test row ({type(err).__name__}: {err})") from None
    if not rows:
        raise ValueError(f"{test_json}: no test rows")
    return rows


@dataclass
class Scores:
    """Accuracy per template and overall (``"avg"``: the mean over templates), for each image condition."""

    accuracy: dict = field(default_factory=dict)  # {"real": {template: acc, ..., "avg": acc}, "blank": {...}}
    visual_gain: float = 0.0  # real avg - blank avg
    examples: list = field(default_factory=list)  # a few (question, answer, real prediction, blank prediction)

    def to_dict(self) -> dict:
        return asdict(self)


def score_model(model, processor, rows: list[TestRow], *, image_size: int, batch_size: int = 64,
                max_new_tokens: int = 6, progress: bool = True, desc: str = "scoring") -> Scores:
    """Answer every test question with its image and with a blank canvas; return the ``Scores``."""
    prompts = [row.question for row in rows]
    blank = synthetic.blank_image(image_size)
    predictions = {}
    with tqdm(total=2 * len(rows), desc=desc, unit="q", disable=not progress) as bar:
        for condition in IMAGE_CONDITIONS:
            images = [row.image_path if condition == "real" else blank for row in rows]
            answers = []
            for start in range(0, len(rows), batch_size):
                answers += generate_batch(model, processor, prompts[start:start + batch_size],
                                          images[start:start + batch_size], max_new_tokens=max_new_tokens,
                                          batch_size=batch_size)
                bar.update(len(prompts[start:start + batch_size]))
            predictions[condition] = answers
    scores = Scores()
    for condition in IMAGE_CONDITIONS:
        hits, totals = defaultdict(int), defaultdict(int)
        for row, predicted in zip(rows, predictions[condition]):
            hits[row.template] += normalize_answer(predicted) == normalize_answer(row.answer)
            totals[row.template] += 1
        per_template = {name: hits[name] / totals[name] for name in sorted(totals)}
        per_template["avg"] = sum(per_template.values()) / len(per_template)
        scores.accuracy[condition] = per_template
    scores.visual_gain = scores.accuracy["real"]["avg"] - scores.accuracy["blank"]["avg"]
    scores.examples = [
        {"question": row.question, "answer": row.answer, "real": real, "blank": blank_answer}
        for row, real, blank_answer in list(zip(rows, predictions["real"], predictions["blank"]))[:8]
    ]
    return scores
