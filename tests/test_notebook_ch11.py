"""Chapter 11's notebook is wired into the book, numbered and captioned in order, and its figures take
plain data.  Nothing here executes the notebook (nbval does: `make notebooks`)."""

from __future__ import annotations

import re

import matplotlib
import nbformat

matplotlib.use("Agg")

from labkit.book import plots_reasoning  # noqa: E402
from labkit.lab.runs import REPO_ROOT  # noqa: E402

CHAPTER = REPO_ROOT / "notebooks" / "11_reasoning.ipynb"


def _markdown() -> list[str]:
    return [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.cell_type == "markdown"]


def test_the_chapter_follows_chapter_10_in_the_toc_and_is_linked_from_the_introduction_and_chapter_10():
    toc = (REPO_ROOT / "_toc.yml").read_text(encoding="utf-8")
    assert toc.index("notebooks/10_hacking_and_zero") < toc.index("notebooks/11_reasoning") < toc.index("book/results")
    assert "../notebooks/11_reasoning.ipynb" in (REPO_ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    ten = nbformat.read(REPO_ROOT / "notebooks" / "10_hacking_and_zero.ipynb", as_version=4)
    assert "(11_reasoning.ipynb)" in ten.cells[-1].source


def test_sections_are_numbered_in_order_and_every_figure_has_one_numbered_caption():
    text = "\n".join(_markdown())
    sections = [int(n) for n in re.findall(r"^## 11\.(\d+) ", text, re.MULTILINE)]
    assert sections == list(range(1, len(sections) + 1)) and len(sections) >= 8
    figures = [int(n) for n in re.findall(r"\*\*Figure 11\.(\d+)\.\*\*", text)]
    assert figures == list(range(1, len(figures) + 1)) and len(figures) >= 2
    code = [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.cell_type == "code"]
    assert sum(source.count("plt.show()") for source in code) == len(figures)


def test_every_citation_is_in_the_bibliography():
    bib = (REPO_ROOT / "book" / "references.bib").read_text(encoding="utf-8")
    keys = set(re.findall(r"^@\w+\{(\w+),", bib, re.MULTILINE))
    groups = re.findall(r"\{cite:[pt]\}`([^`]+)`", "\n".join(_markdown()))
    cited = {key.strip() for group in groups for key in group.split(",")}
    assert cited and cited <= keys, sorted(cited - keys)


def _line(iteration: int, think: float) -> dict:
    return {"iteration": iteration, "think_rate": think, "mean_tokens": 9 + 80 * think, "accuracy": think / 2}


def test_the_figures_take_plain_data():
    fig = plots_reasoning.plot_think_curves({"a": [_line(1, 0.0), _line(2, 0.5)], "b": [_line(1, 0.1), _line(2, 0.2)]})
    assert [len(ax.lines) for ax in fig.axes] == [2, 2, 2]
    assert fig.axes[1].lines[0].get_ydata().tolist() == [9.0, 49.0]
    row = lambda t, a, at, ad: {"think_rate": t, "accuracy": a, "accuracy_thinking": at, "accuracy_direct": ad}  # noqa: E731
    fig = plots_reasoning.plot_profile_before_after({1: row(0.1, 0.2, 0.5, 0.1), 2: row(0.0, 0.0, None, 0.0)},
                                                    {1: row(0.9, 0.6, 0.6, None), 2: row(0.5, 0.3, 0.4, 0.2)}, "t")
    think, right = fig.axes
    assert [line.get_ydata().tolist() for line in think.lines] == [[0.1, 0.0], [0.9, 0.5]]
    # after RL, the thinking answers' accuracy at both k, the direct ones' only where there were any
    assert right.lines[2].get_ydata().tolist() == [0.6, 0.4] and right.lines[3].get_xdata().tolist() == [2]
    fig = plots_reasoning.plot_crossover({"skill": [0.5, 0.9], "rare_2": [0.1, 0.3], "from_rare_2": [0.6, 0.7]},
                                         [1, 2], (("rare_2", "from_rare_2"), ("rare_10", "from_rare_10")))
    # each pair in its colour, the base dashed; a policy of no pair (the skill base) dotted, last
    assert [(line.get_label(), line.get_linestyle()) for line in fig.axes[0].lines] == [
        ("rare_2", "--"), ("from_rare_2", "-"), ("skill", ":")]
