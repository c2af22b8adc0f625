"""Chapter 11's figures: the think rate and the response length over iterations (the R1-Zero figure), the
per-k profile before and after RL, and pass@k up to large k (the crossover).  Each function takes plain
data and returns a new figure."""

from __future__ import annotations

import matplotlib.pyplot as plt


def plot_think_curves(histories: dict[str, list[dict]]):
    """Three panels over GRPO iterations, one line per run: the share of responses that work the problem
    out, their mean length in tokens, and the share that are right (the true reward).

    histories: {run name: its history.json lines}."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.2), sharex=True)
    for name, lines in histories.items():
        x = [line["iteration"] for line in lines]
        for ax, key in zip(axes, ("think_rate", "mean_tokens", "accuracy")):
            ax.plot(x, [line[key] for line in lines], label=name, lw=1.4)
    for ax, title in zip(axes, ("share that thinks", "mean response tokens", "share right (true reward)")):
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_xlabel("GRPO iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.02, 1.02)
    axes[2].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_profile_before_after(before: dict[int, dict], after: dict[int, dict], title: str):
    """Per number of movements k: the think rate and the accuracy of a base (dashed) and of the run trained
    from it (solid), and the accuracy of the thinking and the direct responses after RL (markers).

    before, after: {k: summary row} (`reasoning_report.per_k`)."""
    ks = sorted(after)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.2), sharex=True)
    for rows, style, label in ((before, "--", "base"), (after, "-", "after RL")):
        axes[0].plot(ks, [rows[k]["think_rate"] for k in ks], style, color="tab:purple", label=label)
        axes[1].plot(ks, [rows[k]["accuracy"] for k in ks], style, color="tab:blue", label=f"{label}: all")
    for key, marker, label in (("accuracy_thinking", "o", "after RL: thinking"), ("accuracy_direct", "x", "after RL: direct")):
        points = [(k, after[k][key]) for k in ks if after[k][key] is not None]
        axes[1].plot([k for k, _ in points], [v for _, v in points], marker, color="tab:green", ls="none", label=label)
    axes[0].set_title("share that thinks", fontsize=10, loc="left")
    axes[1].set_title("share right", fontsize=10, loc="left")
    for ax in axes:
        ax.set_xlabel("movements k")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_family_against_seeds(seeds: dict[str, list[dict]], runs: dict[str, list[dict]], title: str,
                              keys: tuple[str, ...] = ("think_rate", "accuracy")):
    """One panel per key over GRPO iterations: the reference run's training seeds as a grey band (their
    lowest and highest value at each iteration: what chance alone moves) and one line per run of a
    family (issue 56's reasoning sweep).

    seeds, runs: {run name: its history.json lines}; every history of the same length."""
    names = {"think_rate": "share that thinks", "accuracy": "share right (true reward)",
             "mean_tokens": "mean response tokens", "kl": "exact KL to the reference", "entropy": "token entropy"}
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.2), sharex=True, squeeze=False)
    for ax, key in zip(axes[0], keys):
        curves = [[line[key] for line in lines] for lines in seeds.values()]
        x = [line["iteration"] for line in next(iter(seeds.values()))]
        ax.fill_between(x, [min(v) for v in zip(*curves)], [max(v) for v in zip(*curves)], color="0.8",
                        label=f"reference, {len(curves)} seeds")
        for name, lines in runs.items():
            ax.plot([line["iteration"] for line in lines], [line[key] for line in lines], label=name, lw=1.4)
        ax.set_title(names.get(key, key), fontsize=10, loc="left")
        ax.set_xlabel("GRPO iteration")
        ax.grid(alpha=0.3)
        if key in ("think_rate", "accuracy"):
            ax.set_ylim(-0.02, 1.02)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    fig.tight_layout()
    return fig


def plot_sweep_family(family: str, keys: tuple[str, ...] = ("think_rate", "accuracy"), preset: str = "tiny"):
    """A family of the reasoning sweep (`labkit.studies.reasoning_sweep.FAMILIES`) over GRPO iterations against
    the reference's three training seeds, read from the committed runs (`plot_family_against_seeds`)."""
    from ..studies import reasoning_sweep

    if family not in reasoning_sweep.FAMILIES or family == "seeds":
        raise ValueError(f"family {family!r}: expected one of {[f for f in reasoning_sweep.FAMILIES if f != 'seeds']}")
    return plot_family_against_seeds(
        reasoning_sweep.histories(reasoning_sweep.SEEDS, preset),
        reasoning_sweep.histories(reasoning_sweep.FAMILIES[family], preset),
        f"Chapter 11's regime, {family}: each run against the reference's three seeds (grey band)", keys=keys)


def plot_crossover(curves: dict[str, list[float]], ks: list[int], pairs: tuple[tuple[str, str], ...]):
    """pass@k against k (log scale), one colour per base: the base dashed, the RL run from it solid; any
    other policy (the skill base) dotted grey.  Where the dashed line reaches the solid one, the base has
    caught up.

    curves: {policy: mean pass@k for each k of `ks`} (`crossover.curve`)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    paired = set()
    for (base, run), colour in zip(pairs, ("tab:blue", "tab:orange", "tab:green")):
        for name, style in ((base, "--"), (run, "-")):
            if name in curves:
                ax.plot(ks, curves[name], style, marker="o", ms=3, color=colour, label=name)
                paired.add(name)
    for name in curves:
        if name not in paired:
            ax.plot(ks, curves[name], ":", marker="s", ms=3, color="grey", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("k (tries per chain)")
    ax.set_ylabel("pass@k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
