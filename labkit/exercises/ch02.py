"""Chapter 2, one group: `check_ch02_sequence_logprob` grades a response's log-probability from its logits."""

from __future__ import annotations

from ._calling import ExerciseError, call_student, require_function


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
    old_logprobs list of R floats) of a sampled rollout; the answer must then match the
    sum of the recorded log-probs within 2e-4 per token (the protocol's tolerance).  A stub's
    NotImplementedError propagates unchanged.
    """
    import math

    import torch

    require_function(sequence_logprob)
    cases = _ch02_cases()
    for number, (name, logits, response_ids) in enumerate(cases, start=1):
        where = f"case {number} of {len(cases)} ({name}): sequence_logprob(logits {tuple(logits.shape)}, " \
                f"response_ids {response_ids.tolist()})"
        got = call_student(sequence_logprob, logits.clone(), response_ids.clone(), where=where)
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
