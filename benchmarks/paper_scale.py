"""Training steps at the paper's 3.65B shape (SigLIP-SO400M-384 + Llama-3.2-3B, 729 image tokens) in bf16, on one GPU
or on a CPU with bf16 matmul instructions: this package's ``train`` command, padded and with length grouping +
padding-free batches, against stock TRL on a stock LLaVA with the same weights; seconds per step, real tokens/s,
MFU and peak memory against ``diagnostics.memory.training_estimate``.

    python benchmarks/paper_scale.py --device cpu --json benchmarks/results/paper_scale_cpu.json
    bash benchmarks/gpu_paper_scale.sh                                  # --device cuda, on the GPU machine
    python benchmarks/paper_scale.py --tiny                             # any CPU: tiny widths, the paper's 761 tokens

Per stage, three runs, each in a process of its own (its peak memory is its own; one model in memory at a time):

* ``stock``: TRL's ``SFTTrainer`` as shipped (its collator, ``assistant_only_loss``) on a stock
  ``LlavaForConditionalGeneration``, the same freezing, and for stage 2 on a CPU the same LoRA adapters
  (``trainer.lora.stage2_lora_config``);
* ``padded``: ``llava-normaligned train`` (the command, through ``python -m llava_normaligned.cli``);
* ``grouped_padding_free``: the same with ``--train_sampling_strategy group_by_modality_length --padding_free True``.

Stage 1 trains the projector on LLaVA-558K-shaped rows (an image and a short caption: 761 tokens); stage 2 trains
on mix665k-shaped rows (``scale_data``: multi-turn, ~6% text-only with a long tail), fully on a GPU and through LoRA
(``--use_peft``, rank 16) on a CPU, where full stage 2 does not fit: ``training_estimate`` gives its memory. Weights
are random (built from the shape, nothing downloaded): the speed does not depend on them. bf16 autocast over bf16
weights, gradient checkpointing on (TRL's default), ``--batch-size`` rows per step.

Timing: the ``train`` runs log every step to TensorBoard, whose events carry wall times; a step's time is the gap
between its event and the previous one (data loading and logging included), its real tokens the growth of TRL's
``num_tokens`` (attention-mask sums, or a packed row's length); the stock run times its steps with a callback and
reads ``num_tokens`` from its log history. Steps after ``--warmup`` count; real tokens/s compare runs whose steps
drew different rows. Peak memory: on a GPU, the peak torch allocated (``train`` records it in
``training_summary.json``; the stock child measures its own the same way); on a CPU, each process's resident,
anonymous and file-backed memory sampled every 0.5 s from ``/proc``: the anonymous peak (tensors and heap) is what
training needs, while loading also maps the checkpoint file (7.3 GB at this shape), whose pages count in the resident
size until the kernel drops them.

A CPU without AMX or AVX512-BF16 cannot run bf16 at this shape (an AVX2 CPU's bf16 ``grad @ W`` ran at 0.27
GFLOP/s): the script says so and runs the paper's widths in float32 with as many layers as fit in ``--budget``
seconds at the measured float32 rate.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import machine  # noqa: E402
import scale_data  # noqa: E402

PAPER_SHAPE = "SigLIP-so400m-384 + Llama-3.2-3B (paper)"  # diagnostics/memory.py's reference architectures
H200_BF16_DENSE_FLOPS = 989e12  # NVIDIA's figure for H100/H200 SXM, dense bf16
LORA_RANK = 16  # TRL's ModelConfig default, what `train --use_peft` uses
RUNS = {
    "padded": [],
    "grouped_padding_free": ["--train_sampling_strategy", "group_by_modality_length", "--padding_free", "True"],
}
TINY = {"vision": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
        "text": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16)}


# ------------------------------------------------------------------------------------------------ set-up


def model_config(opts):
    """The LLaVA config to build: the paper's, tiny widths (``--tiny``), or the paper's widths with ``--layers``."""
    from llava_normaligned.diagnostics.memory import reference_config

    config = reference_config(PAPER_SHAPE)
    if opts.tiny:
        for key, value in TINY["vision"].items():
            setattr(config.vision_config, key, value)
        for key, value in TINY["text"].items():
            setattr(config.text_config, key, value)
    elif opts.layers:
        config.text_config.num_hidden_layers = opts.layers
        config.vision_config.num_hidden_layers = max(1, round(opts.layers * 27 / 28))
    return config


def build(opts, workdir: str) -> tuple[str, str]:
    """(norm-aligned folder, stock LLaVA folder) at the shape, random weights, the same in both."""
    from transformers import AutoModelForCausalLM, SiglipImageProcessor, SiglipVisionModel

    from llava_normaligned.compose import compose_parts, save, stock_llava_like

    config = model_config(opts)
    tokenizer = scale_data.word_tokenizer(with_image_token=True)
    if opts.tiny:  # the paper's shape keeps Llama-3.2's 128,256-row embeddings and LM head
        config.text_config.vocab_size = len(tokenizer)
    dtype = torch.float32 if opts.dtype == "float32" else torch.bfloat16
    torch.manual_seed(0)
    vision_tower = SiglipVisionModel(config.vision_config).to(dtype)
    llm = AutoModelForCausalLM.from_config(config.text_config, dtype=dtype)
    image_processor = SiglipImageProcessor(size={"height": 384, "width": 384}, image_mean=[0.5] * 3,
                                           image_std=[0.5] * 3)
    model, processor = compose_parts(config.vision_config, vision_tower, llm, tokenizer, image_processor,
                                     vision_name="siglip-so400m-patch14-384 (random)",
                                     text_name="Llama-3.2-3B (random)", dtype=dtype)
    del vision_tower, llm
    ours, stock = os.path.join(workdir, "ours"), os.path.join(workdir, "stock")
    save(model, processor, ours)
    stock_llava_like(model).save_pretrained(stock)
    processor.save_pretrained(stock)
    return ours, stock


def write_rows(workdir: str, stage: int, n_rows: int) -> tuple[str, str]:
    """(LLaVA JSON, image folder): LLaVA-558K-shaped rows for stage 1, mix665k-shaped for stage 2."""
    folder = os.path.join(workdir, f"data{stage}")
    rows = scale_data.pretrain_rows(n_rows) if stage == 1 else scale_data.mix_rows(n_rows)
    if stage == 2:  # rows within the recipe's max_length (2,048) only: a CPU step at this shape is minutes
        rows = [row for row in rows if sum(len(t["value"]) for t in row["conversations"]) < 3000]
    scale_data.write_images(rows, os.path.join(folder, "images"))
    return scale_data.write_json(rows, os.path.join(folder, "rows.json")), os.path.join(folder, "images")


# ------------------------------------------------------------------------------------------------ the runs


def train_argv(opts, stage: int, model: str, data: tuple[str, str], out: str) -> list[str]:
    path, images = data
    argv = ["--stage", str(stage), "--model", model, "--data-path", path, "--image-folder", images,
            "--output-dir", out, "--max_steps", str(opts.warmup + opts.steps),
            "--per_device_train_batch_size", str(opts.batch_size), "--learning_rate", "1e-5",
            "--dtype", opts.dtype, "--bf16", str(opts.dtype == "bfloat16"), "--gradient_checkpointing", "True",
            "--max_length", "2048", "--save_strategy", "no", "--disable_tqdm", "True", "--seed", "0",
            "--logging_steps", "1", "--report_to", "tensorboard", "--dataloader_num_workers", "0"]
    if stage == 2 and opts.stage2 == "lora":
        argv += ["--use_peft", "True", "--lora_r", str(LORA_RANK)]
    if opts.attn_implementation:
        argv += ["--attn_implementation", opts.attn_implementation]
    return argv


def _status_kib(pid: int) -> dict:
    """VmRSS, RssAnon and RssFile of a process (Linux ``/proc/PID/status``), in KiB; {} once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            return {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in handle)
                    if k in ("VmRSS", "RssAnon", "RssFile")}
    except (OSError, ValueError):
        return {}


def run_child(command: list[str], env: dict) -> tuple[int, str, dict]:
    """(exit code, the end of its output, its peak memory in GiB sampled every 0.5 s: resident, anonymous (the
    tensors and the heap: what training needs) and file-backed (the checkpoint's mapped pages, which the kernel can
    drop))."""
    import threading

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peaks = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}

    def sample():
        while proc.poll() is None:
            for key, value in _status_kib(proc.pid).items():
                peaks[key] = max(peaks[key], value)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output = proc.communicate()[0]
    sampler.join()
    memory = {"peak_rss_gib": peaks["VmRSS"] / 2**20, "peak_anonymous_gib": peaks["RssAnon"] / 2**20,
              "peak_file_backed_gib": peaks["RssFile"] / 2**20}
    return proc.returncode, output[-4000:], memory


def steps_from_events(folder: str) -> list[tuple[float, float]]:
    """(seconds, real tokens) of each logged step after the first, from the run's TensorBoard events: the wall-time
    gap between consecutive ``train/loss`` events, and the growth of TRL's ``train/num_tokens`` (the tokens it
    trained on: attention-mask sums, or a packed row's length)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(glob.glob(os.path.join(folder, "**", "events.out.tfevents.*"), recursive=True))
    if not files:
        raise RuntimeError(f"no TensorBoard events under {folder}")
    events = EventAccumulator(os.path.dirname(files[-1]))
    events.Reload()
    walls = [e.wall_time for e in sorted(events.Scalars("train/loss"), key=lambda e: e.step)]
    tokens = [e.value for e in sorted(events.Scalars("train/num_tokens"), key=lambda e: e.step)]
    return [(b - a, nb - na) for a, b, na, nb in zip(walls, walls[1:], tokens, tokens[1:])]


def steps_from_history(marks: list[float], history: list[dict]) -> list[tuple[float, float]]:
    """(seconds, real tokens) of each step after the first, from step-end times and the Trainer's log history
    (``num_tokens`` logged at every step)."""
    tokens = [r["num_tokens"] for r in history if "num_tokens" in r and "loss" in r]
    times = marks[1:]  # marks[0]: the start of training
    return [(b - a, nb - na) for a, b, na, nb in zip(times, times[1:], tokens, tokens[1:])]


def run_train(opts, stage: int, name: str, model: str, data, workdir: str, env: dict) -> dict:
    out = os.path.join(workdir, f"stage{stage}_{name}")
    command = [sys.executable, "-m", "llava_normaligned.cli", "train",
               *train_argv(opts, stage, model, data, out), *RUNS[name]]
    code, tail, memory = run_child(command, env)
    if code != 0:
        return {"ok": False, "error": tail}
    with open(os.path.join(out, "training_summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    steps = steps_from_events(out)[max(0, opts.warmup - 1):]  # the first step has no gap before it
    shutil.rmtree(out, ignore_errors=True)  # a 3.65B run writes ~7 GB; the next run needs the disk
    return {"ok": True, "steps": steps, "memory": {**summary["memory"], **memory},
            "rows_per_step": opts.batch_size, "tokens": summary["data"]["prepare"],
            "padding_free": summary["training"]["padding_free"],
            "train_sampling_strategy": summary["training"]["train_sampling_strategy"]}


def run_stock(opts, stage: int, model: str, data, workdir: str, env: dict) -> dict:
    out = os.path.join(workdir, f"stage{stage}_stock")
    command = [sys.executable, os.path.abspath(__file__), "--child-stock", json.dumps(
        {"stage": stage, "model": model, "data": list(data), "out": out, "argv": train_argv(opts, stage, model, data,
                                                                                           out)})]
    code, tail, memory = run_child(command, env)
    if code != 0:
        return {"ok": False, "error": tail}
    with open(os.path.join(out, "stock.json"), encoding="utf-8") as handle:
        result = json.load(handle)
    shutil.rmtree(out, ignore_errors=True)
    result["memory"].update(memory)
    result["steps"] = result["steps"][max(0, opts.warmup - 1):]
    return {"ok": True, **result}


def child_stock(spec: dict) -> int:
    """Stock TRL + stock LLaVA with the options ``train`` parsed for the same run (same SFTConfig, same LoRA)."""
    import logging

    sys.path.insert(0, HERE)
    import bench_train
    from transformers import AutoProcessor, LlavaForConditionalGeneration
    from trl import SFTTrainer

    from llava_normaligned.commands.train import parse_train_args
    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.lora import stage2_lora_config
    from llava_normaligned.trainer.stages import freeze_for_stage
    from llava_normaligned.trainer.train import peak_memory

    logging.disable(logging.WARNING)
    config = parse_train_args(spec["argv"])
    args = dataclasses.replace(config.sft_args, assistant_only_loss=True, report_to=[])  # stock TRL's answer-only loss
    model_args = config.model_args
    model = LlavaForConditionalGeneration.from_pretrained(spec["model"], dtype=model_args.dtype,
                                                          attn_implementation=model_args.attn_implementation)
    peft_config = stage2_lora_config(model_args) if model_args.use_peft else None
    if peft_config is None:
        freeze_for_stage(model, spec["stage"])
    dataset = load_llava_json(*spec["data"])  # stage 1's rows all have an image, as LLaVA-558K's
    timer = bench_train.StepTimer("cuda" if torch.cuda.is_available() else "cpu")
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset,
                         processing_class=AutoProcessor.from_pretrained(spec["model"]), peft_config=peft_config,
                         callbacks=[timer.callback])
    trainer.train()
    with open(os.path.join(spec["out"], "stock.json"), "w", encoding="utf-8") as handle:
        json.dump({"steps": steps_from_history(timer.marks, trainer.state.log_history), "memory": peak_memory(),
                   "rows_per_step": args.per_device_train_batch_size}, handle)
    return 0


def zero2_step(opts, model: str, data, workdir: str, env: dict) -> dict:
    """``accelerate launch --config_file deepspeed_zero2.yaml --num_processes 1 -m llava_normaligned.cli train``
    (stage 1): the ZeRO-2 path of the recipes, at the shape."""
    out = os.path.join(workdir, "zero2")
    config = os.path.join(os.path.dirname(HERE), "trainer", "accelerate_configs", "deepspeed_zero2.yaml")
    argv = train_argv(opts, 1, model, data, out)
    for flag in ("--bf16", "--report_to"):  # precision from the launcher's --mixed_precision; no TensorBoard
        at = argv.index(flag)
        del argv[at:at + 2]
    started = time.perf_counter()
    code, tail, _ = run_child([sys.executable, "-m", "accelerate.commands.launch", "--config_file", config,
                            "--num_processes", "1", "--mixed_precision", "no" if opts.dtype == "float32" else "bf16",
                            "-m", "llava_normaligned.cli", "train", *argv], env)
    wall = time.perf_counter() - started
    if code != 0:
        return {"ok": False, "wall_s": wall, "error": tail}
    with open(os.path.join(out, "training_summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    return {"ok": True, "wall_s": wall, "engine": summary["training"]["engine"], "memory": summary["memory"],
            "train_runtime_s": summary["metrics"].get("train_runtime")}


# ------------------------------------------------------------------------------------------------ figures


def tokens_per_row(model: str, data, stage: int) -> float:
    """Mean tokens of the rows ``train`` keeps (images expanded): what a step of ``batch`` rows processes."""
    from transformers import AutoProcessor

    from llava_normaligned.trainer.data import load_llava_json
    from llava_normaligned.trainer.preprocess import prepare_dataset

    prepared, _ = prepare_dataset(load_llava_json(*data), AutoProcessor.from_pretrained(model), max_length=2048,
                                  drop_text_only=stage == 1)
    lengths = prepared["num_tokens"][:]
    return statistics.mean(lengths)


def step_flops(model: str, stage: int, tokens: float, rows: int, full: bool) -> float:
    """Model FLOPs of a step of ``rows`` rows of ``tokens`` tokens: forward, plus the backward (stage 1 and LoRA:
    input gradients through the LLM, 2 N a token; full stage 2: 4 N, the vision tower too); causal attention."""
    from transformers import AutoConfig

    from llava_normaligned.diagnostics.memory import pass_flops, pass_shape

    shape = pass_shape(AutoConfig.from_pretrained(model, trust_remote_code=True))
    tokens = round(tokens)
    forward = pass_flops(shape, tokens, scored=tokens, causal=True)
    vision = pass_flops(shape, 0, scored=0)
    llm = forward - vision
    backward = 2 * forward if full else llm
    return rows * (forward + backward)


def layers_that_fit(opts, budget: float) -> int:
    """The most decoder layers (vision layers in proportion) of the paper's widths whose runs fit ``budget`` seconds
    at this CPU's measured float32 matmul rate."""
    from llava_normaligned.diagnostics.memory import pass_flops, pass_shape, reference_config

    rate = machine.matmul_peak(torch.float32) * 1e9 * 0.5  # a training step reaches about half the GEMM peak
    runs = 3 * len(opts.stages) * (opts.warmup + opts.steps) * opts.batch_size
    for layers in range(28, 0, -1):
        config = reference_config(PAPER_SHAPE)
        config.text_config.num_hidden_layers = layers
        config.vision_config.num_hidden_layers = max(1, round(layers * 27 / 28))
        if 3 * pass_flops(pass_shape(config), 900, scored=900, causal=True) * runs / rate <= budget:
            return layers
    return 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tiny", action="store_true", help="tiny widths at the paper's 761 tokens (checks the code)")
    parser.add_argument("--layers", type=int, default=None, help="the paper's widths with this many LLM layers")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    parser.add_argument("--stage2", choices=["lora", "full"], default=None,
                        help="stage 2 fully or through LoRA (default: full on a GPU, LoRA on a CPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="rows per step (default: GPU 4, CPU 2)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per run (default: GPU 5, CPU 1)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rows", type=int, default=64, help="rows generated per stage")
    parser.add_argument("--budget", type=float, default=600, help="seconds, on a CPU without bf16 instructions")
    parser.add_argument("--attn-implementation", default=None, help="e.g. flash_attention_2 (default: sdpa)")
    parser.add_argument("--zero2", action="store_true",
                        help="also one single-process DeepSpeed ZeRO-2 run of `train` (stage 1; needs deepspeed)")
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS),
                        help="this package's runs beside stock's (default: all)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child-stock", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child_stock:
        return child_stock(json.loads(opts.child_stock))
    on_gpu = opts.device == "cuda"
    opts.stage2 = opts.stage2 or ("full" if on_gpu else "lora")
    opts.batch_size = opts.batch_size or (4 if on_gpu else 2)
    opts.steps = opts.steps or (5 if on_gpu else 1)
    about = machine.describe()
    opts.dtype = "bfloat16"
    if opts.tiny:
        opts.dtype = "float32"
    elif not on_gpu and not about["bf16_matmul_instructions"]:
        opts.dtype = "float32"
        opts.layers = opts.layers or layers_that_fit(opts, opts.budget)
        print(f"this CPU ({about['cpu']}) has no AMX or AVX512-BF16: bf16 at the paper's shape would take hours a step; "
              f"running its widths in float32 with {opts.layers} LLM layers instead (fits {opts.budget:.0f} s)")
    shape = "tiny widths" if opts.tiny else PAPER_SHAPE + (f", {opts.layers} LLM layers" if opts.layers else "")
    results = {"command": "python benchmarks/paper_scale.py " + " ".join(sys.argv[1:] if argv is None else argv),
               "options": {k: v for k, v in vars(opts).items() if k != "child_stock"}, "shape": shape,
               "machine": about, "stages": {}}
    if on_gpu:
        results["gpu"] = torch.cuda.get_device_name()
        peak = H200_BF16_DENSE_FLOPS
    else:
        peak = machine.matmul_peak(torch.bfloat16 if opts.dtype == "bfloat16" else torch.float32) * 1e9
        results["matmul_peak_gflops"] = peak / 1e9
    print(f"{shape}; {about['cpu']} ({', '.join(about['cpu_flags'])}); {opts.dtype}; peak {peak / 1e9:.0f} GFLOP/s",
          flush=True)
    # every run gets the same threads (stock TRL would take torch's default, `train` picks the free cores)
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", str(torch.get_num_threads())))
    results["threads"] = int(env["OMP_NUM_THREADS"])
    with tempfile.TemporaryDirectory() as workdir:
        env["HF_DATASETS_CACHE"] = os.path.join(workdir, "datasets_cache")
        os.environ["HF_DATASETS_CACHE"] = env["HF_DATASETS_CACHE"]
        started = time.perf_counter()
        ours, stock = build(opts, workdir)
        results["build_seconds"] = time.perf_counter() - started
        for stage in opts.stages:
            results["stages"][str(stage)] = run_stage(opts, stage, ours, stock, workdir, env, peak)
        if opts.zero2:
            results["zero2_single_process"] = zero2_step(opts, ours, write_rows(workdir, 1, opts.rows), workdir, env)
            print("ZeRO-2, one process:", {k: v for k, v in results["zero2_single_process"].items() if k != "error"})
    if not on_gpu:  # other work while the peak was measured only lowers it: measure again, keep the best
        again = machine.matmul_peak(torch.bfloat16 if opts.dtype == "bfloat16" else torch.float32) * 1e9
        results["matmul_peak_gflops_end"] = again / 1e9
        rescore(results, max(peak, again))
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    runs = [run for stage in results["stages"].values() for run in stage["runs"].values()]
    runs += [results["zero2_single_process"]] if opts.zero2 else []
    return 0 if all(run.get("ok") for run in runs) else 1


def rescore(results: dict, peak: float) -> None:
    """MFU of every run against ``peak`` FLOP/s (the best matmul rate measured in the run)."""
    results["matmul_peak_gflops"] = peak / 1e9
    for number, stage in results["stages"].items():
        for name, run in stage["runs"].items():
            if run.get("ok"):
                run["mfu"] = run["model_flops_per_s"] / peak
                print(f"stage {number} {name:22} MFU {run['mfu']:.1%} of {peak / 1e9:.0f} GFLOP/s", flush=True)


def run_stage(opts, stage: int, ours: str, stock: str, workdir: str, env: dict, peak: float) -> dict:
    from transformers import AutoConfig

    from llava_normaligned.diagnostics.memory import training_estimate

    data = write_rows(workdir, stage, opts.rows)
    tokens = tokens_per_row(ours, data, stage)
    full = stage == 2 and opts.stage2 == "full"
    estimate = training_estimate(AutoConfig.from_pretrained(ours, trust_remote_code=True), stage=stage,
                                 weight_dtype=opts.dtype, batch_size=opts.batch_size, sequence=round(tokens),
                                 lora_rank=LORA_RANK if stage == 2 and not full else None)
    entry = {"tokens_per_row": tokens, "estimate_gib": estimate.total_bytes / 2**30, "estimate": estimate.describe(),
             "how": "full" if stage == 1 or full else f"LoRA rank {LORA_RANK}", "runs": {}}
    print(f"stage {stage} ({entry['how']}), {tokens:.0f} tokens a row, {opts.batch_size} rows a step; memory "
          f"{estimate.describe()}", flush=True)
    for name in ("stock", *opts.runs):
        run = (run_stock(opts, stage, stock, data, workdir, env) if name == "stock"
               else run_train(opts, stage, name, ours, data, workdir, env))
        if run["ok"]:
            seconds = sum(t for t, _ in run["steps"]) or math.nan
            real = sum(n for _, n in run["steps"])
            step = seconds / len(run["steps"]) if run["steps"] else math.nan
            flops = step_flops(ours, stage, real / (opts.batch_size * len(run["steps"])), opts.batch_size, full)
            run.update(step_s=step, samples_per_s=opts.batch_size / step, real_tokens_per_s=real / seconds,
                       model_flops_per_s=flops / step, mfu=flops / step / peak)
            # what training needs: on a GPU its peak allocation; on a CPU the peak anonymous memory (tensors, heap),
            # without the checkpoint file's mapped pages that the resident size also counts while loading
            memory = run["memory"].get("peak_gpu_memory_gib" if opts.device == "cuda" else "peak_anonymous_gib")
            run["peak_memory_gib"] = memory
            print(f"  {name:22} {step:8.1f} s a step  {run['real_tokens_per_s']:.2f} real tokens/s  MFU "
                  f"{run['mfu']:.1%}  peak "
                  f"{memory:.1f} GiB (estimate {entry['estimate_gib']:.1f}; resident "
                  f"{run['memory']['peak_rss_gib']:.1f})", flush=True)
        else:
            print(f"  {name:22} failed:\n{run['error'][-2000:]}", flush=True)
        entry["runs"][name] = run
    runs = entry["runs"]
    if all(runs[n].get("ok") for n in runs):  # real tokens/s: the runs' steps hold different rows
        for name in opts.runs:
            entry[f"{name}_vs_stock"] = runs[name]["real_tokens_per_s"] / runs["stock"]["real_tokens_per_s"]
    return entry


if __name__ == "__main__":
    raise SystemExit(main())
