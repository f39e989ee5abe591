"""Atomic file writes: the one home for "write to a temporary name, then move it into place".

A reader (another process, a resumed run, a crash) sees the previous file or the new one, never half of one. The
temporary file lies in the target's own folder (``os.replace`` is atomic only within one file system), has a name
unique to the process and the call (several processes may write the same file at once), and is removed when the
write fails. Standard library only.

Folders built whole and then renamed (the demo's parts, ``make-data``) are another idea and are not here.
"""
from __future__ import annotations

import json
import os

__all__ = ["write_bytes_atomic", "write_json_atomic", "write_text_atomic"]


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, fsync: bool = False,
                       make_folder: bool = False) -> str:
    """Write ``data`` to ``path`` atomically and return ``path`` (as a string).

    ``fsync`` flushes the file to disk before it is moved into place (a record that must survive a power cut);
    ``make_folder`` creates the missing folders above ``path``."""
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
    """Write ``text`` to ``path`` atomically (encoded as ``encoding``, line ends as given) and return ``path``."""
    return write_bytes_atomic(path, text.encode(encoding), fsync=fsync, make_folder=make_folder)


def write_json_atomic(path: str | os.PathLike, data, *, fsync: bool = False, make_folder: bool = False,
                      **json_kwargs) -> str:
    """Write ``data`` as JSON to ``path`` atomically and return ``path``.

    ``json_kwargs`` go to ``json.dumps`` (``indent``, ``ensure_ascii``, ``sort_keys``, ``default``, ...), so the file
    holds exactly what ``json.dump`` with the same arguments writes. Nothing is written when ``data`` cannot be
    serialised: the previous file stays as it was."""
    text = json.dumps(data, **json_kwargs)
    return write_text_atomic(path, text, fsync=fsync, make_folder=make_folder)
