"""The variants sweep: its file is checked, its runs are named by fingerprint, finished runs are
read and not rerun, and the same sweep runs on a two-worker Dask cluster on the loopback address."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.models import presets
from labkit.studies import sweep
from labkit.lab.runs import RunFolder, read_json
from labkit.grpo.variants import Variant


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
    assert names == ["grpo", "no_std", "one_update", "k3_penalty", "no_kl", "rft", "sft_equal_prompts",
                     "random_reward", "format_reward"]
    random = dict(sweep.load_runs(sweep.DEFAULT_FILE))["random_reward"]
    assert random.random_reward_p == read_json(sweep.REPO_ROOT / "runs/tiny/group_size/warm_start_p.json")["p"]


def test_a_sweep_file_may_set_each_runs_budget_sampler_and_folder(tmp_path):
    """The file's `config` is every run's, a run's own `config` wins; G and the iterations become the
    run's, the rest config overrides; `folder` keeps the runs apart from chapter 9's."""
    path = tmp_path / "ablations.json"
    path.write_text(json.dumps({
        "config": {"prompts_per_iteration": 16, "G": 8, "grpo_iterations": 40, "grpo_lr": 1e-4},
        "sampler": "fast", "shared_prompts": True, "folder": "ablations",
        "runs": [{"name": "grpo", "options": {}},
                 {"name": "split", "options": {}, "config": {"prompts_per_iteration": 64, "G": 2}},
                 {"name": "wide_clip", "options": {"updates_per_iteration": 4}, "config": {"clip_eps": 0.99}}]}))
    settings = sweep.load_settings(path)
    assert settings["split"]["config"] == {"prompts_per_iteration": 64, "G": 2, "grpo_iterations": 40,
                                           "grpo_lr": 1e-4}
    assert sweep.sweep_root(path, "tiny") == sweep.REPO_ROOT / "runs" / "tiny" / "sweep" / "ablations"
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"a start")
    grpo_spec, split, wide_clip = sweep.plan("tiny", sweep.load_runs(path), root=tmp_path, start_file=model,
                                           settings=settings)
    assert (grpo_spec["G"], grpo_spec["iterations"]) == (8, 40)
    assert grpo_spec["config_overrides"] == {"prompts_per_iteration": 16, "grpo_lr": 1e-4}
    assert (split["G"], split["config_overrides"]["prompts_per_iteration"]) == (2, 64)
    assert wide_clip["config_overrides"]["clip_eps"] == 0.99 and wide_clip["options"]["updates_per_iteration"] == 4
    assert grpo_spec["sampler"] == "fast" and grpo_spec["shared_prompts"] is True
    plain = sweep.plan("tiny", [("grpo", Variant())], root=tmp_path, start_file=model)[0]
    assert "shared_prompts" not in plain and plain["folder"] != grpo_spec["folder"]
    for bad, message in (({"config": {"clip": 0.2}}, r"unknown key\(s\) \['clip'\]"),
                         ({"config": {"kl_coef": -1}}, r"kl_coef=-1: expected a finite number >= 0"),
                         # issue 58, item 2: each of these passed, then exhausted the machine or failed mid-run
                         ({"config": {"kl_coef": float("inf")}}, r"kl_coef=inf: expected a finite number >= 0"),
                         ({"config": {"grpo_lr": float("inf")}}, r"grpo_lr=inf: expected a finite number > 0"),
                         ({"config": {"grpo_lr": float("nan")}}, r"grpo_lr=nan: expected a finite number > 0"),
                         ({"config": {"seed": 2**70}}, r"seed=1180591620717411303424: expected an integer in 0..2\*\*62"),
                         ({"config": {"seed": -1}}, r"seed=-1: expected an integer in 0..2\*\*62"),
                         ({"config": {"prompts_per_iteration": 100000}},
                          r"prompts_per_iteration=100000: expected a positive integer at most 872, the pool's problems"),
                         ({"config": {"prompts_per_iteration": 600, "G": 8}},
                          r"run 'a': prompts_per_iteration x G = 600 x 8 = 4800 responses an iteration; at most 4096"),
                         ({"config": {"G": 1}}, r"G=1: expected an integer >= 2"),
                         ({"config": {"clip_eps": 1e9}}, r"clip_eps=1000000000.0: expected a number in \(0, 1\)"),
                         ({"config": {"grpo_iterations": 2.5}}, r"grpo_iterations=2.5: expected a positive integer"),
                         ({"sampler": "gpu"}, r"sampler 'gpu': expected one of"),
                         ({"shared_prompts": "yes"}, r"shared_prompts 'yes': expected true or false"),
                         ({"folder": "../elsewhere"}, r"folder '../elsewhere': expected a name"),
                         ({"seeds": 3}, r"unknown top-level key\(s\) \['seeds'\]")):
        path.write_text(json.dumps({"runs": [{"name": "a", "options": {}}], **bad}))
        with pytest.raises(ValueError, match=message):
            sweep.load_settings(path)
    path.write_text(json.dumps({"runs": [{"name": "a", "options": {}, "config": {"beta": 1}}]}))
    with pytest.raises(ValueError, match=r"run 'a''s config has unknown key\(s\) \['beta'\]"):
        sweep.load_settings(path)


def test_the_pool_size_the_sweep_checks_is_the_pools():
    from labkit.grpo.core import load_pool

    assert sweep.POOL_SIZE == len(load_pool())


def test_chapter9s_runs_keep_their_committed_folders():
    """The sweep file's new settings left the fingerprints of the runs that use none of them alone."""
    specs = sweep.plan("tiny", sweep.load_runs(sweep.DEFAULT_FILE), settings=sweep.load_settings(sweep.DEFAULT_FILE),
                       root=sweep.sweep_root(sweep.DEFAULT_FILE, "tiny"))
    committed = {p.name for p in (sweep.REPO_ROOT / "runs" / "tiny" / "sweep").iterdir() if p.is_dir()}
    assert {Path(s["folder"]).name for s in specs} <= committed


@pytest.fixture(scope="module")
def start_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("start") / "model.safetensors"
    presets.save_model(presets.new_tiny_model(seed=3), path)
    return path


def specs_for(root, start_file, runs):
    return sweep.plan("tiny", runs, root=root, iterations=2, start_file=start_file,
                      config_overrides={"max_new_tokens": 4, "checkpoint_problems": 4}, eval_limit=1)


def test_a_fingerprint_names_everything_that_makes_the_numbers(tmp_path, start_file):
    a, b = specs_for(tmp_path, start_file, [("x", Variant()), ("y", Variant(kl="none"))])
    again = specs_for(tmp_path, start_file, [("x", Variant())])[0]
    assert a["folder"] == again["folder"] and a["folder"] != b["folder"]
    longer = sweep.plan("tiny", [("x", Variant())], root=tmp_path, iterations=3, start_file=start_file,
                        config_overrides={"max_new_tokens": 3, "checkpoint_problems": 4}, eval_limit=1)[0]
    assert longer["folder"] != a["folder"]


@pytest.mark.slow  # about 25 s: `make test-slow`
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


def test_a_run_that_fails_fails_alone_and_the_sweep_says_so_in_one_line(tmp_path, start_file):
    """Issue 58, item 9: a run whose folder another process writes fails; its partner is trained, evaluated
    and kept by its local worker process, and the failure is one line naming the run (SweepFailed: the
    command prints it, exit 2)."""
    specs = specs_for(tmp_path / "local", start_file, [("grpo", Variant()), ("no_kl", Variant(kl="none"))])
    busy = Path(specs[1]["folder"])
    busy.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from labkit.lab.runs import hold_folder; "
                               "hold_folder(sys.argv[1]); print('held', flush=True); time.sleep(600)", str(busy)],
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        with pytest.raises(sweep.SweepFailed) as failed:
            sweep.run_sweep(specs, workers=2, progress=False)
    finally:
        holder.kill()
        holder.wait()
    message = str(failed.value)
    assert "\n" not in message and message.startswith("1 sweep run(s) failed"), message
    assert "no_kl: RunFolderBusyError: " in message and f"pid {holder.pid}" in message, message
    # the healthy run was trained and evaluated in its worker process, and a rerun of it trains nothing
    assert RunFolder(specs[0]["folder"]).is_finished()
    assert RunFolder(f"{specs[0]['folder']}/evaluation/grpo").is_finished()
    assert sweep.run_sweep(specs[:1], workers=1, progress=False) == []


def test_the_committed_sweep_is_complete_for_this_code():
    """Every run of sweeps/chapter9.json is finished and evaluated under its current fingerprint, so
    `python -m labkit sweep` starts no training (a code change makes them due: `make cache`)."""
    specs = sweep.plan("tiny", sweep.load_runs(sweep.DEFAULT_FILE))
    due = [s["name"] for s in specs if not sweep._done(s)]
    assert due == [], f"sweep runs {due} are not built for this code; rebuild with `make cache`"
    results = sweep.load_results()
    assert sorted(results["runs"]) == sorted(s["name"] for s in specs)
    assert {results["runs"][s["name"]]["folder"] for s in specs} == {s["folder"].rsplit("/", 1)[1] for s in specs}


CHAPTER10 = sweep.REPO_ROOT / "sweeps" / "chapter10.json"


def test_a_run_may_start_from_another_finished_step(tmp_path):
    path = write(tmp_path, [{"name": "a", "options": {}}, {"name": "b", "start": "base", "options": {}}])
    assert sweep.load_starts(path) == {"a": "warm_start", "b": "base"}
    with pytest.raises(ValueError, match=r"run 0 start 'sft': expected one of \('warm_start', 'base', 'format_base'\)"):
        sweep.load_runs(write(tmp_path, [{"name": "a", "start": "sft", "options": {}}], name="bad.json"))
    specs = sweep.plan("tiny", sweep.load_runs(path), starts=sweep.load_starts(path), root=tmp_path, iterations=2)
    assert [Path(s["start_file"]).parent.name for s in specs] == ["warm_start", "base"]
    assert [s["start"] for s in specs] == ["warm_start", "base"]
    assert specs[0]["folder"].rsplit("-", 1)[1] != specs[1]["folder"].rsplit("-", 1)[1]  # the start makes the run
    assert sweep.results_file(path) == "results-sweep.json" and sweep.results_file(sweep.DEFAULT_FILE) == "results.json.gz"


def test_a_learned_reward_run_is_named_by_its_reward_model():
    [spec] = sweep.plan("tiny", [("lr", Variant(reward="learned"))], iterations=2)
    from labkit.studies import reward_model

    assert spec["reward_model_sha256"] == sweep.sha256_file(reward_model.model_file("tiny"))
    altered = {**spec, "reward_model_sha256": "0" * 64}
    assert sweep.fingerprint(altered) != sweep.fingerprint(spec)


def test_the_committed_chapter10_sweep_is_complete_and_rescored_exactly():
    """Every run of sweeps/chapter10.json is built for this code; every kept rollout's true reward is
    the verifier's verdict on its text, and the learned run's optimised reward is its proxy."""
    from labkit.grpo import core, loop
    from labkit.task import verifier
    from labkit.config import get_preset

    specs = sweep.plan("tiny", sweep.load_runs(CHAPTER10), starts=sweep.load_starts(CHAPTER10))
    due = [s["name"] for s in specs if not sweep._done(s)]
    assert due == [], f"sweep runs {due} are not built for this code; rebuild with `make cache`"
    results = sweep.load_results(CHAPTER10)
    assert sorted(results["runs"]) == sorted(s["name"] for s in specs)
    problems = {p["id"]: p["problem"] for p in core.load_pool()}
    for spec in specs:
        rows = loop.read_rollouts(spec["folder"])
        assert len(rows) == spec["iterations"] * spec["G"] * get_preset("tiny").prompts_per_iteration
        for r in rows:
            v = verifier.score(r["text"], r["finish_reason"], problems[r["problem_id"]], r["tokenization_valid"])
            assert float(v.reward) == r["reward"]
        if spec["options"]["reward"] in ("learned", "learned_guarded"):
            assert {r["optimised_reward"] for r in rows} <= {0.0, 1.0}
            assert read_json(Path(spec["folder"]) / "manifest.json")["identity"]["reward_model_sha256"] == \
                spec["reward_model_sha256"]
            if spec["options"]["reward"] == "learned_guarded":  # the guard pays no malformed answer
                assert all(r["optimised_reward"] == 0.0 for r in rows if not verifier.score(
                    r["text"], r["finish_reason"], problems[r["problem_id"]], r["tokenization_valid"]).valid)
        else:
            assert all(r["optimised_reward"] == r["reward"] for r in rows)


def test_earlier_fingerprints_of_a_run_are_moved_aside_and_others_kept(tmp_path, monkeypatch):
    from labkit.lab import runs

    monkeypatch.setattr(sweep, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(runs, "REPO_ROOT", tmp_path)  # runs.preset_folder names the stale folder
    root = tmp_path / "runs" / "tiny" / "sweep"
    for name in ("grpo-000000000000", "grpo-111111111111", "grpo_long-222222222222", "other-333333333333"):
        (root / name).mkdir(parents=True)
    specs = [{"name": "grpo", "preset": "tiny", "folder": str(root / "grpo-111111111111")}]
    moved = sweep.retire_stale(specs)
    assert [p.name for p in moved] == ["grpo-000000000000"]
    assert sorted(p.name for p in root.iterdir()) == ["grpo-111111111111", "grpo_long-222222222222",
                                                      "other-333333333333"]
    assert (tmp_path / "runs" / "tiny" / "stale" / "sweep" / "grpo-000000000000").is_dir()


def test_a_sweep_file_may_ask_for_gzipped_results(tmp_path):
    plain = tmp_path / "plain.json"
    packed = tmp_path / "packed.json"
    plain.write_text('{"runs": [{"name": "a", "options": {}}]}')
    packed.write_text('{"compress_results": true, "runs": [{"name": "a", "options": {}}]}')
    assert (sweep.results_file(plain), sweep.results_file(packed)) == ("results-plain.json", "results-packed.json.gz")
    results = {"format": "labkit sweep results v1", "runs": {"a": {"curves": {"kl": [0.0, 0.5]}}}}
    for name in ("r.json", "r.json.gz"):
        path = sweep.write_results(tmp_path / name, results)
        assert sweep.read_results(path) == results
    first = (tmp_path / "r.json.gz").read_bytes()
    assert sweep.write_results(tmp_path / "r.json.gz", results).read_bytes() == first  # the same bytes every time
    (tmp_path / "bad.json.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match="bad.json.gz is not a gzipped JSON file"):
        sweep.read_results(tmp_path / "bad.json.gz")
    (tmp_path / "odd.json").write_text('{"compress_results": "yes", "runs": [{"name": "a", "options": {}}]}')
    with pytest.raises(ValueError, match="compress_results 'yes': expected true or false"):
        sweep.results_file(tmp_path / "odd.json")


def test_the_plan_names_a_finished_run_whose_file_was_damaged(tmp_path, monkeypatch, capsys):
    """`sweep FILE --plan` checks each finished run's files against its manifest: an edited history is named,
    with the two ways out, and the run is not listed as finished."""
    import shutil

    from labkit import cli

    committed = sweep.REPO_ROOT / "runs" / "tiny" / "sweep"
    original = sweep.preset_folder
    monkeypatch.setattr(sweep, "preset_folder",
                        lambda preset, *parts: tmp_path.joinpath(*parts) if parts[:1] == ("sweep",)
                        else original(preset, *parts))
    name = next(Path(s["folder"]).name for s in sweep.plan("tiny", sweep.load_runs(sweep.DEFAULT_FILE),
                                                            root=committed) if s["name"] == "no_kl")
    shutil.copytree(committed / name, tmp_path / "sweep" / name)
    assert cli.main(["sweep", str(sweep.DEFAULT_FILE), "--plan"]) == 0
    assert any(line.startswith("no_kl ") and line.endswith(" finished") for line in capsys.readouterr().out.splitlines())
    with open(tmp_path / "sweep" / name / "history.json", "a") as f:
        f.write(" ")
    assert cli.main(["sweep", str(sweep.DEFAULT_FILE), "--plan"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("no_kl "))
    assert line.endswith(f"damaged: {tmp_path / 'sweep' / name / 'history.json'} is not the file its manifest "
                         f"records (1 in all): `git checkout -- {tmp_path / 'sweep' / name / 'history.json'}`, or "
                         "delete the run's folder to train it again")
