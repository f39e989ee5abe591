"""``diagnose`` on Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Idefics3 and SmolVLM: tiny random models of transformers' own
classes, saved with an offline processor (a trained tokenizer holding the family's special tokens, the family's image
processor at tiny sizes, a chat template writing its image placeholder) as a user's folder (``llava_normaligned.tiny``'s
stock VLMs, ``save_tiny_vlm``), then diagnosed. Answers
known by construction: the reported vision norm at the LLM input is the norm of ``inputs_embeds`` at the image
positions; scaling the connector's output by k scales the vision/text ratio by k; Qwen3-VL's deepstack features are
read where they enter the LLM; the M-RoPE positions are the model's own."""

from __future__ import annotations

import json
import os

import pytest
import torch
from PIL import Image

from llava_normaligned.commands.diagnose import main
from llava_normaligned.diagnostics import DiagnoseConfig, passes
from llava_normaligned.diagnostics.default_inputs import default_images_dir, default_prompts_file
from llava_normaligned.diagnostics.inputs import format_prompt, list_images, load_prompts, make_batches, pair_samples
from llava_normaligned.diagnostics.runner import probe_model
from llava_normaligned.families.anatomy import AnatomyError, family_of
from llava_normaligned.families.probe_points import locate
from llava_normaligned.families.processors import ExpandingProcessor, load_processor
from llava_normaligned.loading import load_model
from llava_normaligned.tiny import save_tiny_vlm, tiny_vlm
from tests.support.numerics import F32_EPS, assert_close_scaled, kl_resolution

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3", "smolvlm")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> a saved folder, as a user has it: the model, the tokenizer, preprocessor_config.json naming the
    family's default (torchvision) image processor class, and chat_template.jinja."""
    made = {}
    for family in FAMILIES:
        made[family] = save_tiny_vlm(family, str(tmp_path_factory.mktemp(family)), seed=0)
    return made


def _samples(n: int):
    return pair_samples(list_images(default_images_dir()), load_prompts(default_prompts_file()), n)


def _config(**overrides):
    settings = dict(model="in-memory", output_dir="unused", max_samples=3, batch_size=2, alphas=(0.5, 1.0),
                    max_new_tokens=2, progress=False)
    return DiagnoseConfig(**{**settings, **overrides})


def _llm_input_norms(model, processor, samples):
    """Independently: per sample alone (no padding, the model's own positions), the norms of ``inputs_embeds`` at
    the image positions, read by a forward pre-hook on the language model."""
    seen = []

    def hook(module, args, kwargs):
        seen.append(kwargs["inputs_embeds"].detach())

    language_model = locate(model).language_model
    handle = language_model.register_forward_pre_hook(hook, with_kwargs=True)
    norms = []
    try:
        for sample in samples:
            image = Image.open(sample.image_path).convert("RGB")
            text = format_prompt(processor, sample.prompt, True)
            inputs = processor(text=[text], images=[image], return_tensors="pt", add_special_tokens=False)
            with torch.no_grad():
                model(**inputs)
            positions = inputs["input_ids"][0] == model.config.image_token_id
            norms.append(seen[-1][0, positions].norm(dim=-1))
    finally:
        handle.remove()
    return torch.cat(norms)


def _connector_output_layer(model, family: str):
    base = model.model
    if family in ("qwen2_vl", "qwen2_5_vl"):
        return base.visual.merger.mlp[2]
    if family == "qwen3_vl":
        return base.visual.merger.linear_fc2
    return base.connector.modality_projection.proj


# ------------------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("family", FAMILIES)
def test_llm_input_norm_is_inputs_embeds_and_connector_scale_k_scales_the_ratio(family, folders):
    model, processor = load_model(folders[family])
    assert family_of(model.config).name == family
    # the folder's AutoProcessor needs torchvision (Qwen, SmolVLM): Qwen's is transformers' class without its video
    # part, SmolVLM's Idefics3's class (the same image prompt); Idefics3's needs none, and is transformers' own
    assert not isinstance(processor, ExpandingProcessor)
    samples = _samples(3)
    before = probe_model(model, processor, _config(), samples)
    assert before["family"] == family
    expected = _llm_input_norms(model, processor, samples)
    reported = before["vision_norm"]["llm_input"]
    assert reported["count"] == expected.numel()
    assert reported["mean"] == pytest.approx(expected.mean().item(), rel=1e-4)
    assert reported["max"] == pytest.approx(expected.max().item(), rel=1e-4)
    assert before["vision_text_norm_ratio"] == pytest.approx(
        expected.mean().item() / before["text_embedding_norm"]["T"], rel=1e-4)
    assert before["text_tokens"]["rule"] == "prompt-span"  # the prompt's own tokens were found in the expanded text
    k = 3.0
    last = _connector_output_layer(model, family)
    with torch.no_grad():
        last.weight.mul_(k)
        if last.bias is not None:
            last.bias.mul_(k)
    after = probe_model(model, processor, _config(alphas=(1.0,)), samples)
    assert after["vision_text_norm_ratio"] == pytest.approx(k * before["vision_text_norm_ratio"], rel=1e-4)
    assert after["vision_norm"]["before_projector"] == before["vision_norm"]["before_projector"]


def test_qwen3_vl_deepstack_features_are_read_where_they_enter(folders, tmp_path):
    out = str(tmp_path / "qwen3")
    rc = main([folders["qwen3_vl"], "--output-dir", out, "--max-samples", "2", "--batch-size", "2",
               "--max-new-tokens", "2", "--alphas", "1", "--no-plots", "--no-progress"])
    assert rc == 0
    with open(os.path.join(out, "diagnostics.json"), encoding="utf-8") as f:
        document = json.load(f)
    numbers = document["models"]["model"] if "models" in document else document
    deepstack = numbers["deepstack"]
    assert [row["llm_layer"] for row in deepstack["layers"]] == [0, 1]  # one LLM layer per deepstack vision layer
    assert [row["vision_layer"] for row in deepstack["layers"]] == [0, 1]
    # independently: the deepstack mergers' outputs, per sample alone
    model, processor = load_model(folders["qwen3_vl"])
    outputs = {0: [], 1: []}
    mergers = model.model.visual.deepstack_merger_list
    handles = [m.register_forward_hook(lambda mod, a, o, i=i: outputs[i].append(o.detach().norm(dim=-1)))
               for i, m in enumerate(mergers)]
    try:
        _llm_input_norms(model, processor, _samples(2))
    finally:
        for handle in handles:
            handle.remove()
    for row in deepstack["layers"]:
        expected = torch.cat(outputs[row["llm_layer"]])
        assert row["norm"]["count"] == expected.numel() > 0
        assert row["norm"]["mean"] == pytest.approx(expected.mean().item(), rel=1e-4)
        assert row["hidden_norm"]["count"] == expected.numel()
    with open(os.path.join(out, "summary.md"), encoding="utf-8") as f:
        assert "Deepstack features" in f.read()


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_mrope_positions_and_cached_steps_are_the_models_own(family, folders):
    """A teacher-forced pass and a cached step give the logits of the model's own forward, which computes its M-RoPE
    positions itself (one unpadded sample)."""
    model, processor = load_model(folders[family])
    batch = make_batches(processor, model.config, _samples(1), 1, 2)[0]
    inputs = batch.inputs
    with torch.no_grad():
        own = model(**inputs).logits
    # the same weights through other call paths (positions passed in, a cached step): rounding of reductions of at
    # most 64 terms (the LLM's MLP; the prompt is 42 tokens), relative to the largest logit
    rtol = 4 * 64 * F32_EPS
    ours = passes.run(model, inputs).logits
    assert_close_scaled(ours, own, rtol=rtol, what=f"{family}: teacher-forced logits")
    cache = passes.prefix_cache(model, inputs)
    logits, _ = passes.step(model, cache, inputs["input_ids"][:, -1:], inputs["attention_mask"],
                            passes.rope_deltas(model, inputs))
    assert_close_scaled(logits, own[:, -1], rtol=rtol, what=f"{family}: cached step logits")
    # a token appended after the prompt: the model's own positions for the longer sequence
    appended = own[:, -1].argmax(-1, keepdim=True)
    longer = {**inputs, "input_ids": torch.cat([inputs["input_ids"], appended], 1),
              "attention_mask": torch.cat([inputs["attention_mask"], torch.ones_like(appended)], 1),
              "mm_token_type_ids": torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(appended).int()], 1)}
    with torch.no_grad():
        own_longer = model(**longer).logits
    assert_close_scaled(passes.run(model, inputs, appended=appended).logits, own_longer, rtol=rtol,
                        what=f"{family}: logits with an appended token")


@pytest.mark.parametrize("family", ["idefics3", "smolvlm"])
def test_idefics3_and_smolvlm_inputs_equal_transformers_own_processor(family, folders):
    """Idefics3's processor needs no torchvision (SmolVLM's, which writes the same image prompt, needs it and
    num2words): the builder's expansion (tiles, row markers, global image) equals it token for token, and its pixels
    too."""
    from transformers import Idefics3Processor

    _, processor = load_model(folders[family])
    own = Idefics3Processor(image_processor=processor.image_processor, tokenizer=processor.tokenizer,
                            image_seq_len=processor.image_seq_len, chat_template=processor.chat_template)
    images = [Image.open(s.image_path).convert("RGB") for s in _samples(2)]
    texts = [format_prompt(processor, "What colours do you see?", True)] * 2
    ours = processor(text=texts, images=images, return_tensors="pt", add_special_tokens=False)
    theirs = own(text=texts, images=[[im] for im in images], return_tensors="pt", padding=True,
                 add_special_tokens=False)
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    assert torch.equal(ours["pixel_values"], theirs["pixel_values"])
    assert torch.equal(ours["pixel_attention_mask"], theirs["pixel_attention_mask"])
    assert "<row_1_col_2>" in processor.tokenizer.decode(ours["input_ids"][0])


def test_qwen_placeholder_expansion_counts_merged_tokens(folders):
    processor = load_processor(folders["qwen2_5_vl"], load_model(folders["qwen2_5_vl"])[0].config)
    images = [Image.new("RGB", (48, 32)), Image.new("RGB", (32, 32))]
    texts = [format_prompt(processor, "hi", True), format_prompt(processor, "a longer prompt", True)]
    out = processor(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)
    image_id = processor.image_token_id
    counts = (out["input_ids"] == image_id).sum(-1).tolist()
    assert counts == (out["image_grid_thw"].prod(-1) // 4).tolist()
    assert torch.equal(out["mm_token_type_ids"].bool(), out["input_ids"] == image_id)


def test_the_families_parts_are_counted_once(folders):
    import re

    for family in FAMILIES:
        model = tiny_vlm(family, seed=0).model
        spec = family_of(model.config)
        names = dict(model.named_parameters())
        parts = {name: spec.part_of(name) for name in names}
        assert None not in parts.values(), family
        projector = locate(model).projector
        assert {n for n, p in parts.items() if p == "projector"} >= {
            n for n, _ in model.named_parameters() if any(param is _ for param in projector.parameters())}
        vision_only = [n for n, p in parts.items() if p == "vision_tower"]
        assert not any(".merger." in n or ".deepstack_merger_list." in n or ".connector." in n for n in vision_only)
        modules = [n for n, _ in model.named_modules()]
        tower_targets = [n for n in modules if re.fullmatch(spec.lora_targets(vision=True), n)]
        assert tower_targets and not any("merger" in n for n in tower_targets), family
        for path in spec.keep_unquantized():
            assert path in modules, (family, path)


def test_a_family_missing_a_part_is_one_line(folders):
    model, _ = load_model(folders["qwen2_vl"])
    del model.model.visual.merger
    with pytest.raises(AnatomyError) as error:
        locate(model, "tiny-qwen")
    message = str(error.value)
    assert "\n" not in message and "model.visual.merger" in message


def test_an_image_text_model_of_no_known_family_is_one_line_naming_the_missing_parts(tmp_path, capsys):
    """BLIP-2 (vision model, Q-Former, OPT) loads as an image-text-to-text model but has none of the families' paths."""
    from transformers import Blip2Config, Blip2ForConditionalGeneration

    config = Blip2Config(
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        qformer_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                            encoder_hidden_size=16, vocab_size=64),
        text_config=dict(model_type="opt", vocab_size=64, hidden_size=16, num_hidden_layers=1, ffn_dim=32,
                         num_attention_heads=2, word_embed_proj_dim=16),
        num_query_tokens=4, image_token_index=5)
    folder = str(tmp_path / "blip2")
    Blip2ForConditionalGeneration(config).save_pretrained(folder)
    rc = main([folder, "--output-dir", str(tmp_path / "out"), "--no-progress", "--no-plots"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert "Traceback" not in "\n".join(err)
    line = err[-1]
    assert "cannot probe" in line and "'blip-2'" in line and "no model." in line
    assert not os.path.exists(tmp_path / "out" / "diagnostics.json")


def test_docs_list_every_family():
    from llava_normaligned.families.anatomy import FAMILIES as TABLE

    docs = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "diagnostics.md")
    with open(docs, encoding="utf-8") as f:
        text = f.read()
    rows = [line for line in text.split("### Families", 1)[1].splitlines() if line.startswith("| `")]
    for family in TABLE:
        assert any(line.startswith(f"| `{family.name}`") for line in rows), family.name


def test_a_tokenizer_whose_image_token_is_not_the_models_is_refused(folders):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folders["smolvlm"])
    config.image_token_id = 3
    with pytest.raises(ValueError, match="config.image_token_id is 3"):
        load_processor(folders["smolvlm"], config)


@pytest.mark.parametrize("family", ["qwen3_vl", "smolvlm"])
def test_batched_and_unbatched_runs_agree(family, folders):
    """Left padding changes nothing, M-RoPE positions, tiles and deepstack features included."""
    model, processor = load_model(folders[family])
    one = probe_model(model, processor, _config(batch_size=1, alphas=(0.5, 1.0), max_new_tokens=3), _samples(3))
    three = probe_model(model, processor, _config(batch_size=3, alphas=(0.5, 1.0), max_new_tokens=3), _samples(3))
    for modality in ("vision", "text"):
        for stat in ("norm", "cos_to_layer0", "cos_to_prev", "update_rel"):
            a, b = one["layers"][modality][stat], three["layers"][modality][stat]
            assert [x is None for x in a] == [x is None for x in b]
            assert [x for x in a if x is not None] == pytest.approx([x for x in b if x is not None], rel=1e-4,
                                                                   abs=1e-6)
    # these KLs are ~1e-5 to ~3e-4 here, so the relative tolerance alone would ask for less than the rounding of a KL
    # computed from float32 log-probs (about 4 eps ln V, 2.8e-6 for V = 320)
    floor = kl_resolution(model.config.get_text_config().vocab_size)
    assert one["alpha_sweep"]["rows"][0]["logit_kl"] == pytest.approx(
        three["alpha_sweep"]["rows"][0]["logit_kl"], rel=1e-3, abs=floor)
    assert one["kv_substitution"]["kl_real_hybrid"] == pytest.approx(
        three["kv_substitution"]["kl_real_hybrid"], rel=1e-3, abs=floor)
    if family == "qwen3_vl":
        for a, b in zip(one["deepstack"]["layers"], three["deepstack"]["layers"]):
            assert a["hidden_norm"]["mean"] == pytest.approx(b["hidden_norm"]["mean"], rel=1e-4)
