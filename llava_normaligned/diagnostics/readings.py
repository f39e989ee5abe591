"""The numbers of a run laid out as the two seeds lay them out, and which way each one points.

``blog_tables(document)``: the six tables of the blog post "norm discrepancies are probably fine", same rows, same
columns, same names, one row per model (model, then baseline), so a reader can put them next to the blog's:

    Observation 1   Model | Vision/Text Norm Ratio
    Observation 2   Model | Modality | ||u_1||/||h_0|| | cos(h_1, h_0)
    Ablation 1      Model | Real-Blank Norms corr coeff | Real-Blank Cosine corr coeff | Real-Text Norms corr coeff
                    | Real-Text Cosine corr coeff
    Experiment 1    Model | alpha | Vision/Text Norm Ratio | Attention KL | Logit KL | Median Rank
    Experiment 2    Model | alpha | cos(K', K) | cos(V', V)
    Experiment 3    Model | KL(z_real || z_hybrid) | KL(z_blank || z_hybrid)

``directions(numbers)``: for each measurement, whether it points for the paper (Li et al., arXiv 2512.08374: vision
tokens rotate slower and the gap persists) or for the blog (downscaling at inference breaks behaviour, K is robust
and V is not), by a rule with a stated threshold (``RULES``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

# -------------------------------------------------------------------------------------------- the blog's tables

# name -> (the blog's section, its column names as it writes them)
BLOG_TABLES = {
    "norm_ratio": ("Observation 1", ["Model", "Vision/Text Norm Ratio"]),
    "update_dilution": (
        "Observation 2",
        ["Model", "Modality", r"$\frac{\lVert u_1\rVert}{\lVert h_0\rVert}$", r"$\cos(h_1,h_0)$"],
    ),
    "ablation": (
        "Ablation 1",
        ["Model", "Real-Blank Norms corr coeff", "Real-Blank Cosine corr coeff", "Real-Text Norms corr coeff",
         "Real-Text Cosine corr coeff"],
    ),
    "alpha_norm_matching": (
        "Experiment 1",
        ["Model", r"$\alpha$", "Vision/Text Norm Ratio", "Attention KL", "Logit KL", "Median Rank"],
    ),
    "kv_cosine": ("Experiment 2", ["Model", r"$\alpha$", r"$\cos(K^{\prime}, K)$", r"$\cos(V^{\prime}, V)$"]),
    "kv_substitution": (
        "Experiment 3",
        ["Model", r"$D_{\text{KL}}(z_{\text{real}} \parallel z_{\text{hybrid}})$",
         r"$D_{\text{KL}}(z_{\text{blank}} \parallel z_{\text{hybrid}})$"],
    ),
}


def _at(values, i):
    return values[i] if values is not None and 0 <= i < len(values) else None


def prompt_ratio(numbers: dict) -> float | None:
    """The blog's vision/text norm ratio: mean ||h_0|| of the vision tokens over that of the prompt's text tokens."""
    return numbers.get("vision_text_norm_ratio_prompt")


def norm_matching_row(numbers: dict) -> dict | None:
    """The swept alpha whose vision/text ratio (alpha x ``prompt_ratio``) is nearest 1 (in log): the blog's row
    "pick alpha to match vision and text norms"."""
    ratio, rows = prompt_ratio(numbers), numbers["alpha_sweep"]["rows"]
    if not ratio or not rows:
        return None
    return min(rows, key=lambda r: abs(math.log(r["alpha"] * ratio)))


def smallest_alpha_row(numbers: dict) -> dict | None:
    """The smallest swept alpha (the blog's Experiment 2 table is at alpha = 0.01, the smallest of its sweep)."""
    rows = numbers["alpha_sweep"]["rows"]
    return min(rows, key=lambda r: r["alpha"]) if rows else None


def _model_rows(numbers: dict) -> dict[str, list[list]]:
    name = numbers["model_id"]
    layers, correlation = numbers["layers"], numbers["ablations"]["correlation"]
    matching, smallest, kv = norm_matching_row(numbers), smallest_alpha_row(numbers), numbers["kv_substitution"]
    ratio = prompt_ratio(numbers)
    rows = {
        "norm_ratio": [[name, ratio]],
        "update_dilution": [
            [name, label, _at((layers.get(key) or {}).get("update_rel"), 1),
             _at((layers.get(key) or {}).get("cos_to_layer0"), 1)]
            for key, label in (("vision", "Vision"), ("text", "Text"))
        ],
        "ablation": [[
            name, correlation["real_blank"]["norm"], correlation["real_blank"]["cos_to_layer0"],
            correlation["real_no_image"]["norm"], correlation["real_no_image"]["cos_to_layer0"],
        ]],
        "alpha_norm_matching": [[
            name, matching["alpha"], matching["alpha"] * ratio, matching["attention_kl"], matching["logit_kl"],
            matching["median_rank"],
        ]] if matching else [[name, None, None, None, None, None]],
        "kv_cosine": [[name, smallest["alpha"], smallest["cos_k"], smallest["cos_v"]]] if smallest else [],
        "kv_substitution": [[name, kv["kl_real_hybrid"], kv["kl_blank_hybrid"]]],
    }
    return rows


def blog_tables(pairs: list[tuple[str, dict]]) -> dict:
    """``pairs``: [(label, numbers)] as ``report.models`` gives them. Each table: section, columns, rows."""
    tables = {name: {"section": section, "columns": columns, "rows": []}
              for name, (section, columns) in BLOG_TABLES.items()}
    for _, numbers in pairs:
        for name, rows in _model_rows(numbers).items():
            tables[name]["rows"] += rows
    return tables


# per-layer curves of the blog's figures (Observations 1-2): name -> (column, statistic in ``layers``)
LAYER_CURVES = (
    (r"$\lVert h_l\rVert$", "norm"),
    (r"$\cos(h_l,h_0)$", "cos_to_layer0"),
    (r"$\cos(h_l,h_{l-1})$", "cos_to_prev"),
    (r"$\lVert u_l\rVert$", "update_abs"),
    (r"$\lVert u_l\rVert/\lVert h_{l-1}\rVert$", "update_rel"),
)


def layer_curves(pairs: list[tuple[str, dict]]) -> dict:
    """The per-layer, per-modality curves behind the blog's figures, as one table."""
    columns = ["Model", "Modality", "Layer"] + [column for column, _ in LAYER_CURVES]
    rows = []
    for _, numbers in pairs:
        for key, label in (("vision", "Vision"), ("text", "Text")):
            curves = numbers["layers"].get(key)
            if not curves:
                continue
            for layer in numbers["layers"]["index"]:
                rows.append([numbers["model_id"], label, layer] + [_at(curves.get(s), layer) for _, s in LAYER_CURVES])
    return {"section": "Observations 1-2 (figures)", "columns": columns, "rows": rows}


# ------------------------------------------------------------------------------------------------ which way


@dataclass(frozen=True)
class Rule:
    """One measurement, the claim it tests and whose claim it is, and the rule that decides.

    ``decide(numbers)`` returns (value, outcome): outcome True = the claim holds, False = the opposite holds, None =
    between the thresholds or not measured."""

    key: str
    side: str  # "paper" or "blog"
    claim: str
    measurement: str
    rule: str
    decide: Callable[[dict], tuple[float | None, bool | None]]


def _threshold(value, holds_at, fails_at, higher_holds=True):
    """True when ``value`` is at or beyond ``holds_at``, False at or beyond ``fails_at`` the other way, else None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if higher_holds:
        return True if value >= holds_at else False if value <= fails_at else None
    return True if value <= holds_at else False if value >= fails_at else None


def _layer(numbers, modality, stat, layer):
    return _at((numbers["layers"].get(modality) or {}).get(stat), layer)


def _gap_at_input(numbers):
    value = prompt_ratio(numbers)
    return value, _threshold(value, 2.0, 1.25)


def _gap_persists(numbers):
    vision, text = (numbers["layers"].get(m) or {} for m in ("vision", "text"))
    ratios = [v / t for v, t in zip((vision.get("norm") or [])[1:], (text.get("norm") or [])[1:])
              if v is not None and t]
    value = statistics.median(ratios) if ratios else None
    return value, _threshold(value, 2.0, 1.0)


def _rotates_slower(numbers):
    vision, text = _layer(numbers, "vision", "cos_to_layer0", 1), _layer(numbers, "text", "cos_to_layer0", 1)
    value = vision - text if vision is not None and text is not None else None
    return value, _threshold(value, 0.1, -0.1)


def _updates_diluted(numbers):
    vision, text = _layer(numbers, "vision", "update_rel", 1), _layer(numbers, "text", "update_rel", 1)
    value = text / vision if vision and text is not None else None
    return value, _threshold(value, 2.0, 1.0)


def _downscaling_breaks(numbers):
    row = norm_matching_row(numbers)
    if row is None or row["logit_kl"] is None:
        return None, None
    kl, rank = row["logit_kl"], row["median_rank"]
    if kl >= 0.5 or (rank is not None and rank >= 2):
        return kl, True
    if kl < 0.1 and rank == 1:
        return kl, False
    return kl, None


def _k_robust_v_not(numbers):
    row = smallest_alpha_row(numbers)
    if row is None or row["cos_k"] is None or row["cos_v"] is None:
        return None, None
    value = row["cos_k"] - row["cos_v"]
    return value, _threshold(value, 0.2, 0.05)


def _kv_not_sufficient(numbers):
    kv = numbers["kv_substitution"]
    real, blank = kv["kl_real_hybrid"], kv["kl_blank_hybrid"]
    if real is None or blank is None or real == blank:
        return None, None
    return real - blank, real < blank


def _text_trajectory_unmoved(numbers):
    correlation = numbers["ablations"]["correlation"]
    values = [correlation[pair][curve] for pair in ("real_blank", "real_no_image")
              for curve in ("norm", "cos_to_layer0")]
    if any(v is None for v in values):
        return None, None
    value = min(values)
    return value, _threshold(value, 0.99, 0.9)


RULES = (
    Rule("gap_at_input", "paper", "vision tokens enter the LLM with much larger norms than text tokens",
         "vision/text norm ratio at the LLM input (h_0)",
         "for if >= 2, against if <= 1.25, undecided between", _gap_at_input),
    Rule("gap_persists", "paper", "the norm gap persists through the layers",
         "median over layers 1..L of mean ‖h_l‖ vision / mean ‖h_l‖ text",
         "for if >= 2, against if <= 1 (text overtakes), undecided between", _gap_persists),
    Rule("vision_rotates_slower", "paper", "vision tokens rotate slower (representational inertia)",
         "cos(h_1, h_0) vision minus text",
         "for if >= 0.1, against if <= -0.1, undecided between", _rotates_slower),
    Rule("updates_diluted", "paper", "the same update moves vision tokens relatively less",
         "(‖u_1‖/‖h_0‖) text over vision",
         "for if >= 2, against if <= 1, undecided between", _updates_diluted),
    Rule("downscaling_breaks", "blog", "downscaling the vision tokens to the text norm breaks behaviour",
         "logit KL at the swept alpha nearest the norm-matching one (and its median rank)",
         "for if KL >= 0.5 nats or median rank >= 2, against if KL < 0.1 and median rank = 1, undecided between",
         _downscaling_breaks),
    Rule("k_robust_v_not", "blog", "keys survive downscaling, values do not",
         "cos(K', K) minus cos(V', V) at the smallest swept alpha",
         "for if >= 0.2, against if <= 0.05, undecided between", _k_robust_v_not),
    Rule("kv_not_sufficient", "blog", "the image's effect is spread over the prefill, not held in the visual KV cache",
         "KL(real ‖ hybrid) minus KL(blank ‖ hybrid)",
         "for if < 0 (the hybrid stays nearer the real image), against if > 0", _kv_not_sufficient),
    Rule("text_trajectory_unmoved", "blog", "the image barely moves the text tokens' trajectories",
         "smallest of the four real/blank/no-image correlations",
         "for if >= 0.99, against if <= 0.9, undecided between", _text_trajectory_unmoved),
)

SIDES = {"paper": "the paper", "blog": "the blog"}


def verdict_text(side: str, outcome: bool | None) -> str:
    if outcome is None:
        return "undecided"
    return f"{'for' if outcome else 'against'} {SIDES[side]}"


def directions(numbers: dict) -> list[dict]:
    """Every rule applied to one model's numbers."""
    result = []
    for rule in RULES:
        value, outcome = rule.decide(numbers)
        result.append({
            "key": rule.key,
            "side": rule.side,
            "claim": rule.claim,
            "measurement": rule.measurement,
            "value": value,
            "rule": rule.rule,
            "holds": outcome,
            "verdict": verdict_text(rule.side, outcome),
        })
    return result
