"""Chapter 6's live run (labkit.live, issue 55 item 4): one iteration at a time on the lab's own loop, each line
beside the committed run's; a second call reads what is done and goes on; Ctrl-C keeps every finished iteration."""

import pytest

from labkit import cli, live
from labkit.grpo import loop
from labkit.lab.runs import REPO_ROOT

COMMITTED = REPO_ROOT / "runs" / "tiny" / "grpo"


def test_a_live_run_goes_on_where_it_stopped_and_keeps_one_state(tmp_path, monkeypatch):
    folder = tmp_path / "live"
    run_grpo, calls = loop.run_grpo, []

    def ctrl_c_in_iteration_2(*args, **kwargs):
        calls.append(kwargs["stop_after"])
        if kwargs["stop_after"] == 2 and calls.count(2) == 1:
            raise KeyboardInterrupt  # as a Ctrl-C during iteration 2
        return run_grpo(*args, **kwargs)

    monkeypatch.setattr(loop, "run_grpo", ctrl_c_in_iteration_2)
    seen = []
    with pytest.raises(KeyboardInterrupt):
        live.live_grpo(2, run_dir=folder, on_iteration=seen.append)
    assert [line["iteration"] for line in seen] == [1]  # iteration 1 was finished: it is kept
    lines = live.live_grpo(2, run_dir=folder, on_iteration=lambda line: None)
    assert [line["iteration"] for line in lines] == [1, 2] and lines[0]["seconds"] is None  # read, not rerun
    assert calls == [1, 2, 2]
    assert sorted(p.name for p in (folder / "states").iterdir()) == ["iter-002.pt.gz"]  # only the newest
    committed = [r for r in loop.read_rollouts(COMMITTED) if r["iteration"] <= 2]
    fresh = loop.read_rollouts(folder)
    # the same rollouts are made on any machine (ids fix problem and seed); their tokens agree where the
    # machine rounds as the one that built the cache did, and the lines say which
    assert [r["rollout_id"] for r in fresh] == [r["rollout_id"] for r in committed]
    for line in lines:
        assert line["agrees"] == ([r for r in fresh if r["iteration"] == line["iteration"]]
                                  == [r for r in committed if r["iteration"] == line["iteration"]])
    assert "agrees" in live.format_line(lines[0]) or "DRIFTS" in live.format_line(lines[0])


@pytest.mark.parametrize("iterations", [0, 101, True])
def test_live_refuses_iterations_outside_the_committed_run(tmp_path, capsys, iterations):
    if iterations is True:
        with pytest.raises(ValueError, match="iterations True: must be an integer in 1..100"):
            live.live_grpo(True, run_dir=tmp_path / "x")
        return
    assert cli.main(["live", "grpo", "--iterations", str(iterations), "--run-dir", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --iterations {iterations}: must lie in 1..100 " \
                                               "(the committed run's iterations)"
    assert not (tmp_path / "x").exists()


def test_chapter_11s_options_are_refused_for_the_protocols_live_run(tmp_path, capsys):
    assert cli.main(["live", "grpo", "--base", "rare_0", "--run-dir", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == ("error: --base, --group-size and --beta are chapter 11's: "
                                               "`python -m labkit live reasoning`")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("argv, message", [
    (["--base", "rare_5"], "base 'rare_5': chapter 11's outcome runs start from rare_0, rare_2, rare_10, control"),
    (["--iterations", "41"], "--iterations 41: must lie in 1..40 (the committed run's iterations)"),
    (["--group-size", "1"], "--group-size 1: a group needs at least 2 responses"),
])
def test_chapter_11s_live_run_refuses_bad_settings_in_one_line(tmp_path, capsys, argv, message):
    assert cli.main(["live", "reasoning", *argv, "--run-dir", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("kwargs, message", [
    ({"iterations": 41}, "iterations 41: must be an integer in 1..40 (the committed runs')"),
    ({"iterations": 2, "G": 1}, "G 1, beta 0.02: a group needs G >= 2, and beta is a KL weight >= 0"),
])
def test_a_notebooks_bad_live_settings_are_refused_by_their_parameter_names(tmp_path, kwargs, message):
    with pytest.raises(ValueError) as refused:
        live.live_reasoning(kwargs.pop("iterations"), run_dir=tmp_path / "x", **kwargs)
    assert str(refused.value) == message and not (tmp_path / "x").exists()
