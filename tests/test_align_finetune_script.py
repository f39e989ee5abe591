"""``benchmarks/align_finetune.py --quick``: docs/align.md's experiment runs end to end at tiny sizes. What holds by
construction: the composed Idefics3 feeds the LLM image tokens far above the text norm (its connector is drawn at a
real connector's gain), ``align`` brings them to the text norm (ratio 1 within the LayerNorm's eps), fine-tuning
keeps each model near where it started, and every run of both arms is scored and summarised with intervals."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.markdown import table_with
from tests.support.messages import number

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def test_the_align_then_finetune_experiment_runs_quick(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))  # train's caches
    monkeypatch.syspath_prepend(BENCHMARKS)
    import align_finetune

    results = tmp_path / "copy"
    assert align_finetune.main(["--output-dir", str(tmp_path / "run"), "--quick", "--results", str(results)]) == 0
    document = json.loads((results / "results.json").read_text())
    runs = document["runs"]
    assert sorted((r["kind"], r["steps"], r["seed"]) for r in runs) == [
        (kind, 4, seed) for kind in ("aligned", "aligned_stage1", "stock") for seed in (0, 1)]
    summary = document["summary"]
    assert summary["stock"]["before"]["ratio"]["mean"] > 10  # the gap the experiment is about
    assert summary["aligned"]["before"]["ratio"]["mean"] == pytest.approx(1.0, abs=0.1)  # align closes it at the input
    assert summary["aligned"]["before"]["ratio"]["half_width"] == 0  # one starting model for every seed
    assert summary["aligned_stage1"]["before"]["ratio"]["mean"] == pytest.approx(1.0, abs=0.3)
    assert summary["aligned"]["after"]["4"]["ratio"]["mean"] == pytest.approx(1.0, abs=0.3)
    assert summary["stock"]["after"]["4"]["ratio"]["mean"] > 10
    for kind in ("stock", "aligned", "aligned_stage1"):
        for key in ("real", "blank"):
            entry = summary[kind]["after"]["4"][key]
            assert 0.0 <= entry["mean"] <= 1.0 and entry["n"] == 2
    assert set(summary["minus_stock_after"]) == {"aligned", "aligned_stage1"}
    assert set(summary["minus_stock_after"]["aligned"]["4"]) == {"real", "blank"}
    text = (results / "results.md").read_text()
    rows = {row["model"]: row for row in table_with(text, "vision/text norm ratio")}
    for kind, label in (("aligned", "aligned"), ("aligned_stage1", "aligned, stage 1 first")):
        shown = rows[f"{label}, after 4 steps"]  # the mean over seeds, then the interval's half-width
        for column, key in (("real-image accuracy", "real"), ("vision/text norm ratio", "ratio")):
            assert number(r"^(\S+)", shown[column]) == pytest.approx(summary[kind]["after"]["4"][key]["mean"], abs=5e-4)
    assert "--quick" in text
    assert all(r["train_loss"] is not None and r["train_loss"] > 0 for r in runs)
