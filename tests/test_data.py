"""The committed StockArithmetic-v1 files: split invariants, regeneration, phase separation."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest

from labkit.task import data, problems
from labkit.task.data import PhaseError
from labkit.task.problems import Problem, solve


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    """Statements joined with labels, per split, read the way the scoring phase reads them."""
    return {split: data.joined(split, phase="scoring") for split in data.SPLITS}


def test_split_sizes(splits):
    assert {s: len(rows) for s, rows in splits.items()} == {"train": 1000, "validation": 200, "test": 200}


def test_ids_are_unique_ordered_and_match_their_split(splits):
    for split, rows in splits.items():
        assert [r["id"] for r in rows] == [f"{split}-{i:04d}" for i in range(len(rows))]
        assert all(r["split"] == split for r in rows)


def test_populations(splits):
    assert Counter(r["population"] for r in splits["test"]) == {"ID50": 100, "OOD100": 100}
    assert all(r["population"] == "ID50" for r in splits["train"] + splits["validation"])


def test_operand_bounds_per_population(splits):
    for r in itertools.chain.from_iterable(splits.values()):
        operands = Problem.from_dict(r["problem"]).operands
        assert min(operands) >= 0, r["id"]
        if r["population"] == "ID50":
            assert max(operands) <= 50, r["id"]
        else:
            assert 51 <= max(operands) <= 100, r["id"]  # at least one operand in 51..100


def test_intermediate_stocks_are_non_negative_and_targets_come_from_the_solver(splits):
    for r in itertools.chain.from_iterable(splits.values()):
        problem = Problem.from_dict(r["problem"])
        assert min(problem.stock_levels()) >= 0, r["id"]
        assert r["target"] == solve(problem), r["id"]
        assert 0 <= r["target"] <= problems.TARGET_MAX


def test_no_permutation_of_a_problem_appears_twice_across_all_splits(splits):
    keys = [Problem.from_dict(r["problem"]).key for r in itertools.chain.from_iterable(splits.values())]
    assert len(keys) == 1400 and len(set(keys)) == 1400


def test_splits_are_disjoint_under_the_permutation_key(splits):
    keys = {s: {Problem.from_dict(r["problem"]).key for r in rows} for s, rows in splits.items()}
    for a, b in itertools.combinations(data.SPLITS, 2):
        assert not keys[a] & keys[b], (a, b)


def test_warm_start_set_and_pool(splits):
    train = splits["train"]
    assert problems.warm_start_ids(train) == [f"train-{i:04d}" for i in range(128)]
    assert problems.pool_ids(train) == [f"train-{i:04d}" for i in range(128, 1000)]


def template_of(record: dict) -> int:
    """Which template rendered this statement (statement and label must agree on every operand)."""
    problem = Problem.from_dict(record["problem"])
    matches = {
        index
        for index, item in itertools.product(range(len(problems.TEMPLATES)), problems.ITEMS)
        if problems.render_statement(problem, index, item) == record["statement"]
    }
    assert len(matches) == 1, f"{record['id']}: statement matches templates {sorted(matches)}"
    return matches.pop()


def test_statements_render_their_labelled_problem_and_templates_are_shared(splits):
    for split, rows in splits.items():
        used = Counter(template_of(r) for r in rows)
        assert len(used) >= 3, f"{split} uses only templates {sorted(used)}"


def test_statement_files_hold_no_labels():
    for split in data.SPLITS:
        for row in data.open_records("statements", split, "inference"):
            assert set(row) == {"id", "split", "population", "statement"}
        for row in data.open_records("labels", split, "scoring"):
            assert set(row) == {"id", "split", "population", "problem", "target"}


def test_regeneration_reproduces_the_committed_files_byte_for_byte(tmp_path):
    written = data.write_dataset(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in data.DATA_DIR.glob("*.jsonl"))
    for path in written:
        assert path.read_bytes() == (data.DATA_DIR / path.name).read_bytes(), path.name


# ---------------------------------------------------------------- phase separation


@pytest.mark.parametrize("kind", data.KINDS)
def test_learning_refuses_test_statements_and_labels(kind):
    with pytest.raises(PhaseError, match="test split is held out"):
        data.open_records(kind, "test", "learning")


@pytest.mark.parametrize("split", data.SPLITS)
def test_inference_refuses_labels(split):
    with pytest.raises(PhaseError, match="predictions are made from statements only"):
        data.open_records("labels", split, "inference")


@pytest.mark.parametrize("path", ["runs/tiny/predictions/test.jsonl", "runs/tiny/evaluation/greedy.jsonl"])
def test_learning_refuses_inference_outputs(path):
    with pytest.raises(PhaseError, match="inference output"):
        data.check_path_access("learning", path)
    data.check_path_access("scoring", path)  # scoring joins predictions and labels


def test_what_each_phase_may_open():
    for kind, split in itertools.product(data.KINDS, ("train", "validation")):
        assert data.open_records(kind, split, "learning")
    for split in data.SPLITS:
        assert data.open_records("statements", split, "inference")
        for kind in data.KINDS:
            assert data.open_records(kind, split, "scoring")
    data.check_path_access("learning", Path("runs/tiny/sft/state.pt"))


def test_joined_needs_a_named_phase_and_gives_test_labels_to_scoring_only():
    with pytest.raises(TypeError, match="phase"):
        data.joined("test")  # no default: a caller says which phase it is
    with pytest.raises(PhaseError, match="test split is held out"):
        data.joined("test", phase="learning")
    with pytest.raises(PhaseError, match="predictions are made from statements only"):
        data.joined("test", phase="inference")
    assert len(data.joined("train", phase="learning")) == 1000
    from labkit.eval import evaluate

    with pytest.raises(PhaseError, match="predictions are made from statements only"):
        evaluate.load_test_labels(phase="inference")
    assert len(evaluate.load_test_labels(phase="scoring")) == 200


def test_a_copied_evaluation_folder_is_still_an_inference_output(tmp_path):
    """Recognised by its manifest, not its name: a copy under any name is refused to learning."""
    copy = tmp_path / "my_notes" / "grpo_outputs"
    copy.mkdir(parents=True)
    (copy / "manifest.json").write_text('{"phase": "inference", "policy": "grpo"}')
    (copy / "predictions-greedy.jsonl.gz").write_bytes(b"")
    with pytest.raises(PhaseError, match="inference output"):
        data.check_path_access("learning", copy / "predictions-greedy.jsonl.gz")
    (copy / "manifest.json").write_text('{"phase": "learning"}')
    data.check_path_access("learning", copy / "predictions-greedy.jsonl.gz")


def test_the_committed_evaluation_manifests_mark_their_phase():
    from labkit.eval import evaluate

    for policy in evaluate.POLICIES:
        folder = data.REPO_ROOT / "runs" / "tiny" / "evaluation" / policy
        assert data.read_json(folder / "manifest.json")["phase"] == "inference"


def test_a_flipped_bit_in_a_data_file_is_refused(tmp_path):
    paths = data.write_dataset(tmp_path)
    assert data.open_records("labels", "train", "learning", data_dir=tmp_path)
    path = tmp_path / data.file_name("labels", "train")
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x04
    path.write_bytes(bytes(raw))
    with pytest.raises(data.ArtifactError, match=r"train\.labels\.jsonl has SHA-256 .*SHA256SUMS records"):
        data.open_records("labels", "train", "learning", data_dir=tmp_path)
    (tmp_path / data.DIGESTS_FILE).unlink()
    with pytest.raises(data.ArtifactError, match="SHA256SUMS is missing"):
        data.open_records("statements", "train", "learning", data_dir=tmp_path)
    assert len(paths) == 6


def test_the_committed_digests_match_the_committed_files():
    for name, digest in data.recorded_digests().items():
        assert data.sha256_file(data.DATA_DIR / name) == digest, name
    assert sorted(data.recorded_digests()) == sorted(data.file_name(k, s) for k in data.KINDS for s in data.SPLITS)


def test_phase_error_is_a_permission_error():
    assert issubclass(PhaseError, PermissionError)


@pytest.mark.parametrize(
    "args, message",
    [
        (("training", "labels", "test"), "unknown phase"),
        (("scoring", "answers", "test"), "unknown kind"),
        (("scoring", "labels", "dev"), "unknown split"),
    ],
)
def test_unknown_names_are_value_errors(args, message):
    # check_access(phase, kind, split)
    with pytest.raises(ValueError, match=message):
        data.check_access(*args)


def test_labels_that_do_not_match_the_statements_are_refused_naming_both_files(tmp_path):
    """Even with SHA256SUMS rewritten to match (a hand-made data folder), a label per statement id is checked."""
    import hashlib

    data.write_dataset(tmp_path)
    labels = tmp_path / data.file_name("labels", "train")
    lines = labels.read_text().splitlines(keepends=True)
    labels.write_text("".join(lines[1:]))  # the first problem loses its label
    sums = tmp_path / data.DIGESTS_FILE
    sums.write_text("".join(
        f"{hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()}  {name}\n"
        for name in [line.partition("  ")[2] for line in sums.read_text().splitlines()]))
    with pytest.raises(data.ArtifactError, match=r"statements.* and .*labels.* do not hold the same problems "
                                                 r"\(1000 statements, 999 labels; unlabelled ids: \['train-0000'\]\)"):
        data.joined("train", phase="learning", data_dir=tmp_path)
