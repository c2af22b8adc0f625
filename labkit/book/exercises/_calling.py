"""What every checker shares: the error it raises and the one way it calls the student's code.

The student's function may raise anything.  A checker never lets that crash it: it calls
the function through `call_student`, which turns the exception into an `ExerciseError`
that says where (the case) and what was raised.  A stub's `NotImplementedError` carries
its own "your turn" message, so it propagates unchanged (or, where a chapter asks, is
reported as "not written yet").
"""

from __future__ import annotations


class ExerciseError(AssertionError):
    """The student's answer is wrong; the message says how."""


def require_function(answer) -> None:
    """Refuse anything but a callable: the student passes the function itself, not its result."""
    if not callable(answer):
        raise ExerciseError(f"pass your function itself, not {type(answer).__name__}")


# The one advice for the commonest shape slip of these exercises: a per-response advantage (B,) used with
# per-token values (B, T) without a token axis.  PyTorch's own words for it name sizes, not the slip.
ADVANTAGE_NOT_BROADCAST = ("your advantages have one value per response, shape (B,), and the per-token values "
                           "have shape (B, T): give the advantages a token axis, advantages[:, None] (or "
                           ".unsqueeze(-1)), so that each response's advantage multiplies every one of its tokens")


def is_shape_mismatch(err: BaseException) -> bool:
    """True for PyTorch's broadcasting error ("The size of tensor a (9) must match the size of tensor b (5) ...")."""
    return isinstance(err, RuntimeError) and "must match the size of tensor" in str(err)


def call_student(function, *args, where: str, hint: str = "", not_written: str | None = None,
                 assertion_is_answer: bool = False, on_shape_mismatch: str | None = None):
    """`function(*args)`, the student's answer for one case; what it raises becomes an ExerciseError.

    where: the case, as the message names it ("case 3 of 10: f(x=1)").  Any exception
    becomes ExerciseError(f"{where} raised {type}: {message}{hint}"); hint, when given,
    follows the exception's message as written (so it starts with its own punctuation).
    NotImplementedError (a stub not written yet) propagates unchanged, or, when
    `not_written` names the function, becomes ExerciseError(f"{not_written} is not written
    yet ({message})").

    assertion_is_answer: the student wrote a check, whose answer is to raise AssertionError or not;
    then the AssertionError is returned (None when the check returned), and anything else it
    raised becomes the ExerciseError above.

    on_shape_mismatch: when the student's code fails on PyTorch's broadcasting error, the one-line
    explanation of the slip to give instead of the raw message (e.g. ADVANTAGE_NOT_BROADCAST).
    """
    try:
        result = function(*args)
    except NotImplementedError as err:
        if not_written is None:
            raise  # the stub's "your turn" message, unchanged
        raise ExerciseError(f"{not_written} is not written yet ({err})") from None
    except AssertionError as err:
        if assertion_is_answer and not isinstance(err, ExerciseError):
            return err
        raise ExerciseError(f"{where} raised {type(err).__name__}: {err}{hint}") from None
    except Exception as err:  # the student's code may raise anything; report it, never crash
        if on_shape_mismatch is not None and is_shape_mismatch(err):
            raise ExerciseError(f"{where}: shapes do not broadcast: {on_shape_mismatch}") from None
        raise ExerciseError(f"{where} raised {type(err).__name__}: {err}{hint}") from None
    return None if assertion_is_answer else result


def require_like(got, like, name: str, finite: bool = True) -> None:
    """Refuse a returned tensor that lives on another device than the inputs, has another dtype, or holds
    a NaN or an infinity: each is named in one line, before any value is compared (a NaN compares as
    neither too big nor too small, so a checker that only measured a gap would pass it).

    like: one of the inputs (the device and dtype the answer must keep); finite: False where the checker
    names the cause of a NaN itself."""
    import torch

    if got.device != like.device:
        raise ExerciseError(f"{name} returned a tensor on device {got.device}, the inputs are on {like.device}: "
                            "build new tensors from the inputs (x.new_zeros(...), torch.zeros(..., device=x.device)) "
                            "or move the result back with .to(x.device)")
    if got.dtype != like.dtype:
        made = " (torch.tensor(...) without a dtype and .float() make float32)" if got.dtype == torch.float32 else ""
        raise ExerciseError(f"{name} returned {str(got.dtype).replace('torch.', '')}, the inputs are "
                            f"{str(like.dtype).replace('torch.', '')}: keep their dtype{made}")
    bad = ~torch.isfinite(got.detach())
    if finite and bad.any():
        at = tuple(torch.nonzero(bad)[0].tolist())
        raise ExerciseError(f"{name} returned {got.detach()[at].item()} at index {at}: every value must be finite "
                            "(a division by a zero standard deviation or a log of 0 gives nan or inf)")


def require_tensor(got, shape: tuple, name: str, wanted: str, what: str, like=None) -> None:
    """Refuse a returned value that is not a tensor of `shape`, that is not like the input `like` (its
    device and dtype, and finite: `require_like`), or that carries no gradient.

    name: the student's function; wanted: what to return, in words ("one objective per token, shape
    (5, 9)"); what: the thing whose gradient is needed ("your objective", "your loss")."""
    import torch

    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(shape):
        found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise ExerciseError(f"{name} returned {found}; return {wanted}")
    if like is not None:
        require_like(got, like, name)
    if not got.requires_grad:
        raise ExerciseError(f"{what} carries no gradient: build it from the current policy's tensors with torch "
                            "operations (no .detach(), .item() or numpy)")


def require_number(got, where: str) -> float:
    """The student's returned probability as a float; refused in one line when it is not a number (a
    string such as "0.25", True, a list), holds more than one value, or is not finite."""
    import math
    import numbers

    value = got
    if hasattr(got, "numel") and hasattr(got, "item"):  # a tensor (or numpy array) of one value
        if got.numel() != 1:
            raise ExerciseError(f"{where} returned {type(got).__name__} of {got.numel()} values; return one number")
        value = got.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ExerciseError(f"{where} returned {got!r} ({type(got).__name__}); return a number (a probability), "
                            "not text or a truth value")
    if not math.isfinite(value):
        raise ExerciseError(f"{where} returned {value!r}; a probability is a finite number in [0, 1]")
    return float(value)


def integer_division_hint(got, expected: float) -> str | None:
    """The hint for a probability returned as a whole number where the answer is not one: `//` (or a
    count returned instead of a fraction)."""
    import numbers

    if isinstance(got, numbers.Integral) and not isinstance(got, bool) and expected != int(expected):
        return (f"you returned the whole number {got}: `//` rounds down to an integer; divide with `/` "
                "(and return the probability, not a count)")
    return None
