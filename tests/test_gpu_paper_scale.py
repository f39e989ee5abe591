"""`benchmarks/gpu_paper_scale.py --tiny`: the paper-scale GPU benchmark's code runs end to end on the CPU (both
pipelines, the model-FLOPs count, the single-process ZeRO-2 run of `llava-normaligned train`) and writes its JSON,
so that its first run on a GPU does not fail on a code path."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")


@pytest.mark.slow
def test_gpu_paper_scale_runs_tiny_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets_cache"))
    import gpu_paper_scale

    # the ZeRO-2 run needs DeepSpeed (the `engines` extra); without it the rest of the script is still checked
    with_zero2 = importlib.util.find_spec("deepspeed") is not None
    out = tmp_path / "result.json"
    code = gpu_paper_scale.main(["--tiny", "--stages", "1", "--steps", "1", "--warmup", "0", "--batch-size", "1",
                                 "--json", str(out)] + ([] if with_zero2 else ["--no-zero2"]))
    result = json.loads(out.read_text())
    assert code == 0, result.get("zero2_single_process", {}).get("error")
    stage = result["stages"]["1"]
    for name in ("norm-aligned", "stock"):
        assert stage[name]["samples_per_s"] > 0 and stage[name]["model_flops_per_s"] > 0
    assert stage["ratio_vs_stock"] > 0 and result["image_tokens"] == 64
    assert result["shape"] == "tiny"
    if not with_zero2:
        assert "zero2_single_process" not in result
        return
    zero2 = result["zero2_single_process"]
    assert zero2["ok"] and zero2["engine"]["distributed_type"] == "DEEPSPEED" and zero2["engine"]["zero_stage"] == 2
    assert result["shape"] == "tiny"
