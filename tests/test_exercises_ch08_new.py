"""Chapter 8's new checkers: the advantage check (diagnose this: advantages over the whole batch) and the
zero-signal fraction of a batch of prompts of different difficulty. Right answers pass; each slip is named."""

import pytest
import torch

from labkit.book import exercises
from labkit.grpo.losses import group_advantages


# -- the advantage check ------------------------------------------------------------------------------

def right(rewards, advantages):
    assert torch.allclose(advantages, group_advantages(rewards), rtol=0, atol=1e-12), "not the group advantages"


def invariants_only(rewards, advantages):
    """Sums to zero per group, zero on constant groups: catches the set-level slips, not the std's."""
    assert torch.allclose(advantages.sum(dim=1), torch.zeros(len(rewards), dtype=advantages.dtype), atol=1e-9)
    constant = (rewards == rewards[:, :1]).all(dim=1)
    assert (advantages[constant] == 0).all()


def nothing(rewards, advantages):
    pass


def order_dependent(rewards, advantages):
    right(rewards, advantages)
    assert rewards[0].sum() == REWARDS[0].sum(), "rows are not in their first order"


REWARDS = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 1], [0, 1, 0, 0, 1, 0, 0, 0], [0] * 8, [1, 0, 1, 1, 0, 1, 1, 1]],
                       dtype=torch.float64)


def test_a_right_check_passes(capsys):
    assert exercises.check_ch08_advantage_check(right, REWARDS)
    assert "refuses all 5 wrong ones" in capsys.readouterr().out


def test_the_real_rewards_have_both_kinds_of_group():
    from labkit.book.exercises.ch08 import _ch08_rewards

    rewards = _ch08_rewards()
    constant = (rewards == rewards[:, :1]).all(dim=1)
    assert rewards.shape[1] == 8 and constant.any() and not constant.all()
    assert exercises.check_ch08_advantage_check(right)


@pytest.mark.parametrize("check, case, hint", [
    (nothing, "case 3 of 7 (advantages normalised over the whole batch", "must sum to 0"),
    (invariants_only, "case 5 of 7 (centred per group but divided by the batch's std", "compare with the formula itself"),
])
def test_each_missed_case_is_named(check, case, hint):
    with pytest.raises(exercises.ExerciseError, match="your check let them through") as err:
        exercises.check_ch08_advantage_check(check, REWARDS)
    assert str(err.value).startswith(case) and hint in str(err.value)


def test_a_check_that_depends_on_the_row_order_is_told():
    with pytest.raises(exercises.ExerciseError, match=r"case 2 of 7 .*your check refused right advantages "
                                                      r"\(rows are not in their first order\)"):
        exercises.check_ch08_advantage_check(order_dependent, REWARDS)


# -- the zero-signal fraction of a mixed batch -----------------------------------------------------------

def mixed_right(ps, G):
    return sum(p ** G + (1 - p) ** G for p in ps) / len(ps)


def at_the_mean(ps, G):
    p = sum(ps) / len(ps)
    return p ** G + (1 - p) ** G


@pytest.mark.parametrize("answer, hint", [
    (at_the_mean, "you used the average p"),
    (lambda ps, G: sum(p ** G for p in ps) / len(ps), "only the all-right groups"),
    (lambda ps, G: sum((1 - p) ** G for p in ps) / len(ps), "only the all-wrong groups"),
    (lambda ps, G: 1 - mixed_right(ps, G), "the fraction WITH signal"),
    (lambda ps, G: mixed_right(ps, G) + 0.01, "the mean of that over its prompts"),
])
def test_each_mixed_slip_is_named(answer, hint):
    with pytest.raises(exercises.ExerciseError, match=r"case \d of 8: zero_signal_of_batch") as err:
        exercises.check_ch08_mixed_zero_signal(answer)
    assert hint in str(err.value)


def test_a_right_mixed_answer_passes_and_bad_returns_are_told(capsys):
    assert exercises.check_ch08_mixed_zero_signal(mixed_right)
    assert "on all 8 cases" in capsys.readouterr().out
    with pytest.raises(exercises.ExerciseError, match=r"returned 'half' \(str\); return a number"):
        exercises.check_ch08_mixed_zero_signal(lambda ps, G: "half")
    with pytest.raises(exercises.ExerciseError, match=r"zero_signal_of_batch is not written yet"):
        exercises.check_ch08_mixed_zero_signal(lambda ps, G: (_ for _ in ()).throw(NotImplementedError("your turn")))
