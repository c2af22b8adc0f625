"""The objective's variants: typed switches of the one GRPO loop (chapter 9).

The protocol's run is `Variant()`, every switch at its default; any other value changes one
part of the loop and nothing else:

    objective          "grpo"  clipped surrogate on group advantages (the protocol)
                       "rft"   rejection-sampling fine-tuning (STaR-like): cross-entropy on the
                               policy's own responses whose optimised reward is 1; no advantage
                       "sft"   cross-entropy on the solver's targets for the same prompts: the
                               supervised reference at an equal prompt budget
    scale_by_std       True: A = (r - mean) / (std + eps) (GRPO); False: A = r - mean (Dr. GRPO).
                       With near-equal rewards the division amplifies tiny differences.
    reduction          "sequence": token -> response -> prompt means (each response weighs the
                       same, whatever its length); "token": one mean over all the batch's tokens
                       (TRL's "dapo"/"bnpo"): a long response weighs more
    kl                 "exact": the exact per-prefix KL(current || reference) over the vocabulary
                       (the protocol); "k3": the k3 estimator on the sampled tokens (DeepSeekMath,
                       TRL), whose expected gradient follows KL(reference || current), not the
                       exact term's KL(current || reference); "none"
    length_penalty     the optimised reward is r - length_penalty x (response tokens / limit)
    updates_per_iteration  None: the preset's 2; with 1 the ratio is exactly 1 and the clip never
                       acts (REINFORCE with a group baseline)
    reward             "verifier" (the protocol); "random": Bernoulli(random_reward_p), independent
                       of the response (a control); "format": 1 for a schema-valid answer,
                       whatever its value (a control); "learned": the learned verifier's yes/no
                       (`labkit.reward_model`, runs/<preset>/reward_model/), a proxy (chapter 10)
    random_reward_p    the random control's success probability (the sweep uses the warm start's
                       per-draw validation success)

The log always keeps the true (verifier) reward beside the optimised one.

Each switch with named values is a table below, one small function per entry: `REWARD_TABLE`,
`KL_TABLE` and `OBJECTIVE_TABLE`.  `resolve` looks a variant up in them once, when a loop starts
(`labkit.grpo.start_loop`); the loop then calls what it was given and never tests a switch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Callable

import torch

from . import losses

OBJECTIVES = ("grpo", "rft", "sft")
REDUCTIONS = ("sequence", "token")
KLS = ("exact", "k3", "none")
REWARDS = ("verifier", "random", "format", "learned")


@dataclass(frozen=True)
class Variant:
    """One setting of the loop's switches (the module docstring says what each does)."""

    objective: str = "grpo"
    """"grpo", "rft" or "sft\""""
    scale_by_std: bool = True
    """divide the centred rewards by the group's std (GRPO) or not (Dr. GRPO)"""
    reduction: str = "sequence"
    """"sequence" (token -> response -> prompt means) or "token" (one mean over all tokens)"""
    kl: str = "exact"
    """"exact" (per-prefix, whole vocabulary), "k3" (sampled tokens) or "none\""""
    length_penalty: float = 0.0
    """coefficient of the length penalty on the optimised reward"""
    updates_per_iteration: int | None = None
    """updates on each iteration's rollouts; None: the preset's"""
    reward: str = "verifier"
    """"verifier", "random", "format" or "learned\""""
    random_reward_p: float | None = None
    """the random control's success probability (required with reward "random")"""

    def __post_init__(self):
        for name, allowed in (("objective", OBJECTIVES), ("reduction", REDUCTIONS), ("kl", KLS),
                              ("reward", REWARDS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"variant {name}={getattr(self, name)!r}: expected one of {allowed}")
        if not isinstance(self.scale_by_std, bool):
            raise ValueError(f"variant scale_by_std={self.scale_by_std!r}: expected true or false")
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
# Rewards.  Each takes the iteration's groups (`labkit.sampling.Group`, P of them, G rollouts
# each) and the loop, and returns the (P, G) float32 rewards the loop optimises.  The loop gives
# what an entry needs: `learned_verifier` (reward "learned"), `reward_generator` and `variant`
# (reward "random").


def verifier_reward(groups, loop) -> torch.Tensor:
    """The verifier's reward (the protocol)."""
    return torch.tensor([g.rewards for g in groups])


def format_reward(groups, loop) -> torch.Tensor:
    """1 for a schema-valid answer, whatever its value (a control)."""
    return torch.tensor([[float(v.valid) for v in g.verdicts] for g in groups])


def learned_reward(groups, loop) -> torch.Tensor:
    """The learned verifier's yes/no (a proxy; the verifier's reward is still logged beside it)."""
    proxy, _ = loop.learned_verifier.rewards([r.prompt_ids for g in groups for r in g.rollouts],
                                             [r.response_ids for g in groups for r in g.rollouts])
    return proxy.reshape(len(groups), -1)


def random_reward(groups, loop) -> torch.Tensor:
    """Bernoulli(random_reward_p), independent of the response, from the control's own seeded stream."""
    shape = (len(groups), len(groups[0].rollouts))
    return (torch.rand(shape, generator=loop.reward_generator) < loop.variant.random_reward_p).float()


@dataclass(frozen=True)
class Reward:
    """An entry of `REWARD_TABLE`: the function, and what the loop must be given for it."""

    compute: Callable
    """compute(groups, loop) -> (P, G) float32"""
    needs_learned_verifier: bool = False
    """the loop must be passed a `labkit.reward_model.LearnedVerifier`"""
    needs_generator: bool = False
    """the loop seeds a generator of its own for it (saved in every state)"""


REWARD_TABLE = {
    "verifier": Reward(verifier_reward),
    "random": Reward(random_reward, needs_generator=True),
    "format": Reward(format_reward),
    "learned": Reward(learned_reward, needs_learned_verifier=True),
}

# KL terms.  Each takes the current policy's (logp (B, R), logits (B, R, V)), the reference's, a
# `reduce(values (B, R)) -> 0-d` and the exact KL's block size, and returns (penalty, exact, k3):
# the term the loss optimises and the two logged measures (0-d each).  The logged `kl` is always
# the exact per-prefix KL, without gradient when it is not the one optimised, so that runs with
# different penalties are compared on the same measure.


def exact_kl_term(current, reference, reduce, block_size: int):
    """The exact per-prefix KL(current || reference) over the vocabulary (the protocol)."""
    with torch.no_grad():
        k3 = reduce(losses.kl_estimators(current[0].detach(), reference[0])["k3"])
    exact = reduce(losses.exact_prefix_kl(current[1], reference[1], block_size=block_size))
    return exact, exact, k3


def k3_kl_term(current, reference, reduce, block_size: int):
    """The k3 estimator on the sampled tokens (DeepSeekMath, TRL)."""
    k3 = reduce(losses.kl_estimators(current[0], reference[0])["k3"])
    with torch.no_grad():
        exact = reduce(losses.exact_prefix_kl(current[1].detach(), reference[1], block_size=block_size))
    return k3, exact, k3


def no_kl_term(current, reference, reduce, block_size: int):
    """No penalty; both measures are still logged."""
    with torch.no_grad():
        k3 = reduce(losses.kl_estimators(current[0].detach(), reference[0])["k3"])
        exact = reduce(losses.exact_prefix_kl(current[1].detach(), reference[1], block_size=block_size))
    return torch.zeros((), device=current[0].device), exact, k3


KL_TABLE = {"exact": exact_kl_term, "k3": k3_kl_term, "none": no_kl_term}

# Objectives.  Each entry says which rows the updates learn from and which loss term they use.
# The rows: "rollouts", the iteration's own rollouts with their advantages (GRPO);
# "own_correct", its responses whose optimised reward is 1 (RFT, possibly none);
# "solver_targets", the solver's target for each chosen prompt (SFT).


def surrogate_term(logp_cur, old_logprobs, advantages, mask, group_size, clip_eps, reduction):
    """The clipped surrogate on group advantages, reduced per group: (value 0-d, clip statistics)."""
    return losses.clipped_surrogate(logp_cur, old_logprobs, advantages, mask, clip_eps=clip_eps,
                                    group_size=group_size, reduction=reduction)


def imitation_term(logp_cur, old_logprobs, advantages, mask, group_size, clip_eps, reduction):
    """The mean negative log-likelihood of the rows (one group of all); no ratio, so nothing clipped."""
    return losses.reduce(-logp_cur, mask, None, reduction), {
        "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0}


@dataclass(frozen=True)
class Objective:
    """An entry of `OBJECTIVE_TABLE`."""

    rows: str
    """"rollouts", "own_correct" or "solver_targets" (the comment above the table)"""
    term: Callable
    """term(logp_cur, old_logprobs, advantages, mask, group_size, clip_eps, reduction) -> (0-d, stats)"""
    grouped: bool
    """reduce per group of G (the surrogate's) or over all rows as one group (cross-entropy's)"""


OBJECTIVE_TABLE = {
    "grpo": Objective("rollouts", surrogate_term, grouped=True),
    "rft": Objective("own_correct", imitation_term, grouped=False),
    "sft": Objective("solver_targets", imitation_term, grouped=False),
}


def length_penalised(compute: Callable, coefficient: float) -> Callable:
    """compute's rewards minus coefficient x (response tokens / the preset's response limit)."""
    def penalised(groups, loop) -> torch.Tensor:
        lengths = torch.tensor([[len(r.response_ids) for r in g.rollouts] for g in groups], dtype=torch.float32)
        return compute(groups, loop) - coefficient * lengths / loop.config.max_response_tokens
    return penalised


@dataclass(frozen=True)
class Resolved:
    """A variant looked up in the tables: what the loop calls."""

    reward: Reward
    optimised_reward: Callable
    """optimised_reward(groups, loop) -> (P, G) float32: the reward's, minus the length penalty if any"""
    kl_term: Callable
    objective: Objective
    identity: dict
    """what the variant adds to a run's identity ({} for the protocol, whose identity stays as it was)"""


def resolve(variant: Variant) -> Resolved:
    """The one place where a variant's switches are looked up."""
    reward = REWARD_TABLE[variant.reward]
    optimised = length_penalised(reward.compute, variant.length_penalty) if variant.length_penalty else reward.compute
    return Resolved(reward=reward, optimised_reward=optimised, kl_term=KL_TABLE[variant.kl],
                    objective=OBJECTIVE_TABLE[variant.objective],
                    identity={} if variant.is_protocol else {"variant": variant.to_dict()})


def needs_learned_verifier(variant: Variant) -> bool:
    """Whether a run of `variant` must be given the learned verifier (reward "learned")."""
    return REWARD_TABLE[variant.reward].needs_learned_verifier


# every allowed value has its entry, and nothing else has one
assert tuple(REWARD_TABLE) == REWARDS and tuple(KL_TABLE) == KLS and tuple(OBJECTIVE_TABLE) == OBJECTIVES
