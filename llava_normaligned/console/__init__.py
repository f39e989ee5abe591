"""What every command shares, one module per concern:

- ``errors``: the one error printer (``fail``), ``BadInput``, the exit codes of a stopped command;
- ``held_output``: library output held while a command reads its arguments (``hold_library_output``, ``arguments_accepted``);
- ``parsers``: the parser every command builds (``CommandParser``: one-line usage errors, no abbreviated flags);
- ``checks``: the checks of a command's input (``NumberRule``, ``check_number(s)``, ``check_input_*``, ``check_output_*``);
- ``output_folders``: no half-written output (``removed_unless_kept``);
- ``notices``: the filters of known library notices (``quiet_known_notices``);
- ``progress``: progress bars on terminals only;
- ``help_cache``: the cache of ``COMMAND --help`` texts.

``cli.py`` only parses the subcommand and dispatches. The names below are the ones commands import.
"""

from __future__ import annotations

from .checks import (
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_COUNT,
    SEED,
    NumberRule,
    check_input_file,
    check_input_folder,
    check_number,
    check_numbers,
    check_output_file,
    check_output_folder,
    option_flag,
)
from .errors import INTERRUPTED, TERMINATED, BadInput, fail
from .held_output import arguments_accepted, end_hold, hold_library_output
from .help_cache import HELP_DEPENDS_ON, cached_help, help_cache_dir
from .notices import (
    DEEPSPEED_CPU_NOTICE,
    GRADIENT_CHECKPOINTING_WARNING,
    KNOWN_NOTICES,
    keep_notices_of,
    quiet_known_notices,
)
from .output_folders import OutputFolder, removed_unless_kept
from .parsers import CommandParser, OneLineUsageErrors
from .progress import PROGRESS_BAR_SWITCHES, progress_bars_on_terminals_only

__all__ = [
    "BadInput",
    "CommandParser",
    "DEEPSPEED_CPU_NOTICE",
    "FRACTION",
    "GRADIENT_CHECKPOINTING_WARNING",
    "HELP_DEPENDS_ON",
    "INTERRUPTED",
    "KNOWN_NOTICES",
    "NON_NEGATIVE",
    "NumberRule",
    "OneLineUsageErrors",
    "OutputFolder",
    "POSITIVE",
    "POSITIVE_COUNT",
    "PROGRESS_BAR_SWITCHES",
    "SEED",
    "TERMINATED",
    "arguments_accepted",
    "cached_help",
    "check_input_file",
    "check_input_folder",
    "check_number",
    "check_numbers",
    "check_output_file",
    "check_output_folder",
    "end_hold",
    "fail",
    "help_cache_dir",
    "hold_library_output",
    "option_flag",
    "progress_bars_on_terminals_only",
    "keep_notices_of",
    "quiet_known_notices",
    "removed_unless_kept",
]
