"""Progress bars on terminals only: a log file or a pipe gets plain lines."""

from __future__ import annotations

import importlib
import os
import sys

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
    user_set = {name for name in PROGRESS_BAR_SWITCHES if name in os.environ}
    for name in PROGRESS_BAR_SWITCHES:
        os.environ.setdefault(name, "1")
    # a library imported already read its switch: turned off through its own public function
    for name, module, holder, function in _ALREADY_IMPORTED:
        if name not in user_set and module in sys.modules:
            getattr(importlib.import_module(holder), function)()
    return False


# (the environment switch, the library, the module of its switch-off function, the function) of each library that
# reads its switch when it is imported
_ALREADY_IMPORTED = (
    ("HF_DATASETS_DISABLE_PROGRESS_BARS", "datasets", "datasets", "disable_progress_bars"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "huggingface_hub", "huggingface_hub.utils", "disable_progress_bars"),
    ("HF_HUB_DISABLE_PROGRESS_BARS", "transformers", "transformers.utils.logging", "disable_progress_bar"),
)
