"""The objective's variants: typed switches of the one GRPO loop (chapter 9).

The protocol's run is `Variant()`, every switch at its default; any other value changes one
part of the loop and nothing else:

    objective          "grpo"  clipped surrogate on group advantages (the protocol)
                       "rft"   rejection-sampling fine-tuning (STaR-like): cross-entropy on the
                               policy's own responses whose optimised reward is 1; no advantage
                       "sft"   cross-entropy on the solver's targets for the same prompts: the
                               supervised reference at an equal prompt budget
                       "gspo"  GSPO: one ratio per response, exp(mean over its tokens of
                               log pi - log pi_old), clipped per response to [1 - 3e-4, 1 + 4e-4]
                       "cispo" CISPO: sg(min(rho, 1 + eps_high)) A log pi on every token: the
                               weight is capped, no token's gradient is dropped
    baseline           what is subtracted from each reward: "group_mean" (GRPO, Dr. GRPO);
                       "leave_one_out": the mean of the group's other G - 1 rewards (RLOO);
                       "none": nothing, A = r (REINFORCE on the 0/1 reward)
    advantage_sign     which half of the signal the loss keeps: "both" (the protocol); "positive":
                       only A > 0, the rewarded responses pushed up (positive sample reinforcement);
                       "negative": only A < 0, the failed ones pushed down (Zhu et al. 2025,
                       "The surprising effectiveness of negative reinforcement"); the other half is 0
    scale_by_std       True: A = (r - mean) / (std + eps) (GRPO); False: A = r - mean (Dr. GRPO).
                       With near-equal rewards the division amplifies tiny differences.  Only
                       with the group-mean baseline.
    reduction          "sequence": token -> response -> prompt means (each response weighs the
                       same, whatever its length); "token": one mean over all the batch's tokens
                       (TRL's "dapo"/"bnpo"): a long response weighs more; "constant": the sum
                       over all tokens / (B x the preset's response limit) (Dr. GRPO's)
    kl                 "exact": the exact per-prefix KL(current || reference) over the vocabulary
                       (the protocol); "k1", "k2", "k3": an estimator on the sampled tokens, put
                       in the loss as it is.  k3 (DeepSeekMath, TRL) has an expected gradient that
                       follows KL(reference || current), not KL(current || reference); k2's follows
                       KL(current || reference); k1's is zero in expectation; "none"
    clip_eps_high      the upper clip's epsilon (DAPO's clip-higher: 0.28); None: the preset's
                       clip_eps, a symmetric clip.  CISPO's weight cap is 1 + this
    overlong_filter    DAPO's overlong filtering: responses stopped by the token limit are taken
                       out of the loss (needs reduction "token" or "constant")
    dynamic_sampling   DAPO's dynamic sampling: groups whose optimised rewards are all equal are
                       dropped and replaced by groups of fresh prompts, at most
                       DYNAMIC_SAMPLING_ROUNDS extra draws of P prompts an iteration (then the
                       batch is filled up with dropped groups); logged per iteration
    sampler_weights    the sampler's copy of the policy: "float32" (the trainer's own weights: the
                       protocol, where sampler and trainer agree to 2e-4); "bfloat16" or "float8"
                       (e4m3, one scale per tensor): the weights rounded as an inference engine
                       holds them, so the sampler's probabilities differ from the trainer's.  The
                       pre-update check then reports the mismatch instead of stopping the run
    logp_old_from      where logp_old comes from: "sampler" (the log-probs recorded at sampling
                       time: the protocol); "trainer": recomputed by the policy before the first
                       update (one forward more), as most libraries do, so the first ratio is 1
    tis_cap            truncated importance sampling (needs logp_old_from "trainer"): each token's
                       surrogate term x min(pi_trainer / pi_sampler, tis_cap), detached; None: off
    length_penalty     the optimised reward is r - length_penalty x (response tokens / limit)
    updates_per_iteration  None: the preset's 2; with 1 the ratio is exactly 1 and the clip never
                       acts (REINFORCE with a group baseline)
    reward             "verifier" (the protocol); "random": Bernoulli(random_reward_p), independent
                       of the response (a control); "format": 1 for a schema-valid answer,
                       whatever its value (a control); "learned": the learned verifier's yes/no
                       (`labkit.studies.reward_model`, runs/<preset>/reward_model/), a proxy (chapter 10);
                       "learned_guarded": the same, zeroed for a response that is no schema-valid answer
                       (the source design's format guard)
    random_reward_p    the random control's success probability (the sweep uses the warm start's
                       per-draw validation success)

The log always keeps the true (verifier) reward beside the optimised one.

Each switch with named values is a table below, one small function per entry: `REWARD_TABLE`,
`KL_TABLE`, `OBJECTIVE_TABLE` and `ADVANTAGE_TABLE`.  `resolve(variant, config)` looks a variant up
in them once, when a run starts (`labkit.grpo.run.start_loop`), and binds every entry to what it
needs (the preset's numbers, the random reward's generator, the learned verifier): the loop is
handed a `Resolved` and calls what it holds, never `resolve`, and never reads a switch.  The loss
terms of GSPO and CISPO are `labkit.grpo.objectives`' (each checked against its paper's formula).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, fields
from functools import partial
from typing import Callable

import torch

from ..config import SEED_OFFSETS, PresetConfig
from . import losses, objectives

OBJECTIVES = ("grpo", "rft", "sft", "gspo", "cispo")
REDUCTIONS = losses.REDUCTIONS
KLS = ("exact", "k1", "k2", "k3", "none")
REWARDS = ("verifier", "random", "format", "learned", "learned_guarded")
BASELINES = ("group_mean", "leave_one_out", "none")
ADVANTAGE_SIGNS = ("both", "positive", "negative")
SAMPLER_WEIGHTS = ("float32", "bfloat16", "float8")
LOGP_OLD_FROM = ("sampler", "trainer")
# The switches each objective never reads: a value other than the default would be recorded in the run's
# identity and change nothing, so `Variant` refuses it, naming the switch.
IGNORED_BY = {
    "grpo": (),
    "cispo": (),
    "gspo": ("clip_eps_high",),
    "rft": ("baseline", "advantage_sign", "scale_by_std", "clip_eps_high", "overlong_filter", "dynamic_sampling"),
    "sft": ("baseline", "advantage_sign", "scale_by_std", "clip_eps_high", "overlong_filter", "dynamic_sampling",
            "reward",
            "random_reward_p", "length_penalty"),
}
IGNORED_WHY = {
    "gspo": "its clip is the paper's, [1 - 3e-4, 1 + 4e-4] on each response's ratio",
    "rft": "it learns by cross-entropy on its own right responses: no advantage, no ratio",
    "sft": "it learns by cross-entropy on the solver's targets: no reward, no advantage, no ratio",
}
DYNAMIC_SAMPLING_ROUNDS = 3
"""extra draws of P prompts an iteration that dynamic sampling may make before it stops"""


@dataclass(frozen=True)
class Variant:
    """One setting of the loop's switches (the module docstring says what each does)."""

    objective: str = "grpo"
    """"grpo", "rft", "sft", "gspo" or "cispo\""""
    scale_by_std: bool = True
    """divide the centred rewards by the group's std (GRPO) or not (Dr. GRPO)"""
    reduction: str = "sequence"
    """"sequence" (token -> response -> prompt means), "token" (one mean over all tokens) or "constant"
    (the sum over all tokens / (B x the response limit))"""
    kl: str = "exact"
    """"exact" (per-prefix, whole vocabulary), "k1", "k2", "k3" (sampled tokens) or "none\""""
    length_penalty: float = 0.0
    """coefficient of the length penalty on the optimised reward"""
    updates_per_iteration: int | None = None
    """updates on each iteration's rollouts; None: the preset's"""
    reward: str = "verifier"
    """"verifier", "random", "format" or "learned\""""
    random_reward_p: float | None = None
    """the random control's success probability (required with reward "random")"""
    baseline: str = "group_mean"
    """"group_mean", "leave_one_out" (RLOO) or "none" (REINFORCE)"""
    advantage_sign: str = "both"
    """"both", "positive" (only A > 0 kept) or "negative" (only A < 0 kept)"""
    clip_eps_high: float | None = None
    """the upper clip's epsilon (DAPO: 0.28); None: the preset's clip_eps"""
    overlong_filter: bool = False
    """take responses stopped by the token limit out of the loss (DAPO)"""
    dynamic_sampling: bool = False
    """replace groups with no signal by fresh prompts' groups (DAPO)"""
    sampler_weights: str = "float32"
    """"float32" (the trainer's weights), "bfloat16" or "float8" (rounded copies for the sampler)"""
    logp_old_from: str = "sampler"
    """"sampler" (recorded at sampling time) or "trainer" (recomputed before the first update)"""
    tis_cap: float | None = None
    """truncated importance sampling's cap C on pi_trainer / pi_sampler (Yao et al.: 2); None: off"""

    def __post_init__(self):
        for name, allowed in (("objective", OBJECTIVES), ("reduction", REDUCTIONS), ("kl", KLS),
                              ("reward", REWARDS), ("baseline", BASELINES), ("advantage_sign", ADVANTAGE_SIGNS),
                              ("sampler_weights", SAMPLER_WEIGHTS), ("logp_old_from", LOGP_OLD_FROM)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"variant {name}={getattr(self, name)!r}: expected one of {allowed}")
        for name in ("scale_by_std", "overlong_filter", "dynamic_sampling"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"variant {name}={getattr(self, name)!r}: expected true or false")
        defaults = {f.name: f.default for f in fields(self)}
        for name in IGNORED_BY[self.objective]:
            if getattr(self, name) != defaults[name]:
                raise ValueError(f"variant objective {self.objective!r} ignores {name}={getattr(self, name)!r} "
                                 f"({IGNORED_WHY[self.objective]}): leave {name} at its default, {defaults[name]!r}")
        if self.baseline != "group_mean" and self.scale_by_std:
            raise ValueError(f"variant baseline={self.baseline!r} divides by no std: set scale_by_std to false")
        if self.clip_eps_high is not None and (isinstance(self.clip_eps_high, bool)
                                               or not isinstance(self.clip_eps_high, (int, float))
                                               or not 0.0 < self.clip_eps_high < 1.0):
            raise ValueError(f"variant clip_eps_high={self.clip_eps_high!r}: a number in (0, 1)")
        if self.objective == "gspo" and self.reduction != "sequence":
            raise ValueError(f"variant objective 'gspo' reduces per response: reduction must be 'sequence', "
                             f"got {self.reduction!r}")
        if self.overlong_filter and self.reduction == "sequence":
            raise ValueError("variant overlong_filter drops responses' tokens from a token-level reduction: "
                             "set reduction to 'token' (DAPO's) or 'constant'")
        if self.tis_cap is not None and (isinstance(self.tis_cap, bool) or not isinstance(self.tis_cap, (int, float))
                                         or not self.tis_cap > 1.0):
            raise ValueError(f"variant tis_cap={self.tis_cap!r}: a number > 1 (Yao et al. use 2)")
        if self.tis_cap is not None and (self.logp_old_from != "trainer" or self.objective != "grpo"):
            raise ValueError("variant tis_cap weights GRPO's surrogate by pi_trainer / pi_sampler: it needs "
                             "objective 'grpo' and logp_old_from 'trainer'")
        if self.logp_old_from == "trainer" and not OBJECTIVE_TABLE[self.objective].on_rollouts:
            raise ValueError(f"variant logp_old_from 'trainer': objective {self.objective!r} has no ratio, "
                             "so no logp_old")
        if isinstance(self.length_penalty, bool) or not isinstance(self.length_penalty, (int, float)) \
                or not self.length_penalty >= 0.0:
            raise ValueError(f"variant length_penalty={self.length_penalty!r}: a number >= 0")
        if self.random_reward_p is not None and (isinstance(self.random_reward_p, bool)
                                                 or not isinstance(self.random_reward_p, (int, float))):
            raise ValueError(f"variant random_reward_p={self.random_reward_p!r}: a number in [0, 1]")
        if self.updates_per_iteration is not None and (isinstance(self.updates_per_iteration, bool)
                                                       or not isinstance(self.updates_per_iteration, int)
                                                       or self.updates_per_iteration < 1):
            raise ValueError(f"variant updates_per_iteration={self.updates_per_iteration!r}: a positive integer")
        if self.reward == "random" and not (self.random_reward_p is not None and 0.0 <= self.random_reward_p <= 1.0):
            raise ValueError(f"variant reward 'random' needs random_reward_p in [0, 1], got {self.random_reward_p!r}")
        if self.reward != "random" and self.random_reward_p is not None:
            raise ValueError("variant random_reward_p is only for reward 'random'")

    @classmethod
    def from_dict(cls, options: dict) -> "Variant":
        """A variant from plain options; an unknown key is an error naming the known ones."""
        if not isinstance(options, dict):
            raise ValueError(f"variant options {options!r}: expected an object of option: value pairs, "
                             f"e.g. {{\"kl\": \"none\"}}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown variant option(s) {unknown}; known: {sorted(known)}")
        return cls(**options)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def is_protocol(self) -> bool:
        return self == Variant()

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]


# -- The tables: one small function per entry --------------------------------------------------
#
# Rewards.  Each takes the iteration's groups (`labkit.models.sampling.Group`, P of them, G rollouts
# each), and what `resolve` binds to it (the learned verifier; the random control's generator and
# probability), and returns the (P, G) float32 rewards the loop optimises.


def verifier_reward(groups) -> torch.Tensor:
    """The verifier's reward (the protocol)."""
    return torch.tensor([g.rewards for g in groups])


def format_reward(groups) -> torch.Tensor:
    """1 for a schema-valid answer, whatever its value (a control)."""
    return torch.tensor([[float(v.valid) for v in g.verdicts] for g in groups])


def learned_reward(groups, *, verifier) -> torch.Tensor:
    """The learned verifier's yes/no (a proxy; the verifier's reward is still logged beside it)."""
    proxy, _ = verifier.rewards([r.prompt_ids for g in groups for r in g.rollouts],
                                [r.response_ids for g in groups for r in g.rollouts])
    return proxy.reshape(len(groups), -1)


def guarded_learned_reward(groups, *, verifier) -> torch.Tensor:
    """The learned verifier's yes/no, zeroed for a response that is not a schema-valid answer: the source
    design's format guard.  It can only take away a payment for a malformed answer; a valid answer with a
    wrong value, the near-miss that fooled chapter 10's proxy, it leaves paid (chapter 10 measures both)."""
    valid = torch.tensor([[float(v.valid) for v in g.verdicts] for g in groups])
    return learned_reward(groups, verifier=verifier) * valid


def random_reward(groups, *, generator: torch.Generator, p: float) -> torch.Tensor:
    """Bernoulli(p), independent of the response, from the control's own seeded stream."""
    shape = (len(groups), len(groups[0].rollouts))
    return (torch.rand(shape, generator=generator) < p).float()


@dataclass(frozen=True)
class Reward:
    """An entry of `REWARD_TABLE`: the function, and what the loop must be given for it."""

    compute: Callable
    """compute(groups, **what resolve binds) -> (P, G) float32"""
    needs_learned_verifier: bool = False
    """the loop must be passed a `labkit.studies.reward_model.LearnedVerifier`"""
    needs_generator: bool = False
    """the loop seeds a generator of its own for it (saved in every state)"""


REWARD_TABLE = {
    "verifier": Reward(verifier_reward),
    "random": Reward(random_reward, needs_generator=True),
    "format": Reward(format_reward),
    "learned": Reward(learned_reward, needs_learned_verifier=True),
    "learned_guarded": Reward(guarded_learned_reward, needs_learned_verifier=True),
}

# The loss's terms.  Every objective term and every KL term takes one record, the batch of the loss
# (`LossBatch`), and the settings `resolve` binds to it once (the preset's clip, the variant's reduction):
#     term(batch) -> (value 0-d, statistics)        objective terms (`OBJECTIVE_TABLE`)
#     kl_term(batch) -> (penalty, exact, k3)        KL terms (`KL_TABLE`)
# A KL term returns the penalty the loss optimises, reduced as the loss is, and the two logged
# measures.  The logged `kl` is always the exact per-prefix KL under the protocol's measure (a
# sequence mean over every response token), without gradient when it is not the one optimised, so
# that runs with different penalties and different reductions are compared on the same measure.


@dataclass(frozen=True)
class LossBatch:
    """One batch of the loss: B rows (P prompts x G responses, prompt-major; or RFT's and SFT's rows,
    one group of all), R response positions, V the vocabulary."""

    logp: torch.Tensor
    """(B, R) the current policy's log-probs of the rows' tokens, with gradient"""
    logits: torch.Tensor
    """(B, R, V) the current policy's logits at those positions, with gradient"""
    logp_ref: torch.Tensor
    """(B, R) the frozen reference's log-probs"""
    logits_ref: torch.Tensor
    """(B, R, V) the frozen reference's logits"""
    mask: torch.Tensor
    """(B, R) 1 on the tokens the loss sees (every response token, less what a filter takes out)"""
    measure_mask: torch.Tensor
    """(B, R) 1 on every response token: what the logged measures average over"""
    G: int | None
    """responses per prompt, for the reduction; None: the rows are one group"""
    logp_old: torch.Tensor | None = None
    """(B, R) the old policy's log-probs, recorded at sampling (detached); None: an objective with no ratio"""
    advantages: torch.Tensor | None = None
    """(B,) one per row (detached); None: an objective with no advantage"""
    token_weights: torch.Tensor | None = None
    """(B, R) truncated importance sampling's weights on the term (detached), or None"""

    def reduce(self, values: torch.Tensor, reduction: str, max_new_tokens: int | None = None) -> torch.Tensor:
        """(B, R) per-token values -> 0-d over the loss's tokens, by `reduction` (`losses.reduce`)."""
        return losses.reduce(values, self.mask, self.G, reduction, max_new_tokens)

    def measure(self, values: torch.Tensor) -> torch.Tensor:
        """(B, R) -> 0-d: the protocol's sequence mean over every response token (the logged measures)."""
        return losses.reduce(values, self.measure_mask, self.G, "sequence")


def exact_kl_term(batch: LossBatch, *, reduction: str, max_new_tokens: int, block_size: int):
    """The exact per-prefix KL(current || reference) over the vocabulary (the protocol)."""
    values = losses.exact_prefix_kl(batch.logits, batch.logits_ref, block_size=block_size)
    penalty = batch.reduce(values, reduction, max_new_tokens)
    with torch.no_grad():
        exact = batch.measure(values.detach())
        k3 = batch.measure(losses.kl_estimators(batch.logp.detach(), batch.logp_ref)["k3"])
    return penalty, exact, k3


def estimator_kl_term(name: str) -> Callable:
    """The KL term that puts estimator `name` ("k1", "k2" or "k3") of `losses.kl_estimators` in the loss."""
    def term(batch: LossBatch, *, reduction: str, max_new_tokens: int, block_size: int):
        values = losses.kl_estimators(batch.logp, batch.logp_ref)
        estimate = batch.reduce(values[name], reduction, max_new_tokens)
        with torch.no_grad():
            k3 = batch.measure(values["k3"].detach())
            exact = batch.measure(losses.exact_prefix_kl(batch.logits.detach(), batch.logits_ref, block_size=block_size))
        return estimate, exact, k3
    term.__doc__ = f"The {name} estimator on the sampled tokens, in the loss as it is" + (
        " (DeepSeekMath, TRL)." if name == "k3" else ".")
    return term


k3_kl_term = estimator_kl_term("k3")


def no_kl_term(batch: LossBatch, *, reduction: str, max_new_tokens: int, block_size: int):
    """No penalty; both measures are still logged."""
    with torch.no_grad():
        k3 = batch.measure(losses.kl_estimators(batch.logp.detach(), batch.logp_ref)["k3"])
        exact = batch.measure(losses.exact_prefix_kl(batch.logits.detach(), batch.logits_ref, block_size=block_size))
    return torch.zeros((), device=batch.logp.device), exact, k3


KL_TABLE = {"exact": exact_kl_term, "k1": estimator_kl_term("k1"), "k2": estimator_kl_term("k2"),
            "k3": k3_kl_term, "none": no_kl_term}

# Objective terms.  Every one has the signature of the protocol's, `losses.clipped_surrogate`, which is
# its table entry itself:
#     term(logp (B, R), logp_old (B, R), advantages (B,), mask (B, R), *, G, token_weights,
#          clip_eps, clip_eps_high, reduction, max_new_tokens) -> (value 0-d, statistics)
# `core.grpo_loss` passes the batch's tensors (`LossBatch`); `resolve` binds the four settings once
# (clip_eps_high: the preset's clip_eps unless the variant sets it).  Every term's statistics have the
# same clip keys (`losses.clip_statistics`); an objective without a ratio gets None for logp_old and the
# advantages.


def sequence_ratio_term(logp, logp_old, advantages, mask, *, G, token_weights, clip_eps, clip_eps_high, reduction,
                        max_new_tokens):
    """GSPO: each response's ratio exp(mean_t log-ratio), clipped per response to the paper's
    [1 - 3e-4, 1 + 4e-4] (`objectives.GSPO_CLIP_EPS`), a mean over each group's responses, then over groups."""
    eps_low, eps_high = objectives.GSPO_CLIP_EPS, objectives.GSPO_CLIP_EPS_HIGH
    s = objectives.sequence_ratio(logp, logp_old, mask)  # (B,)
    per_response = objectives.clipped_term(s, advantages, eps_low, eps_high)  # (B,)
    rows = per_response.shape[0]
    G = rows if G is None else G
    value = -per_response.view(rows // G, G).mean(dim=1).mean()
    with torch.no_grad():
        adv = advantages.to(s.dtype)
        stats = losses.clip_statistics(s, (s < 1.0 - eps_low) & (adv < 0), (s > 1.0 + eps_high) & (adv > 0))
    return value, stats


def capped_weight_term(logp, logp_old, advantages, mask, *, G, token_weights, clip_eps, clip_eps_high, reduction,
                       max_new_tokens):
    """CISPO: sg(min(rho, 1 + eps_high)) A log pi on every token, reduced as the variant says; the
    "high" share is the tokens whose weight the cap cut (their gradient is kept, scaled down)."""
    cap = 1.0 + clip_eps_high
    per_token = objectives.capped_weight_per_token(logp, logp_old, advantages, cap)
    value = -losses.reduce(per_token, mask, G, reduction, max_new_tokens)
    with torch.no_grad():
        active = mask.bool()
        rho = torch.exp(torch.where(active, logp - logp_old, torch.zeros_like(logp)))
        stats = losses.clip_statistics(rho, torch.zeros_like(active), rho > cap, active)
    return value, stats


def imitation_term(logp, logp_old, advantages, mask, *, G, token_weights, clip_eps, clip_eps_high, reduction,
                   max_new_tokens):
    """The mean negative log-likelihood of the rows (one group of all); no ratio, so nothing clipped."""
    return losses.reduce(-logp, mask, None, reduction, max_new_tokens), {
        "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0}


# The rows each objective learns from: rows(rollouts, optimised (P, G), solver_targets) -> (prompts,
# responses), where solver_targets() gives the solver's target rows of the iteration's prompts.


def rollout_rows(rollouts, optimised, solver_targets):
    """GRPO: the iteration's own rollouts, with their advantages."""
    return [r.prompt_ids for r in rollouts], [r.response_ids for r in rollouts]


def own_correct_rows(rollouts, optimised, solver_targets):
    """RFT: the iteration's responses whose optimised reward is 1 (possibly none)."""
    keep = [i for i, value in enumerate(optimised.reshape(-1).tolist()) if value >= 1.0]
    return [rollouts[i].prompt_ids for i in keep], [rollouts[i].response_ids for i in keep]


def solver_target_rows(rollouts, optimised, solver_targets):
    """SFT: the solver's target for each chosen prompt."""
    return solver_targets()


@dataclass(frozen=True)
class Objective:
    """An entry of `OBJECTIVE_TABLE`."""

    rows: Callable
    """rows(rollouts, optimised, solver_targets) -> (prompts, responses): what the updates learn from"""
    on_rollouts: bool
    """the rows are the rollouts themselves (with a ratio to logp_old), not a subset or other rows"""
    term: Callable
    """the loss term, with the signature of `losses.clipped_surrogate` (the comment above)"""
    grouped: bool
    """reduce per group of G (the surrogate's) or over all rows as one group (cross-entropy's)"""


OBJECTIVE_TABLE = {
    "grpo": Objective(rollout_rows, True, losses.clipped_surrogate, grouped=True),
    "rft": Objective(own_correct_rows, False, imitation_term, grouped=False),
    "sft": Objective(solver_target_rows, False, imitation_term, grouped=False),
    "gspo": Objective(rollout_rows, True, sequence_ratio_term, grouped=True),
    "cispo": Objective(rollout_rows, True, capped_weight_term, grouped=True),
}

# Baselines: each takes the (P, G) optimised rewards, the preset's advantage eps and the variant's
# scale_by_std, and returns the (P, G) float64 advantages.


def group_mean_advantages(rewards, eps, scale_by_std):
    """GRPO (scale_by_std) or Dr. GRPO: the group's mean subtracted (`losses.group_advantages`)."""
    return losses.group_advantages(rewards, eps=eps, scale_by_std=scale_by_std)


def leave_one_out(rewards, eps, scale_by_std):
    """RLOO: the mean of the group's other G - 1 rewards subtracted."""
    return losses.leave_one_out_advantages(rewards)


def no_baseline(rewards, eps, scale_by_std):
    """REINFORCE: A = r."""
    return losses.raw_reward_advantages(rewards)


ADVANTAGE_TABLE = {"group_mean": group_mean_advantages, "leave_one_out": leave_one_out, "none": no_baseline}


def signed_advantages(advantages, sign: str):
    """advantages(rewards) -> (P, G) with only the `sign` half kept ("both": every one; "positive": A > 0;
    "negative": A < 0), the other entries exactly 0."""
    if sign == "both":
        return advantages

    def kept(rewards):
        a = advantages(rewards)
        return torch.where(a > 0 if sign == "positive" else a < 0, a, torch.zeros_like(a))

    return kept


# Groups and tokens.  `refill` takes the iteration's (chosen, groups, optimised (P, G)), P and a
# `redraw(tag) -> (chosen, groups, optimised)` that samples P fresh prompts (the loop's), and returns
# the groups the iteration learns from with an account (None when it changes nothing);
# `loss_mask(rollouts, response_mask)` says which tokens of the rollouts the loss sees.


def keep_groups(chosen, groups, optimised, P, redraw):
    """The protocol: the iteration learns from the P groups it drew, silent or not."""
    return chosen, groups, optimised, None


def refill_silent_groups(chosen, groups, optimised, P, redraw):
    """DAPO's dynamic sampling: keep the groups whose optimised rewards differ; redraw P fresh prompts,
    at most DYNAMIC_SAMPLING_ROUNDS times, until P such groups are found; if the cap comes first, fill
    the batch up with silent groups (they add nothing, as in plain GRPO).  The kept groups stay in the
    order they were drawn.  The account: rounds, prompts drawn, groups with signal, silent ones kept."""
    drawn = list(zip(chosen, groups, optimised))  # (problem, group, (G,) rewards)
    silent = lambda d: bool(losses.zero_variance_groups(d[2][None])[0])  # noqa: E731
    rounds = 0
    while sum(not silent(d) for d in drawn) < P and rounds < DYNAMIC_SAMPLING_ROUNDS:
        rounds += 1
        drawn += list(zip(*redraw(f"-d{rounds}")))
    with_signal = [i for i, d in enumerate(drawn) if not silent(d)]
    kept = sorted((with_signal + [i for i, d in enumerate(drawn) if silent(d)])[:P])
    account = {"rounds": rounds, "prompts_drawn": len(drawn), "groups_with_signal": len(with_signal),
               "silent_kept": sum(silent(drawn[i]) for i in kept)}
    return ([drawn[i][0] for i in kept], [drawn[i][1] for i in kept], torch.stack([drawn[i][2] for i in kept]),
            account)


def all_tokens(rollouts, response_mask: torch.Tensor) -> torch.Tensor:
    """The protocol: the loss sees every response token ((B, R), the rows' response mask itself)."""
    return response_mask


def drop_overlong(rollouts, response_mask: torch.Tensor) -> torch.Tensor:
    """DAPO's overlong filtering: (B, R) the response mask, 0 on every token of a response stopped by the
    token limit."""
    keep = torch.tensor([r.finish_reason != "length" for r in rollouts])
    return response_mask * keep[:, None].to(response_mask.dtype)


REFILL_TABLE = {False: keep_groups, True: refill_silent_groups}
LOSS_MASK_TABLE = {False: all_tokens, True: drop_overlong}

# Where logp_old comes from.  Each stage takes the iteration's rows (`labkit.grpo.core.Rows`), the policy
# and `check(logp=None)`, the pre-update check (it compares a forward's log-probs of the rollouts with
# the sampler's record; with no argument it runs a forward of its own), and returns (rows, before_first_step,
# statistics): the rows the updates learn from, the check to run on the first update's own forward (None:
# done already) and what the stage adds to the check's record.


def recorded_logp_old(rows, model, check):
    """The protocol: logp_old is the sampler's record; the check rides on the first update's forward."""
    return rows, check, {}


def trainer_logp_old(rows, model, check):
    """logp_old recomputed by the policy before the first update (one forward more), checked against the
    sampler's record, then used in its place, as most libraries do: the first ratio is exactly 1."""
    with torch.no_grad():
        logp = rows.scorer(model)[0]
    check(logp)
    return dataclasses.replace(rows, logp_old=logp), None, {}


def importance_weighted_logp_old(rows, model, check, *, tis_cap: float):
    """`trainer_logp_old`, and each token weighed by truncated importance sampling's
    min(pi_trainer / pi_sampler, tis_cap) (`losses.truncated_importance_weights`)."""
    trainer, _, _ = trainer_logp_old(rows, model, check)
    device = trainer.logp_old.device  # the sampler's record is on the CPU, the trainer's on its device
    weights = losses.truncated_importance_weights(trainer.logp_old, rows.logp_old.to(device),
                                                  rows.batch.response_mask.to(device), tis_cap)
    active = rows.batch.response_mask.to(device).bool()
    return dataclasses.replace(trainer, token_weights=weights), None, {
        "tis_weight_mean": float(weights[active].mean()), "tis_capped": float((weights[active] >= tis_cap).double().mean())}


def no_logp_old(rows, model, check):
    """RFT and SFT: no ratio, so no logp_old; their rows are not the rollouts, so the check scores the
    rollouts in a forward of its own."""
    check()
    return rows, None, {}


LOGP_OLD_TABLE = {"sampler": recorded_logp_old, "trainer": trainer_logp_old}


# The sampler's weights.  Each entry takes the policy and returns the model the iteration samples
# from: the policy itself (the protocol), or a copy whose weights are rounded as a low-precision
# inference engine would hold them (computed in float32, so the result is the same on every CPU).


def same_weights(model):
    """The protocol: the sampler is the trainer's policy itself."""
    return model


def rounded_copy(round_tensor: Callable) -> Callable:
    """A sampler that is a copy of the policy with every weight passed through `round_tensor`."""
    def copy_for_sampling(model):
        sampler = copy.deepcopy(model)
        with torch.no_grad():
            for p in sampler.parameters():
                p.copy_(round_tensor(p))
        sampler.requires_grad_(False)
        return sampler
    copy_for_sampling.__doc__ = round_tensor.__doc__
    return copy_for_sampling


def to_bfloat16(w: torch.Tensor) -> torch.Tensor:
    """bfloat16 weights (8 bits of mantissa), as most inference engines serve a policy."""
    return w.to(torch.bfloat16).to(w.dtype)


def to_float8(w: torch.Tensor) -> torch.Tensor:
    """float8 e4m3 weights with one scale per tensor (its largest |w| maps to 448, e4m3's largest)."""
    scale = w.abs().max().clamp_min(1e-12) / 448.0
    return (w / scale).to(torch.float8_e4m3fn).to(w.dtype) * scale


SAMPLER_WEIGHTS_TABLE = {"float32": same_weights, "bfloat16": rounded_copy(to_bfloat16),
                         "float8": rounded_copy(to_float8)}


def length_penalised(compute: Callable, coefficient: float, limit: int) -> Callable:
    """compute's rewards minus coefficient x (response tokens / limit, the preset's response limit)."""
    def penalised(groups) -> torch.Tensor:
        lengths = torch.tensor([[len(r.response_ids) for r in g.rollouts] for g in groups], dtype=torch.float32)
        return compute(groups) - coefficient * lengths / limit
    return penalised


@dataclass(frozen=True)
class Resolved:
    """A variant looked up in the tables and bound to its run: what the loop calls, and nothing it must
    look up.  The loop never reads `variant`'s switches; they are here for records."""

    variant: Variant
    optimised_reward: Callable
    """optimised_reward(groups) -> (P, G) float32: the reward's, minus the length penalty if any"""
    advantages: Callable
    """advantages(rewards (P, G)) -> (P, G) float64 (`ADVANTAGE_TABLE`, with the preset's eps)"""
    objective: Objective
    """the rows the updates learn from and the loss term, bound to the clip and the reduction"""
    kl_term: Callable
    """kl_term(batch) -> (penalty, exact, k3), bound to the reduction and the exact KL's block size"""
    kl_coef: float
    """the KL term's coefficient in the loss (the preset's kl_coef, or the run's)"""
    refill: Callable
    """`keep_groups` or `refill_silent_groups` (dynamic sampling)"""
    loss_mask: Callable
    """loss_mask(rollouts, response_mask (B, R)) -> (B, R): `all_tokens` or `drop_overlong` (overlong filtering)"""
    filters_overlong: bool
    """for the record: how many responses the filter took out"""
    logp_old_stage: Callable
    """where logp_old comes from (`LOGP_OLD_TABLE`; `no_logp_old` for an objective without a ratio)"""
    sampling_policy: Callable
    """sampling_policy(model) -> the model the iteration samples from (`SAMPLER_WEIGHTS_TABLE`)"""
    strict_logprob_check: bool
    """the pre-update check stops the run on a mismatch (False: a sampler that differs on purpose)"""
    updates_per_iteration: int
    """updates on each iteration's rollouts (the variant's, else the preset's)"""
    generators: dict
    """the generators the variant's entries draw from, by name (saved in every state): {"reward": ...}
    for the random-reward control, else {}"""
    identity: dict
    """what the variant adds to a run's identity ({} for the protocol, whose identity stays as it was)"""


def resolve(variant: Variant, config: PresetConfig, learned_verifier=None) -> Resolved:
    """The one place where a variant's switches are looked up: each table's entry, bound to the preset's
    numbers and to what it draws from.  learned_verifier: the proxy reward "learned" optimises (a
    `labkit.studies.reward_model.LearnedVerifier`, loaded and checked by the caller), None otherwise."""
    reward = REWARD_TABLE[variant.reward]
    if reward.needs_learned_verifier != (learned_verifier is not None):
        raise ValueError(f"variant reward {variant.reward!r} " + (
            "needs the learned verifier: pass learned_verifier=reward_model.load_verifier(preset)"
            if learned_verifier is None else "takes no learned verifier (only reward 'learned' does)"))
    generators = ({"reward": torch.Generator().manual_seed(config.seed + SEED_OFFSETS["random_reward"])}
                  if reward.needs_generator else {})
    compute = (partial(reward.compute, verifier=learned_verifier) if reward.needs_learned_verifier
               else partial(reward.compute, generator=generators["reward"], p=variant.random_reward_p)
               if reward.needs_generator else reward.compute)
    optimised = (length_penalised(compute, variant.length_penalty, config.max_new_tokens)
                 if variant.length_penalty else compute)
    objective = OBJECTIVE_TABLE[variant.objective]
    settings = {"reduction": variant.reduction, "max_new_tokens": config.max_new_tokens}
    logp_old_stage = (no_logp_old if not objective.on_rollouts
                    else partial(importance_weighted_logp_old, tis_cap=variant.tis_cap) if variant.tis_cap is not None
                    else LOGP_OLD_TABLE[variant.logp_old_from])
    return Resolved(
        variant=variant, optimised_reward=optimised,
        advantages=signed_advantages(partial(ADVANTAGE_TABLE[variant.baseline], eps=config.advantage_eps,
                                             scale_by_std=variant.scale_by_std), variant.advantage_sign),
        objective=dataclasses.replace(objective, term=partial(
            objective.term, clip_eps=config.clip_eps, **settings,
            clip_eps_high=config.clip_eps if variant.clip_eps_high is None else variant.clip_eps_high)),
        kl_term=partial(KL_TABLE[variant.kl], **settings, block_size=config.kl_block_size), kl_coef=config.kl_coef,
        refill=REFILL_TABLE[variant.dynamic_sampling], loss_mask=LOSS_MASK_TABLE[variant.overlong_filter],
        filters_overlong=variant.overlong_filter, logp_old_stage=logp_old_stage,
        sampling_policy=SAMPLER_WEIGHTS_TABLE[variant.sampler_weights],
        strict_logprob_check=variant.sampler_weights == "float32",
        updates_per_iteration=variant.updates_per_iteration or config.updates_per_iteration,
        generators=generators,
        # a variant's switches make another run, and so does the proxy it optimises; the protocol's identity
        # stays as it was
        identity={**({} if variant.is_protocol else {"variant": variant.to_dict()}),
                  **({"reward_model_sha256": learned_verifier.file_sha256} if learned_verifier is not None else {})})


def needs_learned_verifier(variant: Variant) -> bool:
    """Whether a run of `variant` must be given the learned verifier (reward "learned")."""
    return REWARD_TABLE[variant.reward].needs_learned_verifier


# every allowed value has its entry, and nothing else has one
assert tuple(REWARD_TABLE) == REWARDS and tuple(KL_TABLE) == KLS and tuple(OBJECTIVE_TABLE) == OBJECTIVES
assert tuple(ADVANTAGE_TABLE) == BASELINES and tuple(SAMPLER_WEIGHTS_TABLE) == SAMPLER_WEIGHTS
