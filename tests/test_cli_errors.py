"""A user's mistake gets one line that names the value and the rule, and nothing is written."""

from __future__ import annotations

import pytest

from labkit import cli
from labkit.runs import REPO_ROOT, sha256_file

GRPO_RUN = REPO_ROOT / "runs" / "tiny" / "grpo"


@pytest.mark.parametrize("argv, message", [
    (["grpo", "--iterations", "0", "--stop-after", "0"], "iterations 0: must be at least 1"),
    (["grpo", "--iterations", "-3"], "iterations -3: must be at least 1"),
    (["grpo", "--group-size", "0"], "group_size 0: a group needs at least 2 responses"),
    (["grpo", "--group-size", "-2"], "group_size -2: a group needs at least 2 responses"),
    (["grpo", "--iterations", "5", "--stop-after", "9"], "stop_after 9: must lie in 1..5"),
    (["grpo", "--threads", "0"], "--threads 0: must be at least 1"),
    (["warm-start", "--validation-limit", "-5"], "--validation-limit -5: must be at least 1"),
    (["pretrain", "--preset", "nosuch"], "only the tiny preset is pretrained"),
    (["all", "--only", "grpo_resme"], "--only grpo_resme: no step called grpo_resme; the steps are data, base,"),
])
def test_bad_options_are_refused_in_one_line(tmp_path, capsys, argv, message):
    if argv[0] == "grpo":
        argv = argv + ["--run-dir", str(tmp_path / "run")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "rollouts.jsonl.gz").exists()


def test_a_finished_run_is_refused_even_through_a_missing_folder(capsys):
    before = {p.name: sha256_file(p) for p in GRPO_RUN.iterdir() if p.is_file()}
    assert cli.main(["grpo", "--run-dir", str(GRPO_RUN / "states" / ".."), "--iterations", "1"]) == 2
    assert "holds a finished run" in capsys.readouterr().err
    assert {p.name: sha256_file(p) for p in GRPO_RUN.iterdir() if p.is_file()} == before


def test_a_missing_or_wrong_state_file_is_named(tmp_path, capsys):
    assert cli.main(["grpo", "--run-dir", str(tmp_path / "run"), "--resume-from", str(tmp_path / "none.pt.gz")]) == 2
    assert "no such state file" in capsys.readouterr().err
    assert cli.main(["sampler-agreement", "--state", str(GRPO_RUN / "history.json"), "--limit", "1",
                     "--out", str(tmp_path / "agreement.json")]) == 2
    assert "is not a safetensors model file" in capsys.readouterr().err


def test_an_inference_output_given_to_learning_is_refused_in_one_line(tmp_path, capsys):
    """A copied evaluation folder (its manifest says "phase": "inference") used as a resume state."""
    copied = tmp_path / "my_copy"
    (copied / "states").mkdir(parents=True)
    evaluation = REPO_ROOT / "runs" / "tiny" / "evaluation" / "grpo"
    (copied / "manifest.json").write_bytes((evaluation / "manifest.json").read_bytes())
    (copied / "states" / "iter-001.pt.gz").write_bytes((evaluation / "predictions-greedy.jsonl.gz").read_bytes())
    assert cli.main(["grpo", "--run-dir", str(tmp_path / "run"), "--resume-from",
                     str(copied / "states" / "iter-001.pt.gz")]) == 2
    err = capsys.readouterr().err
    assert "it is an inference output" in err and len(err.strip().splitlines()) == 1


def test_a_flipped_bit_in_the_warm_start_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """sampler-agreement and grpo read the warm start: one line naming the file, both digests and the fix."""
    import shutil

    warm = tmp_path / "runs" / "tiny" / "warm_start"
    shutil.copytree(REPO_ROOT / "runs" / "tiny" / "warm_start", warm, ignore=shutil.ignore_patterns("states"))
    data = bytearray((warm / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x10
    (warm / "model.safetensors").write_bytes(bytes(data))
    assert cli.main(["sampler-agreement", "--state", str(warm / "model.safetensors"), "--limit", "1",
                     "--out", str(tmp_path / "agreement.json")]) == 2
    err = capsys.readouterr().err
    assert f"{warm / 'model.safetensors'} has SHA-256 {sha256_file(warm / 'model.safetensors')}" in err, err
    assert "python -m labkit warm-start --preset tiny --overwrite" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "agreement.json").exists()
