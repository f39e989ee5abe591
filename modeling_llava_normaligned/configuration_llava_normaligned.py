"""Configuration of the norm-aligned LLaVA model (Li et al., arXiv 2512.08374, §5.1).

A ``LlavaConfig`` plus the fields of the paper's projector norm. This file is pushed to the Hub with every
checkpoint: it imports nothing but transformers.
"""

from transformers import LlavaConfig

PROJECTOR_NORMS = ("layernorm", None)
NORM_INITS = ("target", "default")

# Written into every saved config.json so that a folder or Hub repo loads with trust_remote_code=True.
AUTO_MAP = {
    "AutoConfig": "configuration_llava_normaligned.LlavaNormAlignedConfig",
    "AutoModel": "modeling_llava_normaligned.LlavaNormAlignedModel",
    "AutoModelForImageTextToText": "modeling_llava_normaligned.LlavaNormAlignedForConditionalGeneration",
}


class LlavaNormAlignedConfig(LlavaConfig):
    r"""
    Everything of [`LlavaConfig`], plus:

    projector_norm (`str` or `None`, defaults to `"layernorm"`):
        `"layernorm"` puts a LayerNorm after the visual projector (paper §5.1). `None` is exactly stock LLaVA
        (the paper's "w/o Norm" row).
    norm_target (`float`, *optional*):
        T, the mean L2 norm of the LLM's text-embedding rows whose norm exceeds a small eps (paper §5.1). Set by
        `compose`/`convert`; when it is missing, it is computed from the model's own embeddings at init.
    norm_init (`str`, defaults to `"target"`):
        `"target"`: gain = T / sqrt(D), bias 0 (paper §5.1). `"default"`: gain 1, bias 0 (paper Table 5 ablation).
    gradient_compensation (`bool`, defaults to `True`):
        Global Weight Compensation (GWC): the gradient through the normalized tensor is multiplied by
        1 / clamp(mean |g|, gradient_compensation_min) (paper §5.1, Appendix D).
    gradient_compensation_min (`float`, defaults to 1e-3):
        The clamp δ of GWC.
    loss_at_labels_only (`bool`, defaults to `True`):
        In training mode with `labels`, run the LM head and the cross-entropy on the positions whose next token has
        a label only (the image tokens, system prompt and question carry none), in chunks, and return no `logits`.
        The loss and every gradient are those of the full path within float32 round-off. `False`, or eval mode, or
        no `labels`: stock LLaVA's full logits.
    """

    model_type = "llava_normaligned"

    projector_norm: str | None = "layernorm"
    norm_target: float | None = None
    norm_init: str = "target"
    gradient_compensation: bool = True
    gradient_compensation_min: float = 1e-3
    loss_at_labels_only: bool = True

    def __post_init__(self, **kwargs):
        # Validated before the parent runs so that a bad value is a ValueError naming its field.
        if self.projector_norm not in PROJECTOR_NORMS:
            raise ValueError(f"projector_norm must be one of {PROJECTOR_NORMS}, got {self.projector_norm!r}")
        if self.norm_init not in NORM_INITS:
            raise ValueError(f"norm_init must be one of {NORM_INITS}, got {self.norm_init!r}")
        if not isinstance(self.gradient_compensation, bool):
            raise ValueError(f"gradient_compensation must be a bool, got {self.gradient_compensation!r}")
        if self.norm_target is not None:
            if isinstance(self.norm_target, bool) or not isinstance(self.norm_target, (int, float)):
                raise ValueError(f"norm_target must be a positive number or None, got {self.norm_target!r}")
            if not self.norm_target > 0 or self.norm_target == float("inf"):
                raise ValueError(f"norm_target must be a positive finite number, got {self.norm_target!r}")
            self.norm_target = float(self.norm_target)
        gmin = self.gradient_compensation_min
        if isinstance(gmin, bool) or not isinstance(gmin, (int, float)) or not 0 < gmin < float("inf"):
            raise ValueError(f"gradient_compensation_min must be a positive finite number, got {gmin!r}")
        self.gradient_compensation_min = float(gmin)
        super().__post_init__(**kwargs)
        if getattr(self, "auto_map", None) is None:
            self.auto_map = dict(AUTO_MAP)


__all__ = ["LlavaNormAlignedConfig"]


def _register_model_type() -> None:
    """Make ``model_type = "llava_normaligned"`` known to ``AutoConfig`` in this process once this file is imported,
    as this package's ``__init__`` does, and as remote code too (``from_pretrained(..., trust_remote_code=True)``
    imports it). ``AutoTokenizer`` reads the folder's ``config.json``, so without this the processor loaded after the
    model (``AutoProcessor.from_pretrained(folder)``, which needs no remote code) would ask again whether to run the
    folder's code for a model type it does not know."""
    from transformers import AutoConfig

    AutoConfig.register(LlavaNormAlignedConfig.model_type, LlavaNormAlignedConfig, exist_ok=True)


_register_model_type()
