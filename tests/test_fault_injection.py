"""Fault injection: a GRPO run folder survives a real `kill -9` and a resume in place.

Every run here is a real `python -m labkit grpo` process (tiny preset, one torch thread,
the committed warm start: the CLI takes no start file) killed with a real SIGKILL, so no
Python clean-up code runs.  After each kill the run resumes in the *same* folder from the
newest state that loads, and must end exactly where a continuous run ends: the same final
model, the same history, and `grpo.read_rollouts` returns the continuous run's rows, each
rollout once.

Kill points are chosen by waiting for files, never by sleeping alone:

    between iterations        the state of iteration k is in place
    mid-iteration             a fixed 0.3 s after the state of iteration k (an iteration takes ~1 s)
    segment, no state         rollouts-00k-00k.jsonl.gz exists, its state not yet (a ~0.3 s gap)
    a state being written     the temporary `.iter-00k.pt.gz.*.tmp`; it lives only 5-30 ms, too
                              short to catch by polling, so that process runs the same CLI with
                              os.fsync held on that file (a slow disk), and is killed there
    after the last state      the same, with os.fsync held on the final model file

The last tests corrupt copies of a finished run's files (a flipped bit, a cut) and ask for
a refusal that names the file.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from labkit import grpo, state as state_lib
from labkit.runs import REPO_ROOT, ArtifactError, is_finished, read_json, sha256_file

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL and /proc/self/fd: Linux")

N = 4  # iterations of every run here (~1 s each, plus ~4 s of start-up per process)
ROWS_PER_ITERATION = 16  # 4 prompts x G=4
EVERY_ITERATION = ",".join(str(k) for k in range(1, N))  # the last one is always saved
CLI = [sys.executable, "-m", "labkit", "grpo", "--preset", "tiny", "--threads", "1", "--no-progress",
       "--iterations", str(N)]
WAIT_S = 180  # the longest wait for a file before the test fails (a run takes ~10 s)

# The same CLI, with os.fsync held forever on the first file whose name starts with
# $FI_HOLD_FSYNC: its bytes are written (not yet renamed into place) when the test kills it.
HOLD_FSYNC = textwrap.dedent("""
    import os, sys, time
    prefix, mark = os.environ["FI_HOLD_FSYNC"], os.environ["FI_HOLD_MARK"]
    real_fsync = os.fsync
    def fsync(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(prefix):
            with open(mark, "w") as f:
                f.write(name)
            time.sleep(3600)
        real_fsync(fd)
    os.fsync = fsync
    from labkit.cli import main
    raise SystemExit(main(sys.argv[1:]))
""")


# -- processes -----------------------------------------------------------------------------------


class Run:
    """One `labkit grpo` child process writing into `folder`, its output in a log file."""

    def __init__(self, folder: Path, log: Path, args: list[str], hold_fsync: str | None = None):
        self.folder, self.log = folder, log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("LABKIT_TRACEBACK", None)
        command = CLI + ["--run-dir", str(folder), *args]
        self.mark, self.hold = None, hold_fsync
        if hold_fsync is not None:
            self.mark = log.with_suffix(".held")
            env.update(FI_HOLD_FSYNC=hold_fsync, FI_HOLD_MARK=str(self.mark))
            command = [sys.executable, "-c", HOLD_FSYNC, *command[3:]]  # drop "-m labkit"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, what: str, predicate, timeout: float = WAIT_S):
        """Poll `predicate` every 2 ms until it is truthy; fail clearly if the run ends or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            found = predicate()
            if found:
                return found
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended (exit {self.proc.returncode}) before {what}; its output:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no {what} after {timeout} s; the run's output so far:\n{self.output()}")
            time.sleep(0.002)

    def wait_for_file(self, relative: str, timeout: float = WAIT_S) -> Path:
        path = self.folder / relative
        return self.wait_for(f"{path}", lambda: path.exists() and path, timeout)

    def wait_until_held(self) -> str:
        """Wait until the held fsync is reached; returns the name of the file being written."""
        assert self.mark is not None, "this run holds no fsync"
        return self.wait_for(f"the held fsync of {self.hold}*", lambda: self.mark.exists() and self.mark.read_text())

    def kill9(self) -> None:
        assert self.proc.poll() is None, f"the run had already ended (exit {self.proc.returncode}):\n{self.output()}"
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)
        assert self.proc.returncode == -signal.SIGKILL, self.output()

    def finish(self, timeout: float = 300) -> str:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within {timeout} s:\n{self.output()}")
        assert self.proc.returncode == 0, f"exit {self.proc.returncode}:\n{self.output()}"
        return self.output()


@pytest.fixture
def launch(tmp_path):
    """Start runs; any still alive when the test ends (a failure) is killed, by its own pid."""
    started: list[Run] = []

    def start(folder: Path, *args: str, hold_fsync: str | None = None) -> Run:
        run = Run(folder, tmp_path / f"run-{len(started)}.log", list(args), hold_fsync)
        started.append(run)
        return run

    yield start
    for run in started:
        if run.proc.poll() is None:
            os.kill(run.proc.pid, signal.SIGKILL)
            run.proc.wait(timeout=60)


# -- the folder ------------------------------------------------------------------------------------


def newest_loadable_state(folder: Path) -> Path:
    """The newest states/iter-NNN.pt.gz that load_state accepts (StateFileError: skipped)."""
    for path in sorted((folder / "states").glob("iter-*.pt.gz"), reverse=True):
        try:
            state_lib.load_state(path)
        except state_lib.StateFileError:
            continue
        return path
    raise AssertionError(f"{folder}/states holds no loadable state: {sorted(os.listdir(folder / 'states'))}")


def iteration_of(state: Path) -> int:
    return int(state.name[len("iter-"):len("iter-NNN")])


def names(folder: Path, pattern: str) -> list[str]:
    return sorted(p.name for p in folder.glob(pattern))


def assert_equals_continuous(folder: Path, reference: dict) -> None:
    """Finished, same final model and history, and exactly the continuous run's rollouts, each once."""
    assert is_finished(folder)
    manifest = read_json(folder / "manifest.json")
    assert manifest["final_digest"] == reference["manifest"]["final_digest"]
    assert sha256_file(folder / "model.safetensors") == reference["model_sha256"]
    assert manifest["rollouts"] == N * ROWS_PER_ITERATION and manifest["updates"] == 2 * N
    assert read_json(folder / "history.json") == reference["history"]
    rows = grpo.read_rollouts(folder)
    ids = [r["rollout_id"] for r in rows]
    assert len(ids) == len(set(ids)) == N * ROWS_PER_ITERATION
    assert [r["iteration"] for r in rows] == [k for k in range(1, N + 1) for _ in range(ROWS_PER_ITERATION)]
    assert rows == reference["rows"]
    # every iteration's timings once, from contiguous segments
    timings = [t["iteration"] for p in sorted(folder.glob("timings-*.json"), key=grpo.segment_range)
               for t in read_json(p)]
    assert timings == list(range(1, N + 1))
    assert all(iteration_of(p) <= N for p in (folder / "states").glob("iter-*.pt.gz"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The continuous run: N iterations, a state after each, never interrupted."""
    folder = tmp_path_factory.mktemp("continuous") / "run"
    run = Run(folder, folder.parent / "run.log", ["--save-states-at", EVERY_ITERATION])
    try:
        run.finish()
    finally:
        if run.proc.poll() is None:
            os.kill(run.proc.pid, signal.SIGKILL)
            run.proc.wait(timeout=60)
    rows = grpo.read_rollouts(folder)
    assert len(rows) == N * ROWS_PER_ITERATION and len({r["rollout_id"] for r in rows}) == len(rows)
    return {
        "folder": folder,
        "manifest": read_json(folder / "manifest.json"),
        "history": read_json(folder / "history.json"),
        "rows": rows,
        "model_sha256": sha256_file(folder / "model.safetensors"),
    }


# -- 1. kill -9 between iterations --------------------------------------------------------------------


def test_kill_between_iterations_then_resume_in_place(tmp_path, launch, reference):
    folder = tmp_path / "run"
    first = launch(folder, "--save-states-at", EVERY_ITERATION)
    first.wait_for_file("states/iter-002.pt.gz")
    first.kill9()
    assert not is_finished(folder)
    state = newest_loadable_state(folder)
    assert iteration_of(state) in (2, 3)  # 3 only if iteration 3 ended within the kill's microseconds
    launch(folder, "--resume-from", str(state)).finish()
    assert_equals_continuous(folder, reference)
    assert read_json(folder / "manifest.json")["resumed_from"] == str(state)


# -- 2. kill -9 at awkward moments, several times in one folder ------------------------------------------


def test_repeated_kills_at_awkward_moments_then_resume_in_place(tmp_path, launch, reference):
    folder = tmp_path / "run"
    states = "--save-states-at", EVERY_ITERATION

    # a. mid-iteration: 0.1 s into iteration 2 (an iteration takes ~0.7 s here), nothing of it is on disk yet
    run = launch(folder, *states)
    run.wait_for_file("states/iter-001.pt.gz")
    time.sleep(0.1)
    run.kill9()
    assert names(folder, "rollouts-*") == ["rollouts-001-001.jsonl.gz"], "the kill came after iteration 2 ended"
    state = newest_loadable_state(folder)
    assert iteration_of(state) == 1

    # b. iteration 2's rollouts are written, its state not yet (nor, perhaps, its timings)
    run = launch(folder, *states, "--resume-from", str(state))
    run.wait_for_file("rollouts-002-002.jsonl.gz")
    run.kill9()
    assert not (folder / "states" / "iter-002.pt.gz").exists(), "the kill came after the state was written"
    state = newest_loadable_state(folder)
    assert iteration_of(state) == 1

    # c. while the state of iteration 3 is being written (its bytes in the temporary file, not renamed)
    run = launch(folder, *states, "--resume-from", str(state), hold_fsync=".iter-003.pt.gz.")
    held = run.wait_until_held()
    run.kill9()
    # b's segment 2 is dropped: its rollouts, and its timings if b lived long enough to write them
    # (complete, or as the temporary file of a write the kill interrupted)
    removed = re.search(r"removed ([123]) file\(s\) of an earlier, unfinished attempt \(([^)]*)\)", run.output())
    assert removed and "rollouts-002-002.jsonl.gz" in removed.group(2).split(", "), run.output()
    assert all(name.startswith(("rollouts-002-002", "timings-002-002", ".timings-002-002"))
               for name in removed.group(2).split(", ")), run.output()
    assert (folder / "states" / held).stat().st_size > 0
    assert not (folder / "states" / "iter-003.pt.gz").exists()
    assert "rollouts-003-003.jsonl.gz" in names(folder, "rollouts-*")  # the segment goes before its state
    state = newest_loadable_state(folder)
    assert iteration_of(state) == 2

    # d. after the last state, while the final model is written (no FINISHED yet)
    run = launch(folder, *states, "--resume-from", str(state), hold_fsync=".model.safetensors.")
    run.wait_until_held()
    run.kill9()
    assert not is_finished(folder) and not (folder / "model.safetensors").exists()
    state = newest_loadable_state(folder)
    assert iteration_of(state) == N

    # e. resumed from the last state: nothing left to run but the final model and manifest
    launch(folder, "--resume-from", str(state)).finish()
    assert_equals_continuous(folder, reference)
    assert read_json(folder / "manifest.json")["iterations_run"] == [N, N]


# -- 3. a fresh start in an unfinished folder -------------------------------------------------------------


def test_a_fresh_start_after_stop_after_leaves_no_duplicate_rollouts(tmp_path, launch, reference):
    folder = tmp_path / "run"
    launch(folder, "--stop-after", "2", "--save-states-at", "1").finish()
    assert names(folder, "rollouts-*") == ["rollouts-001-001.jsonl.gz", "rollouts-002-002.jsonl.gz"]
    assert (folder / "stopped-at-002.json").exists() and not is_finished(folder)

    output = launch(folder, "--save-states-at", EVERY_ITERATION).finish()  # from scratch, no --resume-from
    assert "removed 7 file(s) of an earlier, unfinished attempt" in output  # 2 + 2 segment files, 2 states, stopped-at
    assert_equals_continuous(folder, reference)
    assert names(folder, "rollouts-*") == names(reference["folder"], "rollouts-*")
    assert names(folder, "states/*") == names(reference["folder"], "states/*")
    assert names(folder, "stopped-at-*") == []


# -- 4. corrupted files are refused, naming the file -------------------------------------------------------


def flip_bit(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << (position % 8)
    path.write_bytes(bytes(data))


def copy_segments(reference: dict, folder: Path) -> Path:
    folder.mkdir()
    for path in reference["folder"].glob("rollouts-*.jsonl.gz"):
        shutil.copyfile(path, folder / path.name)
    return folder / "rollouts-002-002.jsonl.gz"


@pytest.mark.parametrize("where", ["gzip magic", "deflate start", "middle", "crc32 trailer", "size trailer"])
def test_a_flipped_bit_in_a_state_file_is_refused_naming_the_file(tmp_path, reference, where):
    path = tmp_path / "iter-004.pt.gz"
    shutil.copyfile(reference["folder"] / "states" / "iter-004.pt.gz", path)
    size = path.stat().st_size
    flip_bit(path, {"gzip magic": 0, "deflate start": 10, "middle": size // 2,
                    "crc32 trailer": size - 6, "size trailer": size - 2}[where])
    with pytest.raises(state_lib.StateFileError, match=str(path)):
        state_lib.load_state(path)


def test_a_truncated_state_file_is_refused_naming_the_file(tmp_path, reference):
    path = tmp_path / "iter-004.pt.gz"
    data = (reference["folder"] / "states" / "iter-004.pt.gz").read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(state_lib.StateFileError, match=str(path)):
        state_lib.load_state(path)


def test_resuming_from_a_damaged_state_fails_in_one_line_naming_the_file(tmp_path, launch, reference):
    folder = tmp_path / "run"
    (folder / "states").mkdir(parents=True)
    path = folder / "states" / "iter-002.pt.gz"
    shutil.copyfile(reference["folder"] / "states" / "iter-002.pt.gz", path)
    flip_bit(path, path.stat().st_size - 6)  # the CRC32 trailer
    run = launch(folder, "--resume-from", str(path))
    run.proc.wait(timeout=300)
    output = run.output()
    assert run.proc.returncode == 2 and "Traceback" not in output, output
    assert output.strip().startswith("error: ") and str(path) in output, output


@pytest.mark.parametrize("where", ["crc32 trailer", "size trailer"])
def test_a_flipped_bit_in_a_segment_trailer_is_refused_naming_the_file(tmp_path, reference, where):
    path = copy_segments(reference, tmp_path / "run")
    size = path.stat().st_size
    flip_bit(path, size - 6 if where == "crc32 trailer" else size - 2)
    with pytest.raises(ArtifactError, match=f"{path} is not a complete gzip file"):
        grpo.read_rollouts(path.parent)


def test_every_flipped_bit_in_a_segment_is_refused_naming_the_file_or_harmless(tmp_path, reference):
    """One bit of each byte in turn.  A flip that leaves the data as it was is harmless (bytes 4-9
    of the gzip header: mtime, flags, OS; the padding bits after deflate's last block): the rows
    read back unchanged.  Any flip that changes what is read must be refused, naming the file."""
    path = copy_segments(reference, tmp_path / "run")
    clean = path.read_bytes()
    for position in range(len(clean)):
        path.write_bytes(clean)
        flip_bit(path, position)
        try:
            rows = grpo.read_rollouts(path.parent)
        except ArtifactError as err:
            assert str(path) in str(err), (position, err)
        else:
            assert rows == reference["rows"], f"a flip at byte {position} changed the rows and was read back"


def test_a_truncated_segment_is_refused_naming_the_file(tmp_path, reference):
    path = copy_segments(reference, tmp_path / "run")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=f"{path} is not a complete gzip file"):
        grpo.read_rollouts(path.parent)


def test_a_missing_segment_is_refused_naming_the_next_one(tmp_path, reference):
    path = copy_segments(reference, tmp_path / "run")
    path.unlink()  # iteration 2's rollouts
    with pytest.raises(ArtifactError, match="rollouts-003-003.jsonl.gz: starts at iteration 3, but the segments "
                                            "before it end at 1"):
        grpo.read_rollouts(path.parent)
