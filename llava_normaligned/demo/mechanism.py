"""The paper's mechanism in the demo's models, per LLM layer: the norms and directions of each token group's hidden
states (Fig. 4 (a) and (b); RQ3's representational inertia) and the attention the question pays to the image (the
paper's cross-modal claim), on a fixed batch of test questions with their images, at init and after training.

Token groups (``diagnostics.inputs``' split, with the sink apart):

* ``vision``: the image-token positions;
* ``question``: the tokens of the question's own text (found by character offsets);
* ``template``: the chat template's other tokens (role names, markers, newlines);
* ``sink``: each row's first token (BOS or the first template marker), where real LLMs put their attention sink and
  whose norm can dwarf the rest;
* ``text``: every non-image, non-padding token (question, template and sink together), as the committed runs
  measured it before the split.

Curves per group (``diagnostics``' residual tap): ``norm`` (mean over a row's tokens, then over rows),
``norm_median`` (the median over a row's tokens, then the mean over rows), ``cos_to_prev`` (cos(h_l, h_{l-1})) and
``cos_to_layer0`` (the blog's cumulative cos(h_l, h_0)). ``attention_to_image``: per layer, the attention mass the
question's tokens put on the image tokens (summed over image keys, averaged over heads, question tokens and rows),
read with eager attention.
"""

from __future__ import annotations

import torch

MODALITIES = ("vision", "text")  # the groups every recorded profile has (runs before the split have only these)
GROUPS = ("vision", "question", "template", "sink", "text")
CURVES = ("norm", "norm_median", "cos_to_prev", "cos_to_layer0")


@torch.no_grad()
def layer_profile(model, processor, rows, n: int) -> dict:
    """``{"layers": [0..L], group: {curve: [...]} for each of GROUPS, "attention_to_image": [...]}`` for the first
    ``n`` test rows (layer 0: the LLM's input; ``cos_to_prev`` is None there; ``attention_to_image`` has one value per
    decoder layer, 1..L)."""
    from llava_normaligned.diagnostics.inputs import prompt_text_mask
    from llava_normaligned.diagnostics.probes import LayerStats
    from llava_normaligned.diagnostics.taps import ResidualTap, eager_attention
    from llava_normaligned.families.probe_points import locate
    from llava_normaligned.generation import prepare_inputs, render_prompt

    rows = rows[:n]
    points = locate(model)
    questions = [r.question for r in rows]
    was_training = model.training
    model.eval()
    try:
        inputs = prepare_inputs(model, processor, questions, [[r.image_path] for r in rows])
        with eager_attention(model), ResidualTap(points) as tap:
            output = model(**inputs, output_attentions=True)
        stacked = tap.stacked()
    finally:
        model.train(was_training)
    ids = inputs["input_ids"].cpu()
    valid = inputs["attention_mask"].bool().cpu()
    vision = ids == points.image_token_id
    texts = [render_prompt(processor, q, 1, None) for q in questions]
    question, rule = prompt_text_mask(processor, texts, questions, {"input_ids": ids, "attention_mask": valid.long()},
                                      points.image_token_id)
    question = question & ~vision
    sink = torch.zeros_like(valid)
    sink[torch.arange(ids.shape[0]), valid.long().argmax(dim=1)] = True  # left-padded: each row's first real token
    question = question & ~sink
    text = valid & ~vision
    masks = {"vision": vision, "question": question, "template": text & ~question & ~sink, "sink": sink, "text": text}
    stats = LayerStats()
    stats.curves.update({group: {} for group in GROUPS})
    stats.add(stacked, masks)
    summary = stats.summary(GROUPS)
    profile = {"layers": summary["index"], "question_rule": rule}
    for group in GROUPS:
        profile[group] = None if summary[group] is None else {c: summary[group][c] for c in CURVES}
    profile["attention_to_image"] = attention_to_image(output.attentions, question, vision)
    return profile


def attention_to_image(attentions, queries: torch.Tensor, keys: torch.Tensor) -> list[float | None]:
    """Per layer, the attention mass from the ``queries`` positions to the ``keys`` positions: for each row, the
    probabilities on its key positions summed, averaged over heads and its query positions; then averaged over rows
    that have both. ``attentions``: one (B, H, S, S) tensor per layer; the masks (B, S) bool."""
    out = []
    for layer in attentions or ():
        if layer is None:
            out.append(None)
            continue
        per_row = []
        for b in range(layer.shape[0]):
            if not queries[b].any() or not keys[b].any():
                continue
            mass = layer[b].float().cpu()[:, queries[b]][:, :, keys[b]].sum(dim=-1)  # (H, Q)
            per_row.append(float(mass.mean()))
        out.append(sum(per_row) / len(per_row) if per_row else None)
    return out


def mean_profiles(profiles: list[dict]) -> dict:
    """The mean over seeds of ``layer_profile`` results (entries that are None stay None; groups and curves a
    profile lacks, as runs recorded before them do, are left out)."""
    out = {"layers": profiles[0]["layers"]}
    for group in GROUPS:
        if not all(p.get(group) for p in profiles):
            continue
        out[group] = {}
        for curve in CURVES:
            if not all(curve in p[group] for p in profiles):
                continue
            out[group][curve] = _mean_columns(p[group][curve] for p in profiles)
    if all(p.get("attention_to_image") for p in profiles):
        out["attention_to_image"] = _mean_columns(p["attention_to_image"] for p in profiles)
    return out


def _mean_columns(curves) -> list[float | None]:
    return [None if any(v is None for v in column) else sum(column) / len(column) for column in zip(*curves)]
