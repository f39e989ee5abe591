"""Stage-2 throughput on mix665k-shaped rows: real (non-pad) tokens per second and the padding fraction of stock TRL
on stock LLaVA against this package padded, length-grouped, padding-free, and both, in one run.

    python benchmarks/bench_throughput.py --json benchmarks/results/bench_throughput_cpu.json
    python benchmarks/bench_throughput.py --shape tiny --steps 1 --repeats 1      # the same code in a minute
    python benchmarks/bench_throughput.py --family qwen2_5_vl --json ...         # another family's rows

``--family`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, SmolVLM): that family's stock model at the shape
(``family_shapes.build_family``: about 729 image tokens an image, SmolVLM 612 in 17 tiles), trained by stock TRL and
by ``train``'s path alike from the same weights, its processor built as ``train`` builds it (without torchvision);
the rows are the same mix665k-shaped ones, laid out by the family's processor and chat template.

The rows (``scale_data.mix_rows``) follow llava_v1_5_mix665k's sources in its proportions: LLaVA-Instruct
conversations (1-6 turns) and long descriptions, multi-round short-answer VQA (1-10 questions on one image),
region descriptions, and ~6% text-only ShareGPT conversations whose answer lengths are lognormal (a long tail,
some beyond the recipe's 2,048-token ``max_length``, which drops them as ``train`` does; every run gets the same
kept rows). Each image row holds 729 image tokens (SigLIP-SO400M-384's: 384 px, patch 14), so a row is 729 tokens
plus its text. The tokenizer is ``scale_data.word_tokenizer``: the generated text's words are single tokens, as
common English words are in Llama's vocabulary, and its ChatML template marks the answers, as TRL's
``assistant_only_loss`` needs.

The runs, all stage 2 with the paper's global batch of 128 (``--batch-size`` per device x ``--accumulation``):

* ``stock``: TRL's ``SFTTrainer`` as shipped (its collator, ``assistant_only_loss``) on a stock
  ``LlavaForConditionalGeneration`` with the same weights: padded batches in random order;
* ``padded``: ``train_stage``, padded batches in random order;
* ``grouped``: ``--train_sampling_strategy group_by_modality_length``;
* ``padding_free``: ``--padding_free True``, random order;
* ``grouped_padding_free``: both.

Every run times its optimizer steps after ``--warmup`` (data loading included) and counts the tokens of the
micro-batches those steps trained on, as the trainer received them: real tokens (attention mask, or the packed
length) and computed positions (the batch's shape). The runs are interleaved, ``--repeats`` times, each from the
same saved weights. ``mfu`` is the model FLOPs of the real rows per second (``diagnostics.memory.pass_flops`` with
causal attention within each row, x3 for forward and backward, the LM head at the scored positions only) over the
machine's matmul peak in the same dtype, measured in the same run (``machine.matmul_peak``). Goals: grouped + padding-free >= 1.4x stock's real tokens/s, padding-free >= 1.1x grouped
alone, padding fraction <= 3%.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_train  # noqa: E402  (the step timer)
import family_shapes  # noqa: E402
import machine  # noqa: E402
import scale_data  # noqa: E402

# LLM width, layers, heads, KV heads, MLP width; the vision tower: SigLIP at 384 px, patch 14 (729 tokens)
SHAPES = {
    "tiny": {"text": (128, 2, 4, 2, 256), "vision": (32, 1, 2, 64)},
    "small": {"text": (512, 4, 8, 4, 1408), "vision": (128, 2, 4, 256)},
    "medium": {"text": (1024, 8, 16, 8, 2816), "vision": (256, 4, 4, 1024)},
}
RUNS = {
    "padded": {"train_sampling_strategy": "random", "padding_free": False},
    "grouped": {"train_sampling_strategy": "group_by_modality_length", "padding_free": False},
    "padding_free": {"train_sampling_strategy": "random", "padding_free": True},
    "grouped_padding_free": {"train_sampling_strategy": "group_by_modality_length", "padding_free": True},
}
MAX_LENGTH = 2048  # LLaVA-1.5's model_max_length (the recipes')


def build(shape: str, workdir: str, dtype, family: str = "llava") -> tuple[str, str]:
    """(norm-aligned folder, stock LLaVA folder) with the same weights, composed from parts built here; for another
    family its stock model at the shape (``family_shapes``), which both runs train."""
    from llava_normaligned.compose import compose, save, stock_llava_like
    from llava_normaligned.tiny import TinyTextSpec, TinyVisionSpec, tiny_text_model, tiny_vision_model

    if family != "llava":
        folder = family_shapes.build_family(family, SHAPES[shape]["text"], SHAPES[shape]["vision"],
                                            scale_data.bench_words(), os.path.join(workdir, family))
        return folder, folder
    width, layers, heads, kv_heads, mlp = SHAPES[shape]["text"]
    v_width, v_layers, v_heads, v_mlp = SHAPES[shape]["vision"]
    tokenizer = scale_data.word_tokenizer()
    vision, image_processor = tiny_vision_model(TinyVisionSpec(
        hidden_size=v_width, intermediate_size=v_mlp, num_hidden_layers=v_layers, num_attention_heads=v_heads,
        image_size=384, patch_size=14))
    lm = tiny_text_model(tokenizer, TinyTextSpec(hidden_size=width, intermediate_size=mlp, num_hidden_layers=layers,
                                                 num_attention_heads=heads, num_key_value_heads=kv_heads,
                                                 max_position_embeddings=4096))
    parts = os.path.join(workdir, "parts")
    for folder, model, extra in ((os.path.join(parts, "vision"), vision, image_processor),
                                 (os.path.join(parts, "text"), lm, tokenizer)):
        model.save_pretrained(folder)
        extra.save_pretrained(folder)
    model, processor = compose(os.path.join(parts, "vision"), os.path.join(parts, "text"), dtype=dtype)
    ours, stock = os.path.join(workdir, "ours"), os.path.join(workdir, "stock")
    save(model, processor, ours)
    stock_llava_like(model).save_pretrained(stock)
    processor.save_pretrained(stock)
    return ours, stock


def rows(workdir: str, n_rows: int, seed: int):
    """The mix665k-shaped rows ``train`` keeps at ``max_length`` 2,048 (LLaVA JSON -> messages + images)."""
    from llava_normaligned.trainer.data import load_llava_json

    folder = os.path.join(workdir, "data")
    data = scale_data.mix_rows(n_rows, seed)
    scale_data.write_images(data, os.path.join(folder, "images"))
    path = scale_data.write_json(data, os.path.join(folder, "mix.json"))
    return load_llava_json(path, os.path.join(folder, "images"))


class TokenCounter:
    """The trainer's collator, recording for each micro-batch it makes (in the order the trainer consumes them) its
    rows' lengths as the batch holds them (the attention mask's, or where a packed row's positions restart: not the
    prepared rows' ``num_tokens``, an estimate), whether each has an image, the positions computed and the positions
    scored (labels)."""

    def __init__(self, collator):
        self.collator, self.batches = collator, []

    def __getattr__(self, name):
        return getattr(self.collator, name)

    def __call__(self, features):
        from llava_normaligned.trainer.padding_free import row_bounds

        batch = self.collator(features)
        if batch.get("attention_mask") is None:  # a packed batch: its rows are where the positions restart
            lengths = [end - start for start, end in row_bounds(batch["position_ids"])]
        else:  # padded (this package's collator or TRL's, right or left): the tokens the mask keeps
            lengths = batch["attention_mask"].sum(dim=1).tolist()
        images = [bool(f.get("num_images", len(f.get("images") or []))) for f in features]
        self.batches.append({"lengths": lengths, "images": images, "positions": int(batch["input_ids"].numel()),
                             "scored": int((batch["labels"][..., 1:] != -100).sum())})
        return batch


def sft_args(output_dir: str, opts, **extra):
    from trl import SFTConfig

    return SFTConfig(
        output_dir=output_dir, use_cpu=True, bf16=opts.dtype == "bfloat16", fp16=False, gradient_checkpointing=False,
        report_to=[], save_strategy="no", logging_steps=10_000, disable_tqdm=True, seed=opts.seed,
        max_steps=opts.warmup + opts.steps, per_device_train_batch_size=opts.batch_size,
        gradient_accumulation_steps=opts.accumulation, learning_rate=1e-5, dataloader_num_workers=0,
        max_length=MAX_LENGTH, **extra)


def load(folder: str):
    """The model and processor of ``folder`` as ``train`` loads them (the family's processor built without
    torchvision where transformers' needs it), in float32."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from llava_normaligned.families.processors import load_processor

    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32, trust_remote_code=True)
    return model, load_processor(folder, config, trust_remote_code=True)


def run_ours(name: str, folder: str, dataset, opts, workdir: str) -> dict:
    from llava_normaligned.trainer.train import StageConfig, prepare_stage, run_stage

    model, processor = load(folder)
    timer = bench_train.StepTimer("cpu")
    prepared = prepare_stage(model, processor, dataset,
                             args=sft_args(os.path.join(workdir, name), opts, **RUNS[name]),
                             stage=StageConfig(2, save_final=False), callbacks=[timer.callback])
    prepared.trainer.data_collator = counter = TokenCounter(prepared.trainer.data_collator)
    run_stage(prepared)
    return measured(timer, counter, opts)


def run_stock(folder: str, dataset, opts, workdir: str) -> dict:
    from llava_normaligned.trainer.stages import freeze_for_stage
    from trl import SFTTrainer

    model, processor = load(folder)
    freeze_for_stage(model, 2)
    timer = bench_train.StepTimer("cpu")
    trainer = SFTTrainer(model=model, args=sft_args(os.path.join(workdir, "stock"), opts, assistant_only_loss=True),
                         train_dataset=dataset, processing_class=processor,
                         callbacks=[timer.callback])
    trainer.data_collator = counter = TokenCounter(trainer.data_collator)
    trainer.train()
    return measured(timer, counter, opts)


def measured(timer, counter: TokenCounter, opts) -> dict:
    """Seconds and tokens of the timed steps: their micro-batches are the ones after the warm-up's, in the order the
    collator made them (the loader fetches one batch ahead; that one is never trained on)."""
    seconds = timer.step_times(opts.warmup)
    first = opts.warmup * opts.accumulation
    timed = counter.batches[first:first + opts.steps * opts.accumulation]
    return {"seconds": sum(seconds), "step_seconds": seconds,
            "real_tokens": sum(sum(b["lengths"]) for b in timed), "positions": sum(b["positions"] for b in timed),
            "scored": sum(b["scored"] for b in timed), "lengths": [n for b in timed for n in b["lengths"]],
            "images": [i for b in timed for i in b["images"]]}


def model_flops(shape, run: dict) -> float:
    """Training FLOPs of a run's real rows: 3 forward passes' worth (forward, then backward through activations
    and weights; every part trains in stage 2), causal attention within each row, the LM head at the scored
    positions only (TRL's fused head computes no others)."""
    from llava_normaligned.diagnostics.memory import pass_flops

    body = sum(pass_flops(shape, n, with_image=image, scored=0, causal=True)
               for n, image in zip(run["lengths"], run["images"]))
    return 3 * (body + 2.0 * shape.vocab_size * shape.hidden_size * run["scored"])


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="small", choices=sorted(SHAPES))
    parser.add_argument("--family", default="llava", choices=["llava", *family_shapes.FAMILIES],
                        help="llava: this package's model against stock LLaVA with the same weights; another family: "
                             "its stock model at the shape (family_shapes), trained by both")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="bfloat16: mixed precision (autocast), peak measured in bf16")
    parser.add_argument("--rows", type=int, default=3000, help="mix665k-shaped rows generated (before max_length)")
    parser.add_argument("--batch-size", type=int, default=8, help="per-device micro-batch")
    parser.add_argument("--accumulation", type=int, default=16, help="micro-batches per optimizer step")
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="runs per configuration, interleaved")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", nargs="+", default=["stock", *RUNS], choices=["stock", *RUNS],
                        help="the configurations to run (stock is always among them: the ratios are to it)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    import datasets

    opts = make_parser().parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    logging.disable(logging.WARNING)
    datasets.disable_progress_bars()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dtype = torch.bfloat16 if opts.dtype == "bfloat16" else torch.float32
    started = time.perf_counter()
    results = {"command": "python benchmarks/bench_throughput.py " + " ".join(argv if argv is not None
                                                                              else sys.argv[1:]),
               "options": vars(opts), "machine": machine.describe()}
    print(f"{results['machine']['cpu']} ({', '.join(results['machine']['cpu_flags'])}), torch kernels "
          f"{results['machine']['torch_cpu_capability']}, {torch.get_num_threads()} threads, load "
          f"{results['machine']['load_average'][0]:.2f}", flush=True)
    peak = machine.matmul_peak(dtype)
    results["matmul_peak_gflops"] = peak
    print(f"matmul peak ({opts.dtype}, 2048^3): {peak:.1f} GFLOP/s", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        os.environ["HF_DATASETS_CACHE"] = os.path.join(workdir, "datasets_cache")
        ours, stock = build(opts.shape, workdir, dtype, opts.family)
        dataset = rows(workdir, opts.rows, opts.seed)
        from llava_normaligned.trainer.preprocess import prepare_dataset

        prepared, report = prepare_dataset(dataset, load(ours)[1], max_length=MAX_LENGTH)
        kept = set(prepared["id"])
        dataset = dataset.filter(lambda row: row["id"] in kept)  # the stock run gets the rows `train` keeps
        lengths = prepared["num_tokens"][:]
        results["data"] = {"rows": len(dataset), "dropped_too_long": report.too_long_dropped,
                           "text_only_rows": report.text_only_rows, "tokens_mean": statistics.mean(lengths),
                           "tokens_median": statistics.median(lengths), "tokens_max": max(lengths),
                           "rows_per_step": opts.batch_size * opts.accumulation}
        print(f"{len(dataset)} rows ({report.text_only_rows} text-only; {report.too_long_dropped} longer than "
              f"{MAX_LENGTH} dropped), tokens per row mean {results['data']['tokens_mean']:.0f}, median "
              f"{results['data']['tokens_median']:.0f}, max {max(lengths)}", flush=True)
        names = ["stock", *[name for name in RUNS if name in opts.runs]]
        runs = {name: [] for name in names}
        for repeat in range(opts.repeats):
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                try:
                    with contextlib.redirect_stdout(io.StringIO()):
                        result = (run_stock(stock, dataset, opts, workdir) if name == "stock"
                                  else run_ours(name, ours, dataset, opts, workdir))
                except Exception as error:  # noqa: BLE001  (stock TRL on another family: recorded, the rest runs)
                    if name != "stock" or opts.family == "llava":
                        raise
                    failed = f"{type(error).__name__}: {str(error).splitlines()[0]}"
                    results.setdefault("failed", {})[name] = failed
                    print(f"  {name:22} failed: {failed}", flush=True)
                    continue
                runs[name].append(result)
                print(f"  {name:22} {result['real_tokens'] / result['seconds']:9.0f} real tokens/s, padding "
                      f"{1 - result['real_tokens'] / result['positions']:.1%} ({result['seconds']:.1f} s)", flush=True)
                gc.collect()
        results["runs"] = summarize({name: done for name, done in runs.items() if done}, ours, peak,
                                    with_flops=opts.family == "llava")
    results["wall_seconds"] = time.perf_counter() - started
    results["load_average_end"] = list(os.getloadavg())
    report_lines(results)
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
    return 0


def summarize(runs: dict, folder: str, peak: float, with_flops: bool = True) -> dict:
    """Per configuration, over all its timed steps: real tokens/s, padding fraction, model GFLOP/s and MFU (LLaVA
    only: ``pass_flops`` counts one fixed-size image per row, where the families' processors tile or grid); the
    ratios to stock and to grouped alone."""
    from transformers import AutoConfig

    from llava_normaligned.diagnostics.memory import pass_shape

    shape = pass_shape(AutoConfig.from_pretrained(folder, trust_remote_code=True))
    out = {}
    for name, results in runs.items():
        seconds = sum(r["seconds"] for r in results)
        real = sum(r["real_tokens"] for r in results)
        positions = sum(r["positions"] for r in results)
        flops = sum(model_flops(shape, r) for r in results) if with_flops else None
        out[name] = {"real_tokens_per_s": real / seconds, "padding_fraction": 1 - real / positions,
                     "seconds": seconds, "real_tokens": real, "positions": positions,
                     "model_gflops_per_s": flops / seconds / 1e9 if flops else None,
                     "mfu": flops / seconds / 1e9 / peak if flops else None,
                     "per_run_real_tokens_per_s": [r["real_tokens"] / r["seconds"] for r in results],
                     "per_run_padding_fraction": [1 - r["real_tokens"] / r["positions"] for r in results]}
    for name, entry in out.items():
        if "stock" in out:  # stock TRL may fail on another family's rows (the record's "failed" says why)
            entry["vs_stock"] = entry["real_tokens_per_s"] / out["stock"]["real_tokens_per_s"]
        if "padded" in out:
            entry["vs_padded"] = entry["real_tokens_per_s"] / out["padded"]["real_tokens_per_s"]
        if "padding_free" in name and "grouped" in out:
            entry["vs_grouped"] = entry["real_tokens_per_s"] / out["grouped"]["real_tokens_per_s"]
    return out


def report_lines(results: dict) -> None:
    runs = results["runs"]
    print(f"\n{results['options']['family']}, {results['options']['shape']} shape")
    print(f"{'run':24}{'real tokens/s':>15}{'padding':>10}{'MFU':>8}{'vs stock':>10}{'vs padded':>11}"
          f"{'vs grouped':>12}")
    for name, entry in runs.items():
        mfu = "-" if entry["mfu"] is None else f"{entry['mfu']:.1%}"
        vs_stock = f"{entry['vs_stock']:9.2f}x" if "vs_stock" in entry else f"{'-':>10}"
        vs_padded = f"{entry['vs_padded']:10.2f}x" if "vs_padded" in entry else f"{'-':>11}"
        print(f"{name:24}{entry['real_tokens_per_s']:15.0f}{entry['padding_fraction']:10.1%}{mfu:>8}"
              f"{vs_stock}{vs_padded}" + (f"{entry['vs_grouped']:11.2f}x" if "vs_grouped" in entry else ""))
    for name, why in results.get("failed", {}).items():
        print(f"{name}: failed: {why}")
    if not {"grouped", "padding_free", "grouped_padding_free"} <= set(runs):
        print(f"wall {results['wall_seconds']:.0f} s")
        return
    both = runs["grouped_padding_free"]
    print(f"goals: grouped + padding-free {both['vs_stock']:.2f}x stock (>= 1.4x), padding-free "
          f"{runs['padding_free']['vs_grouped']:.2f}x grouped (>= 1.1x), padding fraction grouped "
          f"{runs['grouped']['padding_fraction']:.1%} / grouped + padding-free {both['padding_fraction']:.1%} "
          f"(<= 3%); wall {results['wall_seconds']:.0f} s")


if __name__ == "__main__":
    raise SystemExit(main())
