"""The objectives people train with now, each as its paper writes it (issue 43): a loss of log-probs.

Every function takes the sampled tokens' log-probs under the current policy and under the policy
that sampled them, one advantage per response, and the response mask, and returns a 0-d loss to
minimise (the negative of the paper's objective); autograd gives the gradient.

    logp       (B, T)  log pi_theta(y_it | s_it), with gradient
    logp_old   (B, T)  log pi_old(y_it | s_it), recorded at sampling (no gradient is taken into it)
    advantages (B,)    one per response, broadcast over its tokens
    mask       (B, T)  1.0 on response tokens, 0.0 on padding
    rho_it = exp(logp_it - logp_old_it)

Each paper (PAPERS) is one of the loop's objectives (`labkit.grpo.variants.OBJECTIVES`: OBJECTIVE_OF)
with the paper's settings (DEFAULTS), named as the glossary names them everywhere in the lab:
clip_eps and clip_eps_high (the clip interval [1 - clip_eps, 1 + clip_eps_high]), reduction
("sequence", "token" or "constant": `losses.reduce`) and kl_coef.

paper       objective  the per-token (or per-response) term                          reduction
"grpo"      grpo       min(rho A, clip(rho, 1 - clip_eps, 1 + clip_eps_high) A)  [1]   sequence
"dr_grpo"   grpo       the same term; advantages not divided by the std          [2]   constant
"dapo"      grpo       the same term, clip_eps_high 0.28 (clip-higher)           [3]   token
"gspo"      gspo       per response: min(s A, clip(s, 1 - clip_eps, 1 + clip_eps_high) A),
                       s_i = exp(mean_t (logp_it - logp_old_it)), the gradient through every
                       token; clip_eps 3e-4, clip_eps_high 4e-4                  [4]   (a mean over responses)
"cispo"     cispo      sg(min(rho, 1 + clip_eps_high)) A logp_it on every token (none dropped)  [5]  token

reduction (`losses.reduce`): "sequence" = the mean over each response's tokens, then over the
responses; "token" = one mean over every token of the batch; "constant" = the sum over every token
divided by B x max_new_tokens.  With `kl_coef` > 0 and `logp_ref`, kl_coef times the k3 estimate of
KL(pi_theta || pi_ref), exp(logp_ref - logp) - (logp_ref - logp) - 1 per token
(`losses.kl_estimators`), is added under the same reduction (GRPO's KL term [1]).

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

PAPERS = ("grpo", "dr_grpo", "dapo", "gspo", "cispo")
"""the papers whose objective this module writes out"""
OBJECTIVE_OF = {"grpo": "grpo", "dr_grpo": "grpo", "dapo": "grpo", "gspo": "gspo", "cispo": "cispo"}
"""each paper's objective in the loop (`labkit.grpo.variants.OBJECTIVES`)"""
GSPO_CLIP_EPS, GSPO_CLIP_EPS_HIGH = 3e-4, 4e-4
"""GSPO's clip of each response's ratio, [1 - 3e-4, 1 + 4e-4], as its paper sets it (the loop's GSPO term's)"""
DEFAULTS = {  # each paper's settings, in the glossary's names
    "grpo": {"clip_eps": 0.2, "clip_eps_high": 0.2, "reduction": "sequence"},
    "dr_grpo": {"clip_eps": 0.2, "clip_eps_high": 0.2, "reduction": "constant"},
    "dapo": {"clip_eps": 0.2, "clip_eps_high": 0.28, "reduction": "token"},
    "gspo": {"clip_eps": GSPO_CLIP_EPS, "clip_eps_high": GSPO_CLIP_EPS_HIGH},
    "cispo": {"clip_eps_high": 0.28, "reduction": "token"},  # the weight's cap is 1 + clip_eps_high
}


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


def objective_loss(paper: str, logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, *, clip_eps: float | None = None, clip_eps_high: float | None = None,
                   reduction: str | None = None, max_new_tokens: int | None = None, kl_coef: float = 0.0,
                   logp_ref: torch.Tensor | None = None) -> torch.Tensor:
    """The loss of `paper`'s objective (PAPERS) on one batch; unset settings take DEFAULTS[paper]."""
    if paper not in PAPERS:
        raise ValueError(f"paper {paper!r}: expected one of {PAPERS}")
    p = {**DEFAULTS[paper], **{k: v for k, v in (("clip_eps", clip_eps), ("clip_eps_high", clip_eps_high),
                                                  ("reduction", reduction)) if v is not None}}
    if p.get("reduction", "sequence") not in losses.REDUCTIONS:
        raise ValueError(f"reduction {p['reduction']!r}: expected one of {losses.REDUCTIONS}")
    if logp.shape != logp_old.shape or logp.shape != mask.shape or advantages.shape != logp.shape[:1]:
        raise ValueError(f"shapes: logp {tuple(logp.shape)}, logp_old {tuple(logp_old.shape)}, mask "
                         f"{tuple(mask.shape)} must be (B, T) and advantages {tuple(advantages.shape)} (B,)")
    if bool((mask.sum(dim=1) == 0).any()):
        raise ValueError("every response needs at least one token in the mask")
    logp_old = logp_old.detach()
    m = mask.to(logp.dtype)
    objective = OBJECTIVE_OF[paper]
    if objective == "gspo":
        s = sequence_ratio(logp, logp_old, mask)  # (B,) the sequence-level ratio
        loss = -clipped_term(s, advantages, p["clip_eps"], p["clip_eps_high"]).mean()
        reduction_for_kl = "sequence"
    else:
        if objective == "cispo":
            per_token = capped_weight_per_token(logp, logp_old, advantages, 1.0 + p["clip_eps_high"])
        else:
            per_token = clipped_term(torch.exp(logp - logp_old), advantages, p["clip_eps"], p["clip_eps_high"])
        loss = -losses.reduce(per_token, m, None, p["reduction"], max_new_tokens)
        reduction_for_kl = p["reduction"]
    if kl_coef:
        if logp_ref is None:
            raise ValueError("kl_coef > 0 needs logp_ref, the reference policy's log-probs (B, T)")
        k3 = losses.kl_estimators(logp, logp_ref.detach())["k3"]
        loss = loss + kl_coef * losses.reduce(k3, m, None, reduction_for_kl, max_new_tokens)
    return loss


# -- The case file for outside checking (tests/data/objective_cases.json) ------------------------------

CASE_SETTINGS = (  # (paper, settings beyond DEFAULTS); three seeded cases each
    ("grpo", {"reduction": "sequence"}),
    ("grpo", {"reduction": "token"}),
    ("grpo", {"reduction": "constant"}),
    ("grpo", {"reduction": "sequence", "kl_coef": 0.04}),
    ("dr_grpo", {"reduction": "constant"}),
    ("dapo", {"reduction": "token"}),
    ("gspo", {}),
    ("cispo", {"reduction": "token"}),
)
CASE_SEEDS = (0, 1, 2)
CASE_LENGTHS = (5, 3, 1, 4)  # the responses' lengths: unequal, one of a single token; T = 5
CASE_MAX_RESPONSE_TOKENS = 6


def _case(paper: str, extra: dict, seed: int) -> dict:
    """One seeded case: float64 inputs, the loss and its gradient with respect to logp, all as lists."""
    g = torch.Generator().manual_seed(1000 * PAPERS.index(paper) + 100 * len(extra) + seed)
    B, T = len(CASE_LENGTHS), max(CASE_LENGTHS)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in CASE_LENGTHS], dtype=torch.float64)
    logp_old = -torch.empty(B, T, dtype=torch.float64).uniform_(0.05, 3.0, generator=g) * mask
    spread = 5e-4 if paper == "gspo" else 0.5  # GSPO's clip is a few 1e-4 wide: move the ratio that far
    logp = (logp_old + spread * torch.randn(B, T, dtype=torch.float64, generator=g)) * mask
    advantages = torch.randn(B, dtype=torch.float64, generator=g)
    params = {**DEFAULTS[paper], **{k: v for k, v in extra.items() if k != "kl_coef"}}
    if params.get("reduction") == "constant":
        params["max_new_tokens"] = CASE_MAX_RESPONSE_TOKENS
    case = {"paper": paper, "objective": OBJECTIVE_OF[paper], "seed": seed, "params": dict(params)}
    kwargs = dict(params)
    if extra.get("kl_coef"):
        logp_ref = (logp_old + 0.2 * torch.randn(B, T, dtype=torch.float64, generator=g)) * mask
        case["params"]["kl_coef"] = kwargs["kl_coef"] = extra["kl_coef"]
        kwargs["logp_ref"] = logp_ref
        case["logp_ref"] = logp_ref.tolist()
    x = logp.clone().requires_grad_(True)
    loss = objective_loss(paper, x, logp_old, advantages, mask, **kwargs)
    loss.backward()
    return {**case, "logp": logp.tolist(), "logp_old": logp_old.tolist(), "advantages": advantages.tolist(),
            "mask": mask.tolist(), "loss": float(loss.detach()), "grad_logp": x.grad.tolist()}


def cases() -> dict:
    """The case file's content: every setting of CASE_SETTINGS at every seed of CASE_SEEDS."""
    return {"format": "labkit objective cases v2",
            "about": "Each case: a paper and the loop's objective that writes it, the inputs (logp, logp_old, "
                     "advantages, mask; logp_ref with kl_coef), the settings in the glossary's names (clip_eps, "
                     "clip_eps_high, reduction, max_new_tokens, kl_coef), and the lab's loss and its gradient with "
                     "respect to logp (labkit/grpo/objectives.py's docstring gives every formula and its paper).",
            "cases": [_case(paper, extra, seed) for paper, extra in CASE_SETTINGS for seed in CASE_SEEDS]}
