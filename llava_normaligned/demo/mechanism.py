"""The paper's mechanism in the demo's trained models: per LLM layer and modality, ``||h_l||`` and
``cos(h_l, h_{l-1})`` (Fig. 4 (a) and (b); RQ3's representational inertia), through the diagnostics' own residual tap
and per-layer statistics (``llava_normaligned.diagnostics``: ``ResidualTap`` + ``LayerStats``), on a fixed batch of
test questions with their images.

Vision tokens are the image-token positions; text tokens every other non-padding position of the prompt (the chat
template's tokens included). Each statistic is the mean over a sample's tokens of that modality, then over samples.
"""

from __future__ import annotations

import torch

MODALITIES = ("vision", "text")
CURVES = ("norm", "cos_to_prev")


@torch.no_grad()
def layer_profile(model, processor, rows, n: int) -> dict:
    """``{"layers": [0..L], "vision": {"norm": [...], "cos_to_prev": [...]}, "text": {...}}`` for the first ``n``
    test rows (layer 0: the LLM's input; ``cos_to_prev`` is None there)."""
    from llava_normaligned.diagnostics.probes import LayerStats
    from llava_normaligned.diagnostics.taps import ResidualTap
    from llava_normaligned.families.probe_points import locate
    from llava_normaligned.generation import prepare_inputs

    rows = rows[:n]
    points = locate(model)
    was_training = model.training
    model.eval()
    try:
        inputs = prepare_inputs(model, processor, [r.question for r in rows], [[r.image_path] for r in rows])
        with ResidualTap(points) as tap:
            model(**inputs)
        stacked = tap.stacked()
    finally:
        model.train(was_training)
    ids = inputs["input_ids"]
    vision = ids == points.image_token_id
    text = inputs["attention_mask"].bool() & ~vision
    stats = LayerStats()
    stats.add(stacked, {"vision": vision, "text": text})
    summary = stats.summary(MODALITIES)
    return {"layers": summary["index"],
            **{m: {c: summary[m][c] for c in CURVES} for m in MODALITIES}}


def mean_profiles(profiles: list[dict]) -> dict:
    """The mean over seeds of ``layer_profile`` results (entries that are None stay None)."""
    out = {"layers": profiles[0]["layers"]}
    for modality in MODALITIES:
        out[modality] = {}
        for curve in CURVES:
            columns = zip(*(p[modality][curve] for p in profiles))
            out[modality][curve] = [None if any(v is None for v in col) else sum(col) / len(col) for col in columns]
    return out
