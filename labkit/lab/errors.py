"""How a command reports a user's mistake: one line naming the value and the rule, exit 2, no traceback.

Both command-line entries (`python -m labkit` and `python -m labkit.book.build`) use `refused`, so
that a missing or damaged file, a bad value or a busy run folder reads the same from either.
LABKIT_TRACEBACK=1 shows the traceback instead, for debugging the lab itself.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from .runs import RunFolderError


class CommandFailed(RuntimeError):
    """A step's command or a worker's run failed, and the message already says which and why (the failed
    command printed its own error above; a worker's error is quoted): a traceback of the caller adds nothing."""


USER_ERRORS = (FileExistsError, FileNotFoundError, ValueError, PermissionError, OSError, RunFolderError, CommandFailed)
"""what a user's mistake raises (PermissionError: data asked for in the wrong phase; OSError: a full disk,
a read-only folder), and a failure whose message says it all (CommandFailed)"""
EXIT_REFUSED = 2


def error_line(err: BaseException) -> str:
    """One line for a failure: an OSError of the system names its file and cause ("no space left on
    device", "read-only file system"); the lab's own errors carry their message."""
    if isinstance(err, OSError) and err.strerror and err.filename:
        where = f"{err.filename} -> {err.filename2}" if err.filename2 else f"{err.filename}"
        return f"{where}: {err.strerror[0].lower()}{err.strerror[1:]}"
    return str(err) or type(err).__name__


def refused(run: Callable[[], int], on_refusal: Callable[[], None] = lambda: None) -> int:
    """run()'s exit code; a user's mistake (USER_ERRORS) is printed as "error: <one line>" on stderr and
    gives EXIT_REFUSED, after on_refusal() (e.g. removing the locks a refused command left)."""
    try:
        return run()
    except USER_ERRORS as err:
        if os.environ.get("LABKIT_TRACEBACK"):
            raise
        on_refusal()
        print(f"error: {error_line(err)}", file=sys.stderr)
        return EXIT_REFUSED
