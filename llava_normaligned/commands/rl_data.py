"""``llava-normaligned rl-data``: LLaVA JSON rows written as a dataset folder for TRL's DPO, GRPO or KTO
(``trainer.rl_data.rl_rows`` then ``save_rows``).

    llava-normaligned rl-data --data-path rows.json --image-folder ./images --format dpo --output-dir ./dpo-data
"""

from __future__ import annotations

from dataclasses import dataclass

from llava_normaligned.checks import check_input_file, check_input_folder, check_output_folder
from llava_normaligned.trainer.data import BAD_IMAGE_POLICIES, BAD_ROW_POLICIES, DataError, split_paths
from llava_normaligned.trainer.rl_data import FORMATS, rl_rows, save_rows

from .shared import CommandParser, arguments_accepted, fail, option


@dataclass(frozen=True, kw_only=True)
class RlDataConfig:
    """``rl-data``'s options: the LLaVA rows, the format, where to write, the seed and the bad-row policies."""

    data_path: str = option("--data-path", required=True,
                            help="LLaVA JSON or JSONL file(s), comma-separated (what `train --data-path` reads)")
    image_folder: str | None = option("--image-folder", default=None,
                                      help="the folder the rows' image paths are relative to (default: none, paths "
                                      "are absolute)")
    format: str = option("--format", required=True, choices=FORMATS,
                         help="grpo: image, prompt, solution; dpo: image, prompt, chosen, rejected; kto: image, "
                         "prompt, completion, label")
    output_dir: str = option("--output-dir", required=True, help="folder to write (must be empty or absent)")
    seed: int = option("--seed", type=int, default=0,
                       help="seed of the rejected answers drawn for dpo and kto (default 0)")
    on_bad_row: str = option("--on-bad-row", default="error", choices=BAD_ROW_POLICIES,
                             help="a malformed row: error (default) names it and stops; skip drops it (as train's "
                             "flag)")
    on_bad_image: str = option("--on-bad-image", default="error", choices=BAD_IMAGE_POLICIES,
                               help="a row whose image is missing or unreadable: error (default) or skip (as train's "
                               "flag)")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=RlDataConfig,
        prog="llava-normaligned rl-data",
        description="Write LLaVA JSON rows as a dataset folder for TRL's DPO, GRPO or KTO (train.parquet, images "
        "embedded): `trl dpo --dataset_name FOLDER` and `llava-normaligned dpo --dataset_name FOLDER` load it.",
    )


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_config(argv)
    try:
        for path in split_paths(args.data_path):
            check_input_file("--data-path", path)
        if args.image_folder is not None:
            check_input_folder("--image-folder", args.image_folder)
        check_output_folder("--output-dir", args.output_dir, empty=True)
    except ValueError as err:  # checks.BadInput
        return fail("rl-data", err)
    arguments_accepted()
    try:
        dataset, report = rl_rows(args.format, args.data_path, args.image_folder, args.seed, return_report=True,
                                  on_bad_row=args.on_bad_row, on_bad_image=args.on_bad_image)
    except (DataError, ValueError, FileNotFoundError) as err:
        return fail("rl-data", err.as_flags() if isinstance(err, DataError) else err, details=True)
    path = save_rows(dataset, args.output_dir)
    print(f"wrote {path}: {args.format} rows, {report.summary()}")
    return 0


__all__ = ["RlDataConfig", "main", "make_parser"]
