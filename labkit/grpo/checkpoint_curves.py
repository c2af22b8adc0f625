"""Fixed-prompt checkpoint curves: how a GRPO run's policy does on the same validation problems.

An iteration's own reward is measured on whichever 4 prompts the iteration drew, so it is noisy
and its problems change every time.  A curve that shows learning measures the same thing at every
checkpoint: a fixed, seeded set of validation problems (never the test split), each answered

    greedily          1 answer per problem: is the most likely answer right?
    on fixed draws    `checkpoint_draws` samples per problem, each with the SAME seed at every
                      checkpoint (common random numbers): a draw changes only where the policy did

and, on the sampled responses (teacher-forced, no gradient), the mean token entropy of the policy
and the exact per-prefix KL(current || reference), both reduced token -> response -> prompt as
the loss reduces them.

What this never does: choose a checkpoint (the run's final model is the run's model), or touch
the run's random streams (the samples draw from seeds of their own, `runtime.hashed_seed`, and
nothing here trains or reads a generator of the loop), so a run with curves trains the same
weights, bit for bit, as one without.

Settings (labkit.config): `checkpoint_every` (0: no curves), `checkpoint_problems`,
`checkpoint_draws`.  Each record is one row of the run folder's `checkpoints.jsonl`
(labkit.grpo.metrics.GRPO_CHECKPOINT names its keys).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lab.runtime import hashed_seed
from ..task import data
from ..task.verifier import score
from ..config import PresetConfig
from ..models import rollouts, sampling, scoring
from . import losses

# Rows per teacher-forced forward: bounds the (rows, R, V) logits held at once (for qwen's
# 151,936-entry vocabulary, 16 rows of 64 tokens are about 0.6 GB); changes no number.
SCORING_ROWS = 16


@dataclass(frozen=True)
class FixedPrompts:
    """The checkpoint problems and their seeds, the same at every checkpoint of every run.

    problem_ids: (N,) validation ids, in the seeded order they were chosen
    prompts:     N prompt id lists; problems: N problem structures (for the verifier)
    seeds:       N x D sample seeds, problem-major, hashed_seed("checkpoint/<id>/<draw>")
    """

    problem_ids: list[str]
    prompts: list[list[int]]
    problems: list[dict]
    seeds: list[int]
    draws: int


def choose_problems(validation_ids: list[str], count: int) -> list[str]:
    """`count` validation ids, a pure function of the ids: ordered by hashed_seed("checkpoint/<id>")."""
    if not 1 <= count <= len(validation_ids):
        raise ValueError(f"checkpoint_problems {count}: must lie in 1..{len(validation_ids)} (the validation split)")
    return sorted(validation_ids, key=lambda pid: hashed_seed(f"checkpoint/{pid}"))[:count]


def fixed_prompts(config: PresetConfig, tokenizer) -> FixedPrompts:
    """Read the validation split (allowed in the learning phase) and build the fixed prompts."""
    statements = {r["id"]: r for r in data.open_records("statements", "validation", "learning")}
    labels = {r["id"]: r for r in data.open_records("labels", "validation", "learning")}
    ids = choose_problems(list(statements), config.checkpoint_problems)
    D = config.checkpoint_draws
    return FixedPrompts(
        problem_ids=ids,
        prompts=[scoring.build_prompt_ids(tokenizer, statements[i]["statement"], config.max_prompt_tokens) for i in ids],
        problems=[labels[i]["problem"] for i in ids],
        seeds=[hashed_seed(f"checkpoint/{i}/{d}") for i in ids for d in range(D)],
        draws=D,
    )


def _rewards(rollouts: list[rollouts.Rollout], problems: list[dict]) -> list:
    return [score(r.text, r.finish_reason, problem, r.tokenization_valid) for r, problem in zip(rollouts, problems)]


def entropy_and_kl(model, reference, rollouts: list[rollouts.Rollout], G: int,
                   pad_id: int) -> tuple[float, float]:
    """(mean token entropy of `model`, exact KL(model || reference)) on the sampled responses.

    Both per token, reduced token -> response -> prompt (groups of `G` consecutive
    rows), teacher-forced without gradient, SCORING_ROWS rows per forward (whole groups)."""
    step = max(G, SCORING_ROWS // G * G)
    entropy_sum, kl_sum, groups = 0.0, 0.0, 0
    with torch.no_grad():
        for first in range(0, len(rollouts), step):
            chunk = rollouts[first:first + step]
            batch = scoring.make_batch([r.prompt_ids for r in chunk], [r.response_ids for r in chunk], pad_id=pad_id)
            _, logits = scoring.response_logprobs(model, batch, return_logits=True)  # (b, R, V)
            _, logits_ref = scoring.response_logprobs(reference, batch, return_logits=True)
            mask = batch.response_mask.to(logits.device)
            n = len(chunk) // G
            entropy_sum += n * float(losses.reduce_tokens(losses.token_entropy(logits), mask, G))
            kl_sum += n * float(losses.reduce_tokens(losses.exact_prefix_kl(logits, logits_ref), mask, G))
            groups += n
    return entropy_sum / groups, kl_sum / groups


def measure(model, reference, tokenizer, fixed: FixedPrompts, config: PresetConfig, iteration: int) -> dict:
    """One checkpoint record of the policy `model` after `iteration` updates' iterations (0: the start).

    Returns the GRPO_CHECKPOINT keys of labkit.grpo.metrics: rates, entropy, KL, and per problem the
    greedy success (0/1) and the number of successful draws (0..D), in `fixed.problem_ids` order
    (so that two checkpoints, or two runs, can be compared problem by problem).  No wall time:
    the record is a pure function of the two models (the caller times it, into timings.jsonl.gz)."""
    N, D = len(fixed.problem_ids), fixed.draws
    common = dict(max_new_tokens=config.max_new_tokens, batch_size=config.eval_batch_size)
    greedy = sampling.sample_fast(model, tokenizer, fixed.prompts, greedy=True, problem_ids=fixed.problem_ids,
                                  **common)
    sampled = sampling.sample_fast(model, tokenizer, [p for p in fixed.prompts for _ in range(D)], fixed.seeds,
                                   problem_ids=[i for i in fixed.problem_ids for _ in range(D)], **common)
    greedy_verdicts = _rewards(greedy, fixed.problems)
    sampled_verdicts = _rewards(sampled, [p for p in fixed.problems for _ in range(D)])
    greedy_correct = [int(v.reward == 1.0) for v in greedy_verdicts]
    draws_correct = [sum(int(v.reward == 1.0) for v in sampled_verdicts[k * D:(k + 1) * D]) for k in range(N)]
    entropy, kl = entropy_and_kl(model, reference, sampled, D, tokenizer.pad_token_id)
    return {
        "iteration": iteration,
        "greedy_success": sum(greedy_correct) / N,
        "sampled_success": sum(draws_correct) / (N * D),
        "sampled_valid_json": sum(v.valid for v in sampled_verdicts) / (N * D),
        "entropy": entropy,
        "kl": kl,
        "problems": N,
        "draws": D,
        "greedy_correct": greedy_correct,
        "draws_correct": draws_correct,
    }


def due(iteration: int, total_iterations: int, every: int) -> bool:
    """Is a checkpoint due after `iteration` (0 = before the first)?  Every `every` iterations,
    at the start and at the end; never when `every` is 0."""
    return every > 0 and (iteration % every == 0 or iteration == total_iterations)
