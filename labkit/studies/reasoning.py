"""RL that teaches the model to reason (issue 41, chapter 11): GRPO on worked answers from each thinking base.

    python -m labkit reasoning --preset tiny        # -> runs/tiny/reasoning/<run>/

Each run is GRPO through the lab's own loop (`labkit.grpo.loop`: its `Loop`, its advantages, its update
with the clipped surrogate, the exact per-prefix KL to the frozen start and the pre-update check,
the variants' length penalty), on the worked variant of the task
(`labkit.task.worked`): the prompts are chains of k = 1 ... 8 movements (GRPO's pool:
`thinking_base.TRAIN_SEED`, 100 chains per k), a response may work before it answers, and it is
scored by `worked.score_worked`.  What differs from the protocol's loop is only what a worked
answer needs: the prompts, the verifier, the response limit (`worked.WORKED_MAX_NEW_TOKENS`)
and the reward the run optimises (`REWARDS`):

    outcome           1 when the final object holds the target and the response keeps every rule
    process           the share of the chain's movements whose step is written right, in order
                      (right_steps / max(k, steps written)); a direct answer earns 0
    process_guarded   the process reward, zeroed for a malformed response (the source design's
                      format guard: no reward without a valid final object)

The true reward (`reward`, the outcome) is recorded for every response whatever the run optimises.

Each run is 40 iterations of 16 chains x G = 8 at rate 1e-4 (`ReasoningConfig`): chapter 10's format
base went from 7.5% to 99.4% valid answers under a smaller budget, so selecting a behaviour a base
shows a few times in a hundred needs no more; it stays within the 45 CPU minutes a run may take.

Per iteration the history logs the share of responses that think, their mean length, the true
accuracy, and both per k; every `measure_every` iterations the policy's think profile on the fixed
validation chains (the checkpoint curve).  At the end, the policy's profile on the test chains
(`thinking_base.TEST_SEED`, 25 chains per k, `profile_draws` draws each: the same chains and seeds
as its base's profile, so before and after are paired).

Each run is trained by the lab's one GRPO loop (`labkit.grpo.loop.run_grpo` with `worked_task`, a
`labkit.grpo.tasks.Task`), so its folder is every GRPO run's (autosaved states, Ctrl-C finishing the
iteration, `--resume` bit for bit) with chapter 11's rows: `history.json`, `rollouts.jsonl.gz` (one
row per response: rollout id, iteration, problem id, `problem` {initial, movements}, text, finish
reason, tokens, true reward, optimised reward, advantage, think flag, steps, steps right, category;
not the token ids, so that the committed cache stays under its 50 MB), `timings.jsonl.gz`,
`checkpoints.jsonl` (the validation profiles), `profile.json.gz`, `manifest.json`, FINISHED;
`model.safetensors` stays local (its digest is in the manifest).  The updates score each prompt
once and the responses in buckets of similar length (`labkit.models.shared_prompt`).
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..lab.runs import RunFolder, UnfinishedRunError, atomic_write_bytes, display_path, preset_folder, sha256_file, write_json
from ..lab.skeleton import refuse_earlier_attempt
from ..lab.runtime import deterministic
from ..task import worked
from ..config import TINY, ReasoningConfig
from ..models import shared_prompt
from ..grpo import core, losses
from ..grpo.loop import CHECKPOINTS_PART, _earlier_attempt, newest_state, run_grpo, start_loop
from ..grpo import variants
from ..grpo.tasks import Task
from ..grpo.variants import Variant
from ..eval import think_profile
from . import thinking_base

MODEL_FILE = "model.safetensors"


def right_steps(verdict: worked.WorkedVerdict, chain: worked.Chain) -> int:
    """How many of the chain's movements have their step written right and in order: step i starts from
    the true stock after i movements, adds or takes the i-th movement, and states the right result."""
    levels = [chain.initial] + chain.levels()
    return sum(1 for i, s in enumerate(verdict.steps[:len(chain.movements)])
               if s.a == levels[i] and s.movement == chain.movements[i] and s.right)


def outcome_reward(verdict: worked.WorkedVerdict, chain: worked.Chain) -> float:
    return float(verdict.reward)


def process_reward(verdict: worked.WorkedVerdict, chain: worked.Chain) -> float:
    return right_steps(verdict, chain) / max(len(chain.movements), len(verdict.steps))


def guarded_process_reward(verdict: worked.WorkedVerdict, chain: worked.Chain) -> float:
    return 0.0 if verdict.category == "malformed" else process_reward(verdict, chain)


REWARDS = {"outcome": outcome_reward, "process": process_reward, "process_guarded": guarded_process_reward}


@dataclass(frozen=True)
class ReasoningRun:
    """One GRPO run: from which thinking base, on which reward, with which length penalty."""

    name: str
    base: str
    reward: str = "outcome"
    length_penalty: float = 0.0
    """the variants' penalty: reward - length_penalty x (response tokens / WORKED_MAX_NEW_TOKENS)"""

    def __post_init__(self):
        if self.reward not in REWARDS:
            raise ValueError(f"reasoning run {self.name!r}: reward {self.reward!r}, expected one of {sorted(REWARDS)}")
        if self.base not in thinking_base.BASES:
            raise ValueError(f"reasoning run {self.name!r}: base {self.base!r}, expected one of {thinking_base.BASES}")


RUNS = (
    ReasoningRun("from_rare_0", "rare_0"),
    ReasoningRun("from_rare_2", "rare_2"),
    ReasoningRun("from_rare_10", "rare_10"),
    ReasoningRun("from_control", "control"),
    ReasoningRun("rare_2_length_penalty", "rare_2", length_penalty=0.5),
    ReasoningRun("rare_2_process", "rare_2", reward="process"),
    ReasoningRun("rare_2_process_guarded", "rare_2", reward="process_guarded"),
)
RUN_NAMES = tuple(r.name for r in RUNS)


def get_run(name: str) -> ReasoningRun:
    for r in RUNS:
        if r.name == name:
            return r
    raise ValueError(f"unknown reasoning run {name!r}; expected one of {RUN_NAMES}")


def preset_config(cfg: ReasoningConfig):
    """The tiny preset's config with the worked runs' budget (the loss's settings stay the protocol's)."""
    return replace(TINY, prompts_per_iteration=cfg.prompts_per_iteration, grpo_iterations=cfg.iterations,
                   grpo_lr=cfg.lr, max_new_tokens=worked.WORKED_MAX_NEW_TOKENS)


def chain_pool(per_k: int) -> list[dict]:
    """GRPO's prompts: {"id", "k", "problem"} for the held-out train chains of each k (`per_k` drawn, none in
    any base's documents; "problem" is the chain), less any that shares its permutation key with a validation
    or test chain (one k = 1 chain of the 800 is a validation chain's): RL never trains on a problem it is
    measured on."""
    measured = {worked.chain_key(c) for seed, n in ((thinking_base.VALIDATION_SEED, thinking_base.MEASURE_CHAINS_PER_K),
                                                    (thinking_base.TEST_SEED, thinking_base.PROFILE_CHAINS_PER_K))
                for chains in thinking_base.held_out_chains(seed, n).values() for c in chains}
    chains = thinking_base.held_out_chains(thinking_base.TRAIN_SEED, per_k)
    return [{"id": f"k{k}-{i:03d}", "k": k, "problem": c} for k in sorted(chains) for i, c in enumerate(chains[k])
            if worked.chain_key(c) not in measured]


# The static sampler (`labkit.models.static_sampler`): the same tokens as the others for the same seeds, and on worked
# answers (about 66 tokens a response) 3.4 times as fast as the fast sampler here (`python -m labkit bench grpo`).
SAMPLER = "static"


def rollout_rows(s: core.Sampled, iteration: int) -> list[dict]:
    """One row per response: enough to recompute its verdict and its reward from the text alone."""
    rows = []
    chains = [p for p in s.chosen for _ in range(len(s.groups[0].rollouts))]
    optimised = s.optimised.reshape(-1).tolist()
    for i, (p, r, v) in enumerate(zip(chains, s.rollouts, s.verdicts)):
        rows.append({"rollout_id": r.rollout_id, "iteration": iteration, "problem_id": p["id"], "k": p["k"],
                     "problem": {"initial": p["problem"].initial, "movements": list(p["problem"].movements)},
                     "text": r.text, "finish_reason": r.finish_reason, "tokenization_valid": r.tokenization_valid,
                     "tokens": len(r.response_ids), "reward": v.reward, "reason": v.reason,
                     "optimised_reward": optimised[i], "advantage": float(s.advantages[i]),
                     "thinks": v.thinks, "steps": len(v.steps), "steps_right": v.steps_right, "category": v.category})
    return rows


def _share(part: list[dict], key: str) -> float | None:
    return sum(bool(r[key]) for r in part) / len(part) if part else None


def iteration_figures(rows: list[dict]) -> dict:
    """The share of an iteration's responses that work the problem out, their mean length, the share right."""
    return {"think_rate": _share(rows, "thinks"), "accuracy": _share(rows, "reward"),
            "mean_tokens": sum(r["tokens"] for r in rows) / len(rows)}


def iteration_record(rows: list[dict], updates: list[dict], check: dict, iteration: int) -> dict:
    """The history's line: think rate, mean length, true accuracy (overall and per k), the update's figures."""
    share = _share
    ks = sorted({r["k"] for r in rows})
    return {"iteration": iteration, **iteration_figures(rows),
            "optimised_reward": sum(r["optimised_reward"] for r in rows) / len(rows),
            "per_k": {str(k): {"responses": len([r for r in rows if r["k"] == k]),
                               "think_rate": share([r for r in rows if r["k"] == k], "thinks"),
                               "accuracy": share([r for r in rows if r["k"] == k], "reward")} for k in ks},
            "categories": {c: sum(r["category"] == c for r in rows) for c in worked.CATEGORIES},
            "logprob_check/max_abs_diff": check["max_abs_diff"],
            **{k: updates[-1][k] for k in ("kl", "entropy", "grad_norm", "learning_rate", "clip_ratio/region_mean")}}


def record(loop: core.Loop, iteration: int, s: core.Sampled, updates: list[dict], check: dict) -> tuple[dict, list[dict]]:
    """The task's record (`labkit.grpo.tasks`): iteration counts from 0 in the loop, from 1 in the files."""
    rows = rollout_rows(s, iteration + 1)
    # the share of groups with no signal, as the protocol's record has it (the reasoning sweep reads it)
    silent = float(losses.zero_variance_groups(s.optimised).float().mean())
    return {**iteration_record(rows, updates, check, iteration + 1), "optimised/frac_reward_zero_std": silent}, rows


def postfix(record: dict) -> dict:
    """The progress bar's figures of a worked iteration."""
    return {"think": f"{record['think_rate']:.2f}", "acc": f"{record['accuracy']:.2f}",
            "tokens": f"{record['mean_tokens']:.0f}"}


class ValidationProfiles:
    """The run's checkpoint curve: the policy's think profile on the fixed validation chains (2 draws each,
    their own seeds), before the first iteration, every `measure_every` iterations and after the last.
    It reads the policy only (`labkit.grpo.tasks`), so a run trains the same weights with or without it."""

    def __init__(self, loop: core.Loop, total_iterations: int, every: int):
        self.loop, self.total, self.every = loop, total_iterations, every
        self.chains = thinking_base.held_out_chains(thinking_base.VALIDATION_SEED, thinking_base.MEASURE_CHAINS_PER_K)

    def maybe_measure(self, folder: RunFolder, iteration: int, at_start: bool = False) -> float:
        if at_start and iteration != 0:
            return 0.0
        if not (iteration == 0 or iteration % self.every == 0 or iteration == self.total):
            return 0.0
        t0 = time.perf_counter()
        summary, _ = thinking_base.measure(self.loop.model, self.loop.tokenizer, self.chains, 2,
                                           thinking_base.VALIDATION_SEED)
        folder.append(CHECKPOINTS_PART, [{"iteration": iteration, **summary}])
        return time.perf_counter() - t0


def worked_task(run: ReasoningRun, cfg: ReasoningConfig) -> Task:
    """The worked task for the one GRPO loop (`labkit.grpo.tasks`): the chain pool and its worked prompts,
    `worked.score_worked`, the run's reward, chapter 11's records, its validation profiles, and at the end
    its test profile (profile.json.gz: the same chains and seeds as its base's profile, so paired)."""

    def pool(tokenizer, config) -> tuple[list[dict], dict[str, list[int]]]:
        chains = chain_pool(cfg.train_chains_per_k)
        return chains, {p["id"]: think_profile.worked_prompt_ids(tokenizer, p["problem"]) for p in chains}

    def finish(folder: RunFolder, loop: core.Loop) -> dict:
        with deterministic("cpu", warn_only=True):
            summary, profile_rows = thinking_base.measure(
                loop.model, loop.tokenizer,
                thinking_base.held_out_chains(thinking_base.TEST_SEED, thinking_base.PROFILE_CHAINS_PER_K),
                cfg.profile_draws, thinking_base.TEST_SEED)
        atomic_write_bytes(folder / "profile.json.gz", gzip.compress(json.dumps(
            {"summary": summary, "table": think_profile.profile(profile_rows), "rows": profile_rows},
            sort_keys=True).encode(), mtime=0))
        folder.register("profile.json.gz")
        return {"run": asdict(run), "reasoning_config": asdict(cfg), "test_profile": summary}

    return Task(step="reasoning", pool=pool, verify=worked.score_worked, reward=REWARDS[run.reward], record=record,
                checkpoints=lambda loop, total: ValidationProfiles(loop, total, cfg.measure_every), postfix=postfix,
                finish=finish, identity={"task": "stock-arithmetic-worked", "run": asdict(run),
                                         "reasoning_config": asdict(cfg)})


def new_loop(run: ReasoningRun, cfg: ReasoningConfig, start: Path) -> core.Loop:
    """The one GRPO loop's start on the worked task (`labkit.grpo.loop.start_loop`), as `train` starts it."""
    config = preset_config(cfg)
    return start_loop(config, cfg.G, cfg.iterations, start, SAMPLER, "cpu",
                      variants.resolve(Variant(length_penalty=run.length_penalty), config), shared_prompts=True,
                      task=worked_task(run, cfg), bucket_tokens=shared_prompt.BUCKET_TOKENS)


def sample_iteration(loop: core.Loop, iteration: int) -> core.Sampled:
    """One iteration's groups, as the loop samples them (`core.sample_iteration`, the static sampler)."""
    return core.sample_iteration(loop, iteration, SAMPLER)


def default_run_dir(preset: str, name: str) -> Path:
    return preset_folder(preset, "reasoning") / name


def base_model(preset: str, base: str) -> Path:
    """The finished thinking base's model file (refused when missing, unfinished, edited or damaged)."""
    base_folder = RunFolder(thinking_base.default_run_dir(preset, base))
    base_folder.manifest()
    base_folder.check_file(thinking_base.MODEL_FILE)
    return base_folder / thinking_base.MODEL_FILE


def train(name: str, preset: str = "tiny", cfg: ReasoningConfig | None = None, *, overwrite: bool = False,
          progress: bool = True, run_dir: Path | None = None, resume: bool = False, restart: bool = False,
          stop_after: int | None = None, kl_coef: float | None = None, task: Task | None = None) -> dict:
    """One reasoning run into runs/<preset>/reasoning/<name>/ (or `run_dir`) by the lab's one GRPO loop
    (`labkit.grpo.loop.run_grpo` with `worked_task`): its folder, autosaves, Ctrl-C and exact resume are
    every GRPO run's.  resume, restart, stop_after: as `run_grpo`'s.  kl_coef: another beta than the
    protocol's (a live run's); task: the worked task with another record hook (`labkit.live`).  Returns the
    manifest (a summary when stopped early)."""
    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: the thinking bases are the tiny preset's")
    run, cfg = get_run(name), cfg or ReasoningConfig()
    config = preset_config(cfg) if kl_coef is None else replace(preset_config(cfg), kl_coef=kl_coef)
    return run_grpo(config, run_dir or default_run_dir(preset, name), G=cfg.G, iterations=cfg.iterations,
                    stop_after=stop_after, resume=resume, restart=restart, sampler=SAMPLER,
                    start_file=base_model(preset, run.base), device="cpu", overwrite=overwrite, progress=progress,
                    variant=Variant(length_penalty=run.length_penalty), shared_prompts=True,
                    task=task or worked_task(run, cfg), bucket_tokens=shared_prompt.BUCKET_TOKENS)


def _worker(job: tuple[str, str, int, bool, bool]) -> tuple[str, float]:
    """One run in a worker process of `threads` torch threads (spawned: nothing shared with the parent)."""
    name, preset, threads, resume, restart = job
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    train(name, preset, progress=False, resume=resume, restart=restart)
    return name, time.perf_counter() - t0


def is_finished(name: str, preset: str = "tiny") -> bool:
    return (default_run_dir(preset, name) / "FINISHED").is_file()


def run_all(preset: str = "tiny", *, only: tuple[str, ...] | None = None, workers: int = 2, threads: int = 1,
            progress: bool = True, resume: bool = False, restart: bool = False) -> dict[str, float]:
    """Every run in `only` (default: all) not yet finished, `workers` at a time (`labkit.lab.workers`: a
    worker never outlives the command); returns {run: seconds}.  resume, restart: for every run that holds
    an unfinished attempt (without either, such a run is refused in one line, before any work); a run not
    yet begun simply starts."""
    from ..lab.workers import each_result

    for name in only or ():
        get_run(name)  # an unknown name is refused before any work
    names = [n for n in RUN_NAMES if (not only or n in only) and not is_finished(n, preset)]
    jobs = []
    for name in names:  # each run's attempt decided before any work
        folder = RunFolder(default_run_dir(preset, name))
        attempt, state = _earlier_attempt(folder), newest_state(folder)
        refuse_earlier_attempt(folder, attempt, resume, restart)
        if resume and attempt and state is None:
            raise UnfinishedRunError(f"{display_path(folder.path)} holds an unfinished attempt ({attempt}) but no "
                                     "saved state to resume from: pass --restart to delete it and start afresh")
        jobs.append((name, preset, threads, resume and state is not None, restart))
    times = {}
    for _, (name, seconds) in each_result(_worker, jobs, workers, what="reasoning runs",
                                          command=f"python -m labkit reasoning --preset {preset} --resume"):
        times[name] = seconds
        if progress:
            print(f"reasoning: {name} done in {seconds:.0f} s", flush=True)
    if all_finished(preset):
        write_step_manifest(preset)
    return times


def write_step_manifest(preset: str = "tiny") -> dict:
    """runs/<preset>/reasoning/manifest.json: every finished run's manifest digest (the step is built when it exists)."""
    root = preset_folder(preset, "reasoning")
    manifest = {"step": "reasoning", "preset": preset,
                "runs": {n: sha256_file(root / n / "manifest.json") for n in RUN_NAMES}}
    write_json(root / "manifest.json", manifest)
    return manifest


def all_finished(preset: str = "tiny") -> bool:
    return all(is_finished(n, preset) for n in RUN_NAMES)


def is_built(preset: str = "tiny") -> bool:
    return (preset_folder(preset, "reasoning") / "manifest.json").is_file()
