"""What the chat page shows beside an answer: the norms of one image's tokens, read by the diagnostics' own taps.

One teacher-forced pass over the formatted question with its image (``diagnostics.passes.run``) under
``ProjectorTap`` (the image tokens where the LLM receives them) and ``ResidualTap`` (h_0 ... h_L), averaged per
modality by ``diagnostics.probes.LayerStats``:

- the vision/text norm ratio at the LLM input: mean L2 norm of the image tokens there over T, the mean L2 norm of the
  non-zero text-embedding rows (``part_metrics.text_embedding_norm``);
- per layer, for the image tokens and for the question's own text tokens: mean ||h_l|| and cos(h_l, h_{l-1}), the
  paper's Fig. 4 for one image (drawn by ``diagnostics.plots.fig_norms_cosine``).
"""

from __future__ import annotations

import tempfile
import weakref

import torch

from llava_normaligned.diagnostics import passes
from llava_normaligned.diagnostics.family_batches import batches_for
from llava_normaligned.diagnostics.inputs import Sample
from llava_normaligned.diagnostics.probes import LayerStats
from llava_normaligned.diagnostics.taps import ProjectorTap, ResidualTap
from llava_normaligned.families.probe_points import ProbePoints
from llava_normaligned.part_metrics import text_embedding_norm

# the per-layer statistics the page shows (``ResidualTap.STATS``), per modality
SHOWN_STATS = ("norm", "cos_to_prev")
# T of each served model, measured once: the page never trains, and at 3-8B the embedding matrix is 0.5-1 G values
_TEXT_NORMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _text_norm(model) -> float:
    if model not in _TEXT_NORMS:
        _TEXT_NORMS[model] = text_embedding_norm(model)
    return _TEXT_NORMS[model]


@torch.inference_mode()
def image_readings(points: ProbePoints, processor, image_path: str, question: str, model_id: str) -> dict:
    """The norms of ``image_path``'s tokens with ``question``: ``{"model_id", "image_tokens", "image_token_norm",
    "text_embedding_norm", "vision_text_norm_ratio", "layers": {"index", "vision": {...}, "text": {...}}}``, each
    layer curve a list over l = 0..L (None where undefined: cos(h_0, h_{-1}))."""
    model = points.model
    make_batches = batches_for(model.config)
    [batch] = make_batches(processor, model.config, [Sample(image_path, question, 1)], 1, 1, "question")
    with ProjectorTap(points) as projector, ResidualTap(points) as residual:
        passes.run(model, batch.inputs, logits_to_keep=1)
    llm_input = projector.norms("llm_input")
    if llm_input is None or llm_input.numel() == 0:
        raise ValueError("no image token reached the language model: cannot read the image's norms")
    stats = LayerStats()
    stats.add(residual.stacked(), {"vision": batch.image_mask, "text": batch.text_mask})
    layers = stats.summary(modalities=("vision", "text"))
    target = _text_norm(model)
    image_norm = float(llm_input.mean())
    return {
        "model_id": model_id,
        "image_tokens": int(llm_input.numel()),
        "image_token_norm": image_norm,
        "text_embedding_norm": target,
        "vision_text_norm_ratio": image_norm / target,
        "layers": {
            "index": layers["index"],
            **{modality: ({name: layers[modality][name] for name in SHOWN_STATS} if layers.get(modality) else None)
               for modality in ("vision", "text")},
        },
    }


def figure(readings: dict, folder: str) -> str:
    """The paper's Fig. 4 for this image (``diagnostics.plots.fig_norms_cosine``): a PNG in a new folder under
    ``folder``, written once (the page serves it while later answers are drawn); returns its path."""
    from llava_normaligned.diagnostics.plots import fig_norms_cosine

    return fig_norms_cosine(readings, tempfile.mkdtemp(prefix="fig-", dir=folder))


def summary_line(readings: dict) -> str:
    """One line for the page: the ratio and what it is made of."""
    return (f"vision/text norm ratio at the LLM input: **{readings['vision_text_norm_ratio']:.3g}** "
            f"(mean L2 norm of the {readings['image_tokens']} image tokens {readings['image_token_norm']:.4g}, "
            f"text-embedding norm T {readings['text_embedding_norm']:.4g})")


__all__ = ["SHOWN_STATS", "figure", "image_readings", "summary_line"]
