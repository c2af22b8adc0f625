"""Chapter 4, ratio and clip: `check_ch04_clipped_objective` grades the per-token clipped objective."""

from __future__ import annotations

from ._calling import ADVANTAGE_NOT_BROADCAST, ExerciseError, call_student, require_function, require_tensor


# (log rho, advantage) per token for the chapter 4 checker: each side of each clip edge, both signs.
CH04_LOG_RATIOS = (-0.7, -0.25, -0.2, -0.1, 0.0, 0.1, 0.17, 0.2, 0.6)
CH04_ADVANTAGES = (1.0, -1.0, 0.5, -1.5, 0.0)


def _ch04_reference(log_ratio: float, advantage: float, clip_eps: float):
    """(objective, d objective / d logp_cur) of one token, from labkit.grpo.losses.clipped_surrogate."""
    import torch

    from ...grpo.losses import clipped_surrogate

    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_surrogate(logp, torch.zeros(1, 1, dtype=torch.float64),
                                torch.tensor([advantage], dtype=torch.float64),
                                torch.ones(1, 1, dtype=torch.bool), clip_eps=clip_eps)
    (grad,) = torch.autograd.grad(-loss, logp)
    return -loss.item(), grad.item()


def _ch04_slip(got, logp_cur, logp_old, clip_eps: float) -> str:
    """The hint for a wrong objective (5, 9): the usual slip it follows on EVERY token, else the formula.

    One token cannot tell the slips apart (where A > 0 and rho < 1 - eps, the maximum and the
    clipped term alone are the same number), the whole grid can."""
    import torch

    logp_cur, logp_old = logp_cur.detach(), logp_old.detach()
    A = torch.tensor(CH04_ADVANTAGES, dtype=torch.float64)[:, None]  # (5, 1)

    def objective(rho, low=1 - clip_eps, high=1 + clip_eps):
        return torch.minimum(rho * A, rho.clamp(low, high) * A)

    rho = (logp_cur - logp_old).exp()  # (5, 9)
    unclipped, clipped = rho * A, rho.clamp(1 - clip_eps, 1 + clip_eps) * A  # (5, 9) each
    ratio_hint = "rho = exp(logp_cur - logp_old), the current policy's probability over the old one's"
    slips = (
        (unclipped, "you returned rho A: take the minimum with the clipped term clip(rho, 1-eps, 1+eps) A"),
        (clipped, "you returned only the clipped term clip(rho, 1-eps, 1+eps) A: take the minimum of it and "
                  "the unclipped rho A"),
        (torch.maximum(unclipped, clipped), "take the minimum (the pessimistic term), not the maximum"),
        (torch.minimum(unclipped, unclipped.clamp(1 - clip_eps, 1 + clip_eps)),
         "you clipped the product rho A; clip the ratio rho alone, then multiply by A: "
         "clip(rho, 1-eps, 1+eps) A (the clip bounds how far the policy moved, whatever the advantage's size)"),
        (unclipped.clamp(1 - clip_eps, 1 + clip_eps),
         "you clipped the product rho A; clip the ratio rho alone, multiply by A, and take the minimum with "
         "the unclipped rho A"),
        (objective(rho, low=None), "you clipped rho at 1 + eps only: the lower edge 1 - eps is missing, and it is "
                                   "the one that binds when A < 0 (clip(rho, 1 - eps, 1 + eps))"),
        (objective(rho, high=None), "you clipped rho at 1 - eps only: the upper edge 1 + eps is missing, and it is "
                                    "the one that binds when A > 0 (clip(rho, 1 - eps, 1 + eps))"),
        (-objective(rho), "you returned the loss, minus the objective: return the objective itself (the loss "
                          "that is minimised is its negative, taken later)"),
        (objective(rho, low=0.8, high=1.2) if clip_eps != 0.2 else None,
         f"you clipped at 0.2 whatever clip_eps says (here {clip_eps}): use the clip_eps argument"),
        (torch.minimum(unclipped, (logp_cur - logp_old).clamp(-clip_eps, clip_eps).exp() * A),
         "you clipped the log-ratio to [-eps, eps]: clip the ratio rho itself to [1 - eps, 1 + eps] (exp(eps) is "
         "not 1 + eps)"),
        (objective(1 / rho), f"your ratio is upside down: {ratio_hint}"),
        (objective(logp_cur / logp_old), f"your ratio divides the log-probs: {ratio_hint}"),
    )
    for formula, hint in slips:
        if formula is not None and torch.allclose(got, formula, rtol=0, atol=1e-9):
            return hint
    return "min(rho A, clip(rho, 1 - eps, 1 + eps) A), with rho = exp(logp_cur - logp_old)"


def check_ch04_clipped_objective(clipped_objective) -> bool:
    """Grade chapter 4's exercise: `clipped_objective(logp_cur, logp_old, advantages, clip_eps) -> (B, T)`.

    Each token's objective min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = exp(logp_cur -
    logp_old), compared with `labkit.grpo.losses.clipped_surrogate` token by token (within 1e-9,
    float64), and its gradient with respect to logp_cur: rho A on the unclipped branch,
    exactly 0 where the clip is active.
    """
    import torch

    require_function(clipped_objective)
    checked = 0
    for clip_eps in (0.2, 0.1):
        # B = 5 responses (one advantage each), T = 9 tokens: every log-ratio for every advantage.
        logp_old = torch.linspace(-3.0, -0.5, len(CH04_LOG_RATIOS), dtype=torch.float64).repeat(len(CH04_ADVANTAGES), 1)
        log_ratio = torch.tensor(CH04_LOG_RATIOS, dtype=torch.float64).repeat(len(CH04_ADVANTAGES), 1)
        logp_cur = (logp_old + log_ratio).requires_grad_(True)
        advantages = torch.tensor(CH04_ADVANTAGES, dtype=torch.float64)
        got = call_student(clipped_objective, logp_cur, logp_old, advantages, clip_eps,
                           where=f"clipped_objective(logp_cur (5, 9), logp_old (5, 9), advantages (5,), "
                                 f"clip_eps={clip_eps})", on_shape_mismatch=ADVANTAGE_NOT_BROADCAST)
        require_tensor(got, logp_cur.shape, "clipped_objective",
                       "one objective per token, shape (5, 9) (broadcast each response's advantage over its "
                       "tokens: advantages[:, None])", "your objective", like=logp_cur)
        (grad,) = torch.autograd.grad(got.sum(), logp_cur, allow_unused=True)
        if grad is None:
            raise ExerciseError("your objective does not depend on logp_cur through autograd")
        for b, A in enumerate(CH04_ADVANTAGES):
            for t, x in enumerate(CH04_LOG_RATIOS):
                rho = torch.tensor(x, dtype=torch.float64).exp().item()
                value, slope = _ch04_reference(x, A, clip_eps)
                where = f"token with rho = {rho:.4f}, A = {A:+g}, clip_eps = {clip_eps}"
                if abs(got[b, t].item() - value) > 1e-9:
                    hint = _ch04_slip(got.detach(), logp_cur, logp_old, clip_eps)
                    raise ExerciseError(f"{where}: objective {got[b, t].item():.6g}, expected {value:.6g}. Hint: {hint}.")
                if abs(grad[b, t].item() - slope) > 1e-9:
                    if slope == 0.0:
                        hint = ("the clip is active here, so the gradient must be exactly 0: compute the clipped term "
                                "with torch.clamp on rho (its gradient is 0 outside the interval), and do not detach "
                                "anything else")
                    else:
                        hint = ("the gradient of rho A with respect to logp_cur is rho A (rho = exp(logp_cur - "
                                "logp_old)); did you detach rho, or compute it from logp_old?")
                    raise ExerciseError(f"{where}: d objective / d logp_cur = {grad[b, t].item():.6g}, "
                                        f"expected {slope:.6g}. Hint: {hint}.")
                checked += 1
    print(f"Correct: your clipped_objective matches labkit.grpo.losses.clipped_surrogate on {checked} tokens "
          "(values and gradients, both signs of A, both sides of both clip edges).")
    return True
