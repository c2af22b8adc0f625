"""Chance baselines: what an answer that never reads the statement scores on the test split.

A policy's success rate means little until it is set beside what no reading at all
would give.  Three measures, all computed from the data files and the saved predictions:

- **constant answer**: the single integer that is most often the target on the
  *validation* split (chosen there, ties to the smaller number), answered to every
  test problem;
- **train-target draw**: an answer drawn at random from the distribution of the
  *train* targets; its expected per-draw success on a test problem is the train
  frequency of that problem's target, averaged over the test problems (an exact
  expectation, nothing is sampled);
- **distinct answers**: how many different values each policy writes (valid JSON
  answers only): a policy that answers few values is close to a constant answer.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from . import data
from .evaluate import read_predictions, wilson_interval
from .verifier import score

POPULATIONS = ("ALL", "ID50", "OOD100")


def _by_population(labels: list[dict]) -> dict[str, list[dict]]:
    return {p: [r for r in labels if p == "ALL" or r["population"] == p] for p in POPULATIONS}


def constant_answer() -> dict:
    """The best constant on validation and its test success per population: {"value", "validation", population: {...}}."""
    validation = data.open_records("labels", "validation", "learning")
    counts = Counter(r["target"] for r in validation)
    value = min(counts, key=lambda v: (-counts[v], v))
    out = {"value": value, "validation": {"correct": counts[value], "problems": len(validation)}}
    for population, rows in _by_population(data.open_records("labels", "test", "scoring")).items():
        correct = sum(r["target"] == value for r in rows)
        out[population] = {"correct": correct, "problems": len(rows), "success_rate": correct / len(rows),
                           "success_rate_ci": wilson_interval(correct, len(rows))}
    return out


def train_target_draw() -> dict:
    """Expected per-draw success, per population, of an answer drawn from the train targets' distribution."""
    train = data.open_records("labels", "train", "learning")
    frequency = Counter(r["target"] for r in train)
    out = {"train_targets": len(train), "distinct_train_targets": len(frequency)}
    for population, rows in _by_population(data.open_records("labels", "test", "scoring")).items():
        out[population] = {"problems": len(rows),
                           "expected_success_rate": sum(frequency[r["target"]] for r in rows) / len(train) / len(rows)}
    return out


def distinct_answers(evaluation_dir: str | Path, policies: list[str]) -> dict[str, dict[str, int]]:
    """{policy: {mode: number of distinct values among its schema-valid test answers}}."""
    labels = {r["id"]: r for r in data.open_records("labels", "test", "scoring")}
    out = {}
    for policy in policies:
        out[policy] = {}
        for mode in ("greedy", "sample"):
            rows = read_predictions(Path(evaluation_dir) / policy, mode)
            values = {score(r["text"], r["finish_reason"], labels[r["problem_id"]]["problem"],
                            r["tokenization_valid"]).value for r in rows}
            out[policy][mode] = len(values - {None})
    return out


def baselines(evaluation_dir: str | Path, policies: list[str]) -> dict:
    """All three, in one dict (chapter 7 and the results page print it)."""
    return {"constant_answer": constant_answer(), "train_target_draw": train_target_draw(),
            "distinct_answers": distinct_answers(evaluation_dir, policies)}


def markdown_table(b: dict) -> str:
    """The two chance baselines as a markdown table (ALL, ID50, OOD100)."""
    const, draw = b["constant_answer"], b["train_target_draw"]
    head = "| baseline | " + " | ".join(POPULATIONS) + " |\n| --- | " + " | ".join("---:" for _ in POPULATIONS) + " |"
    cells = [f"{const[p]['correct']}/{const[p]['problems']} = {100 * const[p]['success_rate']:.1f}% "
             f"[{100 * const[p]['success_rate_ci'][0]:.1f}, {100 * const[p]['success_rate_ci'][1]:.1f}]"
             for p in POPULATIONS]
    rows = [f"| constant answer {const['value']} (the most frequent validation target, "
            f"{const['validation']['correct']}/{const['validation']['problems']}) | " + " | ".join(cells) + " |",
            "| a draw from the train targets' distribution (expected per-draw success) | "
            + " | ".join(f"{100 * draw[p]['expected_success_rate']:.2f}%" for p in POPULATIONS) + " |"]
    return "\n".join([head, *rows]) + "\n"
