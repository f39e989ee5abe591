"""``llava-normaligned align``: the paper's aligned LayerNorm put into a saved VLM of another family
(``llava_normaligned.align.align``), saved with the family's processor files (docs/align.md).

    llava-normaligned align HuggingFaceTB/SmolVLM-256M-Instruct --output-dir smolvlm-aligned
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from llava_normaligned.align import align, processor_source, save_aligned, supported
from llava_normaligned.checks import POSITIVE, BadInput, check_number, check_output_folder
from llava_normaligned.loading import looks_like_path
from llava_normaligned.norm_variant import NormVariant

from .shared import CommandParser, arguments_accepted, fail, option
from .shared.flags import NormOptions, dtype_argument, trust_remote_code_option


@dataclass(frozen=True, kw_only=True)
class AlignConfig(NormOptions):
    """``align``'s options: the stock model, where to write, how to load it, the norm's options."""

    model: str = option(metavar="MODEL", help="Hub id or folder of the stock model")
    output_dir: str = option("--output-dir", required=True, help="new or empty folder to write the aligned model to")
    revision: str | None = option("--revision", default=None,
                                  help="branch, tag or commit of MODEL on the Hub (default: main)")
    dtype: str | None = option("--dtype", type=dtype_argument, default=None,
                               help="dtype to load and save in: bfloat16, float16, float32 (default: as stored)")
    trust_remote_code: bool | None = trust_remote_code_option()


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=AlignConfig,
        prog="llava-normaligned align",
        description="Put the paper's aligned LayerNorm (gain T/sqrt(D), GWC) into a saved vision-language model "
        f"where its connector's output enters the LLM. Families: {supported()}. See docs/align.md.",
    )


def _check_align_arguments(args: AlignConfig) -> NormVariant:
    check_number("--gradient-compensation-min", args.gradient_compensation_min, POSITIVE)
    check_output_folder("--output-dir", args.output_dir, empty=True)
    variant = NormVariant.from_args(args)
    if variant.projector_norm is None:
        raise BadInput("--projector-norm none: align inserts the norm; without it the stock model is the answer")
    if looks_like_path(args.model) and not os.path.isdir(os.path.expanduser(args.model)):
        raise BadInput(f"MODEL {args.model}: no such folder")
    return variant


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_config(argv)
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


__all__ = ["AlignConfig", "main", "make_parser"]
