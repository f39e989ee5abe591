"""``llava-normaligned``: one console script, one subcommand per task.

Each subcommand is a module of ``llava_normaligned.commands`` named as the command, with a ``main(argv) -> int``
(and a ``make_parser()`` for ``--help``); a module is imported only when its subcommand runs, so ``--help`` stays
fast. This module only parses the subcommand and dispatches; what commands share (``fail``, the input checks, the
notice filters, the progress-bar switch, the help cache) lives in ``llava_normaligned.commands.shared``.
"""

from __future__ import annotations

import importlib
import sys

from llava_normaligned.notices import quiet_known_notices

from .commands import COMMANDS, module_name
from .commands.shared import (
    INTERRUPTED,
    cached_help,
    end_hold,
    fail,
    hold_library_output,
    progress_bars_on_terminals_only,
)


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: llava-normaligned <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "Run `llava-normaligned <command> --help` for a command's options."]
    return "\n".join(lines)


HELP_FLAGS = (["-h"], ["--help"])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from importlib.metadata import version

        print(version("llava-normaligned"))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"llava-normaligned: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    quiet_known_notices(rest)
    progress_bars_on_terminals_only()
    if rest in HELP_FLAGS:
        return cached_help(name, lambda args: importlib.import_module(module_name(name)).main(args))
    # what the libraries print while they are imported and the arguments read is shown once the command accepted its
    # arguments, and dropped when it answers bad input with its one line (shared.hold_library_output)
    hold_library_output()
    try:
        result = importlib.import_module(module_name(name)).main(rest)
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (train says itself what it kept)
        return fail(name, "interrupted (Ctrl-C)", code=INTERRUPTED)
    finally:
        end_hold(keep=True)  # a command that never said its arguments were accepted: shown at its end
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
