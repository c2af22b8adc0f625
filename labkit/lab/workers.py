"""Jobs in worker processes that live and die with the command that started them.

    run_in_processes(fn, jobs, workers)  ->  [(job, result or None, error or None)] in finishing order

Each job runs in a process of its own (spawned: nothing shared with the parent), `workers` at a time.
Unlike a `concurrent.futures.ProcessPoolExecutor`, whose pool breaks as a whole when one worker dies
(every pending job then fails, the healthy ones too), a worker's death fails only its own job.  And
the workers never outlive the command:

    the command ends (an error, Ctrl-C)  each live worker is given `grace_seconds` to stop on its own
                                         (a Ctrl-C at a terminal reaches it too, and a training run
                                         then saves its state), then is terminated
    the command is killed (kill -9)      each worker watches its parent and exits within about a
                                         second of losing it, so no worker writes on, or blocks
                                         forever on a pipe nobody reads

    each_result(fn, jobs, workers, what=..., command=...)  ->  (job, result) as each job ends; then one
                                         error for all the failures: `skeleton.Interrupted` (naming the
                                         command that continues) where a Ctrl-C stopped them, else
                                         `errors.CommandFailed` naming each failed job
"""

from __future__ import annotations

import os
import threading
import time

PARENT_CHECK_SECONDS = 0.5
"""how often a worker checks that the command that started it is alive"""


def _exit_with(parent: int) -> None:
    """In a worker: end this process as soon as `parent` is no longer its parent (it died)."""
    def watch():
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(3)  # no clean-up: the run's files are written atomically, and its folder stays unfinished

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _worker(fn, job, send, parent: int) -> None:
    _exit_with(parent)
    try:
        outcome = ("result", fn(job))
    except BaseException as err:  # noqa: BLE001  (reported to the parent, by the job's name)
        outcome = ("error", f"{type(err).__name__}: {err}")
    send.send(outcome)
    send.close()


def run_in_processes(fn, jobs: list, workers: int, *, grace_seconds: float = 30.0):
    """Run `fn(job)` for each job in its own spawned process, `workers` at a time; yields
    (job, result, None) or (job, None, "ErrorName: message") as each one ends (a worker that died
    without answering: "worker died (exit code N)").  `fn` and the jobs must be picklable."""
    import multiprocessing
    from multiprocessing.connection import wait

    if workers < 1:
        raise ValueError(f"workers {workers}: must be at least 1")
    context = multiprocessing.get_context("spawn")
    pending, live = list(jobs), {}  # live: process -> [job, receiving end, outcome or None]
    try:
        while pending or live:
            while pending and len(live) < workers:
                job = pending.pop(0)
                receive, send = context.Pipe(duplex=False)
                process = context.Process(target=_worker, args=(fn, job, send, os.getpid()), daemon=False)
                process.start()
                send.close()  # the parent keeps only its end: a dead worker then reads as end of file
                live[process] = [job, receive, None]
            ready = wait([entry[1] for entry in live.values() if entry[2] is None]
                         + [process.sentinel for process in live])
            for process, entry in list(live.items()):
                if entry[2] is None and entry[1] in ready:
                    entry[2] = _answer(entry[1])  # read as soon as sent: a large result never blocks the worker
                if process.sentinel in ready or not process.is_alive():
                    process.join()
                    job, receive, outcome = live.pop(process)
                    if outcome is None and receive.poll():
                        outcome = _answer(receive)
                    receive.close()
                    if outcome is None or outcome[0] == "died":
                        yield job, None, f"worker died (exit code {process.exitcode})"
                    elif outcome[0] == "error":
                        yield job, None, outcome[1]
                    else:
                        yield job, outcome[1], None
    finally:
        stop(list(live), grace_seconds)


def each_result(fn, jobs: list, workers: int, *, what: str, command: str):
    """`run_in_processes` for a step's runs: yields (job, result) for each job that ended well, as it ends,
    and lets the others run on; then, if any failed, raises one error naming each (by `job[0]`):
    `skeleton.Interrupted` where a Ctrl-C stopped them (each worker's own message names its state), else
    `errors.CommandFailed("<what> failed: ...")`, which a command prints as one line.  A Ctrl-C that stops the command itself is an Interrupted naming
    `command`, the command that continues."""
    from .errors import CommandFailed
    from .skeleton import Interrupted

    failed = []
    try:
        for job, result, error in run_in_processes(fn, jobs, workers):
            if error is None:
                yield job, result
            else:
                failed.append(f"{job[0]}: {error}")
    except KeyboardInterrupt as err:
        if isinstance(err, Interrupted):
            raise
        raise Interrupted(f"{what} stopped (Ctrl-C): every unfinished run kept its newest state; continue with "
                          f"`{command}`") from None
    stopped = [f for f in failed if ": Interrupted: " in f]
    if stopped:
        raise Interrupted("; ".join(stopped))
    if failed:
        raise CommandFailed(f"{what} failed: " + "; ".join(failed))


def _answer(receive) -> tuple:
    """The worker's outcome, or ("died", None) where its end of the pipe closed without one."""
    try:
        return receive.recv()
    except EOFError:
        return ("died", None)


def stop(processes: list, grace_seconds: float) -> None:
    """Let `processes` end on their own for up to `grace_seconds`, then terminate those still alive."""
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join()
