"""The GRPO run: the protocol's 100 iterations of `labkit.grpo.core`, and everything around them.

Run folder (a `labkit.lab.runs.RunFolder`): `rollouts.jsonl.gz` (every rollout, one gzip member
appended per iteration), `timings.jsonl.gz` (wall-clock evidence, one line per iteration, kept
outside the compared state), `parts.json` (the ledger: each part's rows, size and digest, each
state's digest), `history.json` (per-iteration metrics), `model.safetensors` (final policy,
reloaded and its digest checked), `states/iter-<k>.pt.gz` (full states, each carrying the ledger
of its boundary), `manifest.json` (with the final ledger), `FINISHED`.

A run starts (`start_loop`: the two loads of one file, the variant resolved once), iterates (each
iteration written to disk as it ends, autosaved, Ctrl-C finishing the current one), and finishes
(`finish_run`); `resume_check` proves that a stopped-and-resumed run equals a continuous one.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..lab import skeleton, state as state_lib
from ..lab.runs import (REPO_ROOT, ArtifactError, RunFolder, display_path, is_finished,
                        preset_folder, read_json, run_path, same_folder, write_json)
from ..lab.runtime import code_digests, data_digests, environment, seed_everything
from ..lab.runtime import deterministic as deterministic_algorithms
from ..lab.skeleton import Autosave, DeferredInterrupt, holding, refuse_earlier_attempt, whole_write
from ..task import data, verifier
from ..config import PresetConfig, get_preset
from ..models import presets, sampling
from . import checkpoint_curves
from .core import Loop, new_loop, protocol_pool, record_iteration, run_iteration
from .tasks import Task
from .variants import Resolved, Variant, resolve

PROTOCOL = Variant()  # the protocol's loop: every switch at its default


# -- 1. Where a run starts ----------------------------------------------------------------------


def default_run_dir(preset: str, G: int) -> Path:
    """runs/<preset>/grpo for the preset's own group size, runs/<preset>/grpo_g<G> for another."""
    name = "grpo" if G == get_preset(preset).G else f"grpo_g{G}"
    return preset_folder(preset, name)


def state_path(run_dir: Path, iteration: int) -> Path:
    return Path(run_dir) / "states" / f"iter-{iteration:03d}.pt.gz"


def warm_start_file(preset: str) -> Path:
    warm = preset_folder(preset, "warm_start")
    if not is_finished(warm):
        raise FileNotFoundError(f"GRPO starts from the warm start, but {warm} is not a finished run; "
                                f"run `python -m labkit warm-start --preset {preset}` first")
    RunFolder(warm).manifest()  # refuses a manifest that is missing, edited or damaged
    return warm / "model.safetensors"


def load_roles(config: PresetConfig, start_file: Path, device: str) -> tuple[torch.nn.Module, torch.nn.Module,
                                                                              object, str]:
    """The policy and the frozen reference, two loads of one file (eval mode, digests compared);
    returns (policy, reference, tokenizer, their digest)."""
    model, tokenizer = presets.load(config.name, state=start_file, device=device)
    reference, _ = presets.load(config.name, state=start_file, device=device)
    reference.requires_grad_(False)
    model.eval()
    reference.eval()
    start_digest, reference_digest = presets.parameter_digest(model), presets.parameter_digest(reference)
    if start_digest != reference_digest:
        raise RuntimeError(f"policy {start_digest} and reference {reference_digest} differ after loading one file")
    return model, reference, tokenizer, start_digest


def start_loop(config: PresetConfig, G: int, total_iterations: int, start_file: Path, sampler: str,
               device: str, resolved: Resolved, shared_prompts: bool = False, task: Task | None = None,
               bucket_tokens: int | None = None) -> Loop:
    """Stage 0: the three roles (policy and reference are two loads of one file), AdamW, the pool
    (the task's: default the protocol's, `PROTOCOL_TASK`)."""
    seed_everything(config.seed)
    model, reference, tokenizer, start_digest = load_roles(config, start_file, device)
    label = str(start_file.relative_to(REPO_ROOT)) if start_file.is_relative_to(REPO_ROOT) else str(start_file)
    return new_loop(config, G, total_iterations, model, reference, tokenizer, start_digest, start_label=label,
                    sampler=sampler, device=device, resolved=resolved, task=task or PROTOCOL_TASK,
                    shared_prompts=shared_prompts, bucket_tokens=bucket_tokens)


# -- 6. The run: options, folder, iterations, finish ---------------------------------------------


def _check_options(config: PresetConfig, G: int, total_iterations: int, stop_after, save_states_at) -> int:
    """Refuse bad option values before any work; returns the last iteration this call runs."""
    for name, value in (("G", G), ("iterations", total_iterations), ("stop_after", stop_after)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{name} {value!r}: must be an integer")
    if G < 2:
        raise ValueError(f"G {G}: a group needs at least 2 responses (its advantages compare them)")
    if total_iterations < 1:
        raise ValueError(f"iterations {total_iterations}: must be at least 1")
    if stop_after is not None and not 1 <= stop_after <= total_iterations:
        raise ValueError(f"stop_after {stop_after}: must lie in 1..{total_iterations} (the run's iterations)")
    bad_states = [k for k in save_states_at if not 1 <= k <= total_iterations]
    if bad_states:
        raise ValueError(f"save_states_at {bad_states}: each must lie in 1..{total_iterations}")
    return total_iterations if stop_after is None else stop_after


def newest_state(folder: RunFolder) -> Path | None:
    """The run folder's state of the latest iteration that its ledger lists, or None."""
    listed = [name for name in folder.ledger()["files"] if name.startswith("states/iter-")]
    paths = [folder / name for name in listed if (folder / name).is_file()]
    return max(paths, key=lambda p: int(p.name[5:8])) if paths else None


def _earlier_attempt(folder: RunFolder) -> str | None:
    """A description of what an unfinished attempt left in the folder, or None if it holds none."""
    ledger = folder.ledger()
    rows = ledger["parts"].get(ROLLOUTS_PART, {}).get("rows", 0)
    states = sorted(p.name for p in folder.states.glob("iter-*.pt.gz"))
    if not rows and not states and not ledger["files"]:
        return None
    newest = newest_state(folder)
    return (f"{rows} rollouts" + (f", newest state {newest.relative_to(folder.path)}" if newest else ", no state"))


def _prepare_folder(folder: RunFolder, loop: Loop, resume_from: Path | None, restart: bool,
                    stop_after: int | None) -> tuple[int, int]:
    """Restore a state (if any) and clear or cut back the folder; returns (first iteration to run,
    the first iteration whose rollouts this folder holds).

    The folder and the state are compared as real paths (links and `..` resolved), so a resume
    in the run's own folder is seen as one however either is spelled, and the state resumed
    from is never deleted.  A fresh start into a folder an unfinished attempt left is refused
    unless `restart` says to delete that attempt."""
    in_own_folder = resume_from is not None and same_folder(resume_from.parent.parent, folder.path)
    refuse_earlier_attempt(folder, _earlier_attempt(folder), resume_from is not None, restart)
    first_iteration, evidence = loop.restore(resume_from) if resume_from is not None else (0, {})
    if stop_after is not None and first_iteration >= stop_after:  # checked before anything in the folder is cut
        raise ValueError(f"stop_after {stop_after}: {display_path(resume_from)} is already after iteration "
                         f"{first_iteration}; stop after a later iteration")
    if in_own_folder:
        # Resuming in the run's own folder: cut the parts back to the state's boundary.
        if "ledger" not in evidence:
            raise ArtifactError(f"{resume_from} carries no ledger of its folder's parts (written by an older "
                                "labkit); start the run afresh")
        removed, first_in_folder = drop_after(folder, first_iteration, evidence["ledger"]), 1
    else:
        # A fresh start, or a resume into a new folder (which then holds iterations k+1.. only).
        removed = [str(p.relative_to(folder.path)) for p in folder.clear(ATTEMPT_FILES)]
        first_in_folder = first_iteration + 1
    if removed:
        print(f"{folder}: removed or cut {len(removed)} file(s) of an earlier, unfinished attempt "
              f"({', '.join(sorted(removed))})", flush=True)
    return first_iteration, first_in_folder


def run_grpo(
    config: PresetConfig | str, run_dir: str | Path | None = None, *,
    G: int | None = None, iterations: int | None = None, stop_after: int | None = None,
    save_states_at: tuple[int, ...] = (), resume_from: str | Path | None = None, resume: bool = False,
    restart: bool = False, sampler: str = "reference", start_file: str | Path | None = None,
    device: str | None = None, overwrite: bool = False, progress: bool = True, variant: Variant = PROTOCOL,
    shared_prompts: bool = False, learned_verifier=None, task: Task | None = None, bucket_tokens: int | None = None,
) -> dict:
    """Run GRPO into `run_dir`; returns the manifest (or, when stopped early, a summary).

    G               responses per prompt (default: the preset's 4); iterations: default the preset's 100
    stop_after      stop after this many iterations (saving the state); the run is then not finished
    save_states_at  iterations after which to save a full state (the last is always saved; a
                    state is also saved every skeleton.AUTOSAVE_EVERY iterations or AUTOSAVE_SECONDS, kept until
                    the run finishes)
    resume_from     a state file of the same run to continue from, with fresh objects
    resume          continue from the newest state in `run_dir` (an unfinished attempt's)
    restart         delete an unfinished attempt in `run_dir` and start afresh (without resume,
                    restart or overwrite, a folder holding an attempt is refused)
    sampler         "reference" (the protocol's, no KV cache) or "fast" (recorded in the manifest)
    start_file      the warm-start safetensors (default: runs/<preset>/warm_start/model.safetensors)
    variant         the loop's switches (`labkit.grpo.variants`; default: the protocol's)
    learned_verifier  the proxy a variant with reward "learned" optimises
                    (`labkit.studies.reward_model.load_verifier`); None for every other variant
    shared_prompts  score each prompt once per group in the reference forward and the updates
                    (`labkit.models.shared_prompt`: equal within float32 rounding, about 3.5x faster at G=8);
                    the protocol's run keeps the plain path, as it keeps the reference sampler
    bucket_tokens   with shared_prompts, score the responses in buckets of similar length instead of padding
                    every one to the batch's longest (`shared_prompt.buckets`; worked answers)
    task            what the run learns (`labkit.grpo.tasks`): default the protocol's, `PROTOCOL_TASK`;
                    chapter 11's worked answers are `labkit.studies.reasoning.worked_task`

    The run's life is `labkit.lab.skeleton`'s: one process writes a run folder at a time; Ctrl-C
    finishes the current iteration, saves its state and raises `skeleton.Interrupted` saying how to
    resume (a second Ctrl-C stops at once; the newest saved state is then the one to resume from).
    """
    config = get_preset(config) if isinstance(config, str) else config
    G = config.G if G is None else G
    total_iterations = config.grpo_iterations if iterations is None else iterations
    end_iteration = _check_options(config, G, total_iterations, stop_after, save_states_at)
    if resume and resume_from is not None:
        raise ValueError("resume and resume_from: give one (--resume takes the folder's newest state)")
    with holding(RunFolder(run_dir or default_run_dir(config.name, G)), overwrite) as folder:
        if resume:
            resume_from = newest_state(folder)
            if resume_from is None:
                raise FileNotFoundError(f"--resume: {display_path(folder.path)} holds no saved state to resume from")
        if resume_from is not None:
            resume_from = run_path(resume_from)
            if not resume_from.is_file():
                raise FileNotFoundError(f"--resume-from {resume_from}: no such state file (states are in <run>/states/)")
            data.check_path_access("learning", resume_from)
        start_file = Path(start_file or warm_start_file(config.name))
        data.check_path_access("learning", start_file)
        began = time.perf_counter()
        loop = start_loop(config, G, total_iterations, start_file, sampler,
                          device or presets.default_device(config.name),
                          resolve(variant, config, learned_verifier), shared_prompts, task, bucket_tokens)
        first_iteration, first_in_folder = _prepare_folder(folder, loop, resume_from, restart or overwrite,
                                                           stop_after)
        state_files = _iterate(folder, loop, first_iteration, end_iteration, save_states_at, sampler, progress,
                               loop.task.checkpoints(loop, total_iterations))
        summary = {"iterations_run": [first_iteration, end_iteration], "state_files": state_files,
                   "seconds": time.perf_counter() - began}
        if end_iteration < total_iterations:
            write_json(folder / f"stopped-at-{end_iteration:03d}.json", summary)
            return summary
        return finish_run(folder, loop, first_in_folder, resume_from, summary)


def _iterate(folder: RunFolder, loop: Loop, first_iteration: int, end_iteration: int, save_states_at,
             sampler: str, progress: bool, curves: "CheckpointCurves") -> list[dict]:
    """Iterations first_iteration+1..end_iteration, each written to disk as it ends; the states saved
    (requested ones and the last; autosaves come and go: `labkit.lab.skeleton`).  Ctrl-C: see `run_grpo`."""
    state_files: list[dict] = []
    bar = _progress_bar(progress, first_iteration, end_iteration, loop.G)
    with deterministic_algorithms(), DeferredInterrupt() as interrupt:
        autosave = Autosave(folder, interrupt, skeleton.AUTOSAVE_EVERY, skeleton.AUTOSAVE_SECONDS)
        curves.maybe_measure(folder, first_iteration, at_start=True)
        for iteration in range(first_iteration, end_iteration):
            record, rows, timings = run_iteration(loop, iteration, sampler)
            # The iteration's rows go to disk now (appended, synced), before any state counts them.
            folder.append(ROLLOUTS_PART, rows)
            timings["checkpoint"] = curves.maybe_measure(folder, iteration + 1)
            folder.append(TIMINGS_PART, [timings])
            done = iteration + 1
            saved = done in save_states_at or done == end_iteration
            if saved:
                with whole_write(interrupt):
                    state_files.append(save_loop_state(folder, loop, done))
                autosave.kept()
            elif autosave.due(done):  # a Ctrl-C makes it due: the state is saved before the run stops
                with whole_write(interrupt):
                    autosave.saved(save_loop_state(folder, loop, done)["path"])
                saved = True
            if saved:  # stop only where a state was just saved: a Ctrl-C heard later waits for the next one
                autosave.stop_if_asked(done, end_iteration, newest_state(folder), "iteration", "--resume")
            bar.update(1)
            bar.set_postfix(loop.task.postfix(record))
    bar.close()
    autosave.finish()  # the run reached its end: the requested states and the last one stay
    return state_files


class CheckpointCurves:
    """The run's fixed-prompt curves (`labkit.grpo.checkpoint_curves`): a record in checkpoints.jsonl
    at the start and every `checkpoint_every` iterations.  They read the policy and the reference
    and nothing else of the loop (no generator, no optimiser), so they change no weight."""

    def __init__(self, loop: Loop, total_iterations: int):
        self.loop, self.total = loop, total_iterations
        self.every = loop.config.checkpoint_every
        self.fixed = checkpoint_curves.fixed_prompts(loop.config, loop.tokenizer) if self.every else None

    def maybe_measure(self, folder: RunFolder, iteration: int, at_start: bool = False) -> float:
        """Measure after `iteration` if a checkpoint is due; returns the seconds it took (0.0 if none).
        `at_start`: only a run that begins at iteration 0 measures its start (a resume has it)."""
        if at_start and iteration != 0:
            return 0.0
        if not checkpoint_curves.due(iteration, self.total, self.every):
            return 0.0
        t0 = time.perf_counter()
        record = checkpoint_curves.measure(self.loop.model, self.loop.reference, self.loop.tokenizer, self.fixed,
                                           self.loop.config, iteration)
        folder.append(CHECKPOINTS_PART, [record])
        return time.perf_counter() - t0


def read_checkpoints(run_dir: str | Path) -> list[dict]:
    """The fixed-prompt checkpoint records of a GRPO run, in iteration order, checked against its ledger
    ([] for a run made with checkpoint_every 0, whose ledger lists no such part)."""
    folder = RunFolder(run_dir)
    if CHECKPOINTS_PART not in folder.ledger()["parts"]:
        return []
    return folder.read_part(CHECKPOINTS_PART)


def save_loop_state(folder: RunFolder, loop: Loop, iteration: int) -> dict:
    """A full state after `iteration`, carrying the folder's ledger of that boundary as evidence
    (it holds the timings' digest, which differs between runs that computed the same thing, so it
    is not compared); registered in the ledger with its digest."""
    t0 = time.perf_counter()
    path = state_path(folder.path, iteration)
    info = state_lib.save_state(path, loop.capture(iteration), evidence={"ledger": folder.ledger()})
    folder.register(str(path.relative_to(folder.path)), info["sha256"])
    return {**info, "path": str(path.relative_to(folder.path)), "seconds_total": time.perf_counter() - t0}


def finish_run(folder: RunFolder, loop: Loop, first_in_folder: int, resume_from: Path | None, summary: dict) -> dict:
    """The final checks, model, history and manifest; then FINISHED."""
    if loop.reference.training or any(p.requires_grad for p in loop.reference.parameters()):
        raise RuntimeError("the reference left eval mode or gained gradients")
    if presets.parameter_digest(loop.reference) != loop.reference_digest:
        raise RuntimeError("the reference changed during the run; it must stay frozen")
    rows = read_rollouts(folder.path)  # checked against the ledger before the run is called finished
    end_iteration = summary["iterations_run"][1]
    if len(rows) != loop.config.prompts_per_iteration * loop.G * (end_iteration - first_in_folder + 1):
        raise RuntimeError(f"{folder}: {len(rows)} rollouts on disk, not one per sampled response")
    final_digest = presets.parameter_digest(loop.model)
    presets.save_model(loop.model, folder / "model.safetensors")
    device = loop.identity["device"]
    reloaded, _ = presets.load(loop.config.name, state=folder / "model.safetensors", device=device)
    if presets.parameter_digest(reloaded) != final_digest:
        raise RuntimeError("the saved GRPO model does not reload to the same parameters")
    write_json(folder / "history.json", loop.history)
    folder.register("model.safetensors")
    folder.register("history.json")
    extras = loop.task.finish(folder, loop)  # the task's own files (registered) and fields
    manifest = {
        "step": loop.task.step,
        "identity": {k: v for k, v in loop.identity.items() if k != "pool_ids"},
        "config": loop.config.to_dict(),
        "code_sha256": code_digests(),
        "data_sha256": data_digests(),
        "environment": environment(device),
        "reference_digest": loop.reference_digest,
        "final_digest": final_digest,
        "rollouts": len(loop.consumed),
        "updates": loop.next_update,
        "resumed_from": str(resume_from) if resume_from else None,
        "first_iteration_in_folder": first_in_folder,
        # the protocol's rows hold each response's token ids, chapter 11's only their count
        "generated_tokens": sum(r["tokens"] if "tokens" in r else len(r["response_ids"]) for r in rows),
        **extras,
        "ledger": folder.ledger(),
        **summary,
    }
    write_json(folder / "manifest.json", manifest)
    folder.mark_finished({"final_digest": final_digest})
    return manifest


def protocol_postfix(record: dict) -> dict:
    """The progress bar's figures of a protocol iteration."""
    return {"reward": f"{record['reward']:.2f}", "kl": "no update" if record["kl"] is None else f"{record['kl']:.2e}",
            "zero_std": f"{record['frac_reward_zero_std']:.2f}"}


# The protocol's task (`labkit.grpo.tasks`): StockArithmetic's pool, its verifier and reward, its records and
# fixed-prompt curves.  Its identity adds nothing, so a protocol run's states are those it always had.
PROTOCOL_TASK = Task(step="grpo", pool=protocol_pool, verify=verifier.score, reward=sampling.verdict_reward,
                     record=record_iteration, checkpoints=CheckpointCurves, postfix=protocol_postfix)


def _progress_bar(enabled: bool, start: int, end: int, G: int):
    from tqdm.auto import tqdm

    return tqdm(total=end, initial=start, desc=f"GRPO G={G}", unit="it", disable=not enabled, leave=False)


# A run's parts, named in its ledger; the files a fresh attempt clears (cleanup is the only glob).
ROLLOUTS_PART = "rollouts.jsonl.gz"
TIMINGS_PART = "timings.jsonl.gz"
CHECKPOINTS_PART = "checkpoints.jsonl"
ATTEMPT_FILES = (ROLLOUTS_PART, TIMINGS_PART, CHECKPOINTS_PART, "history.json", "model.safetensors", "manifest.json",
                 "resume_report.json", "stopped-at-*.json", "states/iter-*.pt.gz")


def drop_after(folder: RunFolder, iteration: int, ledger: dict) -> list[str]:
    """Before resuming after `iteration` in the run's own folder: cut the parts back to the state's
    ledger, and remove states and stop markers of later iterations (a later, lost attempt)."""
    later = [p for p in folder.states.glob("iter-*.pt.gz") if int(p.name[5:8]) > iteration]
    later += [p for p in folder.path.glob("stopped-at-*.json") if int(p.stem.split("-")[-1]) > iteration]
    # half-written files of a killed write (atomic_write_bytes' temporaries): never read, only disk
    later += list(folder.path.glob(".*.tmp")) + list(folder.states.glob(".*.tmp"))
    for path in later:
        path.unlink()
    return [str(p.relative_to(folder.path)) for p in later] + folder.restore(ledger)


def read_rollouts(run_dir: str | Path) -> list[dict]:
    """Every rollout of a GRPO run folder, in iteration order, checked against the folder's ledger.

    The ledger (the manifest's, once the run is finished) gives the rows and digest of
    rollouts.jsonl.gz; the rows must come in consecutive iterations with no id twice.
    Anything else is refused (ArtifactError naming the file)."""
    folder = RunFolder(run_dir)
    rows = folder.read_part(ROLLOUTS_PART)
    ids = [r["rollout_id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ArtifactError(f"{folder / ROLLOUTS_PART}: {len(ids) - len(set(ids))} rollout ids appear twice")
    iterations = sorted({r["iteration"] for r in rows})
    if iterations and iterations != list(range(iterations[0], iterations[-1] + 1)):
        raise ArtifactError(f"{folder / ROLLOUTS_PART}: iterations {iterations[0]}..{iterations[-1]} have gaps")
    return rows


def read_timings(run_dir: str | Path) -> list[dict]:
    """The wall-clock times of each iteration (evidence only: never compared between runs)."""
    return RunFolder(run_dir).read_part(TIMINGS_PART)


# -- 7. Exact resume: stop, resume in a fresh process, compare with the continuous run --------


def resume_check(
    config: PresetConfig | str,
    *,
    G: int | None = None,
    stop_at: int = 40,
    run_dir: str | Path | None = None,
    scratch_dir: str | Path | None = None,
    sampler: str = "reference",
    device: str | None = None,
    overwrite: bool = False,
) -> dict:
    """Continuous run vs stop-after-`stop_at` + resume, each in a fresh `python -m labkit grpo`
    process (`labkit.lab.resume`): the end states (model, AdamW, schedule position, prompt order,
    generation RNG, system RNGs, history, consumed ids), the final model files and the rollouts
    of the resumed iterations must all be equal.  Report: `run_dir/resume_report.json`."""
    import subprocess
    import sys

    from ..lab import resume
    from ..lab.runs import sha256_file

    config = get_preset(config) if isinstance(config, str) else config
    G = G or config.G
    run_dir = Path(run_dir or default_run_dir(config.name, G))
    if not is_finished(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a finished run; the check compares against it")
    continuous = read_json(run_dir / "manifest.json")
    total = continuous["identity"]["iterations"]
    resume.check_preconditions(run_dir, continuous, state_path(run_dir, total), run_dir / "resume_report.json",
                               overwrite)
    if not 0 < stop_at < total:
        raise ValueError(f"stop_at must lie in 1..{total - 1}, got {stop_at}")
    threads = continuous["environment"]["torch_threads"]
    command = [sys.executable, "-m", "labkit", "grpo", "--preset", config.name, "--group-size", str(G),
               "--iterations", str(total), "--threads", str(threads), "--sampler", sampler, "--no-progress",
               *(["--device", device] if device else [])]

    def stop(folder: Path) -> Path:
        subprocess.run(command + ["--run-dir", str(folder), "--stop-after", str(stop_at)], check=True, cwd=REPO_ROOT)
        return state_path(folder, stop_at)

    def resume_into(folder: Path, boundary: Path) -> None:
        subprocess.run(command + ["--run-dir", str(folder), "--resume-from", str(boundary)], check=True, cwd=REPO_ROOT)

    def extras(folder: Path, is_continuous: bool) -> dict:
        # the final model file, and the rollouts of the resumed iterations, every field
        rows = read_rollouts(folder)
        return {"final_model_sha256": sha256_file(folder / "model.safetensors"),
                "rollouts_after_stop": [r for r in rows if r["iteration"] > stop_at] if is_continuous else rows}

    return resume.run_resume_check(resume.ResumeCheck(
        run_dir=run_dir,
        scratch_dir=Path(scratch_dir or REPO_ROOT / "runs" / "scratch" / config.name / run_dir.name),
        end_state=lambda folder: state_path(folder, total), stop=stop, resume=resume_into, extras=extras,
        boundary=f"after iteration {stop_at} of {total} (both updates done, state saved)",
        facts={"preset": config.name, "G": G}, continuous_seconds=continuous["seconds"],
        extra_work={"extra_iterations": total},
    ), threads)
