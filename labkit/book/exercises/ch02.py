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


def _ch02_slips():
    """[(formula(logits, response_ids) -> float, hint(R) -> str)]: the usual slips, each as the value it gives.

    A formula may raise where the slip itself does (an index out of range): that case then matches a
    student's answer that raised too."""
    import torch

    def scores(logits):
        return torch.log_softmax(logits, dim=-1)

    def picked(table, ids):
        return torch.gather(table, 1, ids[:, None]).squeeze(1)

    shift = ("row j of `logits` is the distribution that response token j was drawn from (they are already "
             "aligned), so gather response_ids[j] from row j, with no shift")
    return [
        (lambda lg, ids: float(picked(scores(lg), ids).mean()),
         lambda R: f"you averaged the {R} tokens' log-probs (their sum divided by {R}); the response's probability "
                   "is the PRODUCT of its token probabilities, so its log-prob is their SUM"),
        (lambda lg, ids: float(picked(scores(lg), ids).sum().exp()),
         lambda R: "that is the probability exp(sum); return the log-probability, the sum itself"),
        (lambda lg, ids: float(picked(lg, ids).sum()),
         lambda R: "you summed raw logits; normalise them over the vocabulary first (log_softmax over the last "
                   "dimension)"),
        (lambda lg, ids: float(picked(torch.log_softmax(lg, dim=0), ids).sum()),
         lambda R: "log_softmax over the wrong dimension: normalise over the vocabulary (dim=-1), not the "
                   "positions"),
        (lambda lg, ids: float(torch.gather(scores(lg)[:-1], 1, ids[1:, None]).sum()),
         lambda R: f"off by one position: you scored token j + 1 with row j; {shift}"),
        (lambda lg, ids: float(torch.gather(scores(lg)[1:], 1, ids[:-1, None]).sum()),
         lambda R: f"off by one position: you scored token j with row j + 1; {shift}"),
        (lambda lg, ids: float(picked(scores(lg), ids.roll(1)).sum()),
         lambda R: f"off by one position (the ids rolled by one); {shift}"),
        (lambda lg, ids: float(picked(scores(lg), ids.roll(-1)).sum()),
         lambda R: f"off by one position (the ids rolled by one); {shift}"),
        (lambda lg, ids: float(picked(scores(lg), ids)[:-1].sum()),
         lambda R: "the last token (EOS) is part of the response and counts too"),
        (lambda lg, ids: float(picked(torch.softmax(lg, dim=-1), ids).sum()),
         lambda R: "you summed the tokens' probabilities: log_softmax is missing (sum the log-probs, "
                   "torch.log_softmax(logits, dim=-1))"),
        (lambda lg, ids: float(scores(lg)[:, ids].sum()),
         lambda R: f"you picked every response token at every row (logp[:, response_ids] has shape ({R}, {R})); "
                   "pick one per row, row j's token response_ids[j]: gather, or logp[torch.arange(R), "
                   "response_ids]"),
        (lambda lg, ids: float(scores(lg)[ids].sum()),
         lambda R: "you picked whole rows (logp[response_ids] uses the token ids as row numbers); pick one "
                   "entry per row, row j's token response_ids[j]: gather, or logp[torch.arange(R), response_ids]"),
    ]


def _ch02_hint(sequence_logprob, cases, failed: int, value: float) -> str:
    """What a wrong `sequence_logprob` most likely did: the slip whose value it gives on EVERY case.

    One case cannot tell some slips apart (on uniform logits a shift and a dropped token give the same
    number); all of them can."""
    import math

    if math.isnan(value) or math.isinf(value):
        return ("log(softmax(x)) underflows to log(0) = -inf when logits are far apart: use "
                "torch.log_softmax(logits, dim=-1), which subtracts the maximum first")

    def value_or_none(function, logits, response_ids):
        try:  # only the hint is at stake here: the failure itself is already known
            got = call_student(function, logits.clone(), response_ids.clone(), where="")
            return float(got)
        except (ExerciseError, TypeError, ValueError, RuntimeError, IndexError):
            return None

    def same(a, b):
        return (a is None and b is None) or (a is not None and b is not None
                                             and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9))

    answers = [value_or_none(sequence_logprob, logits, ids) for _, logits, ids in cases]
    for formula, hint in _ch02_slips():
        if all(same(value_or_none(formula, logits, ids), answer) for (_, logits, ids), answer in zip(cases, answers)):
            return hint(len(cases[failed][2]))
    return "take log_softmax(logits, dim=-1), pick each row's response token with gather, and sum"


def _ch02_call(sequence_logprob, logits, response_ids, where: str) -> float:
    """The student's value for one case, as a float; any way it fails is an ExerciseError naming the case."""
    import torch

    try:
        got = call_student(sequence_logprob, logits.clone(), response_ids.clone(), where=where)
    except ExerciseError as err:
        if "Index tensor must have the same number of dimensions" in str(err):
            raise ExerciseError(f"{where}: torch.gather needs an index with as many dimensions as the table it "
                                "picks from, (R, 1) for logp (R, V): gather(logp, 1, response_ids[:, None]), "
                                "then .squeeze(1)") from None
        raise
    if isinstance(got, torch.Tensor) and got.numel() != 1:
        raise ExerciseError(f"{where} returned a tensor of shape {tuple(got.shape)}; return one number "
                            "(a 0-d tensor): the sum over the response's tokens")
    try:
        return float(got)
    except (TypeError, ValueError):
        raise ExerciseError(f"{where} returned {got!r}; return a number (a 0-d tensor)") from None


def check_ch02_sequence_logprob(sequence_logprob, real=None) -> bool:
    """Grade chapter 2's exercise: `sequence_logprob(logits (R, V), response_ids (R,)) -> 0-d tensor`.

    It must return sum_j log_softmax(logits[j])[response_ids[j]], the log-probability of the
    whole response, within 1e-9 on float64 cases (including logits far apart, where
    log(softmax) underflows).  `real`, optional: (logits (R, V), response_ids (R,),
    logp_old list of R floats) of a sampled rollout; the answer must then match the
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
        value = _ch02_call(sequence_logprob, logits, response_ids, where)
        expected = float(torch.gather(torch.log_softmax(logits, dim=-1), 1, response_ids[:, None]).sum())
        if not math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-9):
            raise ExerciseError(f"{where} returned {value!r}, expected {expected!r}. "
                                f"Hint: {_ch02_hint(sequence_logprob, cases, number - 1, value)}.")
    if real is not None:
        logits, response_ids, recorded = real
        value = _ch02_call(sequence_logprob, logits, response_ids,
                           f"the real rollout: sequence_logprob(logits {tuple(logits.shape)}, response_ids "
                           f"({len(response_ids)},))")
        total = float(sum(recorded))
        if not abs(value - total) <= 2e-4 * len(recorded):
            raise ExerciseError(f"on the real rollout your sequence log-prob is {value:.6f}, but its recorded "
                                f"behaviour log-probs sum to {total:.6f}")
        print(f"On the real rollout: log-prob of the whole response {value:.4f}, probability "
              f"{math.exp(value):.4g} (the recorded token log-probs sum to {total:.4f}).")
    print(f"Correct: your sequence_logprob agrees with log_softmax + gather + sum on all {len(cases)} cases.")
    return True
