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


@pytest.mark.slow
def test_the_packed_attention_bench_times_both_layouts_per_padding(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    out = tmp_path / "bench.json"
    assert importlib.import_module("bench_packed_attention").main(
        ["--layers", "1", "--repeats", "1", "--threads", "1", "--json", str(out)]) == 0
    cases = json.loads(out.read_text())["cases"]
    assert [c["padding"] for c in cases] == sorted(c["padding"] for c in cases) and cases[0]["padding"] == 0
    for case in cases:
        assert case["packed_vs_padded"] == pytest.approx(case["padded_s"] / case["packed_s"])


def _demo_records(shift: float, seeds=(42, 43, 44)) -> list[dict]:
    """Two settings' runs as ``bench_training_speed``'s children record them: the new curves are the committed
    ones plus ``shift``, with seed-to-seed spread."""
    records = []
    for seed in seeds:
        noise = (seed - 43) * 0.05
        for setting, offset, step in (("committed", 0.0, 2.0), ("new", shift, 1.0)):
            records.append({"setting": setting, "seed": seed, "stages": {
                stage: {"step_seconds": [step * 3] + [step] * 9, "logged_steps": [5, 10],
                        "loss": [3.0 + noise + offset, 2.5 + noise + offset], "real_tokens_per_s": 100 / step,
                        "peak_rss_gib": 1.0} for stage in ("1", "2")}})
    return records


def test_the_speed_bench_compares_steps_after_the_first_and_loss_curves_against_seed_noise(monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    bench = importlib.import_module("bench_training_speed")
    same = bench.demo_summary(_demo_records(0.0))
    for stage in ("1", "2"):
        assert same[stage]["speedup"] == pytest.approx(2.0)  # the first (warm-up) step left out
        assert same[stage]["tokens_per_s_ratio"] == pytest.approx(2.0)
        curve = same[stage]["loss_curve"]
        assert curve["paired_end_difference"]["mean"] == pytest.approx(0.0, abs=1e-12)
        assert curve["paired_end_difference"]["within_seed_noise"] is True
    assert same["both_stages_speedup"] == pytest.approx(2.0)
    shifted = bench.demo_summary(_demo_records(0.5))["1"]["loss_curve"]
    assert shifted["paired_end_difference"]["mean"] == pytest.approx(0.5)
    assert shifted["paired_end_difference"]["within_seed_noise"] is False  # a shift every seed shows is found
    assert shifted["largest_step_gap_in_seed_sd"] > 5
