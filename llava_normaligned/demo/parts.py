"""The CPU demo's models: a pre-trained tiny vision encoder and a tiny LLM, composed into each variant of the paper.

    parts = build_parts(folder, PartsConfig())          # once; cached in the folder
    model, processor = compose_variant(parts, VARIANTS[3])   # "w/ Norm, target init (w/ GWC)"
    stock = stock_llava(model)                           # the same weights in transformers' LlavaForConditionalGeneration

Every variant starts from the same weights: the same vision encoder and LLM (``parts``) and the same projector draw
(seeded); only the projector norm differs (paper Tables 4/5).

With ``PartsConfig.text_model`` (``demo --text-model``) the LLM is a real pretrained one instead (``real_llm``: the
offline SmolLM2-135M-Instruct, a folder or a Hub id), saved as it is to ``parts/text`` with its own tokenizer and
chat template; it is not pre-trained on the demo's text, and T is its own embeddings' norm (3.20 for SmolLM2).

Why the norm gap is there at the LLM input (the paper's RQ1), at CPU scale:

* The vision encoder is pre-trained on the synthetic images (``vision_pretrain``), and LLaVA reads its last hidden
  state before the post-layernorm (``vision_feature_layer=-1``): the pre-norm residual stream, whose norm (about 13
  to 20 here) is some 100x the tiny LLM's text-embedding norm T (0.16 for 64-d embeddings drawn with std 0.02;
  about 0.17 after the text pre-training, the value the demo measures and reports in ``parts.json``).
* The projector is drawn as LLaVA-1.5's is *at its real widths*. transformers draws it with std 0.02, which at
  1024 -> 4096 -> 4096 gives each layer an RMS gain of 0.02 * sqrt(fan_in) = 0.64 and 1.28; at the tiny widths the
  same std would shrink the image tokens about 40x and hide the gap. So the demo draws each layer with
  std = (LLaVA-1.5's gain) / sqrt(fan_in): image tokens enter the LLM at tens of times the text norm, as in the
  paper's models (29-72 against 0.8-1.4).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field

import torch

from llava_normaligned.norm_variant import NormVariant
from llava_normaligned.tiny import TinyTextSpec, TinyVisionSpec, tiny_text_model, train_tokenizer
from modeling_llava_normaligned import text_embedding_norm_target

from . import synthetic
from .text_pretrain import TextPretrainConfig, pretrain_text
from .vision_pretrain import VisionPretrainConfig, pretrain_vision

logger = logging.getLogger(__name__)

PARTS_FILE = "parts.json"
# LLaVA-1.5 (CLIP ViT-L 1024-d -> Vicuna 4096-d), projector drawn with std 0.02: per-layer RMS gains
LLAVA15_PROJECTOR_GAINS = (0.02 * math.sqrt(1024), 0.02 * math.sqrt(4096))
# Words the chat template and the text pre-training add to the dataset's own.
EXTRA_WORDS = ("user", "assistant", "system", "Scene", ":")


@dataclass
class Variant:
    """One row of the paper's Table 4 ablation: its projector norm (``NormVariant``), and how stage 2 trains."""

    name: str  # as printed in the tables
    key: str  # folder name
    norm: NormVariant
    # how stage 2 trains (the same model fields can train two ways): the Trainer's global clipping threshold
    # (``max_grad_norm``; 0 = no clipping) and ``StageConfig.clip_per_part``. Stage 1 always trains with the
    # defaults (clipping at 1.0, globally): there only the projector and its norm train, so there is no LLM step
    # for the clipping to throttle, and rows that differ only here share their stage-1 run (``stage1_group``).
    max_grad_norm: float = 1.0
    clip_per_part: bool = False

    def config_fields(self) -> dict:
        """The model's projector-norm options, as the row's result records them."""
        return self.norm.config_kwargs()

    def training_fields(self) -> dict:
        return {"max_grad_norm": self.max_grad_norm, "clip_per_part": self.clip_per_part, "applies_to": "stage 2"}

    def stage1_group(self) -> tuple:
        """Rows with the same key train the same stage 1 (same model fields, same stage-1 training)."""
        return tuple(sorted(self.config_fields().items()))


NO_NORM = NormVariant(projector_norm=None, gradient_compensation=False)
DEFAULT_INIT = NormVariant(norm_init="default", gradient_compensation=False)
TARGET_INIT = NormVariant(norm_init="target", gradient_compensation=False)
TARGET_INIT_GWC = NormVariant(norm_init="target", gradient_compensation=True)
VARIANTS = (
    Variant("w/o Norm", "no_norm", NO_NORM),
    Variant("w/ Norm, default init", "norm_default_init", DEFAULT_INIT),
    Variant("w/ Norm, target init (w/o GWC)", "norm_target_init", TARGET_INIT),
    Variant("w/ Norm, target init (w/ GWC)", "norm_target_init_gwc", TARGET_INIT_GWC),
)
# Beside the paper's four: GWC with per-part clipping (the steadier alternative, recipe
# ``ablation_norm-target-init-part-clip-gwc``), and target init with and without GWC trained without clipping
# (what GWC changes under AdamW when the global clipping cannot couple the parts); each in stage 2, continuing from
# the stage-1 run of the paper's row with the same model fields.
EXTRA_VARIANTS = (
    Variant("w/ Norm, target init (w/ GWC), per-part clipping", "norm_target_init_gwc_part_clip", TARGET_INIT_GWC,
            clip_per_part=True),
    Variant("w/ Norm, target init (w/o GWC), no clipping", "norm_target_init_noclip", TARGET_INIT, max_grad_norm=0.0),
    Variant("w/ Norm, target init (w/ GWC), no clipping", "norm_target_init_gwc_noclip", TARGET_INIT_GWC,
            max_grad_norm=0.0),
)


@dataclass
class PartsConfig:
    """The tiny vision encoder and LLM, and how each is pre-trained. ``text_model``: a real pretrained LLM instead
    of the tiny one (``real_llm``; ``text`` and ``text_pretrain`` are then None)."""

    vision: TinyVisionSpec = field(default_factory=lambda: TinyVisionSpec(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=32,
        patch_size=8))
    text: TinyTextSpec | None = field(default_factory=lambda: TinyTextSpec(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2))
    vision_pretrain: VisionPretrainConfig = field(default_factory=VisionPretrainConfig)
    text_pretrain: TextPretrainConfig | None = field(default_factory=TextPretrainConfig)
    jitter: int = 1
    seed: int = 0
    text_model: str | None = None  # as given to --text-model

    def to_dict(self) -> dict:
        return parts_dict(asdict(self))


def parts_dict(data: dict) -> dict:
    """A ``PartsConfig`` as recorded (``parts.json``, ``demo_config.json``): ``text_model`` only when there is one,
    so the tiny demo's records stay what they were."""
    return {k: v for k, v in data.items() if not (k == "text_model" and v is None)}


@dataclass
class Parts:
    vision_dir: str
    text_dir: str
    info: dict  # pre-training results and measured norms (parts.json)


def build_parts(folder: str, config: PartsConfig, progress: bool = True) -> Parts:
    """Pre-train and save the tiny vision encoder (``folder/vision``) and LLM (``folder/text``).

    Reused when ``folder/parts.json`` records the same config; a folder with another config is an error (never
    overwritten). Written to a temporary folder and moved into place, so an interrupted run leaves nothing half-done.
    """
    wanted = json.loads(json.dumps(config.to_dict()))
    info_path = os.path.join(folder, PARTS_FILE)
    if os.path.exists(info_path):
        with open(info_path, encoding="utf-8") as handle:
            info = json.load(handle)
        if info.get("config") != wanted:
            raise FileExistsError(f"{folder} holds parts built with another config; use another output folder")
        logger.info("reusing the pre-trained parts in %s", folder)
        return Parts(os.path.join(folder, "vision"), os.path.join(folder, "text"), info)
    if os.path.exists(folder) and os.listdir(folder):
        raise FileExistsError(f"{folder} exists, is not empty and has no {PARTS_FILE}")
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".parts-", dir=parent)
    try:
        info = _build(staging, config, wanted, progress)
        if os.path.exists(folder):
            os.rmdir(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Parts(os.path.join(folder, "vision"), os.path.join(folder, "text"), info)


def _build(root: str, config: PartsConfig, wanted: dict, progress: bool) -> dict:
    vision = pretrain_vision(config.vision, config.vision_pretrain, jitter=config.jitter, progress=progress)
    vision.model.save_pretrained(os.path.join(root, "vision"))
    vision.image_processor.save_pretrained(os.path.join(root, "vision"))
    if config.text_model is not None:
        return _with_real_llm(root, config, wanted, vision)

    # The LM's own tokenizer does not know <image>: compose adds it, as it would for Llama or Qwen.
    words = list(synthetic.VOCABULARY) + list(EXTRA_WORDS)
    tokenizer = train_tokenizer(words=words, vocab_size=1024, with_image_token=False)
    lm = tiny_text_model(tokenizer, config.text, seed=config.seed + 1)
    text_info = None
    if config.text_pretrain is not None:
        result = pretrain_text(lm, tokenizer, config.text_pretrain, progress=progress)
        text_info = {"answer_accuracy_from_text": result.answer_accuracy, "seconds": result.seconds,
                     "final_loss": result.losses[-1]}
    lm.save_pretrained(os.path.join(root, "text"))
    tokenizer.save_pretrained(os.path.join(root, "text"))

    info = {
        "config": wanted,
        "vision_pretrain": {"cell_accuracy_held_out": vision.cell_accuracy, "seconds": vision.seconds,
                            "final_loss": vision.losses[-1]},
        "text_pretrain": text_info,
        # paper RQ1: the vision encoder's output norm against the LLM's text-embedding norm
        "vision_feature_norm": {"before_pretraining": vision.feature_norm_before,
                                "after_pretraining": vision.feature_norm_after},
        "text_embedding_norm": text_embedding_norm_target(lm.get_input_embeddings().weight),  # T, paper §5.1
    }
    with open(os.path.join(root, PARTS_FILE), "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=1)
    return info


def _with_real_llm(root: str, config: PartsConfig, wanted: dict, vision) -> dict:
    """``parts/text``: the real LLM as a plain transformers folder (no text pre-training: it knows the language)."""
    from .real_llm import resolve_text_model, save_text_model

    llm = save_text_model(resolve_text_model(config.text_model), os.path.join(root, "text"))
    info = {
        "config": wanted,
        "vision_pretrain": {"cell_accuracy_held_out": vision.cell_accuracy, "seconds": vision.seconds,
                            "final_loss": vision.losses[-1]},
        "text_pretrain": None,
        "llm": {k: v for k, v in llm.items() if k != "text_embedding_norm"},
        "vision_feature_norm": {"before_pretraining": vision.feature_norm_before,
                                "after_pretraining": vision.feature_norm_after},
        "text_embedding_norm": llm["text_embedding_norm"],  # T, paper §5.1: the real embeddings' mean norm
    }
    with open(os.path.join(root, PARTS_FILE), "w", encoding="utf-8") as handle:
        json.dump(info, handle, indent=1)
    return info


# ------------------------------------------------------------------------------------------------ composing


def draw_projector(model, seed: int) -> None:
    """Draw the projector's two linear layers with LLaVA-1.5's per-layer gains (see the module docstring)."""
    projector = model.model.multi_modal_projector
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for linear, gain in zip((projector.linear_1, projector.linear_2), LLAVA15_PROJECTOR_GAINS):
            std = gain / math.sqrt(linear.in_features)
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=generator) * std)
            if linear.bias is not None:
                linear.bias.zero_()


def pre_norm_image_norm(model, pixel_values: torch.Tensor) -> float:
    """Mean L2 norm of the image tokens ``model``'s projector makes before its norm layer (the LLM's image inputs
    without it; for a model without the norm, the image inputs themselves), for ``pixel_values`` (N, 3, H, W)."""
    from llava_normaligned.part_metrics import projected_image_norm

    projector = model.model.multi_modal_projector
    captured = []
    handle = projector.linear_2.register_forward_hook(lambda module, args, output: captured.append(output.detach()))
    try:
        projected_image_norm(model, pixel_values)
    finally:
        handle.remove()
    return float(captured[0].float().norm(dim=-1).mean())


def set_norm_gap(model, pixel_values: torch.Tensor, gap: float) -> dict:
    """Scale the projector's output layer so that the image tokens before the norm layer enter the LLM at ``gap``
    times its text norm T (mean norms over ``pixel_values``), as LLaVA-1.5's do (29-72x, the paper's RQ1).

    Why the output layer: the gap at LLaVA's LLM input is the vision encoder's feature norm times the projector's
    gain, and the demo's tiny encoder cannot reach CLIP ViT-L's feature scale relative to a real LLM's T (SmolLM2's
    T is 3.2, Vicuna's about 1). The layer's bias is zero (``draw_projector``) and GELU comes before it, so scaling
    its weight scales the image tokens exactly, and nothing else changes: the same draw, direction and encoder.
    Returns ``{"natural": the gap before, "target": gap, "factor": the scale applied}``."""
    from llava_normaligned.part_metrics import text_embedding_norm

    if not gap > 0:
        raise ValueError(f"norm gap must be positive, got {gap}")
    projector = model.model.multi_modal_projector
    if projector.linear_2.bias is not None and bool(projector.linear_2.bias.detach().abs().max() > 0):
        raise ValueError("set_norm_gap scales the projector's output layer, whose bias must be zero (draw_projector)")
    natural = pre_norm_image_norm(model, pixel_values) / text_embedding_norm(model)
    factor = gap / natural
    with torch.no_grad():
        projector.linear_2.weight.mul_(factor)
    return {"natural": natural, "target": gap, "factor": factor}


def compose_variant(parts: Parts, variant: Variant, seed: int = 0):
    """(model, processor): the parts composed with ``variant``'s projector norm, projector drawn by ``seed``."""
    from llava_normaligned.compose import compose

    model, processor = compose(parts.vision_dir, parts.text_dir, vision_feature_layer=-1, seed=seed,
                               norm_variant=variant.norm)
    draw_projector(model, seed)
    llm = parts.info.get("llm")
    if llm:  # a real LLM: the composed model names it as its text part (the model card's base model)
        from llava_normaligned.local_paths import public_name

        model.config.text_config.name_or_path = public_name(llm["origin"])
    return model, processor


def stock_llava(model):
    """The same weights in transformers' own ``LlavaForConditionalGeneration`` (the "w/o Norm" architecture)."""
    from llava_normaligned.compose import stock_llava_like

    if getattr(model.config, "projector_norm", None) is not None:
        raise ValueError("stock_llava needs a model without the projector norm (the 'w/o Norm' variant)")
    stock = stock_llava_like(model)
    stock.generation_config = model.generation_config
    return stock.eval()
