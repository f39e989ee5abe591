"""``llava-normaligned diagnose MODEL [--baseline MODEL] [--images DIR] [--prompts FILE] --output-dir DIR``."""

from __future__ import annotations

import argparse
import sys

from llava_normaligned.console import BadInput, check_numbers, check_output_folder, fail

from .config import DEFAULT_ALPHAS, NUMBERS, DiagnoseConfig, DiagnosticsError


def _alphas(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(a) for a in text.split(",") if a.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--alphas: expected comma-separated numbers, got {text!r}") from None


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llava-normaligned diagnose",
        description="Norm-gap diagnostics of a LLaVA-style model: the paper's probes (arXiv 2512.08374, §4, "
        "Appendix C) and the blog post's inference-time experiments. Writes diagnostics.json, CSV tables, PNG "
        "figures and summary.md.",
    )
    parser.add_argument("model", help="Hub id or folder of the model to diagnose")
    parser.add_argument("--baseline", default=None, help="a second model run on the same inputs, drawn beside it")
    parser.add_argument("--images", default=None, help="a folder of images (default: the package's scenes)")
    parser.add_argument("--prompts", default=None, help="a text file, one prompt per line (default: the package's)")
    parser.add_argument(
        "--output-dir", default=None, help="where to write the outputs (required unless --estimate-memory)"
    )
    group = parser.add_argument_group("measurement")
    group.add_argument("--max-samples", type=int, default=12, help="image-prompt pairs to run (default 12)")
    group.add_argument("--alphas", type=_alphas, default=DEFAULT_ALPHAS,
                       help="projector-output scales, comma-separated (default: the blog's 0.01,...,3; 1 is added)")
    group.add_argument("--max-new-tokens", type=int, default=8, help="greedy tokens scored per sample (default 8)")
    group.add_argument("--top-k", type=int, default=10, help="largest text-embedding rows to list (default 10)")
    group.add_argument("--batch-size", type=int, default=4,
                       help="image-prompt pairs per forward pass, and the batch --estimate-memory assumes (default 4)")
    group = parser.add_argument_group("loading")
    group.add_argument("--revision", default=None, help="branch, tag or commit of MODEL on the Hub (default: main)")
    group.add_argument("--baseline-revision", default=None,
                       help="branch, tag or commit of --baseline on the Hub (default: main)")
    group.add_argument("--device", default="auto",
                       help="auto (default: the first GPU found, else cpu), cpu, cuda, cuda:1, mps, xpu")
    group.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (default: as stored)")
    trust = group.add_mutually_exclusive_group()  # neither: None, transformers' own resolution
    trust.add_argument("--trust-remote-code", dest="trust_remote_code", action="store_const", const=True,
                       default=None, help="run a checkpoint's own code (not needed for this package's models); "
                       "review it first and pin --revision to a commit hash")
    trust.add_argument("--no-trust-remote-code", dest="trust_remote_code", action="store_const", const=False,
                       help="refuse checkpoint code without asking")
    group = parser.add_argument_group("output")
    group.add_argument("--no-plots", dest="plots", action="store_false", help="skip the PNG figures")
    group.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    group.add_argument("--estimate-memory", action="store_true",
                       help="print the estimated memory for MODEL (from its config only) and exit")
    group.add_argument("--compare-embeddings", metavar="BASE_LLM", default=None,
                       help="the paper's Appendix C tables (embedding-norm mean/std, top-k tokens by norm) for "
                       "BASE_LLM and MODEL's LLM; reads the two embedding tables only, prints the tables (and writes "
                       "them to --output-dir when given) and exits")
    group.add_argument("--base-revision", default=None, help="revision of BASE_LLM for --compare-embeddings")
    return parser


def _compare_embeddings(args) -> int:
    from llava_normaligned.loading import check_source

    from .embeddings import compare_embeddings, render, write

    check_source(args.model, "model", revision=args.revision)  # both before either table is read
    check_source(args.compare_embeddings, "--compare-embeddings", revision=args.base_revision)
    if args.output_dir:
        check_output_folder("--output-dir", args.output_dir)

    comparison = compare_embeddings(args.model, args.compare_embeddings, revision=args.revision,
                                    base_revision=args.base_revision, trust_remote_code=args.trust_remote_code,
                                    top_k=args.top_k)
    print(render(comparison), end="")
    if args.output_dir:
        written = write(comparison, args.output_dir)
        print(f"wrote {len(written)} files to {args.output_dir}")
    return 0


def _estimate_memory(args) -> int:
    from llava_normaligned.loading import load_config

    from .memory import estimate

    try:
        config = load_config(args.model, revision=args.revision, trust_remote_code=args.trust_remote_code)
    except (ValueError, OSError) as err:
        raise DiagnosticsError(f"cannot read the config of {args.model!r}: {err}") from err
    if not hasattr(config, "text_config"):
        raise DiagnosticsError(f"{args.model!r} is not a vision-language model: its config has no text_config")
    try:
        result = estimate(config, args.dtype or "bfloat16", args.batch_size, args.max_new_tokens)
    except ValueError as err:  # an unknown --dtype
        raise DiagnosticsError(f"--dtype: {err}") from err
    print(f"{args.model}: {result.describe()}")
    return 0


def _check_device_and_dtype(args) -> None:
    """--device and --dtype name something this package runs on (whether the device is there is known on loading)."""
    from llava_normaligned.loading import parse_device, parse_dtype

    try:
        if args.dtype is not None:
            parse_dtype(args.dtype)
        if args.device != "auto":
            parse_device(args.device)
    except ValueError as err:  # "dtype: ..." / "device: ..."
        raise DiagnosticsError(f"--{err}") from None


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        check_numbers(args, NUMBERS, error=DiagnosticsError)
        _check_device_and_dtype(args)
        if args.estimate_memory:
            return _estimate_memory(args)
        if args.compare_embeddings:
            return _compare_embeddings(args)
        if not args.output_dir:
            raise DiagnosticsError("--output-dir is required: the folder to write the diagnostics to")
        config = DiagnoseConfig(
            model=args.model,
            output_dir=args.output_dir,
            baseline=args.baseline,
            images=args.images,
            prompts=args.prompts,
            max_samples=args.max_samples,
            alphas=args.alphas,
            max_new_tokens=args.max_new_tokens,
            top_k=args.top_k,
            batch_size=args.batch_size,
            device=args.device,
            dtype=args.dtype,
            revision=args.revision,
            baseline_revision=args.baseline_revision,
            trust_remote_code=args.trust_remote_code,
            plots=args.plots,
            progress=args.progress,
        )
        from .runner import diagnose

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


if __name__ == "__main__":
    sys.exit(main())
