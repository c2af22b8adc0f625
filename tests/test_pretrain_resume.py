"""Pretraining survives an interruption: a resumed run equals an uninterrupted one, bit for bit.

Tiny budgets (a few updates of each phase, one thread) so the test takes seconds; states are
written at every log boundary (state_every_s=0).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from labkit.answer_phase import AnswerPhaseConfig, answer_batch, lr_at
from labkit.corpus import CorpusGenerator, dataset_keys
from labkit.pretrain import PretrainConfig, pretrain
from labkit.runs import read_json
from labkit.tokenizer import load_tiny_tokenizer

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


def test_the_answer_phase_learns_only_the_answer_digits():
    tokenizer = load_tiny_tokenizer()
    docs = [CorpusGenerator(5, dataset_keys()).direct() for _ in range(3)]
    batch = answer_batch(tokenizer, docs)
    for doc, ids, labels in zip(docs, batch["input_ids"], batch["labels"]):
        learned = tokenizer.decode(ids[labels != -100])
        a, b = doc.answer_span
        assert learned == doc.text[a:b] and learned.isdigit()
        assert "final_stock" not in doc.text


def test_the_answer_phase_schedule_warms_up_then_decays_to_its_floor():
    cfg = AnswerPhaseConfig(steps=100, warmup_steps=10, peak_lr=2e-3, final_lr=4e-4)
    assert lr_at(0, cfg) == pytest.approx(2e-4) and lr_at(9, cfg) == pytest.approx(2e-3)
    assert lr_at(10, cfg) == pytest.approx(2e-3) and lr_at(100, cfg) == pytest.approx(4e-4) < lr_at(99, cfg)
    assert all(lr_at(s, cfg) >= lr_at(s + 1, cfg) for s in range(10, 99))
