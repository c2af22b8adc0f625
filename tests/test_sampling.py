"""The reference and fast samplers, rollout records, the pre-update check, and groups."""

import json

import pytest
import torch

from labkit.eval import agreement
from labkit.models import rollouts, sampling, scoring
from labkit.task import verifier
from labkit.models.presets import new_tiny_model, parameter_digest
from labkit.task.problems import Problem, render_statement, solve
from labkit.models.tokenizer import load_tiny_tokenizer

NEW_TOKENS = 12  # short responses keep the tests fast; the logic does not depend on the length

PROBLEMS = [
    Problem(12, (3, 4), (5, 6)),
    Problem(40, (0, 17), (22, 9)),
    Problem(7, (1, 2), (3, 4)),
    Problem(50, (50, 50), (1, 99)),
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


def sharpened_tiny_model(seed: int = 0, scale: float = 5.0):
    """A random-init tiny model with its weight matrices scaled up.

    At its initial scale the model's logits are nearly flat and greedy decoding
    repeats one token; scaled by 5 its responses vary, so agreement tests compare
    real sequences.  (Dropout, eval mode and everything else are unchanged.)
    """
    model = new_tiny_model(seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(scale)
    return model


@pytest.fixture(scope="module")
def model():
    return sharpened_tiny_model()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [scoring.build_prompt_ids(tokenizer, render_statement(p, i % 4, "boxes")) for i, p in enumerate(PROBLEMS)]


@pytest.fixture(scope="module")
def digest(model):
    return parameter_digest(model)


def test_reference_greedy_equals_model_generate(model, tokenizer, prompts, digest):
    rollouts = sampling.sample_reference(model, tokenizer, prompts[:3], greedy=True, max_new_tokens=NEW_TOKENS,
                                         policy_digest=digest)
    for prompt, rollout in zip(prompts[:3], rollouts):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        assert rollout.response_ids == out[0, len(prompt):].tolist()
        assert rollout.seed is None and rollout.sampler == "reference"


@pytest.mark.parametrize("greedy", [True, False])
def test_fast_equals_reference(model, tokenizer, prompts, digest, greedy):
    if greedy:
        flat, seeds = prompts, None
    else:
        flat = [p for p in prompts for _ in range(3)]
        seeds = list(range(100, 100 + len(flat)))
    kwargs = dict(greedy=greedy, max_new_tokens=NEW_TOKENS, policy_digest=digest)
    assert len({len(p) for p in flat}) > 1  # prompts of different lengths: left padding is exercised
    reference = sampling.sample_reference(model, tokenizer, flat, seeds, **kwargs)
    fast = sampling.sample_fast(model, tokenizer, flat, seeds, **kwargs)
    assert [r.response_ids for r in fast] == [r.response_ids for r in reference]
    in_batches_of_5 = sampling.sample_fast(model, tokenizer, flat, seeds, batch_size=5, **kwargs)
    assert [r.response_ids for r in in_batches_of_5] == [r.response_ids for r in reference]
    assert [r.finish_reason for r in fast] == [r.finish_reason for r in reference]
    assert [r.text for r in fast] == [r.text for r in reference]
    for r, f in zip(reference, fast):
        assert f.sampler == "fast" and f.seed == r.seed
        assert torch.allclose(torch.tensor(f.logp_old), torch.tensor(r.logp_old), atol=1e-5)
    if not greedy:  # the seeds matter: different seeds of one prompt give different responses
        assert reference[0].response_ids != reference[1].response_ids


@pytest.mark.parametrize("greedy", [True, False])
def test_eos_stops_both_samplers_and_is_removed_from_the_text(model, tokenizer, prompts, digest, greedy):
    """Declare a token of one response to be EOS: every rollout stops right after its first occurrence.

    In the fast batch, rows then finish at different steps while the others run on;
    a finished row must stop drawing noise so the others keep their own streams.
    """
    flat = prompts if greedy else [p for p in prompts for _ in range(2)]
    seeds = None if greedy else list(range(20, 20 + len(flat)))
    kwargs = dict(greedy=greedy, max_new_tokens=NEW_TOKENS, policy_digest=digest)
    free = sampling.sample_reference(model, tokenizer, flat, seeds, eos_token_id=-1, **kwargs)  # never stops

    def cut(ids, stop):
        return ids[: ids.index(stop) + 1] if stop in ids else ids

    # Of the generated tokens, the one that makes rows stop at the most different steps.
    stop_token = max(sorted({t for f in free for t in f.response_ids}), key=lambda t: len({len(cut(f.response_ids, t)) for f in free}))
    expected = [cut(f.response_ids, stop_token) for f in free]
    assert len({len(e) for e in expected}) > 1  # rows really finish at different steps
    for sampler in (sampling.sample_reference, sampling.sample_fast):
        got = sampler(model, tokenizer, flat, seeds, eos_token_id=stop_token, **kwargs)
        assert [r.response_ids for r in got] == expected
        for r in got:
            if r.response_ids[-1] == stop_token:
                assert r.finish_reason == "eos"
                assert r.text == rollouts.decode_response(tokenizer, r.response_ids[:-1], tokenizer.eos_token_id)[0]
            else:
                assert r.finish_reason == "length" and len(r.response_ids) == NEW_TOKENS


def test_length_stop_is_recorded(model, tokenizer, prompts, digest):
    (rollout,) = sampling.sample_reference(model, tokenizer, prompts[:1], [3], max_new_tokens=5, policy_digest=digest)
    assert tokenizer.eos_token_id not in rollout.response_ids  # the random model does not stop here
    assert rollout.finish_reason == "length"
    assert len(rollout.response_ids) == len(rollout.logp_old) == 5


def test_recorded_logprobs_match_full_sequence_scores(model, tokenizer, prompts, digest):
    rollouts = sampling.sample_fast(model, tokenizer, prompts, [1, 2, 3, 4], max_new_tokens=NEW_TOKENS,
                                    policy_digest=digest)
    rollouts += sampling.sample_reference(model, tokenizer, prompts[:2], [5, 6], max_new_tokens=NEW_TOKENS,
                                          policy_digest=digest)
    result = sampling.check_recorded_logprobs(model, rollouts)
    assert result["ok"] and result["max_abs_diff"] <= 2e-4
    assert result["tokens"] == sum(len(r.response_ids) for r in rollouts)

    # A recorded score that is off by more than the tolerance is caught.
    rollouts[1].logp_old[2] += 1e-3
    with pytest.raises(ValueError, match="not reproduced"):
        sampling.check_recorded_logprobs(model, rollouts)
    assert sampling.check_recorded_logprobs(model, rollouts, strict=False)["worst_rollout_id"] == rollouts[1].rollout_id


def test_dropout_left_on_breaks_the_pre_update_check(tokenizer, prompts):
    model = new_tiny_model(seed=0)  # attention_dropout 0.1
    rollouts = sampling.sample_reference(model, tokenizer, prompts[:2], [1, 2], max_new_tokens=NEW_TOKENS,
                                         policy_digest="d")
    model.train()
    torch.manual_seed(0)
    result = sampling.check_recorded_logprobs(model, rollouts, strict=False)
    assert not result["ok"] and result["max_abs_diff"] > 1e-2


def test_train_mode_is_refused(tokenizer, prompts):
    model = new_tiny_model(seed=0).train()
    for sampler in (sampling.sample_reference, sampling.sample_fast):
        with pytest.raises(ValueError, match="train mode: dropout"):
            sampler(model, tokenizer, prompts[:1], [0], max_new_tokens=2, policy_digest="d")


@pytest.mark.parametrize("option", [{"top_k": 50}, {"top_p": 0.9}, {"temperature": 0.7}])
def test_truncated_or_tempered_sampling_is_refused(model, tokenizer, prompts, option):
    name = next(iter(option))
    for sampler in (sampling.sample_reference, sampling.sample_fast):
        with pytest.raises(ValueError, match=f"{name}=.* refused: the protocol samples the full distribution"):
            sampler(model, tokenizer, prompts[:1], [0], max_new_tokens=2, policy_digest="d", **option)


def test_seeds_and_greedy_are_exclusive(model, tokenizer, prompts):
    with pytest.raises(ValueError, match="one seed per rollout"):
        sampling.sample_reference(model, tokenizer, prompts[:1], max_new_tokens=2)
    with pytest.raises(ValueError, match="greedy sampling uses no seeds"):
        sampling.sample_fast(model, tokenizer, prompts[:1], [0], greedy=True, max_new_tokens=2)
    with pytest.raises(ValueError, match="1 seeds for 2 prompts"):
        sampling.sample_fast(model, tokenizer, prompts[:2], [0], max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer in 1..256"):
        sampling.sample_fast(model, tokenizer, prompts[:1], [0], max_new_tokens=257)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer in 1..256"):
        sampling.sample_fast(model, tokenizer, prompts[:1], [0], max_new_tokens=0)


def test_undecodable_ids_are_visible_and_invalidate(tokenizer):
    assert len(tokenizer) == 494  # the embedding has 512 rows: ids 494..511 have no token
    eos, im_start = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_start|>")
    good = tokenizer.encode('{"final_stock": 7}', add_special_tokens=False)
    assert rollouts.decode_response(tokenizer, good + [eos]) == ('{"final_stock": 7}', True)
    assert rollouts.decode_response(tokenizer, good + [im_start, eos]) == ('{"final_stock": 7}<|im_start|>', True)
    text, valid = rollouts.decode_response(tokenizer, good[:3] + [500] + good[3:] + [eos])
    assert not valid
    assert text == tokenizer.decode(good[:3]) + "<|undecodable:500|>" + tokenizer.decode(good[3:])
    assert tokenizer.decode([500]) == ""  # what a plain decode would have done: the id vanishes


def test_sampled_undecodable_ids_mark_the_rollout(model, tokenizer, prompts, digest):
    """Nothing is excluded from the vocabulary, so ids 494..511 can be sampled.

    A hook adds 4 to the logit of id 500 (about 10% probability) so that some, not
    all, of the sampled tokens are undecodable; greedy with +100 picks only 500.
    """
    boost = torch.zeros(model.config.vocab_size)
    boost[500] = 4.0
    handle = model.lm_head.register_forward_hook(lambda module, args, out: out + boost)
    try:
        kwargs = dict(max_new_tokens=NEW_TOKENS, policy_digest=digest)
        rollouts = sampling.sample_fast(model, tokenizer, [prompts[0]] * 8, list(range(8)), **kwargs)
        boost[500] = 100.0
        (greedy,) = sampling.sample_reference(model, tokenizer, prompts[:1], greedy=True, **kwargs)
    finally:
        handle.remove()
    assert any(500 in r.response_ids for r in rollouts) and not all(500 in r.response_ids for r in rollouts)
    for r in rollouts:
        assert r.tokenization_valid == (500 not in r.response_ids)
        assert r.text.count("<|undecodable:500|>") == r.response_ids.count(500)
    assert greedy.response_ids == [500] * NEW_TOKENS and not greedy.tokenization_valid
    assert greedy.text == "<|undecodable:500|>" * NEW_TOKENS and greedy.finish_reason == "length"


def test_rollout_record_is_complete_and_serialisable(model, tokenizer, prompts, digest):
    (r,) = sampling.sample_reference(model, tokenizer, prompts[:1], [11], max_new_tokens=3, problem_ids=["train-0200"],
                                     policy_digest=digest)
    d = json.loads(json.dumps(r.to_dict()))
    assert rollouts.Rollout.from_dict(d) == r
    assert d["problem_id"] == "train-0200" and d["prompt_ids"] == prompts[0] and d["seed"] == 11
    assert d["policy_digest"] == parameter_digest(model) and d["sampler"] == "reference" and d["seconds"] > 0
    assert d["rollout_id"] == "train-0200/s11"


def test_group_verifies_each_response_and_keeps_one_problem_id(model, tokenizer, digest):
    problem = PROBLEMS[1]
    statement = render_statement(problem, 0, "lamps")
    group = sampling.sample_group(model, tokenizer, "train-0300", statement, problem, G=4, seeds=[7, 8, 9, 10],
                                  max_new_tokens=NEW_TOKENS, policy_digest=digest)
    assert group.problem_id == "train-0300" and len(group.rollouts) == 4
    assert {r.problem_id for r in group.rollouts} == {"train-0300"}
    assert all(r.prompt_ids == group.prompt_ids for r in group.rollouts)
    expected = [verifier.score(r.text, r.finish_reason, problem, r.tokenization_valid) for r in group.rollouts]
    assert group.verdicts == expected
    assert group.rewards == [float(v.reward) for v in expected]
    json.dumps(group.to_dict())
    with pytest.raises(ValueError, match="3 seeds for a group of G=4"):
        sampling.sample_group(model, tokenizer, "x", statement, problem, G=4, seeds=[1, 2, 3])
    with pytest.raises(ValueError, match="unknown sampler"):
        sampling.sample_group(model, tokenizer, "x", statement, problem, G=1, seeds=[1], sampler="beam")


def test_group_reward_is_one_for_the_correct_answer(tokenizer):
    """A fake sampler-free check of the reward path: the verifier accepts the target answer."""
    problem = PROBLEMS[0]
    text, valid = rollouts.decode_response(tokenizer, scoring.target_response_ids(tokenizer, solve(problem)))
    assert verifier.score(text, "eos", problem, valid).reward == 1


def test_compare_samplers_counts_and_explains(model, tokenizer, prompts):
    result = agreement.compare_samplers(model, tokenizer, prompts[:2], 2, max_new_tokens=6)
    assert result["rollouts"] == 4 and result["identical"] + result["mismatching"] == 4
    assert result["tokens_equal"] <= result["tokens_compared"]

    # Explaining a mismatch: a "fast" rollout made to differ at step 2.
    (r,) = sampling.sample_reference(model, tokenizer, prompts[:1], [5], max_new_tokens=6, policy_digest="d")
    altered = rollouts.Rollout.from_dict({**r.to_dict(), "response_ids": r.response_ids[:2] + [(r.response_ids[2] + 1) % 494] + r.response_ids[3:]})
    info = agreement.explain_mismatch(model, r, altered)
    assert info["first_differing_step"] == 2 and info["reference_token"] == r.response_ids[2]
    assert info["top2_gap"] >= 0
    # The reference token won the decision at that step, so its score is the top one.
    assert info["score_gap_between_the_two_tokens"] >= info["top2_gap"] - 1e-9


def test_gumbel_max_samples_the_softmax():
    """Gumbel-max with independent streams draws tokens with probability softmax(logits)."""
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0]])
    counts = torch.zeros(4)
    for seed in range(4000):
        token, _ = rollouts.choose_tokens(logits, rollouts.GumbelStream(seed, 4).next()[None])
        counts[token] += 1
    expected = torch.softmax(logits[0], dim=0) * 4000
    # 4000 draws: each count within 5 standard deviations of its expectation
    std = (expected * (1 - expected / 4000)).sqrt()
    assert ((counts - expected).abs() < 5 * std).all(), (counts, expected)
