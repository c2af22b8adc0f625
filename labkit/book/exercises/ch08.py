"""Chapter 8, group size: `check_ch08_zero_signal` grades the chance that a group carries no signal."""

from __future__ import annotations

from ._calling import ExerciseError, call_student, require_function, require_number


# (p, G) pairs the chapter 8 checker tries: easy ones first, then the edges.
CH08_CASES = ((0.5, 2), (0.1, 4), (0.1, 2), (0.1, 8), (0.25, 3), (0.02, 16), (0.9, 5), (0.0, 4), (1.0, 4),
              (0.3, 1), (0.015, 8))


def _ch08_first_wrong(cases, values, reference, slips, default_hint: str, call) -> None:
    """Raise ExerciseError at the first case whose value is not reference(*case) within 1e-12; its hint
    names the slip whose formula the answer follows on EVERY case (one case cannot tell them apart),
    else `default_hint`.  call(*case): the student's call, as the message shows it."""
    for number, (case, value) in enumerate(zip(cases, values), start=1):
        expected = reference(*case)
        if abs(value - expected) <= 1e-12:
            continue
        hint = next((text for formula, text in slips
                     if all(abs(v - formula(*c)) <= 1e-12 for c, v in zip(cases, values))), default_hint)
        raise ExerciseError(f"case {number} of {len(cases)}: {call(*case)} returned {value!r}, expected {expected!r}. "
                            f"Hint: {hint}.")


def check_ch08_zero_signal(expected_frac_reward_zero_std) -> bool:
    """Grade chapter 8's exercise: `expected_frac_reward_zero_std(p, G) -> float`.

    The chance that a group of G independent rewards, each 1 with probability p, is
    constant (all right or all wrong), so its advantages are all zero: p^G + (1-p)^G.
    Compared with `labkit.grpo.losses.expected_frac_reward_zero_std` within 1e-12.
    """
    from ...grpo.losses import expected_frac_reward_zero_std as reference

    require_function(expected_frac_reward_zero_std)
    values = []
    for number, (p, G) in enumerate(CH08_CASES, start=1):
        where = f"case {number} of {len(CH08_CASES)}: expected_frac_reward_zero_std(p={p}, G={G})"
        got = call_student(expected_frac_reward_zero_std, p, G, where=where, not_written="expected_frac_reward_zero_std")
        values.append(require_number(got, where))
    # The usual slips, each a formula; a hint names the one the answer follows on EVERY case (at p = 1/2
    # all right and all wrong are equally likely, so one case alone cannot tell them apart).
    slips = (
        (lambda p, G: p ** G, "you counted only the all-right groups; an all-wrong group has zero variance too"),
        (lambda p, G: (1 - p) ** G, "you counted only the all-wrong groups; an all-right group has zero variance too"),
        (lambda p, G: 1 - reference(p, G),
         "that is the chance of a group WITH signal; the question asks for the zero-signal fraction"),
        (lambda p, G: p ** (G - 1) + (1 - p) ** (G - 1),
         "the exponent is G, the number of responses in the group (not G - 1)"),
    )
    _ch08_first_wrong(CH08_CASES, values, reference, slips,
                      "a group is constant when all G rewards are 1 (probability p^G) or all are 0",
                      lambda p, G: f"expected_frac_reward_zero_std(p={p}, G={G})")
    print(f"Correct: your expected_frac_reward_zero_std agrees with p^G + (1-p)^G on all {len(CH08_CASES)} cases.")
    return True


# -- Diagnose this: advantages normalised over the whole batch -------------------------------------------

CH08_ADVANTAGE_SIGNATURE = "check_advantages(rewards (P, G), advantages (P, G))"


def _ch08_advantage_cases(rewards) -> list[tuple[str, object, bool]]:
    """[(what, advantages, must the check refuse them?)] for one iteration's rewards (P, G): the
    protocol's group advantages, then the usual ways of computing them over the wrong set."""
    import torch

    from ...grpo.losses import group_advantages

    r = rewards.to(torch.float64)
    P, G = r.shape
    batch = (r - r.mean()) / (r.std(correction=0) + 1e-8)
    mean_per_group_std_of_batch = (r - r.mean(dim=1, keepdim=True)) / (r.std(correction=0) + 1e-8)
    shuffled = group_advantages(r.T.reshape(P, G)).reshape(G, P).T  # groups of the wrong rows (a stride slip)
    sample_std = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, correction=1, keepdim=True) + 1e-8)
    sample_std = torch.where(torch.isfinite(sample_std), sample_std, torch.zeros_like(sample_std))
    return [
        ("the protocol's group advantages (r - group mean) / (group std + 1e-8)", group_advantages(r), False),
        ("the protocol's advantages, 2 groups swapped with their rewards: still right", None, False),
        ("advantages normalised over the whole batch: (r - batch mean) / (batch std + eps)", batch, True),
        ("the rewards themselves used as advantages (nothing subtracted)", r.clone(), True),
        ("centred per group but divided by the batch's std", mean_per_group_std_of_batch, True),
        ("groups formed from the wrong rows (the batch read column-major)", shuffled, True),
        ("the sample std (divided by G - 1) instead of the population std (divided by G)", sample_std, True),
    ]


def check_ch08_advantage_check(check_advantages, rewards=None) -> bool:
    """Grade chapter 8's diagnose-this exercise: `check_advantages(rewards, advantages)` must raise
    AssertionError when the advantages are not the protocol's group advantages of those rewards, and
    return quietly when they are.  rewards: (P, G) of a real iteration (default: the G = 8 branch's
    first iteration with both constant and mixed groups)."""
    import torch

    from ...grpo.losses import group_advantages

    require_function(check_advantages)
    rewards = _ch08_rewards() if rewards is None else rewards
    cases = _ch08_advantage_cases(rewards)
    for number, (what, advantages, must_refuse) in enumerate(cases, start=1):
        r = rewards.to(torch.float64)
        if advantages is None:  # the same groups in another order: a check must not depend on the row order
            order = torch.arange(r.shape[0]).roll(1)
            r = r[order]
            advantages = group_advantages(r)
        where = f"case {number} of {len(cases)} ({what})"
        refusal = call_student(check_advantages, r.clone(), advantages.clone(), where=where,
                               hint="; signal wrong advantages with AssertionError (assert ...)",
                               assertion_is_answer=True)
        if refusal is not None:
            if not must_refuse:
                said = (str(refusal).splitlines() or ["no message"])[0]
                raise ExerciseError(f"{where}: your check refused right advantages ({said})")
            continue
        if must_refuse:
            hint = ("within each group the advantages must sum to 0, and be exactly 0 where the group's rewards "
                    "are all equal" if number in (3, 4, 6) else
                    "compare with the formula itself: (r - mean) / (std + 1e-8), the std with correction 0")
            raise ExerciseError(f"{where}: your check let them through. Hint: {hint}.")
    print(f"Correct: your check passes the protocol's advantages (in any row order) and refuses all "
          f"{sum(c[2] for c in cases)} wrong ones.")
    return True


def _ch08_rewards(runs=None):
    """(P, G) rewards of the G = 8 branch's first iteration that has both a constant group and a mixed one."""
    import torch

    from ...grpo import loop
    from ...lab.runs import REPO_ROOT

    runs = runs or REPO_ROOT / "runs" / "tiny"
    rows = loop.read_rollouts(runs / "grpo_g8")
    G = 8
    for iteration in sorted({r["iteration"] for r in rows}):
        rewards = torch.tensor([r["reward"] for r in rows if r["iteration"] == iteration], dtype=torch.float64)
        rewards = rewards.view(-1, G)
        constant = (rewards == rewards[:, :1]).all(dim=1)
        if constant.any() and not constant.all():
            return rewards
    raise ExerciseError(f"no iteration of {runs / 'grpo_g8'} has both a constant and a mixed group")


# -- Exercise: the zero-signal fraction of a batch of problems of different difficulty -------------------

# (per-problem success probabilities, G): one problem, equal ones, mixed ones, the edges
CH08_MIXED_CASES = (([0.5], 4), ([0.5, 0.5], 2), ([0.9, 0.1], 4), ([1.0, 0.0, 0.5], 2), ([0.2, 0.6, 0.95, 0.05], 8),
                    ([0.3, 0.3, 0.3, 0.9], 4), ([0.0, 1.0], 8), ([0.75, 0.25, 0.5, 0.5, 0.1], 3))


def _ch08_mixed_zero_signal(ps, G: int) -> float:
    """The expected fraction of constant groups when prompt k succeeds with its own probability p_k:
    the mean over the prompts of p_k^G + (1 - p_k)^G."""
    return sum(p ** G + (1.0 - p) ** G for p in ps) / len(ps)


def check_ch08_mixed_zero_signal(zero_signal_of_batch) -> bool:
    """Grade chapter 8's exercise: `zero_signal_of_batch(ps, G) -> float`, the expected fraction of groups
    with no signal when each prompt k has its own per-draw success probability ps[k].

    Compared within 1e-12 with the mean of p_k^G + (1 - p_k)^G.  Named slips: the single-p formula at
    the mean p (which underestimates it: p^G + (1-p)^G is convex in p), counting one kind of constant
    group only, the chance of signal instead."""
    require_function(zero_signal_of_batch)
    slips = (
        (lambda ps, G: (sum(ps) / len(ps)) ** G + (1 - sum(ps) / len(ps)) ** G,
         "you used the average p in p^G + (1-p)^G; the average of the curve is not the curve at the average "
         "(it is convex: easy and hard prompts are constant far more often than two average ones), so "
         "average p_k^G + (1-p_k)^G over the prompts"),
        (lambda ps, G: sum(p ** G for p in ps) / len(ps), "you counted only the all-right groups"),
        (lambda ps, G: sum((1 - p) ** G for p in ps) / len(ps), "you counted only the all-wrong groups"),
        (lambda ps, G: 1 - _ch08_mixed_zero_signal(ps, G),
         "that is the fraction WITH signal; the question asks for the groups without"),
        (lambda ps, G: sum(p ** G + (1 - p) ** G for p in ps),
         "you summed over the prompts: the fraction is the mean, so divide by the number of prompts"),
        (lambda ps, G: sum(p ** (G - 1) + (1 - p) ** (G - 1) for p in ps) / len(ps),
         "the exponent is G, the number of responses in a group (not G - 1)"),
    )
    values = []
    for number, (ps, G) in enumerate(CH08_MIXED_CASES, start=1):
        where = f"case {number} of {len(CH08_MIXED_CASES)}: zero_signal_of_batch(ps={ps}, G={G})"
        got = call_student(zero_signal_of_batch, list(ps), G, where=where, not_written="zero_signal_of_batch")
        values.append(require_number(got, where))
    _ch08_first_wrong(CH08_MIXED_CASES, values, _ch08_mixed_zero_signal, slips,
                      "prompt k's group is constant with probability p_k^G + (1 - p_k)^G; the batch's expected "
                      "fraction is the mean of that over its prompts",
                      lambda ps, G: f"zero_signal_of_batch(ps={ps}, G={G})")
    print(f"Correct: your zero_signal_of_batch agrees with the mean of p_k^G + (1-p_k)^G on all "
          f"{len(CH08_MIXED_CASES)} cases.")
    return True
