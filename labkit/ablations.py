"""What each piece of GRPO is for: the ablation runs, read, summarised and compared in pairs (issue 40).

`sweeps/ablations.json` removes or changes one piece of GRPO at a time.  Every run starts from the
warm start at one budget (16 prompts x G = 8 a iteration, 40 iterations, rate 1e-4: the cheapest
row of labkit/larger_run.py's validation table that beats the warm start), with the same prompt
order and sampling seeds as its partner `grpo`, so that a pair differs only in the piece named.
`python -m labkit sweep sweeps/ablations.json` trains and evaluates what is missing, into
runs/<preset>/sweep/ablations/<name>-<fingerprint>/ (labkit.sweep).

    ablations.load()                   {name: Run} of the committed runs (checked finished)
    ablations.summary(run)             the numbers a chapter quotes about one run
    ablations.compare(a, b)            paired tests of b against a: test per draw and greedy (200
                                       problems), validation per draw at the last checkpoint (64)
    ablations.table()                  one row per run against `grpo` (the results page's table)
    ablations.seed_spread(method)      three training seeds of one method: the spread an effect must beat

Every comparison is paired (labkit.paired): the same problems, the same evaluation seeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import paired
from .runs import REPO_ROOT, RunFolder, read_json

SWEEP_FILE = REPO_ROOT / "sweeps" / "ablations.json"
PARTNER = "grpo"
LAST_ITERATIONS = 10  # "at the end" of a run: the mean over its last 10 iterations' logged values

# What each run changes against `grpo`, in the words of the chapters and the results page, grouped by
# the chapter where the piece lives.
CHANGES = {
    "mean_only": (3, "no division by the group's std (A = r - mean: Dr. GRPO)"),
    "updates_1": (4, "1 update per batch (the ratio is exactly 1: the clip cannot act)"),
    "updates_2_no_clip": (4, "2 updates per batch, no clip"),
    "updates_4": (4, "4 updates per batch, clip 0.2"),
    "updates_4_no_clip": (4, "4 updates per batch, no clip"),
    "updates_16": (4, "16 updates per batch, clip 0.2"),
    "updates_16_no_clip": (4, "16 updates per batch, no clip"),
    "updates_16_rate_3e-4": (4, "16 updates per batch, clip 0.2, rate 3e-4"),
    "updates_16_no_clip_rate_3e-4": (4, "16 updates per batch, no clip, rate 3e-4"),
    "beta_0": (5, "KL coefficient 0 (no leash)"),
    "beta_0p2": (5, "KL coefficient 0.2"),
    "beta_1": (5, "KL coefficient 1"),
    "beta_5": (5, "KL coefficient 5"),
    "split_64x2": (8, "64 prompts x G = 2 (the same 128 rollouts an iteration)"),
    "split_32x4": (8, "32 prompts x G = 4"),
    "split_8x16": (8, "8 prompts x G = 16"),
    "grpo_seed_2": (6, "GRPO, training seed 2"),
    "grpo_seed_3": (6, "GRPO, training seed 3"),
    "rft": (6, "RFT (fine-tune on its own right answers)"),
    "rft_seed_2": (6, "RFT, training seed 2"),
    "rft_seed_3": (6, "RFT, training seed 3"),
    "sft": (6, "SFT on the solver's answers to the same prompts"),
    "sft_seed_2": (6, "SFT, training seed 2"),
    "sft_seed_3": (6, "SFT, training seed 3"),
}
SEEDS = {"grpo": ("grpo", "grpo_seed_2", "grpo_seed_3"), "rft": ("rft", "rft_seed_2", "rft_seed_3"),
         "sft": ("sft", "sft_seed_2", "sft_seed_3")}


@dataclass(frozen=True)
class Run:
    """One finished ablation run: its name, folder and what the sweep gave it."""

    name: str
    folder: Path
    group_size: int
    prompts_per_iteration: int
    updates_per_iteration: int
    clip_eps: float
    kl_coef: float
    lr: float

    @property
    def evaluation(self) -> Path:
        return self.folder / "evaluation" / "grpo"

    def history(self) -> list[dict]:
        return _history(self.folder)

    def checkpoints(self) -> list[dict]:
        return _checkpoints(self.folder)


@lru_cache(maxsize=None)
def _history(folder: Path) -> list[dict]:
    return read_json(folder / "history.json")


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
    from .config import get_preset

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
        out[spec["name"]] = Run(spec["name"], Path(spec["folder"]), spec["group_size"], config.prompts_per_iteration,
                                updates, config.clip_eps, config.kl_coef, config.grpo_lr)
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
    """{"test_per_draw", "test_greedy"}: an evaluated policy's success on the 200 test problems."""
    from . import evaluate

    scored = evaluate.score_policy(Path(folder), list(_labels()))
    return {"test_per_draw": scored["sample"]["ALL"]["success_rate"],
            "test_greedy": scored["greedy"]["ALL"]["success_rate"]}


@lru_cache(maxsize=1)
def _labels() -> tuple:
    from . import evaluate

    return tuple(evaluate.load_test_labels(phase=evaluate.SCORING_PHASE))


def compare(a: Run | Path, b: Run, names: tuple[str, str] | None = None) -> dict:
    """Paired tests of `b` against `a` (a Run, or an evaluation folder such as the warm start's):
    {"test_sample", "test_greedy"} from paired.compare_policies on the 200 test problems, and, when both
    are runs, {"validation"}: paired.compare_checkpoints of their last fixed-prompt checkpoints."""
    a_eval = a.evaluation if isinstance(a, Run) else Path(a)
    names = names or (a.name if isinstance(a, Run) else a_eval.name, b.name)
    test = paired.compare_policies(a_eval, b.evaluation, list(_labels()), names=names)
    out = {"test_sample": test["sample"], "test_greedy": test["greedy"]}
    if isinstance(a, Run):
        out["validation"] = paired.compare_checkpoints(a.checkpoints()[-1], b.checkpoints()[-1], names)["sample"]
    return out


def warm_start_evaluation(preset: str = "tiny") -> Path:
    """The warm start's evaluation folder (the same 200 problems and seeds as every run's)."""
    from .runs import preset_folder

    folder = preset_folder(preset, "evaluation", "warm_start")
    if not RunFolder(folder).is_finished():
        raise FileNotFoundError(f"{folder} is not finished; build the cache (`make cache`)")
    return folder


def table(preset: str = "tiny") -> list[dict]:
    """One row per run against `grpo`: what it changes, its summary, the paired tests' differences and
    p-values (test per draw, validation per draw), and the warm start's row first."""
    runs = load(preset)
    partner = runs[PARTNER]
    rows = []
    for name, run in runs.items():
        row = {"name": name, "chapter": CHANGES.get(name, (0, ""))[0],
               "changes": CHANGES.get(name, (0, "full GRPO (the partner of every pair)"))[1], **summary(run)}
        if name != PARTNER:
            c = compare(partner, run)
            row.update({"test_difference": c["test_sample"]["mean_difference"], "test_p": c["test_sample"]["p_permutation"],
                        "validation_difference": c["validation"]["mean_difference"],
                        "validation_p": c["validation"]["p_permutation"]})
        rows.append(row)
    return rows


def seed_spread(method: str, preset: str = "tiny") -> dict:
    """Three training seeds of `method` ("grpo", "rft" or "sft"): their test per-draw rates, the spread
    (largest minus smallest) and the paired test of each other seed against the first."""
    if method not in SEEDS:
        raise ValueError(f"method {method!r}: expected one of {sorted(SEEDS)}")
    runs = load(preset, SEEDS[method])
    seeds = [runs[name] for name in SEEDS[method]]
    rates = [summary(r)["test_per_draw"] for r in seeds]
    tests = [compare(seeds[0], other)["test_sample"] for other in seeds[1:]]
    return {"names": [r.name for r in seeds], "test_per_draw": rates, "spread": max(rates) - min(rates),
            "p_against_first": [t["p_permutation"] for t in tests]}


# -- Predict, then run: each chapter's question, measured from the committed files ---------------------
#
# Each `reveal_*` prints the measurement with its paired tests, then compares the student's prediction
# (labkit.exercises.check_prediction) and says why the runs came out as they did; it returns the
# checker's {"prediction", "measured", "right"}.  Every number in the words is computed here.


def gradient_study_results(preset: str = "tiny") -> dict:
    from .runs import RunFolder, preset_folder, sha256_file

    folder = preset_folder(preset, "gradient_study")
    if not RunFolder(folder).is_finished():
        raise FileNotFoundError(f"{folder} is not built; run `python -m labkit gradient-study`")
    finished = read_json(folder / "FINISHED")
    if sha256_file(folder / "results.json") != finished["results_sha256"]:
        raise ValueError(f"{folder / 'results.json'} does not match the digest in its FINISHED marker")
    return read_json(folder / "results.json")


IDENTITY_CHOICES = ("stays the same", "halves", "falls to a quarter")


def reveal_identity(prediction, preset: str = "tiny") -> dict:
    """Chapter 2: from 16 to 64 sampled tokens, what happens to the score-function estimate's error?"""
    from .exercises import check_prediction

    case = gradient_study_results(preset)["identity"]["cases"][-1]  # the case where the warm start is unsure
    sizes, errors = case["sizes"], case["none"]["rms_error"]
    ratio = errors[sizes.index(16)] / errors[sizes.index(64)]
    measured = IDENTITY_CHOICES[0] if ratio < 1.5 else IDENTITY_CHOICES[1] if ratio < 3 else IDENTITY_CHOICES[2]
    scaled = [e * n ** 0.5 for e, n in zip(errors, sizes)]
    print(f"Problem {case['problem_id']}: the warm start gives the right first digit probability "
          f"{case['p_right']:.2f}; the exact gradient's norm is {case['exact_norm']:.3f}.")
    print("N: " + ", ".join(f"{n}: error {e:.4f}" for n, e in zip(sizes, errors))
          + f"; error x sqrt(N) stays between {min(scaled):.3f} and {max(scaled):.3f}.")
    print(f"Bias (the mean of {gradient_study_results(preset)['identity']['trials']:,} estimates minus the exact gradient) "
          f"at N = {sizes[-1]}: {case['none']['bias'][-1]:.5f}.")
    return check_prediction(prediction, measured, choices=IDENTITY_CHOICES, why=(
        f"each estimate averages N independent terms r(a)(onehot(a) - pi) whose mean is the exact gradient, so "
        f"its error is their spread over sqrt(N): 4 times the samples, half the error (measured ratio {ratio:.2f})."))


SCHEME_WORDS = {"none": "raw reward", "mean": "group mean", "mean_std": "mean and std",
                "leave_one_out": "leave-one-out"}


def reveal_baseline(prediction, preset: str = "tiny") -> dict:
    """Chapter 3: which advantage gives the cleanest gradient at the warm start?"""
    from .exercises import check_prediction

    study = gradient_study_results(preset)
    noise = study["noise"]
    schemes = noise["schemes"]
    best = max(schemes, key=lambda s: schemes[s]["snr"])
    print(f"{noise['batches']} batches of {noise['P']} prompts x G = {noise['G']} from the warm start "
          f"({noise['zero_signal']:.0%} of their groups had no signal); reference: "
          f"{noise['reference_batches']} other batches.")
    for s, v in schemes.items():
        print(f"  {SCHEME_WORDS[s]:<14} signal-to-noise {v['snr']:.3f}   cosine with the reference {v['cosine']:.2f}")
    cases = study["identity"]["cases"]
    sure, unsure = cases[0], cases[-1]
    at = sure["sizes"].index(16)
    runs = load(preset, (PARTNER, "mean_only"))
    c = compare(runs[PARTNER], runs["mean_only"], names=("GRPO", "mean only"))
    print(f"Training, {c['test_sample']['n_problems']} test problems x 4 draws: A = r - mean against GRPO's "
          f"(r - mean)/std: {c['test_sample']['verdict']}.")
    return check_prediction(prediction, SCHEME_WORDS[best], choices=tuple(SCHEME_WORDS.values()), why=(
        f"a baseline only helps where it makes the terms smaller.  A wrong answer's tokens were sampled at low "
        f"probability, so their gradients are large; a baseline pushes every wrong answer down with them, the raw "
        f"0/1 reward leaves them out.  The one-token game shows both sides at N = 16: where the warm start is sure "
        f"(p = {sure['p_right']:.2f}) the raw reward's error is {sure['none']['rms_error'][at]:.4f} against "
        f"{sure['leave_one_out']['rms_error'][at]:.4f} with leave-one-out; where it is unsure (p = "
        f"{unsure['p_right']:.2f}), {unsure['none']['rms_error'][at]:.4f} against "
        f"{unsure['leave_one_out']['rms_error'][at]:.4f}.  What GRPO's baseline buys is a loss whose winners and "
        f"losers balance, not a quieter gradient at this start."))


CLIP_CHOICES = ("better", "worse", "not separable")


def _call(comparison: dict, alpha: float = paired.ALPHA) -> str:
    if comparison["p_permutation"] >= alpha:
        return CLIP_CHOICES[2]
    return CLIP_CHOICES[0] if comparison["mean_difference"] > 0 else CLIP_CHOICES[1]


def reveal_clip(prediction, preset: str = "tiny") -> dict:
    """Chapter 4: with 16 updates per batch at 3e-4, what does widening the clip to 0.99 do on the test?"""
    from .exercises import check_prediction

    runs = load(preset, ("updates_4", "updates_4_clip_0p99", "updates_16", "updates_16_clip_0p99",
                         "updates_16_rate_3e-4", "updates_16_clip_0p99_rate_3e-4"))
    for clip, wide in (("updates_4", "updates_4_clip_0p99"), ("updates_16", "updates_16_clip_0p99"),
                       ("updates_16_rate_3e-4", "updates_16_clip_0p99_rate_3e-4")):
        a, b = summary(runs[clip]), summary(runs[wide])
        c = compare(runs[clip], runs[wide], names=("clip 0.2", "clip 0.99"))["test_sample"]
        print(f"{runs[clip].updates_per_iteration} updates per batch at {runs[clip].lr:g}: tokens clipped at the end "
              f"{a['clip_end']:.1%} (clip 0.2) and {b['clip_end']:.1%} (0.99); KL at the end {a['kl_end']:.4f} and "
              f"{b['kl_end']:.4f}; test per draw {a['test_per_draw']:.1%} and {b['test_per_draw']:.1%} "
              f"(paired p = {c['p_permutation']:.2g})")
    fast, fast_wide = runs["updates_16_rate_3e-4"], runs["updates_16_clip_0p99_rate_3e-4"]
    c = compare(fast, fast_wide, names=("clip 0.2", "clip 0.99"))["test_sample"]
    against_start = compare(warm_start_evaluation(preset), fast, names=("warm start", "16 updates, clip 0.2"))
    print(f"Against the warm start, 16 updates at 3e-4 with the clip: {against_start['test_sample']['verdict']}.")
    s, w = summary(fast), summary(fast_wide)
    return check_prediction(prediction, _call(c), choices=CLIP_CHOICES, why=(
        f"with the clip, the ratio of {s['clip_end']:.1%} of the tokens left [0.8, 1.2] at the end and their "
        f"gradient was cut; with clip 0.99 the ratio could go to 1.99 ({w['clip_end']:.1%} clipped).  Paired on "
        f"the test, widening the clip: {c['verdict']}."))


def reveal_leash(prediction, preset: str = "tiny") -> dict:
    """Chapter 5: the smallest KL coefficient that halves the end-of-run KL of the run without a leash."""
    from .exercises import check_prediction

    runs = load(preset, ("beta_0", PARTNER, "beta_0p2", "beta_1", "beta_5"))
    betas = [("beta_0", 0.0), (PARTNER, runs[PARTNER].kl_coef), ("beta_0p2", 0.2), ("beta_1", 1.0), ("beta_5", 5.0)]
    free = summary(runs["beta_0"])["kl_end"]
    measured, protocol_share, separable = None, None, []
    for name, beta in betas:
        s = summary(runs[name])
        c = compare(runs["beta_0"], runs[name], names=("no leash", f"beta {beta:g}"))["test_sample"] if beta else None
        print(f"beta {beta:<5g} KL at the end {s['kl_end']:.4f} ({s['kl_end'] / free:.0%} of no leash's), test per "
              f"draw {s['test_per_draw']:.1%}" + (f"; against no leash: p = {c['p_permutation']:.2g}" if c else ""))
        if measured is None and beta > 0 and s["kl_end"] <= free / 2:
            measured = beta
        if name == PARTNER:
            protocol_share = s["kl_end"] / free
        if c and c["p_permutation"] < paired.ALPHA:
            separable.append(f"beta {beta:g} ({'ahead' if c['mean_difference'] > 0 else 'behind'}, "
                             f"p = {c['p_permutation']:.2g})")
    tested = ("on the test, " + ", ".join(separable) + " differs from no leash at p < 0.05"
              if separable else "on the test, no beta differs from no leash at p < 0.05")
    return check_prediction(prediction, measured, choices=(0.02, 0.2, 1.0, 5.0), why=(
        f"the penalty pulls with beta times the KL's gradient.  At the protocol's beta the run ends with "
        f"{protocol_share:.0%} of the free run's KL: at this budget the leash does not bind; the KL halves only "
        f"once beta reaches {measured:g}.  On success: {tested}."))


def reveal_seeds(prediction, preset: str = "tiny") -> dict:
    """Chapter 6: three GRPO runs that differ only in their training seed: the spread of their test success."""
    from .exercises import check_prediction

    spreads = {m: seed_spread(m, preset) for m in SEEDS}
    for m, s in spreads.items():
        print(f"{m.upper():<5} test per draw by seed: " + ", ".join(f"{r:.1%}" for r in s["test_per_draw"])
              + f"; spread {100 * s['spread']:.1f} points")
    g = spreads["grpo"]
    return check_prediction(prediction, round(100 * g["spread"], 1), tolerance=1.0, low=0.0, high=100.0, why=(
        f"each seed draws other prompts in another order and samples other rollouts: the same method lands "
        f"{100 * g['spread']:.1f} points apart.  An ablation's effect smaller than that is not told apart from a "
        "lucky seed by one run of each."))


def reveal_separable(prediction, preset: str = "tiny") -> dict:
    """Chapter 7: of the three pairs of GRPO seeds, how many are separable at p < 0.05 on the test?"""
    from itertools import combinations

    from .exercises import check_prediction

    runs = load(preset, SEEDS["grpo"])
    count = 0
    for a, b in combinations(SEEDS["grpo"], 2):
        c = compare(runs[a], runs[b], names=(a, b))["test_sample"]
        count += c["p_permutation"] < paired.ALPHA
        print(f"{a} against {b}: {c['verdict']}")
    return check_prediction(prediction, count, choices=(0, 1, 2, 3), why=(
        f"{count} of 3 pairs of one method differ at p < 0.05.  The paired test covers the noise of sampling "
        "and of evaluation on these 200 problems, not the noise of training: two seeds are two different "
        "policies, and the test tells them apart when they are."))


def reveal_split(prediction, preset: str = "tiny") -> dict:
    """Chapter 8: at 64 prompts x G = 2, the share of groups with no signal (rewards all equal)."""
    from .exercises import check_prediction

    runs = load(preset, ("split_64x2", "split_32x4", PARTNER, "split_8x16"))
    splits = [("split_64x2", 2), ("split_32x4", 4), (PARTNER, 8), ("split_8x16", 16)]
    separable = []
    for name, G in splits:
        s = summary(runs[name])
        line = (f"{runs[name].prompts_per_iteration:>2} prompts x G = {G:<2}: no signal in {s['zero_signal_all']:.0%} "
                f"of the groups, test per draw {s['test_per_draw']:.1%}")
        if name != PARTNER:
            c = compare(runs[PARTNER], runs[name])["test_sample"]
            line += f" (against 16 x 8: p = {c['p_permutation']:.2g})"
            if c["p_permutation"] < paired.ALPHA:
                separable.append(f"{runs[name].prompts_per_iteration} x {G} "
                                 f"({'ahead' if c['mean_difference'] > 0 else 'behind'}, p = {c['p_permutation']:.2g})")
        print(line)
    measured = summary(runs["split_64x2"])["zero_signal_all"]
    p_mean = _mean(h["reward"] for h in runs["split_64x2"].history())
    uniform = p_mean ** 2 + (1 - p_mean) ** 2
    tested = ("; on the test only " + ", ".join(separable) + " is separable from 16 x 8" if separable
              else "; on the test no split is separable from 16 x 8")
    return check_prediction(prediction, round(measured, 2), tolerance=0.05, share=True, low=0.0, high=1.0, why=(
        f"a group of two has no signal whenever both answers agree: p^2 + (1 - p)^2, at least 0.5 whatever p.  At "
        f"the run's mean success p = {p_mean:.2f} that is {uniform:.2f}; measured {measured:.2f}, "
        + ("higher, because its prompts are solved at different rates (an easy prompt's pair agrees more often)"
           if measured > uniform else "not above it") + tested + "."))
