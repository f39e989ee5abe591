"""Atomic file writes: the one home for "write to a temporary name, then move it into place".

A reader (another process, a resumed run, a crash) sees the previous file or the new one, never half of one. The
temporary file lies in the target's own folder (`os.replace` is atomic only within one file system), has a name unique
to the process and the call, and is removed when the write fails. Standard library only. Folders built whole and then
renamed (the demo's parts, `make-data`) are another idea and are not here.
"""
from __future__ import annotations

import json
import os

__all__ = ["write_bytes_atomic", "write_json_atomic", "write_text_atomic"]


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, fsync: bool = False,
                       make_folder: bool = False) -> str:
    """Writes bytes to a file atomically.

    Args:
        path (`str` or `os.PathLike`):
            The file to write; replaced if it exists.
        data (`bytes`):
            The content.
        fsync (`bool`, *optional*, defaults to `False`):
            Whether to flush the file to disk before it is moved into place (a record that must survive a power cut).
        make_folder (`bool`, *optional*, defaults to `False`):
            Whether to create the missing folders above `path`.

    Returns:
        `str`: `path`, as a string.

    Raises:
        `OSError`: If the file cannot be written (e.g. its folder is missing and `make_folder` is off); the temporary
        file is removed and the previous file stays as it was.
    """
    path = os.fspath(path)
    folder, name = os.path.split(os.path.abspath(path))
    if make_folder:
        os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # the same permissions a plain open(path, "w") gives; O_EXCL: never another writer's temporary file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    return path


def write_text_atomic(path: str | os.PathLike, text: str, *, encoding: str = "utf-8", fsync: bool = False,
                      make_folder: bool = False) -> str:
    """Writes text to a file atomically, line ends as given.

    Args:
        path (`str` or `os.PathLike`):
            The file to write.
        text (`str`):
            The content.
        encoding (`str`, *optional*, defaults to `"utf-8"`):
            The encoding of the file.
        fsync (`bool`, *optional*, defaults to `False`):
            As in `write_bytes_atomic`.
        make_folder (`bool`, *optional*, defaults to `False`):
            As in `write_bytes_atomic`.

    Returns:
        `str`: `path`, as a string.
    """
    return write_bytes_atomic(path, text.encode(encoding), fsync=fsync, make_folder=make_folder)


def write_json_atomic(path: str | os.PathLike, data, *, fsync: bool = False, make_folder: bool = False,
                      **json_kwargs) -> str:
    """Writes data as JSON to a file atomically.

    The file holds exactly what `json.dump` with the same arguments writes.

    Args:
        path (`str` or `os.PathLike`):
            The file to write.
        data (`Any`):
            The data to serialise.
        fsync (`bool`, *optional*, defaults to `False`):
            As in `write_bytes_atomic`.
        make_folder (`bool`, *optional*, defaults to `False`):
            As in `write_bytes_atomic`.
        **json_kwargs:
            Passed to `json.dumps` (`indent`, `ensure_ascii`, `sort_keys`, `default`, ...).

    Returns:
        `str`: `path`, as a string.

    Raises:
        `TypeError` or `ValueError`: If `data` cannot be serialised; nothing is written and the previous file stays as
        it was.
    """
    text = json.dumps(data, **json_kwargs)
    return write_text_atomic(path, text, fsync=fsync, make_folder=make_folder)
