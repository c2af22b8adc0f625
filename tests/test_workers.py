"""Worker processes that fail alone and never outlive their command (labkit.lab.workers; issue 58, item 9)."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from labkit.lab.errors import CommandFailed
from labkit.lab.skeleton import Interrupted
from labkit.lab.workers import each_result, run_in_processes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and kill -9: Linux")


def job(kind: str):
    """A picklable job: 'die' ends its process without a word, 'raise' fails, 'wait:<file>' writes its pid
    to <file> and sleeps; anything else is returned doubled."""
    if kind == "die":
        os._exit(7)
    if kind == "raise":
        raise ValueError("a bad setting")
    if kind.startswith("wait:"):
        Path(kind[5:]).write_text(str(os.getpid()))
        time.sleep(120)
    return kind * 2


def test_a_dead_or_failing_worker_fails_its_own_job_alone():
    outcomes = {j: (result, error) for j, result, error in run_in_processes(job, ["a", "die", "raise", "b"], 2)}
    assert outcomes == {"a": ("aa", None), "b": ("bb", None), "die": (None, "worker died (exit code 7)"),
                        "raise": (None, "ValueError: a bad setting")}


def named_job(args: tuple):
    """A job named by its first field (as a step's runs are); 'stop' is a run that a Ctrl-C stopped."""
    if args[0] == "stop":
        raise Interrupted("after iteration 3: its state is states/iter-003.pt.gz; continue with --resume")
    return job(args[0])


def test_each_result_yields_the_good_runs_then_names_every_failure_at_once():
    seen = []
    with pytest.raises(CommandFailed, match=r"^the runs failed: (die: worker died \(exit code 7\); raise: ValueError: a "
                                           r"bad setting|raise: ValueError: a bad setting; die: worker died \(exit code "
                                           r"7\))$"):
        for named, result in each_result(named_job, [("a",), ("die",), ("raise",), ("b",)], 2, what="the runs",
                                         command="again"):
            seen.append((named[0], result))
    assert sorted(seen) == [("a", "aa"), ("b", "bb")]  # the healthy runs ran to their end
    with pytest.raises(Interrupted, match=r"^stop: Interrupted: after iteration 3: .* --resume$"):
        list(each_result(named_job, [("stop",), ("raise",)], 1, what="the runs", command="again"))


def test_workers_refuse_a_count_below_one():
    with pytest.raises(ValueError, match="workers 0: must be at least 1"):
        list(run_in_processes(job, ["a"], 0))


def alive(pid: int) -> bool:
    """Running, or stopped: not gone and not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def test_no_worker_outlives_a_command_killed_with_kill_9(tmp_path):
    files = [tmp_path / f"pid-{k}" for k in range(2)]
    command = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_workers import job
        from labkit.lab.workers import run_in_processes
        list(run_in_processes(job, {[f"wait:{f}" for f in files]!r}, 2))
    """)
    parent = subprocess.Popen([sys.executable, "-c", command])
    try:
        deadline = time.monotonic() + 120
        while not all(f.is_file() and f.read_text() for f in files):
            assert time.monotonic() < deadline and parent.poll() is None, "the workers never started"
            time.sleep(0.05)
        workers = [int(f.read_text()) for f in files]
        assert all(alive(pid) for pid in workers)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10  # each worker checks its parent every 0.5 s
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in workers), "a worker outlived its killed command"
    finally:
        if parent.poll() is None:
            parent.kill()
