"""The verifier: every reason constructed, precedence, hostile text, properties.

The problem used by the fixtures is train-0000: 1 + 27 + 43 - 18 - 10 = 43.
"""

from __future__ import annotations

import json
import math
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labkit.task import verifier
from labkit.lab.runs import REPO_ROOT
from labkit.task.problems import Problem, solve
from labkit.task.verifier import REASON_DESCRIPTIONS, REASONS, Verdict, parse_answer, score

PROBLEM = {"initial": 1, "deliveries": [27, 43], "withdrawals": [18, 10]}
TARGET = 43
RIGHT = '{"final_stock": 43}'

# Property tests are derandomized so that CI sees the same examples every run.
PROPERTY = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def correct(value: int) -> Verdict:
    return Verdict(reward=1, valid=True, value=value, reason=None)


def rejected(reason: str, valid: bool = False, value: int | None = None) -> Verdict:
    return Verdict(reward=0, valid=valid, value=value, reason=reason)


# (text, finish_reason, tokenization_valid, expected verdict); each reason at least once.
FIXTURES = {
    "plain": (RIGHT, "eos", True, correct(43)),
    "compact": ('{"final_stock":43}', "eos", True, correct(43)),
    "surrounding JSON whitespace": (' \t\n{ "final_stock" :\r\n43 }\n\n', "eos", True, correct(43)),
    "negative zero is the integer 0": ('{"final_stock": -0}', "eos", True, rejected("wrong_value", True, 0)),
    "escaped key is the same JSON field": ('{"final\\u005fstock": 43}', "eos", True, correct(43)),
    "undecodable id": (RIGHT, "eos", False, rejected("undecodable_id", True, 43)),
    "undecodable id beats length": (RIGHT, "length", False, rejected("undecodable_id", True, 43)),
    "correct JSON but no EOS": (RIGHT, "length", True, rejected("stopped_at_length", True, 43)),
    "truncated at the limit": ('{"final_sto', "length", True, rejected("stopped_at_length")),
    "oversized": (RIGHT + " " * (257 - len(RIGHT)), "eos", True, rejected("oversized")),
    "markdown fence": ('```json\n{"final_stock": 43}\n```', "eos", True, rejected("markdown_fence")),
    "tilde fence": ('~~~\n{"final_stock": 43}\n~~~', "eos", True, rejected("markdown_fence")),
    "two objects, one correct": ('{"final_stock": 43}\n{"final_stock": 7}', "eos", True, rejected("several_objects")),
    "two identical objects": ('{"final_stock": 43}{"final_stock": 43}', "eos", True, rejected("several_objects")),
    "object then number": ('{"final_stock": 43} 43', "eos", True, rejected("several_objects")),
    "prose": ("The final stock is 43.", "eos", True, rejected("not_json")),
    "prose before JSON": ('Answer: {"final_stock": 43}', "eos", True, rejected("not_json")),
    "prose after JSON": ('{"final_stock": 43} because 1+27+43-18-10=43', "eos", True, rejected("not_json")),
    "empty": ("", "eos", True, rejected("not_json")),
    "whitespace only": (" \n\t", "eos", True, rejected("not_json")),
    "two numbers": ("43 43", "eos", True, rejected("not_json")),
    "truncated object": ('{"final_stock": 4', "eos", True, rejected("not_json")),
    "single quotes": ("{'final_stock': 43}", "eos", True, rejected("not_json")),
    "unquoted key": ("{final_stock: 43}", "eos", True, rejected("not_json")),
    "trailing comma": ('{"final_stock": 43,}', "eos", True, rejected("not_json")),
    "leading zero": ('{"final_stock": 043}', "eos", True, rejected("not_json")),
    "plus sign": ('{"final_stock": +43}', "eos", True, rejected("not_json")),
    "hexadecimal": ('{"final_stock": 0x2b}', "eos", True, rejected("not_json")),
    "Python literal True": ('{"final_stock": True}', "eos", True, rejected("not_json")),
    "comment": ('{"final_stock": 43 /* sure */}', "eos", True, rejected("not_json")),
    "non-breaking space is not JSON whitespace": ('\u00a0{"final_stock": 43}', "eos", True, rejected("not_json")),
    "byte order mark": ('\ufeff{"final_stock": 43}', "eos", True, rejected("not_json")),
    "raw control character in a string": ('{"final_stock": "4\x003"}', "eos", True, rejected("not_json")),
    "NaN spelled -NaN": ('{"final_stock": -NaN}', "eos", True, rejected("not_json")),
    "bare number": ("43", "eos", True, rejected("not_object")),
    "list": ('[{"final_stock": 43}]', "eos", True, rejected("not_object")),
    "string": ('"{\\"final_stock\\": 43}"', "eos", True, rejected("not_object")),
    "null": ("null", "eos", True, rejected("not_object")),
    "duplicate field": ('{"final_stock": 43, "final_stock": 43}', "eos", True, rejected("duplicate_field")),
    "nested duplicate": ('{"final_stock": {"a": 1, "a": 1}}', "eos", True, rejected("duplicate_field")),
    "escaped duplicate": ('{"final_stock": 43, "final\\u005fstock": 43}', "eos", True, rejected("duplicate_field")),
    "NaN": ('{"final_stock": NaN}', "eos", True, rejected("non_finite")),
    "Infinity": ('{"final_stock": Infinity}', "eos", True, rejected("non_finite")),
    "-Infinity": ('{"final_stock": -Infinity}', "eos", True, rejected("non_finite")),
    "nested NaN": ('{"final_stock": [NaN]}', "eos", True, rejected("non_finite")),
    "empty object": ("{}", "eos", True, rejected("missing_field")),
    "other spelling": ('{"finalStock": 43}', "eos", True, rejected("missing_field")),
    "trailing space in key": ('{"final_stock ": 43}', "eos", True, rejected("missing_field")),
    "extra field": ('{"final_stock": 43, "unit": "boxes"}', "eos", True, rejected("extra_field")),
    "boolean true": ('{"final_stock": true}', "eos", True, rejected("boolean")),
    "boolean false": ('{"final_stock": false}', "eos", True, rejected("boolean")),
    "float": ('{"final_stock": 43.0}', "eos", True, rejected("float")),
    "exponent": ('{"final_stock": 43e0}', "eos", True, rejected("float")),
    "huge exponent is a float, not infinity": ('{"final_stock": 1e400}', "eos", True, rejected("float")),
    "exponent beyond any float or Decimal": ('{"final_stock": 0.4e0066999999999999999999999999}', "eos", True,
                                             rejected("float")),
    "string value": ('{"final_stock": "43"}', "eos", True, rejected("string")),
    "null value": ('{"final_stock": null}', "eos", True, rejected("wrong_type")),
    "list value": ('{"final_stock": [43]}', "eos", True, rejected("wrong_type")),
    "object value": ('{"final_stock": {"value": 43}}', "eos", True, rejected("wrong_type")),
    "negative": ('{"final_stock": -1}', "eos", True, rejected("out_of_range")),
    "above 300": ('{"final_stock": 301}', "eos", True, rejected("out_of_range")),
    "long integer": ('{"final_stock": 1' + "0" * 200 + "}", "eos", True, rejected("out_of_range")),
    "wrong value": ('{"final_stock": 42}', "eos", True, rejected("wrong_value", True, 42)),
    "lower bound is valid": ('{"final_stock": 0}', "eos", True, rejected("wrong_value", True, 0)),
    "upper bound is valid": ('{"final_stock": 300}', "eos", True, rejected("wrong_value", True, 300)),
}


@pytest.mark.parametrize("name", list(FIXTURES))
def test_fixture(name):
    text, finish_reason, tokenization_valid, expected = FIXTURES[name]
    assert score(text, finish_reason, PROBLEM, tokenization_valid) == expected


def test_every_reason_is_constructed_by_a_fixture():
    constructed = {expected.reason for *_, expected in FIXTURES.values()} - {None}
    assert constructed == set(REASONS)


def test_reasons_are_documented_constants_in_a_fixed_order():
    assert REASONS == (
        "undecodable_id", "stopped_at_length", "oversized", "markdown_fence", "several_objects",
        "not_json", "not_object", "duplicate_field", "non_finite", "missing_field", "extra_field",
        "boolean", "float", "string", "wrong_type", "out_of_range", "wrong_value",
    )
    assert set(REASON_DESCRIPTIONS) == set(REASONS)
    for reason in REASONS:
        assert getattr(verifier, reason.upper()) == reason
        assert f"    {reason} " in verifier.__doc__, f"{reason} missing from the module docstring table"
    assert verifier.FORMAT_REASONS == REASONS[2:-1]


@pytest.mark.parametrize(
    "text, reason",
    [
        # each pair: the text also has the later fault, the earlier reason wins
        ("```\n" + "x" * 300, "oversized"),
        ('```{"final_stock": 43}{"final_stock": 43}', "markdown_fence"),
        ('{"a": 1, "a": 2} {"final_stock": 43}', "several_objects"),
        ('[{"a": 1, "a": 2}]', "not_object"),
        ('{"final_stock": NaN, "final_stock": NaN}', "duplicate_field"),
        ('{"stock": NaN}', "non_finite"),
        ('{"a": 1, "b": 2}', "missing_field"),
        ('{"final_stock": true, "b": 2}', "extra_field"),
        ('{"final_stock": "```"}', "string"),  # a fence inside a single JSON value is not a fence
    ],
)
def test_precedence(text, reason):
    assert score(text, "eos", PROBLEM).reason == reason


def test_exactly_256_characters_is_allowed_and_257_is_not():
    at_limit = RIGHT + " " * (256 - len(RIGHT))
    assert len(at_limit) == 256 and score(at_limit, "eos", PROBLEM) == correct(43)
    assert score(at_limit + " ", "eos", PROBLEM) == rejected("oversized")


@pytest.mark.parametrize(
    "text",
    [
        '{"final_stock": 43} {"final_stock": 43}',
        '{"final_stock": 43}\n{"final_stock": 7}',
        '{"final_stock": 7}\n\n{"final_stock": 43}',
        '{"final_stock": 43}[]',
    ],
)
def test_diagnose_this_two_objects_one_correct_is_rejected(text):
    """The protocol's diagnose-this case: a lenient parser would read a correct answer here."""
    verdict = score(text, "eos", PROBLEM)
    assert verdict == rejected("several_objects")


def test_problem_object_and_dict_give_the_same_verdict():
    problem = Problem.from_dict(PROBLEM)
    for text, finish_reason, tokenization_valid, _ in FIXTURES.values():
        assert score(text, finish_reason, problem, tokenization_valid) == score(
            text, finish_reason, PROBLEM, tokenization_valid
        )


def test_target_comes_from_the_solver():
    other = {"initial": 100, "deliveries": [100, 100], "withdrawals": [0, 0]}
    assert score('{"final_stock": 300}', "eos", other) == correct(300)
    assert score(RIGHT, "eos", other) == rejected("wrong_value", True, 43)


@pytest.mark.parametrize("text", [b'{"final_stock": 43}', None, 43, ['{"final_stock": 43}']])
def test_non_str_text_is_a_programming_error(text):
    with pytest.raises(ValueError, match="text must be a str"):
        score(text, "eos", PROBLEM)


@pytest.mark.parametrize("finish_reason", ["stop", "EOS", "", None, 1, True])
def test_unknown_finish_reason_is_a_programming_error(finish_reason):
    with pytest.raises(ValueError, match="finish_reason must be one of"):
        score(RIGHT, finish_reason, PROBLEM)


@pytest.mark.parametrize("tokenization_valid", [None, 1, 0, "yes"])
def test_tokenization_validity_must_be_a_bool(tokenization_valid):
    with pytest.raises(ValueError, match="tokenization_valid must be a bool"):
        score(RIGHT, "eos", PROBLEM, tokenization_valid)


@pytest.mark.parametrize(
    "problem, message",
    [
        ({"initial": 1, "deliveries": [27, 43]}, "lacks the field"),
        ({"initial": 1, "deliveries": 5, "withdrawals": [1, 1]}, "must be a list of 2 integers"),
        ({"initial": 1, "deliveries": [27, 43, 1], "withdrawals": [18, 10]}, "exactly 2 deliveries"),
        ({"initial": 1, "deliveries": [27, 43], "withdrawals": [18, 100]}, "non-negative"),
        ({"initial": 101, "deliveries": [0, 0], "withdrawals": [0, 0]}, "0..100"),
        ({"initial": True, "deliveries": [0, 0], "withdrawals": [0, 0]}, "integers"),
        ({"initial": 1.0, "deliveries": [0, 0], "withdrawals": [0, 0]}, "integers"),
        ([1, [27, 43], [18, 10]], "must be a dict"),
        (None, "must be a dict"),
        (Problem(1, (27, 43), (18, 100)), "non-negative"),
    ],
)
def test_malformed_problem_raises_a_clear_value_error(problem, message):
    with pytest.raises(ValueError, match=message):
        score(RIGHT, "eos", problem)


HOSTILE = [
    "\x00",
    '{"final_stock": 43}\x00',
    "\ud800",
    '{"final_stock": 43, "\udfff": 1}',
    '{"final_stock": "\\ud800"}',
    "\\u0000",
    "[" * 256,
    "[" * 128 + "]" * 128,
    "{" * 256,
    '{"a":' * 50 + "1" + "}" * 50,
    "-" * 256,
    "9" * 256,
    "9" * 5000,  # above Python's int-conversion digit limit, stopped by the size check
    "1e999999999",
    "-Infinity",
    "\u202e{\"final_stock\": 43}",
    "<|im_end|>",
    '<|im_start|>{"final_stock": 43}',
    "\U0001f4e6" * 10,
    "x" * 1_000_000,
]


@pytest.mark.parametrize("index", range(len(HOSTILE)))
def test_hostile_text_returns_a_verdict(index):
    for finish_reason in ("eos", "length"):
        verdict = score(HOSTILE[index], finish_reason, PROBLEM)
        assert verdict.reward == 0 and verdict.reason in REASONS


def test_deep_nesting_under_a_low_recursion_limit_never_raises():
    depth = 128
    text = "[" * depth + "]" * depth
    old = sys.getrecursionlimit()
    try:
        # leave a little room above the current stack so only the decoder can overflow it
        sys.setrecursionlimit(len(_stack()) + 60)
        verdict = score(text, "eos", PROBLEM)
    finally:
        sys.setrecursionlimit(old)
    assert verdict.reason in ("not_json", "not_object")  # not_object where the C limit is separate


def _stack():
    import inspect

    return inspect.stack(0)


@pytest.mark.parametrize("error", [RecursionError("deep"), ValueError("Exceeds the limit"), OverflowError("big")])
def test_decoder_errors_mean_not_json(monkeypatch, error):
    def explode(self, text, index=0):
        raise error

    monkeypatch.setattr(verifier.json.JSONDecoder, "raw_decode", explode)
    assert score(RIGHT, "eos", PROBLEM) == rejected("not_json")


def test_verdict_is_frozen():
    verdict = score(RIGHT, "eos", PROBLEM)
    with pytest.raises(AttributeError):
        verdict.reward = 0


# ---------------------------------------------------------------- JSONTestSuite

SUITE = REPO_ROOT / "tests" / "data" / "JSONTestSuite" / "test_parsing"  # vendored, MIT (its LICENSE beside it)


def test_json_test_suite_never_crashes_the_verifier():
    files = sorted(SUITE.glob("*.json"))
    assert len(files) == 318, f"{SUITE}: expected JSONTestSuite's 318 parsing cases, found {len(files)}"
    for path in files:
        raw = path.read_bytes()
        # several decodings, so lone surrogates, odd encodings and BOMs all reach the parser
        for text in (raw.decode("utf-8", "surrogateescape"), raw.decode("latin-1"), raw.decode("utf-16", "replace")):
            verdict = score(text, "eos", PROBLEM)
            assert verdict.reward == 0 and verdict.reason in REASONS, path.name
            if path.name.startswith("n_"):
                assert not verdict.valid, path.name  # invalid JSON is never a valid answer


# ---------------------------------------------------------------- properties


def reference_is_valid_answer(text: str) -> bool:
    """A second, independent implementation of the schema (no hooks on the verifier's side)."""
    if len(text) > 256:
        return False

    def reject(name):
        raise ValueError(name)

    try:
        pairs = json.loads(text, object_pairs_hook=lambda p: p, parse_constant=reject)
    except (ValueError, RecursionError):
        return False
    if not isinstance(pairs, list) or len(pairs) != 1 or not isinstance(pairs[0], tuple):
        return False  # a list of pairs is the only way a top-level object comes back here
    (key, value), = pairs
    return key == "final_stock" and type(value) is int and 0 <= value <= 300


def assert_consistent(text: str, verdict: Verdict, target: int = TARGET) -> None:
    assert verdict.reward in (0, 1)
    assert (verdict.reward == 1) == (verdict.reason is None)
    assert verdict.reason is None or verdict.reason in REASONS
    assert verdict.valid == reference_is_valid_answer(text), (text, verdict)
    if verdict.valid:
        assert type(verdict.value) is int and 0 <= verdict.value <= 300
    else:
        assert verdict.value is None
    if verdict.reward == 1:
        assert verdict.value == target and json.loads(text) == {"final_stock": target}


JSON_FRAGMENTS = st.sampled_from(
    ['{', '}', '[', ']', '"final_stock"', '"x"', ':', ',', ' ', '\n', '43', '-1', '301', '0', '4.3',
     'e5', 'true', 'null', 'NaN', 'Infinity', '"', '\\u005f', '```', 'json', '\x00', '\ud800', '\\']
)


@PROPERTY
@given(st.text(st.characters(exclude_categories=()), max_size=300), st.sampled_from(["eos", "length"]))
def test_any_text_returns_a_consistent_verdict(text, finish_reason):
    verdict = score(text, finish_reason, PROBLEM)
    assert_consistent(text, verdict)


@PROPERTY
@given(st.lists(JSON_FRAGMENTS, max_size=40).map("".join))
def test_json_like_text_returns_a_consistent_verdict(text):
    assert_consistent(text, score(text, "eos", PROBLEM))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


def has_non_finite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, list):
        return any(has_non_finite(v) for v in value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    return False


def expected_reason(obj, text: str) -> str | None:
    """The format reason for one JSON value `obj` serialised as `text`, worked out independently."""
    if len(text) > 256:
        return "oversized"
    if not isinstance(obj, dict):
        return "not_object"
    if has_non_finite(obj):
        return "non_finite"
    if "final_stock" not in obj:
        return "missing_field"
    if len(obj) > 1:
        return "extra_field"
    value = obj["final_stock"]
    if type(value) is bool:
        return "boolean"
    if type(value) is float:
        return "float"
    if type(value) is str:
        return "string"
    if type(value) is not int:
        return "wrong_type"
    return None if 0 <= value <= 300 else "out_of_range"


SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")])


@PROPERTY
@given(JSON_VALUES, SEPARATORS)
def test_arbitrary_json_values(value, separators):
    text = json.dumps(value, separators=separators)
    parsed = parse_answer(text)
    assert parsed.reason == expected_reason(value, text), text
    assert_consistent(text, score(text, "eos", PROBLEM))


@PROPERTY
@given(JSON_VALUES, SEPARATORS, st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=2))
def test_arbitrary_final_stock_values(value, separators, others):
    obj = {**others, "final_stock": value}
    text = json.dumps(obj, separators=separators)
    parsed = parse_answer(text)
    assert parsed.reason == expected_reason(obj, text), text
    assert_consistent(text, score(text, "eos", PROBLEM))


@st.composite
def problems(draw) -> Problem:
    """Any valid StockArithmetic problem with operands in 0..100."""
    initial = draw(st.integers(0, 100))
    d1, d2 = draw(st.integers(0, 100)), draw(st.integers(0, 100))
    w1 = draw(st.integers(0, min(100, initial + d1 + d2)))
    w2 = draw(st.integers(0, min(100, initial + d1 + d2 - w1)))
    return Problem(initial, (d1, d2), (w1, w2))


WHITESPACE = st.text(st.sampled_from(" \t\n\r"), max_size=30)


def spaced_answer(draw, value: int) -> str:
    """`{"final_stock": value}` with random JSON whitespace in every gap (at most 256 chars)."""
    ws = [draw(WHITESPACE) for _ in range(6)]
    return f'{ws[0]}{{{ws[1]}"final_stock"{ws[2]}:{ws[3]}{value}{ws[4]}}}{ws[5]}'


@PROPERTY
@given(problems(), st.data())
def test_every_valid_answer_is_accepted(problem, data):
    target = solve(problem)
    text = spaced_answer(data.draw, target)
    assert len(text) <= 256
    assert score(text, "eos", problem) == correct(target)
    assert score(text, "eos", problem.to_dict()) == correct(target)
    assert score(text, "length", problem) == rejected("stopped_at_length", True, target)
    assert score(text, "eos", problem, tokenization_valid=False) == rejected("undecodable_id", True, target)


@PROPERTY
@given(problems(), st.integers(0, 300), st.data())
def test_every_wrong_integer_is_a_wrong_value(problem, value, data):
    target = solve(problem)
    text = spaced_answer(data.draw, value)
    expected = correct(target) if value == target else rejected("wrong_value", True, value)
    assert score(text, "eos", problem) == expected


@PROPERTY
@given(problems(), st.data())
def test_two_valid_answers_in_a_row_are_several_objects(problem, data):
    target = solve(problem)
    first, second = spaced_answer(data.draw, target), spaced_answer(data.draw, data.draw(st.integers(0, 300)))
    text = first + second
    expected = "oversized" if len(text) > 256 else "several_objects"
    assert score(text, "eos", problem) == rejected(expected)


# ---------------------------------------------------------------- chapter 1 exercise checker


def test_chapter_1_checker_accepts_the_reference_and_explains_mistakes(capsys):
    from labkit.book.exercises import CH01_RESPONSES, ExerciseError, check_ch01_is_valid_answer

    assert check_ch01_is_valid_answer(reference_is_valid_answer) is True
    assert "all 28 responses" in capsys.readouterr().out
    assert len(CH01_RESPONSES) == 28

    def lenient(text):  # forgets that True is an int in Python
        try:
            obj = json.loads(text)
        except ValueError:
            return False
        return isinstance(obj, dict) and list(obj) == ["final_stock"] and isinstance(obj["final_stock"], int) \
            and 0 <= obj["final_stock"] <= 300

    with pytest.raises(ExerciseError, match=r"case 13 of 28: .*true.*boolean.*type\(v\) is int"):
        check_ch01_is_valid_answer(lenient)
    with pytest.raises(ExerciseError, match=r"case 3 of 28: .* raised JSONDecodeError"):
        check_ch01_is_valid_answer(lambda text: json.loads(text) is not None)
    with pytest.raises(ExerciseError, match=r"returned 1 \(int\); return True or False"):
        check_ch01_is_valid_answer(lambda text: 1)
    with pytest.raises(ExerciseError, match=r"case 2 of 28: .*valid answer \(value 43\); you returned False"):
        check_ch01_is_valid_answer(lambda text: text == '{"final_stock": 43}')


def test_chapter_1_checker_says_when_the_stub_is_not_written():
    from labkit.book.exercises import ExerciseError, check_ch01_is_valid_answer

    def stub(text):
        raise NotImplementedError("Your turn")

    with pytest.raises(ExerciseError, match=r"is_valid_answer is not written yet \(Your turn\)"):
        check_ch01_is_valid_answer(stub)
