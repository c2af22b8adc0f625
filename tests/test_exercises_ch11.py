"""Chapter 11's checker: the process reward passes, and each usual slip is named."""

import pytest

from labkit.studies import reasoning
from labkit.book.exercises import ExerciseError, check_ch11_process_reward
from labkit.book.exercises.ch11 import CH11_HINTS, _decoys


def test_the_lab_s_own_process_reward_passes(capsys):
    assert check_ch11_process_reward(reasoning.process_reward)
    assert "all 6 responses" in capsys.readouterr().out


@pytest.mark.parametrize("slip", sorted(CH11_HINTS))
def test_each_slip_is_named(slip):
    def student(verdict, chain):
        return _decoys(verdict, chain)[slip]

    with pytest.raises(ExerciseError) as err:
        check_ch11_process_reward(student)
    assert CH11_HINTS[slip] in str(err.value)


def test_a_stub_a_non_number_and_a_crash_are_told_apart():
    def stub(verdict, chain):
        raise NotImplementedError("your turn")

    with pytest.raises(ExerciseError, match="process_reward is not written yet"):
        check_ch11_process_reward(stub)
    with pytest.raises(ExerciseError, match="return the share as a float"):
        check_ch11_process_reward(lambda v, c: "1.0")
    with pytest.raises(ExerciseError, match="raised ZeroDivisionError"):
        check_ch11_process_reward(lambda v, c: 1 / 0)
    with pytest.raises(ExerciseError, match="pass your function itself"):
        check_ch11_process_reward(reasoning.process_reward(None, None) if False else 0.5)
