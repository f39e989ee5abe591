"""The CPU demo: the paper's comparison (Li et al., arXiv 2512.08374, Tables 4 and 5) at CPU scale, one command.

    llava-normaligned demo --output-dir ./demo            # 3 seeds x 8 rows: about 2-7 minutes on 2 CPU cores (measured 147-417 s)
    llava-normaligned demo --output-dir ./demo-ci --quick # about 20-40 s on 2 CPU cores (measured 20-38 s): 2 x 8 runs, for CI

Nothing is downloaded. In order:

1. ``data/``: the synthetic visual-question dataset (``synthetic.py``): captions for stage 1, questions for stage 2,
   a held-out test split; answers balanced within every question, so the text alone scores chance.
2. ``parts/``: a tiny vision encoder and a tiny LLM, each pre-trained for seconds (``parts.py``), so that a
   LLaVA built from them can learn to see in the minutes the demo has. With ``--text-model`` the LLM is a real
   pretrained one instead (``real_llm.py``: the offline SmolLM2-135M-Instruct, a folder or a Hub id), used as it is
   with its own tokenizer and chat template, and trained in bf16 autocast where the CPU has bf16 matrix
   instructions; its rows by default are the paper's four and the stock row (``--rows`` picks any).
3. ``runs/<variant>/seed<k>/``: for each of the paper's four variants (w/o Norm; norm with default init; norm with
   target init, without and with GWC), for GWC with per-part clipping (``StageConfig.clip_per_part``), for target
   init without and with GWC trained without gradient clipping, and for each seed (``num_seeds``, default 3): both
   LLaVA-1.5 stages with this package's ``train_stage`` (TRL's SFTTrainer), the test split scored with the real
   images and with blank ones (``scoring.py``), and the per-layer hidden-state norms and directions of each
   modality (``mechanism.py``, through the diagnostics' residual tap). The three rows beside the paper's four differ
   from their paper row in stage 2 only, and continue from that row's stage-1 model (``run_group``). The runs are
   trained by ``workers`` processes side by side (default: one per core, at most 2), each run seeded and
   single-threaded, so the numbers do not depend on the number of workers.
   ``runs/stock/seed<k>/``: transformers' own ``LlavaForConditionalGeneration`` trained by TRL's own ``SFTTrainer``
   in one stage with the same number of steps, the baseline a user of stock LLaVA would get.
4. ``results.md`` / ``results.json`` (Tables 4 and 5 layout with mean ± 95% interval over seeds and paired
   differences to w/o Norm (``stats.py``), real and blank accuracy, vision/text norm ratios, the optimizer step per
   part (pre-clip gradient norms, clip coefficient, update sizes), the per-layer profiles, the machine's torch
   version, threads and CPU capability), ``figures/*.png``, and ``best_model/``: the paper's method (target init
   with GWC; another row with ``--best-model-variant``) as the run of its seed with the highest real-image average,
   a Hub-ready folder (weights, remote code, processor, model card, the demo's results under ``eval/``).

A finished run (``runs/<variant>/result.json``), the data and the parts are reused when the demo is run again with
the same settings in the same folder, so an interrupted demo resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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

from llava_normaligned.atomic_files import write_json_atomic
from llava_normaligned.tiny import TinyTextSpec, TinyVisionSpec

from . import synthetic
from .mechanism import layer_profile
from .parts import (
    EXTRA_VARIANTS,
    VARIANTS,
    Parts,
    PartsConfig,
    Variant,
    build_parts,
    compose_variant,
    parts_dict,
    pre_norm_image_norm,
    set_norm_gap,
    stock_llava,
)
from .scoring import load_test_rows, score_model
from .text_pretrain import TextPretrainConfig
from .vision_pretrain import VisionPretrainConfig

logger = logging.getLogger(__name__)

CONFIG_FILE = "demo_config.json"
RESULT_FILE = "result.json"
BEST_DIR = "best_model"
STOCK_KEY = "stock"
STOCK_NAME = "stock LLaVA, stock TRL (one stage)"
# Every row, in the tables' order (``--rows`` picks among them); the default with a real LLM: the paper's four and
# the stock row.
ROW_KEYS = tuple(v.key for v in VARIANTS + EXTRA_VARIANTS) + (STOCK_KEY,)
REAL_LLM_ROWS = tuple(v.key for v in VARIANTS) + (STOCK_KEY,)


# ---------------------------------------------------------------------------------------------------- config


@dataclass
class DemoConfig:
    """Everything the demo's numbers depend on. ``full()`` is the README's run; ``quick()`` the CI-sized one."""

    data: synthetic.SyntheticSpec = field(default_factory=synthetic.SyntheticSpec)
    parts: PartsConfig = field(default_factory=PartsConfig)
    batch_size: int = 16
    # Eight rows x three seeds of a 4-layer LLM within ten minutes on 2 cores (docs/demo.md, Time): two worker
    # processes, rows that differ only in stage 2 share their stage 1, and 60 + 150 steps a run (the 2-layer
    # demo's 100 + 300 and 200 + 600 steps, and what they measured, are in docs/demo.md's history).
    stage1_steps: int = 60
    stage2_steps: int = 150
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
    # The rows trained (keys of ROW_KEYS, in that order; w/o Norm, the baseline, always); None: the default, every
    # row with the tiny LLM, REAL_LLM_ROWS with a real one (``row_keys``).
    rows: tuple | None = None
    # A real LLM's (``parts.text_model``) training and scoring precision: "bfloat16" (autocast) or "float32"
    # (``real_llm.compute_dtype``); None: the tiny LLM's float32.
    compute_dtype: str | None = None
    # A real LLM's training batches and attention (benchmarks/bench_training_speed.py measured them on these rows):
    # rows ordered by length (``trainer/sampling.py``, as ``train --train_sampling_strategy
    # group_by_modality_length``), padded (a grouped batch has almost no padding left; ``padding_free`` packs it,
    # ``trainer/padding_free.py``), and eager attention while training: on rows of ~70 tokens torch's CPU sdpa
    # backward costs more than the whole eager attention (docs/training.md). None: the tiny LLM's padded batches in
    # random order, sdpa.
    padding_free: bool | None = None
    train_sampling_strategy: str | None = None
    attn_implementation: str | None = None
    # The image tokens' norm at the LLM input before training, without the norm layer, in units of the LLM's text
    # norm T (``parts.set_norm_gap``: the projector's output layer scaled to it on the probe images); None: as the
    # projector's draw gives it (about 38x for the tiny LLM, 6x for SmolLM2-135M).
    norm_gap: float | None = None
    # Held-out accuracy during training (``trainer/held_out.py``, as ``train --held_out_data_path``): every
    # ``curve_every`` steps of each stage, on ``curve_questions`` test questions spread over the templates; None: no
    # curves (the tiny demo's record is what it was).
    curve_every: int | None = None
    curve_questions: int | None = None
    # Where the runs train and score: None, the CPU; "cuda" (``demo --device cuda``: the GPU script,
    # benchmarks/gpu_demo.sh), a real LLM then in bf16 autocast.
    device: str | None = None

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

    @classmethod
    def real_llm(cls, text_model: str, compute_dtype: str, quick: bool = False) -> DemoConfig:
        """The demo with a real pretrained LLM (``--text-model``; ``real_llm``): the tiny vision encoder pre-trained
        as in the tiny demo, the LLM as it is (no text pre-training), steps, rates and batch sizes for a model of
        that size (docs/demo.md, "A real pretrained LLM")."""
        base = cls.quick() if quick else cls.full()
        parts = dataclasses.replace(base.parts, text=None, text_pretrain=None, text_model=text_model)
        sizes = REAL_LLM_QUICK if quick else REAL_LLM_FULL
        return dataclasses.replace(base, parts=parts, compute_dtype=compute_dtype, **sizes)

    @property
    def real(self) -> bool:
        return self.parts.text_model is not None

    @property
    def row_keys(self) -> tuple:
        if self.rows is not None:
            return tuple(self.rows)
        return REAL_LLM_ROWS if self.real else ROW_KEYS

    @property
    def seeds(self) -> list[int]:
        return [self.seed + i for i in range(self.num_seeds)]

    def to_dict(self) -> dict:
        """As recorded in ``demo_config.json`` and ``results.json``: the fields of the real-LLM demo and ``rows``
        only where they are set, so the tiny demo's record is what it was before they existed."""
        data = json.loads(json.dumps(asdict(self)))
        data["parts"] = parts_dict(data["parts"])
        return {k: v for k, v in data.items() if not (k in OPTIONAL_FIELDS and v is None)}


OPTIONAL_FIELDS = ("rows", "compute_dtype", "padding_free", "train_sampling_strategy", "attn_implementation",
                   "norm_gap", "curve_every", "curve_questions", "device")
# A real LLM's steps, rates and sizes (docs/demo.md, "A real pretrained LLM": how they were chosen).
REAL_LLM_BATCHES = {"padding_free": False, "train_sampling_strategy": "group_by_modality_length",
                    "attn_implementation": "eager"}
# LLaVA-1.5's image tokens enter Vicuna at about 40x its text norm (the paper's RQ2: 39.96 after the projector,
# text embeddings 0.80-1.38); the projector's draw alone gives SmolLM2-135M about 6x
REAL_LLM_NORM_GAP = 40.0
# The default with a real LLM asks the paper's question, target init + GWC against w/o Norm, with as much power as
# 2 hours on 2 CPU cores allow (sized from the pilot's spread for about 3 points; the committed run detects 4.4): 8
# seeds of the two rows, 256 test questions per template, one pass over 960 captions (60 steps of 16) and 90 stage-2
# steps; ``--rows`` adds the other rows (docs/demo.md, "The committed run").
REAL_LLM_PAIR = ("no_norm", "norm_target_init_gwc")
REAL_LLM_FULL = {"data": synthetic.SyntheticSpec(train_per_template=192, test_per_template=256), "num_seeds": 8,
                 "rows": REAL_LLM_PAIR,
                 "batch_size": 16, "stage1_steps": 60, "stage2_steps": 90, "stage1_lr": 1e-3, "stage2_lr": 1e-4,
                 "stage2_vision_lr": 2e-5, "logging_steps": 5, "eval_batch_size": 64, "norm_gap": REAL_LLM_NORM_GAP,
                 "curve_every": 10, "curve_questions": 64, **REAL_LLM_BATCHES}
REAL_LLM_QUICK = {"batch_size": 4, "stage1_steps": 2, "stage2_steps": 2, "stage1_lr": 1e-3, "stage2_lr": 1e-4,
                  "stage2_vision_lr": 2e-5, "logging_steps": 1, "probe_images": 8, "layer_probe_images": 4,
                  "eval_batch_size": 80, "norm_gap": REAL_LLM_NORM_GAP, "curve_every": 1, "curve_questions": 8,
                  **REAL_LLM_BATCHES}


def config_from_dict(data: dict) -> DemoConfig:
    """Inverse of ``DemoConfig.to_dict`` (reads ``demo_config.json``)."""
    parts = dict(data["parts"])
    parts["vision"] = TinyVisionSpec(**parts["vision"])
    parts["text"] = TinyTextSpec(**parts["text"]) if parts["text"] else None
    parts["vision_pretrain"] = VisionPretrainConfig(**parts["vision_pretrain"])
    parts["text_pretrain"] = TextPretrainConfig(**parts["text_pretrain"]) if parts["text_pretrain"] else None
    fields = dict(data, data=synthetic.SyntheticSpec(**data["data"]), parts=PartsConfig(**parts))
    if fields.get("rows") is not None:
        fields["rows"] = tuple(fields["rows"])
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
    write_json_atomic(path, payload, indent=1, default=str)


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
    on the CPU (a real LLM: bf16 autocast where ``config.compute_dtype`` says so), no checkpoints (a run is minutes),
    norm-tracking every ``logging_steps``."""
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
        use_cpu=config.device in (None, "cpu"),
        bf16=config.compute_dtype == "bfloat16",  # autocast over float32 master weights (a real LLM on a bf16 CPU)
        fp16=False,
        activation_checkpointing=False,  # TRL's default is on; nothing to save at this size
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        max_length=None,
        padding_free=bool(config.padding_free),
        train_sampling_strategy=config.train_sampling_strategy or "random",
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
    from llava_normaligned.part_metrics import vision_text_norm_ratio

    return vision_text_norm_ratio(model, pixels)["vision_text_ratio"]


@functools.lru_cache(maxsize=1)
def _text_references(text_dir: str) -> list:
    """The original LLM's answers and distributions on the held-out text prompts (``text_drift``), once a process."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .text_drift import reference_answers

    llm = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    return reference_answers(llm, AutoTokenizer.from_pretrained(text_dir))


def text_drift_reading(model, parts: Parts) -> dict:
    """KL of ``model``'s LLM on text alone from the original LLM (``text_drift``)."""
    from .text_drift import text_kl

    return text_kl(model, _text_references(parts.text_dir))


def pre_norm_ratio(model, pixels) -> float:
    """The image tokens' norm before the projector's norm layer over T: the gap the norm layer closes."""
    from llava_normaligned.part_metrics import text_embedding_norm

    return pre_norm_image_norm(model, pixels) / text_embedding_norm(model)


def _header(index: int, total: int, name: str, what: str) -> None:
    print(f"[{index}/{total}] {name}: {what}", file=sys.stderr, flush=True)


def step_times(position: tuple[int, int], name: str, what: str, every: int) -> list:
    """With a real LLM a step takes seconds: a callback that prints the row, the step and the seconds per step (mean
    since the last line) after the first step, every ``every`` steps and the last, in the run's header format."""
    from transformers import TrainerCallback

    class StepTimes(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.mark = (state.global_step, time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            step = state.global_step
            if step == 1 or step % every == 0 or step == state.max_steps:
                before, then = self.mark
                now = time.perf_counter()
                _header(*position, name, f"{what}, step {step}/{state.max_steps}, "
                                         f"{(now - then) / max(1, step - before):.1f} s/step")
                self.mark = (step, now)

    return [StepTimes()]


def _callbacks(config: DemoConfig, position: tuple[int, int], name: str, what: str) -> list:
    return step_times(position, name, what, max(1, config.logging_steps)) if config.real else []


def compute_autocast(config: DemoConfig):
    """Scoring in the precision the run trained in: bf16 autocast with a real LLM on a CPU with bf16 matmul, else
    nothing changed."""
    if config.compute_dtype == "bfloat16":
        return torch.autocast("cuda" if config.device == "cuda" else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def stage_rates(config: DemoConfig, stage: int) -> dict:
    """The per-part learning rates of ``stage`` (``StageConfig``'s ``lr_*`` fields)."""
    if stage == 1:
        return {"lr_projector": config.stage1_lr}
    return {"lr_llm": config.stage2_lr, "lr_projector": config.stage2_lr, "lr_vision": config.stage2_vision_lr}


@contextlib.contextmanager
def frozen_heap():
    """The Trainer runs a full ``gc.collect()`` when training starts (accelerate's ``free_memory``), which scans every
    object of the process: about 1.6 s a stage here, with torch, transformers, TRL and the data loaded, a stage of
    a few dozen steps included. The objects alive before training are moved out of the collector's sight for the
    stage (``gc.freeze``) and handed back after, so that scan sees only what the stage creates."""
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def curve_callback(config: DemoConfig, processor, test_rows, folder: str, every: int | None = None):
    """The held-out accuracy callback of one stage (every ``every`` steps, default ``config.curve_every``), or None:
    ``curve_questions`` test questions taken at an even stride through the test split, so every template is in
    them."""
    if not config.curve_every:
        return None
    from llava_normaligned.trainer.held_out import HeldOutAccuracyCallback, HeldOutRow

    count = min(config.curve_questions or len(test_rows), len(test_rows))
    stride = max(1, len(test_rows) // count)
    rows = [HeldOutRow(r.question, r.answer, r.image_path, r.template) for r in test_rows[::stride][:count]]
    return HeldOutAccuracyCallback(rows, processor, every or config.curve_every, batch_size=config.eval_batch_size,
                                   max_new_tokens=6, output_dir=folder)


def train_demo_stage(model, processor, dataset, stage: int, steps: int, lr: float, variant: Variant, folder: str,
                     config: DemoConfig, seed: int, progress: bool, position: tuple[int, int] = (1, 1),
                     callbacks: list | None = None):
    """One stage of one run (``train_stage``'s result). Stage 1 trains with the defaults (clipping at 1.0,
    globally); a row's own ``max_grad_norm`` and ``clip_per_part`` apply to stage 2 (``Variant``). ``callbacks``:
    more ``TrainerCallback``s."""
    from llava_normaligned.trainer.train import StageConfig, train_stage

    own = stage == 2
    if config.attn_implementation:
        model.set_attn_implementation(config.attn_implementation)
    with trainer_console_to(os.path.join(folder, f"stage{stage}_trainer_log.txt")), frozen_heap():
        return train_stage(model, processor, dataset,
                           stage=StageConfig(stage, clip_per_part=variant.clip_per_part and own,
                                             **stage_rates(config, stage)),
                           args=sft_args(os.path.join(folder, f"stage{stage}"), steps, lr, config, seed,
                                         disable_tqdm=not progress,
                                         max_grad_norm=variant.max_grad_norm if own else 1.0),
                           callbacks=_callbacks(config, position, variant.name, f"seed {seed}, stage {stage}")
                           + list(callbacks or ()))


def run_stage1(variant: Variant, parts: Parts, datasets: dict, test_rows, paths: DemoPaths, config: DemoConfig,
               position: tuple[int, int], progress: bool, seed: int) -> dict:
    """Stage 1 of ``variant`` with ``seed``: the starting point of every row in its ``stage1_group`` (returned with
    the trained weights, so that each of them continues from a copy)."""
    from llava_normaligned.part_metrics import gain_statistics

    folder = paths.run(variant.key, seed)
    start = time.perf_counter()
    torch.manual_seed(seed)
    model, processor = compose_variant(parts, variant, seed=seed)
    pixels = probe_pixels(processor, test_rows, config.probe_images)
    gap = set_norm_gap(model, pixels, config.norm_gap) if config.norm_gap else None
    ratio = {"init": norm_ratio(model, pixels), "pre_norm_init": pre_norm_ratio(model, pixels)}
    gains = {"init": gain_statistics(model)}
    layers_init = layer_profile(model, processor, test_rows, config.layer_probe_images)
    _header(*position, variant.name, f"seed {seed}, stage 1, {config.stage1_steps} steps")
    # stage 1 trains on captions, so the questions are read at its start and end only (in between they score 0)
    curve = curve_callback(config, processor, test_rows, os.path.join(folder, "stage1"), every=config.stage1_steps)
    result = train_demo_stage(model, processor, datasets["pretrain"], 1, config.stage1_steps, config.stage1_lr,
                              variant, folder, config, seed, progress, position, callbacks=[curve] if curve else None)
    model = result.model
    ratio["after_stage1"] = norm_ratio(model, pixels)
    gains["after_stage1"] = gain_statistics(model)
    return {"key": variant.key, "seed": seed, "pixels": pixels, "ratio": ratio, "gains": gains, "norm_gap": gap,
            "layers_init": layers_init, "curve": curve.records if curve else None,
            "tracking": result.norm_tracking, "loss": result.metrics.get("train_loss"),
            "seconds": time.perf_counter() - start,
            "checkpoint": os.path.relpath(os.path.join(folder, "stage1"), paths.root),
            "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def run_variant(variant: Variant, parts: Parts, datasets: dict, test_rows, paths: DemoPaths, config: DemoConfig,
                position: tuple[int, int], progress: bool, seed: int, stage1: dict | None = None) -> dict:
    """Both stages of one variant with one seed, then its scores. Returns that run's row (also ``result.json``).
    ``stage1``: a ``run_stage1`` result of a row of the same ``stage1_group`` and seed to continue from (its stage 1
    is then not trained again); None: train stage 1 here."""
    if stage1 is None:
        stage1 = run_stage1(variant, parts, datasets, test_rows, paths, config, position, progress, seed)
    from llava_normaligned.part_metrics import gain_statistics

    folder = paths.run(variant.key, seed)
    start = time.perf_counter()
    torch.manual_seed(seed)
    model, processor = compose_variant(parts, variant, seed=seed)
    model.load_state_dict(stage1["state"])
    pixels = stage1["pixels"]
    ratio, gains = dict(stage1["ratio"]), dict(stage1["gains"])
    shared = stage1["key"] != variant.key
    seconds = {"stage1": 0.0 if shared else stage1["seconds"]}
    _header(*position, variant.name, f"seed {seed}, stage 2, {config.stage2_steps} steps"
            + (f" (stage 1: {stage1['key']}'s)" if shared else ""))
    tic = time.perf_counter()
    curve = curve_callback(config, processor, test_rows, os.path.join(folder, "stage2"))
    result = train_demo_stage(model, processor, datasets["instruct"], 2, config.stage2_steps, config.stage2_lr,
                              variant, folder, config, seed, progress, position, callbacks=[curve] if curve else None)
    seconds["stage2"] = time.perf_counter() - tic
    model = result.model
    tracking = {"stage1": stage1["tracking"], "stage2": result.norm_tracking}
    losses = {"stage1": stage1["loss"], "stage2": result.metrics.get("train_loss")}
    ratio["after_stage2"] = norm_ratio(model, pixels)
    ratio["pre_norm_after_stage2"] = pre_norm_ratio(model, pixels)
    gains["after_stage2"] = gain_statistics(model)

    scores, layers, drift, seconds["scoring"] = read_out(model, processor, parts, test_rows, config, progress,
                                                         position, variant.name, variant.key)
    seconds["total"] = seconds["stage1"] + time.perf_counter() - start
    row = {
        "name": variant.name, "key": variant.key, "seed": seed, "training": variant.training_fields(),
        "layers": layers, "layers_init": stage1["layers_init"], **({"text_drift": drift} if drift else {}),
        **({"curve": {"stage1": stage1["curve"], "stage2": curve.records}} if curve else {}),
        "recipe": "two stages (this package's train_stage: TRL SFTTrainer, answer-only labels, per-part rates)",
        "model_class": type(model).__name__, "variant": variant.config_fields(),
        "checkpoint": os.path.relpath(os.path.join(folder, "stage2"), paths.root),
        "stage1_checkpoint": stage1["checkpoint"], "stage1_shared_with": stage1["key"] if shared else None,
        "accuracy": scores.accuracy, "visual_gain": scores.visual_gain, "examples": scores.examples,
        "norm_ratio": ratio, "gain_stats": gains, "tracking": tracking, "train_loss": losses,
        "steps": {"stage1": config.stage1_steps, "stage2": config.stage2_steps}, "seconds": seconds,
        **({"norm_gap": stage1["norm_gap"]} if stage1.get("norm_gap") else {}),
    }
    _write_json(row, os.path.join(folder, RESULT_FILE))
    return row


def run_group(variants: list[Variant], parts: Parts, datasets: dict, test_rows, paths: DemoPaths,
              config: DemoConfig, positions: list[tuple[int, int]], progress: bool, seed: int) -> list[dict]:
    """The rows of one ``stage1_group`` with one seed: stage 1 once (in the first row's folder), then each row's
    stage 2 from a copy of it. Finished rows (``result.json``) are read, not trained again."""
    rows = [_finished(paths.run(v.key, seed)) for v in variants]
    if all(rows):
        return rows
    stage1 = run_stage1(variants[0], parts, datasets, test_rows, paths, config, positions[0], progress, seed)
    return [row or run_variant(v, parts, datasets, test_rows, paths, config, p, progress, seed, stage1=stage1)
            for v, p, row in zip(variants, positions, rows)]


def read_out(model, processor, parts: Parts, test_rows, config: DemoConfig, progress: bool,
             position: tuple[int, int], name: str, key: str):
    """A trained run's readings: its answers on the test split (real and blank images), the per-layer profile and,
    with a real LLM, the text drift. Returns the scores, the layers, the drift (None with the tiny LLM) and the
    seconds scoring took."""
    _header(*position, name, "scoring the test split (real and blank images)")
    tic = time.perf_counter()
    with compute_autocast(config):
        scores = score_model(model.eval(), processor, test_rows, image_size=config.data.image_size,
                             batch_size=config.eval_batch_size, progress=progress, desc=f"scoring {key}")
    scoring = time.perf_counter() - tic
    layers = layer_profile(model, processor, test_rows, config.layer_probe_images)
    drift = text_drift_reading(model, parts) if config.real else None
    return scores, layers, drift, scoring


def stock_model(parts: Parts, test_rows, config: DemoConfig, seed: int):
    """The stock row's model: stock ``LlavaForConditionalGeneration`` with the w/o Norm row's weights at ``seed``
    (the same projector draw, scaled to ``config.norm_gap``), its vision tower frozen; with a real LLM, the chat
    template marked for TRL's ``assistant_only_loss``. Returns the model, its processor, the probe images' pixels
    and the norm gap set (None: as drawn)."""
    torch.manual_seed(seed)
    norm_aligned, processor = compose_variant(parts, VARIANTS[0], seed=seed)
    pixels = probe_pixels(processor, test_rows, config.probe_images)
    gap = set_norm_gap(norm_aligned, pixels, config.norm_gap) if config.norm_gap else None
    model = stock_llava(norm_aligned)
    del norm_aligned
    for param in model.model.vision_tower.parameters():
        param.requires_grad_(False)
    if config.real:  # TRL's assistant_only_loss reads {% generation %} markers, which a real LLM's template may lack
        from llava_normaligned.compose import multimodal_chat_template

        from .real_llm import marked_chat_template

        processor.chat_template = multimodal_chat_template(marked_chat_template(processor.tokenizer),
                                                           processor.tokenizer)
    return model, processor, pixels, gap


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
    model, processor, pixels, gap = stock_model(parts, test_rows, config, seed)
    ratio = {"init": norm_ratio(model, pixels), "pre_norm_init": pre_norm_ratio(model, pixels)}
    layers_init = layer_profile(model, processor, test_rows, config.layer_probe_images)

    _header(*position, STOCK_NAME, f"seed {seed}, one stage, {steps} steps")
    with trainer_console_to(os.path.join(folder, "trainer_log.txt")), frozen_heap():
        # stock TRL as shipped: padded batches in random order (TRL refuses padding-free batches of images); the
        # attention the other rows train with (a choice of kernel, not of model)
        if config.attn_implementation:
            model.set_attn_implementation(config.attn_implementation)
        args = sft_args(os.path.join(folder, "model"), steps, config.stage2_lr,
                        dataclasses.replace(config, padding_free=None, train_sampling_strategy=None), seed,
                        assistant_only_loss=True, disable_tqdm=not progress)
        curve = curve_callback(config, processor, test_rows, args.output_dir)
        trainer = SFTTrainer(model=model, args=args, train_dataset=datasets["instruct"], processing_class=processor,
                             callbacks=_callbacks(config, position, STOCK_NAME, f"seed {seed}, one stage")
                             + ([curve] if curve else []) or None)
        NormTrackingCallback.install(trainer)
        output = trainer.train()
        trainer.save_model(args.output_dir)
    seconds = {"train": time.perf_counter() - start}
    ratio["after_stage2"] = norm_ratio(model, pixels)  # one stage: reported in the end-of-training column
    ratio["pre_norm_after_stage2"] = pre_norm_ratio(model, pixels)

    scores, layers, drift, seconds["scoring"] = read_out(model, processor, parts, test_rows, config, progress,
                                                         position, STOCK_NAME, STOCK_KEY)
    seconds["total"] = time.perf_counter() - start
    row = {
        "name": STOCK_NAME, "key": STOCK_KEY, "seed": seed,
        "training": {"max_grad_norm": args.max_grad_norm, "clip_per_part": False},
        "layers": layers,
        "layers_init": layers_init,
        **({"text_drift": drift} if drift else {}),
        **({"curve": {"one_stage": curve.records}} if curve else {}),
        "recipe": "one stage on the questions (TRL SFTTrainer as shipped, assistant_only_loss); vision tower frozen",
        "model_class": type(model).__name__,
        "variant": {"projector_norm": None},
        "checkpoint": os.path.relpath(args.output_dir, paths.root),
        "accuracy": scores.accuracy,
        "visual_gain": scores.visual_gain,
        "examples": scores.examples,
        **({"norm_gap": gap} if gap else {}),
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


# ------------------------------------------------------------------------------------- the runs, in parallel


@dataclass(frozen=True)
class Task:
    """The runs one process trains together: the rows of one ``stage1_group`` with one seed (stage 1 once), or the
    stock row with one seed. ``positions``: each row's [index/total] in the progress headers."""

    seed: int
    keys: tuple
    positions: tuple

    @property
    def cost(self) -> int:
        """Stages to train (the stock row's one long stage counts as two): the longest tasks are handed out first."""
        return 2 if self.keys == (STOCK_KEY,) else 1 + len(self.keys)


def demo_tasks(variants, seeds: list[int], stock: bool = True) -> list[Task]:
    """Every run of the demo as tasks, seed by seed, in the tables' row order (``stock``: with the stock row)."""
    total = (len(variants) + int(stock)) * len(seeds)
    tasks, index = [], 0
    for seed in seeds:
        groups: dict[tuple, list] = {}
        positions = {}
        for variant in variants:
            index += 1
            positions[variant.key] = (index, total)
            groups.setdefault(variant.stage1_group(), []).append(variant)
        for group in groups.values():
            tasks.append(Task(seed, tuple(v.key for v in group), tuple(positions[v.key] for v in group)))
        if stock:
            index += 1
            tasks.append(Task(seed, (STOCK_KEY,), ((index, total),)))
    return tasks


def row_variants(config: DemoConfig) -> list[Variant]:
    """The variants among the demo's rows (``config.row_keys``), in the tables' order."""
    return [v for v in VARIANTS + EXTRA_VARIANTS if v.key in config.row_keys]


def default_workers() -> int:
    """Processes that train runs side by side: one per core, at most 2 (each run uses one torch thread)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cores))


def _run_task_here(task: Task, parts: Parts, datasets: dict, test_rows, paths: DemoPaths, config: DemoConfig,
                   progress: bool) -> list[dict]:
    if task.keys == (STOCK_KEY,):
        return [run_stock(parts, datasets, test_rows, paths, config, task.positions[0], progress, task.seed)]
    by_key = {v.key: v for v in VARIANTS + EXTRA_VARIANTS}
    return run_group([by_key[k] for k in task.keys], parts, datasets, test_rows, paths, config,
                     list(task.positions), progress, task.seed)


_WORKER_INPUTS: dict = {}  # per worker process: the demo folder's config, parts, datasets and test rows


def worker_init() -> None:
    """A spawned worker starts as a fresh Python, without the command's notice filters: install them (the
    progress-bar switches it inherits with the environment)."""
    from llava_normaligned.notices import quiet_known_notices

    quiet_known_notices([])


def _worker_task(task: Task, root: str) -> list[dict]:
    """A task in a worker process: it reads the settings, parts and data the main process wrote to ``root``."""
    from llava_normaligned.trainer.data import load_llava_json

    with quiet_libraries():
        if _WORKER_INPUTS.get("root") != root:
            with open(os.path.join(root, CONFIG_FILE), encoding="utf-8") as handle:
                config = config_from_dict(json.load(handle))
            paths = DemoPaths(root)
            dataset = synthetic.dataset_paths(paths.data)
            _WORKER_INPUTS.clear()
            _WORKER_INPUTS.update(
                root=root, config=config, paths=paths,
                parts=build_parts(paths.parts, config.parts, progress=False),
                datasets={"pretrain": load_llava_json(dataset.pretrain, dataset.root),
                          "instruct": load_llava_json(dataset.instruct, dataset.root)},
                test_rows=load_test_rows(dataset.test, dataset.root))
        w = _WORKER_INPUTS
        with torch_threads(w["config"].threads):
            return _run_task_here(task, w["parts"], w["datasets"], w["test_rows"], w["paths"], w["config"],
                                  progress=False)


def run_tasks(tasks: list[Task], paths: DemoPaths, config: DemoConfig, workers: int, progress: bool,
              local) -> dict[str, list[dict]]:
    """Run the unfinished tasks, in this process (``workers`` 1, or one task left: ``local(task)``) or in
    ``workers`` spawned processes, longest first. Every run is seeded and single-threaded, so its numbers do not
    depend on where or in which order it runs. Returns each row key's runs in seed order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    done = {}
    pending = []
    for task in tasks:
        found = [_finished(paths.run(key, task.seed)) for key in task.keys]
        if all(found):
            done[task] = found
        else:
            pending.append(task)
    if workers <= 1 or len(pending) <= 1:
        for task in pending:
            done[task] = local(task)
    else:
        context = multiprocessing.get_context("spawn")  # no forked copy of this process's torch / thread state
        with ProcessPoolExecutor(max_workers=min(workers, len(pending)), mp_context=context,
                                 initializer=worker_init) as pool:
            futures = {pool.submit(_worker_task, task, paths.root): task
                       for task in sorted(pending, key=lambda t: -t.cost)}
            for future in as_completed(futures):
                done[futures[future]] = future.result()
    per_run: dict[str, list[dict]] = {}
    for task in tasks:  # seed by seed: each key's runs come out in seed order
        for key, row in zip(task.keys, done[task]):
            per_run.setdefault(key, []).append(row)
    return {key: per_run[key] for key in ROW_KEYS if key in per_run}


# ------------------------------------------------------------------------------------------- over seeds

def aggregate(runs: list[dict], baseline: list[dict] | None) -> dict:
    """One row of the tables from the runs of one variant (one per seed, in seed order): each accuracy's mean and
    95% interval over seeds, its paired difference to ``baseline``'s runs (the same seeds; None for the baseline
    itself), and the means over seeds of the norm ratios, Table 5 statistics, optimizer-step statistics and
    per-layer profiles. The norm-tracking curves (figures) and ``checkpoint`` are the first seed's; ``per_seed``
    names each seed's checkpoint (``best_model/`` holds one row's best seed's, ``best_model_record``)."""
    from llava_normaligned.hub_cards.card import mean_of as _mean
    from llava_normaligned.hub_cards.card import optimizer_step_stats

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
    if all(r.get("curve") for r in runs):
        row["curve"] = curve_intervals([r["curve"] for r in runs], first["steps"].get("stage1", 0))
    if all(r.get("text_drift") for r in runs):
        row["text_kl_interval"] = mean_interval([r["text_drift"]["kl"] for r in runs]).to_dict()
        row["text_top1_agreement"] = _mean(r["text_drift"]["top1_agreement"] for r in runs)
        if baseline is not None and all(b.get("text_drift") for b in baseline):
            row["text_kl_paired"] = paired_difference([r["text_drift"]["kl"] for r in runs],
                                                      [b["text_drift"]["kl"] for b in baseline]).to_dict()
    if all(r.get("layers_init") for r in runs):
        row["layers_init"] = mean_profiles([r["layers_init"] for r in runs])
    row["per_seed"] = [{"seed": r["seed"], "real_avg": r["accuracy"]["real"]["avg"],
                        "blank_avg": r["accuracy"]["blank"]["avg"], "visual_gain": r["visual_gain"],
                        "checkpoint": r["checkpoint"], "seconds": r["seconds"].get("total")} for r in runs]
    row["seconds"] = {"total": sum(r["seconds"].get("total") or 0 for r in runs)}
    return row


def curve_intervals(curves: list[dict], stage1_steps: int) -> list[dict]:
    """Held-out accuracy over training, per step, mean and 95% interval over the seeds: ``[{"step", "stage",
    "mean", "half_width", "n"}]``, steps counted over both stages (a stage-2 reading at step s is at stage1_steps + s;
    the stock row's one stage as it is); only steps every seed read."""
    from .stats import mean_interval

    offsets = {"stage1": 0, "stage2": stage1_steps, "one_stage": 0}
    readings: dict[tuple, list[float]] = {}
    for curve in curves:
        for stage, records in curve.items():
            for record in records or ():
                if stage == "stage2" and record["step"] == 0:
                    continue  # the model stage 1 ended with, read again
                key = (offsets[stage] + record["step"], stage)
                readings.setdefault(key, []).append(record["accuracy"])
    return [{"step": step, "stage": stage, **mean_interval(values).to_dict()}
            for (step, stage), values in sorted(readings.items()) if len(values) == len(curves)]


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
    from llava_normaligned.trainer.engines import CPU_BF16_FLAGS, cpu_flags, cpu_model

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "cpu": cpu_model(),
            "cpu_bf16_flags": sorted(set(CPU_BF16_FLAGS) & cpu_flags())}


# ------------------------------------------------------------------------------------------- best model


# The row ``best_model/`` holds unless ``--best-model-variant`` names another: the paper's method (target-initialised
# norm with Global Weight Compensation). It is not picked by accuracy: with three seeds no row's difference to another
# is separated from zero (docs/demo.md), so a "best row" would be a draw of the seeds.
DEFAULT_BEST_VARIANT = "norm_target_init_gwc"
# The rows a ``best_model/`` can hold: this package's model class (the stock row is transformers' own class).
BEST_MODEL_CHOICES = tuple(v.key for v in VARIANTS + EXTRA_VARIANTS)
SEED_METRIC = "real_avg"  # the per-seed value the saved run is chosen by (``per_seed`` entries of a row)
SEED_METRIC_NAME = "real-image average accuracy"
SEED_METRIC_TEXT = "the mean over the question templates of one run's accuracy on the test split with the real images"


def pick_best_seed(row: dict) -> dict:
    """The run of ``row`` (its ``per_seed`` entry) that ``best_model/`` holds: the highest real-image average (ties:
    the larger visual gain, then the earlier seed)."""
    runs = row["per_seed"]
    return max(runs, key=lambda r: (round(r[SEED_METRIC], 6), round(r["visual_gain"], 6), -runs.index(r)))


def best_model_record(rows: list[dict], key: str = DEFAULT_BEST_VARIANT) -> dict:
    """What ``best_model/`` holds and how it was chosen (``results.json``'s ``best``): the row ``key`` (set by
    ``--best-model-variant``, not picked by accuracy) and, of that row's per-seed runs, the one ``pick_best_seed``
    picks, with every candidate's value, so that the choice can be checked against the row in the tables (the row's
    real-image average is the mean of those values)."""
    if key not in BEST_MODEL_CHOICES:
        raise ValueError(f"best_model/ can hold one of {', '.join(BEST_MODEL_CHOICES)}, not {key!r}")
    row = next((r for r in rows if r["key"] == key), None)
    if row is None:
        raise ValueError(f"the demo trained no row {key!r}")
    run = pick_best_seed(row)
    default = key == DEFAULT_BEST_VARIANT
    chosen_by = ("the paper's method, the default of `--best-model-variant`" if default
                 else f"chosen with `--best-model-variant {key}`")
    seeds = ", ".join(str(s["seed"]) for s in row["per_seed"])
    criterion = (
        f"row: {row['name']} ({key}), {chosen_by}; not picked by accuracy. Run: of that row's {len(row['per_seed'])} "
        f"runs (seeds {seeds}), the one with the highest {SEED_METRIC_NAME} ({SEED_METRIC_TEXT}; ties: the larger "
        "visual gain, then the earlier seed), picked on the test split it is reported on (there is no validation "
        "split, so that run's accuracy is optimistic); the row's real-image average in the tables is the mean of "
        "those per-seed values")
    return {
        "name": row["name"], "key": key, "folder": BEST_DIR, "row_chosen_by": chosen_by, "default_row": default,
        "criterion": criterion,
        "seed_chosen_from": {"row": row["name"], "key": key, "metric": SEED_METRIC, "metric_name": SEED_METRIC_NAME,
                             "metric_is": SEED_METRIC_TEXT,
                             "candidates": [{k: s[k] for k in ("seed", SEED_METRIC, "visual_gain")}
                                            for s in row["per_seed"]],
                             "row_mean": row["accuracy"]["real"]["avg"]},
        "seed": run["seed"], "seed_real_avg": run[SEED_METRIC],
    }


def write_best_model(best: dict, results: dict, paths: DemoPaths) -> str:
    """Copy the stage-2 folder of the row ``best`` (``best_model_record``) at its best seed (``pick_best_seed``) to
    ``best_model/`` with the demo's results in ``eval/`` and a model card (README.md) rendered from the folder; staged
    in a temporary folder and moved into place."""
    from llava_normaligned.hub_cards.card import CardOptions, render_card

    from .results_text import FIGURES_DIR, render_markdown, write_gwc_note

    run = pick_best_seed(best)
    source = os.path.join(paths.root, run["checkpoint"])
    staging = tempfile.mkdtemp(prefix=".best-", dir=paths.root)
    try:
        target = os.path.join(staging, f"llava-normaligned-demo-{best['key']}")  # the card's title
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("checkpoint-*", "*_trainer_log.txt"))
        evaluation = os.path.join(target, "eval")
        os.makedirs(evaluation)
        own = {k: best[k] for k in ("name", "variant", "accuracy", "visual_gain", "norm_ratio", "train_loss", "steps")}
        _write_json({"task": "llava-normaligned demo (synthetic shapes VQA, held-out test split)",
                     "selected_by": results["best"]["criterion"], "row_chosen_by": results["best"]["row_chosen_by"],
                     **own, "accuracy_is": "the mean over the seeds of this variant's runs",
                     "checkpoint_seed": run["seed"],
                     "checkpoint_accuracy": {"real_avg": run["real_avg"], "blank_avg": run["blank_avg"],
                                             "visual_gain": run["visual_gain"]},
                     "per_seed": best["per_seed"]},
                    os.path.join(evaluation, "results.json"))
        with open(os.path.join(evaluation, "results.md"), "w", encoding="utf-8") as handle:
            handle.write(render_markdown(results))
        shutil.copytree(os.path.join(paths.root, FIGURES_DIR), os.path.join(evaluation, FIGURES_DIR))
        write_gwc_note(target)  # the demo's GWC finding, stated under its card's GWC numbers (card_notes.json)
        render_card(target, CardOptions(license="apache-2.0", tags=("demo", "synthetic"))).save(
            os.path.join(target, "README.md"))
        if os.path.exists(paths.best):
            shutil.rmtree(paths.best)
        os.replace(target, paths.best)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths.best


# ---------------------------------------------------------------------------------------------- the demo


def compute_text(config: DemoConfig) -> str:
    """How the runs computed, in words (the report names it)."""
    if config.compute_dtype == "bfloat16":
        return ("bf16 autocast over float32 weights, training and scoring (this CPU has bf16 matrix instructions: "
                "AMX or AVX512-BF16)")
    return "float32 (this CPU has no bf16 matrix instructions, AMX or AVX512-BF16)" if config.real else "float32"


def batches_text(config: DemoConfig) -> str:
    """How the two-stage rows' batches were laid out, in words ('' for padded batches in random order)."""
    said = (["padding-free batches"] if config.padding_free else []) + (
        [f"{config.train_sampling_strategy.replace('_', ' ')} order"]
        if config.train_sampling_strategy not in (None, "random") else []) + (
        [f"{config.attn_implementation} attention"] if config.attn_implementation else [])
    return f"; {' and '.join(said)}" if said else ""


def _real_setup_summary(config: DemoConfig, parts: Parts) -> str:
    v, llm = config.parts.vision, parts.info["llm"]
    return (
        f"Tiny SigLIP ({v.hidden_size}-d, {v.num_hidden_layers} layers, {v.image_size} px, "
        f"{(v.image_size // v.patch_size) ** 2} image tokens), pre-trained for seconds on the synthetic images, + "
        f"{llm['label']}, a real pretrained LLM ({llm['hidden_size']}-d, {llm['num_hidden_layers']} layers, "
        f"{llm['parameters'] / 1e6:.0f}M parameters) with its own tokenizer and chat template, not trained on the "
        f"demo's text; T = {parts.info['text_embedding_norm']:.2f} (D = {llm['hidden_size']}). Compute: "
        f"{compute_text(config)}. Stage 1: {config.stage1_steps} steps on captions (projector + norm, lr "
        f"{config.stage1_lr:g}); stage 2: {config.stage2_steps} steps on questions (all parts; LLM/projector lr "
        f"{config.stage2_lr:g}, vision {config.stage2_vision_lr:g}); batch {config.batch_size}, cosine, warmup "
        f"{config.warmup}, seed {config.seed}"
        f"{f' to {config.seeds[-1]} ({config.num_seeds} seeds)' if config.num_seeds > 1 else ''}"
        f"{batches_text(config)}."
        + (f" Stock row: {config.stage1_steps + config.stage2_steps} steps, one stage."
           if STOCK_KEY in config.row_keys else "")
        + " Scoring: greedy decoding, exact match."
    )


def _setup_summary(config: DemoConfig, parts: Parts) -> str:
    if config.real:
        return _real_setup_summary(config, parts)
    v, t = config.parts.vision, config.parts.text
    return (
        f"Tiny SigLIP ({v.hidden_size}-d, {v.num_hidden_layers} layers, {v.image_size} px, "
        f"{(v.image_size // v.patch_size) ** 2} image tokens) + tiny Llama ({t.hidden_size}-d, "
        f"{t.num_hidden_layers} layers), both pre-trained for seconds on the synthetic data; stage 1: "
        f"{config.stage1_steps} steps on captions (projector + norm, lr {config.stage1_lr:g}); stage 2: "
        f"{config.stage2_steps} steps on questions (all parts; LLM/projector lr {config.stage2_lr:g}, vision "
        f"{config.stage2_vision_lr:g}); batch {config.batch_size}, cosine, warmup {config.warmup}, seed "
        f"{config.seed}"
        f"{f' to {config.seeds[-1]} ({config.num_seeds} seeds)' if config.num_seeds > 1 else ''}."
        + (f" Stock row: {config.stage1_steps + config.stage2_steps} steps, one stage."
           if STOCK_KEY in config.row_keys else "")
        + " Scoring: greedy decoding, exact match."
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


def _check_best_model_variant(best_model_variant: str, config: DemoConfig) -> None:
    """Before the training, not after it: ``best_model/`` holds a row the demo knows and trains."""
    if best_model_variant not in BEST_MODEL_CHOICES:
        raise ValueError(f"best_model/ can hold one of {', '.join(BEST_MODEL_CHOICES)}, not {best_model_variant!r}")
    if best_model_variant not in config.row_keys:
        raise ValueError(f"best_model/ holds a row the demo trains ({', '.join(config.row_keys)}), not "
                         f"{best_model_variant!r}")


def _say_data_and_parts(config: DemoConfig) -> None:
    if config.real:
        print(f"data and parts: the synthetic dataset, the vision encoder's pre-training, then "
              f"{config.parts.text_model} saved as a transformers folder (each reused when the folder already "
              "holds it)", file=sys.stderr, flush=True)
    else:
        print("data and parts: the synthetic dataset, then the vision encoder's and the LLM's pre-training (each "
              "reused when the folder already holds it)", file=sys.stderr, flush=True)


def _dataset_record(info_path: str) -> dict:
    with open(info_path, encoding="utf-8") as handle:
        info = json.load(handle)
    return {"rows": info["rows"], "chance_accuracy": info["chance_accuracy"],
            "text_only_accuracy_test": info["text_only_accuracy_test"], "folder": "data"}


def _timing_record(start: float, data_seconds: float, rows: list[dict], config: DemoConfig, workers: int,
                   load_start: float) -> dict:
    threads = config.threads or torch.get_num_threads()
    return {
        "total_seconds": time.perf_counter() - start,
        "data_and_parts_seconds": data_seconds,
        "runs_seconds": {row["key"]: row["seconds"].get("total") for row in rows},  # summed over seeds
        "torch_threads": threads,
        "workers": workers,
        "load_average_start": load_start,
        "load_average_end": os.getloadavg()[0],
        "note": f"{workers} worker process(es) of {threads} torch thread(s); 1-min load average "
                f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
    }


def run_demo(output_dir: str, config: DemoConfig, progress: bool = True, workers: int | None = None,
             best_model_variant: str = DEFAULT_BEST_VARIANT) -> dict:
    """Run the whole demo into ``output_dir``; returns the results (also written as ``results.json``). ``workers``:
    processes that train runs side by side (None: ``default_workers()``; 1: all in this process). With more than
    one, the progress bars of the runs are off (their headers stay). ``best_model_variant``: the row whose run
    ``best_model/`` holds, at its best seed (``best_model_record``); it changes no number, so a folder trained with
    one is reused with another."""
    workers = default_workers() if workers is None else workers
    _check_best_model_variant(best_model_variant, config)
    from llava_normaligned.trainer.data import load_llava_json

    from .results_text import write_figures, write_tables

    _require_matplotlib()  # the figures come last: fail now, not after the training
    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    paths = prepare_folder(output_dir, config)
    with quiet_libraries(), torch_threads(config.threads):
        _say_data_and_parts(config)
        dataset = ensure_dataset(paths, config.data, progress)
        parts = build_parts(paths.parts, config.parts, progress=progress)
        data_seconds = time.perf_counter() - start
        datasets = {
            "pretrain": load_llava_json(dataset.pretrain, dataset.root),
            "instruct": load_llava_json(dataset.instruct, dataset.root),
        }
        test_rows = load_test_rows(dataset.test, dataset.root)
        if config.real and STOCK_KEY in config.row_keys:  # before any training: can TRL mask this LLM's answers
            from transformers import AutoTokenizer

            from .real_llm import marked_chat_template

            marked_chat_template(AutoTokenizer.from_pretrained(parts.text_dir))
        tasks = demo_tasks(row_variants(config), config.seeds, stock=STOCK_KEY in config.row_keys)
        per_run = run_tasks(tasks, paths, config, workers, progress,
                            local=lambda task: _run_task_here(task, parts, datasets, test_rows, paths, config,
                                                              progress))
        environment_now = environment()
        if config.real:
            environment_now["compute_dtype"] = compute_text(config)
    baseline = per_run[VARIANTS[0].key]
    rows = [aggregate(runs, None if key == VARIANTS[0].key else baseline) for key, runs in per_run.items()]
    contrasts = [contrast(rows, per_run, key, reference) for key, reference in CONTRASTS
                 if key in per_run and reference in per_run]

    best = best_model_record(rows, best_model_variant)
    results = {
        "setup": {"summary": _setup_summary(config, parts), "config": config.to_dict()},
        "dataset": _dataset_record(dataset.info),
        "parts": parts.info,
        "baseline_key": VARIANTS[0].key,
        "seeds": config.seeds,
        "environment": environment_now,
        "rows": rows,
        "contrasts": contrasts,
        "best": best,
        "timing": {},
    }
    results["timing"] = _timing_record(start, data_seconds, rows, config, workers, load_start)
    write_figures(results, paths.root)
    write_best_model(next(r for r in rows if r["key"] == best["key"]), results, paths)
    results["timing"]["total_seconds"] = time.perf_counter() - start
    write_tables(results, paths.root)
    return results
