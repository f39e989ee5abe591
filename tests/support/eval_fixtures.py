"""Offline copies of every benchmark, a few rows each, in the benchmark's own Hub schema (images drawn in code).

Written the ways a user would put a copy under ``--data-dir``: parquet files in the Hub's layout
(``data/<split>-00000-of-00001.parquet``), a single ``Dataset.to_parquet`` file, or a ``save_to_disk`` folder.
The column sets are those of the Hub datasets named in ``llava_normaligned.evaluation.tasks`` (extra columns the
scorer does not read are kept, as the Hub has them).
"""

from __future__ import annotations

import os

from PIL import Image


def image(colour: tuple[int, int, int], size: int = 24) -> Image.Image:
    return Image.new("RGB", (size, size), colour)


RED, GREEN, BLUE = (220, 40, 40), (40, 170, 60), (40, 80, 220)


def pope_rows() -> list[dict]:
    rows = []
    for i, (category, answer) in enumerate(
        [("adversarial", "yes"), ("adversarial", "no"), ("popular", "yes"), ("popular", "no"), ("random", "yes"),
         ("random", "no")]
    ):
        rows.append({
            "id": str(i), "question_id": str(i + 1), "question": f"Is there a {'dog' if i % 2 else 'cat'} in the image?",
            "answer": answer, "image_source": f"COCO_val2014_{i:012d}", "image": image(RED), "category": category,
        })
    return rows


def mmbench_rows() -> list[dict]:
    base = dict(source="synthetic", split="dev", comment=None, image=None)
    return [
        {**base, "index": 0, "question": "What colour is the square?", "hint": None, "A": "red", "B": "green",
         "C": "blue", "D": "nan", "answer": "A", "category": "color_recognition", "L2-category": "finegrained_perception",
         "image": image(RED)},
        {**base, "index": 1, "question": "Which shape is shown?", "hint": "Look at the centre.", "A": "circle",
         "B": "square", "C": "triangle", "D": "cross", "answer": "B", "category": "object_localization",
         "L2-category": "finegrained_perception", "image": image(GREEN)},
        # circular copy of question 0 with its options rotated (MMBench: index + 1e6)
        {**base, "index": 1_000_000, "question": "What colour is the square?", "hint": "nan", "A": "green",
         "B": "blue", "C": "red", "D": "nan", "answer": "C", "category": "color_recognition",
         "L2-category": "finegrained_perception", "image": image(RED)},
    ]


def mmstar_rows() -> list[dict]:
    return [
        {"index": i, "question": "Which colour fills the image?\nOptions: A: red, B: green, C: blue, D: grey",
         "image": image(c), "answer": a, "category": cat, "l2_category": l2, "meta_info": "{}"}
        for i, (c, a, cat, l2) in enumerate([
            (RED, "A", "coarse perception", "image scene and topic"),
            (GREEN, "B", "fine-grained perception", "recognition"),
            (BLUE, "C", "math", "geometry"),
        ])
    ]


def seedbench_rows() -> list[dict]:
    return [
        {"question_id": str(i), "question": "What is the highest bar's label?", "choice_A": "2019", "choice_B": "2020",
         "choice_C": "2021", "choice_D": "2022", "answer": a, "question_image_type": kind,
         "question_image_subtype": "bar chart", "data_id": f"text_rich/{i}.png", "data_source": "SEED-Bench v2 plus",
         "data_type": "Single Image", "level": "L1", "subpart": "Single-Image & Text Comprehension", "version": "v2+",
         "image": image(BLUE)}
        for i, (a, kind) in enumerate([("A", "chart"), ("C", "map"), ("D", "web")])
    ]


def ocrbench_rows() -> list[dict]:
    return [
        {"dataset": "IIIT5K", "question": "what is written in the image?", "answer": ["Hello"],
         "question_type": "Regular Text Recognition", "image": image(GREEN)},
        {"dataset": "HME100k", "question": "Please write out the expression of the formula in the image using LaTeX format.",
         "answer": ["x ^ { 2 }"], "question_type": "Handwritten Mathematical Expression Recognition", "image": image(RED)},
        {"dataset": "docVQA", "question": "What is the date?", "answer": ["May 5", "5 May"],
         "question_type": "Doc-oriented VQA", "image": image(BLUE)},
    ]


def scienceqa_rows() -> list[dict]:
    extra = dict(task="closed choice", grade="grade4", topic="physics", category="Velocity", skill="x", lecture="",
                 solution="")
    return [
        {**extra, "image": image(RED), "question": "Which object is red?", "choices": ["ball", "leaf"], "answer": 0,
         "hint": "", "subject": "natural science"},
        {**extra, "image": image(GREEN), "question": "Which continent is highlighted?",
         "choices": ["Asia", "Europe", "Africa"], "answer": 2, "hint": "This is a map.", "subject": "social science"},
    ]


def ai2d_rows() -> list[dict]:
    return [
        {"question": "Which label shows the sun?", "options": ["A", "B", "C", "D"], "answer": "1", "image": image(BLUE)},
        {"question": "What eats the grass?", "options": ["rabbit", "hawk", "sun", "soil"], "answer": "0",
         "image": image(GREEN)},
    ]


def hellaswag_rows() -> list[dict]:
    return [
        {"ind": 24, "activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he",
         "ctx": "A man is sitting on a roof. he", "endings": [
             "is using wrap to wrap a pair of skis.", "is ripping level tiles off.",
             "is holding a rubik's cube.", "starts pulling up roofing on a roof."],
         "source_id": "activitynet~v_-JhWjGDPHMY", "split": "val", "split_type": "indomain", "label": "3"},
        {"ind": 92, "activity_label": "Clean and jerk", "ctx_a": "A lady walks to a barbell.",
         "ctx_b": "she", "ctx": "A lady walks to a barbell. she", "endings": [
             "bends down and grabs the pole.", "swings and lands in her arms.", "pulls a rope [title] tight.",
             "stands and throws the bar."],
         "source_id": "activitynet~v_-lJS58hyo1c", "split": "val", "split_type": "zeroshot", "label": "0"},
    ]


def mmlu_rows() -> list[dict]:
    return [
        {"question": "What is 2 + 2?", "subject": "elementary_mathematics", "choices": ["3", "4", "5", "6"], "answer": 1},
        {"question": "Who wrote the Republic?", "subject": "philosophy",
         "choices": ["Plato", "Kant", "Hume", "Locke"], "answer": 0},
    ]


ROWS = {
    "pope": pope_rows,
    "mmbench_en_dev": mmbench_rows,
    "mmstar": mmstar_rows,
    "seedbench_2_plus": seedbench_rows,
    "ocrbench": ocrbench_rows,
    "scienceqa_img": scienceqa_rows,
    "ai2d": ai2d_rows,
    "hellaswag": hellaswag_rows,
    "mmlu": mmlu_rows,
}
# how each copy is written: the Hub's parquet layout, one to_parquet file, or save_to_disk (Dataset / DatasetDict)
LAYOUT = {
    "pope": "hub",
    "mmbench_en_dev": "hub",
    "mmstar": "to_parquet",
    "seedbench_2_plus": "save_to_disk",
    "ocrbench": "hub",
    "scienceqa_img": "dataset_dict",
    "ai2d": "to_parquet",
    "hellaswag": "hub",
    "mmlu": "to_parquet",
}


def to_dataset(rows: list[dict]):
    """A datasets.Dataset with PIL columns typed as Image(), as the Hub copies are."""
    from datasets import Dataset
    from datasets import Image as ImageFeature

    dataset = Dataset.from_list(rows)
    if "image" in dataset.column_names:
        dataset = dataset.cast_column("image", ImageFeature())
    return dataset


def write_copy(task: str, data_dir: str, rows: list[dict] | None = None, layout: str | None = None) -> str:
    """Write ``rows`` (default: the task's fixture rows) as DATA_DIR/TASK in ``layout``; returns the folder."""
    from llava_normaligned.evaluation.tasks import TASKS

    split = TASKS[task].hub.split
    folder = os.path.join(data_dir, task)
    dataset = to_dataset(rows if rows is not None else ROWS[task]())
    layout = layout or LAYOUT[task]
    if layout == "hub":
        dataset.to_parquet(os.path.join(folder, "data", f"{split}-00000-of-00001.parquet"))
    elif layout == "to_parquet":
        dataset.to_parquet(os.path.join(folder, f"{split}.parquet"))
    elif layout == "save_to_disk":
        dataset.save_to_disk(folder)
    elif layout == "dataset_dict":
        from datasets import DatasetDict

        DatasetDict({split: dataset, "validation": dataset.select([0])}).save_to_disk(folder)
    else:
        raise ValueError(layout)
    return folder


SYNTHETIC_TEST_PER_TEMPLATE = 16


def synthetic_test_rows() -> int:
    """How many test questions `write_synthetic` writes: 16 per question template of the dataset."""
    from llava_normaligned.demo.synthetic import TEMPLATES

    return SYNTHETIC_TEST_PER_TEMPLATE * len(TEMPLATES)


NOT_WEIGHTS = b"not weights: a command that reads this file fails loudly"


def trap_model(folder, config=None, weights: bool = True) -> str:
    """A model folder that passes the command line's checks (``config``, a transformers config, saved; else an empty
    config.json) with a weight file that is not weights (``weights``): loading it fails, so a test that passes it
    shows the model was never read."""
    os.makedirs(folder, exist_ok=True)
    if config is not None:
        config.save_pretrained(folder)
    else:
        with open(os.path.join(folder, "config.json"), "w") as handle:
            handle.write("{}")
    if weights:
        with open(os.path.join(folder, "model.safetensors"), "wb") as handle:
            handle.write(NOT_WEIGHTS)
    return str(folder)


def write_synthetic(data_dir: str) -> str:
    """The demo's held-out split, written by `make-data` itself (16 test questions per template, 32-px images)."""
    from llava_normaligned.demo.synthetic import SyntheticSpec, make_dataset

    folder = os.path.join(data_dir, "synthetic")
    make_dataset(folder, SyntheticSpec(train_per_template=16, test_per_template=SYNTHETIC_TEST_PER_TEMPLATE), progress=False)
    return folder


def write_all(data_dir: str) -> str:
    for task in ROWS:
        write_copy(task, data_dir)
    write_synthetic(data_dir)
    return data_dir


# ---- fixed answers: the model's side replaced, everything else (build, extract, judge, score) as in a real run ----
def answer_table(data_dir: str, answers: dict) -> dict:
    """{(prompt or context, doc_id): answer} for the rows of each task's copy under ``data_dir``. ``answers[task]``
    is a list (one answer per row: a string for generation, the options' log-likelihoods for log-likelihood tasks)
    or a function (row index, request) -> answer. Rows that cannot become a request are left out."""
    from llava_normaligned.evaluation.data import load_split
    from llava_normaligned.evaluation.tasks import TASKS

    table = {}
    for task, given in answers.items():
        split = load_split(TASKS[task], data_dir)
        for idx in range(len(split)):
            try:
                request = TASKS[task].build(split.rows[idx], idx)
            except (ValueError, KeyError, TypeError):  # the row fails in the run too: no answer needed
                continue
            key = (getattr(request, "prompt", None) or request.context, request.doc_id)
            table[key] = given[idx] if isinstance(given, list) else given(idx, request)
    return table


def use_fixed_answers(monkeypatch, table: dict, fail=lambda request: False) -> None:
    """Make generation answer (and log-likelihood scoring score) from ``table``; a batch holding a request for which
    ``fail(request)`` is true raises, as a device error would."""
    from llava_normaligned.evaluation import batches, loglik

    def generate(model, processor, requests, max_new_tokens):
        if any(fail(r) for r in requests):
            raise RuntimeError("CUDA error: device-side assert (simulated)")
        return [table[(r.prompt, r.doc_id)] for r in requests]

    def score(model, tokenizer, requests, batch_size):
        return [table[(r.context, r.doc_id)] for r in requests]

    monkeypatch.setattr(batches, "generate_answers", generate)
    monkeypatch.setattr(loglik, "score_requests", score)


# ---- the same rows in the Hub cache that `datasets` reads offline, under lmms-eval's dataset ids ----
# lmms-eval 0.7.3's task name -> (Hub dataset id, config, {split: fixture rows}). The Hub ids are lmms-eval's own
# (its copies under lmms-lab-encoder/, MMLU as hails/mmlu_no_train with one config per subject), the rows the
# fixtures above, so both harnesses score the same rows.
def _mmlu_subject_rows(subject: str) -> list[dict]:
    return [{**row, "subject": subject} for row in mmlu_rows() if row["subject"] == subject] or [
        {"question": f"Which letter comes first in {subject.replace('_', ' ')}?", "subject": subject,
         "choices": ["B", "A", "C", "D"], "answer": 1}]


def lmms_datasets() -> dict[str, list[tuple[str, str | None, dict[str, list[dict]]]]]:
    from llava_normaligned.evaluation.prompts import MMLU_SUPERCATEGORY

    return {
        "pope": [("lmms-lab-encoder/POPE", None, {"test": pope_rows()})],
        "mmbench_en_dev": [("lmms-lab-encoder/MMBench", "en", {"dev": mmbench_rows()})],
        "mmstar": [("Lin-Chen/MMStar", None, {"val": mmstar_rows()})],
        "seedbench_2_plus": [("doolayer/SEED-Bench-2-Plus", None, {"test": seedbench_rows()})],
        "ocrbench": [("echo840/OCRBench", None, {"test": ocrbench_rows()})],
        "scienceqa_img": [("lmms-lab-encoder/ScienceQA", "ScienceQA-IMG", {"test": scienceqa_rows()})],
        "ai2d": [("lmms-lab-encoder/ai2d", None, {"test": ai2d_rows()})],
        "hellaswag": [("hellaswag", None, {"train": hellaswag_rows()[:1], "validation": hellaswag_rows()})],
        "mmlu": [("hails/mmlu_no_train", subject, {"test": _mmlu_subject_rows(subject), "dev": _mmlu_subject_rows(subject)})
                 for subject in sorted(MMLU_SUPERCATEGORY)],
    }


def write_hub_cache(hf_home: str, repo_id: str, config: str | None, splits: dict[str, list[dict]]) -> str:
    """Write ``splits`` as ``datasets`` caches a Hub dataset it has loaded once:
    ``HF_HOME/datasets/ORG___name/CONFIG/0.0.0/HASH/`` with ``dataset_info.json`` and one Arrow stream file per split
    (``name-split.arrow``). With ``HF_HUB_OFFLINE=1``, ``load_dataset(repo_id, config)`` reads it back. Returns it."""
    import datasets
    import pyarrow as pa
    from datasets.naming import camelcase_to_snakecase

    *namespace, short = repo_id.split("/")
    name = camelcase_to_snakecase(short)
    config = config or "default"
    folder = os.path.join(hf_home, "datasets", "___".join(namespace + [name]), config, "0.0.0", "fixture")
    os.makedirs(folder, exist_ok=True)
    split_dict = datasets.SplitDict(dataset_name=name)
    features = None
    for split, rows in splits.items():
        dataset = to_dataset(rows)
        features = dataset.features
        table = dataset.data.table
        with pa.OSFile(os.path.join(folder, f"{name}-{split}.arrow"), "wb") as sink, \
                pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        split_dict.add(datasets.SplitInfo(name=split, num_examples=len(dataset), num_bytes=table.nbytes,
                                          dataset_name=name))
    datasets.DatasetInfo(features=features, config_name=config, dataset_name=name, splits=split_dict,
                         version="0.0.0").write_to_directory(folder)
    return folder


def write_lmms_cache(hf_home: str, tasks) -> str:
    """Every dataset lmms-eval reads for ``tasks`` (its task names), in the offline cache under ``hf_home``."""
    table = lmms_datasets()
    for task in tasks:
        for repo_id, config, splits in table[task]:
            write_hub_cache(hf_home, repo_id, config, splits)
    return hf_home
