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


# ---------------------------------------------------------------- chapter 7


def plot_success_rates(results: dict, mode: str = "greedy", populations: tuple[str, ...] = ("ID50", "OOD100", "ALL")):
    """Success rate per policy and population with Wilson 95% error bars (chapter 7).

    results: the content of runs/<preset>/evaluation/results.json
    (`labkit.evaluate.compute_results`).  mode "greedy" shows greedy pass@1;
    "sample" the per-draw success over all samples (never best-of-4).  Bars are
    grouped by policy, one colour per population; the whisker is the interval.
    """
    policies = results["policy_order"]
    width = 0.8 / len(populations)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(policies)), 3.2))
    for j, population in enumerate(populations):
        xs = [i + (j - (len(populations) - 1) / 2) * width for i in range(len(policies))]
        stats = [results["policies"][p][mode][population] for p in policies]
        rates = [100 * s["success_rate"] for s in stats]
        low = [100 * (s["success_rate"] - s["success_rate_ci"][0]) for s in stats]
        high = [100 * (s["success_rate_ci"][1] - s["success_rate"]) for s in stats]
        ax.bar(xs, rates, width, yerr=[low, high], capsize=3, label=population)
    ax.set_xticks(range(len(policies)), policies)
    what = "greedy pass@1" if mode == "greedy" else "per-draw success (all samples, not best-of-4)"
    n = results["policies"][policies[0]][mode]["ALL"]["responses"]
    ax.set_ylabel("success rate (%)")
    ax.set_title(f"{what}; ALL = {n} responses; whiskers: Wilson 95%", fontsize=9, loc="left")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_failure_reasons(results: dict, mode: str = "greedy", population: str = "ALL"):
    """Stacked bars: each policy's responses split by verifier outcome ("correct" first) (chapter 7).

    Only outcomes that occur for some policy are drawn; the legend lists them in
    the verifier's precedence order, so a response always lands in the same bar.
    """
    policies = results["policy_order"]
    counts = [results["policies"][p][mode][population]["reasons"] for p in policies]
    names = [name for name in counts[0] if any(c[name] for c in counts)]
    from .verifier import REASONS

    order = {name: i for i, name in enumerate(("correct",) + REASONS)}
    names.sort(key=lambda name: order.get(name, len(order)))
    fig, ax = plt.subplots(figsize=(7, 0.6 * len(policies) + 1.6))
    left = [0] * len(policies)
    for name in names:
        values = [c[name] for c in counts]
        ax.barh(range(len(policies)), values, left=left, label=name)
        left = [a + b for a, b in zip(left, values)]
    ax.set_yticks(range(len(policies)), policies)
    ax.invert_yaxis()
    ax.set_xlabel(f"{mode} responses ({population})")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(policies) < 3 else -0.2))
    fig.tight_layout()
    return fig


def plot_pass_at_k(results: dict, population: str = "ALL"):
    """pass@k (unbiased estimator) for k = 1..n per policy, beside each policy's greedy pass@1 (chapter 7).

    The title states the exact sampling budget; pass@k with k > 1 is a property
    of the sampler's best-of-k, not of one answer.
    """
    policies = results["policy_order"]
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for p in policies:
        curve = results["policies"][p]["sample"][population]["pass_at_k"]
        line, = ax.plot(curve["k"], [100 * v for v in curve["values"]], marker="o", label=f"{p} pass@k")
        greedy = 100 * results["policies"][p]["greedy"][population]["success_rate"]
        ax.scatter([0.75], [greedy], marker="s", color=line.get_color())
    budget = results["policies"][policies[0]]["sample"][population]["pass_at_k"]["label"]
    ax.set_xticks([0.75] + curve["k"], ["greedy\npass@1"] + [str(k) for k in curve["k"]])
    ax.set_xlabel("k")
    ax.set_ylabel(f"{population} (%)")
    ax.set_title(budget, fontsize=9, loc="left")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
