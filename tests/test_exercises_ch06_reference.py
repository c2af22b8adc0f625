"""Chapter 6's diagnose-this checker: a reference that is not frozen. A right check passes; each check
that misses one way of breaking the reference is told which one."""

import pytest

from labkit.book import exercises
from labkit.models import presets


def right(reference, policy, start_digest):
    assert reference is not policy, "the reference is the policy object"
    assert not {p.data_ptr() for p in reference.parameters()} & {p.data_ptr() for p in policy.parameters()}, \
        "the reference shares weight tensors with the policy"
    assert not any(p.requires_grad for p in reference.parameters()), "a reference parameter requires grad"
    assert not reference.training, "the reference is in train mode"
    assert presets.parameter_digest(reference) == start_digest, "the reference moved from the start"


def digest_only(reference, policy, start_digest):
    assert presets.parameter_digest(reference) == start_digest


def no_storage(reference, policy, start_digest):
    assert reference is not policy
    assert not any(p.requires_grad for p in reference.parameters()) and not reference.training
    assert presets.parameter_digest(reference) == start_digest


def no_grad_check(reference, policy, start_digest):
    assert not {p.data_ptr() for p in reference.parameters()} & {p.data_ptr() for p in policy.parameters()}
    assert not reference.training and presets.parameter_digest(reference) == start_digest


def no_mode_check(reference, policy, start_digest):
    assert not {p.data_ptr() for p in reference.parameters()} & {p.data_ptr() for p in policy.parameters()}
    assert not any(p.requires_grad for p in reference.parameters())
    assert presets.parameter_digest(reference) == start_digest


def no_digest(reference, policy, start_digest):
    assert not {p.data_ptr() for p in reference.parameters()} & {p.data_ptr() for p in policy.parameters()}
    assert not any(p.requires_grad for p in reference.parameters()) and not reference.training


def too_strict(reference, policy, start_digest):
    assert presets.parameter_digest(reference) != presets.parameter_digest(policy), "the policy has not moved"


def test_a_right_check_passes(capsys):
    assert exercises.check_ch06_frozen_reference(right)
    assert "refuses all 5 broken ones" in capsys.readouterr().out


@pytest.mark.parametrize("check, case, hint", [
    (digest_only, "case 2 of 6 (reference = policy", "compare the objects"),
    (no_storage, "case 3 of 6 (a shallow copy", "compare the parameters' storage"),
    (no_grad_check, "case 4 of 6 (a reference whose parameters require grad", "requires grad"),
    (no_mode_check, "case 6 of 6 (a reference in train mode", "eval mode"),
    (no_digest, "case 5 of 6 (a reference whose weights are no longer", "compare the reference's digest"),
])
def test_each_missed_case_is_named(check, case, hint):
    with pytest.raises(exercises.ExerciseError, match="your check let it through") as err:
        exercises.check_ch06_frozen_reference(check)
    assert str(err.value).startswith(case) and hint in str(err.value)


def test_a_check_that_refuses_the_protocols_reference_is_told():
    with pytest.raises(exercises.ExerciseError, match=r"case 1 of 6 .*your check refused the protocol's own "
                                                      r"reference \(the policy has not moved\)"):
        exercises.check_ch06_frozen_reference(too_strict)


def test_a_crash_is_reported_not_raised():
    with pytest.raises(exercises.ExerciseError, match=r"raised KeyError: 'x'; signal a broken reference"):
        exercises.check_ch06_frozen_reference(lambda r, p, d: {}["x"])


def test_a_check_that_returns_false_instead_of_raising_is_told_so():
    """Issue 57: a check that found the alias and returned False was told it "let it through"."""
    def returns_false(reference, policy, start_digest):
        return reference is not policy and not {p.data_ptr() for p in reference.parameters()} & {
            p.data_ptr() for p in policy.parameters()}

    with pytest.raises(exercises.ExerciseError, match=r"case 2 of 6 .*your check returned False; a check signals a "
                                                      r"broken reference by raising AssertionError"):
        exercises.check_ch06_frozen_reference(returns_false)
