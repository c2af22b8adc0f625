"""Tests of labkit.grpo.losses: advantages, the reduction, the clipped surrogate, exact KL, estimators."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from labkit.grpo import losses
from labkit.grpo.losses import (
    blockwise_logsumexp,
    clipped_surrogate,
    exact_prefix_kl,
    group_advantages,
    kl_estimators,
    masked_mean,
    reduce_tokens,
    token_entropy,
    zero_variance_groups,
)

QWEN_VOCAB = 151_936


# ----------------------------------------------------------------------------
# Group advantages
# ----------------------------------------------------------------------------


def test_alternating_group_is_close_to_plus_minus_one_but_not_exactly():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0]]))
    expected = 0.5 / (0.5 + 1e-8)  # mean 0.5, population std 0.5
    assert adv.dtype == torch.float64
    assert adv[0].tolist() == [expected, -expected, expected, -expected]
    unit = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    assert (adv[0] - unit).abs().max().item() < 1e-7
    assert not torch.equal(adv[0], unit), "eps must show: (r - mean) / (std + eps) is not exactly +-1"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_zero_variance_groups_give_exact_zeros(dtype):
    rewards = torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 1, 0]], dtype=dtype)
    adv = group_advantages(rewards)
    assert torch.equal(adv[:2], torch.zeros(2, 4, dtype=torch.float64))
    assert zero_variance_groups(rewards).tolist() == [True, True, False]


@pytest.mark.parametrize("scale_by_std", [True, False])
@pytest.mark.parametrize("rewards", [[[0.1] * 3], [[0.1] * 7]], ids=["three", "seven"])
def test_constant_group_whose_mean_does_not_round_back_still_gives_exact_zeros(scale_by_std, rewards):
    rewards = torch.tensor(rewards, dtype=torch.float64)
    # The trap is real: in float64 (where advantages are computed) the mean of three 0.1
    # is not 0.1, so naive centring leaves ~1e-17, which the std division turns into ~1e-9.
    assert (rewards - rewards.mean(dim=1, keepdim=True)).abs().max().item() > 0
    adv = group_advantages(rewards, scale_by_std=scale_by_std)
    assert torch.equal(adv, torch.zeros_like(adv))


def test_one_success_in_four_gives_plus_sqrt3_and_minus_one_over_sqrt3():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    # mean 1/4, population std sqrt(3)/4: A = (3/4)/(sqrt(3)/4) = sqrt(3), (-1/4)/(sqrt(3)/4) = -1/sqrt(3)
    assert adv[0, 0].item() == pytest.approx(math.sqrt(3), abs=1e-7)
    assert adv[0, 1:].tolist() == pytest.approx([-1 / math.sqrt(3)] * 3, abs=1e-7)
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-12)


def test_dr_grpo_variant_only_centres():
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]]), scale_by_std=False)
    assert adv.tolist() == [[0.75, -0.25, -0.25, -0.25], [0.5, -0.5, 0.5, -0.5]]


def test_std_division_amplifies_a_tiny_difference_and_dr_grpo_does_not():
    rewards = torch.tensor([[0.5 + 1e-4, 0.5, 0.5, 0.5]], dtype=torch.float64)
    grpo = group_advantages(rewards)
    dr_grpo = group_advantages(rewards, scale_by_std=False)
    assert grpo[0, 0].item() == pytest.approx(math.sqrt(3), rel=1e-3)  # order one, from 1e-4
    assert dr_grpo[0, 0].item() == pytest.approx(0.75e-4, rel=1e-9)


def test_random_groups_match_a_float64_numpy_reference():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(50, 8, generator=gen)
    r = rewards.double().numpy()
    centred = r - r.mean(axis=1, keepdims=True)
    expected = centred / (r.std(axis=1, ddof=0, keepdims=True) + 1e-8)
    np.testing.assert_allclose(group_advantages(rewards).numpy(), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(group_advantages(rewards, scale_by_std=False).numpy(), centred, rtol=0, atol=1e-15)


def test_permuting_responses_or_groups_permutes_the_advantages():
    gen = torch.Generator().manual_seed(1)
    binary = torch.randint(0, 2, (30, 4), generator=gen).double()
    floats = torch.rand(30, 6, generator=gen, dtype=torch.float64)
    for rewards in (binary, floats):
        adv = group_advantages(rewards)
        cols = torch.randperm(rewards.shape[1], generator=gen)
        rows = torch.randperm(rewards.shape[0], generator=gen)
        torch.testing.assert_close(group_advantages(rewards[:, cols]), adv[:, cols], rtol=0, atol=1e-12)
        assert torch.equal(group_advantages(rewards[rows]), adv[rows])
    # With 0/1 rewards every sum is exact, so the permutation is exact too.
    cols = torch.tensor([3, 1, 0, 2])
    assert torch.equal(group_advantages(binary[:, cols]), group_advantages(binary)[:, cols])


def test_advantages_are_detached():
    rewards = torch.tensor([[1.0, 0.0, 1.0, 1.0]], requires_grad=True)
    assert not group_advantages(rewards).requires_grad


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 0.0]), torch.zeros(2, 2, 2), torch.zeros(0, 4)])
def test_advantages_refuse_shapes_other_than_groups_by_g(bad):
    with pytest.raises(ValueError, match="rewards"):
        group_advantages(bad)


# ----------------------------------------------------------------------------
# The reduction
# ----------------------------------------------------------------------------


def test_reduce_tokens_hand_values_token_then_response_then_prompt():
    values = torch.tensor([[1.0, 3.0, 99.0], [2.0, 99.0, 99.0], [4.0, 4.0, 4.0], [0.0, 6.0, 99.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    # response means 2, 2, 4, 3; group means (G=2) 2, 3.5; prompt mean 2.75
    assert reduce_tokens(values, mask, G=2).item() == 2.75
    assert reduce_tokens(values, mask).item() == 2.75  # equal groups: same as the response mean
    assert masked_mean(values, mask, dim=1).tolist() == [2.0, 2.0, 4.0, 3.0]


def test_each_response_gets_the_same_total_weight_whatever_its_length():
    lengths = [1, 3, 10, 64]
    mask = torch.zeros(4, 64, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    values = torch.ones(4, 64, dtype=torch.float64, requires_grad=True)
    reduce_tokens(values, mask, G=2).backward()
    per_row_total = values.grad.sum(dim=1)
    assert torch.allclose(per_row_total, torch.full((4,), 0.25, dtype=torch.float64), rtol=0, atol=1e-15)
    for i, n in enumerate(lengths):  # per token: 1 / (P G L_i)
        assert torch.allclose(values.grad[i, :n], torch.full((n,), 0.25 / n, dtype=torch.float64), rtol=0, atol=1e-15)
        assert torch.all(values.grad[i, n:] == 0)
    # The flat token mean would weigh the 64-token response 64 times the 1-token one.
    flat = torch.ones(4, 64, dtype=torch.float64, requires_grad=True)
    (flat * mask).sum().div(mask.sum()).backward()
    assert flat.grad[3].sum() / flat.grad[0].sum() == pytest.approx(64.0)


def test_reduction_refuses_empty_rows_and_bad_group_size():
    values = torch.ones(4, 3)
    mask = torch.ones(4, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="G"):
        reduce_tokens(values, mask, G=3)
    mask[2] = False
    with pytest.raises(ValueError, match=r"\[2\]"):
        reduce_tokens(values, mask, G=2)


# ----------------------------------------------------------------------------
# Ratio and clipped surrogate
# ----------------------------------------------------------------------------

# A hand-built batch: 2 prompts x G=2, T=3, eps=0.2, clip interval [0.8, 1.2].
#   row 0, A=+1,   rho 1.0 (inside), 1.5 (high, clip active), 0.5 (low, A>0: unclipped)
#   row 1, A=-1,   rho 1.1 (inside), 1.5 (high, A<0: unclipped), 0.5 (low, clip active)
#   row 2, A=+2,   rho 0.9 (inside), 1.3 (high, clip active), padding
#   row 3, A=-0.5, rho 0.7 (low, clip active), padding, padding
RHO = [[1.0, 1.5, 0.5], [1.1, 1.5, 0.5], [0.9, 1.3, 1.0], [0.7, 1.0, 1.0]]
ADV = [1.0, -1.0, 2.0, -0.5]
MASK = [[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 0, 0]]
# d obj / d logp_cur = rho * A on the unclipped branch, 0 where the clip is active
OBJ_GRAD = [[1.0, 0.0, 0.5], [-1.1, -1.5, 0.0], [1.8, 0.0, 0.0], [0.0, 0.0, 0.0]]
OBJ = [[1.0, 1.2, 0.5], [-1.1, -1.5, -0.8], [1.8, 2.4, 0.0], [-0.4, 0.0, 0.0]]


def _hand_batch():
    mask = torch.tensor(MASK, dtype=torch.bool)
    logp_old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.5], [-0.7, -1.1, 0.0], [-0.2, 0.0, 0.0]], dtype=torch.float64)
    logp_cur = (logp_old + torch.log(torch.tensor(RHO, dtype=torch.float64)))
    logp_cur = torch.where(mask, logp_cur, torch.tensor(-math.inf, dtype=torch.float64))  # padding may hold anything
    return logp_cur.requires_grad_(), logp_old, torch.tensor(ADV, dtype=torch.float64), mask


def test_clipped_surrogate_value_on_hand_built_batch():
    logp_cur, logp_old, adv, mask = _hand_batch()
    loss, _ = clipped_surrogate(logp_cur, logp_old, adv, mask, clip_eps=0.2, G=2)
    lengths = [3, 3, 2, 1]
    response_means = [sum(OBJ[i][: lengths[i]]) / lengths[i] for i in range(4)]
    expected = -((response_means[0] + response_means[1]) / 2 + (response_means[2] + response_means[3]) / 2) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    loss_one_group, _ = clipped_surrogate(logp_cur, logp_old, adv, mask)
    assert loss_one_group.item() == pytest.approx(expected, abs=1e-12)


def test_surrogate_gradient_is_rho_times_a_unclipped_and_exactly_zero_clipped():
    logp_cur, logp_old, adv, mask = _hand_batch()
    loss, _ = clipped_surrogate(logp_cur, logp_old, adv, mask, clip_eps=0.2, G=2)
    loss.backward()
    lengths = torch.tensor([3.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    weight = 1.0 / (4 * lengths)[:, None]  # 1 / (P G L_i)
    expected = -torch.tensor(OBJ_GRAD, dtype=torch.float64) * weight
    torch.testing.assert_close(logp_cur.grad, expected, rtol=0, atol=1e-14)
    clipped = torch.tensor([[0, 1, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert torch.all(logp_cur.grad[clipped] == 0.0), "clipped branches must pass exactly no gradient"
    assert torch.all(logp_cur.grad[~clipped & mask] != 0.0)
    assert torch.all(logp_cur.grad[~mask] == 0.0) and torch.isfinite(logp_cur.grad).all()


def test_clip_fractions_on_hand_built_batch():
    logp_cur, logp_old, adv, mask = _hand_batch()
    _, stats = clipped_surrogate(logp_cur, logp_old, adv, mask, clip_eps=0.2)
    # 9 active tokens; low: row1 rho 0.5, row3 rho 0.7; high: row0 rho 1.5, row2 rho 1.3
    assert stats["clip_ratio/low_mean"] == pytest.approx(2 / 9, abs=1e-12)
    assert stats["clip_ratio/high_mean"] == pytest.approx(2 / 9, abs=1e-12)
    assert stats["clip_ratio/region_mean"] == pytest.approx(4 / 9, abs=1e-12)
    assert stats["ratio/mean"] == pytest.approx(1.0, abs=1e-12)  # the nine rhos sum to 9
    assert (stats["ratio/min"], stats["ratio/max"]) == pytest.approx((0.5, 1.5), abs=1e-12)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_on_policy_ratio_is_one_and_gradient_is_advantage_over_length(sign):
    # Before the first update logp_cur == logp_old: rho = 1, nothing is clipped.
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    logp_old = torch.tensor([[-0.5, -1.0, -0.1, -2.0], [-0.3, -9.0, -9.0, -9.0]], dtype=torch.float64)
    logp_cur = logp_old.clone().requires_grad_()
    adv = sign * torch.tensor([2.0, 2.0], dtype=torch.float64)
    loss, stats = clipped_surrogate(logp_cur, logp_old, adv, mask, G=2)
    assert loss.item() == -sign * 2.0
    assert stats["clip_ratio/region_mean"] == 0.0 and stats["ratio/mean"] == 1.0
    loss.backward()
    # Both responses get the same total gradient although one has 4 tokens and one has 1.
    assert logp_cur.grad[0].sum().item() == pytest.approx(-sign * 1.0)
    assert logp_cur.grad[1].sum().item() == pytest.approx(-sign * 1.0)
    assert logp_cur.grad[0].tolist() == pytest.approx([-sign * 0.25] * 4)


def test_surrogate_refuses_old_log_probs_that_carry_gradient():
    logp_cur, logp_old, adv, mask = _hand_batch()
    with pytest.raises(ValueError, match="sampling time"):
        clipped_surrogate(logp_cur, logp_cur, adv, mask)
    with pytest.raises(ValueError, match=r"\(B,\)"):
        clipped_surrogate(logp_cur, logp_old, adv[:3], mask)
    with pytest.raises(ValueError, match="clip_eps"):
        clipped_surrogate(logp_cur, logp_old, adv, mask, clip_eps=1.5)


# ----------------------------------------------------------------------------
# Exact prefix KL
# ----------------------------------------------------------------------------


def _kl_div_reference(logits_cur, logits_ref):
    """KL(p_cur || p_ref) per prefix via PyTorch's kl_div (input = log q, target = log p)."""
    return F.kl_div(F.log_softmax(logits_ref, -1), F.log_softmax(logits_cur, -1), log_target=True, reduction="none").sum(-1)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("block_size", [7, 4096])
def test_exact_kl_values_and_gradients_match_kl_div(dtype, tol, block_size):
    gen = torch.Generator().manual_seed(2)
    cur = (2 * torch.randn(3, 5, 50, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_()
    ref = (2 * torch.randn(3, 5, 50, generator=gen, dtype=torch.float64)).to(dtype).requires_grad_()
    weights = torch.rand(3, 5, generator=gen, dtype=torch.float64).to(dtype)

    kl = exact_prefix_kl(cur, ref, block_size=block_size)
    assert kl.shape == (3, 5) and kl.dtype == dtype
    grad_cur, grad_ref = torch.autograd.grad((kl * weights).sum(), (cur, ref))

    cur2, ref2 = cur.detach().clone().requires_grad_(), ref.detach().clone().requires_grad_()
    expected = _kl_div_reference(cur2, ref2)
    exp_cur, exp_ref = torch.autograd.grad((expected * weights).sum(), (cur2, ref2))

    torch.testing.assert_close(kl, expected, rtol=0, atol=tol)
    torch.testing.assert_close(grad_cur, exp_cur, rtol=0, atol=tol)
    torch.testing.assert_close(grad_ref, exp_ref, rtol=0, atol=tol)
    assert kl.min().item() > 0.1  # independent random logits: far from zero, so the match is not trivial


def test_exact_kl_gradcheck_float64():
    gen = torch.Generator().manual_seed(3)
    cur = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: exact_prefix_kl(a, b, block_size=3), (cur, ref))
    # Only the current policy needs a gradient in training: the reference is frozen.
    assert torch.autograd.gradcheck(lambda a: exact_prefix_kl(a, ref.detach(), block_size=3), (cur,))


def test_blocked_equals_one_block_on_the_qwen_vocabulary():
    gen = torch.Generator().manual_seed(4)
    cur = 3 * torch.randn(3, QWEN_VOCAB, generator=gen, dtype=torch.float64)
    ref = cur + 0.5 * torch.randn(3, QWEN_VOCAB, generator=gen, dtype=torch.float64)
    blocked = exact_prefix_kl(cur, ref, block_size=4096)
    one_block = exact_prefix_kl(cur, ref, block_size=QWEN_VOCAB)
    torch.testing.assert_close(blocked, one_block, rtol=1e-12, atol=0)
    torch.testing.assert_close(blocked, _kl_div_reference(cur, ref), rtol=1e-10, atol=0)
    torch.testing.assert_close(blockwise_logsumexp(cur, 4096), torch.logsumexp(cur, -1), rtol=1e-14, atol=0)


def _kl_normalising_each_block_on_its_own(logits_cur, logits_ref, block_size):
    """The protocol's warning, implemented on purpose: softmax within each block only."""
    total = torch.zeros(logits_cur.shape[:-1], dtype=logits_cur.dtype)
    for start in range(0, logits_cur.shape[-1], block_size):
        logp = F.log_softmax(logits_cur[..., start : start + block_size], -1)
        logq = F.log_softmax(logits_ref[..., start : start + block_size], -1)
        total += (logp.exp() * (logp - logq)).sum(-1)
    return total


def test_normalising_each_block_on_its_own_gives_a_different_divergence():
    gen = torch.Generator().manual_seed(5)
    cur = 3 * torch.randn(3, QWEN_VOCAB, generator=gen, dtype=torch.float64)
    ref = cur + 0.5 * torch.randn(3, QWEN_VOCAB, generator=gen, dtype=torch.float64)
    exact = exact_prefix_kl(cur, ref)
    wrong = _kl_normalising_each_block_on_its_own(cur, ref, 4096)
    relative_error = ((wrong - exact).abs() / exact).min().item()
    assert relative_error > 1.0, f"per-block normalisation should be far off, relative error {relative_error}"
    # With one block covering the vocabulary the two coincide: the normaliser is the point.
    torch.testing.assert_close(_kl_normalising_each_block_on_its_own(cur, ref, QWEN_VOCAB), exact, rtol=1e-10, atol=0)


def test_identical_distributions_give_exactly_zero_value_and_gradient():
    gen = torch.Generator().manual_seed(6)
    logits = (10 * torch.randn(4, 9000, generator=gen)).requires_grad_()
    kl = exact_prefix_kl(logits, logits.detach().clone(), block_size=4096)
    assert torch.equal(kl, torch.zeros(4))
    (grad,) = torch.autograd.grad(kl.sum(), logits)
    assert torch.equal(grad, torch.zeros_like(grad))


def test_shifting_a_prefix_logits_by_a_constant_changes_nothing():
    gen = torch.Generator().manual_seed(7)
    cur = torch.randn(4, 300, generator=gen, dtype=torch.float64)
    ref = torch.randn(4, 300, generator=gen, dtype=torch.float64)
    shift = torch.tensor([[0.0], [50.0], [-20.0], [700.0]], dtype=torch.float64)
    torch.testing.assert_close(exact_prefix_kl(cur + shift, ref - shift, block_size=64), exact_prefix_kl(cur, ref, block_size=64), rtol=1e-10, atol=1e-12)


def test_exact_kl_refuses_mismatched_inputs():
    with pytest.raises(ValueError, match="same shape"):
        exact_prefix_kl(torch.zeros(2, 5), torch.zeros(2, 6))
    with pytest.raises(ValueError, match="dtype"):
        exact_prefix_kl(torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="block_size"):
        exact_prefix_kl(torch.zeros(2, 5), torch.zeros(2, 5), block_size=0)


def test_token_entropy_matches_full_softmax_and_known_values():
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(2, 3, 1000, generator=gen, dtype=torch.float64)
    logp = F.log_softmax(logits, -1)
    torch.testing.assert_close(token_entropy(logits, block_size=128), -(logp.exp() * logp).sum(-1), rtol=1e-12, atol=0)
    uniform = torch.zeros(1, 8, dtype=torch.float64)
    assert token_entropy(uniform).item() == pytest.approx(math.log(8), abs=1e-15)


# ----------------------------------------------------------------------------
# KL estimators on sampled tokens
# ----------------------------------------------------------------------------


def test_kl_estimators_hand_values():
    logp_cur = torch.log(torch.tensor([0.5, 0.25, 0.3], dtype=torch.float64))
    logp_ref = torch.log(torch.tensor([0.25, 0.5, 0.3], dtype=torch.float64))
    k = kl_estimators(logp_cur, logp_ref)
    ln2 = math.log(2)
    # r = q/p = 0.5, 2, 1
    assert k["k1"].tolist() == pytest.approx([ln2, -ln2, 0.0], abs=1e-15)
    assert k["k2"].tolist() == pytest.approx([ln2**2 / 2, ln2**2 / 2, 0.0], abs=1e-15)
    assert k["k3"].tolist() == pytest.approx([0.5 - 1 + ln2, 2 - 1 - ln2, 0.0], abs=1e-15)


def test_k3_is_never_negative_even_for_tiny_log_ratios_in_float32():
    magnitudes = torch.logspace(-30, 1.5, 20_000, dtype=torch.float32)
    log_r = torch.cat([magnitudes, -magnitudes, torch.zeros(1)])
    k3 = kl_estimators(torch.zeros_like(log_r), log_r)["k3"]
    assert k3.min().item() >= 0.0


def test_k1_and_k3_average_to_the_exact_kl_under_the_current_policy():
    gen = torch.Generator().manual_seed(9)
    cur = torch.randn(5, 40, generator=gen, dtype=torch.float64)
    ref = torch.randn(5, 40, generator=gen, dtype=torch.float64)
    logp, logq = F.log_softmax(cur, -1), F.log_softmax(ref, -1)
    k = kl_estimators(logp, logq)  # every token of the vocabulary as a "sample"
    exact = exact_prefix_kl(cur, ref)
    p = logp.exp()
    torch.testing.assert_close((p * k["k1"]).sum(-1), exact, rtol=1e-12, atol=0)
    torch.testing.assert_close((p * k["k3"]).sum(-1), exact, rtol=1e-12, atol=0)
    assert torch.all((p * k["k2"]).sum(-1) != exact)  # k2 is biased


# ----------------------------------------------------------------------------
# The benchmark (`python -m labkit bench kl`): runs, ends with its line, and the memory claim
# ----------------------------------------------------------------------------


def test_kl_benchmark_runs_small_and_blocked_needs_less_extra_memory(capsys):
    import re

    from labkit.bench import kl as bench_kl

    # --threads 0: leave this process's torch thread setting alone.
    assert bench_kl.main(["--prefixes", "4", "--vocab", "20000", "--block-size", "1024", "--repeats", "1", "--threads", "0"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(r"time ratio: (\d+\.\d)x; extra memory ratio: (\d+\.\d|n/a)x?", last)
    assert match, last
    if match.group(2) != "n/a":  # memory is counted, not timed: the blocked peak must be smaller
        assert float(match.group(2)) < 1.0, last


def test_exact_kl_on_real_tiny_model_distributions():
    # Probes from a real model: the committed tiny base against a copy moved by one SGD step on a
    # real prompt, so the two full next-token distributions differ the way a policy update makes them.
    from labkit.models import presets, scoring
    from labkit.models.presets import TINY_BASE_STATE

    assert TINY_BASE_STATE.is_file(), f"{TINY_BASE_STATE}: the committed tiny base is missing"
    torch.manual_seed(0)
    model, tokenizer = presets.load("tiny")
    moved, _ = presets.load("tiny")
    ids = torch.tensor([scoring.build_prompt_ids(tokenizer, "A shop had 7 boxes. How many remain?")])
    opt = torch.optim.SGD(moved.parameters(), lr=0.5)
    moved(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    with torch.no_grad():
        cur = moved(input_ids=ids).logits[0].double()  # (T, 512), every prefix of the prompt
        ref = model(input_ids=ids).logits[0].double()
    expected = F.kl_div(F.log_softmax(ref, -1), F.log_softmax(cur, -1), log_target=True, reduction="none").sum(-1)
    assert expected.min() > 1e-6  # the probes really differ
    for block in (512, 100, 7):  # one block, and blocks that do not divide the vocabulary
        torch.testing.assert_close(exact_prefix_kl(cur, ref, block_size=block), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(exact_prefix_kl(cur.float(), ref.float(), block_size=100), expected.float(),
                               rtol=1e-4, atol=1e-6)


# -- Issue 40's baselines and issue 43's reductions, by hand --------------------------------------

def test_leave_one_out_and_raw_reward_advantages_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    loo = losses.leave_one_out_advantages(rewards)
    # row 0: r_0 = 1 minus the mean of (0, 0, 1) = 1/3; r_1 = 0 minus the mean of (1, 0, 1) = 2/3
    assert loo[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-15) and loo.dtype == torch.float64
    assert loo[1].tolist() == [0.0] * 4  # an all-equal group: exactly zero
    # G / (G - 1) times the centred rewards (Dr. GRPO's), to the last bit here
    assert torch.allclose(loo, 4 / 3 * losses.group_advantages(rewards, scale_by_std=False), rtol=0, atol=1e-15)
    assert losses.raw_reward_advantages(rewards).tolist() == rewards.tolist()
    with pytest.raises(ValueError, match="G >= 2"):
        losses.leave_one_out_advantages(torch.ones(3, 1))


def test_the_constant_reduction_divides_by_rows_times_the_limit():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(losses.constant_mean(values, mask, 4)) == (1 + 2 + 4) / (2 * 4)  # padding (even nan) never counts
    assert float(losses.reduce(values, mask, None, "constant", 4)) == 7 / 8
    with pytest.raises(ValueError, match="max_new_tokens must be >= the 3 positions"):
        losses.constant_mean(values, mask, 2)


def test_clip_higher_widens_only_the_upper_side():
    logp_old = torch.zeros(2, 1, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.3], [0.7]], dtype=torch.float64)).requires_grad_(True)
    adv, mask = torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(2, 1)
    sym, s1 = losses.clipped_surrogate(logp, logp_old, adv, mask, clip_eps=0.2)
    high, s2 = losses.clipped_surrogate(logp, logp_old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    # row 0: min(1.3, 1.2) = 1.2 symmetric, min(1.3, 1.28) = 1.28 with clip-higher; row 1: min(-0.7, -0.8) = -0.8
    assert float(sym.detach()) == pytest.approx(-(1.2 - 0.8) / 2, abs=1e-15)
    assert float(high.detach()) == pytest.approx(-(1.28 - 0.8) / 2, abs=1e-15)
    assert s1["clip_ratio/high_mean"] == 0.5 and s2["clip_ratio/high_mean"] == 0.5
    same, _ = losses.clipped_surrogate(logp, logp_old, adv, mask, clip_eps=0.2, clip_eps_high=0.2)
    assert float(same.detach()) == float(sym.detach())


def test_truncated_importance_weights_by_hand():
    # pi_trainer / pi_sampler = 0.5, 1.5, 3 (capped at 2) on row 0; row 1 has one token and padding
    logp_sampler = torch.log(torch.tensor([[0.4, 0.2, 0.1], [0.5, 0.9, 0.9]], dtype=torch.float64))
    logp_trainer = torch.log(torch.tensor([[0.2, 0.3, 0.3], [0.5, 0.1, 0.7]], dtype=torch.float64))
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    w = losses.truncated_importance_weights(logp_trainer, logp_sampler, mask, cap=2.0)
    assert w.flatten().tolist() == pytest.approx([0.5, 1.5, 2.0, 1.0, 1.0, 1.0], abs=1e-15)  # padding: 1
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap must be > 1"):
        losses.truncated_importance_weights(logp_trainer, logp_sampler, mask, cap=1.0)


def test_token_weights_scale_each_token_term_and_its_gradient():
    # two tokens of one response, A = 1, rho = 1.1 and 1.3 (clipped at 1.2); weights 0.5 and 2
    logp_old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.log(torch.tensor([[1.1, 1.3]], dtype=torch.float64)).requires_grad_(True)
    adv, mask = torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2)
    w = torch.tensor([[0.5, 2.0]], dtype=torch.float64)
    loss, stats = losses.clipped_surrogate(logp, logp_old, adv, mask, clip_eps=0.2, token_weights=w)
    assert float(loss.detach()) == pytest.approx(-(0.5 * 1.1 + 2.0 * 1.2) / 2, abs=1e-15)
    loss.backward()
    # the loss is -(w rho A) / 2 per token: its gradient -w rho / 2 where unclipped, exactly 0 where the clip binds
    assert logp.grad.flatten().tolist() == pytest.approx([-0.5 * 1.1 / 2, 0.0], abs=1e-15)
    assert stats["clip_ratio/high_mean"] == 0.5
    with pytest.raises(ValueError, match="token_weights must be detached with the shape"):
        losses.clipped_surrogate(logp, logp_old, adv, mask, token_weights=w[:, :1])
