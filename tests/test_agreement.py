"""The sampler agreement report: counts, explained mismatches, seeds, the written report."""

import hashlib
import json

import pytest
import torch

from labkit.eval import agreement
from labkit.models import sampling
from labkit.eval.evaluate import eval_seed
from labkit.models.presets import new_tiny_model, save_model
from labkit.lab.runs import RunExistsError, read_json
from labkit.models.tokenizer import load_tiny_tokenizer

PROBLEMS = 3  # the first 3 test statements
DRAWS = 2
NEW_TOKENS = 6  # short responses keep the tests fast; counting does not depend on the length


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    model = new_tiny_model(seed=0, tokenizer=tokenizer)
    with torch.no_grad():  # sharpen the near-flat random-init logits so responses vary
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(5.0)
    return model


@pytest.fixture(scope="module")
def problems(tokenizer):
    return agreement.load_test_prompts(tokenizer, limit=PROBLEMS)


def _reference_as_fast(model, tokenizer, prompts, seeds=None, *, batch_size=None, **kwargs):
    """The reference sampler standing in for the fast one: the two samplers are then identical."""
    return sampling.sample_reference(model, tokenizer, prompts, seeds, **kwargs)


def test_seeds_are_the_evaluation_seeds_sha256_truncated_to_62_bits():
    seeds = agreement.draw_seeds(["test-0000", "test-0001"], draws=2)
    by_hand = int.from_bytes(hashlib.sha256(b"eval/test-0001/1").digest()[:8], "big") >> 2
    assert seeds == [[eval_seed("test-0000", 0), eval_seed("test-0000", 1)],
                     [eval_seed("test-0001", 0), by_hand]]
    assert all(0 <= s < 2 ** 62 for row in seeds for s in row)
    with pytest.raises(ValueError, match="draws must be a positive integer"):
        agreement.draw_seeds(["test-0000"], draws=0)


def test_prompts_are_the_first_test_statements_and_limit_is_checked(tokenizer, problems):
    ids, prompts = problems
    assert ids == ["test-0000", "test-0001", "test-0002"]
    assert len(prompts) == PROBLEMS and all(len(p) > 0 for p in prompts)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        agreement.load_test_prompts(tokenizer, limit=0)


def test_identical_samplers_give_no_mismatch_and_every_count(model, tokenizer, problems, monkeypatch):
    monkeypatch.setattr(sampling, "sample_fast", _reference_as_fast)
    ids, prompts = problems
    result = agreement.measure(model, tokenizer, ids, prompts, DRAWS, max_new_tokens=NEW_TOKENS)
    for mode, rollouts in (("greedy", PROBLEMS), ("seeded", PROBLEMS * DRAWS)):
        r = result[mode]
        assert (r["mode"], r["rollouts"], r["identical"], r["mismatching"]) == (mode, rollouts, rollouts, 0)
        assert r["mismatches"] == [] and (r["near_tie_mismatches"], r["unexplained_mismatches"]) == (0, 0)
        assert r["tokens_equal"] == r["tokens_compared"] == r["reference_tokens"] == r["fast_tokens"]
    s = result["summary"]
    assert (s["greedy_identical"], s["greedy_rollouts"], s["seeded_identical"], s["seeded_rollouts"]) == (
        PROBLEMS, PROBLEMS, PROBLEMS * DRAWS, PROBLEMS * DRAWS)
    assert (s["mismatching"], s["unexplained_mismatches"]) == (0, 0)
    assert s["reference_seconds"] == pytest.approx(result["greedy"]["reference_seconds"]
                                                   + result["seeded"]["reference_seconds"])


def test_an_injected_difference_is_counted_and_explained_at_its_step(model, tokenizer, problems, monkeypatch):
    ids, prompts = problems
    target_seed = agreement.draw_seeds(ids, DRAWS)[1][1]  # problem test-0001, draw 1

    def fast_with_one_changed_token(model, tokenizer, prompts, seeds=None, *, batch_size=None, **kwargs):
        rollouts = sampling.sample_reference(model, tokenizer, prompts, seeds, **kwargs)
        for r in rollouts:
            if r.seed == target_seed:
                r.response_ids[2] = (r.response_ids[2] + 1) % model.config.vocab_size
        return rollouts

    monkeypatch.setattr(sampling, "sample_fast", fast_with_one_changed_token)
    result = agreement.compare(model, tokenizer, ids, prompts, agreement.draw_seeds(ids, DRAWS),
                               max_new_tokens=NEW_TOKENS)
    assert (result["rollouts"], result["identical"], result["mismatching"]) == (PROBLEMS * DRAWS, 5, 1)
    [m] = result["mismatches"]
    assert (m["problem_id"], m["draw"], m["seed"], m["first_differing_step"]) == ("test-0001", 1, target_seed, 2)
    assert m["fast_token"] == (m["reference_token"] + 1) % model.config.vocab_size
    assert m["verdict"] == agreement.classify_mismatch(m)
    assert result["near_tie_mismatches"] + result["unexplained_mismatches"] == 1
    assert result["tokens_compared"] - result["tokens_equal"] == NEW_TOKENS - 2  # common prefix: 2 tokens


def test_classify_mismatch_near_tie_only_within_the_threshold():
    assert agreement.classify_mismatch({"score_gap_between_the_two_tokens": 3e-7}) == "near_tie"
    assert agreement.classify_mismatch({"score_gap_between_the_two_tokens": -3e-7}) == "near_tie"
    assert agreement.classify_mismatch({"score_gap_between_the_two_tokens": 0.5}) == "unexplained"
    assert agreement.classify_mismatch({"explanation": "one response is a prefix of the other"}) == "unexplained"


def test_report_is_written_once_and_fast_agrees_with_reference(model, tmp_path):
    state = save_model(model, tmp_path / "model.safetensors")
    out = tmp_path / "agreement.json"
    report = agreement.run("tiny", state=state, out=out, limit=PROBLEMS, draws=DRAWS, max_new_tokens=NEW_TOKENS)
    assert read_json(out) == json.loads(json.dumps(report))  # the report returned is the report written
    assert (report["problems"], report["draws"], report["greedy"]["rollouts"], report["seeded"]["rollouts"]) == (
        PROBLEMS, DRAWS, PROBLEMS, PROBLEMS * DRAWS)
    # The real fast sampler: every pair identical, or each difference a floating-point near-tie.
    assert report["summary"]["unexplained_mismatches"] == 0
    with pytest.raises(RunExistsError, match="never overwritten"):
        agreement.run("tiny", state=state, out=out, limit=PROBLEMS, draws=DRAWS, max_new_tokens=NEW_TOKENS)
