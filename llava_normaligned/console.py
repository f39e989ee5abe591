"""The console's shared pieces, for every command and the library code behind them: the one error printer
(``fail``), the checks of a command's input (``BadInput``, ``NumberRule``, ``check_*``), the filters of known library
notices, the progress-bar switch, Ctrl-C's exit code and the clean-up of a stopped run's output
(``removed_unless_kept``), and the cache of ``COMMAND --help`` texts. ``cli.py`` only parses the subcommand and
dispatches.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import logging
import math
import os
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass

from .io import write_text_atomic


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


class OneLineUsageErrors:
    """For an ``argparse`` parser (put it before the parser class in the bases): argparse's own usage errors (an
    unknown flag, a value that is not a number, a missing argument) are one line, ``PROG: error: MESSAGE`` and the
    hint to ``--help``, exit code 2, as every other bad input (``fail``); the usage block is left to ``--help``."""

    def error(self, message: str):
        end_hold(keep=False)
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


class CommandParser(OneLineUsageErrors, argparse.ArgumentParser):
    """The parser of a command: ``argparse.ArgumentParser`` with one-line usage errors."""


# ------------------------------------------------------------------------------------- checks of a command's input
# Every command checks its arguments with these before it loads a model: a bad one is a ``BadInput`` naming the flag
# and the way out, which the command reports with ``fail`` (one line, exit code 2).

INTERRUPTED = 130  # the exit code of a command stopped by Ctrl-C (128 + SIGINT), as shells report it
TERMINATED = 143  # the exit code of a command stopped by SIGTERM (128 + SIGTERM), as shells report it


class BadInput(ValueError):
    """A command's argument that cannot work (a number out of range, a path that is not there or not usable)."""


@dataclass(frozen=True)
class NumberRule:
    """The values a numeric option takes: ``low``/``high`` bounds (``*_open``: the bound itself is excluded),
    ``special`` values allowed besides (value -> what it means, e.g. ``{-1: "train --num_train_epochs"}``),
    ``steps``: a fraction in (0, 1) of the run or a whole number of steps (transformers' ``*_steps`` fields),
    ``optional``: None is allowed (the option is off)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    special: tuple[tuple[float, str], ...] = ()
    steps: bool = False
    optional: bool = True

    def allows(self, value) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if any(value == allowed for allowed, _ in self.special):
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.high_open else value > self.high):
            return False
        return not (self.steps and value >= 1 and value != int(value))

    def describe(self) -> str:
        def number(value: float) -> str:
            return str(int(value)) if float(value).is_integer() else f"{value:g}"

        if self.steps:
            least = 1 if self.low_open else 0
            text = f"a whole number of steps (at least {least}) or a fraction in (0, 1) of the run's steps"
        elif self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"in {left}{number(self.low)}, {number(self.high)}{right}"
        elif self.low is not None:
            text = f"{'above' if self.low_open else 'at least'} {number(self.low)}"
        elif self.high is not None:
            text = f"{'below' if self.high_open else 'at most'} {number(self.high)}"
        else:
            text = "a finite number"
        specials = ", ".join(f"{number(value)} ({meaning})" for value, meaning in self.special)
        return f"{specials} or {text}" if specials else text


POSITIVE_COUNT = NumberRule(low=1)  # batch sizes, sample counts, token counts, steps
NON_NEGATIVE = NumberRule(low=0)  # learning rates, weight decay, worker counts
POSITIVE = NumberRule(low=0, low_open=True)  # epochs, clamps, scales
FRACTION = NumberRule(low=0, high=1, high_open=True)  # dropout, smoothing, Adam's betas
SEED = NumberRule(low=0, high=2**32 - 1)  # what numpy's generator takes (torch's and Python's take more)


def check_number(flag: str, value, rule: NumberRule, error: type[Exception] = BadInput) -> None:
    """Raise ``error`` ("``FLAG`` must be RULE, got VALUE") when ``value`` is outside ``rule``; ``error``: a
    command's own bad-input exception where it has one."""
    if not rule.allows(value):
        raise error(f"{flag} must be {rule.describe()}, got {value!r}")


def option_flag(name: str) -> str:
    """An argparse destination's flag: ``max_new_tokens`` -> ``--max-new-tokens``."""
    return "--" + name.replace("_", "-")


def check_numbers(values, rules: dict[str, NumberRule], flag=option_flag, error: type[Exception] = BadInput) -> None:
    """``check_number`` for every ``name: rule`` whose name is in ``values`` (a dict, a dataclass or an argparse
    namespace); ``flag(name)`` spells the option in the message."""
    values = values if isinstance(values, dict) else vars(values)
    for name, rule in rules.items():
        if name in values:
            check_number(flag(name), values[name], rule, error)


def _check_input(flag: str, path: str, folder: bool) -> None:
    """``path`` (given by ``flag``) must be there and be a folder (``folder``) or a file."""
    full = os.path.expanduser(path)
    want, other = ("folder", "file") if folder else ("file", "folder")
    if os.path.isdir(full) if not folder else os.path.isfile(full):
        raise BadInput(f"{flag} {path}: a {other}, not a {want}; give the {want}")
    if not (os.path.isdir(full) if folder else os.path.isfile(full)):
        raise BadInput(f"{flag} {path}: no such {want} ({os.path.abspath(full)})")


def check_input_file(flag: str, path: str) -> None:
    """An input file given by ``flag`` must be there and be a file."""
    _check_input(flag, path, folder=False)


def check_input_folder(flag: str, path: str) -> None:
    """An input folder given by ``flag`` must be there and be a folder."""
    _check_input(flag, path, folder=True)


def _check_creatable(flag: str, path: str) -> None:
    """The nearest existing folder above ``path`` must be a folder this process can write in."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise BadInput(f"{flag} {path}: cannot be created, {parent} is a file; give a path under a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"{flag} {path}: cannot be created, {parent} is not writable; give a folder you can write to")


def check_output_folder(flag: str, path: str, *, empty: bool = False) -> None:
    """An output folder given by ``flag``: not a file, and creatable (or a folder this process can write in);
    ``empty``: an existing one must hold nothing (the command would overwrite what is there)."""
    full = os.path.expanduser(path)
    if os.path.exists(full) and not os.path.isdir(full):
        raise BadInput(f"{flag} {path}: a file, not a folder; give a {'new or empty ' if empty else ''}folder")
    if os.path.isdir(full):
        if empty and os.listdir(full):
            raise BadInput(f"{flag} {path}: the folder is not empty; give a new or empty folder")
        if not os.access(full, os.W_OK | os.X_OK):
            raise BadInput(f"{flag} {path}: the folder is not writable; give a folder you can write to")
        return
    _check_creatable(flag, full)


def check_output_file(flag: str, path: str) -> None:
    """An output file given by ``flag``: not a folder, and creatable (its folder may not exist yet)."""
    full = os.path.expanduser(path)
    if os.path.isdir(full):
        raise BadInput(f"{flag} {path}: a folder, not a file; give a file path")
    if not os.path.exists(full):
        _check_creatable(flag, full)


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


class _DropMessage(logging.Filter):
    """Drop the records whose message starts with ``start``; keep every other."""

    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


# (logger, start of the message) of each library notice that no command's user asked for, dropped by
# ``quiet_known_notices``. A filter on the exact logger and message: every other record of that logger still shows.
KNOWN_NOTICES = (
    # bitsandbytes, at import on a CPU with AVX512-BF16: it tries the Hub's optional ``kernels`` package for a CPU
    # 4-bit kernel and, failing (not installed, or offline), says "... pip install kernels"; it then uses its own
    # kernel, which is what this package tests with.
    ("bitsandbytes.backends.cpu.ops", "Failed to load CPU gemm_4bit_forward"),
    # kernels (0.19 and later, which transformers 5.25 requires), in the same attempt with HF_HUB_OFFLINE set: it
    # cannot check the Hub kernel's publisher offline and says so; the kernel is then not found, and bitsandbytes
    # uses its own
    ("kernels._internals.hf_hub", "Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes'"),
    # transformers, when compose adds the image token to the LM's vocabulary: compose asks for this initialisation
    # itself (``resize_token_embeddings(..., mean_resizing=True)``) and the notice says how to turn it off. Image
    # features replace the image token's input row, T leaves that row out, and this package's decoding never emits it
    # (``generation.placeholder_token_ids``).
    ("transformers.modeling_utils", "The new embeddings will be initialized from a multivariate normal"),
    ("transformers.modeling_utils", "The new lm_head weights will be initialized from a multivariate normal"),
)
# DeepSpeed, when anything imports it (accelerate does, on every ``save_pretrained``, once it is installed): with no
# GPU found it logs "Setting accelerator to CPU ..." to stdout. Kept when the command trains with DeepSpeed (the
# notice is then about the user's own engine): ``accelerate launch`` with a DeepSpeed config, or ``deepspeed`` named
# in the arguments or in a ``--config`` file they name.
DEEPSPEED_CPU_NOTICE = ("DeepSpeed", "Setting accelerator to CPU")
_FILTERS: dict[tuple[str, str], _DropMessage] = {}


def _drop(logger_name: str, start: str) -> None:
    found = _FILTERS.setdefault((logger_name, start), _DropMessage(start))
    logger = logging.getLogger(logger_name)  # the library's own logger, made now if it is not imported yet
    if found not in logger.filters:
        logger.addFilter(found)


def quiet_known_notices(argv: list[str] | None = None) -> None:
    """Silence the notices a command's user did not cause, each by its exact source and message (``KNOWN_NOTICES``,
    ``DEEPSPEED_CPU_NOTICE``), in this process; the demo's worker processes call it too (a spawned process starts
    without them). With ``argv`` (a command's arguments):

    * DeepSpeed's "Setting accelerator to CPU" is kept when ``argv`` or the environment trains with DeepSpeed;
    * TRL's ``SFTConfig`` defaults ``gradient_checkpointing=True`` and transformers 5 warns that the name is
      deprecated (``activation_checkpointing``) for that default. Kept when ``argv`` (or a config file it names) sets
      the option itself: then the warning is about the user's own flag.
    """
    for logger_name, start in KNOWN_NOTICES:
        _drop(logger_name, start)
    uses_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() in ("1", "true", "yes") or (
        argv is not None and _mentions(argv, "deepspeed"))
    if not uses_deepspeed:
        _drop(*DEEPSPEED_CPU_NOTICE)
    if argv is not None and not _mentions(argv, "gradient_checkpointing"):
        warnings.filterwarnings(
            "ignore", message=r"`gradient_checkpointing(_kwargs)?` is deprecated", category=FutureWarning
        )


def _mentions(argv: list[str], word: str) -> bool:
    """Whether ``word`` is in ``argv`` or in a ``--config`` file it names."""
    for i, arg in enumerate(argv):
        if word in arg:
            return True
        if arg == "--config" and i + 1 < len(argv) or arg.startswith("--config="):
            path = arg.split("=", 1)[1] if "=" in arg else argv[i + 1]
            try:
                with open(path, encoding="utf-8") as handle:
                    if word in handle.read():
                        return True
            except OSError:
                pass
    return False


# Each library's progress-bar switch: tqdm's own default for every bar that does not set ``disable`` (the Trainer's),
# huggingface_hub's and transformers' (read when they are imported), datasets'.
PROGRESS_BAR_SWITCHES = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bars_on_terminals_only(stream=None) -> bool:
    """Progress bars redraw one line with carriage returns: on a terminal that is a moving bar, in a log file or a
    pipe it is every redraw, kept. When ``stream`` (default stderr, where the bars go) is not a terminal, every
    library's bars are turned off through ``PROGRESS_BAR_SWITCHES``, environment variables, so that worker
    processes and launched ranks inherit them (call it before transformers, datasets and huggingface_hub are
    imported); a value the user set is kept. The log then holds the commands' own plain lines. Returns whether bars
    are drawn."""
    if _is_terminal(sys.stderr if stream is None else stream):
        return True
    for name in PROGRESS_BAR_SWITCHES:
        os.environ.setdefault(name, "1")
    return False


# what a command's --help text depends on besides this package's own source
HELP_DEPENDS_ON = ("llava-normaligned", "trl", "transformers", "peft", "accelerate", "datasets")


def help_cache_dir() -> str:
    """Where ``COMMAND --help`` texts are kept: ``$LLAVA_NORMALIGNED_CACHE``, else ``$XDG_CACHE_HOME`` or
    ``~/.cache``, under ``llava-normaligned/help``."""
    root = os.environ.get("LLAVA_NORMALIGNED_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "llava-normaligned")
    return os.path.join(root, "help")


def _help_key(name: str) -> str:
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
    package_dir = os.path.dirname(os.path.abspath(__file__))
    roots = [package_dir] + [os.path.join(os.path.dirname(package_dir), d) for d in ("trainer", "hub_cards")]
    for root in roots:
        for folder, dirs, files in os.walk(root):
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
    path = os.path.join(help_cache_dir(), f"{name}-{_help_key(name)}.txt")
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
