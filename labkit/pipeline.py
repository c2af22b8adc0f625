"""`python -m labkit all`: every step of the protocol, in order, each in its own process.

    step                 command                                   output under runs/<preset>/
    data                 python -m labkit data --check             (checks data/ reproduces)
    base                 python -m labkit pretrain                 base/        (tiny only)
    warm_start           python -m labkit warm-start               warm_start/
    sft                  python -m labkit sft                      sft/
    sft_resume           python -m labkit sft-resume-check         */resume_report.json
    grpo                 python -m labkit grpo                     grpo/
    grpo_resume          python -m labkit grpo-resume-check        grpo/resume_report.json
    sampler_agreement    python -m labkit sampler-agreement        sampler_agreement.json
    evaluation           python -m labkit evaluate --policy all    evaluation/
    group_size           python -m labkit group-size               grpo_g2/, grpo_g8/, group_size/
    reward_model         python -m labkit reward-model             reward_model/   (chapter 10)
    format_base          python -m labkit format-base              format_base/    (tiny only, chapter 10)
    grpo_large           python -m labkit grpo-large               grpo_large/     (tiny only, chapters 6-7)
    overoptimisation     python -m labkit overoptimisation         overoptimisation/ (tiny only, chapter 10)
    gradient_study       python -m labkit gradient-study           gradient_study/ (tiny only, chapters 2-3)
    thinking             python -m labkit thinking-bases           thinking/       (tiny only, chapter 11)
    reasoning            python -m labkit reasoning                reasoning/      (tiny only, chapter 11)
    skill_test           python -m labkit skill-test               skill_test/     (tiny only, chapter 11)
    crossover            python -m labkit crossover --fill         crossover/      (tiny only, chapter 11)
    rarer                python -m labkit rarer-bases              rarer/          (tiny only, chapter 11)

A step whose output is finished is skipped (finished runs are evidence and are
never overwritten); with `rebuild_stale`, a step that `labkit.lab.cache` finds stale
is moved aside to `runs/<preset>/stale/` first and rebuilt.  Each step's wall
time goes to `runs/<preset>/protocol_times.json`; each built step's inputs are
recorded in `runs/<preset>/cache.json`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import steps
from .lab import cache
from .lab.errors import CommandFailed
from .lab.runs import REPO_ROOT, is_finished, read_json, write_json
from .studies import larger_run, overoptimisation, rarer_bases, reasoning, thinking_base


def _done(preset: str, step: str) -> bool:
    root = cache.runs_dir(preset)
    checks = {
        "data": lambda: False,
        "base": lambda: is_finished(root / "base"),
        "warm_start": lambda: is_finished(root / "warm_start"),
        "sft": lambda: is_finished(root / "sft"),
        "sft_resume": lambda: (root / "warm_start" / "resume_report.json").exists()
        and (root / "sft" / "resume_report.json").exists(),
        "grpo": lambda: is_finished(root / "grpo"),
        "grpo_resume": lambda: (root / "grpo" / "resume_report.json").exists(),
        "sampler_agreement": lambda: (root / "sampler_agreement.json").exists(),
        "evaluation": lambda: (root / "evaluation" / "results.json").exists(),
        "group_size": lambda: is_finished(root / "group_size"),
        "reward_model": lambda: is_finished(root / "reward_model"),
        "grpo_large": lambda: larger_run.is_built(preset),
        "overoptimisation": lambda: overoptimisation.is_built(preset),
        "gradient_study": lambda: is_finished(root / "gradient_study"),
        "skill_test": lambda: is_finished(root / "skill_test"),
        "crossover": lambda: is_finished(root / "crossover"),
        "thinking": lambda: thinking_base.is_built(preset),
        "reasoning": lambda: reasoning.is_built(preset),
        "rarer": lambda: rarer_bases.is_built(preset),
        "format_base": lambda: is_finished(root / "format_base") and is_finished(root / "format_base" / "evaluation"
                                                                                  / "format_base"),
    }
    return checks[step]()


def _commands(preset: str, device: str | None, threads: int | None) -> list[tuple[str, list[str]]]:
    common = ["--preset", preset] + (["--device", device] if device else [])
    threaded = common + (["--threads", str(threads)] if threads else [])
    steps = [("data", ["data", "--check"])]
    if preset == "tiny":
        steps.append(("base", ["pretrain", "--preset", "tiny"] + (["--threads", str(threads)] if threads else [])))
    steps += [
        ("warm_start", ["warm-start", *threaded, "--restart"]),
        ("sft", ["sft", *threaded, "--restart"]),
        ("sft_resume", ["sft-resume-check", *threaded, "--branch", "both"]),
        ("grpo", ["grpo", *threaded, "--save-states-at", "40", "--restart"]),
        ("grpo_resume", ["grpo-resume-check", *threaded]),
        ("sampler_agreement", ["sampler-agreement", *common]),
        ("evaluation", ["evaluate", *threaded, "--policy", "all"]),
        ("group_size", ["group-size", *threaded]),
        ("reward_model", ["reward-model", *threaded]),
    ]
    if preset == "tiny":
        steps.append(("format_base", ["format-base", *threaded, "--resume"]))  # --resume: see the thinking bases
        steps.append(("grpo_large", ["grpo-large", *threaded]))
        # CPU only, two worker processes of one thread each (its runs are recorded with that count); --resume: as
        # for the thinking bases below
        steps.append(("overoptimisation", ["overoptimisation", "--preset", preset, "--workers", "2", "--no-progress",
                                           "--resume"]))
        steps.append(("gradient_study", ["gradient-study", "--preset", preset, "--no-progress"]))
        # --resume: a base or run that this rebuild's earlier attempt left (a Ctrl-C, a killed session) goes on
        # from its newest state; a stale step's folder was moved aside first, so no state of other code is there
        steps.append(("thinking", ["thinking-bases", "--preset", preset, "--workers", "2", "--no-progress", "--resume"]))
        steps.append(("reasoning", ["reasoning", "--preset", preset, "--workers", "2", "--no-progress", "--resume"]))
        steps.append(("skill_test", ["skill-test", "--preset", preset]))
        # --fill: the policies' models are not committed (on a clone, `cache fill` rebuilds and checks them)
        steps.append(("crossover", ["crossover", "--preset", preset, "--fill", "--no-progress"]))
        steps.append(("rarer", ["rarer-bases", "--preset", preset, "--workers", "2", "--no-progress"]))
    return steps


# Steps of the pipeline that correspond to a cache step (for staleness and recording).
CACHE_STEP = {"base": "base", "warm_start": "warm_start", "sft": "sft", "grpo": "grpo",
              "evaluation": "evaluation", "group_size": "group_size", "reward_model": "reward_model",
              "format_base": "format_base", "grpo_large": "grpo_large",
              "overoptimisation": "overoptimisation", "gradient_study": "gradient_study",
              "thinking": "thinking", "reasoning": "reasoning", "skill_test": "skill_test",
              "crossover": "crossover", "rarer": "rarer"}


def move_stale_aside(preset: str, only: tuple[str, ...] | None = None) -> list[tuple[str, Path]]:
    """Move every stale cached step (and each step built from one) to runs/<preset>/stale/<time>/,
    so that the run rebuilds it; returns [(step, where it went)].

    only: the steps the run will rebuild; a stale step outside them is left in place (and said),
    since nothing would rebuild it."""
    root = cache.runs_dir(preset)
    verdicts = cache.check(steps.STEPS, preset)
    stamp = time.strftime('%Y%m%d-%H%M%S')
    moved = []
    for name in cache.to_rebuild(steps.STEPS, verdicts):
        step = steps.get_step(name)
        why = ", ".join(verdicts[name]["changed"][:4]) or "built from a stale step"
        if only and name not in only:
            print(f"{name} is stale ({why}); left in place: not in --only", flush=True)
            continue
        for rel in (step.folder, *step.outputs):
            path = root / rel
            if not path.exists():
                continue
            aside = root / "stale" / stamp / rel
            aside.parent.mkdir(parents=True, exist_ok=True)
            print(f"{name} is stale ({why}); moving {rel} to {aside}", flush=True)
            shutil.move(str(path), aside)
            moved.append((name, aside))
    return moved


def step_names(preset: str) -> list[str]:
    """The steps `run_all` runs for `preset`, in order (what `--only` may name)."""
    return [step for step, _ in _commands(preset, None, None)]


def run_all(preset: str, *, device: str | None = None, threads: int | None = None, rebuild_stale: bool = False,
            only: tuple[str, ...] | None = None) -> dict:
    """Run every step not yet done; returns {step: seconds or "skipped"}."""
    unknown = sorted(set(only or ()) - set(step_names(preset)))
    if unknown:
        raise ValueError(f"--only {','.join(only)}: no step called {', '.join(unknown)}; the steps are "
                         f"{', '.join(step_names(preset))}")
    root = cache.runs_dir(preset)
    times_path = root / "protocol_times.json"
    times = read_json(times_path) if times_path.exists() else {}
    if rebuild_stale and preset == "tiny":
        move_stale_aside(preset, only)
    report = {}
    for step, args in _commands(preset, device, threads):
        if only and step not in only:
            continue
        if _done(preset, step):
            report[step] = "skipped (done)"
            print(f"[{step}] done already; skipped", flush=True)
            continue
        print(f"[{step}] python -m labkit {' '.join(args)}", flush=True)
        t0 = time.perf_counter()
        finished = subprocess.run([sys.executable, "-m", "labkit", *args], cwd=REPO_ROOT)
        if finished.returncode != 0:  # the step printed its own error: one line here, no traceback of ours
            raise CommandFailed(f"step {step} failed (`python -m labkit {' '.join(args)}` exited "
                                f"{finished.returncode}); the steps before it are kept")
        seconds = round(time.perf_counter() - t0, 1)
        report[step] = seconds
        if step != "data":
            times[step] = seconds
            write_json(times_path, times)
        if step in CACHE_STEP:
            cache.record(steps.get_step(CACHE_STEP[step]), preset)
    return report
