"""The KL estimators as losses: each one's gradient against autograd, its expectation against the
closed forms (k1: 0, k2: the reverse KL's gradient, k3: the forward KL's), and sampling against the
expectation."""

import pytest
import torch

from labkit.studies import kl_gradients as kg


def _logits(seed, V=7, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(V, dtype=torch.float64, generator=g),
            scale * torch.randn(V, dtype=torch.float64, generator=g))


def test_the_exact_gradient_is_autograds():
    z, z_ref = _logits(0)
    x = z.clone().requires_grad_(True)
    p, q = torch.softmax(x, 0), torch.softmax(z_ref, 0)
    (p * (p.log() - q.log())).sum().backward()
    assert torch.allclose(kg.exact_gradient(z, z_ref), x.grad, atol=1e-14)


@pytest.mark.parametrize("estimator", kg.ESTIMATORS)
def test_each_expectation_is_the_sum_of_its_per_token_autograd_gradients(estimator):
    """E_a~pi [d est(a)/dz with a held fixed] by autograd, token by token, against expected_gradients."""
    z, z_ref = _logits(1)
    p = torch.softmax(z, 0)
    total = torch.zeros_like(z)
    for a in range(z.numel()):
        x = z.clone().requires_grad_(True)
        logp, logq = torch.log_softmax(x, 0)[a], torch.log_softmax(z_ref, 0)[a]
        value = {"k1": logp - logq, "k2": 0.5 * (logp - logq) ** 2,
                 "k3": torch.exp(logq - logp) - 1 - (logq - logp)}[estimator]
        value.backward()
        total += p[a] * x.grad
    assert torch.allclose(kg.expected_gradients(z, z_ref)[estimator], total, atol=1e-14)


def test_k1_has_no_expected_gradient_k2_is_exact_and_k3_follows_the_forward_kl():
    z, z_ref = _logits(2)
    expected = kg.expected_gradients(z, z_ref)
    p, q = torch.softmax(z, 0), torch.softmax(z_ref, 0)
    assert expected["k1"].abs().max() < 1e-15
    assert torch.allclose(expected["k2"], kg.exact_gradient(z, z_ref), atol=1e-15)
    assert torch.allclose(expected["k3"], p - q, atol=1e-15)  # d KL(q || p) / dz = p - q


def test_sampled_gradients_average_to_their_expectation():
    z, z_ref = _logits(3, scale=0.5)
    sampled = kg.sampled_gradients(z, z_ref, 8, 40000, torch.Generator().manual_seed(0))
    expected = kg.expected_gradients(z, z_ref)
    for e in kg.ESTIMATORS:
        scale = float(sampled[e].std(dim=0).max()) / 200  # 40,000 draws: the mean's standard error, x ~4 margin
        assert (sampled[e].mean(dim=0) - expected[e]).abs().max() < 4 * scale + 1e-12, e


def test_near_the_reference_k3_is_nearly_unbiased_and_far_from_it_is_not():
    z_ref, _ = _logits(4)
    near = kg.study((z_ref + 0.01 * _logits(5)[0])[None], z_ref[None], batches=200)
    far = kg.study((z_ref + 2.0 * _logits(5)[0])[None], z_ref[None], batches=200)
    assert near["k2"]["bias"] < 1e-12 and far["k2"]["bias"] < 1e-12
    assert near["k3"]["bias"] < 0.05 < far["k3"]["bias"]
    assert near["k1"]["bias"] == pytest.approx(1.0) and near["k1"]["cosine"] == 0.0
