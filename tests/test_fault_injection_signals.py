"""Fault injection, Ctrl-C at its worst moments (issue 58): a second Ctrl-C while a state is written, and a run
stopped after its final state.  Apart from tests/test_fault_injection.py, whose helpers and continuous run it uses,
so that `make test`'s workers run the two files side by side (pytest-xdist gives each file to one worker)."""

import os
import signal
from pathlib import Path

import pytest

from labkit.grpo import loop
from labkit.lab import state as state_lib
from test_fault_injection import N, assert_equals_continuous, in_process, reference  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow  # as tests/test_fault_injection.py: `make test-slow`


def test_a_second_ctrl_c_while_a_state_is_written_leaves_that_state_whole(tmp_path, capsys, monkeypatch, reference):
    """Issue 58, item 4: a first Ctrl-C makes iteration 2's autosave due; a second one arrives while that state
    is being written.  The write finishes first, the run stops at that state, and --resume continues from it
    to the continuous run's end (before: a torch traceback, the state lost, --resume refused)."""
    from labkit.lab import skeleton

    decide, save = skeleton.Autosave.due, state_lib.save_state

    def ctrl_c_while_iteration_2_ends(self, done):
        if done == 2:
            self.interrupt.requested = True  # the first Ctrl-C, as DeferredInterrupt's handler records it
        return decide(self, done)

    def second_ctrl_c_inside_the_write(path, *args, **kwargs):
        if Path(path).name == "iter-002.pt.gz":
            os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, delivered to the run's own handler
        return save(path, *args, **kwargs)

    monkeypatch.setattr(skeleton.Autosave, "due", ctrl_c_while_iteration_2_ends)
    monkeypatch.setattr(state_lib, "save_state", second_ctrl_c_inside_the_write)
    folder = tmp_path / "run"
    assert in_process(folder) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"interrupted: interrupted after iteration 2: its state is {folder / 'states' / 'iter-002.pt.gz'}; "
                    "continue with the same command and --resume"), last
    state_lib.load_state(folder / "states" / "iter-002.pt.gz")  # whole: it loads
    monkeypatch.undo()
    assert in_process(folder, "--resume") == 0
    assert_equals_continuous(folder, reference)


def test_resuming_from_the_final_state_says_no_iteration_was_left(tmp_path, capsys, monkeypatch, reference):
    """Issue 58, item 11: a run stopped after its final state, before its finish, resumed: it printed
    "iterations 5..4"."""
    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    folder = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.setattr(loop, "finish_run", stopped)
        assert in_process(folder) == 130
    assert in_process(folder, "--resume") == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith(f"GRPO: no iteration left after iteration {N} (resumed from the final state) in "), out
    assert_equals_continuous(folder, reference)
