"""The CPU demo's outputs: ``results.json``, ``results.md`` (the paper's Tables 4 and 5 layout) and the figures.

Everything here reads the ``results`` dict that ``run.py`` assembles (``run.aggregate``: one row per variant over
its seeds, then the stock row); nothing is computed twice. A row:

    {"name", "key", "recipe", "seeds", "training": {"max_grad_norm", "clip_per_part"},
     "accuracy": {"real": {template: mean, "avg": mean}, "blank": {...}},           means over seeds
     "accuracy_interval": {"real": {template: Interval.to_dict()}, ...},             mean ± 95% interval (stats.py)
     "paired_to_baseline": {"real": {template: Interval.to_dict()}, ...} or None,     paired difference to w/o Norm
     "visual_gain", "norm_ratio": {"init", "after_stage1", "after_stage2"}, "gain_stats": {...},
     "optimizer_step": {"mean": {...}, "first": {...}},   stage 2: grad_norm[/part], clip_coef, update_size/part
     "layers": {"layers", "vision": {"norm", "cos_to_prev"}, "text": {...}},   per LLM layer (mechanism.py)
     "tracking": {"stage1": [records], "stage2": [records]} (the first seed's), "per_seed": [...], "seconds"}
"""

from __future__ import annotations

import json
import os

from ..atomic_files import write_json_atomic, write_text_atomic

# Next to the tables: how the stock row was trained differs from the four variants' recipe in three ways.
STOCK_ROW_NOTE = (
    "The stock row is not the variants' recipe with the norm removed; it differs in three ways, as LLaVA trained "
    "with stock TRL would: **one stage** (stage 1 + stage 2 steps, at the stage-2 rate), **no captions** (it trains "
    "on the questions only, never on the stage-1 caption data) and **the vision tower frozen** (stock TRL has one "
    "learning rate for every part). The w/o Norm row is the like-for-like comparison for the norm."
)
# The run best_model/ holds is picked among its row's seeds on the test split it is then reported on (the synthetic
# set has no validation split).
SELECTION_NOTE = (
    "The saved run was selected by its accuracy on this same test split (there is no separate validation split), so "
    "its accuracy, the best of its row's seeds, is optimistic as an estimate of the saved model's accuracy."
)

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
FIGURES_DIR = "figures"
FIGURES = {
    "vision_text_ratio": "vision_text_ratio.png",
    "projector_output_norm": "projector_output_norm.png",
    "norm_gain": "norm_gain.png",
    "accuracy": "accuracy.png",
    "layer_norm": "layer_norm.png",
    "layer_cos": "layer_cos.png",
}
PARTS = ("vision_tower", "projector", "projector_norm", "llm")


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"


def _templates(rows: list[dict]) -> list[str]:
    return [name for name in rows[0]["accuracy"]["real"] if name != "avg"]


# ------------------------------------------------------------------------------------------------- tables


def _interval(entry: dict, signed: bool = False) -> str:
    mean = f"{entry['mean']:+.3f}" if signed else f"{entry['mean']:.3f}"
    return mean if entry.get("half_width") is None else f"{mean} ± {entry['half_width']:.3f}"


def _separated(entry: dict) -> bool:
    return entry.get("half_width") is not None and (entry["low"] > 0 or entry["high"] < 0)


def accuracy_table(rows: list[dict], condition: str, baseline_key: str) -> list[str]:
    """Paper Table 4 layout: one row per method, accuracy per template and the average, each the mean over seeds ±
    the half-width of its 95% interval (Student t)."""
    templates = _templates(rows)
    lines = ["| Method | " + " | ".join(templates) + " | Avg |", "| --- " * (len(templates) + 2) + "|"]
    for row in rows:
        interval = row["accuracy_interval"][condition]
        lines.append(f"| {row['name']} | " + " | ".join(_interval(interval[t]) for t in templates + ["avg"]) + " |")
    return lines


def paired_table(rows: list[dict], condition: str, baseline_key: str) -> list[str]:
    """Each row's paired difference to the baseline (same seeds), mean ± 95% interval; ``*`` marks an interval that
    does not contain 0."""
    templates = _templates(rows)
    lines = ["| Method | " + " | ".join(templates) + " | Avg |", "| --- " * (len(templates) + 2) + "|"]
    for row in rows:
        paired = row.get("paired_to_baseline")
        if paired is None:
            continue
        cells = [_interval(paired[condition][t], signed=True) + (" *" if _separated(paired[condition][t]) else "")
                 for t in templates + ["avg"]]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return lines


def detectable(entry: dict) -> float | None:
    """A paired difference's smallest detectable difference at 80% power (``stats.detectable_difference``); from its
    interval where the record predates the stored value."""
    from .stats import detectable_from_interval

    value = entry.get("detectable_difference")
    if value is None:
        value = detectable_from_interval(entry.get("half_width"), int(entry.get("n") or 0), entry.get("level", 0.95))
    return value


def _detectable(entry: dict) -> str:
    value = detectable(entry)
    return "n/a" if value is None else f"{value:.3f}"


# the comparison the power goal is set for: target init + GWC against w/o Norm, at most 3 points of average accuracy
POWER_ROW = "norm_target_init_gwc"
POWER_GOAL = 0.03


def power_text(rows: list[dict], baseline_name: str, goal: float = POWER_GOAL, key: str = POWER_ROW) -> str:
    """What the paired comparisons could have seen: for each row, the smallest true difference in the real-image
    average that its seeds and test size detect with 80% power (from the measured paired spread), and whether the
    comparison of ``key`` to the baseline reaches ``goal``."""
    cells = []
    target = None
    for row in rows:
        paired = row.get("paired_to_baseline")
        if paired is None:
            continue
        value = detectable(paired["real"]["avg"])
        if value is None:
            continue
        cells.append(f"{row['name']} {value:.3f}")
        if row["key"] == key:
            target = (row["name"], value)
    if not cells:
        return "One seed: no spread, so no detectable difference can be given."
    text = (f"Smallest paired difference to {baseline_name} in the real-image average that these runs detect with 80% "
            f"power (two-sided, 95%; from the measured paired spread): {', '.join(cells)}. A difference smaller than "
            "that, or not separated from zero, is no evidence of \"no effect\".")
    if target is not None:
        name, value = target
        text += (f" {name} against {baseline_name}: {value:.3f} "
                 + (f"(within the {goal:.2f} goal)." if value <= goal else
                    f"(above the {goal:.2f} goal: more seeds, a larger test split or longer training are needed "
                    "to see a difference of the paper's size)."))
    return text


def separation_text(rows: list[dict], baseline_name: str) -> str:
    """Which paired differences (real-image average) the intervals separate from zero, and nothing more."""
    separated, not_separated = [], []
    for row in rows:
        paired = row.get("paired_to_baseline")
        if paired is None:
            continue
        entry = paired["real"]["avg"]
        (separated if _separated(entry) else not_separated).append(f"{row['name']} ({_interval(entry, True)})")
    if rows and rows[0].get("accuracy_interval", {}).get("real", {}).get("avg", {}).get("half_width") is None:
        return "One seed: no interval, so no difference here is separated from zero."
    text = (f"Paired differences to {baseline_name} in the real-image average that the 95% intervals separate from "
            f"zero: {', '.join(separated) if separated else 'none'}. Not separated from zero: "
            f"{', '.join(not_separated) if not_separated else 'none'}. The tables rank nothing beyond that: rows "
            "whose difference is not separated from zero are not shown better or worse by these runs.")
    return text


def summary_table(rows: list[dict]) -> list[str]:
    """The headline table (results.md's first, and the README's): real- and blank-image average accuracy, mean ±
    95% interval over seeds, and the paired difference to the baseline (``*``: the interval excludes 0)."""
    lines = ["| method | real images | paired difference to w/o Norm | detectable at 80% power | blank images |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        paired = row.get("paired_to_baseline")
        diff = "(reference)" if paired is None else (_interval(paired["real"]["avg"], signed=True)
                                                     + (" *" if _separated(paired["real"]["avg"]) else ""))
        detectable = "" if paired is None else _detectable(paired["real"]["avg"])
        lines.append(f"| {row['name']} | {_interval(row['accuracy_interval']['real']['avg'])} | {diff} | "
                     f"{detectable} | {_interval(row['accuracy_interval']['blank']['avg'])} |")
    return lines


def contrast_table(contrasts: list[dict]) -> list[str]:
    lines = ["| Row | against | paired difference, real avg | separated from 0 |", "| --- | --- | --- | --- |"]
    for c in contrasts:
        lines.append(f"| {c['name']} | {c['reference_name']} | {_interval(c, signed=True)} | "
                     f"{'yes' if c['separated_from_zero'] else 'no'} |")
    return lines


def optimizer_table(rows: list[dict]) -> list[str]:
    """Stage 2, mean over the logged steps and the seeds: pre-clip gradient norms, the global clip coefficient and
    the update sizes ||delta theta|| / ||theta|| per part. The total is the Trainer's ``grad_norm``, the norm its
    global clipping sees: under per-part clipping that is after the parts were clipped (marked †, and explained
    below the table with the total before, ``hub_cards.card.parts_total``)."""
    lines = [("| Method | max_grad_norm | per-part clip | pre-clip grad norm: total (vision / projector / norm / LLM) "
              "| clip coef | update size: vision / projector / norm / LLM |"), "| --- | --- | --- | --- | --- | --- |"]
    notes = []
    for row in rows:
        stats = (row.get("optimizer_step") or {}).get("mean") or {}
        training = row.get("training") or {}
        parts = " / ".join(_fmt(stats.get(f"grad_norm/{p}"), 2) for p in PARTS)
        sizes = " / ".join(_fmt(stats.get(f"update_size/{p}") and stats[f"update_size/{p}"] * 1e3, 2) for p in PARTS)
        per_part = bool(training.get("clip_per_part"))
        lines.append(f"| {row['name']} | {training.get('max_grad_norm', 'n/a')} | "
                     f"{'yes' if per_part else 'no'} | {_fmt(stats.get('grad_norm'), 2)}{' †' if per_part else ''} "
                     f"({parts}) | {_fmt(stats.get('clip_coef'), 3)} | {sizes} |")
        if per_part:
            notes.append(per_part_clip_note(row))
    lines.append("")
    lines.append("Update sizes in units of 1e-3 (per step); n/a: the part is not tracked there (the stock trainer logs no "
                 "per-part gradient norms; its vision tower is frozen).")
    for note in notes:
        lines += ["", note]
    return lines


def per_part_clip_note(row: dict) -> str:
    """Why a per-part clipping row's total is below its parts: they are read at different points of the step."""
    stats = (row.get("optimizer_step") or {}).get("mean") or {}
    max_norm = (row.get("training") or {}).get("max_grad_norm")
    count = sum(1 for p in PARTS if stats.get(f"grad_norm/{p}") is not None)
    share = f" = {max_norm / count ** 0.5:.2f}" if max_norm and count else ""
    return (f"† {row['name']}: the parts' norms are read before clipping; each part is then clipped to "
            f"max_grad_norm / sqrt({count} parts){share}, and the total is the norm of the gradient after that, the "
            f"one the Trainer's global clipping sees: at most max_grad_norm ({max_norm}), so the global clip coef is "
            f"1. Before the per-part clipping the total was {_fmt(stats.get('grad_norm_before_part_clip'), 2)} (the "
            "root sum of squares of the parts' norms; means over the logged steps and the seeds).")


def _by_key(rows: list[dict]) -> dict:
    return {r["key"]: r for r in rows}


def gwc_finding(rows: list[dict], contrasts: list[dict]) -> dict | None:
    """What GWC changed under AdamW in one demo run, as numbers: stage-2 means over the logged steps and the seeds
    (``optimizer_step``) of target init with and without GWC, with and without clipping, and the paired accuracy
    contrasts. None when the run lacks those rows. The demo's model card states it (``write_gwc_note``) from
    ``assets/demo_gwc.json``, which holds this dict for the run the docs quote (``python
    .ci/demo_report.py``)."""
    rows_by = _by_key(rows)
    need = ("norm_target_init", "norm_target_init_gwc", "norm_target_init_noclip", "norm_target_init_gwc_noclip")
    if not all(k in rows_by for k in need):
        return None

    def stat(key, name):
        return ((rows_by[key].get("optimizer_step") or {}).get("mean") or {}).get(name)

    def ratio(a, b):
        return None if a is None or not b else a / b

    c = {(x["key"], x["reference"]): x for x in contrasts}
    llm, vision = "update_size/llm", "update_size/vision_tower"
    return {
        "seeds": rows_by["norm_target_init_gwc"].get("seeds"),
        "llm_layers": len(rows_by["norm_target_init_gwc"]["layers"]["layers"]) - 1
        if rows_by["norm_target_init_gwc"].get("layers") else None,
        "steps": rows_by["norm_target_init_gwc"].get("steps"),
        "grad_norm": {"gwc": stat("norm_target_init_gwc", "grad_norm"), "no_gwc": stat("norm_target_init", "grad_norm")},
        "clip_coef": {"gwc": stat("norm_target_init_gwc", "clip_coef"), "no_gwc": stat("norm_target_init", "clip_coef")},
        "llm_update_ratio": {"clipped": ratio(stat("norm_target_init_gwc", llm), stat("norm_target_init", llm)),
                             "unclipped": ratio(stat("norm_target_init_gwc_noclip", llm),
                                                stat("norm_target_init_noclip", llm))},
        "vision_update_ratio": {"clipped": ratio(stat("norm_target_init_gwc", vision), stat("norm_target_init", vision)),
                                "unclipped": ratio(stat("norm_target_init_gwc_noclip", vision),
                                                   stat("norm_target_init_noclip", vision))},
        "accuracy": {"clipped": c.get(("norm_target_init_gwc", "norm_target_init")),
                     "unclipped": c.get(("norm_target_init_gwc_noclip", "norm_target_init_noclip"))},
    }


def _times(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def gwc_finding_text(finding: dict) -> str:
    """``gwc_finding`` in words (results.md, the docs, the model card)."""
    clipped = finding["llm_update_ratio"]["clipped"]
    if clipped is None:
        verdict = ""
    elif abs(clipped - 1) > 0.1:
        verdict = (" With clipping, GWC changed the LLM's update size by more than 10%: the global clipping carried "
                   "the compensated parts' gradient into the LLM's step.")
    else:
        verdict = (" Even with clipping, GWC changed the LLM's update size by less than 10%: AdamW divides each "
                   "parameter's gradient by its own running scale, which absorbs a common clip coefficient as it "
                   "absorbs GWC's factor; only the coefficient's change from step to step reaches the update.")

    def accuracy(entry):
        if not entry:
            return "n/a"
        return _interval(entry, True) + (" (separated from 0)" if entry.get("separated_from_zero")
                                         else " (not separated from 0)")

    grad, clip = finding["grad_norm"], finding["clip_coef"]
    return (
        f"With clipping at 1.0, GWC's stage-2 pre-clip gradient norm averaged {_fmt(grad['gwc'], 2)} "
        f"against {_fmt(grad['no_gwc'], 2)} without GWC, and the global clip coefficient "
        f"{_fmt(clip['gwc'])} against {_fmt(clip['no_gwc'])}. "
        f"The LLM's update size with GWC was {_times(clipped)} the one without, the vision tower's "
        f"{_times(finding['vision_update_ratio']['clipped'])}. Without clipping the same ratios were "
        f"{_times(finding['llm_update_ratio']['unclipped'])} (LLM) and "
        f"{_times(finding['vision_update_ratio']['unclipped'])} (vision tower).{verdict} In accuracy, GWC against no "
        f"GWC: {accuracy(finding['accuracy']['clipped'])} with clipping, {accuracy(finding['accuracy']['unclipped'])} "
        "without."
    )


def gwc_text(rows: list[dict], contrasts: list[dict]) -> str:
    """What GWC changed under AdamW in this run, from the optimizer-step table and the contrasts."""
    finding = gwc_finding(rows, contrasts)
    return gwc_finding_text(finding) if finding else ""


def _groups(profile: dict) -> tuple:
    """The token groups a profile has: the question, template and sink apart where it was measured so."""
    return ("vision", "question", "template", "sink") if profile.get("question") else ("vision", "text")


def layer_table(rows: list[dict], curve: str, digits: int, key: str = "layers") -> list[str]:
    """One line per row and token group: ``curve`` per LLM layer (``key``: "layers" after stage 2, "layers_init" at
    init); groups or curves a run did not record are left out."""
    rows = [r for r in rows if r.get(key)]
    if not rows:
        return []
    layers = rows[0][key]["layers"]
    lines = ["| Method | tokens | " + " | ".join(f"l={i}" for i in layers) + " |",
             "| --- | --- |" + " --- |" * len(layers)]
    for row in rows:
        profile = row[key]
        for group in _groups(profile):
            values = (profile.get(group) or {}).get(curve)
            if values is not None:
                lines.append(f"| {row['name']} | {group} | " + " | ".join(_fmt(v, digits) for v in values) + " |")
    return lines if len(lines) > 2 else []


def attention_table(rows: list[dict], digits: int = 3) -> list[str]:
    """Per decoder layer, the attention mass the question's tokens put on the image tokens, at init and after
    stage 2 (rows that recorded it)."""
    rows = [r for r in rows if (r.get("layers") or {}).get("attention_to_image")]
    if not rows:
        return []
    count = len(rows[0]["layers"]["attention_to_image"])
    lines = ["| Method | when | " + " | ".join(f"l={i}" for i in range(1, count + 1)) + " |",
             "| --- | --- |" + " --- |" * count]
    for row in rows:
        for key, when in (("layers_init", "init"), ("layers", "after stage 2")):
            values = (row.get(key) or {}).get("attention_to_image")
            if values:
                lines.append(f"| {row['name']} | {when} | " + " | ".join(_fmt(v, digits) for v in values) + " |")
    return lines


def depth_text(results: dict) -> str:
    rows = results["rows"]
    depth = len(rows[0]["layers"]["layers"]) - 1
    c = {(x["key"], x["reference"]): x for x in results.get("contrasts", [])}
    parts, changed = [], False
    for key in ("norm_target_init", "norm_target_init_gwc"):
        entry = c.get((key, "no_norm")) or next(
            ({**r["paired_to_baseline"]["real"]["avg"], "name": r["name"]} for r in rows
             if r["key"] == key and r.get("paired_to_baseline")), None)
        if entry is None:
            continue
        name = entry.get("name") or key
        changed = changed or _separated(entry)  # the verdict below reads the same entries as the parts
        verdict = "separated from zero" if _separated(entry) else "not separated from zero"
        parts.append(f"{name}: {_interval(entry, True)} against w/o Norm ({verdict})")
    if not parts:
        return ""
    return (f"At this depth ({depth} LLM layers), alignment's effect on the real-image accuracy: {'; '.join(parts)}. "
            + ("These runs show alignment changing the accuracy at this depth." if changed else
               "These runs do not show alignment changing the accuracy at this depth."))


def gain_table(rows: list[dict]) -> list[str]:
    """Real minus blank average accuracy: what each model read from the images."""
    lines = ["| Method | real images | blank images | visual gain |", "| --- | --- | --- | --- |"]
    for row in rows:
        real, blank = row["accuracy"]["real"]["avg"], row["accuracy"]["blank"]["avg"]
        lines.append(f"| {row['name']} | {real:.3f} | {blank:.3f} | {row['visual_gain']:+.3f} |")
    return lines


def norm_ratio_table(rows: list[dict]) -> list[str]:
    """The ratio at the LLM input at init, after stage 1 and after stage 2; where the run recorded them, also before
    the norm layer (the gap the norm closes) at init and after stage 2."""
    pre = any("pre_norm_init" in row["norm_ratio"] for row in rows)
    head = "| Method | at init (start of stage 1) | end of stage 1 (start of stage 2) | end of stage 2 |"
    rule = "| --- | --- | --- | --- |"
    if pre:
        head += " before the norm layer: at init | end of stage 2 |"
        rule += " --- | --- |"
    lines = [head, rule]
    for row in rows:
        ratio = row["norm_ratio"]
        line = (f"| {row['name']} | {_fmt(ratio.get('init'), 2)} | {_fmt(ratio.get('after_stage1'), 2)} | "
                f"{_fmt(ratio.get('after_stage2'), 2)} |")
        if pre:
            line += f" {_fmt(ratio.get('pre_norm_init'), 2)} | {_fmt(ratio.get('pre_norm_after_stage2'), 2)} |"
        lines.append(line)
    return lines


def table5(rows: list[dict]) -> list[str]:
    """Paper Table 5 layout: the projector norm's gain and bias after stage 1, per initialisation."""
    columns = [r for r in rows if r.get("gain_stats", {}).get("after_stage1")]
    if not columns:
        return ["(no variant with a projector norm was trained)"]
    header = "| Parameter | Metric | " + " | ".join(
        f"{r['name'].replace('w/ Norm, ', '')} (init -> after stage 1)" for r in columns) + " |"
    lines = [header, "| --- | --- |" + " --- |" * len(columns)]

    def cell(row, metric, spread=None):
        init, after = row["gain_stats"]["init"], row["gain_stats"]["after_stage1"]
        text = f"{init[metric]:.4f} -> {after[metric]:.4f}"
        if spread:
            text += f" (± {after[spread]:.4f})"
        return text

    lines.append("| Gain (g) | L2 norm | " + " | ".join(cell(r, "gain_l2") for r in columns) + " |")
    lines.append("| | Mean of abs. | " + " | ".join(cell(r, "gain_abs_mean", "gain_abs_std") for r in columns) + " |")
    lines.append("| Bias (β) | Mean of abs. | " + " | ".join(cell(r, "bias_abs_mean", "bias_abs_std")
                                                        for r in columns) + " |")
    return lines


def render_markdown(results: dict) -> str:
    """The demo's report (results.md): the setup, the accuracy tables, the mechanism, the figures and the model."""
    lines = [*_setup_lines(results), *_accuracy_lines(results), *_mechanism_lines(results), *_closing_lines(results)]
    return "\n".join(lines)


def _seeds_text(results: dict) -> str:
    seeds = results.get("seeds") or [results["setup"]["config"]["seed"]]
    return f"{len(seeds)} seeds ({', '.join(map(str, seeds))})"


def _setup_lines(results: dict) -> list[str]:
    dataset, parts = results["dataset"], results["parts"]
    chance = ", ".join(f"{k} {v:.2f}" for k, v in dataset["chance_accuracy"].items())
    text_only = ", ".join(f"{k} {v:.2f}" for k, v in dataset["text_only_accuracy_test"].items())
    return [
        "# Norm-aligned LLaVA at CPU scale: the paper's comparison on synthetic images",
        "",
        f"{results['setup']['summary']}",
        "",
        (f"Held-out test split: {dataset['rows']['test']} questions; chance per template: {chance}; best accuracy "
         f"a text-only model can reach on it: {text_only}."),
        "",
        (f"Norm gap of the parts (paper RQ1): vision encoder output norm "
         f"{parts['vision_feature_norm']['after_pretraining']:.2f} against text-embedding norm "
         f"{parts['text_embedding_norm']:.3f}."),
        "",
    ]


def _accuracy_lines(results: dict) -> list[str]:
    rows, baseline, seeds_text = results["rows"], results["baseline_key"], _seeds_text(results)
    return [
        f"## Average accuracy: mean ± 95% interval over {seeds_text} (* = the paired interval excludes 0)",
        "",
        *summary_table(rows),
        "",
        f"## Accuracy with the real images (paper Table 4 layout): mean ± 95% interval over {seeds_text}",
        "",
        *accuracy_table(rows, "real", baseline),
        "",
        *([STOCK_ROW_NOTE, ""] if any(r["key"] == "stock" for r in rows) else []),
        "## Paired differences to w/o Norm (same seeds, same data; * = the interval excludes 0)",
        "",
        *paired_table(rows, "real", baseline),
        "",
        separation_text(rows, next(r["name"] for r in rows if r["key"] == baseline)),
        "",
        power_text(rows, next(r["name"] for r in rows if r["key"] == baseline)),
        "",
        "## The same questions with blank images (what the text alone gives; chance 0.25)",
        "",
        *accuracy_table(rows, "blank", baseline),
        "",
        "## Visual gain: real minus blank (mean over seeds)",
        "",
        *gain_table(rows),
        "",
        "## What GWC does under AdamW: the optimizer step in stage 2",
        "",
        *optimizer_table(rows),
        "",
        *contrast_table(results.get("contrasts", [])),
        "",
        gwc_text(rows, results.get("contrasts", [])),
        "",
    ]


def text_drift_lines(rows: list[dict]) -> list[str]:
    """The text-alone reading (``demo.text_drift``) of runs with a real LLM: each row's KL from the original LLM, mean
    ± 95% interval over seeds, its paired difference to w/o Norm, and how often both pick the same next token."""
    rows = [r for r in rows if r.get("text_kl_interval")]
    if not rows:
        return []
    from .text_drift import ANSWER_TOKENS, PROMPTS

    lines = ["## The text kept: each row's LLM on text alone against the original LLM",
             "",
             (f"KL(original || trained) of the next-token distributions over the original LLM's greedy answers "
              f"({ANSWER_TOKENS} tokens) to {len(PROMPTS)} held-out text prompts, in nats per token (0: unchanged); "
              "mean ± 95% interval over seeds. No offline text set with answers ships with the demo, so there is "
              "no text accuracy here."),
             "",
             "| method | KL per token | paired difference to w/o Norm | detectable at 80% power | same top token |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        paired = row.get("text_kl_paired")
        diff = "(reference)" if paired is None else _interval(paired, signed=True) + (" *" if _separated(paired) else "")
        lines.append(f"| {row['name']} | {_interval(row['text_kl_interval'])} | {diff} | "
                     f"{'' if paired is None else _detectable(paired)} | {row['text_top1_agreement']:.3f} |")
    return [*lines, ""]


def curve_lines(rows: list[dict]) -> list[str]:
    """Held-out accuracy during training (rows that recorded it): per step over both stages, mean ± 95% interval
    over seeds."""
    rows = [r for r in rows if r.get("curve")]
    if not rows:
        return []
    steps = sorted({point["step"] for r in rows for point in r["curve"]})
    lines = ["## Held-out accuracy during training (does the norm change how fast the model learns?)", "",
             "Greedy answers to test questions spread over the templates, exact match, at the start and end of stage 1 "
             "(it trains on captions) and every few steps of stage 2 (`train --held_out_data_path` does the same for "
             "real runs); steps count both stages (the stock row trains one stage of as many steps, read all along); "
             "mean ± 95% interval over seeds.", "",
             "| Method | " + " | ".join(f"step {s}" for s in steps) + " |", "| --- |" + " --- |" * len(steps)]
    for row in rows:
        at = {point["step"]: point for point in row["curve"]}
        lines.append(f"| {row['name']} | " + " | ".join(_interval(at[s]) if s in at else "" for s in steps) + " |")
    return [*lines, ""]


def _split_mechanism_lines(rows: list[dict]) -> list[str]:
    """The readings runs with the token groups apart record (``demo.mechanism``): medians, the cumulative direction,
    the attention to the image, and the norms at init."""
    if not any((r.get("layers") or {}).get("question") for r in rows):
        return []
    groups = ("vision: image tokens; question: the question's own tokens; template: the chat template's other tokens; "
              "sink: each row's first token")
    return [
        f"Token groups: {groups}. Median token norm (one outlying token cannot move it):",
        "",
        *layer_table(rows, "norm_median", 3),
        "",
        "cos(h_l, h_0), the blog's cumulative direction (1: the tokens still point where they entered):",
        "",
        *layer_table(rows, "cos_to_layer0", 3),
        "",
        "Attention mass from the question's tokens to the image tokens (eager attention; summed over image tokens, "
        "mean over heads, question tokens and questions):",
        "",
        *attention_table(rows),
        "",
        "At init (before stage 1), mean token norm ||h_l||:",
        "",
        *layer_table(rows, "norm", 3, key="layers_init"),
        "",
        "At init, cos(h_l, h_0):",
        "",
        *layer_table(rows, "cos_to_layer0", 3, key="layers_init"),
        "",
    ]


def _mechanism_lines(results: dict) -> list[str]:
    rows, config = results["rows"], results["setup"]["config"]
    return [
        "## The mechanism after stage 2 (paper Fig. 4 (a) and (b), RQ3): per LLM layer, mean over seeds",
        "",
        (f"Measured on {config.get('layer_probe_images')} test questions with their images "
         "(``llava_normaligned.diagnostics``' residual tap); l=0 is the LLM's input. Mean token norm ||h_l||:"),
        "",
        *layer_table(rows, "norm", 3),
        "",
        "cos(h_l, h_{l-1}) (1: the tokens keep their direction through the layer):",
        "",
        *layer_table(rows, "cos_to_prev", 3),
        "",
        *_split_mechanism_lines(rows),
        depth_text(results),
        "",
        *text_drift_lines(rows),
        *curve_lines(rows),
        "## Vision/text norm ratio at the LLM input",
        "",
        (f"Mean L2 norm of the projected image tokens of {config['probe_images']} test images "
         "over T, the mean text-embedding norm (1 = aligned, paper §5.1)."),
        "",
        *norm_ratio_table(rows),
        "",
        "## The projector norm after stage 1 (paper Table 5 layout)",
        "",
        *table5(rows),
        "",
    ]


def _closing_lines(results: dict) -> list[str]:
    env = results.get("environment") or {}
    return [
        "## Figures",
        "",
        *[line for name, file in FIGURES.items()
          for line in (f"![{name}]({FIGURES_DIR}/{file})", "", figure_captions(results)[name], "")],
        f"## The saved model (`{results['best']['folder']}/`)",
        "",
        best_model_text(results),
        "",
        f"Wall time: {results['timing']['total_seconds']:.0f} s ({results['timing']['note']}).",
        "",
        (f"Floats depend on the machine: torch {env.get('torch')}, CPU capability {env.get('cpu_capability')}, "
         f"{env.get('torch_threads')} torch thread(s), {env.get('machine')}."
         + (f" Compute: {env['compute_dtype']}." if env.get("compute_dtype") else "")),
        "",
    ]


def best_model_text(results: dict) -> str:
    """Which row, and which of its runs, ``best_model/`` holds: how the row was set (not by accuracy), and the metric
    and candidates the run was picked from, with the values the tables' row is the mean of."""
    best = results["best"]
    row = next(r for r in results["rows"] if r["key"] == best["key"])
    chosen = best["seed_chosen_from"]
    values = "; ".join(f"seed {c['seed']}: {c[chosen['metric']]:.3f}" for c in chosen["candidates"])
    count = len(chosen["candidates"])
    interval = _interval(row["accuracy_interval"]["real"]["avg"])
    return (f"`{best['folder']}/` holds **{best['name']}** (`{best['key']}`), {best['row_chosen_by']}: the row is not "
            f"picked by accuracy. Of that row's {count} runs it holds seed {best['seed']}'s, the one with the highest "
            f"{chosen['metric_name']} ({chosen['metric_is']}; ties go to the larger visual gain, then the earlier "
            f"seed): {values}. The mean of these {count} values, {row['accuracy']['real']['avg']:.3f}, is that row's "
            f"real-image average in the tables above ({interval}). {SELECTION_NOTE}")


def write_tables(results: dict, output_dir: str) -> tuple[str, str]:
    """Write ``results.json`` and ``results.md`` (each to a temporary file first, then moved into place)."""
    json_path = os.path.join(output_dir, RESULTS_JSON)
    md_path = os.path.join(output_dir, RESULTS_MD)
    write_json_atomic(json_path, results, indent=1, default=str)
    write_text_atomic(md_path, render_markdown(results))
    return json_path, md_path


# ------------------------------------------------------------------------------------------------- figures


def _series(row: dict, metric: str) -> tuple[list[float], list[float], float | None]:
    """(steps, values, stage boundary): stage 1's records then stage 2's, on one step axis."""
    steps, values, offset, boundary = [], [], 0, None
    for stage in ("stage1", "stage2"):
        records = row.get("tracking", {}).get(stage) or []
        for record in records:
            if metric in record and record.get("step") is not None:
                steps.append(offset + record["step"])
                values.append(record[metric])
        if records and stage == "stage1":
            offset = max(r.get("step") or 0 for r in records)
            boundary = offset
    return steps, values, boundary


def _stage_series(row: dict, metric: str, stage: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one stage's records, on that stage's own step count."""
    records = [r for r in row.get("tracking", {}).get(stage) or [] if metric in r and r.get("step") is not None]
    return [r["step"] for r in records], [r[metric] for r in records]


def target_init_rows(rows: list[dict]) -> list[dict]:
    """The rows with the target-initialised norm (gain T / sqrt(D)): in the norm figures they start at the text norm
    and stay within a few percent of each other, so they get a panel of their own on a linear scale."""
    return [r for r in rows if (r.get("variant") or {}).get("projector_norm") == "layernorm"
            and (r.get("variant") or {}).get("norm_init") == "target"]


def curve_spread(curves: list[tuple[list[float], list[float]]]) -> float | None:
    """The largest relative spread between curves ``[(steps, values), ...]`` of one stage at the steps they share:
    max over those steps of (max - min) / mean. 0: the curves coincide; None: fewer than two curves share a step."""
    points: dict[float, list[float]] = {}
    for steps, values in curves:
        for step, value in zip(steps, values):
            points.setdefault(step, []).append(value)
    spreads = [(max(v) - min(v)) / (sum(v) / len(v)) for v in points.values() if len(v) >= 2 and sum(v) > 0]
    return max(spreads) if spreads else None


def _spread_text(spread: float | None) -> str:
    if spread is None:
        return "n/a"
    return "identical" if spread == 0 else f"within {spread:.2%}" if spread >= 1e-4 else "within 0.01%"


def _log_axis(ax) -> None:
    """A log y axis labelled in plain numbers at 1, 2 and 5 times the powers of ten (0.2, 0.5, 1, 2, 5, 10)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _mark_stages(ax, boundary) -> None:
    """A dashed line where stage 2 starts, named above the axes where no curve runs."""
    if not boundary:
        return
    from matplotlib.transforms import blended_transform_factory

    ax.axvline(boundary, color="black", linestyle="--", linewidth=0.8)
    above = blended_transform_factory(ax.transData, ax.transAxes)
    ax.text(boundary, 1.01, "stage 1 ", transform=above, ha="right", va="bottom", fontsize=8)
    ax.text(boundary, 1.01, " stage 2", transform=above, ha="left", va="bottom", fontsize=8)


def figure_captions(results: dict) -> dict[str, str]:
    """What each figure shows, under it in results.md."""
    seeds = results.get("seeds") or [results["setup"]["config"]["seed"]]
    first = f"the first seed's run of each row (seed {seeds[0]})"
    grid = ("First panel: every row on a log scale, the target-init rows as the range they span (they lie within a "
            "few percent of each other). Then one panel per target-init row on a shared linear scale, the row in "
            "colour over the other target-init rows in grey; the title gives the largest spread between them in each "
            "stage (in stage 1 the rows beside the paper's four continue from their paper row's stage-1 run, so "
            "they coincide there by construction).")
    per_row = ("One panel per row, all on one scale: image tokens (filled circles, solid) and text tokens (open "
               "squares, dashed)")
    return {
        "vision_text_ratio": f"Vision/text norm ratio at the LLM input over both stages, {first}; 1 = aligned. {grid}",
        "projector_output_norm": (f"Mean L2 norm of the projected image tokens over both stages, {first}, against "
                                  f"the text-embedding norm T. {grid}"),
        "norm_gain": (f"Mean |g| of the projector norm over both stages, {first} (paper Table 5). First panel: every "
                      "row with a norm on a log scale, the target-init rows as their range; then one panel per "
                      "target-init row on a shared linear scale, where a row trained with GWC has a right-hand axis "
                      "with its GWC factor, 1 / mean |g| (paper §5.1)."),
        "accuracy": "Real- and blank-image accuracy per row, mean over the templates and the seeds, with 95% "
                    "intervals over the seeds; the dotted line is chance.",
        "layer_norm": (f"Mean token norm ||h_l|| per LLM layer after stage 2, mean over the seeds. {per_row}; l = 0 "
                       "is the LLM's input."),
        "layer_cos": (f"cos(h_l, h_{{l-1}}) per LLM layer after stage 2, mean over the seeds. {per_row}; 1 = the "
                      "layer kept the tokens' direction. The axis starts at layer 1: the input (l = 0) has no layer "
                      "before it to compare with."),
    }


# One row's look in the figures. Colour, marker and dash differ from row to row; the alpha lets a curve beneath
# another show through. Rows that lie on top of each other get panels of their own (``_curve_grid``,
# ``_layer_grid``), so none hides another.
_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
            "tab:cyan", "tab:gray")
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<")
_DASHES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 2)), (0, (6, 2, 1, 2)))
_CONTEXT = {"color": "0.72", "linewidth": 1.0, "zorder": 1, "label": "the other target-init rows"}
_BAND = "tab:cyan"
_MODALITIES = (("vision", "image tokens", {"color": "tab:orange", "marker": "o", "linestyle": "-", "markersize": 5}),
               ("text", "text tokens", {"color": "tab:blue", "marker": "s", "linestyle": "--", "markersize": 8,
                                        "markerfacecolor": "none"}))


def _styles(rows: list[dict]) -> dict[str, dict]:
    """One colour, marker and line style per method, the same in every figure."""
    return {row["key"]: {"color": _COLOURS[i % len(_COLOURS)], "marker": _MARKERS[i % len(_MARKERS)],
                         "linestyle": _DASHES[i % len(_DASHES)], "markersize": 5, "linewidth": 1.4, "alpha": 0.85,
                         "zorder": 3}
            for i, row in enumerate(rows)}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, folder: str, name: str) -> str:
    path = os.path.join(folder, FIGURES[name])
    fig.savefig(path + ".tmp.png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    os.replace(path + ".tmp.png", path)
    return path


def _legend_below(fig, axes, ncol: int = 3) -> None:
    """One legend under the panels, each label once."""
    handles, labels = {}, []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    fig.legend([handles[label] for label in labels], labels, loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=ncol, fontsize=8, frameon=False)


def _panel_title(ax, text: str, pad: float = 16) -> None:
    import textwrap

    ax.set_title(textwrap.fill(text, 46), fontsize=8.5, pad=pad)


def _panels(count: int, columns: int, height: float):
    """A grid of at least ``count`` panels, ``columns`` wide; the spare ones are hidden."""
    rows = -(-count // columns)
    fig, axes = _pyplot().subplots(rows, columns, figsize=(4.5 * columns, height * rows), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def _same_ylim(axes) -> None:
    """One y range for ``axes``: the union of what each autoscaled to."""
    lows, highs = zip(*(ax.get_ylim() for ax in axes))
    for ax in axes:
        ax.set_ylim(min(lows), max(highs))


def _target_band(ax, rows: list[dict], metric: str) -> None:
    """The target-init rows in the overview panel: the range they span at each step (one row each is drawn in its own
    panel), so that five curves a few percent apart do not hide one another on a log scale."""
    points: dict[float, list[float]] = {}
    for row in rows:
        for step, value in zip(*_series(row, metric)[:2]):
            points.setdefault(step, []).append(value)
    steps = sorted(points)
    if steps:
        ax.fill_between(steps, [min(points[s]) for s in steps], [max(points[s]) for s in steps], color=_BAND,
                        alpha=0.45, edgecolor=_BAND, linewidth=1.6, zorder=2,
                        label=f"the {len(rows)} target-init rows: their range (one panel each)")


def _curve_panel(ax, row: dict, others: list[dict], metric: str, style: dict) -> None:
    """One target-init row in colour over the other target-init rows in grey."""
    for other in others:
        steps, values, _ = _series(other, metric)
        ax.plot(steps, values, **_CONTEXT)
    steps, values, boundary = _series(row, metric)
    ax.plot(steps, values, label=row["name"], **style)
    _mark_stages(ax, boundary)
    _panel_title(ax, row["name"])


def _spread_title(rows: list[dict], metric: str) -> str:
    return ", ".join(f"{stage.replace('stage', 'stage ')}: "
                     f"{_spread_text(curve_spread([_stage_series(r, metric, stage) for r in rows]))}"
                     for stage in ("stage1", "stage2"))


def _overview_panels(axes, rows: list[dict], targets: list[dict], metric: str, style: dict) -> None:
    """The first two panels of ``_curve_grid``: every row on a log scale, the target-init rows as their range; then
    the other rows alone on a linear scale, where they are told apart."""
    overview, others = axes
    boundary = None
    for row in rows:
        steps, values, b = _series(row, metric)
        boundary = boundary or b
        if row not in targets:
            for ax in (overview, others):
                ax.plot(steps, values, label=row["name"], **style[row["key"]])
    _target_band(overview, targets, metric)
    for ax in (overview, others):
        _mark_stages(ax, boundary)
    _log_axis(overview)
    _panel_title(overview, "every row (log scale)")
    _panel_title(others, "the rows without the target-init norm (linear scale)")


def _curve_grid(rows: list[dict], metric: str, ylabel: str, title: str, reference: tuple[float, str] | None):
    """Two overview panels (``_overview_panels``) and one panel per target-init row (linear, one scale), the legend
    in the spare slot. ``reference``: (value, label) of a dotted horizontal line in the panels it falls in."""
    style = _styles(rows)
    drawn = [r for r in rows if _series(r, metric)[0]]
    targets = target_init_rows(drawn)
    fig, axes = _panels(2 + len(targets), 4, 3.9)
    _overview_panels(axes[:2], drawn, targets, metric, style)
    panels = axes[2:]
    for ax, row in zip(panels, targets):
        _curve_panel(ax, row, [r for r in targets if r is not row], metric, style[row["key"]])
    for ax in axes:
        low, high = ax.get_ylim()
        if reference and (ax is not axes[1] or low <= reference[0] <= high):  # the linear overview keeps its scale
            ax.axhline(reference[0], color="grey", linestyle=":", linewidth=1, label=reference[1])
        ax.set_ylabel(ylabel, fontsize=8)
        ax.set_xlabel("training step (stage 1, then stage 2)", fontsize=8)
    if panels:
        _same_ylim(panels)
    fig.suptitle(f"{title}\nlargest spread between the {len(targets)} target-init rows, "
                 f"{_spread_title(targets, metric)}", fontsize=10)
    _legend_below(fig, axes, ncol=4)
    fig.tight_layout()
    return fig


def _figure_vision_text_ratio(results: dict, folder: str) -> str:
    """Paper Fig. 4 (a) at the LLM input: the vision/text norm ratio over both stages."""
    fig = _curve_grid(results["rows"], "vision_text_ratio", "vision / text norm at the LLM input",
                      "Vision/text norm ratio at the LLM input (the stock row: its single stage)", (1.0, "aligned (1)"))
    return _save(fig, folder, "vision_text_ratio")


def _figure_projector_output_norm(results: dict, folder: str) -> str:
    """The blog's figure: the projected image tokens' norm over both stages, against the text-embedding norm."""
    rows = results["rows"]
    _, text_norms, _ = _series(rows[0], "text_embedding_norm")
    reference = (text_norms[0], "text-embedding norm T") if text_norms else None
    fig = _curve_grid(rows, "projector_output_norm", "mean L2 norm of the projected image tokens",
                      "Projector output norm (the stock row: its single stage)", reference)
    return _save(fig, folder, "projector_output_norm")


def _gwc_axis(ax, row: dict) -> None:
    """A right-hand axis with the GWC factor 1 / mean |g| of a row trained with GWC, when its tracked factor is that
    (the clamp at the compensation minimum never reached)."""
    records = [r for stage in ("stage1", "stage2") for r in row.get("tracking", {}).get(stage) or []
               if r.get("gwc_factor") and r.get("gain_abs_mean")]
    if not records or any(abs(r["gwc_factor"] * r["gain_abs_mean"] - 1) > 1e-4 for r in records):
        return
    import numpy as np

    def inverse(value):
        return 1 / np.maximum(value, 1e-12)  # matplotlib probes the transform at 0 too

    axis = ax.secondary_yaxis("right", functions=(inverse, inverse))
    axis.set_ylabel("GWC factor 1 / mean |g|", fontsize=8)
    axis.tick_params(labelsize=8)


def _figure_norm_gain(results: dict, folder: str) -> str:
    """Paper Table 5 and §5.1 over training: the norm's mean |g| (and, for GWC rows, its factor 1 / mean |g|)."""
    rows = [r for r in results["rows"] if _series(r, "gain_abs_mean")[0]]
    style = _styles(results["rows"])
    targets = target_init_rows(rows)
    fig, axes = _panels(1 + len(targets), 3, 3.9)
    boundary = None
    for row in rows:
        steps, values, b = _series(row, "gain_abs_mean")
        boundary = boundary or b
        if row not in targets:
            axes[0].plot(steps, values, label=row["name"], **style[row["key"]])
    _target_band(axes[0], targets, "gain_abs_mean")
    _mark_stages(axes[0], boundary)
    _log_axis(axes[0])
    _panel_title(axes[0], "every row with a norm (log scale)")
    for ax, row in zip(axes[1:], targets):
        _curve_panel(ax, row, [r for r in targets if r is not row], "gain_abs_mean", style[row["key"]])
        if (row.get("variant") or {}).get("gradient_compensation"):
            _gwc_axis(ax, row)
    for ax in axes:
        ax.set_ylabel("mean |g| of the projector norm", fontsize=8)
        ax.set_xlabel("training step (stage 1, then stage 2)", fontsize=8)
    if len(axes) > 1:
        _same_ylim(axes[1:])
    fig.suptitle("Mean |g| of the projector norm (paper Table 5) and the GWC factor (paper §5.1)\nlargest spread "
                 f"between the {len(targets)} target-init rows, {_spread_title(targets, 'gain_abs_mean')}", fontsize=10)
    _legend_below(fig, axes)
    fig.tight_layout()
    return _save(fig, folder, "norm_gain")


def _figure_accuracy(results: dict, folder: str) -> str:
    """Real and blank accuracy per row, with their 95% intervals and chance."""
    rows = results["rows"]
    fig, ax = _pyplot().subplots(figsize=(8, 4.4))
    width, top = 0.38, 1.0
    for i, row in enumerate(rows):
        for offset, condition, bar_colour, label in ((-width / 2, "real", "tab:blue", "real images"),
                                                     (width / 2, "blank", "tab:gray", "blank images")):
            value = row["accuracy"][condition]["avg"]
            half = row.get("accuracy_interval", {}).get(condition, {}).get("avg", {}).get("half_width")
            ax.bar(i + offset, value, width, color=bar_colour, label=label if i == 0 else None, yerr=half, capsize=2)
            # the value as results.md prints it, upright above the error bar: neither crosses it nor runs into its
            # neighbour's
            above = value + (half or 0) + 0.015
            ax.text(i + offset, above, f"{value:.3f}", rotation=90, ha="center", va="bottom", fontsize=7)
            top = max(top, above + 0.13)
    chance = sum(results["dataset"]["chance_accuracy"].values()) / len(results["dataset"]["chance_accuracy"])
    ax.axhline(chance, color="black", linestyle=":", label=f"chance ({chance:.2f})")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([row["name"].replace(", ", ",\n").replace(" (", "\n(") for row in rows], fontsize=7)
    ax.set_ylabel("test accuracy\n(mean over templates and seeds;\nerror bars: 95% interval)", fontsize=9)
    ax.set_ylim(0, top)  # room for the value labels
    # above the axes, where no bar is: inside, it covered the last (stock) bars
    ax.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    return _save(fig, folder, "accuracy")


def _layer_grid(rows: list[dict], curve: str, ylabel: str, first_layer: int, title: str):
    """One panel per row (paper Fig. 4's per-model panels), image and text tokens in each, every panel on one
    scale: rows whose curves coincide (the rows without the target-init norm) each stay visible."""
    fig, axes = _panels(len(rows), 4, 3.4)
    layers = [l for l in rows[0]["layers"]["layers"] if l >= first_layer]
    for ax, row in zip(axes, rows):
        for modality, label, look in _MODALITIES:
            points = [(l, v) for l, v in zip(row["layers"]["layers"], row["layers"][modality][curve])
                      if v is not None and l >= first_layer]
            if points:
                ax.plot(*zip(*points), label=label, alpha=0.85, linewidth=1.4, **look)
        _panel_title(ax, row["name"], pad=6)
        ax.set_xticks(layers)
        ax.set_xlabel("LLM layer l" + (" (0: the LLM's input)" if first_layer == 0 else ""), fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        if curve == "norm":
            _log_axis(ax)
    _same_ylim(axes)
    fig.suptitle(title, fontsize=10)
    _legend_below(fig, axes, ncol=2)
    fig.tight_layout()
    return fig


def _figure_layer_norm(results: dict, folder: str) -> str:
    """Paper Fig. 4 (a) per layer: the token norm ||h_l|| from the LLM's input."""
    fig = _layer_grid(results["rows"], "norm", r"mean token norm $\|h_l\|$ (log)", 0,
                      "Mean token norm per LLM layer after stage 2, mean over the seeds")
    return _save(fig, folder, "layer_norm")


def _figure_layer_cos(results: dict, folder: str) -> str:
    """Paper Fig. 4 (b): cos(h_l, h_{l-1}) from layer 1 (the input has no layer before it)."""
    fig = _layer_grid(results["rows"], "cos_to_prev", r"$\cos(h_l, h_{l-1})$", 1,
                      "Direction kept by each LLM layer after stage 2, mean over the seeds (from layer 1: the input, "
                      "l = 0, has no layer before it)")
    return _save(fig, folder, "layer_cos")


FIGURE_WRITERS = {
    "vision_text_ratio": _figure_vision_text_ratio,
    "projector_output_norm": _figure_projector_output_norm,
    "norm_gain": _figure_norm_gain,
    "accuracy": _figure_accuracy,
    "layer_norm": _figure_layer_norm,
    "layer_cos": _figure_layer_cos,
}


def write_figures(results: dict, output_dir: str) -> dict[str, str]:
    """The norm-tracking figures (paper Fig. 4 at the LLM input, the blog's projector-norm curve, the norm's gain
    and GWC factor), the accuracy bars and the per-layer profiles, one function each (``FIGURE_WRITERS``). Returns
    {name: path}."""
    folder = os.path.join(output_dir, FIGURES_DIR)
    os.makedirs(folder, exist_ok=True)
    return {name: FIGURE_WRITERS[name](results, folder) for name in FIGURES}


# ------------------------------------------------------------------------------ the README's and docs' excerpt

DEMO_COMMAND = "llava-normaligned demo --output-dir demo_out"
GWC_ASSET = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "demo_gwc.json")


def measured_section(results: dict, command: str = DEMO_COMMAND) -> str:
    """What the README and docs/demo.md quote from one run's ``results.json``: how it was measured, the headline
    table, which differences the intervals separate from zero, what GWC did and the verdict at this depth."""
    timing, env = results["timing"], results.get("environment") or {}
    seeds = ", ".join(map(str, results["seeds"]))
    layers = len(results["rows"][0]["layers"]["layers"]) - 1  # the LLM's decoder layers (l = 0 is its input)
    steps = results["setup"]["config"]
    baseline = next(r["name"] for r in results["rows"] if r["key"] == results["baseline_key"])
    cores = os.cpu_count() or 2
    busy = max(timing["load_average_start"], timing["load_average_end"]) > cores + 1  # the demo itself loads every core
    load_note = "other jobs running, so not a quiet timing" if busy else "no other job running"
    head = (f"Measured by `{command}` (seeds {seeds}; {layers}-layer LLM, {steps['stage1_steps']} + "
            f"{steps['stage2_steps']} steps): {timing['total_seconds']:.0f} s wall on the project's 2-core "
            f"machine, {timing.get('workers', 1)} worker process(es), 1-minute load average "
            f"{timing['load_average_start']:.1f} at the start and {timing['load_average_end']:.1f} at the end "
            f"({load_note}); torch {env.get('torch')}, CPU capability "
            f"{env.get('cpu_capability')}, {env.get('torch_threads')} torch thread(s) per run. Real- and blank-image "
            "average accuracy, mean ± 95% interval over the seeds, and the paired difference to w/o Norm (* = its "
            "interval excludes 0), as `results.md` prints it:")
    parts = [head, "", *summary_table(results["rows"]), "", separation_text(results["rows"], baseline), "",
             power_text(results["rows"], baseline), "", gwc_text(results["rows"], results.get("contrasts", [])), "", depth_text(results)]
    return "\n".join(parts).rstrip() + "\n"


def write_gwc_asset(results: dict, path: str | None = None, command: str = DEMO_COMMAND) -> dict:
    """Keep ``gwc_finding`` of the run the docs quote where the model card reads it."""
    finding = gwc_finding(results["rows"], results.get("contrasts", []))
    if finding is None:
        raise ValueError("results.json lacks the rows of the GWC ablation (target init with/without GWC, clipping)")
    record = {"about": "What GWC did under AdamW in the CPU demo the docs quote (llava_normaligned.demo.results_text."
                       "gwc_finding of its results.json); the demo's model card states it.",
              "command": command, "finding": finding}
    with open(path or GWC_ASSET, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1)
        handle.write("\n")
    return record


def read_gwc_asset(path: str | None = None) -> dict | None:
    try:
        with open(path or GWC_ASSET, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def demo_gwc_text(asset: dict | None = None) -> str | None:
    """The package's measured CPU-demo finding on GWC under AdamW, in words, from ``asset`` (default: the shipped
    ``assets/demo_gwc.json``, written from the run the docs quote by ``--write-asset``); None without a finding."""
    asset = asset if asset is not None else read_gwc_asset()
    if not asset or not asset.get("finding"):
        return None
    finding = asset["finding"]
    seeds = finding.get("seeds") or []
    steps = finding.get("steps") or {}
    scope = ", ".join(x for x in (
        f"{len(seeds)} seeds" if seeds else "",
        f"{finding['llm_layers']}-layer LLM" if finding.get("llm_layers") else "",
        f"{steps.get('stage1')} + {steps.get('stage2')} steps" if steps else "") if x)
    return (f"In the package's CPU demo (`{asset.get('command', 'llava-normaligned demo')}`"
            f"{'; ' + scope if scope else ''}; target init with and without GWC, each with clipping at 1.0 and "
            f"without): {gwc_finding_text(finding)}")


def write_gwc_note(folder: str) -> str | None:
    """Give the demo's checkpoint folder its card note (``hub_cards.card.CARD_NOTES``): the demo's GWC finding, which
    its card states under the run's own GWC numbers (a card renders a note only for a checkpoint trained with GWC).
    Cards of other checkpoints carry no such note. Returns the note's path, or None without a finding."""
    from llava_normaligned.hub_cards.card import write_card_notes

    text = demo_gwc_text()
    return str(write_card_notes(folder, {"gwc": text})) if text else None
