"""Checks of input values: numbers (``NumberRule``, ``check_number(s)``) and paths (``check_input_*``,
``check_output_*``), each raising a ``BadInput`` (a ``ValueError``) that names the option; the commands turn it into
their one-line error."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass


class BadInput(ValueError):
    """An input value that cannot work (a number out of range, a path that is not there or not usable); its message
    names the option and the way out."""


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


__all__ = [
    "FRACTION",
    "NON_NEGATIVE",
    "POSITIVE",
    "POSITIVE_COUNT",
    "SEED",
    "BadInput",
    "NumberRule",
    "check_input_file",
    "check_input_folder",
    "check_number",
    "check_numbers",
    "check_output_file",
    "check_output_folder",
    "option_flag",
]
