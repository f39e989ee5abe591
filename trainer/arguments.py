"""Arguments of ``llava-normaligned train``: this package's stage options, TRL's ``SFTConfig`` and ``ModelConfig``.

One parser (TRL's ``TrlParser``, itself transformers' ``HfArgumentParser``) reads them all, so every ``SFTConfig``
flag works (``--per_device_train_batch_size 4`` or ``--per-device-train-batch-size 4``), YAML recipes set defaults
(``--config recipe.yaml``; several ``--config`` files merge in order, later ones win) and command-line flags override
the YAML. A ``--config`` value may also name a recipe shipped in ``trainer/recipes/`` (``--config
llama3.2-3b_siglip-so400m_stage1``). Two adjustments are made before the configs are built, each logged:

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

from trl import ModelConfig, SFTConfig, TrlParser

logger = logging.getLogger(__name__)


@dataclass
class StageConfig:
    """How one stage trains, beside TRL's ``SFTConfig``: ``train_stage(..., args=SFTConfig(...),
    stage=StageConfig(...))``, as TRL's trainers take ``args=SFTConfig``. The command line's ``StageArguments`` is one,
    so ``train`` passes what it parsed as is.

    Learning rates (paper Appendix E.1: stage 2 LLM 1e-5, vision 2e-6): ``None`` takes ``args.learning_rate``; the
    projector follows the LLM's. Stage 1 uses only ``lr_projector``.
    """

    stage: int = field(metadata={"help": "1: feature alignment (projector + norm); 2: instruction tuning (all)",
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
        "help": "sets gradient_accumulation_steps = global / (per-device batch x processes)"})
    # the paper's ablation (Tables 4/5): applied to the model before stage 1
    projector_norm: str | None = field(default=None, metadata={
        "help": "stage 1 variant: 'layernorm' or 'none' (w/o Norm); default: as the model is",
        "choices": ["layernorm", "none"]})
    norm_init: str | None = field(default=None, metadata={
        "help": "stage 1 variant: 'target' (gain T/sqrt(D)) or 'default' (gain 1)", "choices": ["target", "default"]})
    gradient_compensation: bool | None = field(default=None, metadata={
        "help": "stage 1 variant: Global Weight Compensation on/off"})
    lora_vision: bool = field(default=False, metadata={
        "help": "with --use_peft: LoRA adapters on the vision tower's linear layers too (default: the LLM's only)"})
    merge_adapter: bool = field(default=False, metadata={
        "help": "with --use_peft: also save the base model with the adapter merged in, to OUTPUT_DIR/merged"})

    def __post_init__(self):
        super().__post_init__()
        if self.model is None and not (self.vision_model and self.text_model):
            raise ValueError("give --model (a LLaVA checkpoint), or --vision-model and --text-model for stage 1")
        if self.model is None and self.stage == 2:
            raise ValueError("stage 2 starts from a checkpoint: give --model (stage 1's output folder)")
        if (self.data_path is None) == (self.dataset_name is None):
            raise ValueError("give exactly one of --data-path (LLaVA JSON) and --dataset-name (messages + images)")
        if self.global_batch_size is not None and self.global_batch_size < 1:
            raise ValueError(f"--global-batch-size must be positive, got {self.global_batch_size}")

    def variant(self) -> dict:
        """The ablation fields given (``projector_norm`` as the model config spells it: ``None`` for 'none')."""
        out = {}
        if self.projector_norm is not None:
            out["projector_norm"] = None if self.projector_norm == "none" else self.projector_norm
        if self.norm_init is not None:
            out["norm_init"] = self.norm_init
        if self.gradient_compensation is not None:
            out["gradient_compensation"] = self.gradient_compensation
        return out


DATACLASSES = (StageArguments, SFTConfig, ModelConfig)


def check_peft_flags(stage_args: StageArguments, model_args: ModelConfig) -> None:
    """Refuse flags that would do nothing: the adapter flags without ``--use_peft``, ``--lora-vision`` where
    ``--lora_target_modules`` already chose the targets, and ``--train-vision`` under PEFT with no adapter on the
    vision tower."""
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


def make_parser() -> TrlParser:
    parser = TrlParser(
        DATACLASSES,
        prog="llava-normaligned train",
        usage="llava-normaligned train --stage {1,2} (--model DIR | --vision-model ID --text-model ID) "
        "(--data-path JSON --image-folder DIR | --dataset-name ID) --output-dir DIR [--config RECIPE] [options]",
        description="Train LLaVA-1.5 stage 1 or 2 of a norm-aligned (or stock) LLaVA with TRL's SFTTrainer. Every "
        "SFTConfig and ModelConfig flag is accepted; --config RECIPE.yaml (repeatable) sets defaults.",
    )
    _group_own_flags_first(parser)
    _add_sampling_strategies(parser)
    return parser


def _add_sampling_strategies(parser) -> None:
    """``--train_sampling_strategy`` takes this package's length groupings too (``sampling.GROUPED_STRATEGIES``,
    ``group_by_length`` included, which transformers also names)."""
    from .sampling import GROUPED_STRATEGIES

    action = next(a for a in parser._actions if a.dest == "train_sampling_strategy")  # argparse's list of actions
    action.choices = list(dict.fromkeys([*action.choices, *GROUPED_STRATEGIES]))
    action.help = ("order of the training rows: 'random' (default), 'sequential', 'group_by_length' (rows of similar "
                   "length share a batch) or 'group_by_modality_length' (LLaVA-1.5's stage 2: image and text-only rows "
                   "in separate steps, similar lengths within a batch); the two groupings use the prepared token "
                   "counts and are exact on resume. Also: transformers' 'batch_rebalance'")


def _group_own_flags_first(parser) -> None:
    """``--help`` lists this package's flags (``StageArguments``) first, in their own group, then TRL's and
    transformers' (HfArgumentParser puts every dataclass's flags in one "options" group)."""
    own = {f.name for f in dataclasses.fields(StageArguments)}
    options = parser._optionals  # argparse keeps its groups in these attributes (stable since Python 3.2)
    group = parser.add_argument_group("llava-normaligned: model, data, stage and variant")
    moved = [a for a in options._group_actions if a.dest in own]
    for action in moved:
        options._group_actions.remove(action)
        group._group_actions.append(action)
    options.title = "TRL SFTConfig and ModelConfig (transformers TrainingArguments)"
    parser._action_groups.remove(group)
    parser._action_groups.insert(parser._action_groups.index(options), group)


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


def _read_configs(paths: list[str]) -> dict:
    import yaml

    merged = {}
    for path in map(resolve_config, paths):
        with open(path, encoding="utf-8") as handle:
            config = yaml.safe_load(handle) or {}
        if not isinstance(config, dict):
            raise ValueError(f"--config {path}: expected a YAML mapping of argument names to values")  # noqa: TRY004
        for key, value in (config.pop("env", None) or {}).items():
            os.environ[key] = str(value)
        merged.update(config)
    return merged


def _pop_configs(argv: list[str]) -> tuple[list[str], list[str]]:
    rest, configs, i = [], [], 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 >= len(argv):
                raise ValueError("--config needs a file")
            configs.append(argv[i + 1])
            i += 2
        elif argv[i].startswith("--config="):
            configs.append(argv[i].split("=", 1)[1])
            i += 1
        else:
            rest.append(argv[i])
            i += 1
    return rest, configs


def _adjust_for_hardware(namespace, bf16_asked: bool = False) -> None:
    """No GPU: train on the CPU in float32, or in bf16 autocast when ``--bf16 True`` is given on the command line (a
    recipe's ``bf16`` is for GPUs) and the CPU has bf16 matmul instructions (AMX or AVX512-BF16)."""
    if has_accelerator():
        return
    from .engines import cpu_engine_arguments, cpu_has_bf16_matmul

    if cpu_engine_arguments(namespace):  # a DeepSpeed launch: its CPU accelerator over gloo
        return
    bf16 = bool(bf16_asked and namespace.bf16 and cpu_has_bf16_matmul())
    if bf16:
        logger.info("no GPU found: training on the CPU in bf16 autocast (--bf16 True; this CPU has AMX/AVX512-BF16)")
    elif bf16_asked and namespace.bf16:
        logger.warning("no GPU found and this CPU has no bf16 matmul instructions (AMX or AVX512-BF16), where bf16 "
                       "runs hundreds of times slower than float32: training in float32 (use_cpu=True, bf16 off)")
    elif namespace.bf16 is not False or namespace.fp16 or not namespace.use_cpu:
        logger.info("no GPU found: training on the CPU in float32 (use_cpu=True, bf16/fp16 off)")
    namespace.use_cpu, namespace.bf16, namespace.fp16 = True, bf16, False


def accumulation_steps(global_batch_size: int, per_device: int, world_size: int) -> int:
    """gradient_accumulation_steps giving ``global_batch_size`` = per-device batch x processes x steps."""
    per_step = per_device * world_size
    if global_batch_size % per_step:
        raise ValueError(
            f"global_batch_size={global_batch_size} is not a multiple of per_device_train_batch_size ({per_device}) "
            f"x processes ({world_size})"
        )
    return global_batch_size // per_step


def _apply_global_batch(namespace) -> None:
    if namespace.global_batch_size is None:
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))  # set by torchrun / accelerate launch
    namespace.gradient_accumulation_steps = accumulation_steps(
        namespace.global_batch_size, namespace.per_device_train_batch_size, world)
    logger.info("global batch %d = %d per device x %d processes x %d accumulation steps",
                namespace.global_batch_size, namespace.per_device_train_batch_size, world,
                namespace.gradient_accumulation_steps)


def parse_train_args(argv: list[str] | None = None):
    """argv -> ``(StageArguments, SFTConfig, ModelConfig, config_files)``."""
    import sys

    argv, config_files = _pop_configs(list(sys.argv[1:] if argv is None else argv))
    parser = make_parser()
    if config_files:
        unused = parser.set_defaults_with_config(**_read_configs(config_files))
        if unused:
            raise ValueError(f"--config: unknown arguments {unused} (not a train, SFTConfig or ModelConfig field)")
    namespace, remaining = parser.parse_known_args(argv)
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(remaining)}")
    if namespace.output_dir in (None, "", "trainer_output"):
        parser.error("--output-dir is required")
    if namespace.model and namespace.model_name_or_path and namespace.model != namespace.model_name_or_path:
        parser.error("--model and --model_name_or_path disagree: give one")
    namespace.model = namespace.model or namespace.model_name_or_path
    namespace.model_name_or_path = namespace.model
    _adjust_for_hardware(namespace, bf16_asked=any(arg == "--bf16" or arg.startswith("--bf16=") for arg in argv))
    _apply_global_batch(namespace)
    values = vars(namespace)
    built = []
    for dataclass_type in DATACLASSES:
        names = {f.name for f in dataclasses.fields(dataclass_type) if f.init}
        built.append(dataclass_type(**{k: v for k, v in values.items() if k in names}))
    stage_args, sft_args, model_args = built
    check_peft_flags(stage_args, model_args)
    return stage_args, sft_args, model_args, config_files


__all__ = [
    "StageArguments",
    "StageConfig",
    "accumulation_steps",
    "check_peft_flags",
    "has_accelerator",
    "make_parser",
    "parse_train_args",
    "recipe_names",
    "resolve_config",
]
