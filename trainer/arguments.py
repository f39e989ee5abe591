"""The settings of a training stage: this package's ``StageConfig`` / ``StageArguments`` beside TRL's ``SFTConfig`` and
``ModelConfig``, and how a run's ``TrainConfig`` is built from what was asked (a ``TrainRequest``).

The ``train`` command parses the three dataclasses with TRL's ``TrlParser`` (``commands/train.py``); a run's
settings are then built once: ``setup_environment`` sets a recipe's ``env:`` keys (the one step that changes the
environment, logged), ``build_train_config`` validates, derives and builds the frozen ``TrainConfig``, read and never
written from then on. A ``--config`` value may name a recipe shipped in ``trainer/recipes/`` (``resolve_config``).
Two values are derived from the machine, each logged, and given to the configs when they are built:

* no GPU: ``use_cpu=True`` and bf16/fp16 off (TRL's default ``bf16=True`` refuses to start on a CPU-only machine), so
  ``train`` runs on a laptop with no extra flags and on GPUs with the recipe's precision; ``--bf16 True`` on the
  command line keeps bf16 autocast on a CPU with AMX or AVX512-BF16 (``engines.cpu_has_bf16_matmul``);
* ``global_batch_size``: ``gradient_accumulation_steps = global / (per_device_train_batch_size * world size)``, so
  one recipe gives the paper's global batch (256, then 128; Appendix E.1) on any number of GPUs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field

from trl import ModelConfig, SFTConfig

from llava_normaligned.checks import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_COUNT,
    SEED,
    BadInput,
    NumberRule,
    check_input_file,
    check_input_folder,
    check_numbers,
    check_output_folder,
)
from llava_normaligned.loading import LoadOptions
from llava_normaligned.norm_variant import NormVariant, variant_field

logger = logging.getLogger(__name__)


@dataclass
class StageConfig:
    """How one stage trains, beside TRL's ``SFTConfig``: ``train_stage(..., args=SFTConfig(...),
    stage=StageConfig(...))``, as TRL's trainers take ``args=SFTConfig``. The command line's ``StageArguments`` is one,
    so ``train`` passes what it parsed as is.

    Learning rates (paper Appendix E.1: stage 2 LLM 1e-5, vision 2e-6): ``None`` takes ``args.learning_rate``; the
    projector follows the LLM's. Stage 1 uses only ``lr_projector``.
    """

    stage: int = field(metadata={"help": "1: feature alignment (projector + norm); 2: instruction tuning (all) "
                                         "(required)",
                                 "choices": [1, 2]})
    lr_projector: float | None = field(default=None, metadata={
        "help": "projector + norm learning rate (default: the LLM's)"})
    lr_llm: float | None = field(default=None, metadata={"help": "LLM learning rate (default: --learning_rate)"})
    lr_vision: float | None = field(default=None, metadata={
        "help": "vision tower learning rate, stage 2 (default: --learning_rate)"})
    train_vision: bool | None = field(default=None, metadata={
        "help": "stage 2: train the vision tower (default: yes, as the paper; under --use_peft: through adapters when "
                "--lora-vision puts them there). False freezes it"})
    on_too_long: str = field(default="drop", metadata={
        "help": "a row longer than max_length (images included): 'drop' (counted) or 'error'; never truncated",
        "choices": ["drop", "error"]})
    render: str = field(default="fast", metadata={
        "help": "how rows are rendered with the chat template: 'fast' (each conversation shape rendered once and the "
                "rows laid into it where that gives the template's text exactly, checked on a sample; the rest "
                "through jinja) or 'exact' (every row through jinja)",
        "choices": ["fast", "exact"]})
    on_bad_image: str = field(default="error", metadata={
        "help": "a missing/unreadable image: 'error' (names the row) or 'skip' (drop it, counted)",
        "choices": ["error", "skip"]})
    skip_unused_vision: bool = field(default=True, metadata={
        "help": "while training, skip the vision layers after the feature layer and SigLIP's pooling head, whose "
                "outputs LLaVA never reads (same losses and gradients, less compute)"})
    clip_per_part: bool = field(default=False, metadata={
        "help": "clip each part's gradient (vision tower, projector, its norm, LLM) to max_grad_norm / sqrt(parts) "
                "before the global clipping, so one part's large gradient (GWC's) cannot shrink another's step"})
    save_final: bool = field(default=True, metadata={
        "help": "write the final model, processor, training_summary.json and norm_tracking.json to --output-dir"})

    def __post_init__(self):
        if self.stage not in (1, 2):
            raise ValueError(f"--stage must be 1 or 2, got {self.stage!r}")
        for name, allowed in (("on_too_long", ("drop", "error")), ("on_bad_image", ("error", "skip"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.stage == 1 and self.train_vision:
            raise ValueError("--train-vision: stage 1 keeps the vision tower frozen (paper §5.2); it is a stage-2 flag")


@dataclass
class StageArguments(StageConfig):
    """The command line's ``StageConfig``, plus what to train and on which data (the rest is SFTConfig /
    ModelConfig)."""

    model: str | None = field(default=None, metadata={
        "help": "Hub id or folder of a LLaVA checkpoint (norm-aligned or stock), e.g. the output of "
                "`llava-normaligned compose` or of stage 1"})
    vision_model: str | None = field(default=None, metadata={
        "help": "stage 1 without --model: compose from this vision encoder (and --text-model) first"})
    text_model: str | None = field(default=None, metadata={"help": "the causal LM to compose with --vision-model"})
    # data
    data_path: str | None = field(default=None, metadata={
        "help": "LLaVA JSON file(s), comma-separated (LLaVA-558K, llava_v1_5_mix665k, ...)"})
    image_folder: str | None = field(default=None, metadata={"help": "folder the rows' image paths are relative to"})
    dataset_name: str | None = field(default=None, metadata={
        "help": "instead of --data-path: a saved dataset folder, parquet/JSON files or a Hub dataset id, in TRL's "
                "messages + images format or LLaVA's conversation format (lmms-lab/LLaVA-NeXT-Data, ...)"})
    dataset_split: str = field(default="train", metadata={"help": "split of --dataset-name"})
    on_bad_row: str = field(default="error", metadata={
        "help": "a malformed row: 'error' or 'skip'", "choices": ["error", "skip"]})
    check_images: str = field(default="auto", metadata={
        "help": "check images up front: 'auto' ('open' up to 50,000 images, 'exists' above), 'open' (read every "
                "header), 'exists' (the file is there and not empty; embedded bytes: not empty), or 'none'",
        "choices": ["auto", "open", "exists", "none"]})
    global_batch_size: int | None = field(default=None, metadata={
        "help": "sets gradient_accumulation_steps = global / (per-device batch x processes) (default: unset, "
                "--gradient_accumulation_steps applies)"})
    # the paper's ablation (Tables 4/5): applied to the model before stage 1 (llava_normaligned.norm_variant)
    projector_norm: str | None = variant_field("projector_norm")
    norm_init: str | None = variant_field("norm_init")
    gradient_compensation: bool | None = variant_field("gradient_compensation")
    gradient_compensation_min: float | None = variant_field("gradient_compensation_min")
    lora_vision: bool = field(default=False, metadata={
        "help": "with --use_peft: LoRA adapters on the vision tower's linear layers too (default: off, the LLM's "
                "only)"})
    merge_adapter: bool = field(default=False, metadata={
        "help": "with --use_peft: also save the base model with the adapter merged in, to OUTPUT_DIR/merged"})
    # held-out accuracy during training (trainer/held_out.py)
    held_out_data_path: str | None = field(default=None, metadata={
        "help": "a LLaVA JSON file of held-out questions with their answers: greedy answers scored by exact match "
                "before the first step and every --held_out_steps steps, logged as held_out/accuracy and kept in "
                "OUTPUT_DIR/held_out_accuracy.json"})
    held_out_image_folder: str | None = field(default=None, metadata={
        "help": "folder the held-out rows' image paths are relative to (default: --image-folder)"})
    held_out_steps: int = field(default=100, metadata={"help": "optimizer steps between held-out readings"})
    held_out_limit: int | None = field(default=256, metadata={
        "help": "the first N held-out rows are answered (0 or none: all of them)"})
    held_out_batch_size: int = field(default=16, metadata={"help": "held-out questions answered per batch"})
    held_out_max_new_tokens: int = field(default=16, metadata={"help": "tokens generated per held-out answer"})
    held_out_group_field: str | None = field(default="template", metadata={
        "help": "the rows' field whose groups weigh the same in the held-out accuracy (absent: one group)"})

    def __post_init__(self):
        super().__post_init__()
        if self.model is None and not (self.vision_model and self.text_model):
            raise ValueError("give --model (a LLaVA checkpoint), or --vision-model and --text-model for stage 1")
        if self.model is None and self.stage == 2:
            raise ValueError("stage 2 starts from a checkpoint: give --model (stage 1's output folder)")
        if (self.data_path is None) == (self.dataset_name is None):
            raise ValueError("give exactly one of --data-path (LLaVA JSON) and --dataset-name (messages + images)")
        self.variant()  # a value given in Python skips the parser's choices: a bad one names its option here

    def variant(self) -> dict:
        """The ablation options given (``NormVariant.given``: as the model config spells them, ``None`` for
        'none')."""
        return NormVariant.given(self)


DATACLASSES = (StageArguments, SFTConfig, ModelConfig)


# The numeric options whose range is not checked by transformers or TRL (a batch size of 0, max_steps -5, a negative
# learning rate or seed all started, and failed later or trained something else): checked when the arguments are
# parsed, before anything is loaded.
TRAIN_NUMBERS: dict[str, NumberRule] = {
    # this package's (StageArguments)
    "global_batch_size": POSITIVE_COUNT,
    "lr_projector": NON_NEGATIVE,
    "lr_llm": NON_NEGATIVE,
    "lr_vision": NON_NEGATIVE,
    "gradient_compensation_min": POSITIVE,
    "held_out_steps": POSITIVE_COUNT,
    "held_out_limit": NON_NEGATIVE,
    "held_out_batch_size": POSITIVE_COUNT,
    "held_out_max_new_tokens": POSITIVE_COUNT,
    # TRL's SFTConfig (transformers' TrainingArguments)
    "per_device_train_batch_size": POSITIVE_COUNT,
    "per_device_eval_batch_size": POSITIVE_COUNT,
    "gradient_accumulation_steps": POSITIVE_COUNT,
    "eval_accumulation_steps": POSITIVE_COUNT,
    "max_steps": NumberRule(low=1, special=((-1, "train --num_train_epochs"),)),
    "num_train_epochs": POSITIVE,
    "learning_rate": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    "warmup_steps": NumberRule(low=0, steps=True),
    "logging_steps": NumberRule(low=0, low_open=True, steps=True),
    "save_steps": NumberRule(low=0, low_open=True, steps=True),
    "eval_steps": NumberRule(low=0, low_open=True, steps=True),
    "eval_delay": NON_NEGATIVE,
    "max_grad_norm": NON_NEGATIVE,
    "adam_beta1": FRACTION,
    "adam_beta2": FRACTION,
    "adam_epsilon": NON_NEGATIVE,
    "label_smoothing_factor": FRACTION,
    "neftune_noise_alpha": POSITIVE,
    "max_length": POSITIVE_COUNT,
    "seed": SEED,
    "data_seed": SEED,
    "dataloader_num_workers": NON_NEGATIVE,
    "save_total_limit": POSITIVE_COUNT,
    "dataset_num_proc": POSITIVE_COUNT,
    "ddp_timeout": POSITIVE_COUNT,
    # TRL's ModelConfig (LoRA)
    "lora_r": POSITIVE_COUNT,
    "lora_alpha": POSITIVE,
    "lora_dropout": FRACTION,
}


def train_flag(name: str) -> str:
    """The flag of a train field as ``--help`` shows it: this package's with dashes, TRL's with underscores."""
    own = {f.name for f in dataclasses.fields(StageArguments)}
    return "--" + (name.replace("_", "-") if name in own else name)


# What a finished or checkpointed `train` leaves in its output folder.
RUN_OUTPUTS = ("training_summary.json", "norm_tracking.json", "config.json", "model.safetensors",
               "model.safetensors.index.json", "adapter_config.json", "adapter_model.safetensors", "merged")


def earlier_run(folder: str) -> list[str]:
    """The names in ``folder`` that a training run left there (its checkpoints, its final model or adapter, its
    summary); empty when there is no such folder."""
    if not os.path.isdir(folder):
        return []
    return sorted(name for name in os.listdir(folder) if name in RUN_OUTPUTS
                  or (name.startswith("checkpoint-") and os.path.isdir(os.path.join(folder, name))))


def check_chat_template_path(path: str) -> None:
    """``--chat_template_path`` must be a Jinja template file."""
    if not os.path.isfile(path):
        raise BadInput(
            f"--chat_template_path {path}: no such file; give a Jinja template file (a tokenizer folder or Hub id, "
            "which TRL also accepts, would add its special tokens to the LLM and is not supported here)"
        )


def check_train_inputs(stage_args: StageArguments, sft_args: SFTConfig, model_args: ModelConfig) -> None:
    """The paths the arguments name, checked before anything is loaded: the model folder(s) (there, with a config and
    weights), the data files and image folder, the chat template, the checkpoint to resume, and the output folder
    (not a file; not holding an earlier run's results unless it is resumed). ``BadInput`` names the flag."""
    from llava_normaligned.loading import check_source, looks_like_path

    from .data import split_paths

    revision = model_args.model_revision
    for flag, name in (("--model", stage_args.model), ("--vision-model", stage_args.vision_model),
                       ("--text-model", stage_args.text_model)):
        if name is not None:
            check_source(name, flag, revision=revision if flag == "--model" else None)
    if stage_args.data_path is not None:
        for path in split_paths(stage_args.data_path):
            check_input_file("--data-path", path)
    if stage_args.image_folder is not None:
        check_input_folder("--image-folder", stage_args.image_folder)
    if stage_args.held_out_data_path is not None:
        check_input_file("--held_out_data_path", stage_args.held_out_data_path)
        folder = stage_args.held_out_image_folder
        if folder is not None:
            check_input_folder("--held_out_image_folder", folder)
    name = stage_args.dataset_name
    if name is not None and not os.path.exists(name) and looks_like_path(name):
        raise BadInput(f"--dataset-name {name}: no such file or folder ({os.path.abspath(name)}), and not a Hub "
                       "dataset id (namespace/name); give an existing path or a Hub id")
    if sft_args.chat_template_path is not None:
        check_chat_template_path(sft_args.chat_template_path)
    resume = sft_args.resume_from_checkpoint
    if isinstance(resume, str):
        check_input_folder("--resume_from_checkpoint", resume)
    check_output_folder("--output-dir", sft_args.output_dir)
    found = earlier_run(sft_args.output_dir)
    if found and resume is None:
        shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
        raise BadInput(f"--output-dir {sft_args.output_dir} holds an earlier run ({shown}); continue it with "
                       "--resume_from_checkpoint, or give a new --output-dir")


def check_peft_flags(stage_args: StageArguments, model_args: ModelConfig) -> None:
    """Refuse flags that would do nothing: the adapter flags without ``--use_peft``, ``--lora-vision`` where
    ``--lora_target_modules`` already chose the targets, and ``--train-vision`` under PEFT with no adapter on the
    vision tower; and flags that cannot work together: 4/8-bit loading without adapters, adapters in stage 1."""
    if (model_args.load_in_4bit or model_args.load_in_8bit) and not model_args.use_peft:
        flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit"
        raise BadInput(f"{flag}: a 4-bit/8-bit model trains only through adapters; add --use_peft (QLoRA)")
    if model_args.use_peft and stage_args.stage == 1:
        raise BadInput("--use_peft: stage 1 trains the projector fully; LoRA/QLoRA is for stage 2")
    if not model_args.use_peft:
        given = [flag for flag, value in (("--lora-vision", stage_args.lora_vision),
                                          ("--merge-adapter", stage_args.merge_adapter)) if value]
        if given:
            raise ValueError(f"{' and '.join(given)} only apply with --use_peft (LoRA/QLoRA)")
        return
    if stage_args.lora_vision and model_args.lora_target_modules:
        raise ValueError("--lora-vision has no effect with --lora_target_modules: name the vision layers there")
    if stage_args.train_vision and not stage_args.lora_vision and not model_args.lora_target_modules:
        raise ValueError("--train-vision under --use_peft trains the vision tower through adapters: add --lora-vision")
    if stage_args.train_vision is False and stage_args.lora_vision:
        raise ValueError("--train-vision False and --lora-vision contradict each other")


def has_accelerator() -> bool:
    import torch

    if torch.cuda.is_available():
        return True
    for name in ("xpu", "npu", "mps"):
        backend = getattr(torch, name, None) or getattr(torch.backends, name, None)
        if backend is not None and getattr(backend, "is_available", lambda: False)():
            return True
    return False


RECIPES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recipes")


def recipe_names() -> list[str]:
    """The recipes shipped with the package (``trainer/recipes/*.yaml``), without the extension."""
    return sorted(name[:-5] for name in os.listdir(RECIPES_DIR) if name.endswith(".yaml"))


def resolve_config(path: str) -> str:
    """A ``--config`` value -> a file: a path, or the name of a shipped recipe (with or without ``.yaml``)."""
    if os.path.isfile(path):
        return path
    shipped = os.path.join(RECIPES_DIR, path if path.endswith(".yaml") else path + ".yaml")
    if os.path.isfile(shipped):
        return shipped
    raise FileNotFoundError(f"--config: no such file or shipped recipe: {path} (recipes: {', '.join(recipe_names())})")


def hardware_settings(namespace, bf16_asked: bool = False) -> dict:
    """No GPU: train on the CPU in float32, or in bf16 autocast when ``--bf16 True`` is given on the command line (a
    recipe's ``bf16`` is for GPUs) and the CPU has bf16 matmul instructions (AMX or AVX512-BF16). Returns the fields
    to set (``use_cpu``, ``bf16``, ``fp16``; under a DeepSpeed launch ``ddp_backend`` too), empty with a GPU."""
    if has_accelerator():
        return {}
    from .engines import cpu_engine_settings, cpu_has_bf16_matmul

    deepspeed = cpu_engine_settings(namespace)
    if deepspeed is not None:  # a DeepSpeed launch: its CPU accelerator over gloo
        return deepspeed
    bf16 = bool(bf16_asked and namespace.bf16 and cpu_has_bf16_matmul())
    if bf16:
        logger.info("no GPU found: training on the CPU in bf16 autocast (--bf16 True; this CPU has AMX/AVX512-BF16)")
    elif bf16_asked and namespace.bf16:
        logger.warning("no GPU found and this CPU has no bf16 matmul instructions (AMX or AVX512-BF16), where bf16 "
                       "runs hundreds of times slower than float32: training in float32 (use_cpu=True, bf16 off)")
    elif namespace.bf16 is not False or namespace.fp16 or not namespace.use_cpu:
        logger.info("no GPU found: training on the CPU in float32 (use_cpu=True, bf16/fp16 off)")
    return {"use_cpu": True, "bf16": bf16, "fp16": False}


def accumulation_steps(global_batch_size: int, per_device: int, world_size: int) -> int:
    """gradient_accumulation_steps giving ``global_batch_size`` = per-device batch x processes x steps."""
    per_step = per_device * world_size
    if global_batch_size % per_step:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not a multiple of per_device_train_batch_size ({per_device}) "
            f"x processes ({world_size})"
        )
    return global_batch_size // per_step


def _global_batch_settings(namespace) -> dict:
    """``--global-batch-size``: the ``gradient_accumulation_steps`` that gives it on this launch's processes."""
    if namespace.global_batch_size is None:
        return {}
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun / accelerate launch
    steps = accumulation_steps(namespace.global_batch_size, namespace.per_device_train_batch_size, world)
    logger.info("global batch %d = %d per device x %d processes x %d accumulation steps",
                namespace.global_batch_size, namespace.per_device_train_batch_size, world, steps)
    return {"gradient_accumulation_steps": steps}


@dataclass(frozen=True)
class TrainRequest:
    """What the command line and the recipes say, before anything is derived: ``read_train_args``' result."""

    namespace: object  # argparse's Namespace: every field's value: flags over the recipes' values over the defaults
    config_files: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)  # the recipes' ``env:`` keys
    bf16_asked: bool = False  # --bf16 given on the command line (not only by a recipe)
    recipe_keys: tuple[str, ...] = ()  # the settings the recipes gave


@dataclass(frozen=True)
class TrainConfig:
    """A ``train`` run's settings, built once (``build_train_config``: validate, then derive) and then only read.

    ``stage_args``, ``sft_args``, ``model_args``: the three dataclasses of the parser, with what was derived from the
    machine already in them (no GPU: ``use_cpu`` and bf16/fp16; ``--global-batch-size``: the accumulation steps).
    ``load``: how the checkpoint is loaded (``llava_normaligned.loading.LoadOptions``, ``for_training``); None when
    stage 1 composes from ``--vision-model`` and ``--text-model``. ``environment``: the recipes' ``env:`` keys, set by
    ``setup_environment`` before the configuration is built (it may name devices, which decide the derived values)."""

    stage_args: StageArguments
    sft_args: SFTConfig
    model_args: ModelConfig
    load: LoadOptions | None
    config_files: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict:
        """What the run was given and derived, for the one log line at start: this package's fields and the load
        options in full, the Trainer's and the model's fields where they differ from TRL's defaults."""
        def changed(obj) -> dict:
            return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)
                    if f.init and f.default is not dataclasses.MISSING and getattr(obj, f.name) != f.default}

        return {"stage": dataclasses.asdict(self.stage_args), "load": dataclasses.asdict(self.load) if self.load else
                None, "trainer": changed(self.sft_args), "model": changed(self.model_args),
                "config_files": list(self.config_files), "environment": dict(self.environment)}


def setup_environment(environment: dict[str, str], namespace=None) -> None:
    """The one step of ``train`` that changes the process: the recipes' ``env:`` keys into ``os.environ``, each
    logged, then, given the parsed ``namespace`` of a DeepSpeed launch on a machine without GPUs, DeepSpeed's unused
    shared-memory op turned off (``engines.prepare_cpu_engine``). Run after parsing and before
    ``build_train_config`` (which reads the devices and changes nothing)."""
    for key, value in environment.items():
        logger.info("environment: %s=%s (from --config)%s", key, value,
                    "" if os.environ.get(key, value) == value else f", was {os.environ[key]}")
        os.environ[key] = value
    if namespace is not None and not has_accelerator():
        from .engines import prepare_cpu_engine

        prepare_cpu_engine(namespace)


def _check_request(namespace) -> None:
    """What the arguments must satisfy before anything is derived from them (``BadInput`` names the flag)."""
    if namespace.output_dir in (None, "", "trainer_output"):
        raise BadInput("--output-dir is required: the folder to write the model and checkpoints to")
    if namespace.model and namespace.model_name_or_path and namespace.model != namespace.model_name_or_path:
        raise BadInput("--model and --model_name_or_path disagree: give one")
    check_numbers(namespace, TRAIN_NUMBERS, flag=train_flag)
    if str(getattr(namespace.eval_strategy, "value", namespace.eval_strategy)) != "no":
        raise BadInput(f"--eval_strategy {namespace.eval_strategy}: `train` takes no evaluation data, so there is "
                       "nothing to evaluate; leave it at 'no' (score a checkpoint with `llava-normaligned eval`)")
    for flag in ("deepspeed", "fsdp_config"):  # read when the configs are built
        value = getattr(namespace, flag, None)
        if isinstance(value, str) and value.endswith(".json"):
            check_input_file(f"--{flag}", value)


def train_load_options(stage_args: StageArguments, sft_args: SFTConfig, model_args: ModelConfig) -> LoadOptions | None:
    """How ``train`` loads its checkpoint: the same ``LoadOptions`` as every command, from train's fields (the LLM in
    4/8-bit only for QLoRA; 4-bit is always double-quantized, so ``--use_bnb_nested_quant`` is moot). None when
    stage 1 composes from a vision encoder and a causal LM."""
    if stage_args.model is None:
        return None
    return LoadOptions(
        stage_args.model, revision=model_args.model_revision, dtype=model_args.dtype,
        trust_remote_code=sft_args.trust_remote_code, attn_implementation=model_args.attn_implementation,
        quantization="4bit" if model_args.load_in_4bit else "8bit" if model_args.load_in_8bit else None,
        quant_type=model_args.bnb_4bit_quant_type, for_training=True,
    )


def build_train_config(request: TrainRequest) -> TrainConfig:
    """Validate, then derive, once: the run's ``TrainConfig``. The request is not changed; what is derived (the
    model under its two names, the hardware's precision, the global batch's accumulation steps) is computed here and
    given to the dataclasses when they are built."""
    namespace = request.namespace
    _check_request(namespace)
    model = namespace.model or namespace.model_name_or_path
    derived = {"model": model, "model_name_or_path": model,
               **hardware_settings(namespace, bf16_asked=request.bf16_asked),
               **_global_batch_settings(namespace)}
    values = {**vars(namespace), **derived}
    built = []
    for dataclass_type in DATACLASSES:
        names = {f.name for f in dataclasses.fields(dataclass_type) if f.init}
        built.append(dataclass_type(**{k: v for k, v in values.items() if k in names}))
    stage_args, sft_args, model_args = built
    check_peft_flags(stage_args, model_args)
    return TrainConfig(stage_args, sft_args, model_args, train_load_options(stage_args, sft_args, model_args),
                       request.config_files, dict(request.environment))


__all__ = [
    "TRAIN_NUMBERS",
    "StageArguments",
    "StageConfig",
    "TrainConfig",
    "TrainRequest",
    "accumulation_steps",
    "build_train_config",
    "check_chat_template_path",
    "check_peft_flags",
    "check_train_inputs",
    "earlier_run",
    "has_accelerator",
    "recipe_names",
    "resolve_config",
    "setup_environment",
    "train_load_options",
]
