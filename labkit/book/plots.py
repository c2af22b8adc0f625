"""The figures the chapters and the book show.

Each function takes plain data, draws on a new matplotlib figure and returns it;
the notebook calls `plt.show()`.  Shared by every chapter: add functions, in
chapter order, without rewriting the others.
"""

from __future__ import annotations

import math

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


# ---------------------------------------------------------------- chapter 2


def plot_pretraining_curve(corpus_points: list[tuple[float, float]], answer_points: list[tuple[float, float, list]],
                           corpus_minutes: float):
    """Exact answers of the tiny base against CPU minutes of pretraining (chapter 2).

    corpus_points: (minutes, teacher-forced exact answers on the corpus phase's own probe);
    answer_points: (minutes, exact answers on the answer phase's fresh statements, per-digit
    accuracies); corpus_minutes: where the answer phase begins (a vertical line).
    """
    fig, ax = plt.subplots(figsize=(8, 3.6))
    if corpus_points:
        ax.plot(*zip(*corpus_points), "o-", color="tab:gray", label="corpus phase: exact answers (its own probe)")
    minutes = [m for m, _, _ in answer_points]
    ax.plot(minutes, [e for _, e, _ in answer_points], "o-", color="tab:blue", lw=2,
            label="answer phase: exact answers on fresh statements")
    for k, style in zip(range(3), (":", "--", "-.")):
        values = [(m, d[k]) for m, _, d in answer_points if len(d) > k]
        if values:
            ax.plot(*zip(*values), style, color="tab:green", alpha=0.7, label=f"digit {k + 1} from the left: fraction right")
    ax.axvline(corpus_minutes, color="black", lw=0.8)
    ax.text(corpus_minutes, 1.02, " answer phase starts", fontsize=8, va="bottom", transform=ax.get_xaxis_transform())
    ax.set_xlabel("CPU minutes of pretraining (one thread)")
    ax.set_ylabel("fraction right")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def plot_rollout_logprobs(token_texts: list[list[str]], token_logprobs: list[list[float]], titles: list[str]):
    """One panel per rollout: the behaviour log-prob of each generated token, labelled by its text (chapter 2).

    token_texts[i][j]: the text of token j of rollout i (as it should appear on
    the axis); token_logprobs[i][j]: its log-probability under the sampling
    policy; titles[i]: the panel's title (e.g. seed, stop reason, reward).  The
    y axis is shared, so a confident token (near 0) and a gamble (far below)
    compare across rollouts.
    """
    if not (len(token_texts) == len(token_logprobs) == len(titles)):
        raise ValueError(f"{len(token_texts)} token lists, {len(token_logprobs)} log-prob lists and "
                         f"{len(titles)} titles: one of each per rollout")
    width = max(len(t) for t in token_texts)
    fig, axes = plt.subplots(len(titles), 1, figsize=(max(6.0, 0.45 * width + 1.5), 1.7 * len(titles)),
                             sharey=True, squeeze=False)
    low = min(min(lp) for lp in token_logprobs)
    for ax, texts, logprobs, title in zip(axes[:, 0], token_texts, token_logprobs, titles):
        if len(texts) != len(logprobs):
            raise ValueError(f"rollout {title!r}: {len(texts)} tokens but {len(logprobs)} log-probs")
        ax.bar(range(len(logprobs)), logprobs, color=["tab:red" if lp < -1 else "tab:blue" for lp in logprobs])
        ax.set_xticks(range(len(texts)), texts, fontsize=8, family="monospace")
        ax.set_xlim(-0.6, width - 0.4)
        ax.set_ylim(min(low * 1.1, -1.5), 0.0)
        ax.axhline(-1.0, color="grey", linewidth=0.6, linestyle=":")
        ax.set_ylabel("log-prob")
        ax.set_title(title, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("generated token (red: log-prob below -1, i.e. probability below 0.37)")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 3


def plot_zero_signal_vs_success(curves: dict, measured: list[dict] | None = None):
    """How often a group has no signal, against the success rate p, one curve per G (chapter 3).

    curves: {G: (p values, fractions)}, the fraction p^G + (1-p)^G of constant groups.
    measured: optional dicts with "p" (a measured mean reward), "fraction" (the measured
    fraction of constant groups), "label", and optionally "marker", drawn as points.
    """
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for G, (ps, fractions) in curves.items():
        ax.plot(ps, fractions, label=f"G = {G}: $p^G + (1-p)^G$")
    for point in measured or []:
        ax.scatter(point["p"], point["fraction"], marker=point.get("marker", "o"), zorder=3,
                   s=point.get("size", 30), color=point.get("color", "black"), label=point["label"])
    ax.set_xlabel("success rate p (chance that one response earns reward 1)")
    ax.set_ylabel("fraction of groups with no signal")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="upper center")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 4


def plot_clipped_objective(rho, panels: list[dict], clip_eps: float = 0.2):
    """The clipped objective and its gradient as functions of rho, one column per sign of A (chapter 4).

    rho: (N,) ratios.  panels: dicts with "advantage" (a float), "objective" (N,) values of
    min(rho A, clip(rho) A), "unclipped" (N,) values of rho A and "gradient" (N,) values of
    d objective / d log rho.  The flat regions, where the gradient is exactly zero, are
    shaded.
    """
    import numpy as np

    rho = np.asarray(rho)
    fig, axes = plt.subplots(2, len(panels), figsize=(4.2 * len(panels), 5.2), sharex=True, squeeze=False)
    for column, panel in enumerate(panels):
        A = panel["advantage"]
        gradient = np.asarray(panel["gradient"])
        top, bottom = axes[0, column], axes[1, column]
        top.plot(rho, panel["unclipped"], color="tab:gray", linestyle="--", label=r"$\rho A$ (unclipped)")
        top.plot(rho, panel["objective"], color="tab:blue", label=r"$\min(\rho A,\ \mathrm{clip}(\rho) A)$")
        bottom.plot(rho, gradient, color="tab:blue")
        flat = gradient == 0.0
        for ax in (top, bottom):
            for lo, hi in _runs(rho, flat):
                ax.axvspan(lo, hi, color="tab:red", alpha=0.12, lw=0)
            for edge in (1 - clip_eps, 1 + clip_eps):
                ax.axvline(edge, color="tab:red", linewidth=0.7, linestyle=":")
            ax.axvline(1.0, color="black", linewidth=0.5)
        side = r"$\rho > 1+\epsilon$" if A > 0 else r"$\rho < 1-\epsilon$"
        top.set_title(f"A = {A:+g}: flat (zero gradient) where {side}", fontsize=9, loc="left")
        top.set_ylabel("per-token objective")
        bottom.set_ylabel(r"$\partial\,\mathrm{objective} / \partial \log\rho$")
        bottom.set_xlabel(r"$\rho = \pi_\theta / \pi_{\mathrm{old}}$")
        top.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _runs(x, flags):
    """(start, end) x-ranges of the consecutive runs where flags is True."""
    spans, start = [], None
    for value, flag in zip(x, flags):
        if flag and start is None:
            start = value
        if not flag and start is not None:
            spans.append((start, previous))
            start = None
        previous = value
    if start is not None:
        spans.append((start, previous))
    return spans


def plot_token_ratios(responses: list[dict], clip_eps: float = 0.2):
    """rho - 1 per response token on one real group, after one update (chapter 4).

    responses: dicts with "rho" (L,) ratios of the response's tokens, "advantage" and
    "label".  Responses with A > 0 are drawn in green, A < 0 in red, A = 0 in grey.  The
    clip edges (rho = 1 -+ clip_eps) are marked when they fall inside the drawn range.
    """
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 3.4))
    for response in responses:
        rho = np.asarray(response["rho"])
        A = response["advantage"]
        color = "tab:green" if A > 0 else "tab:red" if A < 0 else "tab:gray"
        ax.plot(range(1, len(rho) + 1), rho - 1.0, marker="o", markersize=3, color=color,
                alpha=0.85, label=response["label"])
    ax.axhline(0.0, color="black", linewidth=0.5)
    low, high = ax.get_ylim()
    for edge in (-clip_eps, clip_eps):
        if low <= edge <= high:
            ax.axhline(edge, color="tab:red", linestyle=":", linewidth=0.8)
    ax.set_xlabel("response token (1 = first generated token)")
    ax.set_ylabel(r"$\rho - 1$")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 5


def plot_kl_blocks(blocks: list[str], full: list[float], local: list[float], mass: list[float]):
    """Each vocabulary block's share of the exact KL, full normaliser vs block-local (chapter 5).

    blocks: labels ("0..127", ...).  full: each block's contribution
    sum_{v in block} p(v) (log p(v) - log q(v)) with the full normaliser (they add up to
    the KL).  local: the same with each block softmax-normalised on its own (wrong).
    mass: p_cur's probability mass in each block (full normaliser).
    """
    import numpy as np

    x = np.arange(len(blocks))
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
    width = 0.4
    left.bar(x - width / 2, full, width, label="full normaliser (exact)")
    left.bar(x + width / 2, local, width, label="each block normalised alone (wrong)")
    left.axhline(0.0, color="black", linewidth=0.5)
    left.set_xticks(x, blocks)
    left.set_xlabel("vocabulary block (token ids)")
    left.set_ylabel("block's KL contribution (nats)")
    left.legend(fontsize=7)
    right.bar(x, mass, color="tab:gray")
    right.set_xticks(x, blocks)
    right.set_yscale("log")
    right.set_xlabel("vocabulary block (token ids)")
    right.set_ylabel(r"$\sum_{v \in \mathrm{block}} p_{\mathrm{cur}}(v)$")
    fig.tight_layout()
    return fig


def plot_kl_estimators(exact, expectations: dict, spreads: dict):
    """The exact prefix KL against the k1/k2/k3 estimators on many prefixes: bias and spread (chapter 5).

    exact: (N,) exact KL per prefix (pass only prefixes with KL > 0: the x axis is
    logarithmic).  expectations: {name: (N,)} each estimator's expected value over
    x ~ p_cur at the prefix; spreads: {name: (N,)} its standard deviation (the typical error
    of one draw).  Both are computed from the full distributions, not sampled.  Left: the
    relative bias E[k] / KL - 1 (0 for an unbiased estimator); right: the spread, log-log,
    against the line "std = KL".
    """
    import numpy as np

    exact = np.asarray(exact)
    order = np.argsort(exact)
    styles = {"k1": ("tab:blue", "o", 14), "k2": ("tab:orange", "s", 8), "k3": ("tab:green", "^", 5)}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.9))
    for name in expectations:
        color, marker, size = styles.get(name, ("black", "o", 6))
        kwargs = dict(s=size, marker=marker, color=color, alpha=0.6, label=name, linewidths=0)
        left.scatter(exact[order], (np.asarray(expectations[name]) / exact - 1.0)[order], **kwargs)
        right.scatter(exact[order], np.asarray(spreads[name])[order], **kwargs)
    left.axhline(0.0, color="black", linewidth=0.8, label="unbiased")
    right.plot([exact.min(), exact.max()], [exact.min(), exact.max()], color="black", linewidth=0.8, label="std = KL")
    left.set_ylabel("relative bias  E[estimate] / KL - 1")
    left.set_title("bias: expected value of one draw", fontsize=9, loc="left")
    right.set_yscale("log")
    right.set_ylabel("std of one draw (nats)")
    right.set_title("spread: standard deviation of one draw", fontsize=9, loc="left")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("exact KL at the prefix (nats)")
        ax.legend(fontsize=7, markerscale=2)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 7


def plot_success_rates(results: dict, mode: str = "greedy", populations: tuple[str, ...] = ("ID50", "OOD100", "ALL")):
    """Success rate per policy and population with Wilson 95% error bars (chapter 7).

    results: the content of runs/<preset>/evaluation/results.json
    (`labkit.eval.evaluate.compute_results`).  mode "greedy" shows greedy pass@1;
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
    ax.set_title(f"{what}\nALL = {n} responses; whiskers: Wilson 95%", fontsize=9, loc="left")
    # the legend beside the axes, where no bar is
    ax.legend(fontsize=8, title="population", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              frameon=False)
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
    from ..task.verifier import REASONS

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
    # Policies often share a curve exactly (equal counts); distinct markers, dashes and small
    # sideways offsets keep every one of them visible.
    styles = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1)))]
    for i, p in enumerate(policies):
        marker, dashes = styles[i % len(styles)]
        shift = 0.06 * (i - (len(policies) - 1) / 2)
        curve = results["policies"][p]["sample"][population]["pass_at_k"]
        line, = ax.plot([k + shift for k in curve["k"]], [100 * v for v in curve["values"]], marker=marker,
                        linestyle=dashes, label=f"{p} pass@k")
        greedy = 100 * results["policies"][p]["greedy"][population]["success_rate"]
        ax.scatter([shift], [greedy], marker=marker, color=line.get_color())
    budget = results["policies"][policies[0]]["sample"][population]["pass_at_k"]["label"]
    ax.set_xticks([0] + curve["k"], ["greedy\npass@1"] + [f"pass@{k}" for k in curve["k"]])
    ax.axvline(0.5, color="grey", linewidth=0.5)  # greedy pass@1 is one answer, not a point of the curve
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"{population} (%)")
    ax.set_title(budget, fontsize=9, loc="left")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 8


def plot_zero_signal_curve(p: float, points: list[dict], max_group_size: int = 16, p_label: str = "warm start"):
    """The zero-signal fraction p^G + (1-p)^G against G, with each run's measured fraction (chapter 8).

    p: the success rate the curve is drawn for.  points: dicts with "policy", "G",
    "groups" and "measured" (the mean of frac_reward_zero_std over a run's iterations), as
    in budget.json's zero_signal.points.  The measured points come from runs whose policy
    moved while they ran; the curve assumes one fixed p for every prompt.
    """
    from ..grpo.losses import expected_frac_reward_zero_std

    sizes = list(range(1, max_group_size + 1))
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ax.plot(sizes, [expected_frac_reward_zero_std(p, g) for g in sizes], color="tab:gray",
            label=f"$p^G + (1-p)^G$, p = {p:.3f} ({p_label})")
    for pt in points:
        ax.scatter([pt["G"]], [pt["measured"]], zorder=3,
                   label=f"{pt['policy']}: measured over {pt['groups']} groups")
    ax.set_xlabel("group size G")
    ax.set_ylabel("fraction of groups with zero variance")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks([g for g in sizes if g in (1, 2, 4, 8, 16) or g == max_group_size])
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 6


def _rolling_mean(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


GRPO_CURVES = (
    # (history key, panel title, y label)
    ("reward", "mean reward of the iteration's rollouts", "reward"),
    ("frac_reward_zero_std", "frac_reward_zero_std (groups with no signal)", "fraction of groups"),
    ("kl", "exact prefix KL to the reference (2nd update)", "nats per token"),
    ("clip_ratio/region_mean", "clip fraction (2nd update)", "fraction of tokens"),
    ("entropy", "mean token entropy (2nd update)", "nats"),
    ("completions/mean_length", "mean response length", "tokens"),
)


def plot_grpo_curves(history: list[dict], window: int = 10, keys=GRPO_CURVES):
    """Six per-iteration curves of a GRPO run, each with a trailing mean (chapter 6).

    history: the run's history.json, one dict per iteration with "iteration" and the
    keys of `keys` (by default reward, frac_reward_zero_std, kl, clip_ratio/region_mean,
    entropy, completions/mean_length; the KL, clip fraction and entropy are those the
    loop logs, from the iteration's last update).  Thin line: the value of each
    iteration; thick line: the mean of the last `window` iterations.
    """
    if not history:
        raise ValueError("history is empty: no iteration to plot")
    missing = sorted({k for k, _, _ in keys} - set(history[0]))
    if missing:
        raise ValueError(f"history entries lack {missing}; expected a GRPO history.json")
    xs = [h["iteration"] for h in history]
    rows = (len(keys) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(9, 2.3 * rows), sharex=True, squeeze=False)
    for ax, (key, title, ylabel) in zip(axes.flat, keys):
        values = [float(h[key]) for h in history]
        ax.plot(xs, values, color="tab:blue", linewidth=0.7, alpha=0.5, label="per iteration")
        ax.plot(xs, _rolling_mean(values, window), color="tab:blue", linewidth=2.0,
                label=f"mean of last {window}")
        if ylabel.startswith("fraction"):  # a fraction: show it from 0, even when it never leaves 0
            ax.set_ylim(-0.02, max(0.05, 1.05 * max(values)))
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("iteration")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 2 (appended)


def plot_logprob_check(diffs: dict, tol: float = 2e-4, floor: float = 1e-9, starts: list[int] | None = None):
    """|re-scored - recorded| log-prob of every generated token, one series per condition (chapter 2).

    diffs: {label: list of per-token absolute differences}, e.g. eval mode and train
    mode, each over the same tokens in the same order.  Drawn on a log scale with the
    tolerance `tol` as a dashed line; an exact match (0) is drawn at `floor`.
    starts: optional 1-based token positions where a new rollout begins (thin vertical lines).
    """
    styles = [("tab:blue", "o"), ("tab:red", "x"), ("tab:green", "s"), ("tab:purple", "^")]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for start in (starts or [])[1:]:
        ax.axvline(start - 0.5, color="grey", linewidth=0.5)
    for (label, values), (color, marker) in zip(diffs.items(), styles):
        shown = [max(float(v), floor) for v in values]
        ax.scatter(range(1, len(shown) + 1), shown, s=14, color=color, marker=marker, label=label)
    ax.axhline(tol, color="black", linestyle="--", linewidth=0.8, label=f"tolerance {tol:g}")
    ax.set_yscale("log")
    largest = max((float(v) for values in diffs.values() for v in values), default=0.0)
    ax.set_ylim(floor / 2, max(10.0, 2 * largest))  # every point inside the axes, the largest included
    ax.set_xlabel("generated token (the group's rollouts one after another)")
    ax.set_ylabel(f"|re-scored - recorded|\n(0 drawn at {floor:g})", fontsize=8)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=len(diffs) + 1, frameon=False)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 4 (appended)


def plot_ratio_history(history: list[dict], clip_eps: float = 0.2, tol: float = 2e-4):
    """The largest |rho - 1| over the batch in each update of a GRPO run, per iteration (chapter 4).

    history: the run's history.json; each entry's "updates" holds one dict per update
    with "ratio/min" and "ratio/max".  One series per update index (the first update
    sees the policy that sampled, so rho differs from 1 only by rounding; the second
    sees one real update), on a log scale, with the clip edge `clip_eps` (dotted) and
    the recorded-log-prob tolerance `tol` (dashed).
    """
    if not history:
        raise ValueError("history is empty: no iteration to plot")
    xs = [h["iteration"] for h in history]
    names = ["first update (policy = old)", "second update (one update after sampling)"]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for u in range(max(len(h["updates"]) for h in history)):
        points = [(x, max(h["updates"][u]["ratio/max"] - 1.0, 1.0 - h["updates"][u]["ratio/min"]))
                  for x, h in zip(xs, history) if len(h["updates"]) > u]
        label = names[u] if u < len(names) else f"update {u + 1}"
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, linewidth=0.8, label=label)
    ax.axhline(clip_eps, color="tab:red", linestyle=":", linewidth=1.0,
               label=rf"clip edge $|\rho - 1| = \epsilon = {clip_eps:g}$")
    ax.axhline(tol, color="grey", linestyle="--", linewidth=0.8, label=f"recorded log-prob tolerance ({tol:g})")
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * 300)  # room for the legend above the data
    ax.set_xlabel("GRPO iteration")
    ax.set_ylabel(r"largest $|\rho - 1|$ in the batch")
    ax.legend(fontsize=7, ncol=2, loc="upper center")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 9 (appended)


def _rolling_mean_skipping_none(values: list, window: int) -> list[float]:
    """Trailing mean over the last `window` values, None left out (NaN where a window holds none)."""
    out = []
    for i in range(len(values)):
        kept = [float(v) for v in values[max(0, i - window + 1): i + 1] if v is not None]
        out.append(sum(kept) / len(kept) if kept else float("nan"))
    return out


VARIANT_CURVES = (
    # (curve key in the sweep's results.json, panel title, y label, y scale)
    ("reward", "true (verifier) reward", "reward", "linear"),
    ("optimised_reward", "optimised reward (what the loss saw)", "reward", "linear"),
    ("optimised/frac_reward_zero_std", "zero-variance groups (optimised reward)", "fraction of groups", "linear"),
    ("entropy", "mean token entropy (last update)", "nats", "linear"),
    ("completions/mean_length", "mean response length", "tokens", "linear"),
    ("kl", "exact prefix KL to the reference (last update; log scale)", "nats per token", "log"),
    ("clip_ratio/region_mean", "clip fraction (last update)", "fraction of tokens", "linear"),
)


def plot_variant_curves(curves: dict[str, dict[str, list]], window: int = 10, keys=VARIANT_CURVES,
                        styles: dict[str, dict] | None = None):
    """Small multiples: one panel per logged quantity, one line per run, on shared axes (chapter 9).

    curves: {run name: {key: one value per iteration}} (the sweep's results.json "curves"); a
    None (an RFT iteration that made no update) is left out of the trailing mean of `window`
    iterations, which is what each line shows.  keys: (key, title, y label, y scale) per panel.
    styles: optional matplotlib keyword arguments per run (colour, line style).  All panels share
    the iteration axis, and every run of a panel is drawn on that panel's one scale.
    """
    if not curves:
        raise ValueError("no runs to plot")
    rows = (len(keys) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(9.5, 2.2 * rows + 0.9), sharex=True, squeeze=False)
    for ax, (key, title, ylabel, scale) in zip(axes.flat, keys):
        for name, run in curves.items():
            values = _rolling_mean_skipping_none(run[key], window)
            if scale == "log":  # a zero (no update moved the policy yet) has no place on a log axis
                values = [v if v > 0 else float("nan") for v in values]
            style = {"linewidth": 1.3, **(styles or {}).get(name, {})}
            ax.plot(range(1, len(values) + 1), values, label=name, **style)
        ax.set_yscale(scale)
        if ylabel.startswith("fraction"):  # from 0, with a margin proportional to the data
            top = max(ax.get_ylim()[1], 1e-3)
            ax.set_ylim(-0.04 * top, top)
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for k, ax in enumerate(axes.flat[:len(keys)]):
        if k + 2 >= len(keys):  # no panel below this one: it carries the iteration axis
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("iteration", fontsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def plot_variant_intervals(evaluations: dict[str, dict], reference: str | None = None,
                           modes: tuple[str, ...] = ("greedy", "sample"),
                           populations: tuple[str, ...] = ("ALL", "ID50", "OOD100")):
    """Forest plot: each run's success rate with its Wilson 95% interval, per mode and population (chapter 9).

    evaluations: {run name: evaluation} as in the sweep's results.json (per mode and population a
    summary with "success_rate" and "success_rate_ci"), drawn top to bottom in that order.
    reference: a run whose interval is shaded in every panel, so an overlap can be read off.
    """
    names = list(evaluations)
    fig, axes = plt.subplots(len(populations), len(modes), figsize=(4.6 * len(modes), 0.28 * len(names) * len(populations) + 1.2),
                             sharey=True, squeeze=False)
    for i, population in enumerate(populations):
        for j, mode in enumerate(modes):
            ax = axes[i][j]
            for k, name in enumerate(names):
                s = evaluations[name][mode][population]
                rate, (low, high) = 100 * s["success_rate"], s["success_rate_ci"]
                ax.errorbar([rate], [k], xerr=[[rate - 100 * low], [100 * high - rate]], fmt="o", markersize=3.5,
                            capsize=2.5, color="tab:red" if name == reference else "tab:blue", linewidth=1)
            if reference is not None:
                low, high = evaluations[reference][mode][population]["success_rate_ci"]
                ax.axvspan(100 * low, 100 * high, color="tab:red", alpha=0.12, linewidth=0)
            what = "greedy pass@1" if mode == "greedy" else "per-draw success"
            n = evaluations[names[0]][mode][population]["responses"]
            ax.set_title(f"{population}, {what} (n = {n})", fontsize=9, loc="left")
            ax.tick_params(labelsize=8)
            if i == len(populations) - 1:
                ax.set_xlabel("success rate (%), whiskers: Wilson 95%", fontsize=8)
    axes[0][0].set_yticks(range(len(names)), names)
    axes[0][0].invert_yaxis()
    fig.tight_layout()
    return fig


def plot_ratio_and_clip(histories: dict[str, list[dict]], clip_eps: float = 0.2, tol: float = 2e-4):
    """Left: the largest |rho - 1| of each update, per iteration; right: each update's clip fraction (chapter 9).

    histories: {run name: its history.json}; every update of every iteration is drawn, one
    series per (run, update index), so a run with one update per iteration has one series.
    The clip edge eps (dotted) and the recorded-log-prob tolerance (dashed) frame the left panel.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.5, 3.4))
    markers = ("o", "x", "s", "^")
    for r, (name, history) in enumerate(histories.items()):
        for u in range(max(len(h["updates"]) for h in history)):
            rows = [(h["iteration"], h["updates"][u]) for h in history if len(h["updates"]) > u]
            label = f"{name}, update {u + 1}"
            style = {"marker": markers[u % len(markers)], "markersize": 3, "linewidth": 0.7, "color": f"C{r}",
                     "alpha": 1.0 if u == 0 else 0.6}
            left.plot([x for x, _ in rows], [max(d["ratio/max"] - 1.0, 1.0 - d["ratio/min"]) for _, d in rows],
                      label=label, **style)
            right.plot([x for x, _ in rows], [d["clip_ratio/region_mean"] for _, d in rows], label=label, **style)
    left.axhline(clip_eps, color="tab:red", linestyle=":", linewidth=1.0, label=rf"clip edge $\epsilon = {clip_eps:g}$")
    left.axhline(tol, color="grey", linestyle="--", linewidth=0.8, label=f"log-prob check tolerance {tol:g}")
    left.set_yscale("log")
    left.set_ylabel(r"largest $|\rho - 1|$ in the batch", fontsize=8)
    right.set_ylabel("clip fraction (tokens)", fontsize=8)
    for ax in (left, right):
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=8)
    right.set_ylim(bottom=-0.04 * max(right.get_ylim()[1], 1e-3))
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    return fig


def plot_std_amplification(spreads: list[float], scaled: list[float], unscaled: list[float],
                           reference: float | None = None):
    """The largest advantage of a group [0.5 + d, 0.5, ..., 0.5] against d, with and without the std (chapter 9).

    spreads: the d values (> 0, log axis); scaled, unscaled: the group's largest advantage for
    each, GRPO's (divided by the std) and Dr. GRPO's (centred only).  reference: the largest
    advantage a 0/1 group can get, drawn as a dashed line.
    """
    fig, ax = plt.subplots(figsize=(6.2, 3.3))
    ax.plot(spreads, scaled, marker="o", markersize=3, label="GRPO: (r - mean) / (std + 1e-8)")
    ax.plot(spreads, unscaled, marker="s", markersize=3, label="Dr. GRPO: r - mean")
    if reference is not None:
        ax.axhline(reference, color="grey", linestyle="--", linewidth=0.8,
                   label=f"largest advantage of a 0/1 group ({reference:.3f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("reward difference d of one response (the others 0.5)")
    ax.set_ylabel("largest advantage in the group")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_kl_gradients(labels: list[str], gradients: dict[str, list[float]]):
    """Grouped bars: gradients with respect to the current policy's logits, one group per token (chapter 9).

    labels: the vocabulary entries; gradients: {name: one value per entry}, e.g. the exact
    expected gradient of the k3 penalty and the gradients of KL(cur || ref) and KL(ref || cur).
    """
    width = 0.8 / len(gradients)
    fig, ax = plt.subplots(figsize=(6.2, 3.0))
    for j, (name, values) in enumerate(gradients.items()):
        xs = [i + (j - (len(gradients) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, values, width, label=name)
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("token of the toy vocabulary")
    ax.set_ylabel("gradient w.r.t. its logit")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- chapter 10


def plot_proxy_vs_true(proxy: list[float], true: list[float], reference: list[float] | None = None,
                       window: int = 10, reference_label: str = "protocol GRPO: true reward",
                       labels: tuple[str, str] = ("learned reward: proxy (what the loss saw)",
                                                  "learned reward: true (verifier) reward")):
    """The optimised (proxy) reward and the true (verifier) reward of one run per iteration (chapter 10).

    proxy, true: one value per iteration, each the mean over the iteration's rollouts (a run's
    history.json "optimised_reward" and "reward"); reference: optionally another run's true reward
    (the protocol's GRPO run), drawn grey.  Every line is the trailing mean of `window` iterations,
    all on one reward axis, so a gap between proxy and truth reads directly as a gap.  labels: the
    legend's names of the proxy and the true curve.
    """
    if len(proxy) != len(true) or not proxy:
        raise ValueError(f"proxy ({len(proxy)}) and true ({len(true)}) need one value per iteration each")
    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    xs = range(1, len(proxy) + 1)
    ax.plot(xs, _rolling_mean(list(proxy), window), color="tab:red", linewidth=2.0, label=labels[0])
    ax.plot(xs, _rolling_mean(list(true), window), color="tab:blue", linewidth=2.0, label=labels[1])
    if reference is not None:
        ax.plot(range(1, len(reference) + 1), _rolling_mean(list(reference), window), color="grey", linewidth=1.4,
                linestyle="--", label=reference_label)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"mean reward (trailing mean of {window})")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_from_start(curves: dict[str, dict[str, list[float]]], start_levels: dict[str, dict[str, float]],
                    window: int = 10, keys: tuple[tuple[str, str], ...] = (
                        ("valid_json", "share of valid lab-format answers"), ("reward", "true (verifier) reward"))):
    """Per-iteration curves of runs from different starts, each against its start's own level (chapter 10).

    curves: {run name: {key: one value per iteration}} (the sweep's results "curves");
    start_levels: {run name: {key: the start model's own value}} (e.g. its measured share of valid
    answers before any update), drawn as a dashed horizontal line of the run's colour; a run or
    key missing from it gets no line.  One panel per (key, title) of `keys`, trailing means of
    `window` iterations, y from 0 to 1.
    """
    if not curves:
        raise ValueError("no runs to plot")
    fig, axes = plt.subplots(1, len(keys), figsize=(4.8 * len(keys), 3.4), squeeze=False)
    for ax, (key, title) in zip(axes[0], keys):
        for k, (name, run) in enumerate(curves.items()):
            values = [float(v) for v in run[key]]
            ax.plot(range(1, len(values) + 1), _rolling_mean(values, window), color=f"C{k}", linewidth=1.8,
                    label=f"{name} (trailing mean of {window})")
            level = start_levels.get(name, {}).get(key)
            if level is not None:
                ax.axhline(level, color=f"C{k}", linestyle="--", linewidth=1.0, label=f"{name}: its start, before RL")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_xlabel("iteration", fontsize=8)
        ax.set_ylabel("share of the iteration's rollouts", fontsize=8)
        ax.tick_params(labelsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_difficulty_profiles(profiles: dict[str, dict], axis: str = "carries",
                             modes: tuple[str, ...] = ("greedy", "sample")):
    """Accuracy per difficulty bin, one series per policy, with Wilson 95% whiskers (chapter 10).

    profiles: {policy name: labkit.eval.difficulty.profile(...)}, each with profile[axis]["bins"] and,
    per mode, {bin: {"n", "correct", "rate", "interval"}} (rate and interval None for an empty
    bin, which is left out).  One panel per mode; the policies' points are side by side within
    each bin.
    """
    if not profiles:
        raise ValueError("no profiles to plot")
    names = list(profiles)
    bins = profiles[names[0]][axis]["bins"]
    width = 0.8 / len(names)
    fig, axes = plt.subplots(1, len(modes), figsize=(5.0 * len(modes), 3.6), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for k, name in enumerate(names):
            cells = profiles[name][axis][mode]
            xs, ys, lows, highs = [], [], [], []
            for i, b in enumerate(bins):
                cell = cells[b]
                if cell["n"] == 0:
                    continue
                xs.append(i + (k - (len(names) - 1) / 2) * width)
                ys.append(100 * cell["rate"])
                lows.append(100 * (cell["rate"] - cell["interval"][0]))
                highs.append(100 * (cell["interval"][1] - cell["rate"]))
            ax.errorbar(xs, ys, yerr=[lows, highs], fmt="o", markersize=3.5, capsize=2, linewidth=1,
                        color=f"C{k}", label=name)
        what = "greedy pass@1 (problems)" if mode == "greedy" else "per-draw success (draws)"
        ax.set_title(f"{what}, by {axis}", fontsize=9, loc="left")
        ax.set_xticks(range(len(bins)), bins)
        ax.set_xlabel("carries + borrows" if axis == "carries" else "target", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.set_ylim(-3, 103)
    axes[0][0].set_ylabel("success rate (%), whiskers: Wilson 95%", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    return fig


# ---------------------------------------------------------------- chapters 6-7: what GRPO changed


CHECKPOINT_CURVES = (("sampled_success", "per-draw success\n(fixed draws)"), ("greedy_success", "greedy success"),
                     ("entropy", "mean token entropy"), ("kl", "exact KL to the\nreference, per token"))


def plot_checkpoint_curves(curves: dict[str, list[dict]], keys=CHECKPOINT_CURVES, x: str = "iteration",
                           title: str | None = None):
    """Fixed-prompt checkpoint curves of several runs, one panel per measure (chapter 6).

    curves: {run label: the run's checkpoint records (labkit.grpo.checkpoint_curves)}, each record with
    "iteration" and the keys.  Every run starts from its own iteration-0 record: its start is drawn
    as a dotted horizontal line in its colour, so a run's movement is read against where it began.
    x: "iteration", or "rollouts" (iteration x the run's rollouts per iteration, given in each
    record as "rollouts_per_iteration") to put runs of different batch sizes on one axis.
    """
    fig, axes = plt.subplots(1, len(keys), figsize=(3.1 * len(keys), 3.0), squeeze=False)
    styles = ["o-", "s-", "^-", "D-", "v-"]
    for i, (label, records) in enumerate(curves.items()):
        xs = [r["iteration"] * (r.get("rollouts_per_iteration", 1) if x == "rollouts" else 1) for r in records]
        for ax, (key, name) in zip(axes[0], keys):
            line, = ax.plot(xs, [r[key] for r in records], styles[i % len(styles)], markersize=3.5, label=label)
            ax.axhline(records[0][key], color=line.get_color(), linestyle=":", linewidth=0.8)
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("rollouts sampled" if x == "rollouts" else "iteration", fontsize=8)
    for ax, (key, _) in zip(axes[0], keys):
        if key.endswith("success"):
            ax.set_ylim(0, 1)
        ax.tick_params(labelsize=8)
    axes[0][0].legend(fontsize=7, loc="lower left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_problem_transitions(tables: dict[str, list[list[int]]], a_name: str, b_name: str):
    """Per-problem transitions from policy A to policy B (chapter 7): one heatmap per table.

    tables: {panel title: paired.transition_counts table}, e.g. greedy (2 x 2) and per draw
    (5 x 5); entry [i][j] = problems with i successes under A and j under B.  Cells above the
    diagonal are problems B does better on, below it worse; every cell is labelled with its count.
    """
    fig, axes = plt.subplots(1, len(tables), figsize=(3.4 * len(tables), 3.3), squeeze=False)
    for ax, (name, table) in zip(axes[0], tables.items()):
        n = len(table)
        # the darkest cell at mid-blue, so that every count stays readable on its cell
        ax.imshow(table, cmap="Blues", origin="lower", vmin=0, vmax=2 * max(max(row) for row in table) or 1)
        for i in range(n):
            for j in range(n):
                colour = "tab:green" if j > i else "tab:red" if j < i else "black"
                ax.text(j, i, str(table[i][j]), ha="center", va="center", fontsize=9, color=colour,
                        fontweight="bold" if i != j and table[i][j] else "normal")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xlabel(f"{b_name}: successes", fontsize=8)
        ax.set_ylabel(f"{a_name}: successes", fontsize=8)
        ax.set_title(name, fontsize=9)
    fig.tight_layout()
    return fig


def plot_pass_at_k_panels(panels: dict[str, dict[str, tuple[list[int], list[float]]]],
                          greedy: dict[str, dict[str, float]] | None = None, title: str = ""):
    """pass@k against k (log axis), one panel per population (chapter 7).

    panels: {population: {policy label: (ks, values)}}, values in [0, 1]; greedy: optionally
    {population: {policy label: greedy pass@1}}, drawn as a star at k = 1 in the policy's colour.
    Every panel has the same policies in the same colours, and the same 0-100% axis.
    """
    if not panels:
        raise ValueError("no panel to draw")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.0 * len(panels), 3.4), squeeze=False, sharey=True)
    colours = {}
    for ax, (population, curves) in zip(axes[0], panels.items()):
        for label, (ks, values) in curves.items():
            if len(ks) != len(values) or not ks:
                raise ValueError(f"{population}/{label}: {len(ks)} k values and {len(values)} pass@k values")
            colour = colours.setdefault(label, f"C{len(colours)}")
            ax.plot(ks, [100 * v for v in values], "o-", markersize=3.5, color=colour, label=f"{label} pass@k")
            if greedy and label in greedy.get(population, {}):
                ax.scatter([1], [100 * greedy[population][label]], marker="*", s=90, color=colour, zorder=3,
                           label=f"{label} greedy")
        ks = sorted({k for ks, _ in curves.values() for k in ks})
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k (samples per problem)", fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_title(population, fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0][0].set_ylabel("problems solved (%)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_overoptimisation(settings: dict[str, list[dict]], best_of_n: dict[str, list[dict]],
                          colours: dict[str, str] | None = None):
    """True and proxy reward against sqrt(KL) to the start (chapter 10, after Gao et al. 2022).

    settings: {GRPO setting name: its checkpoint curves} (labkit.studies.overoptimisation records: each
    point's "sequence_kl", "true_success", "proxy_yes"); best_of_n: {proxy name: points} of
    labkit.studies.overoptimisation_summary.best_of_n_table (each "sqrt_kl", "true", "proxy_p").  Three
    panels: (a) GRPO, true reward solid and proxy reward dashed, one colour per setting; (b) the
    gap proxy - true of (a); (c) best-of-n, true solid and proxy's mean p dashed, one colour per
    proxy.  y from 0 to 1 on (a) and (c)."""
    if not settings or not best_of_n:
        raise ValueError("need at least one GRPO setting and one best-of-n proxy to draw")
    palette = ["tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple", "tab:brown", "tab:pink"]
    colours = colours or {}
    fig, axes = plt.subplots(1, 3, figsize=(13.0, 4.2))
    for k, (name, curves) in enumerate(settings.items()):
        colour = colours.get(name, palette[k % len(palette)])
        x = [math.sqrt(c["sequence_kl"]) for c in curves]
        axes[0].plot(x, [c["true_success"] for c in curves], color=colour, linewidth=2.0, marker="o", markersize=3,
                     label=f"{name}: true")
        axes[0].plot(x, [c["proxy_yes"] for c in curves], color=colour, linewidth=1.4, linestyle="--")
        axes[1].plot(x, [c["proxy_yes"] - c["true_success"] for c in curves], color=colour, linewidth=2.0,
                     marker="o", markersize=3, label=name)
    axes[0].plot([], [], color="grey", linestyle="--", label="dashed: the proxy's reward")
    axes[0].set_title("(a) GRPO against a proxy", fontsize=10)
    axes[0].set_ylabel("share of 200 x 4 validation answers")
    axes[1].set_title("(b) the gap: proxy - true", fontsize=10)
    axes[1].set_ylabel("proxy reward - true reward")
    axes[1].axhline(0.0, color="black", linewidth=0.8)
    for k, (name, points) in enumerate(best_of_n.items()):
        colour = colours.get(name, palette[k % len(palette)])
        x = [p["sqrt_kl"] for p in points]
        axes[2].plot(x, [p["true"] for p in points], color=colour, linewidth=2.0, marker="o", markersize=3,
                     label=f"{name}: true")
        axes[2].plot(x, [p["proxy_p"] for p in points], color=colour, linewidth=1.4, linestyle="--")
        for p in points:
            if k == 0:
                axes[2].annotate(f"n={p['n']}", (p["sqrt_kl"], 0.02), fontsize=7, ha="center")
    axes[2].plot([], [], color="grey", linestyle="--", label="dashed: the proxy's mean p")
    axes[2].set_title("(c) best-of-n of the warm start against a proxy", fontsize=10)
    axes[2].set_ylabel("expected reward of the pick")
    for ax in (axes[0], axes[2]):
        ax.set_ylim(0.0, 1.02)
    for ax in axes:
        ax.set_xlabel("sqrt(KL to the start), sqrt(nats)")
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig
