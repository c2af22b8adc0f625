"""Predict, then run: compare a student's prediction with what the committed runs measured.

A chapter asks a question, the student writes `prediction = ...` in one cell (a number or one of
a few choices), then runs the next cell, which loads the committed runs, measures the answer and
calls `check_prediction`.  A wrong prediction is not an error: the checker prints both, the gap
and why the runs came out as they did.  Only a prediction that cannot be compared (left empty, not
a number, not one of the choices, a percentage where a share is asked) raises ExerciseError with
the slip named.
"""

from __future__ import annotations

import math

from ._calling import ExerciseError


def _number(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1 else f"{x:,.4g}"


def require_prediction(prediction, *, choices: tuple | None = None, share: bool = False, low: float | None = None,
                       high: float | None = None) -> None:
    """Refuse, before anything is measured or shown, a prediction that cannot be compared: empty, not one of
    `choices`, not a number, a percentage where a share is asked, outside [low, high]."""
    if prediction is None or prediction is Ellipsis:
        wanted = f"one of {list(choices)}" if choices is not None else "a number"
        raise ExerciseError(f"prediction is still empty: set `prediction` to {wanted} in the prediction cell "
                            "and run it, then run the cell that answers")
    if choices is not None:
        if prediction not in choices:
            raise ExerciseError(f"prediction {prediction!r} is not one of the choices {list(choices)}: copy one of "
                                "them exactly")
        return
    if isinstance(prediction, bool) or not isinstance(prediction, (int, float)) or not math.isfinite(prediction):
        raise ExerciseError(f"prediction {prediction!r} is not a number: write a number such as "
                            f"{_number(0.3 if share else 2.0)}, without quotes")
    if share and 1 < prediction <= 100:
        raise ExerciseError(f"prediction {prediction} looks like a percentage: write a share as a fraction "
                            f"({prediction / 100:g} for {prediction:g}%)")
    if (low is not None and prediction < low) or (high is not None and prediction > high):
        raise ExerciseError(f"prediction {prediction} is outside [{low}, {high}], the range this quantity can take")


def check_prediction(prediction, measured, *, why: str, choices: tuple | None = None,
                     tolerance: float | None = None, low: float | None = None, high: float | None = None,
                     share: bool = False) -> dict:
    """Print the prediction beside the measurement and `why`; return {"prediction", "measured", "right"}.

    choices: the allowed answers (the prediction must be one of them; right when equal to `measured`);
    otherwise a number, right when within `tolerance` of `measured`, and refused outside [low, high].
    share: the number is a share in [0, 1]; a value in (1, 100] is refused as a percentage."""
    require_prediction(prediction, choices=choices, share=share, low=low, high=high)
    if choices is not None:
        right = prediction == measured
        print(f"Your prediction: {prediction}.  The runs: {measured}.  "
              + ("Right." if right else "Not this time."))
    else:
        if tolerance is None or not tolerance >= 0:
            raise ValueError(f"a number's prediction needs a tolerance >= 0, got {tolerance!r}")
        gap = prediction - measured
        right = abs(gap) <= tolerance
        print(f"Your prediction: {_number(prediction)}.  Measured: {_number(measured)} (your gap {gap:+.3g}; "
              f"within {_number(tolerance)} counts as right): " + ("right." if right else "not this time."))
    print("Why: " + why)
    return {"prediction": prediction, "measured": measured, "right": right}
