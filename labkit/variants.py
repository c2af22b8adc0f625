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
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

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
