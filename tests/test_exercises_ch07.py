"""The chapter 7 checker: it accepts the unbiased pass@k and names each common slip."""

import math

import pytest

from labkit.eval import evaluate
from labkit.book import exercises


def unbiased(n, c, k):
    return 1 - math.comb(n - c, k) / math.comb(n, k)


def test_accepts_the_unbiased_estimator(capsys):
    assert exercises.check_ch07_pass_at_k(unbiased) is True
    assert "all 14 cases" in capsys.readouterr().out


def test_accepts_the_product_form_of_chen_et_al():
    product_form = evaluate.pass_at_k  # the lab's own: Chen et al.'s numerically stable product

    assert exercises.check_ch07_pass_at_k(product_form) is True


@pytest.mark.parametrize("wrong, message", [
    (lambda n, c, k: 1 - (1 - c / n) ** k, "plug-in estimate"),
    (lambda n, c, k: c / n, "per-draw success"),
    (lambda n, c, k: float(c > 0), "best-of-n"),
    (lambda n, c, k: math.comb(n - c, k) / math.comb(n, k), "is 1 minus it"),
    (lambda n, c, k: 1 - math.comb(n - c, k) / math.comb(n, k - 1), r"1 - C\(n-c, k\) / C\(n, k\)"),
])
def test_rejects_common_slips_with_a_hint(wrong, message):
    with pytest.raises(exercises.ExerciseError, match=message):
        exercises.check_ch07_pass_at_k(wrong)


def test_reports_a_crash_at_the_edge_and_a_non_number():
    def crashes_when_every_draw_holds_a_correct_one(n, c, k):
        if n - c < k:
            raise ZeroDivisionError("no way to draw k wrong samples")
        return unbiased(n, c, k)

    with pytest.raises(exercises.ExerciseError, match=r"n=4, c=1, k=4\) raised ZeroDivisionError.*pass@k is 1"):
        exercises.check_ch07_pass_at_k(crashes_when_every_draw_holds_a_correct_one)
    with pytest.raises(exercises.ExerciseError, match="return a number"):
        exercises.check_ch07_pass_at_k(lambda n, c, k: [c / n])
