"""``llava-normaligned kto``: TRL's ``trl kto`` script, flag for flag, with the norm tracked
(``trainer.preference``; the parser and the run are ``trl_script``'s, shared with the other TRL scripts).

    llava-normaligned kto --model_name_or_path ./stage2 --dataset_name ./kto-data --output_dir ./kto [--config RECIPE]
"""

from __future__ import annotations

from .shared.trl_script import run_script, script_parser


def make_parser():
    return script_parser("kto")


def main(argv: list[str] | None = None) -> int:
    return run_script("kto", argv)


__all__ = ["main", "make_parser"]
