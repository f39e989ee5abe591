"""Start-up at scale: every up-front phase grows linearly with the rows (times at N and 10N rows, ratios only), the
rows kept and dropped at scale are the right ones, and the caches make the same run again read instead of compute.
Data from ``benchmarks/scale_data.py`` (LLaVA-558K- and mix665k-shaped rows, generated in code)."""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pytest

from llava_normaligned.trainer import data as data_module
from llava_normaligned.trainer import preprocess
from llava_normaligned.trainer.data import ImageRefs, find_bad_images, load_llava_json
from llava_normaligned.trainer.preprocess import prepare_dataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import scale_data

LINEAR = 20.0  # 10x the rows may take at most 20x the time (a loaded machine's noise, never quadratic)


def _timed(function, *args, **kwargs):
    start = time.perf_counter()
    out = function(*args, **kwargs)
    return out, time.perf_counter() - start


def _best_of(n, function, *args, **kwargs) -> float:
    return min(_timed(function, *args, **kwargs)[1] for _ in range(n))


@pytest.fixture(scope="module")
def pretrain_files(tmp_path_factory):
    """LLaVA-558K-shaped JSON at 5K and 50K rows; no image files (the parse is timed with check_images='none')."""
    folder = tmp_path_factory.mktemp("scale")
    rows = scale_data.pretrain_rows(50_000)
    return (scale_data.write_json(rows[:5_000], str(folder / "p5k.json")),
            scale_data.write_json(rows, str(folder / "p50k.json")), str(folder))


def test_parse_grows_linearly(pretrain_files):
    small, large, folder = pretrain_files
    # best of three each, interleaved: the 5K parse takes tens of milliseconds, where one pause of the machine is a
    # large share, and a load that comes and goes then weighs on both sizes alike
    t_small = t_large = float("inf")
    for _ in range(3):
        t_small = min(t_small, _timed(load_llava_json, small, folder, check_images="none")[1])
        t_large = min(t_large, _timed(load_llava_json, large, folder, check_images="none")[1])
    assert t_large / t_small < LINEAR, (t_small, t_large)


def test_image_check_grows_linearly(tmp_path):
    """One stat per file, on threads: 5K and 50K files (hard links of one PNG, plus a missing and an empty one)."""
    blob = scale_data.tiny_images(1)[0]
    first = tmp_path / "first.png"
    first.write_bytes(blob)
    (tmp_path / "empty.png").write_bytes(b"")
    paths = []
    for i in range(50_000):
        folder = tmp_path / f"{i // 1000:03d}"
        if i % 1000 == 0:
            folder.mkdir()
        path = folder / f"{i}.png"
        os.link(first, path)
        paths.append(str(path))
    paths[17] = str(tmp_path / "missing.png")
    paths[49_999] = str(tmp_path / "empty.png")

    def refs(n):
        return ImageRefs(np.arange(n), paths[:n])

    small, large = refs(5_000), refs(50_000)
    bad = find_bad_images(large, "exists")  # every file's inode read once: both sizes are timed warm
    t_small = _best_of(3, find_bad_images, small, "exists")
    t_large = _best_of(2, find_bad_images, large, "exists")
    assert t_large / t_small < LINEAR, (t_small, t_large)
    assert bad == {17: f"image {paths[17]}: file not found", 49_999: f"image {paths[49_999]}: empty file (0 bytes)"}
    # "auto" opens every header up to the limit, and checks existence above it
    limit = data_module.AUTO_OPEN_LIMIT
    assert data_module.resolve_check("auto", limit) == "open" and data_module.resolve_check("auto", limit + 1) == "exists"


def test_render_hash_and_filters_grow_linearly(tiny_processor, tmp_path, monkeypatch):
    """prepare_dataset at 1K and 10K LLaVA-558K-shaped rows (one process): each phase within LINEAR of 10x."""
    monkeypatch.setattr(preprocess, "PARALLEL_ROWS", 10**9)  # one process: the ratio measures the code, not a pool
    rows = scale_data.pretrain_rows(10_000, seed=1)
    times = {}
    for n in (1_000, 10_000):
        path = scale_data.write_json(rows[:n], str(tmp_path / f"rows{n}.json"))
        dataset = load_llava_json(path, str(tmp_path), check_images="none")
        start = time.perf_counter()
        _, report = prepare_dataset(dataset, tiny_processor, max_length=512, cache_dir=str(tmp_path / f"cache{n}"))
        times[n] = {**report.seconds, "total": time.perf_counter() - start}
    for phase in ("hash", "render", "total"):
        assert times[10_000][phase] / max(times[1_000][phase], 1e-3) < LINEAR, (phase, times)
    # the filters are numpy over the whole column: well under a tenth of the rendering at 10K rows
    assert times[10_000]["filter"] < 0.1 * times[10_000]["render"], times


def test_rows_kept_and_dropped_at_scale(tiny_processor, tmp_path):
    rows = scale_data.mix_rows(3_000, seed=2)
    path = scale_data.write_json(rows, str(tmp_path / "mix.json"))
    dataset, load = load_llava_json(path, str(tmp_path), check_images="none", return_report=True)
    text_only = sum(1 for row in rows if "image" not in row)
    assert load.rows_kept == 3_000 and load.text_only_rows == text_only and 0.04 < text_only / 3_000 < 0.08
    cache = str(tmp_path / "cache")  # rendered once: the length filter runs after the cached columns
    full, _ = prepare_dataset(dataset, tiny_processor, max_length=None, cache_dir=cache)
    lengths = np.asarray(full["num_tokens"])
    has_image = np.asarray([bool(images) for images in full.with_format("arrow")["images"].to_pylist()])
    limit = 1024
    stage2, report2 = prepare_dataset(dataset, tiny_processor, max_length=limit, cache_dir=cache)
    assert report2.read_from_cache
    assert report2.too_long_dropped == int((lengths > limit).sum()) > 0
    assert report2.rows_out == int((lengths <= limit).sum()) and report2.text_only_rows == int(
        ((lengths <= limit) & ~has_image).sum())
    assert stage2["id"] == [row_id for row_id, n in zip(full["id"], lengths) if n <= limit]  # order kept
    _, report1 = prepare_dataset(dataset, tiny_processor, max_length=limit, drop_text_only=True, cache_dir=cache)
    assert report1.text_only_dropped == text_only
    assert report1.rows_out == int(((lengths <= limit) & has_image).sum()) and report1.text_only_rows == 0


def test_second_run_reads_both_caches(tiny_processor, tmp_path):
    rows = scale_data.pretrain_rows(2_000, seed=4)
    path = scale_data.write_json(rows, str(tmp_path / "p.json"))
    loaded, prepared = str(tmp_path / "loaded"), str(tmp_path / "prepared")
    results = []
    for _ in range(2):
        dataset, load = load_llava_json(path, str(tmp_path), check_images="none", return_report=True,
                                        cache_dir=loaded)
        out, prep = prepare_dataset(dataset, tiny_processor, max_length=256, cache_dir=prepared)
        results.append((dataset, load, out, prep))
    (d1, l1, o1, p1), (d2, l2, o2, p2) = results
    assert not l1.read_from_cache and l2.read_from_cache and l1.cache_file == l2.cache_file
    assert not p1.read_from_cache and p2.read_from_cache and p1.cache_file == p2.cache_file
    text1, text2 = (d.select_columns(["id", "messages"]) for d in (d1, d2))  # no image files here: not decoded
    assert text1["id"] == text2["id"] and text1[7]["messages"] == text2[7]["messages"]
    assert o1.column_names == o2.column_names
    for column in ("id", "rendered", "spans", "num_tokens"):
        assert o1[column] == o2[column], column
    # other rows, another cache file: one changed caption is a new key for both caches
    rows[10]["conversations"][1]["value"] += " changed"
    scale_data.write_json(rows, path)
    dataset, load = load_llava_json(path, str(tmp_path), check_images="none", return_report=True, cache_dir=loaded)
    _, prep = prepare_dataset(dataset, tiny_processor, max_length=256, cache_dir=prepared)
    assert not load.read_from_cache and not prep.read_from_cache
    assert dataset.select_columns(["messages"])[10]["messages"][1]["content"].endswith(" changed")
