"""Stage-1 and stage-2 steps at the paper's 3.65B shape (SigLIP-SO400M-384 + Llama-3.2-3B, 729 image tokens) on one
GPU in bf16: samples/s and MFU of this package (``train_stage``) against stock TRL on a stock LLaVA with the same
freezing and weights (``bench_train.run_stock``), peak GPU memory against the README's estimate, and one ZeRO-2 run
of ``llava-normaligned train`` in a single process (``trainer/accelerate_configs/deepspeed_zero2.yaml``).

    python benchmarks/gpu_paper_scale.py --device cuda --json benchmarks/results/gpu_paper_scale_h200.json
    python benchmarks/gpu_paper_scale.py --tiny          # CPU, tiny widths: the same code end to end

Weights are random (built from the shape, nothing is downloaded); throughput does not depend on them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_train  # noqa: E402  (the stock baseline and the timing harness)

PAPER_SHAPE = "SigLIP-so400m-384 + Llama-3.2-3B (paper)"  # diagnostics/memory.py's reference architectures
H200_BF16_DENSE_FLOPS = 989e12  # NVIDIA's figure for H100/H200 SXM, dense bf16


def paper_parts(device: str, dtype):
    """(vision config, vision tower, LLM, tokenizer, image processor) at the paper's shape, random weights."""
    from llava_normaligned.diagnostics.memory import reference_config
    from llava_normaligned.tiny import train_tokenizer
    from transformers import AutoModelForCausalLM, SiglipImageProcessor, SiglipVisionModel

    config = reference_config(PAPER_SHAPE)
    with torch.device(device):
        vision_tower = SiglipVisionModel(config.vision_config).to(dtype)
        llm = AutoModelForCausalLM.from_config(config.text_config, dtype=dtype)
    image_processor = SiglipImageProcessor(size={"height": 384, "width": 384}, image_mean=[0.5] * 3,
                                           image_std=[0.5] * 3)
    return config.vision_config, vision_tower, llm, train_tokenizer(), image_processor


def build(opts, workdir):
    """(norm-aligned model, stock LLaVA with its weights, processor, image size)."""
    from llava_normaligned.compose import compose_parts, stock_llava_like

    if opts.tiny:
        model, stock, processor = bench_train.build_models("small", workdir)
        return model, stock, processor, bench_train.SIZES["small"]["vision"]["image_size"]
    dtype = torch.bfloat16
    parts = paper_parts(opts.device, dtype)
    model, processor = compose_parts(*parts, vision_name="siglip-so400m-patch14-384 (random)",
                                     text_name="Llama-3.2-3B (random)", dtype=dtype)
    return model, stock_llava_like(model), processor, 384


def flops_per_sample(model, tokens: float, stage: int) -> float:
    """Model FLOPs of one training sample: 2 N per token forward; backward 2 N per token for activation gradients
    through the LLM (stage 1: its weights are frozen, the vision tower gets no backward) or 4 N for everything."""
    vision = sum(p.numel() for p in model.model.vision_tower.parameters())
    llm = sum(p.numel() for p in model.model.language_model.parameters()) + model.lm_head.weight.numel()
    image_tokens = model.config.image_seq_length
    if stage == 1:
        return 2 * vision * image_tokens + 4 * llm * tokens
    return 6 * (vision * image_tokens + llm * tokens)


def zero2_step(opts, model, processor, workdir, data_path) -> dict:
    """``accelerate launch --config_file deepspeed_zero2.yaml --num_processes 1 -m llava_normaligned.cli train``."""
    from llava_normaligned.compose import save

    folder = os.path.join(workdir, "model")
    save(model, processor, folder)
    out = os.path.join(workdir, "zero2")
    config = os.path.join(os.path.dirname(__file__), os.pardir, "trainer", "accelerate_configs",
                          "deepspeed_zero2.yaml")
    steps = opts.warmup + opts.steps
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, "--num_processes", "1",
               "--mixed_precision", "no" if opts.tiny else "bf16", "-m", "llava_normaligned.cli", "train",
               "--stage", "1", "--model", folder, "--data-path", data_path,
               "--image-folder", os.path.join(os.path.dirname(data_path), "images"), "--output-dir", out,
               "--max_steps", str(steps), "--per_device_train_batch_size", str(opts.batch_size),
               "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "True", "--learning_rate", "1e-3"]
    started = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
    wall = time.perf_counter() - started
    if run.returncode != 0:
        return {"ok": False, "wall_s": wall, "error": (run.stdout + run.stderr)[-3000:]}
    with open(os.path.join(out, "training_summary.json")) as handle:
        summary = json.load(handle)
    return {"ok": True, "wall_s": wall, "engine": summary["training"]["engine"], "steps": steps,
            "train_samples_per_second": summary["metrics"].get("train_samples_per_second"),
            "train_runtime_s": summary["metrics"].get("train_runtime")}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="CPU, float32, tiny widths (checks the script runs)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    parser.add_argument("--no-zero2", dest="zero2", action="store_false")
    parser.add_argument("--json", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    import datasets
    from llava_normaligned.diagnostics.memory import estimate
    from llava_normaligned.trainer.data import load_llava_json

    opts = make_parser().parse_args(argv)
    if opts.tiny:
        opts.device = "cpu"
    opts.dtype = "float32" if opts.tiny else "bfloat16"  # read by bench_train.sft_config
    opts.repeats = 1
    logging.disable(logging.WARNING)
    datasets.disable_progress_bars()
    on_gpu = opts.device != "cpu"
    results = {"options": vars(opts), "shape": "tiny" if opts.tiny else PAPER_SHAPE, "stages": {}}
    if on_gpu:
        results["gpu"] = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as workdir:
        model, stock, processor, image_size = build(opts, workdir)
        parameters = sum(p.numel() for p in model.parameters())
        rows = opts.batch_size * (opts.warmup + opts.steps)
        data_path = bench_train.write_data(os.path.join(workdir, "data"), rows, image_size)
        dataset = load_llava_json(data_path, os.path.join(workdir, "data", "images"))
        tokens, _, _ = bench_train.tokens_per_sample(processor, dataset)
        guess = estimate(model.config, "bfloat16" if not opts.tiny else "float32", opts.batch_size,
                         parameters=parameters)
        results.update(parameters=parameters, tokens_per_sample=tokens, image_tokens=model.config.image_seq_length,
                       readme_estimate_gib=guess.total_bytes / 2**30)
        print(f"{results['shape']}: {parameters / 1e9:.2f}B parameters, {model.config.image_seq_length} image "
              f"tokens, {tokens:.0f} tokens per sample; memory estimate {guess.describe()}")
        for stage in opts.stages:
            entry = {}
            for name, run, net in (("norm-aligned", bench_train.run_norm_aligned, model),
                                   ("stock", bench_train.run_stock, stock)):
                net.to(opts.device)
                if on_gpu:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                times = run(net, processor, dataset, stage, opts, workdir)
                step = sorted(times)[len(times) // 2]
                rate = opts.batch_size / step
                flops = flops_per_sample(model, tokens, stage) * rate
                entry[name] = {"median_step_s": step, "samples_per_s": rate, "model_flops_per_s": flops,
                               "mfu": flops / H200_BF16_DENSE_FLOPS if on_gpu else None,
                               "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None}
                net.to("cpu")
                print(f"stage {stage} {name:13} {rate:8.2f} samples/s  step {step * 1e3:8.1f} ms"
                      + (f"  MFU {entry[name]['mfu']:.1%}  peak {entry[name]['peak_gpu_memory_gib']:.1f} GiB"
                         if on_gpu else ""))
            entry["ratio_vs_stock"] = entry["norm-aligned"]["samples_per_s"] / entry["stock"]["samples_per_s"]
            results["stages"][stage] = entry
        del stock
        if opts.zero2:
            results["zero2_single_process"] = zero2_step(opts, model, processor, workdir, data_path)
            print("ZeRO-2, one process:", {k: v for k, v in results["zero2_single_process"].items() if k != "error"})
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0 if results.get("zero2_single_process", {"ok": True})["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
