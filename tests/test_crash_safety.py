"""A writer killed in the middle of writing an artifact leaves the previous file intact and readable."""

import json
import signal
import subprocess
import sys
import textwrap

import pytest

from labkit.lab.runs import REPO_ROOT, read_json, write_json

# The child writes version 1, then starts writing version 2 with a disk that never finishes
# (fsync blocks), and is killed there with SIGKILL: no Python clean-up code can run.
CHILD = textwrap.dedent("""
    import os, sys, time
    from labkit.lab import runs
    path = sys.argv[1]
    runs.write_json(path, {"version": 1, "rows": list(range(10))})
    def stuck_fsync(fd):
        print("writing", flush=True)
        time.sleep(600)
    os.fsync = stuck_fsync
    runs.write_json(path, {"version": 2, "rows": list(range(100_000))})
""")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_writer_killed_mid_write_leaves_the_previous_file(tmp_path):
    target = tmp_path / "run" / "manifest.json"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target)], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"  # version 2 is on its way to the disk
        partial = list(target.parent.glob(".manifest.json.*.tmp"))
        assert len(partial) == 1 and partial[0].stat().st_size > 0
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert read_json(target) == {"version": 1, "rows": list(range(10))}  # intact, readable, the old version
    assert json.loads(target.read_text()) == read_json(target)
    write_json(target, {"version": 3})  # and the next write still works beside the orphaned temp file
    assert read_json(target) == {"version": 3}
