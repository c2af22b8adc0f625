"""Predict, then run: a wrong prediction is compared and explained, a malformed one is refused with the slip named."""

import pytest

from labkit.book.exercises import ExerciseError, check_prediction


def test_a_number_is_compared_within_its_tolerance(capsys):
    out = check_prediction(0.30, 0.27, tolerance=0.05, share=True, why="because.")
    assert out == {"prediction": 0.30, "measured": 0.27, "right": True}
    assert "Measured: 0.27 (your gap +0.03; within 0.05 counts as right): right." in capsys.readouterr().out
    out = check_prediction(0.60, 0.27, tolerance=0.05, share=True, why="because.")
    assert out["right"] is False
    text = capsys.readouterr().out
    assert "your gap +0.33" in text and "not this time." in text and "Why: because." in text


def test_a_choice_is_right_only_when_it_is_the_runs_answer(capsys):
    assert check_prediction("halves", "halves", choices=("stays", "halves", "quarters"), why="1/sqrt(N).")["right"]
    assert not check_prediction("quarters", "halves", choices=("stays", "halves", "quarters"), why=".")["right"]
    assert "The runs: halves.  Not this time." in capsys.readouterr().out


@pytest.mark.parametrize("prediction, kwargs, message", [
    (None, {"tolerance": 0.1}, "prediction is still empty: set `prediction` to a number"),
    (..., {"choices": ("a", "b")}, r"still empty: set `prediction` to one of \['a', 'b'\]"),
    ("0.3", {"tolerance": 0.1, "share": True}, r"prediction '0.3' is not a number: write a number such as 0.3"),
    (True, {"tolerance": 0.1}, "prediction True is not a number"),
    (float("nan"), {"tolerance": 0.1}, "prediction nan is not a number"),
    (30, {"tolerance": 0.1, "share": True}, r"looks like a percentage: write a share as a fraction \(0.3 for 30%\)"),
    (-0.2, {"tolerance": 0.1, "low": 0.0, "high": 1.0}, r"outside \[0.0, 1.0\]"),
    ("c", {"choices": ("a", "b")}, r"prediction 'c' is not one of the choices \['a', 'b'\]"),
])
def test_a_prediction_that_cannot_be_compared_names_the_slip(prediction, kwargs, message):
    with pytest.raises(ExerciseError, match=message):
        check_prediction(prediction, 0.5 if "choices" not in kwargs else "a", why=".", **kwargs)


@pytest.mark.parametrize("reveal, wrong", [("reveal_identity", "half"), ("reveal_baseline", "group mean!"),
                                           ("reveal_clip", "Better"), ("reveal_leash", 0.5), ("reveal_seeds", "1.5"),
                                           ("reveal_separable", 4), ("reveal_split", 30), ("reveal_rare_zero", None),
                                           ("reveal_where_rl_works", "Worse")])
def test_a_mistyped_or_empty_prediction_is_refused_before_anything_is_shown(capsys, reveal, wrong):
    """Issue 57: a mistyped choice used to print the whole answer before its error."""
    from labkit.book import exercises

    function = getattr(exercises, reveal)
    more = ("advantage",) if reveal == "reveal_where_rl_works" else ()  # its chapter's family
    with pytest.raises(exercises.ExerciseError, match="prediction"):
        exercises.require_prediction_for(wrong, function)  # the prediction cell's own check
    with pytest.raises(exercises.ExerciseError, match="prediction"):
        function(wrong, *more)
    assert capsys.readouterr().out == ""  # nothing of the answer was printed


def test_every_reveal_says_what_it_expects():
    from labkit.book.exercises import reveal

    reveals = {name for name in dir(reveal) if name.startswith("reveal_")}
    assert set(reveal.EXPECTED) == reveals


def _row(think_d, think_beyond, right_d=0.0, right_beyond=False):
    return {"think_beyond_seeds": think_beyond, "accuracy_beyond_seeds": right_beyond,
            "against": {"worked_grpo": {"think_difference": think_d, "accuracy_difference": right_d}}}


@pytest.mark.parametrize("row, what, expected", [
    (_row(-0.30, True), "think", "worse"), (_row(+0.05, True), "think", "better"),
    (_row(-0.30, False), "think", "not separable"),  # a large difference that one seed matches is not the setting's
    (_row(-0.30, True, +0.02, False), "accuracy", "not separable"), (_row(0.0, False, +0.04, True), "accuracy", "better")])
def test_where_rl_works_counts_a_change_only_beyond_every_seed(row, what, expected):
    from labkit.book.exercises.reveal import where_rl_works_outcome

    assert where_rl_works_outcome(row, what) == expected


def test_where_rl_works_asks_each_chapters_piece_of_a_run_the_sweep_plans():
    from labkit.book.exercises.reveal import WHERE_RL_WORKS
    from labkit.studies import reasoning_sweep

    assert set(WHERE_RL_WORKS) == set(reasoning_sweep.FAMILIES) - {"seeds", "controls"}
    for family, (run, what, _) in WHERE_RL_WORKS.items():
        assert run in reasoning_sweep.FAMILIES[family] and what in ("think", "accuracy")
