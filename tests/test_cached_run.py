"""The committed tiny run (the cache the notebooks and CI read) is complete, fresh and consistent.

These tests read `runs/tiny/` as committed.  They fail when the code, data or
config that made a step changed since it was built (rebuild with `make cache`),
when a count of the protocol is not what the files hold, or when a derived file
(results.json, book/results.md) no longer reproduces from the raw files.
"""

from __future__ import annotations

import subprocess

import pytest

from labkit import steps
from labkit.lab import cache
from labkit.eval import evaluate
from labkit.grpo.loop import read_rollouts
from labkit.lab.runs import REPO_ROOT, RunFolder, is_finished, read_json

RUN = REPO_ROOT / "runs" / "tiny"
# The cached run is committed: a clone without it is broken, so these tests fail (never skip) on one.


def test_every_cached_step_is_fresh_against_the_code_data_and_config_that_made_it():
    verdicts = cache.check(steps.STEPS, "tiny")
    assert verdicts, "no cache steps"
    stale = {name: v for name, v in verdicts.items() if v["status"] != "fresh"}
    assert not stale, "stale cache; rebuild with `make cache`:\n" + cache.format_check(stale)


# Policies whose weights are not committed (.gitignore): their run's manifest vouches for the weights.
LOCAL_WEIGHTS = {"grpo_g2": "grpo_g2", "grpo_g8": "grpo_g8"}


def test_results_json_recomputes_byte_for_byte_from_the_raw_predictions():
    assert evaluate.check_results("tiny")
    stale = []
    for message in evaluate.stale_evaluations("tiny"):
        policy = message.split(":")[0]
        if policy in LOCAL_WEIGHTS and message.endswith("is gone"):
            # evaluated weights that stay local: the run's committed manifest records the very file evaluated
            evaluated = read_json(RUN / "evaluation" / policy / "manifest.json")["state_file_sha256"]
            ledger = RunFolder(RUN / LOCAL_WEIGHTS[policy]).manifest()["ledger"]["files"]["model.safetensors"]
            if ledger["sha256"] == evaluated:
                continue
        stale.append(message)
    assert stale == []


def test_the_main_grpo_run_has_1600_rollouts_and_200_updates_none_optimised_twice():
    rollouts = read_rollouts(RUN / "grpo")
    assert len(rollouts) == 1600
    assert len({r["rollout_id"] for r in rollouts}) == 1600
    history = read_json(RUN / "grpo" / "history.json")
    assert len(history) == 100
    assert sum(len(h["updates"]) for h in history) == 200
    assert [h["iteration"] for h in history] == list(range(1, 101))
    for h in history:  # the pre-update check held at every iteration
        assert h["logprob_check/max_abs_diff"] <= 2e-4
    columns = {"rollout_id", "iteration", "problem_id", "response_ids", "text", "finish_reason",
               "tokenization_valid", "logp_old", "reward", "advantage"}
    assert columns <= set(rollouts[0])


@pytest.mark.parametrize("report", ["warm_start/resume_report.json", "sft/resume_report.json",
                                    "grpo/resume_report.json", "grpo_g2/resume_report.json",
                                    "grpo_g8/resume_report.json"])
def test_every_resume_report_says_equal(report):
    data = read_json(RUN / report)
    assert data["equal"] is True, {k: v for k, v in data.items() if k != "equal"}


def test_the_evaluation_holds_1000_responses_per_policy():
    results = read_json(RUN / "evaluation" / "results.json")
    assert set(results["policy_order"]) >= {"warm_start", "sft", "grpo"}
    for policy in results["policy_order"]:
        entry = results["policies"][policy]
        assert entry["complete"] is True
        assert entry["greedy"]["ALL"]["responses"] == 200
        assert entry["sample"]["ALL"]["responses"] == 800
        assert entry["greedy"]["ID50"]["responses"] == entry["greedy"]["OOD100"]["responses"] == 100


def test_the_group_size_exercise_left_the_main_run_unchanged():
    assert is_finished(RUN / "group_size")
    protection = read_json(RUN / "group_size" / "protection.json")
    assert protection["unchanged"] is True
    assert protection["files"] and all(f["unchanged"] for f in protection["files"])
    g2 = read_rollouts(RUN / "grpo_g2")
    g8 = read_rollouts(RUN / "grpo_g8")
    assert (len(g2), len(g8)) == (160, 640)


def test_the_base_was_pretrained_on_a_corpus_free_of_dataset_problems():
    manifest = read_json(RUN / "base" / "manifest.json")
    assert manifest["corpus"]["dataset_problems_found"] == 0
    assert manifest["corpus"]["problems_checked"] > 0


def test_the_committed_cache_stays_under_50_mb():
    """DESIGN.md's budget for the committed cache: under 50 MB.  Eight tiny models of 4.2 MB each (base, format
    base, warm start, SFT, GRPO, and chapter 11's thinking bases rare_0, rare_2 and control, which its live run
    starts from: 34 MB) are most of it; the models of the sweeps, of G = 2 and 8, of the skill base, rare_10 and
    chapter 11's runs are not committed (their manifests record each one's digest: `cache fill` rebuilds them)."""
    files = subprocess.run(["git", "ls-files", "runs/tiny"], cwd=REPO_ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    if not files:
        pytest.skip("not a git checkout with the cache committed")
    size = sum((REPO_ROOT / f).stat().st_size for f in files if (REPO_ROOT / f).is_file())
    assert size < 50 * 2**20, f"committed cache is {size / 2**20:.1f} MB"


@pytest.mark.parametrize("policy", ["sft", "grpo"])
def test_the_fast_sampler_gives_the_reference_samplers_tokens_on_every_evaluated_policy(policy):
    """The evaluation samples with the fast sampler because it draws the reference's tokens; that was measured
    on the warm start (sampler_agreement.json) and, for the other policies chapter 7 evaluates, on each of
    them: the report is of the committed model (its parameter digest) and every rollout is identical."""
    report = read_json(RUN / f"sampler_agreement_{policy}.json")
    assert report["policy"]["parameter_digest"] == read_json(RUN / policy / "manifest.json")["final_digest"]
    summary = report["summary"]
    assert summary["greedy_identical"] == summary["greedy_rollouts"] == 200
    assert summary["seeded_identical"] == summary["seeded_rollouts"] == 800
    assert summary["unexplained_mismatches"] == 0
