"""The trl floor in pyproject.toml works: that exact release, installed alone (``pip install --no-deps --target``)
and put first on the path of a fresh process over this environment, trains a tiny stage 2 with TRL's
``assistant_only_loss=True`` and a processor, and through ``train_stage``. Needs the package registry; skipped only
when it cannot be reached.

Why this floor (the check script, run by hand with each release put first on the path): trl 1.14.2 raises
"Assistant-only loss is not yet supported for vision datasets"; trl 1.15.0 accepts it but its fused LM-head loss
needs Triton (``_ChunkedLogProbFunction`` is ``None`` without it: "'NoneType' object has no attribute 'apply'"), so
it trains on no CPU-only machine; trl 1.16.0 trains."""

from __future__ import annotations

import pytest
from floor_support import floor_of, run_with_release


@pytest.mark.slow  # a pip install and a fresh process: 99 s on a loaded 2-core machine
def test_the_trl_floor_trains_stage2_with_assistant_only_loss(tmp_path):
    report = run_with_release("trl", floor_of("trl"), "trl_floor_check.py", tmp_path)
    assert len(report["stock_losses"]) == 2 and len(report["train_stage_losses"]) == 2
