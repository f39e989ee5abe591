"""``llava-normaligned tiny``: a tiny random stock VLM of another family (``llava_normaligned.tiny.tiny_vlm``:
transformers' own classes, built in code, nothing downloaded) written as its checkpoints are laid out, the folder
``align`` takes (docs/align.md, "Offline, with nothing downloaded").

    llava-normaligned tiny --family idefics3 --output-dir tiny-idefics3
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from llava_normaligned.align import SUPPORTED_MODEL_TYPES as TINY_VLM_FAMILIES  # tiny.TINY_VLM_FAMILIES, unimported
from llava_normaligned.checks import SEED, BadInput, check_number, check_output_folder
from llava_normaligned.families.processors import TRAINS_WITHOUT_TORCHVISION
from llava_normaligned.notices import quiet_known_notices

from .shared import CommandParser, arguments_accepted, fail, option


def _family_name(name: str) -> str:
    return name.strip().lower().replace("-", "_")


@dataclass(frozen=True, kw_only=True)
class TinyConfig:
    """``tiny``'s options: the family, where to write, the seed."""

    family: str = option("--family", required=True, type=_family_name, choices=TINY_VLM_FAMILIES, metavar="FAMILY",
                         help=f"the model_type to build: {', '.join(TINY_VLM_FAMILIES)} (SmolVLM's architecture is "
                         f"idefics3's). `train` needs torchvision for all but {', '.join(TRAINS_WITHOUT_TORCHVISION)}")
    output_dir: str = option("--output-dir", required=True, help="new or empty folder to write the model to")
    seed: int = option("--seed", type=int, default=0, help="seed of the random weights (default 0)")


def make_parser() -> CommandParser:
    return CommandParser(
        config_class=TinyConfig,
        prog="llava-normaligned tiny",
        description="Write a tiny random stock vision-language model of another family (transformers' own classes, "
        "a few hundred kilobytes, built in code: nothing is downloaded) with its processor, as the folder "
        "`llava-normaligned align` takes. See docs/align.md, 'Offline, with nothing downloaded'.",
    )


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_config(argv)
    try:
        check_number("--seed", args.seed, SEED)
        check_output_folder("--output-dir", args.output_dir, empty=True)
    except BadInput as error:
        return fail("tiny", error)
    arguments_accepted()
    from transformers.utils import logging as transformers_logging

    from llava_normaligned.tiny import tiny_vlm  # torch and transformers: once the arguments are checked

    transformers_logging.disable_progress_bar()  # "Writing model shards": one shard of a few hundred kB
    quiet_known_notices()  # DeepSpeed's "Setting accelerator to CPU", when save_pretrained imports it
    vlm = tiny_vlm(args.family, seed=args.seed)
    vlm.save(os.path.expanduser(args.output_dir))
    count = sum(p.numel() for p in vlm.model.parameters())
    print(f"wrote {args.output_dir}: a tiny random {type(vlm.model).__name__} ({count:,} parameters) with its "
          f"processor; next: llava-normaligned align {args.output_dir} --output-dir ALIGNED")
    return 0


__all__ = ["TinyConfig", "main", "make_parser"]
