"""Evaluation of the policies, not of their best sample
(book/protocol.md, "Evaluation and the group-size exercise").

Two phases, kept apart in code:

1. **Inference** (phase "inference": test *statements* only; `labkit.task.data`
   refuses labels to this phase).  A policy is reloaded from its safetensors
   file and, on the 200 test problems, produces

       greedy   one response per problem (draw 0, no seed)          200 responses
       sample   4 responses per problem at temperature 1, draws 0..3  800 responses

   Every sampled (problem, draw) has its own seed, the same for every policy:

       seed(problem_id, draw) = first 8 bytes of SHA-256("eval/{problem_id}/{draw}"),
                                read big-endian, shifted right by 2  ->  62 bits

   so two policies answer the same problem with the same Gumbel noise stream
   (labkit.models.sampling), and a difference between them is a difference of policy.
   The parameter digest is taken after loading (and checked against the one
   the safetensors file records) and again after each mode: generation must
   leave the policy unchanged.  Every response is kept, invalid ones included.

2. **Scoring** (phase "scoring": may read everything).  The saved predictions
   are joined with the test labels afterwards; a missing, duplicated or
   unexpected (problem, draw) is an error.  Each response is scored by
   `labkit.task.verifier.score`, and `results.json` is written for every finished
   policy: see METRICS for every name.  It is a pure function of the raw
   predictions, the labels and the side files, so `python -m labkit results-json`
   recomputes it byte for byte.

What is reported, and why it is honest:

* **Per-draw success** in the sampled mode is over all 800 samples (correct /
  800): the policy's success rate at temperature 1.  It is *not* best-of-4.
  The best-of-4 number (a problem counts if any of its 4 samples is correct)
  is computed too, under the name `best_of_4_not_pass_at_1`, because reporting
  it as pass@1 is the classic inflation chapter 7 diagnoses.
* **pass@k** for k = 1..4 uses the unbiased estimator of Chen et al. (2021),
  pass@k = mean over problems of 1 - C(n-c, k) / C(n, k), with n = 4 samples per
  problem and c of them correct; its exact budget (n = 4, 800 samples) is
  written beside it.  pass@1 equals per-draw success; pass@4 equals best-of-4.
* **Wilson 95% intervals** beside every rate: 200 greedy responses (100 per
  population) and 800 samples (400 per population) are small samples, and a
  1.5% success rate on 200 problems is 3 correct answers; the interval says how
  little that pins down.  The 4 samples of one problem are not independent
  trials of the *policy over problems*, so the sampled interval is optimistic;
  it is the interval of a binomial proportion over responses, stated as such.

Files, per policy, under `runs/<preset>/evaluation/<policy>/`:
`predictions-greedy.jsonl.gz`, `predictions-sample.jsonl.gz` (one JSON object
per response), `manifest.json` (what was evaluated and how), `costs.json`
(generation seconds and peak memory), and `FINISHED`.  A finished evaluation is
evidence and is never overwritten unless `overwrite=True`.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path


from ..lab import memory, runtime
from ..lab.skeleton import shielded
from ..lab.runs import (FINISHED_MARKER, REPO_ROOT, display_path, dumps_json, hold_for_replacing, is_finished,
                   mark_finished, preset_folder, read_json, read_jsonl, sha256_file, write_json, write_jsonl)
from ..task import data, verifier
from ..config import QWEN, get_preset
from ..models import scoring
from ..grpo import metrics

POLICIES = ("warm_start", "sft", "grpo", "grpo_g2", "grpo_g8")
MODES = ("greedy", "sample")
POPULATIONS = ("ALL", "ID50", "OOD100")
INFERENCE_PHASE = "inference"
SCORING_PHASE = "scoring"
WILSON_Z = 1.959963984540054  # the 97.5% quantile of the standard normal: a two-sided 95% interval
DEFAULT_SAMPLER = "fast"
DEFAULT_BATCH_SIZE = QWEN.eval_batch_size  # fast sampler rows per batch: 2 greedy batches, 8 sampled ones
PREDICTION_FILES = {"greedy": "predictions-greedy.jsonl.gz", "sample": "predictions-sample.jsonl.gz"}
MANIFEST_FILE = "manifest.json"
COSTS_FILE = "costs.json"
RESULTS_FILE = "results.json"
RESULTS_FORMAT = "labkit evaluation results v1"

# Every name of results.json, documented once, in labkit.grpo.metrics (tests/test_metrics.py checks it).
METRICS = metrics.EVALUATION
NOTES = (
    "Test samples are small: 200 greedy responses (100 per population) and 800 samples (400 per population); "
    "read every rate with its Wilson 95% interval.",
    "Per-draw success uses all samples; best-of-4 is reported apart, under a name saying it is not pass@1.",
    "The 4 samples of one problem share the problem: the sampled intervals treat them as independent responses "
    "and are therefore optimistic about the policy's rate over problems.",
    "Seeds are shared by all policies: seed(problem_id, draw) = SHA-256('eval/{problem_id}/{draw}') truncated "
    "to 62 bits.",
)


# --- 1. Seeds and problems --------------------------------------------------------------------


def eval_seed(problem_id: str, draw: int) -> int:
    """The seed of sample `draw` of `problem_id`, the same for every policy (62 bits).

    `runtime.hashed_seed(f"eval/{problem_id}/{draw}")`: the first 8 bytes of that SHA-256,
    big-endian, shifted right by 64 - 62 = 2 bits.  A pure function of its two arguments: no
    generator state, no order of evaluation, nothing a policy could change.
    """
    if isinstance(draw, bool) or not isinstance(draw, int) or draw < 0:
        raise ValueError(f"draw must be a non-negative integer, got {draw!r}")
    return runtime.hashed_seed(f"eval/{problem_id}/{draw}")


def select_problems(rows: list[dict], limit: int | None = None) -> list[dict]:
    """All rows (limit None), or the first `limit` rows of each population, in file order.

    Works alike on statements and labels (both carry `id` and `population`), so
    inference and scoring select the same problems without seeing each other's files.
    """
    if limit is None:
        return list(rows)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer (problems per population) or None, got {limit!r}")
    taken: Counter = Counter()
    out = []
    for r in rows:
        if taken[r["population"]] < limit:
            taken[r["population"]] += 1
            out.append(r)
    return out


def load_test_statements(limit: int | None = None) -> list[dict]:
    """The test statements inference may see (phase "inference": the data module refuses labels)."""
    return select_problems(data.open_records("statements", "test", INFERENCE_PHASE), limit)


def load_test_labels(*, phase: str, limit: int | None = None) -> list[dict]:
    """The test labels.  The caller names its phase, and only "scoring" may read them."""
    return select_problems(data.open_records("labels", "test", phase), limit)


# --- 2. Paths -----------------------------------------------------------------------------------


def evaluation_root(preset: str, limit: int | None = None) -> Path:
    """runs/<preset>/evaluation: one folder per policy, and results.json.

    A trial on `limit` problems per population goes to evaluation/trials/limit-<N>/,
    never beside the real evaluation (still under `evaluation/`, so learning cannot read it).
    """
    root = preset_folder(preset, "evaluation")
    return root if limit is None else root / "trials" / f"limit-{limit}"


def policy_state_file(preset: str, policy: str) -> Path:
    """The final model of a finished training run: runs/<preset>/<policy>/model.safetensors."""
    check_policy(policy)
    run_dir = preset_folder(preset, policy)
    if not is_finished(run_dir):
        raise FileNotFoundError(f"policy {policy!r} has no finished run at {run_dir}; train it first "
                                "(final states are fixed before the test is run)")
    return run_dir / "model.safetensors"


def check_policy(policy: str, *, explicit: bool = False) -> None:
    """A protocol policy's name; with `explicit` (the caller gives the model file and the folder,
    as the sweep and chapter 10's format base do) any plain name: letters, digits and '_'."""
    if explicit and policy and all(c.isalnum() or c == "_" for c in policy):
        return
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}"
                         + ("" if explicit else " (another name needs an explicit state file and eval root)"))


# --- 3. Inference -------------------------------------------------------------------------------


def prediction_rows(rollouts, statements: list[dict], mode: str, draws: int) -> list[dict]:
    """One JSON-ready row per rollout; rollouts are problem-major (problem 0 draws 0..d-1, problem 1 ...)."""
    rows = []
    for i, r in enumerate(rollouts):
        problem = statements[i // draws]
        draw = i % draws
        if r.problem_id != problem["id"]:
            raise ValueError(f"rollout {i} answers {r.problem_id!r}, expected {problem['id']!r}: order lost")
        rows.append({
            "problem_id": problem["id"],
            "population": problem["population"],
            "mode": mode,
            "draw": draw,
            "seed": r.seed,
            "sampler": r.sampler,
            "text": r.text,
            "finish_reason": r.finish_reason,
            "tokenization_valid": r.tokenization_valid,
            "response_tokens": len(r.response_ids),
            "response_ids": list(r.response_ids),
        })
    return rows


def generate_predictions(model, tokenizer, statements: list[dict], mode: str, *, sampler: str = DEFAULT_SAMPLER,
                         draws: int = 4, max_new_tokens: int = scoring.MAX_NEW_TOKENS,
                         batch_size: int = DEFAULT_BATCH_SIZE, policy_digest: str | None = None) -> list[dict]:
    """Prediction rows of one mode: greedy (1 per statement) or sample (`draws` per statement, seeded).

    statements: rows with id, population, statement.  The prompt is built from
    the statement alone (scoring.build_prompt_ids).  Sampled rows are
    problem-major, each with seed eval_seed(problem_id, draw).
    """
    from ..models import sampling

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    per_problem = 1 if mode == "greedy" else draws
    prompts = [scoring.build_prompt_ids(tokenizer, s["statement"]) for s in statements]
    flat_prompts = [p for p in prompts for _ in range(per_problem)]
    problem_ids = [s["id"] for s in statements for _ in range(per_problem)]
    seeds = None if mode == "greedy" else [eval_seed(s["id"], d) for s in statements for d in range(draws)]
    rollout_ids = [f"{pid}/{mode}/{i % per_problem}" for i, pid in enumerate(problem_ids)]
    kwargs = dict(greedy=mode == "greedy", max_new_tokens=max_new_tokens, problem_ids=problem_ids,
                  rollout_ids=rollout_ids, policy_digest=policy_digest)
    if sampler == "fast":
        kwargs["batch_size"] = batch_size
    rollouts = sampling.get_sampler(sampler)(model, tokenizer, flat_prompts, seeds, **kwargs)
    return prediction_rows(rollouts, statements, mode, per_problem)


def run_inference(preset: str, policy: str, *, state_file: str | Path | None = None,
                  eval_root: str | Path | None = None, sampler: str = DEFAULT_SAMPLER, device: str | None = None,
                  draws: int | None = None, limit: int | None = None,
                  max_new_tokens: int = scoring.MAX_NEW_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE,
                  overwrite: bool = False) -> dict:
    """Generate and write one policy's greedy and sampled predictions; returns its manifest.

    state_file: the policy's safetensors (default runs/<preset>/<policy>/model.safetensors of a
    finished run).  eval_root: default `evaluation_root(preset, limit)`.  draws: samples per problem
    (default: the preset's eval_draws, 4).  limit: evaluate only the first `limit` problems of
    each population (tests; None = all 200).  sampler: "fast" (default, batched KV cache, same
    Gumbel-max noise per seed) or "reference" (the protocol's sequential sampler without a KV
    cache).  The fast sampler's tokens equal the reference's in every tested case
    (tests/test_sampling.py, tests/test_evaluate.py); only a floating-point near-tie between a
    full forward and a cached step could part them (`python -m labkit bench sampling` counts and
    explains any such mismatch), so the sampler used is recorded in every row and the manifest.  Refuses to overwrite a finished
    evaluation unless `overwrite`.  Raises ValueError if the policy's digest changes.
    """
    from ..models import presets, sampling

    check_policy(policy, explicit=state_file is not None and eval_root is not None)
    sampling.get_sampler(sampler)  # refuse an unknown sampler before any work
    config = get_preset(preset)
    draws = config.eval_draws if draws is None else draws
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be a positive integer, got {draws!r}")
    state_file = Path(state_file) if state_file is not None else policy_state_file(preset, policy)
    out_dir = Path(eval_root if eval_root is not None else evaluation_root(preset, limit)) / policy
    hold_for_replacing(out_dir, overwrite)  # a finished evaluation stays finished until stage 3

    # Stage 1: the statements (phase "inference": no labels) and the policy, reloaded from its file.
    statements = load_test_statements(limit)
    data.check_path_access(INFERENCE_PHASE, state_file)
    start = time.perf_counter()
    model, tokenizer = presets.load(preset, state=state_file, device=device)
    device = str(next(model.parameters()).device)
    load_seconds = time.perf_counter() - start
    start = time.perf_counter()
    digest = presets.parameter_digest(model)
    digest_seconds = time.perf_counter() - start
    # (presets.load has checked the file against the digest it records)

    # Stage 2: each mode, timed, with its peak memory; the digest re-checked after each.
    rows, costs = {}, {"device": device, "load_seconds": load_seconds, "digest_seconds": digest_seconds}
    with runtime.deterministic(device, warn_only=True):
        env = {**runtime.environment(device), "deterministic_algorithms": "warn_only"}
        for mode in MODES:
            was_reset = memory.reset_peak(device)
            start = time.perf_counter()
            rows[mode] = generate_predictions(model, tokenizer, statements, mode, sampler=sampler, draws=draws,
                                              max_new_tokens=max_new_tokens, batch_size=batch_size,
                                              policy_digest=digest)
            peak, peak_kind = memory.peak(device, was_reset)
            seconds = time.perf_counter() - start
            tokens = sum(r["response_tokens"] for r in rows[mode])
            costs[mode] = {"seconds": seconds, "responses": len(rows[mode]), "generated_tokens": tokens,
                           "seconds_per_response": seconds / len(rows[mode]),
                           "peak_memory_bytes": peak, "peak_memory_kind": peak_kind}
            after = presets.parameter_digest(model)
            if after != digest:
                raise ValueError(f"policy {policy!r} changed during {mode} generation: digest {digest[:16]}... "
                                 f"became {after[:16]}...; generation must not touch the weights")

    manifest = {
        "phase": INFERENCE_PHASE,  # how labkit.task.data recognises these files as inference outputs
        "preset": preset,
        "policy": policy,
        "state_file": display_path(state_file),
        "state_file_sha256": sha256_file(state_file),
        "policy_digest": digest,
        "policy_digest_after_generation": digest,
        "sampler": sampler,
        "batch_size": batch_size if sampler == "fast" else None,
        "draws": draws,
        "limit": limit,
        "problems": len(statements),
        "max_new_tokens": max_new_tokens,
        "seed_rule": "seed = int.from_bytes(sha256(f'eval/{problem_id}/{draw}').digest()[:8], 'big') >> 2",
        "environment": env,
        "config_fingerprint": config.fingerprint(),
    }
    # Stage 3: write the predictions, the side files, then FINISHED (last: a folder without it is not
    # evidence).  An overwritten evaluation loses its marker only now, after generation succeeded, and
    # a Ctrl-C waits until the new one is whole.
    with shielded("the evaluation is being written; it stops as soon as its files are whole") as heard:
        (out_dir / FINISHED_MARKER).unlink(missing_ok=True)
        for mode in MODES:
            write_jsonl(out_dir / PREDICTION_FILES[mode], rows[mode])
        write_json(out_dir / MANIFEST_FILE, manifest)
        write_json(out_dir / COSTS_FILE, costs)
        mark_finished(out_dir, {"policy": policy, "policy_digest": digest,
                                "responses": {m: len(rows[m]) for m in MODES}})
    if heard:
        raise KeyboardInterrupt(f"interrupted after the evaluation of {policy} was written whole")
    return manifest


def run_evaluations(preset: str, policy: str = "all", **kwargs) -> list[tuple[str, str]]:
    """Evaluate one policy, or every policy with a finished run ("all"); returns [(policy, status)].

    With "all", a policy without a finished run is skipped ("no run") and an
    already finished evaluation is kept ("kept") unless overwrite=True; a single
    named policy is never skipped silently (the errors of run_inference stand).
    """
    if policy != "all":
        run_inference(preset, policy, **kwargs)
        return [(policy, "evaluated")]
    out = []
    root = Path(kwargs.get("eval_root") or evaluation_root(preset, kwargs.get("limit")))
    for name in POLICIES:
        if not is_finished(preset_folder(preset, name)):
            out.append((name, "no run"))
        elif is_finished(root / name) and not kwargs.get("overwrite", False):
            out.append((name, "kept"))
        else:
            run_inference(preset, name, **kwargs)
            out.append((name, "evaluated"))
    if not any(status != "no run" for _, status in out):
        raise FileNotFoundError(f"no policy of preset {preset!r} has a finished run; train one first")
    return out


# --- 4. Statistics ------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, z: float = WILSON_Z) -> list[float]:
    """[low, high] Wilson score interval of a binomial proportion successes / n (95% by default).

        centre = (p + z^2 / 2n) / (1 + z^2 / n)
        half   = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2)

    Unlike p +- z sqrt(p(1-p)/n), it stays inside [0, 1] and is not empty at 0 or n
    successes, which matters here: 0/200 and 3/200 are real outcomes.  Computed by scipy
    (scipy.stats.binomtest(...).proportion_ci(method="wilson")) at the confidence level z stands
    for, 2 Phi(z) - 1; tests/test_paired.py checks it against the formula above.
    """
    from scipy import stats

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"an interval needs n >= 1 trials, got n={n!r}")
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= n:
        raise ValueError(f"successes must be an integer in 0..n={n}, got {successes!r}")
    ci = stats.binomtest(successes, n).proportion_ci(float(2 * stats.norm.cdf(z) - 1), method="wilson")
    return [float(ci.low), float(ci.high)]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with c correct among n samples: 1 - C(n-c, k) / C(n, k).

    Computed as Chen et al. (2021) do, without large binomials:
    C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i), and 1 when n - c < k.
    """
    _check_counts(n, c, k)
    if n - c < k:
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_pass_at_k(correct_counts: list[int], n: int, k: int) -> float:
    """pass@k over problems: mean of 1 - C(n-c, k)/C(n, k), in exact rational arithmetic, rounded once.

    correct_counts: c for each problem (each problem has exactly n samples).
    Exact integers and fractions make the value independent of summation order.
    """
    if not correct_counts:
        raise ValueError("pass@k needs at least one problem")
    total = Fraction(0)
    for c in correct_counts:
        _check_counts(n, c, k)
        total += 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    return float(total / len(correct_counts))


def _check_counts(n: int, c: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)) or not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs integers 0 <= c <= n and 1 <= k <= n, got n={n!r}, c={c!r}, k={k!r}")


# --- 5. Scoring: the join and the checks --------------------------------------------------------


def read_predictions(policy_dir: str | Path, mode: str) -> list[dict]:
    """The raw prediction rows of one policy and mode."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {MODES}")
    return read_jsonl(Path(policy_dir) / PREDICTION_FILES[mode])


def check_complete(rows: list[dict], expected_ids: list[str], draws: int, mode: str, source: str = "predictions") -> None:
    """Exactly one row per expected (problem, draw); ValueError naming the first bad key otherwise.

    greedy: draws 0 only; sample: draws 0..draws-1, each with its shared seed.
    """
    per_problem = 1 if mode == "greedy" else draws
    for r in rows:
        if r.get("mode") != mode:
            raise ValueError(f"{source}: row ({r.get('problem_id')!r}, draw {r.get('draw')!r}) has mode "
                             f"{r.get('mode')!r} in the {mode} file")
    keys = Counter((r["problem_id"], r["draw"]) for r in rows)
    duplicated = sorted(k for k, count in keys.items() if count > 1)
    if duplicated:
        raise ValueError(f"{source}: (problem, draw) {duplicated[0]} appears {keys[duplicated[0]]} times "
                         f"({len(duplicated)} duplicated key(s)); each response is generated exactly once")
    expected = {(pid, d) for pid in expected_ids for d in range(per_problem)}
    missing = sorted(expected - set(keys))
    if missing:
        raise ValueError(f"{source}: (problem, draw) {missing[0]} is missing ({len(missing)} missing in all); "
                         "every test problem must be answered, an absent response is not a skipped one")
    unexpected = sorted(set(keys) - expected)
    if unexpected:
        raise ValueError(f"{source}: (problem, draw) {unexpected[0]} is not expected ({len(unexpected)} in all): "
                         f"only {len(expected_ids)} problems x {per_problem} draw(s) were evaluated")
    for r in rows:
        seed = None if mode == "greedy" else eval_seed(r["problem_id"], r["draw"])
        if r["seed"] != seed:
            raise ValueError(f"{source}: ({r['problem_id']!r}, draw {r['draw']}) has seed {r['seed']!r}, the "
                             f"shared evaluation seed is {seed!r}")


def score_rows(rows: list[dict], labels_by_id: dict[str, dict]) -> list[dict]:
    """Each prediction joined with its label and scored by the verifier (scoring phase only).

    Returns rows with problem_id, population, draw, text, finish_reason,
    response_tokens, reward, valid, reason ("correct" when reward is 1).
    """
    out = []
    for r in rows:
        label = labels_by_id.get(r["problem_id"])
        if label is None:
            raise ValueError(f"prediction for {r['problem_id']!r}, which is not a test problem")
        if label["population"] != r["population"]:
            raise ValueError(f"{r['problem_id']!r}: prediction says population {r['population']!r}, "
                             f"the label {label['population']!r}")
        verdict = verifier.score(r["text"], r["finish_reason"], label["problem"], r["tokenization_valid"])
        out.append({
            "problem_id": r["problem_id"], "population": r["population"], "draw": r["draw"], "text": r["text"],
            "finish_reason": r["finish_reason"], "response_tokens": r["response_tokens"],
            "reward": verdict.reward, "valid": verdict.valid, "reason": verdict.reason or "correct",
        })
    return out


def reason_counts(scored: list[dict]) -> dict[str, int]:
    """{"correct": n, reason: n for every verifier reason (0 included)}; sums to len(scored)."""
    counts = {name: 0 for name in ("correct",) + verifier.REASONS}
    for r in scored:
        counts[r["reason"]] += 1
    return counts


def best_of_name(draws: int) -> str:
    """The name of the best-of-`draws` rate: it says what it is, and what it is not."""
    return f"best_of_{draws}_not_pass_at_1"


def population_summary(scored: list[dict], mode: str, draws: int) -> dict:
    """The METRICS of one (policy, mode, population) from its scored rows."""
    n = len(scored)
    if n == 0:
        raise ValueError(f"no {mode} responses to summarise")
    correct = sum(r["reward"] for r in scored)
    valid = sum(1 for r in scored if r["valid"])
    without_eos = sum(1 for r in scored if r["finish_reason"] != "eos")
    out = {
        "responses": n,
        "problems": len({r["problem_id"] for r in scored}),
        "correct": correct,
        "success_rate": correct / n,
        "success_rate_ci": wilson_interval(correct, n),
        "valid_json": valid / n,
        "valid_json_ci": wilson_interval(valid, n),
        "valid_json_responses": valid,
        "without_eos": without_eos,
        "without_eos_rate": without_eos / n,
        "without_eos_rate_ci": wilson_interval(without_eos, n),
        "mean_response_tokens": sum(r["response_tokens"] for r in scored) / n,
        "reasons": reason_counts(scored),
    }
    if mode == "sample":
        per_problem = Counter()
        for r in scored:
            per_problem[r["problem_id"]] += r["reward"]
        counts = [per_problem[pid] for pid in sorted({r["problem_id"] for r in scored})]
        problems = len(counts)
        out["pass_at_k"] = {
            "estimator": "unbiased, Chen et al. (2021): mean over problems of 1 - C(n-c, k) / C(n, k)",
            "samples_per_problem": draws,
            "problems": problems,
            "samples": n,
            "label": f"pass@k, n={draws} samples per problem, {n} samples in all ({problems} problems)",
            "k": list(range(1, draws + 1)),
            "values": [mean_pass_at_k(counts, draws, k) for k in range(1, draws + 1)],
        }
        solved = sum(1 for c in counts if c > 0)
        out[best_of_name(draws)] = solved / problems
        out[best_of_name(draws) + "_ci"] = wilson_interval(solved, problems)
    return out


def score_policy(policy_dir: str | Path, labels: list[dict]) -> dict:
    """One policy's results: manifest facts, costs, per mode and population the METRICS.

    labels: every test label row (scoring phase).  The expected problems are
    selected from them with the manifest's `limit`, as inference selected its statements.
    """
    policy_dir = Path(policy_dir)
    manifest = read_json(policy_dir / MANIFEST_FILE)
    costs = read_json(policy_dir / COSTS_FILE)
    draws = manifest["draws"]
    expected = select_problems(labels, manifest["limit"])
    labels_by_id = {r["id"]: r for r in expected}
    expected_ids = [r["id"] for r in expected]
    out = {
        "evaluation": {k: manifest[k] for k in ("policy_digest", "state_file", "state_file_sha256", "sampler",
                                                "draws", "limit", "problems", "max_new_tokens", "seed_rule")},
        "complete": manifest["limit"] is None,
        "costs": costs,
        "prediction_files_sha256": {m: sha256_file(policy_dir / PREDICTION_FILES[m]) for m in MODES},
    }
    for mode in MODES:
        rows = read_predictions(policy_dir, mode)
        source = f"{policy_dir.name}/{PREDICTION_FILES[mode]}"
        check_complete(rows, expected_ids, draws, mode, source)
        scored = score_rows(rows, labels_by_id)
        out[mode] = {
            population: population_summary(
                [r for r in scored if population == "ALL" or r["population"] == population], mode, draws)
            for population in POPULATIONS
        }
    return out


def finished_policies(eval_root: str | Path) -> list[str]:
    """The policies with a finished evaluation under `eval_root`, in POLICIES order."""
    return [p for p in POLICIES if is_finished(Path(eval_root) / p)]


def compute_results(preset: str, eval_root: str | Path | None = None) -> dict:
    """results.json's content for every finished evaluation of `preset` (a pure function of the files)."""
    root = Path(eval_root if eval_root is not None else evaluation_root(preset))
    policies = finished_policies(root)
    if not policies:
        raise FileNotFoundError(f"no finished evaluation under {root}; run `python -m labkit evaluate --preset "
                                f"{preset} --policy all` first")
    labels = load_test_labels(phase=SCORING_PHASE)
    return {
        "format": RESULTS_FORMAT,
        "preset": preset,
        "split": "test",
        "populations": list(POPULATIONS),
        "modes": list(MODES),
        "policy_order": policies,
        "metrics": METRICS,
        "notes": list(NOTES),
        "policies": {p: score_policy(root / p, labels) for p in policies},
    }


def write_results(preset: str, eval_root: str | Path | None = None) -> Path:
    """Recompute and write <eval_root>/results.json (deterministic JSON: labkit.lab.runs.write_json)."""
    root = Path(eval_root if eval_root is not None else evaluation_root(preset))
    return write_json(root / RESULTS_FILE, compute_results(preset, root))


def check_results(preset: str, eval_root: str | Path | None = None) -> bool:
    """True when the committed results.json equals, byte for byte, a recomputation from the predictions."""
    root = Path(eval_root if eval_root is not None else evaluation_root(preset))
    path = root / RESULTS_FILE
    if not path.is_file():
        return False
    return path.read_bytes() == dumps_json(compute_results(preset, root)).encode("utf-8")


def stale_evaluations(preset: str, eval_root: str | Path | None = None) -> list[str]:
    """Messages for evaluations whose policy file changed since (compared by SHA-256); [] if none."""
    root = Path(eval_root if eval_root is not None else evaluation_root(preset))
    out = []
    for policy in finished_policies(root):
        manifest = read_json(root / policy / MANIFEST_FILE)
        path = Path(manifest["state_file"])
        path = path if path.is_absolute() else REPO_ROOT / path
        if not path.is_file() and _kept_local(path):
            continue  # a model git keeps out of clones: its evaluation stands on the SHA-256 it records
        if not path.is_file():
            out.append(f"{policy}: its policy file {manifest['state_file']} is gone")
        elif sha256_file(path) != manifest["state_file_sha256"]:
            out.append(f"{policy}: {manifest['state_file']} changed since it was evaluated; re-run with --overwrite")
    return out


def _kept_local(path: Path) -> bool:
    """Is `path` a file git keeps out of every clone (.gitignore: the G = 2 and G = 8 models, the sweeps'), so
    that its absence on a fresh clone is expected (`python -m labkit cache fill` rebuilds such a model)?"""
    import subprocess

    try:
        ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=REPO_ROOT, capture_output=True)
    except OSError:  # no git: nothing can be said, and the caller reports the file as gone
        return False
    return ignored.returncode == 0


# --- 6. Tables for the book and the notebook --------------------------------------------------


TABLE_COLUMNS = ("policy", "mode", "population", "responses", "correct", "success_rate", "success_rate_ci",
                 "valid_json", "without_eos", "mean_response_tokens")


def results_table(results: dict, modes: tuple[str, ...] = MODES,
                  populations: tuple[str, ...] = POPULATIONS) -> list[dict]:
    """One row per (policy, mode, population) with TABLE_COLUMNS, policies in results order."""
    rows = []
    for policy in results["policy_order"]:
        for mode in modes:
            for population in populations:
                s = results["policies"][policy][mode][population]
                rows.append({"policy": policy, "mode": mode, "population": population,
                             **{c: s[c] for c in TABLE_COLUMNS[3:]}})
    return rows


RATE_COLUMNS = ("success_rate", "valid_json", "without_eos_rate", "best_of_4_not_pass_at_1")


def _cell(column: str, value) -> str:
    rate = column in RATE_COLUMNS or column.endswith("_ci") and column[:-3] in RATE_COLUMNS
    if isinstance(value, (list, tuple)) and len(value) == 2 and rate:
        return f"[{100 * value[0]:.1f}, {100 * value[1]:.1f}]"
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if rate else f"{value:.2f}"
    return str(value)


def markdown_table(rows: list[dict], columns: tuple[str, ...] | None = None) -> str:
    """A GitHub/MyST markdown table of `rows`; rates as percentages, Wilson intervals as [low, high] %."""
    if not rows:
        raise ValueError("no rows to render")
    columns = tuple(columns or rows[0].keys())
    header = ["success_rate_ci (95%)" if c == "success_rate_ci" else c for c in columns]
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---" if c in ("policy", "mode", "population") else "---:" for c in columns) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(c, r[c]) for c in columns) + " |")
    return "\n".join(lines) + "\n"
