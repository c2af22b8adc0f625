"""The objectives people train with now, each as its paper writes it (issue 43): a loss of log-probs.

Every function takes the sampled tokens' log-probs under the current policy and under the policy
that sampled them, one advantage per response, and the response mask, and returns a 0-d loss to
minimise (the negative of the paper's objective); autograd gives the gradient.

    logp       (B, T)  log pi_theta(y_it | s_it), with gradient
    logp_old   (B, T)  log pi_old(y_it | s_it), recorded at sampling (no gradient is taken into it)
    advantages (B,)    one per response, broadcast over its tokens
    mask       (B, T)  1.0 on response tokens, 0.0 on padding
    rho_it = exp(logp_it - logp_old_it)

objective   the per-token (or per-response) term                               default aggregation
"grpo"      min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)       [1]       sequence_mean
"dr_grpo"   the same term; advantages not divided by the std          [2]       constant
"dapo"      the same term, eps_low 0.2, eps_high 0.28 (clip-higher)   [3]       token_mean
"gspo"      per response: min(s A, clip(s, 1 - eps_low, 1 + eps_high) A),        (a mean over responses)
            s_i = exp(mean_t (logp_it - logp_old_it)), the gradient through every token  [4]
"cispo"     sg(min(rho, weight_cap)) A logp_it on every token (none dropped)  [5]  token_mean

aggregation (AGGREGATIONS): "sequence_mean" = the mean over each response's tokens, then over the
responses; "token_mean" = one mean over every token of the batch; "constant" = the sum over every
token divided by B x max_new_tokens.  With `beta` > 0 and `logp_ref`, beta times the k3
estimate of KL(pi_theta || pi_ref), exp(logp_ref - logp) - (logp_ref - logp) - 1 per token
(`losses.kl_estimators`), is added under the same aggregation (GRPO's KL term [1]).

[1] Shao et al. 2024, DeepSeekMath (GRPO).  [2] Liu et al. 2025, Understanding R1-Zero-like training
(Dr. GRPO).  [3] Yu et al. 2025, DAPO.  [4] Zheng et al. 2025, Group Sequence Policy Optimization.
[5] MiniMax 2025, MiniMax-M1 (CISPO).

The loop's GSPO and CISPO terms (`labkit.grpo.variants`) are built from `sequence_ratio` and
`capped_weight_per_token` here.  `python -m labkit objective-cases` writes
tests/data/objective_cases.json from it, so that anyone can recompute every loss and gradient from
the papers' formulas (book: Outside checks).
"""

from __future__ import annotations

import torch

from . import losses

OBJECTIVES = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")
AGGREGATIONS = ("sequence_mean", "token_mean", "constant")
LOSS_REDUCTIONS = {"sequence_mean": "sequence", "token_mean": "token", "constant": "constant"}
"""each aggregation's name in the loop (`losses.reduce`, a variant's `reduction`)"""
GSPO_CLIP_EPS, GSPO_CLIP_EPS_HIGH = 3e-4, 4e-4
"""GSPO's clip of each response's ratio, [1 - 3e-4, 1 + 4e-4], as its paper sets it (the loop's GSPO term's)"""
DEFAULTS = {  # each objective's parameters as its paper sets them
    "grpo": {"epsilon_low": 0.2, "epsilon_high": 0.2, "aggregation": "sequence_mean"},
    "dr_grpo": {"epsilon_low": 0.2, "epsilon_high": 0.2, "aggregation": "constant"},
    "dapo": {"epsilon_low": 0.2, "epsilon_high": 0.28, "aggregation": "token_mean"},
    "gspo": {"epsilon_low": GSPO_CLIP_EPS, "epsilon_high": GSPO_CLIP_EPS_HIGH},
    "cispo": {"weight_cap": 1.28, "aggregation": "token_mean"},  # 1 + the paper's eps_high of 0.28
}


def aggregate(values: torch.Tensor, mask: torch.Tensor, aggregation: str,
              max_new_tokens: int | None = None) -> torch.Tensor:
    """(B, T) per-token values -> 0-d, by `aggregation` (module docstring); padding never counts.
    All three are the loop's own reductions (`losses.reduce`: "sequence", "token", "constant")."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation {aggregation!r}: expected one of {AGGREGATIONS}")
    return losses.reduce(values, mask, None, LOSS_REDUCTIONS[aggregation], max_new_tokens)


def clipped_term(rho: torch.Tensor, advantages: torch.Tensor, clip_eps: float, clip_eps_high: float) -> torch.Tensor:
    """min(rho A, clip(rho, 1 - clip_eps, 1 + clip_eps_high) A), elementwise; rho (B, T) or (B,), A broadcast."""
    A = advantages.reshape(-1, *([1] * (rho.dim() - 1))).to(rho.dtype)
    return torch.minimum(rho * A, rho.clamp(1.0 - clip_eps, 1.0 + clip_eps_high) * A)


def sequence_ratio(logp: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's s_i = exp(mean over response i's tokens of logp - logp_old): (B, T) x 3 -> (B,).
    Padding never counts (its log-ratio is set to 0 before the sum, so an inf there cannot leak)."""
    m = mask.to(logp.dtype)
    log_ratio = torch.where(mask.bool(), logp - logp_old.detach(), torch.zeros_like(logp))
    return torch.exp((log_ratio * m).sum(dim=1) / m.sum(dim=1))


def capped_weight_per_token(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                            weight_cap: float) -> torch.Tensor:
    """CISPO's per-token term sg(min(rho, weight_cap)) A logp: (B, T); its gradient is the capped
    weight times A times grad log pi on every token (no token is dropped, as PPO's clip drops them)."""
    weight = torch.exp(logp - logp_old.detach()).clamp(max=weight_cap).detach()
    return weight * advantages.reshape(-1, 1).to(logp.dtype) * logp


def objective_loss(objective: str, logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, *, epsilon_low: float | None = None, epsilon_high: float | None = None,
                   weight_cap: float | None = None, aggregation: str | None = None,
                   max_new_tokens: int | None = None, beta: float = 0.0,
                   logp_ref: torch.Tensor | None = None) -> torch.Tensor:
    """The loss of `objective` (OBJECTIVES) on one batch; unset parameters take DEFAULTS[objective]."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r}: expected one of {OBJECTIVES}")
    p = {**DEFAULTS[objective], **{k: v for k, v in (("epsilon_low", epsilon_low), ("epsilon_high", epsilon_high),
                                                      ("weight_cap", weight_cap), ("aggregation", aggregation))
                                   if v is not None}}
    if logp.shape != logp_old.shape or logp.shape != mask.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f"shapes: logp {tuple(logp.shape)}, logp_old {tuple(logp_old.shape)}, mask "
                         f"{tuple(mask.shape)} must be (B, T) and advantages {tuple(advantages.shape)} (B,)")
    if bool((mask.sum(dim=1) == 0).any()):
        raise ValueError("every response needs at least one token in the mask")
    logp_old = logp_old.detach()
    m = mask.to(logp.dtype)
    if objective == "gspo":
        s = sequence_ratio(logp, logp_old, mask)  # (B,) the sequence-level ratio
        loss = -clipped_term(s, advantages, p["epsilon_low"], p["epsilon_high"]).mean()
        aggregation_for_kl = "sequence_mean"
    else:
        if objective == "cispo":
            per_token = capped_weight_per_token(logp, logp_old, advantages, p["weight_cap"])
        else:
            per_token = clipped_term(torch.exp(logp - logp_old), advantages, p["epsilon_low"], p["epsilon_high"])
        loss = -aggregate(per_token, m, p["aggregation"], max_new_tokens)
        aggregation_for_kl = p["aggregation"]
    if beta:
        if logp_ref is None:
            raise ValueError("beta > 0 needs logp_ref, the reference policy's log-probs (B, T)")
        k3 = losses.kl_estimators(logp, logp_ref.detach())["k3"]
        loss = loss + beta * aggregate(k3, m, aggregation_for_kl, max_new_tokens)
    return loss


# -- The case file for outside checking (tests/data/objective_cases.json) ------------------------------

CASE_SETTINGS = (  # (objective, parameters beyond DEFAULTS); three seeded cases each
    ("grpo", {"aggregation": "sequence_mean"}),
    ("grpo", {"aggregation": "token_mean"}),
    ("grpo", {"aggregation": "constant"}),
    ("grpo", {"aggregation": "sequence_mean", "beta": 0.04}),
    ("dr_grpo", {"aggregation": "constant"}),
    ("dapo", {"aggregation": "token_mean"}),
    ("gspo", {}),
    ("cispo", {"aggregation": "token_mean"}),
)
CASE_SEEDS = (0, 1, 2)
CASE_LENGTHS = (5, 3, 1, 4)  # the responses' lengths: unequal, one of a single token; T = 5
CASE_MAX_RESPONSE_TOKENS = 6


def _case(objective: str, extra: dict, seed: int) -> dict:
    """One seeded case: float64 inputs, the loss and its gradient with respect to logp, all as lists."""
    g = torch.Generator().manual_seed(1000 * OBJECTIVES.index(objective) + 100 * len(extra) + seed)
    B, T = len(CASE_LENGTHS), max(CASE_LENGTHS)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in CASE_LENGTHS], dtype=torch.float64)
    logp_old = -torch.empty(B, T, dtype=torch.float64).uniform_(0.05, 3.0, generator=g) * mask
    spread = 5e-4 if objective == "gspo" else 0.5  # GSPO's clip is a few 1e-4 wide: move the ratio that far
    logp = (logp_old + spread * torch.randn(B, T, dtype=torch.float64, generator=g)) * mask
    advantages = torch.randn(B, dtype=torch.float64, generator=g)
    params = {**DEFAULTS[objective], **{k: v for k, v in extra.items() if k != "beta"}}
    if params.get("aggregation") == "constant":
        params["max_new_tokens"] = CASE_MAX_RESPONSE_TOKENS
    case = {"objective": objective, "seed": seed, "params": dict(params)}
    kwargs = dict(params)
    if extra.get("beta"):
        logp_ref = (logp_old + 0.2 * torch.randn(B, T, dtype=torch.float64, generator=g)) * mask
        case["params"]["beta"] = kwargs["beta"] = extra["beta"]
        kwargs["logp_ref"] = logp_ref
        case["logp_ref"] = logp_ref.tolist()
    x = logp.clone().requires_grad_(True)
    loss = objective_loss(objective, x, logp_old, advantages, mask, **kwargs)
    loss.backward()
    return {**case, "logp": logp.tolist(), "logp_old": logp_old.tolist(), "advantages": advantages.tolist(),
            "mask": mask.tolist(), "loss": float(loss.detach()), "grad_logp": x.grad.tolist()}


def cases() -> dict:
    """The case file's content: every setting of CASE_SETTINGS at every seed of CASE_SEEDS."""
    return {"format": "labkit objective cases v1",
            "about": "Each case: the inputs (logp, logp_old, advantages, mask; logp_ref with beta), the objective's "
                     "parameters, and the lab's loss and its gradient with respect to logp "
                     "(labkit/grpo/objectives.py's docstring gives every formula and its paper).",
            "cases": [_case(objective, extra, seed) for objective, extra in CASE_SETTINGS for seed in CASE_SEEDS]}
