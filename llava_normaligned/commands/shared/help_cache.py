"""The cache of ``COMMAND --help`` texts (``train --help`` imports TRL: seconds to a minute), keyed on what the text
is built from."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import sys

import llava_normaligned
from llava_normaligned.atomic_files import write_text_atomic

# what a command's --help text depends on besides this package's own source
HELP_DEPENDS_ON = ("llava-normaligned", "trl", "transformers", "peft", "accelerate", "datasets")


def help_cache_dir() -> str:
    """Where ``COMMAND --help`` texts are kept: ``$LLAVA_NORMALIGNED_CACHE``, else ``$XDG_CACHE_HOME`` or
    ``~/.cache``, under ``llava-normaligned/help``."""
    root = os.environ.get("LLAVA_NORMALIGNED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llava-normaligned")
    return os.path.join(root, "help")


def help_key(name: str) -> str:
    """A digest of what ``name --help`` prints from: the width it is wrapped to, the installed versions of the
    packages whose options it lists and every source file of this package (an edited checkout is a new key)."""
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.blake2b(name.encode(), digest_size=12)
    digest.update(f"columns={shutil.get_terminal_size().columns};".encode())  # argparse wraps the text to this width
    for package in HELP_DEPENDS_ON:
        try:
            digest.update(f"{package}={version(package)};".encode())
        except PackageNotFoundError:
            digest.update(f"{package}=none;".encode())
    # the installed package's files; in a checkout, its trainer/ and hub_cards/ are links to the top-level folders
    root = os.path.dirname(os.path.abspath(llava_normaligned.__file__))
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for file in sorted(f for f in files if f.endswith(".py") or f.endswith(".yaml")):
            path = os.path.join(folder, file)
            stat = os.stat(path)
            digest.update(f"{os.path.relpath(path, root)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def cached_help(name: str, run) -> int:
    """``name --help``: printed from the cache when this package, its sources and the packages it lists options
    of are as they were when it was last built; otherwise built by ``run(["--help"])`` (``train --help`` imports
    TRL and transformers' ``TrainingArguments``: seconds on an idle machine, a minute on a busy one) and kept."""
    path = os.path.join(help_cache_dir(), f"{name}-{help_key(name)}.txt")
    try:
        with open(path, encoding="utf-8") as handle:
            sys.stdout.write(handle.read())
        return 0
    except OSError:
        pass
    captured = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(captured):
        try:
            code = int(run(["--help"]) or 0)
        except SystemExit as done:  # argparse's --help exits
            code = done.code if isinstance(done.code, int) else 0
    text = captured.getvalue()
    sys.stdout.write(text)
    if code == 0 and text:
        try:
            write_text_atomic(path, text, make_folder=True)  # never a half-written help text
        except OSError:
            pass
    return code
