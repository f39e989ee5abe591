"""What the commands share, one module per concern (the library below raises and returns; these turn that into a
command's output and exit code):

- ``errors``: the one error printer (``fail``) and the exit codes of a stopped command;
- ``held_output``: library output held while a command reads its arguments (``hold_library_output``,
  ``arguments_accepted``);
- ``parsers``: the parser every command builds (``CommandParser``: one-line usage errors, no abbreviated flags,
  ``--config``);
- ``trl_parsers``: the same for the commands that parse TRL's dataclasses (``train``, ``dpo``, ``grpo``, ``kto``);
- ``flags``: the flag groups several commands have (loading, ``--trust-remote-code``, ``--dtype``, the projector norm);
- ``output_folders``: no half-written output (``removed_unless_kept``);
- ``progress``: progress bars on terminals only;
- ``help_cache``: the cache of ``COMMAND --help`` texts;
- ``stops``: the line a training command ends with when stopped by Ctrl-C, SIGTERM or a full disk;
- ``trl_script``: the parser and run of ``dpo``, ``grpo`` and ``kto`` (imported by them only: it imports TRL).

The checks of input values (``llava_normaligned.checks``) and the filters of known library notices
(``llava_normaligned.notices``) are the core's: the library raises ``BadInput`` and installs a filter itself.
"""

from __future__ import annotations

from .errors import INTERRUPTED, TERMINATED, fail
from .held_output import arguments_accepted, end_hold, hold_library_output
from .help_cache import HELP_DEPENDS_ON, cached_help, help_cache_dir
from .output_folders import OutputFolder, removed_unless_kept
from .parsers import CommandParser, option
from .progress import PROGRESS_BAR_SWITCHES, progress_bars_on_terminals_only

__all__ = [
    "CommandParser",
    "HELP_DEPENDS_ON",
    "INTERRUPTED",
    "OutputFolder",
    "PROGRESS_BAR_SWITCHES",
    "TERMINATED",
    "arguments_accepted",
    "cached_help",
    "end_hold",
    "fail",
    "help_cache_dir",
    "hold_library_output",
    "option",
    "progress_bars_on_terminals_only",
    "removed_unless_kept",
]
