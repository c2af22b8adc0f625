"""Do the two samplers give the same rollouts?  The report of `python -m labkit sampler-agreement`.

The fast sampler (batched, KV cache) is only allowed to stand in for the
reference sampler (sequential, no KV cache) because, with the same random
draws, it produces the same tokens.  This module measures that claim on a
trained policy (the warm start by default), on the 200 test statements:

    greedy   1 rollout per problem                            200 pairs
    seeded   4 rollouts per problem, temperature 1            800 pairs
             seed(problem_id, draw) = labkit.eval.evaluate.eval_seed, the evaluation's own seeds

Each pair (same prompt, same seed) is either identical token for token or a
mismatch.  Every mismatch is explained by ``explain_mismatch` (below)`:
the first step where the two differ and, recomputed there by a full forward,
the gap between the best two decision scores and between the two chosen
tokens.  A gap within `NEAR_TIE` is a floating-point near-tie (a full forward
and a KV-cache step round differently and flip it); a larger one would be a
bug, and the report says which.

Both samplers run in the same process, one after the other, on the same
rollouts, after a warm-up: the report's speed ratio (reference seconds / fast
seconds) compares like with like.  The test statements are read in phase
"inference" (labkit.task.data refuses labels): nothing is scored here, only tokens
compared; responses themselves are not written, only counts, explanations and
timings.
"""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from ..lab.runs import REPO_ROOT, RunExistsError, preset_folder, write_json
from ..task import data
from ..config import QWEN
from ..models import sampling, scoring
from ..models.presets import parameter_digest
from ..models.rollouts import Rollout, decision_scores, gumbel_noise_at
from ..models.scoring import MAX_NEW_TOKENS
from .evaluate import eval_seed

DRAWS = QWEN.eval_draws  # samples per problem: the evaluation's (config.eval_draws), not a value of its own
REPORT_NAME = "sampler_agreement.json"
INFERENCE_PHASE = "inference"
# A mismatch whose two tokens' decision scores lie within this of each other (at the
# first differing step, recomputed by a full forward) is a floating-point near-tie.
NEAR_TIE = 1e-4
DEFAULT_BATCH_SIZE = QWEN.eval_batch_size  # fast sampler rows per batch, the evaluation's


# --- 1. Problems and seeds --------------------------------------------------------------------


def load_test_prompts(tokenizer, limit: int | None = None) -> tuple[list[str], list[list[int]]]:
    """(problem ids, prompt ids) of the test statements, in file order; the first `limit` if given.

    Read in phase "inference": statements only, never labels.
    """
    rows = data.open_records("statements", "test", INFERENCE_PHASE)
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer (number of problems) or None, got {limit!r}")
        rows = rows[:limit]
    return [r["id"] for r in rows], [scoring.build_prompt_ids(tokenizer, r["statement"]) for r in rows]


def draw_seeds(problem_ids: list[str], draws: int = DRAWS) -> list[list[int]]:
    """One list of `draws` seeds per problem: eval_seed(problem_id, draw), draw = 0..draws-1."""
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive integer, got {draws!r}")
    return [[eval_seed(pid, d) for d in range(draws)] for pid in problem_ids]


# --- 2. One comparison, its mismatches explained -----------------------------------------------


def classify_mismatch(mismatch: dict, near_tie: float = NEAR_TIE) -> str:
    """"near_tie" when the two chosen tokens' decision scores are within `near_tie`, else "unexplained".

    mismatch: one entry of `compare_samplers(...)["mismatches"]`.  A
    response that is a prefix of the other (no differing step) is "unexplained".
    """
    gap = mismatch.get("score_gap_between_the_two_tokens")
    return "near_tie" if gap is not None and abs(gap) <= near_tie else "unexplained"


def _draw_of(seed_lists: list[list[int]] | None, problem_ids: list[str]) -> dict:
    """(problem_id, seed) -> draw index, to name a mismatch by its draw."""
    if seed_lists is None:
        return {}
    return {(pid, s): d for pid, seeds in zip(problem_ids, seed_lists) for d, s in enumerate(seeds)}


def compare(model, tokenizer, problem_ids: list[str], prompts: list[list[int]], seed_lists=None, *,
            max_new_tokens: int = scoring.MAX_NEW_TOKENS, batch_size: int | None = DEFAULT_BATCH_SIZE,
            near_tie: float = NEAR_TIE) -> dict:
    """Both samplers on the same rollouts: counts, explained mismatches, times (`compare_samplers`).

    seed_lists None: greedy, one rollout per prompt.  Otherwise one list of seeds
    per prompt (temperature 1).  Adds to compare_samplers' result each mismatch's
    problem_id, draw and `verdict` (see classify_mismatch), and the counts of
    near-tie and unexplained mismatches.
    """
    greedy = seed_lists is None
    result = compare_samplers(model, tokenizer, prompts, seed_lists, greedy=greedy,
                                       max_new_tokens=max_new_tokens, problem_ids=problem_ids,
                                       batch_size=batch_size)
    draw_of = _draw_of(seed_lists, problem_ids)
    for m in result["mismatches"]:
        problem_id = m["rollout_id"].split("/")[0]
        m["problem_id"] = problem_id
        m["draw"] = 0 if greedy else draw_of.get((problem_id, m["seed"]))
        m["verdict"] = classify_mismatch(m, near_tie)
    result["near_tie_mismatches"] = sum(m["verdict"] == "near_tie" for m in result["mismatches"])
    result["unexplained_mismatches"] = result["mismatching"] - result["near_tie_mismatches"]
    return result


# --- 3. The whole report ------------------------------------------------------------------------


def _warm_up(model, tokenizer, prompt: list[int]) -> None:
    """First calls pay one-off costs (allocations, lazy initialisation) that are not sampling."""
    for sampler in (sampling.sample_reference, sampling.sample_fast):
        sampler(model, tokenizer, [prompt], [0], max_new_tokens=2, policy_digest="warm-up")


def measure(model, tokenizer, problem_ids: list[str], prompts: list[list[int]], draws: int = DRAWS, *,
            max_new_tokens: int = scoring.MAX_NEW_TOKENS, batch_size: int | None = DEFAULT_BATCH_SIZE,
            near_tie: float = NEAR_TIE) -> dict:
    """Greedy (1 per problem) and seeded (`draws` per problem) agreement, timed in this process.

    Returns {"greedy": compare(...), "seeded": compare(...), "summary": {...}}; the
    summary's speed_ratio is total reference seconds / total fast seconds.
    """
    if len(problem_ids) != len(prompts):
        raise ValueError(f"{len(problem_ids)} problem ids for {len(prompts)} prompts")
    _warm_up(model, tokenizer, prompts[0])
    options = dict(max_new_tokens=max_new_tokens, batch_size=batch_size, near_tie=near_tie)
    greedy = compare(model, tokenizer, problem_ids, prompts, None, **options)
    seeded = compare(model, tokenizer, problem_ids, prompts, draw_seeds(problem_ids, draws), **options)
    reference_seconds = greedy["reference_seconds"] + seeded["reference_seconds"]
    fast_seconds = greedy["fast_seconds"] + seeded["fast_seconds"]
    summary = {
        "greedy_identical": greedy["identical"],
        "greedy_rollouts": greedy["rollouts"],
        "seeded_identical": seeded["identical"],
        "seeded_rollouts": seeded["rollouts"],
        "mismatching": greedy["mismatching"] + seeded["mismatching"],
        "unexplained_mismatches": greedy["unexplained_mismatches"] + seeded["unexplained_mismatches"],
        "reference_seconds": reference_seconds,
        "fast_seconds": fast_seconds,
        "speed_ratio": reference_seconds / fast_seconds if fast_seconds > 0 else float("inf"),
    }
    return {"greedy": greedy, "seeded": seeded, "summary": summary}


def default_state(preset: str) -> Path:
    """The warm start's model file: runs/<preset>/warm_start/model.safetensors (of a finished run)."""
    from .evaluate import policy_state_file

    return policy_state_file(preset, "warm_start")


def report_path(preset: str) -> Path:
    return preset_folder(preset, REPORT_NAME)


def run(preset: str = "tiny", state: str | Path | None = None, out: str | Path | None = None, *,
        limit: int | None = None, draws: int = DRAWS, max_new_tokens: int = scoring.MAX_NEW_TOKENS,
        batch_size: int | None = DEFAULT_BATCH_SIZE, device: str | None = None, overwrite: bool = False) -> dict:
    """Measure the agreement on the warm start (or `state`) and write the report atomically.

    out defaults to runs/<preset>/sampler_agreement.json; an existing report is
    evidence and is kept unless `overwrite`.  Returns the report.
    """
    from ..models import presets

    out = Path(out) if out is not None else report_path(preset)
    if out.exists() and not overwrite:
        raise RunExistsError(f"{out} exists: a measured report is evidence and is never overwritten; "
                             "choose another --out or pass --overwrite explicitly")
    state = Path(state) if state is not None else default_state(preset)
    model, tokenizer = presets.load(preset, state=state, device=device)
    problem_ids, prompts = load_test_prompts(tokenizer, limit)
    start = time.perf_counter()
    measured = measure(model, tokenizer, problem_ids, prompts, draws, max_new_tokens=max_new_tokens,
                       batch_size=batch_size)
    report = {
        "preset": preset,
        "policy": {"state": _display(state), "parameter_digest": presets.parameter_digest(model)},
        "problems": len(problem_ids),
        "split": "test (statements only, phase inference)",
        "draws": draws,
        "seed_rule": "seed(problem_id, draw) = labkit.eval.evaluate.eval_seed: SHA-256('eval/{problem_id}/{draw}') "
                     "truncated to 62 bits (the evaluation's seeds)",
        "max_new_tokens": max_new_tokens,
        "fast_batch_size": batch_size,
        "near_tie_threshold": NEAR_TIE,
        "environment": {"device": str(next(model.parameters()).device), "torch_threads": torch.get_num_threads(),
                        "torch": torch.__version__, "python": platform.python_version()},
        **measured,
        "total_seconds": time.perf_counter() - start,
        "notes": [
            "Both samplers ran in this process on the same rollouts, reference first, after a warm-up; "
            "times are wall-clock and depend on the machine and its load.",
            "A mismatch is a pair (same prompt, same seed) whose token ids differ; each is explained at its "
            "first differing step (decision scores recomputed by a full forward).",
        ],
    }
    write_json(out, report)
    return report


def _display(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def format_report(report: dict) -> str:
    """A few lines for the terminal: counts, mismatch explanations, times and the speed ratio."""
    lines = [f"policy: {report['policy']['state']} ({report['problems']} test problems, "
             f"{report['environment']['torch_threads']} torch threads, device {report['environment']['device']})"]
    for mode in ("greedy", "seeded"):
        r = report[mode]
        lines.append(f"{mode}: {r['identical']}/{r['rollouts']} rollouts identical, {r['mismatching']} mismatching "
                     f"({r['near_tie_mismatches']} near-ties, {r['unexplained_mismatches']} unexplained); "
                     f"reference {r['reference_seconds']:.1f} s, fast {r['fast_seconds']:.1f} s "
                     f"({r['reference_tokens']} / {r['fast_tokens']} tokens)")
        for m in r["mismatches"]:
            lines.append(f"  {m['problem_id']} draw {m['draw']}: first differing step {m['first_differing_step']}, "
                         f"tokens {m.get('reference_token')} vs {m.get('fast_token')}, "
                         f"top-2 gap {m.get('top2_gap', float('nan')):.3g}, "
                         f"gap between the two {m.get('score_gap_between_the_two_tokens', float('nan')):.3g}: "
                         f"{m['verdict']}")
    s = report["summary"]
    lines.append(f"speed ratio (reference / fast): {s['speed_ratio']:.1f}x "
                 f"({s['reference_seconds']:.1f} s / {s['fast_seconds']:.1f} s)")
    return "\n".join(lines)


# --- Where two rollouts part, and the two samplers side by side ---------------------------------


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
        "reference_logprob": reference.logp_old[step],
        "fast_logprob": fast.logp_old[step],
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
    digest = parameter_digest(model)  # once, outside both timings
    common = dict(greedy=greedy, max_new_tokens=max_new_tokens, problem_ids=flat_ids, policy_digest=digest)
    start = time.perf_counter()
    reference = sampling.sample_reference(model, tokenizer, flat_prompts, seeds, **common)
    reference_seconds = time.perf_counter() - start
    start = time.perf_counter()
    fast = sampling.sample_fast(model, tokenizer, flat_prompts, seeds, batch_size=batch_size, **common)
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
