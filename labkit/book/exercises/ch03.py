"""Chapter 3, advantages: `check_ch03_group_advantages` grades the group-normalised advantages."""

from __future__ import annotations

from ._calling import require_like, ExerciseError, call_student, require_function


# Reward groups the chapter 3 checker tries, in order: the chapter's cases first, then the traps.
CH03_CASES = (
    ("the chapter's [1, 0, 1, 0]", [[1.0, 0.0, 1.0, 0.0]]),
    ("one winner in four", [[1.0, 0.0, 0.0, 0.0]]),
    ("a constant group of zeros", [[0.0, 0.0, 0.0, 0.0]]),
    ("a constant group of ones", [[1.0, 1.0, 1.0, 1.0]]),
    ("four groups at once (one row per prompt)", [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0],
                                                   [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]]),
    ("a group of G = 2", [[0.0, 1.0]]),
    ("a group of G = 8", [[0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]]),
    ("rewards that are not 0/1", [[0.3, 0.1, 0.9, 0.5]]),
    ("a constant group of three 0.1 (their mean is not exactly 0.1 in floating point)", [[0.1, 0.1, 0.1]]),
    ("rewards 1e-8 apart (eps is as large as the std here)", [[1e-8, 0.0]]),
)


def _ch03_variants(rewards):
    """Answers of the usual mistakes, to name the one a wrong answer matches."""
    import torch

    r = rewards.double()
    centred = r - r.mean(dim=1, keepdim=True)
    return {
        "sample std": centred / (r.std(dim=1, correction=1, keepdim=True) + 1e-8),
        "no eps": centred / r.std(dim=1, correction=0, keepdim=True),
        "eps inside the square root": centred / (r.var(dim=1, correction=0, keepdim=True) + 1e-8).sqrt(),
        "no std division": centred,
        "no centring": r / (r.std(dim=1, correction=0, keepdim=True) + 1e-8),
        "mean over all groups": (r - r.mean()) / (r.std(correction=0) + 1e-8),
        "not set to zero": centred / (centred.pow(2).mean(dim=1, keepdim=True).sqrt() + 1e-8),
        "torch.zeros": torch.zeros_like(r),
        "statistics over dim 0": (r - r.mean(dim=0, keepdim=True)) / (r.std(dim=0, correction=0, keepdim=True) + 1e-8),
        **({"mean without keepdim": (r - r.mean(dim=1)) / (r.std(dim=1, correction=0) + 1e-8)}
           if r.shape[0] == r.shape[1] else {}),  # (groups,) against (groups, G) broadcasts only when square
    }


CH03_KEEPDIM = ("r.mean(dim=1) has shape (groups,): keep the group axis, r.mean(dim=1, keepdim=True), so that each "
                "group's statistic lines up with its own row of (groups, G)")
CH03_HINTS = {
    "sample std": "use the population std (divide by G: `correction=0`), not torch's default sample std (G - 1)",
    "no eps": "add eps = 1e-8 to the std in the denominator: (r - mean) / (std + eps)",
    "eps inside the square root": "add eps to the std itself, (std + eps), not to the variance under the square root",
    "no std division": "that is Dr. GRPO's centred reward; GRPO also divides by (std + eps)",
    "no centring": "subtract the group's mean reward first",
    "mean over all groups": "mean and std are taken within each group (dim=1), one row per prompt",
    "not set to zero": ("centring in floating point can leave ~1e-17 that the division by (0 + eps) blows up; "
                        "detect constant groups (all rewards equal) and give them exactly 0.0"),
    "statistics over dim 0": "take the mean and std over each row (dim=1, one group per row), not down the columns",
    "mean without keepdim": CH03_KEEPDIM,
}


def _first_difference(got, expected) -> str:
    """The first group whose advantages differ, rounded: one line, however many groups the case has."""
    import torch

    g = int(torch.nonzero((got - expected).abs().amax(dim=1) > 1e-9)[0, 0])
    where = f"group {g} " if got.shape[0] > 1 else ""
    return (f"{where}returned {[round(v, 6) for v in got[g].tolist()]}, expected "
            f"{[round(v, 6) for v in expected[g].tolist()]}")


def check_ch03_group_advantages(group_advantages) -> bool:
    """Grade chapter 3's exercise: `group_advantages(rewards) -> advantages`.

    rewards: (groups, G) float64.  The answer must have shape (groups, G), agree with
    `labkit.grpo.losses.group_advantages` within 1e-9, be exactly 0.0 in every constant group,
    carry no gradient, and leave the rewards unchanged.
    """
    import torch

    from ...grpo.losses import group_advantages as reference
    from ...grpo.losses import zero_variance_groups

    require_function(group_advantages)
    total = len(CH03_CASES)
    for number, (what, rows) in enumerate(CH03_CASES, start=1):
        rewards = torch.tensor(rows, dtype=torch.float64)
        where = f"case {number} of {total} ({what}): group_advantages({rows})"
        given = rewards.clone()
        got = call_student(group_advantages, given, where=where, on_shape_mismatch=CH03_KEEPDIM)
        if not torch.equal(given, rewards):
            raise ExerciseError(f"{where} changed the rewards in place to {given.tolist()}; leave them unchanged")
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(rewards.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise ExerciseError(f"{where} returned {shape}; return a tensor of shape {tuple(rewards.shape)}, "
                                "one advantage per response")
        require_like(got, rewards, "group_advantages")
        expected = reference(rewards)
        got64 = got.detach().double()
        close = torch.allclose(got64, expected, rtol=0.0, atol=1e-9)
        # Name a known mistake first: a wrong formula (a global mean, say) also breaks the
        # constant groups, and its own hint is the one that helps.  Where the answer equals the
        # un-zeroed formula too (in a constant group every variant divides ~0 by eps alike),
        # the missing zeroing is the mistake to name.
        matches = [name for name, value in _ch03_variants(rewards).items()
                   if name in CH03_HINTS and torch.allclose(got64, value, rtol=0.0, atol=1e-9)]
        if matches and not close and "not set to zero" not in matches:
            raise ExerciseError(f"{where}: {_first_difference(got64, expected)}. Hint: {CH03_HINTS[matches[0]]}.")
        constant = zero_variance_groups(rewards)
        wrong_zero = constant[:, None] & (got64 != 0.0)
        if wrong_zero.any():
            g = int(torch.nonzero(wrong_zero)[0, 0])
            raise ExerciseError(f"{where}: group {g} is constant, so its advantages must be exactly 0.0, got "
                                f"{got64[g].tolist()}. Hint: {CH03_HINTS['not set to zero']}.")
        if close:
            continue
        raise ExerciseError(f"{where}: {_first_difference(got64, expected)}. "
                            "Hint: A = (r - mean) / (std + 1e-8) within each group.")
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    got = call_student(group_advantages, rewards, where="group_advantages on rewards that require grad")
    if got.requires_grad:
        raise ExerciseError("your advantages carry a gradient back to the rewards; rewards and advantages are "
                            "constants of the loss: detach the rewards first")
    print(f"Correct: your group_advantages agrees with labkit.grpo.losses.group_advantages on all {total} cases, "
          "gives exact zeros to constant groups and carries no gradient.")
    return True
