"""The reference and fast samplers, groups of rollouts, and the pre-update check (records and randomness: `labkit.models.rollouts`; the static sampler: `labkit.models.static_sampler`).

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

from ..task import verifier
from ..config import QWEN
from .rollouts import (GumbelStream, Rollout, check_arguments, choose_tokens, default_rollout_id,
                       eos_id_of, make_rollout, resolve_policy_digest, sample_in_batches)
from . import scoring
from .scoring import MAX_NEW_TOKENS  # the protocol's response limit: every sampler's default
from .static_sampler import sample_static

LOGPROB_TOLERANCE = QWEN.logprob_check_tol  # recorded vs re-scored log-probs (labkit.config)


# --- 1. The reference sampler ---------------------------------------------------------------


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
    seeds = check_arguments(model, prompts, seeds, greedy, max_new_tokens, temperature, top_k, top_p, problem_ids)
    eos = eos_id_of(tokenizer, eos_token_id)
    digest = resolve_policy_digest(model, policy_digest)
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
        rollout_id = rollout_ids[i] if rollout_ids is not None else default_rollout_id(problem_id, seed, i)
        rollouts.append(
            make_rollout(tokenizer, eos, prompt, response, logprobs, time.perf_counter() - start,
                          digest, "reference", seed, problem_id, rollout_id)
        )
    return rollouts


# --- 2. The fast sampler --------------------------------------------------------------------


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


SAMPLERS = {"reference": sample_reference, "fast": sample_fast, "static": sample_static}


def get_sampler(name: str):
    """The sampler called `name`: "reference" (the protocol's, no cache), "fast" (transformers' forward
    with its KV cache) or "static" (`labkit.models.static_sampler`: a preallocated cache, fused matmuls);
    all three give the same tokens for the same seeds."""
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; expected one of {sorted(SAMPLERS)}")
    return SAMPLERS[name]


# --- 3. The pre-update check ----------------------------------------------------------------


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
        if len(r.logp_old) != len(r.response_ids):
            raise ValueError(f"rollout {r.rollout_id}: {len(r.logp_old)} log-probs for {len(r.response_ids)} tokens")
        recorded = torch.tensor(r.logp_old, dtype=torch.float64)
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


# --- 4. A group: G responses to one prompt, verified -----------------------------------------


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


def verdict_reward(verdict, problem) -> float:
    """The reward of a verdict as the verifier gives it (the protocol's)."""
    return float(verdict.reward)


def sample_groups(model, tokenizer, problems: list[tuple[str, list[int], object]], G: int, seeds: list[int],
                  sampler: str = "reference", max_new_tokens: int = MAX_NEW_TOKENS,
                  policy_digest: str | None = None, rollout_ids: list[str] | None = None,
                  verify=None, reward=None) -> list[Group]:
    """G responses to each of several prompts, in ONE sampler call (the fast sampler batches all
    P x G rows), each response verified against its problem.

    problems: [(problem_id, prompt token ids, problem)] for P problems; seeds: P x G, prompt-major.
    The verifier sees the problem's structure, never the model; the model sees only the prompt.
    verify, reward: another task's verifier (text, finish_reason, problem, tokenization_valid) -> verdict
    and its reward (verdict, problem) -> float (`labkit.grpo.tasks`; None: the protocol's, looked up at the call).
    """
    verify, reward = verify or verifier.score, reward or verdict_reward
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
        verdicts = [verify(r.text, r.finish_reason, problem, r.tokenization_valid) for r in mine]
        groups.append(Group(problem_id=problem_id, prompt_ids=prompt, rollouts=mine, verdicts=verdicts,
                            rewards=[reward(v, problem) for v in verdicts]))
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
