"""The parser every command builds: ``argparse`` with one-line usage errors and no abbreviated flags."""

from __future__ import annotations

import argparse
import sys

from llava_normaligned.compat import parser_actions

from .config_files import pop_config_flags, read_config_files
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
    """The parser of a command: ``argparse.ArgumentParser`` with one-line usage errors, no abbreviated flags, and
    ``--config FILE.yaml`` read as ``train``'s and TRL's commands read theirs (``config_files``: repeatable, later
    files win): a YAML mapping of the command's options (a key is the flag without its dashes, ``-`` or ``_`` alike:
    ``max-new-tokens`` or ``max_new_tokens``), read as the defaults, which the command line overrides. A key that is
    no option of the command, or a positional argument, is a usage error naming the file."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument("--config", metavar="FILE.yaml", default=None,
                          help="a YAML file of this command's options (flag names without the dashes) read before "
                          "the command line, which overrides it; repeatable, later files win (default: none)")

    def parse_known_args(self, args=None, namespace=None):
        argv = list(sys.argv[1:] if args is None else args)
        try:
            argv, paths = pop_config_flags(argv)
        except ValueError as error:
            self.error(str(error))
        for path in paths:  # in order: a later file's value wins
            self._use_config(path)
        return super().parse_known_args(argv, namespace)

    def _use_config(self, path: str) -> None:
        try:
            values, _ = read_config_files([path])
        except ValueError as error:
            self.error(str(error))
        options = {}
        for action in parser_actions(self):
            if action.option_strings and action.dest not in ("help", "config"):
                for name in (action.dest, *(o.lstrip("-") for o in action.option_strings)):
                    options.setdefault(name.replace("-", "_"), action)
        for key, value in values.items():
            action = options.get(str(key).replace("-", "_"))
            if action is None:
                self.error(f"--config {path}: {key!r} is no option of {self.prog}")
            if action.nargs == 0:  # a switch: true is the flag given; false its opposite (or not given)
                if not isinstance(value, bool):
                    self.error(f"--config {path}: {key}: true or false is expected, not {value!r}")
                if value:
                    action.default = action.const
                elif isinstance(action.const, bool):
                    action.default = not action.const
                continue
            if isinstance(value, str) and action.type is not None:
                try:
                    value = action.type(value)
                except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
                    self.error(f"--config {path}: {key}: {error}")
            if action.choices is not None and value not in action.choices:
                self.error(f"--config {path}: {key}: {value!r} is not one of {', '.join(map(str, action.choices))}")
            action.default, action.required = value, False
