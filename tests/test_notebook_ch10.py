"""Chapter 10's notebook is wired into the book, numbered and captioned in order, and its figures
take plain data.  Nothing here executes the notebook (nbval does: `make notebooks`)."""

from __future__ import annotations

import re

import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")

from labkit.book import plots  # noqa: E402
from labkit.lab.runs import REPO_ROOT  # noqa: E402

CHAPTER = REPO_ROOT / "notebooks" / "10_hacking_and_zero.ipynb"


def _markdown() -> list[str]:
    return [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.cell_type == "markdown"]


def test_the_chapter_is_in_the_toc_after_chapter_9_and_linked_from_the_introduction_and_chapter_9():
    toc = (REPO_ROOT / "_toc.yml").read_text(encoding="utf-8")
    assert toc.index("notebooks/09_variants") < toc.index("notebooks/10_hacking_and_zero")
    assert "../notebooks/10_hacking_and_zero.ipynb" in (REPO_ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    nine = nbformat.read(REPO_ROOT / "notebooks" / "09_variants.ipynb", as_version=4)
    assert "(10_hacking_and_zero.ipynb)" in nine.cells[-1].source


def test_sections_are_numbered_in_order_and_every_figure_has_one_numbered_caption():
    text = "\n".join(_markdown())
    sections = [int(n) for n in re.findall(r"^## 10\.(\d+) ", text, re.MULTILINE)]
    assert sections == list(range(1, len(sections) + 1)) and len(sections) >= 9
    figures = [int(n) for n in re.findall(r"\*\*Figure 10\.(\d+)\.\*\*", text)]
    assert figures == list(range(1, len(figures) + 1))
    code = [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.cell_type == "code"]
    shown = sum(source.count("plt.show()") for source in code)
    assert shown == len(figures)


def test_every_citation_is_in_the_bibliography():
    bib = (REPO_ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    keys = set(re.findall(r"^@\w+\{(\w+),", bib, re.MULTILINE))
    groups = re.findall(r"\{cite:[pt]\}`([^`]+)`", "\n".join(_markdown()))
    cited = {key.strip() for group in groups for key in group.split(",")}
    assert cited and cited <= keys, sorted(cited - keys)


def _profile(rates: dict[str, tuple[int, int]]) -> dict:
    cells = {b: {"n": n, "correct": c, "rate": c / n if n else None, "interval": [0.0, 1.0] if n else None}
             for b, (c, n) in rates.items()}
    return {"carries": {"bins": list(rates), "greedy": cells, "sample": cells}}


def test_the_chapter_10_figures_take_plain_data_and_refuse_empty_input():
    fig = plots.plot_proxy_vs_true([0.5, 0.6, 0.7], [0.5, 0.5, 0.4], reference=[0.5, 0.55, 0.6], window=2)
    assert len(fig.axes[0].lines) == 3 and fig.axes[0].get_xlabel() == "iteration"
    with pytest.raises(ValueError, match="one value per iteration"):
        plots.plot_proxy_vs_true([0.5], [0.5, 0.4])
    fig = plots.plot_from_start({"a": {"valid_json": [0.0, 0.5], "reward": [0.0, 0.25]}},
                                {"a": {"valid_json": 0.05}})
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 2 and len(fig.axes[1].lines) == 1  # no level for reward
    with pytest.raises(ValueError, match="no runs"):
        plots.plot_from_start({}, {})
    fig = plots.plot_difficulty_profiles({"p": _profile({"0": (1, 2), "1": (0, 0)}),
                                          "q": _profile({"0": (2, 2), "1": (1, 4)})})
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["0", "1"]
    with pytest.raises(ValueError, match="no profiles"):
        plots.plot_difficulty_profiles({})
    curves = [{"sequence_kl": 0.0, "true_success": 0.6, "proxy_yes": 0.7},
              {"sequence_kl": 0.25, "true_success": 0.4, "proxy_yes": 0.9}]
    points = [{"n": 1, "sqrt_kl": 0.0, "true": 0.6, "proxy_p": 0.65}, {"n": 2, "sqrt_kl": 0.44, "true": 0.7, "proxy_p": 0.7}]
    fig = plots.plot_overoptimisation({"s": curves}, {"base_100": points})
    assert len(fig.axes) == 3
    true_line, proxy_line = fig.axes[0].lines[:2]
    assert list(true_line.get_xdata()) == [0.0, 0.5] and list(proxy_line.get_ydata()) == [0.7, 0.9]
    assert [round(y, 12) for y in fig.axes[1].lines[0].get_ydata()] == [0.1, 0.5]  # the gap, proxy - true
    with pytest.raises(ValueError, match="at least one GRPO setting"):
        plots.plot_overoptimisation({}, {"base_100": points})
    matplotlib.pyplot.close("all")
