"""PNG figures of a diagnostics document: the paper's Fig. 4 and the blog post's figures.

Colour tells apart what is compared within a model (vision / text tokens; real / blank / no image; prefill /
decode); line style and marker tell the models apart (the model solid with circles, the baseline dashed with
squares). A figure that compares the models only (the α sweeps) colours them too. Labels use matplotlib's mathtext
(``$h_{l-1}$``). matplotlib is imported here only, with the Agg backend, so the probes run where it is not installed.
"""

from __future__ import annotations

import io
import math
import os

from ..atomic_files import write_bytes_atomic
from .output_files import models

MODALITY_COLOURS = {"vision": "tab:blue", "text": "tab:orange"}
CONDITION_COLOURS = {"real": "tab:blue", "blank": "tab:gray", "no_image": "tab:green"}
PHASE_COLOURS = {"prefill": "tab:blue", "decode": "tab:red"}
MODEL_COLOURS = {"model": "tab:purple", "baseline": "tab:green"}  # figures comparing the models only
MODEL_STYLES = {"model": {"linestyle": "-", "marker": "o"}, "baseline": {"linestyle": "--", "marker": "s"}}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _label(label: str, numbers: dict) -> str:
    return f"{label}: {os.path.basename(str(numbers['model_id']).rstrip('/')) or numbers['model_id']}"


def _values(xs, ys):
    pairs = [(x, y) for x, y in zip(xs, ys or []) if y is not None and not (isinstance(y, float) and math.isnan(y))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _style(label: str, **overrides) -> dict:
    return {"markersize": 3.5, **MODEL_STYLES[label], **overrides}


def _save(fig, path: str) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return write_bytes_atomic(path, buffer.getvalue(), make_folder=True)


def _layer_panels(document, panels, title):
    """One panel per (statistic, y-label, log-scale) over layers, vision and text, model and baseline."""
    plt = _pyplot()
    columns = min(len(panels), 2)
    fig, axes = plt.subplots(math.ceil(len(panels) / columns), columns, layout="constrained", squeeze=False,
                             figsize=(5 * columns, 3.6 * math.ceil(len(panels) / columns)))
    axes = list(axes.flat)
    for ax, (stat, ylabel, log) in zip(axes, panels):
        for label, numbers in models(document):
            layers = numbers["layers"]
            for modality in ("vision", "text"):
                if not layers.get(modality):
                    continue
                x, y = _values(layers["index"], layers[modality][stat])
                ax.plot(x, y, color=MODALITY_COLOURS[modality], **_style(label),
                        label=f"{_label(label, numbers)} · {modality}")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.set_ylabel(ylabel)
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return fig


def fig_norms_cosine(document, output_dir):
    """Paper Fig. 4: (a) layer-wise L2 norms, (b) inter-layer cosine similarity, per modality."""
    fig = _layer_panels(
        document,
        [("norm", r"(a) mean L2 norm of $h_l$", True), ("cos_to_prev", r"(b) $\cos(h_l, h_{l-1})$", False)],
        "Layer-wise norms and inter-layer similarity (paper Fig. 4)",
    )
    return _save(fig, os.path.join(output_dir, "fig_norms_cosine.png"))


def fig_trajectories(document, output_dir):
    """The blog's Observations 1-2: norms, absolute updates and cosine to layer 0."""
    fig = _layer_panels(
        document,
        [("norm", r"mean $\Vert h_l \Vert$", True), ("update_abs", r"mean $\Vert h_l - h_{l-1} \Vert$", True),
         ("update_rel", r"mean $\Vert h_l - h_{l-1} \Vert \,/\, \Vert h_{l-1} \Vert$", True),
         ("cos_to_layer0", r"$\cos(h_l, h_0)$", False)],
        "Token trajectories per modality",
    )
    return _save(fig, os.path.join(output_dir, "fig_trajectories.png"))


def fig_ablations(document, output_dir):
    """The blog's Ablation 1: the text tokens' trajectories with the real image, a blank one, and none."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    panels = [("norm", r"text tokens: mean $\Vert h_l \Vert$"), ("cos_to_layer0", r"text tokens: $\cos(h_l, h_0)$")]
    for ax, (stat, ylabel) in zip(axes, panels):
        for label, numbers in models(document):
            for condition, curves in numbers["ablations"]["curves"].items():
                if curves[stat] is None:
                    continue
                ax.plot(range(len(curves[stat])), curves[stat], color=CONDITION_COLOURS[condition], **_style(label),
                        label=f"{_label(label, numbers)} · {condition.replace('_', ' ')}")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Text-token trajectories: real, blank and no image")
    return _save(fig, os.path.join(output_dir, "fig_ablations.png"))


def _sweep_panels(document, panels, title, name, output_dir):
    plt = _pyplot()
    # constrained layout makes room for each panel's tick labels and y-label (they overlapped the next panel)
    columns = min(len(panels), 2)
    rows_of_panels = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows_of_panels, columns, figsize=(5 * columns, 3.4 * rows_of_panels),
                             layout="constrained", squeeze=False)
    axes = list(axes.flat)
    for ax, (key, ylabel, scale) in zip(axes, panels):
        for label, numbers in models(document):
            rows = numbers["alpha_sweep"]["rows"]
            x, y = _values([r["alpha"] for r in rows], [r[key] for r in rows])
            ax.plot(x, y, color=MODEL_COLOURS[label], **_style(label), label=_label(label, numbers))
            matching = numbers["alpha_sweep"]["norm_matching_alpha"]
            if matching:
                ax.axvline(matching, color=MODEL_COLOURS[label], alpha=0.5, linestyle=":")
        ax.set_xscale("log")
        if scale == "symlog":  # KL is exactly 0 at the reference alpha
            ax.set_yscale("symlog", linthresh=1e-4)
            ax.set_ylim(bottom=0)
        elif scale == "log":
            from matplotlib.ticker import LogFormatter

            ax.set_yscale("log")
            for axis_setter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                axis_setter(LogFormatter())  # ranks read 1, 2, 10, not 2 x 10^0
        ax.set_xlabel("α (projector output scale)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, os.path.join(output_dir, name))


def fig_alpha_sweep(document, output_dir):
    """The blog's Experiment 1; dotted verticals mark the α that matches the vision norm to T."""
    return _sweep_panels(
        document,
        [("attention_kl", "attention KL (over the image)", "symlog"), ("logit_kl", "logit KL", "symlog"),
         ("median_rank", "median rank of reference token", "log"), ("greedy_agreement", "greedy agreement", None)],
        "Scaling the projector output by α", "fig_alpha_sweep.png", output_dir,
    )


def fig_kv_cosine(document, output_dir):
    """The blog's Experiment 2: how far cached keys and values of the vision tokens move under α."""
    return _sweep_panels(
        document,
        [("cos_k", r"$\cos(K', K)$, vision positions", None), ("cos_v", r"$\cos(V', V)$, vision positions", None)],
        "Keys and values under α", "fig_kv_cosine.png", output_dir,
    )


def fig_attention_mass(document, output_dir):
    """Text-to-vision attention mass per layer, in prefill and in decoding."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8), layout="constrained")
    for label, numbers in models(document):
        for phase in ("prefill", "decode"):
            values = numbers["attention"][phase]["vision_per_layer"]
            x, y = _values(range(len(values)), values)
            ax.plot(x, y, color=PHASE_COLOURS[phase], **_style(label), label=f"{_label(label, numbers)} · {phase}")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.set_ylabel("attention mass on vision tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("Text-to-vision attention mass")
    return _save(fig, os.path.join(output_dir, "fig_attention_mass.png"))


def fig_theory(document, output_dir):
    """Measured rotation per layer (solid/dashed) against the paper's tan θ_eff prediction (markers only)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    for label, numbers in models(document):
        theory = numbers["theory"]
        for modality in theory["measured_rotation_deg"]:
            n = len(theory["measured_rotation_deg"][modality])
            x, y = _values(range(n), theory["measured_rotation_deg"][modality])
            ax.plot(x, y, color=MODALITY_COLOURS[modality], **_style(label),
                    label=f"{_label(label, numbers)} · {modality}")
            x, y = _values(range(n), theory["predicted_rotation_deg"][modality])
            ax.plot(x, y, "x" if label == "model" else "+", color=MODALITY_COLOURS[modality], markersize=9,
                    linestyle="none", label=f"{_label(label, numbers)} · {modality}, predicted")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.set_ylabel("rotation of h between layers (degrees)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(r"measured vs predicted $\tan\theta_{\mathrm{eff}} = C \sin\varphi \,/\, "
                 r"(\Vert h \Vert + C \cos\varphi)$")
    return _save(fig, os.path.join(output_dir, "fig_theory_rotation.png"))


def fig_vision_norms(document, output_dir):
    """RQ1/RQ2: mean vision-token norm at each stage against the text-embedding norm T."""
    plt = _pyplot()
    stages = ["encoder_output", "before_projector", "after_projector", "after_norm", "llm_input"]
    # Points joined by lines on a log axis: the norms span decades, and a bar on a log axis has no true base.
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    for label, numbers in models(document):
        heights = [(numbers["vision_norm"].get(s) or {}).get("mean") or float("nan") for s in stages]
        ax.plot(range(len(stages)), heights, color=MODEL_COLOURS[label], **_style(label, markersize=6),
                label=f"{_label(label, numbers)} · vision tokens")
        for k, height in enumerate(heights):
            if not math.isnan(height):
                ax.annotate(f"{height:.3g}", (k, height), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=7, color=MODEL_COLOURS[label])
        ax.axhline(numbers["text_embedding_norm"]["T"], color=MODEL_COLOURS[label], linestyle=":", alpha=0.8,
                   label=f"{_label(label, numbers)} · text T")
    ax.set_xticks(range(len(stages)), [s.replace("_", " ") for s in stages], fontsize=8)
    ax.set_xlim(-0.4, len(stages) - 0.6)
    ax.set_yscale("log")
    ax.set_ylabel("mean L2 norm")
    ax.grid(alpha=0.3, which="both", axis="y")
    ax.legend(fontsize=7)
    ax.set_title("Vision-token norms through the projector (dotted: text-embedding norm T)")
    return _save(fig, os.path.join(output_dir, "fig_vision_norms.png"))


FIGURES = (fig_norms_cosine, fig_trajectories, fig_ablations, fig_alpha_sweep, fig_kv_cosine, fig_attention_mass,
           fig_theory, fig_vision_norms)


def write_figures(document: dict, output_dir: str) -> list[str]:
    return [figure(document, output_dir) for figure in FIGURES]
