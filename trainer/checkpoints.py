"""The checkpoints of an output folder, told complete from half-written.

The Trainer writes a checkpoint's files in turn (weights, optimizer, scheduler, RNG states) and ``trainer_state.json``
last, so a checkpoint whose ``trainer_state.json`` reads as JSON was written whole; one without it (a full disk, a
killed process) cannot be resumed from. ``train`` and the TRL-script commands use these when the disk fills during a
save: the incomplete checkpoint goes, the last complete one is named with the ``--resume_from_checkpoint`` to use.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil

# the errors of a write that found no room: the device is full, or the user's quota is
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
# ... as safetensors (Rust's io::Error) words them
_DISK_FULL_TEXT = re.compile(r"\(os error (?:%d|%d)\)" % (errno.ENOSPC, errno.EDQUOT))
# torch's archive writer (torch.save: optimizer.pt, scheduler.pt, rng_state.pth) fails without the errno ("unexpected
# pos", "file write failed"); a failure of it on a file system with less than this left is a full disk
LOW_SPACE_BYTES = 64 * 2**20
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def is_disk_full(error: BaseException, folder: str | None = None) -> bool:
    """Whether ``error`` (or what it was raised from) is a write that found no room: an ``OSError`` with ``ENOSPC`` or
    ``EDQUOT``, safetensors' error naming them, or torch's archive writer failing while the file system of ``folder``
    has less than ``LOW_SPACE_BYTES`` free."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in DISK_FULL:
            return True
        if _DISK_FULL_TEXT.search(str(error)):
            return True
        if folder is not None and isinstance(error, RuntimeError) and "inline_container" in str(error):
            try:
                return shutil.disk_usage(folder).free < LOW_SPACE_BYTES
            except OSError:
                return False
        error = error.__cause__ or error.__context__
    return False


def checkpoints(folder: str) -> list[tuple[int, str]]:
    """``(step, path)`` of every ``checkpoint-N`` folder in ``folder``, by step."""
    if not os.path.isdir(folder):
        return []
    found = [(int(m.group(1)), os.path.join(folder, name)) for name in os.listdir(folder)
             if (m := _CHECKPOINT.match(name)) and os.path.isdir(os.path.join(folder, name))]
    return sorted(found)


def is_complete(checkpoint: str) -> bool:
    """Whether ``checkpoint`` was written whole: its ``trainer_state.json``, written last, reads as JSON."""
    try:
        with open(os.path.join(checkpoint, "trainer_state.json"), encoding="utf-8") as handle:
            json.load(handle)
    except (OSError, ValueError):
        return False
    return True


def last_complete_checkpoint(folder: str) -> str | None:
    """The complete checkpoint of ``folder`` with the highest step; None when there is none."""
    complete = [path for _, path in checkpoints(folder) if is_complete(path)]
    return complete[-1] if complete else None


def remove_incomplete_checkpoints(folder: str) -> list[str]:
    """Remove the checkpoints of ``folder`` written after its last complete one and not whole (what a save that
    failed left); returns their paths. Earlier folders are never touched."""
    last = last_complete_checkpoint(folder)
    last_step = -1 if last is None else int(_CHECKPOINT.match(os.path.basename(last)).group(1))
    removed = []
    for step, path in checkpoints(folder):
        if step > last_step and not is_complete(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


__all__ = ["DISK_FULL", "LOW_SPACE_BYTES", "checkpoints", "is_complete", "is_disk_full", "last_complete_checkpoint",
           "remove_incomplete_checkpoints"]
