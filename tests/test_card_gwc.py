"""The model card's norm-tracking section for a checkpoint trained with GWC: what GWC did to that run's optimizer step
(the numbers of its ``norm_tracking.json``), and, for the demo's checkpoint only, the CPU demo's measured finding
(``assets/demo_gwc.json``, which the demo writes into its folder's ``card_notes.json``), both from data, not prose
constants. Publishing does not import the demo: a card states what its folder carries."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from llava_normaligned.demo import results_text
from llava_normaligned.hub_cards.card import CARD_NOTES, render_card, write_card_notes
from tests.support.messages import number

# step 0 is the before-training record; steps 10 and 20 are logged optimizer steps (their numbers chosen by hand)
RECORDS = [
    {"step": 0, "epoch": 0.0, "projector_output_norm": 0.17, "gwc_factor": 40.0},
    {"step": 10, "epoch": 0.5, "loss": 2.0, "grad_norm": 40.0, "grad_norm/vision_tower": 30.0,
     "grad_norm/projector": 20.0, "grad_norm/projector_norm": 4.0, "grad_norm/llm": 3.0, "clip_coef": 0.025,
     "update_size/vision_tower": 0.001, "update_size/projector": 0.004, "update_size/projector_norm": 0.02,
     "update_size/llm": 0.002, "gwc_factor": 43.0},
    {"step": 20, "epoch": 1.0, "loss": 1.0, "grad_norm": 20.0, "grad_norm/vision_tower": 10.0,
     "grad_norm/projector": 14.0, "grad_norm/projector_norm": 2.0, "grad_norm/llm": 5.0, "clip_coef": 0.05,
     "update_size/vision_tower": 0.003, "update_size/projector": 0.002, "update_size/projector_norm": 0.04,
     "update_size/llm": 0.004, "gwc_factor": 45.0},
]
FINDING = {
    "seeds": [42, 43, 44], "llm_layers": 4, "steps": {"stage1": 60, "stage2": 150},
    "grad_norm": {"gwc": 39.5, "no_gwc": 3.31}, "clip_coef": {"gwc": 0.039, "no_gwc": 0.481},
    "llm_update_ratio": {"clipped": 0.87, "unclipped": 1.0}, "vision_update_ratio": {"clipped": 0.96, "unclipped": 0.98},
    "accuracy": {"clipped": {"mean": -0.089, "half_width": 0.145, "low": -0.234, "high": 0.056,
                             "separated_from_zero": False}, "unclipped": None},
}


@pytest.fixture
def gwc_folder(tiny_model_dir, tmp_path):
    """A GWC checkpoint (the tiny composed model: target init, GWC on) with a norm_tracking.json written here."""
    folder = shutil.copytree(tiny_model_dir, tmp_path / "gwc")
    assert json.loads((folder / "config.json").read_text())["gradient_compensation"] is True
    (folder / "norm_tracking.json").write_text(json.dumps(RECORDS))
    return folder


@pytest.fixture
def demo_asset(tmp_path, monkeypatch):
    path = tmp_path / "demo_gwc.json"
    path.write_text(json.dumps({"command": "llava-normaligned demo --output-dir demo_out", "finding": FINDING}))
    monkeypatch.setattr(results_text, "GWC_ASSET", str(path))
    return path


def _rows(card: str) -> dict[str, tuple[str, str]]:
    section = card[card.index("What GWC did to the optimizer step in this run"):]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 3 and cells[0] not in ("quantity", "---"):
            rows[cells[0]] = (cells[1], cells[2])
    return rows


def test_the_card_reports_the_run_s_optimizer_step_from_its_norm_tracking(gwc_folder, demo_asset):
    card = str(render_card(gwc_folder))
    assert number(r"\((\d+) logged steps;", card) == len([r for r in RECORDS if r["step"] > 0])
    assert "the norms are before clipping" in card
    rows = _rows(card)
    # means over the two logged steps, by hand; the first logged step is step 10 (step 0 is before training)
    assert rows["pre-clip gradient norm, total"] == ("30", "40")
    assert rows["pre-clip gradient norm, vision_tower"] == ("20", "30")
    assert rows["pre-clip gradient norm, llm"] == ("4", "3")
    assert rows["global clip coefficient min(1, max_grad_norm / norm)"] == ("0.0375", "0.025")
    assert rows["update size \\|\\|Δθ\\|\\| / \\|\\|θ\\|\\| (x 1e-3), llm"] == ("3", "2")
    assert rows["update size \\|\\|Δθ\\|\\| / \\|\\|θ\\|\\| (x 1e-3), projector_norm"] == ("30", "20")
    assert rows["GWC factor 1/clamp(mean \\|g\\|)"] == ("44", "43")


def test_a_checkpoint_s_card_does_not_carry_the_demo_s_finding(gwc_folder, demo_asset):
    """Any GWC checkpoint (a 3B model's as well) other than the demo's: its own numbers, not the demo's finding."""
    card = str(render_card(gwc_folder))
    assert "pre-clip gradient norm, total" in card  # its own run's section is there
    assert "In the package's CPU demo" not in card and results_text.gwc_finding_text(FINDING) not in card
    assert not (gwc_folder / CARD_NOTES).exists()


def test_publishing_does_not_import_the_demo(gwc_folder):
    probe = ("import sys; from llava_normaligned.hub_cards import card, push; "
             f"card.render_card({str(gwc_folder)!r}); "
             "print(sorted(m for m in sys.modules if m.startswith('llava_normaligned.demo')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         stdin=subprocess.DEVNULL)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_demo_s_card_states_the_demo_finding_from_its_record(gwc_folder, demo_asset):
    results_text.write_gwc_note(str(gwc_folder))  # what the demo does to its best_model/ before rendering its card
    card = str(render_card(gwc_folder))
    assert results_text.gwc_finding_text(FINDING) in card
    assert "3 seeds, 4-layer LLM, 60 + 150 steps" in card
    for figure in ("39.50", "3.31", "0.039", "0.481", "0.87x", "1.00x"):
        assert figure in card
    # another record, another text: nothing of it is written into the card's code
    changed = dict(FINDING, grad_norm={"gwc": 12.25, "no_gwc": 6.5})
    demo_asset.write_text(json.dumps({"command": "llava-normaligned demo --output-dir demo_out", "finding": changed}))
    results_text.write_gwc_note(str(gwc_folder))
    card = str(render_card(gwc_folder))
    assert "averaged 12.25 against 6.50 without GWC" in card and "39.50" not in card


def test_no_gwc_section_without_gwc_or_without_optimizer_records(gwc_folder, demo_asset):
    config = json.loads((gwc_folder / "config.json").read_text())
    (gwc_folder / "config.json").write_text(json.dumps(dict(config, gradient_compensation=False)))
    assert "What GWC did" not in str(render_card(gwc_folder))
    (gwc_folder / "config.json").write_text(json.dumps(config))
    (gwc_folder / "norm_tracking.json").write_text(json.dumps([{"step": 0, "projector_output_norm": 0.17}]))
    assert "What GWC did" not in str(render_card(gwc_folder))


def test_without_the_demo_record_the_run_s_numbers_still_stand(gwc_folder, tmp_path, monkeypatch):
    monkeypatch.setattr(results_text, "GWC_ASSET", str(tmp_path / "missing.json"))
    assert results_text.write_gwc_note(str(gwc_folder)) is None
    card = str(render_card(gwc_folder))
    assert "pre-clip gradient norm, total" in card and "In the package's CPU demo" not in card


def test_a_note_shows_only_under_the_gwc_section_and_bad_notes_are_refused(gwc_folder):
    write_card_notes(gwc_folder, {"gwc": "A note from whoever wrote this folder."})
    assert "A note from whoever wrote this folder." in str(render_card(gwc_folder))
    config = json.loads((gwc_folder / "config.json").read_text())
    (gwc_folder / "config.json").write_text(json.dumps(dict(config, gradient_compensation=False)))
    assert "A note from whoever wrote this folder." not in str(render_card(gwc_folder))  # no GWC section, no note
    with pytest.raises(ValueError, match="unknown section.*gwcc"):
        write_card_notes(gwc_folder, {"gwcc": "typo"})
    (gwc_folder / CARD_NOTES).write_text(json.dumps({"gwc": 3}))
    with pytest.raises(ValueError, match="Markdown strings"):
        render_card(gwc_folder)


def test_the_shipped_demo_record_is_what_the_card_states():
    asset = results_text.read_gwc_asset()
    assert asset is not None and asset["finding"]["grad_norm"]["gwc"] > 0
    assert results_text.gwc_finding_text(asset["finding"]) in results_text.demo_gwc_text()
