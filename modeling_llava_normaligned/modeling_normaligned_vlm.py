"""Stock vision-language models with the norm-aligned LayerNorm (Li et al., arXiv 2512.08374, §5.1) where the
connector's output becomes the LLM's input embeddings (`llava-normaligned align`).

`NormAligned<StockModel>` subclasses the stock model class (its forward, generate, weight names and processor are the
stock ones) and adds one module, `<connector>.aligned_norm` ([`NormAlignedLayerNorm`]), applied either by a forward
hook on the connector (`norm_entry="connector_output"`) or to the output of the base model's `get_image_features` /
`get_video_features` (`norm_entry="image_features"`: LLaVA-NeXT and OneVision append their `image_newline` rows after
the connector). On a text-only input the model computes exactly what the stock model computes. Classes are built on
first use: transformers resolves `auto_map` names with `getattr` on this module (PEP 562 `__getattr__`). The weights
are saved under the module names as they are, since transformers' per-model key conversions do not apply to custom
code. This file is pushed to the Hub with every aligned checkpoint: it imports torch, transformers and its sibling
files only.
"""

import functools

import torch
from transformers import initialization as init
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

from .configuration_normaligned_vlm import (
    ALIGNED_NORM_NAME,
    CLASS_PREFIX,
    STOCK_MODEL_TYPES,
    aligned_config_class,
)
from .modeling_llava_normaligned import NormAlignedLayerNorm, fill_norm, gain_init, new_norm
from .transformers_hooks import give_class

_MODEL_CLASSES: dict = {}


def new_aligned_norm(config) -> NormAlignedLayerNorm:
    """
    Builds the aligned norm a config asks for, with its initial values set.

    Args:
        config (`PretrainedConfig`):
            An aligned stock VLM's config (see `aligned_config_class`), read for `norm_init`, `norm_target`,
            `gradient_compensation`, `gradient_compensation_min` and the LLM's width
            (`config.get_text_config().hidden_size`).

    Returns:
        [`NormAlignedLayerNorm`]: The norm, with bias 0 and gain T / sqrt(D) (`norm_init="target"`), or 1
        (`norm_init="default"`, or while `norm_target` is not known).
    """
    norm = new_norm(config)
    fill_norm(norm, _gain(config))
    return norm


def _gain(config) -> float:
    """The initial gain: T / sqrt(D) (``norm_init="target"``), 1 (``"default"``, or while T is unknown)."""
    if config.norm_target is None and config.norm_init == "target":
        return 1.0
    return gain_init(config.norm_init, config.norm_target, config.get_text_config().hidden_size)


def _normed(norm, features):
    """``features`` (a tensor, or a list/tuple of per-image tensors) through ``norm``, in their own dtype."""
    if isinstance(features, torch.Tensor):
        return norm(features.to(norm.weight.dtype)).to(features.dtype)
    if isinstance(features, (list, tuple)):
        return type(features)(_normed(norm, one) for one in features)
    return features


def _connector_hook(module, args, output):
    norm = getattr(module, ALIGNED_NORM_NAME)
    if isinstance(output, torch.Tensor):
        return _normed(norm, output)
    if hasattr(output, "last_hidden_state"):  # a connector returning a ModelOutput
        output.last_hidden_state = _normed(norm, output.last_hidden_state)
        return output
    raise TypeError(f"the connector {type(module).__name__} returned {type(output).__name__}: no tensor to align")


def _aligned_features(base, method, args, kwargs):
    """``method`` (the stock get_image_features / get_video_features) of ``base``, its ``pooler_output`` (what the
    base model scatters into the LLM's input embeddings) through the aligned norm."""
    return_dict = kwargs.pop("return_dict", True)
    output = method(base, *args, return_dict=True, **kwargs)
    path = base.config.norm_connector
    prefix = base.base_model_prefix + "."  # the connector's path is relative to the model with its LM head
    norm = getattr(base.get_submodule(path.removeprefix(prefix)), ALIGNED_NORM_NAME)
    if hasattr(output, "pooler_output"):
        output.pooler_output = _normed(norm, output.pooler_output)
    else:
        output = _normed(norm, output)
    return output if return_dict or not hasattr(output, "to_tuple") else output.to_tuple()


def _features_method(method):
    """The override of one of the two methods. ``functools.wraps`` keeps the stock signature, which ``generate``
    reads to pass the pixel values to it before the prefill."""

    @functools.wraps(method)
    def features(self, *args, **kwargs):
        return _aligned_features(self, method, args, kwargs)

    return features


_BASE_CLASSES: dict = {}


def _aligned_base_class(stock_base):
    """The stock base model class with get_image_features / get_video_features returning aligned features (for
    ``norm_entry = "image_features"``); a class, not a patched instance, so that copies of the model keep it."""
    if stock_base in _BASE_CLASSES:
        return _BASE_CLASSES[stock_base]
    namespace = {"__module__": __name__, "__qualname__": CLASS_PREFIX + stock_base.__name__}
    for name in ("get_image_features", "get_video_features"):
        method = getattr(stock_base, name, None)
        if method is not None:
            namespace[name] = _features_method(method)
    cls = type(CLASS_PREFIX + stock_base.__name__, (stock_base,), namespace)
    _BASE_CLASSES[stock_base] = cls
    return cls


def _install(model) -> None:
    """Add ``<connector>.aligned_norm`` to ``model`` and apply it where the config says."""
    config = model.config
    if not config.norm_connector:
        raise ValueError(f"{type(model).__name__}: config.norm_connector (the connector's module path) is not set")
    connector = model.get_submodule(config.norm_connector)
    connector.add_module(ALIGNED_NORM_NAME, new_aligned_norm(config))
    if config.norm_entry == "connector_output":
        connector.register_forward_hook(_connector_hook)
    else:  # "image_features": what get_image_features / get_video_features hand to the LLM
        base = getattr(model, model.base_model_prefix)
        give_class(base, _aligned_base_class(type(base)))


def aligned_model_class(stock_model_type: str):
    """
    Returns the aligned model class of a stock model type, built on first use and then reused.

    The class, `NormAligned<StockForConditionalGeneration>`, subclasses the stock image-text-to-text class. Its
    `__init__` runs the stock one, then adds `<connector>.aligned_norm` at `config.norm_connector` and applies it where
    `config.norm_entry` says; it raises a `ValueError` when `config.norm_connector` is not set. Its `_init_weights`
    gives the norm its initial gain (leaving loaded weights alone). The class is marked for
    `AutoModelForImageTextToText` (`register_for_auto_class`), so that `save_pretrained` copies the remote code.

    Args:
        stock_model_type (`str`):
            The stock `model_type`, one of `STOCK_MODEL_TYPES` (e.g. `"qwen2_vl"`).

    Returns:
        `type`: The `NormAligned<StockForConditionalGeneration>` class; the same object on every call with the same
        `stock_model_type`.

    Raises:
        `ValueError`: If `stock_model_type` is not one of `STOCK_MODEL_TYPES`.
    """
    if stock_model_type in _MODEL_CLASSES:
        return _MODEL_CLASSES[stock_model_type]
    config_class = aligned_config_class(stock_model_type)
    stock = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING[config_class.__mro__[1]]

    def __init__(self, config, *args, **kwargs):
        stock.__init__(self, config, *args, **kwargs)
        _install(self)

    def get_aligned_norm(self) -> NormAlignedLayerNorm:
        """
        Returns the aligned LayerNorm.

        Returns:
            [`NormAlignedLayerNorm`]: The module at `<config.norm_connector>.aligned_norm`.
        """
        return getattr(self.get_submodule(self.config.norm_connector), ALIGNED_NORM_NAME)

    def _init_weights(self, module):
        if isinstance(module, NormAlignedLayerNorm):  # the stock init would set a LayerNorm's gain to 1
            # transformers' init functions leave loaded weights alone (a trained gain is not reset)
            init.constant_(module.weight, _gain(self.config))
            init.zeros_(module.bias)
            return
        stock._init_weights(self, module)

    def save_pretrained(self, *args, **kwargs):
        """
        Saves the model as `PreTrainedModel.save_pretrained` does, under the module names as they are.

        `save_original_format` defaults to `False` here: otherwise transformers would write the stock submodules' legacy
        names (LLaVA-NeXT's `language_model.model.*`), which only its own conversions read back.

        Args:
            *args, **kwargs:
                The arguments of `PreTrainedModel.save_pretrained` (`save_directory` first).

        Returns:
            `None`: What `PreTrainedModel.save_pretrained` returns.
        """
        kwargs.setdefault("save_original_format", False)
        return stock.save_pretrained(self, *args, **kwargs)

    namespace = {
        "__module__": __name__,
        "__qualname__": CLASS_PREFIX + stock.__name__,
        "__doc__": f"{stock.__name__} with the norm-aligned LayerNorm at its connector's output (paper §5.1).",
        "config_class": config_class,
        "__init__": __init__,
        "get_aligned_norm": get_aligned_norm,
        "_init_weights": _init_weights,
        "save_pretrained": save_pretrained,
    }
    cls = type(CLASS_PREFIX + stock.__name__, (stock,), namespace)
    cls.register_for_auto_class("AutoModelForImageTextToText")
    _MODEL_CLASSES[stock_model_type] = cls
    return cls


def register_model_classes() -> None:
    """
    Registers every aligned config and model class with `AutoConfig` and `AutoModelForImageTextToText` in this process
    (idempotent), so that an aligned folder loads here without running its copy of this code.
    """
    from transformers import AutoConfig, AutoModelForImageTextToText

    for model_type in STOCK_MODEL_TYPES:
        config_class, model_class = aligned_config_class(model_type), aligned_model_class(model_type)
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        AutoModelForImageTextToText.register(config_class, model_class, exist_ok=True)


def __getattr__(name: str):
    for model_type in STOCK_MODEL_TYPES:
        if name == CLASS_PREFIX + MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES[model_type]:
            return aligned_model_class(model_type)
    for cls in _BASE_CLASSES.values():
        if name == cls.__name__:
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["aligned_model_class", "new_aligned_norm", "register_model_classes"]
