"""What a diagnostics run writes: ``diagnostics.json`` (every number), CSV tables, and ``summary.md``.

Every file is written to a temporary name and renamed into place, so a crash never leaves a half-written file.
The main model's numbers sit at the top level of the JSON; the baseline's, when given, under ``baseline``.
These files are embedded in model cards and published with a checkpoint, so they name models and inputs by Hub id
or by a file's or folder's own name, never by a path on this machine (``llava_normaligned.local_paths``).
"""

from __future__ import annotations

import csv
import io
import math
import os
from datetime import datetime, timezone

from ..atomic_files import write_json_atomic, write_text_atomic
from ..local_paths import public_name, public_record

FORMAT = "llava-normaligned-diagnostics/1"
JSON_NAME = "diagnostics.json"
SUMMARY_NAME = "summary.md"


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    result = {}
    for name in ("llava-normaligned", "torch", "transformers"):
        try:
            result[name] = version(name)
        except PackageNotFoundError:
            result[name] = None
    return result


# settings that name a model, a file or a folder
PATH_SETTINGS = ("model", "baseline", "images", "prompts", "output_dir")


def build_document(settings: dict, main: dict, baseline: dict | None) -> dict:
    from .readings import blog_tables, layer_curves

    settings = {**settings, **{key: public_name(settings.get(key)) for key in PATH_SETTINGS if key in settings}}
    document = {
        "format": FORMAT,
        "model_id": main["model_id"],
        "baseline_id": baseline["model_id"] if baseline else None,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "settings": settings,
        **main,
        "baseline": baseline,
    }
    # the blog's six tables and its figures' curves, rows for the model then the baseline (readings.BLOG_TABLES)
    document["blog_tables"] = {**blog_tables(models(document)), "layer_curves": layer_curves(models(document))}
    return document


def models(document: dict) -> list[tuple[str, dict]]:
    """[("model", numbers), ("baseline", numbers)] (the second only when present)."""
    pairs = [("model", document)]
    if document.get("baseline"):
        pairs.append(("baseline", document["baseline"]))
    return pairs


# ----------------------------------------------------------------------------------------------------- writing


def json_safe(value):
    """``value`` as written to the JSON: NaN and infinities become ``None``."""
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _csv_text(header: list[str], rows: list[list]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow(["" if v is None else v for v in row])
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------------ tables


def _at(values, i):
    return values[i] if values is not None and i < len(values) else None


def layers_table(document: dict):
    header = ["model", "model_id", "modality", "layer", "norm", "norm_median", "cos_to_layer0", "cos_to_prev",
              "update_abs", "update_rel", "rotation_deg", "predicted_rotation_deg"]
    rows = []
    for label, numbers in models(document):
        predicted = numbers["theory"]["predicted_rotation_deg"]
        for modality in ("vision", "text", "template"):
            curves = numbers["layers"].get(modality)
            if not curves:
                continue
            for layer in numbers["layers"]["index"]:
                rows.append([label, numbers["model_id"], modality, layer]
                            + [_at(curves[k], layer) for k in header[4:11]]
                            + [_at(predicted.get(modality), layer)])
    return header, rows


def alpha_table(document: dict):
    header = ["model", "model_id", "alpha", "vision_text_norm_ratio", "attention_kl", "logit_kl",
              "logit_kl_first_token", "median_rank", "greedy_agreement", "cos_k", "cos_v", "decode_vision_mass"]
    rows = []
    for label, numbers in models(document):
        for row in numbers["alpha_sweep"]["rows"]:
            rows.append([label, numbers["model_id"]] + [row[k] for k in header[2:]])
    return header, rows


def norms_table(document: dict):
    header = ["model", "model_id", "stage", "mean", "std", "median", "min", "max", "count", "ratio_to_text"]
    rows = []
    for label, numbers in models(document):
        text = numbers["text_embedding_norm"]
        rows.append([label, numbers["model_id"], "text_embedding", text["mean"], text["std"], text["median"],
                     text["min"], text["max"], text["num_rows"], text["mean"] / text["T"] if text["T"] else None])
        for stage, stats in numbers["vision_norm"].items():
            if stats:
                rows.append([label, numbers["model_id"], stage] + [stats.get(k) for k in header[3:]])
    return header, rows


def top_tokens_table(document: dict):
    header = ["model", "model_id", "rank", "token_id", "token", "text", "norm"]
    rows = []
    for label, numbers in models(document):
        for row in numbers["text_embedding_norm"]["top_k"]:
            rows.append([label, numbers["model_id"]] + [row[k] for k in header[2:]])
    return header, rows


def attention_table(document: dict):
    header = ["model", "model_id", "layer", "prefill_vision_mass", "prefill_text_mass", "decode_vision_mass",
              "decode_text_mass"]
    rows = []
    for label, numbers in models(document):
        att = numbers["attention"]
        for layer in range(len(att["prefill"]["vision_per_layer"])):
            rows.append([label, numbers["model_id"], layer,
                         _at(att["prefill"]["vision_per_layer"], layer), _at(att["prefill"]["text_per_layer"], layer),
                         _at(att["decode"]["vision_per_layer"], layer), _at(att["decode"]["text_per_layer"], layer)])
    return header, rows


def ablation_table(document: dict):
    header = ["model", "model_id", "condition", "layer", "text_norm", "text_cos_to_layer0"]
    rows = []
    for label, numbers in models(document):
        for condition, curves in numbers["ablations"]["curves"].items():
            for layer, (norm, cos) in enumerate(zip(curves["norm"] or [], curves["cos_to_layer0"] or [])):
                rows.append([label, numbers["model_id"], condition, layer, norm, cos])
    return header, rows


def kv_table(document: dict):
    header = ["model", "model_id", "kl_real_hybrid", "kl_blank_hybrid", "kl_real_blank", "fraction_closer_to_real",
              "num_samples"]
    rows = [[label, n["model_id"]] + [n["kv_substitution"][k] for k in header[2:]] for label, n in models(document)]
    return header, rows


TABLES = {
    "layers.csv": layers_table,
    "alpha_sweep.csv": alpha_table,
    "norms.csv": norms_table,
    "text_embedding_top_k.csv": top_tokens_table,
    "attention_mass.csv": attention_table,
    "ablations.csv": ablation_table,
    "kv_substitution.csv": kv_table,
}


# ----------------------------------------------------------------------------------------------------- summary


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 10 ** -digits or abs(value) >= 10**5):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}f}"
    return str(value)


def _pair(a, b) -> str:
    return f"{_fmt(a)} / {_fmt(b)}"


def _mean_of(values):
    values = [v for v in values or [] if v is not None]
    return sum(values) / len(values) if values else None


def _headline(numbers: dict) -> dict[str, str]:
    layers, attention = numbers["layers"], numbers["attention"]
    vision, text, template = layers.get("vision") or {}, layers.get("text") or {}, layers.get("template") or {}
    sweep = numbers["alpha_sweep"]
    matching = sweep["norm_matching_alpha"]
    nearest = min(sweep["rows"], key=lambda r: abs(math.log(r["alpha"] / matching))) if matching else None
    kv, ablation, theory = numbers["kv_substitution"], numbers["ablations"]["correlation"], numbers["theory"]
    return {
        "text-embedding norm: mean (std), T": (
            f"{_fmt(numbers['text_embedding_norm']['mean'])} ({_fmt(numbers['text_embedding_norm']['std'])}), "
            f"{_fmt(numbers['text_embedding_norm']['T'])}"
        ),
        "vision norm: encoder output / projector input": _pair(
            (numbers["vision_norm"]["encoder_output"] or {}).get("mean"),
            (numbers["vision_norm"]["before_projector"] or {}).get("mean"),
        ),
        "vision norm: projector MLP output / after norm": _pair(
            (numbers["vision_norm"]["after_projector"] or {}).get("mean"),
            (numbers["vision_norm"]["after_norm"] or {}).get("mean"),
        ),
        "**vision / text norm ratio at the LLM input**": f"**{_fmt(numbers['vision_text_norm_ratio'])}**",
        "text tokens at the LLM input ‖h_0‖: prompt text / template tokens": _pair(
            _at(text.get("norm"), 0), _at(template.get("norm"), 0)
        ),
        "update_rel at layer 1, vision / text": _pair(_at(vision.get("update_rel"), 1), _at(text.get("update_rel"), 1)),
        "cos(h_1, h_0), vision / text": _pair(_at(vision.get("cos_to_layer0"), 1), _at(text.get("cos_to_layer0"), 1)),
        "mean inter-layer cosine, vision / text": _pair(
            _mean_of((vision.get("cos_to_prev") or [])[1:]), _mean_of((text.get("cos_to_prev") or [])[1:])
        ),
        "text-to-vision attention mass, prefill / decode": _pair(
            attention["prefill"]["vision"], attention["decode"]["vision"]
        ),
        "alpha matching the norms (nearest swept)": (
            f"{_fmt(matching)} ({_fmt(nearest['alpha'], 2)}: logit KL {_fmt(nearest['logit_kl'])}, "
            f"greedy agreement {_fmt(nearest['greedy_agreement'], 2)})" if nearest else "n/a"
        ),
        "KV substitution: KL(real ‖ hybrid) / KL(blank ‖ hybrid)": _pair(kv["kl_real_hybrid"], kv["kl_blank_hybrid"]),
        "text trajectory r, real vs blank / vs no image (norm)": _pair(
            ablation["real_blank"]["norm"], ablation["real_no_image"]["norm"]
        ),
        "rotation: paper's prediction vs measured, r (MAE in degrees)": (
            f"{_fmt(theory['correlation'])} ({_fmt(theory['mean_abs_error_deg'], 2)})"
        ),
    }


def _alpha_rows(numbers: dict) -> list[str]:
    lines = [
        "| α | vision/text norm | attention KL | logit KL | median rank | greedy agreement | cos(K′,K) | cos(V′,V) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in numbers["alpha_sweep"]["rows"]:
        lines.append(
            f"| {_fmt(r['alpha'], 2)} | {_fmt(r['vision_text_norm_ratio'])} | {_fmt(r['attention_kl'])} | "
            f"{_fmt(r['logit_kl'])} | {_fmt(r['median_rank'], 1)} | {_fmt(r['greedy_agreement'], 2)} | "
            f"{_fmt(r['cos_k'])} | {_fmt(r['cos_v'])} |"
        )
    return lines


def deepstack_rows(numbers: dict) -> list[str]:
    """Qwen3-VL's deepstack features at the LLM layers they enter (``numbers["deepstack"]``); none for others."""
    deepstack = numbers.get("deepstack")
    if not deepstack:
        return []
    lines = [
        "", f"Deepstack features of `{numbers['model_id']}`, {deepstack['entry']}:", "",
        "| LLM layer | vision layer | ‖feature‖ mean | / T | ‖h‖ of the image tokens | ‖feature‖ / ‖h‖ |",
        "|---|---|---|---|---|---|",
    ]
    for row in deepstack["layers"]:
        lines.append(
            f"| {row['llm_layer']} | {row['vision_layer']} | {_fmt((row['norm'] or {}).get('mean'))} | "
            f"{_fmt(row['ratio_to_text'])} | {_fmt((row['hidden_norm'] or {}).get('mean'))} | "
            f"{_fmt(row['ratio_to_hidden'])} |"
        )
    return lines


def _markdown_table(table: dict, digits: int = 3) -> list[str]:
    columns = table["columns"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in table["rows"]:
        cells = [f"`{v}`" if i == 0 else _fmt(v, digits) for i, v in enumerate(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _blog_section(document: dict) -> list[str]:
    tables = document.get("blog_tables") or {}
    lines = ["", "### The blog's tables", "",
             "Laid out as the blog post lays them out (same rows, columns and names); values in "
             "`diagnostics.json` under `blog_tables`. Vision/Text Norm Ratio: mean ‖h_0‖ of the vision tokens over "
             "that of the prompt's text tokens; Experiment 1 is the swept α nearest the norm-matching one, its ratio "
             "α × that ratio; Experiment 2 is the smallest swept α; Real-Text is the run with no image."]
    for name, table in tables.items():
        if name == "layer_curves" or not table["rows"]:
            continue
        lines += ["", f"{table['section']}:", ""] + _markdown_table(table, 4 if name == "ablation" else 3)
    curves = tables.get("layer_curves")
    if curves and curves["rows"]:
        lines += ["", "<details><summary>Per layer and modality (the blog's figures)</summary>", ""]
        lines += _markdown_table(curves) + ["", "</details>"]
    return lines


def _directions_section(document: dict) -> list[str]:
    lines = ["", "### Which way each measurement points", "",
             "The paper (arXiv 2512.08374): vision tokens rotate slower and the gap persists. The blog: downscaling "
             "breaks behaviour, K is robust and V is not. Each row tests one claim by the rule given "
             "(`directions` in the JSON).", ""]
    pairs = models(document)
    lines.append("| claim (whose) | measurement | rule | " + " | ".join(f"`{n['model_id']}`" for _, n in pairs) + " |")
    lines.append("|---|---|---|" + "---|" * len(pairs))
    for i, first in enumerate(pairs[0][1].get("directions") or []):
        cells = []
        for _, numbers in pairs:
            d = numbers["directions"][i]
            cells.append(f"{_fmt(d['value'])}: **{d['verdict']}**")
        lines.append(f"| {first['claim']} ({first['side']}) | {first['measurement']} | {first['rule']} | "
                     + " | ".join(cells) + " |")
    return lines


FIGURE_CAPTIONS = {
    "fig_norms_cosine.png": "Layer-wise norms and inter-layer cosine per modality (paper Fig. 4)",
    "fig_alpha_sweep.png": "Projector output scaled by α (the blog's Experiment 1)",
}


def render_summary(document: dict, figures: list[str] = ()) -> str:
    """The Markdown summary; ``figures`` (file names in the same folder) adds the two main figures as images."""
    pairs = models(document)
    settings = document["settings"]
    heads = [_headline(n) for _, n in pairs]
    names = " | ".join(f"`{n['model_id']}`" for _, n in pairs)
    lines = [
        "## Norm diagnostics",
        "",
        f"`llava-normaligned diagnose` on {document['num_samples']} image-prompt pairs, "
        f"{settings['max_new_tokens']} greedy tokens each ({document['created']}). "
        "The paper's probes (arXiv 2512.08374, §4 and Appendix C) and the experiments of the blog post "
        "\"norm discrepancies are probably fine\"; every number is in `diagnostics.json`.",
        "",
        f"| | {names} |",
        "|---|" + "---|" * len(pairs),
    ]
    lines += [f"| {key} | " + " | ".join(h[key] for h in heads) + " |" for key in heads[0]]
    for label, numbers in pairs:
        lines += ["", f"α sweep of `{numbers['model_id']}` (projector output × α; reference α = 1):", ""]
        lines += _alpha_rows(numbers)
        lines += deepstack_rows(numbers)
    lines += _blog_section(document)
    lines += _directions_section(document)
    for name, caption in FIGURE_CAPTIONS.items():
        if name in figures:
            lines += ["", f"![{caption}]({name})"]
    lines += [
        "",
        "Ratios are means of vision-token norms over T, the mean norm of the LLM's non-zero text-embedding rows. "
        "Text statistics are over the prompt's own text tokens; BOS and chat-template tokens are reported apart "
        "(`layers.template` in the JSON). KL is taken from the unmodified run; the α-sweep figures average over all "
        "generated positions.",
        "",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------- all


def write_outputs(document: dict, output_dir: str, figures: list[str] = ()) -> list[str]:
    """Write the JSON, the CSV tables and the Markdown summary; ``figures`` (paths already written in
    ``output_dir``, ``plots.write_figures``) are linked from the summary. Returns the paths, figures last."""
    document = public_record(json_safe(document))  # what the settings did not name: notes, messages
    written = [write_json_atomic(os.path.join(output_dir, JSON_NAME), document, make_folder=True, indent=2,
                                 ensure_ascii=False)]
    for name, table in TABLES.items():
        written.append(write_text_atomic(os.path.join(output_dir, name), _csv_text(*table(document)), make_folder=True))
    names = [os.path.basename(path) for path in figures]
    written.append(write_text_atomic(os.path.join(output_dir, SUMMARY_NAME), render_summary(document, names),
                                     make_folder=True))
    return written + list(figures)
