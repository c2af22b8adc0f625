"""Chapter 11's runs go through the lab's one GRPO loop (`labkit.grpo.loop.run_grpo` with
`labkit.studies.reasoning.worked_task`), so they have every GRPO run's guarantees: a Ctrl-C finishes the
iteration and saves its state, `--resume` continues bit for bit, the folder's files are checked.

A small worked run from the tiny warm start (2 chains x G = 2, 3 iterations, 1 validation and 1 test
chain per k): its weights, rows, history and validation profiles must be the same whether it ran at
once, stopped after iteration 1 and resumed, or was stopped by a Ctrl-C and resumed.
"""

import os
import signal

import pytest

from labkit.config import ReasoningConfig
from labkit.grpo import loop as grpo_loop
from labkit.lab import skeleton
from labkit.lab.runs import REPO_ROOT, RunFolder, is_finished, read_json
from labkit.studies import reasoning, thinking_base

WARM_START = REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"
CFG = ReasoningConfig(prompts_per_iteration=2, G=2, iterations=3, measure_every=2, profile_draws=1,
                      train_chains_per_k=4)


@pytest.fixture(autouse=True)
def few_chains(monkeypatch):
    monkeypatch.setattr(thinking_base, "MEASURE_CHAINS_PER_K", 1)
    monkeypatch.setattr(thinking_base, "PROFILE_CHAINS_PER_K", 1)


def train(folder, run=reasoning.get_run("from_rare_2"), **options):
    config = reasoning.preset_config(CFG)
    return grpo_loop.run_grpo(config, folder, G=CFG.G, iterations=CFG.iterations, sampler=reasoning.SAMPLER,
                              start_file=WARM_START, device="cpu", progress=False,
                              variant=reasoning.Variant(length_penalty=run.length_penalty), shared_prompts=True,
                              task=reasoning.worked_task(run, CFG), bucket_tokens=64, **options)


def outcome(folder) -> dict:
    f = RunFolder(folder)
    manifest = f.manifest()
    return {"final_digest": manifest["final_digest"], "rows": grpo_loop.read_rollouts(folder),
            "history": read_json(f / "history.json"), "checkpoints": grpo_loop.read_checkpoints(folder),
            "profile": manifest["test_profile"], "step": manifest["step"]}


@pytest.fixture(scope="module")
def continuous_folder(tmp_path_factory):
    """The small run trained at once, once for the module (the live tests' "committed" run too)."""
    folder = tmp_path_factory.mktemp("reasoning") / "continuous"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(thinking_base, "MEASURE_CHAINS_PER_K", 1)
        mp.setattr(thinking_base, "PROFILE_CHAINS_PER_K", 1)
        train(folder)
    return folder


@pytest.fixture(scope="module")
def continuous(continuous_folder):
    return outcome(continuous_folder)


def test_a_worked_run_has_the_runs_rows_records_and_profiles(continuous):
    rows, history = continuous["rows"], continuous["history"]
    assert continuous["step"] == "reasoning"
    assert len(rows) == CFG.iterations * CFG.prompts_per_iteration * CFG.G
    assert [h["iteration"] for h in history] == [1, 2, 3]
    assert sorted({r["iteration"] for r in rows}) == [1, 2, 3] and all("rollout_id" in r and "thinks" in r for r in rows)
    for h in history:
        part = [r for r in rows if r["iteration"] == h["iteration"]]
        assert h["mean_tokens"] == sum(r["tokens"] for r in part) / len(part)
    # validation profiles before the first iteration, at measure_every and after the last
    assert [c["iteration"] for c in continuous["checkpoints"]] == [0, 2, 3]
    assert continuous["profile"]["responses"] == 8  # 1 test chain per k = 1..8, 1 draw


def test_a_worked_run_stopped_and_resumed_equals_the_continuous_one(tmp_path, continuous):
    folder = tmp_path / "stopped"
    summary = train(folder, stop_after=1)
    assert summary["iterations_run"] == [0, 1]
    train(folder, resume=True)
    assert outcome(folder) == continuous


def test_a_ctrl_c_in_a_worked_run_saves_its_state_and_resume_equals_the_continuous_one(tmp_path, monkeypatch,
                                                                                      continuous):
    folder = tmp_path / "interrupted"
    record = reasoning.record

    def interrupted_in_iteration_2(loop, iteration, *rest):
        if iteration == 1:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, heard while the iteration is recorded
        return record(loop, iteration, *rest)

    monkeypatch.setattr(reasoning, "record", interrupted_in_iteration_2)
    with pytest.raises(skeleton.Interrupted, match="interrupted after iteration 2: its state is .*iter-002.*--resume"):
        train(folder)
    monkeypatch.setattr(reasoning, "record", record)
    assert not is_finished(folder) and (folder / "states" / "iter-002.pt.gz").is_file()
    train(folder, resume=True)
    assert outcome(folder) == continuous


# -- Chapter 11's live run (labkit.live.live_reasoning): the run itself, a line per iteration beside the committed --


@pytest.fixture
def small_live(monkeypatch, tmp_path, continuous_folder):
    """live_reasoning at this file's small settings, its base the warm start, its "committed" run the module's
    continuous one (where the live run looks for chapter 11's runs); yields the live run's folder."""
    from labkit import config

    monkeypatch.setattr(config, "ReasoningConfig", lambda: CFG)
    monkeypatch.setattr(reasoning, "base_model", lambda preset, base: WARM_START)
    monkeypatch.setattr(reasoning, "default_run_dir", lambda preset, name: continuous_folder)
    yield tmp_path / "live"


def test_a_live_reasoning_run_agrees_with_the_committed_one_and_goes_on_where_it_stopped(small_live, capsys):
    from labkit import live

    first = live.live_reasoning(2, run_dir=small_live, on_iteration=lambda line: None)
    assert [line["iteration"] for line in first] == [1, 2] and all(line["agrees"] for line in first)
    lines = live.live_reasoning(3, run_dir=small_live)  # prints its lines
    assert [line["iteration"] for line in lines] == [1, 2, 3] and lines[0]["seconds"] is None  # read, not rerun
    assert all(line["agrees"] for line in lines)
    assert [line["think_rate"] for line in lines] == [line["committed"]["think_rate"] for line in lines]
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3 and "(earlier)" in printed[0] and printed[2].endswith("agrees")


def test_a_live_reasoning_run_with_other_settings_says_there_is_nothing_to_compare(small_live):
    from labkit import live

    lines = live.live_reasoning(1, G=3, run_dir=small_live, on_iteration=lambda line: None)
    assert lines[0]["committed"] is None and not lines[0]["agrees"]
    assert live.format_reasoning_line(lines[0]).endswith("your settings: no committed run to compare")
    with pytest.raises(ValueError, match="base 'rare_5': chapter 11's outcome runs start from"):
        live.live_reasoning(1, base="rare_5", run_dir=small_live)


def test_a_ctrl_c_in_a_live_reasoning_run_says_how_to_go_on_and_the_next_call_does(small_live, monkeypatch, capsys):
    from labkit import live

    record = reasoning.record

    def interrupted_in_iteration_2(loop, iteration, *rest):
        if iteration == 1:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C (a notebook's interrupt sends the same)
        return record(loop, iteration, *rest)

    monkeypatch.setattr(reasoning, "record", interrupted_in_iteration_2)
    lines = live.live_reasoning(3, run_dir=small_live, on_iteration=lambda line: None)
    assert [line["iteration"] for line in lines] == [1, 2]
    out = capsys.readouterr().out
    assert "Ctrl-C: stopped after iteration 2, its state saved in" in out and "run the same cell" in out
    assert "Traceback" not in out
    monkeypatch.setattr(reasoning, "record", record)
    lines = live.live_reasoning(3, run_dir=small_live, on_iteration=lambda line: None)
    assert [line["iteration"] for line in lines] == [1, 2, 3] and [line["seconds"] is None for line in lines] == [
        True, True, False]
    assert all(line["agrees"] for line in lines)


def test_resume_starts_a_run_not_yet_begun_and_refuses_an_attempt_without_a_state(tmp_path, monkeypatch):
    """`reasoning --resume` (what `all` runs) continues the runs that hold a state and simply starts the others;
    an attempt that saved no state is refused before any work, naming --restart (issue 58, item 1)."""
    from labkit.grpo.loop import ROLLOUTS_PART
    from labkit.lab import workers
    from labkit.lab.runs import UnfinishedRunError

    monkeypatch.setattr(reasoning, "default_run_dir", lambda preset, name: tmp_path / name)
    jobs = []
    monkeypatch.setattr(workers, "each_result", lambda fn, js, n, **how: iter(jobs.extend(js) or ()))
    reasoning.run_all("tiny", only=("from_rare_10",), resume=True, progress=False)
    assert jobs == [("from_rare_10", "tiny", 1, False, False)]  # nothing to resume: the run starts
    folder = RunFolder(tmp_path / "from_rare_10").open_for_writing()
    folder.append(ROLLOUTS_PART, [{"id": "g8-it001-p000-0", "iteration": 1}])
    folder.release()
    with pytest.raises(UnfinishedRunError, match=r"from_rare_10 holds an unfinished attempt \(1 rollouts, no state\): "
                                                 r"pass --resume"):
        reasoning.run_all("tiny", only=("from_rare_10",), progress=False)
    with pytest.raises(UnfinishedRunError, match=r"no saved state to resume from: pass --restart"):
        reasoning.run_all("tiny", only=("from_rare_10",), resume=True, progress=False)
