"""Chapter 7's figures take plain data, and the chapter is numbered, captioned and cited in order.
Nothing here executes the notebook (nbval does)."""

from __future__ import annotations

import re

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")

from labkit.book import plots  # noqa: E402
from labkit.lab.runs import REPO_ROOT  # noqa: E402

CHAPTER = REPO_ROOT / "notebooks" / "07_evaluation.ipynb"


def test_pass_at_k_panels_draw_one_panel_per_population_with_the_same_colours():
    ks = [1, 2, 4, 8]
    panels = {"ALL": {"warm start": (ks, [0.4, 0.5, 0.6, 0.7]), "larger run": (ks, [0.5, 0.55, 0.6, 0.65])},
              "OOD100": {"warm start": (ks, [0.2, 0.3, 0.4, 0.5]), "larger run": (ks, [0.25, 0.3, 0.35, 0.4])}}
    fig = plots.plot_pass_at_k_panels(panels, greedy={"ALL": {"warm start": 0.6}}, title="t")
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == ["ALL", "OOD100"]
    assert all(len(ax.get_lines()) == 2 and ax.get_ylim() == (0, 100) for ax in axes)
    assert [list(line.get_ydata()) for line in axes[0].get_lines()][0] == pytest.approx([40, 50, 60, 70])
    assert [line.get_color() for line in axes[0].get_lines()] == [line.get_color() for line in axes[1].get_lines()]
    assert len(axes[0].collections) == 1 and len(axes[1].collections) == 0  # the greedy star only where given
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["1", "2", "4", "8"]
    matplotlib.pyplot.close(fig)


def test_pass_at_k_panels_refuse_empty_or_mismatched_data():
    with pytest.raises(ValueError):
        plots.plot_pass_at_k_panels({})
    with pytest.raises(ValueError):
        plots.plot_pass_at_k_panels({"ALL": {"a": ([1, 2], [0.5])}})


def test_problem_transitions_label_every_cell():
    fig = plots.plot_problem_transitions({"greedy": [[3, 1], [2, 4]]}, "warm start", "GRPO")
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["1", "2", "3", "4"]
    matplotlib.pyplot.close(fig)


def _cells(kind: str) -> list[str]:
    return [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.cell_type == kind]


def test_sections_and_figures_are_numbered_in_order_and_every_figure_is_captioned():
    text = "\n".join(_cells("markdown"))
    sections = [int(n) for n in re.findall(r"^## 7\.(\d+) ", text, re.MULTILINE)]
    assert sections == list(range(1, len(sections) + 1))
    figures = [int(n) for n in re.findall(r"\*\*Figure 7\.(\d+)\.\*\*", text)]
    assert figures == list(range(1, len(figures) + 1))
    assert sum(source.count("plt.show()") for source in _cells("code")) == len(figures)
    for n in re.findall(r"[Ss]ection 7\.(\d+)", text):  # every reference names a section that exists
        assert int(n) in sections, n
    for n in re.findall(r"Figure 7\.(\d+)", text):
        assert int(n) in figures, n


def test_every_citation_is_in_the_bibliography():
    bib = (REPO_ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    keys = set(re.findall(r"^@\w+\{(\w+),", bib, re.MULTILINE))
    groups = re.findall(r"\{cite:[pt]\}`([^`]+)`", "\n".join(_cells("markdown")))
    cited = {key.strip() for group in groups for key in group.split(",")}
    assert "yue2025rlvrboundary" in cited and cited <= keys, sorted(cited - keys)


def test_success_rate_legend_sits_beside_the_bars_and_the_title_inside_the_figure():
    """Figures 7.1 and 7.2: no legend over a bar, no title past the figure's edge."""
    import matplotlib

    matplotlib.use("Agg")
    from labkit.lab.runs import REPO_ROOT, read_json

    results = read_json(REPO_ROOT / "runs" / "tiny" / "evaluation" / "results.json")
    for mode in ("greedy", "sample"):
        fig = plots.plot_success_rates(results, mode=mode)
        fig.canvas.draw()
        ax = fig.axes[0]
        renderer = fig.canvas.get_renderer()
        legend = ax.get_legend().get_window_extent(renderer)
        assert legend.x0 >= ax.get_window_extent(renderer).x1  # right of the axes
        title = ax.title.get_window_extent(renderer)
        assert title.x1 <= fig.bbox.x1 and title.y1 <= fig.bbox.y1
        plots.plt.close(fig)
