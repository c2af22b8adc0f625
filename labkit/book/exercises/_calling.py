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


def require_tensor(got, shape: tuple, name: str, wanted: str, what: str) -> None:
    """Refuse a returned value that is not a tensor of `shape`, or that carries no gradient.

    name: the student's function; wanted: what to return, in words ("one objective per token, shape
    (5, 9)"); what: the thing whose gradient is needed ("your objective", "your loss")."""
    import torch

    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(shape):
        found = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise ExerciseError(f"{name} returned {found}; return {wanted}")
    if not got.requires_grad:
        raise ExerciseError(f"{what} carries no gradient: build it from the current policy's tensors with torch "
                            "operations (no .detach(), .item() or numpy)")
