"""One run's life, the same for every training run of the lab: hold the folder, refuse or clear an
earlier attempt, resume, autosave, stop cleanly on Ctrl-C, finish.

    stage     what happens                                                     here
    hold      one process writes a run folder at a time (a lock file)          `holding`
    prepare   a folder holding an unfinished attempt is refused, unless the    `refuse_earlier_attempt`
              caller resumes it or restarts (deleting it); nothing is lost
              silently
    iterate   every `AUTOSAVE_EVERY` units (iterations, updates) or            `Autosave`
              `AUTOSAVE_SECONDS` of wall time, a resumable state; only the
              newest autosave is kept, none once the run has finished
    Ctrl-C    the first finishes the current unit, saves its state and          `DeferredInterrupt`,
              stops, saying how to resume; a second stops at once, except      `Interrupted`,
              while a state is written, which is finished first                `whole_write`
    finish    the model and records, the manifest, then the FINISHED marker    the caller, through
                                                                               `RunFolder.mark_finished`

The GRPO loop (`labkit.grpo.loop`, one unit = one iteration) and SFT (`labkit.train.sft`, one unit =
one update) run through it; what a state holds and how a run resumes from one is theirs
(`labkit.lab.state` captures and compares states).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

from .runs import RunFolder, UnfinishedRunError, display_path

AUTOSAVE_EVERY = 10
"""units (GRPO iterations, SFT updates) between two autosaves, at most"""
AUTOSAVE_SECONDS = 300.0
"""seconds of wall time between two autosaves, at most: a crash or a Ctrl-C loses no more"""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run; the message says which state to resume from, and how."""


class DeferredInterrupt:
    """While active (in the main thread), a first Ctrl-C only asks the run to stop after the current
    unit, whose state is then saved; a second one interrupts at once."""

    def __init__(self):
        self.requested, self._previous = False, None

    def _handle(self, signum, frame):
        if self.requested:
            raise Interrupted("interrupted during a step (Ctrl-C twice): resume from the newest saved state "
                              "with the same command and --resume")
        self.requested = True
        print("\nCtrl-C: finishing this step, then saving its state (Ctrl-C again to stop at once)", flush=True)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


class Autosave:
    """When to save a state on the run's own initiative, and which autosave to keep (the newest).

    `due(done)` after each unit: every `every` units, after `seconds` of wall time since the last
    state, or when Ctrl-C asked to stop.  `saved(name)` registers a new autosave (a path relative to
    the folder, already in its ledger) and forgets the previous one; `kept(...)` tells it that a state
    the caller keeps for good was saved (the clock restarts); `finish()` forgets the last autosave."""

    def __init__(self, folder: RunFolder, interrupt: DeferredInterrupt, every: int | None = AUTOSAVE_EVERY,
                 seconds: float = AUTOSAVE_SECONDS):
        self.folder, self.interrupt, self.every, self.seconds = folder, interrupt, every, seconds
        self.last_time, self.newest = time.monotonic(), None

    def due(self, done: int) -> bool:
        """After unit `done`: whether to save a state now (every None: by the clock and Ctrl-C alone)."""
        return (self.interrupt.requested or (self.every is not None and done % self.every == 0)
                or time.monotonic() - self.last_time > self.seconds)

    def kept(self) -> None:
        self.last_time = time.monotonic()

    def saved(self, name: str) -> None:
        if self.newest is not None and self.newest != name:
            self.folder.forget(self.newest)
        self.newest, self.last_time = name, time.monotonic()

    def stop_if_asked(self, done: int, end: int, newest: Path | None, unit: str, resume_flag: str) -> None:
        """After `unit` `done` of `end`: if Ctrl-C asked, raise Interrupted naming the state to resume from and
        the flag that resumes it ("--resume", or "--resume-from <state>")."""
        if self.interrupt.requested and done < end:
            raise Interrupted(f"interrupted after {unit} {done}: its state is {display_path(newest)}; continue "
                              f"with the same command and {resume_flag}")

    def finish(self) -> None:
        """The run reached its end: the states it keeps for good stay, the last autosave goes."""
        if self.newest is not None:
            self.folder.forget(self.newest)
            self.newest = None


@contextlib.contextmanager
def shielded(message: str):
    """A block that Ctrl-C cannot cut in two (a state or a result being written): a Ctrl-C heard inside
    prints `message` and waits until the block has ended.  Yields a list that holds one True per Ctrl-C
    heard, for the caller to act on afterwards (outside the main thread, where no signal arrives, a no-op)."""
    heard: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield heard
        return

    def handle(signum, frame):
        if not heard:
            print(f"\nCtrl-C: {message}", flush=True)
        heard.append(True)

    previous = signal.signal(signal.SIGINT, handle)
    try:
        yield heard
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def whole_write(interrupt: DeferredInterrupt):
    """A state being written and registered is finished whatever Ctrl-C says: a Ctrl-C heard meanwhile (the
    first or the second) asks the run to stop, and the caller's next `Autosave.stop_if_asked` stops it at the
    state just written.  Without it, a second Ctrl-C during a save would break the write and lose the
    state (the previous one stays whole: `labkit.lab.state.save_state` writes atomically)."""
    with shielded("a state is being written; the run stops as soon as it is whole") as heard:
        yield
    if heard:
        interrupt.requested = True


@contextlib.contextmanager
def holding(folder: RunFolder, overwrite: bool = False):
    """The folder opened for writing by this process alone (`RunFolder.open_for_writing`: a finished run
    is refused unless `overwrite`), released however the block ends."""
    folder.open_for_writing(overwrite)
    try:
        yield folder
    finally:
        folder.release()


def refuse_earlier_attempt(folder: RunFolder, attempt: str | None, resuming: bool, restart: bool) -> None:
    """A fresh start into a folder that holds an unfinished attempt (`attempt` describes it; None: the
    folder holds none) is refused unless `restart` says to delete it."""
    if attempt and not resuming and not restart:
        raise UnfinishedRunError(
            f"{display_path(folder.path)} holds an unfinished attempt ({attempt}): pass --resume to continue "
            "from its newest state, or --restart to delete it and start afresh")
