"""A difficulty profile of a policy's test evaluation: accuracy by difficulty bin, with Wilson 95% intervals.

The headline results (labkit.eval.evaluate) split the 200 test problems by
population (ID50, OOD100).  This module splits them by two measures of how hard
the *arithmetic* is, to ask whether a policy fails on big numbers or on carries:

* **magnitude**: the target (final stock) is below 100 (at most two digits) or
  at least 100 (three digits).

      bins: "target < 100", "target >= 100"

* **carries**: the number of column carries plus column borrows when the stock
  is computed left to right in base 10 by schoolbook column arithmetic,

      s1 = initial + d1     carries of the addition
      s2 = s1 + d2          carries
      s3 = s2 - w1          borrows of the subtraction
      s4 = s3 - w2          borrows          (s4 is the target)

  A carry is a column whose digit sum (with the incoming carry) is >= 10; a
  borrow is a column whose top digit (less the outgoing borrow of the column
  to its right) is smaller than the bottom digit.  The carry out of the
  leftmost column counts (58 + 67: 8+7 = 15 carry, 5+6+1 = 12 carry, 2
  carries); so does every borrow that ripples through zeros (100 - 1: 2
  borrows).  Each carry or borrow is a step where a digit of the answer
  depends on the column to its right, which is where column-by-column
  arithmetic goes wrong; the left-to-right order is the one the statement
  gives and the one that keeps every intermediate stock non-negative.

      bins: "0", "1", "2", "3+"

Per bin and per mode (labkit.eval.evaluate.MODES):

    greedy  n = problems in the bin, correct = greedy responses with reward 1
    sample  n = draws in the bin (problems x 4), correct = draws with reward 1 (per-draw
            success over all draws, not best-of-4)
    rate = correct / n (None when n == 0), interval = Wilson 95% [low, high] (None when n == 0)

Correctness is the verifier's (labkit.eval.evaluate.score_rows, the field "reward"),
after the same completeness checks as results.json.  Read every rate with its
interval: the bins hold tens of problems, and the sampled intervals treat the
4 draws of one problem as independent, so they are optimistic.

Bins are not independent of the population: OOD100 operands reach 100, so
OOD100 problems have larger targets and more carries.  Each axis therefore
lists, per bin, how many problems of each population it holds (`bin_counts`),
so a difference between bins can be read against a difference of populations.
"""

from __future__ import annotations

from pathlib import Path

from ..lab.runs import read_json
from ..task.problems import Problem, solve
from . import evaluate

MAGNITUDE_BINS = ("target < 100", "target >= 100")
CARRY_BINS = ("0", "1", "2", "3+")
AXES = {"magnitude": MAGNITUDE_BINS, "carries": CARRY_BINS}


# --- 1. Column arithmetic -----------------------------------------------------------------------


def _is_natural(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def column_carries(a: int, b: int) -> int:
    """Carries of the schoolbook addition a + b in base 10 (a, b >= 0 integers).

    Column k (units first): digit_k(a) + digit_k(b) + carry_in >= 10 is a carry.
    column_carries(58, 67) == 2, column_carries(99, 1) == 2, column_carries(0, 0) == 0.
    """
    if not (_is_natural(a) and _is_natural(b)):
        raise ValueError(f"column_carries needs integers a >= 0 and b >= 0, got a={a!r}, b={b!r}")
    carries = carry = 0
    while a or b:  # once both are exhausted no column remains; a final carry was counted where it arose
        carry = 1 if a % 10 + b % 10 + carry >= 10 else 0
        carries += carry
        a, b = a // 10, b // 10
    return carries


def column_borrows(a: int, b: int) -> int:
    """Borrows of the schoolbook subtraction a - b in base 10 (integers a >= b >= 0).

    Column k (units first): digit_k(a) - borrow_in < digit_k(b) is a borrow.
    column_borrows(100, 1) == 2, column_borrows(52, 17) == 1, column_borrows(41, 14) == 1.
    """
    if not (_is_natural(a) and _is_natural(b) and a >= b):
        raise ValueError(f"column_borrows needs integers a >= b >= 0 (no negative result), got a={a!r}, b={b!r}")
    borrows = borrow = 0
    while b or borrow:  # with b exhausted and nothing owed, the remaining digits of a are copied
        borrow = 1 if a % 10 - borrow < b % 10 else 0
        borrows += borrow
        a, b = a // 10, b // 10
    return borrows


def carries_and_borrows(problem: dict | Problem) -> int:
    """Carries of initial + d1 and of s1 + d2, plus borrows of s2 - w1 and of s3 - w2 (left to right).

    problem: a label's "problem" dict {initial, deliveries, withdrawals} or a labkit.task.problems.Problem;
    it is validated first (ValueError for a malformed problem or a negative stock level).
    """
    if not isinstance(problem, (dict, Problem)):
        raise ValueError(f"a problem is a dict or a labkit.task.problems.Problem, got {type(problem).__name__}")
    p = Problem.from_dict(problem) if isinstance(problem, dict) else problem.validated()
    (d1, d2), (w1, w2) = p.deliveries, p.withdrawals
    s1, s2, s3 = p.stock_levels()[:3]
    return (column_carries(p.initial, d1) + column_carries(s1, d2)
            + column_borrows(s2, w1) + column_borrows(s3, w2))


# --- 2. Bins ------------------------------------------------------------------------------------


def magnitude_bin(target: int) -> str:
    """"target < 100" or "target >= 100" (a two- or a three-digit answer)."""
    if not _is_natural(target):
        raise ValueError(f"a target is an integer >= 0, got {target!r}")
    return MAGNITUDE_BINS[0] if target < 100 else MAGNITUDE_BINS[1]


def carry_bin(n: int) -> str:
    """"0", "1", "2" or "3+" carries and borrows."""
    if not _is_natural(n):
        raise ValueError(f"a count of carries and borrows is an integer >= 0, got {n!r}")
    return CARRY_BINS[min(n, 3)]


def bins_of(label: dict) -> dict[str, str]:
    """{"magnitude": bin, "carries": bin} of one test label (its target is checked against the solver)."""
    problem = Problem.from_dict(label["problem"])
    if solve(problem) != label["target"]:
        raise ValueError(f"{label['id']!r}: label target {label['target']!r}, the solver says {solve(problem)}")
    return {"magnitude": magnitude_bin(label["target"]), "carries": carry_bin(carries_and_borrows(problem))}


def bin_counts(labels: list[dict]) -> dict[str, dict[str, dict[str, int]]]:
    """Problems per bin and population: {axis: {bin: {"ALL": n, "ID50": n, "OOD100": n}}}, every bin listed."""
    counts = {axis: {b: {pop: 0 for pop in evaluate.POPULATIONS} for b in bins} for axis, bins in AXES.items()}
    for label in labels:
        if label["population"] not in evaluate.POPULATIONS[1:]:
            raise ValueError(f"{label['id']!r}: unknown population {label['population']!r}")
        for axis, b in bins_of(label).items():
            counts[axis][b]["ALL"] += 1
            counts[axis][b][label["population"]] += 1
    return counts


# --- 3. The profile -----------------------------------------------------------------------------


def rate_cell(rewards: list[int]) -> dict:
    """{"n", "correct", "rate", "interval"} of a list of 0/1 rewards; rate and interval None when empty."""
    n, correct = len(rewards), sum(rewards)
    return {"n": n, "correct": correct, "rate": correct / n if n else None,
            "interval": evaluate.wilson_interval(correct, n) if n else None}


def scored_predictions(policy_dir: str | Path, labels: list[dict], mode: str) -> list[dict]:
    """One mode's predictions, checked complete and scored by the verifier, as results.json does.

    The expected problems are the labels selected with the manifest's `limit`, the
    draws those of the manifest (labkit.eval.evaluate.score_policy's rules).
    """
    policy_dir = Path(policy_dir)
    manifest = read_json(policy_dir / evaluate.MANIFEST_FILE)
    expected = evaluate.select_problems(labels, manifest["limit"])
    rows = evaluate.read_predictions(policy_dir, mode)
    evaluate.check_complete(rows, [r["id"] for r in expected], manifest["draws"], mode,
                            f"{policy_dir.name}/{evaluate.PREDICTION_FILES[mode]}")
    return evaluate.score_rows(rows, {r["id"]: r for r in expected})


def profile(policy_dir: str | Path, labels: list[dict]) -> dict:
    """The difficulty profile of one evaluated policy.

    labels: the test label rows (scoring phase).  Returns

        {"policy": folder name, "problems": n,
         "totals": {mode: cell},
         axis: {"bins": [bin, ...], "problems": {bin: {population: n}},
                "greedy": {bin: cell}, "sample": {bin: cell}}   for axis in ("magnitude", "carries")}

    with cell = rate_cell(...) = {"n", "correct", "rate", "interval"}; every bin is listed, in AXES order.
    """
    policy_dir = Path(policy_dir)
    scored = {mode: scored_predictions(policy_dir, labels, mode) for mode in evaluate.MODES}
    expected_ids = {r["problem_id"] for r in scored["greedy"]}
    expected = [r for r in labels if r["id"] in expected_ids]
    bins = {r["id"]: bins_of(r) for r in expected}
    counts = bin_counts(expected)
    out = {"policy": policy_dir.name, "problems": len(expected),
           "totals": {mode: rate_cell([r["reward"] for r in scored[mode]]) for mode in evaluate.MODES}}
    for axis, axis_bins in AXES.items():
        out[axis] = {"bins": list(axis_bins), "problems": counts[axis]}
        for mode in evaluate.MODES:
            out[axis][mode] = {b: rate_cell([r["reward"] for r in scored[mode] if bins[r["problem_id"]][axis] == b])
                               for b in axis_bins}
    return out


# --- 4. Tables ----------------------------------------------------------------------------------


def format_cell(cell: dict) -> str:
    """"64.0% [57.1, 70.3] (n=200)": rate and Wilson bounds in percent, one decimal; "n/a (n=0)" if empty."""
    if cell["n"] == 0:
        return "n/a (n=0)"
    low, high = cell["interval"]
    return f"{100 * cell['rate']:.1f}% [{100 * low:.1f}, {100 * high:.1f}] (n={cell['n']})"


def profile_table(profiles: dict[str, dict], axis: str, mode: str) -> list[dict]:
    """One row per policy (in `profiles` order): {"policy": name, bin: format_cell(...) for each bin}.

    profiles: {policy name: profile(...)}.  The rows render with labkit.eval.evaluate.markdown_table.
    """
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; expected one of {tuple(AXES)}")
    if mode not in evaluate.MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {evaluate.MODES}")
    return [{"policy": name, **{b: format_cell(p[axis][mode][b]) for b in AXES[axis]}}
            for name, p in profiles.items()]
