"""The two samplers, rollout records, the pre-update check, and groups of rollouts.

The **reference sampler** is the protocol's: one rollout after another, no KV
cache (a full forward over prompt + tokens so far at every step), eval mode,
temperature 1 over the whole vocabulary (no top-k, no top-p, no id excluded,
not even the ids the tokenizer does not have), or greedy.  The **fast
sampler** is batched with a KV cache.  Both draw their randomness the same way,
so with the same seeds they give the same tokens:

    Randomness (Gumbel-max).  Each rollout has its own seed and its own
    `torch.Generator` (on the CPU, in float64, so the draws do not depend on the
    device).  At every step the rollout draws one uniform vector u of the
    vocabulary's size and picks

        token = argmax_v ( log_softmax(logits)[v] + g[v] ),   g = -log(-log(u))

    which is an exact sample from softmax(logits), temperature 1.  Greedy is
    argmax(logits).  A rollout draws exactly one vector per token it generates,
    so a batched sampler that only draws for unfinished rows consumes the same
    stream as the sequential one.

Only the EOS id (`tokenizer.eos_token_id`: `<|im_end|>`, 151645 for Qwen) stops a
rollout; `<|endoftext|>` is an ordinary special token here and stays in the text
(Qwen's own generation_config also stops on it; the protocol names one EOS).

The **behaviour log-prob** of each sampled token (EOS included) is
log_softmax(logits)[token] from the real logits at sampling time.  GRPO's old
policy log-probs are these numbers; `check_recorded_logprobs` is the
protocol's pre-update check that full-sequence teacher-forced scoring
reproduces them within 2e-4.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from . import scoring
from ..task import verifier
from ..config import QWEN

MAX_NEW_TOKENS = scoring.MAX_RESPONSE_TOKENS  # the protocol's response limit: every sampler's default
SAMPLER_TOKEN_LIMIT = 256
"""the most tokens one sampler call may generate: worked answers (`labkit.task.worked`) need more than 64"""
LOGPROB_TOLERANCE = QWEN.logprob_check_tol  # recorded vs re-scored log-probs (labkit.config)


# --- 1. Rollout records and decoding --------------------------------------------------------


@dataclass
class Rollout:
    """One sampled response and everything needed to score it and learn from it.

    problem_id:         the problem id (e.g. "train-0131"); prompt_ids are its prompt's token ids
    response_ids:       generated ids, EOS included when finish_reason is "eos"
    old_logprobs:       log-prob of each generated id under the sampling (old) policy, one per id
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
    old_logprobs: list[float]
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


def _check_arguments(model, prompts, seeds, greedy, max_new_tokens, temperature, top_k, top_p, problem_ids):
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


def _policy_digest(model, policy_digest: str | None) -> str:
    """The digest of the sampling policy; callers that know it pass it to save hashing the weights."""
    if policy_digest is not None:
        return policy_digest
    from .presets import parameter_digest

    return parameter_digest(model)


def _rollout_id(problem_id, seed, index: int) -> str:
    return f"{problem_id if problem_id is not None else index}/{'greedy' if seed is None else f's{seed}'}"


def _eos_id(tokenizer, eos_token_id):
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos is None:
        raise ValueError("no EOS id: the tokenizer has none and eos_token_id was not given")
    return int(eos)


def _make_rollout(tokenizer, eos, prompt, response, logprobs, seconds, digest, sampler, seed, problem_id, rollout_id):
    text, valid = decode_response(tokenizer, response, eos)
    return Rollout(
        rollout_id=rollout_id,
        problem_id=problem_id,
        prompt_ids=list(prompt),
        response_ids=response,
        old_logprobs=logprobs,
        finish_reason="eos" if response and response[-1] == eos else "length",
        text=text,
        tokenization_valid=valid,
        seconds=seconds,
        policy_digest=digest,
        sampler=sampler,
        seed=seed,
    )


# --- 4. The reference sampler ---------------------------------------------------------------


@torch.no_grad()
def sample_reference(
    model,
    tokenizer,
    prompts: list[list[int]],
    seeds: list[int] | None = None,
    *,
    greedy: bool = False,
    max_new_tokens: int = MAX_NEW_TOKENS,
    problem_ids: list[str] | None = None,
    rollout_ids: list[str] | None = None,
    eos_token_id: int | None = None,
    policy_digest: str | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> list[Rollout]:
    """One rollout per (prompts[i], seeds[i]), one after another, with no KV cache.

    At every step the whole sequence (prompt + tokens so far) goes through the
    model again; the last position's logits choose the next token.  Stops at
    EOS or after `max_new_tokens`.  `greedy=True` (with seeds=None) takes the
    argmax instead of sampling.  temperature, top_k and top_p exist only to be
    refused: the protocol samples the full distribution at temperature 1.
    """
    seeds = _check_arguments(model, prompts, seeds, greedy, max_new_tokens, temperature, top_k, top_p, problem_ids)
    eos = _eos_id(tokenizer, eos_token_id)
    digest = _policy_digest(model, policy_digest)
    device = next(model.parameters()).device
    rollouts = []
    for i, (prompt, seed) in enumerate(zip(prompts, seeds)):
        start = time.perf_counter()
        stream = None if seed is None else GumbelStream(seed, model.config.vocab_size)
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)  # (1, T)
        response, logprobs = [], []
        for _ in range(max_new_tokens):
            T = ids.shape[1]
            logits = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                position_ids=torch.arange(T, device=device)[None, :],
                use_cache=False,
                logits_to_keep=1,  # the head only at the last position: the others are not needed
            ).logits[:, -1, :]  # (1, V)
            noise = None if stream is None else stream.next()[None, :]
            token, logp = choose_tokens(logits, noise)
            response.append(int(token))
            logprobs.append(float(logp))
            if response[-1] == eos:
                break
            ids = torch.cat([ids, token[:, None]], dim=1)
        problem_id = problem_ids[i] if problem_ids is not None else None
        rollout_id = rollout_ids[i] if rollout_ids is not None else _rollout_id(problem_id, seed, i)
        rollouts.append(
            _make_rollout(tokenizer, eos, prompt, response, logprobs, time.perf_counter() - start,
                          digest, "reference", seed, problem_id, rollout_id)
        )
    return rollouts


# --- 5. The fast sampler --------------------------------------------------------------------


@torch.no_grad()
def _sample_fast_batch(model, prompts, seeds, max_new_tokens, eos, pad_id):
    """(responses, logprobs) for one batch: left-padded prompts, KV cache, one new token per step."""
    device = next(model.parameters()).device
    B, P = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((B, P), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, P), dtype=torch.long)
    for b, p in enumerate(prompts):
        input_ids[b, P - len(p):] = torch.tensor(list(p), dtype=torch.long)
        attention_mask[b, P - len(p):] = 1
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    # Left padding would shift positions; explicit positions make every prompt start at 0.
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # (B, P)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                use_cache=True, logits_to_keep=1)
    cache, logits = out.cache, out.logits[:, -1, :]  # (B, V)
    next_position = attention_mask.sum(dim=1, keepdim=True)  # (B, 1): each row's own length

    streams = [None if s is None else GumbelStream(s, model.config.vocab_size) for s in seeds]
    responses = [[] for _ in range(B)]
    logprobs = [[] for _ in range(B)]
    active = [True] * B
    for step in range(max_new_tokens):
        noise = None
        if streams[0] is not None:
            # Only unfinished rows draw, so each row consumes its stream exactly as the
            # reference sampler does; finished rows get zeros and their choice is ignored.
            noise = torch.zeros(B, logits.shape[-1], dtype=torch.float64)
            for b in range(B):
                if active[b]:
                    noise[b] = streams[b].next()
        tokens, logp = choose_tokens(logits, noise)  # (B,), (B,)
        tokens_list, logp_list = tokens.tolist(), logp.tolist()
        for b in range(B):
            if active[b]:
                responses[b].append(tokens_list[b])
                logprobs[b].append(logp_list[b])
                active[b] = tokens_list[b] != eos
        if not any(active) or step == max_new_tokens - 1:
            break
        # Finished rows keep being fed (pad) so the batch stays rectangular; their outputs are unused.
        feed = torch.tensor([t if a else pad_id for t, a in zip(tokens_list, active)], device=device)[:, None]
        attention_mask = torch.cat([attention_mask, torch.ones((B, 1), dtype=torch.long, device=device)], dim=1)
        out = model(input_ids=feed, attention_mask=attention_mask, position_ids=next_position,
                    cache=cache, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1, :]
        next_position = next_position + 1
    return responses, logprobs


def sample_fast(
    model,
    tokenizer,
    prompts: list[list[int]],
    seeds: list[int] | None = None,
    *,
    greedy: bool = False,
    max_new_tokens: int = MAX_NEW_TOKENS,
    problem_ids: list[str] | None = None,
    rollout_ids: list[str] | None = None,
    eos_token_id: int | None = None,
    policy_digest: str | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    batch_size: int | None = None,
) -> list[Rollout]:
    """Same rollouts as `sample_reference`, batched with a KV cache.

    Prompts are left-padded with an attention mask and explicit positions; each
    step feeds only the newest token of every row with the cache.  With the same
    seeds the tokens equal the reference sampler's (up to floating-point ties:
    `compare_samplers` counts and explains any mismatch).  `batch_size` splits
    many rollouts into batches of at most that many (all at once by default).
    Each rollout's `seconds` is its batch's wall time divided by the batch size.
    """
    return sample_in_batches(_sample_fast_batch, "fast", model, tokenizer, prompts, seeds, greedy=greedy,
                             max_new_tokens=max_new_tokens, problem_ids=problem_ids, rollout_ids=rollout_ids,
                             eos_token_id=eos_token_id, policy_digest=policy_digest, temperature=temperature,
                             top_k=top_k, top_p=top_p, batch_size=batch_size)


def sample_in_batches(batch_fn, sampler: str, model, tokenizer, prompts, seeds, *, greedy, max_new_tokens,
                      problem_ids, rollout_ids, eos_token_id, policy_digest, temperature, top_k, top_p,
                      batch_size) -> list[Rollout]:
    """The batched samplers' common driver: check the arguments, split the rows into batches of at
    most `batch_size` (all at once by default), call `batch_fn(model, prompts, seeds,
    max_new_tokens, eos, pad_id) -> (responses, logprobs)` on each, and make the Rollouts
    (recorded as `sampler`; each one's `seconds` is its batch's wall time / the batch size)."""
    seeds = _check_arguments(model, prompts, seeds, greedy, max_new_tokens, temperature, top_k, top_p, problem_ids)
    eos = _eos_id(tokenizer, eos_token_id)
    digest = _policy_digest(model, policy_digest)
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
            rollout_id = rollout_ids[i] if rollout_ids is not None else _rollout_id(problem_id, seeds[i], i)
            rollouts.append(
                _make_rollout(tokenizer, eos, prompts[i], responses[k], logprobs[k], seconds,
                              digest, sampler, seeds[i], problem_id, rollout_id)
            )
    return rollouts


def _sample_static(*args, **kwargs) -> list[Rollout]:
    """`labkit.models.static_sampler.sample_static` (imported when first used: it imports this module)."""
    from .static_sampler import sample_static

    return sample_static(*args, **kwargs)


SAMPLERS = {"reference": sample_reference, "fast": sample_fast, "static": _sample_static}


def get_sampler(name: str):
    """The sampler called `name`: "reference" (the protocol's, no cache), "fast" (transformers' forward
    with its KV cache) or "static" (`labkit.models.static_sampler`: a preallocated cache, fused matmuls);
    all three give the same tokens for the same seeds."""
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; expected one of {sorted(SAMPLERS)}")
    return SAMPLERS[name]


# --- 6. The pre-update check ----------------------------------------------------------------


@torch.no_grad()
def check_recorded_logprobs(model, rollouts: list[Rollout], tol: float = LOGPROB_TOLERANCE,
                            strict: bool = True, batch_size: int = 16) -> dict:
    """Does full-sequence teacher-forced scoring reproduce the recorded behaviour log-probs?

    The protocol's check before the first update of an iteration: each rollout's
    prompt + response is scored in one forward (`scoring.response_logprobs`) and
    compared token by token with the log-probs recorded at sampling time.
    Kernel shapes differ (one long forward vs. step by step), so equality is
    up to `tol` (2e-4).  Returns {ok, max_abs_diff, tol, rollouts, tokens,
    worst_rollout_id, worst_step}; with strict=True a difference above `tol`
    raises ValueError (active dropout is the classic cause).
    """
    if not rollouts:
        raise ValueError("no rollouts to check")
    results = []
    for first in range(0, len(rollouts), batch_size):
        chunk = rollouts[first:first + batch_size]
        # The pad value never matters: padding is after each row and masked by position.
        batch = scoring.make_batch([r.prompt_ids for r in chunk], [r.response_ids for r in chunk], pad_id=0)
        logp, _ = scoring.response_logprobs(model, batch)
        results.append(compare_with_recorded(logp, chunk, tol=tol, strict=False))
    worst = max(reversed(results), key=lambda r: r["max_abs_diff"])  # on a tie, the later rollout (as one pass)
    result = {**worst, "ok": worst["max_abs_diff"] <= tol, "rollouts": len(rollouts),
              "tokens": sum(r["tokens"] for r in results)}
    if strict and not result["ok"]:
        raise ValueError(_mismatch_message(result))
    return result


def compare_with_recorded(logp: torch.Tensor, rollouts: list[Rollout], tol: float = LOGPROB_TOLERANCE,
                          strict: bool = True) -> dict:
    """Compare teacher-forced log-probs `logp` (B, R) of `rollouts` (one row each, in order) with
    the log-probs recorded at sampling time, token by token; same result and refusal as
    `check_recorded_logprobs`, for a caller that already has the forward (the GRPO update)."""
    logp = logp.detach().cpu().double()
    worst = (0.0, None, None)
    tokens, total = 0, 0.0
    for b, r in enumerate(rollouts):
        if len(r.old_logprobs) != len(r.response_ids):
            raise ValueError(f"rollout {r.rollout_id}: {len(r.old_logprobs)} log-probs for {len(r.response_ids)} tokens")
        recorded = torch.tensor(r.old_logprobs, dtype=torch.float64)
        diff = (logp[b, : len(recorded)] - recorded).abs()
        tokens += len(recorded)
        total += float(diff.sum())
        step = int(torch.argmax(diff))
        if float(diff[step]) >= worst[0] or worst[1] is None:
            worst = (float(diff[step]), r.rollout_id, step)
    result = {"ok": worst[0] <= tol, "max_abs_diff": worst[0], "mean_abs_diff": total / max(tokens, 1),
              "tol": tol, "rollouts": len(rollouts),
              "tokens": tokens, "worst_rollout_id": worst[1], "worst_step": worst[2]}
    if strict and not result["ok"]:
        raise ValueError(_mismatch_message(result))
    return result


def _mismatch_message(result: dict) -> str:
    return (f"recorded behaviour log-probs are not reproduced: max |difference| {result['max_abs_diff']:.3g} > "
            f"{result['tol']:g} (rollout {result['worst_rollout_id']}, step {result['worst_step']}); was the model "
            "in train mode (dropout), or changed since sampling?")


# --- 7. A group: G responses to one prompt, verified -----------------------------------------


@dataclass
class Group:
    """G rollouts of one prompt with their verdicts and rewards (reward 1 = complete, valid, correct)."""

    problem_id: str
    prompt_ids: list[int]
    rollouts: list[Rollout]
    verdicts: list = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "problem_id": self.problem_id,
            "prompt_ids": list(self.prompt_ids),
            "rollouts": [r.to_dict() for r in self.rollouts],
            "verdicts": [asdict(v) for v in self.verdicts],
            "rewards": list(self.rewards),
        }


def sample_groups(model, tokenizer, problems: list[tuple[str, list[int], object]], G: int, seeds: list[int],
                  sampler: str = "reference", max_new_tokens: int = MAX_NEW_TOKENS,
                  policy_digest: str | None = None, rollout_ids: list[str] | None = None) -> list[Group]:
    """G responses to each of several prompts, in ONE sampler call (the fast sampler batches all
    P x G rows), each response verified against its problem.

    problems: [(problem_id, prompt token ids, problem)] for P problems; seeds: P x G, prompt-major.
    The verifier sees the problem's structure, never the model; the model sees only the prompt.
    """
    if len(seeds) != len(problems) * G:
        raise ValueError(f"{len(seeds)} seeds for {len(problems)} groups of G={G}; each response has its own seed")
    rollouts = get_sampler(sampler)(
        model, tokenizer, [prompt for _, prompt, _ in problems for _ in range(G)], list(seeds),
        max_new_tokens=max_new_tokens, problem_ids=[pid for pid, _, _ in problems for _ in range(G)],
        rollout_ids=rollout_ids, policy_digest=policy_digest,
    )
    groups = []
    for k, (problem_id, prompt, problem) in enumerate(problems):
        mine = rollouts[k * G:(k + 1) * G]
        verdicts = [verifier.score(r.text, r.finish_reason, problem, r.tokenization_valid) for r in mine]
        groups.append(Group(problem_id=problem_id, prompt_ids=prompt, rollouts=mine, verdicts=verdicts,
                            rewards=[float(v.reward) for v in verdicts]))
    return groups


def sample_group(model, tokenizer, problem_id: str, statement: str, problem, G: int, seeds: list[int],
                 sampler: str = "reference", max_new_tokens: int = MAX_NEW_TOKENS,
                 policy_digest: str | None = None, rollout_ids: list[str] | None = None) -> Group:
    """G responses to one statement (one seed each), each verified against `problem`: the group of
    chapter 2.  Every rollout keeps `problem_id`."""
    if len(seeds) != G:
        raise ValueError(f"{len(seeds)} seeds for a group of G={G}; each response has its own seed")
    prompt = scoring.build_prompt_ids(tokenizer, statement)
    return sample_groups(model, tokenizer, [(problem_id, prompt, problem)], G, seeds, sampler=sampler,
                         max_new_tokens=max_new_tokens, policy_digest=policy_digest, rollout_ids=rollout_ids)[0]


# --- 8. Do the two samplers agree? ------------------------------------------------------------


def _full_forward_logits(model, ids: list[int]) -> torch.Tensor:
    """(V,) logits of the next token after `ids`, by a full forward (the reference's way)."""
    device = next(model.parameters()).device
    x = torch.tensor([ids], dtype=torch.long, device=device)
    return model(input_ids=x, attention_mask=torch.ones_like(x), position_ids=torch.arange(len(ids), device=device)[None],
                 use_cache=False, logits_to_keep=1).logits[0, -1]


@torch.no_grad()
def explain_mismatch(model, reference: Rollout, fast: Rollout) -> dict:
    """Where two rollouts of the same prompt and seed part, and how close the call was there.

    At the first differing step the decision scores (logits for greedy,
    log-probs + Gumbel noise for sampling) are recomputed by a full forward;
    a tiny top-2 gap means floating-point differences between a full forward
    and a KV-cache step flipped a near-tie.
    """
    n = min(len(reference.response_ids), len(fast.response_ids))
    step = next((s for s in range(n) if reference.response_ids[s] != fast.response_ids[s]), n)
    info = {"rollout_id": reference.rollout_id, "seed": reference.seed, "first_differing_step": step,
            "reference_length": len(reference.response_ids), "fast_length": len(fast.response_ids)}
    if step == n:  # one is a prefix of the other: cannot happen with equal limits, but say so
        info["explanation"] = "one response is a prefix of the other"
        return info
    logits = _full_forward_logits(model, reference.prompt_ids + reference.response_ids[:step])
    noise = None if reference.seed is None else gumbel_noise_at(reference.seed, logits.shape[-1], step)
    scores = decision_scores(logits, noise)
    top2 = torch.topk(scores, 2)
    ref_token, fast_token = reference.response_ids[step], fast.response_ids[step]
    info.update({
        "reference_token": ref_token,
        "fast_token": fast_token,
        "top2_gap": float(top2.values[0] - top2.values[1]),
        "score_gap_between_the_two_tokens": float(scores[ref_token] - scores[fast_token]),
        "reference_logprob": reference.old_logprobs[step],
        "fast_logprob": fast.old_logprobs[step],
    })
    return info


def compare_samplers(model, tokenizer, prompts: list[list[int]], seeds_per_prompt, greedy: bool = False,
                     max_new_tokens: int = MAX_NEW_TOKENS, problem_ids: list[str] | None = None,
                     base_seed: int = 0, batch_size: int | None = None) -> dict:
    """Run both samplers on the same rollouts; count identical and mismatching ones, and time them.

    seeds_per_prompt: an int k (prompt i gets seeds base_seed + i*k .. + k-1) or
    one list of seeds per prompt; ignored when greedy (one rollout per prompt).
    Returns {mode, rollouts, identical, mismatching, mismatches (explained),
    tokens_compared (sum of the longer response of each pair), tokens_equal (sum of the
    common prefixes), reference_tokens, fast_tokens, reference_seconds, fast_seconds, speedup}.
    """
    if greedy:
        flat_prompts, seeds = list(prompts), None
        flat_ids = list(problem_ids) if problem_ids is not None else None
    else:
        if isinstance(seeds_per_prompt, int):
            seed_lists = [[base_seed + i * seeds_per_prompt + j for j in range(seeds_per_prompt)]
                          for i in range(len(prompts))]
        else:
            seed_lists = [list(s) for s in seeds_per_prompt]
        if len(seed_lists) != len(prompts):
            raise ValueError(f"{len(seed_lists)} seed lists for {len(prompts)} prompts")
        flat_prompts = [p for p, s in zip(prompts, seed_lists) for _ in s]
        seeds = [x for s in seed_lists for x in s]
        flat_ids = ([pid for pid, s in zip(problem_ids, seed_lists) for _ in s]
                    if problem_ids is not None else None)
    from .presets import parameter_digest

    digest = parameter_digest(model)  # once, outside both timings
    common = dict(greedy=greedy, max_new_tokens=max_new_tokens, problem_ids=flat_ids, policy_digest=digest)
    start = time.perf_counter()
    reference = sample_reference(model, tokenizer, flat_prompts, seeds, **common)
    reference_seconds = time.perf_counter() - start
    start = time.perf_counter()
    fast = sample_fast(model, tokenizer, flat_prompts, seeds, batch_size=batch_size, **common)
    fast_seconds = time.perf_counter() - start

    mismatches, tokens_equal, tokens_compared = [], 0, 0
    for r, f in zip(reference, fast):
        tokens_compared += max(len(r.response_ids), len(f.response_ids))
        # agreement = the common prefix: after the first difference the two continue different texts
        tokens_equal += next((s for s, (a, b) in enumerate(zip(r.response_ids, f.response_ids)) if a != b),
                             min(len(r.response_ids), len(f.response_ids)))
        if r.response_ids != f.response_ids:
            mismatches.append(explain_mismatch(model, r, f))
    return {
        "mode": "greedy" if greedy else "seeded",
        "rollouts": len(reference),
        "identical": len(reference) - len(mismatches),
        "mismatching": len(mismatches),
        "mismatches": mismatches,
        "tokens_compared": tokens_compared,
        "tokens_equal": tokens_equal,
        "reference_tokens": sum(len(r.response_ids) for r in reference),
        "fast_tokens": sum(len(f.response_ids) for f in fast),
        "reference_seconds": reference_seconds,
        "fast_seconds": fast_seconds,
        "speedup": reference_seconds / fast_seconds if fast_seconds > 0 else float("inf"),
    }
