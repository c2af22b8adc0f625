"""Exercise checkers: one per chapter, in chapter order.

Each checker takes the student's function or answer, compares it with the
lab's own, and raises `ExerciseError` with a message that says what is wrong
(the input, what was expected, what came back).  On success it prints a short
confirmation and returns True.
"""

from __future__ import annotations


class ExerciseError(AssertionError):
    """The student's answer is wrong; the message says how."""


# ---------------------------------------------------------------- chapter 1

# Responses the chapter 1 checker tries, in order: the easy ones first, then the
# traps a plain `json.loads` falls into.  The expected answer comes from
# `labkit.verifier.parse_answer`, never from this list.
CH01_RESPONSES = (
    '{"final_stock": 43}',
    ' {"final_stock":43}\n',
    "The final stock is 43.",
    '{"final_stock": "43"}',
    '{"final_stock": 43.0}',
    '{"final_stock": 301}',
    '{"final_stock": -1}',
    '{"final_stock": 0}',
    '{"final_stock": 300}',
    '{"stock": 43}',
    '{"final_stock": 43, "unit": "boxes"}',
    "[43]",
    '{"final_stock": true}',
    '{"final_stock": false}',
    '{"final_stock": 43, "final_stock": 43}',
    '{"final_stock": NaN}',
    '{"final_stock": Infinity}',
    '{"final_stock": 1e400}',
    '{"final_stock": null}',
    '```json\n{"final_stock": 43}\n```',
    '{"final_stock": 43}\n{"final_stock": 43}',
    '{"final_stock": 43} is my answer',
    '{"final_stock": 43}' + " " * 237,  # 256 characters: still allowed
    '{"final_stock": 43}' + " " * 238,  # 257 characters: oversized
    "",
    "\x00",
    "[" * 200,
)

CH01_HINTS = {
    "boolean": "in Python `True` is an int (isinstance(True, int) is True): test `type(v) is int`",
    "duplicate_field": "json.loads keeps the last of two equal keys silently: pass object_pairs_hook",
    "non_finite": "json.loads accepts NaN and Infinity unless you pass parse_constant",
    "float": "1e400 and 43.0 are JSON numbers with an exponent or a fraction, not integers",
    "oversized": "the limit is on the whole text: at most 256 characters",
    "several_objects": "a second object after the first is not one answer",
    "markdown_fence": "a code fence around the JSON is not a bare JSON object",
    "extra_field": "exactly one field: no other keys",
    "missing_field": "the field must be named exactly final_stock",
    "out_of_range": "the integer must lie in 0..300, both ends included",
    "not_json": "a response that is not one JSON value must return False, not raise",
}


def check_ch01_is_valid_answer(is_valid_answer) -> bool:
    """Grade chapter 1's exercise: `is_valid_answer(text) -> bool`.

    It must return True exactly when `text` alone is a schema-valid answer
    (what `labkit.verifier.parse_answer(text).valid` says), return a bool, and
    never raise on any string.
    """
    from .verifier import REASON_DESCRIPTIONS, parse_answer

    if not callable(is_valid_answer):
        raise ExerciseError(f"pass your function itself, not {type(is_valid_answer).__name__}")
    total = len(CH01_RESPONSES)
    for number, text in enumerate(CH01_RESPONSES, start=1):
        expected = parse_answer(text)
        where = f"case {number} of {total}: is_valid_answer({text[:60]!r}{'...' if len(text) > 60 else ''})"
        try:
            got = is_valid_answer(text)
        except NotImplementedError as err:
            raise ExerciseError(f"is_valid_answer is not written yet ({err})") from None
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(
                f"{where} raised {type(err).__name__}: {err}. A verifier must answer for every "
                "string; catch the parser's errors and return False."
            ) from None
        if type(got) is not bool:
            raise ExerciseError(f"{where} returned {got!r} ({type(got).__name__}); return True or False.")
        if got != expected.valid:
            if expected.valid:
                why = f"it is a valid answer (value {expected.value}); you returned False"
                hint = "surrounding whitespace (space, tab, newline) is allowed, and 0 and 300 are in range"
            else:
                why = (f"it is invalid ({expected.reason}: {REASON_DESCRIPTIONS[expected.reason]}); "
                       "you returned True")
                hint = CH01_HINTS.get(expected.reason, "compare with the rules of section 1.4")
            raise ExerciseError(f"{where}: {why}. Hint: {hint}.")
    print(f"Correct: your is_valid_answer agrees with labkit.verifier on all {total} responses.")
    return True


# ---------------------------------------------------------------- chapter 8

# (p, G) pairs the chapter 8 checker tries: easy ones first, then the edges.
CH08_CASES = ((0.5, 2), (0.1, 4), (0.1, 2), (0.1, 8), (0.25, 3), (0.02, 16), (0.9, 5), (0.0, 4), (1.0, 4),
              (0.3, 1), (0.015, 8))


def check_ch08_zero_signal(zero_signal_fraction) -> bool:
    """Grade chapter 8's exercise: `zero_signal_fraction(p, G) -> float`.

    The chance that a group of G independent rewards, each 1 with probability p, is
    constant (all right or all wrong), so its advantages are all zero: p^G + (1-p)^G.
    Compared with `labkit.group_size.zero_signal_fraction` within 1e-12.
    """
    from .group_size import zero_signal_fraction as reference

    if not callable(zero_signal_fraction):
        raise ExerciseError(f"pass your function itself, not {type(zero_signal_fraction).__name__}")
    for number, (p, G) in enumerate(CH08_CASES, start=1):
        where = f"case {number} of {len(CH08_CASES)}: zero_signal_fraction(p={p}, G={G})"
        try:
            got = zero_signal_fraction(p, G)
        except NotImplementedError as err:
            raise ExerciseError(f"zero_signal_fraction is not written yet ({err})") from None
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(f"{where} raised {type(err).__name__}: {err}") from None
        try:
            value = float(got)
        except (TypeError, ValueError):
            raise ExerciseError(f"{where} returned {got!r}; return a number (a probability)") from None
        expected = reference(p, G)
        if abs(value - expected) <= 1e-12:
            continue
        if abs(value - p ** G) <= 1e-12:
            hint = "you counted only the all-right groups; an all-wrong group has zero variance too"
        elif abs(value - (1 - p) ** G) <= 1e-12:
            hint = "you counted only the all-wrong groups; an all-right group has zero variance too"
        elif abs(value - (1 - expected)) <= 1e-12:
            hint = "that is the chance of a group WITH signal; the question asks for the zero-signal fraction"
        elif G > 1 and abs(value - (p ** (G - 1) + (1 - p) ** (G - 1))) <= 1e-12:
            hint = "the exponent is G, the number of responses in the group (not G - 1)"
        else:
            hint = "a group is constant when all G rewards are 1 (probability p^G) or all are 0"
        raise ExerciseError(f"{where} returned {value!r}, expected {expected!r}. Hint: {hint}.")
    print(f"Correct: your zero_signal_fraction agrees with p^G + (1-p)^G on all {len(CH08_CASES)} cases.")
    return True
