"""The over-optimisation step's GRPO settings are runs like every other (issue 58, item 1): a stop leaves a
state, a rerun is refused until --resume or --restart (before any work, by setting), and a resumed setting
is the uninterrupted one, bit for bit."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest

from labkit.grpo import loop as grpo_loop
from labkit.grpo.loop import ROLLOUTS_PART
from labkit.lab.runs import RunFolder, UnfinishedRunError, read_json
from labkit.lab.skeleton import Interrupted
from labkit.studies import overoptimisation as oo

COMMITTED_ROOT = oo.root  # the committed proxies, which the slow test's runs optimise

@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """The step's folders under tmp_path (the committed proxies are still read from the cache)."""
    monkeypatch.setattr(oo, "root", lambda preset="tiny": tmp_path / "step")
    monkeypatch.setattr(oo, "grpo_dir", lambda preset, setting: tmp_path / "grpo" / setting)
    monkeypatch.setattr(oo, "setting_file", lambda preset, setting: tmp_path / "settings" / f"{setting}.jsonl.gz")
    return tmp_path


def _leave_an_attempt(folder_path) -> None:
    """What a killed setting leaves: some rollouts in the ledger, no state."""
    folder = RunFolder(folder_path).open_for_writing()
    folder.append(ROLLOUTS_PART, [{"id": "g8-it001-p000-0", "iteration": 1}])
    folder.release()


def test_an_unfinished_setting_is_refused_by_name_before_any_work(elsewhere):
    _leave_an_attempt(elsewhere / "grpo" / "base_10-kl")
    with pytest.raises(UnfinishedRunError, match=r"base_10-kl holds an unfinished attempt \(1 rollouts, no state\): "
                                                 r"pass --resume .* or --restart"):
        oo.run_all("tiny", workers=1, progress=False)
    assert not (elsewhere / "step").exists()  # no proxy fitted, no best-of-n drawn: nothing was touched
    with pytest.raises(ValueError, match="pass one of them"):
        oo.run_all("tiny", resume=True, restart=True)


def test_resume_without_a_saved_state_says_restart(elsewhere):
    _leave_an_attempt(elsewhere / "grpo" / "base_10-kl")
    with pytest.raises(UnfinishedRunError, match=r"1 rollouts, no state\) but no saved state to resume from: pass "
                                                 r"--restart"):
        oo.run_setting(oo.get_setting("base_10-kl"), resume=True)


@pytest.mark.slow
def test_a_stopped_setting_resumes_to_the_uninterrupted_one(elsewhere, monkeypatch):
    setting = replace(oo.get_setting("base_10-kl"), iterations=2)
    monkeypatch.setattr(oo, "root", COMMITTED_ROOT)
    monkeypatch.setattr(oo.ValidationCurves, "measure", lambda self, iteration: {"iteration": iteration})  # no curves
    oo.run_setting(setting)
    continuous = read_json(elsewhere / "grpo" / setting.name / "manifest.json")["final_digest"]
    monkeypatch.setattr(oo, "grpo_dir", lambda preset, name: elsewhere / "stopped" / name)
    monkeypatch.setattr(oo, "setting_file", lambda preset, name: elsewhere / "stopped" / f"{name}.jsonl.gz")
    original = grpo_loop.run_iteration

    def iteration_then_ctrl_c(loop, iteration, sampler):
        out = original(loop, iteration, sampler)
        if iteration == 0:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: the run stops after this iteration, with its state
        return out

    monkeypatch.setattr(grpo_loop, "run_iteration", iteration_then_ctrl_c)
    with pytest.raises(Interrupted, match=r"after iteration 1: its state is .*iter-001\.pt\.gz; continue with the "
                                          r"same command and --resume"):
        oo.run_setting(setting)
    monkeypatch.setattr(grpo_loop, "run_iteration", original)
    with pytest.raises(UnfinishedRunError, match="pass --resume"):
        oo.run_setting(setting)
    record = oo.run_setting(setting, resume=True)
    assert record["run"]["final_digest"] == continuous
