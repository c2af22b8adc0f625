"""Prompt/response rows, masks, teacher-forced log-probs and the SFT loss."""

import math
from types import SimpleNamespace

import pytest
import torch

from labkit.models import scoring
from labkit.models.presets import new_tiny_model
from labkit.task.problems import FORMAT_INSTRUCTION
from labkit.models.tokenizer import load_tiny_tokenizer

STATEMENT = "A warehouse holds 12 boxes. It receives deliveries of 3 and 4 boxes, then ships out 5 and 6 boxes. How many boxes are in stock now?"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def model():
    return new_tiny_model(seed=0)


# A bigram "language model" whose next-token distribution depends only on the current
# token: P[x] is the distribution after x.  Its log-probs can be written down by hand.
P = torch.tensor(
    [
        [1 / 8, 2 / 8, 5 / 8],  # after token 0
        [1 / 2, 1 / 4, 1 / 4],  # after token 1
        [1 / 3, 1 / 3, 1 / 3],  # after token 2
    ],
    dtype=torch.float64,
)


class BigramModel(torch.nn.Module):
    """Exposes `.model(...)` -> last_hidden_state and `.lm_head` like Qwen2ForCausalLM."""

    def __init__(self):
        super().__init__()
        self.lm_head = torch.nn.Linear(3, 3, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.log(P).T.float())  # one-hot(x) @ W.T = log P[x]
        self.model = lambda input_ids, attention_mask, position_ids, use_cache: SimpleNamespace(
            last_hidden_state=torch.nn.functional.one_hot(input_ids, 3).float()
        )


def test_prompt_is_the_chat_template_of_statement_and_instruction(tokenizer):
    ids = scoring.build_prompt_ids(tokenizer, STATEMENT)
    expected = f"<|im_start|>user\n{STATEMENT}\n{FORMAT_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(ids, skip_special_tokens=False) == expected


def test_over_long_prompt_is_refused_not_truncated(tokenizer):
    n = len(scoring.build_prompt_ids(tokenizer, STATEMENT))
    assert len(scoring.build_prompt_ids(tokenizer, STATEMENT, max_prompt_tokens=n)) == n
    with pytest.raises(ValueError, match=f"{n} tokens, more than the limit of {n - 1}"):
        scoring.build_prompt_ids(tokenizer, STATEMENT, max_prompt_tokens=n - 1)


def test_target_response_is_the_json_answer_then_eos(tokenizer):
    assert scoring.answer_text(8) == '{"final_stock": 8}'
    ids = scoring.target_response_ids(tokenizer, 8)
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(ids[:-1]) == '{"final_stock": 8}'
    with pytest.raises(ValueError):
        scoring.answer_text(True)


def test_make_batch_right_pads_and_masks_by_position():
    # The second response contains the pad id 0: it is still a response token (masked by position).
    batch = scoring.make_batch([[5, 6, 7], [8]], [[9, 10], [11, 0, 13]], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 9, 10], [8, 11, 0, 13, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4]] * 2
    assert batch.prompt_lengths.tolist() == [3, 1]
    assert batch.response_lengths.tolist() == [2, 3]
    assert batch.response_ids.tolist() == [[9, 10, 0], [11, 0, 13]]
    assert batch.response_mask.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    assert scoring.predicting_positions(batch).tolist() == [[2, 3, 4], [0, 1, 2]]
    assert batch.num_active_tokens == 5


@pytest.mark.parametrize(
    "prompts, responses, limits, message",
    [
        ([[1] * 257], [[2]], scoring.LIMITS, "row 0: prompt has 257 tokens, more than the limit of 256"),
        ([[1], [1] * 4], [[2], [2] * 65], scoring.LIMITS, "row 1: response has 65 tokens, more than the limit of 64"),
        ([[1] * 5], [[2] * 3], (5, 3, 7), "row 0: prompt \\+ response has 8 tokens, more than the limit of 7"),
        ([[1], [1]], [[2], []], scoring.LIMITS, "row 1: empty response"),
        ([[]], [[2]], scoring.LIMITS, "row 0: empty prompt"),
    ],
)
def test_over_long_or_empty_rows_are_refused(prompts, responses, limits, message):
    with pytest.raises(ValueError, match=message):
        scoring.make_batch(prompts, responses, pad_id=0, limits=limits)


def test_largest_allowed_row_is_accepted():
    batch = scoring.make_batch([[1] * 256], [[2] * 64], pad_id=0)
    assert batch.input_ids.shape == (1, 320)


def test_logprobs_equal_the_hand_computation_on_a_bigram_model():
    batch = scoring.make_batch([[0], [1, 2]], [[2], [0, 1, 1]], pad_id=1)
    logp, logits = scoring.response_logprobs(BigramModel(), batch, return_logits=True)
    expected = [
        [math.log(5 / 8), 0.0, 0.0],  # P[0][2]; then nothing
        [math.log(1 / 3), math.log(2 / 8), math.log(1 / 4)],  # P[2][0], P[0][1], P[1][1]
    ]
    assert torch.allclose(logp.double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert logits.shape == (2, 3, 3)
    assert torch.allclose(logits[1, 0].double(), torch.log(P[2]), atol=1e-6)  # predicts response token 0 of row 1
    assert logits[0, 1:].abs().sum() == 0  # beyond row 0's response


def test_logprobs_equal_log_softmax_of_a_plain_forward(model, tokenizer):
    prompt = scoring.build_prompt_ids(tokenizer, STATEMENT)
    response = scoring.target_response_ids(tokenizer, 8)
    logp, _ = scoring.response_logprobs(model, scoring.make_batch([prompt], [response], pad_id=0))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0].double()  # (T, V)
    by_hand = [torch.log_softmax(logits[len(prompt) + j - 1], dim=-1)[t] for j, t in enumerate(response)]
    assert torch.allclose(logp[0].double(), torch.stack(by_hand), atol=1e-5)


def test_batched_equals_each_row_alone(model, tokenizer):
    statements = [STATEMENT, "Inventory log for bolts: opening stock 7; delivery +1; delivery +2; withdrawal -3; withdrawal -4. Give the closing stock.", "x"]
    prompts = [scoring.build_prompt_ids(tokenizer, s) for s in statements]
    responses = [scoring.target_response_ids(tokenizer, t) for t in (8, 3, 123)]
    responses[2] = responses[2] + [500, 7, tokenizer.eos_token_id]  # different lengths, an undecodable id too
    batch = scoring.make_batch(prompts, responses, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        logp, logits = scoring.response_logprobs(model, batch, return_logits=True)
        for b, (p, r) in enumerate(zip(prompts, responses)):
            alone, alone_logits = scoring.response_logprobs(model, scoring.make_batch([p], [r], 0), return_logits=True)
            n = len(r)
            assert torch.allclose(logp[b, :n], alone[0], atol=1e-5, rtol=0)
            assert torch.allclose(logits[b, :n], alone_logits[0], atol=1e-5, rtol=0)
            assert (logp[b, n:] == 0).all()


def test_scoring_leaves_train_or_eval_mode_as_it_was(model, tokenizer):
    batch = scoring.make_batch([[1, 2, 3]], [[4, tokenizer.eos_token_id]], pad_id=0)
    try:
        model.train()
        scoring.response_logprobs(model, batch)
        assert model.training
        model.eval()
        scoring.sft_loss(model, batch)
        assert not model.training
    finally:
        model.eval()


def test_sft_loss_is_the_token_weighted_mean_not_a_mean_of_means():
    model = BigramModel()
    batch = scoring.make_batch([[0], [1, 2]], [[2], [0, 1, 1]], pad_id=1)
    token_terms = [math.log(5 / 8), math.log(1 / 3), math.log(2 / 8), math.log(1 / 4)]
    expected = -sum(token_terms) / 4
    mean_of_means = -(token_terms[0] + sum(token_terms[1:]) / 3) / 2
    loss = scoring.sft_loss(model, batch)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert abs(expected - mean_of_means) > 0.1  # the two normalisations really differ here

    # Accumulation: micro-batch losses over the accumulated batch's token count sum to the whole.
    first = scoring.make_batch([[0]], [[2]], pad_id=1)
    second = scoring.make_batch([[1, 2]], [[0, 1, 1]], pad_id=1)
    summed = scoring.sft_loss(model, first, num_active_tokens=4) + scoring.sft_loss(model, second, num_active_tokens=4)
    assert summed.item() == pytest.approx(expected, abs=1e-6)


def test_sft_loss_has_gradients(model, tokenizer):
    batch = scoring.make_batch([[1, 2, 3]], [[4, tokenizer.eos_token_id]], pad_id=0)
    model.zero_grad()
    scoring.sft_loss(model, batch).backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    model.zero_grad()
