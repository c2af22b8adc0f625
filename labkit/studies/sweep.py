"""A sweep of the loop's variants: runs cached by their configuration's fingerprint, run in parallel.

    python -m labkit sweep [FILE] [--workers N] [--scheduler ADDRESS]

FILE (JSON, or TOML with a top-level `runs` array) lists the runs: each a `name`, the variant
`options` of `labkit.grpo.variants.Variant` (unknown keys are an error), optionally `start`, the
finished step whose model the run starts from and keeps as its reference (default "warm_start";
chapter 10 starts from "base" and "format_base"), and optionally `config`, the budget and the
loop's numbers changed for that run (the keys of `CONFIG_KEYS`).  At the top level, beside `runs`,
`config` sets those for every run of the file (a run's own `config` wins), `sampler` picks the
sampler ("reference", the default, or "fast") and `shared_prompts` (true or false) computes each
prompt once per group when scoring (`labkit.models.shared_prompt`); the ablations (sweeps/ablations.json)
use all three.  For each run:

1. its folder is runs/<preset>/sweep/<name>-<fingerprint>, the fingerprint a digest of everything
   that makes its numbers: the preset's config, the variant, G, the iterations, the sampler, the
   start file's digest, the learned verifier's digest (reward "learned"), the data's digests and
   the fingerprint of what a run's code does (`code_digest`: what `run_one` reaches, without
   docstrings, comments or layout; runs named before it are found through RESTAMPED);
2. a finished folder is read, never rerun: asking again for a finished configuration costs nothing;
3. a missing one is trained (`loop.run_grpo` with the variant) and evaluated exactly as the
   protocol's policies are (`evaluate.run_inference`: greedy and 4 draws on the 200 test problems,
   into <run>/evaluation/), in a worker process; what they share (the finished warm start) is
   checked before the fan-out.
A file with `"task": "worked"` sweeps chapter 11's GRPO on worked answers instead (issue 56): each
run's `start` is a thinking base (default "rare_2"), its budget chapter 11's (`ReasoningConfig`:
16 chains x G = 8, 40 iterations at 1e-4; `config` changes it as above), its loop the worked task's
(`labkit.studies.reasoning.worked_task`: the static sampler, each prompt scored once, responses in
buckets), and its evaluation the test profile every chapter 11 run ends with (200 chains x 8 draws,
the same chains and seeds as its base's, in the run's manifest and profile.json.gz).
Workers: `concurrent.futures.ProcessPoolExecutor` on this machine, or a Dask distributed
scheduler at ADDRESS (`dask-scheduler` and `dask-worker` started elsewhere), whose workers see the
same repository at the same path.  Results (scoring phase): runs/<preset>/sweep/results.json for
the default file (chapter 9), results-<file name>.json for another, gzipped (".gz") when the file sets
"compress_results" (`results_file`, `load_results`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

from ..lab.runs import (REPO_ROOT, RunFolder, RunFolderError, preset_folder, read_checked_json, read_json, sha256_file,
                        write_json)
from ..lab.runtime import LEARNING_DATA_FILES, data_digests
from ..grpo.variants import Variant, needs_learned_verifier

DEFAULT_FILE = REPO_ROOT / "sweeps" / "chapter9.json"
RESULTS_FILE = "results.json"
STARTS = ("warm_start", "base", "format_base")  # steps whose finished model a run may start from
TASKS = ("protocol", "worked")  # what a sweep file's runs learn (its top-level "task"; default "protocol")
WORKED_START = "rare_2"  # a worked run's thinking base when it names none (chapter 11's reference run's)
# The preset's numbers a sweep file may change, per run or for the whole file: the budget (prompts per
# iteration, G, iterations, learning rate), the clip, the KL coefficient and the run's seed.
CONFIG_KEYS = ("prompts_per_iteration", "G", "grpo_iterations", "grpo_lr", "clip_eps", "kl_coef", "seed",
               "logprob_check_tol")
SAMPLERS = ("reference", "fast")
MAX_SEED = 2**62
POOL_SIZE = 872  # the GRPO pool's problems (labkit.grpo.core.load_pool): an iteration draws at most all of them
MAX_RESPONSES_PER_ITERATION = 4096  # 32 x the 128 of the largest committed runs (each update scores them at once)
DATA_FILES = (*LEARNING_DATA_FILES, "test.statements.jsonl", "test.labels.jsonl")  # a run trains, then is tested


def results_file(sweep_file: str | Path) -> str:
    """Where a sweep file's results go, beside its runs: results.json for chapter 9's, else
    results-<stem>.json; with ".gz" when the file sets "compress_results" (every committed sweep does:
    their curves and evaluations are mostly white space and repetition, and gzip keeps the cache small)."""
    sweep_file = Path(sweep_file)
    name = RESULTS_FILE if sweep_file.resolve() == DEFAULT_FILE.resolve() else f"results-{sweep_file.stem}.json"
    return name + (".gz" if _read_file(sweep_file).get("compress_results") else "")


def load_results(sweep_file: str | Path = DEFAULT_FILE, preset: str = "tiny") -> dict:
    """A sweep file's results (the scoring phase's evaluations and curves), from beside its runs."""
    return read_results(sweep_root(sweep_file, preset) / results_file(sweep_file))


def read_results(path: str | Path) -> dict:
    """A sweep's results file, plain or gzipped (by its name)."""
    path = Path(path)
    if path.suffix != ".gz":
        return read_json(path)
    import gzip

    try:
        return json.loads(gzip.decompress(path.read_bytes()).decode("utf-8"))
    except (OSError, EOFError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a gzipped JSON file ({err}); rerun the sweep to rewrite it") from None


def write_results(path: str | Path, results: dict) -> Path:
    """Write a sweep's results, gzipped when the name ends in .gz (mtime 0: the same bytes every time)."""
    if str(path).endswith(".gz"):
        import gzip

        from ..lab.runs import atomic_write_bytes, dumps_json

        return atomic_write_bytes(path, gzip.compress(dumps_json(results).encode("utf-8"), compresslevel=9, mtime=0))
    return write_json(path, results)


def _read_file(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"sweep file {path} does not exist")
    import tomllib

    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise ValueError(f"sweep file {path} is empty: expected {kind} with a top-level 'runs' list")
        spec = tomllib.loads(text) if kind == "TOML" else json.loads(text)
    except UnicodeDecodeError as err:
        raise ValueError(f"sweep file {path} is not UTF-8 text (byte {err.start}): expected {kind}") from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"sweep file {path} is not valid {kind} ({err})") from None
    runs = spec.get("runs") if isinstance(spec, dict) else None
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{path}: expected a top-level 'runs' list of {{'name', 'options'}}")
    unknown = sorted(set(spec) - {"runs", "config", "sampler", "shared_prompts", "folder", "about", "compress_results",
                                  "task"})
    if unknown:
        raise ValueError(f"{path}: unknown top-level key(s) {unknown}; expected 'runs' and optionally 'config', "
                         "'sampler', 'shared_prompts', 'folder', 'compress_results', 'task' and 'about'")
    if spec.get("task", "protocol") not in TASKS:
        raise ValueError(f"{path}: task {spec['task']!r}: expected one of {TASKS}")
    if spec.get("task") == "worked" and ("sampler" in spec or "shared_prompts" in spec):
        raise ValueError(f"{path}: a worked sweep's runs sample and score as chapter 11's (the static sampler, each "
                         "prompt once): leave out 'sampler' and 'shared_prompts'")
    if not isinstance(spec.get("compress_results", False), bool):
        raise ValueError(f"{path}: compress_results {spec['compress_results']!r}: expected true or false")
    folder = spec.get("folder", "")
    if not isinstance(folder, str) or not all(c.isalnum() or c in "_-" for c in folder):
        raise ValueError(f"{path}: folder {folder!r}: expected a name of letters, digits, '_' or '-'")
    return spec


def _read_spec(path: Path) -> list[dict]:
    return _read_file(path)["runs"]


def load_task(path: str | Path) -> str:
    """What a sweep file's runs learn: "protocol" (the default) or "worked" (chapter 11's task)."""
    return _read_file(Path(path)).get("task", "protocol")


def starts_of(task: str) -> tuple[str, ...]:
    """What a run of `task` may start from: a finished step (the protocol's) or a thinking base (worked)."""
    from . import thinking_base

    return thinking_base.BASES if task == "worked" else STARTS


def _checked_config(path: Path, where: str, config) -> dict:
    """A sweep file's `config` object, its keys among CONFIG_KEYS and its values numbers of the right kind."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"{path}: {where} config {config!r}: expected an object, e.g. {{\"clip_eps\": 0.2}}")
    unknown = sorted(set(config) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{path}: {where} config has unknown key(s) {unknown}; a sweep may change {list(CONFIG_KEYS)}")
    for key, value in config.items():
        integer = key in ("prompts_per_iteration", "G", "grpo_iterations", "seed")
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) \
                or (key not in ("seed", "kl_coef") and not value > 0) \
                or (key == "kl_coef" and not value >= 0) or (key == "G" and value < 2) \
                or (key == "clip_eps" and not value < 1) or (key == "seed" and not 0 <= value < MAX_SEED) \
                or (key == "prompts_per_iteration" and value > POOL_SIZE):
            rule = ("an integer >= 2" if key == "G"
                    else "an integer in 0..2**62 - 1 (each stream adds its offset to it, and a seed has 64 bits)"
                    if key == "seed"
                    else f"a positive integer at most {POOL_SIZE}, the pool's problems"
                    if key == "prompts_per_iteration"
                    else "a positive integer" if integer else "a finite number >= 0" if key == "kl_coef"
                    else "a number in (0, 1): the ratio is clipped to [1 - clip_eps, 1 + clip_eps]" if key == "clip_eps"
                    else "a finite number > 0")
            raise ValueError(f"{path}: {where} config {key}={value!r}: expected {rule}")
    return dict(config)


def _check_budget(path: Path, name: str, config: dict) -> None:
    """Refuse, before any folder is made, a run whose iteration holds more responses than a laptop's memory
    scores at once (MAX_RESPONSES_PER_ITERATION)."""
    from ..config import get_preset

    preset = get_preset("tiny")
    P = config.get("prompts_per_iteration", preset.prompts_per_iteration)
    G = config.get("G", preset.G)
    if P * G > MAX_RESPONSES_PER_ITERATION:
        raise ValueError(f"{path}: run {name!r}: prompts_per_iteration x G = {P} x {G} = {P * G} responses an "
                         f"iteration; at most {MAX_RESPONSES_PER_ITERATION} (each update scores all of them in one "
                         "batch, and its memory grows with their number)")


def sweep_root(path: str | Path, preset: str) -> Path:
    """Where a sweep file's runs go: runs/<preset>/sweep/, or its `folder` under it (the ablations keep
    theirs apart, so that their names, such as `grpo`, never meet chapter 9's)."""
    folder = _read_file(Path(path)).get("folder", "")
    return preset_folder(preset, "sweep", folder) if folder else preset_folder(preset, "sweep")


def load_settings(path: str | Path) -> dict[str, dict]:
    """{name: {"config": {...}, "sampler": ..., "shared_prompts": ...}} of a sweep file's runs: the
    file's own settings with each run's `config` laid over them (a run's key wins)."""
    path = Path(path)
    spec = _read_file(path)
    common = _checked_config(path, "the file's", spec.get("config"))
    sampler = spec.get("sampler", "reference")
    if sampler not in SAMPLERS:
        raise ValueError(f"{path}: sampler {sampler!r}: expected one of {SAMPLERS}")
    shared = spec.get("shared_prompts", False)
    if not isinstance(shared, bool):
        raise ValueError(f"{path}: shared_prompts {shared!r}: expected true or false")
    settings = {entry.get("name", ""): {"config": {**common, **_checked_config(path, f"run {entry.get('name')!r}'s",
                                                                                entry.get("config"))},
                                        "sampler": sampler, "shared_prompts": shared}
                for entry in spec["runs"] if isinstance(entry, dict)}
    for name, setting in settings.items():
        _check_budget(path, name, setting["config"])
    return settings


def load_runs(path: str | Path, preset: str = "tiny") -> list[tuple[str, Variant]]:
    """[(name, variant)] from a sweep file; names must be unique and usable as folder names.

    `"random_reward_p": "warm_start_p"` stands for the warm start's measured per-draw validation
    success (runs/<preset>/group_size/warm_start_p.json), so the random control pays as often as
    the real reward would at the start."""
    path = Path(path)
    out, seen = [], set()
    for k, entry in enumerate(_read_spec(path)):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: run {k} {entry!r}: expected an object with 'name' and 'options'")
        unknown = sorted(set(entry) - {"name", "options", "start", "config"})
        if unknown:
            raise ValueError(f"{path}: run {k} has unknown key(s) {unknown}; expected 'name', 'options' "
                             "and optionally 'start' and 'config'")
        task = load_task(path)
        if entry.get("start", WORKED_START if task == "worked" else "warm_start") not in starts_of(task):
            raise ValueError(f"{path}: run {k} start {entry['start']!r}: expected one of {starts_of(task)}")
        name = entry.get("name", "")
        if not name or not all(c.isalnum() or c in "_-" for c in name) or name in seen:
            raise ValueError(f"{path}: run {k} name {name!r} must be unique, letters, digits, '_' or '-'")
        seen.add(name)
        options = entry.get("options", {})
        if not isinstance(options, dict):
            raise ValueError(f"{path}: run {k} ({name}) options {options!r}: expected an object of option: value "
                             'pairs, e.g. {"kl": "none"}')
        options = dict(options)
        if options.get("random_reward_p") == "warm_start_p":
            options["random_reward_p"] = read_json(preset_folder(preset, "group_size", "warm_start_p.json"))["p"]
        try:
            out.append((name, Variant.from_dict(options)))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: run {k} ({name}): {err}") from None
    return out


def load_starts(path: str | Path) -> dict[str, str]:
    """{name: start} of a sweep file's runs: a step ("warm_start" where a run names none) or, in a worked
    sweep, a thinking base (WORKED_START where a run names none)."""
    default = WORKED_START if load_task(path) == "worked" else "warm_start"
    return {entry["name"]: entry.get("start", default) for entry in _read_spec(Path(path))}


def start_model(preset: str, start: str) -> Path:
    """The finished model of step `start` (runs/<preset>/<start>/model.safetensors)."""
    from ..grpo import loop

    if start not in STARTS:
        raise ValueError(f"start {start!r}: expected one of {STARTS}")
    if start == "warm_start":
        return loop.warm_start_file(preset)
    folder = RunFolder(preset_folder(preset, start))
    if not folder.is_finished():
        raise FileNotFoundError(f"{folder} has no finished run to start from; build it first (`make cache`)")
    return folder / "model.safetensors"


def fingerprint(spec: dict, code: str | None = None) -> str:
    """12 hex digits naming a run by everything that makes its numbers.

    code: the digest of what the run's code does (`code_digest`; default: the working tree's)."""
    return _named_by(spec, {"code": code or code_digest(), "data_sha256": data_digests(DATA_FILES)})


def base_config(spec: dict):
    """The preset config a run's overrides apply to: the preset's, or chapter 11's budget for a worked run."""
    from ..config import ReasoningConfig, get_preset

    if spec.get("task") == "worked":
        import dataclasses

        from . import reasoning

        return dataclasses.replace(reasoning.preset_config(ReasoningConfig()), G=ReasoningConfig().G)
    return get_preset(spec["preset"])


def _named_by(spec: dict, code_and_data: dict) -> str:
    """12 hex digits of the run's identity: its settings, start and proxy, and `code_and_data` (how the code
    and data that made it are named: today's fingerprint, or the byte digests of `legacy_fingerprint`)."""
    config = base_config(spec).with_overrides(**spec.get("config_overrides", {}))
    identity = {"config": config.to_dict(), "variant": spec["options"], "G": spec["G"],
                "iterations": spec["iterations"], "sampler": spec["sampler"],
                "start_sha256": sha256_file(spec["start_file"]), **code_and_data,
                # only where a file asks for it, so that chapter 9's runs keep the fingerprints they had
                **({"shared_prompts": True} if spec.get("shared_prompts") else {}),
                # the proxy a learned-reward run optimises makes its numbers too
                **({"reward_model_sha256": spec["reward_model_sha256"]} if "reward_model_sha256" in spec else {}),
                # a worked run (only where a file asks for it, as above)
                **({"task": "worked"} if spec.get("task") == "worked" else {})}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


RUN_ENTRY = "labkit.studies.sweep:run_one"  # what a sweep's run executes: training and evaluation


def code_digest(sources=None) -> str:
    """SHA-256 of the fingerprint of what `run_one` reaches (`labkit.lab.fingerprint`): docstrings,
    comments, layout and functions no run reaches leave it alone.  sources: default the working tree's."""
    from ..lab.fingerprint import Sources, digest_of

    if sources is None:
        if not _CODE_DIGEST:
            _CODE_DIGEST.append(_remembered_digest(lambda: digest_of(Sources.in_folder(REPO_ROOT).fingerprint([RUN_ENTRY]))))
        return _CODE_DIGEST[0]
    return digest_of(sources.fingerprint([RUN_ENTRY]))


def _remembered_digest(compute) -> str:
    """`compute()`, remembered on disk under the SHA-256 of every labkit source file's bytes: the digest is a
    function of those bytes alone, so a process that finds the same bytes reads it (5 ms instead of about a
    second: every chapter that loads a sweep asks)."""
    import tempfile

    sources = hashlib.sha256()
    for path in sorted((REPO_ROOT / "labkit").rglob("*.py")):
        sources.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    memo = Path(tempfile.gettempdir()) / "labkit-code-digest" / sources.hexdigest()
    try:
        text = memo.read_text().strip()
        if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
            return text
    except OSError:
        pass
    digest = compute()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        partial = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
        partial.write_text(digest + "\n")
        os.replace(partial, memo)
    except OSError:
        pass  # a read-only temporary folder: computed again next time
    return digest


_CODE_DIGEST: list[str] = []  # one process reads the package once


def learned_verifier(variant: Variant, preset: str):
    """The learned verifier a run of `variant` optimises (its digests checked), or None."""
    if not needs_learned_verifier(variant):
        return None
    from . import reward_model

    return reward_model.load_verifier(preset)


def run_one(spec: dict) -> dict:
    """Train (unless finished) and evaluate (unless finished) one run; returns a short summary.

    spec: plain values only (it crosses into a worker process or a Dask worker)."""
    import torch

    from ..eval import evaluate
    from ..grpo import loop
    from ..config import get_preset

    torch.set_num_threads(spec.get("threads", 1))
    folder = Path(spec["folder"])
    began = time.perf_counter()
    trained = False
    if spec.get("task") == "worked":
        if not RunFolder(folder).is_finished():
            _train_worked(spec)
            trained = True
        return {"name": spec["name"], "folder": str(folder), "trained": trained, "evaluated": trained,
                "seconds": time.perf_counter() - began}
    if not RunFolder(folder).is_finished():
        config = get_preset(spec["preset"]).with_overrides(**spec.get("config_overrides", {}))
        variant = Variant.from_dict(spec["options"])
        loop.run_grpo(config, folder, G=spec["G"], iterations=spec["iterations"],
                      start_file=spec["start_file"], sampler=spec["sampler"], progress=False, restart=True,
                      variant=variant, learned_verifier=learned_verifier(variant, spec["preset"]),
                      shared_prompts=spec.get("shared_prompts", False))
        trained = True
    evaluated = False
    if spec.get("evaluate", True) and not RunFolder(folder / "evaluation" / "grpo").is_finished():
        evaluate.run_inference(spec["preset"], "grpo", state_file=folder / "model.safetensors",
                               eval_root=folder / "evaluation", limit=spec.get("eval_limit"))
        evaluated = True
    return {"name": spec["name"], "folder": str(folder), "trained": trained, "evaluated": evaluated,
            "seconds": time.perf_counter() - began}


def _train_worked(spec: dict) -> dict:
    """A worked run (chapter 11's task) by the lab's one GRPO loop; its finish writes the test profile."""
    import dataclasses

    from ..config import ReasoningConfig
    from ..grpo import loop
    from ..models import shared_prompt
    from . import reasoning

    config = base_config(spec).with_overrides(**spec.get("config_overrides", {}))
    cfg = dataclasses.replace(ReasoningConfig(), prompts_per_iteration=config.prompts_per_iteration, G=spec["G"],
                              iterations=spec["iterations"], lr=config.grpo_lr)
    run = reasoning.ReasoningRun(spec["name"], spec["start"])
    return loop.run_grpo(config.with_overrides(grpo_iterations=spec["iterations"]), spec["folder"], G=spec["G"],
                         iterations=spec["iterations"], start_file=spec["start_file"], sampler=spec["sampler"],
                         progress=False, restart=True, variant=Variant.from_dict(spec["options"]),
                         shared_prompts=True, task=reasoning.worked_task(run, cfg),
                         bucket_tokens=shared_prompt.BUCKET_TOKENS)


def plan(preset: str, runs: list[tuple[str, Variant]], *, root: str | Path | None = None,
         iterations: int | None = None, start_file: str | Path | None = None, sampler: str = "reference",
         config_overrides: dict | None = None, eval_limit: int | None = None, evaluate: bool = True,
         threads: int = 1, starts: dict[str, str] | None = None,
         settings: dict[str, dict] | None = None, task: str = "protocol") -> list[dict]:
    """The specs of the sweep's runs, each with its fingerprinted folder.

    settings: {name: {"config", "sampler", "shared_prompts"}} from `load_settings`: a run's budget
    and numbers (G and the iterations become the run's own; the rest config overrides), its
    sampler and its scoring; where a run has none, the arguments' values.
    iterations: each run's budget (default: the preset's grpo_iterations, the protocol's 100)
    start_file: one model every run starts from (tests); else each run's step in `starts`
    (`load_starts`; default "warm_start"), checked finished.
    task: "worked" plans chapter 11's runs (`load_task`): each starts from its thinking base (checked finished),
    with chapter 11's budget, sampler and scoring, and is evaluated by its own finish (its test profile)."""
    from . import reward_model
    from ..config import get_preset

    if task not in TASKS:
        raise ValueError(f"task {task!r}: expected one of {TASKS}")
    worked = task == "worked"
    config = base_config({"preset": preset, "task": task})
    iterations = config.grpo_iterations if iterations is None else iterations
    root = Path(root) if root is not None else preset_folder(preset, "sweep")
    specs, restamped = [], _restamped(root)  # read once: every run of the file looks it up
    for name, variant in runs:
        if worked and needs_learned_verifier(variant):
            raise ValueError(f"run {name!r}: the learned verifier judges the protocol's answers, not worked ones")
        if worked:
            from . import reasoning

            start_step = (starts or {}).get(name, WORKED_START)
            start = Path(start_file) if start_file is not None else reasoning.base_model(preset, start_step)
        else:
            start_step = "given" if start_file is not None else (starts or {}).get(name, "warm_start")
            start = Path(start_file) if start_file is not None else start_model(preset, start_step)
        own = (settings or {}).get(name, {})
        overrides = {**(config_overrides or {}), **own.get("config", {})}
        run_g = overrides.pop("G", config.G)
        run_iterations = overrides.pop("grpo_iterations", iterations)
        spec = {"name": name, "preset": preset, "options": variant.to_dict(), "G": run_g,
                "iterations": run_iterations, "sampler": own.get("sampler", sampler), "start_file": str(start),
                "config_overrides": overrides, "eval_limit": eval_limit, "evaluate": evaluate,
                "threads": threads, "start": start_step}
        if own.get("shared_prompts"):
            spec["shared_prompts"] = True
        if worked:
            from . import reasoning

            spec.update(task="worked", sampler=reasoning.SAMPLER, shared_prompts=True, evaluate=False)
        if needs_learned_verifier(variant):
            spec["reward_model_sha256"] = sha256_file(reward_model.model_file(preset))
        named = f"{name}-{fingerprint(spec)}"
        spec["folder"] = str(restamped.get(named, root / named))
        specs.append(spec)
    return specs


# -- Runs named by the byte digests of their code, adopted without a rebuild ----------------------------
# Until 2026-12-06 a run's fingerprint held the SHA-256 of every source file the GRPO and evaluation steps
# imported, so a comment renamed every run.  `restamp` proves, for each finished run, that its folder's name
# is that old fingerprint of exactly the code of a commit, and records its name under today's fingerprint
# of that same commit's code in RESTAMPED (beside the runs): `plan` then finds the run under its old name.
RESTAMPED = "restamped.json"


def _restamped(root: Path) -> dict[str, Path]:
    path = Path(root) / RESTAMPED
    if not path.exists():
        return {}
    return {new: Path(root) / entry["folder"] for new, entry in read_json(path).items()
            if (Path(root) / entry["folder"]).is_dir()}


def legacy_fingerprint(spec: dict, inputs_sha256: dict[str, str]) -> str:
    """The fingerprint a run had when its code was named by file bytes ({path: SHA-256} of the GRPO and
    evaluation steps' recorded files, data included)."""
    return _named_by(spec, {"inputs_sha256": inputs_sha256})


def restamp_runs(specs: list[dict], inputs_sha256: dict[str, str], sources, commit: str) -> list[tuple[str, str]]:
    """Record each finished run of `specs` whose folder is named by the old fingerprint of the code of
    `commit` (inputs_sha256: that commit's files, checked by the caller) under the new fingerprint of the
    same commit's code (`sources`); returns [(old folder, new name)].  A run under no such name is left
    alone (it is missing, or stale, as before)."""
    out = []
    code = code_digest(sources)
    by_root: dict[Path, dict] = {}
    for spec in specs:
        root = Path(spec["folder"]).parent
        old = root / f"{spec['name']}-{legacy_fingerprint(spec, inputs_sha256)}"
        if not RunFolder(old).is_finished():
            continue
        table = by_root.setdefault(root, read_json(root / RESTAMPED) if (root / RESTAMPED).exists() else {})
        new = f"{spec['name']}-{fingerprint(spec, code)}"
        table[new] = {"folder": old.name, "restamped_from": commit}
        out.append((old.name, new))
    for root, table in by_root.items():
        write_json(root / RESTAMPED, dict(sorted(table.items())))
    return out


def run_sweep(specs: list[dict], *, workers: int = 2, scheduler: str | None = None, progress: bool = True) -> list[dict]:
    """Run the missing runs of `specs` in parallel; finished ones are read, not rerun."""
    todo = [s for s in specs if not _done(s)]
    if progress:
        for s in specs:
            if s not in todo:
                print(f"{s['name']}: finished, read from {Path(s['folder']).name}", flush=True)
    if not todo:
        return []
    summaries, failures = [], []
    if scheduler is not None:
        from distributed import Client, as_completed as dask_completed

        with Client(scheduler) as client:
            futures = client.map(run_one, todo, pure=False)
            names = {f.key: s["name"] for f, s in zip(futures, todo)}
            try:
                for future in dask_completed(futures):
                    _collect(future, names[future.key], summaries, failures, progress)
            except BaseException:  # Ctrl-C or a lost scheduler: the runs not yet started never start
                client.cancel(futures, force=True)
                raise
    else:  # a process per run (`labkit.lab.workers`): a worker's death fails its run alone, none outlives the sweep
        from ..lab.workers import run_in_processes

        for spec, summary, error in run_in_processes(run_one, todo, workers):
            if error is None:
                summaries.append(_report(summary, progress))
            else:
                failures.append((spec["name"], error))
                if progress:
                    print(f"{spec['name']}: FAILED ({error})", flush=True)
    if failures:  # the other runs went on and are kept; a rerun reads them and retries only these
        raise SweepFailed(f"{len(failures)} sweep run(s) failed (the others are kept; rerun the same command to retry "
                          "these): " + "; ".join(f"{name}: {error}" for name, error in failures))
    return summaries


class SweepFailed(RunFolderError):
    """Some runs of a sweep failed; each is named with its error in one line, and the finished ones are kept."""


def _collect(future, name: str, summaries: list, failures: list, progress: bool) -> None:
    """A Dask future's outcome: its summary, or (name, "ErrorName: message") among the failures."""
    try:
        summaries.append(_report(future.result(), progress))
    except Exception as err:  # noqa: BLE001  (reported by name with the others, after every run has ended)
        failures.append((name, f"{type(err).__name__}: {err}"))
        if progress:
            print(f"{name}: FAILED ({type(err).__name__}: {err})", flush=True)


def retire_stale(specs: list[dict]) -> list[Path]:
    """Move aside the folders of earlier fingerprints of these runs (same name, other digest: built by
    code or inputs that changed since) to runs/<preset>/stale/sweep/; returns where they went.

    Only names of `specs` are touched, so another sweep file's runs in the same folder stay."""
    import re
    import shutil

    moved = []
    for spec in specs:
        folder = Path(spec["folder"])
        for old in sorted(folder.parent.glob(f"{spec['name']}-*")):
            if old != folder and old.is_dir() and re.fullmatch(re.escape(spec["name"]) + r"-[0-9a-f]{12}", old.name):
                aside = preset_folder(spec["preset"], "stale", "sweep", old.name)
                aside.parent.mkdir(parents=True, exist_ok=True)
                if aside.exists():
                    shutil.rmtree(aside)
                shutil.move(str(old), aside)
                moved.append(aside)
    return moved


def _done(spec: dict) -> bool:
    folder = Path(spec["folder"])
    return RunFolder(folder).is_finished() and (not spec.get("evaluate", True)
                                                or RunFolder(folder / "evaluation" / "grpo").is_finished())


def _report(summary: dict, progress: bool) -> dict:
    if progress:
        what = " and ".join(w for w, done in (("trained", summary["trained"]), ("evaluated", summary["evaluated"]))
                            if done) or "nothing to do"
        print(f"{summary['name']}: {what} in {summary['seconds']:.0f} s", flush=True)
    return summary


FIRST_UPDATE_KEYS = ("ratio/min", "ratio/max", "ratio/mean", "clip_ratio/region_mean")
"""what the results keep of a mismatched run's first update each iteration (its ratio is 1 without a mismatch)"""


CURVE_KEYS = ("reward", "optimised_reward", "frac_reward_zero_std", "optimised/frac_reward_zero_std", "entropy",
              "completions/mean_length", "kl", "clip_ratio/region_mean", "valid_json")
"""the logged values every run keeps per iteration in the results file"""


def curves_of(history: list[dict]) -> dict:
    """A run's curves for the results file: CURVE_KEYS per iteration, and what a variant logged on top
    (DAPO's dynamic sampling and overlong filtering; a mismatched sampler's gap and first-update ratios)."""
    curves = {key: [h[key] for h in history] for key in CURVE_KEYS}
    for key in ("dynamic_sampling", "overlong_filtered", "sampler_mismatch"):
        if key in history[0]:
            curves[key] = [h[key] for h in history]
    if "sampler_mismatch" in history[0]:
        curves["first_update"] = [{k: h["updates"][0][k] for k in FIRST_UPDATE_KEYS} for h in history]
    return curves


WORKED_CURVE_KEYS = ("think_rate", "accuracy", "mean_tokens", "optimised_reward", "kl", "entropy", "grad_norm")
"""what a worked run keeps per iteration in the results file"""


def collect_results(specs: list[dict], out: str | Path | None = None) -> dict:
    """Scoring phase: every run's evaluation (Wilson intervals, ID50/OOD100/ALL) and its curves; a worked run's
    curves and its test profile's summary (the profile's rows stay in the run's profile.json.gz)."""
    from ..eval import evaluate

    if specs and all(s.get("task") == "worked" for s in specs):
        results = {"format": "labkit sweep results v1", "task": "worked", "runs": {}}
        for spec in specs:
            folder = Path(spec["folder"])
            history = read_checked_json(folder / "history.json")
            results["runs"][spec["name"]] = {
                "folder": folder.name, "options": spec["options"], "start": spec["start"],
                "config": {"G": spec["G"], "iterations": spec["iterations"], **spec.get("config_overrides", {})},
                "curves": {key: [h[key] for h in history] for key in WORKED_CURVE_KEYS},
                "test_profile": RunFolder(folder).manifest()["test_profile"]}
        if out is not None:
            write_results(out, results)
        return results
    labels = evaluate.load_test_labels(phase=evaluate.SCORING_PHASE)
    results = {"format": "labkit sweep results v1", "runs": {}}
    # A run whose history.json is not kept (the ablations commit only their partner's) keeps the curves
    # the committed results file already holds for that very folder; nothing else is ever reused.
    earlier = read_results(out)["runs"] if out is not None and Path(out).is_file() else {}
    for spec in specs:
        folder = Path(spec["folder"])
        entry = {"folder": folder.name, "options": spec["options"], "start": spec.get("start", "warm_start")}
        if (folder / "history.json").is_file():
            entry["curves"] = curves_of(read_checked_json(folder / "history.json"))
        elif earlier.get(spec["name"], {}).get("folder") == folder.name:
            entry["curves"] = earlier[spec["name"]]["curves"]
        else:
            raise FileNotFoundError(f"{folder / 'history.json'} is missing and {out} holds no curves for "
                                    f"{folder.name}: retrain the run (delete its folder and rerun the sweep)")
        entry["evaluation"] = evaluate.score_policy(folder / "evaluation" / "grpo", labels)
        results["runs"][spec["name"]] = entry
    if out is not None:
        write_results(out, results)
    return results
