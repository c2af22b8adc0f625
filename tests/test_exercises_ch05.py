"""Chapter 5's checker: it accepts a right blocked exact KL and names the usual mistakes."""

import pytest
import torch

from labkit.book import exercises


def right(logits_cur, logits_ref, block_size):
    N, V = logits_cur.shape
    starts = range(0, V, block_size)

    def lse(z):
        m = z.max(dim=-1).values
        total = torch.zeros(N, dtype=z.dtype)
        for s in starts:
            total += torch.exp(z[:, s:s + block_size] - m[:, None]).sum(-1)
        return m + total.log()

    lc, lr = lse(logits_cur), lse(logits_ref)
    kl = torch.zeros(N, dtype=logits_cur.dtype)
    for s in starts:
        logp, logq = logits_cur[:, s:s + block_size] - lc[:, None], logits_ref[:, s:s + block_size] - lr[:, None]
        kl += (logp.exp() * (logp - logq)).sum(-1)
    return kl


def each_block_alone(logits_cur, logits_ref, block_size):
    kl = torch.zeros(logits_cur.shape[0], dtype=logits_cur.dtype)
    for s in range(0, logits_cur.shape[1], block_size):
        logp = torch.log_softmax(logits_cur[:, s:s + block_size], -1)
        logq = torch.log_softmax(logits_ref[:, s:s + block_size], -1)
        kl += (logp.exp() * (logp - logq)).sum(-1)
    return kl


def reversed_direction(logits_cur, logits_ref, block_size):
    return right(logits_ref, logits_cur, block_size)


def no_max_subtraction(logits_cur, logits_ref, block_size):
    def lse(z):
        return torch.exp(z).sum(-1).log()  # overflows for large logits

    logp = logits_cur - lse(logits_cur)[:, None]
    logq = logits_ref - lse(logits_ref)[:, None]
    return (logp.exp() * (logp - logq)).sum(-1)


def summed(logits_cur, logits_ref, block_size):
    return right(logits_cur, logits_ref, block_size).sum()


def test_accepts_a_right_answer(capsys):
    assert exercises.check_ch05_blocked_kl(right) is True
    assert "all 7 cases" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (each_block_alone, "normalised each block on its own"),
    (reversed_direction, r"KL\(p_ref \|\| p_cur\)"),
    (no_max_subtraction, "subtract each row's maximum"),
    (summed, "one KL per prefix"),
    (lambda a, b, size: a @ b, "raised RuntimeError"),
    (42, "pass your function itself"),
])
def test_names_the_mistake(wrong, message):
    with pytest.raises(exercises.ExerciseError, match=message):
        exercises.check_ch05_blocked_kl(wrong)


def test_a_stub_keeps_its_your_turn_error():
    def stub(logits_cur, logits_ref, block_size):
        raise NotImplementedError("Your turn")

    with pytest.raises(NotImplementedError, match="Your turn"):
        exercises.check_ch05_blocked_kl(stub)
