"""The CPU demo: the paper's comparison (Li et al., arXiv 2512.08374, Tables 4 and 5) at CPU scale, one command.

    llava-normaligned demo --output-dir ./demo            # 3 seeds x 8 rows: about 18 minutes on 2 CPU cores (measured 1067 s)
    llava-normaligned demo --output-dir ./demo-ci --quick # about 55 s on 2 CPU cores (measured 56 s): 2 x 8 runs, for CI

Nothing is downloaded. In order:

1. ``data/``: the synthetic visual-question dataset (``synthetic.py``): captions for stage 1, questions for stage 2,
   a held-out test split; answers balanced within every question, so the text alone scores chance.
2. ``parts/``: a tiny vision encoder and a tiny LLM, each pre-trained for seconds (``parts.py``), so that a
   LLaVA built from them can learn to see in the minutes the demo has.
3. ``runs/<variant>/seed<k>/``: for each of the paper's four variants (w/o Norm; norm with default init; norm with
   target init, without and with GWC), for GWC with per-part clipping (``StageConfig.clip_per_part``), for target
   init without and with GWC trained without gradient clipping, and for each seed (``num_seeds``, default 3): both
   LLaVA-1.5 stages with this package's ``train_stage`` (TRL's SFTTrainer), the test split scored with the real
   images and with blank ones (``scoring.py``), and the per-layer hidden-state norms and directions of each
   modality (``mechanism.py``, through the diagnostics' residual tap).
   ``runs/stock/seed<k>/``: transformers' own ``LlavaForConditionalGeneration`` trained by TRL's own ``SFTTrainer``
   in one stage with the same number of steps, the baseline a user of stock LLaVA would get.
4. ``results.md`` / ``results.json`` (Tables 4 and 5 layout with mean ± 95% interval over seeds and paired
   differences to w/o Norm (``stats.py``), real and blank accuracy, vision/text norm ratios, the optimizer step per
   part (pre-clip gradient norms, clip coefficient, update sizes), the per-layer profiles, the machine's torch
   version, threads and CPU capability), ``figures/*.png``, and ``best_model/``: the best of the paper's four
   variants (its first seed's run) as a Hub-ready folder (weights, remote code, processor, model card, the demo's
   results under ``eval/``).

A finished run (``runs/<variant>/result.json``), the data and the parts are reused when the demo is run again with
the same settings in the same folder, so an interrupted demo resumes where it stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import torch

from llava_normaligned.tiny import TinyTextSpec, TinyVisionSpec

from . import synthetic
from .mechanism import layer_profile
from .parts import EXTRA_VARIANTS, VARIANTS, Parts, PartsConfig, Variant, build_parts, compose_variant, stock_llava
from .scoring import load_test_rows, score_model
from .text_pretrain import TextPretrainConfig
from .vision_pretrain import VisionPretrainConfig

logger = logging.getLogger(__name__)

CONFIG_FILE = "demo_config.json"
RESULT_FILE = "result.json"
BEST_DIR = "best_model"
STOCK_KEY = "stock"
STOCK_NAME = "stock LLaVA, stock TRL (one stage)"


# ---------------------------------------------------------------------------------------------------- config


@dataclass
class DemoConfig:
    """Everything the demo's numbers depend on. ``full()`` is the README's run; ``quick()`` the CI-sized one."""

    data: synthetic.SyntheticSpec = field(default_factory=synthetic.SyntheticSpec)
    parts: PartsConfig = field(default_factory=PartsConfig)
    batch_size: int = 16
    # Eight rows x three seeds in about ten minutes on 2 cores: a run of 200 + 600 steps took 33-42 s, so each run
    # gets half of that (the single-seed demo's numbers, at 800 steps, are in docs/demo.md's history).
    stage1_steps: int = 100
    stage2_steps: int = 300
    # Tiny models trained for hundreds of steps need far larger rates than the paper's (Appendix E.1: stage 1 1e-3,
    # stage 2 LLM 1e-5, vision 2e-6); the vision tower keeps the paper's ratio to the LLM (1/5).
    stage1_lr: float = 1e-3  # projector (+ norm)
    stage2_lr: float = 1e-3  # LLM and projector
    stage2_vision_lr: float = 2e-4
    warmup: float = 0.03  # paper Appendix E.1
    logging_steps: int = 20  # norm-tracking points
    probe_images: int = 64  # test images the vision/text norm ratio is measured on
    eval_batch_size: int = 64
    seed: int = 42  # the first seed; run i uses seed + i (its projector draw, data order and dropout)
    num_seeds: int = 3  # every row is trained once per seed; the tables give mean ± 95% interval
    layer_probe_images: int = 32  # test questions the per-layer hidden states are measured on
    # Tiny matrices gain nothing from a second thread, and two spinning threads on a 2-core machine that is also
    # running anything else stall each other (steps 10x slower and worse); 0 keeps torch's default.
    threads: int = 1

    @classmethod
    def full(cls) -> DemoConfig:
        return cls()

    @classmethod
    def quick(cls) -> DemoConfig:
        return cls(
            data=synthetic.SyntheticSpec(train_per_template=32, test_per_template=16),
            parts=PartsConfig(vision_pretrain=VisionPretrainConfig(num_scenes=256, steps=30),
                              text_pretrain=TextPretrainConfig(num_conversations=256, steps=20)),
            batch_size=8,
            stage1_steps=4,
            stage2_steps=8,
            logging_steps=2,
            probe_images=16,
            num_seeds=2,
            layer_probe_images=8,
        )

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_seeds)]

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self)))


def config_from_dict(data: dict) -> DemoConfig:
    """Inverse of ``DemoConfig.to_dict`` (reads ``demo_config.json``)."""
    parts = dict(data["parts"])
    parts["vision"] = TinyVisionSpec(**parts["vision"])
    parts["text"] = TinyTextSpec(**parts["text"])
    parts["vision_pretrain"] = VisionPretrainConfig(**parts["vision_pretrain"])
    parts["text_pretrain"] = TextPretrainConfig(**parts["text_pretrain"]) if parts["text_pretrain"] else None
    fields = dict(data, data=synthetic.SyntheticSpec(**data["data"]), parts=PartsConfig(**parts))
    return DemoConfig(**fields)


# ---------------------------------------------------------------------------------------------- the folder


@dataclass
class DemoPaths:
    root: str

    @property
    def data(self) -> str:
        return os.path.join(self.root, "data")

    @property
    def parts(self) -> str:
        return os.path.join(self.root, "parts")

    @property
    def best(self) -> str:
        return os.path.join(self.root, BEST_DIR)

    def run(self, key: str, seed: int) -> str:
        return os.path.join(self.root, "runs", key, f"seed{seed}")


def prepare_folder(output_dir: str, config: DemoConfig) -> DemoPaths:
    """Create ``output_dir`` or check that an earlier demo there used the same settings (then its finished pieces
    are reused). A folder with other settings, or with other files and no demo config, is an error."""
    paths = DemoPaths(output_dir)
    config_path = os.path.join(output_dir, CONFIG_FILE)
    wanted = config.to_dict()
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as handle:
            found = json.load(handle)
        if found != wanted:
            raise FileExistsError(
                f"{output_dir} holds a demo run with other settings ({CONFIG_FILE} differs); use another --output-dir"
            )
        return paths
    if os.path.isdir(output_dir) and os.listdir(output_dir):
        raise FileExistsError(f"{output_dir} exists, is not empty and holds no {CONFIG_FILE}; use another --output-dir")
    os.makedirs(output_dir, exist_ok=True)
    _write_json(wanted, config_path)
    return paths


def _write_json(payload, path: str) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=1, default=str)
    os.replace(path + ".tmp", path)


def ensure_dataset(paths: DemoPaths, spec: synthetic.SyntheticSpec, progress: bool) -> synthetic.DatasetPaths:
    dataset = synthetic.dataset_paths(paths.data)
    if os.path.exists(dataset.info):
        with open(dataset.info, encoding="utf-8") as handle:
            if json.load(handle)["spec"] != asdict(spec):
                raise FileExistsError(f"{paths.data} holds a dataset with another spec")
        return dataset
    return synthetic.make_dataset(paths.data, spec, progress=progress)


# --------------------------------------------------------------------------------------------- one run


def sft_args(output_dir: str, steps: int, lr: float, config: DemoConfig, seed: int, **extra):
    """The SFTConfig of one training run: cosine schedule, warmup 0.03, no weight decay (paper Appendix E.1), fp32
    on the CPU, no checkpoints (a run is minutes), norm-tracking every ``logging_steps``."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=config.batch_size,
        learning_rate=lr,
        lr_scheduler_type="cosine",
        warmup_steps=config.warmup,
        weight_decay=0.0,
        logging_steps=min(config.logging_steps, steps),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        fp16=False,
        activation_checkpointing=False,  # TRL's default is on; nothing to save at this size
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        max_length=None,
        **extra,
    )


@contextlib.contextmanager
def trainer_console_to(log_path: str):
    """The Trainer prints every log dict to stdout; send those lines to ``log_path`` (progress bars stay on the
    terminal: they are written to stderr)."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as handle, contextlib.redirect_stdout(handle):
        yield


def probe_pixels(processor, rows, n: int) -> torch.Tensor:
    """Pixel values (n, 3, H, W) of the first ``n`` test images: the fixed batch the norm ratio is measured on."""
    from PIL import Image

    images = []
    for row in rows[:n]:
        with Image.open(row.image_path) as image:
            images.append(image.convert("RGB"))
    return processor.image_processor(images=images, return_tensors="pt")["pixel_values"]


def norm_ratio(model, pixels) -> float:
    from llava_normaligned.trainer.callbacks import vision_text_norm_ratio

    return vision_text_norm_ratio(model, pixels)["vision_text_ratio"]


def _header(index: int, total: int, name: str, what: str) -> None:
    print(f"[{index}/{total}] {name}: {what}", file=sys.stderr, flush=True)


def run_variant(variant: Variant, parts: Parts, datasets: dict, test_rows, paths: DemoPaths, config: DemoConfig,
                position: tuple[int, int], progress: bool, seed: int) -> dict:
    """Both stages of one variant with one seed, then its scores. Returns that run's row (also ``result.json``)."""
    from llava_normaligned.trainer.callbacks import gain_statistics
    from llava_normaligned.trainer.train import StageConfig, train_stage

    folder = paths.run(variant.key, seed)
    start = time.perf_counter()
    torch.manual_seed(seed)
    model, processor = compose_variant(parts, variant, seed=seed)
    pixels = probe_pixels(processor, test_rows, config.probe_images)
    ratio = {"init": norm_ratio(model, pixels)}
    gains = {"init": gain_statistics(model)}
    tracking, losses, seconds = {}, {}, {}

    stages = (
        (1, datasets["pretrain"], config.stage1_steps, config.stage1_lr, {"lr_projector": config.stage1_lr}),
        (2, datasets["instruct"], config.stage2_steps, config.stage2_lr,
         {"lr_llm": config.stage2_lr, "lr_projector": config.stage2_lr, "lr_vision": config.stage2_vision_lr}),
    )
    for stage, dataset, steps, lr, rates in stages:
        _header(*position, variant.name, f"seed {seed}, stage {stage}, {steps} steps")
        stage_dir = os.path.join(folder, f"stage{stage}")
        tic = time.perf_counter()
        with trainer_console_to(os.path.join(folder, f"stage{stage}_trainer_log.txt")):
            result = train_stage(model, processor, dataset,
                                 stage=StageConfig(stage, clip_per_part=variant.clip_per_part, **rates),
                                 args=sft_args(stage_dir, steps, lr, config, seed, disable_tqdm=not progress,
                                               max_grad_norm=variant.max_grad_norm))
        seconds[f"stage{stage}"] = time.perf_counter() - tic
        model = result.model
        tracking[f"stage{stage}"] = result.norm_tracking
        losses[f"stage{stage}"] = result.metrics.get("train_loss")
        ratio[f"after_stage{stage}"] = norm_ratio(model, pixels)
        gains[f"after_stage{stage}"] = gain_statistics(model)

    _header(*position, variant.name, "scoring the test split (real and blank images)")
    tic = time.perf_counter()
    scores = score_model(model.eval(), processor, test_rows, image_size=config.data.image_size,
                         batch_size=config.eval_batch_size, progress=progress, desc=f"scoring {variant.key}")
    seconds["scoring"] = time.perf_counter() - tic
    layers = layer_profile(model, processor, test_rows, config.layer_probe_images)
    seconds["total"] = time.perf_counter() - start
    row = {
        "name": variant.name,
        "key": variant.key,
        "seed": seed,
        "training": variant.training_fields(),
        "layers": layers,
        "recipe": "two stages (this package's train_stage: TRL SFTTrainer, answer-only labels, per-part rates)",
        "model_class": type(model).__name__,
        "variant": variant.config_fields(),
        "checkpoint": os.path.relpath(os.path.join(folder, "stage2"), paths.root),
        "accuracy": scores.accuracy,
        "visual_gain": scores.visual_gain,
        "examples": scores.examples,
        "norm_ratio": ratio,
        "gain_stats": gains,
        "tracking": tracking,
        "train_loss": losses,
        "steps": {"stage1": config.stage1_steps, "stage2": config.stage2_steps},
        "seconds": seconds,
    }
    _write_json(row, os.path.join(folder, RESULT_FILE))
    return row


def run_stock(parts: Parts, datasets: dict, test_rows, paths: DemoPaths, config: DemoConfig,
              position: tuple[int, int], progress: bool, seed: int) -> dict:
    """Stock ``LlavaForConditionalGeneration`` + stock TRL ``SFTTrainer``, one stage on the questions, as many steps
    as a variant's two stages together. The projector and the LLM train at the stage-2 rate; the vision tower is
    frozen (LLaVA-1.5's own recipe; stock TRL has one learning rate for every part). Answer-only loss through TRL's
    own ``assistant_only_loss`` (the chat template marks the answers with ``{% generation %}``)."""
    from trl import SFTTrainer

    from llava_normaligned.trainer.callbacks import NormTrackingCallback, norm_records

    folder = paths.run(STOCK_KEY, seed)
    steps = config.stage1_steps + config.stage2_steps
    start = time.perf_counter()
    torch.manual_seed(seed)
    norm_aligned, processor = compose_variant(parts, VARIANTS[0], seed=seed)
    model = stock_llava(norm_aligned)
    del norm_aligned
    for param in model.model.vision_tower.parameters():
        param.requires_grad_(False)
    pixels = probe_pixels(processor, test_rows, config.probe_images)
    ratio = {"init": norm_ratio(model, pixels)}

    _header(*position, STOCK_NAME, f"seed {seed}, one stage, {steps} steps")
    with trainer_console_to(os.path.join(folder, "trainer_log.txt")):
        args = sft_args(os.path.join(folder, "model"), steps, config.stage2_lr, config, seed,
                        assistant_only_loss=True, disable_tqdm=not progress)
        trainer = SFTTrainer(model=model, args=args, train_dataset=datasets["instruct"], processing_class=processor)
        NormTrackingCallback.install(trainer)
        output = trainer.train()
        trainer.save_model(args.output_dir)
    seconds = {"train": time.perf_counter() - start}
    ratio["after_stage2"] = norm_ratio(model, pixels)  # one stage: reported in the end-of-training column

    _header(*position, STOCK_NAME, "scoring the test split (real and blank images)")
    tic = time.perf_counter()
    scores = score_model(model.eval(), processor, test_rows, image_size=config.data.image_size,
                         batch_size=config.eval_batch_size, progress=progress, desc="scoring stock")
    seconds["scoring"] = time.perf_counter() - tic
    layers = layer_profile(model, processor, test_rows, config.layer_probe_images)
    seconds["total"] = time.perf_counter() - start
    row = {
        "name": STOCK_NAME,
        "key": STOCK_KEY,
        "seed": seed,
        "training": {"max_grad_norm": args.max_grad_norm, "clip_per_part": False},
        "layers": layers,
        "recipe": "one stage on the questions (TRL SFTTrainer as shipped, assistant_only_loss); vision tower frozen",
        "model_class": type(model).__name__,
        "variant": {"projector_norm": None},
        "checkpoint": os.path.relpath(args.output_dir, paths.root),
        "accuracy": scores.accuracy,
        "visual_gain": scores.visual_gain,
        "examples": scores.examples,
        "norm_ratio": ratio,
        "gain_stats": {},
        "tracking": {"stage2": norm_records(trainer.state.log_history)},
        "train_loss": {"single_stage": output.metrics.get("train_loss")},
        "steps": {"single_stage": steps},
        "seconds": seconds,
    }
    _write_json(row, os.path.join(folder, RESULT_FILE))
    return row


def _finished(folder: str) -> dict | None:
    path = os.path.join(folder, RESULT_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


# ------------------------------------------------------------------------------------------- over seeds

OPTIMIZER_KEYS = ("grad_norm", "clip_coef")
OPTIMIZER_PREFIXES = ("grad_norm/", "update_size/", "clip_coef/")


def _mean(values):
    values = list(values)
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sum(values) / len(values)
    if values and all(isinstance(v, dict) for v in values):
        return {k: _mean(v.get(k) for v in values) for k in values[0]}
    return values[0] if values else None


def optimizer_step_stats(records: list[dict]) -> dict:
    """Per key (pre-clip gradient norms, the clip coefficient, the update sizes), the mean over the logged training
    steps of one run's stage-2 records, and the first logged step's values."""
    logged = [r for r in records if (r.get("step") or 0) > 0]
    keys = [k for k in (logged[0] if logged else {}) if k in OPTIMIZER_KEYS or k.startswith(OPTIMIZER_PREFIXES)]
    return {"mean": {k: _mean(r[k] for r in logged if k in r) for k in keys},
            "first": {k: logged[0][k] for k in keys}}


def aggregate(runs: list[dict], baseline: list[dict] | None) -> dict:
    """One row of the tables from the runs of one variant (one per seed, in seed order): each accuracy's mean and
    95% interval over seeds, its paired difference to ``baseline``'s runs (the same seeds; None for the baseline
    itself), and the means over seeds of the norm ratios, Table 5 statistics, optimizer-step statistics and
    per-layer profiles. The norm-tracking curves (figures) and the checkpoint are the first seed's."""
    from .mechanism import mean_profiles
    from .stats import mean_interval, paired_difference

    first = runs[0]
    row = {k: first[k] for k in ("name", "key", "recipe", "model_class", "variant", "training", "steps", "checkpoint",
                                 "examples", "tracking", "train_loss")}
    row["seeds"] = [r["seed"] for r in runs]
    if baseline is not None and [r["seed"] for r in baseline] != row["seeds"]:
        raise ValueError(f"{first['key']}: its seeds differ from the baseline's")
    conditions = list(first["accuracy"])
    row["accuracy"] = {c: {t: _mean(r["accuracy"][c][t] for r in runs) for t in first["accuracy"][c]}
                       for c in conditions}
    row["accuracy_interval"] = {c: {t: mean_interval([r["accuracy"][c][t] for r in runs]).to_dict()
                                    for t in first["accuracy"][c]} for c in conditions}
    row["visual_gain"] = _mean(r["visual_gain"] for r in runs)
    row["visual_gain_interval"] = mean_interval([r["visual_gain"] for r in runs]).to_dict()
    row["paired_to_baseline"] = None if baseline is None else {
        c: {t: paired_difference([r["accuracy"][c][t] for r in runs], [b["accuracy"][c][t] for b in baseline]).to_dict()
            for t in first["accuracy"][c]} for c in conditions}
    row["norm_ratio"] = _mean(r["norm_ratio"] for r in runs)
    row["gain_stats"] = _mean(r["gain_stats"] for r in runs) if first["gain_stats"] else {}
    row["optimizer_step"] = _mean(optimizer_step_stats(r["tracking"].get("stage2") or []) for r in runs)
    row["layers"] = mean_profiles([r["layers"] for r in runs])
    row["per_seed"] = [{"seed": r["seed"], "real_avg": r["accuracy"]["real"]["avg"],
                        "blank_avg": r["accuracy"]["blank"]["avg"], "visual_gain": r["visual_gain"],
                        "checkpoint": r["checkpoint"], "seconds": r["seconds"].get("total")} for r in runs]
    row["seconds"] = {"total": sum(r["seconds"].get("total") or 0 for r in runs)}
    return row


def contrast(rows: list[dict], per_run: dict, key: str, reference: str) -> dict:
    """The paired difference (same seeds) of ``key``'s real-image average accuracy to ``reference``'s."""
    from .stats import paired_difference

    name = {r["key"]: r["name"] for r in rows}
    diff = paired_difference([r["accuracy"]["real"]["avg"] for r in per_run[key]],
                             [r["accuracy"]["real"]["avg"] for r in per_run[reference]])
    return {"key": key, "reference": reference, "name": name[key], "reference_name": name[reference],
            **diff.to_dict(), "separated_from_zero": diff.excludes_zero()}


# contrasts the text states beside the paired differences to w/o Norm (item: what GWC does under AdamW)
CONTRASTS = (
    ("norm_target_init_gwc", "norm_target_init"),  # GWC, clipping at 1.0
    ("norm_target_init_gwc_noclip", "norm_target_init_noclip"),  # GWC, no clipping
    ("norm_target_init_noclip", "norm_target_init"),  # clipping, without GWC
    ("norm_target_init_gwc_noclip", "norm_target_init_gwc"),  # clipping, with GWC
    ("norm_target_init_gwc_part_clip", "norm_target_init_gwc"),  # the alternative against GWC
    ("norm_target_init", "no_norm"),  # alignment
)


def environment() -> dict:
    """What makes floats differ between machines."""
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count()}


# ------------------------------------------------------------------------------------------- best model


def pick_best(rows: list[dict]) -> dict:
    """The variant with the highest real-image average (ties: the larger visual gain, then table order). The stock
    row is a reference, not a candidate: its folder is transformers' own class, without this package's norm."""
    paper = {v.key for v in VARIANTS}
    candidates = [r for r in rows if r["key"] in paper]
    return max(candidates, key=lambda r: (round(r["accuracy"]["real"]["avg"], 6), round(r["visual_gain"], 6),
                                          -candidates.index(r)))


def write_best_model(best: dict, results: dict, paths: DemoPaths) -> str:
    """Copy the best variant's stage-2 folder to ``best_model/`` with the demo's results in ``eval/`` and a model card
    (README.md) rendered from the folder; staged in a temporary folder and moved into place."""
    from llava_normaligned.hub_cards.card import CardOptions, render_card

    from .report import FIGURES_DIR, render_markdown

    source = os.path.join(paths.root, best["checkpoint"])
    staging = tempfile.mkdtemp(prefix=".best-", dir=paths.root)
    try:
        target = os.path.join(staging, f"llava-normaligned-demo-{best['key']}")  # the card's title
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("checkpoint-*", "*_trainer_log.txt"))
        evaluation = os.path.join(target, "eval")
        os.makedirs(evaluation)
        own = {k: best[k] for k in ("name", "variant", "accuracy", "visual_gain", "norm_ratio", "train_loss", "steps")}
        _write_json({"task": "llava-normaligned demo (synthetic shapes VQA, held-out test split)",
                     "selected_by": results["best"]["criterion"], **own,
                     "accuracy_is": "the mean over the seeds of this variant's runs",
                     "checkpoint_seed": best["seeds"][0],
                     "per_seed": best["per_seed"]},
                    os.path.join(evaluation, "results.json"))
        with open(os.path.join(evaluation, "results.md"), "w", encoding="utf-8") as handle:
            handle.write(render_markdown(results))
        shutil.copytree(os.path.join(paths.root, FIGURES_DIR), os.path.join(evaluation, FIGURES_DIR))
        render_card(target, CardOptions(license="apache-2.0", tags=("demo", "synthetic"))).save(
            os.path.join(target, "README.md"))
        if os.path.exists(paths.best):
            shutil.rmtree(paths.best)
        os.replace(target, paths.best)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths.best


# ---------------------------------------------------------------------------------------------- the demo


def _setup_summary(config: DemoConfig, parts: Parts) -> str:
    v, t = config.parts.vision, config.parts.text
    return (
        f"Tiny SigLIP ({v.hidden_size}-d, {v.num_hidden_layers} layers, {v.image_size} px, "
        f"{(v.image_size // v.patch_size) ** 2} image tokens) + tiny Llama ({t.hidden_size}-d, "
        f"{t.num_hidden_layers} layers), both pre-trained for seconds on the synthetic data; stage 1: "
        f"{config.stage1_steps} steps on captions (projector + norm, lr {config.stage1_lr:g}); stage 2: "
        f"{config.stage2_steps} steps on questions (all parts; LLM/projector lr {config.stage2_lr:g}, vision "
        f"{config.stage2_vision_lr:g}); batch {config.batch_size}, cosine, warmup {config.warmup}, seed "
        f"{config.seed}"
        f"{f' to {config.seeds[-1]} ({config.num_seeds} seeds)' if config.num_seeds > 1 else ''}. Stock row: {config.stage1_steps + config.stage2_steps} steps, one stage. Scoring: greedy "
        "decoding, exact match."
    )


@contextlib.contextmanager
def quiet_libraries():
    """transformers / datasets warnings and their loading bars off while the demo runs (restored after)."""
    import datasets
    import transformers

    hf_level = transformers.logging.get_verbosity()
    hf_bars = transformers.logging.is_progress_bar_enabled()
    ds_level = datasets.logging.get_verbosity()
    ds_bars = datasets.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(hf_level)
        if hf_bars:
            transformers.logging.enable_progress_bar()
        datasets.logging.set_verbosity(ds_level)
        if ds_bars:
            datasets.enable_progress_bars()


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("the demo draws its figures with matplotlib: pip install 'llava-normaligned[all]' "
                          "(or matplotlib)") from None


@contextlib.contextmanager
def torch_threads(threads: int):
    """Run with ``threads`` intra-op threads (0: unchanged), restored after."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_demo(output_dir: str, config: DemoConfig, progress: bool = True) -> dict:
    """Run the whole demo into ``output_dir``; returns the results (also written as ``results.json``)."""
    from llava_normaligned.trainer.data import load_llava_json
    from .report import write_figures, write_tables

    _require_matplotlib()  # the figures come last: fail now, not after the training
    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    paths = prepare_folder(output_dir, config)
    with quiet_libraries(), torch_threads(config.threads):
        dataset = ensure_dataset(paths, config.data, progress)
        parts = build_parts(paths.parts, config.parts, progress=progress)
        data_seconds = time.perf_counter() - start
        datasets = {
            "pretrain": load_llava_json(dataset.pretrain, dataset.root),
            "instruct": load_llava_json(dataset.instruct, dataset.root),
        }
        test_rows = load_test_rows(dataset.test, dataset.root)
        variants = VARIANTS + EXTRA_VARIANTS
        total = (len(variants) + 1) * config.num_seeds
        per_run: dict[str, list[dict]] = {v.key: [] for v in variants}
        per_run[STOCK_KEY] = []
        index = 0
        for seed in config.seeds:
            for variant in variants:
                index += 1
                done = _finished(paths.run(variant.key, seed))
                per_run[variant.key].append(done or run_variant(variant, parts, datasets, test_rows, paths, config,
                                                                (index, total), progress, seed))
            index += 1
            done = _finished(paths.run(STOCK_KEY, seed))
            per_run[STOCK_KEY].append(done or run_stock(parts, datasets, test_rows, paths, config, (index, total),
                                                        progress, seed))
        environment_now = environment()
    baseline = per_run[VARIANTS[0].key]
    rows = [aggregate(runs, None if key == VARIANTS[0].key else baseline) for key, runs in per_run.items()]
    contrasts = [contrast(rows, per_run, key, reference) for key, reference in CONTRASTS]

    with open(dataset.info, encoding="utf-8") as handle:
        info = json.load(handle)
    best = pick_best(rows)
    results = {
        "setup": {"summary": _setup_summary(config, parts), "config": config.to_dict()},
        "dataset": {"rows": info["rows"], "chance_accuracy": info["chance_accuracy"],
                    "text_only_accuracy_test": info["text_only_accuracy_test"], "folder": "data"},
        "parts": parts.info,
        "baseline_key": VARIANTS[0].key,
        "seeds": config.seeds,
        "environment": environment_now,
        "rows": rows,
        "contrasts": contrasts,
        "best": {"name": best["name"], "key": best["key"], "folder": BEST_DIR,
                 "criterion": "highest real-image average accuracy (mean over the seeds) among the paper's four "
                              "variants, on the test split (no validation split: the selected variant's test accuracy "
                              "is optimistic); the folder holds its first seed's run",
                 "seed": best["seeds"][0]},
        "timing": {},
    }
    results["timing"] = {
        "total_seconds": time.perf_counter() - start,
        "data_and_parts_seconds": data_seconds,
        "runs_seconds": {row["key"]: row["seconds"].get("total") for row in rows},  # summed over seeds
        "torch_threads": config.threads or torch.get_num_threads(),
        "load_average_start": load_start,
        "load_average_end": os.getloadavg()[0],
        "note": f"{config.threads or torch.get_num_threads()} torch thread(s); 1-min load average "
                f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
    }
    write_figures(results, paths.root)
    write_best_model(best, results, paths)
    results["timing"]["total_seconds"] = time.perf_counter() - start
    write_tables(results, paths.root)
    return results


# ---------------------------------------------------------------------------------------------------- CLI


def make_parser() -> argparse.ArgumentParser:
    from llava_normaligned.timings import stated

    parser = argparse.ArgumentParser(
        prog="llava-normaligned demo",
        description="The paper's comparison (Tables 4 and 5) at CPU scale on synthetic images: data, tiny models, both "
                    "stages for each variant plus stock LLaVA, results table, figures and the best checkpoint "
                    f"(the one-seed, five-row version: {stated('demo')}; the three-seed default is not yet timed quietly).",
    )
    parser.add_argument("--output-dir", required=True, help="folder for everything the demo writes")
    parser.add_argument("--quick", action="store_true",
                        help=f"a CI-sized run ({stated('demo_quick')}; numbers meaningless)")
    parser.add_argument("--seed", type=int, default=None, help="first training seed (default 42)")
    parser.add_argument("--seeds", type=int, default=None, dest="num_seeds",
                        help="how many seeds each row is trained with (seed, seed + 1, ...; default 3, --quick 2)")
    parser.add_argument("--stage1-steps", type=int, default=None)
    parser.add_argument("--stage2-steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--llm-layers", type=int, default=None,
                        help="decoder layers of the tiny LLM (default 2): more depth for the per-layer mechanism to act "
                             "over; each run then takes longer")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default 1: fastest for these tiny models; 0 = torch's default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    config = DemoConfig.quick() if args.quick else DemoConfig.full()
    overrides = {name: value for name, value in (("seed", args.seed), ("stage1_steps", args.stage1_steps),
                                                 ("stage2_steps", args.stage2_steps), ("batch_size", args.batch_size),
                                                 ("threads", args.threads), ("num_seeds", args.num_seeds))
                 if value is not None}
    for name, value in overrides.items():
        if value < 0 or (value == 0 and name not in ("seed", "threads")):
            flag = "seeds" if name == "num_seeds" else name.replace("_", "-")
            raise ValueError(f"--{flag} must be positive, got {value}")
    if args.llm_layers is not None:
        if args.llm_layers < 1:
            raise ValueError(f"--llm-layers must be positive, got {args.llm_layers}")
        text = dataclasses.replace(config.parts.text, num_hidden_layers=args.llm_layers)
        overrides["parts"] = dataclasses.replace(config.parts, text=text)
    return dataclasses.replace(config, **overrides)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    try:
        results = run_demo(args.output_dir, config, progress=not args.no_progress)
    except FileExistsError as error:
        print(f"llava-normaligned demo: error: {error}", file=sys.stderr)
        return 2
    with open(os.path.join(args.output_dir, "results.md"), encoding="utf-8") as handle:
        print("\n" + handle.read())
    print(f"wrote {args.output_dir}: results.md, results.json, figures/, {BEST_DIR}/ "
          f"({results['timing']['total_seconds']:.0f} s)")
    return 0
