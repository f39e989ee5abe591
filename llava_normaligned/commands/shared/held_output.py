"""What libraries write to stderr while a command reads its arguments: held, then shown once the command accepted
them, or dropped when it answers bad input with its one line."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass

# ------------------------------------------------------------------ library output held while the arguments are read
# Importing a command's libraries can print notices (a library's import-time warning, a new release's deprecation):
# ``cli.main`` holds everything written to stderr (file descriptor 2, so C-level writes and handlers made during the
# imports are held too) from before the command's module is imported until the command has accepted its arguments
# (``arguments_accepted``). On bad input (``fail`` with exit code 2) the held output is dropped, so the answer is the
# one line; otherwise it is written out, in order, before anything else. No file descriptor is swapped for Python's
# ``sys.stderr`` object, so a handler made meanwhile keeps writing to the real stderr afterwards.


@dataclass
class _Held:
    saved_fd: int
    buffer: object  # a temporary file, descriptor 2 while held


_HELD: list[_Held] = []


def _flush_stderr() -> None:
    for stream in (sys.stderr, sys.__stderr__):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


def hold_library_output() -> None:
    """Hold what is written to stderr until ``arguments_accepted`` or ``end_hold`` (``cli.main`` calls it before it
    imports a command). Does nothing when stderr has no file descriptor or is already held."""
    if _HELD:
        return
    _flush_stderr()
    try:
        saved = os.dup(2)
    except OSError:
        return
    buffer = tempfile.TemporaryFile()
    os.dup2(buffer.fileno(), 2)
    _HELD.append(_Held(saved, buffer))


def end_hold(keep: bool = True) -> None:
    """Stop holding stderr; ``keep``: write what was held to it (else drop it). Does nothing when nothing is held."""
    if not _HELD:
        return
    held = _HELD.pop()
    _flush_stderr()
    os.dup2(held.saved_fd, 2)
    os.close(held.saved_fd)
    try:
        if keep:
            held.buffer.seek(0)
            data = held.buffer.read()
            while data:
                data = data[os.write(2, data):]
    finally:
        held.buffer.close()


def arguments_accepted() -> None:
    """A command's arguments passed its checks: what libraries wrote meanwhile is shown, and stderr is no longer
    held. Each command calls it once, before it loads a model."""
    end_hold(keep=True)
