"""``llava-normaligned demo --quick``: every output is written, complete and usable, and the run is deterministic.

The quick demo trains for a handful of steps, so its accuracies mean nothing; what is checked is that every number
the README's demo reports is there, that the norm ratios show the gap the demo is about, and that the best
checkpoint is a working model folder.
"""

from __future__ import annotations

import json
import math
import os
import re

import pytest
from PIL import Image

from llava_normaligned.demo import synthetic
from llava_normaligned.demo.parts import EXTRA_VARIANTS, VARIANTS
from llava_normaligned.demo.results_text import FIGURES_DIR
from llava_normaligned.demo.run import torch_threads
from tests.support.messages import number

TEMPLATES = {t.name for t in synthetic.TEMPLATES}


def _run(output_dir):
    from llava_normaligned.cli import main

    return main(["demo", "--output-dir", str(output_dir), "--quick", "--no-progress"])


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("demo") / "out"
    assert _run(output_dir) == 0
    return output_dir


@pytest.fixture(scope="module")
def results(quick_demo):
    return json.loads((quick_demo / "results.json").read_text())


def test_every_variant_and_the_stock_row_are_scored_with_real_and_blank_images(results):
    rows = results["rows"]
    assert [r["key"] for r in rows] == [v.key for v in VARIANTS + EXTRA_VARIANTS] + ["stock"]
    assert rows[-1]["model_class"] == "LlavaForConditionalGeneration"
    assert {r["model_class"] for r in rows[:-1]} == {"LlavaNormAlignedForConditionalGeneration"}
    for row in rows:
        for condition in ("real", "blank"):
            accuracy = row["accuracy"][condition]
            assert set(accuracy) == TEMPLATES | {"avg"}
            assert all(0.0 <= value <= 1.0 for value in accuracy.values())
            assert accuracy["avg"] == pytest.approx(sum(accuracy[t] for t in TEMPLATES) / len(TEMPLATES))
        assert row["visual_gain"] == pytest.approx(row["accuracy"]["real"]["avg"] - row["accuracy"]["blank"]["avg"])
    assert rows[-1]["steps"]["single_stage"] == sum(rows[0]["steps"].values())  # same step budget
    assert results["dataset"]["text_only_accuracy_test"] == {t: 0.25 for t in TEMPLATES}


def test_every_row_is_trained_with_several_seeds_and_reported_with_intervals(quick_demo, results):
    from llava_normaligned.demo.stats import mean_interval, paired_difference

    seeds = results["seeds"]
    assert len(seeds) >= 2 and len(set(seeds)) == len(seeds)
    rows = {r["key"]: r for r in results["rows"]}
    baseline = rows["no_norm"]
    assert baseline["paired_to_baseline"] is None
    for key, row in rows.items():
        assert row["seeds"] == seeds and [s["seed"] for s in row["per_seed"]] == seeds
        reals = [s["real_avg"] for s in row["per_seed"]]
        interval = row["accuracy_interval"]["real"]["avg"]
        assert interval == mean_interval(reals).to_dict() and row["accuracy"]["real"]["avg"] == pytest.approx(
            interval["mean"])
        if key != "no_norm":  # paired with the baseline's runs of the same seeds
            expected = paired_difference(reals, [s["real_avg"] for s in baseline["per_seed"]]).to_dict()
            assert row["paired_to_baseline"]["real"]["avg"] == pytest.approx(expected)
    text = (quick_demo / "results.md").read_text()
    assert "Paired differences to w/o Norm" in text and "separate from zero" in text and " ± " in text
    contrasts = {(c["key"], c["reference"]) for c in results["contrasts"]}
    assert ("norm_target_init_gwc_part_clip", "norm_target_init_gwc") in contrasts
    assert ("norm_target_init_gwc_noclip", "norm_target_init_noclip") in contrasts
    env = results["environment"]
    assert env["torch"] and env["cpu_capability"] and env["torch_threads"] >= 1
    assert env["cpu"] and set(env["cpu_bf16_flags"]) <= {"amx_bf16", "avx512_bf16"}  # which CPU the numbers came from
    assert env["cpu_capability"] in text


def test_the_optimizer_step_is_tracked_per_part(results):
    rows = {r["key"]: r for r in results["rows"]}
    for key in ("norm_target_init", "norm_target_init_gwc", "norm_target_init_gwc_part_clip"):
        stats = rows[key]["optimizer_step"]["mean"]
        for part in ("vision_tower", "projector", "projector_norm", "llm"):
            assert stats[f"grad_norm/{part}"] > 0 and stats[f"update_size/{part}"] > 0, (key, part)
        assert 0 < stats["clip_coef"] <= 1
    assert rows["norm_target_init_noclip"]["training"]["max_grad_norm"] == 0
    assert rows["norm_target_init_noclip"]["optimizer_step"]["mean"]["clip_coef"] == 1.0  # no clipping
    part_clip = rows["norm_target_init_gwc_part_clip"]["optimizer_step"]["mean"]
    assert all(0 < part_clip[f"clip_coef/{p}"] <= 1 for p in ("vision_tower", "projector", "llm"))


def test_per_part_clipping_s_total_is_explained(quick_demo, results):
    """With per-part clipping the Trainer's total is taken after the parts were clipped, so it is below the parts:
    results.md says so and gives the total before (the parts' root sum of squares, which is the Trainer's total
    where nothing clips per part)."""
    from llava_normaligned.demo.results_text import per_part_clip_note
    from llava_normaligned.hub_cards.card import parts_total

    rows = {r["key"]: r for r in results["rows"]}
    part_clip = rows["norm_target_init_gwc_part_clip"]
    stats = part_clip["optimizer_step"]["mean"]
    assert stats["grad_norm"] <= part_clip["training"]["max_grad_norm"] + 1e-3  # after the per-part clipping
    assert stats["grad_norm_before_part_clip"] > 5 * stats["grad_norm"]  # GWC's large vision and projector parts
    assert "grad_norm_before_part_clip" not in rows["norm_target_init_gwc"]["optimizer_step"]["mean"]
    seed = results["seeds"][0]
    run = json.loads((quick_demo / "runs" / "norm_target_init_gwc" / f"seed{seed}" / "result.json").read_text())
    for record in [r for r in run["tracking"]["stage2"] if (r.get("step") or 0) > 0]:  # no per-part clipping
        assert parts_total(record) == pytest.approx(record["grad_norm"], rel=1e-3)
    note = per_part_clip_note(part_clip)
    assert number(r"the total was ([\d.]+)", note) == pytest.approx(stats["grad_norm_before_part_clip"], abs=0.005)
    assert number(r"at most max_grad_norm \(([\d.]+)\)", note) == part_clip["training"]["max_grad_norm"]
    text = (quick_demo / "results.md").read_text()
    assert note in text and f"{stats['grad_norm']:.2f} †" in text


def test_rows_that_differ_only_in_stage_2_share_their_stage_1(quick_demo, results):
    from llava_normaligned.demo.run import STOCK_KEY, demo_tasks

    tasks = demo_tasks(VARIANTS + EXTRA_VARIANTS, [42])
    assert [t.keys for t in tasks] == [
        ("no_norm",), ("norm_default_init",), ("norm_target_init", "norm_target_init_noclip"),
        ("norm_target_init_gwc", "norm_target_init_gwc_part_clip", "norm_target_init_gwc_noclip"), (STOCK_KEY,)]
    assert sorted(p for t in tasks for p in t.positions) == [(i, 8) for i in range(1, 9)]
    shared = {"norm_target_init_noclip": "norm_target_init", "norm_target_init_gwc_noclip": "norm_target_init_gwc",
              "norm_target_init_gwc_part_clip": "norm_target_init_gwc"}
    for seed in results["seeds"]:
        runs = {key: json.loads((quick_demo / "runs" / key / f"seed{seed}" / "result.json").read_text())
                for key in list(shared) + list(set(shared.values()))}
        for key, twin in shared.items():
            row, other = runs[key], runs[twin]
            assert row["stage1_shared_with"] == twin and other["stage1_shared_with"] is None
            assert row["stage1_checkpoint"] == other["stage1_checkpoint"] == f"runs/{twin}/seed{seed}/stage1"
            assert row["tracking"]["stage1"] == other["tracking"]["stage1"]
            assert row["norm_ratio"]["after_stage1"] == other["norm_ratio"]["after_stage1"]
            assert row["seconds"]["stage1"] == 0.0 and row["training"]["applies_to"] == "stage 2"
            assert not (quick_demo / "runs" / key / f"seed{seed}" / "stage1").exists()
            # stage 1 trained with the defaults (global clipping at 1.0) for all of them
            assert all(0 < r["clip_coef"] <= 1 for r in row["tracking"]["stage1"] if "clip_coef" in r)


def test_the_readme_excerpt_and_the_card_s_gwc_record_come_from_results_json(results, tmp_path):
    from llava_normaligned.demo import results_text

    text = results_text.measured_section(results)
    assert all(line in text for line in results_text.summary_table(results["rows"]))
    assert number(r"([\d,]+) s wall", text) == pytest.approx(results["timing"]["total_seconds"], abs=0.5)
    layers = len(results["rows"][0]["layers"]["layers"]) - 1  # l = 0 is the LLM's input
    assert number(r"At this depth \((\d+) LLM layers\)", text) == layers == 4
    path = tmp_path / "demo_gwc.json"
    record = results_text.write_gwc_asset(results, str(path))
    assert results_text.read_gwc_asset(str(path)) == json.loads(json.dumps(record))
    gwc = next(r for r in results["rows"] if r["key"] == "norm_target_init_gwc")
    assert record["finding"]["grad_norm"]["gwc"] == gwc["optimizer_step"]["mean"]["grad_norm"]
    assert results_text.gwc_finding_text(record["finding"]) in results_text.render_markdown(results)


def test_the_readme_and_docs_quote_the_committed_run():
    """README.md and docs/demo.md quote ``measured_section`` of the committed default run; the card's GWC record is
    that run's ``gwc_finding``."""
    from pathlib import Path

    from llava_normaligned.demo import results_text

    root = Path(__file__).resolve().parent.parent
    committed = json.loads((root / "benchmarks" / "results" / "demo_results.json").read_text())
    section = results_text.measured_section(committed)
    for path in ("README.md", "docs/demo.md"):
        assert section.strip() in (root / path).read_text(), f"{path}: regenerate with python .ci/demo_report.py"
    asset = results_text.read_gwc_asset()
    assert asset["finding"] == json.loads(json.dumps(results_text.gwc_finding(committed["rows"], committed["contrasts"])))


def test_the_tiny_demo_s_settings_are_recorded_as_before_the_real_llm_options():
    """``--text-model`` and ``--rows`` add fields to the demo's settings; unset, they are not recorded, so the default
    run's ``demo_config.json`` is the committed run's and a folder written before them is still reused."""
    from pathlib import Path

    from llava_normaligned.demo.run import ROW_KEYS, DemoConfig, config_from_dict

    root = Path(__file__).resolve().parent.parent
    committed = json.loads((root / "benchmarks" / "results" / "demo_results.json").read_text())
    assert DemoConfig.full().to_dict() == committed["setup"]["config"]
    assert config_from_dict(committed["setup"]["config"]) == DemoConfig.full()
    assert DemoConfig.full().row_keys == ROW_KEYS == tuple(v.key for v in VARIANTS + EXTRA_VARIANTS) + ("stock",)


def test_per_layer_norms_and_directions_after_stage_2(quick_demo, results):
    layers = results["setup"]["config"]["parts"]["text"]["num_hidden_layers"]
    for row in results["rows"]:
        profile = row["layers"]
        assert profile["layers"] == list(range(layers + 1))
        for modality in ("vision", "text"):
            norms, cos = profile[modality]["norm"], profile[modality]["cos_to_prev"]
            assert len(norms) == layers + 1 and all(v > 0 for v in norms)
            assert cos[0] is None and all(-1 <= v <= 1 for v in cos[1:])
    rows = {r["key"]: r for r in results["rows"]}
    # at the LLM input the image tokens are far above the text without the norm and near it with the target init
    assert rows["no_norm"]["layers"]["vision"]["norm"][0] > 5 * rows["no_norm"]["layers"]["text"]["norm"][0]
    text = (quick_demo / "results.md").read_text()
    assert "cos(h_l, h_{l-1})" in text and "At this depth" in text


def test_norm_ratios_at_the_start_and_end_of_each_stage_show_the_gap(results):
    rows = {r["key"]: r for r in results["rows"]}
    for key, row in rows.items():
        stages = ("init", "after_stage2") if key == "stock" else ("init", "after_stage1", "after_stage2")
        assert all(math.isfinite(row["norm_ratio"][s]) and row["norm_ratio"][s] > 0 for s in stages), key
    # the tiny parts reproduce the paper's gap (RQ1): without the norm, image tokens enter the LLM far above T ...
    assert rows["no_norm"]["norm_ratio"]["init"] > 10
    assert rows["stock"]["norm_ratio"]["init"] == pytest.approx(rows["no_norm"]["norm_ratio"]["init"], rel=1e-5)
    # ... with the target-initialised norm they start at T (paper §5.1: gain T / sqrt(D), bias 0)
    for key in ("norm_target_init", "norm_target_init_gwc"):
        assert rows[key]["norm_ratio"]["init"] == pytest.approx(1.0, rel=0.02)
    parts = results["parts"]
    assert parts["vision_feature_norm"]["after_pretraining"] > 10 * parts["text_embedding_norm"]
    # the training-time tracking of each stage starts at step 0
    for stage in ("stage1", "stage2"):
        records = rows["norm_target_init_gwc"]["tracking"][stage]
        assert records[0]["step"] == 0 and "vision_text_ratio" in records[-1] and "gwc_factor" in records[-1]


def test_table5_statistics_of_the_norm(results):
    rows = {r["key"]: r for r in results["rows"]}
    assert rows["no_norm"]["gain_stats"]["after_stage1"] == {}
    default = rows["norm_default_init"]["gain_stats"]
    target = rows["norm_target_init_gwc"]["gain_stats"]
    assert default["init"]["gain_abs_mean"] == pytest.approx(1.0)
    hidden = results["setup"]["config"]["parts"]["text"]["hidden_size"]
    assert target["init"]["gain_l2"] == pytest.approx(target["init"]["gain_abs_mean"] * math.sqrt(hidden), rel=1e-4)
    assert target["init"]["gain_abs_mean"] < 0.1  # T / sqrt(D) for a 64-d LLM with embeddings of norm ~0.17
    for stats in (default, target):
        assert {"gain_l2", "gain_abs_mean", "gain_abs_std", "bias_abs_mean", "bias_abs_std"} <= set(
            stats["after_stage1"])
        assert stats["after_stage1"]["bias_abs_mean"] > 0  # stage 1 trained the norm


def test_results_markdown_has_both_tables(quick_demo, results):
    from llava_normaligned.demo.results_text import SELECTION_NOTE, STOCK_ROW_NOTE

    text = (quick_demo / "results.md").read_text()
    for row in results["rows"]:
        assert row["name"] in text
    for heading in ("paper Table 4 layout", "blank images", "Visual gain", "Vision/text norm ratio",
                    "paper Table 5 layout", "Gain (g)", "Bias (β)"):
        assert heading in text
    # the stock row's three differences stand next to the first table; the best model's selection is stated
    first_table_end = text.index("## The same questions with blank images")
    assert text.index(STOCK_ROW_NOTE) < first_table_end
    for difference in ("one stage", "no captions", "the vision tower frozen"):
        assert difference in STOCK_ROW_NOTE
    assert SELECTION_NOTE in text and "test split" in results["best"]["criterion"]


def test_figures_are_png_files_with_captions(quick_demo, results):
    from llava_normaligned.demo.results_text import FIGURES, figure_captions

    text = (quick_demo / "results.md").read_text()
    captions = figure_captions(results)
    for name, file in FIGURES.items():
        path = quick_demo / "figures" / file
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as image:
            assert image.size[0] > 100 and image.size[1] > 100
        _, found, after = text.partition(f"({FIGURES_DIR}/{file})")
        assert found and after.startswith("\n\n" + captions[name]), file  # the link, its caption below it
    assert "has no layer before it" in captions["layer_cos"]  # why the direction figure starts at layer 1


def test_curve_spread_measures_how_far_coinciding_curves_are_apart():
    from llava_normaligned.demo.results_text import curve_spread, target_init_rows

    assert curve_spread([([0, 2, 4], [1.0, 2.0, 3.0]), ([0, 2, 4], [1.0, 2.0, 3.0])]) == 0
    assert curve_spread([([0, 2], [1.0, 2.0]), ([0, 2], [1.0, 2.2]), ([2], [1.8])]) == pytest.approx(0.4 / 2.0)
    assert curve_spread([([0], [1.0])]) is None  # one curve: nothing to compare
    rows = [{"key": v.key, "variant": v.config_fields()} for v in VARIANTS + EXTRA_VARIANTS]
    assert [r["key"] for r in target_init_rows(rows)] == [
        "norm_target_init", "norm_target_init_gwc", "norm_target_init_gwc_part_clip", "norm_target_init_noclip",
        "norm_target_init_gwc_noclip"]


def test_best_model_folder_loads_and_answers(quick_demo, results):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from llava_normaligned.demo.results_text import SELECTION_NOTE
    from llava_normaligned.generation import generate_batch

    folder = quick_demo / "best_model"
    for name in ("config.json", "model.safetensors", "configuration_llava_normaligned.py",
                 "modeling_llava_normaligned.py", "README.md", "eval/results.json", "eval/results.md",
                 "training_summary.json", "norm_tracking.json", "eval/figures/accuracy.png"):
        assert (folder / name).is_file(), name
    config = json.loads((folder / "config.json").read_text())
    best = next(r for r in results["rows"] if r["key"] == results["best"]["key"])
    assert config["model_type"] == "llava_normaligned" and config["projector_norm"] == best["variant"]["projector_norm"]
    model = AutoModelForImageTextToText.from_pretrained(folder, trust_remote_code=True).eval()
    processor = AutoProcessor.from_pretrained(folder, trust_remote_code=True)
    answers = generate_batch(model, processor, ["What colour is the shape?"], [synthetic.blank_image(32)],
                             max_new_tokens=3)
    assert len(answers) == 1 and isinstance(answers[0], str)
    card = (folder / "README.md").read_text()
    assert "license: apache-2.0" in card and f"# llava-normaligned-demo-{best['key']}" in card
    assert SELECTION_NOTE in card  # the card says how the model was picked
    assert json.loads((folder / "eval" / "results.json").read_text())["selected_by"] == results["best"]["criterion"]
    assert "eval/figures/accuracy.png" in card  # the demo's results, embedded with working links
    # the demo's GWC finding travels in the folder (card_notes.json), so `push` renders the same card; it is stated
    # under the run's own GWC numbers, which a checkpoint trained without GWC has not
    from llava_normaligned.demo.results_text import demo_gwc_text

    assert json.loads((folder / "card_notes.json").read_text()) == {"gwc": demo_gwc_text()}
    assert ("In the package's CPU demo" in card) == bool(config["gradient_compensation"]), config


def test_best_model_holds_the_paper_s_method_at_its_best_seed(quick_demo, results):
    """By default ``best_model/`` holds target init with GWC (not the row with the highest mean), as the run of its
    seed with the highest real-image average; results.md and results.json name the row, the metric and every
    candidate, with the values the tables' row is the mean of."""
    from safetensors.torch import load_file

    from llava_normaligned.demo.results_text import best_model_text, summary_table
    from llava_normaligned.demo.run import DEFAULT_BEST_VARIANT, pick_best_seed

    best = results["best"]
    assert DEFAULT_BEST_VARIANT == "norm_target_init_gwc" == best["key"] and best["default_row"]
    row = next(r for r in results["rows"] if r["key"] == best["key"])
    chosen = pick_best_seed(row)
    assert best["seed"] == chosen["seed"] and best["seed_real_avg"] == chosen["real_avg"]
    candidates = best["seed_chosen_from"]["candidates"]
    assert best["seed_chosen_from"]["metric"] == "real_avg" and best["seed_chosen_from"]["row"] == row["name"]
    assert [(c["seed"], c["real_avg"]) for c in candidates] == [(s["seed"], s["real_avg"]) for s in row["per_seed"]]
    assert best["seed_chosen_from"]["row_mean"] == pytest.approx(sum(c["real_avg"] for c in candidates) / len(candidates))
    recorded = json.loads((quick_demo / "best_model" / "eval" / "results.json").read_text())
    assert recorded["checkpoint_seed"] == best["seed"] and recorded["row_chosen_by"] == best["row_chosen_by"]
    assert recorded["checkpoint_accuracy"]["real_avg"] == chosen["real_avg"]
    config = json.loads((quick_demo / "best_model" / "config.json").read_text())
    assert config["gradient_compensation"] and config["norm_init"] == "target"
    # the weights are that seed's stage-2 run of that row, not another seed's
    saved = load_file(quick_demo / "best_model" / "model.safetensors")
    for seed in results["seeds"]:
        run = load_file(quick_demo / "runs" / best["key"] / f"seed{seed}" / "stage2" / "model.safetensors")
        same = saved.keys() == run.keys() and all(saved[k].equal(run[k]) for k in saved)
        assert same == (seed == best["seed"]), seed
    text = best_model_text(results)
    assert f"**{best['name']}**" in text and f"holds seed {best['seed']}'s" in text
    assert "the default of `--best-model-variant`" in text and "not picked by accuracy" in text
    for c in candidates:
        assert f"seed {c['seed']}: {c['real_avg']:.3f}" in text
    # the row's number in the text is the one its table row shows
    interval = next(line for line in summary_table(results["rows"]) if line.startswith(f"| {row['name']} |"))
    assert f"{row['accuracy']['real']['avg']:.3f}" in text and interval.split(" | ")[1] in text
    assert text in (quick_demo / "results.md").read_text()


def test_the_best_model_text_agrees_with_the_rows_of_the_committed_run():
    """The AVX-512 run's report said "Best variant (highest real-image average over the seeds, 0.511): w/o Norm"
    while rows showed 0.549 and 0.642: the selection ran over four rows the text did not name. Now the row is set, and
    every number the text gives is a row's or its seeds'."""
    from pathlib import Path

    from llava_normaligned.demo.results_text import best_model_text
    from llava_normaligned.demo.run import best_model_record

    root = Path(__file__).resolve().parent.parent
    committed = json.loads((root / "benchmarks" / "results" / "demo_results_avx512.json").read_text())
    rows = {r["key"]: r for r in committed["rows"]}
    record = best_model_record(committed["rows"])
    assert record["key"] == "norm_target_init_gwc"  # not no_norm, the old pick of that run
    gwc = rows["norm_target_init_gwc"]
    assert record["seed"] == max(gwc["per_seed"], key=lambda s: s["real_avg"])["seed"]
    text = best_model_text({**committed, "best": record})
    assert "0.500 ± 0.071" in text and "0.511" not in text  # the row's table entry, not another row's mean
    numbers = set(re.findall(r"\d\.\d{3}", text))
    allowed = {f"{s['real_avg']:.3f}" for s in gwc["per_seed"]} | {"0.500", "0.071"}
    assert numbers <= allowed, numbers - allowed
    other = best_model_record(committed["rows"], "norm_target_init_gwc_part_clip")
    assert other["key"] == "norm_target_init_gwc_part_clip" and not other["default_row"]
    chosen = re.search(r"--best-model-variant ([\w-]+)", best_model_text({**committed, "best": other}))
    assert chosen and chosen.group(1) == other["key"]
    with pytest.raises(ValueError, match="stock"):
        best_model_record(committed["rows"], "stock")  # transformers' own class: not this package's folder


def test_best_model_variant_option(quick_demo, results, capsys):
    """``--best-model-variant`` puts another row in ``best_model/``; the runs are reused (it changes no number); a
    key that is no row is refused by the parser."""
    from llava_normaligned.cli import main
    from llava_normaligned.commands.demo import make_parser
    from llava_normaligned.demo.run import BEST_MODEL_CHOICES, DEFAULT_BEST_VARIANT, pick_best_seed

    assert make_parser().parse_args(["--output-dir", "x"]).best_model_variant == DEFAULT_BEST_VARIANT
    assert set(BEST_MODEL_CHOICES) == {v.key for v in VARIANTS + EXTRA_VARIANTS}
    with pytest.raises(SystemExit):
        make_parser().parse_args(["--output-dir", "x", "--best-model-variant", "stock"])
    capsys.readouterr()
    finished = quick_demo / "runs" / "no_norm" / f"seed{results['seeds'][0]}" / "result.json"
    stamp = os.path.getmtime(finished)
    try:
        assert main(["demo", "--output-dir", str(quick_demo), "--quick", "--no-progress",
                     "--best-model-variant", "no_norm"]) == 0
        assert os.path.getmtime(finished) == stamp  # not trained again
        again = json.loads((quick_demo / "results.json").read_text())
        row = next(r for r in again["rows"] if r["key"] == "no_norm")
        assert again["best"]["key"] == "no_norm" and not again["best"]["default_row"]
        assert again["best"]["seed"] == pick_best_seed(row)["seed"]
        config = json.loads((quick_demo / "best_model" / "config.json").read_text())
        assert config["projector_norm"] is None
        assert "`--best-model-variant no_norm`" in (quick_demo / "results.md").read_text()
    finally:  # the other tests read the default folder
        assert _run(quick_demo) == 0
    assert json.loads((quick_demo / "results.json").read_text())["best"]["key"] == DEFAULT_BEST_VARIANT


def test_the_best_seed_is_the_highest_real_average_then_the_larger_visual_gain_then_the_earlier():
    from llava_normaligned.demo.run import pick_best_seed

    def row(*runs):
        return {"per_seed": [{"seed": s, "real_avg": r, "visual_gain": g} for s, r, g in runs]}

    assert pick_best_seed(row((42, 0.50, 0.2), (43, 0.70, 0.1), (44, 0.60, 0.5)))["seed"] == 43
    assert pick_best_seed(row((42, 0.70, 0.1), (43, 0.70, 0.3)))["seed"] == 43
    assert pick_best_seed(row((42, 0.70, 0.3), (43, 0.70, 0.3)))["seed"] == 42


def test_rerun_reuses_finished_runs_and_refuses_other_settings(quick_demo, results, capsys):
    from llava_normaligned.cli import main

    finished = quick_demo / "runs" / "no_norm" / f"seed{results['seeds'][-1]}" / "result.json"
    stamp = os.path.getmtime(finished)
    assert _run(quick_demo) == 0
    assert os.path.getmtime(finished) == stamp  # not trained again
    again = json.loads((quick_demo / "results.json").read_text())
    assert [r["accuracy"] for r in again["rows"]] == [r["accuracy"] for r in results["rows"]]
    capsys.readouterr()
    assert main(["demo", "--output-dir", str(quick_demo), "--quick", "--no-progress", "--stage2-steps", "9"]) == 2
    assert "other settings" in capsys.readouterr().err


def test_same_seed_same_numbers(results, tmp_path):
    """Again, all in one process (``--workers 1``; the first run trained in two worker processes): every run is
    seeded and single-threaded, so where and in which order it ran changes nothing."""
    from llava_normaligned.cli import main

    assert results["timing"]["workers"] == 2
    assert main(["demo", "--output-dir", str(tmp_path / "again"), "--quick", "--no-progress", "--workers", "1"]) == 0
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["timing"]["workers"] == 1
    for first, second in zip(results["rows"], again["rows"]):
        assert second["accuracy"] == first["accuracy"], first["key"]
        assert second["train_loss"] == first["train_loss"], first["key"]
        assert second["norm_ratio"] == pytest.approx(first["norm_ratio"], rel=1e-6), first["key"]


def test_a_used_folder_is_refused_and_left_alone(tmp_path, capsys):
    from llava_normaligned.cli import main

    (tmp_path / "notes.txt").write_text("mine")
    assert main(["demo", "--output-dir", str(tmp_path), "--quick", "--no-progress"]) == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_vision_pretraining_makes_the_encoder_read_every_cell():
    from llava_normaligned.demo.vision_pretrain import VisionPretrainConfig, pretrain_vision
    from llava_normaligned.tiny import TinyVisionSpec

    spec = TinyVisionSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                          image_size=32, patch_size=8)
    with torch_threads(1):  # as the demo runs it: two threads on a busy 2-core machine stall each other
        result = pretrain_vision(spec, VisionPretrainConfig(num_scenes=1024, steps=120), progress=False)
    # 17 classes per cell (empty or colour x kind); about half the cells are empty, so guessing "empty" scores ~0.5
    assert result.cell_accuracy > 0.9
    assert result.losses[-1] < 0.2 * result.losses[0]
    assert result.feature_norm_after > 5  # the residual stream LLaVA reads stays far above a 0.17 text norm


def test_text_pretraining_lowers_the_lm_loss():
    from llava_normaligned.demo.parts import EXTRA_WORDS
    from llava_normaligned.demo.text_pretrain import TextPretrainConfig, conversations, pretrain_text
    from llava_normaligned.tiny import TinyTextSpec, tiny_text_model, train_tokenizer

    tokenizer = train_tokenizer(words=list(synthetic.VOCABULARY) + list(EXTRA_WORDS), vocab_size=1024,
                                with_image_token=False)
    texts = {text for conversation in conversations(256, seed=0) for turn in conversation
             for text in turn["content"].split("\n")}
    for text in texts:  # every word (and punctuation mark) the dataset writes is one token
        assert len(tokenizer.tokenize(text)) == len(re.findall(r"\w+|[^\w\s]", text)), text
    lm = tiny_text_model(tokenizer, TinyTextSpec(), seed=1)
    with torch_threads(1):
        result = pretrain_text(lm, tokenizer, TextPretrainConfig(num_conversations=512, steps=40), progress=False)
    assert result.losses[-1] < 0.5 * result.losses[0]
    held_out = conversations(64, seed=1, split="test")
    train = conversations(64, seed=1, split="train")
    assert not {c[0]["content"] for c in held_out} & {c[0]["content"] for c in train}


def test_the_demo_is_its_own_package_and_training_does_not_use_it():
    """The demo lives in llava_normaligned.demo; nothing under trainer/ imports it (training is not the demo)."""
    import ast
    from pathlib import Path

    from llava_normaligned import demo, trainer

    assert {p.stem for p in Path(demo.__file__).parent.glob("*.py")} >= {
        "run", "parts", "results_text", "scoring", "synthetic", "text_pretrain", "vision_pretrain"}
    for path in Path(trainer.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            assert not [n for n in names if n.startswith("llava_normaligned.demo")], f"{path.name} imports the demo"


def test_bad_seed_count_is_one_clear_error(tmp_path, capsys):
    from llava_normaligned.commands.demo import main as demo_main

    with pytest.raises(SystemExit) as exit_info:
        demo_main(["--output-dir", str(tmp_path / "out"), "--seeds", "0"])
    assert exit_info.value.code == 2
    assert "--seeds must be at least 1, got 0" in capsys.readouterr().err  # the rule every command states
    assert not (tmp_path / "out").exists()  # nothing written
