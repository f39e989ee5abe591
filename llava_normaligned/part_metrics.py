"""Measurements of a model's parts (vision tower, projector, its norm, the LLM) that training logs and the demo
report: the text-embedding norm T and the projected image tokens' norm, their ratio on a batch, each part's
parameters, gradient norm and update size, the projector norm's Table 5 statistics, the gradient-clipping factor.

Used by the trainer's norm tracking (`trainer/callbacks.py`) and the demo; works under FSDP2 (DTensor parameters are
gathered whole) and returns nothing for the norm under ZeRO-3 (partitioned away).
"""

from __future__ import annotations

import math

import torch

from llava_normaligned.families.anatomy import anatomy_of, projector_norm_of, strip_wrappers


def text_embedding_norm(model) -> float:
    """Measures T (paper §5.1) as the LLM receives text (`Anatomy.text_norm_target`: the placeholder tokens'
    rows left out, Gemma's embedding scale counted).

    Falls back to the config's `norm_target` (T when the model was composed or aligned) when the embeddings are sharded
    (ZeRO-3, FSDP), empty, not 2-D or on the meta device.

    Args:
        model (`torch.nn.Module`):
            A vision-language model of a family this package knows, plain or wrapped.

    Returns:
        `float`: T.

    Raises:
        `ValueError`: If the embeddings cannot be read here and the config has no `norm_target`, or the model's parts
        cannot be found (`AnatomyError`).
    """
    anatomy = anatomy_of(model)
    weight = anatomy.input_embeddings.weight
    sharded = hasattr(weight, "full_tensor") or weight.numel() == 0
    if sharded or weight.ndim != 2 or weight.device.type == "meta":
        target = getattr(anatomy.config, "norm_target", None)
        if target is None:
            raise ValueError("the text embeddings are not materialised here and the config has no norm_target")
        return float(target)
    return anatomy.text_norm_target(weight)


@torch.no_grad()
def projected_image_norm(model, pixel_values: torch.Tensor) -> float:
    """Measures the mean L2 norm of the projected image tokens, the LLM's image inputs.

    Runs the base model's `get_image_features` only (vision tower and projector), without gradients and in eval mode
    (the previous mode is restored), with the config's `vision_feature_layer` and `vision_feature_select_strategy`.

    Args:
        model (`torch.nn.Module`):
            A LLaVA-style model, plain or wrapped.
        pixel_values (`torch.Tensor` of shape `(num_images, num_channels, height, width)`):
            The images; moved to the vision tower's device and dtype.

    Returns:
        `float`: The mean, over every projected image token, of its L2 norm.
    """
    anatomy = anatomy_of(model)
    base = anatomy.base
    config = base.config
    was_training = base.training
    base.eval()
    try:
        param = next(anatomy.vision_tower.parameters())
        features = base.get_image_features(
            pixel_values=pixel_values.to(device=param.device, dtype=param.dtype),
            vision_feature_layer=config.vision_feature_layer,
            vision_feature_select_strategy=config.vision_feature_select_strategy,
        )
        features = getattr(features, "pooler_output", features)  # transformers 5: list of (N_i, D) per image
        tokens = torch.cat([f.reshape(-1, f.shape[-1]) for f in features], dim=0)  # (sum N_i, D)
        return float(tokens.float().norm(dim=-1).mean())
    finally:
        base.train(was_training)


def vision_text_norm_ratio(model, batch) -> dict:
    """Measures the vision/text norm ratio at the LLM input, for the images of a batch.

    Args:
        model (`torch.nn.Module`):
            A LLaVA (norm-aligned or stock; plain, PEFT-wrapped or DDP-wrapped).
        batch (`dict` or `torch.Tensor`):
            A collated batch (a dict with `pixel_values`) or a `pixel_values` tensor of shape
            `(num_images, num_channels, height, width)`.

    Returns:
        `dict[str, float]`: `projector_output_norm` (the mean L2 norm of the projected image tokens),
        `text_embedding_norm` (T, paper §5.1) and `vision_text_ratio`, their ratio (1 = aligned; the paper's problem is
        >> 1).

    Raises:
        `ValueError`: If the batch's `pixel_values` is `None`.
    """
    pixel_values = batch["pixel_values"] if isinstance(batch, dict) else batch
    if pixel_values is None:
        raise ValueError("vision_text_norm_ratio needs a batch with images (pixel_values)")
    image_norm = projected_image_norm(model, pixel_values)
    text_norm = text_embedding_norm(model)
    return {"projector_output_norm": image_norm, "text_embedding_norm": text_norm,
            "vision_text_ratio": image_norm / text_norm}


def part_parameters(model) -> dict[str, list[tuple[str, torch.nn.Parameter]]]:
    """Groups a model's parameters by part.

    Args:
        model (`torch.nn.Module`):
            The model, plain or wrapped.

    Returns:
        `dict[str, list[tuple[str, torch.nn.Parameter]]]`: `{part: [(name, parameter), ...]}` for the parts
        `vision_tower`, `projector` (without its norm), `projector_norm` and `llm`; parameters of no part, and parts
        without parameters, are left out.
    """
    anatomy = anatomy_of(model)
    norm = anatomy.projector_norm
    norm_ids = {id(p) for p in norm.parameters()} if norm is not None else set()
    norm_names = {strip_wrappers(n) for n, p in model.named_parameters() if id(p) in norm_ids}
    parts: dict[str, list] = {}
    for name, param in model.named_parameters():
        part = anatomy.part_of(name)
        if part is None:
            continue
        if part == "projector" and norm_names and strip_wrappers(name) in norm_names:
            part = "projector_norm"
        parts.setdefault(part, []).append((name, param))
    return parts


def clip_coefficient(total_norm: float, max_grad_norm: float | None) -> float:
    """Computes the factor by which `torch.nn.utils.clip_grad_norm_` (the Trainer's clipping) scales every gradient.

    Args:
        total_norm (`float`):
            The total gradient norm before clipping.
        max_grad_norm (`float` or `None`):
            The clipping threshold; `None` or <= 0 means no clipping.

    Returns:
        `float`: `min(1, max_grad_norm / (total_norm + 1e-6))`; 1.0 when clipping is off.
    """
    if not max_grad_norm or max_grad_norm <= 0:
        return 1.0
    return min(1.0, float(max_grad_norm) / (float(total_norm) + 1e-6))


@torch.no_grad()
def part_gradient_norms(model) -> dict[str, float]:
    """Measures the L2 norm of the current gradients of each part.

    `train_stage`'s trainer calls it just before gradient clipping, so these are the pre-clip sizes (the Trainer's own
    `grad_norm` is their root sum of squares). Under FSDP2 the per-tensor sums are reduced across ranks (a collective:
    every rank calls it alike); under ZeRO the gradients are not held in `.grad` and nothing is found.

    Args:
        model (`torch.nn.Module`):
            The model, plain or wrapped.

    Returns:
        `dict[str, float]`: The gradient norm of `vision_tower`, `projector` (its linear layers), `projector_norm` (the
        norm's gain and bias) and `llm`; parts without gradients are left out.
    """
    squares: dict[str, torch.Tensor] = {}
    for part, params in part_parameters(model).items():
        for _, param in params:
            if param.grad is None:
                continue
            square = param.grad.detach().float().pow(2).sum()
            if hasattr(square, "full_tensor"):  # a DTensor partial sum (FSDP2)
                square = square.full_tensor()
            squares[part] = square if part not in squares else squares[part] + square
    return {part: float(total.sqrt()) for part, total in squares.items()}  # one host sync per part


@torch.no_grad()
def update_sizes(before: dict[str, list[tuple[torch.Tensor, torch.Tensor]]]) -> dict[str, float]:
    """Measures the relative size of an optimizer step per part, `||theta_after - theta_before|| / ||theta_before||`.

    Args:
        before (`dict[str, list[tuple[torch.Tensor, torch.Tensor]]]`):
            `{part: [(copy_before, param), ...]}`: a copy of each parameter taken before the step, and the parameter,
            read now (after the step; gathered whole under FSDP2, a collective).

    Returns:
        `dict[str, float]`: The relative update of each part; a part whose parameters were all zero gets `inf` if it
        moved, else 0.0.
    """
    sizes = {}
    for part, pairs in before.items():
        moved = sum(float((whole_tensor(p.detach()).float() - old.float()).pow(2).sum()) for old, p in pairs)
        size = sum(float(old.float().pow(2).sum()) for old, _ in pairs)
        sizes[part] = math.sqrt(moved / size) if size > 0 else (math.inf if moved > 0 else 0.0)
    return sizes


def whole_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Gathers a DTensor (FSDP2) whole; a plain tensor is returned as it is. Collective: call it on every rank alike.

    Args:
        tensor (`torch.Tensor`):
            A tensor or a DTensor.

    Returns:
        `torch.Tensor`: The whole tensor.
    """
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


@torch.no_grad()
def gain_statistics(model) -> dict:
    """Computes paper Table 5's statistics of a model's projector norm (`modeling_llava_normaligned.gain_statistics`).

    Args:
        model (`torch.nn.Module`):
            The model, plain or wrapped.

    Returns:
        `dict[str, float]`: The statistics, with `gwc_factor` when GWC is on; empty for a model without the norm, and
        under ZeRO-3, where the parameters are partitioned away.
    """
    from modeling_llava_normaligned import gain_statistics as table5

    norm = projector_norm_of(model)
    if norm is None or getattr(norm, "weight", None) is None or norm.weight.numel() == 0:
        return {}
    compensation_min = float(norm.compensation_min) if getattr(norm, "compensation", False) else None
    return table5(whole_tensor(norm.weight.detach()), whole_tensor(norm.bias.detach()), compensation_min)
