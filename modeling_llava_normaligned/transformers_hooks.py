"""The model's two uses of transformers' internals, kept in one file.

The file is pushed to the Hub with the model files, which run where this package is not installed and so cannot use
`llava_normaligned.compat` (the package's home for such hooks). Checked with transformers >=5.18,<5.26
(`tests/test_compat.py`, `test_model_hub_hooks`).
"""


def loaded_by_from_pretrained(param) -> bool:
    """
    Returns whether `from_pretrained` filled `param` from the checkpoint.

    transformers marks such a tensor `_is_hf_initialized` (its init functions then leave it alone) and has no public
    getter for the mark.

    Args:
        param (`torch.Tensor`):
            A parameter or buffer of a model.

    Returns:
        `bool`: `True` if `param` carries the mark; `False` otherwise, e.g. for a model built from a config.
    """
    return bool(getattr(param, "_is_hf_initialized", False))


def give_class(module, cls) -> None:
    """
    Makes a live module an instance of `cls`, a subclass of its own class that adds methods only.

    Used for an aligned LLaVA-NeXT / OneVision base model, whose `get_image_features` returns aligned features: the
    stock `__init__` builds the base model itself, so there is no constructor argument for its class.

    Args:
        module (`torch.nn.Module`):
            The module to change, in place.
        cls (`type`):
            A subclass of `type(module)` that adds no state.

    Raises:
        `TypeError`: If `cls` is not a subclass of `type(module)`.
    """
    if not issubclass(cls, type(module)):
        raise TypeError(f"{cls.__name__} is not a subclass of {type(module).__name__}")
    module.__class__ = cls


__all__ = ["give_class", "loaded_by_from_pretrained"]
