"""The ablation sweep (issue 40): what the chapters say about its design is what sweeps/ablations.json
holds, every pair differs only in the piece its name says, the committed runs are complete for this
code, and the numbers the chapters quote are recomputed from the runs' own files."""

import functools
import json
import math
from pathlib import Path

import pytest

from labkit.studies import ablations, sweep
from labkit.book.exercises import reveal as reveals
from labkit.config import get_preset

SPEC = json.loads(ablations.SWEEP_FILE.read_text())


@functools.lru_cache(maxsize=1)
def _labels() -> dict:
    from labkit.eval import evaluate

    return {r["id"]: r for r in evaluate.load_test_labels(phase=evaluate.SCORING_PHASE)}


def test_the_sweep_file_is_the_design_the_chapters_describe():
    assert SPEC["config"] == {"prompts_per_iteration": 16, "G": 8, "grpo_iterations": 40, "grpo_lr": 1e-4}
    assert (SPEC["sampler"], SPEC["shared_prompts"], SPEC["folder"]) == ("fast", True, "ablations")
    names = [r["name"] for r in SPEC["runs"]]
    assert sorted(names) == sorted([ablations.PARTNER, *ablations.CHANGES])
    settings = sweep.load_settings(ablations.SWEEP_FILE)
    betas = sorted(settings[n]["config"].get("kl_coef", get_preset("tiny").kl_coef) for n in names if n.startswith("beta"))
    assert betas == [0.0, 0.2, 1.0, 5.0] and get_preset("tiny").kl_coef == 0.02  # with the partner's 0.02
    for name in ("split_64x2", "split_32x4", "split_8x16"):
        c = settings[name]["config"]
        assert c["prompts_per_iteration"] * c["G"] == 16 * 8 == 128  # one budget of rollouts, split
    assert {n for n in names if settings[n]["config"].get("clip_eps") == 0.99} == {
        "updates_2_clip_0p99", "updates_4_clip_0p99", "updates_16_clip_0p99", "updates_16_clip_0p99_rate_3e-4"}
    updates = {r.get("options", {}).get("updates_per_iteration") or get_preset("tiny").updates_per_iteration
               for r in SPEC["runs"] if r["name"].startswith("updates")}
    assert updates == {1, 2, 4, 16}  # chapter 4: "1, 2, 4 and 16 updates per batch"
    assert settings["updates_16_rate_3e-4"]["config"]["grpo_lr"] == pytest.approx(3 * SPEC["config"]["grpo_lr"])
    assert {n: settings[n]["config"].get("seed") for n in names if "seed" in n} == {
        f"{m}_16x8_seed_{k}": 1233 + k for m in ("grpo", "rft", "sft") for k in (2, 3)}


def _differences(spec: dict, partner: dict) -> set[str]:
    out = {f"options.{k}" for k in spec["options"] if spec["options"][k] != partner["options"][k]}
    keys = set(spec["config_overrides"]) | set(partner["config_overrides"])
    out |= {f"config.{k}" for k in keys if spec["config_overrides"].get(k) != partner["config_overrides"].get(k)}
    return out | ({"G"} if spec["G"] != partner["G"] else set())


EXPECTED_DIFFERENCES = {
    "mean_only": {"options.scale_by_std"}, "updates_1": {"options.updates_per_iteration"},
    "updates_2_clip_0p99": {"config.clip_eps"}, "updates_4": {"options.updates_per_iteration"},
    "updates_4_clip_0p99": {"options.updates_per_iteration", "config.clip_eps"},
    "updates_16": {"options.updates_per_iteration"},
    "updates_16_clip_0p99": {"options.updates_per_iteration", "config.clip_eps"},
    "updates_16_rate_3e-4": {"options.updates_per_iteration", "config.grpo_lr"},
    "updates_16_clip_0p99_rate_3e-4": {"options.updates_per_iteration", "config.grpo_lr", "config.clip_eps"},
    **{b: {"config.kl_coef"} for b in ("beta_0", "beta_0p2", "beta_1", "beta_5")},
    **{s: {"config.prompts_per_iteration", "G"} for s in ("split_64x2", "split_32x4", "split_8x16")},
    "grpo_16x8_seed_2": {"config.seed"}, "grpo_16x8_seed_3": {"config.seed"},
    "rft_16x8": {"options.objective", "options.kl"}, "sft_16x8": {"options.objective", "options.kl"},
    **{f"{m}_16x8_seed_{k}": {"options.objective", "options.kl", "config.seed"} for m in ("rft", "sft") for k in (2, 3)},
    "no_baseline": {"options.baseline", "options.scale_by_std"},
    "rloo": {"options.baseline", "options.scale_by_std"},
    "clip_higher": {"options.clip_eps_high"}, "token_mean": {"options.reduction"},
    "dr_grpo": {"options.scale_by_std", "options.reduction"},
    "dapo": {"options.clip_eps_high", "options.reduction", "options.overlong_filter", "options.dynamic_sampling"},
    "gspo": {"options.objective"},
    "cispo": {"options.objective", "options.clip_eps_high", "options.reduction"},
    **{f"{k}_beta_1": {"options.kl", "config.kl_coef"} for k in ("k1", "k2", "k3")},
    **{f"{p}_sampler": {"options.sampler_weights"} for p in ("bf16", "fp8")},
    **{f"{p}_trainer_old": {"options.sampler_weights", "options.logp_old_from"} for p in ("bf16", "fp8")},
    **{f"{p}_tis": {"options.sampler_weights", "options.logp_old_from", "options.tis_cap"} for p in ("bf16", "fp8")},
}


def test_every_run_differs_from_its_partner_only_in_the_piece_it_names():
    specs = {s["name"]: s for s in ablations.specs()}
    partner = specs[ablations.PARTNER]
    assert {n: _differences(s, partner) for n, s in specs.items() if n != ablations.PARTNER} == EXPECTED_DIFFERENCES
    assert len({s["start_file"] for s in specs.values()}) == 1  # every run from the warm start
    assert {s["iterations"] for s in specs.values()} == {40}


def test_the_committed_ablation_runs_are_complete_for_this_code():
    """`python -m labkit sweep sweeps/ablations.json` would train nothing; the results file lists every run."""
    runs = ablations.load()  # raises, naming the run, when one is not built under its current fingerprint
    results = sweep.read_results(sweep.sweep_root(ablations.SWEEP_FILE, "tiny") / sweep.results_file(ablations.SWEEP_FILE))
    assert sweep.results_file(ablations.SWEEP_FILE) == "results-ablations.json.gz"  # the file asks for gzip
    assert {n: results["runs"][n]["folder"] for n in results["runs"]} == {n: r.folder.name for n, r in runs.items()}


def test_a_summary_is_its_runs_own_files_recomputed():
    """The curves the chapters read (results-ablations.json.gz) are the loop's own log, value for value, for
    the run whose history.json is committed (the partner); the summary is recomputed from them."""
    run = ablations.load(names=(ablations.PARTNER,))[ablations.PARTNER]
    history = json.loads((run.folder / "history.json").read_text())
    curves = run.history()
    assert len(curves) == len(history) == 40
    for key in ("reward", "kl", "clip_ratio/region_mean", "frac_reward_zero_std", "entropy", "valid_json"):
        assert [c[key] for c in curves] == [h[key] for h in history], key
    assert [c["iteration"] for c in curves] == [h["iteration"] for h in history]
    s = ablations.summary(run)
    assert s["kl_end"] == pytest.approx(sum(h["kl"] for h in history[-10:]) / 10, rel=1e-12)
    assert s["clip_max"] == max(h["clip_ratio/region_mean"] for h in history)
    assert s["zero_signal_all"] == pytest.approx(sum(h["frac_reward_zero_std"] for h in history) / len(history))
    last = [json.loads(line) for line in (run.folder / "checkpoints.jsonl").read_text().splitlines()][-1]
    assert s["validation_per_draw"] == last["sampled_success"] == sum(last["draws_correct"]) / (4 * 64)
    rows = [json.loads(line) for line in _gunzip(run.evaluation / "predictions-sample.jsonl.gz")]
    assert len(rows) == 800
    assert s["test_per_draw"] == pytest.approx(sum(_correct(r) for r in rows) / 800)


def _correct(row: dict) -> int:
    from labkit.task import verifier

    label = _labels()[row["problem_id"]]
    return int(verifier.score(row["text"], row["finish_reason"], label["problem"], row["tokenization_valid"]).reward)


def _gunzip(path: Path) -> list[str]:
    import gzip

    return gzip.decompress(path.read_bytes()).decode().splitlines()


def test_a_paired_comparison_is_antisymmetric():
    runs = ablations.load()
    ab = ablations.compare(runs[ablations.PARTNER], runs["beta_5"])
    ba = ablations.compare(runs["beta_5"], runs[ablations.PARTNER])
    assert ab["test_sample"]["mean_difference"] == -ba["test_sample"]["mean_difference"]
    assert ab["test_greedy"]["gained"] == ba["test_greedy"]["lost"]
    assert math.isclose(ab["validation"]["mean_difference"], -ba["validation"]["mean_difference"])


@pytest.mark.parametrize("reveal, prediction, tolerance", [
    (reveals.reveal_identity, "halves", None), (reveals.reveal_baseline, "raw reward", None),
    (reveals.reveal_clip, "not separable", None), (reveals.reveal_leash, 1.0, None),
    (reveals.reveal_seeds, 1.0, 1.0), (reveals.reveal_separable, 0, None), (reveals.reveal_split, 0.5, 0.05)])
def test_every_reveal_measures_from_the_files_and_explains(reveal, prediction, tolerance, capsys):
    result = reveal(prediction)
    out = capsys.readouterr().out
    assert "Your prediction" in out and "Why: " in out
    if tolerance is None:
        assert result["right"] == (result["measured"] == prediction)
    else:
        assert result["right"] == (abs(result["measured"] - prediction) <= tolerance)


def test_the_gradient_study_is_read_only_when_its_digest_holds(tmp_path, monkeypatch):
    import shutil

    from labkit.lab import runs

    source = runs.preset_folder("tiny", "gradient_study")
    copy = tmp_path / "runs" / "tiny" / "gradient_study"
    shutil.copytree(source, copy)
    monkeypatch.setattr(runs, "preset_folder", lambda preset, *names: tmp_path.joinpath("runs", preset, *names))
    assert ablations.gradient_study_results()["format"] == "labkit gradient study v2"
    text = (copy / "results.json").read_text()
    (copy / "results.json").write_text(text.replace('"trials": 2000', '"trials": 2001'))
    with pytest.raises(ValueError, match="does not match the digest in its FINISHED marker"):
        ablations.gradient_study_results()


def test_a_p_at_the_monte_carlo_floor_is_printed_as_a_bound():
    from labkit.eval import paired
    from labkit.lab.runs import REPO_ROOT

    rows = ablations.table()
    bound = [r for r in rows if r.get("test_p_is_bound")]
    assert bound, "the 16-update wide-clip run at 3e-4 lies beyond every resample of the permutation test"
    floor = 2 / (paired.PERMUTATION_RESAMPLES + 1)
    assert all(r["test_p"] <= floor * (1 + 1e-9) for r in bound)
    lines = {line.split("|")[1].strip(): line for line in (REPO_ROOT / "book" / "results_detail.md").read_text()
             .splitlines() if line.startswith("| `")}
    for r in rows:
        if "test_p" in r:
            assert ("(<= " in lines[f"`{r['name']}`"].split("|")[4]) == r["test_p_is_bound"], r["name"]


def test_the_committed_results_recollect_without_the_uncommitted_histories(tmp_path):
    """A fresh clone has only the partner's history.json: collecting the results again reuses the committed
    curves of exactly those folders and gives the committed file's content."""
    import shutil

    specs = ablations.specs()
    committed = sweep.sweep_root(ablations.SWEEP_FILE, "tiny") / sweep.results_file(ablations.SWEEP_FILE)
    out = tmp_path / committed.name
    shutil.copy(committed, out)
    moved = []
    for spec in specs:  # hide every history but the partner's, as a fresh clone has them
        history = Path(spec["folder"]) / "history.json"
        if history.is_file() and spec["name"] != ablations.PARTNER:
            hidden = tmp_path / f"{spec['name']}.history.json"
            shutil.move(history, hidden)
            moved.append((hidden, history))
    try:
        again = sweep.collect_results(specs, out)
    finally:
        for hidden, history in moved:
            shutil.move(hidden, history)
    assert again == sweep.read_results(committed)
    for spec in specs:
        spec_other = dict(spec, folder=str(Path(spec["folder"]).with_name("other-folder")))
        if spec["name"] != ablations.PARTNER:
            with pytest.raises(FileNotFoundError, match="holds no curves for other-folder"):
                sweep.collect_results([spec_other], out)
            break


def test_a_mismatched_sampler_is_logged_and_a_recomputed_logp_old_makes_the_first_ratio_one():
    runs = ablations.load(names=ablations.MISMATCH_RUNS)
    accounts = {name: ablations.mismatch_account(run) for name, run in runs.items()}
    for p in ("bf16", "fp8"):
        recomputed, recorded = accounts[f"{p}_trainer_old"], accounts[f"{p}_sampler"]
        assert recomputed["first_ratio_min"] == recomputed["first_ratio_max"] == 1.0  # exactly: the same forward
        assert recorded["first_ratio_min"] < 1.0 < recorded["first_ratio_max"]  # pi_trainer / pi_sampler
        assert "tis_weight_mean" in accounts[f"{p}_tis"] and "tis_weight_mean" not in recomputed
        assert all(0 < a["gap_mean"] < a["gap_max"] for a in (recomputed, recorded))
    # the coarser copy disagrees more: e4m3's 3 mantissa bits against bfloat16's 8
    assert accounts["fp8_sampler"]["gap_mean"] > 10 * accounts["bf16_sampler"]["gap_mean"]
    with pytest.raises(ValueError, match="sampled with the trainer's own weights"):
        ablations.mismatch_account(ablations.load(names=(ablations.PARTNER,))[ablations.PARTNER])
