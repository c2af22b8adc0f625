"""`python -m labkit all --rebuild-stale`: what it moves aside before rebuilding (no step is run here)."""

from __future__ import annotations

from labkit.lab import cache
from labkit import pipeline, steps


def fake_cache(monkeypatch, tmp_path, stale: set[str]):
    for step in steps.STEPS:
        (tmp_path / step.folder).mkdir(parents=True, exist_ok=True)
    verdicts = {s.name: {"status": "stale" if s.name in stale else "fresh", "changed": ["labkit/x.py"] if s.name in stale else []}
                for s in steps.STEPS}
    monkeypatch.setattr(cache, "runs_dir", lambda preset: tmp_path)
    monkeypatch.setattr(cache, "check", lambda steps, preset: verdicts)


def test_a_stale_step_and_everything_built_from_it_are_moved_aside(monkeypatch, tmp_path, capsys):
    fake_cache(monkeypatch, tmp_path, {"sft"})
    moved = pipeline.move_stale_aside("tiny")
    assert [name for name, _ in moved] == ["sft", "evaluation", "group_size", "reward_model", "overoptimisation"]
    assert not (tmp_path / "sft").exists() and (tmp_path / "warm_start").is_dir() and (tmp_path / "base").is_dir()
    assert all(aside.parent.parent == tmp_path / "stale" for _, aside in moved) and all(a.is_dir() for _, a in moved)
    assert "sft is stale (labkit/x.py); moving sft to" in capsys.readouterr().out


def test_only_leaves_a_stale_step_it_will_not_rebuild_in_place(monkeypatch, tmp_path, capsys):
    """A stale base moved aside by a run that only rebuilds later steps would leave them nothing to start from."""
    fake_cache(monkeypatch, tmp_path, {"base", "grpo"})
    moved = pipeline.move_stale_aside("tiny", only=("grpo", "evaluation"))
    assert [name for name, _ in moved] == ["grpo", "evaluation"]
    assert (tmp_path / "base").is_dir() and (tmp_path / "warm_start").is_dir() and not (tmp_path / "grpo").exists()
    out = capsys.readouterr().out
    assert "base is stale (labkit/x.py); left in place: not in --only" in out
    assert "warm_start is stale (built from a stale step); left in place" in out


def test_a_failed_step_stops_the_rebuild_in_one_line_keeping_the_steps_before_it(monkeypatch, tmp_path):
    import subprocess

    import pytest

    from labkit.lab.errors import CommandFailed

    fake_cache(monkeypatch, tmp_path, set())
    monkeypatch.setattr(pipeline, "_done", lambda preset, step: False)
    ran = []
    monkeypatch.setattr(pipeline.subprocess, "run", lambda command, cwd: ran.append(command[3])
                        or subprocess.CompletedProcess(command, 0 if command[3] == "pretrain" else 3))
    with pytest.raises(CommandFailed, match=r"^step warm_start failed \(`python -m labkit warm-start --preset tiny --restart` exited "
                                            r"3\); the steps before it are kept$"):
        pipeline.run_all("tiny", only=("base", "warm_start", "sft"))
    assert ran == ["pretrain", "warm-start"]
