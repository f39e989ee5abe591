"""``llava-normaligned align``: the aligned LayerNorm put into stock VLMs of other families.

Each family is a tiny random model of transformers' own classes, built in code (``llava_normaligned.tiny``'s
``save_tiny_vlm``, the stock models the families' diagnose tests use too), saved as a user's folder and aligned
through the CLI. Answers known by construction: on a text-only prompt the aligned model computes the stock
model's logits (loaded where this package cannot be imported, from the folder's own remote code, with no weight
missing or unexpected); with an image the vision tokens enter the LLM at the text norm T (the norm's output has norm
gain * sqrt(D) = T); Global Weight Compensation scales the gradient reaching the connector by 1 / clamp(mean|g|, min).
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from PIL import Image

from llava_normaligned.align import SUPPORTED_MODEL_TYPES
from llava_normaligned.commands.align import main as align_main
from llava_normaligned.cli import main as cli_main
from llava_normaligned.diagnostics import DiagnoseConfig
from llava_normaligned.commands.diagnose import main as diagnose_main
from llava_normaligned.diagnostics.default_inputs import default_images_dir, default_prompts_file
from llava_normaligned.diagnostics.inputs import list_images, load_prompts, pair_samples
from llava_normaligned.diagnostics.runner import probe_model
from llava_normaligned.families.anatomy import ALIGNED_MODEL_TYPE_PREFIX, ALIGNED_NORM_NAME, family_of
from llava_normaligned.loading import load_model
from llava_normaligned.tiny import save_tiny_vlm
from modeling_llava_normaligned import ALIGNED_REMOTE_CODE_FILES
from tests.support.isolation import run_isolated
from tests.support.markdown import table_with

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

FAMILIES = ("idefics3", "smolvlm", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava_next", "llava_onevision", "gemma3",
            "internvl", "mistral3")
# their transformers processors need no torchvision: AutoProcessor and pipeline() work on the aligned folder
AUTO_PROCESSOR = ("llava_next", "gemma3", "idefics3")  # the first: pipeline()
MIN_GWC = 0.5  # the clamp given on the command line to one family (qwen2_vl): the factor is then exactly 2


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> (stock folder, aligned folder), aligned through the CLI."""
    root = tmp_path_factory.mktemp("align")
    made = {}
    for family in FAMILIES:
        stock = save_tiny_vlm(family, str(root / "stock" / family))
        aligned = str(root / "aligned" / family)
        extra = ["--gradient-compensation-min", str(MIN_GWC)] if family == "qwen2_vl" else []
        assert cli_main(["align", stock, "--output-dir", aligned, *extra]) == 0
        made[family] = (stock, aligned)
    return made


def _samples(n: int):
    return pair_samples(list_images(default_images_dir()), load_prompts(default_prompts_file()), n)


# ------------------------------------------------------------------------------------------ the written folder

ISOLATED_CHECK = """
import json, sys
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, pipeline

families = json.loads(sys.argv[1])
auto_processor = json.loads(sys.argv[2])
image = sys.argv[3]
results = {}
for family, (stock_dir, aligned_dir) in families.items():
    torch.manual_seed(0)
    model, info = AutoModelForImageTextToText.from_pretrained(aligned_dir, trust_remote_code=True,
                                                              output_loading_info=True)
    stock = AutoModelForImageTextToText.from_pretrained(stock_dir).eval()
    model.eval()
    config = model.config
    placeholders = {getattr(config, key, None) for key in dir(config) if key.endswith(("token_id", "token_index"))}
    ids = [i for i in range(5, config.get_text_config().vocab_size) if i not in placeholders][:12]
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        same = torch.equal(model(input_ids=input_ids).logits, stock(input_ids=input_ids).logits)
    norm = model.get_submodule(config.norm_connector + ".aligned_norm")
    try:
        AutoModelForImageTextToText.from_pretrained(aligned_dir, trust_remote_code=False)
        refused = False
    except ValueError:
        refused = True
    row = {
        "class": type(model).__name__,
        "module": type(model).__module__,
        "loading_info": {key: sorted(map(str, value)) for key, value in info.items()},
        "same_text_logits": same,
        "gain": float(norm.weight.float().mean()),
        "gain_std": float(norm.weight.float().std()),
        "config": {key: getattr(config, key) for key in ("norm_family", "norm_connector", "norm_entry",
                                                        "norm_target", "gradient_compensation_min")},
        "hidden_size": config.get_text_config().hidden_size,
        "refused_without_remote_code": refused,
    }
    if family in auto_processor:
        row["processor"] = type(AutoProcessor.from_pretrained(aligned_dir)).__name__
        row["stock_processor"] = type(AutoProcessor.from_pretrained(stock_dir)).__name__
    if family == auto_processor[0]:
        pipe = pipeline("image-text-to-text", model=aligned_dir, trust_remote_code=True)
        messages = [{"role": "user", "content": [{"type": "image", "url": image},
                                                 {"type": "text", "text": "what is it?"}]}]
        out = pipe(text=messages, max_new_tokens=2, return_full_text=False)
        row["pipeline"] = type(pipe.model).__name__
        row["pipeline_text"] = out[0]["generated_text"]
    results[family] = row
print("RESULT" + json.dumps(results))
"""


@pytest.fixture(scope="module")
def isolated(folders, tmp_path_factory):
    """What a fresh Python with only torch and transformers (this package cannot be imported) sees of every aligned
    folder: one subprocess for all families."""
    cwd = str(tmp_path_factory.mktemp("isolated"))
    image = list_images(default_images_dir())[0]
    result = run_isolated(ISOLATED_CHECK.replace("sys.argv[1]", repr(json.dumps(folders)))
                          .replace("sys.argv[2]", repr(json.dumps(AUTO_PROCESSOR)))
                          .replace("sys.argv[3]", repr(str(image))), cwd=cwd, timeout=600)
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_folder_loads_as_remote_code_with_every_weight_and_the_stock_text_logits(family, folders, isolated):
    row = isolated[family]
    assert row["class"].startswith("NormAligned") and row["module"].startswith("transformers_modules.")
    assert not any(row["loading_info"].values()), row["loading_info"]  # no missing, unexpected, mismatched key
    assert row["same_text_logits"]
    assert row["refused_without_remote_code"]  # its own model_type: no silent stock load without the norm
    config = row["config"]
    assert config["norm_family"] == family
    assert config["norm_connector"] == family_of(family).projector
    # the gain is the one saved (T / sqrt(D)), not a re-initialised 1
    assert row["gain"] == pytest.approx(config["norm_target"] / row["hidden_size"] ** 0.5, rel=1e-5)
    assert row["gain_std"] == pytest.approx(0.0, abs=1e-7)
    if family in AUTO_PROCESSOR:
        assert row["processor"] == row["stock_processor"]


def test_the_pipeline_runs_on_an_aligned_folder(isolated):
    row = isolated[AUTO_PROCESSOR[0]]
    assert row["pipeline"].startswith("NormAligned")
    assert isinstance(row["pipeline_text"], str)


def test_the_weights_are_the_stock_ones_under_their_own_names_plus_the_norm(folders):
    from safetensors.torch import load_file

    for family in ("qwen2_vl", "idefics3", "llava_next"):  # Qwen2-VL: transformers saves its stock names differently
        stock_dir, aligned_dir = folders[family]
        stock = load_model(stock_dir)[0].state_dict()
        saved = load_file(os.path.join(aligned_dir, "model.safetensors"))
        norm = {f"{family_of(family).projector}.{ALIGNED_NORM_NAME}.{name}" for name in ("weight", "bias")}
        assert norm <= set(saved) and set(saved) - norm <= set(stock)
        assert set(stock) - set(saved) <= {"lm_head.weight"}  # a head tied to the input embeddings is saved once
        for key in saved.keys() - norm:
            assert torch.equal(saved[key], stock[key]), key
        code = sorted(name for name in os.listdir(aligned_dir) if name.endswith(".py"))
        assert code == sorted(ALIGNED_REMOTE_CODE_FILES)  # copied by save_pretrained (register_for_auto_class)


# -------------------------------------------------------------------------------------------- the invariants


def _config(folder: str) -> DiagnoseConfig:
    return DiagnoseConfig(model=folder, output_dir="unused", max_samples=2, batch_size=2, alphas=(1.0,),
                          max_new_tokens=1, progress=False, plots=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_vision_tokens_enter_the_llm_at_the_text_norm(family, folders):
    stock_dir, aligned_dir = folders[family]
    model, processor = load_model(aligned_dir)
    assert family_of(model.config).name == family
    aligned = probe_model(model, processor, _config(aligned_dir), _samples(2))
    assert aligned["family"] == family
    assert aligned["vision_norm"]["llm_input"]["count"] > 0
    assert aligned["vision_text_norm_ratio"] == pytest.approx(1.0, abs=0.1)
    assert aligned["text_embedding_norm"]["T"] == pytest.approx(model.config.norm_target, rel=0.05)
    stock, stock_processor = load_model(stock_dir)
    before = probe_model(stock, stock_processor, _config(stock_dir), _samples(2))
    assert abs(before["vision_text_norm_ratio"] - 1.0) > 0.1  # the stock model's gap, which the norm closes


def _connector_gradient(model, inputs, compensation: bool) -> tuple[torch.Tensor, float]:
    """The gradient reaching the connector's output (the norm's input) for a fixed loss, and the GWC factor."""
    norm = model.get_aligned_norm()
    norm.compensation = compensation
    seen = {}

    def keep(module, args):
        args[0].retain_grad()
        seen["x"] = args[0]

    handle = norm.register_forward_pre_hook(keep)
    try:
        model.zero_grad()
        logits = model(**inputs).logits
        weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(0))
        (logits.float() * weights).sum().backward()
    finally:
        handle.remove()
    return seen["x"].grad.detach().clone(), float(norm.compensation_factor())


def _image_inputs(processor):
    from llava_normaligned.diagnostics.inputs import format_prompt

    sample = _samples(1)[0]
    image = Image.open(sample.image_path).convert("RGB")
    return processor(text=[format_prompt(processor, sample.prompt, True)], images=[image], return_tensors="pt")


@pytest.mark.parametrize("family", ("qwen2_vl", "idefics3", "llava_next", "gemma3"))
def test_gwc_scales_the_gradient_reaching_the_connector(family, folders):
    model, processor = load_model(folders[family][1])
    model.train()
    inputs = _image_inputs(processor)
    plain, _ = _connector_gradient(model, inputs, compensation=False)
    compensated, factor = _connector_gradient(model, inputs, compensation=True)
    gain = model.get_aligned_norm().weight.detach().abs().mean().item()
    expected = 1 / max(gain, MIN_GWC if family == "qwen2_vl" else 1e-3)
    assert factor == pytest.approx(expected, rel=1e-5)
    if family == "qwen2_vl":
        assert factor == pytest.approx(2.0)  # the --gradient-compensation-min given on the command line
    else:
        assert factor > 5  # gain T / sqrt(D) is small: GWC matters
    assert plain.abs().max() > 0
    torch.testing.assert_close(compensated, plain * factor, rtol=1e-4, atol=1e-7)


def test_a_trained_norm_survives_saving_and_loading(folders, tmp_path):
    model, _ = load_model(folders["qwen2_vl"][1])
    norm = model.get_aligned_norm()
    with torch.no_grad():  # as training leaves it: no longer the init's constant gain and zero bias
        norm.weight.copy_(torch.rand_like(norm.weight) + 0.5)
        norm.bias.copy_(torch.randn_like(norm.bias))
    model.save_pretrained(tmp_path / "trained")
    again = type(model).from_pretrained(tmp_path / "trained")
    assert torch.equal(again.get_aligned_norm().weight, norm.weight)
    assert torch.equal(again.get_aligned_norm().bias, norm.bias)


@pytest.mark.parametrize("family", ("llava_onevision", "idefics3"))  # the norm on image features; on the connector
def test_a_copy_of_the_model_applies_its_own_norm(family, folders):
    model, processor = load_model(folders[family][1])
    inputs = _image_inputs(processor)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        before = model(**inputs).logits
        twin.get_aligned_norm().weight.mul_(3)
        assert not torch.allclose(twin(**inputs).logits, before)
        torch.testing.assert_close(model(**inputs).logits, before)
        twin.get_aligned_norm().weight.div_(3)
        torch.testing.assert_close(twin(**inputs).logits, before)


@pytest.mark.parametrize("family", ("qwen3_vl", "llava_onevision"))
def test_diagnose_on_the_aligned_folder_names_the_family_and_reports_the_ratio(family, folders, tmp_path, capsys):
    out = str(tmp_path / "out")
    rc = diagnose_main([folders[family][1], "--output-dir", out, "--max-samples", "2", "--batch-size", "2",
                        "--max-new-tokens", "1", "--alphas", "1.0", "--no-plots", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    with open(os.path.join(out, "diagnostics.json"), encoding="utf-8") as f:
        document = json.load(f)
    assert document["family"] == family
    assert document["model_type"] == ALIGNED_MODEL_TYPE_PREFIX + family
    assert document["vision_text_norm_ratio"] == pytest.approx(1.0, abs=0.1)
    assert "vision/text norm ratio" in capsys.readouterr().out


def test_the_qwen3_vl_deepstack_mergers_are_left_as_they_are(folders):
    from safetensors.torch import load_file

    aligned_dir = folders["qwen3_vl"][1]
    saved = load_file(os.path.join(aligned_dir, "model.safetensors"))
    assert not any("deepstack_merger_list" in key and ALIGNED_NORM_NAME in key for key in saved)
    assert sum(ALIGNED_NORM_NAME in key for key in saved) == 2


# --------------------------------------------------------------------------------------------- bad inputs


def _write_blip2(out: str) -> str:
    from transformers import Blip2Config, Blip2ForConditionalGeneration

    config = Blip2Config(
        vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                       "image_size": 32, "patch_size": 8},
        qformer_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                        "encoder_hidden_size": 16},
        text_config={"model_type": "opt", "vocab_size": 64, "hidden_size": 16, "ffn_dim": 32, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "word_embed_proj_dim": 16},
        num_query_tokens=4,
    )
    Blip2ForConditionalGeneration(config).save_pretrained(out)
    return out


def _write_causal_lm(out: str) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2)).save_pretrained(out)
    return out


@pytest.mark.parametrize("kind", ("blip2", "causal_lm"))
def test_a_model_of_no_supported_family_is_one_line_and_nothing_is_written(kind, tmp_path, capsys):
    source = (_write_blip2 if kind == "blip2" else _write_causal_lm)(str(tmp_path / "source"))
    out = tmp_path / "parent" / "out"
    capsys.readouterr()
    assert align_main([source, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("llava-normaligned align: error:")
    assert "align supports" in err and "qwen2_vl" in err
    assert not out.exists()
    assert not (tmp_path / "parent").exists() or not os.listdir(tmp_path / "parent")


def test_bad_flags_are_one_line(folders, tmp_path, capsys):
    stock_dir, _ = folders["idefics3"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    for argv, words in (
        ([stock_dir, "--output-dir", str(full)], "not empty"),
        ([stock_dir, "--output-dir", str(tmp_path / "a"), "--gradient-compensation-min", "0"], "compensation-min"),
        ([stock_dir, "--output-dir", str(tmp_path / "b"), "--projector-norm", "none"], "projector-norm"),
        ([str(tmp_path / "nowhere"), "--output-dir", str(tmp_path / "c")], "no such folder"),
    ):
        assert align_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    assert os.listdir(full) == ["keep.txt"]
    assert sorted(os.listdir(tmp_path)) == ["full"]


def test_an_aligned_or_this_packages_model_is_refused_with_the_reason(folders, tmp_path, capsys):
    _, aligned_dir = folders["smolvlm"]
    assert align_main([aligned_dir, "--output-dir", str(tmp_path / "again")]) == 2
    assert "already has the aligned norm" in capsys.readouterr().err


def test_the_model_file_and_the_command_know_the_same_families():
    from modeling_llava_normaligned.configuration_normaligned_vlm import (
        ALIGNED_NORM_NAME as MODEL_NORM_NAME,
    )
    from modeling_llava_normaligned.configuration_normaligned_vlm import MODEL_TYPE_PREFIX, STOCK_MODEL_TYPES

    assert tuple(SUPPORTED_MODEL_TYPES) == tuple(STOCK_MODEL_TYPES)
    assert set(FAMILIES) == set(SUPPORTED_MODEL_TYPES)
    assert MODEL_TYPE_PREFIX == ALIGNED_MODEL_TYPE_PREFIX and MODEL_NORM_NAME == ALIGNED_NORM_NAME
    for model_type in SUPPORTED_MODEL_TYPES:
        family = family_of(model_type)
        assert family is not None and family.align_refusal is None, model_type
        assert family_of(ALIGNED_MODEL_TYPE_PREFIX + model_type).projector_norm == ALIGNED_NORM_NAME
    assert family_of("paligemma").align_refusal and family_of("ovis2").align_refusal
    assert family_of(ALIGNED_MODEL_TYPE_PREFIX + "paligemma") is None
    docs = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "align.md")
    with open(docs, encoding="utf-8") as f:
        table = table_with(f.read().split("## Where the norm goes", 1)[1], "its weights")
    for model_type in SUPPORTED_MODEL_TYPES:  # the docs' table has a row for every family, naming the norm's path
        (row,) = [row for row in table if f"(`{model_type}`)" in row["family (`model_type`)"]]
        assert row["its weights"] == f"`{family_of(model_type).projector}.{ALIGNED_NORM_NAME}`", model_type


def test_the_aligned_folder_names_no_local_path(folders):
    """What `align` writes is published as it is (`push`): its JSON and text files name the stock model by its own
    name, never by the folder it was read from."""
    from llava_normaligned.local_paths import local_paths_in

    for family, (stock, aligned) in folders.items():
        for name in sorted(os.listdir(aligned)):
            if name.endswith((".json", ".jinja", ".py", ".md")):
                with open(os.path.join(aligned, name), encoding="utf-8") as f:
                    text = f.read()
                assert stock not in text and not local_paths_in(text), (family, name, local_paths_in(text))


def test_a_quoted_home_folder_is_read_as_the_folder_not_as_a_hub_id(tmp_path, monkeypatch):
    """`align '~/model'` (quoted, so the shell leaves the tilde): the processor files come from the folder."""
    from llava_normaligned.align import processor_source

    (tmp_path / "model").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert processor_source("~/model", None) == str(tmp_path / "model")
