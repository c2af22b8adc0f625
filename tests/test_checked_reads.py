"""Readers of finished runs (the results pages, the sweep's collector) check each file against the SHA-256
its run records and refuse non-finite numbers, in one line naming the file (issue 58, item 7)."""

import json
import shutil

import pytest

from labkit.lab.runs import REPO_ROOT, ArtifactError, read_checked_json, read_json


@pytest.fixture
def grpo_copy(tmp_path):
    """The committed protocol run's small files (history, manifest, FINISHED), in a folder of their own."""
    folder = tmp_path / "grpo"
    folder.mkdir()
    for name in ("history.json", "manifest.json", "FINISHED"):
        shutil.copy(REPO_ROOT / "runs" / "tiny" / "grpo" / name, folder / name)
    return folder


def test_a_recorded_file_reads_as_it_was_written(grpo_copy):
    assert read_checked_json(grpo_copy / "history.json") == read_json(grpo_copy / "history.json")


def test_a_nan_written_into_a_recorded_history_is_refused_by_its_digest(grpo_copy):
    path = grpo_copy / "history.json"
    history = json.loads(path.read_text())
    history[0]["reward"] = float("nan")
    path.write_text(json.dumps(history))
    with pytest.raises(ArtifactError, match=r"history.json has SHA-256 \w{12}\.\.\., but .*manifest.json records"):
        read_checked_json(path)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_number_is_refused_even_where_no_digest_is_recorded(tmp_path, constant):
    path = tmp_path / "results.json"
    path.write_text('{"mean reward": %s}' % constant)
    with pytest.raises(ArtifactError, match=f"results.json holds {constant}: every number of a lab file is finite"):
        read_checked_json(path)
