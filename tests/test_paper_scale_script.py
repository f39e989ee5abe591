"""`benchmarks/paper_scale.py --tiny`: the paper-scale benchmark's code runs end to end on the CPU at the paper's
sequence length (729 image tokens and a caption) with tiny widths: stock TRL, `llava-normaligned train` padded and
with length grouping + padding-free batches, stage 2 through LoRA (stage 1 runs the same code without it), the
single-process ZeRO-2 run (stage 1),
step times and real tokens from the runs' TensorBoard events (the stock run's from its log history), peak memory
sampled from /proc, and its JSON; so that its
first run at full size (a CPU with bf16 instructions, or a GPU) does not fail on a code path."""

from __future__ import annotations

import json
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")


@pytest.mark.slow
def test_paper_scale_runs_tiny_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    import paper_scale

    out = tmp_path / "result.json"
    code = paper_scale.main(["--tiny", "--device", "cpu", "--stages", "2", "--steps", "1", "--warmup", "1",
                             "--rows", "8", "--zero2", "--json", str(out)])
    result = json.loads(out.read_text())
    assert code == 0, json.dumps(result)[-3000:]
    assert result["machine"]["cpu_flags"] is not None
    for stage, how in (("2", "LoRA rank 16"),):
        entry = result["stages"][stage]
        assert entry["how"] == how and entry["tokens_per_row"] > 729
        for name in ("stock", "padded", "grouped_padding_free"):
            run = entry["runs"][name]
            assert run["ok"] and run["step_s"] > 0 and run["peak_memory_gib"] > 0, (stage, name)
            assert len(run["steps"]) == 1 and run["real_tokens_per_s"] > 0  # one timed step after the warm-up
            (seconds, tokens), = run["steps"]
            assert seconds > 0 and tokens >= 2 * 729  # two rows, each an image's tokens and its text
        assert entry["runs"]["grouped_padding_free"]["padding_free"] is True
        assert entry["runs"]["grouped_padding_free"]["train_sampling_strategy"] == "group_by_modality_length"
        assert entry["runs"]["padded"]["padding_free"] is False
    zero2 = result["zero2_single_process"]
    assert zero2["ok"] and zero2["engine"]["distributed_type"] == "DEEPSPEED" and zero2["engine"]["zero_stage"] == 2
