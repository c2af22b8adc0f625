"""The results page's figure (labkit.book.results_page): each policy's success with its Wilson 95% interval.

Kept apart from labkit.book.plots (the chapters' figures) because the page writes it to a file that
`python -m labkit.book.build results-page --check` compares byte for byte: it is drawn on a bare
matplotlib Figure with the Agg canvas (pyplot and the session's backend are never touched), under
matplotlib's default style (a user's matplotlibrc changes nothing), at a fixed size and
resolution, and saved with no "Software" metadata, so the same data give the same PNG bytes.
"""

from __future__ import annotations

import io

import matplotlib.style
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FIGSIZE = (9.0, 4.2)  # inches
DPI = 100
COLORS = ("tab:gray", "tab:blue", "tab:red", "tab:orange", "tab:purple", "tab:green", "tab:brown", "tab:pink")
PANELS = (("greedy", "greedy pass@1"), ("sample", "per-draw success"))


def results_figure(series: dict[str, dict], populations: tuple[str, ...]) -> Figure:
    """Two panels (greedy pass@1, per-draw success); in each, one point per policy and population.

    series: {policy: {mode: {population: {"correct", "responses", "success_rate", "success_rate_ci"}}}},
    in the order the legend lists them (the shape of results.json's policies).  Each point is the
    rate, its bar the Wilson 95% interval [low, high], both in percent.
    """
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(PANELS), sharey=True)
    width = 0.8 / max(1, len(series))
    for ax, (mode, title) in zip(axes, PANELS):
        for i, (policy, modes) in enumerate(series.items()):
            xs = [j - 0.4 + width * (i + 0.5) for j in range(len(populations))]
            rates = [100 * modes[mode][p]["success_rate"] for p in populations]
            lows = [r - 100 * modes[mode][p]["success_rate_ci"][0] for r, p in zip(rates, populations)]
            highs = [100 * modes[mode][p]["success_rate_ci"][1] - r for r, p in zip(rates, populations)]
            ax.errorbar(xs, rates, yerr=[lows, highs], fmt="o", ms=4, capsize=2, lw=1.2,
                        color=COLORS[i % len(COLORS)], label=policy)
        responses = [next(iter(series.values()))[mode][p]["responses"] for p in populations]
        ax.set_xticks(range(len(populations)))
        ax.set_xticklabels([f"{p}\n({n} responses)" for p, n in zip(populations, responses)])
        ax.set_xlim(-0.5, len(populations) - 0.5)
        ax.set_ylim(0, 100)
        ax.set_title(f"{title}, Wilson 95% intervals", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("success (%)")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(series), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def png_bytes(series: dict[str, dict], populations: tuple[str, ...]) -> bytes:
    """results_figure as PNG bytes: the same data give the same bytes (default style, no metadata)."""
    with matplotlib.style.context("default"):
        fig = results_figure(series, populations)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()
