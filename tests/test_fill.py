"""`python -m labkit cache fill`: a finished run's local model rebuilt, kept only if it is the recorded file,
and the committed folder never deleted or changed, whatever the build does (issue 55, item 3)."""

import pytest

from labkit import fill
from labkit.lab.runs import RunFolder, write_json


def finished_run(folder, model: bytes) -> dict:
    """A finished run whose manifest records `model` as its model; the model itself is then removed, as on a
    clone.  Returns {file: bytes} of what stays (the committed files)."""
    run = RunFolder(folder).open_for_writing()
    (folder / "model.safetensors").write_bytes(model)
    (folder / "log.json").write_text('{"loss": [1.0, 0.5]}\n')
    run.register("model.safetensors")
    run.register("log.json")
    write_json(folder / "manifest.json", {"step": "test", "ledger": run.ledger()})
    run.mark_finished()
    (folder / "model.safetensors").unlink()
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != ".lock"}


def builder(folder, model: bytes, fail: BaseException | None = None):
    def build():  # what a step's build does: the run written anew into its folder
        folder.mkdir()
        (folder / "log.json").write_text('{"loss": [1.0, 0.4]}\n')
        if fail is not None:
            raise fail
        (folder / "model.safetensors").write_bytes(model)
    return build


def committed(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name not in (".lock", "model.safetensors")}


def test_a_rebuilt_model_with_the_recorded_digest_joins_the_committed_folder(tmp_path):
    folder = tmp_path / "thinking" / "rare_2"
    before = finished_run(folder, b"weights")
    status = fill.fill_run(folder, builder(folder, b"weights"), tmp_path / "fill", progress=False)
    assert status.startswith("filled in") and "as recorded" in status
    assert committed(folder) == before  # the committed log, not the rebuilt one
    RunFolder(folder).check_file("model.safetensors")  # the ledger's digest
    assert fill.fill_run(folder, builder(folder, b"weights"), tmp_path / "fill", progress=False) == "present"
    assert list((tmp_path / "fill").iterdir()) == []


def test_a_model_that_differs_is_set_aside_and_the_committed_folder_stays_as_it_was(tmp_path):
    folder = tmp_path / "thinking" / "rare_2"
    before = finished_run(folder, b"weights")
    status = fill.fill_run(folder, builder(folder, b"other bits"), tmp_path / "fill", progress=False)
    assert status.startswith("differs: the rebuilt model's SHA-256 is ")
    assert committed(folder) == before and not (folder / "model.safetensors").exists()
    kept = tmp_path / "fill" / "thinking-rare_2-model.safetensors"
    assert kept.read_bytes() == b"other bits" and str(kept.name) in status


@pytest.mark.parametrize("fail", [RuntimeError("the build broke"), KeyboardInterrupt()])
def test_a_build_that_fails_or_is_interrupted_leaves_the_committed_folder_whole(tmp_path, fail):
    folder = tmp_path / "thinking" / "rare_2"
    before = finished_run(folder, b"weights")
    with pytest.raises(type(fail)):
        fill.fill_run(folder, builder(folder, b"weights", fail), tmp_path / "fill", progress=False)
    assert committed(folder) == before
    assert list((tmp_path / "fill").iterdir()) == []


def test_a_model_present_but_not_the_recorded_one_is_refused_by_name(tmp_path):
    folder = tmp_path / "thinking" / "rare_2"
    finished_run(folder, b"weights")
    (folder / "model.safetensors").write_bytes(b"edited")
    with pytest.raises(ValueError, match="model.safetensors is not the model its manifest records"):
        fill.fill_run(folder, builder(folder, b"weights"), tmp_path / "fill", progress=False)
    assert (folder / "model.safetensors").read_bytes() == b"edited"


def test_start_models_are_filled_first_and_unknown_runs_refused():
    assert fill.needed("thinking", ("rare_2",)) == [("thinking", "skill"), ("thinking", "rare_2")]
    assert fill.needed("reasoning", ("from_rare_2",)) == [("thinking", "skill"), ("thinking", "rare_2"),
                                                          ("reasoning", "from_rare_2")]
    # a run whose model is here needs no start model: rare_2's committed weights spare the skill base
    here = {("thinking", "rare_2")}
    assert fill.needed("reasoning", ("from_rare_2",), lambda *run: run in here) == [("thinking", "rare_2"),
                                                                                  ("reasoning", "from_rare_2")]
    assert fill.needed("thinking", ("rare_2", "rare_10"), lambda *run: run in here) == [
        ("thinking", "rare_2"), ("thinking", "skill"), ("thinking", "rare_10")]
    with pytest.raises(ValueError, match="rare_3 is not a run of thinking"):
        fill.needed("thinking", ("rare_3",))
    with pytest.raises(ValueError, match="step 'grpo' keeps no model to fill"):
        fill.needed("grpo", None)


def test_both_steps_name_their_model_file_alike():
    from labkit.studies import reasoning, thinking_base

    assert reasoning.MODEL_FILE == thinking_base.MODEL_FILE == fill.MODEL_FILE
