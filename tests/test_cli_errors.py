"""A user's mistake gets one line that names the value and the rule, and nothing is written."""

from __future__ import annotations

import pytest

from labkit import cli
from labkit.lab import errors
from labkit.lab.runs import REPO_ROOT, sha256_file

GRPO_RUN = REPO_ROOT / "runs" / "tiny" / "grpo"


@pytest.mark.parametrize("argv, message", [
    (["grpo", "--iterations", "0", "--stop-after", "0"], "--iterations 0: must be at least 1"),
    (["grpo", "--iterations", "-3"], "--iterations -3: must be at least 1"),
    (["grpo", "--group-size", "0"], "--group-size 0: a group needs at least 2 responses"),
    (["grpo", "--group-size", "-2"], "--group-size -2: a group needs at least 2 responses"),
    (["grpo", "--iterations", "5", "--stop-after", "9"], "--stop-after 9: must lie in 1..5 (the run's iterations"),
    (["grpo", "--stop-after", "0"], "--stop-after 0: must lie in 1..100 (the run's iterations, --iterations)"),
    (["grpo", "--iterations", "4", "--save-states-at", "2,9"], "--save-states-at 2,9: each must lie in 1..4"),
    (["grpo", "--threads", "0"], "--threads 0: must be at least 1"),
    (["warm-start", "--stop-after-epochs", "9"], "--stop-after-epochs 9: must lie in 1..2 (warm_start runs 3 epochs"),
    (["sft", "--stop-after-epochs", "0"], "--stop-after-epochs 0: must lie in 1..1 (sft runs 2 epochs"),
    (["live", "reasoning", "--iterations", "41"], "--iterations 41: must lie in 1..40 (the committed run's"),
    (["live", "reasoning", "--group-size", "1"], "--group-size 1: a group needs at least 2 responses"),
    (["live", "reasoning", "--beta", "-1"], "--beta -1.0: a KL weight must be at least 0"),
    (["warm-start", "--validation-limit", "-5"], "--validation-limit -5: must be at least 1"),
    (["pretrain", "--preset", "nosuch"], "error: --preset 'nosuch': only the tiny preset is pretrained"),
    (["pretrain", "--steps", "0"], "error: --steps 0: must be at least 1"),
    (["all", "--only", "grpo_resme"], "--only grpo_resme: no step called grpo_resme; the steps are data, base,"),
    (["grpo", "--save-states-at", "2,x"], "--save-states-at 2,x: expected iteration numbers separated by commas"),
    (["grpo", "--save-states-at", "0"], "--save-states-at 0: iterations count from 1"),
    (["cache", "fill", "--steps", "grpo"], "cache fill: step 'grpo' keeps no model to fill"),
    (["cache", "fill", "--steps", "thinking", "--runs", "rare_3"], "rare_3 is not a run of thinking"),
])
def test_bad_options_are_refused_in_one_line(tmp_path, capsys, argv, message):
    if argv[0] == "grpo":
        argv = argv + ["--run-dir", str(tmp_path / "run")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()  # refused before any folder is made


def test_resume_into_a_missing_folder_is_refused_and_makes_no_folder(tmp_path, capsys):
    folder = tmp_path / "a" / "b" / "run"
    assert cli.main(["grpo", "--iterations", "2", "--resume", "--run-dir", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"error: --resume: {folder} does not exist: no earlier attempt to resume (leave out "
                           "--resume to start a run there)"), err
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its parents


def test_a_finished_run_is_refused_even_through_a_missing_folder(capsys):
    before = {p.name: sha256_file(p) for p in GRPO_RUN.iterdir() if p.is_file()}
    assert cli.main(["grpo", "--run-dir", str(GRPO_RUN / "states" / ".."), "--iterations", "1"]) == 2
    assert "holds a finished run" in capsys.readouterr().err
    assert {p.name: sha256_file(p) for p in GRPO_RUN.iterdir() if p.is_file()} == before


def test_a_missing_or_wrong_state_file_is_named(tmp_path, capsys):
    assert cli.main(["grpo", "--run-dir", str(tmp_path / "run"), "--resume-from", str(tmp_path / "none.pt.gz")]) == 2
    assert "no such state file" in capsys.readouterr().err
    assert cli.main(["sampler-agreement", "--state", str(GRPO_RUN / "history.json"), "--limit", "1",
                     "--out", str(tmp_path / "agreement.json")]) == 2
    assert "is not a safetensors model file" in capsys.readouterr().err


def test_an_inference_output_given_to_learning_is_refused_in_one_line(tmp_path, capsys):
    """A copied evaluation folder (its manifest says "phase": "inference") used as a resume state."""
    copied = tmp_path / "my_copy"
    (copied / "states").mkdir(parents=True)
    evaluation = REPO_ROOT / "runs" / "tiny" / "evaluation" / "grpo"
    (copied / "manifest.json").write_bytes((evaluation / "manifest.json").read_bytes())
    (copied / "states" / "iter-001.pt.gz").write_bytes((evaluation / "predictions-greedy.jsonl.gz").read_bytes())
    assert cli.main(["grpo", "--run-dir", str(tmp_path / "run"), "--resume-from",
                     str(copied / "states" / "iter-001.pt.gz")]) == 2
    err = capsys.readouterr().err
    assert "it is an inference output" in err and len(err.strip().splitlines()) == 1


def test_a_flipped_bit_in_the_warm_start_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """sampler-agreement and grpo read the warm start: one line naming the file, both digests and the fix."""
    import shutil

    warm = tmp_path / "runs" / "tiny" / "warm_start"
    shutil.copytree(REPO_ROOT / "runs" / "tiny" / "warm_start", warm, ignore=shutil.ignore_patterns("states"))
    data = bytearray((warm / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x10
    (warm / "model.safetensors").write_bytes(bytes(data))
    assert cli.main(["sampler-agreement", "--state", str(warm / "model.safetensors"), "--limit", "1",
                     "--out", str(tmp_path / "agreement.json")]) == 2
    err = capsys.readouterr().err
    assert f"{warm / 'model.safetensors'} has SHA-256 {sha256_file(warm / 'model.safetensors')}" in err, err
    assert "python -m labkit warm-start --preset tiny --overwrite" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "agreement.json").exists()


# -- issue 27: every failure one line, naming the file and the rule -------------------------------------

SWEEP_FILES = [
    ("empty.json", b"", r"sweep file .*empty\.json is empty: expected JSON with a top-level 'runs' list"),
    ("broken.json", b'{"runs": [', r"sweep file .*broken\.json is not valid JSON \(Expecting value"),
    ("latin1.json", '{"runs": [{"name": "caf\u00e9"}]}'.encode("latin-1"),
     r"sweep file .*latin1\.json is not UTF-8 text \(byte 23\): expected JSON"),
    ("broken.toml", b"[[runs]\nname = 1", r"sweep file .*broken\.toml is not valid TOML \("),
    ("five.json", b'{"runs": [{"name": "a", "options": 5}]}',
     r"five\.json: run 0 \(a\) options 5: expected an object of option: value pairs"),
    ("string.json", b'{"runs": [{"name": "a", "options": "kl=none"}]}',
     r"string\.json: run 0 \(a\) options 'kl=none': expected an object"),
    ("kl.json", b'{"runs": [{"name": "a", "options": {"kl": "exactly"}}]}',
     r"kl\.json: run 0 \(a\): variant kl='exactly': expected one of \('exact', 'k1', 'k2', 'k3', 'none'\)"),
    ("typed.json", b'{"runs": [{"name": "a", "options": {"updates_per_iteration": true}}]}',
     r"typed\.json: run 0 \(a\): variant updates_per_iteration=True: a positive integer"),
    ("big.json", b'{"runs": [{"name": "a", "options": {"length_penalty": "big"}}]}',
     r"big\.json: run 0 \(a\): variant length_penalty='big': a number >= 0"),
]


@pytest.mark.parametrize("name, content, message", SWEEP_FILES, ids=[n for n, _, _ in SWEEP_FILES])
def test_a_bad_sweep_file_is_refused_in_one_line_naming_it(tmp_path, capsys, name, content, message):
    import re

    path = tmp_path / name
    path.write_bytes(content)
    assert cli.main(["sweep", str(path), "--plan"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(message, err), err


def test_system_errors_are_one_line_naming_the_file_and_the_cause():
    import errno

    full = OSError(errno.ENOSPC, "No space left on device", "runs/tiny/grpo/states/iter-010.pt.gz")
    assert errors.error_line(full) == "runs/tiny/grpo/states/iter-010.pt.gz: no space left on device"
    read_only = OSError(errno.EROFS, "Read-only file system", "runs/tiny/grpo/parts.json")
    assert errors.error_line(read_only) == "runs/tiny/grpo/parts.json: read-only file system"


def test_a_full_disk_during_a_state_save_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    """ENOSPC simulated at the file's write (torch.save would turn it into a bare RuntimeError)."""
    import errno
    import os

    import torch

    from labkit.lab import state as state_lib

    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    path = tmp_path / "states" / "iter-001.pt.gz"
    with pytest.raises(OSError) as err:
        state_lib.save_state(path, {"model": {"w": torch.randn(256, 256)}})
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
    assert errors.error_line(err.value) == f"{path}: no space left on device"
    assert list((tmp_path / "states").iterdir()) == [], "no half-written file is left"


def test_every_hint_names_a_command_that_exists():
    """Each `python -m labkit CMD` (and `python -m labkit.book.build CMD`) a message or docstring gives parses
    with --help."""
    import re

    from labkit.book import build as book

    found = set()
    for path in sorted((REPO_ROOT / "labkit").rglob("*.py")):
        for match in re.finditer(r"python -m (labkit(?:\.book)?) ([a-z][a-z0-9-]*)", path.read_text()):
            found.add((match.group(1), match.group(2), path.name))
    assert len(found) > 20
    for module, command, where in sorted(found):
        parser = cli.build_parser() if module == "labkit" else book.build_parser()
        with pytest.raises(SystemExit) as done:
            parser.parse_args([command, "--help"])
        assert done.value.code == 0, f"{where}: `python -m {module} {command}` is not a command"


def test_a_misspelt_preset_of_a_tiny_only_command_is_refused_by_argparse(capsys):
    """`gradient-study --preset tyni` used to suggest `warm-start --preset tyni`, a command that cannot work."""
    with pytest.raises(SystemExit) as stop:
        cli.main(["gradient-study", "--preset", "tyni"])
    assert stop.value.code == 2
    assert "argument --preset: invalid choice: 'tyni' (choose from 'tiny')" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["grpo", "--preset", "tiny", "--resume"],
    ["grpo", "--preset", "tiny", "--resume-from", "/nonexistent/iter-001.pt.gz"],
    ["warm-start", "--preset", "tiny", "--resume-from", "/nonexistent/epoch-1.pt.gz"],
    ["sft", "--preset", "tiny", "--stop-after-epochs", "9"],
])
def test_a_refused_command_leaves_no_folder_behind(tmp_path, capsys, command):
    """Issue 58, item 11: each of these left a run folder holding only its lock file."""
    from labkit import cli

    folder = tmp_path / "run"
    assert cli.main([*command, "--run-dir", str(folder)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not folder.exists()


def test_a_refused_command_keeps_a_folder_it_did_not_make(tmp_path, capsys):
    from labkit import cli

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".lock").write_text("")  # an earlier command's lock file, in a folder that was there before
    assert cli.main(["grpo", "--preset", "tiny", "--resume", "--run-dir", str(folder)]) == 2
    assert (folder / ".lock").is_file()


def test_results_json_refuses_an_unfinished_evaluation_it_would_leave_out(capsys):
    """Issue 58, item 5: after an interrupted evaluation, results-json exited 0 and wrote results.json without
    that policy.  A trial folder (evaluation/trials/, kept out of git) holds a finished and an unfinished one."""
    import shutil

    root = REPO_ROOT / "runs" / "tiny" / "evaluation" / "trials" / "limit-99"
    try:
        for policy in ("warm_start", "grpo"):
            shutil.copytree(REPO_ROOT / "runs" / "tiny" / "evaluation" / policy, root / policy)
        (root / "grpo" / "FINISHED").unlink()
        assert cli.main(["results-json", "--preset", "tiny", "--limit", "99"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == (f"error: {root / 'grpo'} holds an evaluation that is not finished, which results.json would "
                           "leave out; finish it first: `python -m labkit evaluate --preset tiny --policy grpo "
                           "--limit 99`"), err
        assert not (root / "results.json").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_both_commands_refuse_through_one_helper_that_prints_one_line(capsys, monkeypatch):
    """labkit.lab.errors.refused: a user's mistake is "error: <message>" and exit 2, after the clean-up it is
    given; anything else is not its business; LABKIT_TRACEBACK=1 lets the mistake's traceback through."""
    monkeypatch.delenv("LABKIT_TRACEBACK", raising=False)
    cleaned = []

    def bad():
        raise ValueError("--beta -1: must be >= 0")

    assert errors.refused(bad, on_refusal=lambda: cleaned.append(1)) == 2
    assert capsys.readouterr().err == "error: --beta -1: must be >= 0\n" and cleaned == [1]
    assert errors.refused(lambda: 0) == 0
    with pytest.raises(ZeroDivisionError):
        errors.refused(lambda: 1 / 0)
    monkeypatch.setenv("LABKIT_TRACEBACK", "1")
    with pytest.raises(ValueError):
        errors.refused(bad)
