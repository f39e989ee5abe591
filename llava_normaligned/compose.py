"""Build norm-aligned LLaVA models: compose one from a vision encoder and a causal LM, or convert a stock LLaVA.

    llava-normaligned compose --vision-model google/siglip-so400m-patch14-384 \
        --text-model meta-llama/Llama-3.2-3B-Instruct --output-dir ./llava-na-3b
    llava-normaligned convert --from-llava llava-hf/llava-1.5-7b-hf --output-dir ./llava-1.5-7b-na

Both write a folder that loads with `AutoModelForImageTextToText` + `AutoProcessor` (and with
`trust_remote_code=True` where this package is not installed). The two commands are
`llava_normaligned.commands.compose` and `llava_normaligned.commands.convert`.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .compat import init_module_weights
from .families.anatomy import anatomy_of
from .families.tokens import IMAGE_TOKEN
from .loading import TRUST_REMOTE_CODE_DEFAULT, check_source, parse_dtype
from .local_paths import public_name
from .norm_variant import NORM_FIELDS, NormVariant

if TYPE_CHECKING:  # torch and transformers are imported where a model is built: `--help` does not wait for them
    import torch
    from transformers import LlavaForConditionalGeneration

logger = logging.getLogger(__name__)

# Vision encoders whose last hidden state has no CLS token (LLaVA's "full" strategy).
NO_CLS_VISION_TYPES = {"siglip_vision_model"}
CLS_VISION_TYPES = {"clip_vision_model"}

# Wraps a text-only chat template so that list content ({"type": "image"} / {"type": "text"} parts, as processors
# and TRL pass it) is rendered as plain text with the image token where each image goes.
MULTIMODAL_CONTENT_PREAMBLE = (
    "{%- set _mm = namespace(messages=[]) -%}"
    "{%- for _m in messages -%}"
    "{%- if _m['content'] is string or _m['content'] is none -%}{%- set _mm.messages = _mm.messages + [_m] -%}"
    "{%- else -%}{%- set _t = namespace(text='') -%}"
    "{%- for _p in _m['content'] -%}"
    "{%- if _p['type'] == 'image' -%}{%- set _t.text = _t.text + '" + "@IMAGE_TOKEN@" + "\\n' -%}"
    "{%- elif _p['type'] == 'text' -%}{%- set _t.text = _t.text + _p['text'] -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- set _mm.messages = _mm.messages + [{'role': _m['role'], 'content': _t.text}] -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set messages = _mm.messages -%}"
)


@contextmanager
def _meta_device():
    import torch

    with torch.device("meta"):
        yield


def _share_weights(dst: torch.nn.Module, src: torch.nn.Module, what: str) -> None:
    """Make ``dst`` use ``src``'s parameters and buffers (same names, same shapes): no copy, no re-initialisation."""
    import torch

    src_state = dict(src.named_parameters())
    src_state.update(dict(src.named_buffers()))
    dst_names = {n for n, _ in dst.named_parameters()} | {n for n, _ in dst.named_buffers()}
    missing = sorted(dst_names - set(src_state))
    unexpected = sorted(set(src_state) - dst_names)
    if missing or unexpected:
        raise ValueError(
            f"{what}: its weights do not match the architecture built from its config "
            f"(missing: {missing[:8]}{'...' if len(missing) > 8 else ''}; "
            f"unexpected: {unexpected[:8]}{'...' if len(unexpected) > 8 else ''})"
        )
    for name, tensor in src_state.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = dst.get_submodule(owner_name) if owner_name else dst
        current = dict(owner.named_parameters(recurse=False)).get(leaf)
        if current is not None:
            if tensor.shape != current.shape:
                raise ValueError(f"{what}: weight {name} has shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(current.shape)}")
            # nn.Module.__setattr__ registers a Parameter in the parameter's place, and keeps a buffer a buffer
            setattr(owner, leaf, tensor if isinstance(tensor, torch.nn.Parameter) else torch.nn.Parameter(tensor))
        else:
            setattr(owner, leaf, tensor)


def _vision_parts(vision_model: str, revision: str | None, dtype, trust_remote_code: bool):
    """Load the vision encoder's config and weights; return (vision_config, vision module with those weights)."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(vision_model, revision=revision, trust_remote_code=trust_remote_code)
    if config.model_type == "siglip2" or config.model_type == "siglip2_vision_model":
        raise ValueError(
            f"vision model {vision_model!r} is a NaFlex SigLIP2 (variable resolution), which LLaVA's fixed patch grid "
            "cannot take; use a fixed-resolution SigLIP2 checkpoint (e.g. google/siglip2-so400m-patch14-384, whose "
            "model_type is 'siglip')"
        )
    source = AutoModel.from_pretrained(
        vision_model, revision=revision, dtype=dtype, trust_remote_code=trust_remote_code
    )
    vision_config = getattr(config, "vision_config", None) or config
    if hasattr(config, "vision_config"):
        # A dual encoder (CLIPModel, SiglipModel): its vision half is the *VisionModel LLaVA uses as its tower.
        tower = getattr(source, "vision_model", None)
        if tower is None:
            raise ValueError(f"vision model {vision_model!r}: a dual encoder without a `vision_model` submodule")
        return vision_config, tower
    return vision_config, source


def _is_vision_encoder(config) -> bool:
    vision = getattr(config, "vision_config", None) or config  # a dual encoder (CLIPModel, SiglipModel) or a tower
    return all(hasattr(vision, key) for key in ("image_size", "patch_size", "num_hidden_layers"))


def _is_causal_lm(config) -> bool:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    auto_map = getattr(config, "auto_map", None) or {}
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or "AutoModelForCausalLM" in auto_map


def check_parts(vision_model: str, text_model: str, *, revision: str | None = None, text_revision: str | None = None,
                trust_remote_code: bool | None = TRUST_REMOTE_CODE_DEFAULT, vision_feature_layer: int = -2) -> None:
    """Checks the two models of `compose` from their configs only, before any weight is read.

    Args:
        vision_model (`str`):
            A folder or Hub id that must be a vision encoder (a `*VisionModel`, or a dual encoder with a vision half).
        text_model (`str`):
            A folder or Hub id that must be a causal LM.
        revision (`str`, *optional*):
            The Hub revision of `vision_model`.
        text_revision (`str`, *optional*):
            The Hub revision of `text_model`.
        trust_remote_code (`bool`, *optional*, defaults to `TRUST_REMOTE_CODE_DEFAULT` (`None`)):
            Passed to the config loader.
        vision_feature_layer (`int`, *optional*, defaults to -2):
            Must index one of the encoder's `num_hidden_layers + 1` hidden states.

    Raises:
        `ValueError`: Naming the flag: when the two models are swapped, when `vision_model` is not a vision encoder,
        when `text_model` is not a causal LM, or when `vision_feature_layer` is out of range. The config loader's
        errors (`loading.load_config`) pass through.
    """
    from .loading import load_config

    vision_config = load_config(vision_model, revision=revision, trust_remote_code=trust_remote_code)
    text_config = load_config(text_model, revision=text_revision, trust_remote_code=trust_remote_code)
    if not _is_vision_encoder(vision_config) and _is_vision_encoder(text_config) and _is_causal_lm(vision_config):
        raise ValueError(f"--vision-model {vision_model} is a {vision_config.model_type} language model and "
                         f"--text-model {text_model} a {text_config.model_type} vision encoder: swap the two flags")
    if not _is_vision_encoder(vision_config):
        raise ValueError(f"--vision-model {vision_model}: a {vision_config.model_type} model, not a vision encoder "
                         "(SigLIP, SigLIP2, CLIP: a config with image_size and patch_size); give the vision encoder")
    if not _is_causal_lm(text_config):
        raise ValueError(f"--text-model {text_model}: a {text_config.model_type} model, not a causal language model "
                         "(Llama, Qwen2/2.5/3, SmolLM, ...); give the language model")
    layers = (getattr(vision_config, "vision_config", None) or vision_config).num_hidden_layers
    if not -(layers + 1) <= vision_feature_layer <= layers:  # hidden states: the embeddings, then each layer's
        raise ValueError(f"--vision-feature-layer {vision_feature_layer}: {vision_model} has {layers} layers, so "
                         f"{layers + 1} hidden states; give one in [-{layers + 1}, {layers}] (LLaVA-1.5: -2)")


def input_embedding_weight(llm, name: str) -> torch.Tensor:
    """Returns the input-embedding matrix of a causal LM.

    Args:
        llm (`PreTrainedModel`):
            The causal LM.
        name (`str`):
            The model's name, used in the error message.

    Returns:
        `torch.Tensor` of shape `(vocab_size, hidden_size)`: The weight of `llm.get_input_embeddings()`.

    Raises:
        `ValueError`: If the LM has no input embeddings or they have no weight.
    """
    embeddings = llm.get_input_embeddings()
    weight = getattr(embeddings, "weight", None) if embeddings is not None else None
    if weight is None:
        raise ValueError(f"text model {name!r} has no input embeddings (get_input_embeddings() gives no weight)")
    return weight


def _select_strategy(vision_config) -> tuple[str, int]:
    """LLaVA's feature select strategy and the number of extra (CLS) tokens of a vision encoder."""
    if vision_config.model_type in NO_CLS_VISION_TYPES:
        return "full", 0
    if vision_config.model_type in CLS_VISION_TYPES:
        return "default", 1
    logger.warning(
        "vision encoder type %r is not one this package knows; assuming a CLS token ('default' strategy)",
        vision_config.model_type,
    )
    return "default", 1


def multimodal_chat_template(template: str | None, tokenizer) -> str | None:
    """Makes an LM's chat template accept image parts.

    A message whose content is a list of `{"type": "image"}` / `{"type": "text"}` parts (as processors and TRL pass it)
    is then rendered as plain text, with the image token where each image goes.

    Args:
        template (`str` or `None`):
            The LM's chat template.
        tokenizer (`PreTrainedTokenizerBase`):
            The tokenizer used to try the template on a message with an image part.

    Returns:
        `str` or `None`: `None` when there is no template; `template` unchanged when it already renders image parts
        (the image token and the text both appear); otherwise `template` preceded by `MULTIMODAL_CONTENT_PREAMBLE`.
    """
    if not template:
        return None
    probe = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hello"}]}]
    try:
        rendered = tokenizer.apply_chat_template(probe, chat_template=template, tokenize=False)
    except Exception:  # a template that indexes content as a string fails on parts
        rendered = ""
    if IMAGE_TOKEN in rendered and "hello" in rendered:
        return template
    return MULTIMODAL_CONTENT_PREAMBLE.replace("@IMAGE_TOKEN@", IMAGE_TOKEN) + template


def compose(
    vision_model: str,
    text_model: str,
    *,
    norm_variant: NormVariant | None = None,
    vision_feature_layer: int = -2,
    vision_feature_select_strategy: str | None = None,
    projector_hidden_act: str = "gelu",
    dtype: torch.dtype | str | None = None,
    revision: str | None = None,
    text_revision: str | None = None,
    trust_remote_code: bool | None = TRUST_REMOTE_CODE_DEFAULT,
    seed: int = 42,
    **norm_options,
):
    """Builds a norm-aligned LLaVA from a vision encoder and a causal LM, both with their pretrained weights.

    LLaVA-1.5 defaults: a 2-layer GELU MLP projector, features of the penultimate vision layer, and the select strategy
    the encoder needs (SigLIP has no CLS token). T, the mean norm of the LM's non-zero text-embedding rows (the image
    token's row left out: `text_embedding_norm_target`), is stored in the config (paper §5.1). Both names and their
    configs are checked (`loading.check_source`, `check_parts`) before any weight is read.

    Args:
        vision_model (`str`):
            A folder or Hub id of a vision encoder (SigLIP, fixed-resolution SigLIP2, CLIP), or of a dual encoder whose
            `vision_model` is used.
        text_model (`str`):
            A folder or Hub id of a causal LM; its tokenizer gets the image token.
        norm_variant (`NormVariant`, *optional*):
            The projector norm's options; defaults to the paper's method.
        vision_feature_layer (`int`, *optional*, defaults to -2):
            The vision hidden state the projector reads.
        vision_feature_select_strategy (`str`, *optional*):
            `"full"` or `"default"` (drops the CLS token); `None` picks `"full"` for SigLIP and `"default"` otherwise.
        projector_hidden_act (`str`, *optional*, defaults to `"gelu"`):
            The projector MLP's activation.
        dtype (`torch.dtype` or `str`, *optional*):
            The dtype of the whole model (see `loading.parse_dtype`); `None` or `"auto"` takes the LM's.
        revision (`str`, *optional*):
            The Hub revision of `vision_model`.
        text_revision (`str`, *optional*):
            The Hub revision of `text_model`.
        trust_remote_code (`bool`, *optional*, defaults to `TRUST_REMOTE_CODE_DEFAULT` (`None`)):
            Passed to the config, model and tokenizer loaders.
        seed (`int`, *optional*, defaults to 42):
            Seed of the projector MLP's random init (the global generator is restored afterwards).
        **norm_options:
            The norm's options by name (`projector_norm=None`, `norm_init="default"`, ...), applied over
            `norm_variant` (`NormVariant.from_dict`).

    Returns:
        `tuple`: `(model, processor)`, a [`LlavaNormAlignedForConditionalGeneration`] in eval mode and its
        `LlavaProcessor`.

    Raises:
        `ValueError`: For an unknown norm option, a model that is not what its flag asks for (`check_parts`), a NaFlex
        SigLIP2 encoder, or weights that do not match the architecture built from their config.
        `SourceNotFound`: For a name that is neither a local folder nor a reachable Hub repo.
    """
    norm_variant = NormVariant.from_dict(norm_options, base=norm_variant)  # before anything is read
    check_source(vision_model, "vision model", revision=revision)  # before the imports: a typo fails at once
    check_source(text_model, "text model", revision=text_revision)
    check_parts(vision_model, text_model, revision=revision, text_revision=text_revision,
                trust_remote_code=trust_remote_code, vision_feature_layer=vision_feature_layer)
    from transformers import AutoImageProcessor, AutoModelForCausalLM, AutoTokenizer

    dtype = parse_dtype(dtype)
    vision_config, vision_tower = _vision_parts(vision_model, revision, dtype, trust_remote_code)
    llm = AutoModelForCausalLM.from_pretrained(
        text_model, revision=text_revision, dtype=dtype, trust_remote_code=trust_remote_code
    )
    tokenizer = AutoTokenizer.from_pretrained(
        text_model,
        revision=text_revision,
        trust_remote_code=trust_remote_code,
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )
    image_processor = AutoImageProcessor.from_pretrained(vision_model, revision=revision)
    return compose_parts(
        vision_config, vision_tower, llm, tokenizer, image_processor,
        vision_name=vision_model, text_name=text_model, norm_variant=norm_variant,
        vision_feature_layer=vision_feature_layer, vision_feature_select_strategy=vision_feature_select_strategy,
        projector_hidden_act=projector_hidden_act, dtype=dtype, seed=seed,
    )


def _composed_config(vision_config, llm, image_token_id: int, *, vision_name: str, text_name: str,
                     norm_variant: NormVariant, strategy: str, vision_feature_layer: int, projector_hidden_act: str):
    """The composed model's config: both parts' configs (each naming where it came from, as the model card's
    base_model: a Hub id, never a local path), T measured on the LM's input embeddings, the norm's options."""
    from modeling_llava_normaligned import LlavaNormAlignedConfig, text_embedding_norm_target

    # raises if every row is 0; the image token's row, if the LM has one already, is not text (paper §5.1)
    norm_target = text_embedding_norm_target(
        input_embedding_weight(llm, text_name), exclude_token_ids=(image_token_id,)
    )
    return LlavaNormAlignedConfig(
        vision_config={**vision_config.to_dict(), "_name_or_path": public_name(vision_name)},
        text_config={**llm.config.to_dict(), "_name_or_path": public_name(text_name)},
        image_token_index=image_token_id,
        image_seq_length=(vision_config.image_size // vision_config.patch_size) ** 2,
        projector_hidden_act=projector_hidden_act, vision_feature_select_strategy=strategy,
        vision_feature_layer=vision_feature_layer, norm_target=norm_target, **norm_variant.config_kwargs(),
        tie_word_embeddings=bool(getattr(llm.config, "tie_word_embeddings", False)),
    )


def _init_projector(model, projector, seed: int) -> None:
    """The projector is the only new part: materialise and initialise it in fp32 (LLaVA's init for the MLP, drawn
    with ``seed``; the norm per the variant: gain T / sqrt(D) or 1, bias 0). The global generator is left as it was."""
    import torch

    projector.to_empty(device="cpu").float()
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    for module in projector.modules():
        if module is not projector.norm:
            init_module_weights(model, module)
    torch.random.set_rng_state(generator_state)
    projector.reset_norm()


def compose_parts(
    vision_config,
    vision_tower: torch.nn.Module,
    llm,
    tokenizer,
    image_processor,
    *,
    vision_name: str,
    text_name: str,
    norm_variant: NormVariant | None = None,
    vision_feature_layer: int = -2,
    vision_feature_select_strategy: str | None = None,
    projector_hidden_act: str = "gelu",
    dtype: torch.dtype | None = None,
    seed: int = 42,
    **norm_options,
):
    """Builds a norm-aligned LLaVA, as `compose` does, from parts already loaded.

    The vision tower, the LM's base model and (when the embeddings are not tied) its LM head are shared with the new
    model, not copied. The LM's weights may be on the meta device except its input embeddings, which T is computed from.
    The tokenizer gets EOS as its pad token when it has none, and the input embeddings are resized (mean-initialised)
    when the image token lies outside them.

    Args:
        vision_config (`PretrainedConfig`):
            The vision tower's config (`image_size`, `patch_size`, `model_type`).
        vision_tower (`torch.nn.Module`):
            A `*VisionModel` with its weights.
        llm (`PreTrainedModel`):
            The causal LM.
        tokenizer (`PreTrainedTokenizerBase`):
            The LM's tokenizer, with the image token added.
        image_processor (`BaseImageProcessor`):
            The vision encoder's image processor.
        vision_name (`str`):
            The vision model's name, recorded in the config (a local path by its own name only: `public_name`) and used
            in error messages.
        text_name (`str`):
            The LM's name, likewise.
        norm_variant (`NormVariant`, *optional*):
            As in `compose`.
        vision_feature_layer (`int`, *optional*, defaults to -2):
            As in `compose`.
        vision_feature_select_strategy (`str`, *optional*):
            As in `compose`.
        projector_hidden_act (`str`, *optional*, defaults to `"gelu"`):
            As in `compose`.
        dtype (`torch.dtype`, *optional*):
            The dtype of the whole model; `None` takes the LM's parameters' dtype.
        seed (`int`, *optional*, defaults to 42):
            As in `compose`.
        **norm_options:
            As in `compose`.

    Returns:
        `tuple`: `(model, processor)`, a [`LlavaNormAlignedForConditionalGeneration`] in eval mode and a
        `LlavaProcessor` whose chat template accepts image parts (`multimodal_chat_template`).

    Raises:
        `ValueError`: For an unknown norm option, parts whose weights do not match the architecture built from their
        configs, or input embeddings from which T is undefined.
    """
    norm_variant = NormVariant.from_dict(norm_options, base=norm_variant)
    from transformers import LlavaProcessor

    from modeling_llava_normaligned import LlavaNormAlignedForConditionalGeneration

    strategy, n_extra = _select_strategy(vision_config)
    strategy = vision_feature_select_strategy or strategy
    # One dtype for the whole model: the one asked for, else the LM's (a bf16 LLM stays bf16, and the saved
    # config says so, so from_pretrained does not silently load it back in fp32).
    model_dtype = dtype or next(llm.parameters()).dtype
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    if tokenizer.pad_token is None:  # batched generation and training need one; Llama 3 ships none
        tokenizer.pad_token = tokenizer.eos_token
    config = _composed_config(vision_config, llm, image_token_id, vision_name=vision_name, text_name=text_name,
                              norm_variant=norm_variant, strategy=strategy, vision_feature_layer=vision_feature_layer,
                              projector_hidden_act=projector_hidden_act)
    with _meta_device():
        model = LlavaNormAlignedForConditionalGeneration(config)
    parts = anatomy_of(model)
    _share_weights(parts.vision_tower, vision_tower, f"vision model {vision_name!r}")
    _share_weights(parts.language_model, llm.base_model, f"text model {text_name!r}")
    if not config.tie_word_embeddings:
        _share_weights(model.get_output_embeddings(), llm.get_output_embeddings(), f"text model {text_name!r} (lm_head)")
    _init_projector(model, parts.projector, seed)
    model.to(model_dtype)
    model.tie_weights()
    if image_token_id >= model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=True)
    model.config.text_config.vocab_size = model.get_input_embeddings().weight.shape[0]
    model.generation_config = llm.generation_config
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.eval()

    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=vision_config.patch_size,
        vision_feature_select_strategy=strategy, num_additional_image_tokens=n_extra,
        chat_template=multimodal_chat_template(tokenizer.chat_template, tokenizer))
    return model, processor


def _missing_weight_error(source: str, missing: list[str]) -> ValueError:
    shown = ", ".join(missing[:10]) + (f" ... ({len(missing)} in all)" if len(missing) > 10 else "")
    return ValueError(
        f"checkpoint {source!r} is missing weights: {shown}. Refusing to convert, since they would be randomly "
        "re-initialised."
    )


def _check_stock_llava(source: str, revision: str | None) -> None:
    """``source``'s config must be a stock LLaVA's, read before its weights."""
    from modeling_llava_normaligned import LlavaNormAlignedConfig

    from .loading import load_config

    model_type = load_config(source, revision=revision).model_type
    if model_type == LlavaNormAlignedConfig.model_type:
        raise ValueError(f"--from-llava {source}: already a norm-aligned LLaVA; nothing to convert (load it as it is)")
    if model_type != "llava":
        raise ValueError(f"--from-llava {source}: a {model_type} checkpoint, not a stock LLaVA (model_type 'llava'); "
                         "give a LlavaForConditionalGeneration checkpoint, or build one with `compose`")


def _copy_stock_projector(parts, stock_projector, dtype, source: str) -> None:
    """The stock projector's weights into the aligned one (every one must be there), whose new norm then starts at
    gain T / sqrt(D) or 1, bias 0, in the stock projector's dtype."""
    import torch

    projector = parts.projector
    stock_params = dict(stock_projector.named_parameters())
    projector.to_empty(device="cpu").to(dtype)
    with torch.no_grad():
        for name, param in projector.named_parameters():
            if name.startswith("norm."):
                continue
            if name not in stock_params:
                raise _missing_weight_error(source, [f"{parts.family.projector}.{name}"])
            param.copy_(stock_params[name])
    projector.reset_norm()


def convert_from_llava(
    source: str,
    *,
    norm_variant: NormVariant | None = None,
    dtype: torch.dtype | None = None,
    revision: str | None = None,
    **norm_options,
):
    """Turns a stock `LlavaForConditionalGeneration` checkpoint (legacy or current key layout) into a norm-aligned one.

    Every stock weight must be present; only the new norm is initialised (gain T / sqrt(D) or 1, bias 0), with T
    measured on the stock model's input embeddings without the image token's row (paper §5.1).

    Args:
        source (`str`):
            A folder or Hub id of a stock LLaVA checkpoint (`model_type` `"llava"`).
        norm_variant (`NormVariant`, *optional*):
            The projector norm's options; defaults to the paper's method.
        dtype (`torch.dtype` or `str`, *optional*):
            The dtype to load the checkpoint in (see `loading.parse_dtype`); `None` loads it as stored.
        revision (`str`, *optional*):
            The Hub revision.
        **norm_options:
            The norm's options by name, applied over `norm_variant` (as in `compose`).

    Returns:
        `tuple`: `(model, processor)`, a [`LlavaNormAlignedForConditionalGeneration`] in eval mode and the checkpoint's
        processor.

    Raises:
        `ValueError`: For an unknown norm option, a checkpoint that is already norm-aligned or is not a stock LLaVA, or
        one with missing or mismatched weights.
        `SourceNotFound`: For a name that is neither a local folder nor a reachable Hub repo.
    """
    norm_variant = NormVariant.from_dict(norm_options, base=norm_variant)
    check_source(source, "stock LLaVA checkpoint", revision=revision)  # before the imports: a typo fails at once
    _check_stock_llava(source, revision)
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from modeling_llava_normaligned import (
        LlavaNormAlignedConfig,
        LlavaNormAlignedForConditionalGeneration,
        model_norm_target,
    )

    dtype = parse_dtype(dtype)
    stock, info = LlavaForConditionalGeneration.from_pretrained(
        source, revision=revision, dtype=dtype, output_loading_info=True
    )
    problems = sorted(set(info.get("missing_keys", ())) | set(info.get("mismatched_keys", ()) or ()))
    if problems:
        raise _missing_weight_error(source, [str(p) for p in problems])
    stock_config = stock.config.to_dict()
    for key in ("model_type", "architectures", "auto_map", "transformers_version"):
        stock_config.pop(key, None)
    config = LlavaNormAlignedConfig(
        **stock_config,
        norm_target=model_norm_target(stock),  # the image token's row left out (paper §5.1)
        **norm_variant.config_kwargs(),
    )
    with _meta_device():
        model = LlavaNormAlignedForConditionalGeneration(config)
    parts, stock_parts = anatomy_of(model), anatomy_of(stock, source)
    _share_weights(parts.vision_tower, stock_parts.vision_tower, f"{source} (vision tower)")
    _share_weights(parts.language_model, stock_parts.language_model, f"{source} (language model)")
    if not config.tie_word_embeddings:
        _share_weights(model.get_output_embeddings(), stock.get_output_embeddings(), f"{source} (lm_head)")
    _copy_stock_projector(parts, stock_parts.projector, next(stock.parameters()).dtype, source)
    model.tie_weights()
    model.generation_config = stock.generation_config
    model.eval()
    processor = AutoProcessor.from_pretrained(source, revision=revision)
    return model, processor


def stock_llava_like(model) -> LlavaForConditionalGeneration:
    """Builds the stock baseline of a norm-aligned model, for comparisons (tests, benchmarks, demo).

    Args:
        model ([`LlavaNormAlignedForConditionalGeneration`]):
            The norm-aligned model.

    Returns:
        `LlavaForConditionalGeneration`: A stock LLaVA with `model`'s configuration without the norm fields, and its
        weights except the projector norm's (loaded with `strict=True`), in `model`'s dtype and training mode. With
        `projector_norm=None` the two compute the same logits.
    """
    from transformers import LlavaConfig, LlavaForConditionalGeneration
    from transformers.initialization import no_init_weights

    config = model.config.to_dict()
    for key in (*NORM_FIELDS, "norm_target", "model_type", "architectures", "auto_map", "transformers_version"):
        config.pop(key, None)
    with no_init_weights():
        stock = LlavaForConditionalGeneration(LlavaConfig(**config))
    norm_path = anatomy_of(model).family.projector_norm_path
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(norm_path + ".")}
    stock.load_state_dict(state, strict=True)
    return stock.to(model.dtype).train(model.training)


def save(model, processor, output_dir: str) -> None:
    """Writes a model (safetensors and remote code) and its processor to `output_dir`, creating the folder.

    Args:
        model ([`LlavaNormAlignedForConditionalGeneration`]):
            The model to save.
        processor (`ProcessorMixin`):
            Its processor.
        output_dir (`str`):
            The folder to write to.
    """
    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    processor.save_pretrained(output_dir)
