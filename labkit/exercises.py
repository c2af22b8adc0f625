"""Exercise checkers: one per chapter, in chapter order.

Each checker takes the student's function or answer, compares it with the
lab's own, and raises `ExerciseError` with a message that says what is wrong
(the input, what was expected, what came back).  On success it prints a short
confirmation and returns True.
"""

from __future__ import annotations


class ExerciseError(AssertionError):
    """The student's answer is wrong; the message says how."""


# ---------------------------------------------------------------- chapter 1

# Responses the chapter 1 checker tries, in order: the easy ones first, then the
# traps a plain `json.loads` falls into.  The expected answer comes from
# `labkit.verifier.parse_answer`, never from this list.
CH01_RESPONSES = (
    '{"final_stock": 43}',
    ' {"final_stock":43}\n',
    "The final stock is 43.",
    '{"final_stock": "43"}',
    '{"final_stock": 43.0}',
    '{"final_stock": 301}',
    '{"final_stock": -1}',
    '{"final_stock": 0}',
    '{"final_stock": 300}',
    '{"stock": 43}',
    '{"final_stock": 43, "unit": "boxes"}',
    "[43]",
    '{"final_stock": true}',
    '{"final_stock": false}',
    '{"final_stock": 43, "final_stock": 43}',
    '{"final_stock": NaN}',
    '{"final_stock": Infinity}',
    '{"final_stock": 1e400}',
    '{"final_stock": null}',
    '```json\n{"final_stock": 43}\n```',
    '{"final_stock": 43}\n{"final_stock": 43}',
    '{"final_stock": 43} is my answer',
    '{"final_stock": 43}' + " " * 237,  # 256 characters: still allowed
    '{"final_stock": 43}' + " " * 238,  # 257 characters: oversized
    "",
    "\x00",
    "[" * 200,
)

CH01_HINTS = {
    "boolean": "in Python `True` is an int (isinstance(True, int) is True): test `type(v) is int`",
    "duplicate_field": "json.loads keeps the last of two equal keys silently: pass object_pairs_hook",
    "non_finite": "json.loads accepts NaN and Infinity unless you pass parse_constant",
    "float": "1e400 and 43.0 are JSON numbers with an exponent or a fraction, not integers",
    "oversized": "the limit is on the whole text: at most 256 characters",
    "several_objects": "a second object after the first is not one answer",
    "markdown_fence": "a code fence around the JSON is not a bare JSON object",
    "extra_field": "exactly one field: no other keys",
    "missing_field": "the field must be named exactly final_stock",
    "out_of_range": "the integer must lie in 0..300, both ends included",
    "not_json": "a response that is not one JSON value must return False, not raise",
}


def check_ch01_is_valid_answer(is_valid_answer) -> bool:
    """Grade chapter 1's exercise: `is_valid_answer(text) -> bool`.

    It must return True exactly when `text` alone is a schema-valid answer
    (what `labkit.verifier.parse_answer(text).valid` says), return a bool, and
    never raise on any string.
    """
    from .verifier import REASON_DESCRIPTIONS, parse_answer

    if not callable(is_valid_answer):
        raise ExerciseError(f"pass your function itself, not {type(is_valid_answer).__name__}")
    total = len(CH01_RESPONSES)
    for number, text in enumerate(CH01_RESPONSES, start=1):
        expected = parse_answer(text)
        where = f"case {number} of {total}: is_valid_answer({text[:60]!r}{'...' if len(text) > 60 else ''})"
        try:
            got = is_valid_answer(text)
        except NotImplementedError as err:
            raise ExerciseError(f"is_valid_answer is not written yet ({err})") from None
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(
                f"{where} raised {type(err).__name__}: {err}. A verifier must answer for every "
                "string; catch the parser's errors and return False."
            ) from None
        if type(got) is not bool:
            raise ExerciseError(f"{where} returned {got!r} ({type(got).__name__}); return True or False.")
        if got != expected.valid:
            if expected.valid:
                why = f"it is a valid answer (value {expected.value}); you returned False"
                hint = "surrounding whitespace (space, tab, newline) is allowed, and 0 and 300 are in range"
            else:
                why = (f"it is invalid ({expected.reason}: {REASON_DESCRIPTIONS[expected.reason]}); "
                       "you returned True")
                hint = CH01_HINTS.get(expected.reason, "compare with the rules of section 1.4")
            raise ExerciseError(f"{where}: {why}. Hint: {hint}.")
    print(f"Correct: your is_valid_answer agrees with labkit.verifier on all {total} responses.")
    return True


# ---------------------------------------------------------------- chapter 2


def _ch02_cases():
    """(name, logits (R, V) float64, response_ids (R,) long) for chapter 2's checker, easy ones first."""
    import torch

    g = torch.Generator().manual_seed(2)
    flat = torch.zeros(3, 3, dtype=torch.float64)  # uniform over 3 tokens: the answer is 3 * log(1/3)
    random = torch.randn(5, 11, generator=g, dtype=torch.float64)
    # Logits hundreds apart, and the response takes an unlikely token: exp underflows to 0 there,
    # so log(softmax(x)) gives -inf where log_softmax(x) stays finite.
    wide = torch.randn(4, 7, generator=g, dtype=torch.float64) * 300
    unlikely = torch.argmin(wide, dim=-1)
    return [
        ("uniform logits, 3 tokens of 3", flat, torch.tensor([0, 2, 1])),
        ("random logits, 5 tokens of 11", random, torch.randint(0, 11, (5,), generator=g)),
        ("one token (a response that is only EOS)", random[:1], torch.tensor([4])),
        ("logits hundreds apart, unlikely tokens chosen", wide, unlikely),
    ]


def _ch02_hint(value: float, logits, response_ids) -> str:
    """What a wrong `sequence_logprob` value most likely did, from the usual slips."""
    import math

    import torch

    picked = lambda table: torch.gather(table, 1, response_ids[:, None]).squeeze(1)  # noqa: E731
    logp = picked(torch.log_softmax(logits, dim=-1))
    if math.isnan(value) or math.isinf(value):
        return ("log(softmax(x)) underflows to log(0) = -inf when logits are far apart: use "
                "torch.log_softmax(logits, dim=-1), which subtracts the maximum first")
    slips = [
        (float(logp.mean()), "average over tokens, not sum: the response's probability is the PRODUCT of its "
                             "token probabilities, so its log-prob is the SUM of theirs"),
        (float(logp.sum().exp()), "that is the probability exp(sum); return the log-probability, the sum itself"),
        (float(picked(logits).sum()), "you summed raw logits; normalise them over the vocabulary first "
                                      "(log_softmax over the last dimension)"),
        (float(picked(torch.log_softmax(logits, dim=0)).sum()), "log_softmax over the wrong dimension: normalise "
                                                                "over the vocabulary (dim=-1), not the positions"),
        (float(logp[:-1].sum()), "the last token (EOS) is part of the response and counts too"),
    ]
    for slip_value, hint in slips:
        if math.isclose(value, slip_value, rel_tol=1e-9, abs_tol=1e-9):
            return hint
    return "take log_softmax(logits, dim=-1), pick each row's response token with gather, and sum"


def check_ch02_sequence_logprob(sequence_logprob, real=None) -> bool:
    """Grade chapter 2's exercise: `sequence_logprob(logits (R, V), response_ids (R,)) -> 0-d tensor`.

    It must return sum_j log_softmax(logits[j])[response_ids[j]], the log-probability of the
    whole response, within 1e-9 on float64 cases (including logits far apart, where
    log(softmax) underflows).  `real`, optional: (logits (R, V), response_ids (R,),
    behaviour_logprobs list of R floats) of a sampled rollout; the answer must then match the
    sum of the recorded log-probs within 2e-4 per token (the protocol's tolerance).  A stub's
    NotImplementedError propagates unchanged.
    """
    import math

    import torch

    if not callable(sequence_logprob):
        raise ExerciseError(f"pass your function itself, not {type(sequence_logprob).__name__}")
    cases = _ch02_cases()
    for number, (name, logits, response_ids) in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)} ({name}): sequence_logprob(logits {tuple(logits.shape)}, " \
                f"response_ids {response_ids.tolist()})"
        try:
            got = sequence_logprob(logits.clone(), response_ids.clone())
        except NotImplementedError:
            raise  # a stub not written yet: its own "your turn" message says what to do
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(f"{where} raised {type(err).__name__}: {err}") from None
        if isinstance(got, torch.Tensor) and got.numel() != 1:
            raise ExerciseError(f"{where} returned a tensor of shape {tuple(got.shape)}; return one number "
                                "(a 0-d tensor): the sum over the response's tokens")
        try:
            value = float(got)
        except (TypeError, ValueError):
            raise ExerciseError(f"{where} returned {got!r}; return a number (a 0-d tensor)") from None
        expected = float(torch.gather(torch.log_softmax(logits, dim=-1), 1, response_ids[:, None]).sum())
        if not math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-9):
            raise ExerciseError(f"{where} returned {value!r}, expected {expected!r}. "
                                f"Hint: {_ch02_hint(value, logits, response_ids)}.")
    if real is not None:
        logits, response_ids, recorded = real
        value = float(sequence_logprob(logits, response_ids))
        total = float(sum(recorded))
        if not abs(value - total) <= 2e-4 * len(recorded):
            raise ExerciseError(f"on the real rollout your sequence log-prob is {value:.6f}, but its recorded "
                                f"behaviour log-probs sum to {total:.6f}")
        print(f"On the real rollout: log-prob of the whole response {value:.4f}, probability "
              f"{math.exp(value):.4g} (the recorded token log-probs sum to {total:.4f}).")
    print(f"Correct: your sequence_logprob agrees with log_softmax + gather + sum on all {len(cases)} cases.")
    return True


# ---------------------------------------------------------------- chapter 8

# (p, G) pairs the chapter 8 checker tries: easy ones first, then the edges.
CH08_CASES = ((0.5, 2), (0.1, 4), (0.1, 2), (0.1, 8), (0.25, 3), (0.02, 16), (0.9, 5), (0.0, 4), (1.0, 4),
              (0.3, 1), (0.015, 8))


def check_ch08_zero_signal(zero_signal_fraction) -> bool:
    """Grade chapter 8's exercise: `zero_signal_fraction(p, G) -> float`.

    The chance that a group of G independent rewards, each 1 with probability p, is
    constant (all right or all wrong), so its advantages are all zero: p^G + (1-p)^G.
    Compared with `labkit.group_size.zero_signal_fraction` within 1e-12.
    """
    from .group_size import zero_signal_fraction as reference

    if not callable(zero_signal_fraction):
        raise ExerciseError(f"pass your function itself, not {type(zero_signal_fraction).__name__}")
    for number, (p, G) in enumerate(CH08_CASES, start=1):
        where = f"case {number} of {len(CH08_CASES)}: zero_signal_fraction(p={p}, G={G})"
        try:
            got = zero_signal_fraction(p, G)
        except NotImplementedError as err:
            raise ExerciseError(f"zero_signal_fraction is not written yet ({err})") from None
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(f"{where} raised {type(err).__name__}: {err}") from None
        try:
            value = float(got)
        except (TypeError, ValueError):
            raise ExerciseError(f"{where} returned {got!r}; return a number (a probability)") from None
        expected = reference(p, G)
        if abs(value - expected) <= 1e-12:
            continue
        if abs(value - p ** G) <= 1e-12:
            hint = "you counted only the all-right groups; an all-wrong group has zero variance too"
        elif abs(value - (1 - p) ** G) <= 1e-12:
            hint = "you counted only the all-wrong groups; an all-right group has zero variance too"
        elif abs(value - (1 - expected)) <= 1e-12:
            hint = "that is the chance of a group WITH signal; the question asks for the zero-signal fraction"
        elif G > 1 and abs(value - (p ** (G - 1) + (1 - p) ** (G - 1))) <= 1e-12:
            hint = "the exponent is G, the number of responses in the group (not G - 1)"
        else:
            hint = "a group is constant when all G rewards are 1 (probability p^G) or all are 0"
        raise ExerciseError(f"{where} returned {value!r}, expected {expected!r}. Hint: {hint}.")
    print(f"Correct: your zero_signal_fraction agrees with p^G + (1-p)^G on all {len(CH08_CASES)} cases.")
    return True


# ---------------------------------------------------------------- chapter 3

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
    }


CH03_HINTS = {
    "sample std": "use the population std (divide by G: `correction=0`), not torch's default sample std (G - 1)",
    "no eps": "add eps = 1e-8 to the std in the denominator: (r - mean) / (std + eps)",
    "eps inside the square root": "add eps to the std itself, (std + eps), not to the variance under the square root",
    "no std division": "that is Dr. GRPO's centred reward; GRPO also divides by (std + eps)",
    "no centring": "subtract the group's mean reward first",
    "mean over all groups": "mean and std are taken within each group (dim=1), one row per prompt",
    "not set to zero": ("centring in floating point can leave ~1e-17 that the division by (0 + eps) blows up; "
                        "detect constant groups (all rewards equal) and give them exactly 0.0"),
}


def check_ch03_group_advantages(group_advantages) -> bool:
    """Grade chapter 3's exercise: `group_advantages(rewards) -> advantages`.

    rewards: (groups, G) float64.  The answer must have shape (groups, G), agree with
    `labkit.losses.group_advantages` within 1e-9, be exactly 0.0 in every constant group,
    carry no gradient, and leave the rewards unchanged.
    """
    import torch

    from .losses import group_advantages as reference
    from .losses import zero_variance_groups

    if not callable(group_advantages):
        raise ExerciseError(f"pass your function itself, not {type(group_advantages).__name__}")
    total = len(CH03_CASES)
    for number, (what, rows) in enumerate(CH03_CASES, start=1):
        rewards = torch.tensor(rows, dtype=torch.float64)
        where = f"case {number} of {total} ({what}): group_advantages({rows})"
        given = rewards.clone()
        try:
            got = group_advantages(given)
        except NotImplementedError:
            raise  # the stub's "your turn" message, unchanged
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(f"{where} raised {type(err).__name__}: {err}") from None
        if not torch.equal(given, rewards):
            raise ExerciseError(f"{where} changed the rewards in place to {given.tolist()}; leave them unchanged")
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(rewards.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise ExerciseError(f"{where} returned {shape}; return a tensor of shape {tuple(rewards.shape)}, "
                                "one advantage per response")
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
            raise ExerciseError(f"{where} returned {got64.tolist()}, expected {expected.tolist()}. "
                                f"Hint: {CH03_HINTS[matches[0]]}.")
        constant = zero_variance_groups(rewards)
        wrong_zero = constant[:, None] & (got64 != 0.0)
        if wrong_zero.any():
            g = int(torch.nonzero(wrong_zero)[0, 0])
            raise ExerciseError(f"{where}: group {g} is constant, so its advantages must be exactly 0.0, got "
                                f"{got64[g].tolist()}. Hint: {CH03_HINTS['not set to zero']}.")
        if close:
            continue
        raise ExerciseError(f"{where} returned {got64.tolist()}, expected {expected.tolist()}. "
                            "Hint: A = (r - mean) / (std + 1e-8) within each group.")
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    try:
        got = group_advantages(rewards)
    except NotImplementedError:
        raise
    except Exception as err:
        raise ExerciseError(f"group_advantages on rewards that require grad raised {type(err).__name__}: {err}") from None
    if got.requires_grad:
        raise ExerciseError("your advantages carry a gradient back to the rewards; rewards and advantages are "
                            "constants of the loss: detach the rewards first")
    print(f"Correct: your group_advantages agrees with labkit.losses.group_advantages on all {total} cases, "
          "gives exact zeros to constant groups and carries no gradient.")
    return True


# ---------------------------------------------------------------- chapter 4

# (log rho, advantage) per token for the chapter 4 checker: each side of each clip edge, both signs.
CH04_LOG_RATIOS = (-0.7, -0.25, -0.2, -0.1, 0.0, 0.1, 0.17, 0.2, 0.6)
CH04_ADVANTAGES = (1.0, -1.0, 0.5, -1.5, 0.0)


def _ch04_reference(log_ratio: float, advantage: float, clip_eps: float):
    """(objective, d objective / d logp_cur) of one token, from labkit.losses.clipped_surrogate."""
    import torch

    from .losses import clipped_surrogate

    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_surrogate(logp, torch.zeros(1, 1, dtype=torch.float64),
                                torch.tensor([advantage], dtype=torch.float64),
                                torch.ones(1, 1, dtype=torch.bool), clip_eps=clip_eps)
    (grad,) = torch.autograd.grad(-loss, logp)
    return -loss.item(), grad.item()


def check_ch04_clipped_objective(clipped_objective) -> bool:
    """Grade chapter 4's exercise: `clipped_objective(logp_cur, logp_old, advantages, clip_eps) -> (B, T)`.

    Each token's objective min(rho A, clip(rho, 1 - eps, 1 + eps) A), rho = exp(logp_cur -
    logp_old), compared with `labkit.losses.clipped_surrogate` token by token (within 1e-9,
    float64), and its gradient with respect to logp_cur: rho A on the unclipped branch,
    exactly 0 where the clip is active.
    """
    import torch

    if not callable(clipped_objective):
        raise ExerciseError(f"pass your function itself, not {type(clipped_objective).__name__}")
    checked = 0
    for clip_eps in (0.2, 0.1):
        # B = 5 responses (one advantage each), T = 9 tokens: every log-ratio for every advantage.
        logp_old = torch.linspace(-3.0, -0.5, len(CH04_LOG_RATIOS), dtype=torch.float64).repeat(len(CH04_ADVANTAGES), 1)
        log_ratio = torch.tensor(CH04_LOG_RATIOS, dtype=torch.float64).repeat(len(CH04_ADVANTAGES), 1)
        logp_cur = (logp_old + log_ratio).requires_grad_(True)
        advantages = torch.tensor(CH04_ADVANTAGES, dtype=torch.float64)
        try:
            got = clipped_objective(logp_cur, logp_old, advantages, clip_eps)
        except NotImplementedError:
            raise  # the stub's "your turn" message, unchanged
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(f"clipped_objective(logp_cur (5, 9), logp_old (5, 9), advantages (5,), "
                                f"clip_eps={clip_eps}) raised {type(err).__name__}: {err}") from None
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(logp_cur.shape):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise ExerciseError(f"clipped_objective returned {shape}; return one objective per token, shape (5, 9) "
                                "(broadcast each response's advantage over its tokens: advantages[:, None])")
        if not got.requires_grad:
            raise ExerciseError("your objective carries no gradient to logp_cur: build it from logp_cur with torch "
                                "operations (no .detach(), .item() or numpy)")
        (grad,) = torch.autograd.grad(got.sum(), logp_cur, allow_unused=True)
        if grad is None:
            raise ExerciseError("your objective does not depend on logp_cur through autograd")
        for b, A in enumerate(CH04_ADVANTAGES):
            for t, x in enumerate(CH04_LOG_RATIOS):
                rho = torch.tensor(x, dtype=torch.float64).exp().item()
                value, slope = _ch04_reference(x, A, clip_eps)
                where = f"token with rho = {rho:.4f}, A = {A:+g}, clip_eps = {clip_eps}"
                if abs(got[b, t].item() - value) > 1e-9:
                    if abs(got[b, t].item() - rho * A) <= 1e-9:
                        hint = "you returned rho A: take the minimum with the clipped term clip(rho, 1-eps, 1+eps) A"
                    elif abs(got[b, t].item() - max(rho * A, min(max(rho, 1 - clip_eps), 1 + clip_eps) * A)) <= 1e-9:
                        hint = "take the minimum (the pessimistic term), not the maximum"
                    else:
                        hint = "min(rho A, clip(rho, 1 - eps, 1 + eps) A), with rho = exp(logp_cur - logp_old)"
                    raise ExerciseError(f"{where}: objective {got[b, t].item():.6g}, expected {value:.6g}. Hint: {hint}.")
                if abs(grad[b, t].item() - slope) > 1e-9:
                    if slope == 0.0:
                        hint = ("the clip is active here, so the gradient must be exactly 0: compute the clipped term "
                                "with torch.clamp on rho (its gradient is 0 outside the interval), and do not detach "
                                "anything else")
                    else:
                        hint = ("the gradient of rho A with respect to logp_cur is rho A (rho = exp(logp_cur - "
                                "logp_old)); did you detach rho, or compute it from logp_old?")
                    raise ExerciseError(f"{where}: d objective / d logp_cur = {grad[b, t].item():.6g}, "
                                        f"expected {slope:.6g}. Hint: {hint}.")
                checked += 1
    print(f"Correct: your clipped_objective matches labkit.losses.clipped_surrogate on {checked} tokens "
          "(values and gradients, both signs of A, both sides of both clip edges).")
    return True


# ---------------------------------------------------------------- chapter 5


def _ch05_local_blocks(logits_cur, logits_ref, block_size):
    """The protocol's warning: each block softmax-normalised on its own (a different, wrong sum)."""
    import torch

    total = torch.zeros(logits_cur.shape[0], dtype=torch.float64)
    for start in range(0, logits_cur.shape[-1], block_size):
        logp = torch.log_softmax(logits_cur[:, start:start + block_size].double(), dim=-1)
        logq = torch.log_softmax(logits_ref[:, start:start + block_size].double(), dim=-1)
        total += (logp.exp() * (logp - logq)).sum(dim=-1)
    return total


def check_ch05_blocked_kl(blocked_kl) -> bool:
    """Grade chapter 5's exercise: `blocked_kl(logits_cur, logits_ref, block_size) -> (N,)`.

    The exact KL(p_cur || p_ref) of each row's next-token distributions, computed one
    vocabulary block at a time with the full normaliser.  Compared with
    `labkit.losses.exact_prefix_kl` in float64 (within 1e-10 relative) on random logits,
    with block sizes that do and do not divide V, large logits (no overflow), and
    identical rows (KL exactly 0 is not required, but within 1e-12).
    """
    import torch

    from .losses import exact_prefix_kl

    if not callable(blocked_kl):
        raise ExerciseError(f"pass your function itself, not {type(blocked_kl).__name__}")
    g = torch.Generator().manual_seed(5)
    cur = torch.randn(6, 50, generator=g, dtype=torch.float64) * 2.0
    ref = torch.randn(6, 50, generator=g, dtype=torch.float64) * 2.0
    cases = [
        ("random logits, 6 prefixes x V = 50", cur, ref, 16),
        ("the same, one block holding the whole vocabulary", cur, ref, 50),
        ("the same, blocks of 7 (the last block is shorter)", cur, ref, 7),
        ("the same, blocks of 1", cur, ref, 1),
        ("large logits (exp would overflow without subtracting the maximum)", cur * 400.0, ref * 400.0, 16),
        ("identical distributions", cur, cur.clone(), 16),
    ]
    for number, (what, logits_cur, logits_ref, block_size) in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)} ({what}, block_size={block_size})"
        try:
            got = blocked_kl(logits_cur.clone(), logits_ref.clone(), block_size)
        except NotImplementedError:
            raise  # the stub's "your turn" message, unchanged
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(f"{where} raised {type(err).__name__}: {err}") from None
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (logits_cur.shape[0],):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise ExerciseError(f"{where}: returned {shape}; return one KL per prefix, shape ({logits_cur.shape[0]},)")
        got = got.detach().double()
        expected = exact_prefix_kl(logits_cur, logits_ref, block_size=block_size)
        if not torch.isfinite(got).all():
            raise ExerciseError(f"{where}: got {got.tolist()}. Hint: subtract each row's maximum before exp "
                                "(log-sum-exp), so no exponential overflows.")
        if torch.allclose(got, expected, rtol=1e-10, atol=1e-12):
            continue
        local = _ch05_local_blocks(logits_cur, logits_ref, block_size)
        if torch.allclose(got, local, rtol=1e-10, atol=1e-12):
            hint = ("you normalised each block on its own; every block needs the FULL normaliser, "
                    "log p(v) = z_v - logsumexp over all V entries, found by a first pass over the blocks")
        elif torch.allclose(got, exact_prefix_kl(logits_ref, logits_cur, block_size=block_size), rtol=1e-10, atol=1e-12):
            hint = "that is KL(p_ref || p_cur); the lab's KL weighs by the current policy: sum p_cur (log p_cur - log p_ref)"
        else:
            hint = "sum over all V entries of p_cur(v) (log p_cur(v) - log p_ref(v)), with log p = z - logsumexp(z)"
        raise ExerciseError(f"{where}: got {[round(v, 9) for v in got.tolist()]}, expected "
                            f"{[round(v, 9) for v in expected.tolist()]}. Hint: {hint}.")
    print(f"Correct: your blocked_kl agrees with labkit.losses.exact_prefix_kl on all {len(cases)} cases.")
    return True


# ---------------------------------------------------------------- chapter 7

# (n, c, k) triples the chapter 7 checker tries: the lab's budget (n = 4) first, then the
# edges (no correct sample, every sample correct, n - c < k) and a larger n.
CH07_CASES = ((4, 1, 1), (4, 2, 1), (4, 1, 2), (4, 2, 2), (4, 1, 3), (4, 1, 4), (4, 0, 1), (4, 0, 4), (4, 4, 1),
              (4, 3, 2), (10, 3, 5), (200, 13, 10), (1, 1, 1), (1, 0, 1))


def check_ch07_pass_at_k(pass_at_k) -> bool:
    """Grade chapter 7's exercise: `pass_at_k(n, c, k) -> float`, one problem's unbiased pass@k.

    n samples of the problem, c of them correct, 1 <= k <= n:
    pass@k = 1 - C(n-c, k) / C(n, k), the chance that k samples drawn without replacement
    from the n include a correct one (Chen et al. 2021).  Compared with
    `labkit.evaluate.pass_at_k` within 1e-12 on CH07_CASES; the common slips (per-draw
    success, the biased plug-in 1 - (1 - c/n)^k, best-of-n, forgetting the "1 -") get a hint.
    """
    import math

    from .evaluate import pass_at_k as reference

    if not callable(pass_at_k):
        raise ExerciseError(f"pass your function itself, not {type(pass_at_k).__name__}")
    for number, (n, c, k) in enumerate(CH07_CASES, start=1):
        where = f"case {number} of {len(CH07_CASES)}: pass_at_k(n={n}, c={c}, k={k})"
        try:
            got = pass_at_k(n, c, k)
        except NotImplementedError:
            raise  # the stub's "your turn" message, unchanged
        except Exception as err:  # the student's code may raise anything; report it, never crash
            hint = (" When n - c < k every draw of k samples holds a correct one: C(n-c, k) is 0 and pass@k is 1."
                    if n - c < k else "")
            raise ExerciseError(f"{where} raised {type(err).__name__}: {err}.{hint}") from None
        try:
            value = float(got)
        except (TypeError, ValueError):
            raise ExerciseError(f"{where} returned {got!r}; return a number (a probability)") from None
        expected = reference(n, c, k)
        if abs(value - expected) <= 1e-12:
            continue
        all_fail = math.comb(n - c, k) / math.comb(n, k)
        if abs(value - (1 - (1 - c / n) ** k)) <= 1e-12:
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
    print(f"Correct: your pass_at_k agrees with labkit.evaluate.pass_at_k on all {len(CH07_CASES)} cases.")
    return True


# ---------------------------------------------------------------- chapter 6

CH06_KEYS = ("reward", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio")


def _ch06_rows(groups, order="grouped"):
    """Constructed rollout rows (not model outputs): groups = [(problem_id, [(reward, tokens, finish), ...])].

    Each response's text is a fixed 19-character answer whatever its token count, so a
    length counted in characters differs from one counted in tokens.  order "interleaved"
    deals the rows round-robin (first response of every group, then the second, ...).
    """
    per_group = []
    for problem_id, responses in groups:
        rows = []
        for j, (reward, tokens, finish) in enumerate(responses):
            rows.append({"rollout_id": f"constructed-{problem_id}-{j}", "iteration": 1, "problem_id": problem_id,
                         "response_ids": list(range(100, 100 + tokens)), "text": '{"final_stock": 43}',
                         "finish_reason": finish, "reward": float(reward)})
        per_group.append(rows)
    if order == "grouped":
        return [r for rows in per_group for r in rows]
    width = max(len(rows) for rows in per_group)
    return [rows[j] for j in range(width) for rows in per_group if j < len(rows)]


def _ch06_rewards_by_problem(rows) -> dict[str, list[float]]:
    """The iteration's groups: the rewards of the rows sharing a problem_id."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        groups.setdefault(r["problem_id"], []).append(float(r["reward"]))
    return groups


def _ch06_reference(rows) -> dict:
    """The logged metrics of one iteration, from its raw rollouts (groups = rows sharing a problem_id)."""
    groups = _ch06_rewards_by_problem(rows)
    return {
        "reward": sum(float(r["reward"]) for r in rows) / len(rows),
        "frac_reward_zero_std": sum(len(set(g)) == 1 for g in groups.values()) / len(groups),
        "completions/mean_length": sum(len(r["response_ids"]) for r in rows) / len(rows),
        "completions/clipped_ratio": sum(r["finish_reason"] == "length" for r in rows) / len(rows),
    }


def _ch06_variants(rows) -> dict:
    """The usual mistakes' answers, {(key, name): value}, to name the one a wrong answer matches."""
    n = len(rows)
    groups = _ch06_rewards_by_problem(rows)
    G = n // len(groups)
    chunks = [[float(r["reward"]) for r in rows[i:i + G]] for i in range(0, n, G)]
    right = _ch06_reference(rows)
    return {
        # checked in this order; case 1 (2 groups with signal, 3 all wrong, 1 all right) tells them all apart
        ("frac_reward_zero_std", "with signal"): 1.0 - right["frac_reward_zero_std"],
        ("frac_reward_zero_std", "all wrong only"): sum(set(g) == {0.0} for g in groups.values()) / len(groups),
        ("frac_reward_zero_std", "all right only"): sum(set(g) == {1.0} for g in groups.values()) / len(groups),
        ("frac_reward_zero_std", "consecutive chunks"): sum(len(set(c)) == 1 for c in chunks) / len(chunks),
        ("completions/mean_length", "characters"): sum(len(r["text"]) for r in rows) / n,
        ("completions/mean_length", "without EOS"): sum(len(r["response_ids"]) - 1 for r in rows) / n,
        ("completions/clipped_ratio", "reward 0"): sum(float(r["reward"]) == 0.0 for r in rows) / n,
        ("completions/clipped_ratio", "eos"): sum(r["finish_reason"] == "eos" for r in rows) / n,
        ("reward", "sum"): sum(float(r["reward"]) for r in rows),
    }


CH06_HINTS = {
    "all wrong only": ("an all-correct group [1, 1, 1, 1] has zero variance too: "
                       "count every group whose rewards are all equal"),
    "all right only": ("an all-wrong group [0, 0, 0, 0] has zero variance too: "
                       "count every group whose rewards are all equal"),
    "with signal": "that is the fraction of groups WITH signal; frac_reward_zero_std counts the constant groups",
    "consecutive chunks": ("a group is the G responses to one prompt: group the rows by problem_id, "
                           "not by consecutive chunks of rows"),
    "characters": "lengths are counted in tokens, len(response_ids), not in characters of the text",
    "without EOS": "the EOS token is part of the response (it is the last id of response_ids and it is scored)",
    "reward 0": ("clipped means cut at the token limit (finish_reason == 'length'), "
                 "not rewarded 0: most wrong answers ended with EOS"),
    "eos": "that is the fraction that ended with EOS; clipped_ratio counts finish_reason == 'length'",
    "sum": "the logged reward is the mean over the iteration's rollouts, not the sum",
}


def _ch06_cases():
    E, L = "eos", "length"
    return [
        ("six groups: two with signal, three all wrong, one all right; one response cut at the limit",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)]),
                     ("p5", [(0, 9, E), (0, 9, E), (0, 9, E), (0, 9, E)]),
                     ("p6", [(0, 11, E), (0, 7, E), (0, 8, E), (0, 9, E)])])),
        ("one group of each kind: [1,0,0,0], [0,0,0,0], [1,1,1,1], [1,1,0,0], one response cut at the limit",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)])])),
        ("every group all wrong",
         _ch06_rows([(f"p{k}", [(0, 5 + k, E)] * 4) for k in range(1, 5)])),
        ("the same groups as the first case, rows dealt round-robin (not grouped)",
         _ch06_rows([("p1", [(1, 7, E), (0, 9, E), (0, 64, L), (0, 6, E)]),
                     ("p2", [(0, 8, E), (0, 7, E), (0, 7, E), (0, 12, E)]),
                     ("p3", [(1, 7, E), (1, 7, E), (1, 8, E), (1, 7, E)]),
                     ("p4", [(1, 7, E), (1, 6, E), (0, 7, E), (0, 10, E)])], order="interleaved")),
        ("one all-right group and three all-wrong ones, rows dealt round-robin",
         _ch06_rows([("p1", [(1, 7, E)] * 4), ("p2", [(0, 9, E)] * 4), ("p3", [(0, 64, L)] * 4),
                     ("p4", [(0, 8, E)] * 4)], order="interleaved")),
        ("G = 2: four groups of two",
         _ch06_rows([("p1", [(1, 7, E), (0, 8, E)]), ("p2", [(1, 7, E), (1, 7, E)]),
                     ("p3", [(0, 64, L), (0, 9, E)]), ("p4", [(0, 6, E), (0, 6, E)])])),
    ]


def _ch06_compare(where: str, got, expected: dict, rows) -> None:
    if not isinstance(got, dict):
        raise ExerciseError(f"{where} returned {type(got).__name__}; return a dict with the keys {list(CH06_KEYS)}")
    missing = [k for k in CH06_KEYS if k not in got]
    if missing:
        raise ExerciseError(f"{where}: the returned dict lacks {missing}; it needs the keys {list(CH06_KEYS)} "
                            "(spelled as in history.json)")
    variants = _ch06_variants(rows)
    for key in CH06_KEYS:
        try:
            value = float(got[key])
        except (TypeError, ValueError):
            raise ExerciseError(f"{where}: {key!r} is {got[key]!r}; it must be a number") from None
        if abs(value - expected[key]) <= 1e-9:
            continue
        names = [name for (k, name), v in variants.items() if k == key and abs(value - v) <= 1e-9]
        hint = CH06_HINTS[names[0]] if names else {
            "reward": "the mean of the rewards of all the iteration's rollouts",
            "frac_reward_zero_std": "the fraction of groups (one per problem_id) whose G rewards are all equal",
            "completions/mean_length": "the mean over rollouts of len(response_ids)",
            "completions/clipped_ratio": "the fraction of rollouts with finish_reason == 'length'",
        }[key]
        raise ExerciseError(f"{where}: {key} = {value!r}, expected {expected[key]!r}. Hint: {hint}.")


def check_ch06_iteration_metrics(iteration_metrics, run_dir=None) -> bool:
    """Grade chapter 6's exercise: `iteration_metrics(rows) -> dict`, one iteration's logged metrics.

    rows: the raw rollouts of ONE iteration (dicts as in rollouts.jsonl.gz, in any order).
    The dict must hold reward (mean reward), frac_reward_zero_std (fraction of groups, one
    per problem_id, whose rewards are all equal), completions/mean_length (mean
    len(response_ids)) and completions/clipped_ratio (fraction with finish_reason
    "length").  Tried first on constructed iterations, then, when `run_dir` names a
    finished GRPO run, on every iteration of it against its history.json (within 1e-9).
    """
    from pathlib import Path

    if not callable(iteration_metrics):
        raise ExerciseError(f"pass your function itself, not {type(iteration_metrics).__name__}")

    def call(where, rows):
        try:
            return iteration_metrics([dict(r) for r in rows])
        except NotImplementedError:
            raise  # the stub's "your turn" message, unchanged
        except Exception as err:  # the student's code may raise anything; report it, never crash
            raise ExerciseError(f"{where} raised {type(err).__name__}: {err}") from None

    cases = _ch06_cases()
    for number, (what, rows) in enumerate(cases, start=1):
        where = f"constructed case {number} of {len(cases)} ({what})"
        _ch06_compare(where, call(where, rows), _ch06_reference(rows), rows)
    message = f"Correct: your iteration_metrics agrees on all {len(cases)} constructed iterations"
    if run_dir is not None:
        from .grpo import read_rollouts
        from .runs import read_json

        history = read_json(Path(run_dir) / "history.json")
        rollouts = read_rollouts(run_dir)
        for logged in history:
            rows = [r for r in rollouts if r["iteration"] == logged["iteration"]]
            where = f"iteration {logged['iteration']} of {Path(run_dir).name}"
            if not rows:
                raise ExerciseError(f"{run_dir} holds no rollouts of iteration {logged['iteration']}")
            expected = {k: logged[k] for k in CH06_KEYS}
            _ch06_compare(where + " (compared with history.json)", call(where, rows), expected, rows)
        message += f" and reproduces history.json on all {len(history)} iterations of {Path(run_dir).name}"
    print(message + ".")
    return True
