"""Issue 56's reasoning sweep, read: each piece of GRPO removed or changed where RL works.

    python -m labkit sweep sweeps/planned/reasoning.json     # trains what is missing (sweep.py)

Every run of the sweep file is chapter 11's GRPO from the thinking base rare_2 (16 chains x G = 8,
40 iterations) with one thing changed, and each is evaluated by chapter 11's test profile: the same
200 test chains, 8 temperature-1 draws each, with the same seeds for every run.  So every run is
paired with its partner `worked_grpo` (the unchanged run, training seed 1) chain by chain
(`reasoning_report.paired_over_chains`: the count of right draws per chain, and the count of
working draws), and the p-values are corrected by Holm's method within each family of runs.

Two more yardsticks: the base itself (rare_2's own test profile: where the runs started), and the
partner's two other training seeds, whose difference from the partner is what chance alone moves.

From each run's rollouts: the first iteration in which a group held a worked answer, and the share
of groups with signal (rewards not all equal: the only groups whose advantages are not all 0).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ..eval import paired
from ..grpo import loop
from ..lab.runs import RunFolder, read_checked_json
from . import reasoning_report, thinking_base

SWEEP_FILE = "sweeps/planned/reasoning.json"
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


def group_signal(rows: list[dict], G: int) -> dict:
    """From a run's rollout rows (`loop.read_rollouts`: each iteration's rows in groups of G, in the order
    written): the first iteration in which a group held a worked answer (None: never), and per iteration
    the share of groups whose optimised rewards are not all equal."""
    by_iteration: dict[int, list[dict]] = {}
    for row in rows:
        by_iteration.setdefault(row["iteration"], []).append(row)
    first_worked, with_signal = None, []
    for iteration in sorted(by_iteration):
        rows_now = by_iteration[iteration]
        if len(rows_now) % G:
            raise ValueError(f"iteration {iteration}: {len(rows_now)} rollouts are not groups of G = {G}")
        groups = [rows_now[i:i + G] for i in range(0, len(rows_now), G)]
        if first_worked is None and any(r["thinks"] for r in rows_now):
            first_worked = iteration
        with_signal.append(sum(len({r["optimised_reward"] for r in g}) > 1 for g in groups) / len(groups))
    return {"first_worked_iteration": first_worked, "signal_share": with_signal}


def summary(folder: Path, G: int, rows: list[dict] | None = None) -> dict:
    """One run: think rate and share right on the test profile, KL and entropy at its last iteration,
    and its groups' signal."""
    rows = profile_rows(folder) if rows is None else rows
    history = read_checked_json(folder / "history.json")
    signal = group_signal(loop.read_rollouts(folder), G)
    return {"think_rate": sum(bool(r["thinks"]) for r in rows) / len(rows),
            "accuracy": sum(r["reward"] for r in rows) / len(rows),
            "kl_end": history[-1]["kl"], "entropy_start": history[0]["entropy"], "entropy_end": history[-1]["entropy"],
            "think_rate_curve": [h["think_rate"] for h in history],
            "first_worked_iteration": signal["first_worked_iteration"],
            "signal_share_mean": sum(signal["signal_share"]) / len(signal["signal_share"])}


def table(preset: str = "tiny", sweep_file: str | Path = SWEEP_FILE) -> dict:
    """{"base", "partner", "families": {family: [row, ...]}}: each finished run against the partner, paired
    over the test chains (right draws and working draws), Holm-corrected within its family.  Runs not
    finished yet are left out (listed under "missing")."""
    folders = finished_folders(preset, sweep_file)
    if PARTNER not in folders:
        raise FileNotFoundError(f"{PARTNER} is not finished: `python -m labkit sweep {sweep_file}` trains it")
    G_of = {s["name"]: s["G"] for s in specs(preset, sweep_file)}
    base_rows = thinking_base.read_profile("rare_2", preset)["rows"]
    partner_rows = profile_rows(folders[PARTNER])
    out = {"base": {"think_rate": sum(bool(r["thinks"]) for r in base_rows) / len(base_rows),
                    "accuracy": sum(r["reward"] for r in base_rows) / len(base_rows)},
           "partner": summary(folders[PARTNER], G_of[PARTNER], partner_rows), "families": {}, "missing": []}
    for family, names in FAMILIES.items():
        rows = []
        for name in names:
            if name not in folders:
                out["missing"].append(name)
                continue
            run_rows = profile_rows(folders[name])
            right = reasoning_report.paired_over_chains(partner_rows, run_rows)
            thinks = reasoning_report.paired_over_chains(partner_rows, run_rows, field="thinks")
            rows.append({"name": name, **summary(folders[name], G_of[name], run_rows),
                         "accuracy_difference": right["mean_difference"], "accuracy_p": right["p_permutation"],
                         "accuracy_p_method": right["p_permutation_method"],
                         "think_difference": thinks["mean_difference"], "think_p": thinks["p_permutation"]})
        for key in ("accuracy_p", "think_p") if rows else ():
            for row, adjusted in zip(rows, paired.holm([r[key] for r in rows])):
                row[key + "_holm"] = adjusted
        out["families"][family] = rows
    return out


def format_table(result: dict) -> str:
    """The table as text: one line per run, its family's Holm-corrected p-values."""
    def pct(x):
        return f"{x:6.1%}"

    lines = [f"base rare_2: thinks {pct(result['base']['think_rate'])}, right {pct(result['base']['accuracy'])}",
             f"{'run':<31}{'thinks':>8}{'right':>8}{'d right':>9}{'p (Holm)':>10}{'d thinks':>10}{'p (Holm)':>10}"
             f"{'KL end':>9}{'H end':>7}{'1st worked':>11}{'signal':>8}"]
    p = result["partner"]
    lines.append(f"{PARTNER:<31}{pct(p['think_rate']):>8}{pct(p['accuracy']):>8}{'':>9}{'':>10}{'':>10}{'':>10}"
                 f"{p['kl_end']:>9.4f}{p['entropy_end']:>7.3f}{str(p['first_worked_iteration']):>11}"
                 f"{p['signal_share_mean']:>8.1%}")
    for family, rows in result["families"].items():
        lines.append(f"-- {family}")
        for r in rows:
            lines.append(f"{r['name']:<31}{pct(r['think_rate']):>8}{pct(r['accuracy']):>8}"
                         f"{100 * r['accuracy_difference']:>+8.1f}p{r['accuracy_p_holm']:>10.4f}"
                         f"{100 * r['think_difference']:>+9.1f}p{r['think_p_holm']:>10.4f}"
                         f"{r['kl_end']:>9.4f}{r['entropy_end']:>7.3f}{str(r['first_worked_iteration']):>11}"
                         f"{r['signal_share_mean']:>8.1%}")
    if result["missing"]:
        lines.append(f"not finished yet: {', '.join(result['missing'])}")
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
