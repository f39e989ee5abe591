"""Put the paper's aligned LayerNorm into a saved vision-language model of another family (the `align` command is
`llava_normaligned.commands.align`; see docs/align.md).

The norm-aligned LayerNorm (gain T / sqrt(D), Global Weight Compensation; Li et al., arXiv 2512.08374, §5.1) goes
where the family's connector output becomes the LLM's input embeddings (`Family.norm_entry`). The written folder holds
the stock weights under their own module names plus the norm's two tensors, remote code that wraps the stock class
(`modeling_llava_normaligned/modeling_normaligned_vlm.py`), the family's processor files and a config recording the
family, the connector's path and T, so that it loads with `AutoModelForImageTextToText.from_pretrained(DIR,
trust_remote_code=True)`.

    llava-normaligned align HuggingFaceTB/SmolVLM-256M-Instruct --output-dir smolvlm-aligned
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from llava_normaligned.checks import BadInput

from .families.anatomy import Family, anatomy_of, family_of
from .loading import load_config, load_model
from .norm_variant import NormVariant

# What the model file knows how to wrap (its STOCK_MODEL_TYPES); kept here so that --help and the refusals import
# neither torch nor transformers. tests/test_align.py holds the two equal.
SUPPORTED_MODEL_TYPES = (
    "idefics3",
    "smolvlm",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "llava_next",
    "llava_onevision",
    "gemma3",
    "internvl",
    "mistral3",
)
# Files of a checkpoint that are not the processor's: the model's own, written anew.
_MODEL_FILES = ("config.json", "generation_config.json")
_MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json", ".py", ".md", ".gguf", ".msgpack", ".h5")
_PROCESSOR_PATTERNS = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken", "additional_chat_templates/*")


class AlignError(BadInput):
    """A model ``align`` cannot put the norm into (its family, or a part of it, is not where it should be)."""


def supported() -> str:
    """Lists the model types `align` supports, for messages.

    Returns:
        `str`: `SUPPORTED_MODEL_TYPES` joined with `", "`.
    """
    return ", ".join(SUPPORTED_MODEL_TYPES)


def alignable_family(config, model_id: str) -> Family:
    """Finds the family of a config and checks that `align` can place the norm in it.

    Args:
        config (`PretrainedConfig` or `dict`):
            The stock model's config, or its `config.json` as a dict.
        model_id (`str`):
            The model's name, used in the error message.

    Returns:
        `Family`: The model's family (`families.anatomy.family_of`).

    Raises:
        `AlignError`: If the model is of no known family, if its family has an `align_refusal`, or if its `model_type`
        is not one of `SUPPORTED_MODEL_TYPES`; the one-line message says why.
    """
    family = family_of(config)
    model_type = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
    if family is None:
        raise AlignError(f"{model_id} (model_type {model_type!r}) is not a vision-language model of a family align "
                         f"knows; align supports: {supported()}")
    if family.align_refusal is not None:
        raise AlignError(f"{model_id} ({family.name}): {family.align_refusal}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise AlignError(f"{model_id} (model_type {model_type!r}): align supports {supported()}")
    return family


def norm_target_of(model) -> float:
    """Measures T on a stock model, as training and diagnostics do (`Anatomy.text_norm_target`).

    T is the mean L2 norm of the LLM's input-embedding rows, the family's placeholder rows left out, times the embedding
    layer's own scale (Gemma multiplies its rows by sqrt(D) in `embed_tokens`).

    Args:
        model (`PreTrainedModel`):
            The stock model, with its input embeddings loaded.

    Returns:
        `float`: T.

    Raises:
        `ValueError`: If the model's parts cannot be found (`AnatomyError`) or T is undefined
        (`text_embedding_norm_target`).
    """
    return anatomy_of(model).text_norm_target()


def aligned_config(stock_config, family: Family, norm_target: float, variant: NormVariant, source: str | None = None):
    """Builds the aligned config (`normaligned_<model_type>`) from a stock config and the norm's options.

    Args:
        stock_config (`PretrainedConfig`):
            The stock model's config; every field except `model_type`, `architectures`, `auto_map` and
            `transformers_version` is carried over.
        family (`Family`):
            The model's family: gives `norm_family`, `norm_connector` (`family.projector`) and `norm_entry`.
        norm_target (`float`):
            T.
        variant (`NormVariant`):
            Gives `norm_init`, `gradient_compensation` and `gradient_compensation_min`.
        source (`str`, *optional*):
            The stock model's Hub id, stored as `norm_source` (the model card's base model); `None` for a local folder.

    Returns:
        `PretrainedConfig`: An instance of `aligned_config_class(stock_config.model_type)`.

    Raises:
        `ValueError`: If the stock model type has no aligned config, or a norm field is invalid.
    """
    from modeling_llava_normaligned.configuration_normaligned_vlm import aligned_config_class

    values = stock_config.to_dict()
    for key in ("model_type", "architectures", "auto_map", "transformers_version"):
        values.pop(key, None)
    return aligned_config_class(stock_config.model_type)(
        **values,
        norm_family=family.name,
        norm_connector=family.projector,
        norm_entry=family.norm_entry,
        norm_target=norm_target,
        norm_init=variant.norm_init,
        gradient_compensation=variant.gradient_compensation,
        gradient_compensation_min=variant.gradient_compensation_min,
        norm_source=source,
    )


def wrap(stock, family: Family, norm_target: float, variant: NormVariant, source: str | None = None):
    """Builds the aligned model around a stock model's weights, plus a new norm.

    The aligned model is built on the meta device and takes the stock model's parameters and buffers as they are (the
    same tensors: nothing is copied). The new norm is placed on the device and in the dtype of the connector's first
    floating-point parameter. The stock model's generation config and training mode carry over.

    Args:
        stock (`PreTrainedModel`):
            The stock image-text-to-text model.
        family (`Family`):
            Its family (see `alignable_family`).
        norm_target (`float`):
            T (see `norm_target_of`).
        variant (`NormVariant`):
            The norm's init and GWC options.
        source (`str`, *optional*):
            The stock model's Hub id (see `aligned_config`).

    Returns:
        `NormAligned<StockForConditionalGeneration>`: The aligned model.

    Raises:
        `AlignError`: If the aligned model does not hold the stock model's weights under the same names (anything
        missing besides the norm, or unexpected), or if a tensor is left on the meta device.
    """
    import torch

    from modeling_llava_normaligned.configuration_normaligned_vlm import ALIGNED_NORM_NAME
    from modeling_llava_normaligned.modeling_normaligned_vlm import aligned_model_class, new_aligned_norm

    config = aligned_config(stock.config, family, norm_target, variant, source)
    with torch.device("meta"):
        model = aligned_model_class(stock.config.model_type)(config)
    state = stock.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    norm_keys = {f"{family.projector}.{ALIGNED_NORM_NAME}.{name}" for name in ("weight", "bias")}
    if set(missing) != norm_keys or unexpected:
        raise AlignError(f"the aligned {type(model).__name__} does not hold {type(stock).__name__}'s weights as they "
                         f"are (missing {sorted(set(missing) - norm_keys)[:3]}, unexpected {unexpected[:3]})")
    buffers = dict(stock.named_buffers())
    for name, _ in list(model.named_buffers()):  # the buffers no state dict holds (rotary frequencies, ids)
        if name not in state and name in buffers:
            owner, _, attribute = name.rpartition(".")
            module = model.get_submodule(owner) if owner else model
            setattr(module, attribute, buffers[name])  # nn.Module.__setattr__ keeps a buffer a buffer
    connector = model.get_submodule(family.projector)
    reference = next(p for p in stock.get_submodule(family.projector).parameters() if p.is_floating_point())
    connector.add_module(ALIGNED_NORM_NAME, new_aligned_norm(config).to(device=reference.device, dtype=reference.dtype))
    model.tie_weights()
    still_meta = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.device.type == "meta"]
    if still_meta:
        raise AlignError(f"the aligned model left {len(still_meta)} tensors unset ({still_meta[0]}, ...)")
    model.generation_config = stock.generation_config
    return model.train(stock.training)


def align(
    model_id: str,
    *,
    norm_init: str = "target",
    gradient_compensation: bool = True,
    gradient_compensation_min: float = 1e-3,
    dtype=None,
    revision: str | None = None,
    trust_remote_code: bool | None = None,
):
    """Loads a stock VLM and puts the aligned LayerNorm where its connector's output enters the LLM.

    On a text-only input the result computes what the stock model computes.

    Args:
        model_id (`str`):
            A local folder or a Hub repo id of a stock VLM of a family in `SUPPORTED_MODEL_TYPES`.
        norm_init (`str`, *optional*, defaults to `"target"`):
            `"target"`: gain T / sqrt(D) (paper §5.1); `"default"`: gain 1.
        gradient_compensation (`bool`, *optional*, defaults to `True`):
            Whether GWC is on.
        gradient_compensation_min (`float`, *optional*, defaults to 1e-3):
            The clamp of GWC.
        dtype (`torch.dtype` or `str`, *optional*):
            The dtype to load the stock model in (`loading.load_model`'s `dtype`); `None` loads it as stored.
        revision (`str`, *optional*):
            The Hub revision.
        trust_remote_code (`bool`, *optional*):
            Passed to the config and model loaders; `None` is transformers' own resolution.

    Returns:
        `NormAligned<StockForConditionalGeneration>`: The aligned model, in eval mode, with `norm_source` set to
        `model_id` when it is a Hub id.

    Raises:
        `AlignError`: For a family `align` does not support.
        `ValueError`: For an invalid norm option (`NormVariant`).
        `SourceNotFound`: For a `model_id` that is neither a local folder nor a reachable Hub repo.
    """
    variant = NormVariant(norm_init=norm_init, gradient_compensation=gradient_compensation,
                          gradient_compensation_min=gradient_compensation_min)
    config = load_config(model_id, revision=revision, trust_remote_code=trust_remote_code)
    family = alignable_family(config, model_id)
    stock, _ = load_model(model_id, revision=revision, dtype=dtype, trust_remote_code=trust_remote_code)
    source = None if os.path.isdir(os.path.expanduser(model_id)) else model_id  # a Hub id: the card's base model
    return wrap(stock, family, norm_target_of(stock), variant, source)


# ---------------------------------------------------------------------------------------------------- writing


def processor_source(model_id: str, revision: str | None) -> str:
    """Finds a local folder holding a model's processor files.

    Args:
        model_id (`str`):
            A local folder or a Hub repo id.
        revision (`str`, *optional*):
            The Hub revision.

    Returns:
        `str`: `model_id` itself (`~` expanded) when it is a folder; otherwise the folder where
        `huggingface_hub.snapshot_download` put the repo's files that match `_PROCESSOR_PATTERNS` (`*.json`,
        `*.jinja`, `*.txt`, `*.model`, `*.tiktoken`, `additional_chat_templates/*`).
    """
    folder = os.path.expanduser(model_id)  # "~/model", quoted, reaches here unexpanded
    if os.path.isdir(folder):
        return folder
    from huggingface_hub import snapshot_download

    return snapshot_download(model_id, revision=revision, allow_patterns=list(_PROCESSOR_PATTERNS))


def copy_processor_files(source: str, output_dir: str, stock_model_type: str) -> list[str]:
    """Copies a checkpoint's processor files (tokenizer, image processor, chat templates) to `output_dir`.

    Every top-level file is copied except `config.json`, `generation_config.json`, hidden files and weight, code and
    card files (`_MODEL_SUFFIXES`); an `additional_chat_templates` folder is copied whole. When none of
    `processor_config.json`, `preprocessor_config.json` and `tokenizer_config.json` names a `processor_class`,
    transformers would pick the processor by the config's model type, which is now the aligned one, so the stock
    family's processor class is written into `processor_config.json`.

    Args:
        source (`str`):
            The folder to copy from (see `processor_source`).
        output_dir (`str`):
            An existing folder to copy into.
        stock_model_type (`str`):
            The stock `model_type`, which names the processor class.

    Returns:
        `list[str]`: The names of the files and folders copied from `source`.
    """
    copied = []
    for name in sorted(os.listdir(source)):
        path = os.path.join(source, name)
        if name == "additional_chat_templates" and os.path.isdir(path):
            shutil.copytree(path, os.path.join(output_dir, name))
            copied.append(name)
        elif os.path.isfile(path) and name not in _MODEL_FILES and not name.endswith(_MODEL_SUFFIXES) \
                and not name.startswith("."):
            shutil.copy2(path, os.path.join(output_dir, name))
            copied.append(name)
    named = False
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        path = os.path.join(output_dir, name)
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    named = named or bool(json.load(f).get("processor_class"))
            except (OSError, ValueError):
                pass
    if not named:
        from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

        processor_class = PROCESSOR_MAPPING_NAMES.get(stock_model_type)
        if processor_class:
            path = os.path.join(output_dir, "processor_config.json")
            stored = {}
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    stored = json.load(f)
            with open(path, "w", encoding="utf-8") as f:
                json.dump({**stored, "processor_class": processor_class}, f, indent=2)
    return copied


def save_aligned(model, output_dir: str, processor_source: str | None = None) -> None:
    """Writes a model (weights, config, remote code) and its processor files to `output_dir`, atomically.

    Everything is written to a temporary folder beside `output_dir`, which is renamed at the end, so a failed or stopped
    run leaves nothing half-written.

    Args:
        model (`NormAligned<StockForConditionalGeneration>`):
            The aligned model (see `align`).
        output_dir (`str`):
            The folder to write; it must not exist or be empty.
        processor_source (`str`, *optional*):
            A folder of processor files to copy (see `copy_processor_files`); `None` copies none.

    Raises:
        `OSError`: If `output_dir` exists and is not empty. On any error the temporary folder is removed.
    """
    output_dir = os.path.abspath(os.path.expanduser(output_dir))
    parent = os.path.dirname(output_dir)
    os.makedirs(parent, exist_ok=True)
    stock_model_type = model.config.model_type.removeprefix("normaligned_")
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.", dir=parent)
    try:
        model.save_pretrained(staging)
        if processor_source is not None:
            copy_processor_files(processor_source, staging, stock_model_type)
        if os.path.isdir(output_dir):
            os.rmdir(output_dir)  # checked empty before the run
        os.replace(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


__all__ = ["SUPPORTED_MODEL_TYPES", "AlignError", "align", "alignable_family",
           "copy_processor_files", "norm_target_of", "processor_source", "save_aligned", "supported", "wrap"]
