"""What the data loaders share: the error (``DataError``), the report of what was read (``DataReport``), the
policies' names and sizes, the input paths and the cache folder."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field

logger = logging.getLogger(__name__)

# LLaVA's role names -> chat roles.
LLAVA_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
CHAT_ROLES = ("system", "user", "assistant")
BAD_IMAGE_POLICIES = ("error", "skip")
BAD_ROW_POLICIES = ("error", "skip")
IMAGE_CHECKS = ("auto", "open", "exists", "none")
MAX_LISTED = 10  # problems quoted in an error message
CHUNK_ROWS = 65_536  # rows converted to Arrow at a time
LOADED_FORMAT = "loaded-v2"  # changes whenever the parsed columns would change for the same inputs (v2: absolute image paths)
PROGRESS_SECONDS = 5.0  # phases longer than this log their count and rate


class DataError(ValueError):
    """A training row that cannot be used, named by its file, index and id.

    ``policy``: the keyword whose ``'skip'`` drops such rows (``"on_bad_row"``, ``"on_bad_image"``), or ``None``. The
    message names that keyword; ``as_flags()`` names the command-line flag of the same name instead."""

    def __init__(self, problem: str, policy: str | None = None, *, way_out: str | None = None):
        self.problem, self.policy = problem, policy
        if policy is not None and way_out is None:
            way_out = f"pass {policy}='skip' to drop such rows"
        # a one-line problem keeps its way out on its line; a listing of rows ends with it
        joint = "\n" if "\n" in problem else " "
        super().__init__(problem if way_out is None else f"{problem}{joint}({way_out})")

    def as_flags(self) -> DataError:
        """The same error as a command reports it: the flag (``--on-bad-row skip``) instead of the keyword."""
        if self.policy is None:
            return self
        return DataError(self.problem, self.policy,
                         way_out=f"pass --{self.policy.replace('_', '-')} skip to drop such rows")


class _RowProblem(Exception):
    """What is wrong with a row; the caller names the row (names are built only for rows that fail)."""


@dataclass
class DataReport:
    """What loading did to the rows: read, kept, and dropped (with the first few examples of each)."""

    sources: list[str] = field(default_factory=list)
    rows_read: int = 0
    rows_kept: int = 0
    text_only_rows: int = 0
    leading_assistant_turns_dropped: int = 0
    bad_rows_skipped: int = 0
    bad_images_skipped: int = 0
    images_checked_here: int = 0  # images this process checked (0 on the other processes of a multi-process run)
    image_check: str = ""  # what the image check did ("open", "exists", "exists+sample", "none")
    cache_file: str | None = None  # the parsed rows' cache (None: not cached)
    read_from_cache: bool = False
    seconds: dict = field(default_factory=dict)  # time per phase
    examples: list[str] = field(default_factory=list)

    def note(self, message: str) -> None:
        if len(self.examples) < MAX_LISTED:
            self.examples.append(message)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        parts = [f"{self.rows_kept}/{self.rows_read} rows kept ({self.text_only_rows} text-only)"]
        if self.bad_rows_skipped:
            parts.append(f"{self.bad_rows_skipped} malformed rows skipped")
        if self.bad_images_skipped:
            parts.append(f"{self.bad_images_skipped} rows with a missing/unreadable image skipped")
        if self.leading_assistant_turns_dropped:
            parts.append(f"{self.leading_assistant_turns_dropped} leading assistant turns dropped (as LLaVA does)")
        return "; ".join(parts)


def log_phase(what: str, count: int, start: float, unit: str = "rows") -> float:
    """Log ``what`` with its count and rate when it took longer than ``PROGRESS_SECONDS``; returns the seconds."""
    seconds = time.perf_counter() - start
    if seconds >= PROGRESS_SECONDS:
        logger.info("%s: %d %s in %.1f s (%.0f %s/s)", what, count, unit, seconds, count / max(seconds, 1e-9), unit)
    return round(seconds, 3)


def _check_policy(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")


def split_paths(data_path: str | os.PathLike | list) -> list[str]:
    """``"a.json,b.json"`` or a list of paths -> a list of paths."""
    if isinstance(data_path, (list, tuple)):
        paths = [str(p) for p in data_path]
    else:
        paths = [p.strip() for p in str(data_path).split(",")]
    paths = [p for p in paths if p]
    if not paths:
        raise ValueError("data_path: no file given")
    return paths


def default_cache_dir(kind: str) -> str:
    """Where ``train`` keeps what it computed from the data (``kind``: "loaded" rows, "prepared" columns): under
    the datasets cache (``$HF_DATASETS_CACHE``), one file per distinct input, reused by the next run."""
    import datasets

    return os.path.join(datasets.config.HF_DATASETS_CACHE, f"llava_normaligned_{kind}")
