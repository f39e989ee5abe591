"""The paper's data as the Hub publishes it (LLaVA's conversations with embedded images), written as a local parquet
folder."""

from __future__ import annotations

import io
import os

N_ROWS = 3000
TEXT_ONLY_EVERY = 16  # ~6% text-only rows, as in LLaVA-NeXT-Data and mix665k


def _pngs(n: int = 6) -> list[bytes]:
    from PIL import Image

    out = []
    for k in range(n):
        buffer = io.BytesIO()
        Image.new("RGB", (24, 24), (40 * k, 255 - 30 * k, 90)).save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def write_hub_parquet(folder, n_rows: int = N_ROWS, broken: tuple[int, ...] = ()) -> str:
    """A parquet folder with LLaVA-NeXT-Data's schema (``data/train-0000k-of-0000n.parquet``, two shards)."""
    from datasets import Dataset, Features, Image, List, Value

    pngs = _pngs()
    features = Features({"id": Value("string"), "conversations": List({"from": Value("string"), "value": Value("string")}),
                         "data_source": Value("string"), "image": Image()})
    rows = {"id": [], "conversations": [], "data_source": [], "image": []}
    for i in range(n_rows):
        text_only = i % TEXT_ONLY_EVERY == 5
        question = "What is in the picture?" if text_only else "<image>\nWhat is in the picture?"
        turns = [{"from": "human", "value": question}, {"from": "gpt", "value": f"answer {i}"}]
        if i % 3 == 0:
            turns += [{"from": "human", "value": "And the colour?"}, {"from": "gpt", "value": "green"}]
        rows["id"].append(f"row-{i}")
        rows["conversations"].append(turns)
        rows["data_source"].append("sharegpt" if text_only else "coco")
        data = b"\x89PNG not really" if i in broken else pngs[i % len(pngs)]
        rows["image"].append(None if text_only else {"bytes": data, "path": f"{i}.png"})
    dataset = Dataset.from_dict(rows, features=features)
    os.makedirs(os.path.join(folder, "data"), exist_ok=True)
    half = n_rows // 2
    dataset.select(range(half)).to_parquet(os.path.join(folder, "data", "train-00000-of-00002.parquet"))
    dataset.select(range(half, n_rows)).to_parquet(os.path.join(folder, "data", "train-00001-of-00002.parquet"))
    return str(folder)
