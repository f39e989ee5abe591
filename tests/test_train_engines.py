"""The shipped FSDP2, DeepSpeed ZeRO-2 and ZeRO-3 configs (`trainer/accelerate_configs/`) run `llava-normaligned
train` for both stages in two processes on the CPU over gloo (``trainer/engines.py`` says what that takes), and
under each engine:

* the weights after two SGD steps (lr 1, no clipping, so an update is the gradient itself) equal a one-process
  run's on the same global batch up to float32 rounding (``_assert_same_weights``): the gradients, GWC's
  included, are the same. The projector norm's gain is
  a ramp, not the constant T / sqrt(D), so that a GWC factor taken from a shard of the gain (half of it on each
  rank) would differ from the factor of the whole gain;
* stage 2's three learning-rate groups (LLM, projector, vision tower at three rates) survive the engine's
  optimizer wrapping: the per-part updates match the one-process run, and the groups and logged rates are there;
* the parameters are really sharded (FSDP2: every tensor a ``DTensor`` holding half the elements; ZeRO-3:
  partitioned), as the training summary records;
* a run resumed from its step-1 checkpoint ends with the uninterrupted run's weights;
* stage 2 runs as its recipes do, with length grouping and padding-free batches.

The launched processes start with an empty ``TORCH_EXTENSIONS_DIR``, as on a fresh machine: a ZeRO run compiles
nothing there (DeepSpeed's shared-memory all-reduce op, which only tensor-parallel layers call, is not built).
DeepSpeed is in the ``dev`` extra, so these run wherever the tests do.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

from tests.support.numerics import F32_EPS
from tests.support.training import write_llava_dataset

CONFIGS = os.path.join(os.path.dirname(__file__), os.pardir, "trainer", "accelerate_configs")
ENGINES = {"fsdp": "fsdp.yaml", "zero2": "deepspeed_zero2.yaml", "zero3": "deepspeed_zero3.yaml"}
# an update is lr x gradient: SGD, no clipping, no schedule within the two steps that matters for the comparison
SGD = ["--optim", "sgd", "--max_grad_norm", "0", "--max_steps", "2", "--lr_scheduler_type", "constant",
       "--report_to", "none", "--disable_tqdm", "True", "--gradient_checkpointing", "False", "--seed", "0",
       "--logging_steps", "1"]
STAGE_LRS = {1: ["--learning_rate", "1.0"],
             2: ["--learning_rate", "1.0", "--lr-projector", "0.5", "--lr-vision", "0.25"]}
# stage 2 as its recipes run it: LLaVA's length grouping, and padding-free batches (one process: both rows packed in
# one sequence; two processes: one row each)
STAGE_BATCHES = {1: [], 2: ["--train_sampling_strategy", "group_by_modality_length", "--padding_free", "True"]}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def ramp_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with a projector-norm gain that is a ramp (0.2x .. 3x T / sqrt(D)), not a constant."""
    from transformers import AutoProcessor

    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    out = str(tmp_path_factory.mktemp("ramp_model"))
    model = LlavaNormAlignedForConditionalGeneration.from_pretrained(tiny_model_dir)
    gain = model.model.multi_modal_projector.norm.weight
    with torch.no_grad():
        gain.mul_(torch.linspace(0.2, 3.0, gain.numel()))
    # the factor of half the gain (what one of two shards holds) is far from the whole gain's
    half = gain.detach()[: gain.numel() // 2]
    assert float(gain.detach().abs().mean() / half.abs().mean()) > 1.5
    model.save_pretrained(out)
    AutoProcessor.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def two_rows(tmp_path_factory):
    # two image rows: one per process and step, the same two in the one-process batch of 2
    return write_llava_dataset(tmp_path_factory.mktemp("engine_data"), n_rows=2, text_only=0, multi_turn_every=0)


def _train_argv(stage, model_dir, data, out, *extra):
    path, images = data
    return ["--stage", str(stage), "--model", model_dir, "--data-path", path, "--image-folder", images,
            "--output-dir", str(out), *SGD, *STAGE_LRS[stage], *STAGE_BATCHES[stage], *extra]


def _env(tmp_path):
    return dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                HF_DATASETS_CACHE=str(tmp_path / "datasets_cache"),
                TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"))  # empty: what the runs compile lands here


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux ``/proc``): torch's launcher starts its workers in sessions of their own,
    out of reach of a ``killpg`` of the launcher's group."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _launch(engine, argv, tmp_path, timeout=300):
    """`accelerate launch --config_file <shipped config> --num_processes 2 -m llava_normaligned.cli train ...`,
    in float32 (--mixed_precision no: the comparison is to float32 rounding)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               os.path.join(CONFIGS, ENGINES[engine]), "--num_processes", "2", "--mixed_precision", "no",
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(_free_port()),
               "-m", "llava_normaligned.cli", "train", *argv]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(tmp_path), start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        for pid in workers:  # they hold the output pipe open: communicate() would wait for them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output, _ = proc.communicate()
        raise AssertionError(f"{engine}: did not finish in {timeout} s:\n{output[-6000:]}") from None
    assert proc.returncode == 0, f"{engine}:\n{output[-6000:]}"
    return output


def _weights(folder):
    """The saved model as a user loads it, every weight read from the folder: name -> tensor."""
    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    model, info = LlavaNormAlignedForConditionalGeneration.from_pretrained(str(folder), output_loading_info=True)
    assert not info["missing_keys"], (folder, info)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _summary(folder):
    with open(os.path.join(folder, "training_summary.json")) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def one_process(ramp_model_dir, two_rows, tmp_path_factory):
    """The reference: each stage in one process with both rows in one batch of 2."""
    from llava_normaligned.commands.train import main

    runs = {}
    for stage in (1, 2):
        out = tmp_path_factory.mktemp(f"one_process_stage{stage}")
        assert main(_train_argv(stage, ramp_model_dir, two_rows, out, "--per_device_train_batch_size", "2",
                                "--save_strategy", "no")) == 0
        runs[stage] = _weights(out)
    return runs


def _assert_same_weights(got, expected, initial, what, atol=None):
    """The same weights up to float32 rounding: 4 units of rounding of the tensor's own largest weight (two SGD steps
    of lr 1, each rounding the stored weight), plus 4 units of the largest update anywhere in the model (an update is
    a gradient, and a gradient near zero by cancellation carries the rounding of the large terms it came from: with
    GWC the projector's updates reach tens). ``atol``: a fixed bound instead (a resumed run repeats the same kernels
    on the same inputs)."""
    assert got.keys() == expected.keys(), what
    largest_update = max(float((value - initial[name]).abs().max()) for name, value in expected.items())
    moved = 0
    for name, value in expected.items():
        bound = atol if atol is not None else 4 * F32_EPS * (float(value.abs().max()) + largest_update)
        torch.testing.assert_close(got[name], value, rtol=0, atol=bound, msg=f"{what}: {name}")
        moved += not torch.equal(initial[name], value)
    assert moved, f"{what}: nothing trained"


def _assert_sharded(engine, summary):
    info = summary["training"]["engine"]
    assert info["num_processes"] == 2, info
    if engine == "fsdp":
        assert info["distributed_type"] == "FSDP" and info["fsdp_version"] == 2, info
        assert info["sharded_parameter_tensors"] == info["parameter_tensors"] > 0, info  # every tensor a DTensor
        assert info["parameter_elements_here"] <= info["parameter_elements"] // 2 + 1000, info
    else:
        assert info["distributed_type"] == "DEEPSPEED" and info["zero_stage"] == int(engine[-1]), info
        if engine == "zero3":
            assert info["sharded_parameter_tensors"] == info["parameter_tensors"] > 0, info
            assert info["parameter_elements_here"] <= info["parameter_elements"] // 2 + 1000, info


def test_fsdp_wraps_the_listed_layer_classes_the_model_has(tiny_model):
    from accelerate.utils import FullyShardedDataParallelPlugin

    from llava_normaligned.trainer.engines import fit_fsdp_wrap_classes

    # the shipped config's list, which names layers of four model families
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["LlamaDecoderLayer", "Qwen2DecoderLayer", "SiglipEncoderLayer", "CLIPEncoderLayer"])
    assert fit_fsdp_wrap_classes(plugin, tiny_model) == ["LlamaDecoderLayer", "SiglipEncoderLayer"]
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer", "SiglipEncoderLayer"]
    plugin.set_auto_wrap_policy(tiny_model)  # accelerate's own check now passes
    none_present = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                  transformer_cls_names_to_wrap=["Qwen2DecoderLayer"])
    with pytest.raises(ValueError, match="none of the layer classes to wrap"):
        fit_fsdp_wrap_classes(none_present, tiny_model)


def test_fsdp_resume_knows_which_optimizers_keep_tensor_state(tiny_model):
    # an FSDP resume loads optimizer state only where there is some: torch's full-state-dict load fails without it
    from llava_normaligned.trainer.engines import optimizer_keeps_tensors

    params = [p for p in tiny_model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    assert not optimizer_keeps_tensors(tiny_model, torch.optim.SGD(params, lr=1.0))
    assert optimizer_keeps_tensors(tiny_model, torch.optim.SGD(params, lr=1.0, momentum=0.9))
    assert optimizer_keeps_tensors(tiny_model, torch.optim.AdamW(params, lr=1.0))
    # asking initialises the state with a zero step at lr 0: the weights and gradients are as they were
    assert all(torch.equal(a, b) for a, b in zip(before, params)) and all(p.grad is None for p in params)


@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
def test_engine_trains_both_stages_like_one_process_and_resumes(engine, ramp_model_dir, two_rows, one_process,
                                                                tmp_path):
    initial = _weights(ramp_model_dir)
    per_device = ["--per_device_train_batch_size", "1"]

    stage1 = tmp_path / "stage1"
    _launch(engine, _train_argv(1, ramp_model_dir, two_rows, stage1, *per_device, "--save_strategy", "no"), tmp_path)
    summary = _summary(stage1)
    _assert_sharded(engine, summary)
    got = _weights(stage1)
    _assert_same_weights(got, one_process[1], initial, f"{engine} stage 1")
    assert all(torch.equal(got[n], initial[n]) for n in got if "multi_modal_projector" not in n)  # only it trained

    stage2 = tmp_path / "stage2"
    _launch(engine, _train_argv(2, ramp_model_dir, two_rows, stage2, *per_device, "--save_strategy", "steps",
                                "--save_steps", "1"), tmp_path)
    summary = _summary(stage2)
    _assert_sharded(engine, summary)
    _assert_same_weights(_weights(stage2), one_process[2], initial, f"{engine} stage 2")
    groups = {g["name"]: g["lr"] for g in summary["optimizer_groups"]}
    assert {groups[p] for p in ("llm", "llm/no_decay")} == {1.0}, groups
    assert {groups[p] for p in ("projector", "projector/no_decay")} == {0.5}, groups
    assert {groups[p] for p in ("vision_tower", "vision_tower/no_decay")} == {0.25}, groups
    with open(stage2 / "checkpoint-2" / "trainer_state.json") as handle:
        logged = [r for r in json.load(handle)["log_history"] if "learning_rate" in r]
    assert logged and all(r["learning_rate/llm"] == 1.0 and r["learning_rate/projector"] == 0.5
                          and r["learning_rate/vision_tower"] == 0.25 for r in logged), logged

    resumed = tmp_path / "resumed"
    _launch(engine, _train_argv(2, ramp_model_dir, two_rows, resumed, *per_device, "--save_strategy", "no",
                                "--resume_from_checkpoint", str(stage2 / "checkpoint-1")), tmp_path)
    assert _summary(resumed)["training"]["global_steps"] == 2
    _assert_same_weights(_weights(resumed), _weights(stage2), initial, f"{engine} resumed", atol=1e-6)
    # six launches, and not one compiled an op (a build would leave its folder here, or run past the timeout)
    built = tmp_path / "torch_extensions"
    assert not (built.exists() and os.listdir(built)), os.listdir(built)


def test_deepspeed_cpu_run_skips_the_shm_allreduce_op_only_without_tensor_parallelism(tmp_path, monkeypatch):
    import deepspeed.ops

    from llava_normaligned.trainer.engines import (
        SHM_ALLREDUCE_OP,
        cpu_engine_settings,
        prepare_cpu_engine,
        skip_unused_shm_allreduce,
    )

    compatible = deepspeed.ops.__compatible_ops__  # the dict deepspeed.comm.torch.build_shm_op reads
    assert SHM_ALLREDUCE_OP in compatible
    monkeypatch.setitem(compatible, SHM_ALLREDUCE_OP, True)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", raising=False)

    # a DeepSpeed config with AutoTP: its layers all-reduce through the op, which stays
    tp_config = tmp_path / "ds_tp.json"
    tp_config.write_text(json.dumps({"tensor_parallel": {"autotp_size": 2}, "zero_optimization": {"stage": 1}}))
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(tp_config))
    assert not skip_unused_shm_allreduce(argparse.Namespace(deepspeed=None))
    assert compatible[SHM_ALLREDUCE_OP] is True
    assert not skip_unused_shm_allreduce(argparse.Namespace(deepspeed={"tensor_parallel": {"autotp_size": 4}}))
    assert compatible[SHM_ALLREDUCE_OP] is True

    # the shipped configs (no DeepSpeed JSON), or one without tensor parallelism: the op is not built
    monkeypatch.delenv("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    namespace = argparse.Namespace(deepspeed=None, use_cpu=True, bf16=True, fp16=False, ddp_backend=None)
    before = dict(vars(namespace))
    assert cpu_engine_settings(namespace) == {"use_cpu": False, "bf16": False, "fp16": False, "ddp_backend": "gloo"}
    assert vars(namespace) == before and compatible[SHM_ALLREDUCE_OP] is True  # the settings change nothing
    assert prepare_cpu_engine(namespace)  # the process step does
    assert compatible[SHM_ALLREDUCE_OP] is False
    monkeypatch.setitem(compatible, SHM_ALLREDUCE_OP, True)
    assert skip_unused_shm_allreduce(argparse.Namespace(deepspeed={"tensor_parallel": {"autotp_size": 1}}))
    assert compatible[SHM_ALLREDUCE_OP] is False
