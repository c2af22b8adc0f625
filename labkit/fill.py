"""`python -m labkit cache fill --steps thinking [--runs rare_2]`: the models a finished step keeps local,
rebuilt by the step's own code and kept only if they are the very files its manifests record.

Chapter 11's GRPO runs, the skill base and rare_10 commit everything but their models (4 MB each; the
bases the live run starts from, rare_0, rare_2 and control, are committed whole): each run's manifest
records its model's SHA-256.  A fresh clone therefore has rare_10's profile but not its weights, and the
step itself reports every run "(kept)".  Filling one run:

1. its committed folder is moved aside, untouched, to runs/<preset>/fill/;
2. the run is built again by the step's own function (`thinking_base.build_base`, `reasoning.train`)
   into its usual folder, from the same start model, settings and seeds;
3. the new model is kept only if its SHA-256 is the one the committed manifest records; then it joins
   the committed folder, which goes back in place.  The rebuilt folder's other files are dropped;
4. a model that differs (another CPU's kernels round differently) is left in runs/<preset>/fill/ with
   both digests said, and the committed folder goes back as it was.  So does every file on a failure
   or a Ctrl-C: nothing committed is deleted or changed.

A run's start model is filled first when it is missing too (rare_2 needs the skill base; a reasoning
run needs its thinking base).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable

from .lab.runs import RunFolder, display_path, preset_folder, sha256_file
from .studies import reasoning, thinking_base

FILLABLE = ("thinking", "reasoning")
MODEL_FILE = thinking_base.MODEL_FILE  # reasoning's is the same name (tested)
THREADS = 1  # the steps' workers run one torch thread each, and a model's bits depend on it


def needed(step: str, names: tuple[str, ...] | None,
           present: Callable[[str, str], bool] = lambda kind, name: False) -> list[tuple[str, str]]:
    """[(step, run)] to fill for `names` of `step` (default: all of its runs), start models first.  A run whose
    model is `present(step, run)` needs no start model: rare_2's committed weights spare a skill rebuild."""
    if step not in FILLABLE:
        raise ValueError(f"cache fill: step {step!r} keeps no model to fill; the steps that do: {', '.join(FILLABLE)}")
    cfg = thinking_base.ThinkingBaseConfig()
    every = thinking_base.BASES if step == "thinking" else reasoning.RUN_NAMES
    unknown = sorted(set(names or ()) - set(every))
    if unknown:
        raise ValueError(f"cache fill --runs: {', '.join(unknown)} is not a run of {step}; its runs: {', '.join(every)}")
    out: list[tuple[str, str]] = []

    def add(kind: str, name: str) -> None:
        if (kind, name) in out:
            return
        if not present(kind, name):  # built again: from its start model, filled first
            if kind == "reasoning":
                add("thinking", reasoning.get_run(name).base)
            elif cfg.phase(name).start != "committed":
                add("thinking", cfg.phase(name).start)
        out.append((kind, name))

    for name in names or every:
        add(step, name)
    return out


def run_dir(kind: str, preset: str, name: str) -> Path:
    """The folder of run `name` of step `kind` ("thinking" or "reasoning")."""
    return Path(thinking_base.default_run_dir(preset, name) if kind == "thinking"
                else reasoning.default_run_dir(preset, name))


def fill(step: str, preset: str = "tiny", names: tuple[str, ...] | None = None, progress: bool = True) -> list[tuple[str, str]]:
    """Fill the missing models of `names` of `step` and of their start models; returns [(run, status)]."""
    import torch

    if preset != "tiny":
        raise ValueError(f"--preset {preset!r}: chapter 11's runs are the tiny preset's")
    torch.set_num_threads(THREADS)  # as the steps build them (`run_all`'s workers): the same sums, the same bits
    out = []
    for kind, name in needed(step, names, lambda kind, name: (run_dir(kind, preset, name) / MODEL_FILE).is_file()):
        if kind == "thinking":
            build = lambda name=name: thinking_base.build_base(name, preset, progress=progress)  # noqa: E731
        else:
            build = lambda name=name: reasoning.train(name, preset, progress=progress)  # noqa: E731
        status = fill_run(run_dir(kind, preset, name), build, preset_folder(preset, "fill"), progress)
        out.append((f"{kind}/{name}", status))
        if status.startswith("differs"):
            break  # what is built from it could not match either
    return out


def fill_run(folder: Path, build: Callable[[], object], scratch: Path, progress: bool = True) -> str:
    """Rebuild the model of the finished run in `folder` with `build()` (which writes the run into `folder`),
    and keep it if its SHA-256 is the one the committed manifest records (the module's docstring)."""
    recorded = RunFolder(folder).manifest()["ledger"]["files"][MODEL_FILE]["sha256"]  # the manifest is checked
    target = folder / MODEL_FILE
    if target.exists():
        if sha256_file(target) == recorded:
            return "present"
        raise ValueError(f"{display_path(target)} is not the model its manifest records (SHA-256 "
                         f"{recorded[:12]}...): move it away, then fill")
    aside = scratch / f"{folder.parent.name}-{folder.name}-committed"
    if aside.exists():
        raise ValueError(f"{display_path(aside)} exists: an earlier fill stopped before putting it back; it is "
                         f"the committed {display_path(folder)}: move it back there, then fill again")
    scratch.mkdir(parents=True, exist_ok=True)
    os.replace(folder, aside)
    began = time.perf_counter()
    try:
        if progress:
            print(f"{folder.parent.name}/{folder.name}: rebuilding its model (the committed folder waits in "
                  f"{display_path(aside)})", flush=True)
        build()
        digest = sha256_file(folder / MODEL_FILE)
        if digest == recorded:
            os.replace(folder / MODEL_FILE, aside / MODEL_FILE)
            status = f"filled in {time.perf_counter() - began:.0f} s (SHA-256 {digest[:12]}..., as recorded)"
        else:
            kept = scratch / f"{folder.parent.name}-{folder.name}-{MODEL_FILE}"
            os.replace(folder / MODEL_FILE, kept)
            status = (f"differs: the rebuilt model's SHA-256 is {digest[:12]}..., the manifest records "
                      f"{recorded[:12]}... (this CPU's kernels round differently from the machine that built "
                      f"it); the rebuilt model is {display_path(kept)}, and nothing committed changed")
    finally:
        if folder.exists():
            shutil.rmtree(folder)  # the rebuilt run's other files: the committed ones are the record
        os.replace(aside, folder)
    return status
