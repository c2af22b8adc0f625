"""Result sentences chosen from the numbers, for the chapters to print.

A chapter must not type in a verdict that only one cached run gives: when the cache is rebuilt,
"rose" may become "did not change" and "below the curve" may become "above it".  These helpers
take the run's numbers and return the words; the chapters print them.  Nothing here trains,
samples or scores: it only counts, compares and phrases.
"""

from __future__ import annotations

from pathlib import Path

from ..grpo.losses import expected_frac_reward_zero_std
from ..eval import paired
from ..eval.evaluate import read_predictions, wilson_interval


def side_of(value: float, reference: float, what: str, digits: int = 4) -> str:
    """'above WHAT by 0.0123', 'below WHAT by ...' or 'exactly on WHAT', from value - reference."""
    gap = value - reference
    if gap > 0:
        return f"above {what} by {gap:.{digits}f}"
    if gap < 0:
        return f"below {what} by {-gap:.{digits}f}"
    return f"exactly on {what}"


def intervals_verdict(low_a: float, high_a: float, low_b: float, high_b: float) -> str:
    """How interval A stands to interval B: 'above', 'below' (wholly, no overlap) or 'overlaps'."""
    if low_a > high_b:
        return "above"
    if high_a < low_b:
        return "below"
    return "overlaps"


def change_verdict(before: tuple[int, int], after: tuple[int, int]) -> str:
    """'rose', 'fell' or 'unchanged' for a 0/1 rate counted twice, (successes, n) each, on different samples.

    The verdict is a test, not an overlap of intervals (two rates whose 95% intervals overlap can
    still differ at p = 0.02; see labkit.eval.paired): 'rose' or 'fell' when the two-sided Fisher exact
    test of the two counts (paired.two_proportion_test; the samples are not paired) gives
    p < paired.ALPHA = 0.05, in the direction of the change; otherwise 'unchanged'.
    """
    (k0, n0), (k1, n1) = before, after
    if paired.two_proportion_test(k0, n0, k1, n1) >= paired.ALPHA:
        return "unchanged"
    return "rose" if k1 * n0 > k0 * n1 else "fell"


def count_change(before: tuple[int, int], after: tuple[int, int], what: str) -> str:
    """A sentence on a 0/1 rate measured twice, e.g. (3, 160) then (5, 160): the counts, their Wilson 95%
    intervals (description) and the verdict of change_verdict with its Fisher exact p-value."""
    (k0, n0), (k1, n1) = before, after
    lo0, hi0 = wilson_interval(k0, n0)
    lo1, hi1 = wilson_interval(k1, n1)
    first = f"{k0}/{n0} = {k0 / n0:.1%} [{lo0:.1%}, {hi0:.1%}]"
    second = f"{k1}/{n1} = {k1 / n1:.1%} [{lo1:.1%}, {hi1:.1%}]"
    p = paired.format_p(paired.two_proportion_test(k0, n0, k1, n1), "Fisher exact p")
    verdict = change_verdict(before, after)
    if verdict != "unchanged":
        return f"{what} {verdict} from {first} to {second} ({p})"
    moved = "the same rate" if k0 * n1 == k1 * n0 else "different rates"
    return f"{what} did not change measurably: {first}, then {second} ({moved}, {p})"


def signal_fraction_range(p_low: float, p_high: float, G: int) -> tuple[float, float]:
    """(min, max) of the share of groups WITH signal, 1 - `losses.expected_frac_reward_zero_std(p, G)` =
    1 - p^G - (1-p)^G, for p in [p_low, p_high]: it rises up to p = 1/2, then falls."""
    values = [1.0 - expected_frac_reward_zero_std(p_low, G), 1.0 - expected_frac_reward_zero_std(p_high, G)]
    if p_low <= 0.5 <= p_high:
        values.append(1.0 - expected_frac_reward_zero_std(0.5, G))
    return min(values), max(values)


# What the verifier reads of a response (labkit.eval.evaluate.score_rows): two responses that agree on
# these get the same reward for the same problem.
VERIFIER_INPUTS = ("text", "finish_reason", "tokenization_valid")


def same_responses(policy_dir: str | Path, reference_dir: str | Path, mode: str,
                   key: str | tuple[str, ...] = "text") -> tuple[int, int]:
    """(how many of a policy's test responses equal the reference policy's on `key`, how many there are).

    The responses are matched by (problem, draw): the evaluation gives every policy the same
    problems and, for samples, the same seed per (problem, draw).  key: a prediction field
    ("text", "response_ids") or a tuple of them (VERIFIER_INPUTS: the same reward).
    """
    keys_of = (lambda r: tuple(r[k] for k in key)) if isinstance(key, tuple) else (lambda r: r[key])
    reference = {(r["problem_id"], r["draw"]): r for r in read_predictions(reference_dir, mode)}
    rows = read_predictions(policy_dir, mode)
    keys = {(r["problem_id"], r["draw"]) for r in rows}
    if keys != set(reference) or len(keys) != len(rows):
        raise ValueError(f"{policy_dir} and {reference_dir} did not answer the same (problem, draw) pairs in {mode} mode")
    return sum(keys_of(r) == keys_of(reference[(r["problem_id"], r["draw"])]) for r in rows), len(rows)


# The fields of a stored rollout that a re-run on any machine must give back exactly (ids, tokens,
# texts, rewards and what follows from them), and the two that carry float32 rounding: the
# recorded log-probs (compared within a tolerance) and the digest of the weights that sampled
# (bitwise, so it differs as soon as one update rounded differently, even if the policy samples
# the same tokens).
FLOAT_FIELDS = ("logp_old", "policy_digest")


def compare_rollouts(fresh: list[dict], cached: list[dict], logprob_tol: float) -> dict:
    """Field-by-field comparison of re-run rollouts with cached ones, in the same order.

    Returns {"rollouts", "exact_equal" (every field but FLOAT_FIELDS equal), "logprobs_within"
    (each recorded log-prob within logprob_tol), "max_logprob_gap", "digests_equal",
    "bitwise_equal" (every field equal), "first_difference" (None or (rollout_id, fields that
    differ beyond these rules))}.
    """
    if [r["rollout_id"] for r in fresh] != [r["rollout_id"] for r in cached]:
        raise ValueError("the re-run made other rollouts (ids differ): nothing to compare field by field")
    out = {"rollouts": len(fresh), "exact_equal": 0, "logprobs_within": 0, "max_logprob_gap": 0.0,
           "digests_equal": 0, "bitwise_equal": 0, "first_difference": None}
    for a, b in zip(fresh, cached):
        if set(a) != set(b):
            raise ValueError(f"{a['rollout_id']}: the re-run stores other fields ({sorted(set(a) ^ set(b))})")
        exact = [k for k in a if k not in FLOAT_FIELDS and a[k] != b[k]]
        if len(a["logp_old"]) == len(b["logp_old"]):
            gap = max((abs(x - y) for x, y in zip(a["logp_old"], b["logp_old"])), default=0.0)
        else:
            gap = float("inf")
        out["exact_equal"] += not exact
        out["logprobs_within"] += gap <= logprob_tol
        out["max_logprob_gap"] = max(out["max_logprob_gap"], gap)
        out["digests_equal"] += a["policy_digest"] == b["policy_digest"]
        out["bitwise_equal"] += a == b
        beyond = exact + (["logp_old"] if gap > logprob_tol else [])
        if beyond and out["first_difference"] is None:
            out["first_difference"] = (a["rollout_id"], beyond)
    return out


def rerun_sentence(report: dict, logprob_tol: float) -> str:
    """The verdict of compare_rollouts in words."""
    n = report["rollouts"]
    agree = report["exact_equal"] == n and report["logprobs_within"] == n
    lines = [
        f"tokens, texts, rewards and every other exact field equal: {report['exact_equal']} of {n}",
        f"recorded log-probs within {logprob_tol:g}: {report['logprobs_within']} of {n} "
        f"(largest gap {report['max_logprob_gap']:.1e})",
        f"bitwise identical in every field, sampling digests included: {report['bitwise_equal']} of {n} "
        f"(digests equal: {report['digests_equal']} of {n})",
    ]
    if agree:
        verdict = "The re-run reproduces the cached rollouts"
        if report["bitwise_equal"] < n:
            verdict += (" up to float32 rounding: the same tokens, texts and rewards, and log-probs within "
                        "the tolerance")
        if report["digests_equal"] < n:
            verdict += ("; the weights that sampled some of them differ in their last bits (an update "
                        "rounded differently), so their digests differ")
    else:
        rid, fields = report["first_difference"]
        verdict = f"The re-run does NOT reproduce the cached rollouts: first at {rid}, fields {fields}"
    return "\n".join(["  " + line for line in lines] + [verdict + "."])


# --- Paired comparisons, named as the chapters name the policies ------------------------------------
#
# paired.compare_policies names the two policies in its sentences by their evaluation folders'
# names, and every sweep run's folder is <run>/evaluation/grpo/: a chapter comparing two sweep runs
# (or one with the protocol's grpo) needs its own names in the words.


def compare_named(a_dir: str | Path, b_dir: str | Path, labels: list[dict], subset: str | None = None,
                  names: tuple[str, str] | None = None) -> dict:
    """paired.compare_policies(a_dir, b_dir, labels, subset) (B = b_dir against A = a_dir), its sentences
    naming `names` (A, B) when given (a sweep run's evaluation folder is always called "grpo"), the
    folders' names otherwise."""
    return paired.compare_policies(a_dir, b_dir, labels, subset, names=names)


def paired_call(comparison: dict, mode: str) -> str:
    """How B stands to A in one mode of a paired comparison: 'ahead' or 'behind' when the mode's test
    rejects at p < paired.ALPHA (greedy: the exact McNemar p; sample: the paired permutation p), in the
    direction of the difference (gained - lost, or the mean rate difference); else 'not separable'."""
    c = comparison[mode]
    p, gap = (c["p"], c["gained"] - c["lost"]) if mode == "greedy" else (c["p_permutation"], c["mean_difference"])
    if p >= paired.ALPHA or gap == 0:
        return "not separable"
    return "ahead" if gap > 0 else "behind"


def unpaired_call(a: tuple[int, int], b: tuple[int, int]) -> str:
    """'higher', 'lower' or 'not separable': rate a = (successes, n) against rate b measured on DIFFERENT
    samples, by the two-sided Fisher exact test (paired.two_proportion_test) at p < paired.ALPHA."""
    (ka, na), (kb, nb) = a, b
    if paired.two_proportion_test(ka, na, kb, nb) >= paired.ALPHA:
        return "not separable"
    return "higher" if ka * nb > kb * na else "lower"
