"""``diagnose`` on the LLaVA-like families of transformers 5: LLaVA-NeXT, LLaVA-OneVision, Gemma3, PaliGemma, Mistral3,
InternVL and Ovis2. Each is a tiny random model built in code from its real classes, with a processor built offline
(a BPE tokenizer trained in code holding the family's special tokens, the family's image processor at tiny sizes, a
chat template writing the family's image placeholder), saved as a user's folder and diagnosed from it: the stock
VLMs of ``llava_normaligned.tiny`` (``save_tiny_vlm``), and PaliGemma and Ovis2 built here from its pieces.

Answers known by construction: the vision norm reported at the LLM input is what an independent hook on the language
model's ``inputs_embeds`` sees at the image positions; scaling the connector's output layer by k scales the reported
vision/text ratio by k.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from llava_normaligned.commands.diagnose import main
from llava_normaligned.diagnostics import DiagnoseConfig
from llava_normaligned.diagnostics.default_inputs import default_images_dir, default_prompts_file
from llava_normaligned.diagnostics.inputs import list_images, load_prompts, pair_samples
from llava_normaligned.tiny import (
    TinyVLM,
    chatml_template,
    family_tokenizer,
    save_tiny_vlm,
    tiny_qwen2_config,
    tiny_siglip_config,
    tiny_vlm,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

# The families ``align`` supports are ``llava_normaligned.tiny``'s stock VLMs; PaliGemma and Ovis2 (which ``align``
# refuses) are built here from the same pieces: its tokenizer, chat template and tiny vision / text configs.


def build_paligemma():
    """PaliGemma as its checkpoints ship: no chat template; the prompt is the prefix after the image and BOS."""
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration, PaliGemmaProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tok = family_tokenizer(["<image>"], {"image_token": "<image>"}, None)
    text = {"model_type": "gemma", "vocab_size": len(tok), "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
            "max_position_embeddings": 1024}
    config = PaliGemmaConfig(vision_config=tiny_siglip_config(projection_dim=32), text_config=text, projection_dim=32,
                             hidden_size=32, image_token_index=tok.image_token_id, vocab_size=len(tok))
    images = SiglipImageProcessorPil(size={"height": 32, "width": 32})
    images.image_seq_length = 16
    processor = PaliGemmaProcessor(images, tok)
    return PaliGemmaForConditionalGeneration(config), processor


def build_ovis2():
    from transformers import Ovis2Config, Ovis2ForConditionalGeneration, Ovis2Processor
    from transformers.models.ovis2.image_processing_pil_ovis2 import Ovis2ImageProcessorPil

    indicators = ["<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"]
    tok = family_tokenizer(["<image>", "<IMG_ATOM>", *indicators], {"image_token": "<image>"},
                           chatml_template("<image>"))
    vision = {"hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 2,
              "image_size": 32, "patch_size": 8, "hidden_stride": 2, "vocab_size": 64, "num_visual_indicator_tokens": 5}
    config = Ovis2Config(vision_config=vision, text_config=tiny_qwen2_config(len(tok)), hidden_size=32,
                         vocab_size=len(tok), image_token_id=tok.convert_tokens_to_ids("<IMG_ATOM>"),
                         visual_indicator_token_ids=tok.convert_tokens_to_ids(indicators))
    images = Ovis2ImageProcessorPil(size={"height": 32, "width": 32}, crop_to_patches=False)
    processor = Ovis2Processor(images, tok, image_seq_length=4, chat_template=tok.chat_template)
    return Ovis2ForConditionalGeneration(config), processor


OTHER_FAMILIES = {"paligemma": build_paligemma, "ovis2": build_ovis2}
FAMILIES = ("llava_next", "llava_onevision", "gemma3", "paligemma", "mistral3", "internvl", "ovis2")


def save_family(name: str, out: str) -> str:
    """The family's tiny model and processor saved as a user's folder (seed 0). A processor transformers cannot build
    without torchvision is saved as its checkpoints hold it: image processor, tokenizer, processor_config.json and the
    chat template in chat_template.json."""
    if name not in OTHER_FAMILIES:
        return save_tiny_vlm(name, out, seed=0)
    torch.manual_seed(0)
    model, processor = OTHER_FAMILIES[name]()
    return TinyVLM(model=model, processor=processor).save(out)


# The parameters whose scaling by k scales every vector the connector writes at the image positions by k (the last
# layer's weight and bias; LLaVA-NeXT/OneVision's newline row, written there too).
OUTPUT_PARAMETERS = {
    "llava_next": ("model.multi_modal_projector.linear_2", "model.image_newline"),
    "llava_onevision": ("model.multi_modal_projector.linear_2", "model.image_newline"),
    "gemma3": ("model.multi_modal_projector.mm_input_projection_weight",),
    "paligemma": ("model.multi_modal_projector.linear",),
    "mistral3": ("model.multi_modal_projector.linear_2",),
    "internvl": ("model.multi_modal_projector.linear_2",),
    "ovis2": ("model.visual_embeddings_table",),
}
NEEDS_OFFLINE_PROCESSOR = {"llava_onevision", "internvl", "mistral3"}  # their stock processors need torchvision


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: save_family(name, str(root / name)) for name in FAMILIES}


def _config(**kwargs) -> DiagnoseConfig:
    options = {"model": "in-memory", "output_dir": "unused", "max_samples": 2, "batch_size": 2, "alphas": (1.0,),
                   "max_new_tokens": 2, "progress": False, "plots": False}
    return DiagnoseConfig(**{**options, **kwargs})


def _samples(n: int = 2):
    return pair_samples(list_images(default_images_dir()), load_prompts(default_prompts_file()), n)


def _load(folder: str):
    from llava_normaligned.diagnostics.runner import load

    return load(folder, None, _config(model=folder))


def _llm_input_norms_by_hook(model, batches) -> tuple[torch.Tensor, torch.Tensor]:
    """The norms of what the language model receives at the image-token positions, read by a hook of this test on
    ``model.model.language_model`` over a plain forward of each batch: (every token's, each sample's mean)."""
    image_id = model.config.image_token_id
    tokens, samples, ids = [], [], {}

    def on_base(module, args, kwargs):
        ids["now"] = kwargs["input_ids"] if "input_ids" in kwargs else args[0]

    def on_llm(module, args, kwargs):
        image = ids["now"] == image_id  # (B, S)
        norms = kwargs["inputs_embeds"].detach().float().norm(dim=-1)  # (B, S)
        tokens.append(norms[image])
        samples.extend(float(row[mask].mean()) for row, mask in zip(norms, image))

    handles = [model.model.register_forward_pre_hook(on_base, with_kwargs=True),
               model.model.language_model.register_forward_pre_hook(on_llm, with_kwargs=True)]
    try:
        with torch.no_grad():
            for batch in batches:
                model(**batch.inputs, logits_to_keep=1)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat(tokens), torch.tensor(samples)


@pytest.fixture(scope="module")
def odd_images(tmp_path_factory):
    """Images of three sizes and shapes, so that one batch holds different crops, tiles and row counts."""
    from PIL import Image, ImageDraw

    folder = tmp_path_factory.mktemp("odd_images")
    for i, (width, height) in enumerate([(90, 40), (40, 100), (64, 48)]):
        image = Image.new("RGB", (width, height), (200, 60 * i, 40))
        ImageDraw.Draw(image).ellipse((5, 5, width - 5, height - 5), fill=(10, 200, 10))
        image.save(folder / f"{i}.png")
    return pair_samples(list_images(str(folder)), load_prompts(default_prompts_file()), 3)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_vision_norm_at_the_llm_input_is_what_the_language_model_receives(name, family_dirs, odd_images):
    from llava_normaligned.diagnostics.family_batches import batches_for
    from llava_normaligned.diagnostics.runner import probe_model
    from llava_normaligned.families.anatomy import family_of

    model, processor = _load(family_dirs[name])
    assert family_of(model.config).name == name
    assert type(model).__name__.lower().startswith(name.replace("_", ""))
    config = _config(max_samples=3)
    report = probe_model(model, processor, config, odd_images)  # a batch of 2 images of other sizes, then 1
    batches = batches_for(model.config)(processor, model.config, odd_images, 2, 2)
    norms, per_sample = _llm_input_norms_by_hook(model, batches)
    llm_input = report["vision_norm"]["llm_input"]
    assert llm_input["count"] == norms.numel() > 0
    assert llm_input["mean"] == pytest.approx(float(norms.mean()), rel=1e-5)
    assert report["vision_text_norm_ratio"] == pytest.approx(float(norms.mean()) / report["text_embedding_norm"]["T"],
                                                             rel=1e-5)
    # the residual stream's layer 0 at the image positions is the same input (layer statistics weigh each sample
    # the same: the mean over a sample's image tokens, then over samples)
    assert report["layers"]["vision"]["norm"][0] == pytest.approx(float(per_sample.mean()), rel=1e-4)
    assert len(report["layers"]["vision"]["norm"]) == len(model.model.language_model.layers) + 1


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_scaling_the_connector_output_by_k_scales_the_ratio_by_k(name, family_dirs):
    from llava_normaligned.diagnostics.runner import probe_model

    model, processor = _load(family_dirs[name])
    before = probe_model(model, processor, _config(), _samples())
    k = 3.0
    with torch.no_grad():
        for path in OUTPUT_PARAMETERS[name]:
            target = model.get_submodule(path) if not path.endswith(("weight", "newline")) else None
            tensors = list(target.parameters()) if target is not None else [model.get_parameter(path)]
            for tensor in tensors:
                tensor.mul_(k)
    after = probe_model(model, processor, _config(), _samples())
    assert after["vision_text_norm_ratio"] == pytest.approx(k * before["vision_text_norm_ratio"], rel=1e-4)
    assert after["vision_norm"]["llm_input"]["mean"] == pytest.approx(
        k * before["vision_norm"]["llm_input"]["mean"], rel=1e-4)
    assert after["vision_norm"]["encoder_output"] == before["vision_norm"]["encoder_output"]
    assert after["text_embedding_norm"]["T"] == before["text_embedding_norm"]["T"]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_cli_diagnoses_each_family_folder(name, family_dirs, tmp_path, capsys):
    out = str(tmp_path / "out")
    rc = main([family_dirs[name], "--output-dir", out, "--max-samples", "2", "--batch-size", "2", "--max-new-tokens",
               "2", "--alphas", "0.5", "--no-plots", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    with open(os.path.join(out, "diagnostics.json"), encoding="utf-8") as f:
        document = json.load(f)
    assert document["model_type"] == name
    assert document["vision_text_norm_ratio"] > 0
    assert document["text_tokens"]["rule"] == "prompt-span"
    sweep = document["alpha_sweep"]
    assert sweep is not None
    assert "vision/text norm ratio" in capsys.readouterr().out


def test_the_processors_that_need_torchvision_are_built_without_it(family_dirs):
    from transformers import AutoConfig, AutoProcessor

    from llava_normaligned.families.processors import load_processor

    for name in sorted(NEEDS_OFFLINE_PROCESSOR):
        try:
            import torchvision  # noqa: F401
        except ImportError:
            with pytest.raises((ImportError, ValueError)):  # what a user of this machine meets
                AutoProcessor.from_pretrained(family_dirs[name])
        processor = load_processor(family_dirs[name], AutoConfig.from_pretrained(family_dirs[name]))
        assert not processor.tokenizer.chat_template  # the folder's chat_template.json is the one used
        assert "<|im_start|>" in processor.chat_template
        assert not hasattr(processor, "video_processor")


def _one_batch(name, family_dirs):
    from llava_normaligned.diagnostics.family_batches import batches_for

    model, processor = _load(family_dirs[name])
    return model, processor, batches_for(model.config)(processor, model.config, _samples(1), 1, 2)[0]


def test_paligemma_prompt_is_its_processors_prefix_and_generated_tokens_are_the_causal_suffix(family_dirs):
    from llava_normaligned.diagnostics import passes
    from llava_normaligned.diagnostics.inputs import open_image

    model, processor, batch = _one_batch("paligemma", family_dirs)
    sample = batch.samples[0]
    stock = processor(text=[sample.prompt], images=[open_image(sample.image_path)], return_tensors="pt")
    assert batch.inputs["input_ids"].tolist() == stock["input_ids"].tolist()  # <image> x N, BOS, prefix, "\n"
    assert torch.equal(batch.inputs["pixel_values"], stock["pixel_values"])
    assert batch.inputs["token_type_ids"].tolist() == stock["token_type_ids"].tolist()
    assert not batch.inputs["token_type_ids"].any()  # image and prefix: one bidirectional block
    image_run = batch.image_mask[0].nonzero()[:, 0]
    assert image_run.tolist() == list(range(16)) and batch.text_rule == "prompt-span"
    appended = torch.tensor([[5, 6]])
    kwargs = passes.model_inputs(model, batch.inputs, appended=appended)
    assert kwargs["token_type_ids"][0, -2:].tolist() == [1, 1]  # the generated suffix: causal
    assert kwargs["token_type_ids"].shape == kwargs["input_ids"].shape


def test_gemma3_image_block_and_scaled_text_embeddings(family_dirs):
    from llava_normaligned.diagnostics import passes
    from llava_normaligned.diagnostics.inputs import open_image
    from llava_normaligned.diagnostics.runner import probe_model

    model, processor, batch = _one_batch("gemma3", family_dirs)
    tok = processor.tokenizer
    ids = batch.inputs["input_ids"][0].tolist()
    soft = [i for i, t in enumerate(ids) if t == tok.image_token_id]
    assert len(soft) == 4 and ids[soft[0] - 1] == tok.boi_token_id and ids[soft[-1] + 1] == tok.eoi_token_id
    assert batch.inputs["token_type_ids"][0, soft].tolist() == [1] * 4  # the soft tokens attend both ways
    assert batch.inputs["token_type_ids"][0].sum() == 4
    sample = batch.samples[0]
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                          "text": sample.prompt}]}], add_generation_prompt=True, tokenize=False)
    stock = processor(text=[text], images=[[open_image(sample.image_path)]], return_tensors="pt",
                      add_special_tokens=False)
    assert ids == stock["input_ids"][0].tolist()
    kwargs = passes.model_inputs(model, batch.inputs, appended=torch.tensor([[5, 6]]))
    assert kwargs["token_type_ids"][0, -2:].tolist() == [0, 0]  # generated text
    report = probe_model(model, processor, _config(), _samples())
    weight = model.get_input_embeddings().weight.detach()
    rows = torch.cat([weight[: tok.image_token_id], weight[tok.image_token_id + 1:]]).norm(dim=-1)
    scale = model.config.text_config.hidden_size ** 0.5  # Gemma's embed_tokens multiplies its rows by sqrt(D)
    assert report["text_embedding_norm"]["embed_scale"] == pytest.approx(scale)
    assert report["text_embedding_norm"]["mean"] == pytest.approx(float(rows.mean()) * scale, rel=1e-5)


def test_ovis2_visual_token_distribution_rq4(family_dirs):
    """Ovis's vision tokens are p @ W: never longer than the rows they mix, as long as a row for a one-hot p."""
    from llava_normaligned.diagnostics.runner import probe_model

    model, processor = _load(family_dirs["ovis2"])
    soft = probe_model(model, processor, _config(), _samples())
    tokens = soft["visual_tokens"]
    assert tokens["embedding_norm"]["mean"] == pytest.approx(soft["vision_norm"]["llm_input"]["mean"], rel=1e-5)
    assert tokens["embedding_norm"]["count"] == soft["vision_norm"]["llm_input"]["count"]
    assert tokens["visual_vocabulary_size"] == 64 - 5 and tokens["num_indicator_tokens"] == 5
    assert 0 < tokens["entropy"]["max"] <= tokens["log_vocabulary"] + 1e-5
    assert tokens["mixing_ratio"]["max"] <= 1 + 1e-5
    assert tokens["mixing_ratio"]["mean"] < 0.9  # a random head gives soft distributions that average rows out
    with torch.no_grad():  # logits x 1000: nearly one-hot distributions
        model.model.vision_tower.head_norm.weight.mul_(1000.0)
    sharp = probe_model(model, processor, _config(), _samples())["visual_tokens"]
    assert sharp["max_prob"]["mean"] > 0.99 and sharp["entropy"]["mean"] < 0.05
    assert sharp["mixing_ratio"]["mean"] > 0.99 and sharp["mixing_ratio"]["min"] > 0.95
    assert sharp["embedding_norm"]["mean"] == pytest.approx(sharp["expected_row_norm"]["mean"], rel=1e-2)


def test_a_family_that_cannot_be_probed_gets_one_line(family_dirs, tmp_path, capsys):
    import shutil

    from llava_normaligned.families.anatomy import AnatomyError
    from llava_normaligned.families.probe_points import locate

    broken = str(tmp_path / "mistral3-without-image-processor")
    shutil.copytree(family_dirs["mistral3"], broken)
    os.remove(os.path.join(broken, "preprocessor_config.json"))
    rc = main([broken, "--output-dir", str(tmp_path / "out"), "--no-plots", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("llava-normaligned diagnose: error:")]
    assert "Traceback" not in err and len(lines) == 1
    err = lines[0]
    assert "cannot probe" in err and "no processor for its images" in err and "mistral3" in err
    assert not (tmp_path / "out").exists()
    model, _ = _load(family_dirs["internvl"])
    del model.model.multi_modal_projector
    with pytest.raises(AnatomyError, match=r"no model\.multi_modal_projector") as caught:
        locate(model, "internvl")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_entry_names_the_models_real_modules(name, family_dirs):
    """The anatomy entry resolves on the real classes: parts, LoRA linear names, the bitsandbytes keep list."""
    import re

    from transformers import AutoModelForImageTextToText

    from llava_normaligned.families.anatomy import anatomy_of

    model = AutoModelForImageTextToText.from_pretrained(family_dirs[name])
    anatomy = anatomy_of(model, require_image_token=True)
    assert anatomy.family.name == name and anatomy.image_token_id == model.config.image_token_id
    assert anatomy.decoder_layers is model.model.language_model.layers
    family = anatomy.family
    for path in family.keep_unquantized():
        model.get_submodule(path)
    linear = {n: type(m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    for part, names in ((family.language_model, family.llm_linear_names), (family.vision_tower,
                                                                            family.vision_linear_names)):
        found = {n.rpartition(".")[2] for n in linear if n.startswith(part + ".")}
        assert set(names) <= found, (part, set(names) - found)
    pattern = re.compile(family.lora_targets(vision=True))
    targets = [n for n in linear if pattern.fullmatch(n)]
    assert any(family.part_of(n) == "llm" for n in targets) and any(family.part_of(n) == "vision_tower" for n in targets)
    assert not any(family.part_of(n) == "projector" for n in targets)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_text_tokens_are_the_prompt_whatever_the_family_writes_around_the_image(name, family_dirs):
    from llava_normaligned.diagnostics.family_batches import batches_for

    model, processor = _load(family_dirs[name])
    (batch,) = batches_for(model.config)(processor, model.config, _samples(2), 2, 2)
    assert batch.text_rule == "prompt-span"
    for b, sample in enumerate(batch.samples):
        ids = batch.inputs["input_ids"][b]
        assert processor.tokenizer.decode(ids[batch.text_mask[b]]).strip() == sample.prompt
        assert processor.tokenizer.decode(batch.text_only["input_ids"][b][batch.text_only_mask[b]]).strip() == (
            sample.prompt)
        assert not (batch.text_mask[b] & batch.image_mask[b]).any()


PLACEHOLDERS = {  # family -> the tokens its processor writes around (or as) the image, none of them text to emit
    "gemma3": ("<start_of_image>", "<end_of_image>", "<image_soft_token>"),
    "mistral3": ("[IMG]", "[IMG_BREAK]", "[IMG_END]"),
    "internvl": ("<IMG_CONTEXT>", "<img>", "</img>"),
    "ovis2": ("<image>", "<IMG_ATOM>", "<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>"),
}


@pytest.mark.parametrize("name", sorted(PLACEHOLDERS))
def test_decoding_never_emits_a_familys_placeholder_tokens(family_dirs, name):
    from llava_normaligned.families.anatomy import family_of
    from llava_normaligned.generation import placeholder_token_ids

    model, processor = _load(family_dirs[name])
    tokenizer = processor.tokenizer
    suppressed = set(placeholder_token_ids(model, processor))
    expected = {tokenizer.convert_tokens_to_ids(token) for token in PLACEHOLDERS[name]}
    assert expected <= suppressed, sorted(tokenizer.convert_ids_to_tokens(sorted(expected - suppressed)))
    # the family's config keys alone name them too (Ovis2's indicator ids are a list in its config)
    assert set(family_of(model.config).placeholder_token_ids(model.config)) <= suppressed
    if name == "ovis2":
        assert set(model.config.visual_indicator_token_ids) <= set(
            family_of(model.config).placeholder_token_ids(model.config))
    # the prompt's ordinary words stay
    words = {i for i in tokenizer("the image shows a cat", add_special_tokens=False)["input_ids"]}
    assert words and not words & suppressed


@pytest.mark.parametrize("template_file", ["chat_template.json", "chat_template.jinja"])
def test_a_tiny_vlm_without_a_chat_template_is_refused_before_anything_is_written(template_file, tmp_path):
    """``TinyVLM.save`` writes the template beside the tokenizer when the family has no transformers processor; a
    tokenizer without one was written as a model folder and then failed on ``f.write(None)``."""
    from dataclasses import replace

    vlm = replace(tiny_vlm("internvl"), template_file=template_file)
    assert vlm.processor is None  # the path that writes the template itself
    vlm.tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        vlm.save(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="template_file 'template.txt'"):
        replace(vlm, template_file="template.txt").save(tmp_path / "out")
