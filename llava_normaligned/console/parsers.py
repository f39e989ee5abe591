"""The parser every command builds: ``argparse`` with one-line usage errors."""

from __future__ import annotations

import argparse
import sys

from .held_output import end_hold


class OneLineUsageErrors:
    """For an ``argparse`` parser (put it before the parser class in the bases): argparse's own usage errors (an
    unknown flag, a value that is not a number, a missing argument) are one line, ``PROG: error: MESSAGE`` and the
    hint to ``--help``, exit code 2, as every other bad input (``fail``); the usage block is left to ``--help``."""

    def error(self, message: str):
        end_hold(keep=False)
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


class CommandParser(OneLineUsageErrors, argparse.ArgumentParser):
    """The parser of a command: ``argparse.ArgumentParser`` with one-line usage errors."""
