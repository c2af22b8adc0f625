"""The variants sweep: its file is checked, its runs are named by fingerprint, finished runs are
read and not rerun, and the same sweep runs on a two-worker Dask cluster on the loopback address."""

import json

import pytest

from labkit import models, sweep
from labkit.runs import RunFolder, read_json
from labkit.variants import Variant


def write(tmp_path, runs, name="sweep.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"runs": runs}))
    return path


def test_the_sweep_file_is_checked_by_name(tmp_path):
    assert sweep.load_runs(write(tmp_path, [{"name": "a", "options": {"kl": "none"}}])) == [("a", Variant(kl="none"))]
    with pytest.raises(ValueError, match=r"unknown variant option\(s\) \['kll'\]"):
        sweep.load_runs(write(tmp_path, [{"name": "a", "options": {"kll": "none"}}]))
    with pytest.raises(ValueError, match="must be unique"):
        sweep.load_runs(write(tmp_path, [{"name": "a"}, {"name": "a"}]))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['option'\]"):
        sweep.load_runs(write(tmp_path, [{"name": "a", "option": {}}]))
    toml = tmp_path / "sweep.toml"
    toml.write_text('[[runs]]\nname = "dr"\noptions = { scale_by_std = false }\n')
    assert sweep.load_runs(toml) == [("dr", Variant(scale_by_std=False))]


def test_the_committed_sweep_file_lists_the_chapters_runs():
    names = [name for name, _ in sweep.load_runs(sweep.DEFAULT_FILE)]
    assert names == ["grpo", "dr_grpo", "one_update", "k3_penalty", "no_kl", "rft", "sft_equal_prompts",
                     "random_reward", "format_reward"]
    random = dict(sweep.load_runs(sweep.DEFAULT_FILE))["random_reward"]
    assert random.random_reward_p == read_json(sweep.REPO_ROOT / "runs/tiny/group_size/warm_start_p.json")["p"]


@pytest.fixture(scope="module")
def start_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("start") / "model.safetensors"
    models.save_model(models.new_tiny_model(seed=3), path)
    return path


def specs_for(root, start_file, runs):
    return sweep.plan("tiny", runs, root=root, iterations=2, start_file=start_file,
                      config_overrides={"max_response_tokens": 4}, eval_limit=1)


def test_a_fingerprint_names_everything_that_makes_the_numbers(tmp_path, start_file):
    a, b = specs_for(tmp_path, start_file, [("x", Variant()), ("y", Variant(kl="none"))])
    again = specs_for(tmp_path, start_file, [("x", Variant())])[0]
    assert a["folder"] == again["folder"] and a["folder"] != b["folder"]
    longer = sweep.plan("tiny", [("x", Variant())], root=tmp_path, iterations=3, start_file=start_file,
                        config_overrides={"max_response_tokens": 4}, eval_limit=1)[0]
    assert longer["folder"] != a["folder"]


def test_a_two_worker_local_dask_cluster_runs_the_sweep_and_a_rerun_trains_nothing(tmp_path, start_file):
    from distributed import LocalCluster

    specs = specs_for(tmp_path, start_file, [("grpo", Variant()), ("random", Variant(reward="random", random_reward_p=0.5))])
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        done = sweep.run_sweep(specs, scheduler=cluster.scheduler_address, progress=False)
        assert sorted(s["name"] for s in done) == ["grpo", "random"] and all(s["trained"] for s in done)
        assert sweep.run_sweep(specs, scheduler=cluster.scheduler_address, progress=False) == []  # all read
    for spec in specs:
        assert RunFolder(spec["folder"]).is_finished()
        assert RunFolder(f"{spec['folder']}/evaluation/grpo").is_finished()
    results = sweep.collect_results(specs, tmp_path / "results.json")
    greedy = results["runs"]["random"]["evaluation"]["greedy"]["ALL"]
    assert greedy["responses"] == 2 and len(results["runs"]["grpo"]["curves"]["reward"]) == 2


def test_local_worker_processes_give_the_runs_the_cluster_gives(tmp_path, start_file):
    specs = specs_for(tmp_path / "local", start_file, [("grpo", Variant())])
    done = sweep.run_sweep(specs, workers=1, progress=False)
    assert done[0]["trained"] and done[0]["evaluated"]
    assert sweep.run_sweep(specs, workers=1, progress=False) == []


def test_the_committed_sweep_is_complete_for_this_code():
    """Every run of sweeps/chapter9.json is finished and evaluated under its current fingerprint, so
    `python -m labkit sweep` starts no training (a code change makes them due: `make cache`)."""
    specs = sweep.plan("tiny", sweep.load_runs(sweep.DEFAULT_FILE))
    due = [s["name"] for s in specs if not sweep._done(s)]
    assert due == [], f"sweep runs {due} are not built for this code; rebuild with `make cache`"
    results = read_json(sweep.REPO_ROOT / "runs" / "tiny" / "sweep" / sweep.RESULTS_FILE)
    assert sorted(results["runs"]) == sorted(s["name"] for s in specs)
    assert {results["runs"][s["name"]]["folder"] for s in specs} == {s["folder"].rsplit("/", 1)[1] for s in specs}
