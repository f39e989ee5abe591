"""``llava-normaligned eval``: score a checkpoint on the paper's benchmarks (Table 4) and the demo's task.

    llava-normaligned eval ./llava-na-3b --tasks all --output-dir ./llava-na-3b/eval
    llava-normaligned eval ./llava-na-3b --tasks pope,mmstar --data-dir /data/bench --limit 50 \
        --baseline ./llava-3b/eval/results.json --output-dir ./eval-smoke
    llava-normaligned eval ./llava-na-3b --engine lmms-eval --tasks all --output-dir ./llava-na-3b/eval

The flags become an ``EvalConfig``; the run itself is ``llava_normaligned.evaluation.evaluate`` (this package's own
harness) or ``evaluation.lmms_engine.evaluate_with_lmms`` (lmms-eval, through the ``llava_normaligned`` model
plugin).

Exit codes: 0 every task scored without sample errors (or with errors under --max-error-rate and --allow-errors);
1 a task failed, or samples raised errors; 2 bad arguments or inputs, found before any sample runs.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass

from llava_normaligned.checks import (
    POSITIVE_COUNT,
    BadInput,
    NumberRule,
    check_input_file,
    check_input_folder,
    check_numbers,
    check_output_folder,
)
from llava_normaligned.evaluation.data import EvalDataError
from llava_normaligned.evaluation.results_files import BaselineError, load_baseline, table_markdown
from llava_normaligned.evaluation.runner import SAMPLES_FILE, EvalConfig, EvalSetupError, evaluate
from llava_normaligned.evaluation.tasks import TASKS, UnknownTaskError
from llava_normaligned.loading import LoadOptions

from .shared import CommandParser, arguments_accepted, fail, option
from .shared.flags import (
    LOADING,
    device_option,
    dtype_option,
    quantization_option,
    revision_option,
    trust_remote_code_option,
)


@dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """``eval``'s options, read into the library's ``EvalConfig`` by ``config_from_args``."""

    model: str | None = option(nargs="?", default=None, help="checkpoint folder or Hub repo id")
    tasks: str | None = option("--tasks", default=None,
                               help=f"comma-separated: {', '.join(TASKS)}; 'all' = Table 4's nine")
    output_dir: str | None = option("--output-dir", default=None,
                                    help="where samples.jsonl, results.json and results.md go")
    baseline: str | None = option("--baseline", default=None,
                                  help="results.json of an earlier run: the table shows deltas against it")
    data_dir: str | None = option("--data-dir", default=None,
                                  help="local copies: DIR/TASK/ holds the split (parquet files or save_to_disk)")
    limit: int | None = option("--limit", type=int, default=None,
                               help="score only the first N samples of each task (smoke runs)")
    batch_size: int = option("--batch-size", type=int, default=8, help="requests per forward pass (default 8)")
    max_new_tokens: int | None = option("--max-new-tokens", type=int, default=None,
                                        help="override each task's generation length")
    label: str | None = option("--label", default=None, help="the model's name in the table (default: its folder name)")
    overwrite: bool = option("--overwrite", default=False, one_of="runs", action="store_true",
                             help="replace an earlier run's files in --output-dir")
    resume: bool = option("--resume", default=False, one_of="runs", action="store_true",
                          help="keep an earlier run's finished samples and tasks in --output-dir and do the rest")
    save_data: str | None = option("--save-data", default=None, metavar="DIR",
                                   help="write each loaded split to DIR/TASK (save_to_disk), a copy for --data-dir on "
                                   "a machine without network; without MODEL, only that")
    max_error_rate: float = option("--max-error-rate", type=float, default=0.05, metavar="FRACTION",
                                   help="a task with more than this share of samples raising errors is failed, not "
                                   "scored (default 0.05; a task whose samples all raise always is)")
    allow_errors: bool = option("--allow-errors", default=False, action="store_true",
                                help="exit 0 when samples raised errors but every task stayed under --max-error-rate "
                                "(their scores are marked in the table)")
    engine: str = option("--engine", choices=["own", "lmms-eval"], default="own",
                         help="own: this package's harness (default); lmms-eval: lmms-eval with this package's model "
                         "plugin, writing the same results.md (needs the [eval] extra)")
    list_tasks: bool = option("--list-tasks", default=False, action="store_true",
                              help="print the tasks, their datasets and schemas")
    revision: str | None = revision_option()
    device: str = device_option()
    dtype: str | None = dtype_option()
    trust_remote_code: bool | None = trust_remote_code_option(LOADING)
    quantization: str | None = quantization_option()


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=EvalOptions,
        prog="llava-normaligned eval",
        description="Score a model on the benchmarks of the paper's Table 4 (and the demo's synthetic task).",
    )


# the counts and the error share of a run, checked before anything is read
NUMBERS = {"limit": POSITIVE_COUNT, "batch_size": POSITIVE_COUNT, "max_new_tokens": POSITIVE_COUNT,
           "max_error_rate": NumberRule(low=0, high=1)}


def config_from_args(args: EvalOptions) -> EvalConfig:
    required = [("--tasks", args.tasks)]
    if args.model or not args.save_data:  # --save-data alone needs no model
        required += [("MODEL", args.model), ("--output-dir", args.output_dir)]
    missing = [flag for flag, value in required if not value]
    if missing:
        raise EvalSetupError(f"missing {', '.join(missing)}")
    check_numbers(args, NUMBERS, error=EvalSetupError)
    try:
        if args.data_dir:
            check_input_folder("--data-dir", args.data_dir)
        if args.baseline:
            check_input_file("--baseline", args.baseline)
        for flag, folder in (("--output-dir", args.output_dir), ("--save-data", args.save_data)):
            if folder:
                check_output_folder(flag, folder)
        options = LoadOptions.from_args(args, source=args.model or "")  # --device, --dtype: names this package runs on
    except BadInput as err:
        raise EvalSetupError(str(err)) from None
    return EvalConfig(
        model=args.model,
        tasks=args.tasks,
        output_dir=args.output_dir,
        revision=options.revision,
        quantization=options.quantization,
        device=options.device,
        dtype=options.dtype,
        trust_remote_code=options.trust_remote_code,
        data_dir=args.data_dir,
        limit=args.limit,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        baseline=args.baseline,
        label=args.label,
        overwrite=args.overwrite,
        resume=args.resume,
        save_data=args.save_data,
        allow_errors=args.allow_errors,
        max_error_rate=args.max_error_rate,
    )


def list_tasks() -> str:
    lines = ["| task | Table 4 column | Hub dataset | config | split | kind | columns |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for spec in TASKS.values():
        hub = spec.hub
        lines.append(
            f"| {spec.name} | {spec.column} | {hub.path if hub else '(local only)'} | {hub.config or '' if hub else ''} | "
            f"{hub.split if hub else 'test'} | {spec.kind} | {', '.join(spec.columns)} |"
        )
    return "\n".join(lines)


def exit_code(results: dict, allow_errors: bool) -> int:
    """1 when a task failed, or when scored tasks hold sample errors and ``allow_errors`` is off; else 0."""
    errors = sum(entry.get("n_errors", 0) for entry in results["tasks"].values())
    if errors:
        accepted = "accepted (--allow-errors)" if allow_errors else "pass --allow-errors to accept them"
        print(f"warning: {errors} samples raised errors and were scored wrong; their scores are marked † (see "
              f"'error' in {SAMPLES_FILE}); {accepted}", file=sys.stderr)
    for name, error in results["failed_tasks"].items():
        fail("eval", f"task {name} failed: {error}", code=1, details=True)
    return 1 if results["failed_tasks"] or (errors and not allow_errors) else 0


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_config(argv)
    if args.list_tasks:
        print(list_tasks())
        return 0
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = config_from_args(args)
        baseline = load_baseline(cfg.baseline) if cfg.baseline else None
        arguments_accepted()
        if args.engine == "lmms-eval":
            from llava_normaligned.evaluation.lmms_engine import evaluate_with_lmms

            results = evaluate_with_lmms(cfg, baseline)
        else:
            results = evaluate(cfg, baseline)
    except (EvalSetupError, EvalDataError, UnknownTaskError, BaselineError) as exc:
        return fail("eval", exc, details=True)  # a refused --resume lists what differs
    if cfg.model is None:
        print(f"saved the splits under {cfg.save_data}; evaluate offline with --data-dir {cfg.save_data}")
        return 0
    print(table_markdown(results, baseline))
    samples = SAMPLES_FILE if args.engine == "own" else "lmms-eval's output in lmms_eval/"
    print(f"\nwrote {os.path.join(cfg.output_dir, 'results.json')}, results.md and {samples}")
    return exit_code(results, cfg.allow_errors)


__all__ = ["exit_code", "main", "make_parser"]
