"""Chapter 8's checker: it accepts p^G + (1-p)^G and names each usual slip, even where p = 1/2 (its
first case) makes all-right and all-wrong equally likely."""

import pytest

from labkit.book import exercises


def right(p, G):
    return p ** G + (1 - p) ** G


@pytest.mark.parametrize("wrong, message", [
    (lambda p, G: p ** G, "you counted only the all-right groups"),
    (lambda p, G: (1 - p) ** G, "you counted only the all-wrong groups"),
    (lambda p, G: 1 - right(p, G), "the chance of a group WITH signal"),
    (lambda p, G: p ** (G - 1) + (1 - p) ** (G - 1), r"the exponent is G"),
    (lambda p, G: 0.5, r"case 2 of 11: .*Hint: a group is constant when"),
    (lambda p, G: "half", r"returned 'half' \(str\); return a number"),
])
def test_names_the_slip(wrong, message):
    with pytest.raises(exercises.ExerciseError, match=message):
        exercises.check_ch08_zero_signal(wrong)


def test_accepts_the_right_formula(capsys):
    assert exercises.check_ch08_zero_signal(right) is True
    assert "all 11 cases" in capsys.readouterr().out
