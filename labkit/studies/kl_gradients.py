"""Which KL estimator belongs in the loss?  Their gradients against the exact KL's (issue 43).

At one prefix, with current logits z (pi = softmax(z)) and reference logits z_ref, a loss that
averages an estimator over N tokens a_i sampled from pi has, with respect to z, the gradient

    k1 = log pi(a) - log pi_ref(a)                 g = mean_i (onehot(a_i) - pi)
    k2 = (log pi(a) - log pi_ref(a))^2 / 2         g = mean_i k1(a_i) (onehot(a_i) - pi)
    k3 = r - 1 - log r,  r = pi_ref(a) / pi(a)     g = mean_i (1 - r(a_i)) (onehot(a_i) - pi)

(the samples are drawn, not differentiated, as in every trainer), against the exact reverse KL's
gradient, dKL(pi || pi_ref)/dz = pi * (log pi - log pi_ref - KL).  Their expectations over the
samples are exact sums over the vocabulary (`expected_gradients`): k1's is 0, k2's is the exact
reverse KL's, k3's is pi - pi_ref, the gradient of the forward KL(pi_ref || pi).  Near pi_ref the
two KLs agree to second order, so k3's bias is small there and grows as the policy moves away.
"""

from __future__ import annotations

import torch

from .gradient_study import score_average

ESTIMATORS = ("k1", "k2", "k3")


def _parts(z: torch.Tensor, z_ref: torch.Tensor):
    logp, logq = torch.log_softmax(z.double(), -1), torch.log_softmax(z_ref.double(), -1)
    return logp.exp(), logp, logq


def exact_gradient(z: torch.Tensor, z_ref: torch.Tensor) -> torch.Tensor:
    """dKL(pi || pi_ref)/dz, (..., V), float64."""
    p, logp, logq = _parts(z, z_ref)
    kl = (p * (logp - logq)).sum(-1, keepdim=True)
    return p * (logp - logq - kl)


def _coefficient(estimator: str, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Each sampled token's weight on onehot(a) - pi in the estimator's gradient (same shape as logp)."""
    if estimator == "k1":
        return torch.ones_like(logp)
    if estimator == "k2":
        return logp - logq
    if estimator == "k3":
        return 1.0 - torch.exp(logq - logp)
    raise ValueError(f"estimator {estimator!r}: expected one of {ESTIMATORS}")


def expected_gradients(z: torch.Tensor, z_ref: torch.Tensor) -> dict[str, torch.Tensor]:
    """{estimator: E over a ~ pi of its gradient}, each (..., V): sums over the vocabulary, no sampling."""
    p, logp, logq = _parts(z, z_ref)
    out = {}
    for estimator in ESTIMATORS:
        c = p * _coefficient(estimator, logp, logq)  # (..., V): pi_a times the token's weight
        out[estimator] = c - c.sum(-1, keepdim=True) * p  # sum_a pi_a c_a (onehot(a) - pi)
    return out


def sampled_gradients(z: torch.Tensor, z_ref: torch.Tensor, N: int, batches: int,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
    """{estimator: (batches, V)} gradients of the estimator averaged over N tokens sampled from pi (one prefix)."""
    p, logp, logq = _parts(z, z_ref)
    if p.dim() != 1:
        raise ValueError(f"one prefix at a time: logits of shape (V,), got {tuple(z.shape)}")
    a = torch.multinomial(p.expand(batches, -1), N, replacement=True, generator=generator)  # (batches, N)
    out = {}
    for estimator in ESTIMATORS:
        out[estimator] = score_average(p, a, _coefficient(estimator, logp, logq)[a])
    return out


def study(z: torch.Tensor, z_ref: torch.Tensor, N: int = 16, batches: int = 2000, seed: int = 0) -> dict:
    """At each prefix (rows of z, z_ref: (P, V)): each estimator's bias (||E g - exact|| / ||exact||, from
    the exact expectations), the cosine of E g with the exact gradient, its norm over the exact one's
    (norm_ratio), and the relative spread of one N-token estimate (RMS of g - E g over `batches` draws,
    over ||exact||); medians over the prefixes."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for zc, zr in zip(z, z_ref):
        exact = exact_gradient(zc, zr)
        norm = float(exact.norm())
        if norm == 0.0:
            continue
        expected = expected_gradients(zc, zr)
        sampled = sampled_gradients(zc, zr, N, batches, generator)
        row = {}
        for e in ESTIMATORS:
            bias = float((expected[e] - exact).norm()) / norm
            en = float(expected[e].norm())
            cosine = float(expected[e] @ exact) / (en * norm) if en > 1e-12 * norm else 0.0  # k1: no direction
            spread = float((sampled[e] - expected[e]).norm(dim=1).pow(2).mean().sqrt()) / norm
            row[e] = {"bias": bias, "cosine": cosine, "spread": spread, "norm_ratio": en / norm}
        rows.append(row)

    def median(values):
        values = sorted(values)
        return values[len(values) // 2]

    return {"prefixes": len(rows), "N": N, "batches": batches,
            **{e: {k: median([r[e][k] for r in rows]) for k in ("bias", "cosine", "spread", "norm_ratio")}
               for e in ESTIMATORS}}
