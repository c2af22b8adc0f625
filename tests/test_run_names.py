"""One name, one run, across the whole lab (issue 57): the protocol's run folders, the sweep files' runs, the thinking
bases, the reasoning runs and the over-optimisation settings.  A name may appear in two places only where both
name the same trained model (the same final parameter digest), as chapter 9's `grpo` is the protocol's `grpo`."""

from __future__ import annotations

from collections import defaultdict

from labkit.lab.runs import REPO_ROOT, read_json
from labkit.studies import overoptimisation, reasoning, sweep, thinking_base

RUNS = REPO_ROOT / "runs" / "tiny"
SWEEP_FILES = sorted((REPO_ROOT / "sweeps").glob("*.json"))


def named_runs() -> dict[str, list[tuple[str, str | None]]]:
    """{name: [(where it is named, the final digest of the model it names, or None where there is none)]}."""
    names: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    for folder in sorted(p for p in RUNS.iterdir() if (p / "manifest.json").is_file() and (p / "FINISHED").is_file()):
        names[folder.name].append((f"runs/tiny/{folder.name}", read_json(folder / "manifest.json").get("final_digest")))
    for path in SWEEP_FILES:
        results = sweep.load_results(path, "tiny")
        root = sweep.sweep_root(path, "tiny")
        for name, entry in results["runs"].items():
            manifest = read_json(root / entry["folder"] / "manifest.json")
            names[name].append((f"sweeps/{path.name}", manifest["final_digest"]))
    for name in thinking_base.BASES:
        names[name].append(("thinking base", read_json(RUNS / "thinking" / name / "manifest.json").get("final_digest")))
    for name in reasoning.RUN_NAMES:
        names[name].append(("reasoning run", read_json(RUNS / "reasoning" / name / "manifest.json")["final_digest"]))
    for setting in overoptimisation.SETTINGS:
        names[setting.name].append(("over-optimisation setting", None))
    return names


def test_every_name_names_one_run():
    clashes = {name: places for name, places in named_runs().items()
               if len(places) > 1 and (None in {d for _, d in places} or len({d for _, d in places}) > 1)}
    assert not clashes, "names used for two different runs: " + "; ".join(
        f"{name} ({', '.join(where for where, _ in places)})" for name, places in sorted(clashes.items()))


def test_chapter_9s_grpo_is_the_protocols_run():
    """The one name shared on purpose: the sweep's replica of the protocol's run, the same model bit for bit."""
    places = dict(named_runs()["grpo"])
    assert places["runs/tiny/grpo"] == places["sweeps/chapter9.json"]
