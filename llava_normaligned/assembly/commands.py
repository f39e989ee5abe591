"""The commands that build a model: ``compose`` (a vision encoder and a causal LM), ``convert`` (a stock LLaVA) and
``align`` (a saved VLM of another family): their parsers, argument checks and what they print. The work is the
core's library functions: ``llava_normaligned.compose`` (``compose``, ``convert_from_llava``, ``save``) and
``llava_normaligned.align`` (``align``, ``save_aligned``).

    llava-normaligned compose --vision-model google/siglip-so400m-patch14-384 \
        --text-model meta-llama/Llama-3.2-3B-Instruct --output-dir ./llava-na-3b
    llava-normaligned convert --from-llava llava-hf/llava-1.5-7b-hf --output-dir ./llava-1.5-7b-na
    llava-normaligned align HuggingFaceTB/SmolVLM-256M-Instruct --output-dir smolvlm-aligned
"""

from __future__ import annotations

import argparse
import os

from llava_normaligned.align import align, processor_source, save_aligned, supported
from llava_normaligned.compose import compose, convert_from_llava, save
from llava_normaligned.console import (
    POSITIVE,
    BadInput,
    CommandParser,
    arguments_accepted,
    check_number,
    check_output_folder,
    fail,
    removed_unless_kept,
)
from llava_normaligned.families.anatomy import anatomy_of
from llava_normaligned.flags import add_norm_flags, add_trust_remote_code_flags, dtype_argument
from llava_normaligned.loading import looks_like_path
from llava_normaligned.norm_variant import NormVariant


def _add_build_options(parser: argparse.ArgumentParser) -> None:
    """compose / convert: the projector norm's flags (``flags.add_norm_flags``), --dtype and --output-dir."""
    add_norm_flags(parser)
    parser.add_argument(
        "--dtype", type=dtype_argument, default=None,
        help="dtype to build and save in: bfloat16, float16, float32 (default: the language model's)",
    )
    parser.add_argument("--output-dir", required=True, help="folder to write the model and processor to")


def make_compose_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="llava-normaligned compose",
        description="Build a norm-aligned LLaVA from a vision encoder (SigLIP, SigLIP2, CLIP) and a causal LM "
        "(Llama, Qwen2/2.5/3, SmolLM), with the pretrained weights of both.",
    )
    parser.add_argument("--vision-model", required=True, help="Hub id or folder of the vision encoder")
    parser.add_argument("--text-model", required=True, help="Hub id or folder of the causal LM")
    parser.add_argument("--vision-revision", default=None,
                        help="branch, tag or commit of --vision-model on the Hub (default: main)")
    parser.add_argument("--text-revision", default=None,
                        help="branch, tag or commit of --text-model on the Hub (default: main)")
    parser.add_argument("--vision-feature-layer", type=int, default=-2, help="default -2 (LLaVA-1.5)")
    add_trust_remote_code_flags(parser)
    _add_build_options(parser)
    return parser


def make_convert_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="llava-normaligned convert",
        description="Turn a stock LlavaForConditionalGeneration checkpoint into a norm-aligned one.",
    )
    parser.add_argument("--from-llava", required=True, help="Hub id or folder of a stock LLaVA checkpoint")
    parser.add_argument("--revision", default=None,
                        help="branch, tag or commit of --from-llava on the Hub (default: main)")
    _add_build_options(parser)
    return parser


def _check_arguments(args) -> None:
    """compose / convert: the number options and --output-dir (new or empty: the model's files would mix with what
    is there), before any model is read."""
    check_number("--gradient-compensation-min", args.gradient_compensation_min, POSITIVE)
    check_output_folder("--output-dir", args.output_dir, empty=True)


def _save_new(model, processor, output_dir: str) -> None:
    """``save``, leaving no half-written folder when it fails or is stopped (``console.removed_unless_kept``)."""
    with removed_unless_kept(output_dir):
        save(model, processor, output_dir)


def compose_main(argv: list[str] | None = None) -> int:
    args = make_compose_parser().parse_args(argv)
    try:
        _check_arguments(args)
        arguments_accepted()
        model, processor = compose(
            args.vision_model,
            args.text_model,
            vision_feature_layer=args.vision_feature_layer,
            dtype=args.dtype,
            revision=args.vision_revision,
            text_revision=args.text_revision,
            trust_remote_code=args.trust_remote_code,
            norm_variant=NormVariant.from_args(args),
        )
    except (OSError, ValueError) as error:  # a model that is not there, or not one compose can take
        return fail("compose", error)
    _save_new(model, processor, args.output_dir)
    _report(model, args.output_dir)
    return 0


def convert_main(argv: list[str] | None = None) -> int:
    args = make_convert_parser().parse_args(argv)
    try:
        _check_arguments(args)
        arguments_accepted()
        model, processor = convert_from_llava(
            args.from_llava, dtype=args.dtype, revision=args.revision, norm_variant=NormVariant.from_args(args)
        )
    except (OSError, ValueError) as error:
        return fail("convert", error)
    _save_new(model, processor, args.output_dir)
    _report(model, args.output_dir)
    return 0


def _report(model, output_dir: str) -> None:
    """The line compose / convert end with: the variant as ``NormVariant.report`` says it (a model without a norm:
    nothing of an init or GWC), T and D, the norm's mean |gain| where there is a norm, the image tokens."""
    from modeling_llava_normaligned import gain_statistics

    cfg = model.config
    norm = anatomy_of(model).projector_norm
    gain = "" if norm is None else f" mean|gain|={gain_statistics(norm.weight, norm.bias)['gain_abs_mean']:.5f}"
    print(
        f"wrote {output_dir}: {NormVariant.from_config(cfg).report()} "
        f"T={cfg.norm_target:.4f} D={cfg.text_config.hidden_size}{gain} image tokens/image={cfg.image_seq_length}"
    )


def make_align_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="llava-normaligned align",
        description="Put the paper's aligned LayerNorm (gain T/sqrt(D), GWC) into a saved vision-language model "
        f"where its connector's output enters the LLM. Families: {supported()}. See docs/align.md.",
    )
    parser.add_argument("model", metavar="MODEL", help="Hub id or folder of the stock model")
    parser.add_argument("--output-dir", required=True, help="new or empty folder to write the aligned model to")
    parser.add_argument("--revision", default=None, help="branch, tag or commit of MODEL on the Hub (default: main)")
    parser.add_argument("--dtype", type=dtype_argument, default=None,
                        help="dtype to load and save in: bfloat16, float16, float32 (default: as stored)")
    add_trust_remote_code_flags(parser)
    add_norm_flags(parser)
    return parser


def _check_align_arguments(args) -> NormVariant:
    check_number("--gradient-compensation-min", args.gradient_compensation_min, POSITIVE)
    check_output_folder("--output-dir", args.output_dir, empty=True)
    variant = NormVariant.from_args(args)
    if variant.projector_norm is None:
        raise BadInput("--projector-norm none: align inserts the norm; without it the stock model is the answer")
    if looks_like_path(args.model) and not os.path.isdir(os.path.expanduser(args.model)):
        raise BadInput(f"MODEL {args.model}: no such folder")
    return variant


def align_main(argv: list[str] | None = None) -> int:
    args = make_align_parser().parse_args(argv)
    try:
        variant = _check_align_arguments(args)
        arguments_accepted()
        model = align(
            args.model,
            norm_init=variant.norm_init,
            gradient_compensation=variant.gradient_compensation,
            gradient_compensation_min=variant.gradient_compensation_min,
            dtype=args.dtype,
            revision=args.revision,
            trust_remote_code=args.trust_remote_code,
        )
        source = processor_source(args.model, args.revision)
    except (OSError, ValueError) as error:  # BadInput, AlignError, AnatomyError: ValueErrors
        return fail("align", error)
    save_aligned(model, args.output_dir, source)
    cfg = model.config
    gain = float(model.get_aligned_norm().weight.detach().float().abs().mean())
    print(f"wrote {args.output_dir}: family={cfg.norm_family} norm at {cfg.norm_connector} ({cfg.norm_entry}) "
          f"T={cfg.norm_target:.4f} D={cfg.get_text_config().hidden_size} mean|gain|={gain:.5f} "
          f"GWC={cfg.gradient_compensation}")
    return 0


__all__ = ["align_main", "compose_main", "convert_main", "make_align_parser", "make_compose_parser",
           "make_convert_parser"]
