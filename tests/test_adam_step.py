"""Adam's first step is lr x sign(g) whatever the loss's scale; SGD's is lr x g (labkit.train.adam_step)."""

import pytest
import torch

from labkit.train import adam_step


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _loss(model):
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0]], dtype=model.weight.dtype)
    return model(x).pow(2).mean()


def test_adams_first_step_is_the_rate_at_every_scale_and_sgds_follows_the_scale():
    rows = {(r["optimiser"], r["scale"]): r for r in adam_step.one_step_sizes(_model, _loss, lr=1e-3)}
    for scale in adam_step.SCALES:
        # |g| x scale >> eps = 1e-8 here: the step is lr to within eps / |g|
        assert rows["adam", scale]["median"] == pytest.approx(1.0, rel=1e-4)
        assert rows["adam", scale]["max"] == pytest.approx(1.0, rel=1e-4)
    # SGD: the step is lr x |g| x scale, so the sizes are in the ratio of the scales (float64 steps:
    # after - before keeps about 10 digits of a step of 1e-5 x |g| on a weight near 0.5)
    assert rows["sgd", 100.0]["median"] / rows["sgd", 1.0]["median"] == pytest.approx(100.0, rel=1e-8)
    assert rows["sgd", 0.01]["median"] / rows["sgd", 1.0]["median"] == pytest.approx(0.01, rel=1e-8)
    # by hand: the gradient of the loss, one SGD step of rate 1e-3 moves each weight by 1e-3 x |g|
    model = _model().double()
    _loss(model).backward()
    grads = torch.cat([p.grad.abs().flatten() for p in model.parameters()])
    assert rows["sgd", 1.0]["median"] == pytest.approx(float(grads.median()), rel=1e-8)
    assert rows["sgd", 1.0]["weights"] == int((grads != 0).sum())


def test_a_loss_without_the_parameters_is_refused():
    with pytest.raises(ValueError, match="no weight has a non-zero gradient"):
        adam_step.one_step_sizes(_model, lambda m: 0.0 * m.weight.sum(), lr=1e-3)
