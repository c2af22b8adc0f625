"""Chapter 11: how rare may working be and GRPO still find it?  Bases rarer than rare_2, on one lineage.

    python -m labkit rarer-bases [--workers 2]      (trains only what is missing)

Chapter 11's bases show working in 0%, 2% and 10% of the worked prompt's documents; GRPO from rare_2
finds working, from rare_0 it does not.  The edge lies between: this study adds bases at 1% and 0.5%.

One lineage.  A phase-2 base continues the skill base, whose model is not committed (4 MB, ignored) and
whose rebuild on another CPU is another model: its kernels round differently (the first logged loss of
a rebuild on an AVX2-only EPYC, 2026-12-07: 4.68256 against the committed log's 4.68279), and 3,000
updates carry that difference into different weights.  On an AVX-512 EPYC (family 25, model 17), the
same day, the same recipe and seed rebuilt the committed skill base byte for byte (SHA-256 0473a90e...,
right in 85% of its validation draws at update 3,000): the kernels, not the recipe, decide.  Bases built
from such a rebuild cannot be set beside the committed rare_2.  So the study builds its whole lineage in its
own folder, runs/<preset>/rarer/:

1. "skill": the thinking step's phase 1, the same recipe and seed (`thinking_base` phase "skill");
2. "rare_2", "rare_1", "rare_0p5": the thinking step's phase 2 from that skill base, with working in 2%,
   1% and 0.5% of the worked prompt's documents.  All three draw the same document stream (rare_2's seed
   in the thinking step): the chains, the coin that sends a document to the worked prompt and the coin
   that decides working are the same draws, so each base's worked documents are a subset of the next
   richer base's, and the share is the only difference.  rare_2 here is the lineage's anchor: every
   rarer base is compared with it, never with the committed rare_2;
3. GRPO from each of the three with chapter 11's budget and seed (the sweep's worked runner, the lab's
   one loop), named "from_<base>", each evaluated by the same test profile (200 chains x 8 draws).

On the AVX2-only machine that built it, the lineage's skill base (committed: runs/tiny/rarer/skill) never
learned the skill: 3,000 updates left it right in 21.6% of its test draws (the committed one: 82.5%; its skill
arrived late and all at once, after update 1,600), so its rare working does not pay, and nothing can be
selected from it.  So rarer bases are also made on the chapter's own
lineage, from the committed rare_2 itself (its weights are committed):

4. "rare_2_direct_50", "rare_2_direct_150": rare_2, then 50 or 150 more updates of phase 2's documents with no
   working at all (the worked prompt answered directly), at phase 2's rate; GRPO from each as above.

Each base and run is a resumable run folder as every other: a Ctrl-C keeps its newest state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import ReasoningConfig, ThinkingBaseConfig, ThinkingPhase
from ..lab.runs import RunFolder, preset_folder, sha256_file, write_json
from ..lab.skeleton import holding, refuse_earlier_attempt
from . import thinking_base

FOLDER = "rarer"
# thinking_base's phase index of rare_2: a phase's documents are drawn from ThinkingBaseConfig.seed + index
DOCUMENT_INDEX = [p.name for p in ThinkingBaseConfig().phases].index("rare_2")
_RARE_2 = ThinkingBaseConfig().phase("rare_2")
PHASES = (
    ThinkingBaseConfig().phase("skill"),
    _RARE_2,
    replace(_RARE_2, name="rare_1", thinking_share=0.01),
    replace(_RARE_2, name="rare_0p5", thinking_share=0.005),
)
# Rarer on the chapter's own lineage: the committed rare_2 (whose weights are committed), then more of phase 2's
# documents with no working at all (the worked prompt answered directly), 50 or 150 updates at phase 2's rate,
# with no warm-up (the model is trained); both from one document stream, so the 50-update base is the 150-update
# base's first 50 updates.  The thinking step's phases use seed indices 0-4, so index 5 is a stream of their own.
THINNED = (
    ThinkingPhase("rare_2_direct_50", "rare_2", 50, 0.0, _RARE_2.peak_lr, _RARE_2.final_lr),
    ThinkingPhase("rare_2_direct_150", "rare_2", 150, 0.0, _RARE_2.peak_lr, _RARE_2.final_lr),
)
THINNED_INDEX = len(ThinkingBaseConfig().phases)
BASES = tuple(p.name for p in PHASES)
RARER = BASES[1:]  # the phase-2 bases of the lineage GRPO starts from
STARTS = RARER + tuple(p.name for p in THINNED)  # every base GRPO starts from


def config() -> ThinkingBaseConfig:
    """The thinking step's config with this study's lineage's phases."""
    return replace(ThinkingBaseConfig(), phases=PHASES)


def thinned_config() -> ThinkingBaseConfig:
    """The thinking step's config with the thinned bases' phases and no warm-up (they continue a trained base)."""
    return replace(ThinkingBaseConfig(), phases=THINNED, warmup_steps=0)


def root(preset: str = "tiny") -> Path:
    return preset_folder(preset, FOLDER)


def base_dir(preset: str, name: str) -> Path:
    return root(preset) / name


def base_model(preset: str, name: str) -> Path:
    """A finished base's model file of this lineage (refused when missing, unfinished, edited or damaged)."""
    folder = RunFolder(base_dir(preset, name))
    folder.manifest()
    folder.check_file(thinking_base.MODEL_FILE)
    return folder / thinking_base.MODEL_FILE


def build_base(name: str, preset: str = "tiny", *, resume: bool = False, restart: bool = False,
               progress: bool = True) -> dict:
    """One base of the lineage into runs/<preset>/rarer/<name>/, by the thinking step's own phase run
    (`thinking_base._build`: autosave, Ctrl-C, exact resume, test profile, manifest).  The skill base
    starts from the committed base with the thinking step's phase-1 seed; the others from this lineage's
    skill base with rare_2's document seed."""
    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: only the tiny base is pretrained by the lab")
    thinned = name in {p.name for p in THINNED}
    cfg = thinned_config() if thinned else config()
    phase = cfg.phase(name)
    if thinned:  # from the committed rare_2 (the thinking step's folder: its weights are committed)
        index, source = THINNED_INDEX, thinking_base.start_file(preset, phase)
    elif name == "skill":
        index, source = 0, thinking_base.start_file(preset, phase)
    else:
        index, source = DOCUMENT_INDEX, base_model(preset, "skill")
    folder = RunFolder(base_dir(preset, name))
    with holding(folder, False):
        refuse_earlier_attempt(folder, thinking_base._earlier_attempt(folder), resume, restart)
        state = thinking_base.newest_state(folder) if resume else None
        if state is None:
            folder.clear((thinking_base.MODEL_FILE, "log.json", "log.partial.jsonl", "profile.json.gz",
                          "manifest.json", "states/update-*.pt.gz"))
        return thinking_base._build(folder, name, preset, cfg, phase, index, source, state, None, progress)


def is_finished(name: str, preset: str = "tiny") -> bool:
    return (base_dir(preset, name) / "FINISHED").is_file()


# -- GRPO from each base ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RarerRun:
    """One GRPO run of the study: chapter 11's outcome reward from a base of this lineage (the fields
    `reasoning.worked_task` reads, as `reasoning.ReasoningRun` has them; that class admits only the thinking
    step's bases)."""

    name: str
    base: str
    reward: str = "outcome"
    length_penalty: float = 0.0


RUNS = tuple(RarerRun(f"from_{base}", base) for base in STARTS)
RUN_NAMES = tuple(r.name for r in RUNS)


def run_dir(preset: str, name: str) -> Path:
    return root(preset) / name


def get_run(name: str) -> RarerRun:
    for r in RUNS:
        if r.name == name:
            return r
    raise ValueError(f"unknown run {name!r} of the rarer bases; expected one of {RUN_NAMES}")


def train(name: str, preset: str = "tiny", *, resume: bool = False, restart: bool = False,
          progress: bool = True) -> dict:
    """One GRPO run from its base into runs/<preset>/rarer/<name>/, exactly as chapter 11's from_rare_2 is
    trained (`reasoning.train`: its budget, seed, sampler, scoring and test profile), by the lab's one loop."""
    from ..grpo.loop import run_grpo
    from ..grpo.variants import Variant
    from ..models import shared_prompt
    from . import reasoning

    run, cfg = get_run(name), ReasoningConfig()
    return run_grpo(reasoning.preset_config(cfg), run_dir(preset, name), G=cfg.G, iterations=cfg.iterations,
                    resume=resume, restart=restart, sampler=reasoning.SAMPLER, start_file=base_model(preset, run.base),
                    device="cpu", progress=progress, variant=Variant(), shared_prompts=True,
                    task=reasoning.worked_task(run, cfg), bucket_tokens=shared_prompt.BUCKET_TOKENS)


def run_is_finished(name: str, preset: str = "tiny") -> bool:
    return (run_dir(preset, name) / "FINISHED").is_file()


def _job(job: tuple[str, str, str, int]) -> tuple[str, float]:
    """One base or run in a worker process of `threads` torch threads."""
    import torch

    kind, name, preset, threads = job
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    if kind == "base":
        resume = thinking_base.newest_state(RunFolder(base_dir(preset, name))) is not None
        build_base(name, preset, resume=resume, progress=False)
    else:
        from ..grpo.loop import newest_state

        resume = newest_state(RunFolder(run_dir(preset, name))) is not None
        train(name, preset, resume=resume, progress=False)
    return f"{kind} {name}", time.perf_counter() - t0


def run_all(preset: str = "tiny", *, workers: int = 2, threads: int = 1, progress: bool = True) -> dict[str, float]:
    """Every base and run not yet finished, `workers` at a time, each after what it starts from (an
    unfinished one goes on from its newest state); then the step's manifest.  Returns {what: seconds}."""
    from ..lab.workers import run_in_processes

    thinned = [("base", p.name) for p in THINNED]
    waves = [[("base", "skill"), *thinned], [("base", b) for b in RARER], [("run", r) for r in RUN_NAMES]]
    done = {("base", b) for b in BASES + tuple(p.name for p in THINNED) if is_finished(b, preset)} | {
        ("run", r) for r in RUN_NAMES if run_is_finished(r, preset)}
    times: dict[str, float] = {}
    for wave in waves:
        jobs = [(kind, name, preset, threads) for kind, name in wave if (kind, name) not in done]
        failed = []
        for job, result, error in run_in_processes(_job, jobs, workers):
            if error is not None:
                failed.append(f"{job[0]} {job[1]}: {error}")
                continue
            what, seconds = result
            times[what] = seconds
            if progress:
                print(f"rarer bases: {what} done in {seconds:.0f} s", flush=True)
        if failed:
            raise RuntimeError("rarer bases failed: " + "; ".join(failed))
    if not (root(preset) / SKILL_TEST_FILE).is_file():
        import torch

        torch.set_num_threads(threads)
        began = time.perf_counter()
        skill_check(preset)
        times["skill check"] = time.perf_counter() - began
    write_step_manifest(preset)
    return times


# -- Do the thinned bases keep the skill they no longer show? ----------------------------------------------
SKILL_TEST_FILE = "skill_test.json"


def skill_check(preset: str = "tiny") -> dict:
    """Chapter 11's skill test (`labkit.studies.skill_test`: the first step's left side written for the base, the
    same chains, draws and seeds) for each thinned base, paired chain by chain with the committed rare_2's rows
    (runs/<preset>/skill_test): does a base that no longer shows working still have the skill?  Writes and
    returns runs/<preset>/rarer/skill_test.json."""
    import torch

    from ..lab.runs import write_json
    from ..models import presets
    from . import reasoning_report, skill_test

    committed, committed_rows = skill_test.read(preset)
    chains = thinking_base.held_out_chains(thinking_base.TEST_SEED, committed["chains_per_k"])
    rare_2_rows = [r for r in committed_rows if r["base"] == "rare_2"]
    out = {"draws": committed["draws"], "chains_per_k": committed["chains_per_k"],
           "rare_2": committed["bases"]["rare_2"], "bases": {}, "against_rare_2": {}}
    for phase in THINNED:
        model, tokenizer = presets.load("tiny", state=base_model(preset, phase.name), device="cpu")
        model.eval()
        with torch.no_grad():
            rows = skill_test.sample_forced(model, tokenizer, chains, committed["draws"])
        out["bases"][phase.name] = skill_test.summary(rows)
        out["against_rare_2"][phase.name] = reasoning_report.paired_over_chains(rare_2_rows, rows)
    write_json(root(preset) / SKILL_TEST_FILE, out)
    return out


def read_skill_check(preset: str = "tiny") -> dict:
    """The committed skill check, checked against the digest the step's manifest records."""
    import json

    manifest = json.loads((root(preset) / "manifest.json").read_text())
    path = root(preset) / SKILL_TEST_FILE
    if sha256_file(path) != manifest["skill_test_sha256"]:
        raise ValueError(f"{path} is not the file runs/{preset}/{FOLDER}/manifest.json records: rebuild it with "
                         "`python -m labkit rarer-bases`")
    return json.loads(path.read_text())


def is_built(preset: str = "tiny") -> bool:
    return (root(preset) / "manifest.json").is_file()


def write_step_manifest(preset: str = "tiny") -> dict:
    """runs/<preset>/rarer/manifest.json: every base's and run's manifest digest (the step is built when it exists)."""
    manifest = {"step": FOLDER, "preset": preset,
                "bases": {n: sha256_file(base_dir(preset, n) / "manifest.json")
                          for n in BASES + tuple(p.name for p in THINNED)},
                "runs": {n: sha256_file(run_dir(preset, n) / "manifest.json") for n in RUN_NAMES},
                "skill_test_sha256": sha256_file(root(preset) / SKILL_TEST_FILE)}
    write_json(root(preset) / "manifest.json", manifest)
    return manifest


# -- What the study found -------------------------------------------------------------------------------


def read_profile(folder: Path) -> list[dict]:
    """A finished base's or run's test profile rows (checked against its manifest)."""
    import gzip
    import json

    run = RunFolder(folder)
    run.check_file("profile.json.gz")
    return json.loads(gzip.decompress((run.path / "profile.json.gz").read_bytes()))["rows"]


def table(preset: str = "tiny") -> list[dict]:
    """One row per phase-2 base, richest first: the base's documents with working, its test profile, its GRPO
    run's (the same 200 chains x 8 draws), the paired tests over chains (working draws, right draws), the
    iteration at which a sampled group first held a worked answer and the think rate of every iteration.
    Refused while a base or run is unfinished."""
    from ..lab.runs import read_json
    from . import reasoning_report as report

    out = []
    for run in RUNS:
        base_folder, run_folder = base_dir(preset, run.base), run_dir(preset, run.name)
        for folder in (base_folder, run_folder):
            if not (folder / "FINISHED").is_file():
                raise FileNotFoundError(f"{folder} is not finished: `python -m labkit rarer-bases` builds it")
        before, after = read_profile(base_folder), read_profile(run_folder)
        history = read_json(run_folder / "history.json")
        worked_iterations = [h["iteration"] for h in history if h["think_rate"] > 0]
        documents = RunFolder(base_folder).manifest()["documents"]
        out.append({
            "base": run.base, "run": run.name, "worked_documents": documents.get("worked", 0),
            "before": report.summary_row(run.base, before), "after": report.summary_row(run.name, after),
            "think_test": report.paired_over_chains(before, after, field="thinks"),
            "accuracy_test": report.paired_over_chains(before, after),
            "first_worked_iteration": worked_iterations[0] if worked_iterations else None,
            "think_rate_curve": [h["think_rate"] for h in history],
        })
    return out


def made_as(row: dict) -> str:
    """How a row's base was made, in a few words."""
    thinned = {p.name: p for p in THINNED}
    if row["base"] in thinned:
        return f"rare_2 + {thinned[row['base']].steps} direct updates"
    return f"rebuilt, {row['worked_documents']} worked docs"


def format_table(rows: list[dict]) -> str:
    """The study's table as text: one line per base."""
    from ..eval import paired

    def p(test):
        return paired.format_p(test["p_permutation"], at_most=paired.at_floor(test["p_permutation"],
                                                                             test["p_permutation_method"]))

    lines = [f"{'base':<18} {'made as':<27} {'thinks before -> after':>22} {'p':>12} {'right before -> after':>22} "
             f"{'p':>12} {'first worked iteration':>23}"]
    for r in rows:
        first = "-" if r["first_worked_iteration"] is None else str(r["first_worked_iteration"])
        lines.append(f"{r['base']:<18} {made_as(r):<27} {r['before']['think_rate']:>11.1%} -> "
                     f"{r['after']['think_rate']:<7.1%} {p(r['think_test']):>12} {r['before']['accuracy']:>11.1%} -> "
                     f"{r['after']['accuracy']:<7.1%} {p(r['accuracy_test']):>12} {first:>23}")
    return "\n".join(lines)
