"""The StockArithmetic-v1 verifier: parse and score a response, never execute it.

A response earns reward 1 only when all of these hold:

* it ended with EOS (`finish_reason == "eos"`), not at the token limit;
* every generated token id was one the tokenizer has (`tokenization_valid`);
* its text is at most 256 characters (surrounding whitespace included) and is
  exactly one complete JSON object, with only JSON whitespace (space, tab, LF,
  CR) around it;
* the object has exactly one field, `final_stock`, no field repeated and no
  NaN / Infinity anywhere;
* `final_stock` is a JSON integer (not a boolean, not a number written with a
  fraction or an exponent, not a string) in 0..300;
* and it equals the target the solver computes from the problem's structure.

Everything else is reward 0 with exactly one reason, the first that applies in
the order of `REASONS` (this order is part of the API: later chapters chart the
reasons, so a response always lands in the same bar):

    undecodable_id     a generated id the tokenizer does not have
    stopped_at_length  no EOS: the response hit the token limit
    oversized          more than 256 characters
    markdown_fence     not a single JSON value, and holds a ``` or ~~~ fence
    several_objects    two or more complete JSON values, at least one an object
    not_json           anything else that is not one JSON value
    not_object         one JSON value, but not an object
    duplicate_field    a field name repeated in some object
    non_finite         NaN, Infinity or -Infinity somewhere
    missing_field      no `final_stock` field
    extra_field        `final_stock` plus other fields
    boolean            `final_stock` is true or false
    float              `final_stock` has a fraction or an exponent (5.0, 5e0)
    string             `final_stock` is a string ("5")
    wrong_type         `final_stock` is null, a list or an object
    out_of_range       an integer outside 0..300
    wrong_value        a well-formed answer, but not the target

`valid` and `value` describe the text alone: `valid` is True when the text is a
schema-valid answer (the checks from `oversized` to `out_of_range` pass),
whatever the stop reason, the token ids or the target; `value` is then its
integer, else None.  So a correct JSON answer cut at the token limit is
`valid=True, value=43, reward=0, reason="stopped_at_length"`: JSON validity and
reward are reported separately, as chapter 7 does.

Nothing here runs generated text.  Parsing uses `json` with hooks that only
*record* a duplicate field or a non-finite constant (so the structure can be
classified first and the reason does not depend on where the parser stopped),
and keeps a number with a fraction or an exponent as its literal text, never
converted (so `1e400` is a float literal, not infinity, and an exponent of a
million digits cannot raise).  Any `str` returns a verdict; only programming
errors raise (`ValueError`): a text that is not a `str`, an unknown
`finish_reason`, a non-bool `tokenization_valid`, or a malformed problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .problems import TARGET_MAX, Problem, solve

MAX_CHARS = 256  # the whole response text, surrounding whitespace included
FIELD = "final_stock"
VALUE_MIN, VALUE_MAX = 0, TARGET_MAX
FINISH_REASONS = ("eos", "length")
JSON_WHITESPACE = " \t\n\r"  # RFC 8259 whitespace; other Unicode spaces are not JSON
FENCES = ("```", "~~~")

# The reasons, one constant each, in precedence order (see the module docstring).
UNDECODABLE_ID = "undecodable_id"
STOPPED_AT_LENGTH = "stopped_at_length"
OVERSIZED = "oversized"
MARKDOWN_FENCE = "markdown_fence"
SEVERAL_OBJECTS = "several_objects"
NOT_JSON = "not_json"
NOT_OBJECT = "not_object"
DUPLICATE_FIELD = "duplicate_field"
NON_FINITE = "non_finite"
MISSING_FIELD = "missing_field"
EXTRA_FIELD = "extra_field"
BOOLEAN = "boolean"
FLOAT = "float"
STRING = "string"
WRONG_TYPE = "wrong_type"
OUT_OF_RANGE = "out_of_range"
WRONG_VALUE = "wrong_value"

REASONS = (
    UNDECODABLE_ID,
    STOPPED_AT_LENGTH,
    OVERSIZED,
    MARKDOWN_FENCE,
    SEVERAL_OBJECTS,
    NOT_JSON,
    NOT_OBJECT,
    DUPLICATE_FIELD,
    NON_FINITE,
    MISSING_FIELD,
    EXTRA_FIELD,
    BOOLEAN,
    FLOAT,
    STRING,
    WRONG_TYPE,
    OUT_OF_RANGE,
    WRONG_VALUE,
)

# The reasons that come from the text alone (`parse_answer`); the others need
# the stop reason, the token ids or the target.
FORMAT_REASONS = REASONS[2:-1]

REASON_DESCRIPTIONS = {
    UNDECODABLE_ID: "a generated token id that the tokenizer does not have",
    STOPPED_AT_LENGTH: "no EOS: generation stopped at the token limit",
    OVERSIZED: f"longer than {MAX_CHARS} characters",
    MARKDOWN_FENCE: "wrapped in or mixed with a Markdown code fence",
    SEVERAL_OBJECTS: "two or more JSON values one after another, at least one an object",
    NOT_JSON: "not a single JSON value (prose, truncated or malformed JSON)",
    NOT_OBJECT: "one JSON value, but not an object",
    DUPLICATE_FIELD: "a field name repeated within one object",
    NON_FINITE: "contains NaN, Infinity or -Infinity",
    MISSING_FIELD: f"the object has no '{FIELD}' field",
    EXTRA_FIELD: f"the object has fields other than '{FIELD}'",
    BOOLEAN: f"'{FIELD}' is a boolean",
    FLOAT: f"'{FIELD}' is written with a fraction or an exponent",
    STRING: f"'{FIELD}' is a string",
    WRONG_TYPE: f"'{FIELD}' is null, a list or an object",
    OUT_OF_RANGE: f"'{FIELD}' is an integer outside {VALUE_MIN}..{VALUE_MAX}",
    WRONG_VALUE: "a well-formed answer with the wrong final stock",
}


@dataclass(frozen=True)
class Verdict:
    """The verifier's result for one response.

    reward: 1 for a complete, valid, correct response, else 0.
    valid:  the text is a schema-valid answer (regardless of EOS, ids, target).
    value:  the answer's integer when `valid`, else None.
    reason: None when reward is 1, else one of `REASONS`.
    """

    reward: int
    valid: bool
    value: int | None
    reason: str | None


@dataclass(frozen=True)
class ParsedAnswer:
    """What the text alone says: `valid`, its `value`, or the format `reason` it fails."""

    valid: bool
    value: int | None
    reason: str | None


@dataclass(frozen=True)
class _FloatLiteral:
    """A JSON number written with a fraction or an exponent, kept as its text.

    Converting it (float or Decimal) could give inf or raise on a huge
    exponent; the schema only needs to know that it is not an integer.
    """

    text: str


class _Recorder:
    """Hooks for `json.JSONDecoder` that note duplicates and NaN/Infinity instead of raising.

    Raising from a hook would stop the parser at the first problem, and the
    reason would then depend on parse order (`{"a":1,"a":2} {...}` would read as
    a duplicate, not as several objects).  Recording keeps the precedence fixed.
    """

    def __init__(self) -> None:
        self.duplicate_field = False
        self.non_finite = False

    def object_pairs(self, pairs: list[tuple[str, object]]) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            self.duplicate_field = True
        return obj

    def constant(self, name: str) -> float:
        # name is "NaN", "Infinity" or "-Infinity"; the value only needs to be a non-int.
        self.non_finite = True
        return float(name)


def _decode_values(text: str) -> tuple[list, _Recorder] | None:
    """Decode `text` as whitespace-separated complete JSON values.

    Returns (values, recorder), or None when some part is not a complete JSON
    value.  Never raises on a str: the decoder's ValueError (which also covers
    int-conversion limits), RecursionError on deep nesting and OverflowError
    all mean "not JSON" here.  (Integers are converted by `int`, whose digit
    limit a text of at most MAX_CHARS characters cannot reach.)
    """
    recorder = _Recorder()
    decoder = json.JSONDecoder(
        object_pairs_hook=recorder.object_pairs,
        parse_constant=recorder.constant,
        parse_float=_FloatLiteral,  # 1.0, 1e400, 0.4e0066999...: float literals, never converted
    )
    values, index, end = [], 0, len(text)
    while True:
        while index < end and text[index] in JSON_WHITESPACE:
            index += 1
        if index == end:
            break
        try:
            value, index = decoder.raw_decode(text, index)
        except (ValueError, RecursionError, OverflowError):
            return None
        values.append(value)
    return values, recorder


def _value_reason(value: object) -> str | None:
    """The reason a `final_stock` value fails the schema, or None if it is a valid integer."""
    if isinstance(value, bool):  # before int: True is an int in Python
        return BOOLEAN
    if isinstance(value, int):
        return None if VALUE_MIN <= value <= VALUE_MAX else OUT_OF_RANGE
    if isinstance(value, _FloatLiteral):
        return FLOAT
    if isinstance(value, str):
        return STRING
    return WRONG_TYPE  # None, list or dict


def parse_answer(text: str) -> ParsedAnswer:
    """Check the text alone against the answer schema; never raises on a str.

    The reason is the first of `FORMAT_REASONS` that applies.  Raises
    ValueError only if `text` is not a str (a programming error).
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        return ParsedAnswer(False, None, OVERSIZED)
    decoded = _decode_values(text)
    if decoded is None or len(decoded[0]) != 1:
        if any(fence in text for fence in FENCES):
            reason = MARKDOWN_FENCE
        elif decoded is not None and len(decoded[0]) > 1 and any(isinstance(v, dict) for v in decoded[0]):
            reason = SEVERAL_OBJECTS
        else:
            reason = NOT_JSON  # includes empty or whitespace-only text
        return ParsedAnswer(False, None, reason)
    (obj,), recorder = decoded
    if not isinstance(obj, dict):
        reason = NOT_OBJECT
    elif recorder.duplicate_field:
        reason = DUPLICATE_FIELD
    elif recorder.non_finite:
        reason = NON_FINITE
    elif FIELD not in obj:
        reason = MISSING_FIELD
    elif len(obj) > 1:
        reason = EXTRA_FIELD
    else:
        reason = _value_reason(obj[FIELD])
    if reason is not None:
        return ParsedAnswer(False, None, reason)
    return ParsedAnswer(True, obj[FIELD], None)


def _as_problem(problem: Problem | dict) -> Problem:
    """A validated Problem from a Problem or a dict; ValueError if malformed."""
    try:
        if isinstance(problem, Problem):
            return problem.validated()
        return Problem.from_dict(problem)
    except TypeError as err:  # e.g. deliveries given as an int: tuple(5)
        raise ValueError(f"malformed problem {problem!r}: {err}") from err


def score(text: str, finish_reason: str, problem: Problem | dict, tokenization_valid: bool = True) -> Verdict:
    """Score one response against one problem.

    text:               the decoded response (EOS removed, other specials kept).
    finish_reason:      "eos" if generation emitted EOS, "length" if it hit the limit.
    problem:            a `Problem` or a dict {initial, deliveries, withdrawals};
                        the target comes from `task.solve`, never from the text.
    tokenization_valid: False if any generated id is not in the tokenizer.

    Returns a `Verdict`.  Never raises on any str `text`; raises ValueError on
    programming errors (non-str text, unknown finish_reason, non-bool
    tokenization_valid, malformed problem).
    """
    if not isinstance(finish_reason, str) or finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {finish_reason!r}")
    if not isinstance(tokenization_valid, bool):
        raise ValueError(f"tokenization_valid must be a bool, got {tokenization_valid!r}")
    target = solve(_as_problem(problem))
    parsed = parse_answer(text)
    if not tokenization_valid:
        reason = UNDECODABLE_ID
    elif finish_reason != "eos":
        reason = STOPPED_AT_LENGTH
    elif not parsed.valid:
        reason = parsed.reason
    elif parsed.value != target:
        reason = WRONG_VALUE
    else:
        reason = None
    return Verdict(reward=int(reason is None), valid=parsed.valid, value=parsed.value, reason=reason)
