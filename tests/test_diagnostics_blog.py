"""The seeds' own layouts and readings, on tiny models built in code where the answers are known by construction:
the blog's six tables, which way each measurement points, the paper's Appendix C for a base LLM and a VLM, memory
estimates for every family's config, and decoding that never emits a placeholder token (diagnose, generate, eval)."""

from __future__ import annotations

import json
import math
import os
import statistics

import pytest
import torch

from llava_normaligned.commands.diagnose import main
from llava_normaligned.diagnostics.readings import BLOG_TABLES, RULES, directions
from tests.support.markdown import cell_rows, table_with

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def run(tiny_model_dir, stock_model_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("diag"))
    assert main([tiny_model_dir, "--baseline", stock_model_dir, "--output-dir", out, "--max-samples", "2",
                 "--max-new-tokens", "2", "--no-plots", "--no-progress"]) == 0
    with open(os.path.join(out, "diagnostics.json"), encoding="utf-8") as f:
        document = json.load(f)
    with open(os.path.join(out, "summary.md"), encoding="utf-8") as f:
        return document, f.read()


# ---------------------------------------------------------------------------------------------- the blog's tables


def test_blog_tables_have_the_blog_s_columns_and_the_run_s_numbers(run):
    document, summary = run
    tables = document["blog_tables"]
    pairs = [document, document["baseline"]]
    names = [n["model_id"] for n in pairs]
    for name, (section, columns) in BLOG_TABLES.items():
        assert tables[name]["section"] == section and tables[name]["columns"] == columns
        assert "| " + " | ".join(columns) + " |" in summary, name  # the blog's header, as it writes it
        assert [row[0] for row in tables[name]["rows"]][:: 2 if name == "update_dilution" else 1] == names
    for i, numbers in enumerate(pairs):
        assert tables["norm_ratio"]["rows"][i][1] == pytest.approx(
            numbers["layers"]["vision"]["norm"][0] / numbers["layers"]["text"]["norm"][0])
        vision, text = tables["update_dilution"]["rows"][2 * i: 2 * i + 2]
        assert vision[1:] == ["Vision", numbers["layers"]["vision"]["update_rel"][1],
                              numbers["layers"]["vision"]["cos_to_layer0"][1]]
        assert text[1:] == ["Text", numbers["layers"]["text"]["update_rel"][1],
                            numbers["layers"]["text"]["cos_to_layer0"][1]]
        correlation = numbers["ablations"]["correlation"]
        assert tables["ablation"]["rows"][i][1:] == [
            correlation["real_blank"]["norm"], correlation["real_blank"]["cos_to_layer0"],
            correlation["real_no_image"]["norm"], correlation["real_no_image"]["cos_to_layer0"]]
        ratio = numbers["vision_text_norm_ratio_prompt"]
        rows = numbers["alpha_sweep"]["rows"]
        nearest = min(rows, key=lambda r: abs(math.log(r["alpha"] * ratio)))
        assert tables["alpha_norm_matching"]["rows"][i][1:] == pytest.approx(
            [nearest["alpha"], nearest["alpha"] * ratio, nearest["attention_kl"], nearest["logit_kl"],
             nearest["median_rank"]])
        smallest = min(rows, key=lambda r: r["alpha"])
        assert smallest["alpha"] == 0.01  # the default sweep's smallest, the blog's Experiment 2 row
        assert tables["kv_cosine"]["rows"][i][1:] == [0.01, smallest["cos_k"], smallest["cos_v"]]
        kv = numbers["kv_substitution"]
        assert tables["kv_substitution"]["rows"][i][1:] == [kv["kl_real_hybrid"], kv["kl_blank_hybrid"]]
    curves = tables["layer_curves"]
    layers = document["layers"]["index"]
    assert len(curves["rows"]) == 2 * 2 * len(layers)  # two models, vision and text, every layer
    assert curves["rows"][1][3:] == [document["layers"]["vision"][k][1] for k in
                                     ("norm", "cos_to_layer0", "cos_to_prev", "update_abs", "update_rel")]


def test_summary_states_which_way_each_measurement_points(run):
    document, summary = run
    assert "### Which way each measurement points" in summary
    for numbers in (document, document["baseline"]):
        assert [d["key"] for d in numbers["directions"]] == [r.key for r in RULES]
        for d in numbers["directions"]:
            assert d["verdict"] in ("undecided", f"for the {d['side']}", f"against the {d['side']}")
    table = table_with(summary, "claim (whose)")
    assert [(row["claim (whose)"], row["measurement"], row["rule"]) for row in table] == [
        (f"{rule.claim} ({rule.side})", rule.measurement, rule.rule) for rule in RULES]
    for numbers in (document, document["baseline"]):  # each model's column: its verdicts, in bold
        column = f"`{numbers['model_id']}`"
        verdicts = [row[column].rpartition(": ")[2] for row in table]
        assert verdicts == [f"**{d['verdict']}**" for d in numbers["directions"]]


# ---------------------------------------------------------------------------------------------- which way


def _numbers(*, ratio=15.0, vision_norms=(15.0, 14.0, 13.0), text_norms=(1.0, 5.0, 6.0), cos1=(0.97, 0.17),
             rel1=(0.29, 5.02), matching_kl=6.05, matching_rank=53.0, cos_kv=(0.825, 0.151), kv=(0.204, 0.393),
             correlations=(0.9999, 0.9999, 0.9927, 0.9999)):
    """A model's numbers shaped as the run writes them; the defaults are the blog's SmolVLM2 figures."""
    def layer(norms, cos, rel):
        return {"norm": list(norms), "cos_to_layer0": [1.0, cos, cos], "update_rel": [None, rel, rel]}

    return {
        "vision_text_norm_ratio_prompt": ratio,
        "layers": {"vision": layer(vision_norms, cos1[0], rel1[0]), "text": layer(text_norms, cos1[1], rel1[1]),
                   "index": [0, 1, 2]},
        "alpha_sweep": {"rows": [
            {"alpha": 0.01, "logit_kl": 9.0, "median_rank": 90.0, "cos_k": cos_kv[0], "cos_v": cos_kv[1]},
            {"alpha": 1 / ratio, "logit_kl": matching_kl, "median_rank": matching_rank, "cos_k": 0.9, "cos_v": 0.8},
            {"alpha": 1.0, "logit_kl": 0.0, "median_rank": 1.0, "cos_k": 1.0, "cos_v": 1.0},
        ]},
        "kv_substitution": {"kl_real_hybrid": kv[0], "kl_blank_hybrid": kv[1]},
        "ablations": {"correlation": {"real_blank": {"norm": correlations[0], "cos_to_layer0": correlations[1]},
                                      "real_no_image": {"norm": correlations[2], "cos_to_layer0": correlations[3]}}},
    }


def _verdicts(numbers):
    return {d["key"]: d["verdict"] for d in directions(numbers)}


def test_the_blog_s_own_figures_read_as_the_blog_reads_them():
    verdicts = _verdicts(_numbers())
    assert verdicts["gap_at_input"] == "for the paper"  # 15.11: both seeds see the gap
    assert verdicts["vision_rotates_slower"] == "for the paper"  # 0.97 vs 0.17
    assert verdicts["updates_diluted"] == "for the paper"  # 5.02 / 0.29
    assert verdicts["downscaling_breaks"] == "for the blog"  # logit KL 6.05, median rank 53
    assert verdicts["k_robust_v_not"] == "for the blog"  # 0.825 vs 0.151
    assert verdicts["kv_not_sufficient"] == "for the blog"  # 0.204 < 0.393
    assert verdicts["text_trajectory_unmoved"] == "for the blog"
    assert verdicts["gap_persists"] == "for the paper"  # constructed layers (the blog has no table): median 2.48


def test_an_aligned_model_reads_against_each_claim():
    aligned = _numbers(ratio=1.0, vision_norms=(1.0, 2.0, 3.0), text_norms=(1.0, 4.0, 6.0), cos1=(0.1, 0.25),
                       rel1=(3.0, 3.0), matching_kl=0.0, matching_rank=1.0, cos_kv=(0.5, 0.48), kv=(0.5, 0.2),
                       correlations=(0.5, 0.95, 0.99, 0.99))
    aligned["alpha_sweep"]["rows"] = aligned["alpha_sweep"]["rows"][:1] + aligned["alpha_sweep"]["rows"][2:]
    verdicts = _verdicts(aligned)
    assert set(verdicts.values()) == {"against the paper", "against the blog"}
    assert verdicts["downscaling_breaks"] == "against the blog"  # alpha = 1 is the norm-matching one: KL 0, rank 1


@pytest.mark.parametrize("key, change, verdict", [
    ("gap_at_input", dict(ratio=2.0), "for the paper"),  # thresholds count as met
    ("gap_at_input", dict(ratio=1.25), "against the paper"),
    ("gap_at_input", dict(ratio=1.6), "undecided"),
    ("vision_rotates_slower", dict(cos1=(0.5, 0.45)), "undecided"),
    ("vision_rotates_slower", dict(cos1=(0.3, 0.4)), "against the paper"),
    ("updates_diluted", dict(rel1=(1.0, 1.5)), "undecided"),
    ("gap_persists", dict(vision_norms=(15.0, 6.0, 6.0), text_norms=(1.0, 4.0, 4.0)), "undecided"),  # 1.5
    ("downscaling_breaks", dict(matching_kl=0.3, matching_rank=1.0), "undecided"),
    ("downscaling_breaks", dict(matching_kl=0.05, matching_rank=2.0), "for the blog"),  # the rank alone
    ("downscaling_breaks", dict(matching_kl=0.05, matching_rank=1.0), "against the blog"),
    ("k_robust_v_not", dict(cos_kv=(0.6, 0.5)), "undecided"),
    ("k_robust_v_not", dict(cos_kv=(0.5, 0.5)), "against the blog"),
    ("kv_not_sufficient", dict(kv=(0.3, 0.3)), "undecided"),
    ("kv_not_sufficient", dict(kv=(0.5, 0.3)), "against the blog"),
    ("text_trajectory_unmoved", dict(correlations=(0.99, 0.95, 1.0, 1.0)), "undecided"),
])
def test_each_rule_s_thresholds(key, change, verdict):
    assert _verdicts(_numbers(**change))[key] == verdict


def test_a_measurement_that_is_missing_is_undecided():
    numbers = _numbers()
    numbers["vision_text_norm_ratio_prompt"] = None
    numbers["kv_substitution"]["kl_real_hybrid"] = None
    numbers["ablations"]["correlation"]["real_blank"]["norm"] = None
    verdicts = _verdicts(numbers)
    assert verdicts["gap_at_input"] == verdicts["kv_not_sufficient"] == "undecided"
    assert verdicts["text_trajectory_unmoved"] == verdicts["downscaling_breaks"] == "undecided"


# ------------------------------------------------------------------------------- the paper's Appendix C tables

BASE_NORMS_TOP = [2.0 - 0.1 * k for k in range(12)]  # ids 20..31 of the base LLM
VL_BOUNDARY = {30: 3.0, 31: 2.5}  # two rows the VLM grew (the paper's <|vision_start|>, <|vision_end|>)


def _set_rows(weight: torch.Tensor, norms: list[float]):
    """Row i becomes norms[i] times a unit basis vector: its L2 norm is norms[i] exactly."""
    with torch.no_grad():
        weight.zero_()
        for i, n in enumerate(norms):
            weight[i, i % weight.shape[1]] = n


@pytest.fixture(scope="module")
def embedding_pair(tiny_parts, tmp_path_factory):
    """(base LLM folder, VLM folder, base row norms, VLM row norms, the VLM's image token id)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llava_normaligned.compose import compose, save

    vision_dir, text_dir = tiny_parts
    base_dir = str(tmp_path_factory.mktemp("base_llm"))
    base = AutoModelForCausalLM.from_pretrained(text_dir)
    vocab = base.get_input_embeddings().weight.shape[0]
    base_norms = [0.5] * vocab
    base_norms[20:32] = BASE_NORMS_TOP
    _set_rows(base.get_input_embeddings().weight, base_norms)
    base.save_pretrained(base_dir, max_shard_size="60KB")  # sharded: read through its index, one tensor
    assert os.path.isfile(os.path.join(base_dir, "model.safetensors.index.json"))
    AutoTokenizer.from_pretrained(text_dir).save_pretrained(base_dir)

    vlm_dir = str(tmp_path_factory.mktemp("vlm"))
    vlm, processor = compose(vision_dir, base_dir)
    image_id = vlm.config.image_token_id
    weight = vlm.get_input_embeddings().weight
    vlm_norms = list(base_norms) + [0.5] * (weight.shape[0] - vocab)
    for token_id, norm in VL_BOUNDARY.items():
        vlm_norms[token_id] = norm
    vlm_norms[image_id] = 100.0  # never an input: left out
    _set_rows(weight, vlm_norms)
    save(vlm, processor, vlm_dir)
    return base_dir, vlm_dir, base_norms, vlm_norms, image_id


def test_compare_embeddings_gives_appendix_c_for_a_known_pair(embedding_pair, tmp_path, capsys):
    base_dir, vlm_dir, base_norms, vlm_norms, image_id = embedding_pair
    out = str(tmp_path / "out")
    assert main([vlm_dir, "--compare-embeddings", base_dir, "--output-dir", out]) == 0
    printed = capsys.readouterr().out
    with open(os.path.join(out, "embedding_comparison.json"), encoding="utf-8") as f:
        result = json.load(f)
    kept = [n for i, n in enumerate(vlm_norms) if i != image_id]
    assert result["base"]["mean"] == pytest.approx(statistics.fmean(base_norms), rel=1e-6)
    assert result["base"]["std"] == pytest.approx(statistics.pstdev(base_norms), rel=1e-5)
    assert result["vlm"]["mean"] == pytest.approx(statistics.fmean(kept), rel=1e-6)
    assert result["vlm"]["std"] == pytest.approx(statistics.pstdev(kept), rel=1e-5)
    assert result["vlm"]["excluded_token_ids"] == [image_id] and result["base"]["excluded_token_ids"] == []
    assert [r["token_id"] for r in result["base"]["top_k"]] == list(range(20, 30))
    assert [r["norm"] for r in result["base"]["top_k"]] == pytest.approx(BASE_NORMS_TOP[:10])
    assert [r["token_id"] for r in result["vlm"]["top_k"]] == [30, 31] + list(range(20, 28))
    assert [r["norm"] for r in result["vlm"]["top_k"]] == pytest.approx([3.0, 2.5] + BASE_NORMS_TOP[:8])
    with open(os.path.join(out, "embedding_comparison.md"), encoding="utf-8") as f:
        table = f.read()
    assert table in printed
    rows = cell_rows(table)
    # the paper's Table 6 and Tables 7-8 layouts
    top = ["Rank", "Token", "L2 Norm", "Token", "L2 Norm"]
    assert ["Metric", "Base", "VL"] in rows and top in rows
    (mean,) = [row for row in rows if row[0].startswith("Mean Norm")]
    assert [float(cell) for cell in mean[1:]] == pytest.approx([statistics.fmean(base_norms), statistics.fmean(kept)],
                                                              abs=6e-5)  # printed to 4 decimals
    first = rows[rows.index(top) + 1]  # rank 1: the largest norm of each
    assert first[0] == "1" and [float(first[2]), float(first[4])] == [BASE_NORMS_TOP[0], 3.0]
    assert "100.0000" not in table


def test_compare_embeddings_errors_name_the_input(embedding_pair, tmp_path, capsys):
    assert main([embedding_pair[1], "--compare-embeddings", str(tmp_path / "no-such-llm")]) == 2
    assert "no-such-llm" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- memory, every family


def _family_configs():
    from transformers import Gemma3Config, Idefics3Config, Qwen3VLConfig, SmolVLMConfig

    text = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, vocab_size=320)
    siglip = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
                  patch_size=8)
    return {
        # name: (config, image tokens by construction)
        "qwen3_vl": (Qwen3VLConfig(
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8,
                               spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16,
                               deepstack_visual_indexes=[0]),
            text_config=text), (768 // 16) ** 2),
        "idefics3": (Idefics3Config(vision_config=siglip, text_config={"model_type": "llama", **text},
                                    scale_factor=2), 16 // 4 * 17),
        "smolvlm": (SmolVLMConfig(vision_config=siglip, text_config={"model_type": "llama", **text},
                                  scale_factor=2), 16 // 4 * 17),
        "gemma3": (Gemma3Config(vision_config=siglip, text_config=text, mm_tokens_per_image=4), 4),
    }


@pytest.mark.parametrize("family", ["qwen3_vl", "idefics3", "smolvlm", "gemma3"])
def test_estimate_memory_works_for_every_family(family, tmp_path, capsys):
    from transformers import AutoModelForImageTextToText

    from llava_normaligned.diagnostics.memory import PROMPT_TOKENS, count_parameters, estimate, image_tokens

    config, tokens = _family_configs()[family]
    assert image_tokens(config) == tokens
    real = sum(p.numel() for p in AutoModelForImageTextToText.from_config(config).parameters())
    assert count_parameters(config) == real  # counted on the meta device from the config alone
    assert estimate(config, "float32").sequence_length == tokens + PROMPT_TOKENS + 8
    config.save_pretrained(str(tmp_path))  # a user's folder holding only config.json
    assert main([str(tmp_path), "--estimate-memory", "--dtype", "float32"]) == 0
    assert f"{real / 1e9:.2f}B parameters" in capsys.readouterr().out


@pytest.mark.parametrize("name, tokens", [
    ("LlavaConfig", 576), ("LlavaNextConfig", 576), ("LlavaOnevisionConfig", 576), ("Idefics3Config", 204),
    ("SmolVLMConfig", 204), ("Qwen2VLConfig", 729), ("Qwen2_5_VLConfig", 729), ("Qwen3VLConfig", 576),
    ("Gemma3Config", 256), ("InternVLConfig", 256), ("PaliGemmaConfig", 256), ("Mistral3Config", 729),
    ("Ovis2Config", 256),
])
def test_estimate_memory_reads_every_transformers_family_s_default_config(name, tokens, tmp_path, capsys):
    """Each family's default (full-size) config, built on the meta device, its image tokens by its own rule: e.g.
    Idefics3's defaults, 224 px tiles of patch 32 at scale 2: 49 // 4 = 12 tokens per tile x 17 tiles = 204;
    Qwen2-VL's patch 14 x merge 2 on a 768 px image: 27^2 = 729; PaliGemma's num_image_tokens 256."""
    import transformers

    from llava_normaligned.families.sizes import image_tokens

    config = getattr(transformers, name)()
    assert image_tokens(config) == tokens
    config.save_pretrained(str(tmp_path))
    assert main([str(tmp_path), "--estimate-memory"]) == 0
    assert "parameters: weights" in capsys.readouterr().out


def test_the_blog_s_models_are_in_the_memory_table():
    from llava_normaligned.diagnostics.memory import count_parameters, reference_config, reference_names

    names = [n for n in reference_names() if "blog" in n]
    assert [n.split(" ")[0] for n in names] == ["SmolVLM2-2.2B-Instruct", "Qwen3-VL-2B-Instruct"]
    smol, qwen = (reference_config(n) for n in names)
    assert (smol.model_type, qwen.model_type) == ("smolvlm", "qwen3_vl")
    # the sizes their names give: 2.2B and 2B
    assert count_parameters(smol) / 1e9 == pytest.approx(2.2, rel=0.05)
    assert count_parameters(qwen) / 1e9 == pytest.approx(2.0, rel=0.1)


# ------------------------------------------------------------------------------ placeholders are never decoded


def test_placeholder_ids_cover_every_family_s_markers():
    from types import SimpleNamespace

    from llava_normaligned.generation import placeholder_token_ids
    from llava_normaligned.tiny import train_tokenizer

    tokenizer = train_tokenizer()
    extra = ["<row_1_col_1>", "<row_2_col_3>", "<fake_token_around_image>", "<global-img>", "<|vision_start|>",
             "<|vision_end|>", "<|video_pad|>", "<row_of_text>"]
    tokenizer.add_special_tokens({"additional_special_tokens": extra})
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in extra + ["<image>"]}
    config = SimpleNamespace(image_token_id=ids["<image>"], vision_start_token_id=ids["<|vision_start|>"],
                             video_token_id=None, boi_token_index=tokenizer.eos_token_id)  # EOS is never suppressed
    model = SimpleNamespace(config=config, generation_config=SimpleNamespace(eos_token_id=tokenizer.eos_token_id))
    found = placeholder_token_ids(model, tokenizer)
    assert found == sorted(ids[t] for t in ids if t != "<row_of_text>")
    assert tokenizer.eos_token_id not in found


@pytest.fixture(scope="module")
def rigged_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with its LM head rigged to prefer the image token after every text token: every input row
    gets a large first coordinate, so the last hidden state points along it, and only the image token's row of the
    LM head reads it strongly."""
    import shutil

    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    out = str(tmp_path_factory.mktemp("rigged") / "model")
    shutil.copytree(tiny_model_dir, out)
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(out)
    image_id = model.config.image_token_id
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] += 30.0
        model.lm_head.weight[image_id] = 0.0
        model.lm_head.weight[image_id, 0] = 5.0
    model.save_pretrained(out)
    return out


@pytest.fixture
def image_file(tmp_path):
    from PIL import Image

    path = str(tmp_path / "red.png")
    Image.new("RGB", (32, 32), (200, 30, 30)).save(path)
    return path


@pytest.fixture
def generated(monkeypatch):
    """The new tokens of every ``model.generate`` call (the prompt, which holds image tokens, cut off)."""
    from transformers import GenerationMixin

    outputs, real = [], GenerationMixin.generate

    def spy(self, *args, **kwargs):
        result = real(self, *args, **kwargs)
        outputs.append(result[:, kwargs["input_ids"].shape[1]:].tolist())
        return result

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    return outputs


def _image_id(rigged_dir) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(rigged_dir).image_token_id


def test_the_rigged_model_picks_the_image_token_and_then_cannot_go_on(rigged_dir, image_file):
    from llava_normaligned.diagnostics import passes
    from llava_normaligned.generation import placeholder_token_ids, prepare_inputs
    from llava_normaligned.loading import load_model

    model, processor = load_model(rigged_dir, device="cpu")
    image_id = model.config.image_token_id
    inputs = prepare_inputs(model, processor, ["what is it?"], [[image_file]])
    free = passes.greedy_continuation(model, inputs, 3)
    assert image_id in free.tolist()[0]  # unsuppressed, the rig wins
    with pytest.raises(ValueError, match="Image features and image tokens do not match"):
        passes.run(model, inputs, appended=free[:, :2])  # what diagnose's teacher-forced passes would do
    suppressed = passes.greedy_continuation(model, inputs, 3, placeholder_token_ids(model, processor))
    assert image_id not in suppressed.tolist()[0]
    passes.run(model, inputs, appended=suppressed[:, :2])


def test_diagnose_never_decodes_a_placeholder(rigged_dir, tmp_path):
    from transformers import AutoTokenizer

    out = str(tmp_path / "diag")
    assert main([rigged_dir, "--output-dir", out, "--max-samples", "2", "--max-new-tokens", "3", "--alphas", "0.1",
                 "--no-plots", "--no-progress"]) == 0
    with open(os.path.join(out, "diagnostics.json"), encoding="utf-8") as f:
        samples = json.load(f)["samples"]
    image_token = AutoTokenizer.from_pretrained(rigged_dir).convert_ids_to_tokens(_image_id(rigged_dir))
    assert len(samples) == 2 and all(image_token not in s["greedy_tokens"] for s in samples)


def test_generate_never_decodes_a_placeholder(rigged_dir, image_file, generated, capsys):
    from llava_normaligned.commands.generate import main as generate_main

    assert generate_main([rigged_dir, "--image", image_file, "--prompt", "what is it?", "--max-new-tokens", "4",
                          "--device", "cpu"]) == 0
    assert generated and all(_image_id(rigged_dir) not in row for out in generated for row in out)


def test_eval_never_decodes_a_placeholder(rigged_dir, generated, tmp_path):
    from llava_normaligned.commands.eval import main as eval_main
    from tests.support import eval_fixtures

    data = eval_fixtures.write_all(str(tmp_path / "bench"))
    out = str(tmp_path / "eval")
    assert eval_main([rigged_dir, "--tasks", "pope", "--data-dir", data, "--limit", "2", "--output-dir", out,
                      "--max-new-tokens", "3", "--batch-size", "2"]) == 0
    with open(os.path.join(out, "samples.jsonl"), encoding="utf-8") as f:
        samples = [json.loads(line) for line in f]
    assert samples and not any(s.get("error") for s in samples)
    assert generated and all(_image_id(rigged_dir) not in row for out in generated for row in out)


def test_pass_flops_split_every_parameter_and_count_by_hand():
    from llava_normaligned.diagnostics.memory import count_parameters, pass_flops, pass_shape

    config, _ = _family_configs()["qwen3_vl"]
    shape = pass_shape(config)
    embeddings = 2 * 320 * 64  # untied input embeddings and LM head
    assert shape.vision_parameters + shape.llm_parameters + embeddings == count_parameters(config)
    assert (shape.attention_width, shape.num_layers, shape.vision_layers) == (64, 2, 2)
    assert shape.patches_per_block == shape.image_tokens * 4 and shape.vision_blocks == 1
    text_only = 2 * shape.llm_parameters * 10 + 4 * 2 * 10 * 10 * 64 + 2 * 320 * 64
    assert pass_flops(shape, 10, with_image=False) == text_only
    assert pass_flops(shape, 10) == text_only + 2 * shape.vision_parameters * shape.patches_per_block \
        + 4 * 2 * shape.patches_per_block**2 * 32
