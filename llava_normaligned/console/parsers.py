"""The parser every command builds: ``argparse`` with one-line usage errors and no abbreviated flags."""

from __future__ import annotations

import argparse
import sys

from .held_output import end_hold


class OneLineUsageErrors:
    """For an ``argparse`` parser (put it before the parser class in the bases: ``CommandParser``, and ``train``'s
    and ``dpo``/``grpo``/``kto``'s ``TrlParser`` subclasses, whose ``HfArgumentParser`` passes its keyword arguments
    on to ``argparse.ArgumentParser``):

    - argparse's own usage errors (an unknown flag, a value that is not a number, a missing argument) are one line,
      ``PROG: error: MESSAGE`` and the hint to ``--help``, exit code 2, as every other bad input (``fail``); the usage
      block is left to ``--help``;
    - a flag is only ever its whole name: argparse's abbreviations (``allow_abbrev``) are off, whatever the caller
      passes, so a typo that is a prefix of a flag (``--max_step 2`` for ``--max_steps``) is an unknown flag, not
      that flag. (argparse still reads ``-xy`` as the single-dash flags ``-x -y``.)"""

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        end_hold(keep=False)
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


class CommandParser(OneLineUsageErrors, argparse.ArgumentParser):
    """The parser of a command: ``argparse.ArgumentParser`` with one-line usage errors and no abbreviated flags."""
