"""What a command or the library said, read by meaning rather than by the exact wording of a sentence: the one line
a refusal must be (no traceback), and the numbers a text reports, parsed so that a test compares them as numbers."""

from __future__ import annotations

import re


def one_line(text: str) -> str:
    """The one non-blank line of ``text`` (a command's stderr, an exception's message); ``AssertionError`` showing
    ``text`` when it has more lines or a traceback."""
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text[-3000:]
    return lines[0]


def error_line(text: str, command: str) -> str:
    """What the one ``llava-normaligned COMMAND: error: ...`` line of ``text`` (a command's stderr, progress bars and
    log records around it left aside) says after that prefix; ``AssertionError`` showing ``text`` when there is not
    exactly one such line, or there is a traceback."""
    prefix = f"llava-normaligned {command}: error: "
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1 and "Traceback" not in text, text[-3000:]
    return lines[0][len(prefix):]


def number(pattern: str, text: str) -> float:
    """The number that the first group of ``pattern`` captures at its first match in ``text`` (thousands separators
    allowed); ``AssertionError`` showing ``text`` where nothing matches."""
    found = re.search(pattern, text)
    assert found, (pattern, text[-3000:])
    return float(found.group(1).replace(",", ""))


__all__ = ["error_line", "number", "one_line"]
