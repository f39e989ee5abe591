"""The model card of a checkpoint folder, rendered from the folder itself.

Everything the card states comes from the folder's files: ``config.json`` (the vision encoder and LLM, T, D, the
norm's variant), the safetensors headers and the few tensors the norm statistics need (the projector norm's gain and
bias, the text embeddings), the processor's config, and, when present, ``training_summary.json``,
``norm_tracking.json``, ``diagnostics/`` and ``eval/``. The layout is the Jinja template shipped in
``templates/modelcard.md``; ``huggingface_hub.ModelCard`` renders it under ``ModelCardData`` metadata.

    llava-normaligned card ./llava-na-3b --repo-id me/llava-na-3b --license apache-2.0 --output -
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from llava_normaligned.atomic_files import write_json_atomic
from llava_normaligned.families.anatomy import LLAVA_NORMALIGNED, family_of
from llava_normaligned.local_paths import hide_local_paths

from .selfcheck import TOKEN_PATTERN, remote_code_files, require_model_folder, safetensors_header

TEMPLATE_PATH = Path(__file__).parent / "templates" / "modelcard.md"
PAPER_ARXIV = "2512.08374"
BIBTEX = """@article{li2025unseenbias,
  title   = {The Unseen Bias: How Norm Discrepancy in Pre-Norm MLLMs Leads to Visual Information Loss},
  author  = {Li, Bozhou and Xue, Xinda and Yang, Sihan and Shi, Yang and Chen, Xinlong and Guan, Yushuo and
             Zhang, Yuanxing and Zhang, Wentao},
  journal = {arXiv preprint arXiv:2512.08374},
  year    = {2025}
}"""
BASE_TAGS = ("llava-normaligned", "vision-language", "norm-alignment", "custom_code", f"arxiv:{PAPER_ARXIV}")

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
LICENSE_ID = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")
# Keys whose values are never shown, matched whole (case-insensitive): "token" would also match
# `image_tokens_per_image` or `num_input_tokens_seen` as a substring. Values are scanned for token shapes as well.
SECRET_KEYS = frozenset({
    "token", "hub_token", "hf_token", "access_token", "auth_token", "api_token", "api_key", "apikey",
    "wandb_api_key", "password", "passwd", "secret", "secret_key", "client_secret", "private_key", "authorization",
    "credentials",
})
MAX_ROWS = 60  # of a table built from a JSON record; the rest is counted in a last row
BASE_MODEL_RELATIONS = ("adapter", "merge", "quantized", "finetune")  # the Hub's values of base_model_relation
# Data files, not Hub datasets, when a training source looks like "namespace/name".
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".arrow", ".csv", ".tsv", ".txt", ".zip", ".tar", ".gz")
RATIO_KEY = "vision_text_norm_ratio"  # diagnostics.json: mean norm of the visual tokens entering the LLM / T
# Notes that whoever wrote a folder adds to its card, {section: Markdown}: the card renders what the folder carries,
# and a producer with more to say (the demo: its measured GWC finding) says it here, in the folder, so that `push`
# renders the same card. Sections: "gwc", a paragraph under the GWC optimizer-step table.
CARD_NOTES = "card_notes.json"
NOTE_SECTIONS = ("gwc",)


@dataclass(frozen=True)
class CardOptions:
    """What the folder cannot say about itself: where it is published and under which terms."""

    repo_id: str | None = None  # "namespace/name" for the usage snippets and the title
    revision: str | None = None  # the commit the usage snippets pin
    branch: str | None = None  # the branch the card is pushed to: what the snippets name while no commit is pinned
    license: str | None = None  # a Hub license id (apache-2.0, llama3.2, other, ...)
    datasets: tuple[str, ...] = ()  # Hub dataset ids, added to those in training_summary.json
    base_models: tuple[str, ...] = ()  # Hub model ids; default: the LLM's, from config.json (see card_metadata)
    base_model_relation: str | None = None  # one of BASE_MODEL_RELATIONS; default: see card_metadata
    tags: tuple[str, ...] = ()
    diagnostics_dir: str | None = None  # default <folder>/diagnostics
    eval_dir: str | None = None  # default <folder>/eval


# ------------------------------------------------------------------------------------------------ reading the folder


def _read_json(path: Path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None


def _read_text(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


@dataclass
class Checkpoint:
    """The files of a checkpoint folder the card is rendered from, read once."""

    folder: Path
    config: dict
    processor: dict
    weight_files: dict[str, Path]  # tensor name -> the safetensors file holding it
    shapes: dict[str, list[int]]  # tensor name -> shape, from the headers (no data read)
    training: dict | None = None
    tracking: object | None = None
    diagnostics_dir: Path | None = None
    eval_dir: Path | None = None
    code_files: list[Path] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)  # CARD_NOTES


def _checked_notes(notes, where) -> dict[str, str]:
    if not isinstance(notes, dict) or not all(isinstance(v, str) for v in notes.values()):
        raise ValueError(f"{where}: expected an object of Markdown strings, {{section: text}}")
    unknown = sorted(set(notes) - set(NOTE_SECTIONS))
    if unknown:
        raise ValueError(f"{where}: unknown section(s) {', '.join(unknown)}; the card's are {', '.join(NOTE_SECTIONS)}")
    return notes


def read_card_notes(folder: Path) -> dict[str, str]:
    """The folder's ``card_notes.json`` ({} without one); ``ValueError`` for a section the card does not have."""
    path = folder / CARD_NOTES
    return _checked_notes(_read_json(path) or {}, path)


def write_card_notes(folder: str | os.PathLike, notes: dict[str, str]) -> Path:
    """Write ``notes`` ({section: Markdown}, sections from ``NOTE_SECTIONS``) as the folder's ``card_notes.json``."""
    path = Path(folder) / CARD_NOTES
    write_json_atomic(path, _checked_notes({k: v for k, v in notes.items() if v}, path))
    return path


def read_checkpoint(folder: str | os.PathLike, options: CardOptions | None = None) -> Checkpoint:
    options = options or CardOptions()
    folder = Path(folder)
    config = _read_json(require_model_folder(folder))  # a PEFT adapter folder is refused with the way to publish it
    weight_files, shapes = {}, {}
    for shard in sorted(folder.glob("*.safetensors")):
        for name, info in safetensors_header(shard).items():
            if name != "__metadata__":
                weight_files[name], shapes[name] = shard, info["shape"]
    if not weight_files:
        raise ValueError(f"{folder}: no *.safetensors weights")
    diagnostics = Path(options.diagnostics_dir) if options.diagnostics_dir else folder / "diagnostics"
    evaluation = Path(options.eval_dir) if options.eval_dir else folder / "eval"
    return Checkpoint(
        folder=folder,
        config=config,
        processor=_read_json(folder / "processor_config.json") or _read_json(folder / "preprocessor_config.json")
        or {},
        weight_files=weight_files,
        shapes=shapes,
        training=_read_json(folder / "training_summary.json"),
        tracking=_read_json(folder / "norm_tracking.json"),
        diagnostics_dir=diagnostics if diagnostics.is_dir() else None,
        eval_dir=evaluation if evaluation.is_dir() else None,
        code_files=[folder / name for name in sorted(remote_code_files(folder))],
        notes=read_card_notes(folder),
    )


def _tensor(ckpt: Checkpoint, name: str):
    """One tensor from the safetensors files (float32), or None when the checkpoint lacks it."""
    if name not in ckpt.weight_files:
        return None
    from safetensors import safe_open

    with safe_open(str(ckpt.weight_files[name]), framework="pt") as f:
        return f.get_tensor(name).float()


# --------------------------------------------------------------------------------------------- what the card says


def hub_id(name) -> str | None:
    """``name`` if it reads as a Hub repo id (``namespace/name``), None for a local path or nothing."""
    if isinstance(name, str) and REPO_ID.match(name) and ".." not in name:
        return name
    return None


def _fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_fmt(v) for v in value[:12])
        return shown + (f", ... ({len(value)} in all)" if len(value) > 12 else "")
    return str(value).replace("\n", " ")


def _cells(rows):
    """Rows ready for a Markdown table: a "|" in a label or value would end its cell."""
    return [tuple(str(cell).replace("|", "\\|") for cell in row) for row in rows]


def public(text: str) -> str:
    """What a card may print of a recorded value: no token, no local path (only its own name)."""
    return hide_local_paths(TOKEN_PATTERN.sub("hf_***", text))


def flat_rows(data, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, public value) for every scalar or list of scalars in nested dicts; secret keys redacted."""
    rows = []
    if isinstance(data, dict):
        for key, value in data.items():
            label = f"{prefix}.{key}" if prefix else str(key)
            if str(key).lower() in SECRET_KEYS:
                rows.append((label, "(redacted)"))
            elif isinstance(value, dict):
                rows += flat_rows(value, label)
            elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                rows.append((label, f"({len(value)} records)"))
            else:
                rows.append((label, public(_fmt(value))))
    return rows


def capped(rows: list[tuple[str, str]], source: str, limit: int = MAX_ROWS) -> list[tuple[str, str]]:
    """At most ``limit`` rows; the last one says how many more ``source`` holds."""
    if len(rows) <= limit:
        return rows
    return rows[: limit - 1] + [("...", f"{len(rows) - limit + 1} more rows in `{source}`")]


def _select(data, dotted: str):
    for key in dotted.split("."):
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


# The parts of training_summary.json (written by trainer/train.py `_summary`) the card shows, in this order. Each
# names a value or a subtree (flattened to dotted rows). The rest (optimizer groups, the frozen tensors, the command
# line) stays in the published file, and the card counts it.
TRAINING_FIELDS = (
    "stage", "variant", "learning_rates", "freeze.trainable_params",
    "data.load.sources", "data.load.rows_read", "data.load.rows_kept", "data.load.bad_rows_skipped",
    "data.load.bad_images_skipped", "data.prepare.rows_out", "data.prepare.too_long_dropped",
    "data.prepare.text_only_dropped", "data.prepare.image_tokens_per_image", "data.prepare.longest_row_tokens",
    "data.rows_skipped_in_training",
    "training", "metrics",
    "norm.start.vision_text_ratio", "norm.end.vision_text_ratio", "norm.gain_statistics",  # paper Table 5
    "peft.r", "peft.lora_alpha", "peft.use_dora", "peft.use_rslora", "peft.target_modules", "peft.modules_to_save",
    "versions",
)


def training_rows(summary: dict) -> tuple[list[tuple[str, str]], int]:
    """(rows of the card's Training table, how many fields of the summary they leave out)."""
    rows = []
    for dotted in TRAINING_FIELDS:
        value = _select(summary, dotted)
        if value is not None:
            rows += flat_rows({dotted: value})
    left_out = max(len(flat_rows(summary)) - len(rows), 0)
    return capped(rows, "training_summary.json", limit=MAX_ROWS + 20), left_out


def _part(sub: dict, fallback: str) -> dict:
    name = sub.get("_name_or_path")
    source = f"`{hub_id(name)}`" if hub_id(name) else "a local checkpoint"
    kind = sub.get("model_type", fallback)
    return {"id": hub_id(name), "summary": f"{kind} ({source})", "type": kind}


def _family(ckpt: Checkpoint):
    """The checkpoint's family (``llava_normaligned.families.anatomy``): where its parts' weights are named."""
    return family_of(ckpt.config) or LLAVA_NORMALIGNED


def _params(ckpt: Checkpoint, part: str | None = None) -> int:
    """Parameters of one part (``vision_tower``, ``projector``, ``llm``), or of the whole checkpoint."""
    family = _family(ckpt)
    return sum(math.prod(shape) for name, shape in ckpt.shapes.items() if part is None or family.part_of(name) == part)


def aligned(cfg: dict) -> bool:
    """Whether the checkpoint is a stock VLM of another family with the aligned norm (``llava-normaligned align``)."""
    return bool(cfg.get("norm_connector"))


def _has_norm(cfg: dict) -> bool:
    return cfg.get("projector_norm") == "layernorm" or aligned(cfg)


def headline(ckpt: Checkpoint) -> str:
    """The card's first sentence: what the model is."""
    cfg = ckpt.config
    vision, text = _part(cfg.get("vision_config", {}), "vision encoder"), _part(cfg.get("text_config", {}), "")
    if not aligned(cfg):
        return (f"A LLaVA-style vision-language model: {vision['summary']} + {text['summary']}, joined by "
                f"{projector_summary(cfg)}.")
    source = hub_id(cfg.get("norm_source"))
    stock = f"`{source}`" if source else "a local checkpoint"
    return (f"A vision-language model of the {cfg.get('norm_family')} family ({stock}) with {projector_summary(cfg)}, "
            f"put in by `llava-normaligned align`: {vision['summary']} + {text['summary']}.")


def without_remote_code(cfg: dict) -> str:
    """How the installed package serves the checkpoint without running the repository's code."""
    if aligned(cfg):
        return ("Without remote code: `pip install llava-normaligned`, then `from modeling_llava_normaligned import "
                "register_aligned_auto_classes; register_aligned_auto_classes()` before "
                "`from_pretrained(repo_id, revision=revision)`; the installed package serves the model.")
    return ("Without remote code: `pip install llava-normaligned`, then `import modeling_llava_normaligned` before\n"
            "`from_pretrained(repo_id, revision=revision)`; the installed package serves the model.")


def architecture_rows(ckpt: Checkpoint) -> list[tuple[str, str]]:
    cfg, vis, txt = ckpt.config, ckpt.config.get("vision_config", {}), ckpt.config.get("text_config", {})
    image_size, patch = vis.get("image_size"), vis.get("patch_size")
    proc = ckpt.processor
    vision = (f"{_part(vis, 'vision')['summary']}: width {vis.get('hidden_size')}, "
              f"{vis.get('num_hidden_layers')} layers, {image_size} px images, patch {patch}")
    features = (f"layer {cfg.get('vision_feature_layer')}, strategy `{cfg.get('vision_feature_select_strategy')}`, "
                f"{cfg.get('image_seq_length')} tokens per image")
    norm = f" + LayerNorm ({_norm_recipe(cfg)})" if cfg.get("projector_norm") == "layernorm" else ", no norm"
    text = (f"{_part(txt, 'text')['summary']}: width D = {txt.get('hidden_size')}, "
            f"{txt.get('num_hidden_layers')} layers, vocabulary {txt.get('vocab_size')}")
    params = (f"{_fmt(_params(ckpt))} (vision {_fmt(_params(ckpt, 'vision_tower'))}, projector "
              f"{_fmt(_params(ckpt, 'projector'))}, LLM {_fmt(_params(ckpt, 'llm'))})")
    template = "included" if (ckpt.folder / "chat_template.jinja").is_file() else "none"
    processor = (f"{proc.get('processor_class', 'n/a')}, image token `{proc.get('image_token', 'n/a')}`, "
                 f"chat template {template}")
    if aligned(cfg):
        entry = ("its output" if cfg.get("norm_entry") == "connector_output"
                 else "the image features it gives the LLM (`get_image_features`)")
        features = f"as the stock {cfg.get('norm_family')} model reads them"
        projector = f"the stock connector `{cfg.get('norm_connector')}`, then LayerNorm ({_norm_recipe(cfg)}) on {entry}"
    else:
        projector = f"2-layer MLP ({cfg.get('projector_hidden_act')}){norm}"
    return [
        ("vision encoder", vision),
        ("visual features", features),
        ("projector", projector),
        ("language model", text),
        ("parameters", params),
        ("weights", f"{cfg.get('dtype') or cfg.get('torch_dtype') or 'float32'}, safetensors"),
        ("processor", processor),
        ("transformers", f"config written by {cfg.get('transformers_version', 'n/a')}"),
    ]


def _is_full_recipe(cfg: dict) -> bool:
    """The paper's method as published: LayerNorm, gain T/√D, GWC on (§5.1)."""
    return _has_norm(cfg) and cfg.get("norm_init") == "target" and bool(cfg.get("gradient_compensation"))


def _norm_recipe(cfg: dict) -> str:
    init = "gain T/√D" if cfg.get("norm_init") == "target" else "default init, gain 1"
    return f"{init}, GWC {'on' if cfg.get('gradient_compensation') else 'off'}"


def projector_summary(cfg: dict) -> str:
    """The card's headline name of the projector, from the checkpoint's config (its ablation variant)."""
    if aligned(cfg):
        what = "the paper's norm-aligning LayerNorm" if _is_full_recipe(cfg) else "a LayerNorm"
        return f"{what} ({_norm_recipe(cfg)}) where its connector's output enters the LLM"
    if cfg.get("projector_norm") is None:
        return "a 2-layer MLP projector (no norm: stock LLaVA's)"
    if _is_full_recipe(cfg):
        return "a 2-layer MLP projector with the paper's norm-aligning LayerNorm (gain T/√D, GWC on)"
    return f"a 2-layer MLP projector with a LayerNorm ({_norm_recipe(cfg)}: one of the paper's ablations)"


def method_text(cfg: dict) -> str:
    """What the card's Method section says of this checkpoint: the fix as published, the ablation it is, or the norm
    put into an already trained model (``align``), which is not the paper's training."""
    if aligned(cfg):
        return (f"This checkpoint has the norm put into an already trained {cfg.get('norm_family')} model by "
                f"`llava-normaligned align`: {variant_text(cfg)} The paper trains the norm from the first stage on; "
                "here the LLM had adapted to the connector's large output norms and must re-adapt in fine-tuning. On a "
                "tiny Idefics3 this did not improve accuracy over fine-tuning the stock model (llava-normaligned's "
                "docs/align.md).")
    if _is_full_recipe(cfg):
        return f"This checkpoint uses that fix as described: {variant_text(cfg)}"
    return f"This checkpoint is one of the paper's ablations, not the fix as described: {variant_text(cfg)}"


def variant_text(cfg: dict) -> str:
    """The checkpoint's place in the paper's ablation (Tables 4-5), from its config."""
    if not _has_norm(cfg):
        return "no projector norm: stock LLaVA, the paper's \"w/o Norm\" baseline."
    init = ("gain initialised to T/√D (§5.1)" if cfg.get("norm_init") == "target"
            else "gain initialised to 1, bias 0 (the paper's \"Default Init\" ablation, Table 5)")
    gwc = (f"Global Weight Compensation on (clamp {cfg.get('gradient_compensation_min')})"
           if cfg.get("gradient_compensation") else "Global Weight Compensation off (the paper's \"w/o GWC\" row)")
    where = (f"LayerNorm at the output of the stock {cfg.get('norm_family')} connector (`{cfg.get('norm_connector')}`)"
             if aligned(cfg) else "LayerNorm after the projector")
    return f"{where}, {init}; {gwc}."


def norm_statistics(ckpt: Checkpoint) -> tuple[list[tuple[str, str]], dict]:
    """Rows of the norm-statistics table and the raw numbers, from config and weights (paper §5.1, Table 5), each
    computed by the model's own functions (the ones compose, training and diagnose use)."""
    from modeling_llava_normaligned import gain_init, gain_statistics, text_embedding_norm_target

    cfg, family = ckpt.config, _family(ckpt)
    d = cfg.get("text_config", {}).get("hidden_size")
    t_config = cfg.get("norm_target")
    stats: dict = {"D": d, "T_config": t_config}
    rows = [("D (LLM width)", _fmt(d))]
    when = "when aligned" if aligned(cfg) else "when composed"
    rows.append((f"T, mean L2 norm of the LLM's non-zero text-embedding rows, {when} (config)", _fmt(t_config)))
    embed = _tensor(ckpt, family.embed_tokens_path + ".weight")
    if embed is not None:  # the placeholder tokens' rows are not text: left out, as everywhere (paper §5.1)
        scale = math.sqrt(d) if family.scaled_embeddings and d else 1.0  # Gemma scales its rows in embed_tokens
        stats["T_now"] = scale * text_embedding_norm_target(embed, exclude_token_ids=family.placeholder_token_ids(cfg))
        rows.append(("T measured on this checkpoint's embeddings", _fmt(stats["T_now"])))
    if not _has_norm(cfg):
        rows.append(("projector norm", "none (stock LLaVA)"))
        return rows, stats
    if d and (t_config or cfg.get("norm_init") == "default"):
        stats["g_init"] = gain_init(cfg.get("norm_init"), t_config, d)
        rows.append(("gain at initialisation (T/√D, or 1 for default init)", _fmt(stats["g_init"])))
    norm_path = family.projector_norm_path or LLAVA_NORMALIGNED.projector_norm_path
    gain, bias = _tensor(ckpt, norm_path + ".weight"), _tensor(ckpt, norm_path + ".bias")
    if gain is not None:
        gwc_min = (cfg.get("gradient_compensation_min") or 1e-3) if cfg.get("gradient_compensation") else None
        stats.update(gain_statistics(gain, bias, gwc_min))  # paper Table 5 (+ the GWC factor)
        rows.append(("mean |g| of the gain now", _fmt(stats["gain_abs_mean"])))
        if "g_init" in stats:
            rows.append(("mean |g| / initial gain", _fmt(stats["gain_abs_mean"] / stats["g_init"])))
        if "gwc_factor" in stats:
            rows.append(("GWC factor 1/clamp(mean |g|)", _fmt(stats["gwc_factor"])))
        # For a normalized x̂ with zero-mean, unit-variance coordinates, E‖g⊙x̂ + b‖² = ‖g‖² + ‖b‖²: the norm the
        # visual tokens leave the projector with, to compare with T.
        expected = math.sqrt(stats["gain_l2"] ** 2 + stats["bias_l2"] ** 2)
        stats["vision_norm_expected"] = expected
        rows.append(("expected visual-token norm √(‖g‖² + ‖b‖²)", _fmt(expected)))
        reference = stats.get("T_now") or t_config
        if reference:
            stats["ratio_expected"] = expected / reference
            rows.append(("expected vision/text norm ratio", _fmt(stats["ratio_expected"])))
    for path, value in measured_ratios(ckpt):
        rows.append((f"vision/text norm ratio measured by `diagnose` (`{path}`)", _fmt(value)))
    return rows, stats


def measured_ratios(ckpt: Checkpoint) -> list[tuple[str, float]]:
    """The vision/text norm ratios ``diagnose`` recorded (``vision_text_norm_ratio*`` keys, at any depth)."""
    data = _read_json(ckpt.diagnostics_dir / "diagnostics.json") if ckpt.diagnostics_dir else None
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
        elif isinstance(node, (int, float)) and not isinstance(node, bool) and path.rpartition(".")[2].startswith(
            RATIO_KEY
        ):
            found.append((path, float(node)))

    walk(data, "")
    return found[:8]


def tracking_records(tracking) -> list[dict]:
    """The records of ``norm_tracking.json``: its list, or the first list of records in a dict of them."""
    records = tracking
    if isinstance(tracking, dict):
        records = next((v for v in tracking.values() if isinstance(v, list) and v and isinstance(v[0], dict)), None)
    if not isinstance(records, list) or not records or not isinstance(records[0], dict):
        return []
    return records


def tracking_table(tracking) -> tuple[list[str], list[list[str]], int]:
    """(columns, rows of the first, middle and last records, record count) of ``norm_tracking.json``."""
    records = tracking_records(tracking)
    if not records:
        return [], [], 0
    columns = [k for k, v in records[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)][:8]
    picks = sorted({0, len(records) // 2, len(records) - 1})
    return columns, [[_fmt(records[i].get(c)) for c in columns] for i in picks], len(records)


OPTIMIZER_KEYS = ("grad_norm", "clip_coef", "grad_norm_before_part_clip")
OPTIMIZER_PREFIXES = ("grad_norm/", "update_size/", "clip_coef/")


def mean_of(values):
    """The mean of numbers; of dicts, the mean per key (recursively); otherwise the first value."""
    values = list(values)
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return sum(values) / len(values)
    if values and all(isinstance(v, dict) for v in values):
        return {k: mean_of(v.get(k) for v in values) for k in values[0]}
    return values[0] if values else None


def parts_total(record: dict) -> float | None:
    """The root sum of squares of a record's per-part gradient norms (``grad_norm/<part>``, read before any
    clipping): the whole gradient's norm before clipping. The Trainer's own ``grad_norm`` is the norm its global
    clipping sees, which under per-part clipping (``clip_coef/<part>`` in the record) is taken after each part was
    clipped; this is the total before. None without per-part norms."""
    parts = [v for k, v in record.items() if k.startswith("grad_norm/") and isinstance(v, (int, float))]
    return math.sqrt(sum(v * v for v in parts)) if parts else None


def optimizer_step_stats(records: list[dict]) -> dict:
    """Per key of the norm-tracking records (pre-clip gradient norms ``grad_norm[/part]``, the clip coefficient
    ``clip_coef[/part]``, the update sizes ``update_size/<part>``), the mean over the logged training steps (step > 0)
    of one run's records, and the first logged step's values. The model card's norm-tracking section and the demo's
    tables both read a run's optimizer step through this. With per-part clipping (``clip_coef/<part>`` logged),
    ``grad_norm_before_part_clip`` is ``parts_total``: ``grad_norm`` is then the norm after the per-part clipping."""
    logged = [r for r in records if isinstance(r, dict) and (r.get("step") or 0) > 0]
    if logged and any(k.startswith("clip_coef/") for k in logged[0]):
        logged = [{**r, "grad_norm_before_part_clip": parts_total(r)} for r in logged]
    keys = [k for k in (logged[0] if logged else {}) if k in OPTIMIZER_KEYS or k.startswith(OPTIMIZER_PREFIXES)]
    return {"mean": {k: mean_of(r[k] for r in logged if k in r) for k in keys},
            "first": {k: logged[0][k] for k in keys}, "steps": len(logged)}


GWC_PARTS = ("vision_tower", "projector", "projector_norm", "llm")


def gwc_optimizer_rows(ckpt: Checkpoint) -> tuple[list[tuple[str, str, str]], int]:
    """For a checkpoint trained with GWC: (quantity, mean over the logged steps, first logged step) of its optimizer
    step, from ``norm_tracking.json`` (``optimizer_step_stats``, as the demo's tables read it), and the number of
    logged steps; ([], 0) without GWC or without those records."""
    if not ckpt.config.get("gradient_compensation"):
        return [], 0
    records = tracking_records(ckpt.tracking)
    stats = optimizer_step_stats(records)
    mean, first = stats["mean"], stats["first"]
    if "grad_norm" not in mean:
        return [], 0
    rows = []

    def add(label, key, scale=1.0):
        if key in mean:
            rows.append((label, _fmt(mean[key] * scale), _fmt(first[key] * scale)))

    factors = [r["gwc_factor"] for r in records if (r.get("step") or 0) > 0 and isinstance(r.get("gwc_factor"),
                                                                                            (int, float))]
    if factors:
        first_factor = factors[0]
        rows.append(("GWC factor 1/clamp(mean |g|)", _fmt(mean_of(factors)), _fmt(first_factor)))
    add("pre-clip gradient norm, total", "grad_norm")
    for part in GWC_PARTS:
        add(f"pre-clip gradient norm, {part}", f"grad_norm/{part}")
    add("global clip coefficient min(1, max_grad_norm / norm)", "clip_coef")
    for part in GWC_PARTS:
        add(f"per-part clip coefficient, {part}", f"clip_coef/{part}")
    for part in GWC_PARTS:
        add(f"update size ||Δθ|| / ||θ|| (x 1e-3), {part}", f"update_size/{part}", 1e3)
    return rows, stats["steps"]


def embedded_markdown(path: Path, link_prefix: str) -> str | None:
    """A generated Markdown report placed under a card section: headings demoted two levels, relative links
    pointed at the folder the report is published in, absolute local paths cut to their last component."""
    text = _read_text(path)
    if text is None:
        return None
    text = public(text)
    text = re.sub(r"^(#{1,4}) ", lambda m: "#" * min(len(m.group(1)) + 2, 6) + " ", text, flags=re.MULTILINE)
    return re.sub(r"\]\((?![a-z]+:|/|#)([^)]+)\)", lambda m: f"]({link_prefix}/{m.group(1)})", text).strip()


def remote_code_rows(ckpt: Checkpoint) -> list[tuple[str, str, str]]:
    """(file, sha256, note) of the folder's Python files; the note says whether the installed package ships it."""
    import modeling_llava_normaligned

    package_dir = Path(modeling_llava_normaligned.__file__).parent
    rows = []
    for path in ckpt.code_files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        shipped = package_dir / path.name
        same = shipped.is_file() and hashlib.sha256(shipped.read_bytes()).hexdigest() == digest
        note = f"identical to llava-normaligned {package_version()}'s" if same else "differs from the installed package"
        rows.append((path.name, digest, note))
    return rows


def package_version() -> str:
    try:
        return version("llava-normaligned")
    except PackageNotFoundError:
        return "(not installed)"


def _strings(value) -> list[str]:
    return [value] if isinstance(value, str) else [v for v in value if isinstance(v, str)] if isinstance(
        value, list) else []


def training_datasets(training: dict) -> list[str]:
    """Hub dataset ids a training summary names.

    ``train`` records what it loaded in ``data.load.sources``: a LLaVA JSON file, a local dataset folder or a Hub
    dataset id. A source counts as a Hub id when it reads as ``namespace/name``, is not a data file name and is not a
    folder here; ``data.load.hub_ids`` (or a top-level ``datasets``), when a summary records them, are taken as
    they are."""
    explicit = _strings(_select(training, "data.load.hub_ids")) + _strings(training.get("datasets"))
    guessed = [
        name for name in _strings(_select(training, "data.load.sources"))
        if hub_id(name) and not name.lower().endswith(DATA_FILE_SUFFIXES) and not os.path.exists(name)
    ]
    return [name for name in dict.fromkeys(explicit + guessed) if hub_id(name)]


def card_metadata(ckpt: Checkpoint, options: CardOptions) -> ModelCardData:
    """The card's YAML metadata.

    ``base_model``: ``--base-model`` ids, or the LLM's Hub id from ``config.json``. The Hub reads several base
    models as a merge of them (its relations are adapter, merge, quantized, finetune), which a LLaVA is not; the
    LLM is the model the checkpoint continues to train (``base_model_relation: finetune`` once a training record
    says it was trained; left to the Hub for an untrained composition), and the vision encoder is named in the
    card's Model table. ``--base-model-relation`` sets the relation for a list given by hand."""
    cfg = ckpt.config
    training = ckpt.training if isinstance(ckpt.training, dict) else {}
    if options.base_models:
        base, relation = list(options.base_models), options.base_model_relation
    else:  # an aligned stock VLM continues from the stock model, a composed LLaVA from its LLM
        llm = hub_id(cfg.get("norm_source")) if aligned(cfg) else _part(cfg.get("text_config", {}), "")["id"]
        base = [llm] if llm else []
        relation = options.base_model_relation or ("finetune" if base and ckpt.training else None)
    datasets = list(dict.fromkeys(list(options.datasets) + training_datasets(training)))
    family_tags = [cfg.get("norm_family")] if aligned(cfg) and cfg.get("norm_family") else ["llava"]
    tags = family_tags + list(BASE_TAGS) + (["trl", "sft"] if ckpt.training else []) + list(options.tags)
    extra = {"base_model_relation": relation} if base and relation else {}
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="image-text-to-text",
        base_model=base or None,
        datasets=datasets or None,
        license=options.license or (training.get("license") if isinstance(training.get("license"), str) else None),
        tags=list(dict.fromkeys(tags)),
        **extra,
    )


# -------------------------------------------------------------------------------------------------------- render


def render_card(folder: str | os.PathLike, options: CardOptions | None = None) -> ModelCard:
    """The model card of ``folder`` (a ``huggingface_hub.ModelCard``; ``str(card)`` is the README.md text)."""
    options = options or CardOptions()
    ckpt = read_checkpoint(folder, options)
    cfg = ckpt.config
    norm_rows, _ = norm_statistics(ckpt)
    columns, tracking_rows, tracking_count = tracking_table(ckpt.tracking)
    gwc_rows, gwc_steps = gwc_optimizer_rows(ckpt)
    trained_rows, trained_left_out = training_rows(ckpt.training) if isinstance(ckpt.training, dict) else ([], 0)
    diag_json = _read_json(ckpt.diagnostics_dir / "diagnostics.json") if ckpt.diagnostics_dir else None
    eval_json = _read_json(ckpt.eval_dir / "results.json") if ckpt.eval_dir else None
    context = dict(  # the template's variables
        title=options.repo_id.split("/")[-1] if options.repo_id else ckpt.folder.resolve().name,
        repo_id=options.repo_id or "<namespace>/<name>",
        revision=options.revision,
        branch=options.branch or "main",
        trained=ckpt.training is not None,
        headline=headline(ckpt),
        without_remote_code=without_remote_code(cfg),
        method=method_text(cfg),
        architecture=_cells(architecture_rows(ckpt)),
        norm_rows=_cells(norm_rows),
        norm_sources="and `diagnostics/diagnostics.json`" if measured_ratios(ckpt) else "",
        training_rows=_cells(trained_rows),
        training_left_out=trained_left_out,
        tracking_columns=columns,
        tracking_rows=_cells(tracking_rows),
        tracking_count=tracking_count,
        gwc_rows=_cells(gwc_rows),
        gwc_steps=gwc_steps,
        gwc_note=public(ckpt.notes["gwc"]) if gwc_rows and ckpt.notes.get("gwc") else None,
        diagnostics_dir="diagnostics",
        diagnostics_md=embedded_markdown(ckpt.diagnostics_dir / "summary.md", "diagnostics")
        if ckpt.diagnostics_dir else None,
        diagnostics_rows=_cells(capped(flat_rows(diag_json), "diagnostics/diagnostics.json")),
        eval_dir="eval",
        eval_md=embedded_markdown(ckpt.eval_dir / "results.md", "eval") if ckpt.eval_dir else None,
        eval_rows=_cells(capped(flat_rows(eval_json), "eval/results.json")),
        remote_code=remote_code_rows(ckpt),
        quant_skip_modules=json.dumps(_family(ckpt).keep_unquantized()),  # what the package's loader keeps
        bibtex=BIBTEX,
        package_version=package_version(),
    )
    card = ModelCard.from_template(card_metadata(ckpt, options), template_path=str(TEMPLATE_PATH), **context)
    return ModelCard(re.sub(r"\n{3,}", "\n\n", str(card)))  # sections left empty by the template leave blank runs


def check_card(card: ModelCard) -> None:
    """Local checks of the card's metadata, which need no network. Raises ``ValueError`` listing every problem.

    What is checked: the YAML block parses back, with ``huggingface_hub``'s own parser (``ModelCard`` ->
    ``ModelCardData``, which refuses a malformed ``model-index``), to the metadata it was rendered from; the fields
    this package sets (``library_name``, ``pipeline_tag``); that base models and datasets read as ``namespace/name``
    ids, that the relation is one of the Hub's four, and that the license is shaped like a Hub license id. What is
    not: whether those ids exist, and whether the license id is on the Hub's list. Only the Hub knows; it checks on
    every commit of README.md, and ``card --validate`` asks it (``/api/validate-yaml``) without committing.
    """
    problems = []
    reparsed = ModelCard(str(card)).data.to_dict()  # the YAML block parses back to what was written
    if reparsed != card.data.to_dict():
        problems.append("the YAML front matter does not parse back to the metadata it was rendered from")
    if reparsed.get("library_name") != "transformers":
        problems.append("library_name must be 'transformers'")
    if reparsed.get("pipeline_tag") != "image-text-to-text":
        problems.append("pipeline_tag must be 'image-text-to-text'")
    for key in ("base_model", "datasets"):
        for name in reparsed.get(key) or []:
            if not hub_id(name):
                problems.append(f"{key}: {name!r} is not a Hub repo id (namespace/name)")
    relation = reparsed.get("base_model_relation")
    if relation is not None and relation not in BASE_MODEL_RELATIONS:
        problems.append(f"base_model_relation: {relation!r} is not one of {list(BASE_MODEL_RELATIONS)}")
    license_id = reparsed.get("license")
    if license_id is not None and not (isinstance(license_id, str) and LICENSE_ID.match(license_id)):
        problems.append(f"license: {license_id!r} is not a Hub license id (lower case, e.g. 'apache-2.0')")
    if not all(isinstance(t, str) for t in reparsed.get("tags") or []):
        problems.append("tags must be strings")
    if problems:
        raise ValueError("model card metadata: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------------- Hub validation


def validate_on_hub(card: ModelCard) -> str | None:
    """Ask the Hub (``HF_ENDPOINT``) to validate the card's metadata. None if it accepts it, else why not: its
    refusal, or the HTTP or network error that kept it from answering."""
    from huggingface_hub import constants

    try:
        card.validate()
    except ValueError as error:  # the Hub answered 400: the metadata is refused
        return f"the Hub refused the metadata: {error}"
    except Exception as error:  # noqa: BLE001  (HTTP errors, no network, a wrong HF_ENDPOINT: all reported)
        return f"could not validate with the Hub at {constants.ENDPOINT}: {type(error).__name__}: {error}"
    return None
