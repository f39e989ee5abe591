"""How a training command reports a run that stopped before it finished (Ctrl-C, SIGTERM, a full disk): what was
kept and the ``--resume_from_checkpoint`` to continue with. Shared by ``train`` and the TRL scripts (``dpo``,
``grpo``, ``kto``); it imports nothing heavy, so their ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import os

from llava_normaligned.trainer.checkpoints import is_disk_full, last_complete_checkpoint, remove_incomplete_checkpoints


def stopped_message(output, how: str, checkpoint: str | None = None) -> str:
    """The line reporting a run stopped by Ctrl-C or SIGTERM (``how``): what was kept, and how to continue (from
    ``checkpoint``, the one the stop saved, else the folder's last complete one: a save that Ctrl-C cut short is
    never named)."""
    last = checkpoint if checkpoint is not None and os.path.isdir(checkpoint) else last_complete_checkpoint(output.path)
    if last is not None:
        return f"{how}; {output.path} is kept: continue with --resume_from_checkpoint {last}"
    return f"{how} before the first checkpoint; {output.describe()}"


class DiskFull(Exception):
    """A write of the run found no room (``checkpoints.is_disk_full``); ``removed``: the incomplete checkpoints that
    were taken away (what the failed save left)."""

    def __init__(self, error: BaseException, removed: list[str]):
        super().__init__(str(error))
        self.error, self.removed = error, removed

    @classmethod
    @contextlib.contextmanager
    def caught(cls, output_dir: str, main_process: bool):
        """Within the context, a full disk becomes ``DiskFull``, the failed save's incomplete checkpoints removed
        (by the main process) so that only whole ones are left."""
        try:
            yield
        except Exception as error:
            if not is_disk_full(error, output_dir):
                raise
            raise cls(error, remove_incomplete_checkpoints(output_dir) if main_process else []) from error


def disk_full_message(output, full: DiskFull) -> str:
    """The line reporting a run whose disk filled: where, what was removed, and how to continue (from the last
    complete checkpoint, once there is room)."""
    error = full.error
    if isinstance(error, OSError) and error.strerror:
        line = f"no room left on the disk writing {error.filename or output.path} ({error.strerror})"
    else:  # torch's or safetensors' own error, without the file's name
        line = f"no room left on the disk writing into {output.path} ({str(error).splitlines()[0][:200]})"
    if full.removed:
        line += f"; removed the incomplete {', '.join(full.removed)}"
    last = last_complete_checkpoint(output.path)
    if last is not None:
        return f"{line}; {output.path} is kept: free some space, then continue with --resume_from_checkpoint {last}"
    return f"{line}, before the first complete checkpoint; {output.describe()}; free some space and run again"


__all__ = ["DiskFull", "disk_full_message", "stopped_message"]
