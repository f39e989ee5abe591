"""Model cards rendered from a checkpoint folder: metadata, the numbers computed from config and weights, the records
of training, diagnostics and evaluation, and the metadata validation (locally and by a Hub server's API)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file

from hub_server import HubServer
from llava_normaligned.hub_cards.card import (
    BIBTEX,
    CardOptions,
    check_card,
    main,
    norm_statistics,
    read_checkpoint,
    render_card,
    variant_text,
)
from llava_normaligned.inference import KEEP_UNQUANTIZED
from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration, text_embedding_norm_target

SHA = "0123456789abcdef0123456789abcdef01234567"
NORM_GAIN = "model.multi_modal_projector.norm.weight"


@pytest.fixture
def folder(tiny_model_dir, tmp_path):
    """A writable copy of the tiny checkpoint."""
    return shutil.copytree(tiny_model_dir, tmp_path / "ckpt")


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = value
    path.write_text(json.dumps(data))


def test_card_of_a_composed_model(tiny_model_dir, tiny_parts):
    card = render_card(tiny_model_dir, CardOptions(repo_id="alice/tiny-na", revision=SHA, license="apache-2.0"))
    check_card(card)
    data = card.data.to_dict()
    assert data["library_name"] == "transformers" and data["pipeline_tag"] == "image-text-to-text"
    assert data["license"] == "apache-2.0"
    assert {"llava-normaligned", "custom_code", "arxiv:2512.08374"} <= set(data["tags"])
    assert "base_model" not in data  # the tiny parts are local folders, not Hub ids
    text = str(card)
    assert not any(part in text for part in tiny_parts)  # local paths stay private
    assert 'repo_id = "alice/tiny-na"' in text and f'revision = "{SHA}"' in text
    assert text.count("trust_remote_code=True") >= 3
    assert f"llm_int8_skip_modules={json.dumps(list(KEEP_UNQUANTIZED))}" in text  # the loader's own list
    assert BIBTEX in text and "**This checkpoint has no training record**" in text
    for section in ("## Usage", "## Method", "## Model", "## Norm statistics", "## Training", "## Diagnostics",
                    "## Evaluation", "## Remote code", "## Citation"):
        assert section in text
    assert "gain initialised to T/√D (§5.1); Global Weight Compensation on" in text


def test_norm_statistics_come_from_the_weights(folder):
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(folder)
    config = model.config
    gain = model.model.multi_modal_projector.norm.weight.detach()
    _, stats = norm_statistics(read_checkpoint(folder))
    assert stats["T_config"] == config.norm_target and stats["D"] == config.text_config.hidden_size
    assert stats["g_init"] == pytest.approx(config.norm_target / math.sqrt(config.text_config.hidden_size))
    assert stats["gain_mean_abs"] == pytest.approx(float(gain.abs().mean()), rel=1e-6)
    embed = model.get_input_embeddings().weight.detach()
    text_rows = torch.cat([embed[: config.image_token_index], embed[config.image_token_index + 1:]])
    assert stats["T_now"] == pytest.approx(text_embedding_norm_target(text_rows), rel=1e-6)
    # At init the gain is uniform T/√D and the bias 0, so visual tokens leave the norm with norm T: ratio 1.
    assert stats["ratio_expected"] == pytest.approx(1.0, rel=1e-3)
    # Scale the gain: the card's numbers follow the weights.
    weights = load_file(folder / "model.safetensors")
    weights[NORM_GAIN] = weights[NORM_GAIN] * 3
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    rows, scaled = norm_statistics(read_checkpoint(folder))
    assert scaled["gain_mean_abs"] == pytest.approx(3 * stats["gain_mean_abs"], rel=1e-6)
    assert scaled["ratio_expected"] == pytest.approx(3 * stats["ratio_expected"], rel=1e-5)
    assert ("mean |g| / initial gain", f"{scaled['gain_mean_abs'] / scaled['g_init']:.6g}") in rows


def test_base_models_come_from_the_config_and_can_be_overridden(folder):
    edit_json(folder / "config.json", vision_config___name_or_path="google/siglip-so400m-patch14-384",
              text_config___name_or_path="meta-llama/Llama-3.2-3B-Instruct")
    card = render_card(folder)
    assert card.data.base_model == ["google/siglip-so400m-patch14-384", "meta-llama/Llama-3.2-3B-Instruct"]
    assert "siglip_vision_model (`google/siglip-so400m-patch14-384`)" in str(card)
    card = render_card(folder, CardOptions(base_models=("alice/my-llava",)))
    assert card.data.base_model == ["alice/my-llava"]


def write_records(root, diag_dir, eval_dir):
    (root / "training_summary.json").write_text(json.dumps({
        "stage": 2, "dataset": "alice/shapes-vqa",
        "recipe": {"learning_rate": 2e-5, "epochs": 1, "hub_token": "<HUB_TOKEN>"},
        "trained_modules": ["model.multi_modal_projector", "model.language_model"],
        "final_metrics": {"train_loss": 0.4321},
    }))
    (root / "norm_tracking.json").write_text(json.dumps(
        [{"step": s, "gain_mean_abs": 0.02 + s / 1000, "vision_text_ratio": 1 + s / 100} for s in range(0, 50, 10)]
    ))
    diag_dir.mkdir(parents=True, exist_ok=True)
    (diag_dir / "summary.md").write_text("# Diagnostics\n\nNorms by layer:\n\n![norms](norms.png)\n")
    (diag_dir / "diagnostics.json").write_text(json.dumps({"models": {"this": {"vision_text_norm_ratio": 1.07}}}))
    eval_dir.mkdir(parents=True, exist_ok=True)
    (eval_dir / "results.md").write_text("## Results\n\n| Model | POPE |\n| --- | ---: |\n| this | 81.20 |\n")
    (eval_dir / "results.json").write_text(json.dumps({"tasks": {"pope": {"score": 81.2}}}))


def test_training_diagnostics_and_evaluation_records_are_reported(folder):
    write_records(folder, folder / "diagnostics", folder / "eval")
    card = render_card(folder)
    text = str(card)
    assert "no training record" not in text
    assert "| recipe.learning_rate | 2e-05 |" in text and "| final_metrics.train_loss | 0.4321 |" in text
    assert "| recipe.hub_token | (redacted) |" in text
    assert "model.multi_modal_projector, model.language_model" in text
    assert "| step | gain_mean_abs | vision_text_ratio |" in text and "| 40 | 0.06 | 1.4 |" in text  # last record
    assert "### Diagnostics" in text and "](diagnostics/norms.png)" in text  # demoted, link follows the upload
    assert "measured by `diagnose` (`models.this.vision_text_norm_ratio`) | 1.07 |" in text
    assert "#### Results" in text and "| this | 81.20 |" in text
    assert card.data.datasets == ["alice/shapes-vqa"] and "trl" in card.data.tags


def test_records_from_other_folders(folder, tmp_path):
    write_records(tmp_path, tmp_path / "diag-run", tmp_path / "eval-run")
    text = str(render_card(folder, CardOptions(diagnostics_dir=str(tmp_path / "diag-run"),
                                               eval_dir=str(tmp_path / "eval-run"))))
    assert "| this | 81.20 |" in text and "| 1.07 |" in text
    assert "No training record" in text  # training_summary.json was written outside the checkpoint


def test_json_results_without_markdown_become_a_table(folder):
    (folder / "eval").mkdir()
    (folder / "eval" / "results.json").write_text(json.dumps({"tasks": {"pope": {"score": 81.2, "n": 500}}}))
    text = str(render_card(folder))
    assert "| tasks.pope.score | 81.2 |" in text and "| tasks.pope.n | 500 |" in text


@pytest.mark.parametrize(
    "fields, expected",
    [
        ({"projector_norm": None}, "stock LLaVA, the paper's \"w/o Norm\" baseline"),
        ({"projector_norm": "layernorm", "norm_init": "default", "gradient_compensation": True,
          "gradient_compensation_min": 1e-3}, "gain initialised to 1, bias 0 (the paper's \"Default Init\""),
        ({"projector_norm": "layernorm", "norm_init": "target", "gradient_compensation": False},
         "Global Weight Compensation off (the paper's \"w/o GWC\" row)"),
    ],
)
def test_the_card_names_the_ablation_variant(fields, expected):
    assert expected in variant_text(fields)


def test_stock_variant_card_has_no_gain_rows(folder):
    edit_json(folder / "config.json", projector_norm=None)
    rows, stats = norm_statistics(read_checkpoint(folder))
    assert ("projector norm", "none (stock LLaVA)") in rows and "gain_mean_abs" not in stats


def test_metadata_passes_local_and_hub_validation_and_bad_metadata_fails_both(tiny_model_dir, tmp_path, monkeypatch):
    import huggingface_hub.constants

    good = render_card(tiny_model_dir, CardOptions(repo_id="alice/x", license="llama3.2",
                                                   base_models=("meta-llama/Llama-3.2-3B-Instruct",)))
    bad = render_card(tiny_model_dir, CardOptions(license="Apache 2.0", base_models=("/home/alice/llm",)))
    with HubServer(tmp_path / "hub", tokens={}) as hub:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)  # ModelCard.validate posts there
        check_card(good)
        good.validate()
        with pytest.raises(ValueError, match="license.*base_model|base_model.*license"):
            check_card(bad)
        with pytest.raises(ValueError, match="license"):
            bad.validate()
        assert ("POST", "/api/validate-yaml", 200) in hub.requests
    assert ModelCard(str(good)).data.to_dict() == good.data.to_dict()


def test_card_command_writes_the_readme(folder, capsys):
    assert main([str(folder), "--repo-id", "alice/tiny-na", "--license", "mit", "--tag", "demo"]) == 0
    assert capsys.readouterr().out == f"wrote {folder / 'README.md'}\n"
    card = ModelCard.load(folder / "README.md")
    assert card.data.license == "mit" and "demo" in card.data.tags
    assert not (folder / "README.md.tmp").exists()
    assert main([str(folder), "--output", "-"]) == 0
    assert capsys.readouterr().out.startswith("---\n")


def test_card_command_reports_a_folder_that_is_not_a_checkpoint(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert f"{tmp_path}: no config.json" in capsys.readouterr().err


def test_the_cards_usage_snippets_run(tiny_model_dir, tmp_path, monkeypatch):
    """Every Python block of the Usage section, run as written (the repo id swapped for the local folder)."""
    pytest.importorskip("bitsandbytes")  # the 4-bit snippet; a dev install has it
    from PIL import Image

    text = str(render_card(tiny_model_dir, CardOptions(repo_id="alice/tiny-na", revision=SHA)))
    usage = text[text.index("## Usage"): text.index("## Method")]
    blocks = [b.split("\n", 1)[1] for b in usage.split("```")[1::2] if b.startswith("python")]
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    Image.new("RGB", (40, 40), (200, 30, 30)).save("image.jpg")
    namespace: dict = {}
    for block in blocks:
        exec(block.replace('"alice/tiny-na"', repr(str(tiny_model_dir))), namespace)  # noqa: S102
    assert type(namespace["model"].model.language_model.layers[0].mlp.down_proj).__name__ == "Linear4bit"
    assert isinstance(namespace["output"], torch.Tensor) and namespace["output"].shape[1] > 0
