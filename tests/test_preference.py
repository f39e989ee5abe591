"""DPO, GRPO and KTO on this package's models through TRL, with the norm tracked (docs/training.md, "Preference
and RL fine-tuning").

* The rows (``trainer.rl_data``) and the reward (``trainer.rewards``).
* The Python API: TRL's ``DPOTrainer`` and ``GRPOTrainer`` with ``callbacks=[NormTrackingCallback()]`` and
  ``report_to=["tensorboard"]``: the norm values reach ``state.log_history`` and the TensorBoard event files although
  the Trainer puts the reporting callbacks first; the weights move; only the training forwards are counted (not
  GRPO's generation nor the reference model's log-probabilities, which run without gradients).
* TRL's own scripts (``trl/scripts/dpo.py``, ``grpo.py``) in a fresh interpreter where this package cannot be
  imported, on this package's checkpoint and on a folder ``align`` wrote from a stock Idefics3: the checkpoints load
  with ``--trust_remote_code True`` alone.
* ``llava-normaligned dpo`` / ``grpo`` / ``kto`` with the same command lines, writing ``norm_tracking.json``; bad
  input in one line.

GRPO's gradient is zero when every completion of a group earns the same reward (the advantage is the reward minus
the group's mean): on these random tiny models ``exact_answer`` is always 0, so the runs that must move weights add
a reward that varies, the completion's length in characters (``REWARD_MODULE``), instead of training a model
first: it keeps the test to seconds and still takes the whole GRPO path (generation, rewards, advantages, loss).
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil

import pytest
import torch

from llava_normaligned.cli import main as cli_main
from tests.support.isolation import run_isolated
from tests.support.training import changed, snapshot, write_llava_dataset

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

REWARD_MODULE = '''
def by_length(completions, **kwargs):
    """The completion's length in characters: differs between the completions of a group."""
    return [float(len(c[-1]["content"] if isinstance(c, list) else c)) for c in completions]
'''
NORM = "model.multi_modal_projector.norm.weight"  # this package's projector norm's gain

# the command line of both `trl dpo` / `trl grpo` and `llava-normaligned dpo` / `grpo`: tiny, CPU, two steps
COMMON = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--logging_steps", "1", "--save_strategy", "no",
          "--learning_rate", "1e-3", "--gradient_checkpointing", "False", "--report_to", "none", "--seed", "0",
          "--use_cpu", "True", "--bf16", "False", "--disable_tqdm", "True"]
GRPO = ["--num_generations", "4", "--max_completion_length", "4", "--reward_funcs", "exact_answer",
        "rewards_by_length.by_length"]


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_model_dir):
    """A folder with the rows as dataset folders (``rl-data``), the reward module, this package's tiny checkpoint
    and an aligned tiny Idefics3 (``align``)."""
    from llava_normaligned.align import align, save_aligned
    from llava_normaligned.tiny import save_tiny_vlm

    folder = tmp_path_factory.mktemp("preference")
    json_path, images = write_llava_dataset(folder / "llava", n_rows=8)
    for kind in ("dpo", "grpo", "kto"):
        assert cli_main(["rl-data", "--data-path", json_path, "--image-folder", images, "--format", kind,
                         "--output-dir", str(folder / f"{kind}_data")]) == 0
    (folder / "rewards_by_length.py").write_text(REWARD_MODULE)
    shutil.copytree(tiny_model_dir, folder / "ours")
    stock = save_tiny_vlm("idefics3", folder / "idefics3")
    save_aligned(align(stock), str(folder / "idefics3_aligned"), stock)
    return folder


# ----------------------------------------------------------------------------------------------- rows and reward


def _row(i, question, answer):
    return {"id": str(i), "image": f"{i % 4}.png", "conversations": [
        {"from": "human", "value": f"<image>\n{question}"}, {"from": "gpt", "value": answer}]}


def test_rows_pair_each_answer_with_another_answer_to_the_same_question(tmp_path):
    from PIL import Image

    from llava_normaligned.trainer.rewards import exact_answer
    from llava_normaligned.trainer.rl_data import kto_rows, preference_rows, prompt_rows, save_rows

    for i in range(4):
        Image.new("RGB", (16, 16), (60 * i, 0, 0)).save(tmp_path / f"{i}.png")
    rows = [_row(0, "what colour ?", "red"), _row(1, "what colour ?", "Blue."), _row(2, "what colour ?", "red."),
            _row(3, "how many ?", "two"), _row(4, "how many ?", "Two"),  # one answer only, spelled twice: dropped
            {"id": "text", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yes"}]}]
    pairs, report = preference_rows(rows, str(tmp_path), return_report=True)
    assert [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs] == [
        ("red", "Blue."), ("Blue.", "red"), ("red.", "Blue.")]
    assert (report.rows_read, report.rows_kept, report.no_rejected_dropped, report.text_only_dropped) == (6, 3, 2, 1)
    assert pairs[0]["prompt"] == [{"role": "user", "content": [{"type": "image", "text": None},
                                                               {"type": "text", "text": "what colour ?"}]}]
    assert pairs[0]["image"].size == (16, 16)
    unpaired = kto_rows(rows, str(tmp_path))
    assert unpaired["label"] == [True, False] * 3 and unpaired[1]["completion"][0]["content"] == "Blue."
    prompts = prompt_rows(rows, str(tmp_path))
    assert prompts["solution"] == ["red", "Blue.", "red.", "two", "Two"]

    # written with the images inside: loads back as the train split with the image folder gone
    from datasets import load_dataset

    save_rows(pairs, tmp_path / "out")
    for i in range(4):
        os.remove(tmp_path / f"{i}.png")
    loaded = load_dataset(str(tmp_path / "out"))["train"]
    assert loaded.column_names == ["image", "prompt", "chosen", "rejected"] and loaded[2]["image"].size == (16, 16)

    completions = [[{"role": "assistant", "content": " Red.\n"}], "blue", [{"role": "assistant", "content": [
        {"type": "text", "text": "TWO."}]}], "red square"]
    assert exact_answer(completions, solution=["red", "red", "two", "red"]) == [1.0, 0.0, 1.0, 0.0]


# -------------------------------------------------------------------------------------------------- Python API


def _tensorboard_tags(output_dir) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for path in glob.glob(os.path.join(output_dir, "runs", "**", "events.out.tfevents.*"), recursive=True):
        events = EventAccumulator(path)
        events.Reload()
        tags |= set(events.Tags()["scalars"])
    return tags


def _watch_forwards(module) -> list[tuple[bool, bool]]:
    """(training mode, gradients enabled) of every forward of ``module``."""
    seen = []
    module.register_forward_hook(lambda m, i, o: seen.append((m.training, torch.is_grad_enabled())))
    return seen


def _api_run(kind, work, tmp_path):
    from transformers import AutoProcessor
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, KTOConfig, KTOTrainer

    from llava_normaligned.trainer import NormTrackingCallback, kto_rows, preference_rows, prompt_rows
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(work / "ours")
    processor = AutoProcessor.from_pretrained(work / "ours")
    settings = {"output_dir": str(tmp_path / kind), "use_cpu": True, "bf16": False, "report_to": ["tensorboard"],
                "max_steps": 2, "per_device_train_batch_size": 4, "logging_steps": 1, "save_strategy": "no",
                "learning_rate": 1e-3, "gradient_checkpointing": False, "disable_tqdm": True, "seed": 0}
    callback = NormTrackingCallback()
    json_path, images = str(work / "llava" / "train.json"), str(work / "llava" / "images")
    if kind == "dpo":  # given to the Trainer, which puts it after the reporting callbacks
        trainer = DPOTrainer(model=model, args=DPOConfig(**settings), processing_class=processor,
                             train_dataset=preference_rows(json_path, images), callbacks=[callback])
    elif kind == "kto":
        trainer = KTOTrainer(model=model, args=KTOConfig(**settings), processing_class=processor,
                             train_dataset=kto_rows(json_path, images), callbacks=[callback])
    else:
        spec = importlib.util.spec_from_file_location("rewards_by_length", work / "rewards_by_length.py")
        rewards = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(rewards)  # the reward the TRL scripts import by its dotted path
        trainer = GRPOTrainer(model=model, reward_funcs=[rewards.by_length], processing_class=processor,
                              args=GRPOConfig(**settings, num_generations=4, max_completion_length=4, beta=0.1),
                              train_dataset=prompt_rows(json_path, images))
        trainer.add_callback(callback)  # added once the Trainer is made: last in the list until training begins
        assert trainer.callback_handler.callbacks[-1] is callback
    return trainer, callback


@pytest.mark.parametrize("kind", ["dpo", "grpo", "kto"])
def test_trl_trainer_with_the_callback_reports_the_norm_and_counts_training_forwards_only(kind, work, tmp_path):
    trainer, callback = _api_run(kind, work, tmp_path)
    handler = trainer.callback_handler.callbacks
    reporting = [type(c).__name__ for c in handler]
    assert "TensorBoardCallback" in reporting and "PrinterCallback" in reporting
    # given to the Trainer: it moved to the front at the Trainer's on_init_end; added later: at on_train_begin
    assert (handler.index(callback) == 0) == (kind != "grpo")
    policy = _watch_forwards(trainer.model.model.multi_modal_projector.norm)
    reference = _watch_forwards(trainer.ref_model.model.multi_modal_projector.norm)
    before = snapshot(trainer.model)
    trainer.train()

    assert handler[0] is callback  # it is first: TensorBoard got its values (below)
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logged) == 2 and all(0.5 < e["norm/vision_text_ratio"] < 2 for e in logged)
    # transformers' TensorBoard callback files training logs under "train/"
    assert {"train/norm/vision_text_ratio", "train/norm/gain_abs_mean", "train/norm/gwc_factor"} <= \
        _tensorboard_tags(tmp_path / kind)
    assert json.loads((tmp_path / kind / "norm_tracking.json").read_text())[-1]["step"] == 2
    assert NORM in changed(before, trainer.model)

    trained = [seen for seen in policy if seen == (True, True)]
    assert callback.batches_counted == len(trained) == 2  # one training forward per step (batch 4, no accumulation)
    assert reference and not any(grad for _, grad in reference)  # the reference model ran, without gradients
    if kind == "grpo":  # generation runs with the model in training mode, without gradients: not counted
        assert (True, False) in policy


# ----------------------------------------------------------------------------------- TRL's scripts, no package

TRL_SCRIPTS = """
import json, sys
from trl.scripts import dpo, grpo

for kind, script in (("dpo", dpo), ("grpo", grpo)):
    for model in ("ours", "idefics3_aligned"):
        args = COMMON + (GRPO_TRL if kind == "grpo" else [])
        script.main(*script.make_parser().parse_args_and_config(
            ["--model_name_or_path", model, "--dataset_name", kind + "_data", "--output_dir", f"trl_{kind}_{model}",
             "--trust_remote_code", "True", *args]))
hidden = sorted(m for m in sys.modules if m.partition(".")[0] in ("llava_normaligned", "modeling_llava_normaligned"))
print("LOADED " + json.dumps(hidden))
"""


def test_trl_own_scripts_train_both_checkpoints_without_this_package(work):
    grpo = [*GRPO[:-3], "--reward_funcs", "rewards_by_length.by_length"]  # TRL's script knows no exact_answer
    code = TRL_SCRIPTS.replace("COMMON", repr(COMMON)).replace("GRPO_TRL", repr(grpo))
    done = run_isolated(code, cwd=str(work), env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}, timeout=600)
    assert "LOADED []" in done.stdout
    for kind in ("dpo", "grpo"):
        for model, norm in (("ours", NORM), ("idefics3_aligned", "model.connector.aligned_norm.weight")):
            _assert_moved(work / model, work / f"trl_{kind}_{model}", norm)


def _assert_moved(source, trained, norm: str) -> None:
    from safetensors.torch import load_file

    before, after = load_file(source / "model.safetensors"), load_file(trained / "model.safetensors")
    assert not torch.equal(before[norm], after[norm]), f"{trained}: the norm's gain did not move"


# ---------------------------------------------------------------------------------------------- our commands


@pytest.mark.parametrize("kind", ["dpo", "grpo", "kto"])
def test_our_commands_run_the_same_command_lines_and_write_the_norm_records(kind, work, capsys, monkeypatch):
    monkeypatch.chdir(work)  # as TRL's script, a dotted reward path is found from the working directory
    for model, norm in (("ours", NORM), ("idefics3_aligned", "model.connector.aligned_norm.weight")):
        output = work / f"ours_{kind}_{model}"
        argv = [kind, "--model_name_or_path", model, "--dataset_name", f"{kind}_data", "--output_dir", str(output),
                *COMMON, *(GRPO if kind == "grpo" else [])]
        assert cli_main(argv) == 0
        out = capsys.readouterr().out
        assert out.strip().splitlines()[-1].startswith(f"{kind} done: {output}")
        records = json.loads((output / "norm_tracking.json").read_text())
        assert [r["step"] for r in records] == [0, 1, 2] and all("vision_text_ratio" in r for r in records)
        _assert_moved(work / model, output, norm)
        if kind == "grpo":  # exact_answer was found by its name (and earned nothing: the model is random)
            assert "'rewards/exact_answer/mean': '0'" in out and "rewards/by_length/mean" in out


BAD = [
    (["dpo"], "--model_name_or_path is required"),
    (["dpo", "--model_name_or_path", "ours"], "--dataset_name is required"),
    (["dpo", "--model_name_or_path", "no_such_model/"], "no_such_model"),
    (["dpo", "--model_name_or_path", "ours", "--dataset_name", "./no_such_data"], "--dataset_name ./no_such_data"),
    (["dpo", "--model_name_or_path", "ours", "--dataset_name", "grpo_data", "--output_dir", "bad_out"],
     "--dataset_name grpo_data: the train split has no column chosen, rejected"),
    (["grpo", "--model_name_or_path", "ours", "--dataset_name", "grpo_data"], "--reward_funcs is required"),
    (["grpo", "--model_name_or_path", "ours", "--dataset_name", "grpo_data", "--reward_funcs", "exact"],
     "--reward_funcs exact: unknown reward"),
    (["grpo", "--model_name_or_path", "ours", "--dataset_name", "grpo_data", "--reward_funcs", "nowhere.reward"],
     "--reward_funcs nowhere.reward: cannot import nowhere"),
    (["kto", "--model_name_or_path", "ours", "--dataset_name", "kto_data", "--config", "no_such_recipe"],
     "--config: no such file or shipped recipe: no_such_recipe"),
    (["dpo", "--model_name_or_path", "ours", "--dataset_name", "dpo_data", "--output_dir", "ours/config.json"],
     "--output_dir ours/config.json: a file"),
    (["dpo", "--model_name_or_path", "ours", "--dataset_name", "dpo_data", "--output_dir", "bad_out",
      "--eval_strategy", "steps"], "no 'test' split to evaluate on"),
    (["rl-data", "--data-path", "none.json", "--format", "dpo", "--output-dir", "x"], "--data-path none.json"),
]


@pytest.mark.parametrize("argv, says", BAD, ids=[" ".join(a[:1] + a[-2:]) for a, _ in BAD])
def test_bad_input_is_one_line(argv, says, work, capsys, monkeypatch):
    monkeypatch.chdir(work)
    try:
        code = cli_main(argv)
    except SystemExit as usage_error:  # the parser's own (an unknown recipe): exit code 2, as a process ends
        code = usage_error.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"llava-normaligned {argv[0]}: error: ") and says in err[0], err
    assert not (work / "bad_out").exists()


# --------------------------------------------------------------------------------------------------- recipes

RECIPES = os.path.join(os.path.dirname(__file__), os.pardir, "trainer", "recipes", "preference")


@pytest.mark.parametrize("kind", ["dpo", "grpo"])
def test_the_recipe_reads_the_same_in_trl_and_in_our_command(kind, monkeypatch):
    import importlib

    from llava_normaligned.commands.shared.trl_script import read_script_args
    from llava_normaligned.trainer.preference import build_script_args

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    path = os.path.join(RECIPES, f"{kind}_stage2.yaml")
    argv = ["--model_name_or_path", "runs/stage2", "--dataset_name", "data", "--output_dir", "out"]
    trl_script = importlib.import_module(f"trl.scripts.{kind}")
    theirs = trl_script.make_parser().parse_args_and_config(["--config", path, *argv, "--use_cpu", "True",
                                                              "--bf16", "False"])
    ours = build_script_args(kind, read_script_args(kind, ["--config", f"preference/{kind}_stage2", *argv]))
    assert [type(o) for o in ours] == [type(t) for t in theirs]
    for field in ("learning_rate", "gradient_accumulation_steps", "seed", "trust_remote_code", "num_train_epochs"):
        assert getattr(ours[1], field) == getattr(theirs[1], field), field
    assert ours[1].trust_remote_code is True and ours[1].seed == 42
    if kind == "grpo":
        assert ours[0].reward_funcs == theirs[0].reward_funcs == ["llava_normaligned.trainer.rewards.exact_answer"]
        assert ours[1].num_generations == 8 and ours[1].max_completion_length == 32
    else:
        assert ours[1].beta == theirs[1].beta == 0.1
    if not torch.cuda.is_available():
        assert ours[1].use_cpu and not ours[1].bf16  # the recipe's bf16 turned off on a CPU-only machine
