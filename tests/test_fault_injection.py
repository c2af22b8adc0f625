"""Fault injection: a GRPO run folder survives a real `kill -9` and a resume in place.

Every run here is a real process running the `labkit grpo` command (tiny preset, one torch
thread, the committed warm start: the CLI takes no start file), killed with a real SIGKILL, so
no Python clean-up code runs: forked from a server that imported the lab once
(tests/forked_cli.py), except the continuous reference run, a `python -m labkit` of its own.
After each kill the run resumes in the *same* folder from the newest state that loads, and
must end exactly where a continuous run ends: the same final model, the same history, and a
rollouts.jsonl.gz byte-identical to the continuous run's: every rollout once.

Kill points are chosen by waiting for files, never by sleeping alone:

    between iterations        the state of iteration k is in place
    mid-iteration             a fixed 0.1 s after the state of iteration k (an iteration takes ~0.7 s)
    rows, no state            the ledger (parts.json) counts iteration k's rows, its state not yet
    inside an append          iteration k's rows are written past the ledger, not yet synced: that
                              process holds os.fsync on rollouts.jsonl.gz
    a state being written     the temporary `.iter-00k.pt.gz.*.tmp` (held the same way: it lives
                              only 5-30 ms, too short to catch by polling)
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

from forked_cli import ForkedProcess
from labkit.grpo import loop
from labkit.lab import state as state_lib
from labkit.lab.runs import REPO_ROOT, ArtifactError, is_finished, read_json, sha256_file

# The whole file is `make test-slow`'s (CI runs it after `make test`): its runs are real processes killed with
# SIGKILL and SIGINT, 137 s of a loaded unit phase on 2026-12-07.  `make test` keeps each guarantee's in-process
# twin in tests/test_grpo.py (a killed run resumed in place keeps every rollout once, a state with a flipped bit
# refused by its ledger, a resume equal to the continuous run) and tests/test_reasoning_loop.py (Ctrl-C).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL and /proc/self/fd: Linux")]

N = 4  # iterations of every run here (~1 s each, plus ~4 s of imports for a `python -m labkit` process)
ROWS_PER_ITERATION = 16  # 4 prompts x G=4
EVERY_ITERATION = ",".join(str(k) for k in range(1, N))  # the last one is always saved
# The fast sampler (its tokens are the reference sampler's: tests/test_sampling.py) and curves on 4
# fixed problems instead of 64: a run then takes ~15 s instead of ~40, with every file a run writes.
CLI = [sys.executable, "-m", "labkit", "grpo", "--preset", "tiny", "--threads", "1", "--no-progress",
       "--iterations", str(N), "--sampler", "fast", "--checkpoint-problems", "4"]
WAIT_S = 180  # the longest wait for a file before the test fails (a run takes ~10 s)

# -- processes -----------------------------------------------------------------------------------


class Run:
    """One `labkit grpo` (or `cli`'s command) child process writing into `folder`, its output in a log file.

    A forked child of the lab's preloaded server (tests/forked_cli.py: a real process, without the
    3 to 6 s of imports), or with `fresh` a `python -m labkit` process of its own.  hold_fsync: the
    child holds os.fsync forever on the first file whose name starts with it (after letting `skip`
    such fsyncs through): its bytes are written, not yet synced or renamed into place, when the
    test kills it."""

    def __init__(self, folder: Path, log: Path, args: list[str], hold_fsync: str | None = None, skip: int = 0,
                 cli: list[str] = CLI, fresh: bool = False):
        self.folder, self.log = folder, log
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("LABKIT_TRACEBACK", None)
        command = cli + ["--run-dir", str(folder), *args]
        self.mark, self.hold = None, hold_fsync
        if hold_fsync is not None:
            self.mark = log.with_suffix(".held")
        if fresh:
            assert hold_fsync is None, "a held fsync needs a forked run"
            with open(log, "wb") as out:
                # SIGINT as a terminal gives it: pytest-xdist's workers ignore SIGINT, and an ignored signal
                # is inherited (Python then installs no KeyboardInterrupt for it)
                self.proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        else:
            hold = (hold_fsync, str(self.mark), skip) if hold_fsync is not None else None
            self.proc = ForkedProcess(command[3:], log, REPO_ROOT, env, hold)  # drop "python -m labkit"

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

    def start(folder: Path, *args: str, hold_fsync: str | None = None, skip: int = 0, cli: list[str] = CLI,
              fresh: bool = False) -> Run:
        run = Run(folder, tmp_path / f"run-{len(started)}.log", list(args), hold_fsync, skip, cli, fresh)
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


def ledger_rows(folder: Path, part: str = "rollouts.jsonl.gz") -> int:
    """The rows the unfinished run's ledger counts in `part` (0 before its first append)."""
    try:
        return read_json(folder / "parts.json")["parts"].get(part, {}).get("rows", 0)
    except (FileNotFoundError, ArtifactError):  # not yet written
        return 0


def cut_or_removed(output: str) -> list[str]:
    """The files a resume reported cutting back or removing."""
    found = re.search(r"removed or cut \d+ file\(s\) of an earlier, unfinished attempt \(([^)]*)\)", output)
    return found.group(1).split(", ") if found else []


def assert_equals_continuous(folder: Path, reference: dict) -> None:
    """Finished, same final model and history, and exactly the continuous run's rollouts, each once."""
    assert is_finished(folder)
    manifest = read_json(folder / "manifest.json")
    assert manifest["final_digest"] == reference["manifest"]["final_digest"]
    assert sha256_file(folder / "model.safetensors") == reference["model_sha256"]
    assert manifest["rollouts"] == N * ROWS_PER_ITERATION and manifest["updates"] == 2 * N
    assert read_json(folder / "history.json") == reference["history"]
    rows = loop.read_rollouts(folder)
    ids = [r["rollout_id"] for r in rows]
    assert len(ids) == len(set(ids)) == N * ROWS_PER_ITERATION
    assert [r["iteration"] for r in rows] == [k for k in range(1, N + 1) for _ in range(ROWS_PER_ITERATION)]
    assert rows == reference["rows"]
    assert (folder / "rollouts.jsonl.gz").read_bytes() == (reference["folder"] / "rollouts.jsonl.gz").read_bytes()
    # every iteration's timings once
    assert [t["iteration"] for t in loop.read_timings(folder)] == list(range(1, N + 1))
    assert all(iteration_of(p) <= N for p in (folder / "states").glob("iter-*.pt.gz"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The continuous run: N iterations, a state after each, never interrupted."""
    folder = tmp_path_factory.mktemp("continuous") / "run"
    run = Run(folder, folder.parent / "run.log", ["--save-states-at", EVERY_ITERATION], fresh=True)
    try:
        run.finish()
    finally:
        if run.proc.poll() is None:
            os.kill(run.proc.pid, signal.SIGKILL)
            run.proc.wait(timeout=60)
    rows = loop.read_rollouts(folder)
    assert len(rows) == N * ROWS_PER_ITERATION and len({r["rollout_id"] for r in rows}) == len(rows)
    return {
        "folder": folder,
        "manifest": read_json(folder / "manifest.json"),
        "history": read_json(folder / "history.json"),
        "rows": rows,
        "model_sha256": sha256_file(folder / "model.safetensors"),
    }


# -- 1. kill -9 between iterations --------------------------------------------------------------------


@pytest.mark.slow  # 14 s: `make test-slow`; make test keeps its in-process twin (test_grpo.py's killed run resumed in place)
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


@pytest.mark.slow  # about 40 s: `make test-slow`, run by CI after `make test`
def test_repeated_kills_at_awkward_moments_then_resume_in_place(tmp_path, launch, reference):
    folder = tmp_path / "run"
    states = "--save-states-at", EVERY_ITERATION

    # a. mid-iteration: 0.1 s into iteration 2 (an iteration takes ~0.7 s here), nothing of it is on disk yet
    run = launch(folder, *states)
    run.wait_for_file("states/iter-001.pt.gz")
    time.sleep(0.1)
    run.kill9()
    assert ledger_rows(folder) == ROWS_PER_ITERATION, "the kill came after iteration 2's rows were written"
    state = newest_loadable_state(folder)
    assert iteration_of(state) == 1

    # b. iteration 2's rows are appended and counted, its state not yet written
    run = launch(folder, *states, "--resume-from", str(state))
    run.wait_for("iteration 2's rows in the ledger", lambda: ledger_rows(folder) == 2 * ROWS_PER_ITERATION)
    run.kill9()
    assert not (folder / "states" / "iter-002.pt.gz").exists(), "the kill came after the state was written"
    state = newest_loadable_state(folder)
    assert iteration_of(state) == 1

    # c. inside the append of iteration 2's rows: written past the ledger, not yet synced (the first
    #    fsync of the file is the resume's own, when it cuts b's rows back: it is let through)
    run = launch(folder, *states, "--resume-from", str(state), hold_fsync="rollouts.jsonl.gz", skip=1)
    run.wait_until_held()
    run.kill9()
    assert "rollouts.jsonl.gz" in cut_or_removed(run.output()), run.output()  # b's iteration 2, cut back
    listed = read_json(folder / "parts.json")["parts"]["rollouts.jsonl.gz"]
    assert listed["rows"] == ROWS_PER_ITERATION and (folder / "rollouts.jsonl.gz").stat().st_size > listed["bytes"]
    state = newest_loadable_state(folder)
    assert iteration_of(state) == 1

    # d. while the state of iteration 3 is being written (its bytes in the temporary file, not renamed)
    run = launch(folder, *states, "--resume-from", str(state), hold_fsync=".iter-003.pt.gz.")
    held = run.wait_until_held()
    run.kill9()
    assert "rollouts.jsonl.gz" in cut_or_removed(run.output()), run.output()  # c's unsynced tail, cut off
    assert (folder / "states" / held).stat().st_size > 0
    assert not (folder / "states" / "iter-003.pt.gz").exists()
    assert ledger_rows(folder) == 3 * ROWS_PER_ITERATION  # the rows go before their state
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


@pytest.mark.slow  # about 25 s: `make test-slow`
def test_a_fresh_start_after_stop_after_leaves_no_duplicate_rollouts(tmp_path, launch, reference):
    folder = tmp_path / "run"
    launch(folder, "--stop-after", "2", "--save-states-at", "1").finish()
    assert ledger_rows(folder) == 2 * ROWS_PER_ITERATION
    assert (folder / "stopped-at-002.json").exists() and not is_finished(folder)

    # a rerun that names neither --resume nor --restart is refused in one line, deleting nothing
    refused = launch(folder, "--save-states-at", EVERY_ITERATION)
    assert refused.proc.wait(timeout=WAIT_S) == 2
    assert refused.output().strip().splitlines()[-1].endswith(
        f"holds an unfinished attempt ({2 * ROWS_PER_ITERATION} rollouts, newest state states/iter-002.pt.gz): "
        "pass --resume to continue "
        "from its newest state, or --restart to delete it and start afresh"), refused.output()
    assert names(folder, "states/*") == ["iter-001.pt.gz", "iter-002.pt.gz"]

    output = launch(folder, "--save-states-at", EVERY_ITERATION, "--restart").finish()  # from scratch
    assert sorted(cut_or_removed(output)) == ["checkpoints.jsonl", "parts.json", "rollouts.jsonl.gz",
                                              "states/iter-001.pt.gz", "states/iter-002.pt.gz", "stopped-at-002.json",
                                              "timings.jsonl.gz"]
    assert_equals_continuous(folder, reference)
    assert names(folder, "states/*") == names(reference["folder"], "states/*")
    assert names(folder, "stopped-at-*") == []


# -- 4. corrupted files are refused, naming the file -------------------------------------------------------


def flip_bit(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << (position % 8)
    path.write_bytes(bytes(data))


def copy_run(reference: dict, folder: Path) -> Path:
    """A copy of the finished run's rollouts with the manifest and marker that list them."""
    folder.mkdir()
    for name in ("rollouts.jsonl.gz", "manifest.json", "FINISHED"):
        shutil.copyfile(reference["folder"] / name, folder / name)
    return folder / "rollouts.jsonl.gz"


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


def flip_positions(size: int, stride: int = 53) -> list[int]:
    """Every byte of a gzip file's first 64 (the header: magic, flags, mtime, the stored name; the
    deflate stream's first block header) and last 24 (the stream's end, whose padding bits gzip never
    reads, the CRC32 and the size), and every `stride`-th byte between them."""
    return sorted(set(range(min(64, size))) | set(range(max(0, size - 24), size)) | set(range(64, size - 24, stride)))


def test_flip_positions_cover_both_ends_and_sample_the_middle():
    assert flip_positions(200, stride=50) == [*range(64), 64, 114, 164, *range(176, 200)]
    assert flip_positions(40) == list(range(40))  # a short file: every byte


def test_every_flipped_bit_in_the_rollouts_is_refused_naming_the_file(tmp_path, reference):
    """One bit of each byte in turn, every byte of the header and of the end, a sample of the deflate
    data between them: the ledger's digest refuses every one, even those that gzip itself would read
    back unchanged (the header's mtime and flags, deflate's padding bits).  (Every byte once took 19 s
    of `make test`; the digest does not care where a bit flips.)"""
    path = copy_run(reference, tmp_path / "run")
    clean = path.read_bytes()
    for position in flip_positions(len(clean)):
        path.write_bytes(clean)
        flip_bit(path, position)
        with pytest.raises(ArtifactError, match=f"{path} has SHA-256 .* but the ledger recorded"):
            loop.read_rollouts(path.parent)
    path.write_bytes(clean)
    assert loop.read_rollouts(path.parent) == reference["rows"]


def test_truncated_or_missing_rollouts_are_refused_naming_the_file(tmp_path, reference):
    path = copy_run(reference, tmp_path / "run")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=f"{path} has SHA-256"):
        loop.read_rollouts(path.parent)
    path.unlink()
    with pytest.raises(ArtifactError, match=f"{path} is missing, but the ledger lists it with 64 rows"):
        loop.read_rollouts(path.parent)


@pytest.mark.slow  # 10 s: `make test-slow`; make test keeps test_grpo.py's flipped bit refused by the ledger
def test_a_state_whose_bytes_differ_from_the_ledger_is_refused_in_one_line(tmp_path, launch, reference):
    """A flip that gzip cannot see (the header's mtime byte): the ledger's digest still refuses it."""
    folder = tmp_path / "run"
    launch(folder, "--stop-after", "2", "--save-states-at", "1").finish()
    path = folder / "states" / "iter-001.pt.gz"
    flip_bit(path, 4)
    run = launch(folder, "--resume-from", str(path))
    run.proc.wait(timeout=300)
    output = run.output()
    assert run.proc.returncode == 2 and "Traceback" not in output, output
    assert output.strip().startswith(f"error: {path} has SHA-256") and "parts.json records" in output, output


# -- 5. two writers, links, Ctrl-C, a full disk (issue 27) ------------------------------------------------
#
# Only what needs a second process (a lock holder, a signal) starts one; the runs themselves go
# through the CLI in this process (`cli.main`), which costs no interpreter start-up.

HOLDER = textwrap.dedent("""
    import sys, time
    from labkit.lab.runs import hold_folder
    hold_folder(sys.argv[1])
    print("held", flush=True)
    time.sleep(3600)
""")


def in_process(folder: Path, *args: str) -> int:
    from labkit import cli

    return cli.main(CLI[3:] + ["--run-dir", str(folder), *args])


def test_a_second_writer_is_refused_at_once_and_a_killed_holder_leaves_no_lock(tmp_path, capsys, reference):
    folder = tmp_path / "run"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO_ROOT, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        assert in_process(folder, "--save-states-at", EVERY_ITERATION, "--restart") == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"error: {folder} is being written by another process (pid {holder.pid}); "
            "wait for it to end, or choose another folder"]
        assert sorted(p.name for p in folder.iterdir()) == [".lock"], "the refused run wrote nothing"
    finally:
        holder.kill()
        holder.wait(timeout=60)
    # the kernel released the killed holder's lock: the folder is free at once
    assert in_process(folder, "--save-states-at", EVERY_ITERATION) == 0
    assert_equals_continuous(folder, reference)


@pytest.mark.parametrize("spelling", ["link-as-folder", "link-in-state"])
def test_a_resume_that_names_the_folder_through_a_link_keeps_every_state(tmp_path, capsys, reference, spelling):
    target = tmp_path / "target"
    assert in_process(target, "--stop-after", "2", "--save-states-at", "1") == 0
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    folder, state = ((link, target / "states" / "iter-001.pt.gz") if spelling == "link-as-folder"
                     else (target, link / "states" / ".." / "states" / "iter-001.pt.gz"))
    capsys.readouterr()
    assert in_process(folder, "--save-states-at", EVERY_ITERATION, "--resume-from", str(state)) == 0
    assert "states/iter-001.pt.gz" not in cut_or_removed(capsys.readouterr().out)
    assert (target / "states" / "iter-001.pt.gz").is_file(), "the state resumed from is never deleted"
    assert_equals_continuous(target, reference)


def test_a_ctrl_c_heard_just_after_the_autosave_decision_still_stops_at_a_saved_state(tmp_path, capsys, monkeypatch):
    """The Ctrl-C of the test below, at its worst moment, made deterministic: heard while iteration 2 ends,
    just after the skeleton decided not to autosave.  The run must still stop at a state it saved."""
    from labkit.lab import skeleton

    decide = skeleton.Autosave.due

    def ctrl_c_after_deciding(self, done):
        answer = decide(self, done)
        if done == 2:
            self.interrupt.requested = True  # what DeferredInterrupt's handler does on a first Ctrl-C
        return answer

    monkeypatch.setattr(skeleton.Autosave, "due", ctrl_c_after_deciding)
    assert in_process(tmp_path / "run") == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    found = re.fullmatch(r"interrupted: interrupted after iteration (\d): its state is (\S+); continue with the "
                         r"same command and --resume", last)
    assert found and Path(found.group(2)).is_file(), last


def test_ctrl_c_with_the_default_options_saves_a_state_and_says_how_to_resume(tmp_path, launch, reference):
    folder = tmp_path / "run"
    run = launch(folder)  # no --save-states-at: only the run's own saves
    run.wait_for("iteration 2's rows", lambda: ledger_rows(folder) >= 2 * ROWS_PER_ITERATION)
    # Ctrl-C as a person presses it, in the middle of an iteration's work (iteration 3's, ~1 s long); the
    # test above covers the moment just after an autosave decision.
    time.sleep(0.2)
    run.proc.send_signal(signal.SIGINT)
    assert run.proc.wait(timeout=WAIT_S) == 130, run.output()
    last = run.output().strip().splitlines()[-1]
    found = re.fullmatch(r"interrupted: interrupted after iteration (\d): its state is (\S+); continue with the "
                         r"same command and --resume", last)
    assert found, run.output()
    k = int(found.group(1))
    assert 2 <= k < N and Path(found.group(2)) == folder / "states" / f"iter-{k:03d}.pt.gz"
    assert ledger_rows(folder) == k * ROWS_PER_ITERATION
    assert in_process(folder, "--resume") == 0
    assert_equals_continuous(folder, reference)
    # the interrupted attempt's state stays (the manifest names it as resumed from), and the last one
    assert names(folder, "states/*") == [f"iter-{k:03d}.pt.gz", f"iter-{N:03d}.pt.gz"]
    assert read_json(folder / "manifest.json")["resumed_from"] == str(folder / "states" / f"iter-{k:03d}.pt.gz")


@pytest.fixture
def small_filesystem(tmp_path):
    """A 3 MB tmpfs the test mounts (root on Linux), unmounted afterwards; skipped where the OS refuses
    (tests/test_cli_errors.py simulates ENOSPC at the state's write everywhere)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here ({made.stderr.decode().strip()}); "
                    "the simulated ENOSPC test covers the message")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_ends_the_run_in_one_line_naming_the_file(small_filesystem, capsys):
    folder = small_filesystem / "run"
    assert in_process(folder) == 2  # the run's last state (about 11 MB) cannot fit in 3 MB
    err = capsys.readouterr().err
    assert re.fullmatch(rf"error: {re.escape(str(folder))}/\S+: no space left on device", err.strip()), err
    assert not list(folder.rglob("*.tmp")), "the half-written file was removed"


def test_a_second_thread_of_one_process_cannot_write_where_the_first_does(tmp_path):
    """Issue 58, item 1: a Dask worker runs tasks in threads of one process; a rerun's task landed beside the
    first one's, and the folder's lock, held by the process, let the second writer in."""
    import threading

    from labkit.lab.runs import RunFolderBusyError, hold_folder, release_folder

    folder = tmp_path / "run"
    folder.mkdir()
    hold_folder(folder)
    hold_folder(folder)  # the holding thread may take it again
    refused = []

    def second_writer():
        try:
            hold_folder(folder)
        except RunFolderBusyError as err:
            refused.append(str(err))

    thread = threading.Thread(target=second_writer)
    thread.start()
    thread.join()
    release_folder(folder)
    assert refused and "another thread of this process" in refused[0]
    thread = threading.Thread(target=lambda: (hold_folder(folder), release_folder(folder)))  # free again: taken
    thread.start()
    thread.join()
