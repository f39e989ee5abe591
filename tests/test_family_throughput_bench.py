"""The throughput bench on another family's rows (``bench_throughput.py --family``): its stock model at the bench's
shape, built without torchvision, trained by stock TRL and by ``train``'s padded and padding-free paths from the same
weights in one run; the packed run computes no pad position, the padded ones do, and the image tokens per image are
the family's published count at the chosen size."""

from __future__ import annotations

import importlib
import json
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2_5_vl", "smolvlm"])
def test_the_bench_trains_the_family_every_way_and_the_packed_run_has_no_padding(family, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    bench = importlib.import_module("bench_throughput")
    out = tmp_path / "bench.json"
    argv = ["--family", family, "--shape", "tiny", "--rows", "24", "--batch-size", "4", "--accumulation", "1",
            "--steps", "1", "--warmup", "0", "--repeats", "1", "--threads", "1", "--runs", "stock", "padded",
            "padding_free", "--json", str(out)]
    assert bench.main(argv) == 0
    record = json.loads(out.read_text())
    runs = record["runs"]
    assert set(runs) == {"stock", "padded", "padding_free"}
    assert runs["padding_free"]["padding_fraction"] == 0
    assert runs["stock"]["padding_fraction"] > 0 and runs["padded"]["padding_fraction"] > 0
    for name, run in runs.items():
        assert run["real_tokens_per_s"] > 0 and run["mfu"] is None, name
        assert run["vs_stock"] == pytest.approx(run["real_tokens_per_s"] / runs["stock"]["real_tokens_per_s"])
    # the same rows reach every run: as many real tokens in the timed step whichever way it is batched
    assert runs["padding_free"]["real_tokens"] == runs["padded"]["real_tokens"]
    # an image row holds the family's image tokens: 729 for Qwen2.5-VL (27 x 27 merged patches), 612 + markers for
    # SmolVLM (17 tiles of 36)
    assert record["data"]["tokens_mean"] > (729 if family == "qwen2_5_vl" else 612)
