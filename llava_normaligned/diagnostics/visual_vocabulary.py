"""RQ4 of the paper: the norm gap in a model whose visual tokens are probabilistic (Ovis: a visual embedding table).

Ovis's vision tower ends in a head that gives each visual token a distribution p over a visual vocabulary of V rows;
the token entering the LLM is the expectation of the table's rows under p, e = p @ W (W: (V, D)). Its norm is bounded
by the rows' norms: ||p @ W|| <= sum_i p_i ||W_i||, with equality only for a one-hot p. So the softer p is, the more
the rows average out and the shorter the vision token; a sharp p gives a token as long as a table row. Per visual
token (image tokens only; the indicator tokens are table rows by id):

    entropy          H(p) = -sum_i p_i log p_i (nats); effective_vocabulary = exp(H)
    max_prob         max_i p_i
    embedding_norm   ||p @ W||: the vision token as it enters the LLM
    expected_row_norm sum_i p_i ||W_i||
    mixing_ratio     ||p @ W|| / sum_i p_i ||W_i|| (1 for a one-hot p; the averaging's shrinkage)

and of the table: the norms of its visual rows and of its indicator rows, each against the text's T.
"""

from __future__ import annotations

import torch

from llava_normaligned.families.probe_points import ProbePoints

from . import passes
from .probes import norm_stats

EPS = 1e-12


class VisualVocabularyTap:
    """Reads the distributions the visual embedding table is applied to (float inputs; id lookups are skipped)."""

    STATS = ("entropy", "max_prob", "effective_vocabulary", "embedding_norm", "expected_row_norm", "mixing_ratio")

    def __init__(self, table: torch.nn.Module):
        self.table = table
        self.values = {name: [] for name in self.STATS}
        self._handle = None

    def __enter__(self):
        self._handle = self.table.register_forward_hook(self._on_table)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        return False

    def _on_table(self, module, args, output):
        probs = args[0]
        if not probs.is_floating_point():
            return
        p = probs.detach().float().reshape(-1, probs.shape[-1])  # (#tokens, V)
        weight = module.weight.detach().float()  # (V, D)
        entropy = -(p * p.clamp_min(EPS).log()).sum(-1)
        embedding = output.detach().float().reshape(-1, output.shape[-1])
        expected = p @ weight.norm(dim=-1)
        self.values["entropy"].append(entropy.cpu())
        self.values["max_prob"].append(p.max(-1).values.cpu())
        self.values["effective_vocabulary"].append(entropy.exp().cpu())
        self.values["embedding_norm"].append(embedding.norm(dim=-1).cpu())
        self.values["expected_row_norm"].append(expected.cpu())
        self.values["mixing_ratio"].append((embedding.norm(dim=-1) / expected.clamp_min(EPS)).cpu())


def _ratio(stats: dict | None, target: float | None) -> dict | None:
    if stats is None:
        return None
    return {**stats, "ratio_to_T": stats["mean"] / target if target else None}


def measure(points: ProbePoints, batches, text_target: float | None) -> dict:
    """The RQ4 statistics over the real images of ``batches`` (one plain forward of each)."""
    table = points.projector
    with VisualVocabularyTap(table) as tap:
        for batch in batches:
            passes.run(points.model, batch.inputs, logits_to_keep=1)
    config = points.model.config
    vision_config = getattr(config, "vision_config", None)
    indicators = int(getattr(vision_config, "num_visual_indicator_tokens", 0) or 0)
    rows = table.weight.detach().float().norm(dim=-1).cpu()  # (V,)
    visual_rows, indicator_rows = (rows[:-indicators], rows[-indicators:]) if indicators else (rows, rows[:0])
    per_token = {name: norm_stats(torch.cat(values)) if values else None for name, values in tap.values.items()}
    return {
        "visual_vocabulary_size": int(visual_rows.numel()),
        "num_indicator_tokens": indicators,
        "tokenize_function": getattr(vision_config, "tokenize_function", None),
        "log_vocabulary": float(torch.log(torch.tensor(float(max(visual_rows.numel(), 1))))),
        **{name: per_token[name] for name in ("entropy", "max_prob", "effective_vocabulary", "mixing_ratio")},
        "embedding_norm": _ratio(per_token["embedding_norm"], text_target),
        "expected_row_norm": _ratio(per_token["expected_row_norm"], text_target),
        "table_row_norm": _ratio(norm_stats(visual_rows), text_target),
        "indicator_row_norm": _ratio(norm_stats(indicator_rows), text_target),
    }
