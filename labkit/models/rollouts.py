"""Rollouts: their records, the reproducible randomness every sampler draws, and the checks and driver
the samplers share (`labkit.models.sampling` holds the samplers themselves).

Randomness (Gumbel-max).  Each rollout has its own seed and its own `torch.Generator` (on the CPU,
in float64, so the draws do not depend on the device).  At every step the rollout draws one uniform
vector u of the vocabulary's size and picks

    token = argmax_v ( log_softmax(logits)[v] + g[v] ),   g = -log(-log(u))

which is an exact sample from softmax(logits), temperature 1.  Greedy is argmax(logits).  A rollout
draws exactly one vector per token it generates, so a batched sampler that only draws for unfinished
rows consumes the same stream as the sequential one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from . import scoring

SAMPLER_TOKEN_LIMIT = 256
"""the most tokens one sampler call may generate: worked answers (`labkit.task.worked`) need more than 64"""


# --- 1. Rollout records and decoding --------------------------------------------------------


@dataclass
class Rollout:
    """One sampled response and everything needed to score it and learn from it.

    problem_id:         the problem id (e.g. "train-0131"); prompt_ids are its prompt's token ids
    response_ids:       generated ids, EOS included when finish_reason is "eos"
    logp_old:       log-prob of each generated id under the sampling (old) policy, one per id
    finish_reason:      "eos" (emitted EOS) or "length" (hit max_new_tokens without EOS)
    text:               decoded response, EOS removed, other special tokens kept, undecodable
                        ids shown as <|undecodable:ID|>
    tokenization_valid: False if any generated id is not in the tokenizer
    seconds:            generation wall time (fast sampler: its batch's time shared evenly)
    policy_digest:      SHA-256 of the parameters that sampled (labkit.models.presets.parameter_digest)
    sampler:            "reference" or "fast"
    seed:               the rollout's own seed; None for greedy
    """

    rollout_id: str
    problem_id: str | None
    prompt_ids: list[int]
    response_ids: list[int]
    logp_old: list[float]
    finish_reason: str
    text: str
    tokenization_valid: bool
    seconds: float
    policy_digest: str
    sampler: str
    seed: int | None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Rollout":
        return cls(**d)


def undecodable_marker(token_id: int) -> str:
    """How an id the tokenizer does not have appears in a decoded text (visibly, never dropped)."""
    return f"<|undecodable:{token_id}|>"


def decode_response(tokenizer, response_ids: list[int], eos_token_id: int | None = None) -> tuple[str, bool]:
    """(text, tokenization_valid) of generated ids.

    A final EOS is removed; other special tokens stay in the text.  An id
    outside the tokenizer (Qwen's embedding has more rows than its tokenizer
    has tokens) would silently vanish in `tokenizer.decode`; here it becomes
    `<|undecodable:ID|>` and makes the response invalid.  Runs of valid ids are
    decoded together so multi-byte characters split over tokens stay whole.
    """
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    ids = [int(i) for i in response_ids]
    if ids and ids[-1] == eos:
        ids = ids[:-1]
    known = len(tokenizer)
    pieces, run, valid = [], [], True
    for i in ids:
        if 0 <= i < known:
            run.append(i)
            continue
        valid = False
        if run:
            pieces.append(tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False))
            run = []
        pieces.append(undecodable_marker(i))
    if run:
        pieces.append(tokenizer.decode(run, skip_special_tokens=False, clean_up_tokenization_spaces=False))
    return "".join(pieces), valid


# --- 2. Randomness and the choice of a token ------------------------------------------------


class GumbelStream:
    """One rollout's random draws: Gumbel noise of the vocabulary's size, one vector per step."""

    def __init__(self, seed: int, vocab_size: int):
        self.generator = torch.Generator(device="cpu").manual_seed(int(seed))
        self.vocab_size = vocab_size

    def next(self) -> torch.Tensor:
        """(V,) float64 Gumbel noise for the next step."""
        u = torch.rand(self.vocab_size, generator=self.generator, dtype=torch.float64)
        # u lies in [0, 1); u = 0 would give -inf noise (that token is never picked), which is
        # harmless, but clamping keeps every value finite.
        u = u.clamp(min=torch.finfo(torch.float64).tiny)
        return -torch.log(-torch.log(u))


def gumbel_noise_at(seed: int, vocab_size: int, step: int) -> torch.Tensor:
    """(V,) the noise a rollout with `seed` uses at `step` (0-based); for explaining mismatches."""
    stream = GumbelStream(seed, vocab_size)
    for _ in range(step):
        stream.next()
    return stream.next()


def choose_tokens(logits: torch.Tensor, noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B,) long, behaviour log-probs (B,) float32) from logits (B, V).

    noise None: greedy, argmax of the logits.  noise (B, V) float64 Gumbel:
    argmax of log_softmax(logits) + noise, a temperature-1 sample.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
    if noise is None:
        tokens = torch.argmax(logits, dim=-1)
    else:
        tokens = torch.argmax(logp.double() + noise.to(logp.device), dim=-1)
    return tokens, torch.gather(logp, 1, tokens[:, None]).squeeze(1)


def decision_scores(logits: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
    """(V,) float64: what the argmax of `choose_tokens` is taken over, for one row of logits (V,)."""
    if noise is None:
        return logits.double()
    return torch.log_softmax(logits.float(), dim=-1).double() + noise.to(logits.device)


# --- 3. Checks shared by both samplers ------------------------------------------------------


def check_arguments(model, prompts, seeds, greedy, max_new_tokens, temperature, top_k, top_p, problem_ids):
    """Refuse what the protocol forbids, with the reason; returns the per-rollout seeds."""
    if temperature != 1.0:
        raise ValueError(
            f"temperature={temperature!r} refused: the protocol samples the full distribution at "
            "temperature 1 (behaviour log-probs are those of the policy itself)"
        )
    if top_k is not None:
        raise ValueError(
            f"top_k={top_k!r} refused: the protocol samples the full distribution at temperature 1, "
            "with no token excluded from the vocabulary"
        )
    if top_p is not None:
        raise ValueError(
            f"top_p={top_p!r} refused: the protocol samples the full distribution at temperature 1, "
            "with no token excluded from the vocabulary"
        )
    if any(m.training for m in model.modules()):
        raise ValueError(
            "the model is in train mode: dropout would make the behaviour log-probs inconsistent "
            "(a re-scored sequence would not reproduce them); call model.eval() before sampling"
        )
    if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= SAMPLER_TOKEN_LIMIT:
        raise ValueError(f"max_new_tokens must be an integer in 1..{SAMPLER_TOKEN_LIMIT} (the samplers' limit), "
                         f"got {max_new_tokens!r}")
    if not prompts:
        raise ValueError("no prompts to sample from")
    for i, p in enumerate(prompts):
        if not 1 <= len(p) <= scoring.MAX_PROMPT_TOKENS:
            raise ValueError(f"prompt {i} has {len(p)} tokens; a prompt has 1..{scoring.MAX_PROMPT_TOKENS}")
    if problem_ids is not None and len(problem_ids) != len(prompts):
        raise ValueError(f"{len(problem_ids)} problem ids for {len(prompts)} prompts; one per rollout")
    if greedy:
        if seeds is not None:
            raise ValueError("greedy sampling uses no seeds; pass seeds=None with greedy=True")
        return [None] * len(prompts)
    if seeds is None:
        raise ValueError("pass one seed per rollout (temperature-1 sampling), or greedy=True")
    if len(seeds) != len(prompts):
        raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts; each rollout has its own seed")
    return [int(s) for s in seeds]


def resolve_policy_digest(model, policy_digest: str | None) -> str:
    """The digest of the sampling policy; callers that know it pass it to save hashing the weights."""
    if policy_digest is not None:
        return policy_digest
    from .presets import parameter_digest

    return parameter_digest(model)


def default_rollout_id(problem_id, seed, index: int) -> str:
    return f"{problem_id if problem_id is not None else index}/{'greedy' if seed is None else f's{seed}'}"


def eos_id_of(tokenizer, eos_token_id):
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise ValueError("no EOS id: the tokenizer has none and eos_token_id was not given")
    return int(eos)


def make_rollout(tokenizer, eos, prompt, response, logprobs, seconds, digest, sampler, seed, problem_id, rollout_id):
    text, valid = decode_response(tokenizer, response, eos)
    return Rollout(
        rollout_id=rollout_id,
        problem_id=problem_id,
        prompt_ids=list(prompt),
        response_ids=response,
        logp_old=logprobs,
        finish_reason="eos" if response and response[-1] == eos else "length",
        text=text,
        tokenization_valid=valid,
        seconds=seconds,
        policy_digest=digest,
        sampler=sampler,
        seed=seed,
    )


# --- 4. The batched samplers' driver ------------------------------------------------------


def sample_in_batches(batch_fn, sampler: str, model, tokenizer, prompts, seeds, *, greedy, max_new_tokens,
                      problem_ids, rollout_ids, eos_token_id, policy_digest, temperature, top_k, top_p,
                      batch_size) -> list[Rollout]:
    """The batched samplers' common driver: check the arguments, split the rows into batches of at
    most `batch_size` (all at once by default), call `batch_fn(model, prompts, seeds,
    max_new_tokens, eos, pad_id) -> (responses, logprobs)` on each, and make the Rollouts
    (recorded as `sampler`; each one's `seconds` is its batch's wall time / the batch size)."""
    seeds = check_arguments(model, prompts, seeds, greedy, max_new_tokens, temperature, top_k, top_p, problem_ids)
    eos = eos_id_of(tokenizer, eos_token_id)
    digest = resolve_policy_digest(model, policy_digest)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    size = len(prompts) if batch_size is None else batch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    rollouts = []
    for first in range(0, len(prompts), size):
        chunk = range(first, min(first + size, len(prompts)))
        start = time.perf_counter()
        responses, logprobs = batch_fn(model, [prompts[i] for i in chunk], [seeds[i] for i in chunk],
                                       max_new_tokens, eos, pad_id)
        seconds = (time.perf_counter() - start) / len(chunk)
        for k, i in enumerate(chunk):
            problem_id = problem_ids[i] if problem_ids is not None else None
            rollout_id = rollout_ids[i] if rollout_ids is not None else default_rollout_id(problem_id, seeds[i], i)
            rollouts.append(
                make_rollout(tokenizer, eos, prompts[i], responses[k], logprobs[k], seconds,
                              digest, sampler, seeds[i], problem_id, rollout_id)
            )
    return rollouts
