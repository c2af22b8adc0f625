"""Shared-prompt scoring (`labkit.models.shared_prompt`) against the plain full-row path (`labkit.models.scoring`).

The two paths compute the same function; they differ only in float rounding (the
attention sums run over differently laid-out keys).  Measured bounds and the
tolerances asserted here:

    float32, tiny warm start      log-probs up to 5.4e-5 (values down to -41: about 1e-6 of the
                                  value), logits ~7e-5, gradients ~8e-6 relative (worst parameter);
                                  the log-probs are held to the protocol's pre-update tolerance, 2e-4
    float32, qwen-shaped 2 layers log-probs ~1e-6, gradients ~1e-6 relative
    float64 with exact softmax and RMSNorm     ~1e-13 everything

Qwen2's modules are NOT float64 in a float64 model: eager attention takes its
softmax in float32 (`softmax(..., dtype=torch.float32)`) and RMSNorm normalises in
float32, so `model.double()` alone agrees only to float32 rounding (~1e-5).  The
float64 tests swap both for full-precision versions (monkeypatched, this test
only) to show that what is left is float64 rounding, i.e. that the two paths are
the same computation.  The qwen-shaped model is Qwen2.5-0.5B-Instruct's
architecture (hidden 896, 14 query / 2 key-value heads, head_dim 64, MLP 4864,
rope_theta 1e6, biased q/k/v) with 2 layers and a vocabulary of 8,192 instead of
151,936 (the output head dominates the time otherwise; the head is not what the
shared path changes).
"""

import copy
from pathlib import Path

import pytest
import torch
import transformers.models.qwen2.modeling_qwen2 as modeling_qwen2

from labkit.grpo import core
from labkit.models import presets, scoring, shared_prompt
from labkit import smoke
from labkit.lab.runs import REPO_ROOT

WARM_START = REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"

F32 = dict(logp=2e-4, logits=1e-4, grad=5e-4)  # logp: the protocol's tolerance (config.logprob_check_tol)
F64_EXACT = dict(logp=1e-10, logits=1e-10, grad=1e-10)


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer): the warm start when present (sharper than a random model), else the base."""
    state = WARM_START if Path(WARM_START).is_file() else None
    return presets.load("tiny", state=state)


@pytest.fixture(scope="module")
def qwen_shaped():
    # Qwen's width and head geometry (14 query heads of 64 on 2 key-value heads, biased projections) on one
    # layer (the tiny model's tests above cover a stack of layers) and 8,192 vocabulary entries
    config = smoke.smoke_model_config(layers=1)
    config.vocab_size = 8192
    return smoke.random_model(config, seed=0, device="cpu")


@pytest.fixture(scope="module")
def rows(tiny):
    """Three real prompts of different lengths (66, 61, 40 tokens) x 4 responses of 9, 1, 3 and 7 tokens."""
    _, tokenizer = tiny
    pool = core.load_pool()
    prompts = [scoring.build_prompt_ids(tokenizer, pool[i]["statement"]) for i in range(3)]
    prompts[1] = prompts[1][:40]
    prompts.sort(key=len, reverse=True)
    responses = []
    for k in range(3):
        target = scoring.target_response_ids(tokenizer, pool[k]["target"])
        responses += [target, target[:1], target[:3], target[:-2]]
    return prompts, responses, 4, tokenizer.pad_token_id


def _exact_eager(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Qwen2's eager attention with the softmax in the query's dtype (not float32)."""
    key = modeling_qwen2.repeat_kv(key, module.num_key_value_groups)
    value = modeling_qwen2.repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _exact_rms_norm(self, hidden):
    """Qwen2RMSNorm in the input's dtype (not float32)."""
    return self.weight * (hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@pytest.fixture
def exact_float64(monkeypatch):
    monkeypatch.setattr(modeling_qwen2, "eager_attention_forward", _exact_eager)
    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _exact_rms_norm)


def _plain(model, prompts, responses, G, pad_id):
    batch = scoring.make_batch([prompts[b // G] for b in range(len(responses))], responses, pad_id)
    logp, logits = scoring.response_logprobs(model, batch, return_logits=True)
    return logp, logits, batch.response_mask


def _shared(model, prompts, responses, G, pad_id):
    logp, logits = shared_prompt.shared_response_logprobs(model, prompts, responses, G, pad_id,
                                                          return_logits=True)
    mask = scoring.make_batch([prompts[b // G] for b in range(len(responses))], responses,
                              pad_id).response_mask
    return logp, logits, mask


def _plain_head64(model, prompts, responses, G, pad_id):
    """The plain path with the head in the model's dtype (scoring casts the logits to float32)."""
    batch = scoring.make_batch([prompts[b // G] for b in range(len(responses))], responses, pad_id)
    hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                         position_ids=batch.position_ids, use_cache=False).last_hidden_state
    positions = scoring.predicting_positions(batch)
    hidden = torch.gather(hidden, 1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
    return _head64(model, hidden, batch.response_ids, batch.response_mask)


def _shared_head64(model, prompts, responses, G, pad_id):
    hidden, ids, mask = shared_prompt.shared_response_hidden(model, prompts, responses, G, pad_id)
    return _head64(model, hidden, ids, mask)


def _head64(model, hidden, ids, mask):
    mask = mask.to(hidden.dtype)
    logits = model.lm_head(hidden) * mask[:, :, None]
    logp = torch.gather(torch.log_softmax(logits, -1), 2, ids[:, :, None]).squeeze(2) * mask
    return logp, logits, mask


def _scores_and_gradients(model, path, rows):
    """(logp, logits, mask, {parameter name: gradient}) of a GRPO-shaped loss through `path`."""
    model.zero_grad(set_to_none=True)
    logp, logits, mask = path(model, *rows)
    shared_prompt._example_loss(logp, logits, mask.to(logits.dtype)).backward()
    grads = {name: p.grad.detach().clone() for name, p in presets.unique_parameters(model)}
    model.zero_grad(set_to_none=True)
    return logp.detach(), logits.detach(), mask, grads


def _agreement(model, rows, plain=_plain, shared=_shared):
    lp_a, lg_a, mask, g_a = _scores_and_gradients(model, plain, rows)
    lp_b, lg_b, _, g_b = _scores_and_gradients(model, shared, rows)
    assert lp_a.shape == lp_b.shape and lg_a.shape == lg_b.shape and lp_a.dtype == lp_b.dtype
    assert lg_a.dtype == lg_b.dtype
    off = mask == 0
    assert (lp_b[off] == 0).all() and (lg_b[off] == 0).all()  # zeros beyond each response, as scoring's
    grad = max(float((g_a[n] - g_b[n]).norm() / g_a[n].norm()) for n in g_a if g_a[n].norm() > 0)
    assert set(g_a) == set(g_b) and all(g_b[n].norm() > 0 for n in g_a if g_a[n].norm() > 0)
    return dict(logp=float((lp_a - lp_b).abs().max()), logits=float((lg_a - lg_b).abs().max()), grad=grad)


def _within(measured, tolerance):
    return all(measured[k] <= tolerance[k] for k in tolerance)


# Each prompt once, the responses in one batch (`shared`) or in buckets of similar length (`bucketed`, below).
SHARED_PATHS = {"shared": ("_shared", "_shared_head64"), "bucketed": ("_bucketed", "_bucketed_head64")}


@pytest.mark.parametrize("path", SHARED_PATHS)
def test_tiny_float32_matches_the_plain_path(tiny, rows, path):
    model, _ = tiny
    measured = _agreement(model, rows, shared=globals()[SHARED_PATHS[path][0]])
    assert _within(measured, F32), measured


@pytest.mark.parametrize("path", SHARED_PATHS)
def test_tiny_float64_matches_the_plain_path_to_float64_rounding(tiny, rows, exact_float64, path):
    model = copy.deepcopy(tiny[0]).double()
    measured = _agreement(model, rows, _plain_head64, globals()[SHARED_PATHS[path][1]])
    assert _within(measured, F64_EXACT), measured


def test_qwen_shaped_float32_matches_the_plain_path(qwen_shaped, rows):
    measured = _agreement(qwen_shaped, rows)
    assert _within(measured, F32), measured


def test_qwen_shaped_float64_matches_the_plain_path_to_float64_rounding(qwen_shaped, rows, exact_float64):
    model = copy.deepcopy(qwen_shaped).double()
    measured = _agreement(model, rows, _plain_head64, _shared_head64)
    assert _within(measured, F64_EXACT), measured


@pytest.mark.parametrize("shape", ["P=1", "G=1", "P=1,G=1", "one-token responses", "pad id in a response"])
def test_edge_shapes_match_the_plain_path(tiny, rows, shape):
    model, _ = tiny
    prompts, responses, G, pad_id = rows
    if shape == "P=1":
        prompts, responses = prompts[1:2], responses[G : 2 * G]
    elif shape == "G=1":
        responses, G = responses[::G], 1
    elif shape == "P=1,G=1":
        prompts, responses, G = prompts[2:], responses[2 * G + 2 : 2 * G + 3], 1
    elif shape == "one-token responses":  # no response forward at all
        responses = [r[:1] for r in responses]
    else:
        responses = [r if b % 2 else [pad_id] + r for b, r in enumerate(responses)]
    measured = _agreement(model, (prompts, responses, G, pad_id))
    assert _within(measured, F32), measured


def test_no_grad_and_train_eval_mode_left_as_they_were(tiny, rows):
    model, _ = tiny
    with torch.no_grad():
        logp, logits = shared_prompt.shared_response_logprobs(model, *rows)
    assert logits is None and not logp.requires_grad and not model.training
    plain, _, _ = _plain(model, *rows)
    assert float((logp - plain.detach()).abs().max()) <= F32["logp"]


@pytest.mark.parametrize("count", [11, 13, 0])
def test_wrong_number_of_responses_is_refused_naming_the_counts(tiny, rows, count):
    model, _ = tiny
    prompts, responses, G, pad_id = rows
    responses = (responses * 2)[:count]
    with pytest.raises(ValueError, match=rf"{count} responses for 3 prompts x G 4: expected 12"):
        shared_prompt.shared_response_logprobs(model, prompts, responses, G, pad_id)


def test_bad_group_size_prompts_and_rows_are_refused(tiny, rows):
    model, _ = tiny
    prompts, responses, G, pad_id = rows
    with pytest.raises(ValueError, match="G must be a positive integer"):
        shared_prompt.shared_response_logprobs(model, prompts, responses, 0, pad_id)
    with pytest.raises(ValueError, match="at least one prompt"):
        shared_prompt.shared_response_logprobs(model, [], [], G, pad_id)
    with pytest.raises(ValueError, match="row 5: empty response"):
        shared_prompt.shared_response_logprobs(model, prompts, responses[:5] + [[]] + responses[6:], G, pad_id)
    with pytest.raises(ValueError, match="row 4: empty prompt"):
        shared_prompt.shared_response_logprobs(model, [prompts[0], [], prompts[2]], responses, G, pad_id)


def test_benchmark_reports_both_paths(tiny, rows):
    model, _ = tiny
    report = shared_prompt.benchmark(model, *rows, repeats=1)
    assert set(report) == {"plain_s", "shared_s", "ratio", "rows", "prompts", "G", "repeats",
                           "max_abs_logp_diff"}
    assert report["rows"] == 12 and report["max_abs_logp_diff"] <= F32["logp"]
    assert all(p.grad is None for p in model.parameters())


# -- Bucketed responses: the same function, the responses run in buckets of similar length -----------

def test_buckets_take_rows_longest_first_and_close_at_the_token_budget():
    # lengths 3, 9, 1, 7, 7 at 16 tokens: 9 and 7 fill 2 x 8; 7 and 3 fill 2 x 6; 1 alone
    assert shared_prompt.buckets([3, 9, 1, 7, 7], 16) == [[1, 3], [4, 0], [2]]
    assert shared_prompt.buckets([5, 5], 1) == [[0], [1]]  # a bucket holds at least one row
    assert sorted(b for bucket in shared_prompt.buckets([4, 2, 8, 1, 6, 6, 3], 12) for b in bucket) == list(range(7))
    with pytest.raises(ValueError, match="bucket_tokens 0"):
        shared_prompt.buckets([3], 0)


BUCKET_TOKENS = 8  # the fixture's responses (three each of 9, 7, 3 and 1 tokens): 9s and 7s alone, 3s + a 1, 1s


def _bucketed(model, prompts, responses, G, pad_id):
    logp, logits = shared_prompt.shared_response_logprobs(model, prompts, responses, G, pad_id, return_logits=True,
                                                          bucket_tokens=BUCKET_TOKENS)
    mask = scoring.make_batch([prompts[b // G] for b in range(len(responses))], responses, pad_id).response_mask
    return logp, logits, mask


def _bucketed_head64(model, prompts, responses, G, pad_id):
    hidden, ids, mask = shared_prompt.shared_response_hidden(model, prompts, responses, G, pad_id,
                                                             bucket_tokens=BUCKET_TOKENS)
    return _head64(model, hidden, ids, mask)


def test_the_fixtures_responses_run_in_eight_buckets(rows):
    """So that the bucketed path's agreement above is tested across buckets, not within one."""
    assert len(shared_prompt.buckets([len(r) for r in rows[1]], BUCKET_TOKENS)) == 8


def test_worked_length_rows_are_refused_by_the_protocols_limits_and_taken_by_their_own(tiny, rows):
    model, _ = tiny
    prompts, responses, G, pad_id = rows
    long = [list(r) * 20 for r in responses]  # up to 180 tokens
    long = [r[:160] for r in long]
    with pytest.raises(ValueError, match="more than the limit of 64"):
        shared_prompt.shared_response_logprobs(model, prompts, long, G, pad_id)
    with torch.no_grad():
        one, _ = shared_prompt.shared_response_logprobs(model, prompts, long, G, pad_id, limits=(256, 160, 416))
        bucketed, _ = shared_prompt.shared_response_logprobs(model, prompts, long, G, pad_id, limits=(256, 160, 416),
                                                              bucket_tokens=256)
    assert bucketed.shape == (len(long), 160) and float((one - bucketed).abs().max()) <= F32["logp"]
