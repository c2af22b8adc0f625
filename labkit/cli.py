"""`python -m labkit ...`: every step of the protocol, one sub-command each."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_data(args: argparse.Namespace) -> int:
    """Generate StockArithmetic-v1 from its seed (or check the committed files)."""
    import tempfile

    from .task import data
    from .lab.runs import sha256_file

    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = data.write_dataset(Path(tmp), seed=args.seed)
            bad = [p.name for p in fresh if not (data.DATA_DIR / p.name).exists()
                   or sha256_file(p) != sha256_file(data.DATA_DIR / p.name)]
        if bad:
            print(f"committed data differs from seed {args.seed}: {bad}", file=sys.stderr)
            return 1
        print(f"committed data reproduces byte for byte from seed {args.seed}")
        return 0
    for p in data.write_dataset(seed=args.seed):
        print(p.relative_to(data.DATA_DIR.parent.parent))
    return 0


BENCHMARKS = {
    "kl": "blocked exact KL against a naive log_softmax + kl_div (time and memory ratios)",
    "sampling": "fast KV-cache sampler against the reference sampler on one GRPO iteration",
    "grpo": "samplers against generate(), shared-prompt against plain updates, one iteration's breakdown",
}


def cmd_tune(args: argparse.Namespace) -> int:
    """Try learning rates of the tiny preset on the validation split (labkit.studies.tuning)."""
    from .studies import tuning

    return tuning.run(args)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run one benchmark; each prints its ratios, measured in one process."""
    import importlib

    module = importlib.import_module(f"labkit.bench.{args.name}")
    return module.main(args.rest)


def cmd_pretrain(args: argparse.Namespace) -> int:
    """Pretrain the tiny base: the corpus phase, then the answer phase (none of the 1,400 problems in either)."""
    from dataclasses import replace

    from .lab.runs import UnfinishedRunError, display_path
    from .models.presets import TINY_BASE_DIR
    from .train.pretrain import PretrainConfig, pretrain

    if args.preset != "tiny":  # refused as every command refuses: `error: ...`, exit 2 (lab.errors)
        raise ValueError(f"--preset {args.preset!r}: only the tiny preset is pretrained by the lab (the qwen preset "
                         "uses Qwen2.5-0.5B-Instruct's published weights, see book/instructor.md)")
    for name in ("steps", "answer_steps", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} {value}: must be at least 1")
    cfg = PretrainConfig()
    overrides = {k: v for k, v in (("steps", args.steps), ("seed", args.seed), ("threads", args.threads)) if v is not None}
    if args.answer_steps is not None:
        overrides["answer"] = replace(cfg.answer, steps=args.answer_steps)
    cfg = replace(cfg, **overrides)
    out = Path(args.out if args.out is not None else TINY_BASE_DIR)
    if args.resume and args.restart:
        raise ValueError("--resume and --restart: give one (--resume continues, --restart deletes the saved states)")
    saved = pretrain_states(out)
    if saved and not (args.resume or args.restart or args.overwrite):
        # pretrain() starts a fresh run by deleting the states: refused here, before anything is touched
        raise UnfinishedRunError(f"{display_path(out)} holds an unfinished pretraining ({len(saved)} saved state(s), "
                                 f"newest {saved[-1].name}): pass --resume to continue from it, or --restart to "
                                 "delete them and start afresh")
    try:
        manifest = pretrain(cfg, out_dir=out, overwrite=args.overwrite, resume=args.resume)
    except KeyboardInterrupt:
        newest = pretrain_states(out)
        raise KeyboardInterrupt(f"pretraining stopped; its newest state is {display_path(newest[-1])}: continue with "
                                "the same command and --resume" if newest else
                                "pretraining stopped before its first state: run the same command again") from None
    phase = manifest["answer_phase"]
    print(f"pretrained {cfg.steps} corpus steps and {phase['steps']} answer steps in {manifest['wall_time_s']} s; "
          f"exact answers on {phase['probe']['documents']} fresh held-out statements: "
          f"{phase['curve'][0][2]:.1%} after the corpus phase, {phase['final_exact']:.1%} at the end; "
          f"{manifest['corpus']['problems_checked']} corpus problems checked, none in the dataset; wrote {out}")
    return 0


def pretrain_states(out: Path) -> list[Path]:
    """The saved states of a pretraining in `out` that is not finished, oldest first ([] if none, or finished)."""
    from .lab.runs import is_finished

    states = out / "states"
    if is_finished(out) or not states.is_dir():
        return []
    return sorted((p for p in states.iterdir() if p.suffix in (".state", ".safetensors", ".json")),
                  key=lambda p: p.stat().st_mtime)


def cmd_sft(args: argparse.Namespace) -> int:
    """Warm start or additional SFT of a preset (labkit.train.sft), or one resume check of it."""
    import torch

    from .lab.skeleton import Interrupted
    from .train import sft

    if args.threads is not None:
        torch.set_num_threads(args.threads)  # results are recorded with the thread count
    branch = getattr(args, "branch_fixed", None) or args.branch
    check_learning_data()
    if args.stop_after_epochs is not None:  # run_branch checks it too, by its parameter's name
        from .config import get_preset

        epochs = sft.make_plan(get_preset(args.preset), branch).epochs
        if not 1 <= args.stop_after_epochs < epochs:
            raise ValueError(f"--stop-after-epochs {args.stop_after_epochs}: must lie in 1..{epochs - 1} ({branch} "
                             f"runs {epochs} epochs; the last one always finishes the run)")
    try:
        manifest = sft.run_branch(
            args.preset, branch, args.run_dir, stop_after_epochs=args.stop_after_epochs, resume_from=args.resume_from,
            validation_limit=args.validation_limit, device=args.device, overwrite=args.overwrite, restart=args.restart,
            progress=not args.no_progress, greedy_eval=not args.no_greedy_eval,
        )
    except Interrupted:
        raise  # a first Ctrl-C: the update finished, its state saved, and the message names it
    except KeyboardInterrupt:  # a second Ctrl-C, in the middle of an update
        raise KeyboardInterrupt(sft_resume_hint(args.run_dir or sft.default_run_dir(args.preset, branch))) from None
    nll = ", ".join(f"{v['nll']:.4f}" for v in manifest["validation_nll"])
    greedy = manifest.get("validation_greedy")
    accuracy = f", greedy validation accuracy {greedy['success_rate']:.1%}" if greedy else ""
    print(f"{branch} ({manifest['status']}): {manifest['counts']['updates']} updates, validation NLL per epoch "
          f"[{nll}]{accuracy}, {manifest['times']['total_seconds']:.1f} s")
    return 0


def cmd_sft_resume_check(args: argparse.Namespace) -> int:
    """Continuous vs stop-after-epoch-1 + resume for the SFT branches; writes resume_report.json."""
    import torch

    from .train import sft

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    branches = sft.BRANCHES if args.branch == "both" else (args.branch,)
    status = 0
    for branch in branches:
        existing = sft.default_run_dir(args.preset, branch) / "resume_report.json"
        if existing.exists() and not args.overwrite:
            print(f"{branch}: {existing} exists (evidence); skipped")
            continue
        report = sft.resume_check(args.preset, branch, device=args.device, overwrite=args.overwrite,
                                  progress=not args.no_progress)
        extra = report["cost"]["extra_for_the_check"]["total_seconds"]
        end = report["end_state"]
        print(f"{branch}: resume equal={report['equal']} over {end['compared_fields']} end-state fields "
              f"(differences: {end['different_fields'][:5]}); the check cost {extra:.1f} s extra")
        status |= 0 if report["equal"] else 1
    return status


def sft_resume_hint(run_dir) -> str:
    """What a second Ctrl-C in SFT leaves and how to go on: the newest state in its ledger (saved after each
    epoch, and every few minutes between)."""
    from .lab.runs import RunFolder, display_path

    listed = [Path(run_dir) / name for name in RunFolder(run_dir).ledger()["files"] if name.startswith("states/")]
    states = sorted((p for p in listed if p.is_file()), key=lambda p: p.stat().st_mtime)
    if not states:
        return "no state had been saved yet: run the same command with --restart"
    return (f"the newest state is {display_path(states[-1])}: continue with the same command and "
            f"--resume-from {display_path(states[-1])}")


def check_learning_data() -> None:
    """Before a training run: the train and validation statements and labels hold the same problems
    (labkit.task.data.joined refuses them in one line naming both files), so that a hand-made data folder
    fails here, not with a KeyError halfway through the run."""
    from .task import data

    for split in ("train", "validation"):
        data.joined(split, phase="learning")


def cmd_grpo(args: argparse.Namespace) -> int:
    """The GRPO run of a preset (labkit.grpo.loop): 100 iterations of 4 prompts x G responses."""
    import torch

    from .grpo import loop
    from .config import get_preset

    if args.threads is not None:
        torch.set_num_threads(args.threads)  # results are recorded with the thread count
    check_learning_data()
    stop_at = tuple(iteration_list("--save-states-at", args.save_states_at)) if args.save_states_at else ()
    config = get_preset(args.preset)
    curves = {k: v for k, v in (("checkpoint_every", args.checkpoint_every),
                                ("checkpoint_problems", args.checkpoint_problems)) if v is not None}
    for name, value in curves.items():
        if value < (0 if name == "checkpoint_every" else 1):
            raise ValueError(f"--{name.replace('_', '-')} {value}: must be at least "
                             f"{0 if name == 'checkpoint_every' else 1}")
    # run_grpo checks these too, by its parameters' names; here the refusal names the options a user typed
    total = config.grpo_iterations if args.iterations is None else args.iterations
    if total < 1:
        raise ValueError(f"--iterations {total}: must be at least 1")
    if args.G is not None and args.G < 2:
        raise ValueError(f"--group-size {args.G}: a group needs at least 2 responses (its advantages compare them)")
    if args.stop_after is not None and not 1 <= args.stop_after <= total:
        raise ValueError(f"--stop-after {args.stop_after}: must lie in 1..{total} (the run's iterations, --iterations)")
    if any(k > total for k in stop_at):
        raise ValueError(f"--save-states-at {args.save_states_at}: each must lie in 1..{total} (the run's iterations, "
                         "--iterations)")
    run_dir = args.run_dir or loop.default_run_dir(config.name, config.G if args.G is None else args.G)
    if args.resume and not Path(run_dir).is_dir():  # refused before run_grpo makes the folder and its parents
        raise FileNotFoundError(f"--resume: {run_dir} does not exist: no earlier attempt to resume "
                                "(leave out --resume to start a run there)")
    out = loop.run_grpo(
        config.with_overrides(**curves) if curves else config, args.run_dir, G=args.G, iterations=args.iterations,
        stop_after=args.stop_after, save_states_at=stop_at, resume_from=args.resume_from, sampler=args.sampler,
        resume=args.resume, restart=args.restart,
        device=args.device, overwrite=args.overwrite, progress=not args.no_progress,
        shared_prompts=args.scoring == "shared",
    )
    first, last = out["iterations_run"]
    ran = (f"iterations {first + 1}..{last}" if last > first
           else f"no iteration left after iteration {last} (resumed from the final state)")
    print(f"GRPO: {ran} in {out['seconds']:.1f} s"
          + (f"; {out['rollouts']} rollouts, {out['updates']} updates" if "rollouts" in out else " (stopped)"))
    return 0


def iteration_list(option: str, text: str) -> list[int]:
    """`2,40` as [2, 40]; anything else refused in one line naming the option."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text}: expected iteration numbers separated by commas, e.g. 2,40") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{option} {text}: iterations count from 1")
    return values


def cmd_grpo_resume_check(args: argparse.Namespace) -> int:
    """Continuous GRPO run vs stop + resume in fresh processes; writes resume_report.json."""
    from .grpo import loop

    report = loop.resume_check(args.preset, G=args.G, stop_at=args.stop_at,
                               sampler=args.sampler, device=args.device, overwrite=args.overwrite)
    end = report["end_state"]
    extra = report["cost"]["extra_for_the_check"]["total_seconds"]
    print(f"GRPO G={report['G']}: resume equal={report['equal']} over {end['compared_fields']} fields "
          f"(differences: {end['different_fields'][:5]}); the check cost {extra:.1f} s extra")
    return 0 if report["equal"] else 1


def cmd_group_size(args: argparse.Namespace) -> int:
    """Chapter 8's exercise (labkit.studies.group_size): G=2 and G=8 branches, resume checks, evaluation, budget,
    protection of the main runs; into runs/<preset>/group_size/."""
    import torch

    from .studies import group_size
    from .lab.runs import read_json

    if args.threads is not None:
        torch.set_num_threads(args.threads)  # results are recorded with the thread count
    manifest = group_size.run_exercise(args.preset, device=args.device, progress=not args.no_progress)
    out = group_size.runs_root_of(args.preset) / "group_size"
    group_size.print_budget_table(read_json(out / "budget.json"))
    print(f"protection: unchanged={manifest['protection_unchanged']} ({out / 'protection.json'}); "
          f"{manifest['seconds']:.1f} s")
    return 0 if manifest["protection_unchanged"] else 1


def cmd_student(args: argparse.Namespace) -> int:
    """Write the student copy of every chapter: solutions become "your turn" stubs (labkit/book/student.py)."""
    from .book import student

    for path, count in student.write_student_copies(args.out, args.notebooks or None):
        print(f"{path}: {count} exercise(s) stubbed")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Greedy + 4 seeded samples per test problem for one policy or all, then rescore into results.json."""
    import torch

    from .eval import evaluate

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    statuses = evaluate.run_evaluations(
        args.preset, args.policy, sampler=args.sampler, device=args.device, limit=args.limit,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, overwrite=args.overwrite,
    )
    for policy, status in statuses:
        print(f"{policy}: {status}")
    return cmd_results(args)


def cmd_results(args: argparse.Namespace) -> int:
    """Recompute runs/<preset>/evaluation/results.json from the raw predictions (or only check it)."""
    from .eval import evaluate
    from .lab.runs import read_json

    root = evaluate.evaluation_root(args.preset, args.limit)
    for message in evaluate.stale_evaluations(args.preset, root):
        print(f"stale: {message}", file=sys.stderr)
    unfinished = [p for p in evaluate.POLICIES if (root / p).is_dir() and not evaluate.is_finished(root / p)]
    if unfinished and not getattr(args, "check", False):
        # results.json would silently leave it out: an interrupted evaluation is finished first (issue 58, item 5)
        raise ValueError(f"{root / unfinished[0]} holds an evaluation that is not finished, which results.json would "
                         f"leave out; finish it first: `python -m labkit evaluate --preset {args.preset} "
                         f"--policy {unfinished[0]}" + (f" --limit {args.limit}" if args.limit else "") + "`")
    if getattr(args, "check", False):
        same = evaluate.check_results(args.preset, root)
        print(f"{root / evaluate.RESULTS_FILE}: " + ("reproduces byte for byte from the predictions" if same
                                                      else "MISSING or differs from a recomputation"))
        return 0 if same else 1
    path = evaluate.write_results(args.preset, root)
    print(evaluate.markdown_table(evaluate.results_table(read_json(path))), end="")
    print(f"wrote {path}")
    return 0


def cmd_all(args: argparse.Namespace) -> int:
    """Every step of the protocol in order, skipping what is finished (labkit.pipeline)."""
    from .pipeline import run_all

    only = tuple(args.only.split(",")) if args.only else None
    report = run_all(args.preset, device=args.device, threads=args.threads, rebuild_stale=args.rebuild_stale, only=only)
    for step, outcome in report.items():
        print(f"{step:<18} {outcome if isinstance(outcome, str) else f'{outcome:.1f} s'}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    """Is the cached run fresh against the code, data and upstream runs that made it?"""
    from . import steps
    from .lab import cache

    chosen = tuple(steps.get_step(name) for name in args.steps.split(",")) if args.steps else steps.STEPS
    if args.action == "record":
        if not args.steps:
            raise ValueError("cache record: name the steps you have just built with --steps (e.g. --steps grpo)")
        for step in chosen:
            cache.record(step, args.preset)
            print(f"recorded the inputs of {step.name}")
        return 0
    if args.action == "restamp":
        return restamp_cache(args.preset, chosen, args.commit)
    if args.action == "fill":
        from . import fill

        if len(chosen) != 1:
            raise ValueError(f"cache fill: name one step with --steps ({' or '.join(fill.FILLABLE)})")
        names = tuple(args.runs.split(",")) if args.runs else None
        results = fill.fill(chosen[0].name, args.preset, names, progress=not args.no_progress)
        for run, status in results:
            print(f"{run:<22} {status}")
        return 0 if all(not status.startswith("differs") for _, status in results) else 1
    verdicts = cache.check(chosen, args.preset)
    print(cache.format_check(verdicts))
    damaged = [path for v in verdicts.values() if v["status"] == "damaged" for path in v["changed"]]
    if damaged:
        print(f"damaged: {', '.join(damaged)} differ from the SHA-256 their manifests record; restore them "
              f"(`git checkout -- FILE` for a committed file, `python -m labkit cache fill` for a local model)",
              file=sys.stderr)
    bad = [k for k, v in verdicts.items() if v["status"] not in ("fresh", "damaged")]
    if bad:
        print(f"not fresh: {', '.join(bad)}; rebuild with `make cache`", file=sys.stderr)
    return 1 if bad or damaged else 0


def restamp_cache(preset: str, chosen: tuple, commit: str) -> int:
    """Adopt the code fingerprints without a rebuild: each step recorded by file bytes gets the fingerprint
    of exactly the code those bytes prove (`labkit.lab.cache.restamp`), and the sweeps' runs their new
    names (`labkit.studies.sweep.restamp_runs`).  A step whose bytes do not match `commit` is refused by name."""
    from .lab import cache
    from .lab.fingerprint import Sources
    from .lab.runs import REPO_ROOT, write_json
    from .studies import sweep

    commit = cache.resolve_commit(commit)
    record = cache.read_cache(preset)
    refused = []
    for step in chosen:
        if step.name in record and not cache.is_byte_record(record[step.name]):
            print(f"{step.name:<16} already fingerprinted; left alone")
            continue
        try:
            record[step.name] = cache.restamp(step, preset, commit)
        except cache.RestampRefused as err:
            refused.append(str(err))
            print(f"{step.name:<16} REFUSED: {err}")
            continue
        print(f"{step.name:<16} restamped from {commit[:12]}: {len(record[step.name]['code'])} definitions")
    write_json(cache.runs_dir(preset) / cache.CACHE_FILE, record)
    # The sweeps' runs were named by the byte digests of the GRPO and evaluation steps' files at `commit`.
    legacy = {}
    for name in ("grpo", "evaluation"):
        legacy.update(cache.byte_record_at(preset, name, commit, REPO_ROOT))
    inputs_sha256 = {k: v for k, v in legacy.items() if not k.startswith("runs/")}
    try:
        cache.check_byte_record("the sweeps' runs", inputs_sha256, preset, commit)
    except cache.RestampRefused as err:
        print(f"sweeps REFUSED: {err}", file=sys.stderr)
        return 1
    sources = Sources.at_commit(REPO_ROOT, commit)
    for sweep_file in sorted((REPO_ROOT / "sweeps").glob("*.json")):
        specs = sweep.plan(preset, sweep.load_runs(sweep_file, preset), starts=sweep.load_starts(sweep_file),
                           settings=sweep.load_settings(sweep_file), root=sweep.sweep_root(sweep_file, preset))
        moved = sweep.restamp_runs(specs, inputs_sha256, sources, commit)
        print(f"{sweep_file.name}: {len(moved)} of {len(specs)} runs restamped")
    if refused:
        print(f"refused: {len(refused)} step(s); they stay as they were", file=sys.stderr)
    return 1 if refused else 0


def cmd_smoke(args: argparse.Namespace) -> int:
    """The qwen path end to end at full size on seeded random weights (labkit.smoke): every stage
    once, each timed with its peak memory; the table is printed and written to <run>/smoke.json."""
    from . import smoke

    report = smoke.run_smoke(args.preset, random_weights=args.random_weights, device=args.device, layers=args.layers,
                             head_dim=args.head_dim, run_dir=args.run_dir, max_new_tokens=args.max_new_tokens,
                             eval_problems=args.eval_problems, rewards=args.rewards, progress=not args.no_progress,
                             state_compresslevel=args.state_compresslevel, restart=args.restart)
    smoke.print_report(report)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """Train and evaluate the sweep's missing runs; then write their results file (`sweep.results_file`)."""
    import time

    from .studies import sweep

    for name in ("workers", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} {getattr(args, name)}: must be at least 1")
    sweep_file = args.file or sweep.DEFAULT_FILE
    runs = sweep.load_runs(sweep_file, args.preset)
    specs = sweep.plan(args.preset, runs, threads=args.threads, starts=sweep.load_starts(sweep_file),
                       settings=sweep.load_settings(sweep_file), root=sweep.sweep_root(sweep_file, args.preset),
                       task=sweep.load_task(sweep_file))
    if args.plan:
        from .lab.cache import damaged_in
        from .lab.runs import display_path

        for s in specs:
            done = sweep._done(s)
            damaged = damaged_in(Path(s["folder"])) if done else []
            status = ("to run" if not done else "finished" if not damaged else
                      f"damaged: {display_path(damaged[0])} is not the file its manifest records "
                      f"({len(damaged)} in all): `git checkout -- {display_path(damaged[0])}`, or delete the "
                      "run's folder to train it again")
            print(f"{s['name']:<28} {Path(s['folder']).name:<44} {status}")
        return 0
    began = time.perf_counter()
    done = sweep.run_sweep(specs, workers=args.workers, scheduler=args.scheduler)
    out = Path(specs[0]["folder"]).parent / sweep.results_file(sweep_file)
    sweep.collect_results(specs, out)
    for aside in sweep.retire_stale(specs):
        print(f"{aside.name}: an earlier fingerprint of a run of this file, moved to {aside.parent}")
    print(f"sweep: {len(done)} run(s) trained or evaluated, {len(specs) - len(done)} read; "
          f"{time.perf_counter() - began:.0f} s; results in {out}")
    return 0


def cmd_reward_model(args: argparse.Namespace) -> int:
    """Chapter 10's learned verifier: sample, label by the verifier, fit, report precision and recall."""
    from .studies import reward_model

    manifest = reward_model.run_reward_model(args.preset, args.run_dir, limit=args.limit, overwrite=args.overwrite,
                                             progress=not args.no_progress)
    held = manifest["metrics"]["held_out"]
    print(f"reward model: held-out precision {held['precision']:.3f}, recall {held['recall']:.3f}, accuracy "
          f"{held['accuracy']:.3f} on {held['n']} responses; in {args.run_dir or reward_model.default_run_dir(args.preset)}")
    return 0


def cmd_live(args: argparse.Namespace) -> int:
    """Run GRPO yourself (the protocol's, or chapter 11's from a thinking base), one line an iteration beside
    the committed run's (labkit.live)."""
    from . import live

    # live.py checks these too, by its parameters' names (a notebook calls it with them); here the
    # refusal names the options
    from .config import TINY, ReasoningConfig

    most = TINY.grpo_iterations if args.what == "grpo" else ReasoningConfig().iterations  # the committed runs'
    if args.iterations is not None and not 1 <= args.iterations <= most:
        raise ValueError(f"--iterations {args.iterations}: must lie in 1..{most} (the committed run's iterations)")
    if args.G is not None and args.G < 2:
        raise ValueError(f"--group-size {args.G}: a group needs at least 2 responses")
    if args.beta is not None and not args.beta >= 0:
        raise ValueError(f"--beta {args.beta}: a KL weight must be at least 0")
    if args.what == "grpo":
        if args.base or args.G or args.beta is not None:
            raise ValueError("--base, --group-size and --beta are chapter 11's: `python -m labkit live reasoning`")
        lines = live.live_grpo(10 if args.iterations is None else args.iterations, run_dir=args.run_dir,
                               restart=args.restart)
    else:
        lines = live.live_reasoning(20 if args.iterations is None else args.iterations, base=args.base or "rare_2",
                                    G=args.G, kl_coef=args.beta, run_dir=args.run_dir, restart=args.restart)
    agree = sum(bool(line["agrees"]) for line in lines)
    print(f"live {args.what}: {len(lines)} iteration(s), {agree} the committed run's rollouts exactly; Ctrl-C keeps "
          "every finished iteration, and the same command goes on")
    return 0


def cmd_gradient_study(args: argparse.Namespace) -> int:
    """Chapters 2-3: the policy-gradient identity on an enumerable game, and the estimator's noise at the warm start."""
    import torch

    from .studies import gradient_study

    torch.set_num_threads(args.threads)
    results = gradient_study.run_study(args.preset, args.run_dir, progress=not args.no_progress)
    noise = results["noise"]["schemes"]
    print("gradient study: signal-to-noise per batch of "
          f"{results['noise']['P']} x G = {results['noise']['G']}: "
          + ", ".join(f"{s} {noise[s]['snr_corrected']:.4f}" for s in gradient_study.ADVANTAGE_SCHEMES)
          + f"; {results['seconds']:.0f} s")
    return 0


def cmd_skill_test(args: argparse.Namespace) -> int:
    """Chapter 11: skill or propensity, the working started for each thinking base (labkit.studies.skill_test)."""
    import torch

    from .studies import skill_test

    torch.set_num_threads(args.threads)
    if args.draws < 1:
        raise ValueError(f"--draws {args.draws}: must be at least 1")
    results = skill_test.run(args.preset, draws=args.draws, out=args.run_dir, overwrite=args.overwrite)
    for base, s in results["bases"].items():
        against = results["against_skill"].get(base)
        print(f"{base:<8} right {s['accuracy']:6.1%}  steps all right {s['steps_right']:6.1%}"
              + (f"  against skill: {100 * against['mean_difference']:+.1f} points, paired over "
                 f"{against['n_problems']} chains (p = {against['p_permutation']:.1g})" if against else ""))
    return 0


def cmd_crossover(args: argparse.Namespace) -> int:
    """Chapter 11: pass@k of worked answers up to k = --draws, before and after RL (labkit.studies.crossover)."""
    import torch

    from .studies import crossover

    policies = tuple(args.policies.split(",")) if args.policies else tuple(crossover.POLICIES)
    if args.fill:  # the models are not committed: rebuilt and checked against their manifests first
        from . import fill

        for step, kind in (("thinking", "base"), ("reasoning", "run")):
            names = tuple(crossover.POLICIES[p][1] for p in policies if crossover.POLICIES.get(p, ("",))[0] == kind)
            for run, status in fill.fill(step, args.preset, names, progress=not args.no_progress) if names else ():
                print(f"cache fill {run}: {status}", flush=True)
                if status.startswith("differs"):
                    raise ValueError(f"crossover --fill: {run}'s rebuilt model is not the committed run's on this "
                                     f"CPU, so its pass@k would not be that run's: count on the machine that built it, "
                                     f"or rebuild the runs whole in a scratch clone (thinking-bases / reasoning --only) "
                                     f"and count there (each counts file records which model it counted)")
    torch.set_num_threads(args.threads)
    counted = crossover.run(args.preset, policies=policies, draws=args.draws, chains_per_k=args.chains_per_k,
                            out=args.run_dir, overwrite=args.overwrite, progress=not args.no_progress)
    ks = crossover.powers_of_two(args.draws)
    print(f"{'policy':<13}" + "".join(f"{'pass@' + str(k):>10}" for k in ks))
    for policy, rows in counted.items():
        print(f"{policy:<13}" + "".join(f"{x:>10.1%}" for x in crossover.curve(rows, ks)))
    for base, run in crossover.PAIRS:
        if base in counted and run in counted:
            print(f"{run} - {base}, chain by chain (points; Holm-adjusted p over the k):")
            for row in crossover.compare(counted[base], counted[run], ks):
                print(f"  pass@{row['k']:<4} {100 * row['difference']:+6.1f}  "
                      f"[{100 * row['interval'][0]:+.1f}, {100 * row['interval'][1]:+.1f}]  p_holm {row['p_holm']:.2g}")
    return 0


def cmd_objective_cases(args: argparse.Namespace) -> int:
    """Write tests/data/objective_cases.json from labkit.grpo.objectives, or check that it is what the code gives."""
    import math

    from .grpo import objectives
    from .lab.runs import read_json, write_json

    fresh = objectives.cases()
    if not args.check:
        write_json(args.out, fresh)
        print(f"wrote {len(fresh['cases'])} cases to {args.out}")
        return 0
    saved = read_json(args.out)

    def same(a, b) -> bool:
        if isinstance(a, float) or isinstance(b, float):
            return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        return a == b

    if not same(saved, fresh):
        print(f"{args.out} differs from what labkit.grpo.objectives gives now: rerun `python -m labkit objective-cases`")
        return 1
    print(f"{args.out}: {len(saved['cases'])} cases, as labkit.grpo.objectives gives them")
    return 0


def cmd_format_base(args: argparse.Namespace) -> int:
    """Chapter 10's base that rarely answers in the lab's format: continued pretraining, measured, evaluated."""
    from .studies import format_base

    manifest = format_base.run_format_base(args.preset, args.run_dir, evaluate_limit=args.limit,
                                           overwrite=args.overwrite, resume=args.resume, restart=args.restart,
                                           progress=not args.no_progress)
    share = manifest["format_share"]
    print(f"format base: {manifest['counts']['steps']} updates, {manifest['counts']['lab_format_documents']} lab-format "
          f"documents; valid lab-format answers at temperature 1: {share['before']['valid']:.1%} before, "
          f"{share['after']['valid']:.1%} after ({share['after']['correct']:.1%} correct)")
    return 0


def cmd_grpo_large(args: argparse.Namespace) -> int:
    """The larger GRPO run (labkit.studies.larger_run): train, evaluate, and the 64-draw evaluations for pass@k."""
    import torch

    from .studies import larger_run
    from .lab.runs import is_finished

    torch.set_num_threads(args.threads or 1)  # results are recorded with the thread count
    config = larger_run.larger_config(args.preset)
    if not is_finished(larger_run.run_dir(args.preset)) or args.overwrite:
        out = larger_run.train(args.preset, device=args.device, progress=not args.no_progress,
                               overwrite=args.overwrite)
        print(f"larger GRPO run: {out['rollouts']} rollouts, {out['updates']} updates "
              f"({config.prompts_per_iteration} prompts x G={config.G}, lr {config.grpo_lr:g}) "
              f"in {out['seconds']:.1f} s")
    evaluated = larger_run.evaluate_all(args.preset, device=args.device)
    print(f"evaluated: {', '.join(evaluated) or 'nothing (all finished)'}")
    return 0


def cmd_overoptimisation(args: argparse.Namespace) -> int:
    """Chapter 10's over-optimisation runs (labkit.studies.overoptimisation): proxies, best-of-n, GRPO on them."""
    from .studies import overoptimisation

    only = tuple(args.only.split(",")) if args.only else None
    times = overoptimisation.run_all(args.preset, only=only, workers=args.workers, threads=args.threads,
                                     overwrite=args.overwrite, progress=not args.no_progress, resume=args.resume,
                                     restart=args.restart)
    for part, seconds in times.items():
        print(f"{part:<32} {seconds:7.0f} s")
    built = overoptimisation.is_built(args.preset)
    print(f"{overoptimisation.root(args.preset)}: " + ("built (manifest.json written)" if built else
                                                      "not every setting has run yet (no manifest.json)"))
    return 0


def _build_and_report(module, names: tuple[str, ...], args: argparse.Namespace) -> int:
    """Chapter 11's two steps: build what is missing (`module.run_all`), then one line per finished run:
    its wall time (or "kept") and its test profile's think rate and accuracy."""
    from .lab.runs import read_json

    only = tuple(args.only.split(",")) if args.only else None
    if args.resume and args.restart:
        raise ValueError("--resume continues an unfinished attempt and --restart deletes it: pass one of them")
    times = module.run_all(args.preset, only=only, workers=args.workers, threads=args.threads,
                           progress=not args.no_progress, resume=args.resume, restart=args.restart)
    width = max(map(len, names)) + 1
    for name in names:
        if module.is_finished(name, args.preset):
            s = read_json(module.default_run_dir(args.preset, name) / "manifest.json")["test_profile"]
            seconds = f"{times[name]:6.0f} s" if name in times else "  (kept)"
            print(f"{name:<{width}} {seconds}  thinks {s['think_rate']:6.1%}  right {s['accuracy']:6.1%}")
    return 0


def cmd_thinking_bases(args: argparse.Namespace) -> int:
    """Chapter 11's thinking bases (labkit.studies.thinking_base): the skill, then working made rare; a control."""
    from .studies import thinking_base

    return _build_and_report(thinking_base, thinking_base.BASES, args)


def cmd_reasoning(args: argparse.Namespace) -> int:
    """Chapter 11's GRPO runs on worked answers from each thinking base (labkit.studies.reasoning)."""
    from .studies import reasoning

    return _build_and_report(reasoning, reasoning.RUN_NAMES, args)


def cmd_rarer_bases(args: argparse.Namespace) -> int:
    """Chapter 11: bases rarer than rare_2 on one lineage of their own, and GRPO from each (labkit.studies.rarer_bases)."""
    from .studies import rarer_bases

    rarer_bases.run_all(args.preset, workers=args.workers, threads=args.threads, progress=not args.no_progress)
    print(rarer_bases.format_table(rarer_bases.table(args.preset)))
    return 0


def cmd_sampler_agreement(args: argparse.Namespace) -> int:
    """Reference vs fast sampler on the warm start: greedy and seeded agreement, explained, timed."""
    import torch

    from .eval import agreement

    torch.set_num_threads(args.threads)  # one thread by default: the two samplers are timed alike
    report = agreement.run(args.preset, state=args.state, out=args.out, limit=args.limit, draws=args.draws,
                           max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, device=args.device,
                           overwrite=args.overwrite)
    print(agreement.format_report(report))
    print(f"wrote {args.out or agreement.report_path(args.preset)}")
    return 0 if report["summary"]["unexplained_mismatches"] == 0 else 1


def _add_sft_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda for qwen when present, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run (evidence: normally refused)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


COMMAND_ORDER = ("data", "pretrain", "warm-start", "sft", "sft-resume-check", "grpo", "grpo-resume-check",
                 "sampler-agreement", "evaluate", "results-json", "group-size",  # the protocol, in order
                 "grpo-large", "sweep", "gradient-study", "objective-cases", "reward-model", "format-base", "overoptimisation",
                 "thinking-bases", "reasoning", "rarer-bases", "skill-test", "crossover", "live", "all", "smoke", "cache",
                 "tune", "bench", "student")  # the tools


def _add_data_and_tool_commands(sub) -> None:
    """Subcommands: the data, tuning and benchmark commands."""
    from .task.problems import DEFAULT_SEED

    p = sub.add_parser("data", help="generate the StockArithmetic-v1 files from their seed")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="generation seed (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="only check that the committed files reproduce byte for byte")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("tune", help="try tiny learning rates on the validation split (the tables in config.py)")
    from .studies.tuning import add_arguments as add_tune_arguments

    add_tune_arguments(p)
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("bench", help="run a benchmark that prints ratios measured in one process")
    p.add_argument("name", choices=sorted(BENCHMARKS), help="; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments passed to the benchmark")
    p.set_defaults(func=cmd_bench)


def _add_grpo_command(sub) -> None:
    """The `grpo` subcommand."""
    p = sub.add_parser("grpo", help="GRPO from the warm start: 100 iterations x 4 prompts x G responses, 2 updates each")
    _add_sft_arguments(p)
    p.add_argument("--group-size", dest="G", type=int, default=None, help="G, responses per prompt (default: the preset's 4)")
    p.add_argument("--iterations", type=int, default=None, help="total iterations (default: the preset's 100)")
    p.add_argument("--run-dir", default=None, help="run folder (default: runs/<preset>/grpo or grpo_g<G>)")
    p.add_argument("--stop-after", type=int, default=None, help="stop (and save the state) after this iteration")
    p.add_argument("--save-states-at", default="", help="comma-separated iterations after which to save a full state")
    p.add_argument("--resume-from", default=None, help="a state file of the same run to continue from")
    p.add_argument("--sampler", default="reference", choices=["reference", "fast", "static"],
                   help="reference: the protocol's, no KV cache; fast: batched, transformers' KV cache; static: "
                        "batched, a preallocated cache (labkit.models.static_sampler); the same tokens for the same "
                        "seeds (default: %(default)s)")
    attempt = p.add_mutually_exclusive_group()
    attempt.add_argument("--resume", action="store_true",
                         help="continue an unfinished run from the newest state in its folder")
    attempt.add_argument("--restart", action="store_true",
                         help="delete an unfinished run's files (its states too) and start afresh")
    p.add_argument("--scoring", default="plain", choices=["plain", "shared"],
                   help="plain: one forward per full row (the protocol's); shared: each prompt computed once for "
                        "its G responses, equal within float32 rounding (default: %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="fixed-prompt curves every N iterations, 0 for none (default: the preset's 10; another "
                        "value makes another run: it is part of the config's fingerprint)")
    p.add_argument("--checkpoint-problems", type=int, default=None,
                   help="fixed validation problems the curves measure (default: the preset's 64)")
    p.set_defaults(func=cmd_grpo)


def _add_training_commands(sub) -> None:
    """Subcommands: pretraining, GRPO, the pipeline, the cache and the smoke run."""
    p = sub.add_parser("pretrain", help="pretrain the tiny base: the corpus phase, then the answer phase")
    p.add_argument("--preset", default="tiny", help="only 'tiny' (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="run folder (default: runs/tiny/base)")
    p.add_argument("--resume", action="store_true", help="continue from the newest state in <out>/states/ "
                   "(written every few minutes); the result equals an uninterrupted run")
    p.add_argument("--steps", type=int, default=None, help="corpus-phase updates (default: the PretrainConfig's)")
    p.add_argument("--answer-steps", type=int, default=None, help="answer-phase updates (default: the config's)")
    p.add_argument("--seed", type=int, default=None, help="model initialisation seed (default: the PretrainConfig's)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: 1, deterministic)")
    p.add_argument("--restart", action="store_true", help="delete the saved states of an unfinished pretraining in "
                   "<out> and start afresh (without --resume or --restart, such a folder is refused)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run (evidence: normally refused)")
    p.set_defaults(func=cmd_pretrain)

    _add_grpo_command(sub)

    p = sub.add_parser("grpo-resume-check", help="GRPO: stop, resume in a fresh process, compare with the continuous run")
    _add_sft_arguments(p)
    p.add_argument("--group-size", dest="G", type=int, default=None, help="G of the run to check (default: 4)")
    p.add_argument("--stop-at", type=int, default=40, help="iteration after which to stop (default: %(default)s)")
    p.add_argument("--sampler", default="reference", choices=["reference", "fast"], help="the run's sampler")
    p.set_defaults(func=cmd_grpo_resume_check)

    p = sub.add_parser("all", help="every step of the protocol in order (skips finished steps)")
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda for qwen when present, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads for every step")
    p.add_argument("--rebuild-stale", action="store_true", help="move stale cached steps aside and rebuild them")
    p.add_argument("--only", default="", help="comma-separated step names to run (default: all)")
    p.set_defaults(func=cmd_all)

    p = sub.add_parser("cache", help="check (or record) whether the cached run is fresh against what made it")
    p.add_argument("action", choices=["check", "record", "restamp", "fill"],
                   help="check: verdict per step (the definitions or files that changed); record: store the inputs "
                        "of steps just built; restamp: give steps recorded by file bytes the fingerprint of the "
                        "code those bytes prove, and the sweeps' runs their names under it (no rebuild); fill: "
                        "rebuild the models a finished step keeps local (--steps thinking or reasoning, --runs "
                        "rare_2), each kept only if it is the file its manifest records (labkit/fill.py)")
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    p.add_argument("--steps", default="", help="comma-separated step names (default: every step; record: required)")
    p.add_argument("--commit", default="HEAD",
                   help="restamp: the commit whose files the byte record must match (default: %(default)s)")
    p.add_argument("--runs", default="", help="fill: comma-separated runs of the step (default: all of them); "
                                              "their start models are filled first")
    p.add_argument("--no-progress", action="store_true", help="fill: no progress bars")
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("smoke", help="the qwen path end to end at full size on random weights (no download): "
                                     "every stage once, timed, with its peak memory")
    p.add_argument("--preset", default="qwen", help="only 'qwen': Qwen2.5-0.5B-Instruct's architecture (default: %(default)s)")
    p.add_argument("--random-weights", action="store_true",
                   help="seeded random weights and a stand-in tokenizer with Qwen's sizes and special ids "
                        "(required: the smoke downloads nothing)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when present, else cpu)")
    p.add_argument("--layers", type=int, default=24,
                   help="decoder layers, full widths and vocabulary (default: %(default)s, the real model; the unit "
                        "test uses 2)")
    p.add_argument("--head-dim", type=int, default=64,
                   help="attention head width: 64 is the real model; smaller keeps Qwen's 14 query and 2 key/value "
                        "heads and the full vocabulary and scales the widths (hidden 14 x, MLP 76 x this; the unit "
                        "test uses 16) (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="response token limit of every sampler call (default: 8 on the CPU, the protocol's 64 on CUDA)")
    p.add_argument("--eval-problems", type=int, default=1,
                   help="test problems per population in the two evaluation stages (default: %(default)s)")
    p.add_argument("--rewards", default="synthetic", choices=["synthetic", "verifier"],
                   help="synthetic: a fixed 1,0,0,0 pattern per group when every group has zero variance, so the "
                        "updates change the weights as in a real run; verifier: the protocol's own rewards, which "
                        "random weights never earn (default: %(default)s)")
    p.add_argument("--state-compresslevel", type=int, default=1, choices=[0, 1],
                   help="the state file's gzip level: 1 as the runs save it, 0 stored uncompressed in the same "
                        "format (faster; the unit test's) (default: %(default)s)")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="run folder (default: runs/scratch/smoke-qwen-<device>-<layers>l[-hd<head dim>]-<UTC "
                        "time>); a finished run there is refused")
    p.add_argument("--restart", action="store_true", help="delete what a stopped smoke left in --run-dir and measure "
                   "again (its stages run in one go: there is nothing to resume)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--no-progress", action="store_true", help="no progress line per stage")
    p.set_defaults(func=cmd_smoke)

    # Further sub-commands are added below, one block each, in protocol order.
    for name, fixed, text in (("warm-start", "warm_start", "warm-start SFT: 128 examples, 3 epochs, 48 updates of 8"),
                              ("sft", None, "additional SFT from the warm start: 872 examples, 2 epochs, 218 updates")):
        p = sub.add_parser(name, help=text)
        _add_sft_arguments(p)
        if fixed is None:
            p.add_argument("--branch", default="sft", choices=["warm_start", "sft"], help="(default: %(default)s)")
        p.add_argument("--run-dir", type=Path, default=None, help="run folder (default: runs/<preset>/<branch>)")
        p.add_argument("--stop-after-epochs", type=int, default=None, help="stop after N epochs (resume checks)")
        p.add_argument("--resume-from", type=Path, default=None, help="a saved state of the same run to continue")
        p.add_argument("--restart", action="store_true",
                       help="delete an unfinished run's files (its states too) and start afresh")
        p.add_argument("--validation-limit", type=int, default=None, help="score only the first N validation problems")
        p.add_argument("--no-greedy-eval", action="store_true", help="skip the final greedy validation accuracy")
        p.set_defaults(func=cmd_sft, branch_fixed=fixed)


def _add_exercise_commands(sub) -> None:
    """Subcommands: the SFT resume check, the exercises (group size, sweep) and the student copies."""
    p = sub.add_parser("sft-resume-check", help="SFT: stop after epoch 1, resume, compare with the continuous run")
    _add_sft_arguments(p)
    p.add_argument("--branch", default="both", choices=["warm_start", "sft", "both"], help="(default: %(default)s)")
    p.set_defaults(func=cmd_sft_resume_check)

    p = sub.add_parser("group-size", help="chapter 8: G=2 and G=8 for 20 iterations from the warm start, "
                                          "resume checks, evaluation, budget, protection of the main runs")
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda for qwen when present, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_group_size)

    p = sub.add_parser("sweep", help="chapter 9: the loop's variants, each trained and evaluated once, in parallel "
                                     "(runs cached by their configuration's fingerprint)")
    p.add_argument("file", nargs="?", type=Path, default=None,
                   help="sweep file, JSON or TOML with a 'runs' list (default: sweeps/chapter9.json)")
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="worker processes on this machine (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default: %(default)s)")
    p.add_argument("--scheduler", default=None,
                   help="a Dask distributed scheduler's address (e.g. tcp://10.0.0.5:8786) to run on instead")
    p.add_argument("--plan", action="store_true", help="only list the runs, their folders and what is finished")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("student", help="write the student copies of the notebooks (solution cells stubbed)")
    p.add_argument("--out", type=Path, default=Path("student"), help="output folder (default: %(default)s/)")
    p.add_argument("notebooks", nargs="*", type=Path, help="notebooks to copy (default: every notebooks/*.ipynb)")
    p.set_defaults(func=cmd_student)


def resume_options(p: argparse.ArgumentParser, what: str) -> None:
    """--resume and --restart for a command whose runs are on the run skeleton (`labkit.lab.skeleton`)."""
    p.add_argument("--resume", action="store_true", help=f"continue {what} from its newest state (stopped by a "
                   "Ctrl-C or a kill)")
    p.add_argument("--restart", action="store_true", help=f"delete the attempt of {what} and start afresh")


def _add_chapter10_commands(sub) -> None:
    """Subcommands: chapter 10's learned verifier and format-seeded base."""

    def common(p, default_dir: str, limit_help: str) -> None:
        p.add_argument("--run-dir", type=Path, default=None, help=f"run folder (default: {default_dir})")
        p.add_argument("--limit", type=int, default=None, help=limit_help)
        p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 for tiny)")
        p.add_argument("--overwrite", action="store_true", help="replace a finished run (evidence: normally refused)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser("reward-model", help="chapter 10: a learned verifier (logistic regression on the warm start's "
                                            "scores), fitted to the verifier's labels of warm-start and SFT samples")
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    common(p, "runs/<preset>/reward_model", "use only the first N train problems (default: all 1,000)")
    p.set_defaults(func=cmd_reward_model)

    p = sub.add_parser("live", help="chapters 6 and 11: run GRPO yourself, live, each iteration beside the "
                                    "committed run's (its torch threads; Ctrl-C keeps what is done, run again to go on)")
    p.add_argument("what", choices=["grpo", "reasoning"],
                   help="grpo: the protocol's run (chapter 6); reasoning: GRPO on worked answers from a thinking "
                        "base (chapter 11)")
    p.add_argument("--iterations", type=int, default=None, help="iterations 1..N (default: 10 for grpo, 20 for reasoning)")
    p.add_argument("--base", default=None, help="reasoning: the thinking base to start from, rare_0, rare_2, rare_10 "
                                                "or control (default: rare_2)")
    p.add_argument("--group-size", dest="G", type=int, default=None, help="reasoning: G (default: the committed run's, 8)")
    p.add_argument("--beta", type=float, default=None, help="reasoning: the KL weight (default: the protocol's, 0.02)")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="folder (default: runs/scratch/live/grpo, or runs/scratch/live/reasoning/<base>-G<G>-beta<beta>)")
    p.add_argument("--restart", action="store_true", help="delete an earlier live run and begin at iteration 1")
    p.set_defaults(func=cmd_live)

    p = sub.add_parser("gradient-study", help="chapters 2-3: the policy-gradient identity, exactly, and the "
                                              "gradient's noise under each advantage scheme at the warm start")
    p.add_argument("--preset", default="tiny", choices=["tiny"], help="only 'tiny' (default: %(default)s)")
    p.add_argument("--run-dir", type=Path, default=None, help="output folder (default: runs/<preset>/gradient_study)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    p.set_defaults(func=cmd_gradient_study)

    p = sub.add_parser("skill-test", help="chapter 11: skill or propensity: each thinking base continues a worked "
                                          "answer whose first step is started for it, paired with the skill base")
    p.add_argument("--preset", default="tiny", choices=["tiny"], help="only 'tiny' (default: %(default)s)")
    p.add_argument("--draws", type=int, default=4, help="answers per test chain and base (default: %(default)s)")
    p.add_argument("--run-dir", type=Path, default=None, help="output folder (default: runs/<preset>/skill_test)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished test (evidence: normally refused)")
    p.set_defaults(func=cmd_skill_test)

    p = sub.add_parser("objective-cases", help="outside checks: write (or --check) tests/data/objective_cases.json, "
                                               "each objective's loss and gradient on seeded small tensors")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests" / "data"
                   / "objective_cases.json", help="the case file (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="compare the file with what the code gives; exit 1 if not")
    p.set_defaults(func=cmd_objective_cases)

    p = sub.add_parser("grpo-large", help="chapters 6-7: the larger GRPO run (32 prompts x G=8, its own rate, "
                                          "outside the protocol's counts), its evaluation and 64 draws for pass@k")
    p.add_argument("--preset", default="tiny", choices=["tiny"], help="only 'tiny' (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cpu for tiny)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished run (evidence: normally refused)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_grpo_large)

    p = sub.add_parser("overoptimisation", help="chapter 10: proxies of several strengths, best-of-n and GRPO "
                                                "against them, the true reward beside the proxy's")
    p.add_argument("--preset", default="tiny", choices=["tiny"], help="only 'tiny' (default: %(default)s)")
    p.add_argument("--only", default=None, help="comma-separated GRPO settings to run (default: every one not yet run)")
    p.add_argument("--workers", type=int, default=2, help="GRPO settings run at once, one process each (default: 2)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker (default: 1)")
    p.add_argument("--overwrite", action="store_true", help="rebuild everything (a built step is normally refused)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    resume_options(p, "each unfinished GRPO setting")
    p.set_defaults(func=cmd_overoptimisation)

    p = sub.add_parser("format-base", help="chapter 10: continue the tiny base's pretraining with 2%% of documents "
                                           "in the lab's format until 5%% of its answers use it; then evaluate it")
    p.add_argument("--preset", default="tiny", choices=["tiny"], help="only 'tiny' (default: %(default)s)")
    common(p, "runs/tiny/format_base", "evaluate on the first N test problems per population")
    resume_options(p, "an unfinished run")
    p.set_defaults(func=cmd_format_base)

    for name, func, what in (("thinking-bases", cmd_thinking_bases, "chapter 11: bases that can work a problem out "
                              "and rarely do (a skill phase, then working at 0%%, 2%%, 10%%; a control)"),
                             ("reasoning", cmd_reasoning, "chapter 11: GRPO on worked answers from each thinking "
                              "base (outcome, length-penalty and process rewards)")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--preset", default="tiny", choices=["tiny"], help="only 'tiny' (default: %(default)s)")
        p.add_argument("--only", default=None, help="comma-separated names (default: every one not yet built)")
        p.add_argument("--workers", type=int, default=2, help="runs at once, one process each (default: 2)")
        p.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker (default: 1)")
        p.add_argument("--no-progress", action="store_true", help="no progress lines")
        p.add_argument("--resume", action="store_true", help="continue each unfinished run from its newest state "
                       "(a run that a Ctrl-C or a kill stopped)")
        p.add_argument("--restart", action="store_true", help="delete each unfinished run's attempt and start it afresh")
        p.set_defaults(func=func)


def _add_rarer_command(sub) -> None:
    """Subcommand: chapter 11's rarer bases (labkit.studies.rarer_bases)."""
    p = sub.add_parser("rarer-bases", help="chapter 11: bases that work a problem out in 2%%, 1%% and 0.5%% of their "
                                           "documents, on one lineage of their own, and GRPO from each (trains only "
                                           "what is missing; an unfinished base or run goes on from its newest state)")
    p.add_argument("--preset", default="tiny", choices=["tiny"], help="only 'tiny' (default: %(default)s)")
    p.add_argument("--workers", type=int, default=2, help="bases or runs at once, one process each (default: 2)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker (default: 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_rarer_bases)


def _add_crossover_command(sub) -> None:
    """Subcommand: chapter 11's pass@k crossover (labkit.studies.crossover)."""
    p = sub.add_parser("crossover", help="chapter 11: pass@k of worked answers for k up to --draws, the thinking "
                                         "bases before and chapter 11's runs after RL, chain by chain")
    p.add_argument("--preset", default="tiny", choices=["tiny"], help="only 'tiny' (default: %(default)s)")
    p.add_argument("--policies", default=None,
                   help="comma-separated, some of rare_2,from_rare_2,rare_10,from_rare_10,skill (default: all)")
    p.add_argument("--draws", type=int, default=256, help="answers per chain and policy: pass@k for k up to it "
                                                          "(default: %(default)s)")
    p.add_argument("--chains-per-k", type=int, default=13, help="test chains of each k = 1 ... 8 (default: %(default)s)")
    p.add_argument("--run-dir", type=Path, default=None, help="output folder (default: runs/<preset>/crossover)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--overwrite", action="store_true", help="count a finished study again (normally refused)")
    p.add_argument("--fill", action="store_true", help="first rebuild the policies' models that are not here "
                                                        "(`cache fill`: each kept only if it is the file its manifest records)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_crossover)


def _add_evaluation_commands(sub) -> None:
    """Subcommands: evaluation, its results file and the sampler comparison."""
    p = sub.add_parser("evaluate", help="test evaluation: greedy + 4 seeded samples per problem, then results.json")
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda for qwen when present, else cpu)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--overwrite", action="store_true", help="replace a finished evaluation (evidence: normally refused)")
    p.add_argument("--policy", default="all", choices=["all", "warm_start", "sft", "grpo", "grpo_g2", "grpo_g8"],
                   help="all: every policy with a finished run, keeping finished evaluations (default: %(default)s)")
    p.add_argument("--sampler", default="fast", choices=["fast", "reference"],
                   help="fast: batched KV cache (tokens equal to reference in the tests); reference: no KV cache "
                        "(default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=100, help="fast sampler rows per batch (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None,
                   help="a trial on the first N problems of each population, written to evaluation/trials/limit-N")
    p.add_argument("--max-new-tokens", type=int, default=64, help="response token limit (default: %(default)s)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("results-json", help="recompute evaluation/results.json from the saved predictions and the test labels")
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="only check that results.json reproduces byte for byte")
    p.add_argument("--limit", type=int, default=None, help="the trial on N problems per population (evaluation/trials)")
    p.set_defaults(func=cmd_results)

    p = sub.add_parser("sampler-agreement", help="reference vs fast sampler on the warm start: greedy on the 200 "
                                                 "test problems, seeded on 200 x 4 draws; mismatches explained")
    p.add_argument("--preset", default="tiny", choices=["tiny", "qwen"], help="model preset (default: %(default)s)")
    p.add_argument("--state", type=Path, default=None,
                   help="model file (default: runs/<preset>/warm_start/model.safetensors of the finished warm start)")
    p.add_argument("--out", type=Path, default=None, help="report (default: runs/<preset>/sampler_agreement.json)")
    p.add_argument("--limit", type=int, default=None, help="only the first N test problems (a trial)")
    p.add_argument("--draws", type=int, default=4, help="seeded samples per problem (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="response token limit (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=100, help="fast sampler rows per batch (default: %(default)s)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda for qwen when present, else cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing report (evidence: normally refused)")
    p.set_defaults(func=cmd_sampler_agreement)

    # `--help` lists the steps in the protocol's order, then the tools (argparse keeps the
    # order of add_parser, which groups the code by shared arguments instead).


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m labkit",
        description="GRPO course lab: run each step of the protocol (see book/protocol.md).",
        epilog="Two commands, split by what they touch: `python -m labkit` makes and checks the lab's runs "
               "(models, rollouts, evaluations); `python -m labkit.book.build` works on the book itself, from the "
               "files those runs wrote (offline check, results page, student sources, re-executing "
               "chapters): `python -m labkit.book.build --help`.  `results-json` here recomputes "
               "a run's numbers; `labkit.book.build results-page` writes the page that prints them.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    _add_data_and_tool_commands(sub)
    _add_training_commands(sub)
    _add_exercise_commands(sub)
    _add_chapter10_commands(sub)
    _add_rarer_command(sub)
    _add_crossover_command(sub)
    _add_evaluation_commands(sub)
    rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
    sub._choices_actions.sort(key=lambda action: rank.get(action.dest, len(rank)))
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command; a user's mistake is one line on stderr and exit 2 (`labkit.lab.errors.refused`), a Ctrl-C
    one line and exit 130 (LABKIT_TRACEBACK=1 shows the traceback of either)."""
    import os

    from .lab.errors import refused

    args = build_parser().parse_args(argv)
    for name in ("threads", "limit", "validation_limit", "draws", "batch_size", "max_new_tokens"):
        value = getattr(args, name, None)
        if value is not None and value < 1:
            print(f"error: --{name.replace('_', '-')} {value}: must be at least 1", file=sys.stderr)
            return 2
    before = _folders(args)
    try:
        return refused(lambda: _run(args), on_refusal=lambda: _remove_left_locks(_folders(args) - before))
    except KeyboardInterrupt as err:  # labkit.lab.skeleton.Interrupted says which state to resume from
        if os.environ.get("LABKIT_TRACEBACK"):
            raise
        print(f"interrupted: {err}" if str(err) else "interrupted (Ctrl-C)", file=sys.stderr)
        return 130


PATH_OPTIONS = ("run_dir", "out", "eval_root", "scratch_dir")  # the options that name a folder a command writes


def _folders(args: argparse.Namespace) -> set[Path]:
    """The folders a command may create: those under runs/ (three levels) and those its options name, as they
    are now, so that a refused command's leftovers can be told from what was there before."""
    from .lab.runs import REPO_ROOT

    found = {p for depth in ("*", "*/*", "*/*/*") for p in (REPO_ROOT / "runs").glob(depth) if p.is_dir()}
    for name in PATH_OPTIONS:
        value = getattr(args, name, None)
        if value is not None and Path(value).is_dir():
            found.add(Path(value))
    return found


def _remove_left_locks(created: set[Path]) -> None:
    """A refused command leaves nothing behind: each folder it created that holds only its lock file goes
    (deepest first), and nothing else is touched."""
    from .lab.runs import LOCK_FILE, RunFolderBusyError, hold_folder, release_folder

    for folder in sorted(created, key=lambda p: len(p.parts), reverse=True):
        try:
            if {p.name for p in folder.iterdir()} != {LOCK_FILE}:
                continue
            hold_folder(folder)  # refused if another process writes there now: its folder is left alone
            try:
                (folder / LOCK_FILE).unlink()
                folder.rmdir()
            finally:
                release_folder(folder)
        except (OSError, RunFolderBusyError):  # busy, or not empty after all: left as it is
            continue


def _run(args: argparse.Namespace) -> int:
    if hasattr(args, "threads") and args.threads is None and getattr(args, "preset", None) == "tiny":
        # The tiny model gains nothing from a second CPU thread, and on a busy 2-core
        # machine threads waiting for each other slow it down many times over.
        args.threads = 1
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    return args.func(args)
