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

Files: `history.json`, `rollouts.jsonl.gz` (one row per response: iteration, problem id, `problem`
{initial, movements}, text, finish reason, tokens, true reward, optimised reward, advantage, think
flag, steps, steps right, category), `checkpoints.json`, `profile.json.gz`, `manifest.json`,
FINISHED; `model.safetensors` stays local (its digest is in the manifest).
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..lab.runs import REPO_ROOT, RunFolder, sha256_file, atomic_write_bytes, preset_folder, write_json
from ..lab.runtime import code_digests, deterministic, environment, seed_everything
from ..task import worked
from ..config import TINY, ReasoningConfig
from ..models import presets, sampling, shared_prompt
from ..grpo import core
from ..grpo.loop import load_roles
from ..grpo import variants
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
    """GRPO's prompts: {"id", "k", "chain"} for the held-out train chains of each k (`per_k` drawn, none in
    any base's documents), less any that shares its permutation key with a validation or test chain (one
    k = 1 chain of the 800 is a validation chain's): RL never trains on a problem it is measured on."""
    measured = {worked.chain_key(c) for seed, n in ((thinking_base.VALIDATION_SEED, thinking_base.MEASURE_CHAINS_PER_K),
                                                    (thinking_base.TEST_SEED, thinking_base.PROFILE_CHAINS_PER_K))
                for chains in thinking_base.held_out_chains(seed, n).values() for c in chains}
    chains = thinking_base.held_out_chains(thinking_base.TRAIN_SEED, per_k)
    return [{"id": f"k{k}-{i:03d}", "k": k, "chain": c} for k in sorted(chains) for i, c in enumerate(chains[k])
            if worked.chain_key(c) not in measured]


def new_loop(run: ReasoningRun, cfg: ReasoningConfig, start: Path) -> core.Loop:
    """The lab's loop on the worked task: policy and reference from `start`, AdamW, the chain pool."""
    config = preset_config(cfg)
    seed_everything(config.seed)
    model, reference, tokenizer, digest = load_roles(config, start, "cpu")
    pool = chain_pool(cfg.train_chains_per_k)
    resolved = variants.resolve(Variant(length_penalty=run.length_penalty), config)
    identity = {"task": "stock-arithmetic-worked", "run": asdict(run), "reasoning_config": asdict(cfg),
                "start_digest": digest, "pool_ids": [p["id"] for p in pool], "torch_threads": torch.get_num_threads()}
    return core.Loop(
        config=config, G=cfg.G, model=model, reference=reference, tokenizer=tokenizer,
        optimizer=torch.optim.AdamW(model.parameters(), lr=config.grpo_lr, weight_decay=config.grpo_weight_decay),
        pool=pool, prompts={p["id"]: think_profile.worked_prompt_ids(tokenizer, p["chain"]) for p in pool},
        order=core.PromptOrder(len(pool), config.seed + core.PROMPT_ORDER_SEED_OFFSET),
        generation=torch.Generator().manual_seed(config.seed + core.GENERATION_SEED_OFFSET),
        identity=identity, total_updates=cfg.iterations * resolved.updates_per_iteration, reference_digest=digest,
        resolved=resolved, shared_prompts=True, bucket_tokens=shared_prompt.BUCKET_TOKENS)


# The static sampler (`labkit.models.static_sampler`): the same tokens as the others for the same seeds, and on worked
# answers (about 66 tokens a response) 3.4 times as fast as the fast sampler here (`python -m labkit bench grpo`).
SAMPLER = "static"


def sample_iteration(loop: core.Loop, iteration: int, reward) -> core.Sampled:
    """G worked responses to each of the next P chains (the static sampler, one call), scored by the worked
    verifier; the run's reward, the variant's optimised reward and the group advantages."""
    chosen, seeds = core.draw_prompts(loop)
    t0 = time.perf_counter()
    G = loop.G
    rollouts = sampling.get_sampler(SAMPLER)(
        loop.model, loop.tokenizer, [loop.prompts[p["id"]] for p in chosen for _ in range(G)], seeds,
        max_new_tokens=worked.WORKED_MAX_NEW_TOKENS, problem_ids=[p["id"] for p in chosen for _ in range(G)],
        rollout_ids=[f"{stem}-{j}" for stem in core.group_stems(chosen, G, iteration) for j in range(G)],
        policy_digest=presets.parameter_digest(loop.model))
    groups = []
    for k, p in enumerate(chosen):
        mine = rollouts[k * G:(k + 1) * G]
        verdicts = [worked.score_worked(r.text, r.finish_reason, p["chain"], r.tokenization_valid) for r in mine]
        groups.append(sampling.Group(problem_id=p["id"], prompt_ids=loop.prompts[p["id"]], rollouts=mine,
                                     verdicts=verdicts, rewards=[reward(v, p["chain"]) for v in verdicts]))
    optimised = loop.resolved.optimised_reward(groups)  # (P, G): the run's reward, minus any length penalty
    return core.Sampled(chosen=chosen, groups=groups, optimised=optimised,
                        advantages=loop.resolved.advantages(optimised).reshape(-1), seconds=time.perf_counter() - t0)


def rollout_rows(s: core.Sampled, iteration: int) -> list[dict]:
    """One row per response: enough to recompute its verdict and its reward from the text alone."""
    rows = []
    chains = [p for p in s.chosen for _ in range(len(s.groups[0].rollouts))]
    optimised = s.optimised.reshape(-1).tolist()
    for i, (p, r, v) in enumerate(zip(chains, s.rollouts, s.verdicts)):
        rows.append({"iteration": iteration, "problem_id": p["id"], "k": p["k"],
                     "problem": {"initial": p["chain"].initial, "movements": list(p["chain"].movements)},
                     "text": r.text, "finish_reason": r.finish_reason, "tokenization_valid": r.tokenization_valid,
                     "tokens": len(r.response_ids), "reward": v.reward, "reason": v.reason,
                     "optimised_reward": optimised[i], "advantage": float(s.advantages[i]),
                     "thinks": v.thinks, "steps": len(v.steps), "steps_right": v.steps_right, "category": v.category})
    return rows


def iteration_record(rows: list[dict], updates: list[dict], check: dict, iteration: int, seconds: dict) -> dict:
    """The history's line: think rate, mean length, true accuracy (overall and per k), the update's figures."""
    def share(part, key):
        return sum(bool(r[key]) for r in part) / len(part) if part else None

    ks = sorted({r["k"] for r in rows})
    return {"iteration": iteration, "think_rate": share(rows, "thinks"), "accuracy": share(rows, "reward"),
            "mean_tokens": sum(r["tokens"] for r in rows) / len(rows),
            "optimised_reward": sum(r["optimised_reward"] for r in rows) / len(rows),
            "per_k": {str(k): {"responses": len([r for r in rows if r["k"] == k]),
                               "think_rate": share([r for r in rows if r["k"] == k], "thinks"),
                               "accuracy": share([r for r in rows if r["k"] == k], "reward")} for k in ks},
            "categories": {c: sum(r["category"] == c for r in rows) for c in worked.CATEGORIES},
            "logprob_check/max_abs_diff": check["max_abs_diff"],
            **{k: updates[-1][k] for k in ("kl", "entropy", "grad_norm", "learning_rate", "clip_ratio/region_mean")},
            "seconds": seconds}


def default_run_dir(preset: str, name: str) -> Path:
    return preset_folder(preset, "reasoning") / name


def train(name: str, preset: str = "tiny", cfg: ReasoningConfig | None = None, *, overwrite: bool = False,
          progress: bool = True) -> dict:
    """One reasoning run, start to end, into runs/<preset>/reasoning/<name>/; returns its manifest."""
    from tqdm import tqdm

    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: the thinking bases are the tiny preset's")
    run, cfg = get_run(name), cfg or ReasoningConfig()
    base_folder = RunFolder(thinking_base.default_run_dir(preset, run.base))
    base_folder.manifest()  # refuses a base that is missing, unfinished, edited or damaged
    base_folder.check_file(thinking_base.MODEL_FILE)
    start = base_folder / thinking_base.MODEL_FILE
    folder = RunFolder(default_run_dir(preset, name)).open_for_writing(overwrite)
    folder.clear((MODEL_FILE, "history.json", "history.partial.jsonl", "rollouts.jsonl.gz", "checkpoints.json",
                  "profile.json.gz", "manifest.json"))
    began = time.perf_counter()
    with deterministic("cpu", warn_only=True):
        loop = new_loop(run, cfg, start)
        validation = thinking_base.held_out_chains(thinking_base.VALIDATION_SEED, thinking_base.MEASURE_CHAINS_PER_K)
        checkpoints, all_rows = [], []

        def checkpoint(iteration: int) -> None:
            summary, _ = thinking_base.measure(loop.model, loop.tokenizer, validation, 2, thinking_base.VALIDATION_SEED)
            checkpoints.append({"iteration": iteration, **summary})

        checkpoint(0)
        reward = REWARDS[run.reward]
        bar = tqdm(range(cfg.iterations), desc=f"reasoning {name}", disable=not progress, mininterval=5)
        for it in bar:
            t0 = time.perf_counter()
            s = sample_iteration(loop, it + 1, reward)
            t1 = time.perf_counter()
            updates, check = core.update_iteration(loop, s)
            rows = rollout_rows(s, it + 1)
            record = iteration_record(rows, updates, check, it + 1,
                                      {"sampling": s.seconds, "update": time.perf_counter() - t1,
                                       "iteration": time.perf_counter() - t0})
            loop.history.append(record)
            all_rows += rows
            with open(folder / "history.partial.jsonl", "a") as f:  # to follow a run in a worker process
                f.write(json.dumps(record) + "\n")
            bar.set_postfix(think=f"{record['think_rate']:.2f}", acc=f"{record['accuracy']:.2f}",
                            tokens=f"{record['mean_tokens']:.0f}")
            if (it + 1) % cfg.measure_every == 0 or it + 1 == cfg.iterations:
                checkpoint(it + 1)
        bar.close()
        trained = time.perf_counter() - began
        summary, profile_rows = thinking_base.measure(
            loop.model, loop.tokenizer, thinking_base.held_out_chains(thinking_base.TEST_SEED,
                                                                      thinking_base.PROFILE_CHAINS_PER_K),
            cfg.profile_draws, thinking_base.TEST_SEED)
    presets.save_model(loop.model, folder / MODEL_FILE)
    write_json(folder / "history.json", loop.history)
    (folder / "history.partial.jsonl").unlink(missing_ok=True)
    write_json(folder / "checkpoints.json", checkpoints)
    atomic_write_bytes(folder / "rollouts.jsonl.gz", gzip.compress(
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in all_rows).encode(), mtime=0))
    atomic_write_bytes(folder / "profile.json.gz", gzip.compress(json.dumps(
        {"summary": summary, "table": think_profile.profile(profile_rows), "rows": profile_rows},
        sort_keys=True).encode(), mtime=0))
    manifest = {"step": "reasoning", "run": asdict(run), "config": asdict(cfg), "preset": preset,
                "start_model": {"file": str(start.relative_to(REPO_ROOT)), "parameter_digest": loop.identity["start_digest"]},
                "final_digest": presets.parameter_digest(loop.model), "test_profile": summary,
                "code_sha256": code_digests(), "environment": environment("cpu"),
                "times": {"train_seconds": trained, "total_seconds": time.perf_counter() - began}}
    for file in (MODEL_FILE, "history.json", "checkpoints.json", "rollouts.jsonl.gz", "profile.json.gz"):
        folder.register(file)
    manifest["ledger"] = folder.ledger()
    write_json(folder / "manifest.json", manifest)
    folder.mark_finished({"think_rate": summary["think_rate"], "accuracy": summary["accuracy"]})
    return manifest


def _worker(job: tuple[str, str, int]) -> tuple[str, float]:
    """One run in a worker process of `threads` torch threads (spawned: nothing shared with the parent)."""
    name, preset, threads = job
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    train(name, preset, progress=False)
    return name, time.perf_counter() - t0


def is_finished(name: str, preset: str = "tiny") -> bool:
    return (default_run_dir(preset, name) / "FINISHED").is_file()


def run_all(preset: str = "tiny", *, only: tuple[str, ...] | None = None, workers: int = 2, threads: int = 1,
            progress: bool = True) -> dict[str, float]:
    """Every run in `only` (default: all) not yet finished, `workers` at a time; returns {run: seconds}."""
    import concurrent.futures
    import multiprocessing

    for name in only or ():
        get_run(name)  # an unknown name is refused before any work
    names = [n for n in RUN_NAMES if (not only or n in only) and not is_finished(n, preset)]
    times = {}
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, workers), mp_context=context) as pool:
        for name, seconds in pool.map(_worker, [(n, preset, threads) for n in names]):
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
