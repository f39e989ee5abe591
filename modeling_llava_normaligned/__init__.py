"""The norm-aligned LLaVA model as a transformers model.

Importing this package registers the model with ``AutoConfig``, ``AutoModel`` and ``AutoModelForImageTextToText``
(in this process) and marks the classes so that ``save_pretrained`` copies the configuration and modeling files
next to the weights, which is what lets a saved folder load with ``trust_remote_code=True`` where this package is
not installed. Only the sibling files travel to the Hub (``REMOTE_CODE_FILES``: configuration, modeling and the two
transformers hooks they use); this ``__init__`` is the installed package's glue.
"""

from transformers import AutoConfig, AutoModel, AutoModelForImageTextToText

from . import modeling_llava_normaligned as _modeling
from .configuration_llava_normaligned import AUTO_MAP, LlavaNormAlignedConfig
from .modeling_llava_normaligned import *  # the model classes and the paper's quantities (its __all__)
from .modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration, LlavaNormAlignedModel

# The files that make up the remote code of a checkpoint.
REMOTE_CODE_FILES = ("configuration_llava_normaligned.py", "modeling_llava_normaligned.py", "transformers_hooks.py")
# ... and of a stock VLM with the aligned norm (``llava-normaligned align``): these two plus the ones above.
ALIGNED_REMOTE_CODE_FILES = ("configuration_normaligned_vlm.py", "modeling_normaligned_vlm.py", *REMOTE_CODE_FILES)


def register_auto_classes() -> None:
    """Register the config and models with the Auto classes (idempotent)."""
    AutoConfig.register(LlavaNormAlignedConfig.model_type, LlavaNormAlignedConfig, exist_ok=True)
    AutoModel.register(LlavaNormAlignedConfig, LlavaNormAlignedModel, exist_ok=True)
    AutoModelForImageTextToText.register(
        LlavaNormAlignedConfig, LlavaNormAlignedForConditionalGeneration, exist_ok=True
    )
    LlavaNormAlignedConfig.register_for_auto_class()
    LlavaNormAlignedModel.register_for_auto_class("AutoModel")
    LlavaNormAlignedForConditionalGeneration.register_for_auto_class("AutoModelForImageTextToText")


register_auto_classes()


def register_aligned_auto_classes() -> None:
    """Register the aligned stock models (``normaligned_<model_type>``, written by ``llava-normaligned align``) with
    ``AutoConfig`` and ``AutoModelForImageTextToText`` in this process (idempotent): such a folder then loads here
    with the installed classes, as this package's own model does. Called by the package's loader, not at import
    (it imports every supported family's modeling module)."""
    from .modeling_normaligned_vlm import register_model_classes

    register_model_classes()


__all__ = [
    "ALIGNED_REMOTE_CODE_FILES",
    "AUTO_MAP",
    "REMOTE_CODE_FILES",
    "LlavaNormAlignedConfig",
    "register_aligned_auto_classes",
    "register_auto_classes",
]
__all__ += _modeling.__all__
