"""What each LLaVA-1.5 stage trains, and at which learning rate (paper §5.2, Appendix E.1).

* Stage 1 (feature alignment, LLaVA-558K): vision tower and LLM frozen; the projector and its norm train.
* Stage 2 (instruction tuning): everything trains, with one learning rate per part: LLM 1e-5, vision tower 2e-6 in
  the paper; the projector's defaults to the LLM's.

Works on stock ``LlavaForConditionalGeneration``, on the norm-aligned model, on a stock VLM of another family with
the aligned norm (``llava-normaligned align``: the norm is the connector's, and trains with it) and on any of them
wrapped by PEFT; the parts are the family's (``families.anatomy``). Freezing
is by ``requires_grad`` only: a frozen part computes no weight gradient, and in stage 1 no autograd graph is built
through the vision tower at all (nothing in it requires grad).

Vision-tower parameters that LLaVA's forward never uses (the layers after ``vision_feature_layer``, the post
layernorm and SigLIP's pooling head) stay frozen in every stage: they would get no gradient, and DDP would wait for
it. A family whose connector reads the tower's last output (``Family.vision_output``: Idefics3, Qwen-VL, Gemma3)
uses every vision parameter but a pooling head.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

# PARTS and part_of: callers import them from here too
from llava_normaligned.families.anatomy import PARTS, anatomy_of, base_model, part_of

logger = logging.getLogger(__name__)

# Optimizer group order: the Trainer logs the first group's rate as `learning_rate`, which should be the LLM's.
GROUP_ORDER = ("llm", "projector", "vision_tower")


llava_base = base_model  # the base model inside a wrapped model (``llava_normaligned.families.anatomy``)


def vision_encoder_layers(model):
    """``(encoder owner, layers)`` of a LLaVA's vision tower (``layers`` is ``None`` for a tower of another shape)."""
    tower = anatomy_of(model).vision_tower
    owner = getattr(tower, "vision_model", tower)
    return owner, getattr(getattr(owner, "encoder", None), "layers", None)


def deepest_feature_layer(vision_feature_layer, num_layers: int) -> int:
    """How many encoder layers LLaVA's image features depend on: the deepest ``hidden_states[k]`` it reads.

    ``hidden_states[k]`` is the output of layer ``k - 1`` (``hidden_states[0]``: the embeddings), so layers
    ``k ..`` run for nothing. ``vision_feature_layer``: an int or a list (negative counts from the end).
    """
    layers = [vision_feature_layer] if isinstance(vision_feature_layer, int) else list(vision_feature_layer)
    return max(f if f >= 0 else num_layers + 1 + f for f in layers)


def unused_vision_parameters(model) -> list[str]:
    """Names of vision-tower parameters LLaVA's forward never uses: encoder layers after the deepest feature layer,
    the post layernorm and the pooling head (LLaVA reads ``hidden_states[vision_feature_layer]``). Only the pooling
    head for a family whose connector reads the tower's last output (``Family.vision_output``: Gemma3's SigLIP)."""
    anatomy = anatomy_of(model)
    _, layers = vision_encoder_layers(model)
    unused_prefixes = [".head."]  # SigLIP's pooling head: no connector reads its pooled output
    if anatomy.family.vision_output == "hidden_states":
        unused_prefixes.append(".post_layernorm.")
        if layers is not None:
            deepest = deepest_feature_layer(anatomy.config.vision_feature_layer, len(layers))
            unused_prefixes += [f".encoder.layers.{i}." for i in range(deepest, len(layers))]
    tower = anatomy.family.vision_tower.rpartition(".")[2] + "."
    names = []
    for name, _ in model.named_parameters():
        if anatomy.part_of(name) != "vision_tower":
            continue
        tail = "." + name.split(tower, 1)[1]
        if any(p in tail for p in unused_prefixes):
            names.append(name)
    return names


@dataclass
class FreezeReport:
    """Parameter counts per part: trainable / total, and the names frozen because LLaVA never uses them."""

    stage: int
    trainable: dict
    total: dict
    never_used: list

    def lines(self) -> list[str]:
        out = []
        for part in PARTS:
            state = "trains" if self.trainable.get(part, 0) else "frozen"
            out.append(f"{part:>12}: {state:6} ({self.trainable.get(part, 0):,} of {self.total.get(part, 0):,} params)")
        if self.never_used:
            out.append(f"{'':>12}  {len(self.never_used)} vision tensors never used by LLaVA stay frozen")
        return out

    def to_dict(self) -> dict:
        return {"stage": self.stage, "trainable_params": self.trainable, "total_params": self.total,
                "frozen_never_used": self.never_used}


def _count(model) -> tuple[dict, dict]:
    part_of_name = anatomy_of(model).part_of
    trainable, total = dict.fromkeys(PARTS, 0), dict.fromkeys(PARTS, 0)
    for name, param in model.named_parameters():
        part = part_of_name(name)
        if part is None:
            continue
        total[part] += param.numel()
        if param.requires_grad:
            trainable[part] += param.numel()
    return trainable, total


def _freeze(model, stage: int, trains: set[str], keep_peft_choice: bool) -> FreezeReport:
    never_used = set(unused_vision_parameters(model))
    anatomy = anatomy_of(model)
    part_of_name = anatomy.part_of
    for name, param in model.named_parameters():
        if keep_peft_choice:
            # PEFT chose what trains (adapters, modules_to_save copies; the originals stay frozen): keep it, within
            # the parts that train in this stage.
            param.requires_grad_(param.requires_grad and name not in never_used and part_of_name(name) in trains)
            continue
        wanted = part_of_name(name) in trains and name not in never_used
        if not (param.is_floating_point() or param.is_complex()):
            wanted = False  # quantized storage cannot take gradients
        param.requires_grad_(wanted)
    trainable, total = _count(model)
    report = FreezeReport(stage, trainable, total, sorted(never_used))
    logger.info("stage %d: what trains\n  %s", stage, "\n  ".join(report.lines()))
    if keep_peft_choice and not trainable["projector"]:
        raise ValueError(
            f"PEFT left the projector frozen: add {anatomy.family.projector_module_name!r} to the LoRA config's "
            "modules_to_save (lora.py's stage2_lora_config does) so the projector and its norm train fully and are "
            "saved"
        )
    return report


def _is_peft(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def freeze_stage1(model) -> FreezeReport:
    """Stage 1 (feature alignment): the projector and its norm train; vision tower and LLM are frozen."""
    if _is_peft(model):
        raise ValueError("stage 1 trains the projector fully; LoRA/QLoRA (use_peft) is for stage 2")
    return _freeze(model, 1, {"projector"}, keep_peft_choice=False)


def freeze_stage2(model, train_vision: bool | None = None) -> FreezeReport:
    """Stage 2 (instruction tuning): the LLM, the vision tower and the projector with its norm train.

    ``train_vision``: ``None`` (default): the vision tower trains (the paper), or under PEFT as the LoRA config says
    (adapters on it or not); ``False``: it stays frozen (its adapters too); ``True``: it trains, and under PEFT the
    LoRA config must put adapters on it (``lora.stage2_lora_config(..., lora_vision=True)``), else ``ValueError``.
    Under PEFT the adapters train in the LLM (and vision tower) and the projector trains fully.
    """
    peft = _is_peft(model)
    trains = {"llm", "projector"} | ({"vision_tower"} if train_vision is not False else set())
    report = _freeze(model, 2, trains, keep_peft_choice=peft)
    if peft and train_vision and not report.trainable["vision_tower"]:
        raise ValueError(
            "train_vision=True under PEFT, but the LoRA config puts no adapter on the vision tower: add them "
            "(--lora-vision; lora.stage2_lora_config(..., lora_vision=True)) or leave train_vision unset"
        )
    return report


def freeze_for_stage(model, stage: int, *, train_vision: bool | None = None) -> FreezeReport:
    """Apply stage 1's or stage 2's freezing (see ``freeze_stage1`` / ``freeze_stage2``) and log what trains.
    ``train_vision`` is a stage-2 option; stage 1 keeps the vision tower frozen (paper §5.2)."""
    if stage == 1:
        if train_vision:
            raise ValueError("train_vision: stage 1 keeps the vision tower frozen (paper §5.2); it is a stage-2 option")
        return freeze_stage1(model)
    if stage == 2:
        return freeze_stage2(model, train_vision=train_vision)
    raise ValueError(f"stage must be 1 or 2, got {stage!r}")


# --------------------------------------------------------------------------------------- learning-rate groups


@dataclass
class StageLearningRates:
    """Learning rate per part; ``None`` falls back to the run's ``learning_rate`` (the projector's to the LLM's)."""

    projector: float | None = None
    llm: float | None = None
    vision_tower: float | None = None

    def resolved(self, base: float) -> dict[str, float]:
        llm = base if self.llm is None else self.llm
        return {
            "llm": llm,
            "vision_tower": base if self.vision_tower is None else self.vision_tower,
            "projector": llm if self.projector is None else self.projector,
        }


def _is_no_decay(name: str, param: torch.nn.Parameter, decay_names: set[str] | None) -> bool:
    if decay_names is not None:
        return name not in decay_names
    return param.ndim < 2  # biases and norm gains


def parameter_groups(
    model,
    lrs: dict[str, float],
    weight_decay: float,
    decay_names: set[str] | None = None,
) -> list[dict]:
    """Optimizer parameter groups: one per (part, decay / no decay) that has trainable parameters.

    Each group carries ``lr``, ``weight_decay`` and a ``name`` (``"projector"``, ``"llm/no_decay"``, ...), so the
    schedule scales every part's rate alike and logs can tell them apart. ``decay_names``: the Trainer's
    ``get_decay_parameter_names`` (biases and norm weights excluded); ``None``: decay every matrix.
    """
    buckets: dict[tuple[str, bool], list] = {}
    part_of_name = anatomy_of(model).part_of
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        part = part_of_name(name)
        if part is None:
            raise ValueError(f"trainable parameter {name!r} belongs to no known part (vision_tower, projector, llm)")
        buckets.setdefault((part, _is_no_decay(name, param, decay_names)), []).append(param)
    groups = []
    for part in GROUP_ORDER:
        for no_decay in (False, True):
            params = buckets.get((part, no_decay))
            if params:
                groups.append({
                    "params": params,
                    "lr": lrs[part],
                    "weight_decay": 0.0 if no_decay else weight_decay,
                    "name": f"{part}/no_decay" if no_decay else part,
                })
    if not groups:
        raise ValueError("no trainable parameters: check the stage's freezing")
    return groups


__all__ = [
    "PARTS",
    "FreezeReport",
    "StageLearningRates",
    "deepest_feature_layer",
    "freeze_for_stage",
    "freeze_stage1",
    "freeze_stage2",
    "llava_base",
    "parameter_groups",
    "part_of",
    "unused_vision_parameters",
    "vision_encoder_layers",
]
