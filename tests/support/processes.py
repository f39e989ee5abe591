"""Child processes that behave the same however pytest itself was started.

A test run started in the background (``cmd &`` from a script, ``nohup``, a CI runner) begins with SIGINT and
SIGQUIT ignored, and an ignored signal stays ignored through ``fork`` and ``exec``: a Python child started from it
never turns SIGINT into ``KeyboardInterrupt`` (Python installs its handler only where SIGINT was not ignored), so a
test that sends Ctrl-C to a child would wait for nothing. A signal blocked in the parent's mask is blocked in the
child the same way. A child that inherits the terminal as its standard input may stop at a prompt (transformers'
"Do you wish to run the custom code?", pip's credentials), or be stopped by the terminal when pytest runs as a
background job.

So a test that signals a child starts it with ``spawn`` / ``spawn_console``: the signals tests send (SIGINT,
SIGTERM, SIGQUIT) at their default dispositions and unblocked before the child's program starts, standard input
``/dev/null``. Before sending, ``send_or_skip`` reads the child's dispositions in ``/proc`` (where there is one) and
skips, saying why, when the signal still cannot arrive; ``wait_after_signal`` turns a child that does not exit into
a failure that says which signal it was sent, what the child did with it, and the child's last lines.

Every other subprocess a test starts gets ``stdin=subprocess.DEVNULL`` where it is started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence

import pytest

# the signals tests send to children: each at its default disposition, and unblocked, in every child started here
SENT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)


def console_script(name: str) -> str:
    """The entry point ``name`` installed with the interpreter running the tests (its environment's scripts folder,
    else next to it), never one found first on a ``PATH`` that may lead to another installation."""
    for folder in dict.fromkeys([sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]):
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path
    return os.path.join(os.path.dirname(sys.executable), name)  # not installed: the start fails and says so


CONSOLE = console_script("llava-normaligned")


def _default_dispositions(then: Callable[[], None] | None = None) -> Callable[[], None]:
    def reset() -> None:  # runs in the child, between fork and exec
        for number in SENT_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SENT_SIGNALS)
        if then is not None:
            then()

    return reset


def spawn(command: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen(command, **popen_kwargs)`` with SIGINT, SIGTERM and SIGQUIT at their default dispositions
    and unblocked in the child, whatever pytest inherited, and standard input ``/dev/null`` unless ``stdin`` is
    given. A ``preexec_fn`` given runs after the reset."""
    popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
    popen_kwargs["preexec_fn"] = _default_dispositions(popen_kwargs.get("preexec_fn"))
    return subprocess.Popen(list(command), **popen_kwargs)


def spawn_console(args: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """The installed ``llava-normaligned`` console script with ``args``, started by ``spawn`` (default signal
    dispositions, standard input ``/dev/null``); ``popen_kwargs`` go to ``subprocess.Popen``."""
    return spawn([CONSOLE, *args], **popen_kwargs)


def _mask(status: str, field: str) -> int | None:
    for line in status.splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1].strip(), 16)
    return None


def signal_state(pid: int, number: int) -> str | None:
    """What process ``pid`` does with signal ``number``, from Linux's ``/proc``: "ignored", "blocked" (by every one
    of its threads, so it stays pending), "caught" (a handler: Python's, for SIGINT) or "default"; None where
    ``/proc`` cannot say (another system, or the process is gone)."""
    bit = 1 << (number - 1)
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            status = handle.read()
    except OSError:
        return None
    ignored, caught = _mask(status, "SigIgn"), _mask(status, "SigCgt")
    if ignored is None or caught is None:
        return None
    if ignored & bit:
        return "ignored"
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        threads = []
    masks = []
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/status", encoding="ascii") as handle:
                masks.append(_mask(handle.read(), "SigBlk"))
        except OSError:  # a thread that just ended
            continue
    if masks and all(mask is not None and mask & bit for mask in masks):
        return "blocked"
    return "caught" if caught & bit else "default"


def send_or_skip(proc: subprocess.Popen, number: int) -> None:
    """Send signal ``number`` to ``proc``; when ``/proc`` shows that the child ignores or blocks it (it would never
    arrive), stop the child and skip the test, saying so."""
    state = signal_state(proc.pid, number)
    if state in ("ignored", "blocked"):
        proc.kill()
        proc.wait()
        name = signal.Signals(number).name
        pytest.skip(f"{name} cannot reach the child: /proc/{proc.pid}/status shows it {state} there, although the "
                    f"child was started with {name} at its default disposition and unblocked")
    proc.send_signal(number)


def wait_after_signal(proc: subprocess.Popen, number: int, timeout: float, output: Callable[[], str],
                      lines: int = 25) -> int:
    """Wait up to ``timeout`` s for ``proc``, which was sent signal ``number``, and return its exit code. If it has
    not exited by then: kill it and fail with what it did with the signal and the last ``lines`` of ``output()``
    (what the test has read of the child's output)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = signal_state(proc.pid, number)
        proc.kill()
        proc.wait()
        name = signal.Signals(number).name
        said = "\n".join(output().rstrip().splitlines()[-lines:])
        pytest.fail(f"{os.path.basename(str(proc.args[0]))} (pid {proc.pid}) did not exit within {timeout:.0f} s "
                    f"of {name} ({name} in the child: {state or 'not readable'}); its last lines:\n{said}",
                    pytrace=False)
