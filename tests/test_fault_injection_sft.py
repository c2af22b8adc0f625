"""Fault injection in the SFT loop: a real `kill -9` mid-epoch and during a state write, then a resume
in place; a state whose bytes differ from its ledger is refused in one line.

Apart from tests/test_fault_injection.py (whose processes and helpers it uses) so that `make test`'s
two workers can run the GRPO and the SFT halves side by side (pytest-xdist gives each file to one
worker).
"""

import sys
import time

import pytest

from labkit.lab import state as state_lib
from labkit.lab.runs import is_finished, read_json, sha256_file
from test_fault_injection import flip_bit, launch  # noqa: F401  (launch is a fixture)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL and /proc/self/fd: Linux")

# -- the SFT loop: kill -9 mid-epoch and during a state write, resume in place -----------------------

# The warm start (3 epochs of 16 updates) with a short validation, so each process takes ~10 s.
SFT_CLI = [sys.executable, "-m", "labkit", "warm-start", "--preset", "tiny", "--threads", "1", "--no-progress",
           "--validation-limit", "4", "--no-greedy-eval"]


@pytest.mark.slow  # about 45 s: `make test-slow`
def test_sft_killed_mid_epoch_and_during_a_state_write_resumes_to_the_continuous_run(tmp_path, launch):
    continuous = tmp_path / "continuous"
    launch(continuous, cli=SFT_CLI, fresh=True).finish()  # a `python -m labkit` of its own
    folder = tmp_path / "run"

    # a. 0.3 s into epoch 2 (an epoch takes ~2 s): only epoch 1's state is on disk
    run = launch(folder, cli=SFT_CLI)
    run.wait_for_file("states/epoch-1.pt.gz")
    time.sleep(0.3)
    run.kill9()
    assert sorted(p.name for p in (folder / "states").iterdir()) == ["epoch-1.pt.gz"]

    # b. while epoch 2's state is being written (bytes in the temporary file, not renamed)
    run = launch(folder, "--resume-from", str(folder / "states" / "epoch-1.pt.gz"), hold_fsync=".epoch-2.pt.gz.",
                 cli=SFT_CLI)
    held = run.wait_until_held()
    run.kill9()
    assert (folder / "states" / held).exists() and not (folder / "states" / "epoch-2.pt.gz").exists()

    # c. resumed from epoch 1 again: the temporary is removed, epochs 2 and 3 rerun
    output = launch(folder, "--resume-from", str(folder / "states" / "epoch-1.pt.gz"), cli=SFT_CLI).finish()
    assert f"(states/{held})" in output, output
    assert is_finished(folder)
    assert sha256_file(folder / "model.safetensors") == sha256_file(continuous / "model.safetensors")
    assert read_json(folder / "history.json") == read_json(continuous / "history.json")
    for epoch in (1, 2, 3):
        a, _ = state_lib.load_state(folder / "states" / f"epoch-{epoch}.pt.gz")
        b, _ = state_lib.load_state(continuous / "states" / f"epoch-{epoch}.pt.gz")
        assert state_lib.compare_states(a, b)["equal"], (epoch, state_lib.compare_states(a, b)["different_fields"][:8])
    assert sorted(p.name for p in (folder / "states").iterdir()) == ["epoch-1.pt.gz", "epoch-2.pt.gz", "epoch-3.pt.gz"]
    ledger = read_json(folder / "manifest.json")["ledger"]
    assert sorted(ledger["files"]) == ["history.json", "model.safetensors", "states/epoch-1.pt.gz",
                                       "states/epoch-2.pt.gz", "states/epoch-3.pt.gz"]


@pytest.mark.slow  # 38 s in `make test`'s unit phase (9 s alone): `make test-slow`
def test_sft_refuses_a_state_whose_bytes_differ_from_its_ledger(tmp_path, launch):
    folder = tmp_path / "run"
    launch(folder, "--stop-after-epochs", "1", cli=SFT_CLI).finish()
    path = folder / "states" / "epoch-1.pt.gz"
    flip_bit(path, 4)  # the gzip header's mtime: gzip itself would not notice
    run = launch(folder, "--resume-from", str(path), cli=SFT_CLI)
    run.proc.wait(timeout=300)
    output = run.output()
    assert run.proc.returncode == 2 and "Traceback" not in output, output
    assert output.strip().startswith(f"error: {path} has SHA-256"), output


@pytest.mark.slow  # 41 s in `make test`'s unit phase (11 s alone): `make test-slow`
def test_ctrl_c_in_sft_says_which_state_to_resume_from(tmp_path, launch):
    import re
    import signal
    from pathlib import Path

    folder = tmp_path / "run"
    run = launch(folder, cli=SFT_CLI)
    run.wait_for_file("states/epoch-1.pt.gz")
    # Ctrl-C, pressed again each second until the run stops: a SIGINT that lands just after a state
    # write is sometimes lost (about 1 in 6 here; the closing note of 2026-12-02 says so), as a
    # user would press again
    import time
    while run.proc.poll() is None:
        run.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 3.0
        while run.proc.poll() is None and "interrupted:" not in run.output() and time.monotonic() < deadline:
            time.sleep(0.01)
        if "interrupted:" in run.output():  # it was heard: let the process end on its own
            run.proc.wait(timeout=60)
    assert run.proc.returncode == 130, run.output()
    last = run.output().strip().splitlines()[-1]
    # the first Ctrl-C heard finishes the update and saves its state (labkit.lab.skeleton); a second one,
    # pressed before that, stops at once and names the newest state saved
    found = (re.fullmatch(r"interrupted: interrupted after update \d+: its state is (\S+); continue with the "
                          r"same command and --resume-from (\S+)", last)
             or re.fullmatch(r"interrupted: the newest state is (\S+): continue with the same command and "
                             r"--resume-from (\S+)", last))
    assert found and found.group(1) == found.group(2), run.output()
    state = Path(found.group(1))
    assert state.parent == folder / "states" and state.is_file() and "Traceback" not in run.output()
    launch(folder, "--resume-from", str(state), cli=SFT_CLI).finish()
    assert is_finished(folder)


def test_a_stop_during_sfts_final_stage_resumes_from_the_last_epochs_state(tmp_path, capsys, monkeypatch):
    """Issue 58, item 3: a Ctrl-C during the final greedy validation names the last epoch's state, and
    --resume-from that state finishes the run (it was refused: "nothing to do up to epoch 3")."""
    from labkit import cli
    from labkit.train import sft

    folder = tmp_path / "run"
    command = SFT_CLI[3:-1] + ["--run-dir", str(folder)]  # with the greedy validations, on 4 problems
    greedy, calls = sft.greedy_validation, []

    def ctrl_c_in_the_final_validation(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first is the start's, the second the end's
            raise KeyboardInterrupt
        return greedy(*args, **kwargs)

    monkeypatch.setattr(sft, "greedy_validation", ctrl_c_in_the_final_validation)
    assert cli.main(command) == 130
    state = folder / "states" / "epoch-3.pt.gz"
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(f"continue with the same command and --resume-from {state}"), last
    assert not is_finished(folder)
    monkeypatch.undo()
    assert cli.main(command + ["--resume-from", str(state)]) == 0
    assert is_finished(folder)
    manifest = read_json(folder / "manifest.json")
    assert manifest["status"] == "finished" and manifest["validation_greedy"]["problems"] == 4, manifest
