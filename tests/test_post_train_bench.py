"""``benchmarks/post_train.py --quick``: GRPO and DPO after the demo's stage 2 run end to end at tiny sizes with TRL's
own trainers, and the record is consistent: every (variant, seed, method) is there, accuracies are fractions, the
paired difference is after minus before, the norm ratio is the one each variant's projector gives."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.markdown import table_with

BENCHMARKS = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def test_post_training_after_stage2_runs_quick_and_its_record_adds_up(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    monkeypatch.syspath_prepend(BENCHMARKS)
    import post_train

    out = tmp_path / "results"
    argv = ["--quick", "--output-dir", str(out), "--work-dir", str(tmp_path / "work"), "--workers", "1"]
    assert post_train.main(argv) == 0
    document = json.loads((out / "results.json").read_text())

    assert document["command"] == "python benchmarks/post_train.py " + " ".join(argv)
    assert document["variants"] == ["no_norm", "norm_target_init_gwc"] and document["seeds"] == [42, 43]
    assert {"cpu", "torch", "transformers", "trl"} <= set(document["environment"])
    assert document["seconds"] > 0 and document["test_questions"] == 80
    runs = document["runs"]
    assert sorted((r["key"], r["seed"]) for r in runs) == [(k, s) for k in document["variants"] for s in (42, 43)]
    settings = document["settings"]
    for run in runs:
        assert set(run["post"]) == {"grpo", "dpo", "dpo_nll"}
        for method, post in run["post"].items():
            steps = settings["grpo_steps" if method == "grpo" else "dpo_steps"]
            assert post["steps"] == steps and post["train_loss"] is not None
            for accuracy in (post["accuracy"], run["stage2"]["accuracy"]):
                assert all(0.0 <= value <= 1.0 for condition in accuracy.values() for value in condition.values())
            # the post-training starts from the saved stage-2 model: the ratio before it is the demo's after stage 2
            assert post["norm_ratio"]["before"] == pytest.approx(run["stage2"]["norm_ratio"], rel=1e-4)
            assert post["tracked_ratio"]["batches_counted"] == steps  # one training forward a step
        rewards = run["post"]["grpo"]["reward"]
        assert len(rewards["per_step"]) == settings["grpo_steps"] and 0.0 <= rewards["mean"] <= 1.0
        assert rewards["mean"] == pytest.approx(sum(rewards["per_step"]) / len(rewards["per_step"]))
        assert len(run["post"]["dpo"]["preference"]["accuracies"]) == settings["dpo_steps"]
        ratio = run["post"]["dpo"]["norm_ratio"]["after"]
        # w/o Norm keeps the gap (image tokens far above the text norm); target init holds them near it
        assert ratio > 5 if run["key"] == "no_norm" else 0.5 < ratio < 2

    summary = document["summary"]
    for key, entry in summary["variants"].items():
        for method, block in entry["methods"].items():
            for condition in ("real", "blank"):
                seeds = block[condition]["per_seed"]
                diff = [a - b for a, b in zip(seeds["after"], seeds["before"])]
                assert block[condition]["after_minus_before"]["mean"] == pytest.approx(sum(diff) / len(diff))
                assert block[condition]["after_minus_before"]["mean"] == pytest.approx(
                    block[condition]["after"]["mean"] - block[condition]["before"]["mean"])
                assert block[condition]["after"]["n"] == 2
            if method == "grpo":
                assert block["reward_last_minus_first_quarter"]["mean"] == pytest.approx(
                    block["reward_last_quarter"]["mean"] - block["reward_first_quarter"]["mean"])
            mine = sorted((r for r in runs if r["key"] == key), key=lambda r: r["seed"])
            assert block["real"]["per_seed"]["after"] == [r["post"][method]["accuracy"]["real"]["avg"] for r in mine]
    assert set(summary["gwc_minus_no_norm"]) == {"grpo", "dpo", "dpo_nll"}
    text = (out / "summary.md").read_text()
    table = table_with(text, "method")
    blocks = [(entry, method, block) for entry in summary["variants"].values()
              for method, block in entry["methods"].items()]
    assert [(row["variant"], row["method"]) for row in table] == [
        (entry["name"], post_train.METHOD_NAMES[method]) for entry, method, _ in blocks]
    assert {("w/o Norm", "GRPO"), ("w/ Norm, target init (w/ GWC)", "DPO + NLL")} <= {
        (row["variant"], row["method"]) for row in table}
    for row, (_, _, block) in zip(table, blocks):  # the ratio's means, before and after, as summary.md shows them
        shown = [float(cell) for cell in row["vision/text norm ratio before / after"].split(" / ")]
        assert shown == pytest.approx([block["norm_ratio"][when]["mean"] for when in ("before", "after")], abs=5e-4)

    # a second run in the same work folder reuses every finished piece; other settings there are refused
    assert post_train.main(argv) == 0
    assert json.loads((out / "results.json").read_text())["runs"] == runs
    with pytest.raises(SystemExit):
        post_train.main(argv + ["--grpo-steps", "3"])
