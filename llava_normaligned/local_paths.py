"""How a record names a model, a data set, a file or a folder: the one rule for everything that may be published.

Training summaries, diagnostics, evaluation results, configs and model cards are pushed with a checkpoint, so they
never name a path on the machine that wrote them: a Hub id (`org/name`) is published as given, a local path by its own
name (`/home/me/runs/ckpt/` -> `ckpt`). `public_name` applies the rule to one name, `hide_local_paths` to free text,
`public_record` to a whole record, and `local_paths_in` finds what the rule would hide (the self-check refuses to
publish a record in which it finds anything). Standard library only: the trainer, diagnostics, evaluation and the Hub
tools all import it.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile

# What a path component may hold (no spaces: a path with spaces is cut at the first one, its head still hidden).
_PART = r"[\w.@+~-]+"
# Not a path's start when preceded by these: a word (``and/or``, ``w/o``, a URL's host: ``https://host/a/b``), or
# another path character (the middle of a relative path ``eval/a/b``, ``../a/b``, or of a URL's ``//host``).
_START = r"(?<![\w./\\~@+-])"
_GENERIC = (
    rf"file:/+{_PART}(?:/+{_PART})*",  # file:///home/me/x
    rf"~[/\\]+{_PART}(?:[/\\]+{_PART})*",  # ~/runs/x
    rf"[A-Za-z]:[/\\]+{_PART}(?:[/\\]+{_PART})*",  # C:\runs\x, C:/runs/x
    rf"\\\\{_PART}(?:\\+{_PART})+",  # \\server\share\x
    rf"/{_PART}(?:/+{_PART})+",  # /data/x (one component alone, "/s", is too often prose)
)
# Hub ids: "name" or "namespace/name" (no "..", no leading "." or "~").
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(?:/[A-Za-z0-9][\w.-]*)?")


def is_hub_id(value) -> bool:
    """Tells whether a value reads as a Hub repo id.

    Args:
        value (`Any`):
            The value to test.

    Returns:
        `bool`: `True` for a string of the form `namespace/name` or `name` (letters, digits, `_`, `.`, `-`; starting
        with a letter or digit) that holds no `..`.
    """
    return isinstance(value, str) and bool(_HUB_ID.fullmatch(value)) and ".." not in value


def _own_name(path: str) -> str:
    """The last component of ``path``, whichever separator it uses (``C:\\a\\b\\`` -> ``b``)."""
    parts = [p for p in re.split(r"[/\\]+", path) if p]
    return parts[-1] if parts else path


def _is_written_as_local(text: str) -> bool:
    return (
        text.startswith(("~", "./", "../", ".\\", "..\\", "file:", "\\\\"))
        or os.path.isabs(text)
        or bool(re.match(r"[A-Za-z]:[/\\]", text))
    )


def public_name(value: str | os.PathLike | None) -> str | None:
    """Applies the publishing rule to a value that names one model, data set, file or folder.

    Args:
        value (`str`, `os.PathLike` or `None`):
            The name.

    Returns:
        `str` or `None`: A local path (one that exists here, or is written as absolute, `~/`, `./`, `../`, a Windows
        path or a `file:` URL) by its last component (`/home/me/runs/ckpt/` -> `ckpt`); any other value, e.g. a Hub id,
        as given. `None` and the empty string are returned as they are.
    """
    if value is None:
        return None
    text = os.fspath(value)
    if not text:
        return text
    expanded = os.path.expanduser(text)
    if os.path.exists(expanded):
        return _own_name(os.path.abspath(expanded))
    if _is_written_as_local(text):
        return _own_name(text.removeprefix("file:"))
    return text


def _own_folders() -> tuple[str, ...]:
    """This machine's home and temporary folders (as given and resolved), longest first."""
    found = set()
    for folder in (os.path.expanduser("~"), tempfile.gettempdir()):
        for variant in (folder, os.path.realpath(folder)):
            variant = variant.rstrip("/\\")
            if variant and _own_name(variant) != variant:  # "/" or "" would match every slash
                found.add(variant)
    return tuple(sorted(found, key=len, reverse=True))


@functools.lru_cache(maxsize=8)
def _pattern_for(own_folders: tuple[str, ...]) -> re.Pattern:
    # the folder itself, not another one whose name starts with it ("/tmp" but not "/tmpfs", "/tmp.d"; "/tmp.")
    own = tuple(rf"{re.escape(folder)}(?![\w@+~-]|\.[\w@+~-])(?:[/\\]+{_PART})*" for folder in own_folders)
    return re.compile(_START + "(?:" + "|".join(own + _GENERIC) + r")[/\\]?")


def _pattern() -> re.Pattern:
    return _pattern_for(_own_folders())


def local_paths_in(text: str) -> list[str]:
    """Finds every local path in a text.

    A local path, in text: an absolute POSIX path of two components or more (`/data/run`), a Windows path (`C:\\runs`,
    `\\\\server\\share`), a `~/` path, a `file:` URL, and this machine's home and temporary folders themselves (`/root`,
    `/tmp`). Not one: URLs (`https://host/a/b`), relative paths (`eval/norms.png`), Hub ids, ratios and prose (`1/2`,
    `w/o`, `and/or`).

    Args:
        text (`str`):
            The text to search.

    Returns:
        `list[str]`: The local paths, as written in `text`; empty when there is nothing to hide.
    """
    return [match.group(0) for match in _pattern().finditer(text)]


def hide_local_paths(text: str, paths=()) -> str:
    """Replaces every local path in a text by its own name (`/home/a/run/ckpt` -> `ckpt`).

    What counts as a local path is what `local_paths_in` finds.

    Args:
        text (`str`):
            Free text: an error message, a command line, a Markdown cell.
        paths (`Iterable`, *optional*, defaults to `()`):
            The run's own files and folders (no Hub ids; `None` entries are skipped). Each, as given, expanded and
            resolved, is replaced first by its own name, keeping what follows it, so that a relative path inside one
            stays readable (`/data/bench/pope/3.png` -> `bench/pope/3.png` when `/data/bench` is given).

    Returns:
        `str`: The text with the paths replaced.
    """
    variants = set()
    for path in filter(None, paths):
        path = os.fspath(path)
        expanded = os.path.expanduser(path)
        variants |= {path, expanded, os.path.abspath(expanded), os.path.realpath(expanded)}
    for variant in sorted(variants, key=len, reverse=True):
        trimmed = variant.rstrip("/\\")
        if re.search(r"[/\\]", trimmed) and public_name(trimmed) != trimmed:  # a bare name has nothing to hide
            text = text.replace(trimmed, public_name(trimmed))
    return _pattern().sub(lambda match: _own_name(match.group(0).removeprefix("file:")), text)


def public_record(data):
    """Hides the local paths in every string of a record about to be written.

    Args:
        data (`Any`):
            Dicts, lists, tuples, strings, path objects and other values, nested.

    Returns:
        `Any`: The same structure with every string, keys included, passed through `hide_local_paths` and every path
        object through `public_name`; tuples become lists, and other values are returned as they are.
    """
    if isinstance(data, str):
        return hide_local_paths(data)
    if isinstance(data, os.PathLike):
        return public_name(data)
    if isinstance(data, dict):
        return {public_record(key) if isinstance(key, str) else key: public_record(value)
                for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [public_record(value) for value in data]
    return data


__all__ = ["hide_local_paths", "is_hub_id", "local_paths_in", "public_name", "public_record"]
