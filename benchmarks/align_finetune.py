"""``align`` on an already trained VLM, then fine-tuning: the stock model against the aligned one (docs/align.md).

The paper trains its norm from the first stage on. ``align`` puts it into a VLM whose LLM has already learned to read
image tokens at their large norms: from then on the LLM receives them at the text norm, and fine-tuning has to
re-adapt it. This script measures what that costs and what it gives, at CPU scale:

1. the demo's data and tiny parts (``llava_normaligned.demo``: a pre-trained 64-d SigLIP-style encoder and a 4-layer
   LLM), composed into transformers' own ``Idefics3ForConditionalGeneration`` (pixel shuffle + one linear layer,
   drawn at a real connector's gain, so that image tokens enter the LLM at tens of times the text norm);
2. that stock model trained as a VLM is (connector alignment, then instruction tuning, with this package's
   ``train_stage``): the "already trained" model a user downloads;
3. per seed, from that model, the same fine-tuning (same steps, rates, data order) of (a) the stock model, (b) the
   model ``align`` makes of it (``llava_normaligned.align.align``: gain T/sqrt(D), GWC) and (c) that model after a
   stage 1 of its connector and norm alone (the LLM and vision tower frozen);
4. real-image and blank-image accuracy on the demo's held-out test split (``demo.scoring``) and the vision/text norm
   ratio at the LLM input (the mean L2 norm of ``inputs_embeds`` at the image positions over T, as ``diagnose``
   measures it), before and after fine-tuning; means with 95% intervals over seeds and the paired difference
   (``demo.stats``).

    python benchmarks/align_finetune.py --output-dir runs/align_finetune   # about 6 minutes on 2 CPU cores (365 s)
    python benchmarks/align_finetune.py --output-dir /tmp/af --quick       # the same pipeline in about 20 s

Writes ``results.json`` and ``results.md`` in the output folder (``--results`` copies them elsewhere).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

IDEFICS_TOKENS = ("<fake_token_around_image>", "<global-img>", "<end_of_utterance>")
# the arms: the stock model fine-tuned as it is; after `align`; after `align` and a stage 1 of the connector and its
# norm alone (the LLM and vision tower frozen) before the same fine-tuning
KINDS = ("stock", "aligned", "aligned_stage1")
LABELS = {"stock": "stock", "aligned": "aligned", "aligned_stage1": "aligned, stage 1 first"}
CONNECTOR_GAIN = 0.02 * math.sqrt(1024) * 0.02 * math.sqrt(4096)  # LLaVA-1.5's two projector layers' RMS gains


@dataclass
class Settings:
    """Everything the numbers depend on."""

    quick: bool = False
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    batch_size: int = 16
    pretrain_stage1_steps: int = 60  # the stock VLM before it is downloaded: connector alignment
    pretrain_stage2_steps: int = 150  # ... then instruction tuning
    finetune_steps: tuple[int, ...] = (50, 200)  # what the user then runs, stock or aligned: a short and a long run
    stage1_first_steps: int = 60  # the "aligned_stage1" arm's stage 1 (captions, connector and norm only)
    stage1_lr: float = 1e-3
    lr: float = 1e-3  # LLM and connector (and norm): the demo's stage-2 rates
    vision_lr: float = 2e-4
    warmup: float = 0.03
    ratio_images: int = 64
    logging_steps: int = 10
    pretrain_seed: int = 42

    @classmethod
    def quick_settings(cls) -> Settings:
        return cls(quick=True, seeds=(0, 1), batch_size=8, pretrain_stage1_steps=4, pretrain_stage2_steps=8,
                   finetune_steps=(4,), stage1_first_steps=2, ratio_images=8, logging_steps=2)


@dataclass
class RunResult:
    kind: str  # one of KINDS
    steps: int  # fine-tuning steps
    seed: int
    before: dict = field(default_factory=dict)  # accuracy and ratio of the starting model
    after: dict = field(default_factory=dict)
    train_loss: float | None = None
    seconds: float = 0.0


# ------------------------------------------------------------------------------------------------ the model


def compose_idefics3(parts, image_size: int, seed: int):
    """A stock ``Idefics3ForConditionalGeneration`` made of the demo's parts: the SigLIP encoder's weights in its vision
    model, the LLM's in its text model, a new connector drawn at ``CONNECTOR_GAIN``; and its ``Idefics3Processor``
    (no image splitting: one image of ``image_size`` px, ``(image_size / patch)^2 / 4`` tokens)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3Processor,
        SiglipVisionModel,
    )
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    vision = SiglipVisionModel.from_pretrained(parts.vision_dir)
    text = AutoModelForCausalLM.from_pretrained(parts.text_dir)
    tokenizer = AutoTokenizer.from_pretrained(parts.text_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": list(IDEFICS_TOKENS)})
    vc = vision.config
    scale = 2
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size},
        image_mean=vision_processor_stat(parts, "image_mean"), image_std=vision_processor_stat(parts, "image_std"))
    per_image = (vc.image_size // vc.patch_size) ** 2 // scale**2
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=per_image,
                                  chat_template=tokenizer.chat_template)
    text.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    vision_config = {k: getattr(vc, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                 "num_attention_heads", "image_size", "patch_size",
                                                 "layer_norm_eps", "hidden_act")}
    config = Idefics3Config(vision_config=vision_config, text_config=text.config.to_dict(), scale_factor=scale,
                            image_token_id=processor.image_token_id, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    vision_state = {k.removeprefix("vision_model."): v for k, v in vision.state_dict().items()}
    vision_state = {k: v for k, v in vision_state.items() if not k.startswith("head.")}  # no pooling head in Idefics3
    missing, unexpected = model.model.vision_model.load_state_dict(vision_state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"vision weights do not fit Idefics3's vision model: {missing[:3]} {unexpected[:3]}")
    model.model.text_model.load_state_dict(text.model.state_dict())
    model.lm_head.load_state_dict(text.lm_head.state_dict())
    proj = model.model.connector.modality_projection.proj
    with torch.no_grad():  # a real connector's gain, so that image tokens enter the LLM far above the text norm
        proj.weight.normal_(0.0, CONNECTOR_GAIN / math.sqrt(proj.in_features))
    model.generation_config = text.generation_config
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), processor


def vision_processor_stat(parts, key: str):
    with open(os.path.join(parts.vision_dir, "preprocessor_config.json"), encoding="utf-8") as f:
        return json.load(f)[key]


# ----------------------------------------------------------------------------------------------- measuring


@torch.no_grad()
def vision_text_ratio(model, processor, rows, n: int) -> float:
    """Mean L2 norm of the LLM's input embeddings at the image positions over T, on ``n`` test questions (a forward
    pre-hook on the language model reads ``inputs_embeds``, as ``diagnose`` does)."""
    from llava_normaligned.families.anatomy import anatomy_of
    from llava_normaligned.generation import prepare_inputs

    anatomy = anatomy_of(model)
    seen = []
    hook = anatomy.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["inputs_embeds"].detach()), with_kwargs=True)
    was_training = model.training
    model.eval()
    try:
        rows = rows[:n]
        inputs = prepare_inputs(model, processor, [r.question for r in rows], [[r.image_path] for r in rows], None)
        model(**inputs)
    finally:
        hook.remove()
        model.train(was_training)
    image = inputs["input_ids"] == anatomy.image_token_id
    return float(seen[-1][image].float().norm(dim=-1).mean()) / anatomy.text_norm_target()


def evaluate(model, processor, rows, settings: Settings, image_size: int) -> dict:
    from llava_normaligned.demo.scoring import score_model

    scores = score_model(model, processor, rows, image_size=image_size, batch_size=64, progress=False)
    return {"real": scores.accuracy["real"]["avg"], "blank": scores.accuracy["blank"]["avg"],
            "ratio": vision_text_ratio(model, processor, rows, settings.ratio_images)}


# ------------------------------------------------------------------------------------------------ training


def train(model, processor, dataset, folder: str, *, stage: int, steps: int, lr: float, settings: Settings, seed: int):
    from llava_normaligned.trainer.train import StageConfig, train_stage
    from trl import SFTConfig

    args = SFTConfig(output_dir=folder, max_steps=steps, per_device_train_batch_size=settings.batch_size,
                     learning_rate=lr, lr_scheduler_type="cosine", warmup_steps=settings.warmup, weight_decay=0.0,
                     logging_steps=min(settings.logging_steps, steps), save_strategy="no", report_to=[],
                     use_cpu=True, bf16=False, fp16=False, activation_checkpointing=False, seed=seed,
                     data_seed=seed, dataloader_num_workers=0, max_length=None, disable_tqdm=True)
    rates = {"lr_projector": lr} if stage == 1 else {"lr_vision": settings.vision_lr}
    log = os.path.join(folder, "trainer_log.txt")
    os.makedirs(folder, exist_ok=True)
    with open(log, "a", encoding="utf-8") as handle, contextlib.redirect_stdout(handle):
        return train_stage(model, processor, dataset, args=args, stage=StageConfig(stage, **rates))


def pretrained_stock(root: str, parts, datasets, settings: Settings, image_size: int) -> str:
    """The stock model trained as a VLM (stage 1, then stage 2), saved in ``root/stock_trained`` (reused)."""
    folder = os.path.join(root, "stock_trained")
    if os.path.isfile(os.path.join(folder, "model.safetensors")):
        return folder
    model, processor = compose_idefics3(parts, image_size, settings.pretrain_seed)
    train(model, processor, datasets["pretrain"], os.path.join(root, "work", "pretrain1"), stage=1,
          steps=settings.pretrain_stage1_steps, lr=settings.stage1_lr, settings=settings, seed=settings.pretrain_seed)
    train(model, processor, datasets["instruct"], os.path.join(root, "work", "pretrain2"), stage=2,
          steps=settings.pretrain_stage2_steps, lr=settings.lr, settings=settings, seed=settings.pretrain_seed)
    staging = folder + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging)
    processor.save_pretrained(staging)
    os.replace(staging, folder)
    return folder


def run(kind: str, steps: int, seed: int, stock_dir: str, root: str, datasets, rows, settings: Settings,
        image_size: int, before_cache: dict) -> RunResult:
    from llava_normaligned.align import align
    from llava_normaligned.loading import load_model

    work = os.path.join(root, "work", f"{kind}-{steps}-seed{seed}")
    if kind == "stock":
        model, processor = load_model(stock_dir, for_training=True)
    else:
        model = align(stock_dir)
        processor = load_model(stock_dir)[1]
    result = RunResult(kind, steps, seed)
    if kind == "aligned_stage1":  # its starting point depends on the seed: measured per run
        model = train(model, processor, datasets["pretrain"], os.path.join(work, "stage1"), stage=1,
                      steps=settings.stage1_first_steps, lr=settings.stage1_lr, settings=settings, seed=seed).model
        result.before = evaluate(model, processor, rows, settings, image_size)
    else:  # the same starting model for every seed
        if kind not in before_cache:
            before_cache[kind] = evaluate(model, processor, rows, settings, image_size)
        result.before = before_cache[kind]
    start = time.perf_counter()
    trained = train(model, processor, datasets["instruct"], work, stage=2, steps=steps, lr=settings.lr,
                    settings=settings, seed=seed)
    result.seconds = round(time.perf_counter() - start, 1)
    result.train_loss = trained.metrics.get("train_loss")
    result.after = evaluate(trained.model, processor, rows, settings, image_size)
    return result


# ------------------------------------------------------------------------------------------------- report


def summarise(results: list[RunResult]) -> dict:
    """Per arm and fine-tuning length: the starting model's and the fine-tuned model's scores, mean and interval over
    seeds (the stock and aligned arms start from one model: no interval); per length each aligned arm minus stock,
    paired by seed."""
    from llava_normaligned.demo.stats import mean_interval, paired_difference

    def runs(kind: str, steps: int) -> list[RunResult]:
        return sorted((r for r in results if r.kind == kind and r.steps == steps), key=lambda r: r.seed)

    def intervals(values: list[dict]) -> dict:
        return {key: mean_interval([v[key] for v in values]).to_dict() for key in ("real", "blank", "ratio")}

    lengths = sorted({r.steps for r in results})
    kinds = [k for k in KINDS if any(r.kind == k for r in results)]
    out = {kind: {"before": intervals([r.before for r in runs(kind, lengths[0])]),
                  "after": {str(n): intervals([r.after for r in runs(kind, n)]) for n in lengths}} for kind in kinds}
    out["minus_stock_after"] = {
        kind: {str(n): {key: paired_difference([r.after[key] for r in runs(kind, n)],
                                               [r.after[key] for r in runs("stock", n)]).to_dict()
                        for key in ("real", "blank")} for n in lengths}
        for kind in kinds if kind != "stock"
    }
    return out


def _interval(entry: dict, digits: int = 3) -> str:
    half = entry.get("half_width")
    return f"{entry['mean']:.{digits}f}" + ("" if not half else f" ± {half:.{digits}f}")  # one start: no interval


def markdown(summary: dict, settings: Settings, machine: dict, seconds: float) -> str:
    lengths = " or ".join(str(n) for n in settings.finetune_steps)
    lines = [
        "# align on a trained VLM, then fine-tuning: stock vs aligned",
        "",
        f"`python benchmarks/align_finetune.py{' --quick' if settings.quick else ''}` on {machine['cpu']} "
        f"(CPU capability {machine['cpu_capability']}, {machine['threads']} torch thread(s), torch {machine['torch']}, "
        f"transformers {machine['transformers']}); {seconds:.0f} s. A tiny Idefics3 made of the demo's parts, trained "
        f"as a VLM ({settings.pretrain_stage1_steps} + {settings.pretrain_stage2_steps} steps), then fine-tuned "
        f"(stage 2) {lengths} steps as it is (stock), after `align` (aligned), or after `align` and "
        f"{settings.stage1_first_steps} steps of stage 1 (the connector and its norm alone; aligned, stage 1 first), "
        f"seeds {list(settings.seeds)}; mean ± 95% interval over seeds (Student's t). Chance is 0.25; the "
        "blank-image column is what the text alone gives.",
        "",
        "| model | real-image accuracy | blank-image accuracy | vision/text norm ratio |",
        "| --- | --- | --- | --- |",
    ]
    for kind in (k for k in KINDS if k in summary):
        before = summary[kind]["before"]
        lines.append(f"| {LABELS[kind]}, before fine-tuning | {_interval(before['real'])} | "
                     f"{_interval(before['blank'])} | {_interval(before['ratio'])} |")
        for steps, after in summary[kind]["after"].items():
            lines.append(f"| {LABELS[kind]}, after {steps} steps | {_interval(after['real'])} | "
                         f"{_interval(after['blank'])} | {_interval(after['ratio'])} |")
    lines.append("")
    for kind, by_length in summary["minus_stock_after"].items():
        for steps, diff in by_length.items():
            lines.append(f"{LABELS[kind]} minus stock after {steps} steps, paired by seed: real-image accuracy "
                         f"{_interval(diff['real'])}, blank-image {_interval(diff['blank'])}.")
    return "\n".join(lines) + "\n"


def machine_info() -> dict:
    import transformers

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True, help="folder for the data, the models and the results")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the same pipeline in about 20 seconds")
    parser.add_argument("--results", default=None, help="also copy results.json / results.md to this folder")
    args = parser.parse_args(argv)

    from llava_normaligned.trainer.data import load_llava_json

    from llava_normaligned.demo.parts import build_parts
    from llava_normaligned.demo.run import DemoConfig, DemoPaths, ensure_dataset
    from llava_normaligned.demo.scoring import load_test_rows

    torch.set_num_threads(1)  # tiny matrices: one thread is fastest and the numbers do not depend on the machine's
    settings = Settings.quick_settings() if args.quick else Settings()
    demo = DemoConfig.quick() if args.quick else DemoConfig.full()
    paths = DemoPaths(args.output_dir)
    os.makedirs(args.output_dir, exist_ok=True)
    recorded = os.path.join(args.output_dir, "settings.json")  # what the reused pieces (data, parts, model) used
    wanted = json.loads(json.dumps({"settings": asdict(settings), "demo": demo.to_dict()}))
    if os.path.exists(recorded):
        with open(recorded, encoding="utf-8") as f:
            if json.load(f) != wanted:
                parser.error(f"--output-dir {args.output_dir} holds a run with other settings; use another folder")
    else:
        with open(recorded, "w", encoding="utf-8") as f:
            json.dump(wanted, f, indent=1)
    started = time.perf_counter()
    dataset = ensure_dataset(paths, demo.data, progress=False)
    parts = build_parts(paths.parts, demo.parts, progress=False)
    image_folder = dataset.root  # the rows name their images relative to it
    datasets = {"pretrain": load_llava_json(dataset.pretrain, image_folder),
                "instruct": load_llava_json(dataset.instruct, image_folder)}
    rows = load_test_rows(dataset.test, image_folder)
    image_size = demo.data.image_size
    stock_dir = pretrained_stock(args.output_dir, parts, datasets, settings, image_size)
    results, before = [], {}
    for steps in settings.finetune_steps:
        for seed in settings.seeds:
            for kind in KINDS:
                results.append(run(kind, steps, seed, stock_dir, args.output_dir, datasets, rows, settings, image_size,
                                   before))
                print(f"{kind}, {steps} steps, seed {seed}: {results[-1].after}", flush=True)
    summary = summarise(results)
    seconds = time.perf_counter() - started
    machine = machine_info()
    document = {"settings": asdict(settings), "machine": machine, "seconds": round(seconds, 1),
                "runs": [asdict(r) for r in results], "summary": summary}
    text = markdown(summary, settings, machine, seconds)
    for folder in filter(None, (args.output_dir, args.results)):
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "results.json"), "w", encoding="utf-8") as f:
            json.dump(document, f, indent=1)
        with open(os.path.join(folder, "results.md"), "w", encoding="utf-8") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
