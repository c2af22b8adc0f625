"""The chapters' generated verdicts: each wording follows from the numbers, exactly."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from labkit.book import narrative
from labkit.eval.evaluate import wilson_interval


def test_side_of_and_interval_verdicts():
    assert narrative.side_of(0.30, 0.25, "the curve", digits=2) == "above the curve by 0.05"
    assert narrative.side_of(0.25, 0.30, "the curve", digits=2) == "below the curve by 0.05"
    assert narrative.side_of(0.5, 0.5, "the curve") == "exactly on the curve"
    assert narrative.intervals_verdict(0.6, 0.7, 0.4, 0.5) == "above"
    assert narrative.intervals_verdict(0.1, 0.2, 0.4, 0.5) == "below"
    assert narrative.intervals_verdict(0.45, 0.7, 0.4, 0.5) == "overlaps"


def fisher_by_hand(k0: int, n0: int, k1: int, n1: int) -> float:
    """Two-sided Fisher exact p: the hypergeometric tables at most as likely as the observed one."""
    total, successes = n0 + n1, k0 + k1

    def prob(x):
        return Fraction(math.comb(successes, x) * math.comb(total - successes, n0 - x), math.comb(total, n0))

    support = range(max(0, successes - n1), min(successes, n0) + 1)
    return float(sum(prob(x) for x in support if prob(x) <= prob(k0) * Fraction(10 ** 7 + 1, 10 ** 7)))


def test_a_rate_moves_only_when_the_fisher_exact_test_rejects():
    assert narrative.change_verdict((10, 100), (60, 100)) == "rose"
    assert narrative.change_verdict((60, 100), (10, 100)) == "fell"
    # 50.6% [43.0, 58.3] -> 63.7% [56.1, 70.8]: the intervals overlap, yet the counts differ at p < 0.05.
    assert narrative.intervals_verdict(*wilson_interval(102, 160), *wilson_interval(81, 160)) == "overlaps"
    p = fisher_by_hand(81, 160, 102, 160)
    assert 0.02 < p < 0.05
    assert narrative.change_verdict((81, 160), (102, 160)) == "rose"
    assert narrative.count_change((81, 160), (102, 160), "the reward") == (
        f"the reward rose from 81/160 = 50.6% [43.0%, 58.3%] to 102/160 = 63.7% [56.1%, 70.8%] "
        f"(Fisher exact p = {p:.2g})")
    p = fisher_by_hand(198, 320, 201, 320)
    assert p > 0.05 and narrative.change_verdict((198, 320), (201, 320)) == "unchanged"
    assert narrative.count_change((198, 320), (201, 320), "it") == (
        f"it did not change measurably: 198/320 = 61.9% [56.4%, 67.0%], then 201/320 = 62.8% [57.4%, 67.9%] "
        f"(different rates, Fisher exact p = {p:.2g})")
    assert fisher_by_hand(3, 160, 3, 160) == 1.0
    assert narrative.count_change((3, 160), (3, 160), "the reward") == (
        "the reward did not change measurably: 3/160 = 1.9% [0.6%, 5.4%], then 3/160 = 1.9% [0.6%, 5.4%] "
        "(the same rate, Fisher exact p = 1)")
    assert narrative.count_change((44, 800), (318, 320), "x").endswith("(Fisher exact p < 1e-6)")


def test_signal_fraction_and_its_range():
    assert narrative.signal_fraction_range(0.5, 0.5, 4) == pytest.approx((1 - 2 / 16, 1 - 2 / 16))
    assert narrative.signal_fraction_range(0.0, 0.0, 4) == (0.0, 0.0)
    low, high = narrative.signal_fraction_range(0.4, 0.6, 4)
    assert high == pytest.approx(0.875) and low == pytest.approx(1 - 0.4 ** 4 - 0.6 ** 4)


def _row(rid, ids, lps, digest="d"):
    return {"rollout_id": rid, "response_ids": ids, "text": str(ids), "reward": 1.0, "logp_old": lps,
            "policy_digest": digest}


def test_a_rerun_is_compared_exactly_on_tokens_and_within_tolerance_on_logprobs():
    cached = [_row("a", [1, 2], [-0.1, -0.2]), _row("b", [3], [-0.3])]
    close = [_row("a", [1, 2], [-0.1 + 1.7e-6, -0.2]), _row("b", [3], [-0.3], digest="e")]
    report = narrative.compare_rollouts(close, cached, 2e-4)
    assert (report["exact_equal"], report["logprobs_within"], report["bitwise_equal"], report["digests_equal"]) == (2, 2, 0, 1)
    assert report["first_difference"] is None
    assert narrative.rerun_sentence(report, 2e-4).endswith("so their digests differ.")
    wrong = [_row("a", [1, 9], [-0.1, -0.2]), _row("b", [3], [-0.3])]
    report = narrative.compare_rollouts(wrong, cached, 2e-4)
    assert report["first_difference"] == ("a", ["response_ids", "text"])
    assert "does NOT reproduce" in narrative.rerun_sentence(report, 2e-4)


def _greedy_rows(successes):
    return [{"problem_id": f"p{k:03d}", "reward": int(x)} for k, x in enumerate(successes)]


def _sampled_rows(counts, draws=4):
    return [{"problem_id": f"p{k:03d}", "draw": d, "reward": int(d < c)} for k, c in enumerate(counts) for d in range(draws)]


@pytest.mark.parametrize("a, b", [
    ([0] * 30 + [1] * 10, [1] * 25 + [0] * 5 + [1] * 10),  # B gains 25, loses 0: ahead, significant
    ([1] * 25 + [0] * 5 + [1] * 10, [0] * 30 + [1] * 10),  # B behind, significant
    ([0, 1] * 20, [1, 0] * 3 + [0, 1] * 17),  # 3 gained, 3 lost: not separable
])
def test_paired_call_reads_the_direction_and_the_test(a, b):
    from labkit.eval import paired

    counts_a, counts_b = [4 * x for x in a], [min(4, 4 * x + (k % 2)) for k, x in enumerate(b)]
    names = ("warm_start", "rft")
    expected = {"greedy": paired.compare_greedy(_greedy_rows(a), _greedy_rows(b), names),
                "sample": paired.compare_sampled(_sampled_rows(counts_a), _sampled_rows(counts_b), 4, names)}
    for mode, key, gap in (("greedy", "p", expected["greedy"]["gained"] - expected["greedy"]["lost"]),
                           ("sample", "p_permutation", expected["sample"]["mean_difference"])):
        call = narrative.paired_call(expected, mode)
        if expected[mode][key] >= paired.ALPHA:
            assert call == "not separable" and "not separable" in expected[mode]["verdict"]
        else:
            assert call == ("ahead" if gap > 0 else "behind")
            assert f"rft {call}, significant at" in expected[mode]["verdict"]


def test_compare_named_names_the_two_sides():
    from labkit.eval import evaluate
    from labkit.lab.runs import REPO_ROOT

    root = REPO_ROOT / "runs" / "tiny" / "evaluation"
    labels = evaluate.load_test_labels(phase="scoring")
    named = narrative.compare_named(root / "warm_start", root / "grpo", labels, names=("the start", "the run"))
    plain = narrative.compare_named(root / "warm_start", root / "grpo", labels)
    assert named["greedy"]["verdict"].startswith("the run gained") and plain["greedy"]["verdict"].startswith("grpo gained")
    assert {k: v for k, v in named["sample"].items() if k != "verdict"} == \
        {k: v for k, v in plain["sample"].items() if k != "verdict"}


def test_unpaired_rates_are_told_apart_by_the_fisher_exact_test_only():
    assert narrative.unpaired_call((60, 100), (10, 100)) == "higher"
    assert narrative.unpaired_call((10, 100), (60, 100)) == "lower"
    assert narrative.unpaired_call((102, 160), (81, 160)) == "higher"  # intervals overlap, p = 0.02
    assert narrative.unpaired_call((201, 320), (198, 320)) == "not separable"
