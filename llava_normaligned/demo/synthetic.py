"""A synthetic visual-question dataset in the LLaVA JSON format: shapes, colours, counts, positions.

    llava-normaligned make-data --output-dir ./shapes
    llava-normaligned train --stage 1 --model ./model --data-path ./shapes/pretrain.json --image-folder ./shapes ...
    llava-normaligned train --stage 2 --model ./stage1 --data-path ./shapes/instruct.json --image-folder ./shapes ...

Each image is a square canvas cut into a 2x2 grid; each cell is empty or holds one coloured shape. The files:

- ``pretrain.json``: one caption per training image ("Describe the image." -> every shape with its place), the
  stage-1 data (LLaVA-558K is captions too);
- ``instruct.json``: one question per training image, the stage-2 data (the format of llava_v1_5_mix665k);
- ``test.json``: held-out questions about images whose scenes never occur in the training split;
- ``images/{train,test}/*.png`` and ``dataset_info.json`` (the spec, the templates, the counts).

A tiny model trained for minutes learns the answer priors of a question template long before it learns to look
(STACK-NOTES "Tiny VLMs on CPU"). So answers are balanced within every distinct question text: for each question
and each of its answers there are equally many rows, and a model that reads only the text scores exactly chance
(``text_only_accuracy`` computes the best such score from a split). Images are drawn to fit the answer, not the
other way round.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from PIL import Image, ImageDraw
from tqdm.auto import tqdm

COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (230, 200, 30)}
KINDS = ("circle", "square", "triangle", "cross")
# Cells of the 2x2 grid in reading order: (row, column).
POSITIONS = {"top left": (0, 0), "top right": (0, 1), "bottom left": (1, 0), "bottom right": (1, 1)}
NUMBER_WORDS = ("zero", "one", "two", "three", "four")
BACKGROUND = (245, 245, 240)

CAPTION_PROMPT = "Describe the image."

# The corpus of the CPU demo's tokenizer: trained on these, it makes every word the dataset writes one token (the
# tests check it).
VOCABULARY = tuple(sorted({
    ",", ".", "?", "A", "Blue", "Bottom", "Circle", "Cross", "Describe", "Four", "Green", "How", "One", "Red",
    "Square", "Three", "Top", "Triangle", "Two", "What", "Where", "Yellow", "Zero", "an", "and", "are", "at",
    "bottom", "colour", "empty", "image", "in", "is", "it", "kind", "left", "many", "of", "right", "shape",
    "shapes", "the", "there", "top", "which",
} | set(COLOURS) | set(KINDS) | set(NUMBER_WORDS)))


@dataclass
class SyntheticSpec:
    """What ``make_dataset`` draws. Row counts are per question template; every template has four answers."""

    image_size: int = 32  # pixels; a multiple of 2 (the grid). The demo's vision encoder uses 8-px patches.
    train_per_template: int = 1024  # instruct.json rows per template (pretrain.json has one caption per image)
    test_per_template: int = 64  # test.json rows per template
    seed: int = 0
    jitter: int = 1  # pixels a shape may shift inside its cell, so no two cells render alike pixel for pixel

    def __post_init__(self):
        if not isinstance(self.image_size, int) or self.image_size < 8 or self.image_size % 2:
            raise ValueError(f"image_size must be an even integer >= 8, got {self.image_size!r}")
        for name in ("train_per_template", "test_per_template"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0 or value % 16:
                raise ValueError(
                    f"{name} must be a positive multiple of 16 (every question text x answer gets equally many "
                    f"rows), got {value!r}"
                )
        if not isinstance(self.jitter, int) or not 0 <= self.jitter <= self.image_size // 8:
            raise ValueError(f"jitter must be an integer in [0, image_size // 8], got {self.jitter!r}")


# ------------------------------------------------------------------------------------------------------- scenes


@dataclass(frozen=True)
class Shape:
    colour: str
    kind: str


@dataclass
class Scene:
    """The content of the four cells in reading order (None = empty) and the per-shape pixel offsets."""

    cells: tuple  # 4 x (Shape | None)
    offsets: tuple = field(default=((0, 0),) * 4)

    def key(self) -> tuple:
        """What the scene shows, without the jitter: train and test never share one."""
        return tuple(None if s is None else (s.colour, s.kind) for s in self.cells)

    def caption(self) -> str:
        """'A red circle at the top left and a blue cross at the bottom right.' (cells in reading order)"""
        parts = [
            f"{'an' if shape.colour[0] in 'aeiou' else 'a'} {shape.colour} {shape.kind} at the {position}"
            for shape, position in zip(self.cells, POSITIONS)
            if shape is not None
        ]
        text = " and ".join(parts) + "."
        return text[0].upper() + text[1:]


def _random_shape(rng: random.Random) -> Shape:
    return Shape(rng.choice(list(COLOURS)), rng.choice(KINDS))


def fill_cells(rng: random.Random, fixed: dict, count: int | None = None) -> list:
    """Four cells: ``fixed`` (cell -> Shape) kept, each other one empty or holding a random shape (even odds). With
    ``count``, exactly that many cells are occupied."""
    free = [c for c in range(4) if c not in fixed]
    if count is None:
        occupied = [c for c in free if rng.random() < 0.5]
    else:
        occupied = rng.sample(free, count - len(fixed))
    cells = [fixed.get(c) for c in range(4)]
    for c in occupied:
        cells[c] = _random_shape(rng)
    return cells


# ---------------------------------------------------------------------------------------------------- templates
# A template maps a question slot value and an answer to a scene where that answer is right. Each yields
# (question text, answer text, scene); its question texts x answers are enumerated so that rows balance exactly.


def capitalise(word: str) -> str:
    return word[0].upper() + word[1:]


def _count_scene(rng, slot, answer):
    return fill_cells(rng, {}, count=NUMBER_WORDS.index(answer))


def _single(rng, cell=None, colour=None, kind=None):
    """One shape, everything not given drawn at random; the other cells empty."""
    cell = rng.randrange(4) if cell is None else cell
    shape = Shape(colour or rng.choice(list(COLOURS)), kind or rng.choice(KINDS))
    return [shape if c == cell else None for c in range(4)]


def _single_colour_scene(rng, slot, answer):
    return _single(rng, colour=answer)


def _single_kind_scene(rng, slot, answer):
    return _single(rng, kind=answer)


def _single_position_scene(rng, slot, answer):
    return _single(rng, cell=list(POSITIONS).index(answer))


def _colour_at_scene(rng, slot, answer):
    # The asked cell holds a shape of the answer's colour; each other cell is empty or holds a random shape, so
    # the question binds a place to a colour.
    cell = list(POSITIONS).index(slot)
    return fill_cells(rng, {cell: Shape(answer, rng.choice(KINDS))})


@dataclass(frozen=True)
class Template:
    name: str
    question: str  # format string with {slot}, or a fixed text
    slots: tuple  # values of {slot}; (None,) for a fixed question
    answers: tuple  # the four answer words (lower case); the row's answer is capitalised
    scene: callable

    def question_text(self, slot) -> str:
        return self.question.format(slot=slot)


# "count" looks at the whole image; "colour", "shape" and "position" read one property of a single shape; "colour_at"
# binds a place to a colour among up to four shapes (the hardest for a tiny model).
TEMPLATES = (
    Template("count", "How many shapes are there?", (None,), NUMBER_WORDS[1:], _count_scene),
    Template("colour", "What colour is the shape?", (None,), tuple(COLOURS), _single_colour_scene),
    Template("shape", "What shape is in the image?", (None,), KINDS, _single_kind_scene),
    Template("position", "Where is the shape?", (None,), tuple(POSITIONS), _single_position_scene),
    Template("colour_at", "What colour is the shape at the {slot}?", tuple(POSITIONS), tuple(COLOURS),
             _colour_at_scene),
)


# --------------------------------------------------------------------------------------------------- rendering


def render(scene: Scene, image_size: int) -> Image.Image:
    """Draw the scene: each shape fills about 3/4 of its cell, shifted by its offset."""
    image = Image.new("RGB", (image_size, image_size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    cell = image_size // 2
    margin = max(1, cell // 8)
    for index, shape in enumerate(scene.cells):
        if shape is None:
            continue
        row, col = divmod(index, 2)
        dx, dy = scene.offsets[index]
        x0, y0 = col * cell + margin + dx, row * cell + margin + dy
        x1, y1 = x0 + cell - 2 * margin - 1, y0 + cell - 2 * margin - 1
        colour = COLOURS[shape.colour]
        if shape.kind == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        elif shape.kind == "square":
            draw.rectangle((x0, y0, x1, y1), fill=colour)
        elif shape.kind == "triangle":
            draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=colour)
        else:  # cross: two bars a third of the cell wide
            w = max(1, (x1 - x0) // 3)
            mx, my = (x0 + x1) // 2, (y0 + y1) // 2
            draw.rectangle((mx - w // 2, y0, mx + w // 2, y1), fill=colour)
            draw.rectangle((x0, my - w // 2, x1, my + w // 2), fill=colour)
    return image


def blank_image(image_size: int) -> Image.Image:
    """The canvas with nothing on it: what the demo scores every model on a second time."""
    return Image.new("RGB", (image_size, image_size), BACKGROUND)


# ------------------------------------------------------------------------------------------------------- splits


@dataclass
class Row:
    template: str
    question: str
    answer: str
    scene: Scene


# One scene in four (by a stable hash of what it shows) belongs to the test split, the rest to training: the splits
# never share a scene, and each still holds scenes for every question/answer pair. There are only 64 one-shape
# scenes (16 per colour, kind or place), so refusing "every scene training drew" would leave the test split none,
# and a smaller test share could leave an answer without a held-out scene.
TEST_SCENE_SHARE = 4
MAX_DRAWS = 10_000


def is_test_scene(key: tuple) -> bool:
    return hashlib.sha256(repr(key).encode()).digest()[0] % TEST_SCENE_SHARE == 0


def _balanced_rows(rng: random.Random, spec: SyntheticSpec, per_template: int, split: str) -> list[Row]:
    """``per_template`` rows per template, equally many for every (question text, answer) pair, shuffled; every
    scene belongs to ``split`` ("train" or "test")."""
    want_test = split == "test"
    rows = []
    for template in TEMPLATES:
        pairs = [(slot, answer) for slot in template.slots for answer in template.answers]
        repeats = per_template // len(pairs)  # SyntheticSpec checks per_template is a multiple of 16 (>= pairs)
        for slot, answer in pairs:
            for _ in range(repeats):
                for _ in range(MAX_DRAWS):
                    scene = Scene(tuple(template.scene(rng, slot, answer)), random_offsets(rng, spec.jitter))
                    if is_test_scene(scene.key()) == want_test:
                        break
                else:  # cannot happen for the templates above; a guard against an edited template looping forever
                    raise RuntimeError(f"template {template.name!r}: no {split} scene for {slot!r} -> {answer!r}")
                rows.append(Row(template.name, template.question_text(slot), capitalise(answer), scene))
    rng.shuffle(rows)
    return rows


def random_offsets(rng: random.Random, jitter: int) -> tuple:
    return tuple((rng.randint(-jitter, jitter), rng.randint(-jitter, jitter)) for _ in range(4))


def text_only_accuracy(records: list[dict]) -> dict[str, float]:
    """The best accuracy a model that never looks at the image can reach on ``records`` (rows of a split's JSON):
    per template, it answers each distinct question text with that text's most frequent answer."""
    by_question = defaultdict(Counter)
    template_of = {}
    for record in records:
        question, answer = _question_answer(record)
        by_question[question][answer] += 1
        template_of[question] = record.get("template", "?")
    hits, totals = Counter(), Counter()
    for question, answers in by_question.items():
        hits[template_of[question]] += max(answers.values())
        totals[template_of[question]] += sum(answers.values())
    return {name: hits[name] / totals[name] for name in sorted(totals)}


def _question_answer(record: dict) -> tuple[str, str]:
    from llava_normaligned.generation import without_image_tags

    turns = record["conversations"]
    return without_image_tags(turns[0]["value"]), turns[1]["value"]


# --------------------------------------------------------------------------------------------------- writing


def _record(row_id: str, image: str, question: str, answer: str, template: str, scene: Scene) -> dict:
    # llava_v1_5_mix665k layout. Extra keys LLaVA loaders ignore: "template" (read by the demo's scorer) and
    # "scene" (what the image shows, as its caption: the split tests check train and test share none).
    return {
        "id": row_id,
        "image": image,
        "conversations": [
            {"from": "human", "value": f"<image>\n{question}"},
            {"from": "gpt", "value": answer},
        ],
        "template": template,
        "scene": scene.caption(),
    }


@dataclass
class DatasetPaths:
    root: str
    pretrain: str
    instruct: str
    test: str
    info: str


def dataset_paths(root: str) -> DatasetPaths:
    return DatasetPaths(
        root=root,
        pretrain=os.path.join(root, "pretrain.json"),
        instruct=os.path.join(root, "instruct.json"),
        test=os.path.join(root, "test.json"),
        info=os.path.join(root, "dataset_info.json"),
    )


def make_dataset(output_dir: str, spec: SyntheticSpec | None = None, progress: bool = True) -> DatasetPaths:
    """Write the dataset to ``output_dir`` (created; must be empty or absent) and return its file paths.

    Deterministic: the same spec gives byte-identical files. Written to a temporary sibling folder and moved into
    place at the end, so an interrupted run leaves no half-written dataset.
    """
    spec = spec or SyntheticSpec()
    if os.path.exists(output_dir) and os.listdir(output_dir):
        raise FileExistsError(f"make-data: output folder {output_dir!r} exists and is not empty")
    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".make-data-", dir=parent)
    try:
        _write(staging, spec, progress)
        if os.path.exists(output_dir):
            os.rmdir(output_dir)
        os.replace(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dataset_paths(output_dir)


def _write(root: str, spec: SyntheticSpec, progress: bool) -> None:
    rng = random.Random(spec.seed)
    train_rows = _balanced_rows(rng, spec, spec.train_per_template, "train")
    test_rows = _balanced_rows(rng, spec, spec.test_per_template, "test")
    paths = dataset_paths(root)
    splits = {"train": train_rows, "test": test_rows}
    records = {"pretrain": [], "instruct": [], "test": []}
    total = len(train_rows) + len(test_rows)
    with tqdm(total=total, desc="make-data: images", unit="img", disable=not progress) as bar:
        for split, rows in splits.items():
            os.makedirs(os.path.join(root, "images", split))
            for index, row in enumerate(rows):
                name = f"images/{split}/{index:06d}.png"
                render(row.scene, spec.image_size).save(os.path.join(root, name), optimize=False)
                row_id = f"{split}-{index:06d}"
                if split == "train":
                    records["pretrain"].append(_record(row_id, name, CAPTION_PROMPT, row.scene.caption(), "caption", row.scene))
                    records["instruct"].append(_record(row_id, name, row.question, row.answer, row.template, row.scene))
                else:
                    records["test"].append(_record(row_id, name, row.question, row.answer, row.template, row.scene))
                bar.update(1)
    for name in ("pretrain", "instruct", "test"):
        with open(getattr(paths, name), "w") as f:
            json.dump(records[name], f, indent=1)
    info = {
        "spec": asdict(spec),
        "templates": {t.name: {"question": t.question, "slots": list(t.slots), "answers": list(t.answers)}
                      for t in TEMPLATES},
        "rows": {name: len(rs) for name, rs in records.items()},
        "chance_accuracy": {t.name: 1 / len(t.answers) for t in TEMPLATES},
        "text_only_accuracy_test": text_only_accuracy(records["test"]),
        "caption_prompt": CAPTION_PROMPT,
        "background": list(BACKGROUND),
    }
    with open(paths.info, "w") as f:
        json.dump(info, f, indent=1)
