"""Difficulty profile: column carries and borrows, bins, and accuracy per bin (hand-worked values)."""

import random

import pytest

from labkit.eval import difficulty, evaluate
from labkit.lab.runs import REPO_ROOT, read_json, write_json, write_jsonl
from labkit.task.problems import Problem

EVALUATION = REPO_ROOT / "runs" / "tiny" / "evaluation"


# --- column arithmetic ---------------------------------------------------------------------------


@pytest.mark.parametrize("a,b,carries", [
    (0, 0, 0),
    (0, 7, 0),
    (58, 67, 2),    # 8+7 = 15 carry; 5+6+1 = 12 carry
    (99, 1, 2),     # 9+1 = 10 carry; 9+0+1 = 10 carry
    (1, 99, 2),     # the same columns, operands swapped
    (100, 100, 0),  # 0+0, 0+0, 1+1 = 2
    (45, 45, 1),    # 5+5 = 10 carry; 4+4+1 = 9
    (50, 50, 1),    # 0+0; 5+5 = 10 carry (out of the leftmost column: counted)
    (41, 35, 0),    # 1+5 = 6; 4+3 = 7
    (95, 5, 2),     # 5+5 = 10 carry; 9+0+1 = 10 carry
    (999, 1, 3),    # a carry ripples through three nines
    (14, 6, 1),     # 4+6 = 10 carry; 1+0+1 = 2
])
def test_column_carries_hand_worked(a, b, carries):
    assert difficulty.column_carries(a, b) == carries


@pytest.mark.parametrize("a,b,borrows", [
    (0, 0, 0),
    (7, 0, 0),
    (100, 1, 2),    # 0<1 borrow; 0-1<0 borrow; 1-1 = 0
    (52, 17, 1),    # 2<7 borrow; 5-1 = 4 >= 1
    (41, 14, 1),    # 1<4 borrow; 4-1 = 3 >= 1
    (84, 18, 1),    # 4<8 borrow; 8-1 = 7 >= 1
    (100, 100, 0),  # equal numbers: every column 0, 0, 0
    (37, 37, 0),
    (100, 0, 0),
    (100, 99, 2),   # 0<9 borrow; 0-1<9 borrow; 1-1 = 0
    (200, 101, 2),  # 0<1 borrow; 0-1 < 0 borrow; 2-1 = 1 >= 1
    (91, 9, 1),     # 1<9 borrow; 9-1 = 8 >= 0
])
def test_column_borrows_hand_worked(a, b, borrows):
    assert difficulty.column_borrows(a, b) == borrows


def test_carries_and_borrows_on_three_hand_worked_problems():
    # test-0000-like: 41 + 35 = 76 (1+5, 4+3: 0 carries); 76 + 22 = 98 (6+2, 7+2: 0);
    # 98 - 14 = 84 (8>=4, 9>=1: 0 borrows); 84 - 18 = 66 (4<8 borrow, 8-1 >= 1: 1).  Total 1.
    assert difficulty.carries_and_borrows({"initial": 41, "deliveries": [35, 22], "withdrawals": [14, 18]}) == 1
    # 58 + 67 = 125 (2 carries); 125 + 9 = 134 (5+9 = 14 carry, 2+0+1 = 3: 1);
    # 134 - 7 = 127 (4<7 borrow, 3-1 >= 0: 1); 127 - 0 = 127 (0).  Total 4.
    assert difficulty.carries_and_borrows(Problem(58, (67, 9), (7, 0))) == 4
    # 99 + 1 = 100 (2 carries); 100 + 100 = 200 (0); 200 - 100 = 100 (0);
    # 100 - 1 = 99 (2 borrows).  Total 4.
    assert difficulty.carries_and_borrows({"initial": 99, "deliveries": [1, 100], "withdrawals": [100, 1]}) == 4
    # Withdrawals swapped: the borrows move to the first subtraction, the total stays 4:
    # 99 + 1 = 100 (2); 100 + 100 = 200 (0); 200 - 1 = 199 (0<1, 0-1<0: 2 borrows); 199 - 100 = 99 (0).
    assert difficulty.carries_and_borrows(Problem(99, (1, 100), (1, 100))) == 4
    # A problem without any carry or borrow.
    assert difficulty.carries_and_borrows(Problem(10, (20, 30), (10, 20))) == 0


# --- an independent reference: digit strings --------------------------------------------------------


def carries_by_strings(a: int, b: int) -> int:
    """Schoolbook addition on zero-padded digit strings, leftmost column last."""
    width = max(len(str(a)), len(str(b)))
    top, bottom = str(a).zfill(width), str(b).zfill(width)
    count, carry = 0, 0
    for x, y in zip(reversed(top), reversed(bottom)):
        carry = int(int(x) + int(y) + carry > 9)
        count += carry
    return count


def borrows_by_strings(a: int, b: int) -> int:
    """Schoolbook subtraction on zero-padded digit strings, leftmost column last."""
    width = len(str(a))
    top, bottom = str(a).zfill(width), str(b).zfill(width)
    count, borrow = 0, 0
    for x, y in zip(reversed(top), reversed(bottom)):
        borrow = int(int(x) - borrow - int(y) < 0)
        count += borrow
    return count


def digit_sum(x: int) -> int:
    return sum(int(c) for c in str(x))


def test_column_arithmetic_matches_digit_strings_on_random_pairs():
    rng = random.Random(20261129)
    pairs = [(a, b) for a in range(0, 120) for b in range(0, 120)]  # every pair of the task's range
    pairs += [(rng.randrange(10 ** rng.randint(1, 9)), rng.randrange(10 ** rng.randint(1, 9))) for _ in range(5000)]
    for a, b in pairs:
        assert difficulty.column_carries(a, b) == carries_by_strings(a, b), (a, b)
        # Each carry turns 10 in one column into 1 in the next: digit sums drop by 9 per carry.
        assert difficulty.column_carries(a, b) == (digit_sum(a) + digit_sum(b) - digit_sum(a + b)) // 9, (a, b)
        big, small = max(a, b), min(a, b)
        assert difficulty.column_borrows(big, small) == borrows_by_strings(big, small), (big, small)
        # The borrows of big - small are the carries of (big - small) + small.
        assert difficulty.column_borrows(big, small) == carries_by_strings(big - small, small), (big, small)


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("a,b", [(-1, 2), (2, -1), (1.5, 2), (True, 1), ("3", 4), (None, 0)])
def test_column_carries_refuses_what_is_not_two_naturals(a, b):
    with pytest.raises(ValueError, match=r"^column_carries needs integers a >= 0 and b >= 0, got a=.*, b=.*$"):
        difficulty.column_carries(a, b)


@pytest.mark.parametrize("a,b", [(3, 5), (0, 1), (-1, -2), (5, -1), (5.0, 1), (False, 0)])
def test_column_borrows_refuses_a_negative_result_or_bad_operands(a, b):
    with pytest.raises(ValueError, match=r"^column_borrows needs integers a >= b >= 0 .*, got a=.*, b=.*$"):
        difficulty.column_borrows(a, b)


def test_bad_problems_and_bins_are_refused():
    with pytest.raises(ValueError, match="non-negative"):  # 10 + 0 + 0 - 20 < 0
        difficulty.carries_and_borrows({"initial": 10, "deliveries": [0, 0], "withdrawals": [20, 0]})
    with pytest.raises(ValueError, match="lacks the field"):
        difficulty.carries_and_borrows({"initial": 10, "deliveries": [0, 0]})
    with pytest.raises(ValueError, match="a dict or a labkit.task.problems.Problem"):
        difficulty.carries_and_borrows([10, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="target"):
        difficulty.magnitude_bin(-1)
    with pytest.raises(ValueError, match="carries and borrows"):
        difficulty.carry_bin(1.0)


def test_bins():
    assert [difficulty.magnitude_bin(t) for t in (0, 99, 100, 300)] == [
        "target < 100", "target < 100", "target >= 100", "target >= 100"]
    assert [difficulty.carry_bin(n) for n in range(7)] == ["0", "1", "2", "3+", "3+", "3+", "3+"]


# --- the profile over a constructed evaluation folder -------------------------------------------------


def label(pid, population, initial, deliveries, withdrawals, target):
    return {"id": pid, "split": "test", "population": population, "target": target,
            "problem": {"initial": initial, "deliveries": deliveries, "withdrawals": withdrawals}}


# Four problems, bins worked out by hand:
#   p-a  10+20+30-10-20 = 30   0 carries/borrows (above)          "target < 100"   carries "0"
#   p-b  41+35+22-14-18 = 66   1 (above)                          "target < 100"   carries "1"
#   p-c  58+67+9-7-0   = 127   4 (above)                          "target >= 100"  carries "3+"
#   p-d  99+1+100-100-1 = 99   4 (above)                          "target < 100"   carries "3+"
LABELS = [
    label("p-a", "ID50", 10, [20, 30], [10, 20], 30),
    label("p-b", "ID50", 41, [35, 22], [14, 18], 66),
    label("p-c", "OOD100", 58, [67, 9], [7, 0], 127),
    label("p-d", "OOD100", 99, [1, 100], [100, 1], 99),
]
TARGETS = {r["id"]: r["target"] for r in LABELS}


def prediction(pid, mode, draw, answer, finish_reason="eos"):
    """A prediction row with the fields run_inference writes (labkit.eval.evaluate.prediction_rows)."""
    text = answer if isinstance(answer, str) else f'{{"final_stock": {answer}}}'
    return {"problem_id": pid, "population": next(r["population"] for r in LABELS if r["id"] == pid),
            "mode": mode, "draw": draw, "seed": None if mode == "greedy" else evaluate.eval_seed(pid, draw),
            "sampler": "fast", "text": text, "finish_reason": finish_reason, "tokenization_valid": True,
            "response_tokens": 7, "response_ids": [1] * 7}


def answers(pid, correct):
    """The target when correct, else a wrong value: what the verifier then judges."""
    return TARGETS[pid] if correct else TARGETS[pid] + 1


@pytest.fixture
def policy_dir(tmp_path):
    """An evaluation folder written as run_inference writes one (gzip JSON Lines, manifest with draws, limit)."""
    folder = tmp_path / "evaluation" / "handmade"
    greedy = [
        prediction("p-a", "greedy", 0, answers("p-a", True)),                          # correct
        prediction("p-b", "greedy", 0, answers("p-b", False)),                         # wrong value
        prediction("p-c", "greedy", 0, answers("p-c", True)),                          # correct
        prediction("p-d", "greedy", 0, answers("p-d", True), finish_reason="length"),  # right text, no EOS: 0
    ]
    draws = {"p-a": [1, 1, 1, 0], "p-b": [0, 1, 0, 0], "p-c": [0, 0, 0, 0], "p-d": [1, 1, 0, 1]}
    # A wrong draw answers target + 1, except a wrong draw 3, which is not JSON: both score 0.
    sample = [prediction(pid, "sample", d, answers(pid, c) if d != 3 or c else "not json")
              for pid, cs in draws.items() for d, c in enumerate(cs)]
    write_jsonl(folder / evaluate.PREDICTION_FILES["greedy"], greedy)
    write_jsonl(folder / evaluate.PREDICTION_FILES["sample"], sample)
    write_json(folder / evaluate.MANIFEST_FILE, {"draws": 4, "limit": None})
    return folder


def cell(n, correct):
    return {"n": n, "correct": correct, "rate": correct / n if n else None,
            "interval": evaluate.wilson_interval(correct, n) if n else None}


def test_profile_counts_and_rates_by_hand(policy_dir):
    p = difficulty.profile(policy_dir, LABELS)
    assert list(p) == ["policy", "problems", "totals", "magnitude", "carries"]
    assert p["policy"] == "handmade" and p["problems"] == 4
    # greedy: p-a and p-c correct (p-b wrong value, p-d cut at the token limit) -> 2 of 4.
    # sample: 3 + 1 + 0 + 3 = 7 correct of 16 draws.
    assert p["totals"] == {"greedy": cell(4, 2), "sample": cell(16, 7)}
    magnitude = p["magnitude"]
    assert magnitude["bins"] == ["target < 100", "target >= 100"]
    assert magnitude["problems"] == {"target < 100": {"ALL": 3, "ID50": 2, "OOD100": 1},
                                     "target >= 100": {"ALL": 1, "ID50": 0, "OOD100": 1}}
    # "< 100" holds p-a, p-b, p-d: greedy 1 of 3 (p-a); draws 3 + 1 + 3 = 7 of 12.
    # ">= 100" holds p-c: greedy 1 of 1; draws 0 of 4.
    assert magnitude["greedy"] == {"target < 100": cell(3, 1), "target >= 100": cell(1, 1)}
    assert magnitude["sample"] == {"target < 100": cell(12, 7), "target >= 100": cell(4, 0)}
    carries = p["carries"]
    assert carries["bins"] == ["0", "1", "2", "3+"]
    assert carries["problems"] == {"0": {"ALL": 1, "ID50": 1, "OOD100": 0}, "1": {"ALL": 1, "ID50": 1, "OOD100": 0},
                                   "2": {"ALL": 0, "ID50": 0, "OOD100": 0}, "3+": {"ALL": 2, "ID50": 0, "OOD100": 2}}
    # "0" = p-a, "1" = p-b, "2" empty, "3+" = p-c, p-d.
    assert carries["greedy"] == {"0": cell(1, 1), "1": cell(1, 0), "2": cell(0, 0), "3+": cell(2, 1)}
    assert carries["sample"] == {"0": cell(4, 3), "1": cell(4, 1), "2": cell(0, 0), "3+": cell(8, 3)}
    assert carries["greedy"]["2"] == {"n": 0, "correct": 0, "rate": None, "interval": None}
    assert carries["sample"]["3+"]["rate"] == 0.375


def test_profile_table_formats_rates_and_intervals(policy_dir):
    p = difficulty.profile(policy_dir, LABELS)
    rows = difficulty.profile_table({"handmade": p, "again": p}, "carries", "greedy")
    # Wilson 95% by hand, z^2 = 3.8415:
    #   centre = (p + z^2/2n) / (1 + z^2/n),  half = z / (1 + z^2/n) * sqrt(p(1-p)/n + z^2/4n^2)
    #   1/1: centre (1 + 1.9207) / 4.8415 = 0.6033, half 0.4048 * sqrt(0.9604) = 0.3967  -> [20.7, 100.0] (clamped)
    #   0/1: centre 1.9207 / 4.8415 = 0.3967, half 0.3967                              -> [0.0, 79.3]
    #   1/2: centre 0.5, half 1.96 / 2.9207 * sqrt(1/8 + 3.8415/16) = 0.6711 * 0.6042 = 0.4055 -> [9.5, 90.5]
    assert rows == [
        {"policy": "handmade", "0": "100.0% [20.7, 100.0] (n=1)", "1": "0.0% [0.0, 79.3] (n=1)",
         "2": "n/a (n=0)", "3+": "50.0% [9.5, 90.5] (n=2)"},
        {"policy": "again", "0": "100.0% [20.7, 100.0] (n=1)", "1": "0.0% [0.0, 79.3] (n=1)",
         "2": "n/a (n=0)", "3+": "50.0% [9.5, 90.5] (n=2)"},
    ]
    # 7/12 = 58.3%: centre (0.5833 + 0.1601) / 1.3201 = 0.5631, half 1.4847 * sqrt(0.02025 + 0.00667) = 0.2436
    #   -> [0.3195, 0.8067] = [32.0, 80.7];  0/4: upper bound z^2 / (n + z^2) = 3.8415 / 7.8415 = 49.0%.
    assert difficulty.profile_table({"handmade": p}, "magnitude", "sample") == [
        {"policy": "handmade", "target < 100": "58.3% [32.0, 80.7] (n=12)",
         "target >= 100": "0.0% [0.0, 49.0] (n=4)"}]
    with pytest.raises(ValueError, match="unknown axis"):
        difficulty.profile_table({"handmade": p}, "size", "greedy")
    with pytest.raises(ValueError, match="unknown mode"):
        difficulty.profile_table({"handmade": p}, "carries", "best")


def test_profile_checks_completeness_and_labels(policy_dir, tmp_path):
    # A missing problem is an error, as in results.json, not a smaller bin.
    with pytest.raises(ValueError, match="is missing"):
        difficulty.profile(policy_dir, LABELS + [label("p-e", "ID50", 1, [1, 1], [1, 1], 1)])
    # A label whose target disagrees with the solver is refused.
    wrong = [dict(r, target=31) if r["id"] == "p-a" else r for r in LABELS]
    with pytest.raises(ValueError, match="the solver says 30"):
        difficulty.bin_counts(wrong)


# --- the committed tiny evaluation ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def test_labels():
    return evaluate.load_test_labels(phase=evaluate.SCORING_PHASE)


def test_bin_counts_of_the_test_split(test_labels):
    counts = difficulty.bin_counts(test_labels)
    for axis, bins in difficulty.AXES.items():
        assert list(counts[axis]) == list(bins)
        assert sum(c["ALL"] for c in counts[axis].values()) == 200
        assert sum(c["ID50"] for c in counts[axis].values()) == sum(c["OOD100"] for c in counts[axis].values()) == 100
        assert all(c["ALL"] == c["ID50"] + c["OOD100"] for c in counts[axis].values())


def test_profile_of_warm_start_agrees_with_results_json(test_labels):
    results = read_json(EVALUATION / evaluate.RESULTS_FILE)["policies"]["warm_start"]
    p = difficulty.profile(EVALUATION / "warm_start", test_labels)
    for mode in evaluate.MODES:
        expected = results[mode]["ALL"]
        assert p["totals"][mode]["correct"] == expected["correct"]
        assert p["totals"][mode]["n"] == expected["responses"]
        for axis in difficulty.AXES:
            assert sum(c["correct"] for c in p[axis][mode].values()) == expected["correct"], (mode, axis)
            assert sum(c["n"] for c in p[axis][mode].values()) == expected["responses"], (mode, axis)
    assert p["totals"]["greedy"]["correct"] == results["greedy"]["ALL"]["correct"]
