"""Configurations of stock vision-language models with the norm-aligned LayerNorm (Li et al., arXiv 2512.08374, §5.1)
at the point where the connector's output becomes the LLM's input embeddings (`llava-normaligned align`).

`NormAligned<StockConfig>` subclasses the stock config (every field, sub-config and default is the stock one), adds the
norm's fields and has its own `model_type`, `normaligned_<stock model_type>`, so that a folder loaded without
`trust_remote_code` fails loudly instead of silently dropping the norm. The classes are built on first use: transformers
resolves `auto_map` names with `getattr` on this module (PEP 562 `__getattr__`). This file is pushed to the Hub with
every aligned checkpoint, so it imports only transformers.
"""

from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

MODEL_TYPE_PREFIX = "normaligned_"
CLASS_PREFIX = "NormAligned"
# The stock families this file knows (their transformers model_type).
STOCK_MODEL_TYPES = (
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
# Where the aligned norm is applied: "connector_output" (a forward hook on the connector module: its output is what
# the LLM receives at the image positions), or "image_features" (the output of the base model's
# get_image_features / get_video_features: LLaVA-NeXT and OneVision add their image_newline rows after the connector).
NORM_ENTRIES = ("connector_output", "image_features")
NORM_INITS = ("target", "default")
ALIGNED_NORM_NAME = "aligned_norm"  # the norm's attribute on the connector module (Qwen3-VL's merger has a `norm`)

_CONFIG_CLASSES: dict = {}


def _check(config) -> None:
    if config.norm_entry not in NORM_ENTRIES:
        raise ValueError(f"norm_entry must be one of {NORM_ENTRIES}, got {config.norm_entry!r}")
    if config.norm_init not in NORM_INITS:
        raise ValueError(f"norm_init must be one of {NORM_INITS}, got {config.norm_init!r}")
    if not isinstance(config.gradient_compensation, bool):
        raise ValueError(  # noqa: TRY004 (a bad config value: every loader reports a ValueError)
            f"gradient_compensation must be a bool, got {config.gradient_compensation!r}")
    target = config.norm_target
    if target is not None:
        if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < float("inf"):
            raise ValueError(f"norm_target must be a positive finite number or None, got {target!r}")
        config.norm_target = float(target)
    low = config.gradient_compensation_min
    if isinstance(low, bool) or not isinstance(low, (int, float)) or not 0 < low < float("inf"):
        raise ValueError(f"gradient_compensation_min must be a positive finite number, got {low!r}")
    config.gradient_compensation_min = float(low)


def aligned_config_class(stock_model_type: str):
    """
    Returns the aligned configuration class of a stock model type, built on first use and then reused.

    The class, `NormAligned<StockConfig>`, keeps every field and default of the stock config and adds the norm's:
    `norm_family` (the package's family name), `norm_connector` (the connector's module path), `norm_entry`,
    `norm_target` (T), `norm_init`, `gradient_compensation`, `gradient_compensation_min` and `norm_source` (the stock
    model's Hub id). Its `model_type` is `normaligned_<stock_model_type>`, and it is marked for `AutoConfig`
    (`register_for_auto_class`), so that `save_pretrained` copies this file and writes the `auto_map`. An instance
    checks the norm's fields before the stock `__post_init__` runs and raises a `ValueError` naming the field that is
    wrong.

    Args:
        stock_model_type (`str`):
            The stock `model_type`, one of `STOCK_MODEL_TYPES` (e.g. `"qwen2_vl"`).

    Returns:
        `type`: The `NormAligned<StockConfig>` class; the same object on every call with the same `stock_model_type`.

    Raises:
        `ValueError`: If `stock_model_type` is not one of `STOCK_MODEL_TYPES`.
    """
    if stock_model_type not in STOCK_MODEL_TYPES:
        raise ValueError(f"no aligned config for model_type {stock_model_type!r} (known: {', '.join(STOCK_MODEL_TYPES)})")
    if stock_model_type in _CONFIG_CLASSES:
        return _CONFIG_CLASSES[stock_model_type]
    stock = CONFIG_MAPPING[stock_model_type]

    def __post_init__(self, **kwargs):
        _check(self)
        stock.__post_init__(self, **kwargs)

    namespace = {
        "__module__": __name__,
        "__qualname__": CLASS_PREFIX + stock.__name__,
        "__doc__": f"{stock.__name__} with the norm-aligned LayerNorm at the connector's output (paper §5.1): "
        "`norm_family` (the package's family name), `norm_connector` (the connector's module path), `norm_entry`, "
        "`norm_target` (T, the text-embedding norm the vision tokens are aligned to), `norm_init`, "
        "`gradient_compensation` and `gradient_compensation_min` (GWC), `norm_source` (the stock model's Hub id).",
        "model_type": MODEL_TYPE_PREFIX + stock_model_type,
        "__annotations__": {
            "norm_family": "str | None",
            "norm_connector": "str | None",
            "norm_entry": "str",
            "norm_target": "float | None",
            "norm_init": "str",
            "gradient_compensation": "bool",
            "gradient_compensation_min": "float",
            "norm_source": "str | None",
        },
        "norm_family": None,
        "norm_connector": None,
        "norm_entry": "connector_output",
        "norm_target": None,
        "norm_init": "target",
        "gradient_compensation": True,
        "gradient_compensation_min": 1e-3,
        "norm_source": None,
        "__post_init__": __post_init__,
    }
    cls = type(CLASS_PREFIX + stock.__name__, (stock,), namespace)
    cls.register_for_auto_class()
    _CONFIG_CLASSES[stock_model_type] = cls
    return cls


def stock_model_type(aligned_model_type: str) -> str | None:
    """
    Returns the stock model type an aligned model type was made from.

    Args:
        aligned_model_type (`str`):
            A `model_type`, e.g. `"normaligned_qwen2_vl"`.

    Returns:
        `str` or `None`: The stock model type (`"qwen2_vl"` for `"normaligned_qwen2_vl"`), or `None` when
        `aligned_model_type` is empty, lacks the `normaligned_` prefix, or names a stock type not in
        `STOCK_MODEL_TYPES`.
    """
    if aligned_model_type and aligned_model_type.startswith(MODEL_TYPE_PREFIX):
        stock = aligned_model_type[len(MODEL_TYPE_PREFIX) :]
        return stock if stock in STOCK_MODEL_TYPES else None
    return None


def register_config_classes() -> None:
    """
    Registers every `normaligned_*` configuration class with `AutoConfig` in this process (idempotent).

    The processor and tokenizer loaders read a folder's `config.json`; without this registration they would ask again
    whether to run the folder's remote code. Called when this module is imported.
    """
    for model_type in STOCK_MODEL_TYPES:
        cls = aligned_config_class(model_type)
        AutoConfig.register(cls.model_type, cls, exist_ok=True)


def __getattr__(name: str):
    for model_type in STOCK_MODEL_TYPES:
        if name == CLASS_PREFIX + CONFIG_MAPPING_NAMES[model_type]:
            return aligned_config_class(model_type)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_config_classes()

__all__ = [
    "ALIGNED_NORM_NAME",
    "MODEL_TYPE_PREFIX",
    "NORM_ENTRIES",
    "STOCK_MODEL_TYPES",
    "aligned_config_class",
    "register_config_classes",
    "stock_model_type",
]
