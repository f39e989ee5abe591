"""Pre-train the CPU demo's tiny vision encoder on the synthetic images, so it starts out useful, like SigLIP.

A randomly initialised tiny vision tower gives a LLaVA nothing worth reading in the minutes a CPU demo has: a tiny
LLaVA trained on it learns the question templates' answer priors and nothing from the image (STACK-NOTES "Tiny VLMs
on CPU"). Real LLaVAs start from a contrastively pre-trained encoder. The stand-in here is a few seconds of
supervised pre-training on scenes of the training partition (``synthetic.is_test_scene`` is False): a linear head
on each grid cell's patch tokens predicts what the cell holds (empty, or one of 4 colours x 4 kinds).

The head reads the encoder's last hidden state *before* its post-layernorm, the residual stream LLaVA takes
(``vision_feature_layer=-1`` in the demo), through a LayerNorm of its own that is thrown away afterwards. That
residual stream is where the paper's norm gap comes from: pre-norm transformers let it grow, and nothing ties its
norm to the LLM's embeddings (paper RQ1: vision outputs 29-72 against text embeddings 0.8-1.4). ``feature_norms``
measures it.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from llava_normaligned.tiny import TinyVisionSpec, tiny_vision_model

from . import synthetic

N_CELLS = 4
N_CELL_CLASSES = 1 + len(synthetic.COLOURS) * len(synthetic.KINDS)  # empty + colour x kind


@dataclass
class VisionPretrainConfig:
    """How long and on what the tiny vision encoder is pre-trained."""

    num_scenes: int = 4096  # distinct training-partition scenes rendered once
    steps: int = 300
    batch_size: int = 64
    learning_rate: float = 2e-3
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------------- data


def _cell_label(shape) -> int:
    if shape is None:
        return 0
    colour = list(synthetic.COLOURS).index(shape.colour)
    kind = synthetic.KINDS.index(shape.kind)
    return 1 + colour * len(synthetic.KINDS) + kind


def random_scenes(num_scenes: int, jitter: int, seed: int, split: str = "train") -> list:
    """``num_scenes`` random scenes (0-4 shapes), all from ``split``'s partition (``synthetic.is_test_scene``)."""
    rng = random.Random(seed)
    scenes = []
    while len(scenes) < num_scenes:
        cells = synthetic.fill_cells(rng, {}, count=rng.randint(0, N_CELLS))
        scene = synthetic.Scene(tuple(cells), synthetic.random_offsets(rng, jitter))
        if synthetic.is_test_scene(scene.key()) == (split == "test"):
            scenes.append(scene)
    return scenes


def render_batch(scenes, image_size: int, image_processor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel values (N, 3, S, S) through the encoder's own image processor, and cell labels (N, 4)."""
    images = [synthetic.render(scene, image_size) for scene in scenes]
    pixels = image_processor(images=images, return_tensors="pt")["pixel_values"]
    labels = torch.tensor([[_cell_label(s) for s in scene.cells] for scene in scenes])
    return pixels, labels


# ---------------------------------------------------------------------------------------------------- model


class CellHead(nn.Module):
    """Pools the patch tokens of each 2x2-grid cell and classifies the cell (trained with the encoder, then dropped)."""

    def __init__(self, hidden_size: int, patches_per_side: int):
        super().__init__()
        if patches_per_side % 2:
            raise ValueError(f"the image must hold an even number of patches per side, got {patches_per_side}")
        self.patches_per_side = patches_per_side
        self.norm = nn.LayerNorm(hidden_size)
        self.classify = nn.Linear(hidden_size, N_CELL_CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, P*P, D) -> (B, 4, classes)
        b, _, d = tokens.shape
        h = self.patches_per_side // 2  # patches per cell side
        grid = tokens.view(b, 2, h, 2, h, d)  # (B, cell row, patch row, cell col, patch col, D)
        cells = grid.mean(dim=(2, 4)).reshape(b, N_CELLS, d)  # (B, 4, D) in reading order
        return self.classify(self.norm(cells))


def encoder_features(vision_model, pixel_values: torch.Tensor, layer: int = -1) -> torch.Tensor:
    """hidden_states[layer] of the encoder: the residual stream, before the post-layernorm (what LLaVA reads)."""
    out = vision_model(pixel_values=pixel_values, output_hidden_states=True)
    return out.hidden_states[layer]  # (B, N_patches, D)


@torch.no_grad()
def feature_norms(vision_model, pixel_values: torch.Tensor, layer: int = -1) -> float:
    """Mean L2 norm of the encoder's output tokens at ``layer`` (the paper's RQ1 measurement)."""
    was_training = vision_model.training
    vision_model.eval()
    try:
        return float(encoder_features(vision_model, pixel_values, layer).float().norm(dim=-1).mean())
    finally:
        vision_model.train(was_training)


@dataclass
class VisionPretrainResult:
    model: object
    image_processor: object
    cell_accuracy: float  # on held-out test-partition scenes
    feature_norm_before: float
    feature_norm_after: float
    seconds: float
    losses: list


def pretrain_vision(
    spec: TinyVisionSpec, config: VisionPretrainConfig, jitter: int = 1, progress: bool = True
) -> VisionPretrainResult:
    """Build a tiny vision encoder (``tiny.tiny_vision_model``) and pre-train it on per-cell classification."""
    import time

    start = time.perf_counter()
    torch.manual_seed(config.seed)
    model, image_processor = tiny_vision_model(spec, seed=config.seed)
    patches_per_side = spec.image_size // spec.patch_size
    head = CellHead(spec.hidden_size, patches_per_side)
    pixels, labels = render_batch(random_scenes(config.num_scenes, jitter, config.seed), spec.image_size,
                                  image_processor)
    test_pixels, test_labels = render_batch(random_scenes(512, jitter, config.seed + 1, split="test"),
                                            spec.image_size, image_processor)
    norm_before = feature_norms(model, test_pixels)

    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
    warmup = max(1, config.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(step, config.steps) / config.steps)),
    )
    generator = torch.Generator().manual_seed(config.seed)
    losses = []
    model.train()
    for _ in tqdm(range(config.steps), desc="vision pre-training", unit="step", disable=not progress):
        index = torch.randint(0, pixels.shape[0], (config.batch_size,), generator=generator)
        logits = head(encoder_features(model, pixels[index]))  # (B, 4, classes)
        loss = nn.functional.cross_entropy(logits.reshape(-1, N_CELL_CLASSES), labels[index].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        predicted = head(encoder_features(model, test_pixels)).argmax(-1)
    accuracy = float((predicted == test_labels).float().mean())
    return VisionPretrainResult(
        model=model,
        image_processor=image_processor,
        cell_accuracy=accuracy,
        feature_norm_before=norm_before,
        feature_norm_after=feature_norms(model, test_pixels),
        seconds=time.perf_counter() - start,
        losses=losses,
    )

