"""The chapters' generated verdicts: each wording follows from the numbers, exactly."""

from __future__ import annotations

import pytest

from labkit import narrative


def test_side_of_and_interval_verdicts():
    assert narrative.side_of(0.30, 0.25, "the curve", digits=2) == "above the curve by 0.05"
    assert narrative.side_of(0.25, 0.30, "the curve", digits=2) == "below the curve by 0.05"
    assert narrative.side_of(0.5, 0.5, "the curve") == "exactly on the curve"
    assert narrative.intervals_verdict(0.6, 0.7, 0.4, 0.5) == "above"
    assert narrative.intervals_verdict(0.1, 0.2, 0.4, 0.5) == "below"
    assert narrative.intervals_verdict(0.45, 0.7, 0.4, 0.5) == "overlaps"


def test_a_rate_rises_only_when_the_intervals_separate():
    assert narrative.change_verdict((10, 100), (60, 100)) == "rose"
    assert narrative.change_verdict((60, 100), (10, 100)) == "fell"
    assert narrative.change_verdict((81, 160), (102, 160)) == "unchanged"  # 50.6% -> 63.7%: intervals overlap
    text = narrative.count_change((3, 160), (3, 160), "the reward")
    assert text.startswith("the reward did not change measurably") and text.endswith("(the same rate)")


def test_signal_fraction_and_its_range():
    assert narrative.signal_fraction(0.5, 4) == pytest.approx(1 - 2 / 16)
    assert narrative.signal_fraction(0.0, 4) == 0.0
    low, high = narrative.signal_fraction_range(0.4, 0.6, 4)
    assert high == pytest.approx(0.875) and low == pytest.approx(1 - 0.4 ** 4 - 0.6 ** 4)


def _row(rid, ids, lps, digest="d"):
    return {"rollout_id": rid, "response_ids": ids, "text": str(ids), "reward": 1.0, "old_logprobs": lps,
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
