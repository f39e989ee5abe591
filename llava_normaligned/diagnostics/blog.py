"""The blog post's experiments ("norm discrepancies are probably fine"), as accumulators fed batch by batch.

Positions used below, for a prompt of S_p tokens followed by the n greedy tokens g_1..g_n (teacher-forced, so the
whole sequence is one pass of S_p + n - 1 tokens):
    scored positions: S_p - 1 ... S_p + n - 2, the n positions whose logits predict g_1 ... g_n (the first is the
        prefill's last token, the others are decoding steps);
    prefill text queries: the prompt's text tokens after the image (those that can attend to it);
    decode queries: the positions of g_1 ... g_{n-1}, each a decoding step attending to the prompt and the tokens
        generated before it.
KL(P || Q) is always taken from the reference run (P: real image, alpha = 1) to the modified one (Q).
"""

from __future__ import annotations

import math
import statistics

import torch

from .probes import pearson
from .taps import cosine

TINY = 1e-30  # floor of a probability inside a log (fp32 softmax can underflow to exactly 0)


def kl_logprobs(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) along the last dimension, from log-probabilities."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def kl_probs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) along the last dimension, from probabilities."""
    return (torch.xlogy(p, p) - torch.xlogy(p, q.clamp_min(TINY))).sum(-1)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(sum(values) / len(values)) if values else None


def _layer_means(per_layer: list[list[float]]) -> list[float | None]:
    return [_mean(values) for values in per_layer]


# ------------------------------------------------------------------------------------- attention mass (prefill, decode)


class AttentionMass:
    """How much attention text queries give to vision keys and to text keys, per layer (mean over heads, then over
    the queries of one sample, then over samples). For a text query the two masses add up to 1, padding aside."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
        self.values = {
            phase: {kind: [[] for _ in range(num_layers)] for kind in ("vision", "text")}
            for phase in ("prefill", "decode")
        }

    def hook(self, vision_keys: torch.Tensor, text_keys: torch.Tensor, queries: dict[str, torch.Tensor]):
        """A callback for ``AttentionTap``. Keys: (B, S) bool; queries: phase -> (B, S) bool."""

        def on_weights(layer: int, probs: torch.Tensor):  # (B, H, S, S), reduced where it lives
            keys = {"vision": vision_keys.to(probs.device), "text": text_keys.to(probs.device)}
            mass = {  # (B, S): per query, the mass on each kind of key, mean over heads
                kind: (probs * mask[:, None, None, :]).sum(-1).mean(1).cpu() for kind, mask in keys.items()
            }
            for phase, query_mask in queries.items():
                for b in range(query_mask.shape[0]):
                    if query_mask[b].any():
                        for kind, values in mass.items():
                            self.values[phase][kind][layer].append(float(values[b, query_mask[b]].mean()))

        return on_weights

    def summary(self) -> dict:
        result = {}
        for phase, kinds in self.values.items():
            per_layer = {kind: _layer_means(layers) for kind, layers in kinds.items()}
            result[phase] = {
                **{f"{kind}_per_layer": values for kind, values in per_layer.items()},
                **{kind: _mean(values) for kind, values in per_layer.items()},
                "num_samples": len(kinds["vision"][0]),
            }
        return result


# ----------------------------------------------------------------------------- attention over the image (for its KL)


class VisionAttention:
    """Where the scored positions look inside the image: per layer, head and scored position, the attention
    probabilities over the vision keys, renormalised to sum to 1. The reference run stores them; a modified run is
    compared to them by KL (mean over heads and positions per sample and layer)."""

    def __init__(self, num_layers: int):
        self.reference: list[list[torch.Tensor]] = [[] for _ in range(num_layers)]  # layer -> row -> (H, n, N_v)

    @staticmethod
    def _rows(probs: torch.Tensor, vision_keys: torch.Tensor, scored: slice):
        for b in range(probs.shape[0]):
            p = probs[b][:, scored][:, :, vision_keys[b].to(probs.device)]  # (H, n, N_v)
            yield (p / p.sum(-1, keepdim=True).clamp_min(TINY)).cpu()

    def capture(self, vision_keys: torch.Tensor, scored: slice):
        for layer_rows in self.reference:
            layer_rows.clear()

        def on_weights(layer: int, probs: torch.Tensor):
            self.reference[layer].extend(self._rows(probs, vision_keys, scored))

        return on_weights

    def compare(self, vision_keys: torch.Tensor, scored: slice, sink: list[list[float]]):
        """A callback that appends, per layer, each row's mean KL(reference || this run) to ``sink[layer]``."""

        def on_weights(layer: int, probs: torch.Tensor):
            for reference, q in zip(self.reference[layer], self._rows(probs, vision_keys, scored)):
                sink[layer].append(float(kl_probs(reference, q).mean()))

        return on_weights


# ------------------------------------------------------------------------------------------------ the alpha sweep


class AlphaSweep:
    """The blog's Experiment 1 (the projector output scaled by alpha) and Experiment 2 (cos(K', K), cos(V', V)).

    Per alpha, over all samples and scored positions:
        logit_kl: mean KL(reference next-token distribution || alpha run's);
        median_rank: median rank (1 = top) of the reference's greedy token among the alpha run's logits;
        greedy_agreement: fraction of scored positions whose argmax is the reference's greedy token;
        attention_kl: mean KL of the attention over the image (``VisionAttention``), over layers, heads, positions;
        cos_k, cos_v: mean cosine between the cached key (value) vectors of the alpha run and of the reference, per
            layer, KV head and vision position (cached keys carry RoPE, the same rotation in both runs);
        vision_text_norm_ratio: mean norm of the vision tokens entering the LLM / T;
        decode_vision_mass: the text-to-vision attention mass of the decode queries.
    """

    def __init__(self, alphas, num_layers: int):
        self.alphas = list(alphas)
        self.num_layers = num_layers
        self.rows = {
            a: {
                "logit_kl": [],
                "logit_kl_first": [],
                "ranks": [],
                "agree": [],
                "attention_kl": [[] for _ in range(num_layers)],
                "cos_k": [[] for _ in range(num_layers)],
                "cos_v": [[] for _ in range(num_layers)],
                "vision_norms": [],
                "decode_mass": AttentionMass(num_layers),
            }
            for a in self.alphas
        }

    def attention_sinks(self, alpha):
        row = self.rows[alpha]
        return row["attention_kl"], row["decode_mass"]

    def add_outputs(self, alpha, ref_logprobs, logits, ref_layers, layers, vision_positions, vision_norms):
        """ref_logprobs, logits: (B, n, V) at the scored positions; ref_layers, layers: per-layer cache entries;
        vision_positions: (B, S) bool over the cached positions; vision_norms: LLM-input vision-token norms."""
        row = self.rows[alpha]
        log_q = torch.log_softmax(logits.float(), dim=-1).cpu()
        kl = kl_logprobs(ref_logprobs, log_q)  # (B, n)
        row["logit_kl"] += kl.reshape(-1).tolist()
        row["logit_kl_first"] += kl[:, 0].tolist()
        target = ref_logprobs.argmax(-1, keepdim=True)  # (B, n, 1) the reference's greedy tokens
        rank = 1 + (log_q > log_q.gather(-1, target)).sum(-1)  # (B, n)
        row["ranks"] += rank.reshape(-1).tolist()
        row["agree"] += (log_q.argmax(-1) == target[..., 0]).reshape(-1).float().tolist()
        for layer, (ref, run) in enumerate(zip(ref_layers, layers)):
            for b in range(vision_positions.shape[0]):
                where = vision_positions[b].to(run.keys.device)
                for name, r, x in (("cos_k", ref.keys, run.keys), ("cos_v", ref.values, run.values)):
                    # (H_kv, N_v, d) -> cosine per head and position
                    c = cosine(x[b][:, where].float(), r[b][:, where].float())
                    row[name][layer].append(float(c.mean()))
        row["vision_norms"].append(vision_norms)

    def summary(self, text_target: float | None) -> dict:
        rows = []
        for alpha in self.alphas:
            r = self.rows[alpha]
            norms = torch.cat(r["vision_norms"]) if r["vision_norms"] else torch.empty(0)
            attention_kl = _layer_means(r["attention_kl"])
            cos_k, cos_v = _layer_means(r["cos_k"]), _layer_means(r["cos_v"])
            rows.append(
                {
                    "alpha": alpha,
                    "vision_text_norm_ratio": (
                        float(norms.mean()) / text_target if text_target and norms.numel() else None
                    ),
                    "attention_kl": _mean(attention_kl),
                    "logit_kl": _mean(r["logit_kl"]),
                    "logit_kl_first_token": _mean(r["logit_kl_first"]),
                    "median_rank": float(statistics.median(r["ranks"])) if r["ranks"] else None,
                    "greedy_agreement": _mean(r["agree"]),
                    "cos_k": _mean(cos_k),
                    "cos_v": _mean(cos_v),
                    "decode_vision_mass": r["decode_mass"].summary()["decode"]["vision"],
                    "attention_kl_per_layer": attention_kl,
                    "cos_k_per_layer": cos_k,
                    "cos_v_per_layer": cos_v,
                    "num_positions": len(r["ranks"]),
                }
            )
        reference = next(row for row in rows if row["alpha"] == 1.0)
        ratio = reference["vision_text_norm_ratio"]
        return {
            "reference_alpha": 1.0,
            "alphas": self.alphas,
            # the scale that would bring vision tokens to the text-embedding norm T
            "norm_matching_alpha": 1.0 / ratio if ratio else None,
            "rows": rows,
        }


# ---------------------------------------------------------------------------------- blank-image and no-image ablations


class Ablations:
    """The blog's Ablation 1: the text tokens' trajectories (per layer, their mean norm and mean cosine to layer 0)
    with the real image, a blank white image of the same size, and no image. Correlations are Pearson's r between
    two conditions' curves of one sample, averaged over samples. ``next_token_kl``: KL(real || condition) of the
    first generated token's distribution."""

    CONDITIONS = ("real", "blank", "no_image")
    CURVES = ("norm", "cos_to_layer0")

    def __init__(self):
        self.curves = {c: {name: [] for name in self.CURVES} for c in self.CONDITIONS}
        self.next_token_kl = {c: [] for c in self.CONDITIONS[1:]}

    def add(self, condition: str, stacked: dict[str, torch.Tensor], text_mask: torch.Tensor):
        """stacked: statistic -> (L+1, B, S) from ``ResidualTap``; text_mask: (B, S) bool, the prompt's text."""
        for b in range(text_mask.shape[0]):
            for name in self.CURVES:
                self.curves[condition][name].append(stacked[name][:, b, text_mask[b]].mean(-1))

    def add_next_token(self, condition: str, ref_logprobs: torch.Tensor, logits: torch.Tensor):
        """ref_logprobs, logits: (B, V) for the first generated token."""
        log_q = torch.log_softmax(logits.float(), dim=-1).cpu()
        self.next_token_kl[condition] += kl_logprobs(ref_logprobs, log_q).tolist()

    def summary(self) -> dict:
        result = {"curves": {}, "correlation": {}, "next_token_kl": {}}
        for condition, curves in self.curves.items():
            result["curves"][condition] = {
                name: torch.stack(values).mean(0).tolist() if values else None for name, values in curves.items()
            }
        for other in self.CONDITIONS[1:]:
            result["correlation"][f"real_{other}"] = {
                name: _mean(
                    [
                        r
                        for a, b in zip(self.curves["real"][name], self.curves[other][name])
                        if (r := pearson(a, b)) is not None
                    ]
                )
                for name in self.CURVES
            }
            result["next_token_kl"][f"real_{other}"] = _mean(self.next_token_kl[other])
        return result


# ------------------------------------------------------------------------------------------- KV-cache substitution


class KVSubstitution:
    """The blog's Experiment 3. The prompt minus its last token is run with the real image and with a blank one;
    the hybrid cache is the real run's with the vision positions' keys and values taken from the blank run. Feeding
    the last prompt token on each cache gives z_real, z_blank and z_hybrid for the first generated token."""

    def __init__(self):
        self.kl = {"real_hybrid": [], "blank_hybrid": [], "real_blank": []}

    def add(self, logits_real: torch.Tensor, logits_blank: torch.Tensor, logits_hybrid: torch.Tensor):
        """Each (B, V)."""
        real, blank, hybrid = (
            torch.log_softmax(x.float(), -1).cpu() for x in (logits_real, logits_blank, logits_hybrid)
        )
        self.kl["real_hybrid"] += kl_logprobs(real, hybrid).tolist()
        self.kl["blank_hybrid"] += kl_logprobs(blank, hybrid).tolist()
        self.kl["real_blank"] += kl_logprobs(real, blank).tolist()

    def summary(self) -> dict:
        closer = [r < b for r, b in zip(self.kl["real_hybrid"], self.kl["blank_hybrid"])]
        return {
            "kl_real_hybrid": _mean(self.kl["real_hybrid"]),
            "kl_blank_hybrid": _mean(self.kl["blank_hybrid"]),
            "kl_real_blank": _mean(self.kl["real_blank"]),
            # the blog's reading: if visual KV content controlled the output, the hybrid would sit closer to blank
            "fraction_closer_to_real": _mean([float(c) for c in closer]),
            "num_samples": len(closer),
        }
