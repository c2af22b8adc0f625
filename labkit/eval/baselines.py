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

from ..task import data
from ..task.verifier import score
from .evaluate import read_predictions, wilson_interval

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


def answers_per_problem(evaluation_dir: str | Path, policy: str) -> dict:
    """The diversity of one policy's draws, problem by problem: how many distinct schema-valid values each
    problem's sampled answers hold (an answer with no valid value adds none).

    {"draws": draws per problem, "problems": n, "mean": mean distinct values per problem,
     "histogram": {k: problems with k distinct values, k = 0 .. draws}}."""
    labels = {r["id"]: r for r in data.open_records("labels", "test", "scoring")}
    values: dict[str, list] = {}
    for r in read_predictions(Path(evaluation_dir) / policy, "sample"):
        verdict = score(r["text"], r["finish_reason"], labels[r["problem_id"]]["problem"], r["tokenization_valid"])
        values.setdefault(r["problem_id"], []).append(verdict.value)
    draws = max(len(v) for v in values.values())
    counts = [len(set(v) - {None}) for v in values.values()]
    return {"draws": draws, "problems": len(counts), "mean": sum(counts) / len(counts),
            "histogram": {k: counts.count(k) for k in range(draws + 1)}}


def markdown_diversity(evaluation_dir: str | Path, policies: list[str]) -> str:
    """`answers_per_problem` of each policy as a markdown table."""
    rows = {policy: answers_per_problem(evaluation_dir, policy) for policy in policies}
    draws = max(r["draws"] for r in rows.values())
    head = ("| policy | distinct answers per problem (mean) | " + " | ".join(f"{k} distinct" for k in range(draws + 1))
            + " |\n| --- | ---: | " + " | ".join("---:" for _ in range(draws + 1)) + " |")
    lines = [f"| {policy} | {r['mean']:.2f} | " + " | ".join(str(r["histogram"].get(k, 0)) for k in range(draws + 1))
             + " |" for policy, r in rows.items()]
    return "\n".join([head, *lines]) + "\n"


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


# --- Against chance: the rule, and the sentences chapter 7 and the results page print --------------------------

MODE_NAMES = {"greedy": "greedy pass@1", "sample": "per-draw success"}


def distinct_test_targets() -> dict[str, int]:
    """{population: number of distinct target values among the test problems}."""
    return {p: len({r["target"] for r in rows})
            for p, rows in _by_population(data.open_records("labels", "test", "scoring")).items()}


def _chance_threshold(b: dict, population: str, end: int) -> tuple[float, str]:
    """The higher of one end of the constant answer's Wilson interval (end 0: lower, 1: upper) and the
    train-target draw's expected success (an exact expectation, so it has no interval of its own)."""
    constant = b["constant_answer"][population]["success_rate_ci"][end]
    draw = b["train_target_draw"][population]["expected_success_rate"]
    if constant >= draw:
        return constant, f"the {('lower', 'upper')[end]} end of the constant answer's interval"
    return draw, "the expected success of a draw from the train targets"


def chance_bar(b: dict, population: str = "ALL") -> tuple[float, str]:
    """The rate a policy's whole 95% interval must lie above to be called above chance, and what sets it.

    The upper end of the constant answer's interval (the rule that separates two measured rates:
    intervals that do not overlap), or the train-target draw's expected success if that is higher.
    """
    return _chance_threshold(b, population, 1)


def chance_floor(b: dict, population: str = "ALL") -> tuple[float, str]:
    """The mirror of `chance_bar`: a policy's whole interval below it is below chance (the lower end
    of the constant answer's interval, or the draw's expected success if that is higher)."""
    return _chance_threshold(b, population, 0)


def chance_call(stats: dict, b: dict, population: str = "ALL") -> str:
    """'above', 'below' or 'not separated': where the Wilson interval of `stats` (a results.json entry) lies.

    'above': its lower end is above `chance_bar`; 'below': its upper end is below `chance_floor`;
    'not separated' otherwise: this evaluation cannot tell the policy from an answer that never
    reads the statement.
    """
    low, high = stats["success_rate_ci"]
    if low > chance_bar(b, population)[0]:
        return "above"
    if high < chance_floor(b, population)[0]:
        return "below"
    return "not separated"


def chance_sentence(results: dict, b: dict, policy: str, mode: str = "greedy", population: str = "ALL") -> str:
    """One sentence saying whether `policy` is above chance in `mode` on `population`, decided by the intervals."""
    s = results["policies"][policy][mode][population]
    low, high = s["success_rate_ci"]
    head = (f"{policy}, {MODE_NAMES[mode]} on {population} ({s['correct']}/{s['responses']} = "
            f"{100 * s['success_rate']:.1f}%, 95% interval [{100 * low:.2f}, {100 * high:.2f}])")
    call = chance_call(s, b, population)
    if call == "above":
        bar, what = chance_bar(b, population)
        return f"{head}, is above chance: its whole interval lies above {100 * bar:.2f}%, {what}."
    if call == "below":
        floor, what = chance_floor(b, population)
        return f"{head}, is below chance: its whole interval lies below {100 * floor:.2f}%, {what}."
    bar, what = chance_bar(b, population)
    return (f"{head}, is not above chance: its interval starts at {100 * low:.2f}%, not above {100 * bar:.2f}%, "
            f"{what}, so this evaluation cannot tell it from an answer that never reads the statement.")


def markdown_beside(results: dict, b: dict, policies: list[str]) -> str:
    """Each policy's rates beside the chance bar, as a markdown table (one row per policy and mode)."""
    head = ("| policy | mode | " + " | ".join(POPULATIONS) + " | distinct answers |\n| --- | --- | "
            + " | ".join("---:" for _ in POPULATIONS) + " | ---: |")
    rows = ["| *above chance: lower end above* | both | "
            + " | ".join(f"{100 * chance_bar(b, p)[0]:.2f}%" for p in POPULATIONS) + " | |"]
    for policy in policies:
        for mode in ("greedy", "sample"):
            cells = []
            for p in POPULATIONS:
                s = results["policies"][policy][mode][p]
                lo, hi = s["success_rate_ci"]
                cells.append(f"{100 * s['success_rate']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] "
                             f"{chance_call(s, b, p)}")
            rows.append(f"| {policy} | {mode} | " + " | ".join(cells)
                        + f" | {b['distinct_answers'][policy][mode]} |")
    return "\n".join([head, *rows]) + "\n"
