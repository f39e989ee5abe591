"""``llava-normaligned compose``: a norm-aligned LLaVA from a vision encoder and a causal LM, both pretrained
(``llava_normaligned.compose.compose``), saved with its processor. ``convert`` shares its flags and checks.

    llava-normaligned compose --vision-model google/siglip-so400m-patch14-384 \
        --text-model meta-llama/Llama-3.2-3B-Instruct --output-dir ./llava-na-3b
"""

from __future__ import annotations

from dataclasses import dataclass

from llava_normaligned.checks import POSITIVE, check_number, check_output_folder
from llava_normaligned.compose import compose, save
from llava_normaligned.families.anatomy import anatomy_of
from llava_normaligned.norm_variant import NormVariant

from .shared import CommandParser, arguments_accepted, fail, option, removed_unless_kept
from .shared.flags import NormOptions, dtype_argument, trust_remote_code_option


@dataclass(frozen=True, kw_only=True)
class BuildOptions(NormOptions):
    """What ``compose`` and ``convert`` share: the projector norm's options, --dtype and --output-dir."""

    dtype: str | None = option("--dtype", type=dtype_argument, default=None,
                               help="dtype to build and save in: bfloat16, float16, float32 (default: the language "
                               "model's)")
    output_dir: str = option("--output-dir", required=True, help="folder to write the model and processor to")


@dataclass(frozen=True, kw_only=True)
class ComposeConfig(BuildOptions):
    """``compose``'s options: the two pretrained parts and how to read them, then ``BuildOptions``."""

    vision_model: str = option("--vision-model", required=True, help="Hub id or folder of the vision encoder")
    text_model: str = option("--text-model", required=True, help="Hub id or folder of the causal LM")
    vision_revision: str | None = option("--vision-revision", default=None,
                                         help="branch, tag or commit of --vision-model on the Hub (default: main)")
    text_revision: str | None = option("--text-revision", default=None,
                                       help="branch, tag or commit of --text-model on the Hub (default: main)")
    vision_feature_layer: int = option("--vision-feature-layer", type=int, default=-2,
                                       help="default -2 (LLaVA-1.5)")
    trust_remote_code: bool | None = trust_remote_code_option()


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=ComposeConfig,
        prog="llava-normaligned compose",
        description="Build a norm-aligned LLaVA from a vision encoder (SigLIP, SigLIP2, CLIP) and a causal LM "
        "(Llama, Qwen2/2.5/3, SmolLM), with the pretrained weights of both.",
    )


def check_build_arguments(args: BuildOptions) -> None:
    """compose / convert: the number options and --output-dir (new or empty: the model's files would mix with what
    is there), before any model is read."""
    check_number("--gradient-compensation-min", args.gradient_compensation_min, POSITIVE)
    check_output_folder("--output-dir", args.output_dir, empty=True)


def save_new(model, processor, output_dir: str) -> None:
    """``save``, leaving no half-written folder when it fails or is stopped (``shared.removed_unless_kept``)."""
    with removed_unless_kept(output_dir):
        save(model, processor, output_dir)


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_config(argv)
    try:
        check_build_arguments(args)
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
    save_new(model, processor, args.output_dir)
    report_built(model, args.output_dir)
    return 0


def report_built(model, output_dir: str) -> None:
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


__all__ = ["BuildOptions", "ComposeConfig", "check_build_arguments", "main", "make_parser", "report_built", "save_new"]
