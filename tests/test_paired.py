"""Paired tests between policies (labkit.eval.paired): hand-worked values, and the committed evaluation."""

from __future__ import annotations

import gzip
import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest

from labkit.task import data, verifier
from labkit.eval import evaluate, paired
from labkit.lab.runs import REPO_ROOT, read_json

EVAL = REPO_ROOT / "runs" / "tiny" / "evaluation"


def two_sided_binomial_half(k: int, n: int) -> float:
    """Exact two-sided binomial p-value at probability 1/2: 2 * P(X <= min(k, n - k)), capped at 1."""
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    return min(1.0, float(Fraction(2 * tail, 2 ** n)))


def fisher_by_hand(k0: int, n0: int, k1: int, n1: int) -> float:
    """Two-sided Fisher exact p: the hypergeometric tables at most as likely as the observed one."""
    total, successes = n0 + n1, k0 + k1

    def prob(x):  # x successes in the first row
        return Fraction(math.comb(successes, x) * math.comb(total - successes, n0 - x), math.comb(total, n0))

    observed = prob(k0)
    support = range(max(0, successes - n1), min(successes, n0) + 1)
    return float(sum(prob(x) for x in support if prob(x) <= observed * Fraction(10 ** 7 + 1, 10 ** 7)))


def wilson_by_hand(x: int, n: int) -> list[float]:
    z = 1.959963984540054  # Phi^-1(0.975)
    p = x / n
    centre = (p + z ** 2 / (2 * n)) / (1 + z ** 2 / n)
    half = z / (1 + z ** 2 / n) * math.sqrt(p * (1 - p) / n + z ** 2 / (4 * n ** 2))
    return [max(0.0, centre - half), min(1.0, centre + half)]


# --- counts -----------------------------------------------------------------------------------------


def test_mcnemar_is_the_exact_binomial_on_the_discordant_pairs():
    # 10 gained, 6 lost: 2 * (C(16,0) + ... + C(16,6)) / 2^16 = 2 * 14893 / 65536
    assert sum(math.comb(16, i) for i in range(7)) == 14893
    assert paired.mcnemar_exact(10, 6) == pytest.approx(2 * 14893 / 65536, abs=1e-12)
    assert paired.mcnemar_exact(6, 10) == pytest.approx(2 * 14893 / 65536, abs=1e-12)
    assert paired.mcnemar_exact(0, 0) == 1.0
    assert paired.mcnemar_exact(5, 5) == 1.0
    assert paired.mcnemar_exact(0, 7) == pytest.approx(2 / 2 ** 7, abs=1e-15)
    with pytest.raises(ValueError, match="lost must be a non-negative integer, got -1"):
        paired.mcnemar_exact(3, -1)


def test_the_sign_test_drops_ties_and_is_exact():
    differences = [0.25] * 20 + [1] * 9 + [-0.5] * 6 + [0] * 5  # 29 up, 6 down, 5 ties
    out = paired.sign_test(differences)
    assert (out["up"], out["down"], out["ties"]) == (29, 6, 5)
    expected = 2 * sum(math.comb(35, i) for i in range(7)) / 2 ** 35
    assert out["p"] == pytest.approx(expected, abs=1e-12)
    assert out["p"] == pytest.approx(two_sided_binomial_half(29, 35), abs=1e-15)
    assert paired.sign_test([0, 0, 0]) == {"up": 0, "down": 0, "ties": 3, "p": 1.0}


def test_the_unpaired_test_is_fisher_exact():
    for counts in [(81, 160, 102, 160), (3, 10, 8, 10), (0, 20, 5, 20), (198, 320, 201, 320), (7, 7, 0, 3)]:
        assert paired.two_proportion_test(*counts) == pytest.approx(fisher_by_hand(*counts), abs=1e-12)
    # The module docstring's example: the Wilson intervals overlap, yet the test rejects at 5%.
    low0, high0 = paired.wilson_interval(81, 160)
    low1, high1 = paired.wilson_interval(102, 160)
    assert low1 < high0
    assert 0.02 < paired.two_proportion_test(81, 160, 102, 160) < 0.025
    with pytest.raises(ValueError, match=r"k1 must be an integer in 0..n=5, got 6"):
        paired.two_proportion_test(1, 5, 6, 5)


# --- Wilson -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("x,n", [(0, 200), (3, 200), (81, 160), (200, 200), (1, 1), (0, 1), (16, 800)])
def test_the_scipy_wilson_interval_is_the_formula(x, n):
    got = paired.wilson_interval(x, n)
    assert got == pytest.approx(wilson_by_hand(x, n), abs=1e-12)
    assert got == pytest.approx(evaluate.wilson_interval(x, n), abs=1e-15)
    assert 0.0 <= got[0] <= x / n <= got[1] <= 1.0
    assert (got[0] == 0.0) == (x == 0) and (got[1] == 1.0) == (x == n)


def test_evaluate_z_is_the_normal_quantile_and_the_printed_digits_agree():
    from scipy import stats

    assert abs(evaluate.WILSON_Z - stats.norm.ppf(0.975)) < 1e-15  # not 1.96
    for n in (1, 4, 100, 160, 200, 320, 400, 800):
        for x in range(n + 1):
            ours, theirs = paired.wilson_interval(x, n), evaluate.wilson_interval(x, n)
            assert ours == pytest.approx(theirs, abs=1e-15)
            assert [f"{100 * v:.1f}" for v in ours] == [f"{100 * v:.1f}" for v in theirs]
    assert paired.wilson_interval(3, 200, 0.99)[1] > paired.wilson_interval(3, 200)[1]


def test_the_wilson_arguments_are_checked_as_evaluate_checks_them():
    for args, message in [((0, 0), "n >= 1"), ((5, 4), "0..n=4"), ((True, 4), "0..n=4"), ((1.0, 4), "0..n=4")]:
        with pytest.raises(ValueError, match=message):
            paired.wilson_interval(*args)
        with pytest.raises(ValueError, match=message):
            evaluate.wilson_interval(*args)
    with pytest.raises(ValueError, match="confidence must be a number strictly between 0 and 1, got 1.5"):
        paired.wilson_interval(1, 4, 1.5)


# --- paired rates --------------------------------------------------------------------------------------


A8 = [0, 1, 2, 4, 3, 0, 1, 2]
B8 = [2, 1, 4, 4, 1, 3, 2, 4]


def brute_force_permutation_p(differences) -> float:
    """Every one of the 2^n sign flips: two-sided p = min(1, 2 * min(P(T >= t), P(T <= t))), T = sum."""
    d = np.asarray(differences, dtype=np.int64)
    observed = int(d.sum())
    flips = np.array(list(itertools.product((1, -1), repeat=d.size)), dtype=np.int64)
    null = flips @ d
    return min(1.0, 2 * min(np.mean(null >= observed), np.mean(null <= observed)))


def test_the_mean_difference_and_its_t_interval_match_a_numpy_reference():
    out = paired.paired_mean_difference(A8, B8, 4)
    d = (np.array(B8, dtype=np.float64) - np.array(A8, dtype=np.float64)) / 4
    t_975_7 = 2.364624  # Student t, 7 degrees of freedom, 97.5% quantile (table value)
    from scipy import stats

    assert stats.t.ppf(0.975, 7) == pytest.approx(t_975_7, abs=1e-6)
    half = stats.t.ppf(0.975, 7) * d.std(ddof=1) / math.sqrt(8)
    assert out["n_problems"] == 8
    assert out["a_rate"] == pytest.approx(sum(A8) / 32, abs=1e-15)
    assert out["b_rate"] == pytest.approx(sum(B8) / 32, abs=1e-15)
    assert out["mean_difference"] == pytest.approx(d.mean(), abs=1e-15)
    assert out["mean_difference"] == (sum(B8) - sum(A8)) / 32 == 8 / 32
    assert out["interval"] == pytest.approx([d.mean() - half, d.mean() + half], abs=1e-12)
    assert all(type(v) is float for v in out["interval"])
    zero = paired.paired_mean_difference([1, 2, 3], [1, 2, 3], 4)
    assert zero["interval"] == [0.0, 0.0] and zero["p_permutation"] == 1.0 and zero["mean_difference"] == 0.0
    one = paired.paired_mean_difference([1, 2, 3], [1, 2, 4], 4)  # one non-zero difference: +-1, p = 1
    assert one["p_permutation"] == brute_force_permutation_p([0, 0, 1]) == 1.0
    with pytest.raises(ValueError, match="at least 2 problems"):
        paired.paired_mean_difference([1], [2], 4)
    with pytest.raises(ValueError, match="0..draws=4"):
        paired.paired_mean_difference([1, 5], [2, 2], 4)


def test_the_permutation_p_is_exact_on_a_small_case_and_deterministic_on_a_large_one():
    out = paired.paired_mean_difference(A8, B8, 4)
    assert out["p_permutation_method"] == "exact"
    assert out["p_permutation"] == pytest.approx(brute_force_permutation_p(np.subtract(B8, A8)), abs=1e-12)
    # 40 problems, 20 non-zero differences: 2^20 flips > 20,000, so Monte Carlo, seeded.
    rng = np.random.default_rng(7)
    a = rng.integers(0, 5, 40)
    b = np.where(np.arange(40) % 2 == 0, a, np.clip(a + rng.choice([-1, 1, 1, 2], 40), 0, 4))
    first, second = paired.paired_mean_difference(a, b, 4), paired.paired_mean_difference(a, b, 4)
    assert first["p_permutation_method"] == "monte carlo, 20000 sign flips"
    assert first["p_permutation"] == second["p_permutation"]
    nonzero = (b - a)[b != a]
    assert 14 < nonzero.size <= 20
    assert first["p_permutation"] == pytest.approx(brute_force_permutation_p(nonzero), abs=0.01)


def _scipy_sign_flip_p(d) -> float:
    from scipy import stats

    return float(stats.permutation_test((np.asarray(d, dtype=np.float64),), lambda x, axis: np.sum(x, axis=axis),
                                        permutation_type="samples", vectorized=True,
                                        n_resamples=paired.PERMUTATION_RESAMPLES, alternative="two-sided",
                                        rng=np.random.default_rng(paired.PERMUTATION_SEED)).pvalue)


@pytest.mark.parametrize("m, shift, one_sided", [(17, 0, False), (22, 1, False), (57, 0, False), (120, 1, False),
                                                 (201, 0, False), (33, 0, True), (199, 2, False)])
def test_the_fast_monte_carlo_p_is_scipys_bit_for_bit(m, shift, one_sided):
    """The sign flips drawn from PCG64's 32-bit halves give scipy.stats.permutation_test's p exactly (odd and
    even sizes, p near 1, near 0.05, at its floor of 2/20,001)."""
    rng = np.random.default_rng(m)
    d = rng.integers(-8, 9, m) + shift
    d = np.abs(d) if one_sided else d
    d = d[d != 0].astype(np.float64)
    assert 2 ** d.size > paired.PERMUTATION_RESAMPLES
    assert paired._sums_exactly(d)
    assert paired._monte_carlo_sign_flip_p(d) == _scipy_sign_flip_p(d)
    assert paired.permutation_p(d) == (_scipy_sign_flip_p(d), "monte carlo, 20000 sign flips")


def test_differences_that_are_not_integers_keep_scipys_own_path():
    d = np.random.default_rng(3).normal(size=40)
    assert not paired._sums_exactly(d)
    assert paired.permutation_p(d)[0] == _scipy_sign_flip_p(d)


# --- words ------------------------------------------------------------------------------------------------


def test_the_verdict_words_follow_from_p():
    assert paired.verdict(0.0012) == "significant at p = 0.0012"
    assert paired.verdict(0.45) == "not separable (p = 0.45)"
    assert paired.verdict(0.454498291015625, what="exact McNemar p") == "not separable (exact McNemar p = 0.45)"
    assert paired.verdict(3e-7, direction="B ahead") == "B ahead, significant at p < 1e-6"
    assert paired.verdict(0.05) == "not separable (p = 0.05)"  # p < alpha rejects, p = alpha does not
    assert paired.verdict(0.02, alpha=0.01) == "not separable (p = 0.02)"
    assert paired.format_p(3.44e-5) == "p = 3.4e-5" and paired.format_p(1.0) == "p = 1"
    with pytest.raises(ValueError, match="0 <= p <= 1"):
        paired.verdict(1.5)


# --- comparisons of scored rows ------------------------------------------------------------------------


def greedy_rows(successes):
    return [{"problem_id": f"p{i:03d}", "draw": 0, "reward": s} for i, s in enumerate(successes)]


def test_compare_greedy_counts_the_discordant_pairs():
    a = [0] * 10 + [1] * 6 + [1] * 20 + [0] * 4
    b = [1] * 10 + [0] * 6 + [1] * 20 + [0] * 4
    out = paired.compare_greedy(greedy_rows(a), greedy_rows(b)[::-1])  # matched by id, not by order
    assert {k: out[k] for k in ("n", "a_correct", "b_correct", "gained", "lost")} == \
        {"n": 40, "a_correct": 26, "b_correct": 30, "gained": 10, "lost": 6}
    assert out["p"] == pytest.approx(2 * 14893 / 65536, abs=1e-12)
    assert out["verdict"] == "B gained 10 problems and lost 6 against A: not separable (exact McNemar p = 0.45)"
    strong = paired.compare_greedy(greedy_rows([0] * 12), greedy_rows([1] * 12), names=("sft", "grpo"))
    assert strong["verdict"] == ("grpo gained 12 problems and lost 0 against sft: grpo ahead, significant at "
                                 f"exact McNemar p = {2 / 2 ** 12:.2g}")


def test_mismatched_keys_are_refused_by_name():
    with pytest.raises(ValueError, match=r"A and B do not cover the same keys: A has \('p002',\) which B lacks"):
        paired.compare_greedy(greedy_rows([1, 0, 1]), greedy_rows([1, 0]))
    with pytest.raises(ValueError, match=r"B has \('p001',\) which A lacks"):
        paired.compare_greedy(greedy_rows([1]), greedy_rows([1, 0]))
    sampled = [{"problem_id": "p0", "draw": d, "reward": 1} for d in range(4)]
    with pytest.raises(ValueError, match=r"B has \('p0', 4\) which A lacks"):
        paired.compare_sampled(sampled, sampled + [{"problem_id": "p0", "draw": 4, "reward": 0}], 4)
    with pytest.raises(ValueError, match=r"problem 'p0' has draws \[0, 1, 2\], expected 0..3"):
        paired.compare_sampled(sampled[:3], sampled[:3], 4)
    with pytest.raises(ValueError, match="appears twice"):
        paired.compare_greedy(greedy_rows([1, 0]) * 2, greedy_rows([1, 0]) * 2)


def test_compare_sampled_uses_per_problem_counts():
    rows = lambda counts: [{"problem_id": f"p{i}", "draw": d, "reward": int(d < c)}  # noqa: E731
                           for i, c in enumerate(counts) for d in range(4)]
    out = paired.compare_sampled(rows(A8), rows(B8), 4)
    d = np.subtract(B8, A8)
    assert (out["up"], out["down"], out["ties"]) == (int((d > 0).sum()), int((d < 0).sum()), int((d == 0).sum()))
    assert (out["up"], out["down"], out["ties"]) == (5, 1, 2)
    assert out["p_sign"] == pytest.approx(two_sided_binomial_half(5, 6), abs=1e-15)
    mean = paired.paired_mean_difference(A8, B8, 4)
    for key in ("n_problems", "a_rate", "b_rate", "mean_difference", "interval", "p_permutation"):
        assert out[key] == mean[key]
    assert out["draws"] == 4
    assert out["verdict"].startswith("B did better than A on 5 problems and worse on 1 (2 ties; sign test p = 0.22)")


# --- the committed evaluation ------------------------------------------------------------------------


def scored_by_hand(policy: str, mode: str, labels: dict) -> dict[tuple[str, int], int]:
    """{(problem_id, draw): reward} read straight from the gzip file and scored by the verifier."""
    name = {"greedy": "predictions-greedy.jsonl.gz", "sample": "predictions-sample.jsonl.gz"}[mode]
    with gzip.open(EVAL / policy / name, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return {(r["problem_id"], r["draw"]): verifier.score(r["text"], r["finish_reason"], labels[r["problem_id"]]["problem"],
                                                         r["tokenization_valid"]).reward for r in rows}


def test_warm_start_against_grpo_on_the_committed_evaluation():
    labels = data.open_records("labels", "test", "scoring")
    by_id = {r["id"]: r for r in labels}
    a = {m: scored_by_hand("warm_start", m, by_id) for m in evaluate.MODES}
    b = {m: scored_by_hand("grpo", m, by_id) for m in evaluate.MODES}
    results = read_json(EVAL / "results.json")["policies"]
    outs = {s: paired.compare_policies(EVAL / "warm_start", EVAL / "grpo", labels, s) for s in paired.SUBSETS}
    for subset, out in outs.items():
        keep = paired.subset_ids(labels, subset)
        g = out["greedy"]
        keys = [k for k in a["greedy"] if k[0] in keep]
        assert g["n"] == len(keys) == (200 if subset == "ALL" else 100)
        assert g["gained"] == sum(1 for k in keys if b["greedy"][k] > a["greedy"][k])
        assert g["lost"] == sum(1 for k in keys if b["greedy"][k] < a["greedy"][k])
        assert g["a_correct"] == results["warm_start"]["greedy"][subset]["correct"]
        assert g["b_correct"] == results["grpo"]["greedy"][subset]["correct"]
        assert g["p"] == pytest.approx(two_sided_binomial_half(g["gained"], g["gained"] + g["lost"]), abs=1e-12)
        s = out["sample"]
        count = lambda scored, pid: sum(scored["sample"][(pid, d)] for d in range(4))  # noqa: E731
        diffs = [count(b, pid) - count(a, pid) for pid in sorted(keep)]
        assert (s["up"], s["down"], s["ties"]) == (sum(x > 0 for x in diffs), sum(x < 0 for x in diffs),
                                                   sum(x == 0 for x in diffs))
        assert s["a_rate"] * 4 * len(keep) == pytest.approx(results["warm_start"]["sample"][subset]["correct"])
        assert s["mean_difference"] == pytest.approx(sum(diffs) / 4 / len(keep), abs=1e-15)
    # The note's facts on the committed cache: greedy 124 -> 128 of 200, 10 gained and 6 lost, p = 0.45.
    g = outs["ALL"]["greedy"]
    assert (g["a_correct"], g["b_correct"], g["gained"], g["lost"]) == (124, 128, 10, 6)
    assert g["verdict"] == "grpo gained 10 problems and lost 6 against warm_start: not separable (exact McNemar p = 0.45)"
    assert outs["ALL"]["sample"]["p_permutation"] == paired.compare_policies(EVAL / "warm_start", EVAL / "grpo",
                                                                             labels)["sample"]["p_permutation"]


def test_subsets_are_the_populations():
    labels = [{"id": "a", "population": "ID50"}, {"id": "b", "population": "OOD100"}, {"id": "c", "population": "ID50"}]
    assert paired.subset_ids(labels, "ALL") == {"a", "b", "c"}
    assert paired.subset_ids(labels, "ID50") == {"a", "c"}
    assert paired.subset_ids(labels, "OOD100") == {"b"}
    assert paired.SUBSETS == evaluate.POPULATIONS
    with pytest.raises(ValueError, match="unknown subset 'id50'"):
        paired.subset_ids(labels, "id50")


def test_per_problem_transitions_are_counted_by_hand():
    rows_a = [{"problem_id": p, "reward": r} for p, r in (("p1", 1), ("p1", 0), ("p2", 0), ("p2", 0), ("p3", 1), ("p3", 1))]
    rows_b = [{"problem_id": p, "reward": r} for p, r in (("p1", 1), ("p1", 1), ("p2", 0), ("p2", 0), ("p3", 1), ("p3", 0))]
    a, b = paired.per_problem_successes(rows_a), paired.per_problem_successes(rows_b)
    assert a == {"p1": 1, "p2": 0, "p3": 2} and b == {"p1": 2, "p2": 0, "p3": 1}
    # rows: A's successes 0..2, columns: B's; p2 stays at 0, p1 goes 1 -> 2, p3 goes 2 -> 1
    assert paired.transition_counts(a, b, top=2) == [[1, 0, 0], [0, 0, 1], [0, 1, 0]]
    assert paired.changed_problems(a, b) == {"gained": ["p1"], "lost": ["p3"], "same": ["p2"]}
    with pytest.raises(ValueError, match="different problems"):
        paired.transition_counts(a, {"p1": 0}, top=2)
    with pytest.raises(ValueError, match="expected 0..1"):
        paired.transition_counts(a, b, top=1)


def test_compare_counts_matches_the_row_comparisons():
    a, b = [0, 1, 1, 0, 1], [1, 1, 0, 1, 1]  # greedy: gained problems 0 and 3, lost problem 2
    greedy = paired.compare_counts(a, b, 1)
    assert (greedy["gained"], greedy["lost"]) == (2, 1)
    assert greedy["p"] == pytest.approx(paired.mcnemar_exact(2, 1), abs=0) == 1.0
    draws = paired.compare_counts([0, 2, 4, 1], [1, 2, 3, 4], 4)
    assert (draws["up"], draws["down"], draws["ties"]) == (2, 1, 1)
    assert draws["mean_difference"] == pytest.approx((1 + 0 - 1 + 3) / 4 / 4, abs=1e-15)
    with pytest.raises(ValueError, match="one per problem"):
        paired.compare_counts([1], [1, 0], 1)
    start = {"problems": 4, "draws": 4, "greedy_correct": [0, 1, 1, 0], "draws_correct": [0, 2, 4, 1]}
    end = {"problems": 4, "draws": 4, "greedy_correct": [1, 1, 1, 1], "draws_correct": [1, 2, 3, 4]}
    both = paired.compare_checkpoints(start, end, ("start", "end"))
    assert both["greedy"]["gained"] == 2 and both["sample"]["up"] == 2


def test_a_monte_carlo_p_at_its_floor_is_reported_as_a_bound():
    floor = 2 / (paired.PERMUTATION_RESAMPLES + 1)
    assert paired.at_floor(floor, "monte carlo, 20000 sign flips") and not paired.at_floor(floor, "exact")
    assert not paired.at_floor(3 * floor, "monte carlo, 20000 sign flips")
    assert paired.format_p(floor, at_most=True) == "p <= 1.0e-4"
    # 40 problems all one draw better: no sign flip is as extreme as the observed sum
    result = paired.compare_counts([0] * 40, [1] * 40, 4)
    assert result["p_permutation_method"] != "exact" and "paired permutation p <= 1.0e-4" in result["verdict"]


def test_holms_adjustment_by_hand():
    from labkit.eval import paired

    # m = 4, sorted 0.01, 0.02, 0.03, 0.5: 4 x 0.01 = 0.04; 3 x 0.02 = 0.06; 2 x 0.03 = 0.06; 1 x 0.5 = 0.5
    assert paired.holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06], abs=1e-15)
    # 2 x 0.04 = 0.08, then 1 x 0.045 = 0.045, raised to 0.08: a larger p never adjusts below a smaller one
    assert paired.holm([0.04, 0.045]) == pytest.approx([0.08, 0.08], abs=1e-15)
    assert paired.holm([0.9, 0.8]) == [1.0, 1.0]
    assert paired.holm([0.4]) == [0.4] and paired.holm([0.5, 0.5, 0.5]) == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match=r"holm needs p-values in \[0, 1\]"):
        paired.holm([1.5])


def test_a_folder_is_scored_once_a_process_and_again_when_its_file_changes(tmp_path, monkeypatch):
    """compare_policies reads, checks and scores each folder's predictions once (the results page compares one
    policy with many); a predictions file written again is read again, and the comparison follows it."""
    import shutil

    labels = data.open_records("labels", "test", "scoring")
    for policy in ("warm_start", "grpo"):
        shutil.copytree(EVAL / policy, tmp_path / policy)
    calls = []
    original = evaluate.score_rows
    monkeypatch.setattr(evaluate, "score_rows", lambda rows, by_id: calls.append(1) or original(rows, by_id))
    first = paired.compare_policies(tmp_path / "warm_start", tmp_path / "grpo", labels)
    assert len(calls) == 4  # two folders x two modes
    assert paired.compare_policies(tmp_path / "warm_start", tmp_path / "grpo", labels, "ID50")["greedy"]["n"] == 100
    assert len(calls) == 4  # the same files: nothing read or scored again
    # grpo's greedy answers all made wrong: read again, and every problem it had right is lost
    path = tmp_path / "grpo" / evaluate.PREDICTION_FILES["greedy"]
    rows = evaluate.read_predictions(tmp_path / "grpo", "greedy")
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({**r, "text": "no answer"}) + "\n" for r in rows)
    again = paired.compare_policies(tmp_path / "warm_start", tmp_path / "grpo", labels)
    assert len(calls) == 5
    assert again["greedy"]["b_correct"] == 0 and again["greedy"]["lost"] == first["greedy"]["a_correct"]
    assert again["sample"] == first["sample"]
