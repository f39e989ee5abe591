"""The CPU training-step benchmarks on SmolLM2-135M at two rows a step, each run once: every configuration timed,
and a record that names the machine and the command it was run with."""

from __future__ import annotations

import importlib
import json
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")

pytest.importorskip("gguf", reason="the SmolLM2 GGUF file needs the gguf package (in .[dev])")


def _record(name: str, tmp_path, monkeypatch) -> dict:
    monkeypatch.syspath_prepend(BENCHMARKS)
    out = tmp_path / "bench.json"
    argv = ["--rows", "2", "--repeats", "1", "--json", str(out)]
    assert importlib.import_module(name).main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"] == f"python benchmarks/{name}.py " + " ".join(argv)
    assert {"cpu", "torch"} <= set(record["machine"])
    return record


@pytest.mark.slow
def test_the_loss_bench_times_both_paths_full_and_compacted(tmp_path, monkeypatch):
    record = _record("bench_loss_at_labels", tmp_path, monkeypatch)
    assert record["rows"]["rows"] == 2
    for path in ("train", "model"):
        step = record["seconds_per_step"][path]
        assert step["full"] > 0 and step["labelled_only"] > 0
        assert step["speedup"] == pytest.approx(step["full"] / step["labelled_only"], rel=1e-2)


@pytest.mark.slow
def test_the_precision_bench_times_every_option_and_names_the_fastest(tmp_path, monkeypatch):
    record = _record("bench_cpu_precision", tmp_path, monkeypatch)
    steps = record["seconds_per_step_1_thread"]
    assert {"float32", "float32+fused"} <= set(steps) and all(s["median"] > 0 for s in steps.values())
    assert record["fastest"] == min(steps, key=lambda option: steps[option]["median"])
    assert record["fastest_2_threads"]["median"] > 0
