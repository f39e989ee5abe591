"""The norm-aligned LLaVA model (Li et al., "The Unseen Bias", arXiv 2512.08374, §5.1).

Stock transformers LLaVA with one change: a LayerNorm after the visual projector whose gain starts at T / sqrt(D)
(T: mean L2 norm of the LLM's text-embedding rows, D: LLM width), so that vision tokens enter the LLM with the norm
of text tokens, and a backward rule, Global Weight Compensation (GWC), that keeps the small gain from starving the
projector and vision encoder of gradient.

The norm lives in `model.multi_modal_projector.norm`, inside the base model, because trainers (TRL's SFT trainer)
call the base model directly. This file is pushed to the Hub with every checkpoint: it imports torch, transformers
and its sibling configuration file only.
"""

import inspect
import math
import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoModel, GenerationMixin
from transformers import initialization as init
from transformers.models.llava.modeling_llava import (
    LlavaCausalLMOutputWithPast,
    LlavaForConditionalGeneration,
    LlavaModel,
    LlavaMultiModalProjector,
    LlavaPreTrainedModel,
)
from transformers.utils import logging

from .configuration_llava_normaligned import LlavaNormAlignedConfig
from .transformers_hooks import loaded_by_from_pretrained

logger = logging.get_logger(__name__)

# paper §5.1: T is the mean norm over rows with ||w|| > eps (padding and never-trained rows are often exactly zero)
TEXT_NORM_EPS = 1e-6


# ------------------------------------------------------------------------------ the paper's quantities (one home)
# Every command of the package (compose, convert, train's norm tracking, the model card, diagnose) computes T, the
# gain init, the GWC factor and the Table 5 statistics with these functions, and so does the Hub copy of this file.


@torch.no_grad()
def embedding_row_norms(embedding_weight: torch.Tensor) -> torch.Tensor:
    """
    Computes the L2 norm of every row of an embedding table, in float32, 16384 rows at a time.

    Working in chunks avoids a float32 copy of the whole table (2 GB for a 150k x 3584 table).

    Args:
        embedding_weight (`torch.Tensor` of shape `(vocab_size, hidden_size)`):
            The embedding table, in any floating dtype.

    Returns:
        `torch.FloatTensor` of shape `(vocab_size,)`: The L2 norm of each row.
    """
    return torch.cat([rows.float().norm(dim=-1) for rows in embedding_weight.detach().split(16384)])


@torch.no_grad()
def text_embedding_norm_target(
    embedding_weight: torch.Tensor, eps: float = TEXT_NORM_EPS, exclude_token_ids=()
) -> float:
    """
    Computes T, the mean L2 norm of the text-embedding rows whose norm exceeds `eps` (paper §5.1).

    Rows of norm <= `eps` (padding, never-trained rows) are dropped. Every other row counts, added special tokens
    included (a pad or chat-template token is a text input), except the rows in `exclude_token_ids`. That argument is
    meant for the image placeholder token: `get_image_features` replaces every placeholder position with a visual token
    before the first decoder layer, so its row is never an input of the LLM. Leaving it out gives the same T whether it
    is measured before the token is added (`compose`), on a stock LLaVA that has it (`convert`), or on any checkpoint
    later (training logs, the model card, `diagnose`).

    Args:
        embedding_weight (`torch.Tensor` of shape `(vocab_size, hidden_size)`):
            The LLM's input-embedding table.
        eps (`float`, *optional*, defaults to `TEXT_NORM_EPS` (1e-6)):
            Rows whose L2 norm is <= `eps` are left out.
        exclude_token_ids (`Iterable[int]`, *optional*, defaults to `()`):
            Token ids whose rows are left out. `None` entries and ids outside the table are ignored.

    Returns:
        `float`: T, the mean L2 norm of the rows that are kept.

    Raises:
        `ValueError`: If `embedding_weight` is `None`, not 2-D or empty, if it is on the meta device, or if no row is
        left once the small rows and `exclude_token_ids` are dropped.
    """
    if embedding_weight is None or embedding_weight.ndim != 2 or embedding_weight.numel() == 0:
        raise ValueError("text embeddings: expected a non-empty (vocab_size, hidden_size) matrix to compute T from")
    if embedding_weight.device.type == "meta":
        raise ValueError("text embeddings are on the meta device (not loaded): cannot compute T from them")
    norms = embedding_row_norms(embedding_weight)  # (V,)
    kept = norms > eps
    excluded = 0
    for token_id in exclude_token_ids or ():
        if token_id is not None and 0 <= int(token_id) < norms.numel():
            excluded += int(kept[int(token_id)])
            kept[int(token_id)] = False
    if not kept.any():
        why = f"every row has L2 norm <= {eps}" if not excluded else \
            f"no row is left: {norms.numel() - excluded} row(s) have L2 norm <= {eps} and {excluded} are excluded " \
            "(exclude_token_ids)"
        raise ValueError(f"text embeddings: {why}; T (paper §5.1) is undefined")
    return float(norms[kept].mean())


def image_token_id_of(config) -> int | None:
    """
    Reads the image placeholder token id of a LLaVA config.

    Args:
        config (`PretrainedConfig` or `dict`):
            A config object or its `config.json` as a dict.

    Returns:
        `int` or `None`: `image_token_id` (`image_token_index` in older configs), the first of the two that holds an
        integer (not a bool); `None` when neither does.
    """
    for key in ("image_token_id", "image_token_index"):
        value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def model_norm_target(model) -> float:
    """
    Computes T of a LLaVA-style model (this one or stock) from its input embeddings, without the image token's row.

    Args:
        model (`PreTrainedModel`):
            A model with `get_input_embeddings()` and a config with the image token id (see `image_token_id_of`).

    Returns:
        `float`: T, as `text_embedding_norm_target` computes it.

    Raises:
        `ValueError`: As `text_embedding_norm_target` raises it (e.g. embeddings on the meta device).
    """
    return text_embedding_norm_target(
        model.get_input_embeddings().weight, exclude_token_ids=(image_token_id_of(model.config),)
    )


def gain_init(norm_init: str, norm_target: float | None, hidden_size: int) -> float:
    """
    Computes the initial gain of the projector norm.

    Args:
        norm_init (`str`):
            `"default"` for gain 1 (paper Table 5, "Default Init"); any other value (`"target"`) gives T / sqrt(D)
            (paper §5.1).
        norm_target (`float` or `None`):
            T. Required unless `norm_init` is `"default"`.
        hidden_size (`int`):
            D, the LLM's width.

    Returns:
        `float`: `norm_target / sqrt(hidden_size)`, or 1.0 for `norm_init="default"`.

    Raises:
        `ValueError`: If `norm_target` is `None` and `norm_init` is not `"default"`.
    """
    if norm_init == "default":
        return 1.0
    if norm_target is None:
        raise ValueError("norm_target (T) is not set: compose the model with `compose` or pass norm_target=")
    return norm_target / math.sqrt(hidden_size)  # paper §5.1: g_init = T / sqrt(D)


def norm_gain_init(config: LlavaNormAlignedConfig) -> float:
    """
    Computes `gain_init` from a config's `norm_init`, `norm_target` and `text_config.hidden_size`.

    Args:
        config ([`LlavaNormAlignedConfig`]):
            The model's config.

    Returns:
        `float`: The initial gain of the projector norm.

    Raises:
        `ValueError`: If `config.norm_init` is `"target"` and `config.norm_target` is not set.
    """
    return gain_init(config.norm_init, config.norm_target, config.text_config.hidden_size)


def compensation_factor(gain: torch.Tensor, clamp_min: float) -> torch.Tensor:
    """
    Computes the GWC factor 1 / clamp(mean |g|, clamp_min) (paper §5.1).

    The gain is detached and reduced in at least float32 precision (a bf16 or fp16 gain is promoted first).

    Args:
        gain (`torch.Tensor` of shape `(hidden_size,)`):
            The norm's gain g.
        clamp_min (`float`):
            The clamp δ (`gradient_compensation_min`).

    Returns:
        `torch.Tensor` of shape `()`: The factor, in float32 or the gain's dtype if that is wider, on the gain's device.
    """
    gain = gain.detach()
    gain = gain.to(torch.promote_types(gain.dtype, torch.float32))  # bf16/fp16 gains: reduce in fp32
    return gain.abs().mean().clamp_min(clamp_min).reciprocal()


@torch.no_grad()
def gain_statistics(gain: torch.Tensor, bias: torch.Tensor | None, compensation_min: float | None = None) -> dict:
    """
    Computes paper Table 5's statistics of the projector norm, under the key names that the training summary, the norm
    tracking and the model card share.

    Args:
        gain (`torch.Tensor` of shape `(hidden_size,)`):
            The norm's gain g.
        bias (`torch.Tensor` of shape `(hidden_size,)` or `None`):
            The norm's bias b; `None` is read as zeros.
        compensation_min (`float`, *optional*):
            The GWC clamp δ. When given (GWC on), the result also holds `gwc_factor`.

    Returns:
        `dict[str, float]`: `gain_l2` (||g||_2), `gain_abs_mean` and `gain_abs_std` (mean and std of |g|), `bias_l2`,
        `bias_abs_mean` and `bias_abs_std` (of |b|; each std is 0.0 for a single element), and with `compensation_min`
        `gwc_factor` = 1 / clamp(mean |g|, compensation_min) (paper §5.1).
    """
    gain = gain.detach().float()
    bias = torch.zeros_like(gain) if bias is None else bias.detach().float()
    stats = {
        "gain_l2": float(gain.norm()),
        "gain_abs_mean": float(gain.abs().mean()),
        "gain_abs_std": float(gain.abs().std()) if gain.numel() > 1 else 0.0,
        "bias_l2": float(bias.norm()),
        "bias_abs_mean": float(bias.abs().mean()),
        "bias_abs_std": float(bias.abs().std()) if bias.numel() > 1 else 0.0,
    }
    if compensation_min is not None:
        stats["gwc_factor"] = float(compensation_factor(gain, compensation_min))
    return stats


class _CompensateGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming gradient by 1 / clamp(mean|g|, min).

    The factor is computed in backward, from the gain the forward pass used (the optimizer has not stepped yet),
    so the forward pass costs one view and nothing else.
    """

    @staticmethod
    def forward(ctx, x, gain, clamp_min: float):
        ctx.save_for_backward(gain)
        ctx.clamp_min = clamp_min
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_output):
        (gain,) = ctx.saved_tensors
        return grad_output * compensation_factor(gain, ctx.clamp_min).to(grad_output.dtype), None, None


class NormAlignedLayerNorm(nn.LayerNorm):
    """
    LayerNorm with Global Weight Compensation (paper §5.1 and Appendix D).

    y = (x - mean) / sqrt(var + eps) * g + b. With compensation on, the gradient w.r.t. the normalized tensor x_hat,
    (dL/dy * g), is multiplied by 1 / clamp(mean|g|, min). The map x -> x_hat is linear in that gradient, so scaling
    the gradient at the input x is the same thing and lets the fused layer_norm kernel do the work; the gain's and
    bias's own gradients (dL/dy * x_hat, dL/dy) are untouched.

    Args:
        hidden_size (`int`):
            The size of the last dimension, normalized over.
        eps (`float`, *optional*, defaults to 1e-5):
            Added to the variance.
        compensation (`bool`, *optional*, defaults to `True`):
            Whether GWC scales the gradient.
        compensation_min (`float`, *optional*, defaults to 1e-3):
            The clamp δ of GWC.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, compensation: bool = True, compensation_min: float = 1e-3):
        super().__init__(hidden_size, eps=eps)
        self.compensation = compensation
        self.compensation_min = compensation_min

    def compensation_factor(self) -> torch.Tensor:
        """
        Computes the GWC factor 1 / clamp(mean |g|, `compensation_min`) for the current gain (`compensation_factor`).

        Returns:
            `torch.Tensor` of shape `()`: The factor.
        """
        return compensation_factor(self.weight, self.compensation_min)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, N, D)
        """
        Applies the LayerNorm; the gradient to `hidden_states` is scaled by the GWC factor when `compensation` is on,
        gradients are enabled and `hidden_states` requires grad.

        Args:
            hidden_states (`torch.Tensor` of shape `(..., hidden_size)`):
                The tensor to normalize over its last dimension, e.g. `(batch_size, num_image_tokens, hidden_size)`.

        Returns:
            `torch.Tensor` of the same shape as `hidden_states`: The normalized tensor, times the gain, plus the bias.
        """
        if self.compensation and torch.is_grad_enabled() and hidden_states.requires_grad:
            hidden_states = _CompensateGradient.apply(hidden_states, self.weight, self.compensation_min)
        return F.layer_norm(hidden_states, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        """
        Returns:
            `str`: `nn.LayerNorm`'s description followed by `compensation` and `compensation_min`.
        """
        return f"{super().extra_repr()}, compensation={self.compensation}, compensation_min={self.compensation_min}"


class LlavaNormAlignedProjector(LlavaMultiModalProjector):
    """LLaVA-1.5's 2-layer MLP projector (same parameter names), then the aligned LayerNorm when configured."""

    def __init__(self, config: LlavaNormAlignedConfig):
        super().__init__(config)
        # Kept for ``reset_norm``; not named ``config``, which transformers reads on submodules as their own config.
        self._norm_config = config
        self.norm = new_norm(config)  # its values: the model's ``_init_weights``, or the checkpoint's

    @torch.no_grad()
    def reset_norm(self, config: LlavaNormAlignedConfig | None = None) -> NormAlignedLayerNorm | None:
        """
        Rebuilds and initialises the projector norm: the one way to change the norm after the model is built.

        With `config.projector_norm=None` the projector gets no norm (the paper's "w/o Norm", exactly the stock
        projector). With `"layernorm"` it gets a new [`NormAlignedLayerNorm`] with GWC per `gradient_compensation` /
        `gradient_compensation_min`, bias 0 and gain T / sqrt(D) (`norm_init="target"`, paper §5.1) or 1 (`"default"`,
        paper Table 5), on the device and in the dtype of the projector's `linear_1.weight`.

        Args:
            config ([`LlavaNormAlignedConfig`], *optional*):
                The config to read. Defaults to the config this projector was built with, as it reads now.

        Returns:
            [`NormAlignedLayerNorm`] or `None`: The new norm, also set as `self.norm`.

        Raises:
            `ValueError`: If the config asks for a norm with `norm_init="target"` and has no `norm_target`.
        """
        config = self._norm_config if config is None else config
        norm = new_norm(config)
        if norm is not None:
            reference = self.linear_1.weight
            norm = norm.to(device=reference.device, dtype=reference.dtype)
            fill_norm(norm, norm_gain_init(config))
        self.norm = norm
        return norm

    def forward(self, image_features: torch.Tensor) -> torch.Tensor:  # (B, N, D_vision) -> (B, N, D_text)
        """
        Applies LLaVA-1.5's 2-layer MLP, then the aligned LayerNorm when there is one.

        Args:
            image_features (`torch.Tensor` of shape `(num_images, num_image_tokens, vision_feature_size)`):
                The selected vision features; `vision_feature_size` is the vision width times the number of vision
                feature layers (one unless `config.vision_feature_layer` is a list).

        Returns:
            `torch.Tensor` of shape `(num_images, num_image_tokens, text_hidden_size)`: The image tokens as the LLM
            receives them.
        """
        hidden_states = super().forward(image_features)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        return hidden_states


def new_norm(config) -> NormAlignedLayerNorm | None:
    """
    Builds the aligned norm a config asks for, with `nn.LayerNorm`'s initial values (`fill_norm` sets the aligned ones).

    Args:
        config ([`LlavaNormAlignedConfig`] or `PretrainedConfig`):
            This model's config or an aligned stock VLM's, read for `projector_norm` (absent counts as `"layernorm"`),
            `gradient_compensation`, `gradient_compensation_min` and the LLM's width
            (`config.get_text_config().hidden_size`).

    Returns:
        [`NormAlignedLayerNorm`] or `None`: The norm, or `None` for `projector_norm=None` (the "w/o Norm" variant).
    """
    if getattr(config, "projector_norm", "layernorm") is None:  # paper "w/o Norm": exactly the stock projector
        return None
    return NormAlignedLayerNorm(
        config.get_text_config().hidden_size,
        compensation=config.gradient_compensation,
        compensation_min=config.gradient_compensation_min,
    )


@torch.no_grad()
def fill_norm(norm: NormAlignedLayerNorm, gain: float) -> None:
    """
    Sets a norm's gain to `gain` and its bias to 0 in place, whatever it held (paper §5.1).

    Args:
        norm ([`NormAlignedLayerNorm`]):
            The norm to fill.
        gain (`float`):
            The gain, T / sqrt(D) or 1 (see `norm_gain_init`).
    """
    norm.weight.fill_(gain)
    norm.bias.zero_()


# Where the norm sits, relative to the base model. This file cannot import the package's anatomy module
# (llava_normaligned/families/anatomy.py, which describes the same path for every command), so it keeps its own.
PROJECTOR_NORM_PATH = "multi_modal_projector.norm"


def _is_norm_key(key: str) -> bool:
    return PROJECTOR_NORM_PATH + "." in key


# A key of LLaVA's legacy layout, where the language model sat whole under ``language_model`` (its base under
# ``language_model.model``, its head under ``language_model.lm_head``); in this model's layout the base is
# ``language_model`` itself, with no ``model`` or ``lm_head`` inside. transformers maps that layout for stock LLaVA
# only; loaded here, such keys come back unexpected (whatever prefix the loader added).
_LEGACY_LLM_KEY = re.compile(r"(^|\.)language_model\.(model|lm_head)\.")


class LlavaNormAlignedPreTrainedModel(LlavaPreTrainedModel):
    config_class = LlavaNormAlignedConfig
    config: LlavaNormAlignedConfig

    @classmethod
    def is_custom_code(cls) -> bool:
        """
        Tells transformers to initialise the weights as for a model inside transformers (stock LLaVA).

        transformers treats every class defined outside its package as custom code and then marks a module initialised
        as soon as its own parameters are, before its `_init_weights` runs. The vision tower's attention and MLP modules
        hold no parameters of their own, so they were skipped and their `nn.Linear` weights kept the generic std 0.02
        init instead of the vision model's own. This model initialises only through `transformers.initialization`, which
        leaves loaded weights alone. `is_remote_code()` is unchanged, so `save_pretrained` still copies the code.

        Returns:
            `bool`: Always `False`.
        """
        return False

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """
        Loads the model with `PreTrainedModel.from_pretrained`, and refuses two kinds of checkpoint it cannot read.

        Missing weights are initialised as stock LLaVA initialises them and reported in transformers' load report
        (`output_loading_info=True`), with one warning that names the checkpoint and the way out. A missing projector
        norm (what a stock LLaVA lacks) is initialised to T / sqrt(D) and reported in its own warning. The package's
        loader (`llava_normaligned.loading.load_model`, behind every command) refuses any checkpoint that lacks a weight
        other than the projector norm's.

        Args:
            *args, **kwargs:
                The arguments of `PreTrainedModel.from_pretrained` (`pretrained_model_name_or_path` first).
            output_loading_info (`bool`, *optional*, defaults to `False`):
                Whether to also return transformers' loading info.

        Returns:
            [`LlavaNormAlignedPreTrainedModel`]: The model, an instance of `cls`; with `output_loading_info=True` the
            tuple `(model, loading_info)`, where `loading_info` is transformers' report (a `dict` with `missing_keys`,
            `unexpected_keys` and more).

        Raises:
            `ValueError`: With the `llava-normaligned convert --from-llava` hint, for a checkpoint whose config's
            `model_type` is not this model's (a stock LLaVA: transformers would load it through LLaVA's key mapping and
            save it back in a layout this model cannot read), or for one in LLaVA's legacy key layout
            (`language_model.model.*`, `language_model.lm_head.*`), whose language model would otherwise stay random.
        """
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(*args, output_loading_info=True, **kwargs)
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        source = source if source is None or isinstance(source, str) else str(source)
        named = "the given state_dict" if source is None else f"checkpoint {source!r}"
        convert = (f"convert it with `llava-normaligned convert --from-llava {source or 'CHECKPOINT'} --output-dir OUT`"
                   + ("" if source else " from its folder or Hub id"))
        if model.config.model_type != cls.config_class.model_type:
            raise ValueError(
                f"{named} is a {model.config.model_type!r} checkpoint, not a "
                f"{cls.config_class.model_type!r} one: {convert}"
            )
        legacy = sorted(k for k in info.get("unexpected_keys", ()) if _LEGACY_LLM_KEY.search(k))
        if legacy:
            raise ValueError(
                f"{named} holds its language model under LLaVA's legacy key names ({legacy[0]}, ... "
                f"{len(legacy)} keys), which this model does not read: {convert}"
            )
        missing = info.get("missing_keys", ())
        others = sorted(k for k in missing if not _is_norm_key(k))
        if others:
            shown = ", ".join(others[:5]) + (f" ... ({len(others)} in all)" if len(others) > 5 else "")
            logger.warning(
                "%s lacks %d weight(s), initialised at random: %s. A stock LLaVA checkpoint converts with "
                "`llava-normaligned convert --from-llava`; `llava_normaligned.loading.load_model` (every command) "
                "refuses it.",
                named, len(others), shown,
            )
        if any(_is_norm_key(k) for k in missing):
            logger.warning(
                "%s has no projector norm weights: the norm was initialised (norm_init=%r, gain %.4g)",
                named,
                model.config.norm_init,
                gain_statistics(model.get_projector_norm().weight, None)["gain_abs_mean"],
            )
        return (model, info) if want_info else model

    def _init_weights(self, module):
        if isinstance(module, NormAlignedLayerNorm):
            # The base init sets every *LayerNorm* gain to 1; the aligned gain is T / sqrt(D) (paper §5.1).
            gain = norm_gain_init(self.config) if self.config.norm_target is not None else 1.0
            init.constant_(module.weight, gain)
            init.zeros_(module.bias)
            return
        super()._init_weights(module)

    @torch.no_grad()
    def initialize_weights(self):
        """
        Initialises the weights as `PreTrainedModel.initialize_weights` does, then completes T when it is not known.

        When the model has a projector norm that was not loaded from a checkpoint and `config.norm_target` is `None`, T
        is computed from the model's own input embeddings (initialised or loaded by then; skipped while they are on the
        meta device), stored in `config.norm_target`, and the norm is filled with the gain it gives.
        """
        norm = self.get_projector_norm()
        norm_was_set = norm is not None and loaded_by_from_pretrained(norm.weight)
        super().initialize_weights()
        if norm is None or norm_was_set or self.config.norm_target is not None:
            return
        # T was not given: take it from the embeddings, which are initialised (or loaded) by now.
        if self.get_input_embeddings().weight.device.type == "meta":
            return
        self.config.norm_target = model_norm_target(self)
        fill_norm(norm, norm_gain_init(self.config))

    def get_projector_norm(self) -> NormAlignedLayerNorm | None:
        """
        Returns the projector's aligned LayerNorm.

        Returns:
            [`NormAlignedLayerNorm`] or `None`: The norm; `None` for the "w/o Norm" variant, or while the base model is
            not built yet.
        """
        base = self if isinstance(self, LlavaNormAlignedModel) else getattr(self, self.base_model_prefix, None)
        return None if base is None else base.get_submodule(PROJECTOR_NORM_PATH.rpartition(".")[0]).norm


class LlavaNormAlignedModel(LlavaNormAlignedPreTrainedModel, LlavaModel):
    """LLaVA's base model (vision tower, projector with the aligned norm, language model), no LM head."""

    def __init__(self, config: LlavaNormAlignedConfig):
        LlavaPreTrainedModel.__init__(self, config)
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = LlavaNormAlignedProjector(config)
        self.language_model = AutoModel.from_config(config.text_config)
        self.post_init()


# ------------------------------------------------------------------------------ the loss at labelled positions
# A LLaVA row's image tokens, system prompt and question carry no label, yet the full path turns each of them into a
# vocabulary-wide row of logits: at 2,048 tokens and a 152K vocabulary that is 1.2 GB of float32 a row.

_LLAVA_FORWARD = inspect.signature(LlavaForConditionalGeneration.forward)
LOSS_CHUNK_ROWS = 2048  # labelled positions through the LM head at a time (each chunk recomputed in backward)


def _chunk_nll(lm_head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of ``targets`` (n,) under ``lm_head(hidden)`` (n, D) -> (n, V), in float32 as
    transformers' causal-LM loss computes it (on the head's device, where a model split across devices has it)."""
    logits = lm_head(hidden).float()
    return F.cross_entropy(logits, targets.to(logits.device), reduction="sum")


def labelled_positions_loss(
    hidden_states: torch.Tensor,
    lm_head: nn.Module,
    labels: torch.Tensor | None = None,
    *,
    shift_labels: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    ignore_index: int = -100,
    chunk_rows: int = LOSS_CHUNK_ROWS,
) -> torch.Tensor:
    """
    Computes transformers' causal-LM loss (`ForCausalLMLoss`) with the LM head applied at the labelled positions only.

    The loss is the next-token cross-entropy in float32, summed and divided by `num_items_in_batch`, else averaged over
    the labelled positions. A LLaVA row's image tokens, system prompt and question carry no label, and the full path
    would turn each of them into a vocabulary-wide row of logits.

    Args:
        hidden_states (`torch.Tensor` of shape `(batch_size, sequence_length, hidden_size)`):
            The LLM's last hidden states.
        lm_head (`nn.Module`):
            Maps hidden states to logits over the vocabulary.
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The token ids to predict, unshifted, `ignore_index` where there is none. Required unless `shift_labels` is
            given.
        shift_labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Labels already shifted (position i holds the label of the token after i), as sequence-parallel trainers pass
            them. Used instead of `labels` when given.
        num_items_in_batch (`int` or `torch.Tensor`, *optional*):
            The number of labelled positions in the whole optimizer step (gradient accumulation), if known.
        ignore_index (`int`, *optional*, defaults to -100):
            The label value of positions that are not predicted.
        chunk_rows (`int`, *optional*, defaults to `LOSS_CHUNK_ROWS` (2048)):
            Positions passed through the LM head at a time. With gradients on and more positions than this, each chunk's
            logits are recomputed in backward instead of kept, so memory holds at most one chunk's
            `(chunk_rows, vocab_size)` logits.

    Returns:
        `torch.FloatTensor` of shape `()`: The loss; 0, still connected to the LM head in the graph, when no position is
        labelled.
    """
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.to(hidden_states.device)
    mask = shift_labels != ignore_index  # (B, L)
    rows, targets = hidden_states[mask], shift_labels[mask]  # (n, D), (n,)
    # an empty chunk: 0, with the head in the graph even for a batch without labels (DDP waits for every parameter)
    total = _chunk_nll(lm_head, rows[:0], targets[:0])
    recompute = torch.is_grad_enabled() and rows.requires_grad and len(rows) > chunk_rows
    for start in range(0, len(rows), chunk_rows):
        piece = (rows[start : start + chunk_rows], targets[start : start + chunk_rows])
        total = total + (checkpoint(_chunk_nll, lm_head, *piece, use_reentrant=False) if recompute
                         else _chunk_nll(lm_head, *piece))
    if num_items_in_batch is None:
        return total / mask.sum().clamp(min=1).to(total.device)
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


class LlavaNormAlignedForConditionalGeneration(
    LlavaNormAlignedPreTrainedModel, LlavaForConditionalGeneration, GenerationMixin
):
    """The norm-aligned LLaVA with its LM head: generation, pipelines and training work as with stock LLaVA.

    ``GenerationMixin`` is named among the direct bases, as transformers requires of a model that generates (it is
    also inherited through ``LlavaForConditionalGeneration``)."""

    def __init__(self, config: LlavaNormAlignedConfig):
        LlavaPreTrainedModel.__init__(self, config)
        self.model = LlavaNormAlignedModel(config)
        self.lm_head = nn.Linear(config.text_config.hidden_size, config.text_config.vocab_size, bias=False)
        self.post_init()

    def loss_at_labels_only(self, labels) -> bool:
        """
        Tells whether a forward call computes the loss at the labelled positions only.

        Args:
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)` or `None`):
                The `labels` passed to `forward`.

        Returns:
            `bool`: `True` in training mode with `labels` given and `config.loss_at_labels_only` on (the default when
            the config lacks the field); evaluation and generation get the full logits.
        """
        return labels is not None and self.training and getattr(self.config, "loss_at_labels_only", True)

    def forward(self, *args, **kwargs) -> LlavaCausalLMOutputWithPast:
        """
        Runs stock LLaVA's forward, except in training mode with `labels` (see `loss_at_labels_only`): there the LM head
        and the cross-entropy run at the labelled positions only (`labelled_positions_loss`), and `logits` is `None`.

        Args:
            *args, **kwargs:
                The arguments of [`LlavaForConditionalGeneration.forward`], bound by name to its signature, e.g.
                `input_ids` `(batch_size, sequence_length)`, `pixel_values` `(batch_size, num_channels, height, width)`,
                `attention_mask` `(batch_size, sequence_length)` and `labels` `(batch_size, sequence_length)`. On the
                labelled-positions path `shift_labels` and `num_items_in_batch` go to `labelled_positions_loss`, and
                `logits_to_keep` is ignored (the labels decide which positions reach the LM head).

        Returns:
            [`LlavaCausalLMOutputWithPast`] or `tuple`: As stock LLaVA returns it; on the labelled-positions path a
            `LlavaCausalLMOutputWithPast` with the scalar `loss`, `logits=None` and the base model's other outputs, or
            its tuple when `return_dict` (else `config.return_dict`) is `False`.
        """
        arguments = _LLAVA_FORWARD.bind(self, *args, **kwargs).arguments  # by name, as stock LLaVA reads them
        arguments.pop("self")
        arguments.update(arguments.pop("kwargs", {}))
        labels = arguments.pop("labels", None)
        if not self.loss_at_labels_only(labels):
            return super().forward(labels=labels, **arguments)
        return_dict = arguments.pop("return_dict", None)
        shift_labels = arguments.pop("shift_labels", None)
        num_items_in_batch = arguments.pop("num_items_in_batch", None)
        arguments.pop("logits_to_keep", None)  # the labels decide which positions reach the head
        outputs = self.model(**arguments, return_dict=True)
        loss = labelled_positions_loss(outputs.last_hidden_state, self.lm_head, labels, shift_labels=shift_labels,
                                       num_items_in_batch=num_items_in_batch)
        # the base model's fields by their names (the cache and image fields were renamed between releases)
        output = LlavaCausalLMOutputWithPast(
            loss=loss, logits=None, **{key: value for key, value in outputs.items() if key != "last_hidden_state"})
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return output if return_dict else output.to_tuple()

    # stock LLaVA's signature, which generate() checks its keyword arguments against
    forward.__signature__ = _LLAVA_FORWARD


__all__ = [
    "TEXT_NORM_EPS",
    "LlavaNormAlignedForConditionalGeneration",
    "LlavaNormAlignedModel",
    "LlavaNormAlignedPreTrainedModel",
    "NormAlignedLayerNorm",
    "compensation_factor",
    "embedding_row_norms",
    "gain_init",
    "gain_statistics",
    "image_token_id_of",
    "labelled_positions_loss",
    "model_norm_target",
    "norm_gain_init",
    "text_embedding_norm_target",
]
