"""Chapter 1, the verifier: `check_ch01_is_valid_answer` grades `is_valid_answer(text) -> bool`."""

from __future__ import annotations

from ._calling import ExerciseError, call_student, require_function


# Responses the chapter 1 checker tries, in order: the easy ones first, then the
# traps a plain `json.loads` falls into.  The expected answer comes from
# `labkit.task.verifier.parse_answer`, never from this list.
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
    "[" * 100_000,  # oversized and nested past Python's recursion limit: the length comes first
)
CH01_DEEP = ("check the length before parsing: 100,000 nested brackets make json.loads recurse past Python's "
             "limit (RecursionError), and the 256-character rule refuses the text without reading it")

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
    (what `labkit.task.verifier.parse_answer(text).valid` says), return a bool, and
    never raise on any string.
    """
    from ...task.verifier import REASON_DESCRIPTIONS, parse_answer

    require_function(is_valid_answer)
    total = len(CH01_RESPONSES)
    for number, text in enumerate(CH01_RESPONSES, start=1):
        expected = parse_answer(text)
        where = f"case {number} of {total}: is_valid_answer({text[:60]!r}{'...' if len(text) > 60 else ''})"
        deep = len(text) > 10_000
        got = call_student(is_valid_answer, text, where=where, not_written="is_valid_answer",
                           hint=f". Hint: {CH01_DEEP}." if deep else ". A verifier must answer for every string; "
                                                                      "catch the parser's errors and return False.")
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
    print(f"Correct: your is_valid_answer agrees with labkit.task.verifier on all {total} responses.")
    return True
