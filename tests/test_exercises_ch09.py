"""The chapter 9 checker: it accepts reading the update count from the logs and names each common guess."""

import pytest

from labkit.book import exercises
from labkit.book.exercises.ch09 import CRASH_HINT


def count_updates(histories):
    """The answer: the run whose every iteration made exactly one update."""
    [name] = [name for name, history in histories.items() if all(len(r["updates"]) == 1 for r in history)]
    return name


def ratio_stayed_one(histories):
    """Also right: the GRPO run whose every update kept rho within 1e-4 of 1 (SFT/RFT log no ratio)."""
    return next(name for name, history in histories.items()
                if all(r["updates"] for r in history) and all(
                    "ratio/min" in u and max(u["ratio/max"] - 1, 1 - u["ratio/min"]) < 1e-4
                    for r in history for u in r["updates"]))


def lowest_final_kl(histories):
    return min(histories, key=lambda name: histories[name][-1]["kl"] if histories[name][-1]["kl"] is not None
               else float("inf"))


def lowest_mean_update_kl(histories):
    return min(histories, key=lambda name: sum(u["kl"] for r in histories[name] for u in r["updates"])
               / sum(len(r["updates"]) for r in histories[name]))


def clip_never_acted_last_update(histories):
    # the top-level clip fraction is the LAST update's (None where RFT made no update)
    return next(name for name, h in histories.items() if all(r["clip_ratio/region_mean"] == 0.0 for r in h))


def clip_never_acted_any_update(histories):
    return next(name for name, h in histories.items()
                if all(u["clip_ratio/region_mean"] == 0.0 for r in h for u in r["updates"]))


def clip_never_acted_on_grpo(histories):
    return next(name for name, h in histories.items()
                if all(r["updates"] and "ratio/min" in r["updates"][0] for r in h)
                and all(u["clip_ratio/region_mean"] == 0.0 for r in h for u in r["updates"]))


def mean_of_one(histories):
    return next(name for name, h in histories.items() if sum(len(r["updates"]) for r in h) == len(h))


def test_the_cases_are_constructed_the_same_way_every_time():
    cases = exercises._ch09_cases()
    assert len(cases) == 4
    assert all(sorted(case.values()) == sorted(exercises.CH09_ROLES) for case in cases)
    assert list(cases[0]) == ["run A1", "run B1", "run C1", "run D1", "run E1", "run F1"]
    assert list(cases[0].values()) == list(exercises.CH09_ROLES)
    assert list(cases[1].values()) == list(exercises.CH09_ROLES[::-1])
    assert [next(n for n, r in case.items() if r == "one_update") for case in cases] == \
        ["run A1", "run E2", "run C3", "run F4"]
    one, rft = exercises._ch09_history("one_update"), exercises._ch09_history("rft_half")
    assert [len(r["updates"]) for r in one] == [1] * 6
    assert [len(r["updates"]) for r in rft] == [2, 0, 2, 0, 2, 0]
    assert rft[1]["clip_ratio/region_mean"] is None and rft[1]["kl"] is None
    assert one[0]["updates"][0]["ratio/max"] == 1.0 + 1.5e-6 and one[0]["clip_ratio/region_mean"] == 0.0
    assert exercises._ch09_history("lowest_kl")[-1]["kl"] == 0.0003
    assert "ratio/min" not in exercises._ch09_history("sft")[0]["updates"][0]


@pytest.mark.parametrize("answer", [count_updates, ratio_stayed_one])
def test_accepts_the_right_reading_of_the_logs(answer, capsys):
    assert exercises.check_ch09_one_update_run(answer) is True
    assert capsys.readouterr().out == ("Correct: your one_update_run found the one-update run in all 4 cases "
                                       "(6 constructed runs each, in different orders).\n")


@pytest.mark.parametrize("wrong, case, got, expected, role", [
    (lowest_final_kl, 1, "run C1", "run A1", "lowest_kl"),
    (lowest_mean_update_kl, 1, "run C1", "run A1", "lowest_kl"),
    (clip_never_acted_last_update, 2, "run A2", "run E2", "sft"),
    (clip_never_acted_any_update, 2, "run F2", "run E2", "rft_half"),
    (clip_never_acted_on_grpo, 2, "run B2", "run E2", "small_steps"),
    (mean_of_one, 2, "run F2", "run E2", "rft_half"),
])
def test_names_each_typical_wrong_answer(wrong, case, got, expected, role):
    with pytest.raises(exercises.ExerciseError) as error:
        exercises.check_ch09_one_update_run(wrong)
    message = str(error.value)
    assert message.startswith(f"case {case} of 4: one_update_run(histories of 'run ")
    assert f"returned {got!r}, expected {expected!r}. Hint: {exercises.CH09_HINTS[role]}." in message


def test_a_crash_on_the_none_of_an_rft_iteration_is_reported_with_the_reason():
    def largest_last_clip(histories):  # max() over None fails on the RFT run's empty iterations
        return min(histories, key=lambda name: max(r["clip_ratio/region_mean"] for r in histories[name]))

    with pytest.raises(exercises.ExerciseError) as error:
        exercises.check_ch09_one_update_run(largest_last_clip)
    message = str(error.value)
    assert message.startswith("case 1 of 4: one_update_run(histories of 'run A1', 'run B1', 'run C1', 'run D1', "
                              "'run E1', 'run F1') raised TypeError: '>' not supported between instances of "
                              "'NoneType' and 'float' (a constructed history")
    assert message.endswith("'NoneType' and 'float'" + CRASH_HINT)
    assert "an RFT iteration with no correct sample has an empty 'updates' list and None" in CRASH_HINT


def test_a_non_name_and_a_stub_are_named():
    with pytest.raises(exercises.ExerciseError, match=r"returned 1; return one of the run names given, as a string "
                                                      r"\(here 'run A1'\)"):
        exercises.check_ch09_one_update_run(lambda histories: 1)
    with pytest.raises(exercises.ExerciseError, match=r"returned 'one_update'; return one of the run names"):
        exercises.check_ch09_one_update_run(lambda histories: "one_update")

    def stub(histories):
        raise NotImplementedError("Your turn: write one_update_run()")

    with pytest.raises(exercises.ExerciseError, match=r"^one_update_run is not written yet \(Your turn"):
        exercises.check_ch09_one_update_run(stub)
    with pytest.raises(exercises.ExerciseError, match="pass your function itself"):
        exercises.check_ch09_one_update_run("run A1")


# -- the rho = 1 exercise --------------------------------------------------------------------------------

def stays_one(history, tol):
    updates = [u for record in history for u in record["updates"]]
    if not updates or any("ratio/min" not in u for u in updates):
        return False
    return all(abs(u["ratio/min"] - 1) <= tol and abs(u["ratio/max"] - 1) <= tol
               and u["clip_ratio/region_mean"] == 0 for u in updates)


def first_only(history, tol):
    return all("ratio/min" in r["updates"][0] and abs(r["updates"][0]["ratio/max"] - 1) <= tol
               for r in history if r["updates"])


def clip_only(history, tol):
    return all(u["clip_ratio/region_mean"] == 0 for r in history for u in r["updates"])


def top_level_only(history, tol):
    return all(r["clip_ratio/region_mean"] in (0.0, None) and (r["kl"] or 0) < 0.005 for r in history)


def test_the_ratio_exercise_accepts_a_right_answer(capsys):
    assert exercises.check_ch09_ratio_stays_one(stays_one)
    assert "by the ratio alone" in capsys.readouterr().out


@pytest.mark.parametrize("answer, named", [
    (first_only, "look at every update of every iteration"),
    (clip_only, "a zero clip fraction only says rho stayed inside"),
    (top_level_only, "cross-entropy logs no ratio (and some iterations made no update)"),
    (lambda h, tol: True, "look at every update"),
    (lambda h, tol: False, "with one update per iteration every update is the first"),
])
def test_the_ratio_exercise_names_the_slip(answer, named):
    with pytest.raises(exercises.ExerciseError, match=r"case \d of 6: ratio_stays_one") as err:
        exercises.check_ch09_ratio_stays_one(answer)
    assert named in str(err.value)


def test_the_ratio_exercise_wants_a_bool():
    with pytest.raises(exercises.ExerciseError, match="return True or False"):
        exercises.check_ch09_ratio_stays_one(lambda h, tol: 1)
