"""Exact resume, checked: a continuous run against a stopped-then-resumed one, field by field.

SFT and GRPO share this driver; each says only what is its own (how to stop, how to resume,
which end state, what else to compare):

    1. the continuous run is the real run (finished, with its end state on disk);
    2. a second run from the same start stops at a boundary, into `scratch/stop`;
    3. a fresh process resumes from the boundary's state to the end, into `scratch/resume`;
    4. the two end states (plus the caller's extras, e.g. the final model files) are compared
       with `state.compare_states`: every tensor bitwise, every other field exactly.
The report's top-level `equal` is True only when every compared field is equal.  Its cost is
reported apart from the continuous run's; wall-clock times are never compared.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .runs import sha256_file, write_json
from . import state as state_lib


@dataclass
class ResumeCheck:
    """What one resume check needs from its loop (SFT or GRPO)."""

    run_dir: Path  # the continuous run (finished)
    scratch_dir: Path  # stop/ and resume/ go here, wiped first
    end_state: Callable[[Path], Path]  # run folder -> its end state file
    stop: Callable[[Path], Path]  # runs the stop run into a folder; returns the boundary state
    resume: Callable[[Path, Path], None]  # (folder, boundary state): resumes to the end there
    extras: Callable[[Path, bool], dict]  # (run folder, is_continuous) -> more fields to compare
    boundary: str  # in words, e.g. "after iteration 40 of 100 (...)"
    facts: dict = field(default_factory=dict)  # report fields of the caller's own (preset, branch, ...)
    continuous_seconds: float = 0.0
    extra_work: dict = field(default_factory=dict)  # e.g. {"extra_iterations": 100}
    after: Callable[[Path, Path], dict] | None = None  # (boundary, resume folder) -> more report fields


def check_preconditions(run_dir: Path, manifest: dict, end_state: Path, report_path: Path, overwrite: bool) -> None:
    """Refuse before any work: a report that exists, a resumed 'continuous' run, no end state."""
    if report_path.exists() and not overwrite:
        raise FileExistsError(f"{report_path} exists; a resume report is evidence (pass --overwrite to redo it)")
    if manifest.get("resumed_from"):
        raise ValueError(f"{run_dir} was itself resumed; the check compares a continuous run with a resumed one")
    if not end_state.is_file():
        raise FileNotFoundError(f"{end_state} is missing (full states are not committed): the check compares end "
                                "states, so rerun the continuous run (with --overwrite, or into a new folder) first")


def run_resume_check(check: ResumeCheck, threads: int, fresh_process: bool = True) -> dict:
    """Steps 2-4 of the module docstring; writes and returns `run_dir/resume_report.json`'s content."""
    shutil.rmtree(check.scratch_dir, ignore_errors=True)
    stop_dir, resume_dir = check.scratch_dir / "stop", check.scratch_dir / "resume"
    t0 = time.perf_counter()
    boundary = check.stop(stop_dir)
    stop_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    check.resume(resume_dir, boundary)
    resume_seconds = time.perf_counter() - t0

    t0 = time.perf_counter()
    end_a, end_b = check.end_state(check.run_dir), check.end_state(resume_dir)
    a, _ = state_lib.load_state(end_a)
    b, _ = state_lib.load_state(end_b)
    a.update(check.extras(check.run_dir, True))
    b.update(check.extras(resume_dir, False))
    end = state_lib.compare_states(a, b)
    del a, b
    more = check.after(boundary, resume_dir) if check.after else {}
    compare_seconds = time.perf_counter() - t0
    report = {
        "equal": end["equal"] and more.get("boundary_state", {}).get("equal", True),
        **check.facts,
        "boundary": check.boundary,
        "continuous_state": str(end_a.relative_to(check.run_dir)),
        "resumed_state": f"scratch: {end_b.relative_to(check.scratch_dir)} (not kept)",
        "fresh_process": fresh_process,
        "torch_threads": threads,
        "timings_compared": False,
        "end_state": end,
        **{k: v for k, v in more.items() if k != "cost"},
        "cost": {
            "continuous_run_seconds": check.continuous_seconds,
            "extra_for_the_check": {
                "stop_run_seconds": stop_seconds,
                "resume_run_seconds": resume_seconds,
                "compare_seconds": compare_seconds,
                "total_seconds": stop_seconds + resume_seconds + compare_seconds,
                **check.extra_work,
            },
            **more.get("cost", {}),
        },
        "state_bytes": {
            "continuous_end": end_a.stat().st_size,
            "stop_boundary": boundary.stat().st_size,
            "resumed_end": end_b.stat().st_size,
        },
        # the two scratch states are not kept (each is the size of a model and its optimiser): their digests are,
        # as the source protocol asks for the states themselves (issue 57); each file also carries the timings'
        # digest in its evidence, so equal states still have different bytes
        "state_sha256": {
            "continuous_end": sha256_file(end_a),
            "stop_boundary": sha256_file(boundary),
            "resumed_end": sha256_file(end_b),
        },
    }
    write_json(check.run_dir / "resume_report.json", report)
    return report
