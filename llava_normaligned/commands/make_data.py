"""``llava-normaligned make-data``: the demo's synthetic VQA dataset (``demo.synthetic.make_dataset``) written as
LLaVA JSON with its images.

    llava-normaligned make-data --output-dir ./synthetic-vqa
"""

from __future__ import annotations

import argparse
import json

from llava_normaligned.checks import check_output_folder
from llava_normaligned.demo.synthetic import SyntheticSpec, make_dataset

from .shared import CommandParser, arguments_accepted, fail, progress_bars_on_terminals_only


def make_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="llava-normaligned make-data",
        description="Write the synthetic shapes/colours/counts/positions VQA dataset in the LLaVA JSON format.",
    )
    defaults = SyntheticSpec()
    parser.add_argument("--output-dir", required=True, help="folder to create (must be empty or absent)")
    parser.add_argument("--image-size", type=int, default=defaults.image_size, help="image side in pixels")
    parser.add_argument("--train-per-template", type=int, default=defaults.train_per_template,
                        help="training questions per template (a multiple of 16)")
    parser.add_argument("--test-per-template", type=int, default=defaults.test_per_template,
                        help="held-out test questions per template (a multiple of 16)")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help=f"seed of the scenes and questions drawn (default {defaults.seed})")
    parser.add_argument("--jitter", type=int, default=defaults.jitter, help="max shift of a shape in its cell (px)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
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


__all__ = ["main", "make_parser"]
