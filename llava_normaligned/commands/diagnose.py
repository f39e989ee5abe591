"""``llava-normaligned diagnose MODEL [--baseline MODEL] [--images DIR] [--prompts FILE] --output-dir DIR``: the
flags become a ``DiagnoseConfig`` and the run is ``llava_normaligned.diagnostics.diagnose``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from llava_normaligned.checks import BadInput, check_numbers, check_output_folder
from llava_normaligned.diagnostics.config import DEFAULT_ALPHAS, NUMBERS, DiagnoseConfig, DiagnosticsError
from llava_normaligned.loading import LoadOptions

from .shared import CommandParser, arguments_accepted, fail, option
from .shared.flags import LOADING, device_option, dtype_option, revision_option, trust_remote_code_option


def _alphas(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(a) for a in text.split(",") if a.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--alphas: expected comma-separated numbers, got {text!r}") from None


MEASUREMENT, OUTPUT = "measurement", "output"  # the --help sections


@dataclass(frozen=True, kw_only=True)
class DiagnoseOptions:
    """``diagnose``'s options, read into the library's ``DiagnoseConfig`` (and ``LoadOptions``) by ``main``."""

    model: str = option(help="Hub id or folder of the model to diagnose")
    baseline: str | None = option("--baseline", default=None,
                                  help="a second model run on the same inputs, drawn beside it")
    images: str | None = option("--images", default=None, help="a folder of images (default: the package's scenes)")
    prompts: str | None = option("--prompts", default=None,
                                 help="a text file, one prompt per line (default: the package's)")
    output_dir: str | None = option("--output-dir", default=None,
                                    help="where to write the outputs (required unless --estimate-memory)")
    max_samples: int = option("--max-samples", type=int, default=12, group=MEASUREMENT,
                              help="image-prompt pairs to run (default 12)")
    alphas: tuple[float, ...] = option("--alphas", type=_alphas, default=DEFAULT_ALPHAS, group=MEASUREMENT,
                                       help="projector-output scales, comma-separated (default: the blog's "
                                       "0.01,...,3; 1 is added)")
    max_new_tokens: int = option("--max-new-tokens", type=int, default=8, group=MEASUREMENT,
                                 help="greedy tokens scored per sample (default 8)")
    top_k: int = option("--top-k", type=int, default=10, group=MEASUREMENT,
                        help="largest text-embedding rows to list (default 10)")
    batch_size: int = option("--batch-size", type=int, default=4, group=MEASUREMENT,
                             help="image-prompt pairs per forward pass, and the batch --estimate-memory assumes "
                             "(default 4)")
    revision: str | None = revision_option()
    device: str = device_option()
    dtype: str | None = dtype_option()
    trust_remote_code: bool | None = trust_remote_code_option(LOADING)
    baseline_revision: str | None = option("--baseline-revision", default=None, group=LOADING,
                                           help="branch, tag or commit of --baseline on the Hub (default: main)")
    plots: bool = option("--no-plots", default=True, group=OUTPUT, action="store_false", help="skip the PNG figures")
    progress: bool = option("--no-progress", default=True, group=OUTPUT, action="store_false",
                            help="no progress bars")
    estimate_memory: bool = option("--estimate-memory", default=False, group=OUTPUT, action="store_true",
                                   help="print the estimated memory for MODEL (from its config only) and exit")
    compare_embeddings: str | None = option(
        "--compare-embeddings", metavar="BASE_LLM", default=None, group=OUTPUT,
        help="the paper's Appendix C tables (embedding-norm mean/std, top-k tokens by norm) for BASE_LLM and MODEL's "
        "LLM; reads the two embedding tables only, prints the tables (and writes them to --output-dir when given) and "
        "exits")
    base_revision: str | None = option("--base-revision", default=None, group=OUTPUT,
                                       help="revision of BASE_LLM for --compare-embeddings")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=DiagnoseOptions,
        prog="llava-normaligned diagnose",
        description="Norm-gap diagnostics of a LLaVA-style model: the paper's probes (arXiv 2512.08374, §4, "
        "Appendix C) and the blog post's inference-time experiments. Writes diagnostics.json, CSV tables, PNG "
        "figures and summary.md.",
    )


def _compare_embeddings(args, options: LoadOptions) -> int:
    from llava_normaligned.diagnostics.embeddings import compare_embeddings, render, write
    from llava_normaligned.loading import check_source

    check_source(options.source, "model", revision=options.revision)  # both before either table is read
    check_source(args.compare_embeddings, "--compare-embeddings", revision=args.base_revision)
    if args.output_dir:
        check_output_folder("--output-dir", args.output_dir)

    comparison = compare_embeddings(options.source, args.compare_embeddings, revision=options.revision,
                                    base_revision=args.base_revision, trust_remote_code=options.trust_remote_code,
                                    top_k=args.top_k)
    print(render(comparison), end="")
    if args.output_dir:
        written = write(comparison, args.output_dir)
        print(f"wrote {len(written)} files to {args.output_dir}")
    return 0


def _estimate_memory(args, options: LoadOptions) -> int:
    from llava_normaligned.diagnostics.memory import estimate
    from llava_normaligned.loading import load_config

    try:
        config = load_config(options.source, revision=options.revision, trust_remote_code=options.trust_remote_code)
    except (ValueError, OSError) as err:
        raise DiagnosticsError(f"cannot read the config of {options.source!r}: {err}") from err
    if not hasattr(config, "text_config"):
        raise DiagnosticsError(f"{options.source!r} is not a vision-language model: its config has no text_config")
    dtype = "bfloat16" if options.dtype in (None, "auto") else options.dtype  # "as stored": estimated for bf16
    try:
        result = estimate(config, dtype, args.batch_size, args.max_new_tokens)
    except ValueError as err:  # a dtype the estimate has no size for
        raise DiagnosticsError(f"--dtype: {err}") from err
    print(f"{options.source}: {result.describe()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_config(argv)
    try:
        check_numbers(args, NUMBERS, error=DiagnosticsError)
        options = LoadOptions.from_args(args)  # --device, --dtype: names this package runs on
        if args.estimate_memory:
            return _estimate_memory(args, options)
        if args.compare_embeddings:
            return _compare_embeddings(args, options)
        if not args.output_dir:
            raise DiagnosticsError("--output-dir is required: the folder to write the diagnostics to")
        config = DiagnoseConfig(
            model=options.source,
            output_dir=args.output_dir,
            baseline=args.baseline,
            images=args.images,
            prompts=args.prompts,
            max_samples=args.max_samples,
            alphas=args.alphas,
            max_new_tokens=args.max_new_tokens,
            top_k=args.top_k,
            batch_size=args.batch_size,
            device=options.device,
            dtype=options.dtype,
            revision=options.revision,
            baseline_revision=args.baseline_revision,
            trust_remote_code=options.trust_remote_code,
            plots=args.plots,
            progress=args.progress,
        )
        from llava_normaligned.diagnostics.runner import diagnose

        arguments_accepted()
        document, written = diagnose(config)
    except (DiagnosticsError, BadInput, ImportError, OSError) as err:  # OSError: a folder it cannot write, ...
        return fail("diagnose", err, details=True)
    ratio = document["vision_text_norm_ratio"]
    line = f"vision/text norm ratio {ratio:.3g}" if ratio is not None else "vision/text norm ratio n/a"
    if document.get("baseline"):
        base = document["baseline"]["vision_text_norm_ratio"]
        line += f" (baseline {base:.3g})" if base is not None else ""
    print(f"{line}; wrote {len(written)} files to {config.output_dir}")
    return 0
