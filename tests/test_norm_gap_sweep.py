"""`benchmarks/norm_gap_sweep.py`: the demo over several norm gaps in one command, each run at the gap asked (w/o
Norm's image tokens over T at init), summarised per gap with the paired difference and what it could detect."""

from __future__ import annotations

import json
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")


@pytest.mark.slow
def test_a_sweep_over_gaps_is_one_command(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(BENCHMARKS)
    import norm_gap_sweep

    out = tmp_path / "sweep"
    assert norm_gap_sweep.main(["--output-dir", str(out), "--quick", "--gaps", "2", "60", "--rows",
                                "no_norm,norm_target_init_gwc", "--no-progress", "--workers", "1"]) == 0
    summary = json.loads((out / "sweep.json").read_text())["gaps"]
    assert [entry["gap"] for entry in summary] == [2.0, 60.0]
    for entry in summary:
        assert entry["measured_gap_at_init"] == pytest.approx(entry["gap"], rel=1e-3)
        results = json.loads((out / f"gap_{entry['gap']:g}" / "results.json").read_text())
        assert results["setup"]["config"]["norm_gap"] == entry["gap"]
        method = entry["rows"]["norm_target_init_gwc"]
        assert method["paired_to_no_norm"]["n"] == 2 and method["detectable"] is not None
    text = (out / "sweep.md").read_text()
    assert "| 60 | 60.0 |" in text and "detects" in text
    assert norm_gap_sweep.main(["--output-dir", str(out), "--gaps", "0"]) == 2
    assert "--gaps" in capsys.readouterr().err
