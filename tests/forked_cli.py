"""Real `labkit` CLI processes for the fault-injection tests, without paying the lab's imports each time.

A run of `python -m labkit grpo` spends about 60% of its time importing torch and transformers
(3 to 6 s of a 10 s run).  Here each run is instead a child process forked from a server that
imported them, and the lab, once (multiprocessing's forkserver, started on first use in each
pytest worker; the server itself only imports).  The child is a real process with its own pid:
it runs `labkit.cli.main(args)` as `python -m labkit` does, in the repository, with the given
environment and its output in a log file, and a real SIGKILL or SIGINT reaches it as it would
reach `python -m labkit`.  `ForkedProcess` answers as much of subprocess.Popen as the tests use
(pid, poll, wait, returncode, send_signal).

What this does not exercise: the interpreter's own start-up, and a hash seed of its own per
process (the children share the server's).  The tests' continuous reference runs stay
`python -m labkit` processes, so every resumed run is compared with a run of a fresh interpreter.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys

# What the server imports before it forks (the CLI imports its commands' modules lazily).
PRELOAD = ["torch", "transformers", "labkit.cli", "labkit.grpo.loop", "labkit.train.sft", "labkit.models.presets", "labkit.eval.evaluate",
           "labkit.studies.tuning"]
_CONTEXT = None


def context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _hold_fsync(prefix: str, mark: str, skip: int) -> None:
    """Hold os.fsync forever on the first file named `prefix`* after letting `skip` such fsyncs
    through, writing the file's name to `mark` first (its bytes are written, not yet synced or
    renamed into place, when the test kills the process)."""
    real_fsync, left = os.fsync, [skip]

    def fsync(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(prefix) and left[0] > 0:
            left[0] -= 1
        elif name.startswith(prefix):
            with open(mark, "w") as f:
                f.write(name)
            signal.pause()  # until the test's SIGKILL
        real_fsync(fd)

    os.fsync = fsync


def _child(args: list[str], log: str, cwd: str, env: dict, hold: tuple | None) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # line-buffered, as PYTHONUNBUFFERED is for a log
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # SIGINT as a terminal gives it (pytest-xdist's workers ignore it, and the server inherited that)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if hold is not None:
        _hold_fsync(*hold)
    from labkit.cli import main

    code = main(args)
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(code)


class ForkedProcess:
    """`labkit.cli.main(args)` in a forked child (module docstring); a Popen-like handle on it."""

    def __init__(self, args: list[str], log, cwd, env: dict, hold: tuple | None = None):
        self._process = context().Process(target=_child, args=(list(args), str(log), str(cwd), dict(env), hold),
                                          daemon=False)
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired("labkit (forked)", timeout)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)
