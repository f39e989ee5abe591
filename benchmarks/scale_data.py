"""LLaVA-558K- and llava_v1_5_mix665k-shaped training files, generated in code (for ``bench_data.py`` and the scale
tests). Nothing is downloaded.

* ``write_pretrain_json`` (LLaVA-558K, ``blip_laion_cc_sbu_558k.json``): one image per row, one of LLaVA's brief
  caption prompts with the ``<image>`` tag before or after it, a short caption (5-30 words, BLIP-style), image
  paths ``00453/004539375.jpg`` in ~1,000-file folders.
* ``write_mix_json`` (llava_v1_5_mix665k): the mixture's sources in its proportions: LLaVA-Instruct conversations
  and long answers (COCO), multi-round short-answer VQA (VQAv2, GQA, OCR-VQA, TextVQA), region descriptions (VG,
  RefCOCO), and ~6% text-only ShareGPT conversations whose lengths have a long tail (some longer than a 2,048-token
  ``max_length`` even without an image). Rows share images as the real mixture does (several sources use COCO).
* ``write_images``: the image files the rows name, in their nested folders: a few distinct tiny PNGs, each path a
  file of its own (copied, not hard-linked, so a cold-cache check touches one inode per file as real data does).

Sizes are ``n_rows``; the real files have 558,128 and 665,298 rows.
"""

from __future__ import annotations

import io
import json
import os
import random

PRETRAIN_ROWS = 558_128
MIX_ROWS = 665_298

WORDS = ["a", "the", "of", "and", "in", "on", "with", "at", "by", "from", "to", "for", "is", "are", "was", "two", "three", "small", "large", "red", "blue", "green", "white", "black", "yellow", "brown", "grey", "old", "new", "wooden", "metal", "glass", "stone", "young", "man", "woman", "child", "dog", "cat", "bird", "horse", "car", "bus", "train", "truck", "bike", "boat", "plane", "street", "road", "city", "building", "house", "room", "kitchen", "table", "chair", "bed", "sofa", "window", "door", "wall", "floor", "tree", "grass", "field", "beach", "water", "river", "lake", "sea", "mountain", "sky", "cloud", "sun", "snow", "rain", "night", "day", "light", "shadow", "person", "people", "group", "crowd", "player", "team", "game", "ball", "field", "court", "stand", "sitting", "standing", "walking", "running", "riding", "holding", "looking", "wearing", "playing", "eating", "drinking", "carrying", "shirt", "dress", "hat", "jacket", "bag", "phone", "book", "sign", "logo", "text", "picture", "photo", "image", "view", "close", "up", "background", "front", "side", "top", "bottom", "left", "right", "middle", "near", "behind", "next", "under", "over", "inside", "outside", "flowers", "plate", "food", "pizza", "sandwich", "cake", "fruit", "apple", "banana", "orange", "bowl", "cup", "bottle", "computer", "laptop", "screen", "keyboard", "clock", "vase", "umbrella", "kite", "surfboard", "skateboard", "skis", "bench", "fence", "pole", "traffic", "light", "parking", "lot", "sidewalk", "store", "market", "shop", "restaurant", "office", "park", "garden", "yard", "farm", "animal", "cow", "sheep", "elephant", "giraffe", "zebra", "bear", "vintage", "modern", "design", "style", "pattern", "colour", "shape", "detail", "scene", "portrait", "illustration", "poster", "cover", "vector", "icon", "template", "set", "collection", "luxury", "furniture", "home", "decor", "wedding", "party", "summer", "winter", "autumn", "spring", "beautiful", "happy", "bright", "dark", "colorful", "simple", "elegant", "classic", "premium", "quality", "because", "however", "although", "therefore", "which", "that", "this", "these", "those", "there", "here", "then", "when", "while", "where", "why", "how", "what", "who", "would", "could", "should", "might", "will", "can", "may", "must", "has", "have", "had", "does", "did", "been", "being", "very", "quite", "rather", "also", "only", "just", "even", "still", "already", "often", "usually", "sometimes", "always", "never", "several", "many", "much", "more", "most", "less", "important", "different", "similar", "possible", "likely", "certain", "various", "specific", "particular", "general", "overall", "example"]

BRIEF_PROMPTS = [  # LLaVA's stage-1 instructions (brief description)
    "Describe the image concisely.", "Provide a brief description of the given image.",
    "Offer a succinct explanation of the picture presented.", "Summarize the visual content of the image.",
    "Give a short and clear explanation of the subsequent image.", "Share a concise interpretation of the image provided.",
    "Present a compact description of the photo's key features.", "Relay a brief, clear account of the picture shown.",
    "Render a clear and concise summary of the photo.", "Write a terse but informative summary of the picture.",
    "Create a compact narrative representing the image presented.",
]
SHORT_ANSWER = "Answer the question using a single word or phrase."
IMAGE_TAG = "<image>"

# (source, share of mix665k rows, image folder or None for text-only)
MIX_SOURCES = [
    ("llava_conv", 0.087, "coco/train2017"), ("llava_detail", 0.035, "coco/train2017"),
    ("llava_complex", 0.116, "coco/train2017"), ("vqav2", 0.125, "coco/train2017"), ("gqa", 0.108, "gqa/images"),
    ("ocr_vqa", 0.120, "ocr_vqa/images"), ("textvqa", 0.033, "textvqa/train_images"), ("vg", 0.130, "vg/VG_100K"),
    ("refcoco", 0.185, "coco/train2014"), ("sharegpt", 0.061, None),
]
# distinct images per folder relative to its rows (COCO is shared by several sources, VQA rows group questions)
IMAGE_POOL = {"coco/train2017": 118_000, "gqa/images": 72_000, "ocr_vqa/images": 80_000,
              "textvqa/train_images": 22_000, "vg/VG_100K": 86_000, "coco/train2014": 40_000}


class _Text:
    """Fast random English-like text: spans of a word corpus and of a sentence corpus generated once (O(1) a call)."""

    def __init__(self, rng: random.Random, corpus_words: int = 400_000):
        self.rng = rng
        words = rng.choices(WORDS, k=corpus_words)
        self.corpus = " ".join(words)
        self.word_starts = [0]
        for word in words:
            self.word_starts.append(self.word_starts[-1] + len(word) + 1)
        sentences, self.sentence_starts = [], [0]
        position = 0
        while position < corpus_words - 30:
            k = rng.randint(6, 22)
            sentence = " ".join(words[position : position + k]).capitalize() + "."
            sentences.append(sentence)
            self.sentence_starts.append(self.sentence_starts[-1] + len(sentence) + 1)
            position += k
        self.sentence_corpus = " ".join(sentences)

    def _span(self, corpus: str, starts: list[int], n: int) -> str:
        n = max(1, min(n, len(starts) - 2))
        first = int(self.rng.random() * (len(starts) - 1 - n))
        return corpus[starts[first] : starts[first + n] - 1]

    def words(self, low: int, high: int) -> str:
        return self._span(self.corpus, self.word_starts, low + int(self.rng.random() * (high - low + 1)))

    def sentences_(self, n: int) -> str:
        return self._span(self.sentence_corpus, self.sentence_starts, n)

    def phrase(self) -> str:
        return self.words(1, 3)

    def question(self) -> str:
        return self.words(4, 12).capitalize() + "?"


def _tagged(prompt: str, rng: random.Random) -> str:
    return f"{IMAGE_TAG}\n{prompt}" if rng.random() < 0.5 else f"{prompt}\n{IMAGE_TAG}"


def pretrain_rows(n_rows: int = PRETRAIN_ROWS, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    text = _Text(rng)
    rows = []
    for i in range(n_rows):
        row_id = f"{i:09d}"
        rows.append({"id": row_id, "image": f"{i // 1000:05d}/{row_id}.jpg", "conversations": [
            {"from": "human", "value": _tagged(rng.choice(BRIEF_PROMPTS), rng)},
            {"from": "gpt", "value": text.words(5, 30)},
        ]})
    return rows


def _mix_turns(source: str, text: _Text, rng: random.Random) -> list[tuple[str, str]]:
    """(question, answer) pairs of one row of ``source``."""
    if source == "llava_conv":
        return [(text.question(), text.sentences_(rng.randint(1, 5))) for _ in range(rng.randint(1, 6))]
    if source == "llava_detail":
        return [(rng.choice(["Describe the following image.", "What do you see happening in this image?"]),
                 text.sentences_(rng.randint(5, 12)))]
    if source == "llava_complex":
        return [(text.question(), text.sentences_(rng.randint(4, 10)))]
    if source in ("vqav2", "gqa", "ocr_vqa"):
        return [(f"{text.question()}\n{SHORT_ANSWER}", text.phrase()) for _ in range(rng.randint(1, 10))]
    if source == "textvqa":
        return [(f"{text.question()}\nReference OCR token: {text.words(2, 8)}\n{SHORT_ANSWER}", text.phrase())]
    if source in ("vg", "refcoco"):
        box = lambda: "[" + ", ".join(f"{rng.random():.2f}" for _ in range(4)) + "]"
        return [(f"Please provide a short description for this region: {box()}", text.words(2, 8))
                for _ in range(rng.randint(1, 10))]
    # sharegpt: text-only, multi-turn, long answers with a long tail (lognormal sentence counts)
    return [(text.sentences_(rng.randint(1, 4)), text.sentences_(int(rng.lognormvariate(2.3, 0.9))))
            for _ in range(rng.randint(1, 6))]


def mix_rows(n_rows: int = MIX_ROWS, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    text = _Text(rng)
    sources = [s for s, _, _ in MIX_SOURCES]
    weights = [w for _, w, _ in MIX_SOURCES]
    folders = {s: f for s, _, f in MIX_SOURCES}
    scale = n_rows / MIX_ROWS
    pools = {folder: max(1, int(size * scale)) for folder, size in IMAGE_POOL.items()}
    rows = []
    for i, source in enumerate(rng.choices(sources, weights=weights, k=n_rows)):
        turns = _mix_turns(source, text, rng)
        conversations = []
        for number, (question, answer) in enumerate(turns):
            if number == 0 and folders[source] is not None:
                question = _tagged(question, rng)
            conversations += [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        row = {"id": f"{source}-{i}", "conversations": conversations}
        folder = folders[source]
        if folder is not None:
            k = rng.randrange(pools[folder])
            row["image"] = f"{folder}/{k // 1000:03d}/{k:012d}.jpg"
        rows.append(row)
    return rows


def write_json(rows: list[dict], path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(rows, handle)
    return path


def write_pretrain_json(path: str, n_rows: int = PRETRAIN_ROWS, seed: int = 0) -> str:
    return write_json(pretrain_rows(n_rows, seed), path)


def write_mix_json(path: str, n_rows: int = MIX_ROWS, seed: int = 0) -> str:
    return write_json(mix_rows(n_rows, seed), path)


def tiny_images(n_distinct: int = 8, size: int = 16) -> list[bytes]:
    """A few distinct tiny PNGs (a few hundred bytes each)."""
    from PIL import Image

    out = []
    for k in range(n_distinct):
        buffer = io.BytesIO()
        Image.new("RGB", (size, size), ((37 * k) % 256, (91 * k) % 256, (173 * k) % 256)).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def write_images(rows: list[dict], image_folder: str, n_distinct: int = 8) -> int:
    """Write every image the rows name under ``image_folder`` (each path its own file); returns the count."""
    blobs = tiny_images(n_distinct)
    paths = sorted({row["image"] for row in rows if "image" in row})
    made = set()
    for number, relative in enumerate(paths):
        path = os.path.join(image_folder, relative)
        folder = os.path.dirname(path)
        if folder not in made:
            os.makedirs(folder, exist_ok=True)
            made.add(folder)
        with open(path, "wb") as handle:
            handle.write(blobs[number % len(blobs)])
    return len(paths)


def word_tokenizer(with_image_token: bool = False):
    """A byte-level BPE in which every word of the generated text is one token (as common English words are in
    Llama's vocabulary, so a row's token count is what it would be there), with ChatML's special tokens and the
    ChatML template of ``llava_normaligned.tiny``, whose ``{% generation %}`` markers TRL's ``assistant_only_loss``
    needs. ``with_image_token``: with ``<image>`` already added (``compose`` adds it to an LM's tokenizer itself)."""
    from llava_normaligned.tiny import train_tokenizer

    return train_tokenizer(bench_words(), vocab_size=2048, with_image_token=with_image_token)


def bench_words() -> list[str]:
    """Every word the generated rows use (the tokenizers' vocabulary: one token each)."""
    from llava_normaligned.tiny import DEFAULT_CORPUS_WORDS

    words = sorted(set(WORDS) | set(DEFAULT_CORPUS_WORDS))
    return words + [w.capitalize() for w in words] + [".", "?", "[", "]", "Reference", "OCR", "token", "Please"]


__all__ = ["MIX_ROWS", "PRETRAIN_ROWS", "bench_words", "mix_rows", "pretrain_rows", "tiny_images", "word_tokenizer", "write_images",
           "write_json", "write_mix_json", "write_pretrain_json"]
