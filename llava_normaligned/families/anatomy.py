"""Where the parts of a vision-language model are: one table of model families, one lookup.

Every command that needs the vision tower, the projector, its norm, the language model, its decoder layers, the input
embeddings or the image token asks this module (training's freezing and learning-rate groups, the norm tracking,
generation, the loader's bitsandbytes skip list, LoRA targets, the model card, diagnostics). A family is described
once, by module paths relative to the model with its LM head (the names ``named_parameters()``, state-dict keys,
bitsandbytes skip lists and PEFT targets use):

    anatomy = anatomy_of(model)            # plain, PEFT-wrapped, DDP-wrapped or torch.compile'd
    anatomy.projector, anatomy.projector_norm, anatomy.decoder_layers, anatomy.image_token_id
    family_of(config).keep_unquantized()   # ["model.vision_tower", "model.multi_modal_projector", "lm_head"]
    part_of("base_model.model.model.vision_tower.encoder.layers.0.mlp.fc1.lora_A.default.weight")  # "vision_tower"

Adding a family is adding one ``Family`` to ``FAMILIES``. A projector may live inside the vision tower (Qwen's
``model.visual.merger``): its parameters then belong to the projector, not to the tower (the most specific path wins),
and the tower's LoRA targets leave it out. Optional fields describe what else a family does: connectors besides the
projector (Qwen3-VL's deepstack mergers), placeholder tokens besides the image token, M-RoPE positions, deepstack
features added inside the LLM (``Deepstack``), a projector fed a distribution over a visual vocabulary (Ovis) and the
token type of generated tokens (PaliGemma). A model whose ``model_type`` is in no entry is matched by structure: the
first family whose required paths all resolve.
When none fits, ``AnatomyError`` names what the closest family misses. (The model file keeps its own path to its
norm, ``PROJECTOR_NORM_PATH``: remote code cannot import this package.)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache
from typing import TYPE_CHECKING

from llava_normaligned.compat import compiled_inner

if TYPE_CHECKING:  # torch is imported where a live model is read, so the table costs nothing to import
    import torch
    from torch import nn

PARTS = ("vision_tower", "projector", "llm")
# Prefixes wrappers add to parameter and module names: DDP, torch.compile, PEFT.
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "base_model.model.")


class AnatomyError(ValueError):
    """A model this package cannot find its way around; the message names every part that is missing."""


@dataclass(frozen=True)
class Deepstack:
    """Vision features added to the LLM's hidden states inside its decoder stack (Qwen3-VL's DeepStack).

    The vision tower's layer ``indexes[i]`` (``config.<indexes_key>``) goes through merger ``i`` (``mergers``, a
    ModuleList path) and is added to the hidden states of the image positions after LLM decoder layer ``i``
    (transformers' ``Qwen3VLTextModel._deepstack_process``): LLM layers ``0 .. len(indexes) - 1`` receive them. The
    text model receives the features as its ``features_kwarg`` forward argument, the positions as ``mask_kwarg``."""

    mergers: str
    indexes_key: str = "vision_config.deepstack_visual_indexes"
    features_kwarg: str = "deepstack_visual_embeds"
    mask_kwarg: str = "visual_pos_masks"

    def vision_layers(self, config) -> list[int]:
        value = config
        for key in self.indexes_key.split("."):
            value = value.get(key) if isinstance(value, dict) else getattr(value, key, None)
        return [int(i) for i in (value or ())]

    def llm_layers(self, config) -> list[int]:
        """The LLM decoder layers after which the features are added, in the order of ``vision_layers``."""
        return list(range(len(self.vision_layers(config))))


@dataclass(frozen=True)
class Family:
    """The module paths of one VLM family, relative to the model with its LM head (``...ForConditionalGeneration``).

    ``projector_norm`` is relative to the projector and optional (stock LLaVA has none); every other part is
    required. ``base`` is the base model (the one TRL's trainer calls directly). ``projector_input`` and
    ``generated_token_type`` describe what a few families do differently (Ovis, PaliGemma); their defaults are
    LLaVA's."""

    name: str
    model_types: tuple[str, ...]
    base: str = "model"
    vision_tower: str = "model.vision_tower"
    projector: str = "model.multi_modal_projector"
    projector_norm: str | None = None
    language_model: str = "model.language_model"
    decoder_layers: str = "layers"  # relative to the language model
    embed_tokens: str = "embed_tokens"  # relative to the language model
    lm_head: str = "lm_head"
    image_token_keys: tuple[str, ...] = ("image_token_id", "image_token_index")
    # LoRA targets: the linear layers of the LLM's attention and MLP, and of the vision tower's
    llm_linear_names: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    vision_linear_names: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2")
    notes: str = ""
    # --- optional: what other families do (defaults: LLaVA's behaviour)
    # connectors besides the projector, feeding the LLM too (Qwen3-VL's deepstack mergers): the "projector" part
    extra_projectors: tuple[str, ...] = ()
    # config keys of placeholder tokens besides the image token (Qwen's vision start/end, the video token)
    placeholder_token_keys: tuple[str, ...] = ()
    # "1d": one position per token; "mrope": Qwen's 3-D M-RoPE positions, from the base model's get_rope_index
    positions: str = "1d"
    # why a packed row (``train --padding_free True``) cannot give the padded batch's result, where it cannot; None:
    # it can (trainer/padding_free.py; tests/test_padding_free_mrope.py and tests/test_padding_free_families.py)
    packing_refusal: str | None = None
    deepstack: Deepstack | None = None
    # where the image tokens enter the LLM, in words (docs/diagnostics.md's families table)
    image_tokens: str = "the image token is expanded to one position per projected vision token"
    # What the projector maps: "features" (an MLP or linear map of vision features), or "visual_vocabulary" (Ovis:
    # an embedding table applied to a probability distribution over a visual vocabulary, paper RQ4).
    projector_input: str = "features"
    # token_type_ids of the tokens a model generates after its prompt, where its forward takes them (PaliGemma: 1,
    # the causal suffix after the bidirectional prefix; Gemma3: 0, text)
    generated_token_type: int = 0
    # ``align``: where the connector's output becomes the LLM's input embeddings. "connector_output": the projector
    # module's output is what the LLM receives at the image positions; "image_features": the base model's
    # get_image_features / get_video_features output (LLaVA-NeXT/OneVision add image_newline rows after the
    # projector). ``align_refusal``: why ``align`` cannot place the norm in this family (None: it can).
    norm_entry: str = "connector_output"
    align_refusal: str | None = None
    # What the vision tower's output the connector reads: "hidden_states" (LLaVA: ``hidden_states[config.
    # vision_feature_layer]``, so the layers after it, the post layernorm and a pooling head run for nothing and stay
    # frozen in training) or "last_hidden_state" (the tower's output: every vision parameter is used).
    vision_output: str = "hidden_states"
    # the processor takes one list of images per text (Gemma3's counts the images of each sample)
    images_per_text: bool = False
    # the input embedding layer multiplies its rows by sqrt(D) (Gemma): T read off the weights alone counts it
    scaled_embeddings: bool = False

    # ----------------------------------------------------------------------------------------- module paths
    @property
    def part_prefixes(self) -> dict[str, tuple[str, ...]]:
        """Part -> the module paths whose parameters belong to it (for freezing, lr groups, parameter counts)."""
        return {
            "vision_tower": (self.vision_tower,),
            "projector": (self.projector, *self.extra_projectors),
            "llm": (self.language_model, self.lm_head),
        }

    @property
    def nested_projectors(self) -> tuple[str, ...]:
        """The connectors that live inside the vision tower's module (Qwen's ``model.visual.merger``): their
        parameters are the projector's, not the tower's, although they are under the tower's path."""
        return tuple(p for p in self.part_prefixes["projector"] if p.startswith(self.vision_tower + "."))

    def placeholder_token_ids(self, config) -> list[int]:
        """The ids of the image token and the family's other placeholder tokens found in ``config`` (a key may hold
        one id or a list, as Ovis2's ``visual_indicator_token_ids``)."""
        ids = []
        for key in (*self.image_token_keys, *self.placeholder_token_keys):
            value = config.get(key) if isinstance(config, dict) else getattr(config, key, None)
            for one in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(one, int) and not isinstance(one, bool) and one not in ids:
                    ids.append(one)
        return ids

    @property
    def projector_norm_path(self) -> str | None:
        return f"{self.projector}.{self.projector_norm}" if self.projector_norm else None

    @property
    def embed_tokens_path(self) -> str:
        return f"{self.language_model}.{self.embed_tokens}"

    def keep_unquantized(self) -> list[str]:
        """Modules kept in floating point under 4/8-bit loading, by full path: bitsandbytes matches an entry from
        the start of the path or as a suffix (a bare ``vision_tower`` matches nothing in a LLaVA), and a custom list
        replaces transformers' default one, so ``lm_head`` is named too."""
        nested = self.nested_projectors  # kept with the tower that holds them
        return [self.vision_tower, *(p for p in self.part_prefixes["projector"] if p not in nested), self.lm_head]

    def lora_targets(self, vision: bool = False) -> str:
        """A PEFT ``target_modules`` regex (matched whole against module names): the LLM's attention and MLP
        projections, and with ``vision`` the vision tower's."""
        llm = rf".*{_escaped(self.language_model)}\..*\.({'|'.join(self.llm_linear_names)})"
        if not vision:
            return llm
        # the tower's own layers, not those of a projector inside it
        inside = "".join(rf"(?!{_escaped(p[len(self.vision_tower) + 1:])}\.)" for p in self.nested_projectors)
        tower = rf".*{_escaped(self.vision_tower)}\.{inside}.*\.({'|'.join(self.vision_linear_names)})"
        return f"({llm}|{tower})"

    @property
    def projector_module_name(self) -> str:
        """The projector's attribute name: what PEFT's ``modules_to_save`` matches (as a name suffix)."""
        return self.projector.rpartition(".")[2]

    def part_of(self, name: str) -> str | None:
        """The part (``vision_tower``, ``projector``, ``llm``) a parameter or module name belongs to; None if none.
        Wrapper prefixes (PEFT, DDP, compile) are ignored; names relative to the base model are understood too."""
        name = strip_wrappers(name)
        best, best_length = None, -1
        for part, prefixes in self.part_prefixes.items():
            for prefix in prefixes:
                for candidate in (prefix, self._relative_to_base(prefix)):
                    matches = candidate and (name == candidate or name.startswith(candidate + "."))
                    if matches and len(candidate) > best_length:  # the most specific wins (a projector in a tower)
                        best, best_length = part, len(candidate)
        return best

    def _relative_to_base(self, path: str) -> str | None:
        return path[len(self.base) + 1 :] if path.startswith(self.base + ".") else None


def _escaped(path: str) -> str:
    return path.replace(".", r"\.")


LLAVA = Family(
    name="llava",
    model_types=("llava",),
    notes="transformers' LlavaForConditionalGeneration (LLaVA-1.5 layout, transformers >= 4.52 names)",
    align_refusal="a stock LLaVA becomes this package's own model with `llava-normaligned convert --from-llava`",
)
LLAVA_NORMALIGNED = replace(
    LLAVA,
    name="llava_normaligned",
    model_types=("llava_normaligned",),
    projector_norm="norm",  # NormAlignedLayerNorm; None in the "w/o Norm" variant
    notes="this package's model: LLaVA with the norm-aligned LayerNorm after the projector (paper §5.1)",
    align_refusal="this package's model already has the aligned norm after its projector",
)

# Qwen2-VL, Qwen2.5-VL, Qwen3-VL: the merger (patch merger: 2x2 patches -> one token, then an MLP) is the vision
# model's last module; the LLM's image tokens are <|image_pad|> between <|vision_start|> and <|vision_end|>, one per
# merged token, positioned by M-RoPE.
_QWEN_VL = dict(
    base="model",
    vision_tower="model.visual",
    projector="model.visual.merger",
    language_model="model.language_model",
    image_token_keys=("image_token_id",),
    placeholder_token_keys=("vision_start_token_id", "vision_end_token_id", "video_token_id"),
    positions="mrope",
    vision_output="last_hidden_state",
    image_tokens="<|vision_start|> <|image_pad|> x prod(grid_thw)/merge_size^2 <|vision_end|>; M-RoPE positions",
)
QWEN2_VL = Family(
    name="qwen2_vl",
    model_types=("qwen2_vl",),
    vision_linear_names=("qkv", "proj", "fc1", "fc2"),
    notes="transformers' Qwen2VLForConditionalGeneration: merger = LayerNorm, then a 2-layer MLP",
    **_QWEN_VL,
)
QWEN2_5_VL = Family(
    name="qwen2_5_vl",
    model_types=("qwen2_5_vl",),
    vision_linear_names=("qkv", "proj", "gate_proj", "up_proj", "down_proj"),
    notes="transformers' Qwen2_5_VLForConditionalGeneration: merger = RMSNorm, then a 2-layer MLP",
    **_QWEN_VL,
)
QWEN3_VL = Family(
    name="qwen3_vl",
    model_types=("qwen3_vl",),
    vision_linear_names=("qkv", "proj", "linear_fc1", "linear_fc2"),
    extra_projectors=("model.visual.deepstack_merger_list",),
    deepstack=Deepstack(mergers="model.visual.deepstack_merger_list"),
    notes="transformers' Qwen3VLForConditionalGeneration: merger = LayerNorm before the MLP; deepstack features of "
    "middle vision layers added to the first LLM layers' image positions",
    **_QWEN_VL,
)
# Idefics3 and SmolVLM (SmolVLM2): SigLIP-style vision model, a connector (pixel shuffle + one linear layer), a Llama.
_IDEFICS3 = dict(
    base="model",
    vision_tower="model.vision_model",
    projector="model.connector",
    language_model="model.text_model",
    image_token_keys=("image_token_id",),
    vision_output="last_hidden_state",
    image_tokens="per tile <fake_token_around_image><row_i_col_j><image> x image_seq_len, then the global image "
    "(<global-img>); one <image> per connector output token",
)
IDEFICS3 = Family(name="idefics3", model_types=("idefics3",),
                  notes="transformers' Idefics3ForConditionalGeneration", **_IDEFICS3)
SMOLVLM = Family(name="smolvlm", model_types=("smolvlm",), images_per_text=True,  # its processor nests a flat list
                 notes="transformers' SmolVLMForConditionalGeneration (SmolVLM, SmolVLM2)", **_IDEFICS3)

# transformers 5's LLaVA-like families: the image features are scattered into the LLM's input embeddings at the
# image-token positions, after the projector (and, for LLaVA-NeXT/OneVision, the unpadding and newline rows).
PIXTRAL_LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LLAVA_LIKE: tuple[Family, ...] = (
    replace(LLAVA, name="llava_next", model_types=("llava_next",), norm_entry="image_features", align_refusal=None,
            image_tokens="<image> x (anyres crops, unpadded) with image_newline rows; read at inputs_embeds",
            notes="LlavaNextForConditionalGeneration: anyres crops; the image positions also hold image_newline rows"),
    replace(LLAVA, name="llava_onevision", model_types=("llava_onevision",), norm_entry="image_features",
            align_refusal=None,
            placeholder_token_keys=("video_token_index",),
            image_tokens="as LLaVA-NeXT: <image> x (anyres crops, unpadded) with image_newline rows",
            notes="LlavaOnevisionForConditionalGeneration: anyres crops and image_newline rows, like LLaVA-NeXT"),
    replace(LLAVA, name="gemma3", model_types=("gemma3",), align_refusal=None, vision_output="last_hidden_state",
            images_per_text=True, scaled_embeddings=True,
            placeholder_token_keys=("boi_token_index", "eoi_token_index"),
            image_tokens="<start_of_image> <image_soft_token> x mm_tokens_per_image <end_of_image>; token_type_ids "
            "1 on the soft tokens",
            packing_refusal="each image's tokens attend to each other both ways (token_type_ids), a mask "
            "transformers does not build for packed rows (measured: gradients 13% apart)",
            notes="Gemma3ForConditionalGeneration: avg-pooled SigLIP, RMSNorm, then a projection matrix; the text "
            "embeddings are scaled by sqrt(D) inside embed_tokens, the image features are not"),
    replace(LLAVA, name="paligemma", model_types=("paligemma",), generated_token_type=1,
            align_refusal="PaliGemma rescales the projector's output by 1/sqrt(D) inside get_image_features and its "
            "image prefix attends bidirectionally: align does not place the norm there",
            image_tokens="<image> x image_seq_length, BOS, the prefix, a newline (no chat turn); token_type_ids",
            notes="PaliGemmaForConditionalGeneration: one linear projector; the image and the prefix attend "
            "bidirectionally (token_type_ids 0), the generated suffix causally (1)"),
    replace(LLAVA, name="mistral3", model_types=("mistral3",), align_refusal=None,
            vision_linear_names=PIXTRAL_LINEAR_NAMES,
            image_tokens="rows of [IMG] (one per merged patch), each row ending in [IMG_BREAK], the last in [IMG_END]",
            notes="Mistral3ForConditionalGeneration: Pixtral vision tower; the projector's RMSNorm and 2x2 patch "
            "merger come before its MLP; [IMG_BREAK]/[IMG_END] rows are text tokens"),
    replace(LLAVA, name="internvl", model_types=("internvl",), align_refusal=None,
            vision_linear_names=("q_proj", "k_proj", "v_proj", "projection_layer", "fc1", "fc2"),
            image_tokens="<img> <IMG_CONTEXT> x (tiles x image_seq_length) </img>",
            notes="InternVLForConditionalGeneration: pixel shuffle (downsample_ratio) before the MLP projector; "
            "<img>/</img> around the <IMG_CONTEXT> tokens"),
    replace(LLAVA, name="ovis2", model_types=("ovis2",), projector="model.visual_embeddings_table",
            vision_linear_names=("q_proj", "k_proj", "v_proj", "out_proj", "gate_proj", "up_proj", "down_proj"),
            projector_input="visual_vocabulary", placeholder_token_keys=("visual_indicator_token_ids",),
            align_refusal="Ovis2's visual embedding table gives both the image tokens and the indicator tokens "
            "(<IMG_START>...): where its image features enter the LLM is ambiguous",
            image_tokens="<IMG_START> <IMG_ATOM> x tokens per grid <IMG_GRID> ... <IMG_END>; atoms and indicators take "
            "rows of the visual embedding table",
            notes="Ovis2ForConditionalGeneration: the vision tower's head gives a distribution over a visual "
            "vocabulary; the embedding table maps it to the LLM (probabilistic visual tokens, paper RQ4); indicator "
            "tokens (<IMG_START>...) take rows of the same table"),
)

# One entry per family. Order matters only for models matched by structure (an unknown model_type).
FAMILIES: tuple[Family, ...] = (
    LLAVA_NORMALIGNED,
    LLAVA,
    QWEN2_VL,
    QWEN2_5_VL,
    QWEN3_VL,
    IDEFICS3,
    SMOLVLM,
    *LLAVA_LIKE,
)


def strip_wrappers(name: str) -> str:
    """A parameter or module name without the prefixes PEFT, DDP and torch.compile add."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix) :], True
    return name


# ``align``'s models: a stock family's model with the aligned norm, model_type ``normaligned_<stock>``, the norm at
# ``<projector>.aligned_norm`` (the model file's ``configuration_normaligned_vlm`` spells both the same way).
ALIGNED_MODEL_TYPE_PREFIX = "normaligned_"
ALIGNED_NORM_NAME = "aligned_norm"


@cache
def aligned_family(family: Family) -> Family:
    """``family`` as ``align`` writes it: the same parts and name, the aligned norm under the projector."""
    return replace(family, model_types=tuple(ALIGNED_MODEL_TYPE_PREFIX + t for t in family.model_types),
                   projector_norm=ALIGNED_NORM_NAME,
                   align_refusal="this model already has the aligned norm (written by `llava-normaligned align`)")


def family_of(config_or_model_type) -> Family | None:
    """The family of a config (object or dict) or a ``model_type`` string; None when no entry names it. A model
    ``align`` wrote (``normaligned_<stock>``) is its stock family's, with the aligned norm (``aligned_family``)."""
    if isinstance(config_or_model_type, str):
        model_type = config_or_model_type
    elif isinstance(config_or_model_type, dict):
        model_type = config_or_model_type.get("model_type")
    else:
        model_type = getattr(config_or_model_type, "model_type", None)
    if isinstance(model_type, str) and model_type.startswith(ALIGNED_MODEL_TYPE_PREFIX):
        stock = family_of(model_type[len(ALIGNED_MODEL_TYPE_PREFIX) :])
        return aligned_family(stock) if stock is not None and stock.align_refusal is None else None
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def family_for_config(config, what: str = "model") -> Family:
    """``family_of`` that raises ``AnatomyError`` naming the model type and the families known."""
    family = family_of(config)
    if family is None:
        model_type = config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None)
        raise AnatomyError(f"{what}: model_type {model_type!r} is not a family this package knows ({known()})")
    return family


def known() -> str:
    return ", ".join(t for f in FAMILIES for t in f.model_types)


def part_of(name: str, family: Family = LLAVA) -> str | None:
    """``Family.part_of`` (LLaVA's paths by default, which are also this package's model's)."""
    return family.part_of(name)


# ------------------------------------------------------------------------------------------------- a live model


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DDP (``.module``), torch.compile (``._orig_mod``) and PEFT (``get_base_model()``)."""
    from torch import nn

    for _ in range(8):
        if hasattr(model, "get_base_model") and callable(model.get_base_model):
            model = model.get_base_model()
        elif compiled_inner(model) is not None:
            model = compiled_inner(model)
        elif isinstance(getattr(model, "module", None), nn.Module) and not hasattr(model, "config"):
            model = model.module
        else:
            break
    return model


def _active(module):
    """PEFT's ``modules_to_save`` wraps a module: the trained copy of the active adapter is the one in use."""
    from torch import nn

    copies = getattr(module, "modules_to_save", None)
    if isinstance(copies, nn.ModuleDict) and len(copies):
        return copies[getattr(module, "active_adapter", None) or next(iter(copies.keys()))]
    return module


def _resolve(root: nn.Module, path: str, base_path: str):
    """The module at ``path`` of ``root`` (a model with its head), or of ``root`` as the base model itself."""
    from torch import nn

    for candidate in (path, path[len(base_path) + 1 :] if path.startswith(base_path + ".") else None):
        if candidate is None:
            continue
        module = root
        try:
            for part in candidate.split("."):
                module = _active(getattr(module, part))
        except AttributeError:
            continue
        if isinstance(module, nn.Module):
            return module
    return None


@dataclass
class Anatomy:
    """The parts of one model, found through its family's paths."""

    family: Family
    model: nn.Module  # unwrapped: the model with its LM head (or a base model given on its own)
    base: nn.Module  # the base model: vision tower, projector, language model
    vision_tower: nn.Module
    projector: nn.Module  # the active copy under PEFT modules_to_save
    projector_norm: nn.Module | None
    language_model: nn.Module
    decoder_layers: nn.ModuleList
    input_embeddings: nn.Module
    image_token_id: int | None
    missing: list[str] = field(default_factory=list)
    deepstack_mergers: nn.ModuleList | None = None  # Family.deepstack's mergers, when the family has them

    @property
    def config(self):
        return self.model.config

    def vision_dtype(self) -> torch.dtype:
        """The dtype pixel values must have: the vision tower's (a quantized model's ``dtype`` can mislead)."""
        for param in self.vision_tower.parameters():
            if param.is_floating_point():
                return param.dtype
        return self.model.dtype

    def part_of(self, name: str) -> str | None:
        return self.family.part_of(name)

    @property
    def placeholder_token_ids(self) -> list[int]:
        """The image token's id and the family's other placeholder tokens' (``Family.placeholder_token_ids``)."""
        ids = self.family.placeholder_token_ids(self.config)
        if self.image_token_id is not None and self.image_token_id not in ids:
            ids.append(self.image_token_id)
        return ids

    @property
    def embed_scale(self) -> float:
        """The factor the input embedding layer multiplies its rows by (Gemma: sqrt(D)); 1 for the others."""
        return float(getattr(self.input_embeddings, "scalar_embed_scale", 1.0))

    def text_norm_target(self, weight=None) -> float:
        """T (paper §5.1) as the LLM receives text: the mean L2 norm of the input-embedding rows (``weight``, or the
        model's own), the placeholder tokens' rows left out, times ``embed_scale``."""
        from modeling_llava_normaligned import text_embedding_norm_target

        weight = self.input_embeddings.weight if weight is None else weight
        return text_embedding_norm_target(weight, exclude_token_ids=self.placeholder_token_ids) * self.embed_scale


def _find(model: nn.Module, family: Family) -> tuple[dict, list[str]]:
    from torch import nn

    parts, missing = {}, []
    for key in ("vision_tower", "projector", "language_model"):
        path = getattr(family, key)
        parts[key] = _resolve(model, path, family.base)
        if parts[key] is None:
            missing.append(path)
    base = _resolve(model, family.base, family.base) if family.base else model
    parts["base"] = base if base is not None and parts["vision_tower"] is not None else model
    layers = None
    if parts["language_model"] is not None:
        layers = _resolve(parts["language_model"], family.decoder_layers, "")
        if not isinstance(layers, nn.ModuleList):
            missing.append(f"{family.language_model}.{family.decoder_layers} (the decoder layers)")
    parts["decoder_layers"] = layers
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None or getattr(embeddings, "weight", None) is None:
        missing.append("input embeddings (get_input_embeddings())")
    parts["input_embeddings"] = embeddings
    norm = None
    if family.projector_norm and parts["projector"] is not None:
        norm = getattr(parts["projector"], family.projector_norm, None)
    parts["projector_norm"] = norm if isinstance(norm, nn.Module) else None
    config = getattr(model, "config", None)
    image_token_id = None
    for key in family.image_token_keys:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            image_token_id = value
            break
    parts["image_token_id"] = image_token_id
    if family.deepstack is not None:
        parts["deepstack_mergers"] = _resolve(model, family.deepstack.mergers, family.base)
        if parts["deepstack_mergers"] is None:
            missing.append(f"{family.deepstack.mergers} (the deepstack mergers)")
    return parts, missing


def anatomy_of(model: nn.Module, what: str | None = None, *, require_image_token: bool = False) -> Anatomy:
    """The parts of ``model`` (plain or wrapped), or ``AnatomyError`` naming the parts that are missing.

    The family is the one of ``model.config.model_type``; a model type in no entry is matched by structure."""
    inner = unwrap(model)
    what = what or type(inner).__name__
    config = getattr(inner, "config", None)
    family = family_of(config) if config is not None else None
    candidates = [family] if family is not None else list(FAMILIES)
    best = None
    for candidate in candidates:
        parts, missing = _find(inner, candidate)
        if require_image_token and parts["image_token_id"] is None:
            missing.append(f"config.{candidate.image_token_keys[0]}")
        if not missing:
            return Anatomy(family=candidate, model=inner, missing=[], **parts)
        if best is None or len(missing) < len(best[1]):
            best = (candidate, missing)
    family, missing = best
    model_type = getattr(config, "model_type", None)
    raise AnatomyError(
        f"{what} ({type(inner).__name__}, model_type {model_type!r}): no {'; no '.join(missing)}. This package "
        f"knows the parts of: {known()} (the closest, {family.name}, keeps them at {family.vision_tower}, "
        f"{family.projector}, {family.language_model}.{family.decoder_layers})"
    )


def base_model(model: nn.Module) -> nn.Module:
    """The base model (vision tower, projector, language model) inside ``model``: a ForConditionalGeneration,
    PEFT-, DDP- or compile-wrapped, or the base model itself."""
    return anatomy_of(model).base


def projector_of(model: nn.Module) -> nn.Module:
    """The projector in use (the trained copy under PEFT ``modules_to_save``)."""
    return anatomy_of(model).projector


def projector_norm_of(model: nn.Module) -> nn.Module | None:
    """The projector's norm (``None`` for stock LLaVA and the "w/o Norm" variant)."""
    return anatomy_of(model).projector_norm


def vision_dtype(model: nn.Module) -> torch.dtype:
    """The dtype pixel values must have: the vision tower's; the model's own for a model this module cannot read."""
    try:
        return anatomy_of(model).vision_dtype()
    except AnatomyError:
        return model.dtype


__all__ = [
    "ALIGNED_MODEL_TYPE_PREFIX",
    "ALIGNED_NORM_NAME",
    "FAMILIES",
    "LLAVA",
    "LLAVA_LIKE",
    "LLAVA_NORMALIGNED",
    "PARTS",
    "Anatomy",
    "AnatomyError",
    "Deepstack",
    "Family",
    "aligned_family",
    "anatomy_of",
    "base_model",
    "family_for_config",
    "family_of",
    "part_of",
    "projector_norm_of",
    "projector_of",
    "strip_wrappers",
    "unwrap",
    "vision_dtype",
]
