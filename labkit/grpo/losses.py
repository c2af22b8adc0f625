"""The loss maths of GRPO, as small tensor-in, tensor-out functions (chapters 3, 4, 5).

In chapter order:

    3  group advantages        A = (r - mean_G r) / (std_G r + eps), per group of G responses
    4  ratio, clipped surrogate rho = exp(logp_cur - logp_old); min(rho A, clip(rho, 1-eps, 1+eps) A)
       the reduction           mean over a response's tokens, then over a group, then over prompts
    5  exact prefix KL         sum_v p_cur(v) (log p_cur(v) - log p_ref(v)), in vocabulary blocks
       KL estimators           k1, k2, k3 on the sampled tokens only (for comparison)

Shapes used throughout:
    P prompts, G responses per prompt (the group size), B = P * G response rows,
    ordered prompt-major (rows 0..G-1 are the first prompt's group), T tokens per row
    (padded), V vocabulary entries.  A mask (B, T) is True on a response's own tokens
    (EOS included) and False on padding.

Nothing here needs a model; every function works on tensors you can build by hand.
"""

from __future__ import annotations

import torch

# ----------------------------------------------------------------------------
# 3. Group advantages
# ----------------------------------------------------------------------------


def _check_rewards(rewards: torch.Tensor) -> None:
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 2:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a 2-D tensor (groups, G), got {shape}")
    if rewards.shape[0] == 0 or rewards.shape[1] == 0:
        raise ValueError(f"rewards must hold at least one group of at least one response, got shape {tuple(rewards.shape)}")
    if rewards.is_floating_point() and not torch.isfinite(rewards).all():
        raise ValueError(f"rewards must be finite, got {rewards.tolist()}")


def zero_variance_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Which groups carry no learning signal: every reward in the group is the same.

    rewards: (groups, G).  Returns a bool tensor (groups,), True where all G rewards
    are equal (compared exactly, so [0.1, 0.1, 0.1] counts as constant).
    """
    _check_rewards(rewards)
    return (rewards == rewards[:, :1]).all(dim=1)


def expected_frac_reward_zero_std(p: float, G: int) -> float:
    """Chance that a group of G independent 0/1 rewards with success rate p is constant.

        P(all right) + P(all wrong) = p^G + (1 - p)^G

    Such a group has advantages exactly 0: no surrogate gradient.  It assumes one p for
    every prompt; when p varies between prompts the expected fraction is larger (the
    function is convex in p), so with mixed difficulty this is a lower bound.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p is a success rate and must lie in [0, 1], got {p}")
    if int(G) != G or G < 1:
        raise ValueError(f"G (responses per prompt) must be a positive integer, got {G}")
    return p ** G + (1.0 - p) ** G


def group_advantages(rewards: torch.Tensor, eps: float = 1e-8, scale_by_std: bool = True) -> torch.Tensor:
    """Group-relative advantages, one per response.

        A_i = (r_i - mean(r)) / (std(r) + eps)      (GRPO; std with correction 0)
        A_i =  r_i - mean(r)                         (scale_by_std=False: Dr. GRPO)

    rewards: (groups, G), one row per prompt.  Returns (groups, G) in float64, detached.

    - The std is the population std (divide by G, not G - 1).
    - A group whose rewards are all equal gets advantages of exactly 0.0: no winner is
      invented.  Its centred rewards are set to zero rather than computed, because the
      mean of equal values need not round back to that value (three 0.1 in float32).
    - Computed in float64 so that eps is visible: for [1, 0, 1, 0] the advantages are
      +-0.5 / (0.5 + 1e-8) = +-(1 - 2e-8), which float32 (spacing 6e-8 just below 1)
      would round to exactly +-1.  Cast to your loss dtype afterwards if you like.
    """
    _check_rewards(rewards)
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    r = rewards.detach().to(torch.float64)
    constant = zero_variance_groups(r)  # (groups,)
    centred = r - r.mean(dim=1, keepdim=True)  # (groups, G)
    centred = torch.where(constant[:, None], torch.zeros_like(centred), centred)
    if not scale_by_std:
        return centred
    std = centred.pow(2).mean(dim=1, keepdim=True).sqrt()  # population std, (groups, 1)
    return centred / (std + eps)


def leave_one_out_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO's advantages: each reward minus the mean of the *other* G - 1 rewards of its group.

        A_i = r_i - (1 / (G - 1)) sum_{j != i} r_j  =  G / (G - 1) x (r_i - mean(r))

    rewards: (groups, G), G >= 2.  Returns (groups, G) float64, detached; a group whose rewards
    are all equal gets exactly 0.0 (as in `group_advantages`).  The baseline of response i does
    not depend on r_i, so the estimator stays unbiased; the factor G / (G - 1) is all that
    separates it from the group mean's centring (Dr. GRPO)."""
    _check_rewards(rewards)
    G = rewards.shape[1]
    if G < 2:
        raise ValueError(f"leave-one-out needs G >= 2 responses per group, got {G}")
    r = rewards.detach().to(torch.float64)
    constant = zero_variance_groups(r)  # (groups,)
    others = (r.sum(dim=1, keepdim=True) - r) / (G - 1)  # (groups, G)
    return torch.where(constant[:, None], torch.zeros_like(r), r - others)


def raw_reward_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """No baseline (REINFORCE on the reward itself): A_i = r_i.  (groups, G) -> (groups, G) float64.

    Unbiased like the others, but with 0/1 rewards every correct response is pushed up and no
    wrong one is pushed down, and a group that is all right still pushes: its mean is the signal."""
    _check_rewards(rewards)
    return rewards.detach().to(torch.float64).clone()


# ----------------------------------------------------------------------------
# 4. The reduction: token mean, then response (group) mean, then prompt mean
# ----------------------------------------------------------------------------


def _check_values_and_mask(values: torch.Tensor, mask: torch.Tensor, what: str = "values") -> None:
    if values.dim() != 2:
        raise ValueError(f"{what} must be 2-D (B, T), got shape {tuple(values.shape)}")
    if mask.shape != values.shape:
        raise ValueError(f"mask must have the shape of {what} {tuple(values.shape)}, got {tuple(mask.shape)}")


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is True, along `dim`.

    values: any shape; mask: same shape (bool, or 0/1).  Returns values' shape without `dim`.
    Raises ValueError if some slice has no active position (its mean is undefined; a
    response always has at least its EOS token, so an empty row is a bug upstream).
    """
    if mask.shape != values.shape:
        raise ValueError(f"mask must have the shape of values {tuple(values.shape)}, got {tuple(mask.shape)}")
    weights = mask.to(values.dtype)
    counts = weights.sum(dim=dim)
    if (counts == 0).any():
        empty = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"masked_mean over dim {dim}: no active position in slice(s) {empty}")
    # torch.where, not values * weights: a padding position may hold inf or nan.
    zeros = torch.zeros((), dtype=values.dtype, device=values.device)
    return torch.where(mask.bool(), values, zeros).sum(dim=dim) / counts


def reduce_tokens(values: torch.Tensor, mask: torch.Tensor, G: int | None = None) -> torch.Tensor:
    """The lab's reduction of per-token values to one scalar, in three stages.

        per response  m_i = (1 / L_i) sum_t mask_it values_it     L_i = active tokens of row i
        per group     g_p = (1 / G)   sum_{i in group p} m_i
        over prompts  out = (1 / P)   sum_p g_p

    values, mask: (B, T) with B = P * G, rows prompt-major.  Returns a 0-d tensor.
    G: G; None means one group holding all B rows.

    Each response weighs 1 / (P G) whatever its length: a long response spreads the same
    total weight over more tokens (per token 1 / (P G L_i)).  Because every group has the
    same size G, the group-then-prompt mean equals the plain mean over the B responses;
    the stages are kept separate because they are what the protocol states and what a
    variant with unequal groups would change.
    """
    _check_values_and_mask(values, mask)
    rows = values.shape[0]
    G = rows if G is None else G
    if G < 1 or rows % G != 0:
        raise ValueError(f"G must divide the {rows} rows (B = prompts * G), got {G}")
    response_means = masked_mean(values, mask, dim=1)  # (B,)
    group_means = response_means.view(rows // G, G).mean(dim=1)  # (P,)
    return group_means.mean()  # ()


def token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One mean over every active token of the batch (TRL's "dapo"/"bnpo" reductions).

        out = sum_it mask_it values_it / sum_it mask_it

    values, mask: (B, T).  Returns a 0-d tensor.  Unlike `reduce_tokens`, a response weighs
    in proportion to its length: the length bias the lab's reduction avoids."""
    _check_values_and_mask(values, mask)
    active = mask.bool()
    if not active.any():
        raise ValueError("token_mean: no active position in the batch")
    zeros = torch.zeros((), dtype=values.dtype, device=values.device)
    return torch.where(active, values, zeros).sum() / active.sum()


def constant_mean(values: torch.Tensor, mask: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """Dr. GRPO's reduction: the sum over every active token divided by a constant, B x max_new_tokens.

        out = sum_it mask_it values_it / (B L_max)

    values, mask: (B, T), T <= max_new_tokens.  Returns a 0-d tensor.  Every token weighs
    the same 1 / (B L_max), whatever its response's length or the batch's: neither the per-response
    mean's favour for short responses nor the token mean's dependence on the batch's lengths."""
    _check_values_and_mask(values, mask)
    if not max_new_tokens or max_new_tokens < values.shape[1]:
        raise ValueError(f"constant_mean: max_new_tokens must be >= the {values.shape[1]} positions of "
                         f"the batch, got {max_new_tokens!r}")
    zeros = torch.zeros((), dtype=values.dtype, device=values.device)
    return torch.where(mask.bool(), values, zeros).sum() / (values.shape[0] * max_new_tokens)


REDUCTIONS = ("sequence", "token", "constant")


def reduce(values: torch.Tensor, mask: torch.Tensor, G: int | None = None,
           reduction: str = "sequence", max_new_tokens: int | None = None) -> torch.Tensor:
    """`reduce_tokens` ("sequence", the protocol's), `token_mean` ("token") or `constant_mean`
    ("constant", which needs max_new_tokens); (B, T) -> 0-d."""
    if reduction == "sequence":
        return reduce_tokens(values, mask, G)
    if reduction == "token":
        return token_mean(values, mask)
    if reduction == "constant":
        return constant_mean(values, mask, max_new_tokens)
    raise ValueError(f"unknown reduction {reduction!r}; expected one of {REDUCTIONS}")


# ----------------------------------------------------------------------------
# 4. Ratio and clipped surrogate
# ----------------------------------------------------------------------------


def clipped_surrogate(
    logp_cur: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    G: int | None = None,
    reduction: str = "sequence",
    clip_eps_high: float | None = None,
    max_new_tokens: int | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate loss of PPO/GRPO and its clipping statistics.

        rho_it = exp(logp_cur_it - logp_old_it)
        obj_it = w_it min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps_high) A_i)
        loss   = - reduce_tokens(obj, mask, G)

    logp_cur:   (B, T) log-probs of the sampled tokens under the current policy (with grad).
    logp_old:   (B, T) the same under the old policy, recorded at sampling time (detached).
    advantages: (B,)   one per response, broadcast over its tokens (detached).
    mask:       (B, T) True on response tokens.
    G: G for the reduction (see `reduce_tokens`); None = one group of all rows,
                which gives the same value whenever groups have equal sizes.
    reduction:  "sequence" (`reduce_tokens`, the protocol's), "token" (`token_mean`) or
                "constant" (`constant_mean`, with max_new_tokens).
    clip_eps_high: the upper clip's epsilon (DAPO's clip-higher); None: clip_eps, symmetric.
    token_weights: (B, T) w_it >= 0, detached: truncated importance sampling's
                min(pi_trainer / pi_sampler, C) when the sampler's probabilities differ from
                the trainer's (`labkit.grpo.variants`, "tis_cap"); None: w = 1 (the protocol).

    The gradient of obj_it with respect to logp_cur_it is rho_it A_i where the min picks
    the unclipped term, and exactly 0 where the clip is active: rho > 1 + eps with A > 0,
    or rho < 1 - eps with A < 0 (the policy already moved far enough that way).

    Returns (loss, stats), stats as floats over the active tokens of the batch:
        clip_ratio/low_mean     fraction with rho < 1 - eps and A < 0 (low clip active)
        clip_ratio/high_mean    fraction with rho > 1 + eps and A > 0 (high clip active)
        clip_ratio/region_mean  fraction with either
        ratio/mean, ratio/min, ratio/max   of rho over active tokens
    """
    _check_values_and_mask(logp_cur, mask, "logp_cur")
    if logp_old.shape != logp_cur.shape:
        raise ValueError(f"logp_old must have the shape of logp_cur {tuple(logp_cur.shape)}, got {tuple(logp_old.shape)}")
    if advantages.shape != logp_cur.shape[:1]:
        raise ValueError(f"advantages must have shape (B,) = ({logp_cur.shape[0]},), one per response, got {tuple(advantages.shape)}")
    if logp_old.requires_grad:
        raise ValueError(
            "logp_old requires grad: old log-probs are recorded by the old policy at sampling time "
            "and must be detached; recomputing them from the current policy makes rho = 1 and erases the history"
        )
    if advantages.requires_grad:
        raise ValueError("advantages require grad: rewards and advantages carry no gradient; detach them")
    if not 0.0 < clip_eps < 1.0:
        raise ValueError(f"clip_eps must lie in (0, 1), got {clip_eps}")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not eps_high > 0.0:
        raise ValueError(f"clip_eps_high must be > 0, got {clip_eps_high}")
    if token_weights is not None and (token_weights.shape != logp_cur.shape or token_weights.requires_grad):
        raise ValueError(f"token_weights must be detached with the shape of logp_cur {tuple(logp_cur.shape)}, "
                         f"got {tuple(token_weights.shape)} (requires_grad={token_weights.requires_grad})")

    active = mask.bool()
    # On padding the log-probs may be anything (even -inf); rho is set to 1 there so that
    # no inf or nan can reach the masked sums or their gradients.
    log_ratio = torch.where(active, logp_cur - logp_old, torch.zeros_like(logp_cur))
    rho = torch.exp(log_ratio)  # (B, T)
    adv = advantages.to(logp_cur.dtype)[:, None]  # (B, 1)
    unclipped = rho * adv
    clipped = rho.clamp(1.0 - clip_eps, 1.0 + eps_high) * adv
    objective = torch.minimum(unclipped, clipped)  # (B, T)
    if token_weights is not None:  # w >= 0 keeps the min's choice and the clip's zero gradient
        objective = objective * token_weights.to(objective.dtype)
    loss = -reduce(objective, mask, G, reduction, max_new_tokens)

    with torch.no_grad():
        stats = clip_statistics(rho, (rho < 1.0 - clip_eps) & (adv < 0), (rho > 1.0 + eps_high) & (adv > 0), active)
    return loss, stats


def clip_statistics(ratio: torch.Tensor, low: torch.Tensor, high: torch.Tensor,
                    active: torch.Tensor | None = None) -> dict[str, float]:
    """The clip's statistics, the same keys for every objective: over the active entries of `ratio`
    ((B, T) per token, or (B,) per response), the shares where the low clip acts (`low`, bool, the same
    shape), where the high one does (`high`) and where either does, and the ratio's mean, min and max.
    active: bool, the same shape (the response tokens); None: every entry counts."""
    active = torch.ones_like(low) if active is None else active
    n_active = active.sum().clamp_min(1).to(torch.float64)
    low, high, ratio_active = low & active, high & active, ratio[active]
    return {
        "clip_ratio/low_mean": (low.sum() / n_active).item(),
        "clip_ratio/high_mean": (high.sum() / n_active).item(),
        "clip_ratio/region_mean": ((low | high).sum() / n_active).item(),
        "ratio/mean": ratio_active.mean().item(),
        "ratio/min": ratio_active.min().item(),
        "ratio/max": ratio_active.max().item(),
    }


def truncated_importance_weights(logp_trainer: torch.Tensor, logp_sampler: torch.Tensor, mask: torch.Tensor,
                                 cap: float) -> torch.Tensor:
    """Truncated importance sampling's per-token weights (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"):

        w_it = min(pi_trainer(y_t | x, y_<t) / pi_sampler(y_t | x, y_<t), cap)

    logp_trainer: (B, T) the sampled tokens' log-probs as the trainer computes them (the old policy,
    recomputed); logp_sampler: (B, T) as the sampler recorded them; mask (B, T).  Returns (B, T),
    detached, 1 on padding.  When sampler and trainer agree, every w is 1 and the loss is unchanged.
    """
    if not cap > 1.0:
        raise ValueError(f"the importance weight's cap must be > 1 (Yao et al. use 2), got {cap!r}")
    log_ratio = torch.where(mask.bool(), logp_trainer.detach() - logp_sampler.detach(), torch.zeros_like(logp_trainer))
    return torch.exp(log_ratio).clamp(max=cap)


# ----------------------------------------------------------------------------
# 5. Exact KL on visited prefixes, in vocabulary blocks
# ----------------------------------------------------------------------------


def _vocab_blocks(vocab: int, block_size: int):
    for start in range(0, vocab, block_size):
        yield slice(start, min(start + block_size, vocab))


def blockwise_logsumexp(logits: torch.Tensor, block_size: int = 4096) -> torch.Tensor:
    """log sum_v exp(z_v) over the whole last dimension, one vocabulary block at a time.

        lse = m + log sum_blocks sum_{v in block} exp(z_v - m),    m = max_v z_v

    logits: (N, V).  Returns (N,) in logits' dtype.  Subtracting the row maximum keeps
    every exponential <= 1 (no overflow); the per-block sums are accumulated in float64,
    so the blocked result is as accurate as torch.logsumexp over the full row.  Only one
    block of exponentials exists at a time.
    """
    row_max = logits.amax(dim=-1)  # (N,)
    total = torch.zeros(logits.shape[0], dtype=torch.float64, device=logits.device)
    for block in _vocab_blocks(logits.shape[-1], block_size):
        total += torch.exp(logits[:, block] - row_max[:, None]).sum(dim=-1)
    return (row_max.to(torch.float64) + total.log()).to(logits.dtype)


class _ExactPrefixKL(torch.autograd.Function):
    """KL(p_cur || p_ref) per row of (N, V) logits, forward and backward in vocabulary blocks.

    With p = softmax(z_cur), q = softmax(z_ref) and KL = sum_v p_v (log p_v - log q_v):
        dKL/dz_cur_v = p_v (log p_v - log q_v - KL)
        dKL/dz_ref_v = q_v - p_v
    Autograd of the blocked loop would keep every block's probabilities for backward;
    this Function keeps only the two logit tensors (already alive) and three (N,) vectors,
    and recomputes each block's probabilities in backward.
    """

    @staticmethod
    def forward(ctx, logits_cur, logits_ref, block_size):
        lse_cur = blockwise_logsumexp(logits_cur, block_size)  # (N,)
        lse_ref = blockwise_logsumexp(logits_ref, block_size)  # (N,)
        kl = torch.zeros(lse_cur.shape, dtype=torch.float64, device=lse_cur.device)  # (N,) accumulator
        for block in _vocab_blocks(logits_cur.shape[-1], block_size):
            logp = logits_cur[:, block] - lse_cur[:, None]  # (N, block)
            logq = logits_ref[:, block] - lse_ref[:, None]
            p = torch.exp(logp)
            # Equal logits give logp - logq == 0 exactly, so identical policies give KL 0.0.
            # In-place ops and a row-wise dot product: fewer fresh block-sized buffers,
            # which on CPU cost more (page faults) than the arithmetic.
            kl += torch.linalg.vecdot(p, logp.sub_(logq))
        kl = kl.to(logits_cur.dtype)
        ctx.save_for_backward(logits_cur, logits_ref, lse_cur, lse_ref, kl)
        ctx.block_size = block_size
        return kl

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_kl):
        logits_cur, logits_ref, lse_cur, lse_ref, kl = ctx.saved_tensors
        need_cur, need_ref = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_cur = torch.empty_like(logits_cur) if need_cur else None
        grad_ref = torch.empty_like(logits_ref) if need_ref else None
        g = grad_kl[:, None]  # (N, 1)
        for block in _vocab_blocks(logits_cur.shape[-1], ctx.block_size):
            logp = logits_cur[:, block] - lse_cur[:, None]
            logq = logits_ref[:, block] - lse_ref[:, None]
            p = torch.exp(logp)
            if need_ref:
                torch.mul(g, torch.exp(logq).sub_(p), out=grad_ref[:, block])  # g (q - p)
            if need_cur:
                log_ratio_minus_kl = logp.sub_(logq).sub_(kl[:, None])  # in place: logp is not needed again
                torch.mul(log_ratio_minus_kl.mul_(g), p, out=grad_cur[:, block])  # g p (log p - log q - KL)
        return grad_cur, grad_ref, None


def exact_prefix_kl(logits_cur: torch.Tensor, logits_ref: torch.Tensor, block_size: int = 4096) -> torch.Tensor:
    """Exact KL(p_cur || p_ref) of the next-token distributions, one value per prefix.

        KL(prefix) = sum_{v=1..V} p_cur(v) (log p_cur(v) - log p_ref(v)),
        log p(v)   = z_v - logsumexp_{u=1..V} z_u        (the FULL normaliser)

    logits_cur, logits_ref: (..., V), same shape and dtype, finite.  Returns (...).

    The vocabulary is traversed in blocks of `block_size`: a first sweep computes each
    prefix's logsumexp over all V entries (block by block), a second turns each block into
    probabilities with that full normaliser and accumulates its share of the sum.
    Normalising a block on its own would compute a different (wrong) divergence.
    Beyond the two logit tensors, forward and backward hold a few (N, block_size)
    temporaries and (N,) vectors, never a full (N, V) tensor of probabilities (backward
    must of course return (N, V) gradients).  Differentiable in both arguments (the
    reference is normally frozen); exactly 0.0 where the two logits are equal.

    The sum runs over the whole vocabulary at each prefix that was actually visited; it
    is exact to rounding per prefix, not a KL between sequence distributions.
    """
    if logits_cur.shape != logits_ref.shape:
        raise ValueError(f"logits_cur {tuple(logits_cur.shape)} and logits_ref {tuple(logits_ref.shape)} must have the same shape")
    if logits_cur.dtype != logits_ref.dtype or not logits_cur.is_floating_point():
        raise ValueError(f"logits must share one floating dtype, got {logits_cur.dtype} and {logits_ref.dtype}")
    if logits_cur.dim() < 1 or logits_cur.shape[-1] == 0:
        raise ValueError(f"logits must be (..., V) with V >= 1, got {tuple(logits_cur.shape)}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    lead, vocab = logits_cur.shape[:-1], logits_cur.shape[-1]
    kl = _ExactPrefixKL.apply(logits_cur.reshape(-1, vocab), logits_ref.reshape(-1, vocab), block_size)
    return kl.reshape(lead)


def token_entropy(logits: torch.Tensor, block_size: int = 4096) -> torch.Tensor:
    """Entropy of the next-token distribution at each prefix, in vocabulary blocks.

        H = - sum_v p(v) log p(v),   log p(v) = z_v - logsumexp(z)

    logits: (..., V).  Returns (...).  A diagnostic: call it under torch.no_grad()
    (under autograd every block's intermediates would be kept for backward).
    """
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (..., V) with V >= 1, got {tuple(logits.shape)}")
    lead, vocab = logits.shape[:-1], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    lse = blockwise_logsumexp(flat, block_size)
    entropy = torch.zeros(lse.shape, dtype=torch.float64, device=lse.device)
    for block in _vocab_blocks(vocab, block_size):
        logp = flat[:, block] - lse[:, None]
        entropy -= (torch.exp(logp) * logp).sum(dim=-1)
    return entropy.to(logits.dtype).reshape(lead)


# ----------------------------------------------------------------------------
# 5. KL estimators on sampled tokens (logged beside the exact KL; a variant may put one in the loss)
# ----------------------------------------------------------------------------


def kl_estimators(logp_cur: torch.Tensor, logp_ref: torch.Tensor) -> dict[str, torch.Tensor]:
    """Schulman's single-sample estimators of KL(p_cur || p_ref), one per sampled token.

    With x ~ p_cur sampled and log r = log p_ref(x) - log p_cur(x):
        k1 = -log r                    unbiased, high variance, can be negative
        k2 = (log r)^2 / 2             biased, low variance, >= 0
        k3 = (r - 1) - log r           unbiased, low variance, >= 0 (the DeepSeekMath/TRL choice)

    logp_cur, logp_ref: same shape (e.g. (B, T)), the sampled tokens' log-probs.
    Returns {"k1", "k2", "k3"}, each of that shape.  These see one token per prefix; the
    lab's penalty is `exact_prefix_kl`, which sums over the whole vocabulary.
    """
    if logp_cur.shape != logp_ref.shape:
        raise ValueError(f"logp_cur {tuple(logp_cur.shape)} and logp_ref {tuple(logp_ref.shape)} must have the same shape")
    log_r = logp_ref - logp_cur
    return {
        "k1": -log_r,
        "k2": 0.5 * log_r.pow(2),
        # expm1, not exp(x) - 1: near x = 0 the latter rounds below x and k3 turns negative.
        "k3": torch.expm1(log_r) - log_r,
    }
