"""Chapter 2's checker: it accepts a right sequence log-probability and names each typical slip."""

import pytest
import torch

from labkit.book import exercises


def right(logits, response_ids):
    return torch.gather(torch.log_softmax(logits, dim=-1), 1, response_ids[:, None]).sum()


def averaged(logits, response_ids):
    return torch.gather(torch.log_softmax(logits, dim=-1), 1, response_ids[:, None]).mean()


def shifted_forward(logits, response_ids):
    # scores token j + 1 with row j: the shift of a causal LM's logits, applied twice
    return torch.gather(torch.log_softmax(logits[:-1], dim=-1), 1, response_ids[1:, None]).sum()


def shifted_backward(logits, response_ids):
    return torch.gather(torch.log_softmax(logits[1:], dim=-1), 1, response_ids[:-1, None]).sum()


def rolled(logits, response_ids):
    return torch.gather(torch.log_softmax(logits, dim=-1), 1, response_ids.roll(1)[:, None]).sum()


def raw_logits(logits, response_ids):
    return torch.gather(logits, 1, response_ids[:, None]).sum()


def wrong_dim(logits, response_ids):
    return torch.gather(torch.log_softmax(logits, dim=0), 1, response_ids[:, None]).sum()


def probability(logits, response_ids):
    return right(logits, response_ids).exp()


def no_eos(logits, response_ids):
    return torch.gather(torch.log_softmax(logits, dim=-1), 1, response_ids[:, None])[:-1].sum()


def underflow(logits, response_ids):
    return torch.gather(torch.log(torch.softmax(logits, dim=-1)), 1, response_ids[:, None]).sum()


def probabilities_summed(logits, response_ids):
    # log_softmax missing: the tokens' probabilities, not their log-probs
    return torch.gather(torch.softmax(logits, dim=-1), 1, response_ids[:, None]).sum()


def every_pair(logits, response_ids):
    # logp[:, ids] picks every response token at every row (an R x R table), not one per row
    return torch.log_softmax(logits, dim=-1)[:, response_ids].sum()


def whole_rows(logits, response_ids):
    # logp[ids] picks whole rows (indexed by token ids), not one entry per row
    return torch.log_softmax(logits, dim=-1)[response_ids].sum()


def gather_without_a_column_axis(logits, response_ids):
    return torch.gather(torch.log_softmax(logits, dim=-1), 1, response_ids).sum()


def test_the_right_answer_passes(capsys):
    assert exercises.check_ch02_sequence_logprob(right)
    assert "Correct" in capsys.readouterr().out


@pytest.mark.parametrize(("answer", "named"), [
    (averaged, r"you averaged the \d+ tokens' log-probs \(their sum divided by \d+\)"),
    (shifted_forward, r"off by one position: you scored token j \+ 1 with row j"),
    (shifted_backward, r"off by one position: you scored token j with row j \+ 1"),
    (rolled, r"off by one position \(the ids rolled by one\)"),
    (raw_logits, r"you summed raw logits"),
    (wrong_dim, r"log_softmax over the wrong dimension"),
    (probability, r"that is the probability exp\(sum\)"),
    (no_eos, r"the last token \(EOS\) is part of the response"),
    (underflow, r"log\(softmax\(x\)\) underflows"),
    (probabilities_summed, r"you summed the tokens' probabilities: log_softmax is missing"),
    (every_pair, r"you picked every response token at every row \(logp\[:, response_ids\]"),
    (whole_rows, r"you picked whole rows \(logp\[response_ids\]"),
    (gather_without_a_column_axis, r"torch.gather needs an index with as many dimensions as the table"),
])
def test_each_typical_slip_is_named(answer, named):
    with pytest.raises(exercises.ExerciseError, match=named):
        exercises.check_ch02_sequence_logprob(answer)


def test_a_slip_is_named_in_one_line_without_pytorch_words():
    with pytest.raises(exercises.ExerciseError) as caught:
        exercises.check_ch02_sequence_logprob(gather_without_a_column_axis)
    assert "\n" not in str(caught.value) and "Index tensor must have" not in str(caught.value)


def real_rollout():
    """A stand-in for the chapter's real rollout: logits (R, V), ids (R,), and the recorded log-probs."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 13, generator=g, dtype=torch.float64)
    ids = torch.randint(0, 13, (6,), generator=g)
    recorded = torch.gather(torch.log_softmax(logits, dim=-1), 1, ids[:, None]).squeeze(1).tolist()
    return logits, ids, recorded


def test_the_real_rollout_is_checked(capsys):
    assert exercises.check_ch02_sequence_logprob(right, real=real_rollout())
    assert "On the real rollout" in capsys.readouterr().out


def test_a_failure_on_the_real_rollout_is_reported_not_raised():
    calls = []

    def fails_on_the_real_one(logits, response_ids):
        calls.append(1)
        if len(calls) > 4:  # the four constructed cases pass, then the real rollout raises
            raise ValueError("boom")
        return right(logits, response_ids)

    with pytest.raises(exercises.ExerciseError, match=r"the real rollout.* raised ValueError: boom"):
        exercises.check_ch02_sequence_logprob(fails_on_the_real_one, real=real_rollout())
