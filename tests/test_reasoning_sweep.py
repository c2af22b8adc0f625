"""A sweep of chapter 11's GRPO on worked answers (`"task": "worked"` in a sweep file, issue 56): each run
trained by the one GRPO loop with the worked task from its thinking base, evaluated by its own test profile,
named by its fingerprint, read and never rerun once finished; its results keep the think-rate curves and the
test profile.  Small settings (2 chains x G = 2, 2 iterations, 1 test chain per k) from the tiny warm start."""

import json

import pytest

from labkit.studies import sweep, thinking_base
from labkit.lab.runs import REPO_ROOT, RunFolder

WARM_START = REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"


def write(tmp_path, body: dict):
    path = tmp_path / "worked.json"
    path.write_text(json.dumps(body))
    return path


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(thinking_base, "MEASURE_CHAINS_PER_K", 1)
    monkeypatch.setattr(thinking_base, "PROFILE_CHAINS_PER_K", 1)


def test_a_worked_sweep_trains_each_run_once_and_keeps_its_curves_and_test_profile(tmp_path, small):
    path = write(tmp_path, {"task": "worked", "config": {"prompts_per_iteration": 2, "G": 2, "grpo_iterations": 2},
                            "runs": [{"name": "reference"}, {"name": "negative_only", "start": "rare_0",
                                                              "options": {"advantage_sign": "negative"}}]})
    assert sweep.load_task(path) == "worked" and sweep.load_starts(path) == {"reference": "rare_2",
                                                                            "negative_only": "rare_0"}
    specs = sweep.plan("tiny", sweep.load_runs(path), root=tmp_path / "runs", start_file=WARM_START,
                       starts=sweep.load_starts(path), settings=sweep.load_settings(path), task="worked")
    assert [(s["G"], s["iterations"], s["sampler"], s["task"]) for s in specs] == [(2, 2, "static", "worked")] * 2
    assert specs[0]["folder"] != specs[1]["folder"]
    for spec in specs:
        assert sweep.run_one(spec)["trained"] and sweep._done(spec)
        assert not sweep.run_one(spec)["trained"]  # finished: read, never rerun
    results = sweep.collect_results(specs, tmp_path / "results.json")
    reference = results["runs"]["reference"]
    assert results["task"] == "worked" and reference["start"] == "rare_2"
    assert len(reference["curves"]["think_rate"]) == 2 and reference["test_profile"]["responses"] == 64  # 1 chain per k x 8 draws
    assert RunFolder(specs[1]["folder"]).manifest()["step"] == "reasoning"
    assert results["runs"]["negative_only"]["options"]["advantage_sign"] == "negative"


@pytest.mark.parametrize("body, message", [
    ({"task": "chess", "runs": [{"name": "a"}]}, r"task 'chess': expected one of \('protocol', 'worked'\)"),
    ({"task": "worked", "runs": [{"name": "a", "start": "warm_start"}]}, r"run 0 start 'warm_start': expected one of"),
    ({"task": "worked", "sampler": "fast", "runs": [{"name": "a"}]}, "leave out 'sampler' and 'shared_prompts'"),
])
def test_a_worked_sweep_file_is_refused_in_one_line_naming_the_value(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(ValueError, match=message):
        sweep.load_runs(path)


def test_a_worked_run_may_not_optimise_the_protocols_learned_verifier(tmp_path):
    path = write(tmp_path, {"task": "worked", "runs": [{"name": "a", "options": {"reward": "learned"}}]})
    with pytest.raises(ValueError, match="the learned verifier judges the protocol's answers"):
        sweep.plan("tiny", sweep.load_runs(path), root=tmp_path, start_file=WARM_START, task="worked")
