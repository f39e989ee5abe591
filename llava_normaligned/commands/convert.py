"""``llava-normaligned convert``: a stock ``LlavaForConditionalGeneration`` checkpoint turned into a norm-aligned one
(``llava_normaligned.compose.convert_from_llava``), with ``compose``'s flags and checks.

    llava-normaligned convert --from-llava llava-hf/llava-1.5-7b-hf --output-dir ./llava-1.5-7b-na
"""

from __future__ import annotations

from dataclasses import dataclass

from llava_normaligned.compose import convert_from_llava
from llava_normaligned.norm_variant import NormVariant

from .compose import BuildOptions, check_build_arguments, report_built, save_new
from .shared import CommandParser, arguments_accepted, fail, option


@dataclass(frozen=True, kw_only=True)
class ConvertConfig(BuildOptions):
    """``convert``'s options: the stock checkpoint, then ``compose``'s ``BuildOptions``."""

    from_llava: str = option("--from-llava", required=True, help="Hub id or folder of a stock LLaVA checkpoint")
    revision: str | None = option("--revision", default=None,
                                  help="branch, tag or commit of --from-llava on the Hub (default: main)")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=ConvertConfig,
        prog="llava-normaligned convert",
        description="Turn a stock LlavaForConditionalGeneration checkpoint into a norm-aligned one.",
    )


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_config(argv)
    try:
        check_build_arguments(args)
        arguments_accepted()
        model, processor = convert_from_llava(
            args.from_llava, dtype=args.dtype, revision=args.revision, norm_variant=NormVariant.from_args(args)
        )
    except (OSError, ValueError) as error:
        return fail("convert", error)
    save_new(model, processor, args.output_dir)
    report_built(model, args.output_dir)
    return 0


__all__ = ["ConvertConfig", "main", "make_parser"]
