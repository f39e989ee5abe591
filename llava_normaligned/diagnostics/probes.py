"""The paper's probes (§4, Appendix C): RQ1 text-embedding and vision-encoder norms, RQ2 norms through the projector,
RQ3 the layer-by-layer dynamics of each modality's hidden states.

Averaging convention (every layer statistic): per sample, the mean over that sample's tokens of one modality; then
the mean over samples, so that each sample weighs the same whatever its length.
"""

from __future__ import annotations

import math

import torch

from llava_normaligned.families.probe_points import ProbePoints
from modeling_llava_normaligned import TEXT_NORM_EPS, embedding_row_norms, text_embedding_norm_target

# vision: image tokens; text: the tokens of the prompt's own text; template: the other non-padding tokens (BOS, chat
# template markers and role names: attention sinks whose norms can dwarf the text's); all: vision + text, the
# tokens whose layer-wide update norm and angle stand for the paper's C and phi (§3.1).
MODALITIES = ("vision", "text", "template", "all")


def _float(x) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


def norm_stats(values: torch.Tensor | None) -> dict | None:
    """mean, std (population), median, min, max and count of a 1-D tensor of norms; None when there are none."""
    if values is None or values.numel() == 0:
        return None
    values = values.float()
    return {
        "mean": float(values.mean()),
        "std": float(values.std(correction=0)),
        "median": float(values.median()),
        "min": float(values.min()),
        "max": float(values.max()),
        "count": int(values.numel()),
    }


# ------------------------------------------------------------------------------------------------------ RQ1


@torch.no_grad()
def text_embedding_norm(points: ProbePoints, tokenizer, top_k: int, eps: float = TEXT_NORM_EPS) -> dict:
    """Statistics of the L2 norms of the LLM's input-embedding rows (paper Table 6) and the top-k rows (Tables 7-8).

    The image token's row is left out: it is never an input (vision features replace it). ``mean``/``std`` are over
    the remaining rows; ``T`` is the mean over those with norm > eps (paper §5.1), the target of the aligned norm,
    computed by the model's own ``text_embedding_norm_target`` (the function ``compose`` sets ``norm_target`` with).
    """
    try:
        target = text_embedding_norm_target(points.embeddings, eps, exclude_token_ids=(points.image_token_id,))
    except ValueError:  # every row is zero: T is undefined
        target = None
    if target is not None:  # Gemma's embed_tokens multiplies its rows by sqrt(D): the text enters the LLM scaled
        target *= points.embed_scale
    summary = embedding_table_stats(points.embeddings, tokenizer, top_k, (points.image_token_id,), eps,
                                    scale=points.embed_scale)
    top = summary.pop("top_k")
    return {
        **{key: summary[key] for key in ("mean", "std")},
        "T": target,
        **summary,
        "config_norm_target": getattr(points.model.config, "norm_target", None),
        "top_k": top,
    }


@torch.no_grad()
def embedding_table_stats(embeddings: torch.Tensor, tokenizer, top_k: int, exclude_token_ids=(),
                          eps: float = TEXT_NORM_EPS, scale: float = 1.0) -> dict:
    """L2 norms of the rows of a (V, D) input-embedding table, ``exclude_token_ids`` left out: mean, std
    (population), median, min, max, counts, and the ``top_k`` largest rows with their token and decoded text (paper
    Appendix C, Tables 6-8). ``scale`` multiplies every norm (an embedding layer that scales its rows, as Gemma's
    does by sqrt(D)). One function for ``diagnose`` and ``diagnose --compare-embeddings``."""
    norms = embedding_row_norms(embeddings).cpu() * scale  # (V,)
    kept = torch.ones_like(norms, dtype=torch.bool)
    excluded = [int(i) for i in exclude_token_ids if i is not None and 0 <= int(i) < norms.numel()]
    kept[excluded] = False
    ids = torch.arange(norms.numel())[kept]
    rows = norms[kept]
    top = []
    for rank, index in enumerate(rows.argsort(descending=True, stable=True)[:top_k].tolist(), 1):
        token_id = int(ids[index])
        known = tokenizer is not None and token_id < len(tokenizer)
        top.append(
            {
                "rank": rank,
                "token_id": token_id,
                "token": tokenizer.convert_ids_to_tokens(token_id) if known else None,
                "text": tokenizer.decode([token_id]) if known else None,
                "norm": float(rows[index]),
            }
        )
    return {
        "mean": float(rows.mean()),
        "std": float(rows.std(correction=0)),
        "median": float(rows.median()),
        "min": float(rows.min()),
        "max": float(rows.max()),
        "num_rows": int(rows.numel()),
        "num_zero_rows": int((rows <= eps).sum()),
        "eps": eps,
        "excluded_token_ids": excluded,
        "hidden_size": int(embeddings.shape[-1]),
        "embed_scale": float(scale),
        "top_k": top,
    }


# ------------------------------------------------------------------------------------------------------ RQ2


def vision_norm(collected: dict[str, list[torch.Tensor]], text_target: float | None) -> dict:
    """Vision-token norm statistics at each stage (see ``ProjectorTap``), each with its ratio to T."""
    result = {}
    for stage, values in collected.items():
        stats = norm_stats(torch.cat(values) if values else None)
        if stats is not None and text_target:
            stats["ratio_to_text"] = stats["mean"] / text_target
        result[stage] = stats
    return result


# ------------------------------------------------------------------------------------------------------ RQ3


def _derived(stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Adds per-token angles in degrees: the rotation of h between layers and the angle phi of the update."""
    out = dict(stats)
    out["rotation_deg"] = torch.rad2deg(torch.arccos(stats["cos_to_prev"].clamp(-1, 1)))
    out["update_angle_deg"] = torch.rad2deg(torch.arccos(stats["update_cos"].clamp(-1, 1)))
    return out


class LayerStats:
    """Accumulates, for each modality, one (L+1,) curve per sample and statistic; summarises them as means.

    Each statistic is the mean over the sample's tokens of that modality; ``norm_median`` is the median of their
    norms instead, which one outlying token (an attention sink) cannot move far."""

    def __init__(self):
        self.curves: dict[str, dict[str, list[torch.Tensor]]] = {m: {} for m in MODALITIES}

    def add(self, stacked: dict[str, torch.Tensor], masks: dict[str, torch.Tensor]):
        """``stacked``: statistic -> (L+1, B, S) from ``ResidualTap``; ``masks``: modality -> (B, S) bool."""
        stacked = _derived(stacked)
        for modality, mask in masks.items():
            for b in range(mask.shape[0]):
                if not mask[b].any():
                    continue
                for name, values in stacked.items():
                    curve = values[:, b, mask[b]].mean(dim=-1)  # (L+1,)
                    self.curves[modality].setdefault(name, []).append(curve)
                median = stacked["norm"][:, b, mask[b]].median(dim=-1).values  # (L+1,)
                self.curves[modality].setdefault("norm_median", []).append(median)

    def mean_curves(self, modality: str) -> dict[str, torch.Tensor]:
        return {name: torch.stack(curves).mean(0) for name, curves in self.curves[modality].items()}

    def summary(self, modalities=("vision", "text", "template")) -> dict:
        result = {}
        for modality in modalities:
            if not self.curves[modality]:
                result[modality] = None
                continue
            result[modality] = {name: [_float(v) for v in curve] for name, curve in self.mean_curves(modality).items()}
            result[modality]["num_samples"] = len(next(iter(self.curves[modality].values())))
        first = next((r for r in result.values() if r), None)
        result["index"] = list(range(len(first["norm"]))) if first else []
        return result


def pearson(a: torch.Tensor, b: torch.Tensor) -> float | None:
    """Pearson correlation of two 1-D curves (NaN entries dropped pairwise); None when it is undefined."""
    a, b = a.double(), b.double()
    keep = ~(a.isnan() | b.isnan())
    a, b = a[keep] - a[keep].mean(), b[keep] - b[keep].mean()
    denominator = (a.norm() * b.norm()).item()
    if a.numel() < 2 or denominator == 0:
        return None
    return float((a * b).sum() / denominator)
