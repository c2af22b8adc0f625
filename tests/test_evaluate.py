"""Evaluation: shared seeds, phase separation, the join's checks, Wilson intervals, pass@k, results."""

import hashlib
import itertools
import math
import shutil
from fractions import Fraction

import pytest
import torch

from labkit import cli
from labkit.task import data, verifier
from labkit.eval import evaluate
from labkit.models import presets
from labkit.lab import runs
from labkit.lab.runs import RunExistsError, is_finished, read_json, read_jsonl, write_jsonl

NEW_TOKENS = 6  # short responses keep the tests fast; nothing here depends on the length
LIMIT = 2  # problems per population: 4 problems, 4 greedy and 16 sampled responses per policy


@pytest.fixture(scope="module")
def state_files(tmp_path_factory):
    """Two different random-init tiny policies saved as safetensors files."""
    folder = tmp_path_factory.mktemp("policies")
    out = {}
    for name, seed in (("warm_start", 1), ("sft", 2)):
        out[name] = presets.save_model(presets.new_tiny_model(seed=seed), folder / f"{name}.safetensors")
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory, state_files):
    """An evaluation folder with both policies evaluated on LIMIT problems per population."""
    root = tmp_path_factory.mktemp("evaluation")
    for policy, path in state_files.items():
        evaluate.run_inference("tiny", policy, state_file=path, eval_root=root, limit=LIMIT,
                               max_new_tokens=NEW_TOKENS)
    return root


def copy_root(root, tmp_path):
    """A private copy of the evaluation folder, to damage without touching the shared one."""
    target = tmp_path / "evaluation"
    shutil.copytree(root, target)
    return target


# --- seeds and problems -------------------------------------------------------------------------


def test_eval_seed_is_the_documented_sha256_rule():
    expected = int(hashlib.sha256(b"eval/test-0000/0").hexdigest()[:16], 16) >> 2
    assert evaluate.eval_seed("test-0000", 0) == expected == 541068885511372160
    seeds = {evaluate.eval_seed(f"test-{i:04d}", d) for i in range(200) for d in range(4)}
    assert len(seeds) == 800 and all(0 <= s < 2**62 for s in seeds)


def test_limit_takes_the_first_problems_of_each_population():
    rows = evaluate.load_test_statements(limit=LIMIT)
    assert [(r["id"], r["population"]) for r in rows] == [
        ("test-0000", "ID50"), ("test-0001", "ID50"), ("test-0100", "OOD100"), ("test-0101", "OOD100")]
    assert len(evaluate.load_test_statements()) == 200


def test_seeds_are_shared_across_policies(root):
    a = read_jsonl(root / "warm_start" / evaluate.PREDICTION_FILES["sample"])
    b = read_jsonl(root / "sft" / evaluate.PREDICTION_FILES["sample"])
    keys = [(r["problem_id"], r["draw"]) for r in a]
    assert keys == [(pid, d) for pid in ("test-0000", "test-0001", "test-0100", "test-0101") for d in range(4)]
    assert [r["seed"] for r in a] == [r["seed"] for r in b] == [evaluate.eval_seed(p, d) for p, d in keys]
    # Same seeds, different policies: the responses differ, so the difference is the policy's.
    assert [r["response_ids"] for r in a] != [r["response_ids"] for r in b]
    greedy = read_jsonl(root / "sft" / evaluate.PREDICTION_FILES["greedy"])
    assert [(r["draw"], r["seed"]) for r in greedy] == [(0, None)] * 4


def test_prediction_rows_have_the_documented_fields(root):
    row = read_jsonl(root / "sft" / evaluate.PREDICTION_FILES["sample"])[5]
    assert set(row) == {"problem_id", "population", "mode", "draw", "seed", "sampler", "text", "finish_reason",
                        "tokenization_valid", "response_tokens", "response_ids"}
    assert row["mode"] == "sample" and row["sampler"] == "fast" and row["response_tokens"] == len(row["response_ids"])
    costs = read_json(root / "sft" / evaluate.COSTS_FILE)
    assert costs["device"] == "cpu" and costs["sample"]["responses"] == 16
    assert costs["greedy"]["peak_memory_bytes"] > 0 and "RSS" in costs["greedy"]["peak_memory_kind"]


def test_fast_and_reference_samplers_give_the_same_predictions(state_files):
    model, tokenizer = presets.load("tiny", state=state_files["sft"])
    statements = evaluate.load_test_statements(limit=1)
    for mode in evaluate.MODES:
        fast, reference = (evaluate.generate_predictions(model, tokenizer, statements, mode, sampler=s, draws=2,
                                                         max_new_tokens=NEW_TOKENS) for s in ("fast", "reference"))
        strip = lambda rows: [{k: v for k, v in r.items() if k != "sampler"} for r in rows]  # noqa: E731
        assert strip(fast) == strip(reference)
        assert {r["sampler"] for r in reference} == {"reference"}


# --- phase separation and evidence ---------------------------------------------------------------


def spy_on_open_records(monkeypatch):
    calls = []
    original = data.open_records

    def spy(kind, split, phase, *args, **kwargs):
        calls.append((kind, split, phase))
        return original(kind, split, phase, *args, **kwargs)

    monkeypatch.setattr(data, "open_records", spy)
    return calls


def test_inference_opens_only_test_statements(monkeypatch, state_files, tmp_path):
    calls = spy_on_open_records(monkeypatch)
    evaluate.run_inference("tiny", "sft", state_file=state_files["sft"], eval_root=tmp_path, limit=1,
                           max_new_tokens=2)
    assert calls == [("statements", "test", "inference")]


def test_inference_refuses_labels(monkeypatch, state_files, tmp_path):
    with pytest.raises(data.PhaseError, match="inference may not open test labels"):
        data.open_records("labels", "test", evaluate.INFERENCE_PHASE)
    # An inference that tried to read the labels is stopped by the data module, and leaves no evidence.
    monkeypatch.setattr(evaluate, "load_test_statements",
                        lambda limit=None: data.open_records("labels", "test", evaluate.INFERENCE_PHASE))
    with pytest.raises(data.PhaseError):
        evaluate.run_inference("tiny", "sft", state_file=state_files["sft"], eval_root=tmp_path, limit=1,
                               max_new_tokens=2)
    assert not (tmp_path / "sft" / evaluate.PREDICTION_FILES["greedy"]).exists()
    assert not is_finished(tmp_path / "sft")


def test_scoring_joins_the_labels_in_the_scoring_phase(monkeypatch, root):
    calls = spy_on_open_records(monkeypatch)
    evaluate.compute_results("tiny", root)
    assert calls == [("labels", "test", "scoring")]


def test_a_finished_evaluation_is_never_overwritten(root, state_files):
    with pytest.raises(RunExistsError, match="never overwritten"):
        evaluate.run_inference("tiny", "sft", state_file=state_files["sft"], eval_root=root, limit=LIMIT,
                               max_new_tokens=NEW_TOKENS)


@pytest.mark.parametrize("where", ["generation", "writing"])
def test_an_interrupted_overwrite_leaves_the_finished_evaluation_finished(monkeypatch, root, state_files, tmp_path,
                                                                          where):
    """Issue 58, item 5: a Ctrl-C during `evaluate --overwrite`'s generation keeps the old evaluation finished
    and byte for byte; one while the new files are written waits until they are whole, then stops."""
    import os
    import signal

    target = copy_root(root, tmp_path)
    before = {p.name: p.read_bytes() for p in (target / "sft").iterdir() if p.is_file()}
    write = evaluate.write_jsonl

    def ctrl_c_in_generation(*args, **kwargs):
        raise KeyboardInterrupt

    def ctrl_c_in_the_write(path, rows):
        os.kill(os.getpid(), signal.SIGINT)  # delivered to the shield's handler, which waits
        return write(path, rows)

    if where == "generation":
        monkeypatch.setattr(evaluate, "generate_predictions", ctrl_c_in_generation)
    else:
        monkeypatch.setattr(evaluate, "write_jsonl", ctrl_c_in_the_write)
    with pytest.raises(KeyboardInterrupt):
        evaluate.run_inference("tiny", "sft", state_file=state_files["sft"], eval_root=target, limit=LIMIT,
                               max_new_tokens=NEW_TOKENS, overwrite=True)
    assert is_finished(target / "sft")
    runs.release_folder(target / "sft")  # the process lives on (a test); a command's end releases it
    if where == "generation":
        assert {p.name: p.read_bytes() for p in (target / "sft").iterdir() if p.is_file()} == before
    else:  # the same policy and seeds: the rewritten evaluation equals the old one but for its timings
        assert read_jsonl(target / "sft" / evaluate.PREDICTION_FILES["greedy"]) == \
            read_jsonl(root / "sft" / evaluate.PREDICTION_FILES["greedy"])


def test_a_policy_changed_during_generation_is_refused(monkeypatch, state_files, tmp_path):
    original = evaluate.generate_predictions

    def generate_then_touch_the_weights(model, *args, **kwargs):
        rows = original(model, *args, **kwargs)
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
        return rows

    monkeypatch.setattr(evaluate, "generate_predictions", generate_then_touch_the_weights)
    with pytest.raises(ValueError, match="changed during greedy generation"):
        evaluate.run_inference("tiny", "sft", state_file=state_files["sft"], eval_root=tmp_path, limit=1,
                               max_new_tokens=2)
    assert not is_finished(tmp_path / "sft")


def test_digest_recorded_in_the_file_must_match_the_reloaded_policy(tmp_path):
    from safetensors.torch import save_file

    a, b = presets.new_tiny_model(seed=1), presets.new_tiny_model(seed=2)
    path = tmp_path / "mislabelled.safetensors"
    save_file(presets.unique_state(b), str(path), metadata={"format": "pt",
                                                          "labkit_parameter_digest": presets.parameter_digest(a)})
    with pytest.raises(ValueError, match="the file was corrupted or changed after it was saved"):
        evaluate.run_inference("tiny", "sft", state_file=path, eval_root=tmp_path, limit=1, max_new_tokens=2)


def test_manifest_records_the_digest_unchanged(root, state_files):
    manifest = read_json(root / "sft" / evaluate.MANIFEST_FILE)
    model, _ = presets.load("tiny", state=state_files["sft"])
    assert manifest["policy_digest"] == manifest["policy_digest_after_generation"] == presets.parameter_digest(model)
    assert manifest["sampler"] == "fast" and manifest["draws"] == 4 and manifest["limit"] == LIMIT
    assert manifest["environment"]["deterministic_algorithms"] == "warn_only"
    assert not torch.are_deterministic_algorithms_enabled()  # the caller's setting is restored


# --- the join's checks ------------------------------------------------------------------------


def rewrite(root, policy, mode, change):
    path = root / policy / evaluate.PREDICTION_FILES[mode]
    write_jsonl(path, change(read_jsonl(path)))


def test_missing_duplicated_or_unexpected_responses_are_errors(root, tmp_path):
    rows = read_jsonl(root / "sft" / evaluate.PREDICTION_FILES["sample"])
    ids = ["test-0000", "test-0001", "test-0100", "test-0101"]
    evaluate.check_complete(rows, ids, 4, "sample")  # complete: no error
    with pytest.raises(ValueError, match=r"\('test-0001', 2\) is missing"):
        evaluate.check_complete([r for r in rows if (r["problem_id"], r["draw"]) != ("test-0001", 2)], ids, 4, "sample")
    with pytest.raises(ValueError, match=r"\('test-0100', 3\) appears 2 times"):
        evaluate.check_complete(rows + [r for r in rows if (r["problem_id"], r["draw"]) == ("test-0100", 3)],
                                ids, 4, "sample")
    with pytest.raises(ValueError, match=r"\('test-0000', 4\) is not expected"):
        evaluate.check_complete(rows + [{**rows[0], "draw": 4}], ids, 4, "sample")
    with pytest.raises(ValueError, match="shared evaluation seed"):
        evaluate.check_complete([{**r, "seed": r["seed"] + 1} for r in rows], ids, 4, "sample")
    # The same checks stop the results from being computed from damaged files.
    damaged = copy_root(root, tmp_path)
    rewrite(damaged, "warm_start", "greedy", lambda rows: rows[:-1])
    with pytest.raises(ValueError, match=r"warm_start/predictions-greedy.jsonl.gz: \(problem, draw\) "
                                         r"\('test-0101', 0\) is missing"):
        evaluate.compute_results("tiny", damaged)


# --- statistics -----------------------------------------------------------------------------------


def wilson_by_hand(x: int, n: int) -> tuple[float, float]:
    z = 1.959963984540054  # Phi^-1(0.975)
    p = x / n
    centre = (p + z**2 / (2 * n)) / (1 + z**2 / n)
    half = z / (1 + z**2 / n) * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return centre - half, centre + half


@pytest.mark.parametrize("x,n", [(0, 200), (3, 200), (200, 200), (1, 4), (16, 800)])
def test_wilson_interval_matches_the_formula(x, n):
    low, high = evaluate.wilson_interval(x, n)
    hand_low, hand_high = wilson_by_hand(x, n)
    assert low == pytest.approx(max(hand_low, 0.0), abs=1e-15)
    assert high == pytest.approx(min(hand_high, 1.0), abs=1e-15)
    assert 0.0 <= low <= x / n <= high <= 1.0


def test_wilson_interval_known_values():
    assert evaluate.wilson_interval(0, 200) == [0.0, pytest.approx(0.018845, abs=1e-6)]
    assert evaluate.wilson_interval(3, 200) == [pytest.approx(0.005114, abs=1e-6), pytest.approx(0.043166, abs=1e-6)]
    assert evaluate.wilson_interval(200, 200) == [pytest.approx(0.981155, abs=1e-6), 1.0]
    with pytest.raises(ValueError, match="n >= 1"):
        evaluate.wilson_interval(0, 0)
    with pytest.raises(ValueError, match="0..n=4"):
        evaluate.wilson_interval(5, 4)


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of the k-subsets of n samples (c of them correct) holding at least one correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))


def test_pass_at_k_matches_brute_force_enumeration():
    for n in range(1, 7):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = brute_force_pass_at_k(n, c, k)
                assert evaluate.pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-15), (n, c, k)
                assert evaluate.mean_pass_at_k([c], n, k) == float(expected), (n, c, k)
    counts = [0, 1, 4, 2, 3]
    for k in range(1, 5):
        assert evaluate.mean_pass_at_k(counts, 4, k) == float(sum(brute_force_pass_at_k(4, c, k) for c in counts) / 5)


def scored_rows(correct_by_problem: dict[str, list[int]]) -> list[dict]:
    """Constructed scored rows: one per (problem, draw) with the given rewards."""
    return [{"problem_id": pid, "population": "ID50", "draw": d, "text": "", "finish_reason": "eos",
             "response_tokens": 7, "reward": reward, "valid": True, "reason": "correct" if reward else "wrong_value"}
            for pid, rewards in correct_by_problem.items() for d, reward in enumerate(rewards)]


def test_per_draw_success_is_not_best_of_4():
    # One problem solved once in 4 samples, one never: 1 correct of 8 samples, 1 of 2 problems "solved".
    summary = evaluate.population_summary(scored_rows({"a": [0, 0, 1, 0], "b": [0, 0, 0, 0]}), "sample", 4)
    assert summary["responses"] == 8 and summary["problems"] == 2 and summary["correct"] == 1
    assert summary["success_rate"] == 1 / 8
    assert summary["best_of_4_not_pass_at_1"] == 1 / 2
    # pass@k by hand: problem a gives 1 - C(3,k)/C(4,k) = 1/4, 1/2, 3/4, 1; problem b gives 0.
    assert summary["pass_at_k"]["k"] == [1, 2, 3, 4]
    assert summary["pass_at_k"]["values"] == [1 / 8, 1 / 4, 3 / 8, 1 / 2]
    assert summary["pass_at_k"]["values"][0] == summary["success_rate"]  # pass@1 is per-draw success
    assert summary["pass_at_k"]["values"][-1] == summary["best_of_4_not_pass_at_1"]  # pass@4 is best-of-4
    assert summary["pass_at_k"]["label"] == "pass@k, n=4 samples per problem, 8 samples in all (2 problems)"
    assert summary["reasons"]["correct"] == 1 and summary["reasons"]["wrong_value"] == 7


# --- results ---------------------------------------------------------------------------------------


def test_results_hold_every_metric_per_policy_mode_and_population(root):
    results = evaluate.compute_results("tiny", root)
    assert results["policy_order"] == ["warm_start", "sft"]
    for policy in results["policy_order"]:
        entry = results["policies"][policy]
        assert entry["costs"] == read_json(root / policy / evaluate.COSTS_FILE)
        assert entry["complete"] is False  # a limited trial says so
        for mode, per_population in (("greedy", 2), ("sample", 8)):
            for population in evaluate.POPULATIONS:
                s = entry[mode][population]
                n = per_population * (2 if population == "ALL" else 1)
                assert s["responses"] == n and s["problems"] == n // (1 if mode == "greedy" else 4)
                assert set(s["reasons"]) == {"correct", *verifier.REASONS} and sum(s["reasons"].values()) == n
                assert s["success_rate"] == s["correct"] / n == s["reasons"]["correct"] / n
                assert s["success_rate_ci"] == evaluate.wilson_interval(s["correct"], n)
                for name in ("valid_json", "without_eos", "mean_response_tokens", "valid_json_ci"):
                    assert name in s
                assert ("pass_at_k" in s) == (mode == "sample") == ("best_of_4_not_pass_at_1" in s)


def test_results_recompute_is_byte_identical(root, tmp_path):
    copy = copy_root(root, tmp_path)
    path = evaluate.write_results("tiny", copy)
    first = path.read_bytes()
    assert evaluate.write_results("tiny", copy).read_bytes() == first
    assert evaluate.check_results("tiny", copy)
    path.write_bytes(first.replace(b'"correct"', b'"correct" ', 1))
    assert not evaluate.check_results("tiny", copy)


def test_results_command_writes_and_checks(monkeypatch, root, tmp_path, capsys):
    copy = copy_root(root, tmp_path)
    monkeypatch.setattr(evaluate, "evaluation_root", lambda preset, limit=None: copy)
    assert cli.main(["results-json", "--preset", "tiny"]) == 0
    assert "| warm_start | greedy | ALL | 4 |" in capsys.readouterr().out
    assert cli.main(["results-json", "--preset", "tiny", "--check"]) == 0
    assert (copy / evaluate.RESULTS_FILE).read_bytes() == evaluate.write_results("tiny", copy).read_bytes()


def test_markdown_table_renders_rates_as_percentages():
    rows = [{"policy": "sft", "mode": "greedy", "population": "ALL", "responses": 200, "correct": 3,
             "success_rate": 0.015, "success_rate_ci": [0.005114, 0.043166], "valid_json": 1.0, "without_eos": 0,
             "mean_response_tokens": 7.8}]
    assert evaluate.markdown_table(rows) == (
        "| policy | mode | population | responses | correct | success_rate | success_rate_ci (95%) | valid_json "
        "| without_eos | mean_response_tokens |\n"
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        "| sft | greedy | ALL | 200 | 3 | 1.5% | [0.5, 4.3] | 100.0% | 0 | 7.80 |\n"
    )


def test_evaluate_command_all_skips_missing_runs_and_keeps_finished_evaluations(monkeypatch, tmp_path, state_files,
                                                                                capsys):
    # A repository with one finished policy run (sft); a trial with --limit goes to evaluation/trials/limit-1.
    monkeypatch.setattr(evaluate, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(runs, "REPO_ROOT", tmp_path)  # where runs.display_path makes paths relative
    run = tmp_path / "runs" / "tiny" / "sft"
    run.mkdir(parents=True)
    shutil.copy(state_files["sft"], run / "model.safetensors")
    (run / "FINISHED").write_text("{}\n")
    argv = ["evaluate", "--preset", "tiny", "--policy", "all", "--limit", "1", "--max-new-tokens", "2"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "warm_start: no run\nsft: evaluated\ngrpo: no run\n" in out and "| sft | sample | ALL | 8 |" in out
    trial = tmp_path / "runs" / "tiny" / "evaluation" / "trials" / "limit-1"
    assert is_finished(trial / "sft") and (trial / evaluate.RESULTS_FILE).is_file()
    assert read_json(trial / "sft" / evaluate.MANIFEST_FILE)["state_file"] == "runs/tiny/sft/model.safetensors"
    assert not (tmp_path / "runs" / "tiny" / "evaluation" / "sft").exists()  # the real folder is untouched
    assert cli.main(argv) == 0
    assert "sft: kept" in capsys.readouterr().out
    assert evaluate.stale_evaluations("tiny", trial) == []
    (run / "model.safetensors").write_bytes(b"changed")
    assert evaluate.stale_evaluations("tiny", trial) == [
        "sft: runs/tiny/sft/model.safetensors changed since it was evaluated; re-run with --overwrite"]


def test_a_model_git_keeps_out_of_clones_is_not_called_stale(root, tmp_path):
    """Issue 58, item 11: on a fresh clone, results-json called the evaluations of the uncommitted G = 2 and
    G = 8 models stale; a missing file that .gitignore names is expected, any other is reported gone."""
    if (runs.REPO_ROOT / "runs/tiny/grpo_g2/model.safetensors").exists():
        pytest.skip("this checkout holds the G = 2 model (`cache fill` or `make cache` made it)")
    target = copy_root(root, tmp_path)
    manifest_path = target / "sft" / evaluate.MANIFEST_FILE
    for state_file, expected in (("runs/tiny/grpo_g2/model.safetensors", []),
                                 ("runs/tiny/no_such_run/model.safetensors",
                                  ["sft: its policy file runs/tiny/no_such_run/model.safetensors is gone"])):
        manifest = read_json(manifest_path)
        manifest["state_file"] = state_file
        runs.write_json(manifest_path, manifest)
        assert [m for m in evaluate.stale_evaluations("tiny", target) if m.startswith("sft")] == expected
