"""The static-cache sampler (`labkit.models.static_sampler`) against the reference sampler.

The two compute the same function in a different order (the attention sums run over a
preallocated, masked cache), so the logits differ by float32 rounding (~1e-6) and the
tokens are equal unless two candidates tie within that; none do on these rows.  The
behaviour log-probs agree within the protocol's pre-update tolerance (2e-4; measured: ~3e-5
on the tiny warm start, ~1e-6 on the qwen-shaped model).  These tests run under both kernel
families (`make test` repeats them with ATEN_CPU_CAPABILITY=default).
"""

from pathlib import Path

import pytest
import torch

from labkit.grpo import core
from labkit.models import presets, rollouts, sampling, scoring, static_sampler
from labkit import smoke
from labkit.lab.runs import REPO_ROOT

WARM_START = REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"
LOGPROB_TOL = sampling.LOGPROB_TOLERANCE


@pytest.fixture(scope="module")
def tiny():
    state = WARM_START if Path(WARM_START).is_file() else None
    return presets.load("tiny", state=state)


@pytest.fixture(scope="module")
def prompts(tiny):
    """Four real prompts of different lengths (one cut to 30 tokens)."""
    _, tokenizer = tiny
    pool = core.load_pool()
    out = [scoring.build_prompt_ids(tokenizer, pool[i]["statement"]) for i in range(4)]
    out[2] = out[2][:30]
    return out


def _assert_same(reference, static):
    assert [r.response_ids for r in static] == [r.response_ids for r in reference]
    assert [r.finish_reason for r in static] == [r.finish_reason for r in reference]
    assert [r.text for r in static] == [r.text for r in reference]
    worst = max(abs(a - b) for r, s in zip(reference, static) for a, b in zip(r.logp_old, s.logp_old))
    assert worst <= LOGPROB_TOL, worst
    assert {s.sampler for s in static} == {"static"}
    assert [s.rollout_id for s in static] == [r.rollout_id for r in reference]


@pytest.mark.parametrize("max_new_tokens", [64, 5])  # EOS inside the limit, and cut at the limit
def test_tiny_seeded_groups_equal_the_reference_sampler(tiny, prompts, max_new_tokens):
    model, tokenizer = tiny
    rows = [p for p in prompts for _ in range(4)]  # a GRPO iteration: G=4 rollouts share each prompt
    seeds = list(range(100, 116))
    ids = [f"p{i // 4}" for i in range(16)]
    common = dict(max_new_tokens=max_new_tokens, problem_ids=ids, policy_digest="test")
    reference = sampling.sample_reference(model, tokenizer, rows, seeds, **common)
    static = static_sampler.sample_static(model, tokenizer, rows, seeds, **common)
    _assert_same(reference, static)
    if max_new_tokens == 5:
        assert {r.finish_reason for r in static} == {"length"}


def test_tiny_greedy_distinct_prompts_and_batches_equal_the_reference_sampler(tiny, prompts):
    model, tokenizer = tiny
    reference = sampling.sample_reference(model, tokenizer, prompts, greedy=True, policy_digest="test")
    for batch_size in (None, 3, 1):
        static = static_sampler.sample_static(model, tokenizer, prompts, greedy=True, policy_digest="test",
                                              batch_size=batch_size)
        _assert_same(reference, static)


def test_noise_drawn_in_blocks_equals_one_vector_per_step(tiny, prompts, monkeypatch):
    """Blocks of 2 steps (so a response crosses several) give the same tokens as the reference's
    one draw per step; a block of (steps x V) holds the numbers of `steps` draws of (V,)."""
    monkeypatch.setattr(static_sampler, "NOISE_BLOCK_STEPS", 2)
    model, tokenizer = tiny
    rows, seeds = prompts[:2] * 3, [7, 8, 9, 10, 11, 12]
    reference = sampling.sample_reference(model, tokenizer, rows, seeds, policy_digest="test")
    _assert_same(reference, static_sampler.sample_static(model, tokenizer, rows, seeds, policy_digest="test"))
    blocks = static_sampler.NoiseBlocks([5], 64, 5, "cpu")
    stream = rollouts.GumbelStream(5, 64)
    for step in range(5):
        assert torch.equal(blocks.at(step)[0], stream.next())


def test_qwen_shaped_two_layers_equals_the_reference_sampler(tiny, prompts, monkeypatch):
    """Qwen2.5-0.5B's architecture (biased q/k/v, 14 query / 2 key-value heads, head_dim 64, MLP
    4864, rope_theta 1e6), 2 layers, random weights, a vocabulary of 8,192 instead of 151,936 (the
    full head makes this test 15 s longer and is not what the sampler changes): sampled and greedy.
    A small block budget makes the noise come in blocks of 2 steps, as 151,936 ids would."""
    _, tokenizer = tiny
    config = smoke.smoke_model_config(layers=2)
    config.vocab_size = 8192
    model = smoke.random_model(config, seed=0, device="cpu")
    monkeypatch.setattr(static_sampler, "NOISE_BLOCK_BYTES", 4 * 2 * 8192 * 8)
    assert static_sampler.NoiseBlocks([1] * 4, 8192, 6, "cpu").block == 2
    rows = [prompts[2], prompts[2], prompts[3][:20], prompts[3][:20]]
    for seeds, greedy in ((None, True), ([1, 2, 3, 4], False)):
        common = dict(greedy=greedy, max_new_tokens=6, policy_digest="test")
        reference = sampling.sample_reference(model, tokenizer, rows, seeds, **common)
        _assert_same(reference, static_sampler.sample_static(model, tokenizer, rows, seeds, **common))


def test_refusals_name_the_value(tiny, prompts):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="temperature=0.7 refused"):
        static_sampler.sample_static(model, tokenizer, prompts, [1, 2, 3, 4], temperature=0.7)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        static_sampler.sample_static(model, tokenizer, prompts, [1, 2, 3, 4], batch_size=0)
    decoder = static_sampler.StaticDecoder(model, 1, 4)
    with torch.no_grad(), pytest.raises(ValueError, match="the cache holds 4 positions; 5 were asked for"):
        decoder.prefill(torch.zeros((1, 5), dtype=torch.long), torch.ones((1, 5), dtype=torch.bool))


def test_finished_rows_leaving_the_decoder_changes_no_rollout(tiny, prompts, monkeypatch):
    """Rows that have finished leave the decoder once at most COMPACT_BELOW of its rows still run (worked answers:
    65 tokens on average, up to 160, so most steps ran mostly finished rows).  Each row's numbers are its own:
    the rollouts equal those of a decoder that keeps every row (measured here: bit for bit; asserted: the same
    tokens, log-probs within float32 rounding, since another kernel family may block a smaller batch otherwise)."""
    model, tokenizer = tiny
    rows = [p for p in prompts for _ in range(8)]
    seeds = list(range(200, 232))
    common = dict(max_new_tokens=64, policy_digest="test")
    compacted = static_sampler.sample_static(model, tokenizer, rows, seeds, **common)
    assert len({len(r.response_ids) for r in compacted}) > 3  # rows finish at many different steps
    monkeypatch.setattr(static_sampler, "COMPACT_BELOW", 2.0)  # never: every row stays to the end
    kept = static_sampler.sample_static(model, tokenizer, rows, seeds, **common)
    assert [r.response_ids for r in compacted] == [r.response_ids for r in kept]
    worst = max(abs(a - b) for r, s in zip(kept, compacted) for a, b in zip(r.logp_old, s.logp_old))
    assert worst <= 1e-6, worst
