"""``llava-normaligned eval --engine lmms-eval``: the same Table 4 outputs, with lmms-eval doing the evaluation.

lmms-eval runs in a child process (``python -m lmms_eval`` of this interpreter) on this package's model plugin
(``lmms_plugin.py``): ``--model llava_normaligned --model_args pretrained=...``, every task in one run, its output
under ``OUTPUT_DIR/lmms_eval/`` (``<model>/<timestamp>_results.json`` and the per-sample files, with
``--log_samples``) and its log in ``OUTPUT_DIR/lmms_eval.log``. lmms-eval exits 0 even when a task raises, so
success is read from its results JSON only: a task without its headline metric there is failed, with the log's
last error. The headline of each task is the metric lmms-eval reports for it (below, as a percentage); results.json
and results.md are then written by the same code as this package's own harness (results_files.py), baseline deltas
included.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass

from ..local_paths import public_name
from . import provenance
from .results_files import ResultsWriter, load_baseline
from .runner import EvalConfig, EvalSetupError, check_model, check_output, results_header
from .tasks import TASKS, resolve_tasks

logger = logging.getLogger(__name__)

LMMS_DIR = "lmms_eval"  # under --output-dir
LMMS_LOG = "lmms_eval.log"
INSTALL_HINT = "pip install 'llava-normaligned[eval]' (on a CPU-only torch: see docs/evaluation.md, 'lmms-eval')"
# lmms-eval on a CPU-only torch (docs/evaluation.md): lmms-eval's hard requirement on torchvision pulls a build that
# does not import with the CPU torch, so lmms-eval goes in without its requirements, then what the nine tasks and
# this plugin need at run time, with torch pinned to the installed one.
CPU_INSTALL = {
    "lmms_eval": "lmms-eval>=0.7.3,<0.8",
    "constraints": "torch==2.13.0\nfilelock<4\n",
    "needs": ["loguru", "pytablewriter", "evaluate", "sacrebleu", "jsonlines", "tenacity", "openpyxl", "filelock<4"],
}


@dataclass(frozen=True)
class LmmsTask:
    task: str  # lmms-eval's task (or group) name
    metric: str  # key in its results JSON: "<metric>,<filter>"
    scale: float  # to a percentage
    note: str


# This package's task -> lmms-eval 0.7.3's task and the number it reports for it.
LMMS_TASKS = {
    "mmbench_en_dev": LmmsTask("mmbench_en_dev", "gpt_eval_score,none", 1.0,
                               "lmms-eval's gpt_eval_score (CircularEval; a GPT judge reads answers its rules cannot, "
                               "when an OpenAI key is set)."),
    "mmstar": LmmsTask("mmstar", "average,none", 100.0, "lmms-eval's average: the mean of the l2-category accuracies."),
    "pope": LmmsTask("pope", "pope_f1_score,none", 100.0,
                     "lmms-eval's pope_f1_score: the lower-cased answer compared exactly with yes/no."),
    "seedbench_2_plus": LmmsTask("seedbench_2_plus", "seedbench_2_plus_all,none", 100.0,
                                 "lmms-eval's seedbench_2_plus_all: the answer's first character against the letter."),
    "ocrbench": LmmsTask("ocrbench", "ocrbench_accuracy,none", 100.0, "lmms-eval's ocrbench_accuracy."),
    "scienceqa_img": LmmsTask("scienceqa_img", "exact_match,none", 100.0, "lmms-eval's exact_match."),
    "ai2d": LmmsTask("ai2d", "exact_match,flexible-extract", 100.0, "lmms-eval's exact_match (flexible-extract)."),
    "hellaswag": LmmsTask("hellaswag", "acc_norm,none", 100.0, "lmms-eval's acc_norm, zero-shot."),
    "mmlu": LmmsTask("mmlu", "acc,none", 100.0, "lmms-eval's acc over the 57 subjects (weighted by size), zero-shot."),
}


def check_engine_config(cfg: EvalConfig) -> list[str]:
    """lmms-eval's task names for the run; raises EvalSetupError for what this engine cannot do."""
    specs = resolve_tasks(cfg.tasks)
    local_only = [s.name for s in specs if s.name not in LMMS_TASKS]
    if local_only:
        raise EvalSetupError(f"--engine lmms-eval: lmms-eval has no task {', '.join(local_only)}; run it with the "
                             "package's own harness (--engine own)")
    for flag, value in (("--data-dir", cfg.data_dir), ("--save-data", cfg.save_data), ("--resume", cfg.resume)):
        if value:
            raise EvalSetupError(f"--engine lmms-eval: {flag} is for the package's own harness; lmms-eval reads its "
                                 "data sets from the Hub or from the datasets cache (HF_HOME), see docs/evaluation.md")
    if cfg.model is None:
        raise EvalSetupError("--engine lmms-eval: missing MODEL")
    if importlib.util.find_spec("lmms_eval") is None:
        raise EvalSetupError(f"--engine lmms-eval: lmms-eval is not installed: {INSTALL_HINT}")
    return [s.name for s in specs]


def model_args(cfg: EvalConfig) -> str:
    """``--model_args`` for the plugin. lmms-eval splits on commas, so a value holding one cannot be passed."""
    args = {"pretrained": cfg.model, "revision": cfg.revision, "dtype": None if cfg.dtype == "auto" else cfg.dtype,
            "device": cfg.device, "trust_remote_code": cfg.trust_remote_code, "max_new_tokens": cfg.max_new_tokens,
            "load_in_4bit": True if cfg.quantization == "4bit" else None,
            "load_in_8bit": True if cfg.quantization == "8bit" else None}
    for key, value in args.items():
        if value is not None and ("," in str(value) or "=" in str(value)):
            raise EvalSetupError(f"--engine lmms-eval: {key} {value!r} holds ',' or '=', which lmms-eval's "
                                 "--model_args cannot carry")
    return ",".join(f"{k}={v}" for k, v in args.items() if v is not None)


def lmms_command(cfg: EvalConfig, names: list[str]) -> list[str]:
    command = [sys.executable, "-m", "lmms_eval", "--model", "llava_normaligned", "--model_args", model_args(cfg),
               "--tasks", ",".join(LMMS_TASKS[n].task for n in names), "--batch_size", str(cfg.batch_size),
               "--output_path", os.path.join(cfg.output_dir, LMMS_DIR), "--log_samples"]
    return command + (["--limit", str(cfg.limit)] if cfg.limit else [])


def lmms_environment() -> dict:
    """The environment lmms-eval runs in: this one's, and, offline, its datasets cache pinned to the one ``datasets``
    reads here (``LMMS_EVAL_DATASETS_CACHE``, unless set). lmms-eval moves its datasets cache to a node-local scratch
    folder (``/tmp/lmms_eval_hf_datasets/USER``) when it takes the usual one for a network file system (NFS, Lustre,
    9p, ...); offline, the moved cache is empty and every task fails with a ConnectionError, although the data sets
    are there."""
    import datasets.config

    env = dict(os.environ)
    if datasets.config.HF_HUB_OFFLINE and not env.get("LMMS_EVAL_DATASETS_CACHE", "").strip():
        env["LMMS_EVAL_DATASETS_CACHE"] = str(datasets.config.HF_DATASETS_CACHE)
    return env


def latest_results(output_dir: str) -> str | None:
    """The newest ``<model>/<timestamp>_results.json`` lmms-eval wrote under OUTPUT_DIR/lmms_eval."""
    found = glob.glob(os.path.join(output_dir, LMMS_DIR, "**", "*_results.json"), recursive=True)
    return max(found, key=os.path.getmtime) if found else None


def _last_error(log_path: str) -> str:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if "Error" in line or "error" in line]
    except OSError:
        return "no log"
    return lines[-1][-300:] if lines else "no error in the log"


def task_entry(name: str, lmms_results: dict, n_samples: dict) -> dict | str:
    """This package's results entry for one task from lmms-eval's results, or why there is none."""
    spec = LMMS_TASKS[name]
    reported = lmms_results.get(spec.task)
    value = (reported or {}).get(spec.metric)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"lmms-eval reported no {spec.metric} for {spec.task}"
    n = (n_samples.get(spec.task) or {}).get("effective")
    if n is None:  # a group (mmlu): the sum over its tasks
        n = sum((v or {}).get("effective", 0) for k, v in n_samples.items() if k.startswith(f"{spec.task}_")) or None
    metrics = {k.split(",")[0]: v for k, v in reported.items() if isinstance(v, (int, float)) and "stderr" not in k
               and not isinstance(v, bool)}
    return {
        "metric": spec.metric.split(",")[0],
        "score": float(value) * spec.scale,
        "metrics": metrics,
        "categories": {},
        "n": n,
        "n_errors": 0,
        "n_unparsed": None,
        "column": TASKS[name].column,
        "notes": spec.note,
        "lmms_eval_task": spec.task,
        "first_error": None,
    }


def lmms_header(cfg: EvalConfig) -> dict:
    """The head of ``results.json`` for a run through lmms-eval: ``runner.results_header`` from the checkpoint's
    config (the model runs in lmms-eval's process) and the lmms-eval version."""
    from llava_normaligned.loading import load_config

    config = load_config(cfg.model, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    identity = {
        "model": public_name(cfg.model),
        "revision": cfg.revision,
        "engine": "lmms-eval",
        "model_fingerprint": provenance.model_fingerprint(cfg.model),
        "settings": provenance.public_settings({"tasks": cfg.tasks, "limit": cfg.limit, "batch_size": cfg.batch_size,
                                                "max_new_tokens": cfg.max_new_tokens,
                                                "quantization": cfg.quantization, "dtype": cfg.dtype,
                                                "device": cfg.device}),
    }
    return results_header(cfg, config, identity, {"lmms_eval": provenance.installed_version("lmms-eval")})


def evaluate_with_lmms(cfg: EvalConfig, baseline: dict | None = None) -> dict:
    """Run lmms-eval on ``cfg`` and write results.json / results.md from its output; returns the results.
    Raises EvalSetupError before lmms-eval starts for what it cannot do."""
    names = check_engine_config(cfg)
    if baseline is None and cfg.baseline:
        baseline = load_baseline(cfg.baseline)
    check_output(cfg)
    check_model(cfg)
    try:
        config_header = lmms_header(cfg)
    except (OSError, ValueError) as exc:
        raise EvalSetupError(f"cannot read the config of model {cfg.model!r}: {exc}") from exc
    os.makedirs(cfg.output_dir, exist_ok=True)
    log_path = os.path.join(cfg.output_dir, LMMS_LOG)
    command = lmms_command(cfg, names)
    logger.info("running lmms-eval: %s (log: %s)", " ".join(command[3:]), log_path)
    started = latest_results(cfg.output_dir)
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=lmms_environment())
    path = latest_results(cfg.output_dir)
    writer = ResultsWriter(cfg.output_dir, config_header, names, baseline)
    if path is None or path == started:
        for name in names:
            writer.task_failed(name, f"lmms-eval wrote no results (exit {code}; {_last_error(log_path)})")
        writer.close()
        return writer.results
    with open(path, encoding="utf-8") as f:
        lmms = json.load(f)
    writer.results["lmms_eval_results"] = os.path.relpath(path, cfg.output_dir)
    for name in names:
        entry = task_entry(name, lmms.get("results", {}), lmms.get("n-samples", {}))
        if isinstance(entry, str):
            writer.task_failed(name, f"{entry} ({_last_error(log_path)})")
        else:
            writer.task_done(name, entry)
    writer.close()
    return writer.results
