"""The format-seeded base (labkit.studies.format_base): its documents, its stop rule, the committed run."""

import json
import random
from dataclasses import replace

import pytest

from labkit.train import corpus
from labkit.studies import format_base
from labkit.models import presets
from labkit.task import problems, verifier
from labkit.eval.evaluate import load_test_labels, read_predictions
from labkit.lab.runs import REPO_ROOT, UnfinishedRunError, read_json

COMMITTED = REPO_ROOT / "runs" / "tiny" / "format_base"


def test_a_lab_format_document_is_the_labs_prompt_and_answer_for_a_fresh_problem():
    source = corpus.CorpusGenerator(7, corpus.dataset_keys())
    doc = format_base.lab_format_document(source)
    assert doc.kind == "lab_format"
    assert problems.FORMAT_INSTRUCTION in doc.text
    answer = doc.text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>")[0]
    [key] = doc.keys
    problem = problems.Problem(key[0], key[1], key[2])
    assert json.loads(answer) == {"final_stock": problems.solve(problem)}
    assert key not in corpus.dataset_keys()
    assert corpus.check_disjoint([doc], corpus.dataset_keys()) == 1


def test_the_share_of_lab_format_documents_is_the_stated_one():
    cfg = format_base.FormatBaseConfig()
    source = corpus.CorpusGenerator(cfg.seed, corpus.dataset_keys())
    kinds = [format_base.next_document(source, cfg).kind for _ in range(5000)]
    share = kinds.count("lab_format") / len(kinds)
    assert abs(share - cfg.lab_format_share) < 4 * (cfg.lab_format_share * (1 - cfg.lab_format_share) / 5000) ** 0.5
    assert "final_stock" not in {d for d in kinds if d != "lab_format"}


def test_training_stops_at_the_first_measurement_over_the_threshold(monkeypatch):
    shares = iter([0.0, 0.01, 0.2, 0.9])
    monkeypatch.setattr(format_base, "format_share", lambda *a: {"valid": next(shares), "correct": 0.0, "responses": 4})
    model, tokenizer = presets.load("tiny")
    cfg = format_base.FormatBaseConfig(max_steps=5, measure_every=1, stop_at_valid_share=0.1, documents_per_step=2)
    result = format_base.train(model, tokenizer, cfg, problems=[], progress=False)
    measured = [(r["step"], r["valid"]) for r in result["log"] if r["kind"] == "measure"]
    assert measured == [(0, 0.0), (1, 0.01), (2, 0.2)]
    assert result["steps"] == 2 and result["documents"] == 4 and result["problems_checked"] >= 4
    assert not model.training  # trained in eval mode: no attention dropout


def test_the_qwen_preset_is_refused():
    with pytest.raises(ValueError, match="only the tiny base is pretrained by the lab"):
        format_base.run_format_base("qwen")


def test_the_committed_run_shows_the_format_rarely_and_its_evaluation_rescores_exactly():
    manifest = read_json(COMMITTED / "manifest.json")
    cfg = manifest["config"]
    log = format_base.read_log()
    measured = [r for r in log if r["kind"] == "measure"]
    assert measured[0]["step"] == 0 and measured[0]["valid"] == 0.0  # the base never answers so
    assert all(r["valid"] < cfg["stop_at_valid_share"] for r in measured[:-1])
    assert cfg["stop_at_valid_share"] <= measured[-1]["valid"] < 0.5  # present, and rare
    assert manifest["format_share"]["after"] == measured[-1]
    assert manifest["counts"]["documents"] == manifest["counts"]["steps"] * cfg["documents_per_step"]
    assert 0 < manifest["counts"]["lab_format_documents"] < manifest["counts"]["documents"] * 0.05
    labels = {r["id"]: r for r in load_test_labels(phase="scoring")}
    folder = COMMITTED / "evaluation" / format_base.POLICY_NAME
    assert read_json(folder / "manifest.json")["state_file"] == "runs/tiny/format_base/model.safetensors"
    for mode in ("greedy", "sample"):
        rows = read_predictions(folder, mode)
        assert len(rows) == (200 if mode == "greedy" else 800)
        valid = [verifier.score(r["text"], r["finish_reason"], labels[r["problem_id"]]["problem"]).valid for r in rows]
        assert sum(valid) < len(rows) / 2


def test_random_is_not_used_for_the_share(monkeypatch):
    """The document stream is the generator's own seeded rng, never Python's global one."""
    cfg = format_base.FormatBaseConfig()
    a = corpus.CorpusGenerator(cfg.seed, corpus.dataset_keys())
    b = corpus.CorpusGenerator(cfg.seed, corpus.dataset_keys())
    random.seed(1)
    first = [format_base.next_document(a, cfg).text for _ in range(50)]
    random.seed(2)
    assert [format_base.next_document(b, cfg).text for _ in range(50)] == first


SMALL = format_base.FormatBaseConfig(max_steps=6, measure_every=3, measure_draws=1, documents_per_step=2,
                                     stop_at_valid_share=2.0)  # a share no measurement reaches: all six updates


@pytest.fixture
def few_problems(monkeypatch):
    """Two validation problems to measure on (the run's maths is the same on 200)."""
    problems = format_base.validation_problems()[:2]
    monkeypatch.setattr(format_base, "validation_problems", lambda: problems)


def test_a_stopped_format_base_is_refused_until_resume_and_then_equals_the_uninterrupted_one(tmp_path, few_problems):
    """Issue 58, item 1: the format base is a run like every other (a state, a refusal, an exact resume)."""
    whole = format_base.run_format_base(run_dir=tmp_path / "whole", cfg=SMALL, evaluate_limit=1, progress=False)
    stopped = format_base.run_format_base(run_dir=tmp_path / "cut", cfg=SMALL, stop_after=2, progress=False)
    assert stopped["stopped_after"] == 2 and stopped["state"].endswith("states/update-00002.pt.gz")
    with pytest.raises(UnfinishedRunError, match=r"a state after 2 updates\): pass --resume .* or --restart"):
        format_base.run_format_base(run_dir=tmp_path / "cut", cfg=SMALL, progress=False)
    resumed = format_base.run_format_base(run_dir=tmp_path / "cut", cfg=SMALL, resume=True, evaluate_limit=1,
                                          progress=False)
    assert resumed["resumed_from"] == "update-00002.pt.gz" and whole["resumed_from"] is None
    assert resumed["final_digest"] == whole["final_digest"] and resumed["counts"] == whole["counts"]
    assert read_json(tmp_path / "cut" / "log.json") == read_json(tmp_path / "whole" / "log.json")
    assert not list((tmp_path / "cut").glob("states/*.pt.gz"))  # the autosaves go once the run has finished
    format_base.run_format_base(run_dir=tmp_path / "other", cfg=SMALL, stop_after=2, progress=False)
    with pytest.raises(ValueError, match="belongs to another format base or setting: identity fields \\['config'\\]"):
        format_base.run_format_base(run_dir=tmp_path / "other", cfg=replace(SMALL, lr=1e-5), resume=True,
                                    progress=False)


def test_a_ctrl_c_during_the_evaluation_is_continued_by_the_same_command(tmp_path, few_problems, monkeypatch):
    from labkit.eval import evaluate

    original = evaluate.run_inference

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "run_inference", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        format_base.run_format_base(run_dir=tmp_path / "f", cfg=SMALL, evaluate_limit=1, progress=False)
    monkeypatch.setattr(evaluate, "run_inference", original)
    manifest = format_base.run_format_base(run_dir=tmp_path / "f", cfg=SMALL, evaluate_limit=1, progress=False)
    assert manifest["counts"]["steps"] == 6 and (tmp_path / "f" / "evaluation" / "format_base" / "FINISHED").is_file()
    with pytest.raises(FileExistsError):  # finished and evaluated: refused unless --overwrite
        format_base.run_format_base(run_dir=tmp_path / "f", cfg=SMALL, evaluate_limit=1, progress=False)


def test_ctrl_c_saves_a_state_and_names_the_command_that_continues(tmp_path, few_problems, monkeypatch):
    import os
    import signal

    from labkit.lab.skeleton import Interrupted

    original = format_base.FormatRun.update

    def update_then_ctrl_c(self):
        row = original(self)
        if self.done == 3:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: the run stops after this update, with its state
        return row

    monkeypatch.setattr(format_base.FormatRun, "update", update_then_ctrl_c)
    with pytest.raises(Interrupted, match=r"after update 3: its state is .*update-00003\.pt\.gz; continue with "
                                          r"the same command and --resume"):
        format_base.run_format_base(run_dir=tmp_path / "f", cfg=SMALL, progress=False)
    monkeypatch.setattr(format_base.FormatRun, "update", original)
    assert format_base.run_format_base(run_dir=tmp_path / "f", cfg=SMALL, resume=True, evaluate_limit=1,
                                       progress=False)["resumed_from"] == "update-00003.pt.gz"
