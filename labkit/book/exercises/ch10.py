"""Chapter 10, the difficulty profile: `check_ch10_carries` grades counting carries and borrows.

The student writes `carries_and_borrows(problem) -> int` for a problem dict
{"initial", "deliveries": [d1, d2], "withdrawals": [w1, w2]}: the carries of initial + d1 and
of (initial + d1) + d2, plus the borrows of the two subtractions, in the statement's order,
by schoolbook column arithmetic (labkit.eval.difficulty is the reference).  The problems are
constructed, each to catch one way of getting it wrong:

    final carry     58 + 67 = 125: the carry out of the leftmost column counts (2, not 1)
    carry in        99 + 1 = 100: the tens column carries only with the carry it receives (2, not 1)
    ripple          100 - 1 = 99: the borrow ripples through the zero (2, not 1)
    borrows         the two subtractions count too

(The order of operations is not a trap: the carries of a + b are (S(a) + S(b) - S(a + b)) / 9,
S the digit sum, so summing the deliveries first gives the same total; the borrows likewise.)
"""

from __future__ import annotations

from ...eval import difficulty
from ._calling import ExerciseError, call_student, require_function

# (problem, what it is there to catch)
CH10_CASES = (
    ({"initial": 41, "deliveries": [35, 22], "withdrawals": [14, 18]}, "one borrow in the last subtraction"),
    ({"initial": 58, "deliveries": [67, 0], "withdrawals": [0, 0]}, "the carry out of the leftmost column"),
    ({"initial": 100, "deliveries": [0, 0], "withdrawals": [1, 0]}, "a borrow that ripples through a zero"),
    ({"initial": 99, "deliveries": [1, 0], "withdrawals": [0, 0]}, "a carry that ripples through a nine"),
    ({"initial": 7, "deliveries": [8, 5], "withdrawals": [6, 9]}, "carries and borrows together"),
    ({"initial": 0, "deliveries": [0, 0], "withdrawals": [0, 0]}, "nothing to carry"),
    ({"initial": 99, "deliveries": [1, 100], "withdrawals": [100, 99]}, "three-digit stocks"),
)


def _digits(n: int) -> list[int]:
    return [int(c) for c in str(n)[::-1]]


def _carries_without_final(a: int, b: int) -> int:
    """The mistake of not counting the carry out of the leftmost column."""
    width = max(len(_digits(a)), len(_digits(b)))
    carries = carry = 0
    for k in range(width):
        carry = 1 if (a // 10**k) % 10 + (b // 10**k) % 10 + carry >= 10 else 0
        carries += carry if k < width - 1 else 0
    return carries


def _carries_without_carry_in(a: int, b: int) -> int:
    """The mistake of testing each column's digit sum without the carry it receives."""
    width = max(len(_digits(a)), len(_digits(b)))
    return sum(1 for k in range(width) if (a // 10**k) % 10 + (b // 10**k) % 10 >= 10)


def _borrows_without_ripple(a: int, b: int) -> int:
    """The mistake of comparing digits without the borrow owed to the column on the right."""
    return sum(1 for k in range(len(_digits(a))) if (a // 10**k) % 10 < (b // 10**k) % 10)


def _levels(p: dict) -> tuple[int, int, int]:
    s1 = p["initial"] + p["deliveries"][0]
    s2 = s1 + p["deliveries"][1]
    return s1, s2, s2 - p["withdrawals"][0]


def _decoys(p: dict) -> dict[str, int]:
    """What each common mistake answers for problem p."""
    (d1, d2), (w1, w2), initial = p["deliveries"], p["withdrawals"], p["initial"]
    s1, s2, s3 = _levels(p)
    carries, borrows = difficulty.column_carries, difficulty.column_borrows
    return {
        "final carry": _carries_without_final(initial, d1) + _carries_without_final(s1, d2)
                       + borrows(s2, w1) + borrows(s3, w2),
        "ripple": carries(initial, d1) + carries(s1, d2) + _borrows_without_ripple(s2, w1)
                  + _borrows_without_ripple(s3, w2),
        "carry in": _carries_without_carry_in(initial, d1) + _carries_without_carry_in(s1, d2)
                    + borrows(s2, w1) + borrows(s3, w2),
        "borrows": carries(initial, d1) + carries(s1, d2),
    }


CH10_HINTS = {
    "final carry": "the carry out of the leftmost column counts too: 58 + 67 has 8 + 7 = 15 (carry) and then "
                   "5 + 6 + 1 = 12 (carry), 2 carries, although no column holds the final 1",
    "ripple": "a column that lends must first pay what it owes: in 100 - 1 the units borrow from the tens, whose "
              "0 then borrows from the hundreds, 2 borrows; compare each top digit minus the borrow owed to "
              "the column on its right",
    "carry in": "a column's sum includes the carry it receives from the column on its right: in 99 + 1 the "
                "units give 9 + 1 = 10 (carry), and then the tens give 9 + 0 + 1 = 10 (carry), 2 carries",
    "borrows": "the two withdrawals count too: add the borrows of (stock - w1) and of (that - w2)",
}


def _worked(p: dict) -> str:
    (d1, d2), (w1, w2) = p["deliveries"], p["withdrawals"]
    s1, s2, s3 = _levels(p)
    steps = [(f"{p['initial']} + {d1} = {s1}", difficulty.column_carries(p["initial"], d1), ("carry", "carries")),
             (f"{s1} + {d2} = {s2}", difficulty.column_carries(s1, d2), ("carry", "carries")),
             (f"{s2} - {w1} = {s3}", difficulty.column_borrows(s2, w1), ("borrow", "borrows")),
             (f"{s3} - {w2} = {s3 - w2}", difficulty.column_borrows(s3, w2), ("borrow", "borrows"))]
    return "; ".join(f"{text}: {n} {words[n != 1]}" for text, n, words in steps)


def check_ch10_carries(carries_and_borrows) -> bool:
    """Grade chapter 10's exercise: `carries_and_borrows(problem) -> int` on constructed problems."""
    require_function(carries_and_borrows)
    consistent = list(CH10_HINTS)  # the mistakes the answers so far could all come from
    for number, (problem, purpose) in enumerate(CH10_CASES, start=1):
        where = f"case {number} of {len(CH10_CASES)} ({purpose}): carries_and_borrows({problem})"
        got = call_student(carries_and_borrows, {k: (list(v) if isinstance(v, list) else v) for k, v in problem.items()},
                           where=where, not_written="carries_and_borrows")
        expected = difficulty.carries_and_borrows(problem)
        if isinstance(got, bool) or not isinstance(got, int):
            raise ExerciseError(f"{where} returned {got!r} ({type(got).__name__}); return the count as an int "
                                f"(here {expected})")
        decoys = _decoys(problem)
        if got == expected:
            consistent = [name for name in consistent if decoys[name] == got]
            continue
        # the mistake that explains this answer and every earlier one, else any that explains this one
        mistakes = [n for n in consistent if decoys[n] == got] or [n for n, v in decoys.items() if v == got]
        hint = CH10_HINTS[mistakes[0]] if mistakes else "work each column from the units up"
        raise ExerciseError(f"{where} returned {got}, expected {expected} ({_worked(problem)}). Hint: {hint}.")
    print(f"Correct: your carries_and_borrows agrees with the column arithmetic on all {len(CH10_CASES)} problems.")
    return True
