"""``llava-normaligned make-data``: the demo's synthetic VQA dataset (``demo.synthetic.make_dataset``) written as
LLaVA JSON with its images.

    llava-normaligned make-data --output-dir ./synthetic-vqa
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from llava_normaligned.checks import check_output_folder
from llava_normaligned.demo.synthetic import SyntheticSpec, make_dataset

from .shared import CommandParser, arguments_accepted, fail, option, progress_bars_on_terminals_only

_SPEC = SyntheticSpec()  # the dataset's defaults


@dataclass(frozen=True, kw_only=True)
class MakeDataConfig:
    """``make-data``'s options: where to write and the ``SyntheticSpec`` fields."""

    output_dir: str = option("--output-dir", required=True, help="folder to create (must be empty or absent)")
    image_size: int = option("--image-size", type=int, default=_SPEC.image_size, help="image side in pixels")
    train_per_template: int = option("--train-per-template", type=int, default=_SPEC.train_per_template,
                                     help="training questions per template (a multiple of 16)")
    test_per_template: int = option("--test-per-template", type=int, default=_SPEC.test_per_template,
                                    help="held-out test questions per template (a multiple of 16)")
    seed: int = option("--seed", type=int, default=_SPEC.seed,
                       help=f"seed of the scenes and questions drawn (default {_SPEC.seed})")
    jitter: int = option("--jitter", type=int, default=_SPEC.jitter, help="max shift of a shape in its cell (px)")
    no_progress: bool = option("--no-progress", default=False, action="store_true", help="no progress bar")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=MakeDataConfig,
        prog="llava-normaligned make-data",
        description="Write the synthetic shapes/colours/counts/positions VQA dataset in the LLaVA JSON format.",
    )


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_config(argv)
    try:
        check_output_folder("--output-dir", args.output_dir, empty=True)
        spec = SyntheticSpec(
            image_size=args.image_size,
            train_per_template=args.train_per_template,
            test_per_template=args.test_per_template,
            seed=args.seed,
            jitter=args.jitter,
        )
    except ValueError as error:  # checks.BadInput, or a field of the spec out of range
        return fail("make-data", error)
    arguments_accepted()
    paths = make_dataset(args.output_dir, spec, progress=not args.no_progress and progress_bars_on_terminals_only())
    with open(paths.info) as f:
        rows = json.load(f)["rows"]
    print(
        f"wrote {paths.root}: {rows['pretrain']} captions (pretrain.json, stage 1), {rows['instruct']} questions "
        f"(instruct.json, stage 2), {rows['test']} held-out questions (test.json); images under images/"
    )
    return 0


__all__ = ["MakeDataConfig", "main", "make_parser"]
