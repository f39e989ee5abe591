"""``benchmarks/bench_loss_at_labels.py`` on SmolLM2-135M at two rows a step: both paths, full and compacted, timed,
and a record that names the machine and the command."""

from __future__ import annotations

import json
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")

pytest.importorskip("gguf", reason="the SmolLM2 GGUF file needs the gguf package (in .[dev])")


@pytest.mark.slow
def test_the_bench_times_both_paths_full_and_compacted(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    import bench_loss_at_labels

    out = tmp_path / "bench.json"
    argv = ["--rows", "2", "--repeats", "1", "--json", str(out)]
    assert bench_loss_at_labels.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"] == "python benchmarks/bench_loss_at_labels.py " + " ".join(argv)
    assert record["rows"]["rows"] == 2 and {"cpu", "torch"} <= set(record["machine"])
    for path in ("train", "model"):
        step = record["seconds_per_step"][path]
        assert step["full"] > 0 and step["labelled_only"] > 0
        assert step["speedup"] == pytest.approx(step["full"] / step["labelled_only"], rel=1e-2)
