"""The CPU demo's outputs: ``results.json``, ``results.md`` (the paper's Tables 4 and 5 layout) and the figures.

Everything here reads the ``results`` dict that ``run.py`` assembles; nothing is computed twice. Rows of
``results["rows"]`` (one per variant, then the stock row):

    {"name", "key", "recipe", "accuracy": {"real": {template: acc, "avg": acc}, "blank": {...}}, "visual_gain",
     "norm_ratio": {"init", "after_stage1", "after_stage2"}, "gain_stats": {"init", "after_stage1", "after_stage2"},
     "tracking": {"stage1": [records], "stage2": [records]}, "train_loss": {...}, "seconds": {...}}
"""

from __future__ import annotations

import json
import os

# Next to the tables: how the stock row was trained differs from the four variants' recipe in three ways.
STOCK_ROW_NOTE = (
    "The stock row is not the variants' recipe with the norm removed; it differs in three ways, as LLaVA trained "
    "with stock TRL would: **one stage** (stage 1 + stage 2 steps, at the stage-2 rate), **no captions** (it trains "
    "on the questions only, never on the stage-1 caption data) and **the vision tower frozen** (stock TRL has one "
    "learning rate for every part). The w/o Norm row is the like-for-like comparison for the norm."
)
# The best variant is picked on the test split it is then reported on (the synthetic set has no validation split).
SELECTION_NOTE = (
    "It was selected by its accuracy on this same test split (there is no separate validation split), so that "
    "accuracy, the best of four, is optimistic as an estimate of the selected model's accuracy."
)

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
FIGURES_DIR = "figures"
FIGURES = {
    "vision_text_ratio": "vision_text_ratio.png",
    "projector_output_norm": "projector_output_norm.png",
    "norm_gain": "norm_gain.png",
    "accuracy": "accuracy.png",
}


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"


def _delta(value: float, reference: float) -> str:
    return f"{value:.3f} ({value - reference:+.3f})"


def _templates(rows: list[dict]) -> list[str]:
    return [name for name in rows[0]["accuracy"]["real"] if name != "avg"]


# ------------------------------------------------------------------------------------------------- tables


def accuracy_table(rows: list[dict], condition: str, baseline_key: str) -> list[str]:
    """Paper Table 4 layout: one row per method, accuracy per template and the average, each with its change
    against the "w/o Norm" row."""
    templates = _templates(rows)
    reference = next(r for r in rows if r["key"] == baseline_key)["accuracy"][condition]
    lines = ["| Method | " + " | ".join(templates) + " | Avg |", "| --- " * (len(templates) + 2) + "|"]
    for row in rows:
        accuracy = row["accuracy"][condition]
        if row["key"] == baseline_key:
            cells = [_fmt(accuracy[t]) for t in templates + ["avg"]]
        else:
            cells = [_delta(accuracy[t], reference[t]) for t in templates + ["avg"]]
        lines.append(f"| {row['name']} | " + " | ".join(cells) + " |")
    return lines


def gain_table(rows: list[dict]) -> list[str]:
    """Real minus blank average accuracy: what each model read from the images."""
    lines = ["| Method | real images | blank images | visual gain |", "| --- | --- | --- | --- |"]
    for row in rows:
        real, blank = row["accuracy"]["real"]["avg"], row["accuracy"]["blank"]["avg"]
        lines.append(f"| {row['name']} | {real:.3f} | {blank:.3f} | {row['visual_gain']:+.3f} |")
    return lines


def norm_ratio_table(rows: list[dict]) -> list[str]:
    lines = ["| Method | at init (start of stage 1) | end of stage 1 (start of stage 2) | end of stage 2 |",
             "| --- | --- | --- | --- |"]
    for row in rows:
        ratio = row["norm_ratio"]
        lines.append(f"| {row['name']} | {_fmt(ratio.get('init'), 2)} | {_fmt(ratio.get('after_stage1'), 2)} | "
                     f"{_fmt(ratio.get('after_stage2'), 2)} |")
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
    rows = results["rows"]
    baseline = results["baseline_key"]
    dataset = results["dataset"]
    setup = results["setup"]
    parts = results["parts"]
    chance = ", ".join(f"{k} {v:.2f}" for k, v in dataset["chance_accuracy"].items())
    text_only = ", ".join(f"{k} {v:.2f}" for k, v in dataset["text_only_accuracy_test"].items())
    lines = [
        "# Norm-aligned LLaVA at CPU scale: the paper's comparison on synthetic images",
        "",
        f"{setup['summary']}",
        "",
        (f"Held-out test split: {dataset['rows']['test']} questions; chance per template: {chance}; best accuracy "
         f"a text-only model can reach on it: {text_only}."),
        "",
        (f"Norm gap of the parts (paper RQ1): vision encoder output norm "
         f"{parts['vision_feature_norm']['after_pretraining']:.2f} against text-embedding norm "
         f"{parts['text_embedding_norm']:.3f}."),
        "",
        "## Accuracy with the real images (paper Table 4 layout; change against w/o Norm)",
        "",
        *accuracy_table(rows, "real", baseline),
        "",
        STOCK_ROW_NOTE,
        "",
        "## The same questions with blank images (what the text alone gives; chance 0.25)",
        "",
        *accuracy_table(rows, "blank", baseline),
        "",
        "## Visual gain: real minus blank",
        "",
        *gain_table(rows),
        "",
        "## Vision/text norm ratio at the LLM input",
        "",
        (f"Mean L2 norm of the projected image tokens of {results['setup']['config']['probe_images']} test images "
         "over T, the mean text-embedding norm (1 = aligned, paper §5.1)."),
        "",
        *norm_ratio_table(rows),
        "",
        "## The projector norm after stage 1 (paper Table 5 layout)",
        "",
        *table5(rows),
        "",
        "## Figures",
        "",
        *[f"![{name}]({FIGURES_DIR}/{file})" for name, file in FIGURES.items()],
        "",
        (f"Best variant (highest real-image average): **{results['best']['name']}**, saved in "
         f"`{results['best']['folder']}`. {SELECTION_NOTE}"),
        "",
        f"Wall time: {results['timing']['total_seconds']:.0f} s ({results['timing']['note']}).",
        "",
    ]
    return "\n".join(lines)


def write_tables(results: dict, output_dir: str) -> tuple[str, str]:
    """Write ``results.json`` and ``results.md`` (each to a temporary file first, then moved into place)."""
    json_path = os.path.join(output_dir, RESULTS_JSON)
    md_path = os.path.join(output_dir, RESULTS_MD)
    for path, text in ((json_path, json.dumps(results, indent=1, default=str)), (md_path, render_markdown(results))):
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(path + ".tmp", path)
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


def _colours(rows: list[dict]) -> dict[str, str]:
    """One colour per method, the same in every figure."""
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink")
    return {row["key"]: palette[i % len(palette)] for i, row in enumerate(rows)}


def write_figures(results: dict, output_dir: str) -> dict[str, str]:
    """The norm-tracking figures (paper Fig. 4 at the LLM input, the blog's projector-norm curve, the norm's gain
    and GWC factor) and the accuracy bars. Returns {name: path}."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    folder = os.path.join(output_dir, FIGURES_DIR)
    os.makedirs(folder, exist_ok=True)
    rows = results["rows"]
    colour = _colours(rows)
    paths = {}

    def save(fig, name):
        path = os.path.join(folder, FIGURES[name])
        fig.tight_layout()
        fig.savefig(path + ".tmp.png", dpi=110)
        plt.close(fig)
        os.replace(path + ".tmp.png", path)
        paths[name] = path

    for name, metric, ylabel in (
        ("vision_text_ratio", "vision_text_ratio", "vision / text norm at the LLM input"),
        ("projector_output_norm", "projector_output_norm", "mean L2 norm of the projected image tokens"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4))
        boundary = None
        for row in rows:
            steps, values, b = _series(row, metric)
            boundary = boundary or b
            if steps:
                ax.plot(steps, values, label=row["name"], marker=".", color=colour[row["key"]])
        if metric == "vision_text_ratio":
            ax.axhline(1.0, color="grey", linestyle=":", label="aligned (1)")
        else:
            steps, values, _ = _series(rows[0], "text_embedding_norm")
            if values:
                ax.axhline(values[0], color="grey", linestyle=":", label="text-embedding norm T")
        if boundary:
            ax.axvline(boundary, color="black", linestyle="--", linewidth=0.8)
            ax.text(boundary, ax.get_ylim()[1], " stage 2", va="top", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("training step (stage 1, then stage 2; the stock row: its single stage)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
        save(fig, name)

    fig, (ax_gain, ax_gwc) = plt.subplots(1, 2, figsize=(10, 4))
    for row in rows:
        steps, values, _ = _series(row, "gain_abs_mean")
        if steps:
            ax_gain.plot(steps, values, label=row["name"], marker=".", color=colour[row["key"]])
        steps, values, _ = _series(row, "gwc_factor")
        if steps:
            ax_gwc.plot(steps, values, label=row["name"], marker=".", color=colour[row["key"]])
    ax_gain.set_yscale("log")
    ax_gain.set_title("mean |g| of the projector norm (paper Table 5)")
    ax_gwc.set_title("GWC factor 1 / clamp(mean |g|, 1e-3) (paper §5.1)")
    for ax in (ax_gain, ax_gwc):
        ax.set_xlabel("training step (stage 1, then stage 2)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    save(fig, "norm_gain")

    fig, ax = plt.subplots(figsize=(8, 4.4))
    width = 0.38
    for i, row in enumerate(rows):
        for offset, condition, bar_colour, label in ((-width / 2, "real", "tab:blue", "real images"),
                                                     (width / 2, "blank", "tab:gray", "blank images")):
            bars = ax.bar(i + offset, row["accuracy"][condition]["avg"], width, color=bar_colour,
                          label=label if i == 0 else None)
            ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=2)  # as results.md prints them
    chance = sum(results["dataset"]["chance_accuracy"].values()) / len(results["dataset"]["chance_accuracy"])
    ax.axhline(chance, color="black", linestyle=":", label=f"chance ({chance:.2f})")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([row["name"].replace(", ", ",\n").replace(" (", "\n(") for row in rows], fontsize=7)
    ax.set_ylabel("test accuracy (mean over templates)")
    ax.set_ylim(0, 1.08)  # room for a value label on a bar at 1.0
    # above the axes, where no bar is: inside, it covered the last (stock) bars
    ax.legend(fontsize=8, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    save(fig, "accuracy")
    return paths
