"""Every key the lab writes is documented in labkit.grpo.metrics, and every documented name is written.

The keys come from real runs made here (a 2-iteration GRPO run and a short SFT branch on the
tiny model) and from the committed evaluation's results.json, so a new key cannot slip in
undocumented, and a documented name that nothing writes any more is reported too.
"""

import pytest

from labkit.grpo import loop, metrics
from labkit.models import presets
from labkit.train import sft
from labkit.config import TINY
from labkit.lab.runs import REPO_ROOT, read_json


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    start = root / "start.safetensors"
    presets.save_model(presets.new_tiny_model(seed=3), start)
    loop.run_grpo(TINY.with_overrides(max_new_tokens=4, checkpoint_problems=8), root / "grpo", G=2,
                  iterations=2,
                  start_file=start, progress=False)
    return root / "grpo"


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    short = TINY.with_overrides(warm_start_examples=8, warm_start_epochs=1, sft_batch_size=4)
    folder = tmp_path_factory.mktemp("metrics_sft") / "warm_start"
    tokenizer = presets.load_tiny_tokenizer()
    manifest = sft.run_branch(short, "warm_start", folder, model_factory=lambda: (presets.new_tiny_model(0, tokenizer),
                                                                                   tokenizer),
                              validation_limit=3, progress=False)
    return folder, manifest


def keys(records) -> set[str]:
    return {k for r in records for k in r}


def test_grpo_history_updates_rows_and_timings_are_documented(grpo_run):
    history = read_json(grpo_run / "history.json")
    assert keys(history) == set(metrics.GRPO_ITERATION)
    assert keys(u for h in history for u in h["updates"]) == set(metrics.GRPO_UPDATE)
    assert keys(loop.read_rollouts(grpo_run)) == set(metrics.ROLLOUT_ROW)
    assert keys(loop.read_timings(grpo_run)) == set(metrics.GRPO_TIMINGS)
    checkpoints = loop.read_checkpoints(grpo_run)
    assert [c["iteration"] for c in checkpoints] == [0, 2]  # the start and the end of a 2-iteration run
    assert keys(checkpoints) == set(metrics.GRPO_CHECKPOINT)


def test_the_variants_keys_of_an_iteration_record_are_documented():
    """The keys `core.record_iteration` writes only for some variants, read from its source."""
    import ast
    import inspect

    from labkit.grpo import core

    tree = ast.parse(inspect.getsource(core.record_iteration).lstrip())
    written = {node.value for node in ast.walk(tree) if isinstance(node, ast.Dict) for node in node.keys
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    variant_keys = written - set(metrics.GRPO_ITERATION)
    assert variant_keys == set(metrics.GRPO_ITERATION_VARIANTS), variant_keys


def test_sft_history_and_greedy_validation_are_documented(sft_run):
    folder, manifest = sft_run
    history = read_json(folder / "history.json")
    assert keys(history["updates"]) == set(metrics.SFT_UPDATE)
    assert keys(history["validation"]) == set(metrics.SFT_VALIDATION)
    assert set(manifest["validation_greedy"]) == set(metrics.GREEDY_VALIDATION)
    assert set(manifest["start_validation_greedy"]) == set(metrics.GREEDY_VALIDATION)


def test_the_evaluations_results_are_documented():
    results = read_json(REPO_ROOT / "runs" / "tiny" / "evaluation" / "results.json")
    written = set()
    for policy in results["policies"].values():
        for mode in results["modes"]:
            for population in results["populations"]:
                written |= set(policy[mode][population])
    assert written, "no metric block found in results.json"
    assert metrics.undocumented(written, metrics.EVALUATION) == []
    assert results["metrics"] == metrics.EVALUATION


def test_one_name_one_meaning_across_tables():
    """A name shared by two tables is the same quantity (the same first words of its description)."""
    assert metrics.GREEDY_VALIDATION["without_eos"] == metrics.EVALUATION["without_eos"]
    for table in metrics.ALL.values():
        assert all(isinstance(v, str) and v for v in table.values())
    assert "lr" not in metrics.SFT_UPDATE and "accuracy" not in metrics.GREEDY_VALIDATION


def read_jsonl(path):
    import json

    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


TINY_RUNS = REPO_ROOT / "runs" / "tiny"


def test_the_base_pretraining_logs_are_documented():
    """Both phases of the committed base (the cache check keeps them what pretrain.py writes)."""
    corpus_log = read_jsonl(TINY_RUNS / "base" / "corpus_log.jsonl")
    answer_log = read_jsonl(TINY_RUNS / "base" / "log.jsonl")
    assert keys(corpus_log) == set(metrics.PRETRAIN_CORPUS_LOG)
    assert keys(answer_log) == set(metrics.PRETRAIN_ANSWER_LOG)
    assert {r["kind"] for r in answer_log} == {"train", "eval"}


def test_the_format_base_log_is_documented():
    log = read_json(TINY_RUNS / "format_base" / "log.json")
    assert keys(log) == set(metrics.FORMAT_BASE_LOG)
    assert {r["kind"] for r in log} == {"train", "measure"}


def test_the_learned_verifiers_fit_and_samples_are_documented():
    import gzip
    import json

    from labkit.studies import reward_model

    assert keys(read_json(TINY_RUNS / "reward_model" / "history.json")) == set(metrics.REWARD_MODEL_FIT)
    with gzip.open(TINY_RUNS / "reward_model" / "samples.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    assert keys(rows) == set(metrics.REWARD_MODEL_SAMPLE)
    assert keys(r["features"] for r in rows) == set(reward_model.FEATURES)


def test_a_gradient_norm_has_one_name_in_every_table():
    """grad_norm everywhere (not gradient_norm); learning_rate everywhere but the frozen base's logs."""
    for name, table in metrics.ALL.items():
        assert "gradient_norm" not in table, name
        if not name.startswith("pretrain_"):
            assert "lr" not in table, name
