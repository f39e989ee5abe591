"""The evaluation run of ``llava-normaligned eval``, stage by stage: resolve the tasks, load and check every split
(before the model), refuse to mix runs in --output-dir, load the model, run each task through its batch loop
(``batches.py`` for generation, ``loglik.py`` for log-likelihood), score it and rewrite results.json / results.md
after every task. The ``eval`` command (``llava_normaligned.commands.eval``) parses the flags into an
:class:`EvalConfig` and calls :func:`evaluate`.

Outputs, in ``output_dir``: samples.jsonl (every sample, appended as it is scored), results.json and results.md
(rewritten after every task; published with the model, so they name no local path: provenance.py).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass

from ..local_paths import hide_local_paths, public_name
from . import provenance
from .data import LoadedSplit, load_split, save_split
from .results_files import ResultsWriter, load_baseline
from .scoring import error_verdict
from .tasks import TASKS, TaskSpec, resolve_tasks

logger = logging.getLogger(__name__)

SAMPLES_FILE = "samples.jsonl"


@dataclass
class EvalConfig:
    """What to score, on what, and how.

    Model: ``model`` (folder or Hub id), ``revision``, ``quantization`` (None, "4bit", "8bit"), ``device``
    ("auto": CUDA when there is one), ``dtype`` ("auto" keeps the checkpoint's), ``trust_remote_code`` (None:
    transformers' own resolution, which needs no remote code for this package's models; True runs the repo's code).
    Data: ``tasks`` (comma-separated names, "all" = Table 4's nine), ``data_dir`` (local copies, DIR/TASK/),
    ``limit`` (first N samples of each split, for smoke runs).
    Run: ``batch_size`` (requests per forward), ``max_new_tokens`` (None: each task's default).
    Output: ``output_dir``, ``baseline`` (an earlier results.json to compare with), ``label`` (the row name in the
    table; default: the model's folder name), ``overwrite`` / ``resume`` (what to do with an earlier run's files),
    ``save_data`` (write every loaded split to SAVE_DATA/TASK for an offline machine; with no model, only that).
    Errors: a task with more than ``max_error_rate`` of its samples raising (or all of them) is failed, not scored;
    ``allow_errors`` makes a run whose scored tasks hold fewer errors exit 0 (their cells are marked).
    """

    model: str | None
    tasks: str
    output_dir: str | None
    revision: str | None = None
    quantization: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool | None = None
    data_dir: str | None = None
    limit: int | None = None
    batch_size: int = 8
    max_new_tokens: int | None = None
    baseline: str | None = None
    label: str | None = None
    overwrite: bool = False
    resume: bool = False
    save_data: str | None = None
    allow_errors: bool = False
    max_error_rate: float = 0.05


class EvalSetupError(RuntimeError):
    """Bad arguments or inputs found before any sample runs."""


def load_splits(specs: list[TaskSpec], cfg: EvalConfig) -> dict[str, LoadedSplit]:
    """Every task's split, schema-checked, before any model is loaded."""
    splits = {}
    for spec in specs:
        splits[spec.name] = load_split(spec, cfg.data_dir, cfg.limit)
        logger.info("%s: %d samples from %s (%s)", spec.name, len(splits[spec.name]), splits[spec.name].location,
                    splits[spec.name].source)
    return splits


def save_splits(specs: list[TaskSpec], splits: dict[str, LoadedSplit], cfg: EvalConfig) -> None:
    for spec in specs:
        if spec.hub is None:
            logger.info("%s: local only, not saved (copy %s)", spec.name, splits[spec.name].location)
            continue
        folder = save_split(spec, splits[spec.name], cfg.save_data)
        logger.info("%s: saved %d samples to %s", spec.name, len(splits[spec.name]), folder)


def method_label(config) -> str:
    """The paper's name for the variant a checkpoint is (Table 4's "Method" column)."""
    if getattr(config, "model_type", None) != "llava_normaligned":
        return f"w/o Norm ({getattr(config, 'model_type', 'stock')})"
    if config.projector_norm is None:
        return "w/o Norm"
    init = " default init" if config.norm_init == "default" else ""
    return f"w/ Norm{init} (w/ GWC)" if config.gradient_compensation else f"w/ Norm{init} (w/o GWC)"


def load_evaluated_model(cfg: EvalConfig):
    from llava_normaligned.loading import load_model

    try:
        return load_model(
            cfg.model,
            revision=cfg.revision,
            quantization=cfg.quantization,
            device=cfg.device,
            dtype=cfg.dtype,
            trust_remote_code=cfg.trust_remote_code,
        )
    except Exception as exc:
        raise EvalSetupError(f"cannot load model {cfg.model!r}: {type(exc).__name__}: {exc}") from exc


def check_model(cfg: EvalConfig) -> None:
    """A model that cannot be loaded (a missing folder, one without weights, a Hub id that cannot be looked up: see
    ``loading.check_source``) is refused before any data is read, and after the checks of the arguments themselves
    (tasks, output folder), which need neither the model nor the Hub."""
    from llava_normaligned.loading import SourceNotFound, check_source

    if cfg.model:
        try:
            check_source(cfg.model, "model", revision=cfg.revision)
        except SourceNotFound as exc:
            raise EvalSetupError(str(exc)) from None


def check_output(cfg: EvalConfig) -> dict | None:
    """Refuse to touch an earlier run's files in --output-dir unless --overwrite or --resume says what to do.
    With --resume, return the earlier run's results.json, which :func:`check_resume` compares with this run."""
    earlier = [f for f in (SAMPLES_FILE, "results.json") if os.path.exists(os.path.join(cfg.output_dir, f))]
    if earlier and not (cfg.overwrite or cfg.resume):
        raise EvalSetupError(f"{cfg.output_dir} already holds {', '.join(earlier)} of an earlier run: pass "
                             "--resume to continue it, --overwrite to replace it, or another --output-dir")
    if not (cfg.resume and earlier):
        return None
    results_path = os.path.join(cfg.output_dir, "results.json")
    try:
        with open(results_path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise EvalSetupError(f"--resume: cannot read {results_path}, so cannot tell which run the samples in "
                             f"{cfg.output_dir} belong to ({exc}); pass --overwrite to start over") from exc


def check_resume(cfg: EvalConfig, earlier_run: dict, identity: dict) -> None:
    """Refuse to mix samples of two setups: the model's files (or Hub commit), the data's rows and every setting that
    changes an answer must be those of the earlier run."""
    problems = provenance.resume_mismatches(earlier_run, identity)
    if problems:
        raise EvalSetupError(f"--resume: {os.path.join(cfg.output_dir, 'results.json')} is another run; what differs "
                             "(earlier -> now):\n  " + "\n  ".join(problems) +
                             "\nrun it as it was, or pass --overwrite or another --output-dir")


def prepare_output(cfg: EvalConfig) -> dict[str, list[dict]]:
    """Create --output-dir and samples.jsonl. Returns, per task, the finished sample records of an earlier run
    (``--resume``), which are kept in samples.jsonl; failed ones are dropped to run again."""
    os.makedirs(cfg.output_dir, exist_ok=True)
    samples_path = os.path.join(cfg.output_dir, SAMPLES_FILE)
    if cfg.resume and os.path.exists(samples_path):
        return _resume_samples(samples_path)
    open(samples_path, "w").close()
    return {}


def _resume_samples(samples_path: str) -> dict[str, list[dict]]:
    kept: dict[str, list[dict]] = {}
    with open(samples_path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed run may be cut short
            if not record.get("error"):  # failed samples run again
                kept.setdefault(record["task"], []).append(record)
    from ..atomic_files import write_text_atomic

    write_text_atomic(samples_path, "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n"
                                            for records in kept.values() for r in records))
    return kept


def _progress_bar(total: int, name: str):
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=name, unit="sample", disable=None, leave=False)
    return bar


def run_task(spec: TaskSpec, split: LoadedSplit, model, processor, sink, cfg: EvalConfig, earlier: list[dict]) -> dict:
    """Run one task (skipping rows an earlier run finished) and score every record."""
    from .batches import run_generation
    from .loglik import run_loglik

    earlier = [r for r in earlier if r.get("row") is not None and r["row"] < len(split)]
    skip = frozenset(r["row"] for r in earlier)
    bar = _progress_bar(len(split) - len(skip), spec.name)
    try:
        if spec.kind == "loglik":
            records = run_loglik(spec, split, model, processor.tokenizer, sink, batch_size=cfg.batch_size,
                                 skip=skip, progress=bar.update)
        else:
            max_new = cfg.max_new_tokens or spec.max_new_tokens
            records = run_generation(spec, split, model, processor, sink, batch_size=cfg.batch_size,
                                     max_new_tokens=max_new, skip=skip, progress=bar.update)
    finally:
        bar.close()
    records = sorted(earlier + records, key=lambda r: r["row"])
    entry = spec.score(records)
    first_error = next((r["error"] for r in records if r.get("error")), None)
    entry.update(
        column=spec.column,
        max_new_tokens=(cfg.max_new_tokens or spec.max_new_tokens) if spec.kind == "generate" else None,
        notes=spec.notes,
        first_error=_scrub(first_error, cfg) if first_error else None,
    )
    return entry


def _scrub(text: str, cfg: EvalConfig) -> str:
    """An error message as results.json may publish it: the run's own folders by their base names."""
    local_model = cfg.model if cfg.model and provenance.is_local(cfg.model) else None  # a Hub id stays as it is
    return hide_local_paths(text, [local_model, cfg.data_dir, cfg.output_dir, cfg.save_data, cfg.baseline])


def _public_location(split: LoadedSplit, cfg: EvalConfig) -> str:
    """Where a split came from, without local paths: ``hub-id[config]:split``, or ``DATA_DIR-name/TASK``."""
    if split.source != "local":
        return split.location
    relative = os.path.relpath(split.location, cfg.data_dir)
    root = public_name(cfg.data_dir)
    return root if relative == "." else f"{root}/{relative}"


def run_identity(cfg: EvalConfig, specs: list[TaskSpec], splits: dict[str, LoadedSplit]) -> dict:
    """The part of results.json that says which model, data and settings produced the samples: published as it is
    (no local paths), and what --resume compares by content (provenance.py)."""
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("model", "revision", "label", "output_dir")}
    chosen = {spec.name for spec in specs}
    settings["tasks"] = ",".join(name for name in TASKS if name in chosen)  # canonical: aliases, order do not matter
    return {
        "model": public_name(cfg.model),
        "revision": cfg.revision,
        "model_fingerprint": provenance.model_fingerprint(cfg.model),
        "settings": provenance.public_settings(settings),
        "datasets": {
            spec.name: {
                "source": splits[spec.name].source,
                "location": _public_location(splits[spec.name], cfg),
                "rows": len(splits[spec.name]),
                "sha256": provenance.split_digest(splits[spec.name].rows),
            }
            for spec in specs
        },
    }


def results_header(cfg: EvalConfig, config, identity: dict, versions: dict) -> dict:
    """The head of results.json, for both engines: the model (published name, revision, label, the paper's method
    read from its ``config``), the rest of ``identity`` (engine, fingerprint, settings, data) and the versions that
    ran it (this package's first)."""
    return {
        "model": identity["model"],
        "revision": identity["revision"],
        "label": cfg.label or identity["model"],
        "method": method_label(config),
        **{k: v for k, v in identity.items() if k not in ("model", "revision")},
        "versions": {"llava_normaligned": provenance.installed_version("llava-normaligned"), **versions},
    }


def harness_header(cfg: EvalConfig, model, identity: dict) -> dict:
    """The head of ``results.json`` for this package's own harness (``results_header`` with the versions it ran
    with: datasets, torch, transformers); ``lmms_engine.lmms_header`` is the lmms-eval engine's."""
    import datasets
    import torch
    import transformers

    return results_header(cfg, model.config, identity, {"transformers": transformers.__version__,
                                                        "torch": torch.__version__, "datasets": datasets.__version__})


def evaluate(cfg: EvalConfig, baseline: dict | None = None) -> dict:
    """The whole run; returns the results (also in cfg.output_dir). Raises EvalSetupError / EvalDataError /
    UnknownTaskError / BaselineError before any sample runs; after that, a failing task is recorded and skipped."""
    from .batches import SampleSink

    specs = resolve_tasks(cfg.tasks)
    if baseline is None and cfg.baseline:
        baseline = load_baseline(cfg.baseline)
    earlier_run = check_output(cfg) if cfg.output_dir else None
    check_model(cfg)
    splits = load_splits(specs, cfg)
    if cfg.save_data:
        save_splits(specs, splits, cfg)
    if cfg.model is None:
        return {}
    identity = run_identity(cfg, specs, splits)
    if earlier_run is not None:  # before the model loads: a refused --resume costs seconds
        check_resume(cfg, earlier_run, identity)
    model, processor = load_evaluated_model(cfg)
    if not provenance.is_local(cfg.model):
        identity["model_fingerprint"] = {"commit": provenance.loaded_hub_commit(cfg.model, cfg.revision)}
        if earlier_run is not None:  # the commit the revision resolved to for this load
            check_resume(cfg, earlier_run, identity)
    earlier = prepare_output(cfg)
    writer = ResultsWriter(cfg.output_dir, harness_header(cfg, model, identity), [s.name for s in specs], baseline)
    sink = SampleSink(os.path.join(cfg.output_dir, SAMPLES_FILE))
    try:
        for spec in specs:
            try:
                entry = run_task(spec, splits[spec.name], model, processor, sink, cfg, earlier.get(spec.name, []))
            except Exception as exc:  # the other tasks still run; this one is reported as failed
                logger.exception("task %s failed", spec.name)
                writer.task_failed(spec.name, _scrub(f"{type(exc).__name__}: {exc}", cfg))
                continue
            too_many = error_verdict(entry, cfg.max_error_rate)
            if too_many:  # a score mostly made of failed samples is no score: reported as a failed task
                logger.error("task %s failed: %s", spec.name, too_many)
                writer.task_failed(spec.name, too_many)
                continue
            writer.task_done(spec.name, entry)
            logger.info("%s: %s = %.2f (%d samples, %d errors)", spec.name, entry["metric"], entry["score"],
                        entry["n"], entry["n_errors"])
    finally:
        sink.close()
    writer.close()
    return writer.results


__all__ = ["EvalConfig", "EvalSetupError", "SAMPLES_FILE", "evaluate", "harness_header", "load_evaluated_model",
           "method_label", "results_header"]
