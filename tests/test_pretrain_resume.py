"""Pretraining survives an interruption: a resumed run equals an uninterrupted one, bit for bit.

Tiny budgets (a few updates of each phase, one thread) so the test takes seconds; states are
written at every log boundary (state_every_s=0).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from labkit.train.answer_phase import JSON_KEYS, AnswerPhaseConfig, answer_batch, keyed_document, lr_at
from labkit.train.corpus import CorpusGenerator, dataset_keys
from labkit.train.pretrain import PretrainConfig, pretrain
from labkit.lab.runs import read_json
from labkit.models.tokenizer import load_tiny_tokenizer

SMALL = PretrainConfig(steps=4, log_every=2, heldout_every=2, heldout_rows=4, probe_documents=8, warmup_steps=2,
                       answer=AnswerPhaseConfig(steps=4, documents_per_step=4, warmup_steps=1, probe_documents=8,
                                                eval_every=2, log_every=2))


@pytest.fixture(scope="module")
def continuous(tmp_path_factory):
    return pretrain(SMALL, tmp_path_factory.mktemp("continuous"), progress=False, state_every_s=0)


@pytest.mark.parametrize("stop", [("corpus", 2), ("answer", 2)])
def test_a_resumed_pretraining_equals_an_uninterrupted_one(tmp_path, continuous, stop):
    assert pretrain(SMALL, tmp_path, progress=False, stop_after=stop, state_every_s=0) is None
    assert not (tmp_path / "model.safetensors").exists()
    resumed = pretrain(SMALL, tmp_path, progress=False, resume=True, state_every_s=0)
    assert resumed["parameter_digest"] == continuous["parameter_digest"]
    assert resumed["corpus"] == continuous["corpus"]
    assert [row[::2] for row in resumed["answer_phase"]["curve"]] == [row[::2] for row in continuous["answer_phase"]["curve"]]
    assert read_json(tmp_path / "manifest.json")["model_sha256"] == continuous["model_sha256"]


def test_an_interrupted_run_is_not_a_different_run(tmp_path):
    assert pretrain(SMALL, tmp_path, progress=False, stop_after=("answer", 2), state_every_s=0) is None
    other = replace(SMALL, answer=replace(SMALL.answer, peak_lr=1e-3))
    with pytest.raises(ValueError, match="not a state of this answer phase"):
        pretrain(other, tmp_path, progress=False, resume=True, state_every_s=0)


def test_the_answer_phase_learns_the_whole_answer_and_measures_its_digits():
    tokenizer = load_tiny_tokenizer()
    source = CorpusGenerator(5, dataset_keys())
    docs = [source.direct(), keyed_document(source), keyed_document(source)]
    trained = answer_batch(tokenizer, docs)
    measured = answer_batch(tokenizer, docs, span="number")
    for doc, ids, labels, digit_labels in zip(docs, trained["input_ids"], trained["labels"], measured["labels"]):
        assistant = doc.text.split("<|im_start|>assistant\n")[1]
        answer = assistant[: assistant.index("<|im_end|>") + len("<|im_end|>")]
        assert tokenizer.decode(ids[labels != -100]) == answer  # the whole answer, up to its end of turn
        a, b = doc.answer_span
        assert tokenizer.decode(ids[digit_labels != -100]) == doc.text[a:b] and doc.text[a:b].isdigit()
        assert "final_stock" not in doc.text
    for doc in docs[1:]:  # a keyed document answers with the key its instruction names
        key = doc.text.split('of the form {"')[1].split('"')[0]
        assert key in JSON_KEYS and doc.text.split("assistant\n")[1].startswith('{"' + key + '": ')


def test_the_answer_phase_schedule_warms_up_then_decays_to_its_floor():
    cfg = AnswerPhaseConfig(steps=100, warmup_steps=10, peak_lr=2e-3, final_lr=4e-4)
    assert lr_at(0, cfg) == pytest.approx(2e-4) and lr_at(9, cfg) == pytest.approx(2e-3)
    assert lr_at(10, cfg) == pytest.approx(2e-3) and lr_at(100, cfg) == pytest.approx(4e-4)
    assert lr_at(99, cfg) > lr_at(100, cfg)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 99))


def test_the_cli_lists_the_protocol_steps_in_order_and_refuses_bad_pretrain_options(capsys):
    from labkit import cli

    listed = [a.dest for a in cli.build_parser()._subparsers._group_actions[0]._choices_actions]
    assert listed == list(cli.COMMAND_ORDER)
    assert cli.main(["pretrain", "--answer-steps", "0"]) == 2
    assert "--answer-steps 0: must be at least 1" in capsys.readouterr().err
    assert cli.main(["pretrain", "--preset", "nosuch"]) == 2
    assert "only the tiny preset is pretrained" in capsys.readouterr().err


def test_a_rerun_without_resume_or_restart_keeps_the_saved_states(tmp_path, capsys):
    """Issue 58, item 8: the same command run again after a stop deleted every saved state, the finished
    corpus phase's included, without a word; now it is refused in one line, and nothing is touched."""
    from labkit import cli

    assert pretrain(SMALL, tmp_path, progress=False, stop_after=("corpus", 2), state_every_s=0) is None
    states = sorted((tmp_path / "states").iterdir())
    before = {p.name: p.read_bytes() for p in states}
    assert before
    assert cli.main(["pretrain", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path} holds an unfinished pretraining "
                                               f"({len(before)} saved state(s), newest "), err
    assert err[0].endswith("pass --resume to continue from it, or --restart to delete them and start afresh"), err
    assert cli.main(["pretrain", "--out", str(tmp_path), "--resume", "--restart"]) == 2
    assert "--resume and --restart: give one" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "states").iterdir())} == before


def test_ctrl_c_in_pretraining_names_its_newest_state_and_resume(tmp_path, capsys, monkeypatch):
    from labkit import cli
    from labkit.train import pretrain as pretrain_module

    assert pretrain(SMALL, tmp_path, progress=False, stop_after=("corpus", 2), state_every_s=0) is None

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrain_module, "pretrain", interrupted)
    assert cli.main(["pretrain", "--out", str(tmp_path), "--resume"]) == 130
    newest = max((tmp_path / "states").iterdir(), key=lambda p: p.stat().st_mtime)
    assert capsys.readouterr().err.strip() == (f"interrupted: pretraining stopped; its newest state is {newest}: "
                                               "continue with the same command and --resume")
