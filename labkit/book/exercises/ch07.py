"""Chapter 7, evaluation: `check_ch07_pass_at_k` grades the unbiased pass@k of one problem."""

from __future__ import annotations

from ._calling import ExerciseError, call_student, integer_division_hint, require_function, require_number


# (n, c, k) triples the chapter 7 checker tries: the lab's budget (n = 4) first, then the
# edges (no correct sample, every sample correct, n - c < k) and a larger n.
CH07_CASES = ((4, 1, 1), (4, 2, 1), (4, 1, 2), (4, 2, 2), (4, 1, 3), (4, 1, 4), (4, 0, 1), (4, 0, 4), (4, 4, 1),
              (4, 3, 2), (10, 3, 5), (200, 13, 10), (1, 1, 1), (1, 0, 1))


def check_ch07_pass_at_k(pass_at_k) -> bool:
    """Grade chapter 7's exercise: `pass_at_k(n, c, k) -> float`, one problem's unbiased pass@k.

    n samples of the problem, c of them correct, 1 <= k <= n:
    pass@k = 1 - C(n-c, k) / C(n, k), the chance that k samples drawn without replacement
    from the n include a correct one (Chen et al. 2021).  Compared with
    `labkit.eval.evaluate.pass_at_k` within 1e-12 on CH07_CASES; the common slips (per-draw
    success, the biased plug-in 1 - (1 - c/n)^k, best-of-n, forgetting the "1 -") get a hint.
    """
    import math

    from ...eval.evaluate import pass_at_k as reference

    require_function(pass_at_k)
    for number, (n, c, k) in enumerate(CH07_CASES, start=1):
        where = f"case {number} of {len(CH07_CASES)}: pass_at_k(n={n}, c={c}, k={k})"
        hint = (" When n - c < k every draw of k samples holds a correct one: C(n-c, k) is 0 and pass@k is 1."
                if n - c < k else "")
        got = call_student(pass_at_k, n, c, k, where=where, hint=f".{hint}")
        value = require_number(got, where)
        expected = reference(n, c, k)
        if abs(value - expected) <= 1e-12:
            continue
        all_fail = math.comb(n - c, k) / math.comb(n, k)
        if integer_division_hint(got, expected):
            hint = integer_division_hint(got, expected)
        elif abs(value - (1 - (1 - c / n) ** k)) <= 1e-12:
            hint = ("that is the plug-in estimate 1 - (1 - c/n)^k, which draws WITH replacement and is biased low; "
                    "draw k of the n samples without replacement: 1 - C(n-c, k) / C(n, k)")
        elif abs(value - c / n) <= 1e-12:
            hint = "that is the per-draw success c/n (pass@1); pass@k asks whether any of k samples is correct"
        elif abs(value - float(c > 0)) <= 1e-12:
            hint = "that is best-of-n (is any of all n samples correct?); pass@k draws only k of the n"
        elif abs(value - all_fail) <= 1e-12:
            hint = "C(n-c, k) / C(n, k) is the chance that all k drawn samples are wrong; pass@k is 1 minus it"
        else:
            hint = "pass@k = 1 - C(n-c, k) / C(n, k): one minus the chance that k samples drawn from n are all wrong"
        raise ExerciseError(f"{where} returned {value!r}, expected {expected!r}. Hint: {hint}.")
    print(f"Correct: your pass_at_k agrees with labkit.eval.evaluate.pass_at_k on all {len(CH07_CASES)} cases.")
    return True
