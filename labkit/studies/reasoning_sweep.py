"""Issue 56's reasoning sweep, read: each piece of GRPO removed or changed where RL works.

    python -m labkit sweep sweeps/reasoning.json     # trains what is missing (sweep.py)

Every run of the sweep file is chapter 11's GRPO from the thinking base rare_2 (16 chains x G = 8,
40 iterations) with one thing changed, and each is evaluated by chapter 11's test profile: the same
200 test chains, 8 temperature-1 draws each, with the same seeds for every run.  So every run is
paired with its partner `worked_grpo` (the unchanged run, training seed 1) chain by chain
(`reasoning_report.paired_over_chains`: the count of right draws per chain, and the count of
working draws), and the p-values are corrected by Holm's method within each family of runs.

Two more yardsticks: the base itself (rare_2's own test profile: where the runs started), and the
partner's two other training seeds, whose difference from the partner is what chance alone moves.

From each run's history: the first iteration in which a group held a worked answer, and the share
of groups with signal (rewards not all equal: the only groups whose advantages are not all 0).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ..eval import paired
from ..lab.runs import REPO_ROOT, RunFolder, display_path, read_checked_json
from . import reasoning_report, thinking_base

SWEEP_FILE = REPO_ROOT / "sweeps" / "reasoning.json"  # wherever the caller runs (a chapter: notebooks/)
PARTNER = "worked_grpo"
FAMILIES = {
    "seeds": ("worked_grpo_seed_2", "worked_grpo_seed_3"),
    "advantage": ("worked_mean_only", "worked_no_baseline", "worked_rloo", "worked_positive_only",
                  "worked_negative_only"),
    "group size": ("worked_split_64x2", "worked_split_32x4", "worked_split_8x16", "worked_dynamic_sampling"),
    "KL leash": ("worked_beta_0", "worked_beta_0p2", "worked_beta_1", "worked_beta_5"),
    "reuse and clip": ("worked_updates_1", "worked_updates_2_clip_0p99", "worked_updates_4",
                       "worked_updates_4_clip_0p99", "worked_updates_16", "worked_updates_16_clip_0p99"),
    "controls": ("worked_random_reward", "worked_random_reward_clip_0p99", "worked_format_reward"),
}
"""the runs of each family, in the order a table shows them (Holm's correction is within a family)"""


def specs(preset: str = "tiny", sweep_file: str | Path = SWEEP_FILE) -> list[dict]:
    """The sweep's planned runs, as `python -m labkit sweep FILE` plans them."""
    from . import sweep

    return sweep.plan(preset, sweep.load_runs(sweep_file, preset), settings=sweep.load_settings(sweep_file),
                      root=sweep.sweep_root(sweep_file, preset), starts=sweep.load_starts(sweep_file),
                      task=sweep.load_task(sweep_file))


def finished_folders(preset: str = "tiny", sweep_file: str | Path = SWEEP_FILE) -> dict[str, Path]:
    """{name: folder} of the sweep's runs that are finished under today's fingerprint."""
    return {s["name"]: Path(s["folder"]) for s in specs(preset, sweep_file) if (Path(s["folder"]) / "FINISHED").is_file()}


def profile_rows(folder: Path) -> list[dict]:
    """A finished run's test-profile rows, checked against its ledger."""
    run = RunFolder(folder)
    run.check_file("profile.json.gz")
    return json.loads(gzip.decompress((folder / "profile.json.gz").read_bytes()))["rows"]


def group_signal(history: list[dict]) -> dict:
    """From a run's history (one line per iteration): the first iteration in which a response worked the
    chain out (None: never), and per iteration the share of groups whose optimised rewards are not all
    equal (1 - `optimised/frac_reward_zero_std`: the only groups whose advantages are not all 0)."""
    first_worked = next((h["iteration"] for h in history if h["think_rate"] > 0), None)
    return {"first_worked_iteration": first_worked,
            "signal_share": [1.0 - h["optimised/frac_reward_zero_std"] for h in history]}


def summary(folder: Path, rows: list[dict] | None = None) -> dict:
    """One run: think rate and share right on the test profile, KL and entropy at its last iteration,
    and its groups' signal."""
    rows = profile_rows(folder) if rows is None else rows
    history = read_checked_json(folder / "history.json")
    signal = group_signal(history)
    return {"think_rate": sum(bool(r["thinks"]) for r in rows) / len(rows),
            "accuracy": sum(r["reward"] for r in rows) / len(rows),
            "kl_end": history[-1]["kl"], "entropy_start": history[0]["entropy"], "entropy_end": history[-1]["entropy"],
            "think_rate_curve": [h["think_rate"] for h in history],
            "first_worked_iteration": signal["first_worked_iteration"],
            "signal_share_mean": sum(signal["signal_share"]) / len(signal["signal_share"])}


BASE_SEEDS = {"rare_0": ("worked_from_rare_0_seed_2", "worked_from_rare_0_seed_3"),
              "control": ("worked_from_control_seed_2", "worked_from_control_seed_3")}
"""chapter 11's runs from rare_0 and from the control (`reasoning`'s from_rare_0 and from_control, training seed
1) at training seeds 2 and 3: whether GRPO finds working from a base that never shows it, at any seed"""


def base_seeds(preset: str = "tiny", sweep_file: str | Path = SWEEP_FILE) -> dict[str, dict]:
    """{base: {"runs": [row per finished seed], "missing": [names]}} for the bases of `BASE_SEEDS`: seed 1 is
    chapter 11's run from the base, seeds 2 and 3 the sweep's.  A row: {"name", "think_rate", "accuracy" (its
    test profile), "peak_think_rate" (the highest share of an iteration's responses that worked it out),
    "first_worked_iteration"}."""
    from . import reasoning

    folders = finished_folders(preset, sweep_file)
    out = {}
    for base, names in BASE_SEEDS.items():
        runs = {f"from_{base}": Path(reasoning.default_run_dir(preset, f"from_{base}"))}
        runs.update({name: folders[name] for name in names if name in folders})
        rows = []
        for name, folder in runs.items():
            s = summary(folder)
            rows.append({"name": name, "think_rate": s["think_rate"], "accuracy": s["accuracy"],
                         "peak_think_rate": max(s["think_rate_curve"]), "first_worked_iteration": s["first_worked_iteration"]})
        out[base] = {"runs": rows, "missing": [n for n in names if n not in folders]}
    return out


SEEDS = (PARTNER, "worked_grpo_seed_2", "worked_grpo_seed_3")
"""the reference run at its three training seeds: a piece's effect is measured against each of them"""
BEYOND_SEEDS_ALPHA = 0.01


def table(preset: str = "tiny", sweep_file: str | Path = SWEEP_FILE, families: tuple[str, ...] | None = None) -> dict:
    """{"base", "partner", "families": {family: [row, ...]}, "missing"}: each finished run against the
    reference, paired over the test chains (right draws and working draws), Holm-corrected within its
    family, against each of the reference's finished training seeds.

    The paired test over chains holds the trained policy fixed: it says whether two policies differ,
    not whether the change of setting made the difference; a second training seed of the same setting
    can differ from the first as much.  So a run counts as changed by its setting ("beyond_seeds", for
    right answers and for working separately) only where it differs from every seed of the reference in
    the same direction with a Holm-corrected p below `BEYOND_SEEDS_ALPHA`.  Runs not finished yet are
    left out (listed under "missing")."""
    folders = finished_folders(preset, sweep_file)
    if PARTNER not in folders:
        raise FileNotFoundError(f"{PARTNER} is not finished: `python -m labkit sweep {display_path(sweep_file)}` trains it")
    base_rows = thinking_base.read_profile("rare_2", preset)["rows"]
    seed_rows = {name: profile_rows(folders[name]) for name in SEEDS if name in folders}
    out = {"base": {"think_rate": sum(bool(r["thinks"]) for r in base_rows) / len(base_rows),
                    "accuracy": sum(r["reward"] for r in base_rows) / len(base_rows)},
           "partner": summary(folders[PARTNER], seed_rows[PARTNER]), "seeds": list(seed_rows),
           "families": {}, "missing": []}
    for family, names in FAMILIES.items():
        if families is not None and family not in families:  # a chapter's one family: its tests alone (Holm is per family)
            continue
        rows = []
        for name in names:
            if name not in folders:
                out["missing"].append(name)
                continue
            run_rows = profile_rows(folders[name])
            row = {"name": name, **summary(folders[name], run_rows), "against": {}}
            for seed, reference in seed_rows.items():
                if seed == name:
                    continue
                right = reasoning_report.paired_over_chains(reference, run_rows)
                thinks = reasoning_report.paired_over_chains(reference, run_rows, field="thinks")
                row["against"][seed] = {"accuracy_difference": right["mean_difference"], "accuracy_p": right["p_permutation"],
                                        "think_difference": thinks["mean_difference"], "think_p": thinks["p_permutation"]}
            rows.append(row)
        for seed in seed_rows:  # Holm within the family, against each reference seed
            compared = [r for r in rows if seed in r["against"]]
            for key in ("accuracy_p", "think_p") if compared else ():
                for r, adjusted in zip(compared, paired.holm([r["against"][seed][key] for r in compared])):
                    r["against"][seed][key + "_holm"] = adjusted
        for r in rows:
            for what in ("accuracy", "think"):
                tests = list(r["against"].values())
                signs = {t[f"{what}_difference"] > 0 for t in tests}
                r[f"{what}_beyond_seeds"] = (len(tests) == len(SEEDS) - (r["name"] in SEEDS) and len(signs) == 1
                                             and all(t[f"{what}_p_holm"] < BEYOND_SEEDS_ALPHA for t in tests))
        out["families"][family] = rows
    return out


def format_table(result: dict, families: tuple[str, ...] | None = None) -> str:
    """The table as text: one line per run; its difference from the reference (seed 1) with its Holm p, the
    range of its differences from the three seeds, and whether it is beyond the seeds ("*").
    families: only these families' runs (default: every family, and the runs not finished yet)."""
    def pct(x):
        return f"{x:6.1%}"

    def diffs(r, what):
        d = [100 * t[f"{what}_difference"] for t in r["against"].values()]
        first = r["against"].get(PARTNER)
        head = f"{100 * first[f'{what}_difference']:+6.1f} (p {first[f'{what}_p_holm']:.3f})" if first else " " * 18
        return f"{head} [{min(d):+5.1f}, {max(d):+5.1f}]{'*' if r[f'{what}_beyond_seeds'] else ' '}"

    lines = [f"base rare_2: thinks {pct(result['base']['think_rate'])}, right {pct(result['base']['accuracy'])}; "
             f"differences in points against {PARTNER} (Holm p) and [the range against the seeds {', '.join(result['seeds'])}]; "
             f"* beyond every seed (p < {BEYOND_SEEDS_ALPHA} each, one direction)",
             f"{'run':<31}{'thinks':>7}{'right':>7}  {'right: d (p) [seeds]':<33}{'thinks: d (p) [seeds]':<33}"
             f"{'KL end':>7}{'H end':>6}{'1st':>4}{'signal':>7}"]
    p = result["partner"]
    lines.append(f"{PARTNER:<31}{pct(p['think_rate']):>7}{pct(p['accuracy']):>7}  {'':<33}{'':<33}"
                 f"{p['kl_end']:>7.3f}{p['entropy_end']:>6.3f}{str(p['first_worked_iteration']):>4}"
                 f"{p['signal_share_mean']:>7.1%}")
    for family, rows in result["families"].items():
        if families is not None and family not in families:
            continue
        lines.append(f"-- {family}")
        for r in rows:
            lines.append(f"{r['name']:<31}{pct(r['think_rate']):>7}{pct(r['accuracy']):>7}  {diffs(r, 'accuracy'):<33}"
                         f"{diffs(r, 'think'):<33}{r['kl_end']:>7.3f}{r['entropy_end']:>6.3f}"
                         f"{str(r['first_worked_iteration']):>4}{r['signal_share_mean']:>7.1%}")
    missing = [n for n in result["missing"] if families is None or any(n in FAMILIES[f] for f in families)]
    if missing:
        lines.append(f"not finished yet: {', '.join(missing)}")
    return "\n".join(lines)


def one_winner_advantages(G: int = 8, names: tuple[str, ...] = (PARTNER, *FAMILIES["advantage"]),
                          preset: str = "tiny", sweep_file: str | Path = SWEEP_FILE) -> dict[str, tuple[float, float]]:
    """{run: (the winner's advantage, each loser's)} for a group of G with one reward 1 and G - 1 rewards 0,
    computed by each run's own advantage function (`variants.resolve`), as its loss sees it."""
    import torch

    from ..config import PRESETS
    from ..grpo import variants
    from . import sweep

    if G < 2:
        raise ValueError(f"G {G}: a group with one winner needs a loser too (G >= 2)")
    variant_of = dict(sweep.load_runs(sweep_file, preset))
    rewards = torch.zeros(1, G, dtype=torch.float32)
    rewards[0, 0] = 1.0
    out = {}
    for name in names:
        a = variants.resolve(variant_of[name], PRESETS[preset]).advantages(rewards)[0]
        out[name] = (float(a[0]), float(a[1]))
    return out


CHANGES = {
    "worked_grpo_seed_2": "the reference at training seed 2", "worked_grpo_seed_3": "the reference at training seed 3",
    "worked_from_rare_0_seed_2": "from rare_0 at training seed 2", "worked_from_rare_0_seed_3": "from rare_0 at training seed 3",
    "worked_from_control_seed_2": "from the control at training seed 2",
    "worked_from_control_seed_3": "from the control at training seed 3",
    "worked_mean_only": "no std (A = r - mean)", "worked_no_baseline": "no baseline (A = r)",
    "worked_rloo": "leave-one-out baseline (RLOO)", "worked_positive_only": "positive advantages only",
    "worked_negative_only": "negative advantages only", "worked_split_64x2": "G = 2 (64 chains)",
    "worked_split_32x4": "G = 4 (32 chains)", "worked_split_8x16": "G = 16 (8 chains)",
    "worked_dynamic_sampling": "dynamic sampling (DAPO)", "worked_beta_0": "beta 0", "worked_beta_0p2": "beta 0.2",
    "worked_beta_1": "beta 1", "worked_beta_5": "beta 5", "worked_updates_1": "1 update a batch",
    "worked_updates_2_clip_0p99": "2 updates, clip 0.99 (none)", "worked_updates_4": "4 updates a batch",
    "worked_updates_4_clip_0p99": "4 updates, clip 0.99 (none)", "worked_updates_16": "16 updates a batch",
    "worked_updates_16_clip_0p99": "16 updates, clip 0.99 (none)", "worked_random_reward": "a random reward",
    "worked_random_reward_clip_0p99": "a random reward, clip 0.99 (none)", "worked_format_reward": "a format-only reward",
}
"""what each run changes, in words (the sweep file names the same change in its options)"""


def _effect(r: dict, what: str) -> str:
    """"-13.3 points (-17.6 to -13.3 against the seeds, Holm p <= 0.0001 each)" for `what` of row r."""
    d = [100 * t[f"{what}_difference"] for t in r["against"].values()]
    p = max(t[f"{what}_p_holm"] for t in r["against"].values())
    return (f"{100 * r['against'][PARTNER][f'{what}_difference']:+.1f} points ({min(d):+.1f} to {max(d):+.1f} "
            f"against the seeds, Holm p <= {max(p, 1e-4):.4f} each)")


def findings(result: dict) -> list[str]:
    """One sentence per family of `table(...)`'s result: the runs whose setting changed the share right or
    the share that works it out beyond the reference's training seeds (`BEYOND_SEEDS_ALPHA`), with their
    differences, and the runs that stayed within the seeds."""
    out = []
    for family, rows in result["families"].items():
        if family == "seeds" or not rows:
            continue
        beyond, within = [], []
        for r in rows:
            parts = [f"right {r['accuracy']:.1%}, {_effect(r, 'accuracy')}" if r["accuracy_beyond_seeds"] else None,
                     f"works it out {r['think_rate']:.1%}, {_effect(r, 'think')}" if r["think_beyond_seeds"] else None]
            parts = [p for p in parts if p]
            change = CHANGES.get(r["name"], r["name"])
            (beyond if parts else within).append(f"{change[0].upper()}{change[1:]}: {'; '.join(parts)}" if parts else change)
        text = f"{family[0].upper()}{family[1:]}. " + (f"Beyond the seeds: {'. '.join(beyond)}. " if beyond else
                                             "No run differs beyond the seeds. ")
        out.append(text + (f"Within the seeds: {', '.join(within)}." if within else ""))
    return out


def entropy_and_selection(result: dict, selected_above: float = 0.5) -> str:
    """The token entropy at the first and last iteration, for the runs whose test profile works it out
    more often than `selected_above` (RL selected working) and for the others (Cui et al. 2025 report
    that entropy falls as reward rises)."""
    rows = [{"name": PARTNER, **result["partner"]}] + [r for rs in result["families"].values() for r in rs]
    start = sorted({round(r["entropy_start"], 2) for r in rows})
    groups = {True: [r for r in rows if r["think_rate"] > selected_above],
              False: [r for r in rows if r["think_rate"] <= selected_above]}

    def span(rs):
        low, high = (f"{v:.2f}" for v in (min(r["entropy_end"] for r in rs), max(r["entropy_end"] for r in rs)))
        return low if low == high else f"{low} to {high}"

    return (f"Token entropy at the first iteration: {start[0]:.2f}" + (f" to {start[-1]:.2f}" if len(start) > 1 else "")
            + f"; at the last, {span(groups[True])} in the {len(groups[True])} runs that work it out in more than "
            f"{selected_above:.0%} of their test answers" + (f", and {span(groups[False])} in the {len(groups[False])} "
                                                               f"that do not ({', '.join(CHANGES.get(r['name'], r['name']) for r in groups[False])})"
                                                               if groups[False] else "") + ".")


def histories(names, preset: str = "tiny", sweep_file: str | Path = SWEEP_FILE) -> dict[str, list[dict]]:
    """{run: its history.json lines}, checked against each run's ledger, for the finished runs of `names`."""
    folders = finished_folders(preset, sweep_file)
    return {name: read_checked_json(folders[name] / "history.json") for name in names if name in folders}


def protocol_power(preset: str = "tiny") -> list[dict]:
    """What the protocol's regime can show at all: GRPO at the ablation budget (`labkit.studies.ablations`:
    16 prompts x G = 8, 40 iterations) against the warm start it starts from, for each of its three
    training seeds, paired over the 200 test problems x 4 draws.  A piece removed there can only show
    an effect smaller than GRPO's own."""
    from . import ablations

    runs = ablations.load(preset, ablations.SEEDS["grpo"])
    warm = ablations.warm_start_evaluation(preset)
    out = []
    for name, run in runs.items():
        test = ablations.compare(warm, run)["test_sample"]
        out.append({"name": name, "difference": test["mean_difference"], "p": test["p_permutation"],
                    "p_is_bound": paired.at_floor(test["p_permutation"], test["p_permutation_method"])})
    return out


def both_regimes(family: str, result: dict | None = None, preset: str = "tiny") -> str:
    """A chapter's "what if we remove it?" in both regimes, as text: the protocol budget's own power
    (`protocol_power`), then the reasoning sweep's `family` against the reference's seeds, with its
    generated finding (`findings`)."""
    if family not in FAMILIES or family == "seeds":
        raise ValueError(f"family {family!r}: expected one of {[f for f in FAMILIES if f != 'seeds']}")
    result = result or table(preset)
    power = protocol_power(preset)
    lines = ["The protocol's regime (chapter 9's ablation budget): full GRPO against the warm start, per training "
             "seed, " + "; ".join(f"{100 * r['difference']:+.1f} points ({'p <= ' if r['p_is_bound'] else 'p = '}"
                                  f"{r['p']:.2g})" for r in power)
             + ": whatever a removed piece does there, it must show inside an effect this small.",
             "", "Chapter 11's regime (GRPO from rare_2 on worked answers, where RL selects working):",
             format_table({**result, "families": {family: result["families"][family]}}, (family,)), ""]
    lines += [f for f in findings({**result, "families": {family: result["families"][family]}})]
    return "\n".join(lines)

