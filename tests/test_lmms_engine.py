"""`eval --engine lmms-eval` without lmms-eval running: what it refuses, and how lmms-eval's results JSON becomes
this package's results (the real runs are in test_lmms_eval.py)."""

from __future__ import annotations

import pytest

from llava_normaligned.commands.eval import main
from llava_normaligned.evaluation.lmms_engine import LMMS_TASKS, model_args, task_entry
from llava_normaligned.evaluation.results_files import ResultsWriter, table_markdown
from llava_normaligned.evaluation.runner import EvalConfig
from tests.support.markdown import row_of
from tests.support.messages import number


@pytest.mark.parametrize("extra, message", [
    (["--tasks", "pope,synthetic"], "lmms-eval has no task synthetic"),
    (["--tasks", "pope", "--data-dir", "."], "--data-dir is for the package's own harness"),
    (["--tasks", "pope", "--resume"], "--resume is for the package's own harness"),
])
def test_engine_refuses_what_lmms_eval_cannot_do(tiny_model_dir, tmp_path, capsys, extra, message):
    code = main([tiny_model_dir, "--engine", "lmms-eval", "--output-dir", str(tmp_path / "out"), *extra])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_model_args_carry_the_flags_and_refuse_commas():
    cfg = EvalConfig(model="./ckpt", tasks="pope", output_dir="o", revision="abc123", quantization="4bit",
                     dtype="bfloat16", max_new_tokens=8)
    assert model_args(cfg) == ("pretrained=./ckpt,revision=abc123,dtype=bfloat16,device=auto,max_new_tokens=8,"
                               "load_in_4bit=True")
    with pytest.raises(Exception, match="cannot carry"):
        model_args(EvalConfig(model="./a,b", tasks="pope", output_dir="o"))


def test_lmms_results_become_the_table4_results(tmp_path):
    lmms = {  # the shape of lmms-eval 0.7.3's <timestamp>_results.json
        "results": {
            "pope": {"alias": "pope", "pope_f1_score,none": 0.8, "pope_accuracy,none": 0.75,
                     "pope_f1_score_stderr,none": "N/A"},
            "mmlu": {"alias": "mmlu", "acc,none": 0.5, "acc_stderr,none": "N/A"},
            "hellaswag": {"alias": "hellaswag", "acc,none": 0.25},  # no acc_norm: reported as failed
        },
        "n-samples": {"pope": {"original": 9, "effective": 9}, "mmlu_philosophy": {"effective": 3},
                      "mmlu_anatomy": {"effective": 1}, "hellaswag": {"effective": 4}},
    }
    entries = {name: task_entry(name, lmms["results"], lmms["n-samples"]) for name in ("pope", "mmlu", "hellaswag")}
    assert entries["pope"]["score"] == pytest.approx(80.0) and entries["pope"]["n"] == 9
    assert entries["pope"]["metrics"] == {"pope_f1_score": 0.8, "pope_accuracy": 0.75}
    assert entries["mmlu"]["score"] == pytest.approx(50.0) and entries["mmlu"]["n"] == 4  # the group's subjects
    assert entries["hellaswag"] == "lmms-eval reported no acc_norm,none for hellaswag"
    writer = ResultsWriter(str(tmp_path), {"model": "m", "label": "m", "method": "w/o Norm", "engine": "lmms-eval"},
                           list(entries))
    writer.task_done("pope", entries["pope"])
    writer.task_done("mmlu", entries["mmlu"])
    writer.task_failed("hellaswag", entries["hellaswag"])
    writer.close()
    table = table_markdown(writer.results)
    row = row_of(table, "Model", "m")
    (avg_header,) = [header for header in row if header.startswith("Avg")]
    scores = [entries["pope"]["score"], entries["mmlu"]["score"]]
    assert (row["Method"], row["HellaSwag"]) == ("w/o Norm", "failed")  # the failed task: no number, out of Avg
    assert [float(row["POPE"]), float(row["MMLU"])] == pytest.approx(scores)
    assert float(row[avg_header]) == pytest.approx(sum(scores) / 2) and number(r"\((\d+) of", avg_header) == 2
    assert LMMS_TASKS["pope"].note in (tmp_path / "results.md").read_text()


def test_placeholder_tokens_are_never_generated(tiny_model, tiny_processor):
    """A model whose favourite next token is the image token: the evaluation's decoding still never emits it."""
    from PIL import Image

    from llava_normaligned.evaluation.batches import generate_answers
    from llava_normaligned.evaluation.prompts import GenerationRequest
    from llava_normaligned.generation import placeholder_token_ids

    image_id = tiny_model.config.image_token_id
    assert image_id in placeholder_token_ids(tiny_model, tiny_processor)

    def favour_image_token(module, inputs, logits):
        logits[..., image_id] += 1e4
        return logits

    tiny_model.lm_head.register_forward_hook(favour_image_token)
    request = GenerationRequest(doc_id="0", prompt="What is it?", images=[Image.new("RGB", (24, 24), "red")], gold=None)
    from llava_normaligned.generation import prepare_inputs

    inputs = prepare_inputs(tiny_model, tiny_processor, [request.prompt], [request.images])
    start = inputs["input_ids"].shape[1]
    greedy = dict(max_new_tokens=3, do_sample=False, pad_token_id=tiny_processor.tokenizer.eos_token_id)
    assert image_id in tiny_model.generate(**inputs, **greedy)[0, start:].tolist()  # the hook works: it is picked
    suppressed = tiny_model.generate(**inputs, **greedy, suppress_tokens=placeholder_token_ids(tiny_model, tiny_processor))
    assert image_id not in suppressed[0, start:].tolist()
    answers = generate_answers(tiny_model, tiny_processor, [request, request], max_new_tokens=4)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)


def test_engine_without_lmms_eval_says_how_to_install(tiny_model_dir, tmp_path, capsys):
    import importlib.util

    if importlib.util.find_spec("lmms_eval") is not None:
        pytest.skip("lmms-eval is installed here")
    code = main([tiny_model_dir, "--engine", "lmms-eval", "--tasks", "pope", "--output-dir", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert "lmms-eval is not installed" in err and "llava-normaligned[eval]" in err and len(err.splitlines()) == 1


def test_offline_lmms_eval_reads_the_datasets_cache_datasets_reads(monkeypatch):
    """Offline, lmms-eval's datasets cache is named (it would otherwise move to an empty scratch folder on a file
    system it takes for a network one); a cache the user named is kept, and online nothing is added."""
    import datasets.config

    from llava_normaligned.evaluation.lmms_engine import lmms_environment

    monkeypatch.delenv("LMMS_EVAL_DATASETS_CACHE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", "/data/hf/datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    assert lmms_environment()["LMMS_EVAL_DATASETS_CACHE"] == "/data/hf/datasets"
    monkeypatch.setenv("LMMS_EVAL_DATASETS_CACHE", "/scratch/mine")
    assert lmms_environment()["LMMS_EVAL_DATASETS_CACHE"] == "/scratch/mine"
    monkeypatch.delenv("LMMS_EVAL_DATASETS_CACHE")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    assert "LMMS_EVAL_DATASETS_CACHE" not in lmms_environment()
