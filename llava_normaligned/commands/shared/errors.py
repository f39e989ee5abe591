"""The one error printer, ``fail``: a command's error in one line and its exit code; the exit codes of a stopped
command."""

from __future__ import annotations

import sys

from .held_output import end_hold

INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C (128 + SIGINT), as shells report it
TERMINATED = 143  # the exit code of a command stopped by SIGTERM (128 + SIGTERM), as shells report it


def fail(command: str, error, code: int = 2, details: bool = False) -> int:
    """Report a command's error in one line on stderr, ``llava-normaligned COMMAND: error: MESSAGE`` (the message's
    first line: the way out belongs there), and return ``code`` (2: bad input, as argparse's own usage errors; 130:
    stopped by Ctrl-C). ``details``: the message's further lines follow as they are (the rows or settings at fault
    that a data or resume check lists)."""
    message = str(error).strip() or type(error).__name__
    first, *rest = message.splitlines()
    end_hold(keep=code != 2)  # bad input: what libraries said while the arguments were read is not shown
    print(f"llava-normaligned {command}: error: {first}", file=sys.stderr)
    if details and rest:
        print("\n".join(rest), file=sys.stderr)
    return code
