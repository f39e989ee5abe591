"""The transformers floor in pyproject.toml works: that exact release, installed alone (``pip install --no-deps
--target``) and put first on the path of a fresh process over this environment, composes a tiny model, trains a
stage 2 through TRL's SFTTrainer with a processor and through ``train_stage`` (whose collator asks the processor for
``return_text_replacement_offsets``), and loads the saved stage back with ``load_model`` and generates
(tests/transformers_floor_check.py). Needs the package registry; skipped only when it cannot be reached.

Why this floor (the check script, run by hand with each release put first on the path; releases before 5.18 require
huggingface-hub<2, so they were run with their own dependencies installed beside them): 5.0.0 and 5.3.0 have no
``return_text_replacement_offsets`` (nor ``image_processing_backends``), which the collator needs; 5.10.4, 5.13.1,
5.15.1 and 5.17.0 stop in ``compose``: "AutoImageProcessor requires the Torchvision library" (the PIL image
processor is not yet the default without torchvision); 5.18.0 passes, as does 5.24.0 (the tested stack)."""

from __future__ import annotations

import pytest
from floor_support import floor_of, run_with_release


@pytest.mark.slow  # a pip install, then a fresh process: trains twice, saves, loads, generates (112 s, loaded)
def test_the_transformers_floor_trains_loads_and_generates(tmp_path):
    report = run_with_release("transformers", floor_of("transformers"), "transformers_floor_check.py", tmp_path)
    assert len(report["stock_losses"]) == 2 and len(report["train_stage_losses"]) == 2
    assert report["collator_labelled"] > 0 and report["loaded"] == "LlavaNormAlignedForConditionalGeneration"
    assert report["labelled_positions_loss"] > 0  # the model's own training forward on the floor release
