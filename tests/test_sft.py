"""labkit.train.sft and labkit.train.schedule: counts, schedule, overfit, exact resume, evidence rules.

Runs use a randomly initialised tiny model and a shortened config (a few
examples, 2 epochs of 2 updates), so the whole file takes seconds.
"""

from __future__ import annotations

import pytest
import torch

from labkit import config
from labkit.task import data
from labkit.models import presets
from labkit.train import schedule, sft
from labkit.lab import state
from labkit.lab.runs import RunExistsError, read_json
from labkit.models.tokenizer import load_tiny_tokenizer

# 2 epochs x 2 updates of 4 examples; 8 validation problems
SHORT = config.TINY.with_overrides(warm_start_examples=8, warm_start_epochs=2, sft_batch_size=4)
VALIDATION_LIMIT = 8


@pytest.fixture(scope="module")
def tokenizer():
    return load_tiny_tokenizer()


@pytest.fixture(scope="module")
def train_examples(tokenizer):
    return sft.load_split_examples(tokenizer, "train")


@pytest.fixture(scope="module")
def factory(tokenizer):
    return lambda: (presets.new_tiny_model(0, tokenizer), tokenizer)


@pytest.fixture(scope="module")
def checked(tmp_path_factory, factory):
    """A shortened warm start and its resume check (in-process, fresh objects)."""
    root = tmp_path_factory.mktemp("sft")
    report = sft.resume_check(SHORT, "warm_start", run_dir=root / "real", scratch_dir=root / "scratch",
                              model_factory=factory, fresh_process=False, validation_limit=VALIDATION_LIMIT,
                              progress=False)
    return root, report


# -- schedule -----------------------------------------------------------------------------------


def test_schedule_hand_worked_values():
    # total 10, warm-up ceil(1.0) = 1: peak at update 0, then linear to 0.1 * peak at update 9
    values = schedule.schedule_values(10, 1.0)
    assert values[0] == 1.0 and values[9] == pytest.approx(0.1, abs=1e-15)
    assert values[5] == pytest.approx(1 - 0.9 * 5 / 9, abs=1e-15)
    # the protocol's three schedules
    assert [schedule.warmup_updates(t, 0.1) for t in (48, 218, 200)] == [5, 22, 20]
    warm = schedule.schedule_values(48, 1e-3)
    assert warm[0] == pytest.approx(2e-4) and warm[4] == 1e-3 and warm[47] == pytest.approx(1e-4)
    grpo = schedule.schedule_values(200, 1e-6)
    assert grpo[19] == 1e-6 and grpo[199] == pytest.approx(1e-7) and max(grpo) == 1e-6
    assert all(a >= b for a, b in zip(grpo[19:], grpo[20:]))  # decays monotonically after warm-up
    with pytest.raises(ValueError, match="update index"):
        schedule.warmup_linear_decay(48, 48, 1e-3)


# -- counts and data ------------------------------------------------------------------------------


def test_protocol_counts():
    for preset in (config.TINY, config.QWEN):
        warm, more = sft.make_plan(preset, "warm_start"), sft.make_plan(preset, "sft")
        assert (warm.examples, warm.epochs, warm.batch_size, warm.updates_per_epoch, warm.total_updates) == (128, 3, 8, 16, 48)
        assert (more.examples, more.epochs, more.batch_size, more.updates_per_epoch, more.total_updates) == (872, 2, 8, 109, 218)
    assert sft.make_plan(config.QWEN, "sft").peak_lr == 2e-5 and sft.make_plan(config.TINY, "sft").peak_lr == 1.5e-4
    with pytest.raises(ValueError, match="unknown SFT branch"):
        sft.make_plan(config.TINY, "grpo")


def test_branch_examples_are_the_first_128_and_the_other_872(tokenizer, train_examples):
    train = train_examples
    warm = sft.branch_examples(train, "warm_start", config.TINY)
    more = sft.branch_examples(train, "sft", config.TINY)
    assert [e.id for e in warm] == [f"train-{i:04d}" for i in range(128)]
    assert [e.id for e in more] == [f"train-{i:04d}" for i in range(128, 1000)]
    assert all(e.response_ids[-1] == tokenizer.eos_token_id for e in warm + more)  # EOS is supervised


def test_learning_phase_refuses_test_data(tokenizer):
    with pytest.raises(data.PhaseError, match="learning may not open test"):
        sft.load_split_examples(tokenizer, "test")


# -- one update -----------------------------------------------------------------------------------


def test_loss_decreases_on_a_tiny_overfit(tokenizer, train_examples):
    model = presets.new_tiny_model(0, tokenizer)
    examples = train_examples[:2]
    # 5e-3, well above the preset's rate, so that 12 updates on 2 examples are enough to overfit
    overfit = config.TINY.with_overrides(warm_start_examples=2, warm_start_epochs=12, sft_batch_size=2, sft_lr=5e-3)
    plan = sft.make_plan(overfit, "warm_start")
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=plan.peak_lr)
    losses = [sft.sft_update(model, optimizer, examples, tokenizer.pad_token_id, plan, k, 1)["loss"]
              for k in range(plan.total_updates)]
    assert losses[0] > 5.0  # random init over 512 ids: about log(512) = 6.2
    assert losses[-1] < 0.5 * losses[0], losses


def test_update_refuses_train_mode(tokenizer):
    model = presets.new_tiny_model(0, tokenizer).train()
    examples = sft.load_split_examples(tokenizer, "validation")[:2]
    params = list(model.parameters())
    with pytest.raises(RuntimeError, match="eval mode"):
        sft.sft_update(model, torch.optim.AdamW(params), examples, tokenizer.pad_token_id,
                       sft.make_plan(SHORT, "warm_start"), 0, 1)


def test_same_threads_same_numbers(tokenizer, train_examples):
    """Two runs of the same updates give bitwise-equal weights (the thread count is held fixed)."""
    examples = train_examples[:8]
    plan = sft.make_plan(SHORT, "warm_start")
    digests = []
    for _ in range(2):
        model = presets.new_tiny_model(0, tokenizer)
        params = list(model.parameters())
        optimizer = torch.optim.AdamW(params, lr=plan.peak_lr)
        with sft.deterministic_algorithms():
            for k in range(2):
                sft.sft_update(model, optimizer, examples[4 * k : 4 * k + 4], tokenizer.pad_token_id, plan, k, 1)
        digests.append(presets.parameter_digest(model))
    assert digests[0] == digests[1]


# -- the run, its evidence and its resume -----------------------------------------------------------


def test_resume_equals_continuous_exactly(checked):
    root, report = checked
    assert report["equal"] is True
    end = report["end_state"]
    assert end["equal"] is True and end["different_fields"] == []
    for section in state.STATE_SECTIONS + ("final_model_file",):
        assert end["sections"][section]["equal"] is True, section
    assert report["boundary_state"]["equal"] is True
    assert read_json(root / "real" / "resume_report.json")["equal"] is True
    resumed = read_json(root / "scratch" / "resume" / "manifest.json")
    assert resumed["resumed_from"]["epochs_done"] == 1
    assert resumed["counts"]["updates"] == 4  # the history carried over: 2 before the stop, 2 after


def test_run_evidence(checked, factory):
    root, _ = checked
    manifest = read_json(root / "real" / "manifest.json")
    history = read_json(root / "real" / "history.json")
    assert manifest["status"] == "finished" and (root / "real" / "FINISHED").exists()
    assert manifest["counts"]["updates"] == 4 and len(history["updates"]) == 4
    assert [v["epoch"] for v in manifest["validation_nll"]] == [0, 1, 2]
    assert manifest["validation_used_for_selection"] is False and manifest["eval_mode"] is True
    assert manifest["start_model"]["parameter_digest"] != manifest["final_digest"]
    assert manifest["reloaded_parameter_digest"] == manifest["final_digest"]
    model, _ = factory()
    presets.load_state_into(model, root / "real" / "model.safetensors")
    assert presets.parameter_digest(model) == manifest["final_digest"]
    assert set(manifest["files"]["states"]) == {"states/epoch-1.pt.gz", "states/epoch-2.pt.gz"}
    greedy = manifest["validation_greedy"]  # measured on the reloaded final model, chooses nothing
    assert greedy["problems"] == VALIDATION_LIMIT and greedy["correct"] + sum(greedy["reasons"].values()) == VALIDATION_LIMIT
    # each epoch used every example once, in a permutation
    for epoch in (1, 2):
        ids = [i for h in history["updates"] if h["epoch"] == epoch for i in h["example_ids"]]
        assert sorted(ids) == [f"train-{i:04d}" for i in range(8)]
    # the loss is the mean over the batch's active tokens, and the learning rates follow the schedule
    assert [h["learning_rate"] for h in history["updates"]] == schedule.schedule_values(4, SHORT.sft_lr)


def test_finished_run_refuses_overwrite(checked, factory):
    root, _ = checked
    with pytest.raises(RunExistsError, match="never overwritten"):
        sft.run_branch(SHORT, "warm_start", root / "real", model_factory=factory, progress=False)
    with pytest.raises(FileExistsError, match="resume report is evidence"):
        sft.resume_check(SHORT, "warm_start", run_dir=root / "real", scratch_dir=root / "scratch",
                         model_factory=factory, fresh_process=False, progress=False)


def test_a_resume_that_loses_the_data_order_is_caught(checked, factory, tmp_path):
    """A state whose data-order generator was not saved properly: the resumed run ends elsewhere."""
    root, _ = checked
    boundary, evidence = state.load_state(root / "scratch" / "stop" / "states" / "epoch-1.pt.gz")
    boundary["generators"]["data_order"] = torch.Generator().manual_seed(0).get_state()  # the bug
    broken = tmp_path / "broken.pt.gz"
    state.save_state(broken, boundary, evidence)
    sft.run_branch(SHORT, "warm_start", tmp_path / "resumed", model_factory=factory, resume_from=broken,
                   validation_limit=VALIDATION_LIMIT, progress=False, greedy_eval=False)
    report = state.compare_state_files(root / "real" / "states" / "epoch-2.pt.gz",
                                       tmp_path / "resumed" / "states" / "epoch-2.pt.gz")
    assert report["equal"] is False
    assert "generators/data_order" in report["different_fields"]
    assert "data_order/permutation" in report["different_fields"]
    assert any(p.startswith("model/") for p in report["different_fields"])


def test_resume_refuses_another_runs_state(checked, factory, tmp_path):
    root, _ = checked
    other = SHORT.with_overrides(sft_lr=5e-4)
    with pytest.raises(ValueError, match="identity differs in .*config_fingerprint"):
        sft.run_branch(other, "warm_start", tmp_path / "x", model_factory=factory, progress=False,
                       resume_from=root / "scratch" / "stop" / "states" / "epoch-1.pt.gz",
                       validation_limit=VALIDATION_LIMIT)


def test_a_rerun_into_an_unfinished_attempt_is_refused_unless_restarted(tmp_path, factory):
    from labkit.lab.runs import UnfinishedRunError

    folder = tmp_path / "run"
    common = dict(model_factory=factory, validation_limit=VALIDATION_LIMIT, progress=False, greedy_eval=False)
    sft.run_branch(SHORT, "warm_start", folder, stop_after_epochs=1, **common)
    with pytest.raises(UnfinishedRunError, match=r"holds an unfinished attempt \(newest state states/epoch-1\.pt\.gz\): "
                                                 r"pass --resume-from .*epoch-1\.pt\.gz to continue it, or --restart"):
        sft.run_branch(SHORT, "warm_start", folder, **common)
    assert (folder / "states" / "epoch-1.pt.gz").is_file(), "the refusal deleted nothing"
    manifest = sft.run_branch(SHORT, "warm_start", folder, restart=True, **common)
    assert manifest["status"] == "finished"


def test_a_first_ctrl_c_mid_epoch_saves_an_autosave_that_resumes_to_the_continuous_run(checked, factory, tmp_path,
                                                                                       monkeypatch):
    """The run skeleton (labkit.lab.skeleton) in SFT: Ctrl-C during update 3 (epoch 2 of 2, 2 updates an epoch)
    finishes the update, saves states/update-00003.pt.gz and stops naming it; resumed from it, inside its
    epoch, the run ends with the continuous run's model and history, bit for bit."""
    from labkit.lab import skeleton
    from labkit.lab.runs import sha256_file

    asked = skeleton.Autosave.due

    def ctrl_c_at_update_3(self, done):
        if done == 3:
            self.interrupt.requested = True  # what DeferredInterrupt's handler does on a first Ctrl-C
        return asked(self, done)

    monkeypatch.setattr(skeleton.Autosave, "due", ctrl_c_at_update_3)
    folder = tmp_path / "run"
    common = dict(model_factory=factory, validation_limit=VALIDATION_LIMIT, progress=False, greedy_eval=False)
    with pytest.raises(skeleton.Interrupted, match=r"interrupted after update 3: its state is .*update-00003\.pt\.gz; "
                                                   r"continue with the same command and --resume-from "):
        sft.run_branch(SHORT, "warm_start", folder, **common)
    state_file = folder / "states" / "update-00003.pt.gz"
    saved, _ = state.load_state(state_file)
    assert saved["progress"]["updates_done"] == 3 and saved["data_order"]["cursor"] == 4  # inside epoch 2
    monkeypatch.setattr(skeleton.Autosave, "due", asked)
    manifest = sft.run_branch(SHORT, "warm_start", folder, resume_from=state_file, **common)
    root, _ = checked
    assert manifest["status"] == "finished"
    assert sha256_file(folder / "model.safetensors") == sha256_file(root / "real" / "model.safetensors")
    assert read_json(folder / "history.json") == read_json(root / "real" / "history.json")
    # the state it resumed from stays, named by the manifest (as GRPO's does)
    assert state_file.exists() and manifest["resumed_from"]["path"] == str(state_file)


def test_the_resume_report_states_the_digests_of_the_states_it_does_not_keep(checked):
    """Issue 57: the stop-boundary and resumed-end states are scratch, wiped; the report keeps their SHA-256 (and
    the continuous end's), each the digest of the file compared."""
    from labkit.lab.runs import sha256_file

    root, report = checked
    digests = report["state_sha256"]
    assert set(digests) == {"continuous_end", "stop_boundary", "resumed_end"}
    assert digests["continuous_end"] == sha256_file(root / "real" / report["continuous_state"])
    assert digests["stop_boundary"] == sha256_file(root / "scratch" / "stop" / "states" / "epoch-1.pt.gz")
    assert all(len(d) == 64 for d in digests.values())
