"""The chapter 10 checker: it accepts counting carries and borrows right and names each common mistake."""

import pytest

from labkit.eval import difficulty
from labkit.book import exercises
from labkit.book.exercises import ExerciseError


def by_digit_sums(problem):
    """Right, by another route: carries of a + b = (S(a) + S(b) - S(a + b)) / 9, borrows likewise."""
    def s(n):
        return sum(int(c) for c in str(n))

    (d1, d2), (w1, w2) = problem["deliveries"], problem["withdrawals"]
    s2 = problem["initial"] + d1 + d2
    s4 = s2 - w1 - w2
    return (s(problem["initial"]) + s(d1) + s(d2) - s(s2)) // 9 + (s(w1) + s(w2) + s(s4) - s(s2)) // 9


def digits(n, width):
    return [(n // 10**k) % 10 for k in range(width)]


def make(add, subtract):
    def carries_and_borrows(problem):
        (d1, d2), (w1, w2) = problem["deliveries"], problem["withdrawals"]
        s1 = problem["initial"] + d1
        s2 = s1 + d2
        return add(problem["initial"], d1) + add(s1, d2) + subtract(s2, w1) + subtract(s2 - w1, w2)
    return carries_and_borrows


def add_right(a, b):
    count = carry = 0
    for x, y in zip(digits(a, 4), digits(b, 4)):
        carry = int(x + y + carry >= 10)
        count += carry
    return count


def subtract_right(a, b):
    count = borrow = 0
    for x, y in zip(digits(a, 4), digits(b, 4)):
        borrow = int(x - borrow < y)
        count += borrow
    return count


def add_no_final(a, b):  # drops the carry out of the leftmost column of the wider operand
    width = max(len(str(a)), len(str(b)))
    count = carry = 0
    for k, (x, y) in enumerate(zip(digits(a, width), digits(b, width))):
        carry = int(x + y + carry >= 10)
        count += carry if k < width - 1 else 0
    return count


def add_no_carry_in(a, b):
    return sum(int(x + y >= 10) for x, y in zip(digits(a, 4), digits(b, 4)))


def subtract_no_ripple(a, b):
    return sum(int(x < y) for x, y in zip(digits(a, 4), digits(b, 4)))


@pytest.mark.parametrize("answer", [make(add_right, subtract_right), by_digit_sums, difficulty.carries_and_borrows])
def test_accepts_the_column_arithmetic(answer, capsys):
    assert exercises.check_ch10_carries(answer) is True
    assert capsys.readouterr().out == ("Correct: your carries_and_borrows agrees with the column arithmetic on all "
                                       "7 problems.\n")


@pytest.mark.parametrize("wrong, case, got, expected, mistake", [
    (make(add_no_final, subtract_right), 2, 1, 2, "final carry"),
    (make(add_right, subtract_no_ripple), 3, 1, 2, "ripple"),
    (make(add_no_carry_in, subtract_right), 4, 1, 2, "carry in"),
    (make(add_right, lambda a, b: 0), 1, 0, 1, "borrows"),
])
def test_names_the_mistake_and_shows_the_columns(wrong, case, got, expected, mistake):
    with pytest.raises(ExerciseError) as info:
        exercises.check_ch10_carries(wrong)
    message = str(info.value)
    assert message.startswith(f"case {case} of 7 (")
    assert f"returned {got}, expected {expected} (" in message
    assert message.endswith(f"Hint: {exercises.CH10_HINTS[mistake]}.")


def test_the_worked_columns_are_spelled_out():
    with pytest.raises(ExerciseError) as info:
        exercises.check_ch10_carries(make(add_no_final, subtract_right))
    assert ("carries_and_borrows({'initial': 58, 'deliveries': [67, 0], 'withdrawals': [0, 0]}) returned 1, "
            "expected 2 (58 + 67 = 125: 2 carries; 125 + 0 = 125: 0 carries; 125 - 0 = 125: 0 borrows; "
            "125 - 0 = 125: 0 borrows)") in str(info.value)


def test_each_case_separates_the_mistake_it_names():
    """Every mistake the checker names is wrong on at least one case, and the decoys are what the
    student-style implementations above compute."""
    from labkit.book.exercises.ch10 import _decoys

    students = {"final carry": make(add_no_final, subtract_right), "ripple": make(add_right, subtract_no_ripple),
                "carry in": make(add_no_carry_in, subtract_right), "borrows": make(add_right, lambda a, b: 0)}
    for problem, _ in exercises.CH10_CASES:
        decoys = _decoys(problem)
        assert {name: f(problem) for name, f in students.items()} == decoys
    for name in students:
        assert any(_decoys(p)[name] != difficulty.carries_and_borrows(p) for p, _ in exercises.CH10_CASES), name


def test_a_wrong_type_a_crash_and_a_stub_are_reported():
    with pytest.raises(ExerciseError, match=r"returned 1.0 \(float\); return the count as an int \(here 1\)"):
        exercises.check_ch10_carries(lambda p: 1.0)
    with pytest.raises(ExerciseError, match=r"returned True \(bool\)"):
        exercises.check_ch10_carries(lambda p: True)
    with pytest.raises(ExerciseError, match=r"case 1 of 7 .* raised KeyError: 'stock'"):
        exercises.check_ch10_carries(lambda p: p["stock"])

    def stub(problem):
        raise NotImplementedError("your turn: count the carries and borrows")

    with pytest.raises(ExerciseError, match=r"carries_and_borrows is not written yet \(your turn"):
        exercises.check_ch10_carries(stub)
    with pytest.raises(ExerciseError, match="pass your function itself"):
        exercises.check_ch10_carries(3)


def test_the_student_cannot_change_the_cases():
    def mutate(problem):
        problem["deliveries"].append(5)
        return difficulty.carries_and_borrows({**problem, "deliveries": problem["deliveries"][:2]})

    assert exercises.check_ch10_carries(mutate) is True
    assert all(len(p["deliveries"]) == 2 for p, _ in exercises.CH10_CASES)
