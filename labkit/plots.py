"""The figures the chapters and the book show.

Each function takes plain data, draws on a new matplotlib figure and returns it;
the notebook calls `plt.show()`.  Shared by every chapter: add functions, in
chapter order, without rewriting the others.
"""

from __future__ import annotations

import matplotlib.pyplot as plt


# ---------------------------------------------------------------- chapter 1


def plot_target_distribution(records: list[dict], bin_width: int = 10):
    """Histogram of targets for each split and population (chapter 1).

    records: dicts with "split", "population" and "target" (as from
    `task.generate_dataset()`).  One panel per (split, population) present, in
    the order train, validation, test ID50, test OOD100; shared x axis 0..300 so
    the wider OOD100 range shows at a glance.
    """
    order = [("train", "ID50"), ("validation", "ID50"), ("test", "ID50"), ("test", "OOD100")]
    groups = {key: [r["target"] for r in records if (r["split"], r["population"]) == key] for key in order}
    groups = {key: targets for key, targets in groups.items() if targets}
    top = max(max(targets) for targets in groups.values())
    bins = list(range(0, max(300, top) + bin_width, bin_width))
    fig, axes = plt.subplots(len(groups), 1, figsize=(7, 1.6 * len(groups)), sharex=True, squeeze=False)
    for ax, ((split, population), targets) in zip(axes[:, 0], groups.items()):
        ax.hist(targets, bins=bins, color="tab:orange" if population == "OOD100" else "tab:blue")
        ax.set_ylabel("problems")
        ax.set_title(f"{split} {population}: {len(targets)} problems, targets {min(targets)}..{max(targets)}",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel(f"target (final stock), bins of {bin_width}")
    fig.tight_layout()
    return fig
