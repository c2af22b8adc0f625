"""The results page's verdict is decided by the Wilson intervals, and the page refuses a run without results."""

import pytest

from labkit import results_page
from labkit.evaluate import wilson_interval


def _results(grpo: tuple[int, int], sft: tuple[int, int]) -> dict:
    def entry(c, n):
        return {"greedy": {"ALL": {"success_rate": c / n, "success_rate_ci": wilson_interval(c, n), "responses": n}}}
    return {"policies": {"grpo": entry(*grpo), "sft": entry(*sft)}}


def test_beat_only_when_the_intervals_do_not_overlap():
    assert results_page.verdict(_results((120, 200), (40, 200))).startswith("grpo beat sft:")
    assert results_page.verdict(_results((40, 200), (120, 200))).startswith("grpo did worse than sft:")
    close = results_page.verdict(_results((24, 200), (16, 200)))
    assert close.startswith("grpo did not beat sft:") and "overlap" in close
    assert "12.0% [" in close and "8.0% [" in close


def test_the_authors_figures_are_kept_apart_and_marked_as_theirs():
    table = results_page._authors_table()
    assert "| sft | 16/200 = 8.0% |" in table
    assert "| grpo | 3/200 = 1.5% |" in table


def test_a_run_without_results_is_refused_with_the_command_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="labkit evaluate"):
        results_page.render(tmp_path)
