"""Answers that must never be graded "Correct", nor crash a checker: a NaN, text, a truth value, a float32
tensor where the inputs are float64, a tensor on another device, a whole number from `//` (issue 57).
Each is refused in one line that names the slip."""

import math
import re

import pytest
import torch

from labkit.book.exercises import ch03, ch04, ch05, ch07, ch08
from labkit.book.exercises._calling import ExerciseError
from labkit.eval.evaluate import pass_at_k


def right_ch04(logp_cur, logp_old, advantages, clip_eps):
    rho = (logp_cur - logp_old).exp()
    return torch.minimum(rho * advantages[:, None], rho.clamp(1 - clip_eps, 1 + clip_eps) * advantages[:, None])


@pytest.mark.parametrize("answer, message", [
    (lambda *a: right_ch04(*a) * float("nan"), r"clipped_objective returned nan at index \(0, 0\): every value must "
                                               r"be finite"),
    (lambda *a: right_ch04(*a).float(), r"clipped_objective returned float32, the inputs are float64: keep their "
                                        r"dtype \(torch.tensor\(...\) without a dtype and .float\(\) make float32\)"),
    (lambda *a: torch.zeros(5, 9, dtype=torch.float64, device="meta", requires_grad=True),
     "clipped_objective returned a tensor on device meta, the inputs are on cpu"),
])
def test_chapter_4_refuses_nan_float32_and_another_device(answer, message):
    with pytest.raises(ExerciseError, match=message):
        ch04.check_ch04_clipped_objective(answer)
    ch04.check_ch04_clipped_objective(right_ch04)  # the right answer still passes


def test_chapter_3_names_the_nan_of_a_zero_std():
    def no_eps(r):  # right wherever the std is not zero; 0 / 0 in a constant group
        centred, std = r - r.mean(dim=1, keepdim=True), r.std(dim=1, correction=0, keepdim=True)
        return torch.where(std > 0, centred / (std + 1e-8), centred / std)

    with pytest.raises(ExerciseError, match="returned nan at index .*a division by a zero standard deviation"):
        ch03.check_ch03_group_advantages(no_eps)


def test_chapter_5_refuses_a_tensor_on_another_device():
    with pytest.raises(ExerciseError, match="blocked_kl returned a tensor on device meta"):
        ch05.check_ch05_blocked_kl(lambda cur, ref, b: torch.zeros(cur.shape[0], dtype=cur.dtype, device="meta"))


@pytest.mark.parametrize("answer, message", [
    (lambda n, c, k: str(pass_at_k(n, c, k)), r"returned '0.25' \(str\); return a number \(a probability\), not "
                                              r"text or a truth value"),
    (lambda n, c, k: True, r"returned True \(bool\)"),
    (lambda n, c, k: float("nan"), "returned nan; a probability is a finite number"),
    (lambda n, c, k: 1 - math.comb(n - c, k) // math.comb(n, k), "you returned the whole number 1: `//` rounds "
                                                                 "down to an integer; divide with `/`"),
])
def test_chapter_7_refuses_text_truth_values_nan_and_integer_division(answer, message):
    with pytest.raises(ExerciseError, match=message):
        ch07.check_ch07_pass_at_k(answer)


def test_chapter_7_takes_a_one_value_tensor():
    assert ch07.check_ch07_pass_at_k(lambda n, c, k: torch.tensor(pass_at_k(n, c, k), dtype=torch.float64))


@pytest.mark.parametrize("answer, message", [
    (lambda p, G: str(p ** G + (1 - p) ** G), r"returned '0.5' \(str\)"),
    (lambda p, G: float("inf"), "returned inf; a probability is a finite number"),
])
def test_chapter_8_refuses_text_and_non_finite_numbers(answer, message):
    with pytest.raises(ExerciseError, match=message):
        ch08.check_ch08_zero_signal(answer)


def test_chapter_6_refuses_a_nan_loss():
    """A loss of NaN compared as neither above nor below the right one, so it was graded "Correct"."""
    from labkit.book.exercises import ch06

    def nan_loss(logp_cur, *rest):
        return (logp_cur * float("nan")).sum()

    with pytest.raises(ExerciseError, match=r"grpo_loss returned nan at index \(\): every value must be finite"):
        ch06.check_ch06_grpo_loss(nan_loss)


@pytest.mark.parametrize("answer, hint", [
    (lambda r: (r - r.mean(dim=1)) / (r.std(dim=1, correction=0) + 1e-8), "keep the group axis, r.mean(dim=1, keepdim=True)"),
    (lambda r: (r - r.mean(dim=0, keepdim=True)) / (r.std(dim=0, correction=0, keepdim=True) + 1e-8),
     "over each row (dim=1, one group per row), not down the columns"),
    (lambda r: (r - r.mean()) / (r.std(correction=0) + 1e-8), "mean and std are taken within each group"),
])
def test_chapter_3_names_the_axis_slips_in_a_short_message(answer, hint):
    """Issue 57: these slips got 750-character messages listing every number; now one group and the slip."""
    with pytest.raises(ExerciseError, match=re.escape(hint)) as error:
        ch03.check_ch03_group_advantages(answer)
    assert len(str(error.value)) < 500


def test_chapter_1_refuses_a_parser_that_reads_before_it_checks_the_length():
    """Issue 57: a check that parsed first passed every case, then raised RecursionError on a deep nesting."""
    import json

    from labkit.book.exercises import ch01
    from labkit.task.verifier import parse_answer

    def parse_first(text):
        try:
            json.loads(text)
        except json.JSONDecodeError:
            return False
        return parse_answer(text).valid

    with pytest.raises(ExerciseError, match="raised RecursionError.*Hint: check the length before parsing"):
        ch01.check_ch01_is_valid_answer(parse_first)


def _blocked_kl(cur, ref, block_size, global_max=False, drop_last=False):
    """A blocked KL written from torch alone, with two optional slips."""
    V = cur.shape[-1]

    def logsumexp(z):
        m = z.max() if global_max else z.max(dim=-1, keepdim=True).values
        total = sum((z[:, i:i + block_size] - m).exp().sum(-1, keepdim=True) for i in range(0, V, block_size))
        return m + total.log()

    lse_cur, lse_ref = logsumexp(cur), logsumexp(ref)
    stop = (V // block_size) * block_size if drop_last and V % block_size else V
    out = torch.zeros(cur.shape[0], dtype=cur.dtype)
    for i in range(0, stop, block_size):
        lp, lq = cur[:, i:i + block_size] - lse_cur, ref[:, i:i + block_size] - lse_ref
        out = out + (lp.exp() * (lp - lq)).sum(-1)
    return out


@pytest.mark.parametrize("answer, message", [
    (lambda c, r, b: _blocked_kl(c, r, b, global_max=True), "subtract each row's own maximum, z.max\\(dim=-1, "
                                                             "keepdim=True\\), not one maximum of the whole tensor"),
    (lambda c, r, b: _blocked_kl(c, r, b, drop_last=True), "the last block, shorter than block_size .* is left out"),
    (lambda c, r, b: (torch.log_softmax(c, -1).exp() * (torch.log_softmax(c, -1) - torch.log_softmax(r, -1))).sum(-1),
     "your function called log_softmax on all V = 50 columns at once"),
])
def test_chapter_5_names_the_row_maximum_the_last_block_and_the_whole_row(answer, message):
    with pytest.raises(ExerciseError, match=message):
        ch05.check_ch05_blocked_kl(answer)
    assert ch05.check_ch05_blocked_kl(_blocked_kl)


@pytest.mark.parametrize("answer, hint", [
    (lambda lc, lo, A, eps: right_ch04(lc, lo, A, 0.2), r"you clipped at 0.2 whatever clip_eps says \(here 0.1\)"),
    (lambda lc, lo, A, eps: torch.minimum((lc - lo).exp() * A[:, None], (lc - lo).clamp(-eps, eps).exp() * A[:, None]),
     "you clipped the log-ratio to \\[-eps, eps\\]"),
])
def test_chapter_4_names_a_hard_coded_epsilon_and_a_clipped_log_ratio(answer, hint):
    with pytest.raises(ExerciseError, match=hint):
        ch04.check_ch04_clipped_objective(answer)


@pytest.mark.parametrize("answer, hint", [
    (lambda ps, G: sum(p ** G + (1 - p) ** G for p in ps), "you summed over the prompts: the fraction is the mean"),
    (lambda ps, G: sum(p ** (G - 1) + (1 - p) ** (G - 1) for p in ps) / len(ps), "the exponent is G"),
])
def test_chapter_8_names_a_sum_for_a_mean_and_the_exponent(answer, hint):
    with pytest.raises(ExerciseError, match=hint):
        ch08.check_ch08_mixed_zero_signal(answer)


def test_chapter_11_names_the_integer_division():
    from labkit.book.exercises import ch11
    from labkit.studies import reasoning

    def floor_share(verdict, chain):
        return reasoning.right_steps(verdict, chain) // max(len(chain.movements), len(verdict.steps))

    with pytest.raises(ExerciseError, match="you returned the whole number 0: `//` rounds down"):
        ch11.check_ch11_process_reward(floor_share)
