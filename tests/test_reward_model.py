"""The learned verifier (labkit.studies.reward_model): its maths on hand-worked numbers, a small real run,
and the committed run re-scored exactly."""

import math
import shutil

import pytest
import torch

from labkit.task import data, verifier
from labkit.models import presets, scoring
from labkit.studies import reward_model
from labkit.lab.runs import REPO_ROOT, ArtifactError, RunExistsError, read_json, sha256_file, write_json

COMMITTED = REPO_ROOT / "runs" / "tiny" / "reward_model"


def test_precision_and_recall_on_a_hand_worked_table():
    m = reward_model.classification_metrics([1, 1, 0, 0, 1], [1, 0, 1, 0, 1])
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (2, 1, 1, 1)
    assert m["precision"] == 2 / 3 and m["recall"] == 2 / 3 and m["accuracy"] == 3 / 5 and m["positive_share"] == 3 / 5
    never = reward_model.classification_metrics([0, 0], [0, 1])
    assert never["precision"] is None and never["recall"] == 0.0
    with pytest.raises(ValueError, match="2 predictions for 3 labels"):
        reward_model.classification_metrics([0, 1], [0, 1, 1])


def test_newton_finds_the_root_of_the_symmetric_two_point_problem():
    """X = [[1, -1], [1, 1]], y = [0, 1]: by symmetry b = 0, and the gradient in w vanishes where
    l2 * w = sigmoid(-w) (worked by hand); that root is found here by bisection, independently."""
    X = torch.tensor([[1.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0.0, 1.0], dtype=torch.float64)
    l2 = 0.05
    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if l2 * mid < 1 / (1 + math.exp(mid)) else (lo, mid)
    theta, log = reward_model.fit_logistic(X, y, l2, steps=50)
    assert abs(float(theta[0])) < 1e-12
    assert float(theta[1]) == pytest.approx(lo, abs=1e-10)
    assert log[-1]["step_norm"] < 1e-12 and len(log) < 50


def test_newton_reaches_a_zero_gradient_on_random_data():
    g = torch.Generator().manual_seed(0)
    X = torch.cat([torch.ones(200, 1, dtype=torch.float64), torch.randn(200, 3, generator=g, dtype=torch.float64)], 1)
    y = (torch.rand(200, generator=g, dtype=torch.float64) < torch.sigmoid(X @ torch.tensor(
        [0.3, 1.0, -2.0, 0.5], dtype=torch.float64))).double()
    theta, _ = reward_model.fit_logistic(X, y, 1e-3, steps=50)
    theta = theta.clone().requires_grad_(True)
    reward_model.logistic_loss(theta, X, y, 1e-3).backward()
    assert float(theta.grad.abs().max()) < 1e-12  # autograd agrees: the minimum


def test_the_held_out_rule_is_a_fixed_hash_of_the_id():
    assert reward_model.is_held_out("train-0000", 0.2) == reward_model.is_held_out("train-0000", 0.2)
    ids = [f"train-{k:04d}" for k in range(1000)]
    assert all(not reward_model.is_held_out(i, 0.0) for i in ids) and all(reward_model.is_held_out(i, 1.0) for i in ids)
    assert 150 <= sum(reward_model.is_held_out(i, 0.2) for i in ids) <= 250


def test_features_are_the_judges_log_probs():
    judge, tokenizer = presets.load("tiny", state=REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors")
    prompt = scoring.build_prompt_ids(tokenizer, "Start with 3 boxes.")
    responses = [scoring.target_response_ids(tokenizer, 7), scoring.target_response_ids(tokenizer, 12)[:-1]]
    x = reward_model.judge_features(judge, [prompt, prompt], responses, tokenizer.pad_token_id, tokenizer.eos_token_id)
    for row, response in zip(x, responses):
        with torch.no_grad():
            logp, _ = scoring.response_logprobs(judge, scoring.make_batch([prompt], [response], tokenizer.pad_token_id))
        logp = logp[0, :len(response)].double()
        assert row[0] == pytest.approx(float(logp.sum()), abs=1e-9)
        assert row[1] == pytest.approx(float(logp.min()), abs=1e-9)
        assert row[2] == pytest.approx(float(logp.mean()), abs=1e-9)
        assert row[3] == len(response) / scoring.MAX_NEW_TOKENS
    assert x[:, 4].tolist() == [1.0, 0.0]  # the second response lost its EOS


def test_a_small_run_writes_checked_files_and_reloads_to_the_same_scores(tmp_path):
    run = tmp_path / "rm"
    manifest = reward_model.run_reward_model("tiny", run, limit=20, progress=False)
    assert manifest["responses"]["total"] == 80  # 20 problems x 2 draws x 2 policies
    assert (run / "FINISHED").is_file() and set(manifest["ledger"]["files"]) == {
        "samples.jsonl.gz", "model.safetensors", "history.json"}
    rows = reward_model.read_samples(run)
    v = reward_model.load_verifier("tiny", run)
    assert v.file_sha256 == sha256_file(run / "model.safetensors") == manifest["ledger"]["files"]["model.safetensors"]["sha256"]
    statements = {s["id"]: s["statement"] for s in data.open_records("statements", "train", "learning")}
    _, tokenizer = presets.load("tiny")
    proxy, p = v.rewards([scoring.build_prompt_ids(tokenizer, statements[r["problem_id"]]) for r in rows],
                         [r["response_ids"] for r in rows])
    assert p.tolist() == pytest.approx([r["p_correct"] for r in rows], abs=1e-9)
    assert [int(a) for a in proxy.tolist()] == [r["proxy"] for r in rows]
    with pytest.raises(RunExistsError, match="never overwritten"):
        reward_model.run_reward_model("tiny", run, limit=20, progress=False)


def test_a_verifier_whose_judge_changed_is_refused(tmp_path):
    run = tmp_path / "rm"
    shutil.copytree(COMMITTED, run)
    manifest = read_json(run / "manifest.json")
    manifest["judge"]["sha256"] = "0" * 64
    write_json(run / "manifest.json", manifest)
    with pytest.raises(ArtifactError, match=r"manifest\.json has SHA-256 .* the manifest was edited or damaged"):
        reward_model.load_verifier("tiny", run)  # an edited manifest is refused first, by its FINISHED record
    finished = read_json(run / "FINISHED")  # a manifest that vouches for the change itself: the judge check
    write_json(run / "FINISHED", {**finished, "manifest_sha256": sha256_file(run / "manifest.json")})
    with pytest.raises(ValueError, match="is not the judge .* was trained with"):
        reward_model.load_verifier("tiny", run)
    with pytest.raises(FileNotFoundError, match="python -m labkit reward-model --preset tiny"):
        reward_model.load_verifier("tiny", tmp_path / "nothing")


def test_the_committed_run_is_rescored_by_the_verifier_exactly():
    """Every label is the verifier's verdict on the stored text; every figure of the manifest is
    recomputed from the stored proxies and labels; the split follows the hash rule."""
    manifest = reward_model.read_manifest()
    rows = reward_model.read_samples()
    problems = {r["id"]: r["problem"] for r in data.open_records("labels", "train", "learning")}
    assert len(rows) == manifest["responses"]["total"] == 4000
    for r in rows:
        v = verifier.score(r["text"], r["finish_reason"], problems[r["problem_id"]])
        assert (int(v.reward), v.reason) == (r["label"], r["reason"])
        assert r["held_out"] == reward_model.is_held_out(r["problem_id"], manifest["config"]["held_out_share"])
        assert r["proxy"] == int(r["p_correct"] >= manifest["config"]["threshold"])
    held = [r for r in rows if r["held_out"]]
    assert manifest["metrics"]["held_out"] == reward_model.classification_metrics(
        [r["proxy"] for r in held], [r["label"] for r in held])
    assert manifest["metrics"]["held_out"]["precision"] > 0.85 and manifest["metrics"]["held_out"]["recall"] > 0.85
    # no train problem of the held-out side was fitted on
    assert not {r["problem_id"] for r in held} & {r["problem_id"] for r in rows if not r["held_out"]}
