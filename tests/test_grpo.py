"""The GRPO loop on a random-init tiny model: counts, roles, rollouts file, exact resume."""

import json
import shutil

import pytest
import torch

from labkit.grpo import core, loop, losses
from labkit.lab import skeleton
from labkit.lab.runs import UnfinishedRunError
from labkit.models import presets
from labkit.lab import state as state_lib
from labkit.lab.runs import sha256_file
from labkit.config import TINY


@pytest.fixture(scope="module")
def start_file(tmp_path_factory):
    """A random-init tiny model standing in for the warm start (fast to sample: the loop is what is tested)."""
    path = tmp_path_factory.mktemp("start") / "model.safetensors"
    presets.save_model(presets.new_tiny_model(seed=3), path)
    return path


# Short responses keep the test fast: the loop logic does not depend on the length.
# Curves every iteration on 6 fixed problems: their records are tested, at little cost.
SMALL = TINY.with_overrides(max_new_tokens=6, grpo_lr=1e-3, checkpoint_every=1, checkpoint_problems=6)


def run(tmp, start_file, **kw):
    return loop.run_grpo(SMALL, tmp, G=2, iterations=3, start_file=start_file, progress=False, **kw)


@pytest.fixture(scope="module")
def continuous(tmp_path_factory, start_file):
    """(folder, manifest) of the plain 3-iteration run, built once for the module: tests read it and
    compare with it; a test that changes a file works on a copy."""
    folder = tmp_path_factory.mktemp("continuous") / "run"
    return folder, run(folder, start_file)


def test_counts_roles_and_rollout_records(continuous):
    folder, manifest = continuous
    # 3 iterations x 4 prompts x G=2 = 24 rollouts, 3 x 2 = 6 updates
    assert manifest["rollouts"] == 24 and manifest["updates"] == 6
    assert manifest["reference_digest"] == manifest["identity"]["start_digest"]
    assert manifest["final_digest"] != manifest["reference_digest"], "6 updates' worth of lr must move the policy"
    rows = loop.read_rollouts(folder)
    assert len(rows) == 24 and len({r["rollout_id"] for r in rows}) == 24
    for key in ("rollout_id", "iteration", "problem_id", "response_ids", "text", "finish_reason",
                "tokenization_valid", "logp_old", "reward", "advantage"):
        assert key in rows[0]
    history = json.loads((folder / "history.json").read_text())
    assert [h["iteration"] for h in history] == [1, 2, 3]
    assert all(len(h["updates"]) == 2 for h in history)
    # the pool never includes a warm-start problem, and prompts are not repeated within the epoch
    seen = [p for h in history for p in h["problem_ids"]]
    assert len(set(seen)) == len(seen) and all(int(p.split("-")[1]) >= 128 for p in seen)
    # each group's advantages are those of its own rewards
    for it in range(3):
        for k in range(4):
            group = [r for r in rows if r["iteration"] == it + 1][k * 2:(k + 1) * 2]
            rewards = torch.tensor([[r["reward"] for r in group]])
            expected = losses.group_advantages(rewards)[0].tolist()
            assert [r["advantage"] for r in group] == pytest.approx(expected, abs=0)


def test_finished_run_is_never_overwritten(continuous, start_file):
    folder, _ = continuous
    with pytest.raises(FileExistsError, match="never overwritten"):
        run(folder, start_file)


def test_stop_and_resume_equals_continuous(tmp_path, start_file, continuous):
    folder, _ = continuous
    stopped = run(tmp_path / "stop", start_file, stop_after=1)
    assert stopped["iterations_run"] == [0, 1]
    run(tmp_path / "resume", start_file, resume_from=loop.state_path(tmp_path / "stop", 1))
    a, _ = state_lib.load_state(loop.state_path(folder, 3))
    b, _ = state_lib.load_state(loop.state_path(tmp_path / "resume", 3))
    report = state_lib.compare_states(a, b)
    assert report["equal"], report["different_fields"]
    resumed = loop.read_rollouts(tmp_path / "resume")
    assert resumed == [r for r in loop.read_rollouts(folder) if r["iteration"] > 1]
    # the resumed folder measures its own iterations' checkpoints, equal to the continuous run's
    curves = loop.read_checkpoints(folder)
    assert [c["iteration"] for c in curves] == [0, 1, 2, 3]
    assert loop.read_checkpoints(tmp_path / "resume") == curves[2:]


def test_checkpoint_curves_change_no_weight_and_no_rollout(tmp_path, start_file, continuous):
    """The curves sample with seeds of their own and train nothing: the same run without them ends
    in the same weights, bit for bit, with the same rollouts."""
    folder, with_curves = continuous
    without = loop.run_grpo(SMALL.with_overrides(checkpoint_every=0), tmp_path / "without", G=2,
                            iterations=3, start_file=start_file, progress=False)
    assert with_curves["final_digest"] == without["final_digest"]
    assert loop.read_rollouts(folder) == loop.read_rollouts(tmp_path / "without")
    assert loop.read_checkpoints(tmp_path / "without") == []
    curves = loop.read_checkpoints(folder)
    start = curves[0]
    assert start["iteration"] == 0 and start["kl"] == 0.0, "at the start the policy is the reference"
    assert len(start["greedy_correct"]) == len(start["draws_correct"]) == 6
    assert start["sampled_success"] == sum(start["draws_correct"]) / (6 * SMALL.checkpoint_draws)


def test_a_problem_drawn_twice_in_one_iteration_makes_two_groups(tmp_path, start_file, monkeypatch):
    """P = 32 prompts from a pool of 20: the order wraps inside the iteration and 12 problems come
    twice.  Groups are positions, not problem ids: 32 groups of G = 2, every rollout id unique."""
    pool = core.load_pool()[:20]
    monkeypatch.setattr(core, "load_pool", lambda: pool)
    config = SMALL.with_overrides(prompts_per_iteration=32, checkpoint_every=0)
    loop.run_grpo(config, tmp_path / "run", G=2, iterations=1, start_file=start_file, progress=False)
    rows = loop.read_rollouts(tmp_path / "run")
    history = json.loads((tmp_path / "run" / "history.json").read_text())[0]
    assert len(history["problem_ids"]) == 32 and len(set(history["problem_ids"])) == 20
    assert len(rows) == 64 and len({r["rollout_id"] for r in rows}) == 64
    rewards = torch.tensor([r["reward"] for r in rows]).reshape(32, 2)
    assert history["frac_reward_zero_std"] == float(losses.zero_variance_groups(rewards).float().mean())
    assert [r["advantage"] for r in rows] == pytest.approx(losses.group_advantages(rewards).reshape(-1).tolist(),
                                                           abs=0)


def test_iteration_metrics_groups_by_position():
    rows = [{"problem_id": "train-0200", "reward": r, "response_ids": [1], "finish_reason": "eos"}
            for r in (1.0, 0.0, 1.0, 1.0)]  # one problem, two groups: (1, 0) has signal, (1, 1) has none
    metrics = core.iteration_metrics(rows, [True] * 4, G=2)
    assert metrics["frac_reward_zero_std"] == 0.5 and metrics["reward_std"] == 0.25
    with pytest.raises(ValueError, match="groups of 3"):
        core.iteration_metrics(rows, [True] * 4, G=3)


def test_resume_refuses_a_state_of_another_run(tmp_path, start_file):
    run(tmp_path / "stop", start_file, stop_after=1)
    with pytest.raises(ValueError, match="another run"):
        loop.run_grpo(SMALL, tmp_path / "other", G=4, iterations=3, start_file=start_file,
                      progress=False, resume_from=loop.state_path(tmp_path / "stop", 1))


def test_prompt_order_crosses_epochs_deterministically():
    a, b = core.PromptOrder(5, seed=1), core.PromptOrder(5, seed=1)
    first = a.take(7)
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and a.epoch == 1 and a.cursor == 2
    b.take(3)
    saved = b.state()
    c = core.PromptOrder(5, seed=1)
    c.restore(saved)
    assert c.take(4) == first[3:7]


def test_a_killed_run_resumed_in_place_keeps_every_rollout_once(tmp_path, start_file, continuous):
    """States at 1 and 2 of 3; the process dies after the iteration-2 state (as kill -9 would:
    nothing after it is written); resuming in the same folder gives the continuous run's rollouts."""
    continuous_folder, continuous = continuous
    folder = tmp_path / "killed"
    run(folder, start_file, stop_after=2, save_states_at=(1,))
    assert len(loop.read_rollouts(folder)) == 16  # written with the states, not at the end
    resumed = run(folder, start_file, resume_from=loop.state_path(folder, 2))
    assert loop.read_rollouts(folder) == loop.read_rollouts(continuous_folder)
    assert resumed["final_digest"] == continuous["final_digest"] and resumed["rollouts"] == 24


def test_a_fresh_start_in_an_unfinished_folder_leaves_no_old_rollouts(tmp_path, start_file):
    folder = tmp_path / "run"
    run(folder, start_file, stop_after=2, save_states_at=(1,))
    # a rerun that says neither resume nor restart is refused, and deletes nothing
    with pytest.raises(UnfinishedRunError,
                       match=r"holds an unfinished attempt \(16 rollouts, newest state states/iter-002\.pt\.gz\): "
                             r"pass --resume .* or --restart"):
        run(folder, start_file)
    assert sorted(p.name for p in (folder / "states").iterdir()) == ["iter-001.pt.gz", "iter-002.pt.gz"]
    run(folder, start_file, restart=True)
    rows = loop.read_rollouts(folder)
    assert len(rows) == 24 and len({r["rollout_id"] for r in rows}) == 24
    assert sorted(p.name for p in (folder / "states").iterdir()) == ["iter-003.pt.gz"]
    assert not list(folder.glob("stopped-at-*")), "the earlier attempt's stop marker is gone"
    ledger = json.loads((folder / "manifest.json").read_text())["ledger"]
    assert ledger["parts"]["rollouts.jsonl.gz"]["rows"] == 24 and ledger["parts"]["timings.jsonl.gz"]["rows"] == 3
    assert sorted(ledger["files"]) == ["history.json", "model.safetensors", "states/iter-003.pt.gz"]


def test_a_file_the_ledger_does_not_list_is_ignored_and_a_changed_part_refused(tmp_path, continuous):
    folder = shutil.copytree(continuous[0], tmp_path / "run")  # a copy: this test changes a part
    # a stray copy beside the real part (what globbing readers once merged) is not part of the run
    (folder / "rollouts-old.jsonl.gz").write_bytes((folder / "rollouts.jsonl.gz").read_bytes())
    assert len(loop.read_rollouts(folder)) == 24
    # an extra block appended to the real part changes its digest: refused, naming the file
    loop.RunFolder(folder).path.joinpath("rollouts.jsonl.gz").open("ab").write(
        __import__("gzip").compress(b'{"rollout_id": "x"}\n'))
    with pytest.raises(loop.ArtifactError, match=r"rollouts\.jsonl\.gz has SHA-256 .* but the ledger recorded"):
        loop.read_rollouts(folder)


def test_the_rollouts_of_a_resumed_run_are_byte_identical_to_the_continuous_run(tmp_path, start_file, continuous):
    folder = tmp_path / "killed"
    run(folder, start_file, stop_after=2, save_states_at=(1,))
    run(folder, start_file, resume_from=loop.state_path(folder, 1))  # back to iteration 1: 2 is redone
    assert (folder / "rollouts.jsonl.gz").read_bytes() == (continuous[0] / "rollouts.jsonl.gz").read_bytes()
    timings = loop.read_timings(folder)
    assert [t["iteration"] for t in timings] == [1, 2, 3]
    # each rollout's time, beside the rows and never in them (issue 57: the source protocol asks for it)
    rows = loop.read_rollouts(folder)
    assert [len(t["rollout_seconds"]) for t in timings] == [sum(r["iteration"] == t["iteration"] for r in rows)
                                                          for t in timings]
    assert all(s > 0 for t in timings for s in t["rollout_seconds"]) and "seconds" not in rows[0]


def test_a_finished_run_named_through_a_missing_folder_is_still_refused(continuous, start_file):
    with pytest.raises(FileExistsError, match="never overwritten"):
        run(continuous[0] / "nowhere" / "..", start_file)


def test_a_corrupted_start_file_is_refused(tmp_path, start_file):
    bad = tmp_path / "bad.safetensors"
    data = bytearray(start_file.read_bytes())
    data[-50] ^= 0x10
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted or changed after it was saved"):
        loop.run_grpo(SMALL, tmp_path / "run", G=2, iterations=1, start_file=bad, progress=False)


def test_a_start_file_that_differs_from_its_producers_record_is_refused(tmp_path, start_file):
    """A valid model file put where the warm start was: its own digest is fine, its producer's record is not."""
    warm = tmp_path / "tiny" / "warm_start"
    warm.mkdir(parents=True)
    (warm / "model.safetensors").write_bytes(start_file.read_bytes())
    recorded = loop.RunFolder(warm).register("model.safetensors")["sha256"]
    (warm / "manifest.json").write_text(json.dumps({"ledger": json.loads((warm / "parts.json").read_text())}))
    (warm / "parts.json").unlink()
    presets.save_model(presets.new_tiny_model(seed=4), warm / "model.safetensors")
    with pytest.raises(loop.ArtifactError) as refused:
        loop.run_grpo(SMALL, tmp_path / "run", G=2, iterations=1, start_file=warm / "model.safetensors",
                      progress=False)
    message = str(refused.value)
    assert recorded in message and sha256_file(warm / "model.safetensors") in message
    assert "python -m labkit warm-start --preset tiny --overwrite" in message
    assert not (tmp_path / "run" / "rollouts.jsonl.gz").exists(), "refused before any work"


def test_a_state_with_a_flipped_bit_is_refused_by_its_ledger(tmp_path, start_file):
    folder = tmp_path / "run"
    run(folder, start_file, stop_after=2, save_states_at=(1,))
    state = loop.state_path(folder, 1)
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))
    with pytest.raises(loop.ArtifactError, match=r"iter-001\.pt\.gz has SHA-256 .* records"):
        run(folder, start_file, resume_from=state)


def test_a_link_to_a_finished_run_is_refused(tmp_path, start_file, continuous):
    (tmp_path / "link").symlink_to(continuous[0])
    with pytest.raises(FileExistsError, match="never overwritten"):
        run(tmp_path / "link", start_file)


def test_shared_prompt_scoring_trains_the_same_policy_within_rounding(tmp_path, start_file, continuous):
    """The shared-prompt path computes each prompt once per group: the same rollouts at iteration 1,
    the pre-update check within its tolerance, and weights within float32 rounding after 6 updates."""
    plain_folder, plain = continuous
    shared = run(tmp_path / "shared", start_file, shared_prompts=True)
    assert shared["identity"]["scoring"] == "shared_prompt" and "scoring" not in plain["identity"]
    first = lambda folder: [r for r in loop.read_rollouts(folder) if r["iteration"] == 1]  # noqa: E731
    assert [r["response_ids"] for r in first(plain_folder)] == [r["response_ids"] for r in first(tmp_path / "shared")]
    history = json.loads((tmp_path / "shared" / "history.json").read_text())
    assert max(h["logprob_check/max_abs_diff"] for h in history) <= SMALL.logprob_check_tol
    # the first update sees the same weights and rollouts: its loss and gradient norm agree to rounding
    first_plain = json.loads((plain_folder / "history.json").read_text())[0]["updates"][0]
    assert history[0]["updates"][0]["loss"] == pytest.approx(first_plain["loss"], abs=1e-6)
    assert history[0]["updates"][0]["grad_norm"] == pytest.approx(first_plain["grad_norm"], rel=1e-4)
    # later updates: AdamW divides by sqrt(v), so a rounding-level gradient near 0 can flip a step's
    # sign; the weights stay close relative to how far the 6 updates moved them
    start, _ = presets.load("tiny", state=start_file)
    a, _ = presets.load("tiny", state=plain_folder / "model.safetensors")
    b, _ = presets.load("tiny", state=tmp_path / "shared" / "model.safetensors")
    norm = lambda pairs: sum(float((x - y).pow(2).sum()) for x, y in pairs) ** 0.5  # noqa: E731
    gap = norm(zip(a.parameters(), b.parameters()))
    moved = norm(zip(a.parameters(), start.parameters()))
    assert gap < 0.1 * moved, f"weights differ by {gap:.2e} (L2) after 6 updates that moved them by {moved:.2e}"


def test_a_resume_that_would_stop_before_its_state_is_refused_and_changes_nothing(tmp_path, start_file):
    folder = tmp_path / "run"
    run(folder, start_file, stop_after=2)
    before = sorted(p.name for p in folder.rglob("*") if p.is_file())
    with pytest.raises(ValueError, match=r"stop_after 1: .*iter-002\.pt\.gz is already after iteration 2"):
        run(folder, start_file, resume_from=folder / "states" / "iter-002.pt.gz", stop_after=1)
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == before  # no stray stopped-at-001.json


def test_resume_takes_the_newest_state_and_autosaves_go_once_the_run_finishes(tmp_path, start_file, continuous,
                                                                              monkeypatch):
    monkeypatch.setattr(skeleton, "AUTOSAVE_EVERY", 1)  # a state after every iteration
    folder = tmp_path / "run"
    run(folder, start_file, stop_after=2)  # iteration 1's autosave goes once iteration 2's state is saved
    assert sorted(p.name for p in (folder / "states").iterdir()) == ["iter-002.pt.gz"]
    with pytest.raises(ValueError, match="give one"):
        run(folder, start_file, resume=True, resume_from=folder / "states" / "iter-002.pt.gz")
    manifest = run(folder, start_file, resume=True)
    assert manifest["resumed_from"] == str(folder / "states" / "iter-002.pt.gz")
    assert manifest["final_digest"] == continuous[1]["final_digest"]
    assert sorted(p.name for p in (folder / "states").iterdir()) == ["iter-002.pt.gz", "iter-003.pt.gz"]
    assert sorted(manifest["ledger"]["files"]) == ["history.json", "model.safetensors", "states/iter-002.pt.gz",
                                                   "states/iter-003.pt.gz"]


@pytest.mark.parametrize("damage", ["edited", "deleted"])
def test_a_finished_runs_manifest_is_checked_before_its_model_is_trusted(tmp_path, continuous, damage):
    from labkit.lab.runs import ArtifactError, RunFolder

    folder = shutil.copytree(continuous[0], tmp_path / "run")
    manifest = folder / "manifest.json"
    if damage == "edited":
        manifest.write_text(manifest.read_text().replace('"updates": 6', '"updates": 7'))
        expected = r"manifest\.json has SHA-256 .* but .*FINISHED recorded .*: the manifest was edited or damaged"
    else:
        manifest.unlink()
        expected = r"manifest\.json is missing, but .*FINISHED says the run finished with one"
    with pytest.raises(ArtifactError, match=expected):
        RunFolder(folder).manifest()
    with pytest.raises(ArtifactError, match=expected):  # a model is checked against its run's records
        presets.load("tiny", state=folder / "model.safetensors")


@pytest.mark.parametrize("sampler", ["fast", "static"])
def test_the_batched_samplers_train_the_protocols_policy(tmp_path, start_file, continuous, sampler):
    """Their tokens are the reference sampler's (tests/test_sampling.py, tests/test_static_sampler.py),
    so the run is the same run: the same rollouts and the same final weights, bit for bit."""
    manifest = run(tmp_path / "run", start_file, sampler=sampler)
    assert manifest["final_digest"] == continuous[1]["final_digest"]
    # the sampler's own log-probs differ in float rounding only (the pre-update check's tolerance)
    own = ("sampler", "seconds", "logp_old")
    strip = lambda rows: [{k: v for k, v in r.items() if k not in own} for r in rows]  # noqa: E731
    rows, protocol = loop.read_rollouts(tmp_path / "run"), loop.read_rollouts(continuous[0])
    assert strip(rows) == strip(protocol)
    assert max(abs(a - b) for r, q in zip(rows, protocol) for a, b in zip(r["logp_old"], q["logp_old"])) <= 2e-4
