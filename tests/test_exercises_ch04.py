"""Chapter 4's checker: it accepts a right per-token clipped objective and names the usual mistakes."""

import pytest
import torch

from labkit.book import exercises


def right(logp_cur, logp_old, advantages, clip_eps):
    rho = torch.exp(logp_cur - logp_old)
    A = advantages[:, None]
    return torch.minimum(rho * A, torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * A)


def unclipped(logp_cur, logp_old, advantages, clip_eps):
    return torch.exp(logp_cur - logp_old) * advantages[:, None]


def maximum(logp_cur, logp_old, advantages, clip_eps):
    rho = torch.exp(logp_cur - logp_old)
    A = advantages[:, None]
    return torch.maximum(rho * A, torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * A)


def clipped_only(logp_cur, logp_old, advantages, clip_eps):
    return torch.clamp(torch.exp(logp_cur - logp_old), 1 - clip_eps, 1 + clip_eps) * advantages[:, None]


def something_else(logp_cur, logp_old, advantages, clip_eps):
    return right(logp_cur, logp_old, advantages, clip_eps) + 1.0


def detached_rho(logp_cur, logp_old, advantages, clip_eps):
    # Right values, but rho carries no gradient: only the "* logp_cur" trick would.
    rho = torch.exp(logp_cur - logp_old).detach()
    A = advantages[:, None]
    return torch.minimum(rho * A, torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * A) + 0.0 * logp_cur


def fixed_eps(logp_cur, logp_old, advantages, clip_eps):
    return right(logp_cur, logp_old, advantages, 0.2)


def no_gradient(logp_cur, logp_old, advantages, clip_eps):
    return right(logp_cur, logp_old, advantages, clip_eps).detach()


def reduced(logp_cur, logp_old, advantages, clip_eps):
    return right(logp_cur, logp_old, advantages, clip_eps).mean(dim=1)


def raises(logp_cur, logp_old, advantages, clip_eps):
    return logp_cur @ advantages  # shapes (5, 9) @ (5,) do not fit


def test_accepts_a_right_answer(capsys):
    assert exercises.check_ch04_clipped_objective(right) is True
    assert "90 tokens" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, message", [
    (unclipped, "you returned rho A"),
    (maximum, "take the minimum .*, not the maximum"),
    (clipped_only, "you returned only the clipped term"),
    (something_else, r"Hint: min\(rho A, clip"),
    (detached_rho, "did you detach rho"),
    (fixed_eps, "clip_eps = 0.1"),
    (no_gradient, "carries no gradient"),
    (reduced, "one objective per token"),
    (raises, "raised RuntimeError"),
    ("not a function", "pass your function itself"),
])
def test_names_the_mistake(wrong, message):
    with pytest.raises(exercises.ExerciseError, match=message):
        exercises.check_ch04_clipped_objective(wrong)


def test_a_stub_keeps_its_your_turn_error():
    def stub(logp_cur, logp_old, advantages, clip_eps):
        raise NotImplementedError("Your turn")

    with pytest.raises(NotImplementedError, match="Your turn"):
        exercises.check_ch04_clipped_objective(stub)


def clamped_product(logp_cur, logp_old, advantages, clip_eps):
    # The slip issue 44 names: the clip applied to rho x A instead of rho.
    obj = torch.exp(logp_cur - logp_old) * advantages[:, None]
    return torch.minimum(obj, torch.clamp(obj, 1 - clip_eps, 1 + clip_eps))


def clamped_product_alone(logp_cur, logp_old, advantages, clip_eps):
    return torch.clamp(torch.exp(logp_cur - logp_old) * advantages[:, None], 1 - clip_eps, 1 + clip_eps)


def not_broadcast(logp_cur, logp_old, advantages, clip_eps):
    # (5, 9) against (5,): PyTorch raises a RuntimeError about tensor sizes.
    rho = torch.exp(logp_cur - logp_old)
    return torch.minimum(rho * advantages, torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * advantages)


@pytest.mark.parametrize("answer", [clamped_product, clamped_product_alone])
def test_clamping_the_product_gets_its_own_message(answer):
    with pytest.raises(exercises.ExerciseError, match=r"you clipped the product rho A; clip the ratio rho alone"):
        exercises.check_ch04_clipped_objective(answer)


def test_an_advantage_not_broadcast_per_token_is_explained_in_one_line():
    with pytest.raises(exercises.ExerciseError) as caught:
        exercises.check_ch04_clipped_objective(not_broadcast)
    message = str(caught.value)
    assert "advantages[:, None]" in message and "one value per response, shape (B,)" in message
    assert "must match the size of tensor" not in message and "\n" not in message  # not PyTorch's raw words


def upper_edge_only(logp_cur, logp_old, advantages, clip_eps):
    rho, A = torch.exp(logp_cur - logp_old), advantages[:, None]
    return torch.minimum(rho * A, torch.clamp(rho, max=1 + clip_eps) * A)


def lower_edge_only(logp_cur, logp_old, advantages, clip_eps):
    rho, A = torch.exp(logp_cur - logp_old), advantages[:, None]
    return torch.minimum(rho * A, torch.clamp(rho, min=1 - clip_eps) * A)


def the_loss(logp_cur, logp_old, advantages, clip_eps):
    return -right(logp_cur, logp_old, advantages, clip_eps)


def inverted_ratio(logp_cur, logp_old, advantages, clip_eps):
    return right(logp_old, logp_cur, advantages, clip_eps)


def quotient_ratio(logp_cur, logp_old, advantages, clip_eps):
    rho, A = logp_cur / logp_old, advantages[:, None]
    return torch.minimum(rho * A, torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * A)


@pytest.mark.parametrize("answer, named", [
    (upper_edge_only, r"you clipped rho at 1 \+ eps only: the lower edge 1 - eps is missing"),
    (lower_edge_only, r"you clipped rho at 1 - eps only: the upper edge 1 \+ eps is missing"),
    (the_loss, r"you returned the loss, minus the objective"),
    (inverted_ratio, r"your ratio is upside down: rho = exp\(logp_cur - logp_old\)"),
    (quotient_ratio, r"your ratio divides the log-probs: rho = exp\(logp_cur - logp_old\)"),
])
def test_more_typical_slips_are_named(answer, named):
    with pytest.raises(exercises.ExerciseError, match=named):
        exercises.check_ch04_clipped_objective(answer)


def test_a_misplaced_token_axis_is_explained_in_one_line():
    def row_axis(logp_cur, logp_old, advantages, clip_eps):
        # advantages[None, :] puts the responses on the token axis: (1, 5) against (5, 9)
        rho, A = torch.exp(logp_cur - logp_old), advantages[None, :]
        return torch.minimum(rho * A, torch.clamp(rho, 1 - clip_eps, 1 + clip_eps) * A)

    with pytest.raises(exercises.ExerciseError, match=r"shapes do not broadcast: .*advantages\[:, None\]"):
        exercises.check_ch04_clipped_objective(row_axis)
