"""Model cards rendered from a checkpoint folder: metadata, the numbers computed from config and weights, the records
of a real training run (``train_stage``), diagnostics and evaluation, what a card must never publish (tokens, local
paths), and the metadata checks: local ones, and those of a Hub API (here the test server's rules, tests/support/hub_server.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file

from llava_normaligned.commands.card import main
from llava_normaligned.hub_cards.card import (
    BIBTEX,
    CardOptions,
    check_card,
    flat_rows,
    norm_statistics,
    read_checkpoint,
    render_card,
    variant_text,
)
from llava_normaligned.loading import KEEP_UNQUANTIZED
from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration, text_embedding_norm_target
from tests.support.hub_server import HubServer
from tests.support.markdown import row_of, table_with
from tests.support.messages import number, one_line

SHA = "0123456789abcdef0123456789abcdef01234567"
NORM_GAIN = "model.multi_modal_projector.norm.weight"
TOKEN = "hf_" + "cardTestToken0123456789abcdefghijk"[:34]
LLM_ID = "meta-llama/Llama-3.2-3B-Instruct"


@pytest.fixture
def folder(tiny_model_dir, tmp_path):
    """A writable copy of the tiny checkpoint."""
    return shutil.copytree(tiny_model_dir, tmp_path / "ckpt")


@pytest.fixture(scope="module")
def trained_dir(tiny_model_dir, tmp_path_factory):
    """The output folder of a real 2-step stage-2 run of the `train` command (its training_summary.json and
    norm_tracking.json as train writes them), its data read from an absolute local path."""
    from llava_normaligned.commands.train import main as train_main
    from tests.support.training import write_llava_dataset

    root = tmp_path_factory.mktemp("trained_for_card")
    data_path, images = write_llava_dataset(root / "private-data", n_rows=8, text_only=0)
    out = root / "run"
    assert train_main([
        "--stage", "2", "--model", tiny_model_dir, "--data-path", data_path, "--image-folder", images,
        "--output-dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "4", "--report_to", "none",
        "--save_strategy", "no", "--gradient_checkpointing", "False", "--disable_tqdm", "True",
    ]) == 0
    return out


@pytest.fixture
def trained(trained_dir, tmp_path):
    """A writable copy of the trained folder, and its training summary."""
    copy = shutil.copytree(trained_dir, tmp_path / "trained")
    return copy, json.loads((copy / "training_summary.json").read_text())


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
    assert "base_model" not in data and "base_model_relation" not in data  # the tiny parts are local folders
    text = str(card)
    assert not any(part in text for part in tiny_parts)  # local paths stay private
    assert 'repo_id = "alice/tiny-na"' in text and f'revision = "{SHA}"' in text
    assert text.count("trust_remote_code=True") >= 3
    skip = re.search(r"llm_int8_skip_modules=(\[.*?\]),", text)
    assert skip and json.loads(skip.group(1)) == list(KEEP_UNQUANTIZED)  # the loader's own list
    assert BIBTEX in text and "no training record" in text.split("## Usage")[0]  # said before the usage
    for section in ("## Usage", "## Method", "## Model", "## Norm statistics", "## Training", "## Diagnostics",
                    "## Evaluation", "## Remote code", "## Citation"):
        assert section in text
    with open(os.path.join(tiny_model_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["norm_init"] == "target" and config["gradient_compensation"] is True
    method = text[text.index("## Method"): text.index("## Model")]
    assert variant_text(config) in method and "T/√D (§5.1)" in method and "Compensation on" in method


def test_unpinned_snippets_name_the_branch_the_card_is_pushed_to(tiny_model_dir):
    text = str(render_card(tiny_model_dir, CardOptions(repo_id="alice/x", branch="dev")))
    assert 'revision = "dev"  # a branch: replace with a commit hash' in text
    assert 'revision = "main"  # a branch' in str(render_card(tiny_model_dir, CardOptions(repo_id="alice/x")))


def test_norm_statistics_come_from_the_weights(folder):
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(folder)
    config = model.config
    gain = model.model.multi_modal_projector.norm.weight.detach()
    _, stats = norm_statistics(read_checkpoint(folder))
    assert stats["T_config"] == config.norm_target and stats["D"] == config.text_config.hidden_size
    assert stats["g_init"] == pytest.approx(config.norm_target / math.sqrt(config.text_config.hidden_size))
    assert stats["gain_abs_mean"] == pytest.approx(float(gain.abs().mean()), rel=1e-6)
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
    assert scaled["gain_abs_mean"] == pytest.approx(3 * stats["gain_abs_mean"], rel=1e-6)
    assert scaled["ratio_expected"] == pytest.approx(3 * stats["ratio_expected"], rel=1e-5)
    assert float(dict(rows)["mean |g| / initial gain"]) == pytest.approx(
        3 * stats["gain_abs_mean"] / stats["g_init"], rel=1e-5)


def test_base_model_is_the_llm_and_a_list_can_be_given(folder):
    edit_json(folder / "config.json", vision_config___name_or_path="google/siglip-so400m-patch14-384",
              text_config___name_or_path=LLM_ID)
    card = render_card(folder)
    # One base model: the Hub reads several as a merge of them. The vision encoder is named in the Model table.
    assert card.data.base_model == [LLM_ID] and "base_model_relation" not in card.data.to_dict()  # not trained
    vision = row_of(str(card), "part", "vision encoder")[""]
    assert re.match(r"(\w+) \(`([^`]+)`\)", vision).groups() == (
        "siglip_vision_model", "google/siglip-so400m-patch14-384")
    card = render_card(folder, CardOptions(base_models=("alice/vit", "alice/llm"), base_model_relation="merge"))
    assert card.data.base_model == ["alice/vit", "alice/llm"] and card.data.base_model_relation == "merge"
    check_card(card)
    with pytest.raises(ValueError, match="base_model_relation: 'fused'"):
        check_card(render_card(folder, CardOptions(base_models=("alice/llm",), base_model_relation="fused")))


def test_card_of_a_trained_checkpoint_shows_its_real_training_record(trained, tmp_path_factory):
    folder, summary = trained
    card = render_card(folder, CardOptions(repo_id="alice/trained"))
    check_card(card)
    text = str(card)
    assert "no training record" not in text and {"trl", "sft"} <= set(card.data.tags)
    rows = dict(re.findall(r"^\| ([\w.]+) \| (.*) \|$", text, flags=re.MULTILINE))  # two-column table rows

    def shown(dotted):
        return rows[dotted]

    # The paper's Table 5 statistics and the final metrics reach the card (not crowded out by other fields).
    stats = summary["norm"]["gain_statistics"]
    assert float(shown("norm.gain_statistics.gain_abs_mean")) == pytest.approx(stats["gain_abs_mean"], rel=1e-5)
    assert float(shown("norm.gain_statistics.gwc_factor")) == pytest.approx(stats["gwc_factor"], rel=1e-5)
    assert float(shown("metrics.train_loss")) == pytest.approx(summary["metrics"]["train_loss"], rel=1e-5)
    assert shown("stage") == "2" and shown("training.global_steps") == "2"
    assert shown("variant.norm_init") == "target"
    assert float(shown("learning_rates.projector")) == pytest.approx(summary["learning_rates"]["projector"])
    # Keys that merely contain "token" are numbers, not secrets.
    assert shown("data.prepare.image_tokens_per_image") == str(summary["data"]["prepare"]["image_tokens_per_image"])
    assert "(redacted)" not in text
    # What the card leaves out is counted, and no absolute local path is published: the data file by its name.
    assert "more fields there" in text and "run.argv" not in rows
    assert shown("data.load.sources") == "train.json"
    assert str(tmp_path_factory.getbasetemp()) not in text and "private-data" not in text
    # The norm tracking written by the run: first, middle and last records.
    records = json.loads((folder / "norm_tracking.json").read_text())
    assert number(r"`norm_tracking\.json`, (\d+) records", text) == len(records)
    trace, shown = table_with(text, "vision_text_ratio"), sorted({0, len(records) // 2, len(records) - 1})
    assert [int(row["step"]) for row in trace] == [records[i]["step"] for i in shown]


def test_datasets_and_relation_come_from_the_training_summary(trained):
    folder, summary = trained
    edit_json(folder / "config.json", text_config___name_or_path=LLM_ID)
    # What train records for a dataset loaded from the Hub (load_messages_dataset: sources = [name]), next to a
    # local file and a relative local folder, which are not datasets on the Hub.
    summary["data"]["load"]["sources"] = ["alice/shapes-vqa", str(folder / "train.json"), "data/train.json"]
    (folder / "training_summary.json").write_text(json.dumps(summary))
    card = render_card(folder, CardOptions(datasets=("alice/extra",)))
    assert card.data.datasets == ["alice/extra", "alice/shapes-vqa"]
    assert card.data.base_model == [LLM_ID] and card.data.base_model_relation == "finetune"  # trained from it
    check_card(card)


def test_secrets_are_redacted_by_key_name_and_by_value_shape():
    rows = dict(flat_rows({"hub_token": "anything", "run": {"HF_TOKEN": "x", "note": f"pushed with {TOKEN}"},
                           "num_input_tokens_seen": 1200, "max_new_tokens": 64}))
    assert rows["hub_token"] == "(redacted)" and rows["run.HF_TOKEN"] == "(redacted)"
    assert rows["run.note"] == "pushed with hf_***"
    assert rows["num_input_tokens_seen"] == "1,200" and rows["max_new_tokens"] == "64"


def write_records(root, diag_dir, eval_dir):
    (root / "norm_tracking.json").write_text(json.dumps(
        [{"step": s, "gain_abs_mean": 0.02 + s / 1000, "vision_text_ratio": 1 + s / 100} for s in range(0, 50, 10)]
    ))
    diag_dir.mkdir(parents=True, exist_ok=True)
    (diag_dir / "summary.md").write_text(
        "# Diagnostics\n\nModel `/home/alice/runs/llava-na-3b` on 8 images.\n\nNorms by layer:\n\n"
        "![norms](norms.png) (see https://huggingface.co/docs/hub)\n"
    )
    (diag_dir / "diagnostics.json").write_text(json.dumps({"models": {"this": {"vision_text_norm_ratio": 1.07}}}))
    eval_dir.mkdir(parents=True, exist_ok=True)
    (eval_dir / "results.md").write_text("## Results\n\n| Model | POPE |\n| --- | ---: |\n| this | 81.20 |\n")
    (eval_dir / "results.json").write_text(json.dumps({"tasks": {"pope": {"score": 81.2}}}))


def test_diagnostics_and_evaluation_records_are_reported_without_local_paths(folder):
    write_records(folder, folder / "diagnostics", folder / "eval")
    text = str(render_card(folder))
    last = table_with(text, "gain_abs_mean")[-1]  # the norm's trace: its last record
    assert (last["step"], last["gain_abs_mean"], last["vision_text_ratio"]) == ("40", "0.06", "1.4")
    assert "### Diagnostics" in text and "](diagnostics/norms.png)" in text  # demoted, link follows the upload
    assert "Model `llava-na-3b` on 8 images" in text and "/home/alice" not in text  # the path cut to its name
    assert "https://huggingface.co/docs/hub" in text  # URLs are not local paths
    measured = [row for row in table_with(text, "statistic")
                if "`models.this.vision_text_norm_ratio`" in row["statistic"]]
    assert len(measured) == 1 and "diagnose" in measured[0]["statistic"] and float(measured[0]["value"]) == 1.07
    assert "#### Results" in text and row_of(text, "Model", "this")["POPE"] == "81.20"


def test_records_from_other_folders(folder, tmp_path):
    write_records(tmp_path, tmp_path / "diag-run", tmp_path / "eval-run")
    text = str(render_card(folder, CardOptions(diagnostics_dir=str(tmp_path / "diag-run"),
                                               eval_dir=str(tmp_path / "eval-run"))))
    assert "| this | 81.20 |" in text and "| 1.07 |" in text
    assert "No training record" in text  # training_summary.json is not in the checkpoint


def test_json_results_without_markdown_become_a_table_and_long_ones_say_what_is_cut(folder):
    (folder / "eval").mkdir()
    tasks = {f"task{i:03d}": {"score": 50 + i / 10, "data_dir": f"/data/alice/task{i:03d}"} for i in range(100)}
    (folder / "eval" / "results.json").write_text(json.dumps({"tasks": tasks}))
    text = str(render_card(folder))
    assert "| tasks.task000.score | 50 |" in text and "| tasks.task000.data_dir | task000 |" in text
    assert "/data/alice" not in text
    shown = table_with(text, "result")
    last = shown[-1]  # 200 rows, so many shown, the last one counting the rest and naming where they are
    assert last["result"] == "..." and "`eval/results.json`" in last["value"]
    assert number(r"(\d+) more rows", last["value"]) == 2 * len(tasks) - (len(shown) - 1)


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


def test_headline_and_method_describe_the_checkpoint_s_own_variant(folder):
    """A "default init, GWC off" checkpoint (the demo's best model in one run) is not sold as the paper's fix."""
    full = str(render_card(folder))
    head, method = full.split("## Usage")[0], full[full.index("## Method"): full.index("## Model")]
    assert "norm-aligning LayerNorm" in head and "T/√D, GWC on" in head and "uses that fix as described" in method
    edit_json(folder / "config.json", norm_init="default", gradient_compensation=False)
    text = str(render_card(folder))
    head, method = text.split("## Usage")[0], text[text.index("## Method"): text.index("## Model")]
    assert "ablations" in head and "default init, gain 1" in head and "GWC off" in head
    assert "norm-aligning" not in head and "T/√D" not in head and "uses that fix" not in method
    assert "ablations" in method and "not the fix as described" in method
    assert "gain initialised to 1" in method and "Global Weight Compensation off" in method


def test_stock_variant_card_has_no_gain_rows(folder):
    edit_json(folder / "config.json", projector_norm=None)
    rows, stats = norm_statistics(read_checkpoint(folder))
    assert ("projector norm", "none (stock LLaVA)") in rows and "gain_abs_mean" not in stats


def test_metadata_checks_local_and_by_a_hub_api(tiny_model_dir, tmp_path, monkeypatch):
    """``check_card`` (local: parses back with huggingface_hub's parser, id and license shapes) and
    ``ModelCard.validate`` against the test server's /api/validate-yaml, which applies the rules written in
    hub_server.validate_card_metadata: this shows the card passes those rules and that the client reports a refusal,
    not that the real Hub accepts it."""
    import huggingface_hub.constants

    good = render_card(tiny_model_dir, CardOptions(repo_id="alice/x", license="llama3.2", base_models=(LLM_ID,),
                                                   base_model_relation="finetune"))
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
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]  # no temporary file left behind
    assert main([str(folder), "--output", "-"]) == 0
    assert capsys.readouterr().out.startswith("---\n")


def test_card_command_reports_a_folder_that_is_not_a_checkpoint(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2  # bad input
    err = capsys.readouterr().err
    assert f"{tmp_path}: no config.json" in err and len(err.strip().splitlines()) == 1
    assert main([str(tmp_path / "nope")]) == 2
    assert "not a folder" in capsys.readouterr().err
    (tmp_path / "adapter_config.json").write_text("{}")
    assert main([str(tmp_path)]) == 2
    assert "a PEFT adapter" in capsys.readouterr().err


def test_card_validate_reports_a_hub_it_cannot_reach(folder, capsys, monkeypatch):
    import socket

    import huggingface_hub.constants

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    assert main([str(folder), "--validate", "--output", "-"]) == 1
    err = capsys.readouterr().err
    line = one_line(err)
    assert f"http://127.0.0.1:{port}" in line and "could not validate" in line


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
