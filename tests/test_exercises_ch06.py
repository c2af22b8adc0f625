"""Chapter 6's checker: it accepts a right `iteration_metrics` and names the usual mistakes."""

import pytest

from labkit.book import exercises
from labkit.lab.runs import RunFolder, write_json


def right(rows):
    groups = {}
    for r in rows:
        groups.setdefault(r["problem_id"], []).append(r["reward"])
    n = len(rows)
    return {
        "reward": sum(r["reward"] for r in rows) / n,
        "frac_reward_zero_std": sum(len(set(g)) == 1 for g in groups.values()) / len(groups),
        "completions/mean_length": sum(len(r["response_ids"]) for r in rows) / n,
        "completions/clipped_ratio": sum(r["finish_reason"] == "length" for r in rows) / n,
    }


def with_changes(**changes):
    """`right`, with some keys computed another (wrong) way."""
    def answer(rows):
        out = right(rows)
        out.update({k.replace("__", "/"): f(rows) for k, f in changes.items()})
        return out
    return answer


def chunked_zero_std(rows, G=4):
    chunks = [[r["reward"] for r in rows[i:i + G]] for i in range(0, len(rows), G)]
    return sum(len(set(c)) == 1 for c in chunks) / len(chunks)


def test_accepts_a_right_answer(capsys):
    assert exercises.check_ch06_iteration_metrics(right) is True
    assert "all 6 constructed iterations" in capsys.readouterr().out


def only(value):
    """The fraction of groups whose rewards all equal `value` (half of the zero-variance count)."""
    def fraction(rows):
        groups = {r["problem_id"] for r in rows}
        return sum(all(r["reward"] == value for r in rows if r["problem_id"] == p) for p in groups) / len(groups)
    return fraction


@pytest.mark.parametrize("wrong, message", [
    (with_changes(frac_reward_zero_std=only(0.0)), "all-correct group"),
    (with_changes(frac_reward_zero_std=only(1.0)), "all-wrong group"),
    (with_changes(frac_reward_zero_std=chunked_zero_std), "group the rows by problem_id"),
    (with_changes(frac_reward_zero_std=lambda rows: 1 - right(rows)["frac_reward_zero_std"]), "WITH signal"),
    (with_changes(completions__mean_length=lambda rows: sum(len(r["text"]) for r in rows) / len(rows)),
     "in tokens"),
    (with_changes(completions__mean_length=lambda rows: sum(len(r["response_ids"]) - 1 for r in rows) / len(rows)),
     "EOS token is part of the response"),
    (with_changes(completions__clipped_ratio=lambda rows: sum(r["reward"] == 0 for r in rows) / len(rows)),
     "cut at the token limit"),
    (with_changes(reward=lambda rows: sum(r["reward"] for r in rows)), "not the sum"),
])
def test_names_the_mistake(wrong, message):
    with pytest.raises(exercises.ExerciseError, match=message):
        exercises.check_ch06_iteration_metrics(wrong)


def test_refuses_bad_return_values_and_reports_errors():
    with pytest.raises(exercises.ExerciseError, match="lacks"):
        exercises.check_ch06_iteration_metrics(lambda rows: {"reward": 0.0})
    with pytest.raises(exercises.ExerciseError, match="return a dict"):
        exercises.check_ch06_iteration_metrics(lambda rows: [0.0, 0.0, 0.0, 0.0])
    with pytest.raises(exercises.ExerciseError, match="raised ZeroDivisionError"):
        exercises.check_ch06_iteration_metrics(lambda rows: 1 / 0)
    with pytest.raises(exercises.ExerciseError, match="pass your function"):
        exercises.check_ch06_iteration_metrics(right(exercises._ch06_cases()[0][1]))


def write_run(run_dir, rows, history):
    folder = RunFolder(run_dir).open_for_writing()
    for iteration in sorted({r["iteration"] for r in rows}):  # one block per iteration, as the loop appends
        folder.append("rollouts.jsonl.gz", [r for r in rows if r["iteration"] == iteration])
    write_json(run_dir / "history.json", history)


def test_compares_with_a_run_folder(tmp_path, capsys):
    """A two-iteration run folder built by hand: the checker reproduces its history.json."""
    cases = exercises._ch06_cases()
    rows, history = [], []
    for iteration, (_, case_rows) in enumerate(cases[:2], start=1):
        rows += [{**r, "iteration": iteration, "rollout_id": f"it{iteration}-{r['rollout_id']}"} for r in case_rows]
        history.append({"iteration": iteration, **right(case_rows)})
    write_run(tmp_path / "run", rows, history)
    assert exercises.check_ch06_iteration_metrics(right, run_dir=tmp_path / "run") is True
    assert "all 2 iterations of run" in capsys.readouterr().out

    # a history that disagrees with its rollouts is reported with the iteration's number
    history[1]["frac_reward_zero_std"] += 0.25
    write_run(tmp_path / "bad", rows, history)
    with pytest.raises(exercises.ExerciseError, match="iteration 2 of bad"):
        exercises.check_ch06_iteration_metrics(right, run_dir=tmp_path / "bad")
