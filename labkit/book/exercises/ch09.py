"""Chapter 9, the variants: `check_ch09_one_update_run` grades reading the update count from the logs.

The histories it builds are constructed for teaching (typed-in numbers in the shape of the
loop's history.json), NOT model outputs.  Each case holds six runs under opaque names, in an
order that changes from case to case, each run built to catch one way of guessing:

    one_update      GRPO, 1 update per iteration: rho within 2e-6 of 1, clip fraction 0 (the answer)
    two_clipping    GRPO, 2 updates per iteration; the second one clips
    lowest_kl       GRPO, 2 updates per iteration, the lowest KL of all
    small_steps     GRPO, 2 updates per iteration, clip fraction 0 everywhere, but the second
                    update's rho leaves 1 by a few percent
    sft             cross-entropy, 2 updates per iteration: clip fraction 0.0, no ratio keys
    rft_half        cross-entropy, 2 updates in half of the iterations and none in the others
                    (their top-level KL, entropy and clip fields are None): 1 per iteration on average
"""

from __future__ import annotations

from ._calling import ExerciseError, call_student, require_function

CH09_ROLES = ("one_update", "two_clipping", "lowest_kl", "small_steps", "sft", "rft_half")

# Why a wrong pick is wrong: the decoy's role -> the hint.
CH09_HINTS = {
    "two_clipping": "that run made 2 updates in every iteration (and its second update clips); count each "
                    "iteration's 'updates'",
    "lowest_kl": "that run has the lowest KL, but the KL says how far the policy is from the reference, not how "
                 "many updates each iteration made; count each iteration's 'updates'",
    "small_steps": "that run's clip fraction is 0 at every update, yet it made 2 updates per iteration and its "
                   "second update's ratio left 1 (see ratio/min and ratio/max): a zero clip fraction only says "
                   "rho stayed inside [1 - eps, 1 + eps], not that rho was 1",
    "sft": "that run logs a clip fraction of 0.0 because cross-entropy (SFT) has no ratio to clip, and it made "
           "2 updates per iteration; a zero clip fraction is no evidence of one update",
    "rft_half": "that run (RFT) made 2 updates in some iterations and none in the others (no correct sample to "
                "learn from: an empty 'updates' list and None in the top-level fields); its mean is 1 update per "
                "iteration, but not one in each",
}

CRASH_HINT = (" (a constructed history in the loop's shape: an RFT iteration with no correct sample has an empty "
              "'updates' list and None in its top-level 'kl', 'entropy' and 'clip_ratio/*' fields, and SFT/RFT "
              "updates carry no 'ratio/*' keys; count each iteration's 'updates')")

ITERATIONS = 6
_KEYS = ("kl", "entropy", "grad_norm", "learning_rate", "clip_ratio/low_mean", "clip_ratio/high_mean",
         "clip_ratio/region_mean")


def _grpo_update(spread: float, clip: float, kl: float) -> dict:
    return {"loss": -0.001, "surrogate": -0.001, "kl": kl, "kl_k3": kl, "entropy": 0.11, "grad_norm": 2.0,
            "learning_rate": 1e-5, "clip_ratio/low_mean": clip / 2, "clip_ratio/high_mean": clip / 2,
            "clip_ratio/region_mean": clip, "ratio/mean": 1.0, "ratio/min": 1.0 - spread, "ratio/max": 1.0 + spread}


def _ce_update(kl: float) -> dict:
    return {"loss": 0.4, "surrogate": 0.4, "kl": kl, "kl_k3": kl, "entropy": 0.10, "grad_norm": 1.0,
            "learning_rate": 1e-5, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
            "clip_ratio/region_mean": 0.0}


def _record(iteration: int, updates: list[dict]) -> dict:
    return {"iteration": iteration, "reward": 0.5, "optimised_reward": 0.5, "frac_reward_zero_std": 0.25,
            "updates": updates, **{k: updates[-1][k] if updates else None for k in _KEYS}}


def _ch09_history(role: str) -> list[dict]:
    """One constructed run of `role` (see the module docstring), ITERATIONS iterations long."""
    history = []
    for it in range(1, ITERATIONS + 1):
        grow = it / ITERATIONS
        if role == "one_update":
            updates = [_grpo_update(1.5e-6, 0.0, 0.004 * grow)]
        elif role == "two_clipping":
            updates = [_grpo_update(1.5e-6, 0.0, 0.006 * grow), _grpo_update(0.35, 0.05, 0.008 * grow)]
        elif role == "lowest_kl":
            updates = [_grpo_update(1.2e-6, 0.0, 0.0002 * grow), _grpo_update(0.25, 0.01, 0.0003 * grow)]
        elif role == "small_steps":
            updates = [_grpo_update(1.0e-6, 0.0, 0.009 * grow), _grpo_update(0.05, 0.0, 0.010 * grow)]
        elif role == "sft":
            updates = [_ce_update(0.012 * grow), _ce_update(0.013 * grow)]
        elif role == "rft_half":
            updates = [_ce_update(0.003 * grow), _ce_update(0.0035 * grow)] if it % 2 else []
        else:
            raise ValueError(f"unknown role {role!r}")
        history.append(_record(it, updates))
    return history


def _ch09_cases() -> list[dict[str, str]]:
    """[{run name: role}]: each case names the six roles differently and lists them in another order."""
    orders = [CH09_ROLES, CH09_ROLES[::-1], CH09_ROLES[2:] + CH09_ROLES[:2], CH09_ROLES[3:] + CH09_ROLES[:3]]
    return [{f"run {'ABCDEF'[(k + shift) % 6]}{number}": role for k, role in enumerate(order)}
            for number, (shift, order) in enumerate(zip((0, 5, 4, 2), orders), start=1)]


def check_ch09_one_update_run(one_update_run) -> bool:
    """Grade chapter 9's exercise: `one_update_run(histories) -> str`.

    histories: {run name: that run's history, a list of per-iteration records as in
    history.json, each with its "updates" list}.  The answer is the name of the one run that
    made exactly one update in every iteration.  The cases are constructed histories (see the
    module docstring), each in another order with other names.
    """
    require_function(one_update_run)
    cases = _ch09_cases()
    for number, roles in enumerate(cases, start=1):
        histories = {name: _ch09_history(role) for name, role in roles.items()}
        names = list(histories)
        where = f"case {number} of {len(cases)}: one_update_run(histories of {', '.join(repr(n) for n in names)})"
        got = call_student(one_update_run, histories, where=where, hint=CRASH_HINT, not_written="one_update_run")
        expected = next(name for name, role in roles.items() if role == "one_update")
        if got == expected:
            continue
        if not isinstance(got, str) or got not in roles:
            raise ExerciseError(f"{where} returned {got!r}; return one of the run names given, as a string "
                                f"(here {expected!r})")
        raise ExerciseError(f"{where} returned {got!r}, expected {expected!r}. Hint: {CH09_HINTS[roles[got]]}.")
    print(f"Correct: your one_update_run found the one-update run in all {len(cases)} cases "
          f"({len(CH09_ROLES)} constructed runs each, in different orders).")
    return True


# -- The idea behind one update per iteration: rho stays 1 ---------------------------------------------

CH09_RATIO_HINTS = {
    "two_clipping": "its first update's ratio is 1, but its second one's leaves 1 (and clips): look at every "
                    "update of every iteration, not the first or the top-level fields only",
    "lowest_kl": "a low KL says the policy is near the reference, not that rho = 1: its second updates' "
                 "ratio/min and ratio/max leave 1",
    "small_steps": "its clip fraction is 0 everywhere, yet its second updates' ratio leaves 1 by 5%: a zero "
                   "clip fraction only says rho stayed inside [1 - eps, 1 + eps]; read ratio/min and ratio/max",
    "sft": "cross-entropy logs no ratio at all (no 'ratio/*' keys): no evidence that rho = 1, so the answer is "
           "False, not a guess",
    "rft_half": "cross-entropy logs no ratio (and some iterations made no update): no evidence that rho = 1",
    "one_update": "with one update per iteration every update is the first after sampling, so "
                  "rho = pi_theta / pi_old is 1 up to float rounding (within tol) and the clip never acts",
}


def check_ch09_ratio_stays_one(ratio_stays_one, tol: float = 2e-4) -> bool:
    """Grade chapter 9's exercise: `ratio_stays_one(history, tol) -> bool`: True exactly when every
    update of every iteration logged a ratio within `tol` of 1 on every token (ratio/min and ratio/max)
    and no clipping, the signature of one update per iteration; False for a history with no ratio to
    read (cross-entropy) or an update whose ratio left 1.

    Tried on the six constructed runs of the update-count exercise (see the module docstring); the
    hint names the run the answer got wrong and why."""
    require_function(ratio_stays_one)
    for number, role in enumerate(CH09_ROLES, start=1):
        history = _ch09_history(role)
        where = f"case {number} of {len(CH09_ROLES)}: ratio_stays_one(the {role} run's history, tol={tol:g})"
        got = call_student(ratio_stays_one, history, tol, where=where, hint=CRASH_HINT, not_written="ratio_stays_one")
        if not isinstance(got, bool):
            raise ExerciseError(f"{where} returned {got!r}; return True or False")
        expected = role == "one_update"
        if got != expected:
            raise ExerciseError(f"{where} returned {got}, expected {expected}. Hint: {CH09_RATIO_HINTS[role]}.")
    print(f"Correct: your ratio_stays_one tells the one-update run from the {len(CH09_ROLES) - 1} others by the "
          "ratio alone.")
    return True
