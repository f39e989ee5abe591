"""Training, diagnosing and publishing a stock VLM of another family with the aligned norm (``align``'s output).

Tiny random models of transformers' own classes (``llava_normaligned.tiny.save_tiny_vlm``), aligned through the CLI, then trained
two steps through ``llava-normaligned train --stage 2`` on LLaVA JSON rows, with one learning rate per part. What is
known by construction: the norm is the connector's (it trains, in the projector's optimizer group, at the
projector's rate; PEFT keeps the connector with its norm in ``modules_to_save``); every trainable parameter gets a
gradient (nothing that DDP would wait for); the trained folder loads, every weight and the trained norm in place, in
a Python that has only torch and transformers; ``diagnose``, ``card`` and ``push``'s self-check take it.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

from llava_normaligned.cli import main as cli_main
from llava_normaligned.families.anatomy import ALIGNED_NORM_NAME, anatomy_of, family_of
from llava_normaligned.families.processors import TRAINS_WITHOUT_TORCHVISION
from llava_normaligned.loading import load_model
from llava_normaligned.tiny import save_tiny_vlm
from tests.support.hub_data import write_hub_parquet
from tests.support.isolation import run_isolated
from tests.support.training import write_llava_dataset

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

# the families whose transformers processor loads without torchvision (the others train where it is installed)
TRAINED = TRAINS_WITHOUT_TORCHVISION
PEFT = ("idefics3", "llava_next")  # the norm on the connector's output; on the image features
RATES = {"projector": 1e-3, "llm": 1e-4, "vision_tower": 2e-6}
FAST = ["--max_steps", "2", "--per_device_train_batch_size", "2", "--report_to", "none", "--save_strategy", "no",
        "--gradient_checkpointing", "False", "--disable_tqdm", "True", "--logging_steps", "1", "--seed", "0"]


def _norm_key(family: str, name: str = "weight") -> str:
    return f"{family_of(family).projector}.{ALIGNED_NORM_NAME}.{name}"


def _train(model_dir: str, out: str, data, *extra: str) -> int:
    path, images = data
    return cli_main(["train", "--stage", "2", "--model", model_dir, "--data-path", path, "--image-folder", images,
                     "--output-dir", out, "--lr-projector", str(RATES["projector"]), "--lr-llm", str(RATES["llm"]),
                     "--lr-vision", str(RATES["vision_tower"]), *FAST, *extra])


def _read(folder: str, name: str):
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_llava_dataset(tmp_path_factory.mktemp("align_train_data"), n_rows=8, text_only=1)


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    """family -> the aligned folder (stock folder saved, then `align` through the CLI)."""
    root = tmp_path_factory.mktemp("align_train")
    made = {}
    for family in (*TRAINED, "mistral3"):
        stock = save_tiny_vlm(family, str(root / "stock" / family))
        made[family] = str(root / "aligned" / family)
        assert cli_main(["align", stock, "--output-dir", made[family]]) == 0
    return made


@pytest.fixture(scope="module")
def trained(aligned, data, tmp_path_factory):
    """family -> the folder `train --stage 2` wrote from the aligned folder (two steps, per-part rates)."""
    root = tmp_path_factory.mktemp("align_trained")
    made = {}
    for family in TRAINED:
        made[family] = str(root / family)
        assert _train(aligned[family], made[family], data) == 0, family
    return made


# ------------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("family", TRAINED)
def test_stage2_trains_the_norm_with_the_connector_at_the_projectors_rate(family, aligned, trained):
    summary = _read(trained[family], "training_summary.json")
    assert summary["training"]["global_steps"] == 2
    assert summary["model_class"].startswith("NormAligned")
    variant = summary["variant"]
    assert variant["aligned_family"] == family and variant["projector_norm"] == "layernorm"
    assert variant["norm_connector"] == family_of(family).projector
    assert summary["learning_rates"] == RATES
    model = load_model(aligned[family])[0]
    anatomy = anatomy_of(model)
    d = model.config.get_text_config().hidden_size
    connector = sum(p.numel() for n, p in model.named_parameters() if anatomy.part_of(n) == "projector")
    assert summary["freeze"]["trainable_params"]["projector"] == connector  # the norm's 2 x D included
    assert anatomy.part_of(_norm_key(family)) == "projector"
    groups = {g["name"]: g for g in summary["optimizer_groups"]}
    # the norm's gain and bias are no-decay tensors of the projector's group, at the projector's rate
    assert groups["projector/no_decay"]["lr"] == RATES["projector"] and groups["projector/no_decay"]["num_params"] >= 2 * d
    assert groups["llm"]["lr"] == RATES["llm"] and groups["vision_tower"]["lr"] == RATES["vision_tower"]
    before = load_file(os.path.join(aligned[family], "model.safetensors"))
    after = load_file(os.path.join(trained[family], "model.safetensors"))
    assert set(before) == set(after)  # saved under the same names: the remote-code class loads them as they are
    assert not torch.equal(before[_norm_key(family)], after[_norm_key(family)])  # the norm trained
    llm = [k for k in before if anatomy.part_of(k) == "llm"]
    assert any(not torch.equal(before[k], after[k]) for k in llm)


@pytest.mark.parametrize("family", TRAINED)
def test_the_norm_tracking_reads_what_the_llm_receives(family, aligned, trained):
    records = _read(trained[family], "norm_tracking.json")
    assert [r["step"] for r in records] == [0, 1, 2]
    config = load_model(aligned[family])[0].config
    gain = config.norm_target / config.get_text_config().hidden_size ** 0.5
    start = records[0]
    assert start["gain_abs_mean"] == pytest.approx(gain, rel=1e-5)  # T / sqrt(D), as aligned
    assert start["gwc_factor"] == pytest.approx(1 / gain, rel=1e-5)
    assert start["text_embedding_norm"] == pytest.approx(config.norm_target, rel=1e-5)  # T as align measured it
    # the norm's output is ||g * x_hat + b|| <= ||g|| sqrt(D) ... = T (with b = 0 at the start; LayerNorm's eps makes
    # it smaller for the tiny connectors' nearly flat outputs): read after the norm, never the connector's raw output
    assert 0.5 < start["vision_text_ratio"] <= 1.0 + 1e-4
    assert all("vision_text_ratio" in r and "gain_l2" in r for r in records[1:])


@pytest.mark.parametrize("family", TRAINED)
def test_every_trainable_parameter_gets_a_gradient(family, aligned, data):
    """Nothing trainable is left without a gradient (DDP would wait for it): the families that read the vision
    tower's last output train every vision parameter; LLaVA-NeXT / OneVision leave the unused ones frozen."""
    from llava_normaligned.trainer.collator import LlavaTrainingCollator
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.preprocess import prepare_dataset
    from llava_normaligned.trainer.stages import freeze_for_stage, unused_vision_parameters

    model, processor = load_model(aligned[family], for_training=True)
    report = freeze_for_stage(model, 2)
    never_used = unused_vision_parameters(model)
    assert report.never_used == sorted(never_used)
    rows, _ = prepare_dataset(load_llava_json(*data), processor, max_length=None)
    family_info = anatomy_of(model).family
    batch = LlavaTrainingCollator(processor, images_per_text=family_info.images_per_text)([rows[0], rows[1]])
    for param in model.parameters():  # every parameter, the frozen ones too: which does the forward leave out?
        param.requires_grad_(True)
    model.train()
    model(**batch).loss.backward()
    without = {n for n, p in model.named_parameters() if p.grad is None}
    assert without == set(never_used)  # exactly what the stage freezes as never used: no more, no less
    # the labels are the answers only: no image token, no prompt
    labelled = batch["labels"][0][batch["labels"][0] != -100]
    answers = [m["content"] for m in rows[0]["messages"] if m["role"] == "assistant"]
    text = processor.tokenizer.decode(labelled)
    assert all(answer in text for answer in answers) and "?" not in text, text


def test_stage1_trains_the_connector_and_its_norm_only(aligned, data, tmp_path):
    out = str(tmp_path / "stage1")
    path, images = data
    assert cli_main(["train", "--stage", "1", "--model", aligned["idefics3"], "--data-path", path, "--image-folder",
                     images, "--output-dir", out, *FAST]) == 0
    summary = _read(out, "training_summary.json")
    assert summary["freeze"]["trainable_params"]["llm"] == 0
    assert summary["freeze"]["trainable_params"]["vision_tower"] == 0
    before = load_file(os.path.join(aligned["idefics3"], "model.safetensors"))
    after = load_file(os.path.join(out, "model.safetensors"))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert _norm_key("idefics3") in changed and changed <= {k for k in before if k.startswith("model.connector.")}


def test_hub_format_rows_train_an_aligned_model(aligned, tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    folder = write_hub_parquet(tmp_path / "hub_rows", n_rows=12)
    out = str(tmp_path / "run")
    assert cli_main(["train", "--stage", "2", "--model", aligned["llava_next"], "--dataset-name", folder,
                     "--output-dir", out, *FAST]) == 0
    summary = _read(out, "training_summary.json")
    assert summary["data"]["load"]["rows_kept"] == 12 and summary["training"]["global_steps"] == 2


@pytest.mark.parametrize("family", PEFT)
def test_lora_keeps_the_connector_and_its_norm_trained_fully_and_merges(family, aligned, data, tmp_path):
    out = str(tmp_path / "lora")
    assert _train(aligned[family], out, data, "--use_peft", "--lora_r", "4", "--merge-adapter") == 0
    adapter = _read(out, "adapter_config.json")
    assert adapter["modules_to_save"] == [family_of(family).projector_module_name]
    saved = load_file(os.path.join(out, "adapter_model.safetensors"))
    trained_norm = next(v for k, v in saved.items() if k.endswith(f"{ALIGNED_NORM_NAME}.weight"))
    start = load_file(os.path.join(aligned[family], "model.safetensors"))[_norm_key(family)]
    assert not torch.equal(trained_norm, start)  # the copy PEFT trains is the one the forward used
    merged = load_file(os.path.join(out, "merged", "model.safetensors"))
    torch.testing.assert_close(merged[_norm_key(family)], trained_norm, rtol=0, atol=0)


# ------------------------------------------------------------------------------ the trained folder, elsewhere

BARE_LOAD = """
import json, sys
import torch
from safetensors.torch import save_file
from transformers import AutoModelForImageTextToText

folders = json.loads(sys.argv[1])
out = {}
for family, (folder, norm_path) in folders.items():
    model, info = AutoModelForImageTextToText.from_pretrained(folder, trust_remote_code=True, output_loading_info=True)
    out[family] = {"class": type(model).__name__, "module": type(model).__module__,
                   "loading_info": {k: sorted(map(str, v)) for k, v in info.items()}}
    torch.save(model.get_submodule(norm_path).weight.detach().clone(), sys.argv[2] + f"/{family}.pt")
print("RESULT" + json.dumps(out))
"""


def test_the_trained_folder_loads_in_a_bare_python_with_its_trained_norm(trained, tmp_path):
    folders = {f: (trained[f], f"{family_of(f).projector}.{ALIGNED_NORM_NAME}") for f in TRAINED}
    result = run_isolated(BARE_LOAD.replace("sys.argv[1]", repr(json.dumps(folders)))
                          .replace("sys.argv[2]", repr(str(tmp_path))), cwd=str(tmp_path), timeout=600)
    rows = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("RESULT"))[6:])
    for family in TRAINED:
        row = rows[family]
        assert row["class"].startswith("NormAligned") and row["module"].startswith("transformers_modules."), row
        assert not any(row["loading_info"].values()), (family, row["loading_info"])
        saved = load_file(os.path.join(trained[family], "model.safetensors"))[_norm_key(family)]
        assert torch.equal(torch.load(tmp_path / f"{family}.pt"), saved)


@pytest.mark.parametrize("family", TRAINED)
def test_diagnose_names_the_family_of_the_trained_folder(family, trained, data, tmp_path, capsys):
    """The folder `train` wrote (its processor saved by the Trainer) diagnoses; the training images are small enough
    for the tiny LLMs' 1024-token context in every family (InternVL tiles the default images past it)."""
    out = str(tmp_path / "diag")
    assert cli_main(["diagnose", trained[family], "--output-dir", out, "--max-samples", "2", "--batch-size", "2",
                     "--max-new-tokens", "1", "--alphas", "1.0", "--no-plots", "--no-progress",
                     "--images", data[1]]) == 0, capsys.readouterr().err
    document = _read(out, "diagnostics.json")
    assert document["family"] == family
    assert 0 < document["vision_text_norm_ratio"] < 10


def test_the_card_describes_the_aligned_family_and_push_accepts_the_folder(trained, tmp_path, capsys):
    folder = trained["idefics3"]
    assert cli_main(["card", folder, "--output", str(tmp_path / "README.md")]) == 0
    card = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "of the idefics3 family" in card and "`llava-normaligned align`" in card
    assert "stock connector `model.connector`" in card
    assert "stock LLaVA" not in card and "w/o Norm" not in card
    assert "register_aligned_auto_classes()" in card
    assert "already trained idefics3 model" in card and "uses that fix as described" not in card
    assert "- idefics3" in card.split("---")[1]  # the family's tag in the metadata
    # the self-check (remote code, weights, secrets, local paths, the fresh-process load) passes; nothing uploaded
    assert cli_main(["push", folder, "--repo-id", "alice/idefics3-aligned", "--dry-run"]) == 0
    assert "dry run: nothing uploaded" in capsys.readouterr().out


def test_the_card_names_the_stock_model_as_the_base_when_align_was_given_a_hub_id(trained, tmp_path):
    import shutil

    from llava_normaligned.hub_cards.card import render_card

    folder = tmp_path / "from_hub"
    shutil.copytree(trained["llava_next"], folder)
    config = _read(str(folder), "config.json")
    (folder / "config.json").write_text(json.dumps({**config, "norm_source": "llava-hf/llava-v1.6-mistral-7b-hf"}))
    card = render_card(folder)
    assert card.data.base_model == ["llava-hf/llava-v1.6-mistral-7b-hf"]
    assert card.data.base_model_relation == "finetune"  # it was trained (training_summary.json)
    named = re.search(r"of the (\w+) family \(`([^`]+)`\)", str(card).split("## Usage")[0])  # the headline
    assert named and named.groups() == ("llava_next", "llava-hf/llava-v1.6-mistral-7b-hf")


def test_push_and_pull_through_a_hub_server(trained, tmp_path):
    """The real huggingface_hub client over HTTP against the local Hub server: push (with the fresh-process load
    check), then pull; the pulled folder has the trained weights and the aligned remote code, byte for byte."""
    import huggingface_hub.constants

    from llava_normaligned.hub_cards.push import pull, push
    from modeling_llava_normaligned import ALIGNED_REMOTE_CODE_FILES
    from tests.support.hub_server import HubServer

    token = "hf_" + "alignTestToken0123456789abcdefghijk"[:34]
    folder = trained["gemma3"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)  # the server speaks LFS, not Xet
        with HubServer(tmp_path / "hub", tokens={token: "alice"}) as hub:
            pushed = push(folder, "alice/gemma3-aligned", token=token, endpoint=hub.url)
            assert {"model.safetensors", "config.json", *ALIGNED_REMOTE_CODE_FILES} <= set(pushed.uploaded)
            pulled = pull("alice/gemma3-aligned", local_dir=tmp_path / "pulled", token=token, endpoint=hub.url)
    assert pulled.commit == pushed.commit or pushed.card_commit == pulled.commit
    for name in ("model.safetensors", *ALIGNED_REMOTE_CODE_FILES):
        assert (tmp_path / "pulled" / name).read_bytes() == open(os.path.join(folder, name), "rb").read(), name
    assert {name for name, _, same in pulled.remote_code if same} >= set(ALIGNED_REMOTE_CODE_FILES)


# ---------------------------------------------------------------------------------------------- refusals


def test_a_variant_flag_that_differs_from_the_aligned_norm_is_one_line(aligned, data, tmp_path, capsys):
    out = tmp_path / "never"
    assert _train(aligned["idefics3"], str(out), data, "--gradient-compensation", "False") == 2
    err = capsys.readouterr().err
    assert "chosen when it is written" in err and "llava-normaligned align" in err
    assert not out.exists()


def test_a_family_whose_processor_needs_torchvision_is_refused_in_one_line(aligned, data, tmp_path, capsys):
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torchvision is installed: Mistral3's transformers processor loads and trains")
    out = tmp_path / "never"
    assert _train(aligned["mistral3"], str(out), data) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "mistral3" in err and "pip install torchvision" in err
    assert not out.exists()


# ------------------------------------------------------------------------------------------- two processes

DDP_RANK_SCRIPT = """
import json, os, sys
import torch, torch.distributed as dist
from trl import SFTConfig
from llava_normaligned.loading import load_model
from llava_normaligned.families.processors import TRAINS_WITHOUT_TORCHVISION
from llava_normaligned.tiny import save_tiny_vlm
from llava_normaligned.trainer.data import load_llava_json
from llava_normaligned.trainer.train import StageConfig, shared_image_checker, train_stage

folders, data, images, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
for family, folder in folders.items():
    # every row has an image and DDP is told no parameter goes unused: a trainable parameter that the forward left
    # without a gradient would stop the second step ("Expected to have finished reduction ...")
    args = SFTConfig(output_dir=os.path.join(out, family), use_cpu=True, bf16=False, report_to=[],
                     gradient_checkpointing=False, ddp_find_unused_parameters=False, max_steps=2,
                     per_device_train_batch_size=1, logging_steps=1, save_strategy="no", learning_rate=1e-3,
                     seed=0, disable_tqdm=True)
    dataset = load_llava_json(data, images, image_checker=shared_image_checker(args))
    model, processor = load_model(folder, for_training=True)
    result = train_stage(model, processor, dataset, args=args, stage=StageConfig(2, lr_vision=2e-4))
    rank = dist.get_rank()
    torch.save({n: p.detach() for n, p in result.model.named_parameters()}, os.path.join(out, f"{family}{rank}.pt"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump({"rank": rank, "world_size": dist.get_world_size()}, handle)
"""


def test_two_process_ddp_trains_aligned_models_with_no_unused_parameter(aligned, tmp_path):
    from tests.support.distributed import torchrun

    families = ("gemma3", "llava_next")  # a SigLIP pooling head; layers after the feature layer, post layernorm
    path, images = write_llava_dataset(tmp_path / "data", n_rows=4, text_only=0, multi_turn_every=0)
    ranks = torchrun(DDP_RANK_SCRIPT, tmp_path, json.dumps({f: aligned[f] for f in families}), path, images)
    assert [r["world_size"] for r in ranks] == [2, 2]
    out = tmp_path / "out"
    for family in families:
        w0, w1 = torch.load(out / f"{family}0.pt"), torch.load(out / f"{family}1.pt")
        assert all(torch.equal(w0[n], w1[n]) for n in w0), family  # the ranks stayed in step
        start = load_file(os.path.join(aligned[family], "model.safetensors"))
        assert not torch.equal(start[_norm_key(family)], w0[_norm_key(family)])  # the norm trained under DDP
