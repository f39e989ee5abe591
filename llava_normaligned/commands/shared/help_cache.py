"""The cache of ``COMMAND --help`` texts (``train --help`` imports TRL: seconds to a minute), keyed on what the text
is built from."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys

from llava_normaligned.atomic_files import write_text_atomic

# what a command's --help text depends on besides this package's own source
HELP_DEPENDS_ON = ("llava-normaligned", "trl", "transformers", "peft", "accelerate", "datasets")


def help_cache_dir() -> str:
    """Where ``COMMAND --help`` texts are kept: ``$LLAVA_NORMALIGNED_CACHE``, else ``$XDG_CACHE_HOME`` or
    ``~/.cache``, under ``llava-normaligned/help``."""
    root = os.environ.get("LLAVA_NORMALIGNED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llava-normaligned")
    return os.path.join(root, "help")


OWN_PACKAGES = ("llava_normaligned", "modeling_llava_normaligned")


def help_key(name: str) -> str:
    """A digest of what ``name --help`` is wrapped to and lists options of: the name, where this package is (two
    checkouts or environments share the cache), the terminal's width and the installed versions of the packages
    whose options it lists. The sources it is built from are checked apart (``source_digest``)."""
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.blake2b(name.encode(), digest_size=12)
    digest.update(f"package={os.path.abspath(sys.modules[OWN_PACKAGES[0]].__file__)};".encode())
    digest.update(f"columns={shutil.get_terminal_size().columns};".encode())  # argparse wraps the text to this width
    for package in HELP_DEPENDS_ON:
        try:
            digest.update(f"{package}={version(package)};".encode())
        except PackageNotFoundError:
            digest.update(f"{package}=none;".encode())
    return digest.hexdigest()


def source_folders() -> list[str]:
    """The folders of this package's modules imported so far, outermost only. In a wheel that is the installed
    package's folder; in an editable checkout also ``trainer/`` and ``hub_cards/``, which pyproject.toml maps to
    ``llava_normaligned.trainer`` and ``llava_normaligned.hub_cards``."""
    folders = set()
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] in OWN_PACKAGES:
            folders.update(os.path.abspath(f) for f in getattr(module, "__path__", None) or ())
    return sorted(f for f in folders if not any(f.startswith(other + os.sep) for other in folders))


def source_digest(folders: list[str]) -> str:
    """A digest of the size and time of every ``.py`` and ``.yaml`` file in ``folders`` (the recipes a help text
    lists are ``.yaml``): an edited checkout is a new digest."""
    digest = hashlib.blake2b(digest_size=12)
    for root in folders:
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for file in sorted(f for f in files if f.endswith((".py", ".yaml"))):
                path = os.path.join(folder, file)
                try:
                    stat = os.stat(path)
                except OSError:
                    continue
                digest.update(f"{path}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def cached_help(name: str, run) -> int:
    """``name --help``: printed from the cache when the packages it lists options of and the sources it was built
    from are as they were when it was last built; otherwise built by ``run(["--help"])`` (``train --help`` imports
    TRL and transformers' ``TrainingArguments``: seconds on an idle machine, a minute on a busy one) and kept, with
    the folders of the sources that building it imported."""
    path = os.path.join(help_cache_dir(), f"{name}-{help_key(name)}.json")
    try:
        with open(path, encoding="utf-8") as handle:
            kept = json.load(handle)
        if source_digest(kept["folders"]) == kept["sources"]:
            sys.stdout.write(kept["text"])
            return 0
    except (OSError, ValueError, KeyError, TypeError):
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
        folders = source_folders()
        kept = {"folders": folders, "sources": source_digest(folders), "text": text}
        try:
            write_text_atomic(path, json.dumps(kept), make_folder=True)  # never a half-written help text
        except OSError:
            pass
    return code


