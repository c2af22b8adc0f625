"""Exercise checkers: one per chapter, in chapter order.

Each checker takes the student's function or answer, compares it with the
lab's own, and raises `ExerciseError` with a message that says what is wrong
(the input, what was expected, what came back).  On success it prints a short
confirmation and returns True.
"""

from __future__ import annotations


class ExerciseError(AssertionError):
    """The student's answer is wrong; the message says how."""
