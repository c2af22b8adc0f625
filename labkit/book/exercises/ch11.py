"""Chapter 11: the process reward, written by the student and checked on six responses."""

from __future__ import annotations

import math

from ...task import worked
from ...studies import reasoning
from ._calling import ExerciseError, call_student, integer_division_hint, require_function

CHAIN = worked.Chain(41, (35, 12, -30, -7))  # levels 76, 88, 58, 51
_RIGHT = worked.worked_text(CHAIN)
# (response, what it tests): every one against CHAIN; the expected value is labkit.studies.reasoning.process_reward's
CH11_CASES = (
    (_RIGHT, "every step right"),
    ('{"final_stock": 51}', "a direct answer: no step"),
    ('41 + 35 = 76\n76 + 12 = 89\n89 - 30 = 59\n59 - 7 = 52\n{"final_stock": 52}', "one slip, and the steps after it "
     "start from a wrong stock"),
    ('41 + 35 = 76\n{"final_stock": 76}', "one right step of four"),
    (_RIGHT.replace('\n{"final_stock": 51}', '\n51 + 1 = 52\n{"final_stock": 52}'), "a fifth, invented step"),
    ('41 + 12 = 53\n53 + 35 = 88\n88 - 30 = 58\n58 - 7 = 51\n{"final_stock": 51}', "the first two movements swapped"),
)


def _decoys(verdict: worked.WorkedVerdict, chain: worked.Chain) -> dict[str, float]:
    """What the usual slips give on one response."""
    k, steps = len(chain.movements), verdict.steps
    right = reasoning.right_steps(verdict, chain)
    return {
        "over_written": right / len(steps) if steps else 0.0,
        "over_k": right / k,
        "arithmetic_only": sum(s.right for s in steps) / max(k, len(steps)) if steps else 0.0,
        "outcome": float(verdict.reward),
    }


CH11_HINTS = {
    "over_written": "you divide by the steps written: a response that writes one right step and stops earns the "
                    "whole reward; divide by max(k, steps written), so that every movement must be worked",
    "over_k": "you divide by k alone: a response that adds invented steps loses nothing for them; divide by "
              "max(k, steps written)",
    "arithmetic_only": "you count every step whose arithmetic holds: a step must also start from the true stock "
                       "after the movements before it and use the next movement (reasoning.right_steps says how)",
    "outcome": "that is the outcome reward (is the final number right?): the process reward pays for the steps",
}


def check_ch11_process_reward(process_reward) -> bool:
    """Grade chapter 11's exercise: `process_reward(verdict, chain) -> float` on six responses."""
    require_function(process_reward)
    for number, (text, purpose) in enumerate(CH11_CASES, start=1):
        verdict = worked.score_worked(text, "eos", CHAIN)
        where = f"case {number} of {len(CH11_CASES)} ({purpose}): {text!r}"
        got = call_student(process_reward, verdict, CHAIN, where=where, not_written="process_reward")
        expected = reasoning.process_reward(verdict, CHAIN)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
            raise ExerciseError(f"{where} returned {got!r}; return the share as a float (here {expected:g})")
        if abs(got - expected) <= 1e-9:
            continue
        slips = [name for name, value in _decoys(verdict, CHAIN).items() if abs(value - got) <= 1e-9]
        hint = (integer_division_hint(got, expected) or (CH11_HINTS[slips[0]] if slips else
                "count the steps that are right in order, over max(k, steps written)"))
        raise ExerciseError(f"{where} returned {got:g}, expected {expected:g} "
                            f"({reasoning.right_steps(verdict, CHAIN)} right steps of k = {len(CHAIN.movements)}, "
                            f"{len(verdict.steps)} written). Hint: {hint}.")
    print(f"Correct: your process_reward agrees with the lab's on all {len(CH11_CASES)} responses.")
    return True
