"""Training throughput of stage 1 and stage 2: this package's pipeline against stock TRL with stock LLaVA.

    python benchmarks/bench_train.py                                   # CPU, float32, small config
    python benchmarks/bench_train.py --device cuda --dtype bfloat16 --size medium

For each stage, two runs of TRL's SFTTrainer with the same freezing, batch, data and step count, interleaved
(``--repeats`` times, alternating which goes first), each timed per optimizer step after ``--warmup`` steps:

* ``norm-aligned``: ``train_stage`` (LlavaNormAlignedForConditionalGeneration with LayerNorm + GWC, this package's
  answer-only collator, per-part learning rates, norm tracking);
* ``stock``: ``trl.SFTTrainer`` as shipped (its own collator with ``assistant_only_loss``) on a stock
  ``LlavaForConditionalGeneration`` with the same weights (minus the norm).

It prints samples/s and tokens/s (medians over the runs) and their ratio (goal: >= 1.0x in both stages), the share
of step time spent in data collation, the vision tower, the projector, the LLM (with LM head and loss) and the
optimizer (hooks on a separate, synchronised pass), and checks that stage 1 builds no autograd graph through the
frozen vision tower and gives a gradient to the projector's tensors only. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import random
import statistics
import tempfile
import time
from collections import defaultdict

import torch

SIZES = {
    # vision: width, layers, heads, image size, patch -> (image / patch)^2 image tokens; text: width, layers, heads
    "small": {
        "vision": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                   "image_size": 64, "patch_size": 8},
        "text": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
                 "num_key_value_heads": 4},
    },
    "medium": {
        "vision": {"hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 6, "num_attention_heads": 6,
                   "image_size": 224, "patch_size": 14},
        "text": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
                 "num_key_value_heads": 8},
    },
}


# ------------------------------------------------------------------------------------------------ set-up


def build_models(size: str, workdir: str):
    """(norm-aligned model, stock LLaVA with the same weights, processor), composed from tiny parts built here."""
    from llava_normaligned.compose import compose, stock_llava_like
    from llava_normaligned.tiny import TinyTextSpec, TinyVisionSpec, save_tiny_parts

    spec = SIZES[size]
    parts = save_tiny_parts(os.path.join(workdir, "parts"), vision=TinyVisionSpec(**spec["vision"]),
                            text=TinyTextSpec(**spec["text"]))
    model, processor = compose(*parts)
    return model, stock_llava_like(model), processor


def write_data(folder: str, rows: int, image_size: int, seed: int = 0) -> str:
    """LLaVA JSON rows about images with one coloured rectangle (a third of them two-turn)."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    colours = {"red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 30, 220), "yellow": (230, 210, 30)}
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    out = []
    for i in range(rows):
        name = rng.choice(list(colours))
        image = Image.new("RGB", (image_size, image_size), (245, 245, 245))
        x, y = rng.randrange(image_size // 2), rng.randrange(image_size // 2)
        ImageDraw.Draw(image).rectangle([x, y, x + image_size // 3, y + image_size // 3], fill=colours[name])
        image.save(os.path.join(folder, "images", f"{i}.png"))
        turns = [{"from": "human", "value": "<image>\nwhat colour is the shape ?"}, {"from": "gpt", "value": name}]
        if i % 3 == 0:
            turns += [{"from": "human", "value": "is there a circle ?"}, {"from": "gpt", "value": "no"}]
        out.append({"id": str(i), "image": f"{i}.png", "conversations": turns})
    path = os.path.join(folder, "data.json")
    with open(path, "w") as handle:
        json.dump(out, handle)
    return path


def sft_config(output_dir: str, opts, stage: int, **extra):
    from trl import SFTConfig

    on_gpu = opts.device != "cpu"
    return SFTConfig(
        output_dir=output_dir, use_cpu=not on_gpu, bf16=opts.dtype == "bfloat16", fp16=False,
        gradient_checkpointing=False, report_to=[], save_strategy="no", logging_steps=10_000, disable_tqdm=True,
        max_steps=opts.warmup + opts.steps, per_device_train_batch_size=opts.batch_size, seed=0,
        learning_rate=1e-3 if stage == 1 else 1e-5, dataloader_num_workers=0, max_length=None, **extra,
    )


class StepTimer:
    """TrainerCallback recording the wall time of every optimizer step (data loading included)."""

    def __init__(self, device: str):
        from transformers import TrainerCallback

        self.device = device
        self.marks = []
        timer = self

        class _Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                timer.mark()

            def on_train_begin(self, args, state, control, **kwargs):
                timer.mark()

        self.callback = _Callback()

    def mark(self):
        if self.device != "cpu":
            torch.cuda.synchronize()
        self.marks.append(time.perf_counter())

    def step_times(self, warmup: int) -> list[float]:
        deltas = [b - a for a, b in zip(self.marks, self.marks[1:])]
        return deltas[warmup:]


# ------------------------------------------------------------------------------------------------ the runs


def run_norm_aligned(model, processor, dataset, stage, opts, workdir):
    from llava_normaligned.trainer.train import StageConfig, train_stage

    timer = StepTimer(opts.device)
    train_stage(model, processor, dataset, args=sft_config(os.path.join(workdir, "na"), opts, stage),
                stage=StageConfig(stage, save_final=False), callbacks=[timer.callback])
    return timer.step_times(opts.warmup)


def run_stock(stock, processor, dataset, stage, opts, workdir):
    from trl import SFTTrainer

    from llava_normaligned.trainer.stages import freeze_for_stage

    freeze_for_stage(stock, stage)  # the same freezing; everything else is TRL as shipped
    timer = StepTimer(opts.device)
    args = sft_config(os.path.join(workdir, "stock"), opts, stage, assistant_only_loss=True)
    trainer = SFTTrainer(model=stock, args=args, train_dataset=dataset, processing_class=processor,
                         callbacks=[timer.callback])
    trainer.train()
    return timer.step_times(opts.warmup)


def tokens_per_sample(processor, dataset):
    """(mean tokens per sample, the answer-only collator, the prepared rows)."""
    from llava_normaligned.trainer.collator import LlavaTrainingCollator
    from llava_normaligned.trainer.preprocess import prepare_dataset

    prepared, _ = prepare_dataset(dataset, processor, max_length=None)
    lengths = prepared["num_tokens"]
    return sum(lengths) / len(lengths), LlavaTrainingCollator(processor), prepared


# --------------------------------------------------------------------------- where a step's time goes


class ComponentClock:
    """Forward hooks time each part's forward; gradient hooks on the tensors between the parts time the backward:
    LLM (+ LM head + loss) from the start of backward to the gradient at its input embeddings, projector from the
    gradient at its output to the gradient at its input, vision tower from there to the end."""

    def __init__(self, model, device):
        self.device = device
        self.base = model.model
        self.forward = defaultdict(float)
        self.marks = {}
        self._start = {}
        self._hooks = []
        for name, module in (("vision_tower", self.base.vision_tower), ("projector", self.base.multi_modal_projector),
                             ("llm", self.base.language_model)):
            self._hooks.append(module.register_forward_pre_hook(self._pre(name)))
            self._hooks.append(module.register_forward_hook(self._post(name)))
        self._hooks.append(self.base.language_model.register_forward_pre_hook(self._llm_input, with_kwargs=True))
        self._hooks.append(self.base.multi_modal_projector.register_forward_hook(self._projector_io))

    def now(self):
        if self.device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter()

    def _pre(self, name):
        return lambda module, args: self._start.__setitem__(name, self.now())

    def _post(self, name):
        def hook(module, args, output):
            self.forward[name] += self.now() - self._start[name]
        return hook

    def _mark(self, key):
        def hook(grad):
            self.marks.setdefault(key, self.now())
        return hook

    def _llm_input(self, module, args, kwargs):
        embeds = kwargs.get("inputs_embeds")
        if embeds is not None and embeds.requires_grad:
            embeds.register_hook(self._mark("llm_input_grad"))

    def _projector_io(self, module, args, output):
        if output.requires_grad:
            output.register_hook(self._mark("projector_output_grad"))
        if args and args[0].requires_grad:
            args[0].register_hook(self._mark("projector_input_grad"))

    def remove(self):
        for hook in self._hooks:
            hook.remove()


def component_shares(model, collator, rows, stage, opts) -> dict[str, float]:
    from llava_normaligned.trainer.skip_unread_layers import skip_unused_vision_compute
    from llava_normaligned.trainer.stages import freeze_for_stage

    freeze_for_stage(model, stage)
    model.train()
    device = torch.device(opts.device)
    model.to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    clock = ComponentClock(model, opts.device)
    totals = defaultdict(float)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=opts.dtype == "bfloat16")
    n = opts.warmup + opts.steps
    with skip_unused_vision_compute(model):  # as train_stage runs it
        for step in range(n):
            _timed_step(model, collator, rows, step, opts, clock, optimizer, autocast, device, totals)
    clock.remove()
    step = totals.pop("step")
    shares = {k: v / step for k, v in totals.items()}
    shares["other"] = 1.0 - sum(shares.values())
    return shares


def _timed_step(model, collator, rows, step, opts, clock, optimizer, autocast, device, totals) -> None:
    """One hooked training step; after the warm-up, its time is added to ``totals`` part by part."""
    start = clock.now()
    batch = collator(rows[step * opts.batch_size:(step + 1) * opts.batch_size])
    batch = {k: v.to(device) for k, v in batch.items()}
    collated = clock.now()
    clock.forward.clear()
    clock.marks.clear()
    with autocast:
        loss = model(**batch).loss
    backward_start = clock.now()
    loss.backward()
    backward_end = clock.now()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    end = clock.now()
    if step < opts.warmup:
        return
    marks = clock.marks
    llm_grad = marks.get("llm_input_grad", backward_end)
    out_grad = marks.get("projector_output_grad", llm_grad)
    in_grad = marks.get("projector_input_grad", backward_end)
    totals["data"] += collated - start
    totals["vision_tower"] += clock.forward["vision_tower"] + (backward_end - in_grad)
    totals["projector"] += clock.forward["projector"] + (in_grad - out_grad)
    # the LLM with what surrounds it: embedding lookup, image-token scatter, LM head and loss
    totals["llm"] += (backward_start - collated) - clock.forward["vision_tower"] - clock.forward["projector"]
    totals["llm"] += llm_grad - backward_start
    totals["optimizer"] += end - backward_end
    totals["step"] += end - start


def stage1_graph_check(model, collator, rows, opts) -> dict:
    from llava_normaligned.trainer.stages import freeze_for_stage

    freeze_for_stage(model, 1)
    model.train()
    device = torch.device(opts.device)
    model.to(device)
    seen = {}
    hook = model.model.vision_tower.register_forward_hook(
        lambda m, i, o: seen.__setitem__("graph", o.last_hidden_state.requires_grad))
    batch = {k: v.to(device) for k, v in collator(rows[: opts.batch_size]).items()}
    model(**batch).loss.backward()
    hook.remove()
    # Which tensors backward gave a gradient: the projector's only (a frozen parameter never gets one; this checks
    # that the freezing left nothing else trainable, e.g. in the LLM the gradient flows through)
    with_grad = [name for name, p in model.named_parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return {"graph_through_vision_tower": seen["graph"], "tensors_with_gradient": len(with_grad),
            "all_in_projector": all("multi_modal_projector" in name for name in with_grad)}


# ------------------------------------------------------------------------------------------------ main


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="bfloat16: mixed precision (bf16 autocast, fp32 weights)")
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps at the start of each run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per pipeline per stage (interleaved)")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--json", default=None, help="also write the results here")
    return parser


def main(argv: list[str] | None = None) -> int:
    import logging

    opts = make_parser().parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    logging.disable(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import datasets

    datasets.disable_progress_bars()
    from llava_normaligned.trainer.data import load_llava_json

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device {opts.device}, {opts.dtype}, size {opts.size}, batch {opts.batch_size}, {opts.steps} timed steps "
          f"x {opts.repeats} runs per pipeline; torch threads {torch.get_num_threads()}; load average {load:.2f}")
    results = {"options": vars(opts), "load_average_start": load, "stages": {}}
    with tempfile.TemporaryDirectory() as workdir:
        model, stock, processor = build_models(opts.size, workdir)
        image_size = SIZES[opts.size]["vision"]["image_size"]
        rows_needed = opts.batch_size * (opts.warmup + opts.steps)
        dataset = load_llava_json(write_data(os.path.join(workdir, "data"), rows_needed, image_size),
                                  os.path.join(workdir, "data", "images"))
        per_sample, collator, prepared = tokens_per_sample(processor, dataset)
        rows = [prepared[i] for i in range(len(prepared))]
        print(f"{model.config.image_seq_length} image tokens per image, {per_sample:.1f} tokens per sample")
        if 1 in opts.stages:
            check = stage1_graph_check(model, collator, rows, opts)
            results["stage1_checks"] = check
            print(f"stage 1: autograd graph through the frozen vision tower: {check['graph_through_vision_tower']}; "
                  f"tensors given a gradient: {check['tensors_with_gradient']} "
                  f"(all in the projector: {check['all_in_projector']})")
        for stage in opts.stages:
            times = {"norm-aligned": [], "stock": []}
            for repeat in range(opts.repeats):
                order = ["norm-aligned", "stock"] if repeat % 2 == 0 else ["stock", "norm-aligned"]
                for name in order:
                    run = run_norm_aligned if name == "norm-aligned" else run_stock
                    net = model if name == "norm-aligned" else stock
                    with contextlib.redirect_stdout(io.StringIO()):  # the Trainer's end-of-run log line
                        times[name] += run(net, processor, dataset, stage, opts, workdir)
                    gc.collect()
            medians = {k: statistics.median(v) for k, v in times.items()}
            rates = {k: {"samples_per_s": opts.batch_size / m, "tokens_per_s": opts.batch_size * per_sample / m,
                         "median_step_s": m} for k, m in medians.items()}
            ratio = medians["stock"] / medians["norm-aligned"]
            shares = component_shares(model, collator, rows, stage, opts)
            results["stages"][stage] = {"rates": rates, "ratio_vs_stock": ratio, "shares": shares}
            na, st = rates["norm-aligned"], rates["stock"]
            print(f"\nstage {stage}:")
            print(f"  {'':14}{'samples/s':>12}{'tokens/s':>12}{'median step':>14}")
            for name in ("norm-aligned", "stock"):
                r = rates[name]
                print(f"  {name:14}{r['samples_per_s']:12.1f}{r['tokens_per_s']:12.0f}{r['median_step_s'] * 1e3:11.1f} ms")
            print(f"  ratio norm-aligned / stock: samples/s {na['samples_per_s'] / st['samples_per_s']:.3f}x, "
                  f"tokens/s {na['tokens_per_s'] / st['tokens_per_s']:.3f}x  (goal >= 1.0x)")
            print("  share of step time (norm-aligned, hooked pass): "
                  + ", ".join(f"{k} {v:.1%}" for k, v in shares.items()))
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    results["load_average_end"] = load_end
    print(f"\nload average at the end {load_end:.2f} (timings on a loaded machine are inflated, ratios less so)")
    if opts.json:
        with open(opts.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
