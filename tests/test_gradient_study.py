"""The gradient study's pieces: advantage schemes by hand, the exact policy gradient against autograd,
the score-function estimate's formula, bias and 1/sqrt(N) error, and the weight-space gradient of
a batch against the loop's own clipped surrogate at ratio 1 (two implementations that agree)."""

import math

import pytest
import torch

from labkit.studies import gradient_study as gs
from labkit.grpo import losses
from labkit.models import presets
from labkit.models.tokenizer import load_tiny_tokenizer


def test_the_advantage_schemes_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    assert gs.scheme_advantages(r, "none").tolist() == r.tolist()
    assert gs.scheme_advantages(r, "mean").tolist() == [[0.75, -0.25, -0.25, -0.25], [0.0] * 4]
    loo = gs.scheme_advantages(r, "leave_one_out")
    assert torch.allclose(loo[0], torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3], dtype=torch.float64), atol=1e-15)
    assert loo[1].tolist() == [0.0] * 4  # a constant group: exact zeros, as in the loop
    std = math.sqrt(0.1875)
    assert torch.allclose(gs.scheme_advantages(r, "mean_std")[0],
                          torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64) / (std + 1e-8))
    with pytest.raises(ValueError, match="advantage scheme 'rloo': expected one of"):
        gs.scheme_advantages(r, "rloo")


def test_the_exact_gradient_is_autograds_and_a_hand_worked_one():
    probs = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    assert gs.exact_gradient(probs, rewards).tolist() == [0.25, -0.125, -0.125]  # pi (r - J), J = 0.5
    z = torch.randn(7, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    r = torch.tensor([0, 1, 0, 1, 1, 0, 0], dtype=torch.float64)
    (torch.softmax(z, 0) @ r).backward()
    assert torch.allclose(gs.exact_gradient(torch.softmax(z, 0).detach(), r), z.grad, atol=1e-15)


def test_an_estimate_is_the_formula_written_out():
    probs = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    g = gs.score_function_estimates(probs, rewards, 3, 5, "leave_one_out", torch.Generator().manual_seed(1))
    samples = torch.multinomial(probs.expand(5, 3), 3, replacement=True, generator=torch.Generator().manual_seed(1))
    for t in range(5):
        r = rewards[samples[t]]
        expected = sum((r[i] - (r.sum() - r[i]) / 2) * (torch.nn.functional.one_hot(samples[t, i], 3) - probs)
                       for i in range(3)) / 3
        assert torch.allclose(g[t], expected, atol=1e-15)


def test_the_estimate_is_unbiased_and_its_error_falls_as_one_over_root_n():
    probs = torch.tensor([0.55, 0.25, 0.15, 0.05], dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    out = gs.score_function_errors(probs, rewards, sizes=(16, 64), trials=20000, schemes=("none", "mean", "leave_one_out"))
    exact = out["exact_norm"]
    for scheme in ("none", "leave_one_out"):  # unbiased: the bias is Monte-Carlo noise, a few % of the gradient
        assert out[scheme]["bias"][0] < 0.03 * exact
        ratio = out[scheme]["rms_error"][0] / out[scheme]["rms_error"][1]
        assert ratio == pytest.approx(2.0, rel=0.05)  # 4x the samples, half the error
    # the group mean with itself included gives (N - 1) / N of the gradient: a bias of exact / N
    assert out["mean"]["bias"][0] == pytest.approx(exact / 16, rel=0.3)


def test_a_batch_gradient_is_the_clipped_surrogates_at_ratio_one():
    torch.manual_seed(0)
    model = presets.new_tiny_model(seed=3)
    model.eval()
    tokenizer = load_tiny_tokenizer()
    chosen = [{"id": f"p{k}", "statement": f"Start with {k + 3} items.", "problem": None} for k in range(2)]
    from labkit.models import sampling

    original, calls = sampling.verifier.score, []

    def alternating(*args, **kwargs):  # rewards 1, 0, 0, 1: both groups have a winner and a loser
        calls.append(1)
        return type("Verdict", (), {"reward": float(len(calls) in (1, 4))})()

    sampling.verifier.score = alternating
    try:
        grads, rewards = gs.batch_gradients(model, tokenizer, chosen, 2, [1, 2, 3, 4], ("mean_std",))
    finally:
        sampling.verifier.score = original
    from labkit.models import scoring

    assert rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    prompts = [scoring.build_prompt_ids(tokenizer, p["statement"]) for p in chosen]
    # the same rollouts again: the sampler is seeded per response
    rollouts = sampling.get_sampler("fast")(model, tokenizer, [q for q in prompts for _ in range(2)], [1, 2, 3, 4],
                                            max_new_tokens=scoring.MAX_NEW_TOKENS)
    batch = scoring.make_batch([r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts],
                               tokenizer.pad_token_id)
    logp, _ = scoring.response_logprobs(model, batch)
    A = gs.scheme_advantages(rewards, "mean_std").reshape(-1).float()
    model.zero_grad(set_to_none=True)
    loss, _ = losses.clipped_surrogate(logp, logp.detach(), A, batch.response_mask, G=2)
    loss.backward()
    expected = gs._flat_grad(model)
    assert expected.abs().max() > 1e-4  # a real gradient, not two zeros
    assert torch.allclose(grads["mean_std"], expected, rtol=1e-5, atol=1e-9)


def test_the_corrected_signal_to_noise_removes_the_plug_ins_one_over_n():
    """Issue 57, claim 2: ||mean||^2 / variance overstates the signal-to-noise by about 1/n.  On gradients with
    a known mean and unit noise (true ratio 0.005), 400 trials of n = 128: the plug-in averages about
    0.005 + 1/128, the corrected estimate 0.005 within its Monte-Carlo error."""
    from labkit.studies.gradient_study import corrected_snr

    g = torch.Generator().manual_seed(0)
    D, n = 50, 128
    mu = torch.zeros(D, dtype=torch.float64)
    mu[0] = 0.5
    true = float(mu.pow(2).sum()) / D
    plug, corrected = [], []
    for _ in range(400):
        x = mu + torch.randn(n, D, generator=g, dtype=torch.float64)
        mean = x.mean(0)
        plug.append(float(mean.pow(2).sum()) / (float(x.pow(2).sum(1).mean()) - float(mean.pow(2).sum())))
        corrected.append(corrected_snr(x.sum(0), float(x.pow(2).sum()), n))
    assert abs(sum(plug) / 400 - (true + 1 / n)) < 0.0005
    assert abs(sum(corrected) / 400 - true) < 0.0005


def test_the_jackknife_interval_is_the_formula_and_covers_the_truth():
    from labkit.studies.gradient_study import corrected_snr, snr_with_interval

    g = torch.Generator().manual_seed(1)
    D, K, m = 20, 16, 8
    mu = torch.zeros(D, dtype=torch.float64)
    mu[:2] = 0.4
    true = float(mu.pow(2).sum()) / D
    covered = 0
    for trial in range(200):
        x = mu + torch.randn(K * m, D, generator=g, dtype=torch.float64)
        chunks = x.view(K, m, D)
        out = snr_with_interval(chunks.sum(1), chunks.pow(2).sum((1, 2)), m)
        if trial == 0:  # the jackknife written out again
            left = [corrected_snr(x.sum(0) - chunks[k].sum(0), float(x.pow(2).sum() - chunks[k].pow(2).sum()),
                                  (K - 1) * m) for k in range(K)]
            mean_left = sum(left) / K
            se = ((K - 1) / K * sum((v - mean_left) ** 2 for v in left)) ** 0.5
            assert out["snr_corrected"] == pytest.approx(corrected_snr(x.sum(0), float(x.pow(2).sum()), K * m))
            assert out["snr_se"] == pytest.approx(se) and out["snr_interval"] == pytest.approx(
                [out["snr_corrected"] - 1.96 * se, out["snr_corrected"] + 1.96 * se])
        covered += out["snr_interval"][0] <= true <= out["snr_interval"][1]
    assert 0.88 <= covered / 200 <= 0.99, covered  # a 95% interval, within its Monte-Carlo spread


def test_the_paired_difference_leaves_the_same_chunk_out_of_both_schemes():
    from labkit.studies.gradient_study import corrected_snr, snr_difference

    g = torch.Generator().manual_seed(2)
    K, m, D = 16, 8, 10
    x = torch.randn(K * m, D, generator=g, dtype=torch.float64) + 0.3
    y = 0.5 * x + 0.1 * torch.randn(K * m, D, generator=g, dtype=torch.float64)  # the same batches, another scheme
    a = (x.view(K, m, D).sum(1), x.view(K, m, D).pow(2).sum((1, 2)))
    b = (y.view(K, m, D).sum(1), y.view(K, m, D).pow(2).sum((1, 2)))
    out = snr_difference(a, b, m)
    assert out["difference"] == pytest.approx(corrected_snr(x.sum(0), float(x.pow(2).sum()), K * m)
                                              - corrected_snr(y.sum(0), float(y.pow(2).sum()), K * m))
    left = []
    for k in range(K):
        keep = torch.tensor([j // m != k for j in range(K * m)])
        left.append(corrected_snr(x[keep].sum(0), float(x[keep].pow(2).sum()), (K - 1) * m)
                    - corrected_snr(y[keep].sum(0), float(y[keep].pow(2).sum()), (K - 1) * m))
    mean = sum(left) / K
    assert out["se"] == pytest.approx(((K - 1) / K * sum((v - mean) ** 2 for v in left)) ** 0.5)
