"""compose / convert, the CLI, and loading with trust_remote_code where this package is not importable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from transformers import (
    AutoImageProcessor,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    CLIPConfig,
    CLIPModel,
    LlavaProcessor,
    SiglipConfig,
    SiglipModel,
)

from llava_normaligned.cli import main as cli_main
from llava_normaligned.compose import compose, convert_from_llava, input_embedding_weight, save, stock_llava_like
from llava_normaligned.tiny import TinyTextSpec, TinyVisionSpec, save_tiny_parts
from modeling_llava_normaligned import (
    LlavaNormAlignedForConditionalGeneration,
    model_norm_target,
    text_embedding_norm_target,
)
from tests.support.isolation import run_isolated
from tests.support.processes import CONSOLE


def _inputs(processor, n_images=1, question="what colour is the shape"):
    images = [Image.new("RGB", (48, 40), (200, 30, 30)), Image.new("RGB", (40, 40), (20, 30, 200))][:n_images]
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": question}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    return processor(images=images, text=[text], return_tensors="pt")


def test_compose_keeps_both_pretrained_parts(tiny_parts, tiny_model_dir):
    vision_dir, text_dir = tiny_parts
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
    source_vision = AutoModel.from_pretrained(vision_dir)
    for name, param in source_vision.state_dict().items():
        assert torch.equal(model.model.vision_tower.state_dict()[name], param), name
    llm = AutoModelForCausalLM.from_pretrained(text_dir)
    ours = model.model.language_model.state_dict()
    for name, param in llm.model.state_dict().items():
        if name == "embed_tokens.weight":  # one row added for <image>
            assert torch.equal(ours[name][: param.shape[0]], param)
            continue
        assert torch.equal(ours[name], param), name
    assert torch.equal(model.lm_head.weight[: llm.lm_head.weight.shape[0]], llm.lm_head.weight)
    # T from the LM's own embeddings, before the image token was added (paper §5.1)
    assert model.config.norm_target == pytest.approx(text_embedding_norm_target(llm.get_input_embeddings().weight))
    # LLaVA-1.5 defaults
    assert model.config.vision_feature_layer == -2
    assert model.config.vision_feature_select_strategy == "full"  # SigLIP has no CLS token
    assert model.config.projector_hidden_act == "gelu"


def test_composed_folder_loads_with_auto_classes(tiny_model_dir):
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    assert isinstance(model, LlavaNormAlignedForConditionalGeneration)
    assert isinstance(processor, LlavaProcessor)
    assert processor.tokenizer.image_token == "<image>"
    assert processor.tokenizer.image_token_id == model.config.image_token_id
    inputs = _inputs(processor)
    assert (inputs["input_ids"] == model.config.image_token_id).sum() == model.config.image_seq_length
    with torch.no_grad():
        model(**inputs)
    # the LM's chat template is kept (ChatML here), able to render image parts
    assert "<|im_start|>" in processor.chat_template
    for name in ("configuration_llava_normaligned.py", "modeling_llava_normaligned.py", "model.safetensors"):
        assert os.path.exists(os.path.join(tiny_model_dir, name)), name
    config = json.load(open(os.path.join(tiny_model_dir, "config.json")))
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForImageTextToText"}


def test_trust_remote_code_in_a_fresh_python(tiny_model_dir, tiny_model, tiny_processor, tmp_path):
    """A process where this package cannot be imported loads model, base model and processor from the folder."""
    folder = tmp_path / "checkpoint"
    shutil.copytree(tiny_model_dir, folder)
    inputs = _inputs(tiny_processor)
    torch.save(dict(inputs), tmp_path / "inputs.pt")
    with torch.no_grad():
        expected = tiny_model(**inputs).logits
    run_isolated(
        f"""
        import torch
        from transformers import AutoModel, AutoModelForImageTextToText, AutoProcessor
        folder = {str(folder)!r}
        model = AutoModelForImageTextToText.from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__name__ == "LlavaNormAlignedForConditionalGeneration", type(model)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        base = AutoModel.from_pretrained(folder, trust_remote_code=True)
        assert type(base).__name__ == "LlavaNormAlignedModel"
        processor = AutoProcessor.from_pretrained(folder, trust_remote_code=True)
        inputs = torch.load({str(tmp_path / "inputs.pt")!r})
        with torch.no_grad():
            logits = model(**inputs).logits
        torch.save(logits, {str(tmp_path / "logits.pt")!r})
        """,
        cwd=str(tmp_path),
    )
    assert torch.equal(torch.load(tmp_path / "logits.pt"), expected)


@pytest.mark.parametrize(
    "vision, text, strategy, tied",
    [
        (TinyVisionSpec(kind="clip"), TinyTextSpec(kind="qwen2"), "default", False),
        (TinyVisionSpec(kind="siglip"), TinyTextSpec(kind="qwen3", tie_word_embeddings=True), "full", True),
        (TinyVisionSpec(kind="siglip"), TinyTextSpec(kind="llama", tie_word_embeddings=True), "full", True),
    ],
)
def test_compose_other_encoders_and_lms(tmp_path, vision, text, strategy, tied):
    vision_dir, text_dir = save_tiny_parts(tmp_path / "parts", vision=vision, text=text)
    model, processor = compose(vision_dir, text_dir, projector_norm="layernorm", norm_init="target")
    assert model.config.vision_feature_select_strategy == strategy
    assert model.config.text_config.model_type == text.kind
    assert model.config.tie_word_embeddings is tied
    if tied:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    inputs = _inputs(processor)
    n_patches = (vision.image_size // vision.patch_size) ** 2  # CLIP's CLS token is dropped ("default")
    assert (inputs["input_ids"] == model.config.image_token_id).sum() == n_patches
    save(model, processor, str(tmp_path / "out"))
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, model(**inputs).logits)


def test_compose_ablation_options(tiny_parts):
    model, _ = compose(*tiny_parts, projector_norm=None)
    assert model.model.multi_modal_projector.norm is None
    model, _ = compose(*tiny_parts, norm_init="default", gradient_compensation=False)
    norm = model.model.multi_modal_projector.norm
    assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and norm.compensation is False
    from llava_normaligned.norm_variant import NormVariant

    # a NormVariant, and options by name over it; the projector MLP is the same draw whatever the norm
    model, _ = compose(*tiny_parts, norm_variant=NormVariant(gradient_compensation=False), gradient_compensation_min=0.1)
    assert NormVariant.from_config(model.config) == NormVariant(gradient_compensation=False, gradient_compensation_min=0.1)
    assert model.model.multi_modal_projector.norm.compensation_min == 0.1
    paper, _ = compose(*tiny_parts)
    T, D = paper.config.norm_target, paper.config.text_config.hidden_size
    norm = paper.model.multi_modal_projector.norm
    assert torch.equal(norm.weight, torch.full_like(norm.weight, T / D ** 0.5)) and not norm.bias.any()
    assert torch.equal(paper.model.multi_modal_projector.linear_1.weight, model.model.multi_modal_projector.linear_1.weight)
    with pytest.raises(ValueError, match="norm_init must be one of"):
        compose(*tiny_parts, norm_init="zeros")


def test_compose_text_model_without_usable_embeddings(tiny_parts, tmp_path):
    vision_dir, text_dir = tiny_parts
    broken = tmp_path / "text"
    shutil.copytree(text_dir, broken)
    state = load_file(str(broken / "model.safetensors"))
    for key in state:
        if key.endswith("embed_tokens.weight"):
            state[key] = torch.zeros_like(state[key])
    save_file(state, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="text embeddings"):
        compose(vision_dir, str(broken))


@pytest.mark.parametrize(
    "dual_cls, config_cls, strategy", [(SiglipModel, SiglipConfig, "full"), (CLIPModel, CLIPConfig, "default")]
)
def test_compose_from_a_dual_encoder_checkpoint(tiny_parts, tmp_path, dual_cls, config_cls, strategy):
    """The paper's google/siglip-so400m-patch14-384 is a SiglipModel (text + vision): compose keeps its vision half."""
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8)
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=64,
                max_position_embeddings=16)
    torch.manual_seed(0)
    dual = dual_cls(config_cls(vision_config=vision, text_config=text))
    dual.save_pretrained(tmp_path / "dual")
    AutoImageProcessor.from_pretrained(tiny_parts[0]).save_pretrained(tmp_path / "dual")
    model, processor = compose(str(tmp_path / "dual"), tiny_parts[1])
    assert model.config.vision_feature_select_strategy == strategy
    for name, param in dual.vision_model.state_dict().items():
        assert torch.equal(model.model.vision_tower.state_dict()[name], param), name
    with torch.no_grad():
        model(**_inputs(processor))


def test_text_model_without_input_embeddings_is_a_clear_error():
    class NoEmbeddings(torch.nn.Module):
        def get_input_embeddings(self):
            return None

    with pytest.raises(ValueError, match="'some/lm' has no input embeddings"):
        input_embedding_weight(NoEmbeddings(), "some/lm")


def test_compose_keeps_a_bf16_lm_in_bf16(tmp_path):
    vision_dir, text_dir = save_tiny_parts(tmp_path / "parts")
    lm = AutoModelForCausalLM.from_pretrained(text_dir).to(torch.bfloat16)
    lm.save_pretrained(text_dir)
    model, processor = compose(vision_dir, text_dir)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    save(model, processor, str(tmp_path / "out"))
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "out")
    assert {p.dtype for p in reloaded.parameters()} == {torch.bfloat16}
    # asking for a dtype wins
    model32, _ = compose(vision_dir, text_dir, dtype=torch.float32)
    assert {p.dtype for p in model32.parameters()} == {torch.float32}


def test_compose_cli(tiny_parts, tmp_path):
    out = tmp_path / "cli"
    code = cli_main(["compose", "--vision-model", tiny_parts[0], "--text-model", tiny_parts[1],
                     "--output-dir", str(out), "--norm-init", "default", "--no-gradient-compensation"])
    assert code == 0
    config = json.load(open(out / "config.json"))
    assert config["norm_init"] == "default" and config["gradient_compensation"] is False
    assert config["norm_target"] > 0


def test_compose_without_a_norm_speaks_of_no_norm_init_or_gwc(tiny_parts, tmp_path, capsys):
    """``llava-normaligned compose --projector-norm none``, run as a user runs it: the line it ends with says the model
    has no norm, and nothing of a norm init, GWC or a gain. Its config.json says ``projector_norm: null``; the other
    options stay stored (every config field needs a valid value), inert, and what reads the config back describes
    the variant as no norm. With a norm, the line names each option."""
    from llava_normaligned.norm_variant import NormVariant

    out = tmp_path / "none"
    done = subprocess.run([CONSOLE, "compose", "--vision-model", tiny_parts[0], "--text-model", tiny_parts[1],
                           "--output-dir", str(out), "--projector-norm", "none"], capture_output=True, text=True,
                          timeout=300, check=False, stdin=subprocess.DEVNULL,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    measures = (f"T={config['norm_target']:.4f} D={config['text_config']['hidden_size']} "
                f"image tokens/image={config['image_seq_length']}")
    assert done.stdout.splitlines() == [f"wrote {out}: projector_norm=none (w/o Norm) {measures}"], done.stdout
    assert not any(word in done.stdout + done.stderr for word in ("norm_init", "GWC", "gain")), done.stdout
    assert config["projector_norm"] is None
    variant = NormVariant.from_config(config)
    assert variant.in_force() == {"projector_norm": None}
    assert (variant.describe(), variant.report()) == ("none (w/o Norm)", "projector_norm=none (w/o Norm)")
    assert AutoModelForImageTextToText.from_pretrained(out).model.multi_modal_projector.norm is None

    with_norm = tmp_path / "norm"
    assert cli_main(["compose", "--vision-model", tiny_parts[0], "--text-model", tiny_parts[1], "--output-dir",
                     str(with_norm), "--norm-init", "default", "--no-gradient-compensation"]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith(f"wrote {with_norm}: projector_norm=layernorm norm_init=default GWC=False T="), line
    assert " mean|gain|=1.00000 " in line, line


# ------------------------------------------------------------------------------------------------ convert


@pytest.fixture
def stock_llava_dir(tiny_model_dir, tmp_path):
    """A stock LlavaForConditionalGeneration with the tiny model's parts, saved by transformers (legacy keys)."""
    ours = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
    stock = stock_llava_like(ours)
    torch.manual_seed(1)
    with torch.no_grad():  # a trained-looking projector, distinct from the composed init
        for p in stock.model.multi_modal_projector.parameters():
            p.add_(0.05 * torch.randn_like(p))
    out = tmp_path / "stock"
    stock.save_pretrained(out)
    AutoProcessor.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out, stock.eval()


def _current_layout(folder):
    """Rewrite a saved stock checkpoint in the current (transformers 5) key layout."""
    state = load_file(str(folder / "model.safetensors"))
    renamed = {}
    for key, value in state.items():
        key = key.replace("language_model.model.", "model.language_model.", 1)
        key = key.replace("language_model.lm_head.", "lm_head.", 1)
        if key.startswith(("vision_tower.", "multi_modal_projector.")):
            key = "model." + key
        renamed[key] = value
    save_file(renamed, str(folder / "model.safetensors"))
    return sorted(renamed)


@pytest.mark.parametrize("layout", ["as_saved", "current"])
def test_convert_from_stock_llava(stock_llava_dir, layout, tmp_path):
    folder, stock = stock_llava_dir
    keys = sorted(load_file(str(folder / "model.safetensors")))
    if layout == "current":
        keys = _current_layout(folder)
        assert all(k.startswith(("model.", "lm_head.")) for k in keys)
    processor = AutoProcessor.from_pretrained(folder)
    inputs = _inputs(processor)
    with torch.no_grad():
        expected = stock(**inputs).logits

    plain, _ = convert_from_llava(str(folder), projector_norm=None)
    with torch.no_grad():
        assert torch.equal(plain(**inputs).logits, expected)  # w/o Norm == the stock model

    model, processor = convert_from_llava(str(folder))
    norm = model.model.multi_modal_projector.norm
    T = model_norm_target(stock)
    assert model.config.norm_target == pytest.approx(T)
    assert torch.allclose(norm.weight, torch.full_like(norm.weight, T / model.config.text_config.hidden_size ** 0.5))
    for name, param in stock.state_dict().items():
        assert torch.equal(model.state_dict()[name], param), name
    save(model, processor, str(tmp_path / "converted"))
    assert cli_main(["convert", "--from-llava", str(folder), "--output-dir", str(tmp_path / "cli")]) == 0
    reloaded = AutoModelForImageTextToText.from_pretrained(tmp_path / "cli")
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, model(**inputs).logits)


def test_convert_carries_every_norm_option(stock_llava_dir, tmp_path):
    """Each of the four options reaches the converted model: by flag (``convert``), by ``NormVariant`` and by name."""
    from llava_normaligned.norm_variant import NormVariant

    folder, stock = stock_llava_dir
    out = tmp_path / "cli"
    assert cli_main(["convert", "--from-llava", str(folder), "--output-dir", str(out), "--norm-init", "default",
                     "--no-gradient-compensation", "--gradient-compensation-min", "0.02"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert NormVariant.from_config(config) == NormVariant("layernorm", "default", False, 0.02)
    norm = AutoModelForImageTextToText.from_pretrained(out).model.multi_modal_projector.norm
    assert norm.compensation_min == 0.02 and not norm.compensation and torch.equal(norm.weight, torch.ones_like(
        norm.weight))
    variant = NormVariant(gradient_compensation_min=0.5)
    for model, _ in (convert_from_llava(str(folder), norm_variant=variant),
                     convert_from_llava(str(folder), gradient_compensation_min=0.5)):
        norm = model.model.multi_modal_projector.norm
        assert model.config.gradient_compensation_min == 0.5 and norm.compensation_min == 0.5 and norm.compensation
        assert norm.weight.dtype == stock.dtype
    with pytest.raises(ValueError, match="gradient_compensation_min must be"):
        convert_from_llava(str(folder), gradient_compensation_min=0)
    with pytest.raises(ValueError, match="not a projector-norm option: norm_gain"):
        convert_from_llava(str(folder), norm_gain=2.0)


def test_convert_refuses_a_checkpoint_missing_weights(stock_llava_dir):
    folder, _ = stock_llava_dir
    state = load_file(str(folder / "model.safetensors"))
    dropped = next(k for k in sorted(state) if "layers.1" in k and "language_model" in k)
    del state[dropped]
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="missing weights") as info:
        convert_from_llava(str(folder))
    assert "layers.1" in str(info.value)
