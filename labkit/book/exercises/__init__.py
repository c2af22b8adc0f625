"""Exercise checkers: one module per chapter (`ch01` ... `ch11`), in chapter order.

Each checker takes the student's function or answer, compares it with the
lab's own, and raises `ExerciseError` with a message that says what is wrong
(the input, what was expected, what came back).  On success it prints a short
confirmation and returns True.  The student's function is called through one
helper, `_calling.call_student`, which reports what it raised.

The notebooks import the checkers from here (`from labkit.book.exercises import
check_ch03_group_advantages`), so every name below stays importable from the
package itself.
"""

from __future__ import annotations

from ._calling import ExerciseError, call_student, require_function
from .ch01 import CH01_HINTS, CH01_RESPONSES, check_ch01_is_valid_answer
from .ch02 import check_ch02_sequence_logprob
from .ch03 import CH03_CASES, CH03_HINTS, check_ch03_group_advantages
from .ch04 import CH04_ADVANTAGES, CH04_LOG_RATIOS, check_ch04_clipped_objective
from .ch05 import check_ch05_blocked_kl
from .ch06 import (CH06_HINTS, CH06_KEYS, CH06_LOSS_SIGNATURE, CH06_REFERENCE_SIGNATURE, check_ch06_frozen_reference,
                   check_ch06_grpo_loss, check_ch06_iteration_metrics)
from .ch06 import _ch06_cases  # noqa: F401  (private, but tests/test_exercises_ch06.py reads the constructed cases)
from .ch07 import CH07_CASES, check_ch07_pass_at_k
from .ch08 import (CH08_ADVANTAGE_SIGNATURE, CH08_CASES, CH08_MIXED_CASES, check_ch08_advantage_check,
                   check_ch08_mixed_zero_signal, check_ch08_zero_signal)
from .ch09 import CH09_HINTS, CH09_RATIO_HINTS, CH09_ROLES, check_ch09_one_update_run, check_ch09_ratio_stays_one
from .ch09 import _ch09_cases, _ch09_history  # noqa: F401  (private, but tests/test_exercises_ch09.py builds the cases)
from .ch10 import CH10_CASES, CH10_HINTS, check_ch10_carries
from .ch11 import CH11_CASES, CH11_HINTS, check_ch11_process_reward
from .predict import check_prediction
from .reveal import (RARE_ZERO_CHOICES, require_prediction_for, reveal_rare_zero, reveal_baseline, reveal_clip, reveal_identity, reveal_leash, reveal_separable, reveal_seeds,
                     reveal_split, reveal_where_rl_works)

__all__ = [
    "ExerciseError",
    "check_prediction",
    "require_prediction_for",
    "reveal_identity",
    "reveal_baseline",
    "reveal_clip",
    "reveal_leash",
    "reveal_seeds",
    "reveal_separable",
    "reveal_split",
    "reveal_where_rl_works",
    "call_student",
    "require_function",
    "CH01_HINTS",
    "CH01_RESPONSES",
    "check_ch01_is_valid_answer",
    "check_ch02_sequence_logprob",
    "CH03_CASES",
    "CH03_HINTS",
    "check_ch03_group_advantages",
    "CH04_ADVANTAGES",
    "CH04_LOG_RATIOS",
    "check_ch04_clipped_objective",
    "check_ch05_blocked_kl",
    "CH06_HINTS",
    "CH06_KEYS",
    "check_ch06_iteration_metrics",
    "CH06_LOSS_SIGNATURE",
    "check_ch06_grpo_loss",
    "CH06_REFERENCE_SIGNATURE",
    "check_ch06_frozen_reference",
    "CH07_CASES",
    "check_ch07_pass_at_k",
    "CH08_CASES",
    "check_ch08_zero_signal",
    "CH08_ADVANTAGE_SIGNATURE",
    "CH08_MIXED_CASES",
    "check_ch08_advantage_check",
    "check_ch08_mixed_zero_signal",
    "CH09_HINTS",
    "CH09_ROLES",
    "check_ch09_one_update_run",
    "CH09_RATIO_HINTS",
    "check_ch09_ratio_stays_one",
    "CH10_CASES",
    "CH10_HINTS",
    "check_ch10_carries",
    "CH11_CASES",
    "CH11_HINTS",
    "check_ch11_process_reward",
    "RARE_ZERO_CHOICES",
    "reveal_rare_zero",
]
