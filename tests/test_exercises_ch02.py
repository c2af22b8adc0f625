"""Chapter 2's checker: it accepts a right sequence log-probability and names each typical slip."""

import pytest
import torch

from labkit import exercises


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
])
def test_each_typical_slip_is_named(answer, named):
    with pytest.raises(exercises.ExerciseError, match=named):
        exercises.check_ch02_sequence_logprob(answer)
