"""``llava-normaligned dpo``: TRL's ``trl dpo`` script, flag for flag, with the norm tracked
(``trainer.preference``; the parser and the run are ``trl_script``'s, shared with the other TRL scripts).

    llava-normaligned dpo --model_name_or_path ./stage2 --dataset_name ./dpo-data --output_dir ./dpo [--config RECIPE]
"""

from __future__ import annotations

from .shared.trl_script import run_script, script_parser


def make_parser():
    return script_parser("dpo")


def main(argv: list[str] | None = None) -> int:
    return run_script("dpo", argv)


__all__ = ["main", "make_parser"]
