"""What each piece of GRPO is for: the ablation runs, read, summarised and compared in pairs (issue 40).

`sweeps/ablations.json` removes or changes one piece of GRPO at a time.  Every run starts from the
warm start at one budget (16 prompts x G = 8 a iteration, 40 iterations, rate 1e-4: the cheapest
row of labkit/studies/larger_run.py's validation table that beats the warm start), with the same prompt
order and sampling seeds as its partner `grpo`, so that a pair differs only in the piece named.
`python -m labkit sweep sweeps/ablations.json` trains and evaluates what is missing, into
runs/<preset>/sweep/ablations/<name>-<fingerprint>/ (labkit.studies.sweep).

    ablations.load()                   {name: Run} of the committed runs (checked finished)
    ablations.summary(run)             the numbers a chapter quotes about one run
    ablations.compare(a, b)            paired tests of b against a: test per draw and greedy (200
                                       problems), validation per draw at the last checkpoint (64)
    ablations.table()                  one row per run against `grpo_16x8` (the results page's table)
    ablations.seed_spread(method)      three training seeds of one method: the spread an effect must beat

Each chapter's predict-then-run question is answered from these by labkit.book.exercises.reveal.

Every comparison is paired (labkit.eval.paired): the same problems, the same evaluation seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..lab.runs import REPO_ROOT, RunFolder, read_json
from ..eval import paired

SWEEP_FILE = REPO_ROOT / "sweeps" / "ablations.json"
PARTNER = "grpo_16x8"  # GRPO at the sweep's budget (the protocol's run is `grpo`)
LAST_ITERATIONS = 10  # "at the end" of a run: the mean over its last 10 iterations' logged values

# What each run changes against `grpo_16x8`, in the words of the chapters and the results page, grouped by
# the chapter where the piece lives.
CHANGES = {
    "mean_only": (3, "no division by the group's std (A = r - mean: Dr. GRPO's advantage, without its constant sum)"),
    "updates_1": (4, "1 update per batch (the ratio is exactly 1: the clip cannot act)"),
    "updates_2_clip_0p99": (4, "2 updates per batch, clip widened to 0.99 (it almost never binds)"),
    "updates_4": (4, "4 updates per batch, clip 0.2"),
    "updates_4_clip_0p99": (4, "4 updates per batch, clip 0.99"),
    "updates_16": (4, "16 updates per batch, clip 0.2"),
    "updates_16_clip_0p99": (4, "16 updates per batch, clip 0.99"),
    "updates_16_rate_3e-4": (4, "16 updates per batch, clip 0.2, rate 3e-4"),
    "updates_16_clip_0p99_rate_3e-4": (4, "16 updates per batch, clip 0.99, rate 3e-4"),
    "beta_0": (5, "KL coefficient 0 (no leash)"),
    "beta_0p2": (5, "KL coefficient 0.2"),
    "beta_1": (5, "KL coefficient 1"),
    "beta_5": (5, "KL coefficient 5"),
    "split_64x2": (8, "64 prompts x G = 2 (the same 128 rollouts an iteration)"),
    "split_32x4": (8, "32 prompts x G = 4"),
    "split_8x16": (8, "8 prompts x G = 16"),
    "grpo_16x8_seed_2": (6, "GRPO, training seed 2"),
    "grpo_16x8_seed_3": (6, "GRPO, training seed 3"),
    "rft_16x8": (6, "RFT (fine-tune on its own right answers)"),
    "rft_16x8_seed_2": (6, "RFT, training seed 2"),
    "rft_16x8_seed_3": (6, "RFT, training seed 3"),
    "sft_16x8": (6, "SFT on the solver's answers to the same prompts"),
    "sft_16x8_seed_2": (6, "SFT, training seed 2"),
    "sft_16x8_seed_3": (6, "SFT, training seed 3"),
    "no_baseline": (3, "no baseline: A = r, the raw 0/1 reward (REINFORCE)"),
    "rloo": (3, "leave-one-out baseline: A = r - mean of the other G - 1 (RLOO)"),
    # the objectives of issue 43 (the appendix "The objectives people use now")
    "clip_higher": (9, "clip-higher: ratio clipped to [0.8, 1.28] (DAPO's epsilons)"),
    "token_mean": (9, "one token mean over the batch (DAPO's aggregation)"),
    "dr_grpo": (9, "no std, sum over tokens / (B x 64): Dr. GRPO, both its changes"),
    "dapo": (9, "DAPO: clip-higher, token mean, overlong filtering, dynamic sampling"),
    "gspo": (9, "GSPO: one ratio per response, clipped to [1 - 3e-4, 1 + 4e-4]"),
    "cispo": (9, "CISPO: capped, detached weight min(rho, 1.28) on every token, token mean"),
    "k1_beta_1": (9, "KL coefficient 1, k1 on the sampled tokens in the loss"),
    "k2_beta_1": (9, "KL coefficient 1, k2 on the sampled tokens in the loss"),
    "k3_beta_1": (9, "KL coefficient 1, k3 on the sampled tokens in the loss"),
    # a sampler that computes its probabilities differently from the trainer (issue 43)
    "bf16_sampler": (9, "sampler with bfloat16 weights, logp_old = the sampler's"),
    "bf16_trainer_old": (9, "sampler with bfloat16 weights, logp_old recomputed by the trainer"),
    "bf16_tis": (9, "sampler with bfloat16 weights, logp_old recomputed, truncated importance sampling (C = 2)"),
    "fp8_sampler": (9, "sampler with float8 weights, logp_old = the sampler's"),
    "fp8_trainer_old": (9, "sampler with float8 weights, logp_old recomputed by the trainer"),
    "fp8_tis": (9, "sampler with float8 weights, logp_old recomputed, truncated importance sampling (C = 2)"),
}
# the KL-estimator runs' partner on the leash: the exact KL at the same coefficient
KL_ESTIMATOR_PARTNER = "beta_1"
SEEDS = {"grpo": ("grpo_16x8", "grpo_16x8_seed_2", "grpo_16x8_seed_3"),
         "rft": ("rft_16x8", "rft_16x8_seed_2", "rft_16x8_seed_3"),
         "sft": ("sft_16x8", "sft_16x8_seed_2", "sft_16x8_seed_3")}


@dataclass(frozen=True)
class Run:
    """One finished ablation run: its name, folder and what the sweep gave it."""

    name: str
    folder: Path
    G: int
    prompts_per_iteration: int
    updates_per_iteration: int
    clip_eps: float
    kl_coef: float
    lr: float
    iterations: int

    @property
    def evaluation(self) -> Path:
        return self.folder / "evaluation" / "grpo"

    def history(self) -> list[dict]:
        """Per iteration: "iteration" and the logged values the chapters use (sweep.collect_results' curves)."""
        return _history(self.folder)

    def checkpoints(self) -> list[dict]:
        return _checkpoints(self.folder)


@lru_cache(maxsize=None)
def _history(folder: Path) -> list[dict]:
    """The run's curves from the sweep's results file (results-ablations.json.gz, written by
    `sweep.collect_results` from each run's history.json): the runs' own history.json files are not
    committed, except the partner's, against which tests/test_ablations.py checks the copy."""
    curves = _results(folder.parent)["runs"]
    entry = next((e for e in curves.values() if e["folder"] == folder.name), None)
    if entry is None:
        raise FileNotFoundError(f"{folder.name} is not in {folder.parent / RESULTS_FILE}; rerun "
                                "`python -m labkit sweep sweeps/ablations.json`")
    columns = entry["curves"]
    length = len(columns["kl"])
    return [{"iteration": i + 1, **{key: values[i] for key, values in columns.items()}} for i in range(length)]


RESULTS_FILE = "results-ablations.json.gz"


@lru_cache(maxsize=None)
def _results(root: Path) -> dict:
    from .sweep import read_results

    return read_results(root / RESULTS_FILE)


@lru_cache(maxsize=None)
def _checkpoints(folder: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (folder / "checkpoints.jsonl").read_text().splitlines() if line.strip()]


def specs(preset: str = "tiny") -> list[dict]:
    """The sweep's planned runs, as `python -m labkit sweep sweeps/ablations.json` plans them."""
    from . import sweep

    return sweep.plan(preset, sweep.load_runs(SWEEP_FILE, preset), settings=sweep.load_settings(SWEEP_FILE),
                      root=sweep.sweep_root(SWEEP_FILE, preset), starts=sweep.load_starts(SWEEP_FILE))


def load(preset: str = "tiny", names: tuple[str, ...] | None = None) -> dict[str, Run]:
    """{name: Run} of the runs of sweeps/ablations.json (all, or `names`), each checked finished and
    evaluated under its current fingerprint (else FileNotFoundError naming the run and the command
    that builds it)."""
    from . import sweep
    from ..config import get_preset

    out = {}
    planned = specs(preset)
    unknown = sorted(set(names or ()) - {s["name"] for s in planned})
    if unknown:
        raise ValueError(f"no ablation run named {unknown}; the sweep's runs: {[s['name'] for s in planned]}")
    for spec in planned:
        if names is not None and spec["name"] not in names:
            continue
        if not sweep._done(spec):
            raise FileNotFoundError(f"ablation run {spec['name']!r} is not built for this code "
                                    f"({Path(spec['folder']).name}); run `python -m labkit sweep sweeps/ablations.json`")
        config = get_preset(preset).with_overrides(**spec["config_overrides"])
        updates = spec["options"]["updates_per_iteration"] or config.updates_per_iteration
        out[spec["name"]] = Run(spec["name"], Path(spec["folder"]), spec["G"], config.prompts_per_iteration,
                                updates, config.clip_eps, config.kl_coef, config.grpo_lr, spec["iterations"])
    return out


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def summary(run: Run) -> dict:
    """The numbers the chapters quote about one run.

    test_per_draw, test_greedy: the evaluation's rates on the 200 test problems (4 seeded draws, greedy);
    validation_per_draw: the last fixed-prompt checkpoint's (64 validation problems x 4 draws);
    kl_end, clip_end, zero_signal, entropy_end: means over the last LAST_ITERATIONS iterations' logs of
    the exact KL per token to the warm start, the share of response tokens whose ratio left the clip
    range, the share of groups whose rewards were all equal, the sampled tokens' entropy;
    kl_max, clip_max: the largest of those over the run; zero_signal_all: the mean over every iteration."""
    history = run.history()
    tail = history[-LAST_ITERATIONS:]
    return {
        **evaluation_summary(run.evaluation),
        "validation_per_draw": run.checkpoints()[-1]["sampled_success"],
        "kl_end": _mean(h["kl"] for h in tail), "kl_max": max(h["kl"] for h in history),
        "clip_end": _mean(h["clip_ratio/region_mean"] for h in tail),
        "clip_max": max(h["clip_ratio/region_mean"] for h in history),
        "zero_signal": _mean(h["frac_reward_zero_std"] for h in tail),
        "zero_signal_all": _mean(h["frac_reward_zero_std"] for h in history),
        "entropy_end": _mean(h["entropy"] for h in tail),
        "valid_json_end": _mean(h["valid_json"] for h in tail),
    }


def evaluation_summary(folder: str | Path) -> dict:
    """{"test_per_draw" (with its Wilson 95% "test_per_draw_ci" and its "test_per_draw_counts", (right, draws)),
    "test_greedy"}: an evaluated policy's success on the 200 test problems."""
    return dict(_evaluation_summary(Path(folder)))


@lru_cache(maxsize=None)  # a finished evaluation never changes: read and score it once per process
def _evaluation_summary(folder: Path) -> dict:
    from ..eval import evaluate

    scored = evaluate.score_policy(folder, list(_labels()))
    return {"test_per_draw": scored["sample"]["ALL"]["success_rate"],
            "test_per_draw_ci": tuple(scored["sample"]["ALL"]["success_rate_ci"]),
            "test_per_draw_counts": (scored["sample"]["ALL"]["correct"], scored["sample"]["ALL"]["responses"]),
            "test_greedy": scored["greedy"]["ALL"]["success_rate"]}


@lru_cache(maxsize=1)
def _labels() -> tuple:
    from ..eval import evaluate

    return tuple(evaluate.load_test_labels(phase=evaluate.SCORING_PHASE))


def compare(a: Run | Path, b: Run, names: tuple[str, str] | None = None) -> dict:
    """Paired tests of `b` against `a` (a Run, or an evaluation folder such as the warm start's):
    {"test_sample", "test_greedy"} from paired.compare_policies on the 200 test problems, and, when both
    are runs, {"validation"}: paired.compare_checkpoints of their last fixed-prompt checkpoints.
    Finished runs never change, so each comparison is computed once per process."""
    import copy

    return copy.deepcopy(_compare(a if isinstance(a, Run) else Path(a), b, names))


@lru_cache(maxsize=None)
def _compare(a: Run | Path, b: Run, names: tuple[str, str] | None = None) -> dict:
    a_eval = a.evaluation if isinstance(a, Run) else Path(a)
    names = names or (a.name if isinstance(a, Run) else a_eval.name, b.name)
    test = paired.compare_policies(a_eval, b.evaluation, list(_labels()), names=names)
    out = {"test_sample": test["sample"], "test_greedy": test["greedy"]}
    if isinstance(a, Run):
        out["validation"] = paired.compare_checkpoints(a.checkpoints()[-1], b.checkpoints()[-1], names)["sample"]
    return out


def warm_start_evaluation(preset: str = "tiny") -> Path:
    """The warm start's evaluation folder (the same 200 problems and seeds as every run's)."""
    from ..lab.runs import preset_folder

    folder = preset_folder(preset, "evaluation", "warm_start")
    if not RunFolder(folder).is_finished():
        raise FileNotFoundError(f"{folder} is not finished; build the cache (`make cache`)")
    return folder


def table(preset: str = "tiny") -> list[dict]:
    """One row per run against `grpo_16x8`: what it changes, its summary, the paired tests' differences and
    p-values (test per draw, validation per draw; `*_p_is_bound` where a Monte-Carlo p sits at the
    smallest value its resamples can give, so that the true p may be smaller)."""
    runs = load(preset)
    partner = runs[PARTNER]
    rows = []
    for name, run in runs.items():
        row = {"name": name, "chapter": CHANGES.get(name, (0, ""))[0],
               "changes": CHANGES.get(name, (0, "full GRPO (the partner of every pair)"))[1], **summary(run)}
        if name != PARTNER:
            c = compare(partner, run)
            row.update({"test_difference": c["test_sample"]["mean_difference"], "test_p": c["test_sample"]["p_permutation"],
                        "test_p_is_bound": paired.at_floor(c["test_sample"]["p_permutation"],
                                                           c["test_sample"]["p_permutation_method"]),
                        "validation_p_is_bound": paired.at_floor(c["validation"]["p_permutation"],
                                                                 c["validation"]["p_permutation_method"]),
                        "validation_difference": c["validation"]["mean_difference"],
                        "validation_p": c["validation"]["p_permutation"]})
        rows.append(row)
    return rows


def seed_spread(method: str, preset: str = "tiny") -> dict:
    """Three training seeds of `method` ("grpo", "rft" or "sft"): their test per-draw rates and right draws (of
    "draws"), the spread (largest minus smallest rate) and the paired test of each other seed against the first."""
    if method not in SEEDS:
        raise ValueError(f"method {method!r}: expected one of {sorted(SEEDS)}")
    runs = load(preset, SEEDS[method])
    seeds = [runs[name] for name in SEEDS[method]]
    rates = [summary(r)["test_per_draw"] for r in seeds]
    counts = [summary(r)["test_per_draw_counts"] for r in seeds]
    tests = [compare(seeds[0], other)["test_sample"] for other in seeds[1:]]
    return {"names": [r.name for r in seeds], "test_per_draw": rates, "spread": max(rates) - min(rates),
            "right": [c[0] for c in counts], "draws": counts[0][1],
            "p_against_first": [t["p_permutation"] for t in tests]}


def gradient_study_results(preset: str = "tiny") -> dict:
    """runs/<preset>/gradient_study/results.json (labkit.studies.gradient_study), checked against its FINISHED digest."""
    from ..lab.runs import RunFolder, preset_folder, sha256_file

    folder = preset_folder(preset, "gradient_study")
    if not RunFolder(folder).is_finished():
        raise FileNotFoundError(f"{folder} is not built; run `python -m labkit gradient-study`")
    finished = read_json(folder / "FINISHED")
    if sha256_file(folder / "results.json") != finished["results_sha256"]:
        raise ValueError(f"{folder / 'results.json'} does not match the digest in its FINISHED marker")
    return read_json(folder / "results.json")


OBJECTIVE_RUNS = ("clip_higher", "token_mean", "dr_grpo", "dapo", "gspo", "cispo")  # against PARTNER
KL_ESTIMATOR_RUNS = ("k1_beta_1", "k2_beta_1", "k3_beta_1")  # against KL_ESTIMATOR_PARTNER (the exact KL)
MISMATCH_RUNS = ("bf16_sampler", "bf16_trainer_old", "bf16_tis", "fp8_sampler", "fp8_trainer_old", "fp8_tis")


def paired_rows(names: tuple[str, ...], partner: str, preset: str = "tiny") -> list[dict]:
    """For each run of `names`, against `partner`: {"name", "changes", its `summary`, "train_seconds" (its
    manifest's: the training's wall time on the machine that built it), "difference" and
    "p" (test per draw, paired permutation), "verdict" (the paired test in words), "p_is_bound"}."""
    runs = load(preset, (partner, *names))
    rows = []
    for name in names:
        c = compare(runs[partner], runs[name])["test_sample"]
        rows.append({"name": name, "changes": CHANGES[name][1], **summary(runs[name]),
                     "train_seconds": read_json(runs[name].folder / "manifest.json")["seconds"],
                     "difference": c["mean_difference"], "p": c["p_permutation"], "verdict": c["verdict"],
                     "p_is_bound": paired.at_floor(c["p_permutation"], c["p_permutation_method"])})
    return rows


def dynamic_sampling_account(run: Run) -> dict:
    """What DAPO's switches did over a run, from its logged accounts (labkit.grpo.variants): the mean number of
    extra draws an iteration, the prompts drawn beyond the batch's P, the iterations that hit the cap and
    kept silent groups, and the responses the overlong filter took out of the loss."""
    history = run.history()
    if "dynamic_sampling" not in history[0]:
        raise ValueError(f"run {run.name!r} did not use dynamic sampling")
    accounts = [h["dynamic_sampling"] for h in history]
    return {"iterations": len(accounts), "rounds_mean": _mean(a["rounds"] for a in accounts),
            "extra_prompts": sum(a["prompts_drawn"] - run.prompts_per_iteration for a in accounts),
            "capped_iterations": sum(a["silent_kept"] > 0 for a in accounts),
            "silent_kept": sum(a["silent_kept"] for a in accounts),
            "overlong_filtered": sum(h.get("overlong_filtered", 0) for h in history)}


def mismatch_account(run: Run) -> dict:
    """What a sampler that differs from the trainer did over a run (`labkit.grpo.variants`' sampler_weights), from
    its logged values: the gap |log pi_trainer - log pi_sampler| per token (the mean of each iteration's mean,
    the largest of any token), the first update's ratio (its smallest and largest over the run, the mean
    share of tokens outside the clip range) and, with truncated importance sampling, the mean weight and the
    mean share of tokens whose weight the cap cut."""
    history = run.history()
    if "sampler_mismatch" not in history[0]:
        raise ValueError(f"run {run.name!r} sampled with the trainer's own weights: no mismatch was logged")
    gaps, first = [h["sampler_mismatch"] for h in history], [h["first_update"] for h in history]
    account = {"iterations": len(history), "gap_mean": _mean(g["mean_abs_diff"] for g in gaps),
               "gap_max": max(g["max_abs_diff"] for g in gaps),
               "first_ratio_min": min(f["ratio/min"] for f in first), "first_ratio_max": max(f["ratio/max"] for f in first),
               "first_clipped": _mean(f["clip_ratio/region_mean"] for f in first)}
    if "tis_weight_mean" in gaps[0]:
        account.update(tis_weight_mean=_mean(g["tis_weight_mean"] for g in gaps),
                       tis_capped=_mean(g["tis_capped"] for g in gaps))
    return account


SCHEME_WORDS = {"none": "raw reward", "mean": "group mean", "mean_std": "mean and std",
                "leave_one_out": "leave-one-out"}


def format_rate(x: float) -> str:
    """A learning rate as the chapters write it: 1e-4, 3e-4."""
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"
