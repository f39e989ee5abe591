"""The model's two uses of transformers' internals, in one file. It is pushed to the Hub with the model files, which
run where this package is not installed and so cannot call ``llava_normaligned.compat`` (the package's one home for
such hooks); checked with transformers >=5.18,<5.26 (``tests/test_compat.py``, ``test_model_hub_hooks``).

- ``loaded_by_from_pretrained(param)``: whether ``from_pretrained`` filled ``param`` from the checkpoint: transformers
  marks such a tensor ``_is_hf_initialized`` (its init functions then leave it alone), and has no public getter.
- ``give_class(module, cls)``: make a live module an instance of ``cls``, a subclass of its own class that adds
  methods only (an aligned LLaVA-NeXT / OneVision base model, whose ``get_image_features`` returns aligned features);
  the stock ``__init__`` builds the base model itself, so there is no constructor argument for its class.
"""


def loaded_by_from_pretrained(param) -> bool:
    """Whether ``from_pretrained`` loaded ``param`` from the checkpoint (False for a model built from a config)."""
    return bool(getattr(param, "_is_hf_initialized", False))


def give_class(module, cls) -> None:
    """``module`` becomes an instance of ``cls``, which must subclass its class without adding state."""
    if not issubclass(cls, type(module)):
        raise TypeError(f"{cls.__name__} is not a subclass of {type(module).__name__}")
    module.__class__ = cls


__all__ = ["give_class", "loaded_by_from_pretrained"]
