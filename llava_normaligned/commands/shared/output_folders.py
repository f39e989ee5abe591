"""A stopped run leaves no half-written output: ``removed_unless_kept`` takes away what it wrote."""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass


@dataclass
class OutputFolder:
    """What ``removed_unless_kept`` found and did: ``before`` (the names the folder held when the run started; None:
    there was no folder), ``removed`` (what the run had written was taken away)."""

    path: str
    before: frozenset | None = None
    removed: bool = False

    def describe(self) -> str:
        """What was left of the folder, for the line reporting a stopped run."""
        if self.removed:
            return f"removed {self.path}, which this run had created" if self.before is None else \
                f"removed what this run had written in {self.path}"
        if not os.path.isdir(self.path):
            return "nothing was written"
        return f"{self.path} is kept as it is"


@contextlib.contextmanager
def removed_unless_kept(path: str, keep=lambda folder: False):
    """Run the ``with`` body; when it raises (an error, or ``KeyboardInterrupt`` from Ctrl-C) and ``keep(path)``
    finds nothing worth keeping in ``path`` (a saved model, a checkpoint), take away what the body wrote there: the
    folder itself if the body created it, else the entries it added. What was there before is never touched. Then
    raise again. Yields an ``OutputFolder``."""
    state = OutputFolder(path, before=frozenset(os.listdir(path)) if os.path.isdir(path) else None)
    try:
        yield state
    except BaseException:
        if os.path.isdir(path) and not keep(path):
            if state.before is None:
                shutil.rmtree(path, ignore_errors=True)
                state.removed = True
            else:
                for name in set(os.listdir(path)) - state.before:
                    entry = os.path.join(path, name)
                    if os.path.isdir(entry) and not os.path.islink(entry):
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        os.remove(entry)
                    state.removed = True
        raise
