"""Chapter 6's GRPO-loss checker: it accepts a right loss written from torch alone and names each slip.

The batch is real: iteration 1's 16 rollouts of the cached run, scored by the final GRPO model and the
warm start in float64 (`_ch06_loss_batch`), built once for the module."""

import pytest
import torch

from labkit.book import exercises
from labkit.book.exercises.ch06 import _ch06_loss_batch


@pytest.fixture(scope="module")
def batch():
    return _ch06_loss_batch()


def _parts(logp_cur, logp_old, advantages, mask, logits_cur, logits_ref, clip_eps, sign=1.0, which="min",
           backwards=False):
    rho = torch.exp(torch.where(mask, logp_cur - logp_old, torch.zeros_like(logp_cur)))
    A = sign * advantages[:, None]
    clipped = rho.clamp(1 - clip_eps, 1 + clip_eps) * A
    objective = {"min": torch.minimum(rho * A, clipped), "max": torch.maximum(rho * A, clipped),
                 "none": rho * A}[which]
    logq, logr = torch.log_softmax(logits_cur, -1), torch.log_softmax(logits_ref, -1)
    kl = (logr.exp() * (logr - logq)).sum(-1) if backwards else (logq.exp() * (logq - logr)).sum(-1)
    return objective, kl


def _sequence_mean(values, mask, G):
    m = mask.to(values.dtype)
    per_response = torch.where(mask, values, torch.zeros_like(values)).sum(1) / m.sum(1)
    return per_response.view(-1, G).mean(1).mean()


def make(**slip):
    kl_sign = slip.pop("kl_sign", 1.0)
    reduction = slip.pop("reduction", "sequence")
    negate = slip.pop("negate", False)

    def grpo_loss(logp_cur, logp_old, advantages, mask, logits_cur, logits_ref, G, clip_eps, kl_coef):
        objective, kl = _parts(logp_cur, logp_old, advantages, mask, logits_cur, logits_ref, clip_eps, **slip)
        per_token = (objective if negate else -objective) + kl_sign * kl_coef * kl
        if reduction == "token":
            return torch.where(mask, per_token, torch.zeros_like(per_token)).sum() / mask.sum()
        return _sequence_mean(per_token, mask, G)
    return grpo_loss


def test_a_right_loss_passes(batch, capsys):
    assert exercises.check_ch06_grpo_loss(make(), batch)
    out = capsys.readouterr().out
    assert out.startswith("Correct: your grpo_loss gives ") and "on 16 real rollouts" in out


@pytest.mark.parametrize("slip, named", [
    (dict(sign=-1.0), "the sign of A is flipped"),
    (dict(which="none"), "there is no min: you used rho A alone"),
    (dict(which="max"), "you took the max of rho A and its clipped version"),
    (dict(reduction="token"), "you averaged over all the batch's tokens at once"),
    (dict(backwards=True), "the KL is taken the wrong way round"),
    (dict(kl_sign=0.0), "the KL term is missing"),
    (dict(kl_sign=-1.0), "the KL term has the wrong sign"),
    (dict(negate=True, kl_sign=1.0), "you returned the objective, not the loss"),
])
def test_each_slip_is_named(batch, slip, named):
    with pytest.raises(exercises.ExerciseError, match=r"loss -?\d\.\d{9}, expected -?\d\.\d{9}\. Hint: ") as err:
        exercises.check_ch06_grpo_loss(make(**slip), batch)
    assert named in str(err.value)


def test_the_batch_makes_every_slip_visible(batch):
    """Each slip gives a value of its own on this batch (else the checker could not name it): the clip
    acts, advantages differ, responses differ in length and the KL is not negligible."""
    from labkit.book.exercises.ch06 import _ch06_loss_variants

    values = [v.item() for v in _ch06_loss_variants(batch, batch["logits_cur"]).values()]
    assert min(abs(a - b) for i, a in enumerate(values) for b in values[i + 1:]) > 1e-6


def test_a_detached_ratio_has_the_right_value_and_the_wrong_gradient(batch):
    right = make()

    def detached(logp_cur, *rest):
        return right(logp_cur.detach() + 0.0 * logp_cur, *rest)

    with pytest.raises(exercises.ExerciseError, match="the value is right but its gradient"):
        exercises.check_ch06_grpo_loss(detached, batch)


def test_shape_gradient_and_crash_are_reported(batch):
    right = make()
    with pytest.raises(exercises.ExerciseError, match=r"returned \(16,\); return the batch's loss as one 0-d tensor"):
        exercises.check_ch06_grpo_loss(lambda *a: torch.zeros(16, dtype=torch.float64, requires_grad=True), batch)
    with pytest.raises(exercises.ExerciseError, match="carries no gradient"):
        exercises.check_ch06_grpo_loss(lambda *a: right(*a).detach(), batch)
    with pytest.raises(exercises.ExerciseError, match="raised ZeroDivisionError"):
        exercises.check_ch06_grpo_loss(lambda *a: 1 / 0, batch)
    with pytest.raises(exercises.ExerciseError, match="pass your function itself"):
        exercises.check_ch06_grpo_loss(3.0, batch)


def test_an_advantage_not_broadcast_per_token_is_explained_in_one_line():
    def not_broadcast(logp_cur, logp_old, advantages, mask, logits_cur, logits_ref, G, clip_eps, kl_coef):
        assert logp_cur.shape[1] != advantages.shape[0]  # the real batch: (16, T) against (16,), T != 16
        return (torch.exp(logp_cur - logp_old) * advantages).sum()

    with pytest.raises(exercises.ExerciseError) as caught:
        exercises.check_ch06_grpo_loss(not_broadcast)
    assert "advantages[:, None]" in str(caught.value) and "must match the size" not in str(caught.value)
