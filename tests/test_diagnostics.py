"""Norm-gap diagnostics on tiny models built in code, where the right answers are known by construction."""

from __future__ import annotations

import csv
import json
import math
import os

import pytest
import torch

from llava_normaligned.commands.diagnose import main
from llava_normaligned.diagnostics import DiagnoseConfig
from llava_normaligned.diagnostics.default_inputs import (
    SCENES,
    default_images_dir,
    default_prompts_file,
    draw_scene,
)
from llava_normaligned.diagnostics.inputs import list_images, load_prompts, pair_samples
from llava_normaligned.diagnostics.runner import probe_model
from llava_normaligned.diagnostics.theory import compare_rotation, tan_theta_eff, theta_eff
from llava_normaligned.families.anatomy import AnatomyError
from llava_normaligned.families.probe_points import locate
from tests.support.messages import error_line, number
from tests.support.numerics import kl_resolution

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

REQUIRED = ("text_embedding_norm", "vision_norm", "vision_text_norm_ratio", "layers", "alpha_sweep")
LAYER_STATS = ("norm", "cos_to_layer0", "cos_to_prev", "update_abs", "update_rel")


@pytest.fixture(scope="module")
def cli_run(tiny_model_dir, stock_model_dir, tmp_path_factory):
    """One end-to-end CLI run with a baseline: 3 samples in batches of 2 (a padded, ragged last batch)."""
    out = str(tmp_path_factory.mktemp("diagnostics"))
    rc = main([tiny_model_dir, "--baseline", stock_model_dir, "--output-dir", out, "--max-samples", "3",
               "--batch-size", "2", "--max-new-tokens", "3", "--no-progress"])
    assert rc == 0
    with open(os.path.join(out, "diagnostics.json"), encoding="utf-8") as f:
        return out, json.load(f)


def _samples(n: int):
    return pair_samples(list_images(default_images_dir()), load_prompts(default_prompts_file()), n)


def _probe(model, processor, n=2, batch_size=2, alphas=(1.0,), new_tokens=2):
    config = DiagnoseConfig(model="in-memory", output_dir="unused", max_samples=n, batch_size=batch_size,
                            alphas=alphas, max_new_tokens=new_tokens, progress=False)
    return probe_model(model, processor, config, _samples(n))


# ------------------------------------------------------------------------------------------------- RQ1


def test_text_embedding_statistics_equal_a_direct_computation(tiny_model, tiny_processor):
    stats = _probe(tiny_model, tiny_processor)["text_embedding_norm"]
    weight = tiny_model.get_input_embeddings().weight.detach()
    image_id = tiny_model.config.image_token_id
    norms = torch.cat([weight[:image_id], weight[image_id + 1:]]).norm(dim=-1)
    assert stats["num_rows"] == weight.shape[0] - 1
    assert stats["mean"] == pytest.approx(norms.mean().item(), rel=1e-6)
    assert stats["std"] == pytest.approx(norms.std(correction=0).item(), rel=1e-6)
    assert stats["T"] == pytest.approx(norms[norms > 1e-6].mean().item(), rel=1e-6)
    # compose stored T before adding the image token: the same rows, the same number
    assert stats["T"] == pytest.approx(tiny_model.config.norm_target, rel=1e-5)
    ids = [row["token_id"] for row in stats["top_k"]]
    order = [i if i < image_id else i + 1 for i in norms.argsort(descending=True)[:10].tolist()]
    assert ids == order
    assert stats["top_k"][0]["token"] == tiny_processor.tokenizer.convert_ids_to_tokens(ids[0])


# ------------------------------------------------------------------------------------------------- RQ2


@pytest.mark.parametrize("variant", ["stock", "aligned"])
def test_scaling_the_projector_output_by_k_scales_vision_norm_and_ratio_by_k(
    variant, tiny_model_dir, stock_model_dir
):
    from llava_normaligned.loading import load_model

    model, processor = load_model(stock_model_dir if variant == "stock" else tiny_model_dir)
    before = _probe(model, processor)
    k = 3.0
    projector = model.model.multi_modal_projector
    norm = getattr(projector, "norm", None)
    last = projector.linear_2 if norm is None else norm  # the module whose output enters the LLM
    with torch.no_grad():
        last.weight.mul_(k)
        last.bias.mul_(k)
    after = _probe(model, processor)
    stage = "after_projector" if variant == "stock" else "after_norm"
    assert after["vision_norm"][stage]["mean"] == pytest.approx(k * before["vision_norm"][stage]["mean"], rel=1e-5)
    assert after["vision_norm"]["llm_input"]["mean"] == pytest.approx(
        k * before["vision_norm"]["llm_input"]["mean"], rel=1e-5
    )
    assert after["vision_text_norm_ratio"] == pytest.approx(k * before["vision_text_norm_ratio"], rel=1e-5)
    ratio = before["vision_text_norm_ratio_prompt"]
    assert after["vision_text_norm_ratio_prompt"] == pytest.approx(k * ratio, rel=1e-4)
    assert after["vision_norm"]["before_projector"] == before["vision_norm"]["before_projector"]
    assert after["text_embedding_norm"]["T"] == before["text_embedding_norm"]["T"]
    if variant == "aligned":  # paper §5.1: the norm brings the vision tokens to about T whatever the MLP emits
        assert before["vision_text_norm_ratio"] == pytest.approx(1.0, abs=0.1)
    else:
        assert before["vision_norm"]["after_norm"] is None


# ------------------------------------------------------------------------------------------------- RQ3


def test_layer_statistics_by_construction(cli_run):
    _, doc = cli_run
    for numbers in (doc, doc["baseline"]):
        layers = numbers["layers"]
        assert layers["index"] == list(range(numbers["num_layers"] + 1))
        for modality in ("vision", "text"):
            curves = layers[modality]
            assert set(LAYER_STATS) <= set(curves)
            assert all(len(curves[s]) == numbers["num_layers"] + 1 for s in LAYER_STATS)
            assert curves["cos_to_layer0"][0] == pytest.approx(1.0, abs=1e-6)
            assert curves["cos_to_prev"][0] is None and curves["update_abs"][0] is None
            assert curves["cos_to_prev"][1] == pytest.approx(curves["cos_to_layer0"][1], abs=1e-6)
            assert all(0 < v for v in curves["update_abs"][1:])
        # the residual stream's layer-0 vision tokens are exactly what the projector tap saw entering the LLM
        assert layers["vision"]["norm"][0] == pytest.approx(numbers["vision_norm"]["llm_input"]["mean"], rel=1e-5)


def test_batched_and_unbatched_runs_agree(tiny_model, tiny_processor):
    one = _probe(tiny_model, tiny_processor, n=3, batch_size=1, alphas=(0.1, 1.0))
    three = _probe(tiny_model, tiny_processor, n=3, batch_size=3, alphas=(0.1, 1.0))
    for modality in ("vision", "text"):
        for stat in LAYER_STATS:
            a, b = one["layers"][modality][stat], three["layers"][modality][stat]
            assert [x is None for x in a] == [x is None for x in b]
            assert [x for x in a if x is not None] == pytest.approx([x for x in b if x is not None], rel=1e-4, abs=1e-6)
    # a KL from float32 log-probs is known to about kl_resolution (4 eps ln V) in absolute terms, whatever its size
    floor = kl_resolution(tiny_model.config.text_config.vocab_size)
    assert one["alpha_sweep"]["rows"][0]["logit_kl"] == pytest.approx(
        three["alpha_sweep"]["rows"][0]["logit_kl"], rel=1e-3, abs=floor
    )
    assert one["attention"]["prefill"]["vision"] == pytest.approx(three["attention"]["prefill"]["vision"], rel=1e-5)


# -------------------------------------------------------------------------------------------- the blog's experiments


def test_alpha_one_is_the_reference_and_alpha_scales_the_ratio(cli_run):
    _, doc = cli_run
    for numbers in (doc, doc["baseline"]):
        sweep = numbers["alpha_sweep"]
        assert sweep["alphas"] == [0.01, 0.03, 0.05, 0.07, 0.1, 0.3, 1.0, 3.0]
        rows = {row["alpha"]: row for row in sweep["rows"]}
        reference = rows[1.0]
        assert reference["logit_kl"] == 0.0 and reference["attention_kl"] == 0.0
        assert reference["median_rank"] == 1.0 and reference["greedy_agreement"] == 1.0
        assert reference["cos_k"] == pytest.approx(1.0, abs=1e-6) and reference["cos_v"] == pytest.approx(1.0, abs=1e-6)
        assert reference["vision_text_norm_ratio"] == pytest.approx(numbers["vision_text_norm_ratio"], rel=1e-6)
        assert reference["num_positions"] == 3 * 3  # samples x scored positions
        assert rows[0.01]["logit_kl"] > 0  # a 100x smaller image must change something
        assert sweep["norm_matching_alpha"] == pytest.approx(1 / numbers["vision_text_norm_ratio"])
        # the first layer sees RMSNorm(alpha * h): keys and values barely move there, whatever alpha
        assert rows[0.01]["cos_k_per_layer"][0] == pytest.approx(1.0, abs=1e-3)


def test_attention_mass_over_the_modalities_sums_to_one(cli_run):
    _, doc = cli_run
    for numbers in (doc, doc["baseline"]):
        for phase in ("prefill", "decode"):
            mass = numbers["attention"][phase]
            for vision, text in zip(mass["vision_per_layer"], mass["text_per_layer"]):
                assert 0 < vision < 1
                assert vision + text == pytest.approx(1.0, abs=1e-5)


def test_a_blank_real_image_makes_the_ablations_and_the_kv_substitution_trivial(
    tiny_model, tiny_processor, tmp_path
):
    """With a blank image as the 'real' one, the blank-image run and the hybrid cache are the real run."""
    from PIL import Image

    Image.new("RGB", (40, 30), (255, 255, 255)).save(tmp_path / "white.png")
    config = DiagnoseConfig(model="in-memory", output_dir="unused", max_samples=2, batch_size=2, alphas=(1.0,),
                            max_new_tokens=2, progress=False)
    samples = pair_samples(list_images(str(tmp_path)), load_prompts(default_prompts_file()), 2)
    numbers = probe_model(tiny_model, tiny_processor, config, samples)
    kv = numbers["kv_substitution"]
    # KLs between runs that compute the same thing by other passes (a hybrid cache, another batch): zero up to the
    # rounding of float32 log-probs
    floor = kl_resolution(tiny_model.config.text_config.vocab_size)
    assert kv["kl_real_hybrid"] == pytest.approx(0.0, abs=floor)
    assert kv["kl_blank_hybrid"] == pytest.approx(0.0, abs=floor)
    assert numbers["ablations"]["next_token_kl"]["real_blank"] == pytest.approx(0.0, abs=floor)
    assert numbers["ablations"]["correlation"]["real_blank"]["norm"] == pytest.approx(1.0, abs=1e-6)
    assert numbers["ablations"]["next_token_kl"]["real_no_image"] > 0


def _mean(values):
    return sum(values) / len(values)


def _plain_forward(model, processor, sample, image=None):
    """One sample alone (no padding, no hooks, default attention): the next-token log-probabilities after the prompt,
    the hidden states, the input ids, and the positions of the prompt's text, found as the standalone tokenisation
    of the prompt inside the formatted sequence. ``image``: "real", "blank" or None (no image)."""
    from PIL import Image

    content = ([{"type": "image"}] if image else []) + [{"type": "text", "text": sample.prompt}]
    text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    if image:
        picture = Image.open(sample.image_path).convert("RGB")
        if image == "blank":
            picture = Image.new("RGB", picture.size, (255, 255, 255))
        inputs = processor(text=[text], images=[picture], return_tensors="pt", add_special_tokens=False)
    else:
        inputs = processor.tokenizer([text], return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model(**inputs, output_hidden_states=True)
    ids = inputs["input_ids"][0].tolist()
    prompt_ids = processor.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(ids)) if ids[i : i + len(prompt_ids)] == prompt_ids)
    text_positions = torch.zeros(len(ids), dtype=torch.bool)
    text_positions[start : start + len(prompt_ids)] = True
    return torch.log_softmax(out.logits[0, -1].float(), -1), out.hidden_states, inputs["input_ids"][0], text_positions


def test_batched_probes_equal_plain_forward_passes_of_each_sample(cli_run, tiny_model_dir):
    """The run's first-token KLs (the cached KV-substitution steps, the ablation passes), its text-token trajectory
    and its template group, recomputed with plain forward passes of each sample alone: left padding, position ids,
    cache steps, hooks and token masks all have to be right for these to agree."""
    from llava_normaligned.loading import load_model

    _, doc = cli_run
    model, processor = load_model(tiny_model_dir, device="cpu")
    image_id = model.config.image_token_id
    kl_blank, kl_no_image, text_curves, template_norms, no_image_curves = [], [], [], [], []
    for sample in _samples(3):
        real, hidden, ids, text = _plain_forward(model, processor, sample, "real")
        blank, *_ = _plain_forward(model, processor, sample, "blank")
        no_image, hidden_no_image, _, text_no_image = _plain_forward(model, processor, sample)
        kl_blank.append(float((real.exp() * (real - blank)).sum()))
        kl_no_image.append(float((real.exp() * (real - no_image)).sum()))
        # hidden_states[l], l < L, is the residual stream entering decoder layer l (the last one is after the final norm)
        text_curves.append([float(h[0, text].norm(dim=-1).mean()) for h in hidden[:-1]])
        no_image_curves.append([float(h[0, text_no_image].norm(dim=-1).mean()) for h in hidden_no_image[:-1]])
        template = ~text & (ids != image_id)
        template_norms.append(float(hidden[0][0, template].norm(dim=-1).mean()))
    floor = kl_resolution(model.config.text_config.vocab_size)  # KLs of ~1e-3 from float32 log-probs
    assert doc["kv_substitution"]["kl_real_blank"] == pytest.approx(_mean(kl_blank), rel=1e-3, abs=floor)
    assert doc["ablations"]["next_token_kl"]["real_blank"] == pytest.approx(_mean(kl_blank), rel=1e-3, abs=floor)
    assert doc["ablations"]["next_token_kl"]["real_no_image"] == pytest.approx(_mean(kl_no_image), rel=1e-3,
                                                                                 abs=floor)
    assert _mean(kl_no_image) > 0
    num_layers = doc["num_layers"]
    expected = [_mean([curve[layer] for curve in text_curves]) for layer in range(num_layers)]
    assert doc["layers"]["text"]["norm"][:num_layers] == pytest.approx(expected, rel=1e-4)
    assert doc["ablations"]["curves"]["real"]["norm"][:num_layers] == pytest.approx(expected, rel=1e-4)
    expected_no_image = [_mean([curve[layer] for curve in no_image_curves]) for layer in range(num_layers)]
    assert doc["ablations"]["curves"]["no_image"]["norm"][:num_layers] == pytest.approx(expected_no_image, rel=1e-4)
    assert doc["layers"]["template"]["norm"][0] == pytest.approx(_mean(template_norms), rel=1e-4)
    assert doc["text_tokens"]["rule"] == "prompt-span"


def test_alpha_sweep_equals_a_model_whose_projector_output_is_scaled(tiny_model_dir):
    """The sweep scales the projector output with a hook; scaling the projector norm's gain and bias by alpha does
    the same inside the model. The sweep's KL, rank and agreement must equal those measured on that second model."""
    import copy

    from llava_normaligned.loading import load_model

    model, processor = load_model(tiny_model_dir, device="cpu")
    alpha, samples = 0.05, _samples(3)
    numbers = _probe(model, processor, n=3, batch_size=3, alphas=(alpha,), new_tokens=1)
    row = {r["alpha"]: r for r in numbers["alpha_sweep"]["rows"]}[alpha]
    scaled = copy.deepcopy(model)
    with torch.no_grad():
        scaled.model.multi_modal_projector.norm.weight.mul_(alpha)
        scaled.model.multi_modal_projector.norm.bias.mul_(alpha)
    kls, ranks, agree = [], [], []
    for sample in samples:
        ref, *_ = _plain_forward(model, processor, sample, "real")
        run, *_ = _plain_forward(scaled, processor, sample, "real")
        kls.append(float((ref.exp() * (ref - run)).sum()))
        greedy = int(ref.argmax())
        ranks.append(1 + int((run > run[greedy]).sum()))
        agree.append(float(int(run.argmax()) == greedy))
    assert min(kls) > 0
    floor = kl_resolution(model.config.text_config.vocab_size)  # a KL from float32 log-probs, absolute rounding
    assert row["logit_kl"] == pytest.approx(sum(kls) / 3, rel=1e-3, abs=floor)
    assert row["greedy_agreement"] == pytest.approx(sum(agree) / 3)
    assert row["median_rank"] == sorted(ranks)[1]
    assert row["num_positions"] == 3


# ------------------------------------------------------------------------------------------------- theory


def test_theta_eff_matches_hand_values():
    assert tan_theta_eff(1.0, 1.0, math.pi / 2) == pytest.approx(1.0)
    assert theta_eff(1.0, 1.0, math.pi / 2) == pytest.approx(math.pi / 4)
    assert tan_theta_eff(3.0, 2.0, math.pi / 3) == pytest.approx(math.sqrt(3) / 4)
    assert theta_eff(5.0, 2.0, 0.0) == 0.0  # an update along h does not turn it
    assert theta_eff(0.0, 2.0, 1.1) == pytest.approx(1.1)  # from the origin, h turns to the update
    assert theta_eff(1.0, 2.0, math.pi) == pytest.approx(math.pi)  # a backward update larger than h flips it
    # larger norm, same update: less rotation (the paper's "representational inertia")
    assert theta_eff(10.0, 1.0, 1.0) < theta_eff(1.0, 1.0, 1.0)


def test_theta_eff_is_the_exact_angle_between_h_and_h_plus_update():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 32, generator=g, dtype=torch.float64)
    update = torch.randn(64, 32, generator=g, dtype=torch.float64)
    h[:8] *= 20  # some high-norm tokens
    phi = torch.arccos(torch.nn.functional.cosine_similarity(update, h, dim=-1))
    measured = torch.arccos(torch.nn.functional.cosine_similarity(h + update, h, dim=-1))
    predicted = theta_eff(h.norm(dim=-1), update.norm(dim=-1), phi)
    torch.testing.assert_close(predicted, measured)


def test_compare_rotation_uses_the_layer_wide_update():
    layers = {
        "vision": {"norm": [10.0, 10.0], "update_abs": [None, 1.0], "update_angle_deg": [None, 90.0],
                   "rotation_deg": [None, 5.0]},
        "text": {"norm": [1.0, 1.0], "update_abs": [None, 1.0], "update_angle_deg": [None, 90.0],
                 "rotation_deg": [None, 44.0]},
    }
    pooled = {"norm": [5.5, 5.5], "update_abs": [None, 1.0], "update_angle_deg": [None, 90.0]}
    result = compare_rotation(layers, pooled)
    assert result["predicted_rotation_deg"]["vision"][1] == pytest.approx(math.degrees(math.atan(0.1)))
    assert result["predicted_rotation_deg"]["text"][1] == pytest.approx(45.0)
    assert result["update_abs_vision_over_text"] == [None, 1.0]
    assert result["mean_abs_error_deg"] == pytest.approx((abs(5.71059 - 5.0) + 1.0) / 2, rel=1e-4)


# ------------------------------------------------------------------------------------------------- outputs


def test_cli_writes_json_csv_png_and_summary(cli_run, tiny_model_dir, stock_model_dir):
    out, doc = cli_run
    # published with the checkpoint: folders by base name, never a path of this machine
    assert doc["model_id"] == os.path.basename(tiny_model_dir) and doc["baseline_id"] == os.path.basename(stock_model_dir)
    assert doc["baseline"]["model_id"] == os.path.basename(stock_model_dir)
    assert doc["settings"]["model"] == os.path.basename(tiny_model_dir) and doc["settings"]["images"] == "images"
    local = os.path.dirname(tiny_model_dir)
    for name in os.listdir(out):
        if name.endswith((".json", ".csv", ".md")):
            with open(os.path.join(out, name), encoding="utf-8") as f:
                assert local not in f.read(), name
    assert doc["settings"]["max_samples"] == 3 and doc["settings"]["alphas"]
    for key in REQUIRED:
        assert key in doc and key in doc["baseline"]
    assert {"mean", "std"} <= set(doc["text_embedding_norm"])
    assert {"before_projector", "after_projector"} <= set(doc["vision_norm"])
    assert doc["projector_norm"] == "NormAlignedLayerNorm" and doc["baseline"]["projector_norm"] is None
    assert doc["baseline"]["model_class"] == "LlavaForConditionalGeneration"
    assert doc["vision_text_norm_ratio"] > doc["baseline"]["vision_text_norm_ratio"]
    with open(os.path.join(out, "layers.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert {r["model"] for r in rows} == {"model", "baseline"}
    assert {r["modality"] for r in rows} == {"vision", "text", "template"}
    assert len(rows) == 2 * 3 * (doc["num_layers"] + 1)
    with open(os.path.join(out, "alpha_sweep.csv"), encoding="utf-8") as f:
        assert len(list(csv.DictReader(f))) == 2 * 8
    for name in ("norms.csv", "text_embedding_top_k.csv", "attention_mass.csv", "ablations.csv", "kv_substitution.csv"):
        assert os.path.getsize(os.path.join(out, name)) > 0
    pngs = [n for n in os.listdir(out) if n.endswith(".png")]
    assert "fig_norms_cosine.png" in pngs and "fig_alpha_sweep.png" in pngs and len(pngs) == 8
    for name in pngs:
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    summary = open(os.path.join(out, "summary.md"), encoding="utf-8").read()
    assert summary.startswith("## Norm diagnostics")
    assert f"`{os.path.basename(tiny_model_dir)}`" in summary and f"`{os.path.basename(stock_model_dir)}`" in summary
    assert f"**{doc['vision_text_norm_ratio']:.3f}**" in summary
    assert "(fig_norms_cosine.png)" in summary  # a relative link the model card re-points
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]  # no temporary file left behind


# --------------------------------------------------------------------------------------------------- errors


def test_empty_image_folder_is_a_clear_error(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "notes.txt").write_text("not an image")
    rc = main([tiny_model_dir, "--images", str(tmp_path / "images"), "--output-dir", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "holds no image files" in err and str(tmp_path / "images") in err
    assert not (tmp_path / "out").exists()  # checked before any model is loaded or anything written


def test_unreadable_image_and_empty_prompt_file_are_clear_errors(tiny_model_dir, tmp_path, capsys):
    (tmp_path / "bad.png").write_text("not a png")
    rc = main([tiny_model_dir, "--images", str(tmp_path), "--output-dir", str(tmp_path / "out")])
    assert rc == 2 and "cannot read image" in capsys.readouterr().err
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("# only a comment\n\n")
    rc = main([tiny_model_dir, "--prompts", str(prompts), "--output-dir", str(tmp_path / "out")])
    assert rc == 2 and "holds no prompt" in capsys.readouterr().err


def test_prompt_longer_than_the_context_is_a_clear_error(tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("what colour is it?\n" + "red " * 600 + "\n")
    rc = main([tiny_model_dir, "--prompts", str(prompts), "--max-samples", "2", "--output-dir", str(tmp_path / "o")])
    assert rc == 2
    refused = error_line(capsys.readouterr().err, "diagnose")
    with open(os.path.join(tiny_model_dir, "config.json"), encoding="utf-8") as f:
        context = json.load(f)["text_config"]["max_position_embeddings"]
    assert number(r"on line (\d+) ", refused) == 2 and repr(str(prompts)) in refused, refused
    assert number(r"context of (\d+) tokens", refused) == context and number(r"is (\d+) tokens", refused) > context
    assert not (tmp_path / "o").exists()


def test_a_model_it_cannot_probe_is_a_clear_error(tiny_parts, tiny_model, tmp_path, capsys):
    _, text_dir = tiny_parts  # a plain causal LM: no vision tower, no projector
    rc = main([text_dir, "--output-dir", str(tmp_path / "out")])
    assert rc == 2
    assert "not a vision-language model" in capsys.readouterr().err
    del tiny_model.model.multi_modal_projector
    with pytest.raises(AnatomyError, match=r"no model\.multi_modal_projector"):
        locate(tiny_model, "tiny")


def test_loading_errors_exit_2_with_the_message(tiny_model_dir, tmp_path, capsys):
    """A device this machine lacks, a folder that does not exist, a mistyped name: a message and exit code 2, no
    traceback, nothing written. The device defaults to "auto", as for generate and eval."""
    assert DiagnoseConfig(model="m", output_dir="o").device == "auto"
    out = str(tmp_path / "out")
    if not torch.cuda.is_available():
        assert main([tiny_model_dir, "--device", "cuda", "--output-dir", out, "--no-plots"]) == 2
        refused = error_line(capsys.readouterr().err, "diagnose")
        assert "'cuda'" in refused and "not available" in refused
    assert main(["./no/such/model", "--estimate-memory"]) == 2
    assert "model './no/such/model': no such folder" in capsys.readouterr().err
    assert main([tiny_model_dir, "--estimate-memory", "--dtype", "float8"]) == 2
    assert "--dtype" in capsys.readouterr().err
    assert not os.path.exists(out)


# ---------------------------------------------------------------------------------------- inputs and memory


def test_default_inputs_ship_and_redraw_identically():
    paths = list_images(default_images_dir())
    assert [os.path.basename(p) for p in paths] == sorted(f"{name}.png" for name in SCENES)
    assert sum(os.path.getsize(p) for p in paths) <= 200_000
    from PIL import Image

    for path in paths:
        shipped = Image.open(path).convert("RGB")
        assert shipped.tobytes() == draw_scene(os.path.basename(path)[:-4]).tobytes()
    assert len(load_prompts(default_prompts_file())) >= 4


def test_text_tokens_are_the_prompt_and_template_tokens_are_apart(tiny_model, tiny_processor):
    """BOS, chat markers and role names are not the prompt's text (real LLMs put attention sinks there): the text
    group holds exactly the prompt's tokens, the rest is the template group. The tokenizer's padding side is left as
    it was."""
    from llava_normaligned.diagnostics.inputs import TEXT_RULE_SPECIAL, make_batches, prompt_text_mask

    tokenizer = tiny_processor.tokenizer
    tokenizer.padding_side = "right"
    samples = _samples(3)
    (batch,) = make_batches(tiny_processor, tiny_model.config, samples, 3, 2)
    assert tokenizer.padding_side == "right"
    assert batch.text_rule == "prompt-span"
    ids, only = batch.inputs["input_ids"], batch.text_only["input_ids"]
    for b, sample in enumerate(samples):
        assert tokenizer.decode(ids[b][batch.text_mask[b]]) == sample.prompt
        assert tokenizer.decode(only[b][batch.text_only_mask[b]]) == sample.prompt
        template = tokenizer.convert_ids_to_tokens(ids[b][batch.template_mask[b]].tolist())
        assert template.count("<|im_start|>") == 2 and "<|im_end|>" in template
    masks = batch.image_mask.long() + batch.text_mask.long() + batch.template_mask.long()
    assert torch.equal(masks, batch.inputs["attention_mask"].long())  # every real token in exactly one group
    # without offsets, the fallback keeps every special token out of the text
    fallback, rule = prompt_text_mask(tiny_processor, [], [], batch.inputs, tiny_model.config.image_token_id,
                                      TEXT_RULE_SPECIAL)
    assert rule == TEXT_RULE_SPECIAL and (fallback & batch.text_mask).equal(batch.text_mask)
    special = {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "<pad>")}
    assert not any(int(i) in special for i in ids[fallback])


def test_samples_use_every_image_and_prompt_before_repeating():
    samples = pair_samples(["a.png", "b.png", "c.png"], [(1, "p"), (3, "q")], 10)
    pairs = [(s.image_path, s.prompt) for s in samples]
    assert pairs[:3] == [("a.png", "p"), ("b.png", "q"), ("c.png", "p")]
    assert sorted(pairs) == sorted((i, p) for i in ("a.png", "b.png", "c.png") for p in ("p", "q"))  # no repeats
    assert [s.prompt_line for s in samples[:2]] == [1, 3]
    assert [(s.image_path, s.prompt) for s in pair_samples(["a.png"], [(1, "p"), (2, "q")], 1)] == [("a.png", "p")]


def test_memory_estimate_counts_the_parameters_and_prints(tiny_model, tiny_model_dir, capsys):
    from llava_normaligned.diagnostics.memory import count_parameters, estimate

    assert count_parameters(tiny_model.config) == sum(p.numel() for p in tiny_model.parameters())
    small = estimate(tiny_model.config, "float32", batch_size=1)
    big = estimate(tiny_model.config, "float32", batch_size=8)
    assert small.weights_bytes == 4 * small.parameters and big.activation_bytes > small.activation_bytes
    assert main([tiny_model_dir, "--estimate-memory"]) == 0
    assert "GiB (estimate)" in capsys.readouterr().out


def test_the_diagnostics_modules_import_each_other_without_cycles():
    """plots -> report, never back: each module of the package can be read (and imported) on its own."""
    import ast

    import llava_normaligned.diagnostics as package

    folder = os.path.dirname(package.__file__)
    graph = {}
    for name in sorted(n[:-3] for n in os.listdir(folder) if n.endswith(".py")):
        with open(os.path.join(folder, f"{name}.py"), encoding="utf-8") as handle:
            tree = ast.parse(handle.read())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported |= {node.module} if node.module else {alias.name for alias in node.names}
        graph[name] = imported - {name}
    assert "output_files" in graph["plots"] and "plots" not in graph["output_files"]

    def cycle_from(start, node, seen):
        for nxt in graph.get(node, ()):
            if nxt == start:
                return [*seen, nxt]
            if nxt not in seen:
                found = cycle_from(start, nxt, [*seen, nxt])
                if found:
                    return found
        return None

    cycles = [cycle_from(name, name, [name]) for name in graph if name != "__init__"]
    assert not [c for c in cycles if c], f"import cycles: {[c for c in cycles if c]}"
