"""A thinking base is a run like every other (issue 58, item 1): a stop leaves a state, a rerun is refused
until --resume or --restart, and a resumed base is the uninterrupted one, bit for bit.  On a phase of six
updates from the committed base, with one chain per k to measure on."""

from __future__ import annotations

import os
import signal

import pytest

from labkit.config import ThinkingBaseConfig, ThinkingPhase
from labkit.lab.runs import UnfinishedRunError, read_json, sha256_file
from labkit.lab.skeleton import Interrupted
from labkit.studies import thinking_base

CFG = ThinkingBaseConfig(phases=(ThinkingPhase("tiny_phase", "committed", 6, 0.5, 3e-4, 3e-4),), measure_every=3,
                         profile_draws=1, rows_per_step=2)


@pytest.fixture
def small(tmp_path, monkeypatch):
    """Bases built under tmp_path/<continuous|stopped>, measured on one chain per k."""
    monkeypatch.setattr(thinking_base, "PROFILE_CHAINS_PER_K", 1)
    monkeypatch.setattr(thinking_base, "MEASURE_CHAINS_PER_K", 1)
    where = {"root": tmp_path / "continuous"}
    monkeypatch.setattr(thinking_base, "default_run_dir", lambda preset, name: where["root"] / name)
    return where


def _files(folder):
    return {name: sha256_file(folder / name) for name in ("model.safetensors", "log.json", "profile.json.gz")}


def test_a_stopped_base_is_refused_until_resume_and_then_equals_the_uninterrupted_one(small, tmp_path):
    thinking_base.build_base("tiny_phase", cfg=CFG, progress=False)
    continuous = _files(tmp_path / "continuous" / "tiny_phase")
    small["root"] = tmp_path / "stopped"
    stopped = thinking_base.build_base("tiny_phase", cfg=CFG, stop_after=2, progress=False)
    assert stopped["stopped_after"] == 2 and stopped["state"].endswith("states/update-00002.pt.gz")
    with pytest.raises(UnfinishedRunError, match=r"a state after 2 updates\): pass --resume .* or --restart"):
        thinking_base.build_base("tiny_phase", cfg=CFG, progress=False)
    manifest = thinking_base.build_base("tiny_phase", cfg=CFG, resume=True, progress=False)
    folder = tmp_path / "stopped" / "tiny_phase"
    assert manifest["resumed_from"] == "update-00002.pt.gz" and _files(folder) == continuous
    assert not list(folder.glob("states/*.pt.gz"))  # the autosaves go once the base is finished
    assert read_json(folder / "manifest.json")["documents"] == \
        read_json(tmp_path / "continuous" / "tiny_phase" / "manifest.json")["documents"]


def test_ctrl_c_saves_a_state_names_the_command_and_restart_starts_afresh(small, tmp_path, monkeypatch):
    original = thinking_base.PhaseRun.update

    def update_then_ctrl_c(self):
        row = original(self)
        if self.done == 3:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: the run stops after this update, with its state
        return row

    monkeypatch.setattr(thinking_base.PhaseRun, "update", update_then_ctrl_c)
    with pytest.raises(Interrupted, match=r"after update 3: its state is .*update-00003\.pt\.gz; continue with "
                                          r"the same command and --resume"):
        thinking_base.build_base("tiny_phase", cfg=CFG, progress=False)
    monkeypatch.setattr(thinking_base.PhaseRun, "update", original)
    manifest = thinking_base.build_base("tiny_phase", cfg=CFG, restart=True, progress=False)
    assert manifest["resumed_from"] is None and manifest["steps"] == 6


def test_a_state_of_another_setting_is_refused_by_name(small, tmp_path):
    thinking_base.build_base("tiny_phase", cfg=CFG, stop_after=2, progress=False)
    other = ThinkingBaseConfig(phases=(ThinkingPhase("tiny_phase", "committed", 6, 0.25, 3e-4, 3e-4),),
                               measure_every=3, profile_draws=1, rows_per_step=2)
    with pytest.raises(ValueError, match=r"belongs to another thinking base or setting: identity fields \['phase'\]"):
        thinking_base.build_base("tiny_phase", cfg=other, resume=True, progress=False)


def test_the_bases_run_in_waves_each_after_the_base_it_continues():
    cfg = thinking_base.ThinkingBaseConfig()
    assert thinking_base.waves(["skill", "rare_0", "rare_2", "rare_10", "control"], cfg, set()) == \
        [["skill", "control"], ["rare_0", "rare_2", "rare_10"]]
    assert thinking_base.waves(["rare_2"], cfg, {"skill"}) == [["rare_2"]]
    with pytest.raises(ValueError, match=r"continue bases that are neither built nor asked for: \['skill'\]"):
        thinking_base.waves(["rare_2"], cfg, set())
