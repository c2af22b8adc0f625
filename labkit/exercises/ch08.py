"""Chapter 8, group size: `check_ch08_zero_signal` grades the chance that a group carries no signal."""

from __future__ import annotations

from ._calling import ExerciseError, call_student, require_function


# (p, G) pairs the chapter 8 checker tries: easy ones first, then the edges.
CH08_CASES = ((0.5, 2), (0.1, 4), (0.1, 2), (0.1, 8), (0.25, 3), (0.02, 16), (0.9, 5), (0.0, 4), (1.0, 4),
              (0.3, 1), (0.015, 8))


def check_ch08_zero_signal(zero_signal_fraction) -> bool:
    """Grade chapter 8's exercise: `zero_signal_fraction(p, G) -> float`.

    The chance that a group of G independent rewards, each 1 with probability p, is
    constant (all right or all wrong), so its advantages are all zero: p^G + (1-p)^G.
    Compared with `labkit.group_size.zero_signal_fraction` within 1e-12.
    """
    from ..group_size import zero_signal_fraction as reference

    require_function(zero_signal_fraction)
    values = []
    for number, (p, G) in enumerate(CH08_CASES, start=1):
        where = f"case {number} of {len(CH08_CASES)}: zero_signal_fraction(p={p}, G={G})"
        got = call_student(zero_signal_fraction, p, G, where=where, not_written="zero_signal_fraction")
        try:
            values.append(float(got))
        except (TypeError, ValueError):
            raise ExerciseError(f"{where} returned {got!r}; return a number (a probability)") from None
    # The usual slips, each a formula; a hint names the one the answer follows on EVERY case (at p = 1/2
    # all right and all wrong are equally likely, so one case alone cannot tell them apart).
    slips = (
        (lambda p, G: p ** G, "you counted only the all-right groups; an all-wrong group has zero variance too"),
        (lambda p, G: (1 - p) ** G, "you counted only the all-wrong groups; an all-right group has zero variance too"),
        (lambda p, G: 1 - reference(p, G),
         "that is the chance of a group WITH signal; the question asks for the zero-signal fraction"),
        (lambda p, G: p ** (G - 1) + (1 - p) ** (G - 1),
         "the exponent is G, the number of responses in the group (not G - 1)"),
    )
    for number, ((p, G), value) in enumerate(zip(CH08_CASES, values), start=1):
        expected = reference(p, G)
        if abs(value - expected) <= 1e-12:
            continue
        hint = next((text for formula, text in slips
                     if all(abs(v - formula(q, g)) <= 1e-12 for (q, g), v in zip(CH08_CASES, values))),
                    "a group is constant when all G rewards are 1 (probability p^G) or all are 0")
        where = f"case {number} of {len(CH08_CASES)}: zero_signal_fraction(p={p}, G={G})"
        raise ExerciseError(f"{where} returned {value!r}, expected {expected!r}. Hint: {hint}.")
    print(f"Correct: your zero_signal_fraction agrees with p^G + (1-p)^G on all {len(CH08_CASES)} cases.")
    return True
