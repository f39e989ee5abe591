"""Train LLaVA-1.5's stage 1 or stage 2 with TRL's ``SFTTrainer`` (paper §5.2, Appendix E.1).

    llava-normaligned train --stage 1 --model ./llava-na-3b --data-path blip_laion_cc_sbu_558k.json \\
        --image-folder ./images --output-dir ./stage1 [--config recipe.yaml] [any SFTConfig flag]

Python API (what the ``train`` command, ``llava_normaligned.commands.train``, and the demo call):

    result = train_stage(model, processor, dataset, args=SFTConfig(...), stage=1)
    result = train_stage(model, processor, dataset, args=SFTConfig(...), stage=StageConfig(2, lr_vision=2e-6))
    result.model, result.metrics, result.norm_tracking, result.output_dir

``train_stage`` is ``run_stage(prepare_stage(...))``. ``prepare_stage`` does everything that can fail on the
inputs, before any training: the chat template (``args.chat_template_path``), the stage's freezing
(``stages.py``), the preparation of the rows (render, answer spans, length checks; ``preprocess.py``; once per
machine in a multi-process run), the answer-only collator (``collator.py``), the per-part learning rates and the
norm-tracking callback (``callbacks.py``). ``run_stage`` runs ``trainer.train()`` (resuming if asked; vision compute
that LLaVA never reads skipped, ``skip_unread_layers.py``) and saves the final model, processor,
``training_summary.json`` and ``norm_tracking.json`` in ``args.output_dir``; a run that SIGTERM stopped
(``callbacks.SigtermCheckpoint``, which ``train`` installs) keeps its last checkpoint and saves nothing as finished.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass, field

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import SFTConfig, SFTTrainer

from llava_normaligned.atomic_files import write_json_atomic
from llava_normaligned.checks import BadInput
from llava_normaligned.compat import TrainerHooks, forget_accelerate_preparation, fused_head_compacted_on_cpu
from llava_normaligned.families.anatomy import anatomy_of
from llava_normaligned.loading import LoadOptions
from llava_normaligned.local_paths import hide_local_paths, public_name, public_record
from llava_normaligned.part_metrics import gain_statistics, part_gradient_norms, part_parameters

from .arguments import (
    StageConfig,
    TrainConfig,
    check_chat_template_path,
)
from .callbacks import NormTrackingCallback, SigtermCheckpoint, Terminated, norm_records, will_log
from .collator import SKIPPED_KEY, LlavaTrainingCollator
from .engines import (
    cpu_training_threads,
    engine_summary,
    fit_fsdp_wrap_classes,
    optimizer_keeps_tensors,
    remove_wrapper_sources,
    take_fsdp_on_cpu,
)
from .held_out import HeldOutAccuracyCallback, load_held_out
from .padding_free import check_padding_free, multimodal_positions, packed_attention
from .preprocess import prepare_dataset
from .sampling import grouped_order_for
from .skip_unread_layers import skip_unused_vision_compute
from .stage_model import describe_variant
from .stages import StageLearningRates, freeze_for_stage, parameter_groups

logger = logging.getLogger(__name__)

SUMMARY_FILE = "training_summary.json"


@dataclass
class TrainStageResult:
    """What ``train_stage`` returns.

    Attributes:
        model: the trained model (a ``PeftModel`` when trained with a ``peft_config``).
        metrics: the Trainer's training metrics (``train_loss``, ``train_runtime``, ``train_samples_per_second``, ...).
        norm_tracking: the records written to ``norm_tracking.json``: ``[{"step", "epoch", "loss"?,
            "projector_output_norm", "text_embedding_norm", "vision_text_ratio", "gain_abs_mean"?, "gain_l2"?,
            "bias_abs_mean"?, "gain_grad_abs_mean"?, "gwc_factor"?}, ...]``; step 0 holds the values before any
            update. Gain/GWC fields are absent for stock LLaVA and the "w/o Norm" variant.
        output_dir: where the model, processor and JSON files were written.
        summary: the content of ``training_summary.json``.
        trainer: the ``SFTTrainer`` used (for its state and logs).
    """

    model: object
    metrics: dict
    norm_tracking: list
    output_dir: str
    summary: dict = field(default_factory=dict)
    trainer: object = None


class LlavaStageTrainer(TrainerHooks, SFTTrainer):
    """TRL's ``SFTTrainer`` with one learning rate per part (vision tower, projector, LLM), logged per part, and the
    pre-clip gradient norm of each part.

    The optimizer is the one ``args.optim`` names (AdamW by default), built on ``stages.parameter_groups``; the
    scheduler scales every group alike, so the parts keep their ratio (paper Appendix E.1: LLM 1e-5, vision 2e-6).
    At each logging step the logs gain ``learning_rate/<part>`` (the rate the step used) and ``grad_norm/<part>``
    (``part_metrics.part_gradient_norms``, read after the step's last backward, before clipping; the Trainer's
    ``grad_norm`` is their total). Both are read in ``training_step``, a public hook. The two private Trainer methods
    this trainer needs (the training order, an FSDP resume without optimizer tensors) are ``compat.TrainerHooks``'s,
    which hands them to ``train_sampler`` and ``resume_scheduler_only`` here.

    ``clip_per_part=True`` (``StageConfig.clip_per_part``) clips each part's gradient on its own before the Trainer's
    global clipping: see ``clip_parts``. The logs then also hold ``clip_coef/<part>``, each part's factor.

    ``args.train_sampling_strategy`` ``group_by_length`` and ``group_by_modality_length`` order the rows by the
    prepared token counts (``sampling.py``); transformers' other strategies are its own.
    """

    def __init__(self, *args, learning_rates: StageLearningRates | None = None, clip_per_part: bool = False,
                 **kwargs):
        self.learning_rates = learning_rates or StageLearningRates()
        self.clip_per_part = clip_per_part
        self._part_clip: dict[str, float] = {}
        self.skipped_rows = 0
        self._group_rates: list[float] = []
        self._part_grad_norms: dict[str, float] = {}
        super().__init__(*args, **kwargs)

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        if take_fsdp_on_cpu(self.accelerator):  # an FSDP launch without GPUs (engines.py)
            self.is_fsdp_enabled = True
        if self.is_fsdp_enabled:  # one FSDP config for every LLM / vision family
            fit_fsdp_wrap_classes(self.accelerator.state.fsdp_plugin, self.model)

    def save_model(self, output_dir: str | None = None, *args, **kwargs) -> None:
        super().save_model(output_dir, *args, **kwargs)
        folder = output_dir if output_dir is not None else self.args.output_dir
        if self.args.should_save and os.path.isdir(folder):
            remove_wrapper_sources(self.model, folder)

    def resume_scheduler_only(self, checkpoint: str) -> bool:  # compat.TrainerHooks
        # FSDP: torch cannot load an optimizer without tensor state (SGD without momentum), and there is none
        return self.is_fsdp_enabled and not optimizer_keeps_tensors(self.model, self.optimizer)

    def train_sampler(self, dataset):  # compat.TrainerHooks
        return grouped_order_for(dataset, self.args)

    def resolved_learning_rates(self) -> dict[str, float]:
        return self.learning_rates.resolved(self.args.learning_rate)

    def create_optimizer(self, model=None):
        if self.optimizer is None:
            opt_model = self.model if model is None else model
            groups = parameter_groups(
                opt_model, self.resolved_learning_rates(), self.args.weight_decay,
                decay_names=set(self.get_decay_parameter_names(opt_model)),
            )
            optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            optimizer_kwargs.pop("params", None)
            self.optimizer = optimizer_cls(groups, **optimizer_kwargs)
            for group in self.optimizer.param_groups:
                logger.info("optimizer group %-20s lr %.3g  weight decay %g  (%d tensors)", group.get("name", "?"),
                            group["lr"], group["weight_decay"], len(group["params"]))
        return self.optimizer

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        skipped = inputs.pop(SKIPPED_KEY, None)
        if skipped is not None and model.training:  # evaluation batches are not training rows
            self.skipped_rows += int(skipped)
        # each packed row's 3-D positions, as it has them alone; read from the model the Trainer holds (``model``
        # may be an engine's wrapper: DeepSpeed's ``config`` is its own dict)
        if getattr(self.data_collator, "padding_free", False):
            inputs = multimodal_positions(self.model, inputs)
        # the LM head at the labelled positions only, on the CPU as on GPUs (TRL's fused head; compat)
        with fused_head_compacted_on_cpu():
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        # After the last micro-batch's backward (the Trainer sets ``sync_gradients`` for it), the gradients are
        # those clipping and the optimizer step are about to use, and the param groups hold this step's rates (the
        # scheduler steps after the optimizer).
        if not self.accelerator.sync_gradients:
            return loss
        logged = will_log(self.args, self.state)
        if logged or self.clip_per_part:
            norms = part_gradient_norms(model)  # pre-clip
            if logged:
                self._part_grad_norms = norms
                self._group_rates = [group["lr"] for group in self.optimizer.param_groups]
            if self.clip_per_part:
                factors = clip_parts(model, norms, self.args.max_grad_norm)
                if logged:
                    self._part_clip = factors
        return loss

    def log(self, logs: dict, start_time: float | None = None) -> None:
        if "learning_rate" in logs and self._group_rates:
            for group, rate in zip(self.optimizer.param_groups, self._group_rates):
                part = str(group.get("name", "")).split("/")[0]
                if part:
                    logs.setdefault(f"learning_rate/{part}", rate)
            self._group_rates = []
        if "loss" in logs and self._part_grad_norms:
            logs.update({f"grad_norm/{part}": value for part, value in self._part_grad_norms.items()})
            self._part_grad_norms = {}
        if "loss" in logs and self._part_clip:
            logs.update({f"clip_coef/{part}": value for part, value in self._part_clip.items()})
            self._part_clip = {}
        super().log(logs, start_time)


@torch.no_grad()
def clip_parts(model, norms: dict[str, float], max_grad_norm: float | None) -> dict[str, float]:
    """Per-part gradient clipping: each part p (``part_metrics.part_parameters``) whose pre-clip gradient norm n_p
    exceeds an equal share of the budget, ``max_grad_norm / sqrt(P)`` (P parts with gradients), has its gradient
    multiplied by ``share / (n_p + 1e-6)``; the others are left as they are. The clipped total is then at most
    ``max_grad_norm``, so the Trainer's global clipping that follows changes nothing: a large gradient in one part
    (the GWC-compensated vision tower and projector) can no longer shrink another part's (the LLM's). Returns each
    part's factor (1.0 where it was not clipped, and for every part when clipping is off)."""
    if not max_grad_norm or max_grad_norm <= 0 or not norms:
        return {part: 1.0 for part in norms}
    share = float(max_grad_norm) / math.sqrt(len(norms))
    factors = {part: min(1.0, share / (norm + 1e-6)) for part, norm in norms.items()}
    for part, params in part_parameters(model).items():
        factor = factors.get(part, 1.0)
        if factor < 1.0:
            for _, param in params:
                if param.grad is not None:
                    param.grad.mul_(factor)
    return factors


def _check_args(args: SFTConfig) -> None:
    """What this pipeline refuses in an ``SFTConfig`` (the settings it owns are ``_trainer_args``')."""
    if not isinstance(args, SFTConfig):
        raise TypeError(f"args must be a trl.SFTConfig, got {type(args).__name__}")
    if args.packing:
        raise ValueError("--packing: TRL's packing cuts and merges rows across batches, which could cut an image; "
                         "--padding_free True packs each batch's rows into one sequence without padding")
    resume = args.resume_from_checkpoint
    if isinstance(resume, str) and not os.path.isdir(resume):
        raise FileNotFoundError(f"resume_from_checkpoint: no such checkpoint folder: {resume}")
    refuse_jit_checkpoint(args)


def refuse_jit_checkpoint(args) -> None:
    """transformers' SIGTERM checkpoint (``enable_jit_checkpoint``) is not combined with this pipeline's
    (``callbacks.SigtermCheckpoint``, whose docstring says why)."""
    if getattr(args, "enable_jit_checkpoint", False):
        raise BadInput(
            "--enable_jit_checkpoint: transformers' SIGTERM checkpoint is saved mid-step and the run then ends as if "
            "it had finished; train saves a checkpoint on SIGTERM itself, at the end of the optimizer step, and exits "
            "143 (docs/training.md, Preemption): leave the flag unset"
        )


def check_trainable_processor(processor, model) -> None:
    """Training tokenizes through the family's transformers processor (it reports where it expanded each image tag,
    which locates the answers, and the Trainer saves it with the model). A processor this package built in its place
    (``families.processors``: where the family's needs torchvision) can diagnose and generate, not train."""
    from transformers import ProcessorMixin

    if isinstance(processor, ProcessorMixin):
        return
    family = anatomy_of(model).family.name
    raise ValueError(
        f"training a {family} model needs its transformers processor, which did not load here "
        f"({type(processor).__name__} was built in its place, for diagnostics and generation): install torchvision "
        "(pip install torchvision; SmolVLM also needs num2words), which the family's processor imports"
    )


def _trainer_args(args: SFTConfig, *, find_unused: bool) -> SFTConfig:
    """The ``SFTConfig`` the Trainer is given: the caller's, with the few fields this pipeline owns set
    (``dataclasses.replace``; a log line when the user's value differs). The caller's object is never changed: the
    same SFTConfig can start several stages.

    Owned: ``remove_unused_columns`` and ``assistant_only_loss`` off (the collator needs the prepared columns and
    makes the answer-only labels, for any chat template); ``padding_free`` off (TRL refuses it for images; this
    package's collator packs the rows itself, ``padding_free.py``, with the caller's value); ``chat_template_path``
    cleared (``_use_chat_template`` applied it before the rows were rendered; TRL would apply it after, and save a
    template training never used); ``ddp_find_unused_parameters`` on when ``find_unused`` (``_ddp_finds_unused``)."""
    owned = {"remove_unused_columns": False, "assistant_only_loss": False}
    changes = {k: v for k, v in owned.items() if getattr(args, k) != v}
    if changes:
        logger.info("set %s (answer-only labels and image handling are done by this package's collator)", changes)
    pipeline = {"padding_free": False, "chat_template_path": None}
    if find_unused:
        pipeline["ddp_find_unused_parameters"] = True
    return dataclasses.replace(args, **owned, **pipeline)


def _use_chat_template(processor, args: SFTConfig, chat_template: str | None) -> None:
    """Put the run's chat template on the processor before any row is rendered, so that the rows are rendered with
    the template the saved processor carries. ``args.chat_template_path`` (a Jinja file) is read here; the Trainer's
    copy of the settings has it cleared (``_trainer_args``)."""
    path = args.chat_template_path
    if path is not None:
        if chat_template is not None:
            raise ValueError("give chat_template or args.chat_template_path (--chat_template_path), not both")
        check_chat_template_path(path)
        with open(path, encoding="utf-8") as handle:
            chat_template = handle.read()
    if chat_template is None:
        return
    from llava_normaligned.compose import multimodal_chat_template

    # a text LM's template renders image parts only once wrapped (compose does the same with the LM's template)
    processor.chat_template = multimodal_chat_template(chat_template, processor.tokenizer)
    logger.info("chat template set on the processor (%s); the saved processor carries it", path or "chat_template=")


def _checkpointing(args: SFTConfig) -> tuple[bool, dict]:
    """(activation checkpointing on, its kwargs): transformers 5 renamed ``gradient_checkpointing*``."""
    enabled = getattr(args, "activation_checkpointing", None)
    kwargs = getattr(args, "activation_checkpointing_kwargs", None)
    if enabled is None:
        enabled, kwargs = args.gradient_checkpointing, args.gradient_checkpointing_kwargs
    return bool(enabled), kwargs if isinstance(kwargs, dict) else {}


def _ddp_finds_unused(args: SFTConfig, stage: int, prepare_report) -> bool:
    """Whether the Trainer must have ``ddp_find_unused_parameters=True`` (``_trainer_args`` sets it): stage 2 rows
    without an image leave the vision tower and the projector without gradients on the process that holds them, so
    DDP must look for unused parameters. transformers turns that off under gradient checkpointing (TRL's default),
    so it is turned on (non-reentrant checkpointing allows it); reentrant checkpointing cannot have it, and is
    refused for such data. A value the user set is kept."""
    if stage != 2 or not prepare_report.text_only_rows or args.ddp_find_unused_parameters is not None:
        return False
    checkpointing, kwargs = _checkpointing(args)
    if checkpointing and kwargs.get("use_reentrant"):
        if args.world_size > 1:
            raise ValueError(
                f"{prepare_report.text_only_rows} text-only rows: under DDP they leave the vision tower without "
                "gradients, which reentrant gradient checkpointing cannot allow; drop use_reentrant=True (the "
                "default, non-reentrant checkpointing, works) or set ddp_find_unused_parameters yourself"
            )
        return False
    if args.world_size > 1:
        logger.info("ddp_find_unused_parameters=True: %d text-only rows leave the vision tower without gradients",
                    prepare_report.text_only_rows)
    return True


def _projector_in_vision_dtype(model) -> None:
    """Keep the trained projector copy in the vision tower's dtype. For a quantized base TRL casts every trainable
    parameter to bf16 (QLoRA's adapters); the projector, trained fully, takes the vision features as they come."""
    anatomy = anatomy_of(model)
    dtype = anatomy.vision_dtype()
    for name, param in model.named_parameters():
        if param.requires_grad and anatomy.part_of(name) == "projector" and param.dtype != dtype:
            param.data = param.data.to(dtype)


def _write_json(payload: dict, folder: str, name: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    return write_json_atomic(path, payload, indent=1, default=str)


def peak_memory() -> dict:
    """This process's peak resident memory and, on CUDA, the peak memory torch allocated on its GPU, in GiB."""
    out = {}
    try:
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux (bytes on macOS)
        out["peak_rss_gib"] = round(kib / (2**30 if sys.platform == "darwin" else 2**20), 3)
    except ImportError:  # Windows
        pass
    if torch.cuda.is_available():
        out["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return out


def _versions() -> dict:
    import transformers
    import trl

    return {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}


def with_hub_ids(load: dict | None) -> dict | None:
    """The data report plus ``hub_ids``: the sources that are Hub dataset ids (the model card's ``datasets``)."""
    if not isinstance(load, dict):
        return load
    sources = [s for s in load.get("sources") or [] if isinstance(s, str)]
    data_file = (".json", ".jsonl", ".parquet", ".csv", ".arrow", ".txt")
    hub_ids = [s for s in sources
               if re.fullmatch(r"[\w.-]+/[\w.-]+", s) and not s.endswith(data_file) and not os.path.exists(s)]
    return {**load, "hub_ids": hub_ids}


def _public_data_report(report: dict | None) -> dict | None:
    """A data report as published: its sources and cache file by their Hub ids or their files' own names."""
    if not isinstance(report, dict):
        return report
    named = {key: public_name(report[key]) for key in ("cache_file",) if isinstance(report.get(key), str)}
    if isinstance(report.get("sources"), list):
        named["sources"] = [public_name(s) if isinstance(s, str) else s for s in report["sources"]]
    return {**report, **named}


def _public_run(run: dict) -> dict:
    """What the run was given, as published: recipe files by their own names, paths on the command line too."""
    named = {}
    if isinstance(run.get("config_files"), list):
        named["config_files"] = [public_name(f) if isinstance(f, str) else f for f in run["config_files"]]
    if isinstance(run.get("argv"), list):
        named["argv"] = [hide_local_paths(a) if isinstance(a, str) else a for a in run["argv"]]
    return {**run, **named}


def _summary(trainer, *, stage, freeze, prepare_report, data_report, metrics, records, run_info, peft_config) -> dict:
    args = trainer.args
    model = trainer.model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    groups = [{"name": g.get("name"), "lr": g.get("initial_lr", g["lr"]), "weight_decay": g["weight_decay"],
               "num_params": sum(p.numel() for p in g["params"])} for g in trainer.optimizer.param_groups]
    # published with the model: names by Hub id or own name (llava_normaligned.local_paths), in every string too
    return public_record({
        "stage": stage,
        "model_class": type(base).__name__,
        "base_model": public_name(getattr(base.config, "name_or_path", None)),
        "variant": describe_variant(base),
        "learning_rates": {part: lr for part, lr in trainer.resolved_learning_rates().items()
                           if any(str(g.get("name", "")).startswith(part) for g in trainer.optimizer.param_groups)},
        "optimizer_groups": groups,
        "freeze": freeze.to_dict(),
        "data": {
            "load": _public_data_report(
                with_hub_ids(data_report.to_dict() if hasattr(data_report, "to_dict") else data_report)),
            "prepare": _public_data_report(prepare_report.to_dict()),
            "rows_skipped_in_training": trainer.skipped_rows,
        },
        "training": {
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "world_size": args.world_size,
            "global_batch_size": args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size,
            "num_train_epochs": args.num_train_epochs,
            "max_steps": args.max_steps,
            "global_steps": trainer.state.global_step,
            "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
            "warmup": args.warmup_steps,
            "weight_decay": args.weight_decay,
            "seed": args.seed,
            "bf16": args.bf16,
            "fp16": args.fp16,
            "max_length": args.max_length,
            "train_sampling_strategy": args.train_sampling_strategy,
            "padding_free": getattr(trainer.data_collator, "padding_free", False),
            "gradient_checkpointing": _checkpointing(args)[0],
            "cpu_threads": torch.get_num_threads() if args.use_cpu else None,
            "engine": engine_summary(trainer),
        },
        "metrics": metrics,
        "memory": peak_memory(),
        "norm": {
            "start": records[0] if records else None,
            "end": records[-1] if records else None,
            "gain_statistics": gain_statistics(model),  # paper Table 5, after this stage
        },
        "peft": peft_config.to_dict() if peft_config is not None else None,
        "run": _public_run(run_info or {}),
        "versions": _versions(),
    })


@dataclass
class PreparedStage:
    """A stage ready to train (``prepare_stage``): the trainer and what the summary records."""

    trainer: LlavaStageTrainer
    config: StageConfig
    freeze: object
    prepare_report: object
    data_report: object = None
    peft_config: object = None
    run_info: dict | None = None

    @property
    def stage(self) -> int:
        return self.config.stage


def _shared_cache_dir() -> str | None:
    """Where the rendered rows are kept (the datasets cache, per machine): the next run with the same rows reads
    them, and in a multi-process run the other processes read what the main process wrote."""
    from .data import default_cache_dir

    return default_cache_dir("prepared")


def _prepare_rows(dataset, processor, args, *, stage, config):
    with args.main_process_first(desc="rendering the rows"):  # the others then read what the main process wrote
        return prepare_dataset(dataset, processor, max_length=args.max_length, on_too_long=config.on_too_long,
                               drop_text_only=(stage == 1), num_proc=args.dataset_num_proc,
                               cache_dir=_shared_cache_dir(), fast_render=config.render == "fast")


def prepare_stage(
    model,
    processor,
    train_dataset,
    *,
    args: SFTConfig,
    stage: int | StageConfig,
    eval_dataset=None,
    peft_config=None,
    callbacks: list | None = None,
    chat_template: str | None = None,
    data_report=None,
    run_info: dict | None = None,
) -> PreparedStage:
    """Everything before training that can fail on the inputs; the arguments are ``train_stage``'s."""
    config = stage if isinstance(stage, StageConfig) else StageConfig(stage=stage)
    stage = config.stage
    forget_accelerate_preparation(model)  # trained by an earlier Trainer (stage 1): this one prepares it anew
    if peft_config is not None and stage == 1:
        raise ValueError("stage 1 trains the projector fully: LoRA/QLoRA (peft_config) is for stage 2")
    padding_free = bool(args.padding_free)  # the Trainer is told False (TRL refuses it for images): the collator packs
    _check_args(args)
    check_trainable_processor(processor, model)
    if padding_free:
        check_padding_free(model)
    _use_chat_template(processor, args, chat_template)
    learning_rates = StageLearningRates(projector=config.lr_projector, llm=config.lr_llm,
                                        vision_tower=config.lr_vision)

    if peft_config is None:
        freeze = freeze_for_stage(model, stage, train_vision=config.train_vision)
    prepared, prepare_report = _prepare_rows(train_dataset, processor, args, stage=stage, config=config)
    if eval_dataset is not None:
        eval_dataset, _ = _prepare_rows(eval_dataset, processor, args, stage=2, config=config)
    args = _trainer_args(args, find_unused=_ddp_finds_unused(args, stage, prepare_report))  # once: then only read
    collator = LlavaTrainingCollator(
        processor, max_length=args.max_length, on_bad_image=config.on_bad_image,
        pad_to_multiple_of=args.pad_to_multiple_of, padding_free=padding_free, report_skips=True,
        images_per_text=anatomy_of(model).family.images_per_text,
    )
    trainer = LlavaStageTrainer(
        model=model,
        args=args,
        train_dataset=prepared,
        eval_dataset=eval_dataset,
        processing_class=processor,
        data_collator=collator,
        callbacks=callbacks,
        peft_config=peft_config,
        learning_rates=learning_rates,
        clip_per_part=config.clip_per_part,
    )
    if peft_config is not None:
        freeze = freeze_for_stage(trainer.model, stage, train_vision=config.train_vision)  # within PEFT's choice
        _projector_in_vision_dtype(trainer.model)
    norm_tracking = NormTrackingCallback.install(trainer)
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, SigtermCheckpoint):  # a run SIGTERM stopped writes no end-of-run records
            callback.hold_back(norm_tracking)
    return PreparedStage(trainer=trainer, config=config, freeze=freeze, prepare_report=prepare_report,
                         data_report=data_report, peft_config=peft_config, run_info=run_info)


def run_stage(prepared: PreparedStage) -> TrainStageResult:
    """Train a prepared stage and save the model, processor, ``training_summary.json`` and ``norm_tracking.json``.

    When a ``SigtermCheckpoint`` among the Trainer's callbacks stopped the run (SIGTERM), the Trainer has saved the
    checkpoint of the last step; nothing is saved as if the run had finished (no final model, no summary) and
    ``callbacks.Terminated`` is raised, naming that checkpoint, on every process."""
    trainer, args = prepared.trainer, prepared.trainer.args
    with skip_unused_vision_compute(trainer.model, enabled=prepared.config.skip_unused_vision), \
            packed_attention(trainer.model, enabled=getattr(trainer.data_collator, "padding_free", False)):
        train_output = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    stopped = next((c.stopped_at for c in trainer.callback_handler.callbacks
                    if isinstance(c, SigtermCheckpoint) and c.stopped_at is not None), None)
    if stopped is not None:  # every rank stopped at this step (SigtermCheckpoint agrees on it)
        trainer.accelerator.wait_for_everyone()
        raise Terminated(os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{stopped}"))
    metrics = dict(train_output.metrics)
    # rows whose image failed to decode (skip policy), counted on every rank
    skipped = torch.tensor(trainer.skipped_rows, device=trainer.args.device)
    trainer.skipped_rows = int(trainer.accelerator.reduce(skipped, reduction="sum"))
    records = norm_records(trainer.state.log_history)
    summary = _summary(trainer, stage=prepared.stage, freeze=prepared.freeze, prepare_report=prepared.prepare_report,
                       data_report=prepared.data_report, metrics=metrics, records=records, run_info=prepared.run_info,
                       peft_config=prepared.peft_config)
    if prepared.config.save_final:
        trainer.save_model(args.output_dir)  # model (or adapter) + processor; main process only
        if trainer.is_world_process_zero():
            _write_json(summary, args.output_dir, SUMMARY_FILE)
    trainer.accelerator.wait_for_everyone()
    forget_accelerate_preparation(trainer.model)  # the model returned runs its own forward, and trains on anew
    return TrainStageResult(model=trainer.model, metrics=metrics, norm_tracking=records,
                            output_dir=args.output_dir, summary=summary, trainer=trainer)


def train_stage(model, processor, train_dataset, *, args: SFTConfig, stage: int | StageConfig, eval_dataset=None,
                peft_config=None, callbacks: list | None = None, chat_template: str | None = None, data_report=None,
                run_info: dict | None = None) -> TrainStageResult:
    """Train one LLaVA-1.5 stage with TRL's ``SFTTrainer`` and save the result: ``run_stage(prepare_stage(...))``.

    The settings are two dataclasses, as TRL's trainers take ``args=SFTConfig``: ``args`` for the Trainer and
    ``stage`` (``arguments.StageConfig``: stage number, per-part learning rates, vision training, row and image
    policies, compute skipping, saving) for this pipeline. The other keywords are objects, as the Trainer takes them.

    Args:
        model: a ``LlavaNormAlignedForConditionalGeneration`` or a stock ``LlavaForConditionalGeneration``.
        processor: its processor (a ``LlavaProcessor`` with a chat template).
        train_dataset: rows ``{"id", "messages", "images"}`` (``data.load_llava_json`` / ``load_messages_dataset``).
        args: a ``trl.SFTConfig``. ``output_dir``, batch sizes, schedule, precision, ``max_length`` (rows longer are
            dropped or refused, never truncated), ``resume_from_checkpoint`` and ``chat_template_path`` (a Jinja
            file, applied before the rows are rendered and saved with the processor) are read from it. It is not
            changed: the fields this pipeline owns are set on the Trainer's copy (``dataclasses.replace``).
        stage: a ``StageConfig``, or just the stage number (1: projector + norm train, vision tower and LLM frozen;
            2: all train) for ``StageConfig``'s defaults.
        eval_dataset: rows like ``train_dataset``, evaluated per ``args.eval_strategy`` (answer-only loss).
        peft_config: a ``peft.LoraConfig`` (stage 2 only; ``lora.stage2_lora_config`` keeps the projector trained
            fully via ``modules_to_save``).
        callbacks: more ``TrainerCallback``s. The norm-tracking callback is always added.
        chat_template: a template to train with instead of the processor's; it is set on the processor (so the
            saved processor carries it), wrapped to render image parts if it is a text-only template.
        data_report: the loader's ``DataReport`` (recorded in the summary).
        run_info: anything to record in the summary (recipe files, command line).

    Returns:
        ``TrainStageResult``.
    """
    return run_stage(prepare_stage(model, processor, train_dataset, args=args, stage=stage, eval_dataset=eval_dataset,
                                   peft_config=peft_config, callbacks=callbacks, chat_template=chat_template,
                                   data_report=data_report, run_info=run_info))


# ------------------------------------------------------------------------------------- a run from its TrainConfig


def shared_image_checker(args: SFTConfig):
    """An ``image_checker`` for the data loaders that opens the images on the main process only and gives what it
    found to the others: every process reads the same rows in the same order, so a row's position is the same on
    all. Alone: ``data.find_bad_images`` itself."""
    from .data import find_bad_images

    if args.world_size <= 1:
        return find_bad_images

    def check_on_main(items, check):
        from accelerate.utils import broadcast_object_list

        found = [find_bad_images(items, check) if args.process_index == 0 else None]
        broadcast_object_list(found, from_process=0)
        return found[0]

    check_on_main.checks_here = args.process_index == 0
    return check_on_main


def _load_data(stage_args, image_checker):
    from .data import default_cache_dir, load_llava_json, load_messages_dataset

    common = {"on_bad_image": stage_args.on_bad_image, "on_bad_row": stage_args.on_bad_row,
              "check_images": stage_args.check_images, "return_report": True, "image_checker": image_checker,
              "cache_dir": default_cache_dir("loaded")}
    if stage_args.data_path:
        return load_llava_json(stage_args.data_path, stage_args.image_folder, **common)
    return load_messages_dataset(stage_args.dataset_name, split=stage_args.dataset_split, **common)


def _load_model(config: TrainConfig, load: LoadOptions | None = None):
    """The model and processor the stage starts from: the checkpoint, loaded with the run's ``LoadOptions``
    (``config.load``, or ``load``), or for stage 1 without one a vision encoder and a causal LM composed; then the
    run's norm variant applied."""
    from .stage_model import apply_norm_variant, compose_for_stage1

    stage_args, load = config.stage_args, load or config.load
    variant = stage_args.variant()
    if load is None:
        return compose_for_stage1(stage_args.vision_model, stage_args.text_model, variant,
                                  dtype=config.model_args.dtype, trust_remote_code=config.sft_args.trust_remote_code)
    model, processor = load.load()
    apply_norm_variant(model, stage=stage_args.stage, **variant)
    return model, processor


def _configure_logging(sft_args: SFTConfig) -> None:
    """transformers' levels for everything (``--log_level``, ``--log_level_replica``), and this package's own account
    of the run (what trains, the optimizer groups, the data summaries) at INFO on the main process unless
    ``--log_level`` says otherwise."""
    level = sft_args.get_process_log_level()
    logging.getLogger().setLevel(level)
    if sft_args.should_log and sft_args.log_level == "passive":
        level = logging.INFO
    logging.getLogger("llava_normaligned").setLevel(level)


def _cpu_threads(sft_args: SFTConfig) -> None:
    """On the CPU, as many torch threads as there are cores no other process is using (``engines.
    cpu_training_threads``), unless ``OMP_NUM_THREADS`` says otherwise."""
    if not sft_args.use_cpu:
        return
    choice = cpu_training_threads()
    if choice is None:
        return
    threads, why = choice
    torch.set_num_threads(threads)
    logger.info("training on the CPU with %s (OMP_NUM_THREADS=N sets it)", why)


def _redacted(value):
    """A configuration as logged: the values of ``*token`` keys (``--hub_token``) replaced, as transformers does."""
    if isinstance(value, dict):
        return {k: f"<{k.upper()}>" if str(k).endswith("token") and v else _redacted(v) for k, v in value.items()}
    return value


def prepare_run(config: TrainConfig, *, argv: list[str], callbacks=()) -> tuple[PreparedStage, object]:
    """A run's set-up from its ``TrainConfig`` (what ``train`` parsed): logging and threads, the data (first: a bad
    row is found in seconds), the held-out rows, the model and the adapters (stage 2 with ``use_peft``), prepared for
    the Trainer with ``callbacks``; ``argv`` is recorded in the run's summary. Returns ``(prepared stage,
    processor)``; bad input raises (``DataError``, ``TemplateError``, ``ValueError``, ``FileNotFoundError``)."""
    from .lora import stage2_lora_config

    stage_args, sft_args, model_args = config.stage_args, config.sft_args, config.model_args
    _configure_logging(sft_args)
    _cpu_threads(sft_args)
    logger.info("configuration: %s", json.dumps(_redacted(config.describe()), default=str))
    # the data first: a bad row is found in seconds, not after a model of several GB has loaded
    dataset, data_report = _load_data(stage_args, shared_image_checker(sft_args))
    held_out = _held_out_rows(stage_args)
    model, processor = _load_model(config)
    peft_config = stage2_lora_config(model_args, lora_vision=stage_args.lora_vision,
                                     family=anatomy_of(model).family) if model_args.use_peft else None
    prepared = prepare_stage(
        model, processor, dataset, args=sft_args, stage=stage_args, peft_config=peft_config,
        data_report=data_report, callbacks=list(callbacks),
        run_info={"config_files": list(config.config_files), "argv": list(argv),
                  "model": public_name(stage_args.model) if stage_args.model else
                  f"{public_name(stage_args.vision_model)} + {public_name(stage_args.text_model)}"},
    )
    if held_out:
        HeldOutAccuracyCallback.install(prepared.trainer, held_out, processor, stage_args.held_out_steps,
                                        batch_size=stage_args.held_out_batch_size,
                                        max_new_tokens=stage_args.held_out_max_new_tokens)
    return prepared, processor


def _held_out_rows(stage_args) -> list | None:
    """``--held_out_data_path``'s rows (``held_out.load_held_out``), read before the model loads; None without it."""
    if stage_args.held_out_data_path is None:
        return None
    try:
        return load_held_out(stage_args.held_out_data_path,
                             stage_args.held_out_image_folder or stage_args.image_folder,
                             limit=stage_args.held_out_limit or None, group_field=stage_args.held_out_group_field)
    except ValueError as error:
        raise BadInput(str(error)) from None


def merge_if_asked(result: TrainStageResult, config: TrainConfig, processor) -> None:
    """``--merge-adapter``: the trained adapters merged into an unquantized copy of the base, saved as ``merged/``."""
    from .lora import merge_adapter

    if not (config.model_args.use_peft and config.stage_args.merge_adapter and result.trainer.is_world_process_zero()):
        return

    def unquantized_base():
        return _load_model(config, dataclasses.replace(config.load, quantization=None))[0]

    merged = merge_adapter(result.model, os.path.join(result.output_dir, "merged"), processor, unquantized_base)
    logger.info("merged model written to %s", merged)


__all__ = [
    "SUMMARY_FILE",
    "LlavaStageTrainer",
    "PreparedStage",
    "StageConfig",
    "TrainStageResult",
    "merge_if_asked",
    "prepare_run",
    "prepare_stage",
    "refuse_jit_checkpoint",
    "run_stage",
    "shared_image_checker",
    "train_stage",
    "with_hub_ids",
]
