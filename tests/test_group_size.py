"""Chapter 8's exercise: constant groups, same presentations, budget arithmetic, protection, bonus refusal."""

import pytest
import torch

from labkit.book import exercises
from labkit.grpo import loop
from labkit.studies import group_size as gs
from labkit.models import presets
from labkit.config import TINY
from labkit.lab.runs import RunExistsError, read_json, write_json

# Short responses and few iterations keep the test fast: the exercise's logic does not depend on them.
# Curves on 4 fixed problems, not 64: they run in every branch, at a second instead of ~14 per run.
SMALL = TINY.with_overrides(max_new_tokens=6, grpo_lr=1e-3, checkpoint_problems=4)
ITERATIONS = 2


# -- 1. constant groups ---------------------------------------------------------------------------


def test_zero_variance_groups_have_exactly_zero_advantages_and_gradients():
    rows = {r["case"]: r for r in gs.zero_variance_group_table()}
    for case in ("all wrong", "all right"):
        r = rows[case]
        assert r["zero_variance"] is True
        assert r["advantages"] == [0.0, 0.0, 0.0, 0.0]
        assert r["surrogate_loss"] == 0.0
        assert r["logp_grad"] == [[0.0] * 3] * 4 and r["max_abs_grad"] == 0.0
    half = rows["two right, two wrong"]
    assert half["zero_variance"] is False and half["ratio_mean"] == 1.0
    assert half["advantages"] == pytest.approx([1, -1, 1, -1], abs=1e-7)
    assert half["advantages"] != [1.0, -1.0, 1.0, -1.0], "eps = 1e-8 keeps them just below 1 (float64)"
    # d loss / d logp = -A_i / (G L_i) on the response's tokens, lengths 3, 2, 3, 1; 0 on padding
    a = 0.5 / (0.5 + 1e-8)
    expected = [[-a / 12] * 3, [a / 8, a / 8, 0.0], [-a / 12] * 3, [a / 4, 0.0, 0.0]]
    for got_row, want_row in zip(half["logp_grad"], expected):
        assert got_row == pytest.approx(want_row, abs=1e-15)
    assert half["logp_grad"] == half["logp_grad_formula"]
    assert all(r["source"] == gs.CONSTRUCTED for r in rows.values())


# -- 2. the exercise end to end on a random-init model (no resume checks, no evaluation) ----------


@pytest.fixture(scope="module")
def exercise(tmp_path_factory):
    """A main G=4 run of 3 iterations, then the exercise (G=2, G=8, 2 iterations each) in a tmp runs folder."""
    root = tmp_path_factory.mktemp("runs") / "tiny"
    start = presets.save_model(presets.new_tiny_model(seed=3), root.parent / "start.safetensors")
    code = root.parent / "code"
    for rel in gs.PROTECTED_CODE:
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text(f"# stand-in for {rel}\n")
    loop.run_grpo(SMALL, root / "grpo", G=4, iterations=3, start_file=start, progress=False)
    manifest = gs.run_exercise(SMALL, runs_root=root, code_root=code, iterations=ITERATIONS, start_file=start,
                               resume_checks=False, evaluate=False, validation_limit=2, progress=False)
    return {"root": root, "code": code, "start": start, "manifest": manifest}


def test_branches_see_the_same_presentations(exercise):
    root = exercise["root"]
    report = read_json(root / "group_size" / "presentations.json")
    g2, g8, main = (gs.prompt_presentations(root / name) for name in ("grpo_g2", "grpo_g8", "grpo"))
    assert len(g2) == ITERATIONS * 4 and g2 == g8 == main[: len(g2)] == report["problem_ids"]
    assert report["equal"] is True and report["main_run"]["first_presentations_equal"] is True
    assert report["main_run"]["same_start"] is True


def test_a_different_presentation_is_caught(exercise, tmp_path):
    root = exercise["root"]
    dirs = {}
    for name in ("grpo_g2", "grpo_g8"):
        (tmp_path / name).mkdir()
        for f in ("history.json", "manifest.json"):
            (tmp_path / name / f).write_bytes((root / name / f).read_bytes())
        dirs[name] = tmp_path / name
    history = read_json(dirs["grpo_g8"] / "history.json")
    history[-1]["problem_ids"][0] = "train-0999"
    write_json(dirs["grpo_g8"] / "history.json", history)
    report = gs.check_same_presentations(dirs)
    assert report["equal"] is False and report["branches"]["grpo_g8"]["equal_to_first"] is False


def test_budget_arithmetic(exercise):
    assert gs.expected_counts(20, 2) == {"iterations": 20, "updates": 40, "presentations": 80, "rollouts": 160,
                                         "groups": 80}
    assert gs.expected_counts(20, 8)["rollouts"] == 640 and gs.expected_counts(100, 4)["rollouts"] == 1600
    budget = read_json(exercise["root"] / "group_size" / "budget.json")
    rows = {r["policy"]: r for r in budget["rows"]}
    assert set(rows) == {"grpo", "grpo_g2", "grpo_g8"}  # no warm-start/SFT manifests in this folder
    for name, G, iterations in (("grpo", 4, 3), ("grpo_g2", 2, ITERATIONS), ("grpo_g8", 8, ITERATIONS)):
        r = rows[name]
        assert (r["updates"], r["presentations"], r["rollouts"]) == (2 * iterations, 4 * iterations, 4 * iterations * G)
        rollouts = loop.read_rollouts(exercise["root"] / name)
        assert r["generated_tokens"] == sum(len(x["response_ids"]) for x in rollouts)
        history = read_json(exercise["root"] / name / "history.json")
        assert r["zero_variance_measured"] == sum(h["frac_reward_zero_std"] for h in history) / len(history)
    p_info = budget["zero_signal"]["p"]
    assert p_info["responses"] == 2 * SMALL.eval_draws and p_info["p"] == p_info["correct"] / p_info["responses"]
    for point in budget["zero_signal"]["points"]:
        G, p = point["G"], p_info["p"]
        assert point["predicted"] == p ** G + (1 - p) ** G
    text = gs.format_budget_table(budget)
    assert "Same updates is not same cost" in text and "not an ablation of group size alone" in text


def test_exercise_protection_unchanged_and_never_rerun(exercise):
    root = exercise["root"]
    protection = read_json(root / "group_size" / "protection.json")
    assert protection["unchanged"] is True and protection["changed"] == []
    labels = {f["file"] for f in protection["files"]}
    assert "runs/tiny/grpo/model.safetensors" in labels and "labkit/task/verifier.py" in labels
    assert "runs/tiny/evaluation/results.json#main_entries" in labels
    with pytest.raises(RunExistsError, match="never overwritten"):
        gs.run_exercise(SMALL, runs_root=root, code_root=exercise["code"], iterations=ITERATIONS,
                        start_file=exercise["start"], resume_checks=False, evaluate=False, progress=False)


def test_a_finished_branch_of_another_shape_is_refused(exercise):
    with pytest.raises(ValueError, match="other settings"):
        gs.run_branch(SMALL, 2, exercise["root"] / "grpo_g2", iterations=ITERATIONS + 1,
                      start_file=exercise["start"], progress=False)


# -- 3. protection on a small fake tree --------------------------------------------------------------


def fake_tree(tmp_path):
    root, code = tmp_path / "runs" / "tiny", tmp_path / "code"
    for name in gs.MAIN_POLICIES:
        (root / name).mkdir(parents=True)
        (root / name / "model.safetensors").write_bytes(name.encode())
    (root / "grpo" / "history.json").write_text("[]\n")
    write_json(root / "evaluation" / "results.json", {"policies": {"warm_start": {"x": 1}, "grpo": {"x": 2}}})
    for rel in gs.PROTECTED_CODE:
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text("v1\n")
    return root, code


def test_protection_lists_what_a_clone_holds_never_a_lock_or_a_saved_state(tmp_path):
    """The list is the same on the machine that made the runs and on a clone (which has no lock and no
    states: .gitignore): 49 entries in one build and 52 in another was the old list's fault."""
    root, code = fake_tree(tmp_path)
    clone = {label for label in gs.record_protection(root, code)}
    (root / "grpo" / ".lock").write_text("pid\n")
    (root / "grpo" / "states").mkdir()
    (root / "grpo" / "states" / "iter-040.pt.gz").write_bytes(b"state")
    assert {label for label in gs.record_protection(root, code)} == clone
    assert "runs/tiny/grpo/history.json" in clone


@pytest.mark.parametrize("target", ["grpo/model.safetensors", "grpo/history.json", "code:labkit/task/verifier.py",
                                    "results:grpo"])
def test_protection_flips_and_names_the_changed_file(tmp_path, target):
    root, code = fake_tree(tmp_path)
    before = gs.record_protection(root, code)
    assert gs.check_protection(before, root, code)["unchanged"] is True
    # the exercise's own results entries are expected: adding them changes nothing protected
    write_json(root / "evaluation" / "results.json",
               {"policies": {"warm_start": {"x": 1}, "grpo": {"x": 2}, "grpo_g2": {"x": 3}}})
    assert gs.check_protection(before, root, code)["unchanged"] is True
    if target.startswith("code:"):
        (code / target[5:]).write_text("v2\n")
        label = target[5:]
    elif target.startswith("results:"):
        write_json(root / "evaluation" / "results.json",
                   {"policies": {"warm_start": {"x": 1}, "grpo": {"x": 99}, "grpo_g2": {"x": 3}}})
        label = "runs/tiny/evaluation/results.json#main_entries"
    else:
        (root / target).write_bytes(b"changed")
        label = f"runs/tiny/{target}"
    report = gs.check_protection(before, root, code)
    assert report["unchanged"] is False and report["changed"] == [label]
    entry = next(f for f in report["files"] if f["file"] == label)
    assert entry["sha256_before"] != entry["sha256_after"] and entry["unchanged"] is False


def test_protection_counts_a_new_or_removed_file_as_a_change(tmp_path):
    root, code = fake_tree(tmp_path)
    before = gs.record_protection(root, code)
    (root / "sft" / "model.safetensors").unlink()
    (root / "grpo" / "extra.json").write_text("{}\n")
    report = gs.check_protection(before, root, code)
    assert report["unchanged"] is False
    assert report["changed"] == ["runs/tiny/grpo/extra.json", "runs/tiny/sft/model.safetensors"]


# -- 4. the bonus refusal and the zero-signal exercise ------------------------------------------------


def test_a_bonus_reward_is_refused():
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match="verifier's reward is the only reward") as err:
        gs.forced_bonus_rewards(rewards, torch.tensor([[0.1, 0.0, 0.0, 0.0], [0.0] * 4]))
    assert "1 of 2 groups have zero variance" in str(err.value) and "invented advantages" in str(err.value)
    with pytest.raises(ValueError, match="only reward"):
        gs.forced_bonus_rewards(rewards, 0.5)  # a uniform bonus is refused too: it is not the verifier's
    assert torch.equal(gs.forced_bonus_rewards(rewards, 0.0), rewards)
    with pytest.raises(ValueError, match="0 or 1"):
        gs.forced_bonus_rewards(rewards + 0.1, 0.0)


def test_zero_signal_fraction_and_its_checker():
    assert gs.expected_frac_reward_zero_std(0.5, 2) == 0.5
    assert gs.expected_frac_reward_zero_std(0.0, 8) == gs.expected_frac_reward_zero_std(1.0, 8) == 1.0
    assert gs.expected_frac_reward_zero_std(0.1, 4) == pytest.approx(0.1 ** 4 + 0.9 ** 4, abs=0)
    with pytest.raises(ValueError, match="success rate"):
        gs.expected_frac_reward_zero_std(1.5, 4)
    assert exercises.check_ch08_zero_signal(lambda p, G: p ** G + (1 - p) ** G) is True
    with pytest.raises(exercises.ExerciseError, match="all-wrong group has zero variance too"):
        exercises.check_ch08_zero_signal(lambda p, G: p ** G)
    with pytest.raises(exercises.ExerciseError, match="WITH signal"):
        exercises.check_ch08_zero_signal(lambda p, G: 1 - p ** G - (1 - p) ** G)


# -- 5. glue: evaluation like the main policies, and the command ----------------------------------


def test_branches_are_evaluated_with_the_main_evaluations_settings(tmp_path, monkeypatch):
    from labkit.eval import evaluate

    write_json(tmp_path / "warm_start" / evaluate.MANIFEST_FILE,
               {"sampler": "reference", "draws": 4, "max_new_tokens": 64, "batch_size": None})
    (tmp_path / "grpo_g8").mkdir()
    (tmp_path / "grpo_g8" / "FINISHED").write_text("{}\n")  # already evaluated: kept
    calls = []
    monkeypatch.setattr(evaluate, "evaluation_root", lambda preset, limit=None: tmp_path)
    monkeypatch.setattr(evaluate, "run_inference", lambda preset, policy, **kw: calls.append((preset, policy, kw)))
    monkeypatch.setattr(evaluate, "write_results", lambda preset: calls.append(("results", preset)))
    status = gs.evaluate_policies(TINY, ["grpo_g2", "grpo_g8"])
    assert status == {"grpo_g2": "evaluated", "grpo_g8": "kept"}
    assert calls == [("tiny", "grpo_g2", {"device": None, "sampler": "reference", "draws": 4, "max_new_tokens": 64}),
                     ("results", "tiny")]


def test_the_command_is_registered():
    from labkit import cli

    args = cli.build_parser().parse_args(["group-size", "--preset", "tiny", "--threads", "1"])
    assert args.func is cli.cmd_group_size and args.preset == "tiny" and args.threads == 1
