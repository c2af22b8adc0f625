"""The figures of the "what if we remove it?" sections (chapters 2-8), drawn from labkit.studies.ablations' files.

Each function takes plain numbers (already read and checked by labkit.studies.ablations) and returns a
matplotlib Figure; the notebooks show it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from ..studies.ablations import SCHEME_WORDS, Run, summary


def plot_identity(cases: list[dict]):
    """The score-function estimate's error against N (log-log), one panel per case, each scheme a line,
    with the slope -1/2 of 1/sqrt(N) drawn above the raw reward's first point."""
    fig, axes = plt.subplots(1, len(cases), figsize=(4.6 * len(cases), 3.4), sharey=True)
    for ax, case in zip(axes if len(cases) > 1 else [axes], cases):
        sizes = case["sizes"]
        for scheme, style in (("none", "o-"), ("mean", "s--"), ("leave_one_out", "^:")):
            ax.loglog(sizes, case[scheme]["rms_error"], style, label=SCHEME_WORDS[scheme])
        first = case["none"]["rms_error"][0]
        ax.loglog(sizes, [1.6 * first * (sizes[0] / n) ** 0.5 for n in sizes], color="gray", lw=0.8, ls="-.",
                  label=r"$\propto 1/\sqrt{N}$")
        ax.set_title(f"{case['problem_id']}: p(right digit) = {case['p_right']:.2f}")
        ax.set_xlabel("sampled tokens N")
    (axes[0] if len(cases) > 1 else axes).set_ylabel("RMS error of the estimate")
    (axes[0] if len(cases) > 1 else axes).legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_gradient_noise(schemes: dict):
    """Signal-to-noise of one batch's gradient under each advantage scheme: the estimate corrected for the
    plug-in's 1/batches bias (bars), its jackknife 95% interval (whiskers), the plug-in (crosses), and zero."""
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    names = list(schemes)
    labels = [SCHEME_WORDS[s] for s in names]
    corrected = [schemes[s]["snr_corrected"] for s in names]
    low = [c - schemes[s]["snr_interval"][0] for c, s in zip(corrected, names)]
    high = [schemes[s]["snr_interval"][1] - c for c, s in zip(corrected, names)]
    ax.bar(labels, corrected, yerr=[low, high], capsize=4, color="tab:blue", label="corrected, 95% interval")
    ax.plot(labels, [schemes[s]["snr"] for s in names], "x", color="black", label="plug-in (biased up)")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_ylabel("signal-to-noise per batch")
    ax.set_title("one batch's gradient at the warm start")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_run_curves(runs: dict[str, Run], keys: tuple[tuple[str, str], ...]):
    """One panel per (history key, label): each run's logged value over its iterations."""
    fig, axes = plt.subplots(1, len(keys), figsize=(4.8 * len(keys), 3.3))
    axes = axes if len(keys) > 1 else [axes]
    for ax, (key, label) in zip(axes, keys):
        for name, run in runs.items():
            history = run.history()
            ax.plot([h["iteration"] for h in history], [h[key] for h in history], label=name, lw=1.2)
        ax.set_xlabel("iteration")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_frontier(runs: dict[str, Run]):
    """Test per-draw success against the KL at the end of the run, one point per run, each with its Wilson 95%
    interval: the intervals describe each rate, and whether two runs differ is their paired test, not this
    picture (the axis spans a few points, so a small gap looks large without them)."""
    fig, ax = plt.subplots(figsize=(5.0, 3.4))
    for name, run in runs.items():
        s = summary(run)
        rate, (low, high) = 100 * s["test_per_draw"], s["test_per_draw_ci"]
        ax.errorbar(s["kl_end"], rate, yerr=[[rate - 100 * low], [100 * high - rate]], fmt="o", capsize=3)
        ax.annotate(name, (s["kl_end"], rate), fontsize=8, xytext=(4, 2), textcoords="offset points")
    ax.set_xlabel("exact KL per token at the end")
    ax.set_ylabel("test per-draw success (%)")
    ax.set_title("bars: Wilson 95% intervals (differences: paired tests)", fontsize=8)
    fig.tight_layout()
    return fig


def plot_seeds(spreads: dict[str, dict], warm_start_rate: float):
    """Each method's three training seeds (dots) beside the warm start's rate (a line)."""
    fig, ax = plt.subplots(figsize=(5.0, 3.2))
    for k, (method, s) in enumerate(spreads.items()):
        ax.plot([k] * len(s["test_per_draw"]), [100 * r for r in s["test_per_draw"]], "o", alpha=0.8)
    ax.axhline(100 * warm_start_rate, color="gray", ls="--", lw=1, label="warm start")
    ax.set_xticks(range(len(spreads)), [m.upper() for m in spreads])
    ax.set_ylabel("test per-draw success (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_splits(rows: list[dict]):
    """Per split of one budget of rollouts: the share of groups with no signal, and test per-draw success."""
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3.2))
    labels = [r["label"] for r in rows]
    axes[0].bar(labels, [100 * r["zero_signal_all"] for r in rows], color="tab:gray")
    axes[0].set_ylabel("groups with no signal (%)")
    axes[1].bar(labels, [100 * r["test_per_draw"] for r in rows], color="tab:blue")
    axes[1].set_ylabel("test per-draw success (%)")
    lowest = min(100 * r["test_per_draw"] for r in rows)
    axes[1].set_ylim(lowest - 10, None)
    fig.tight_layout()
    return fig
