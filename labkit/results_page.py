"""The book's results page, written from a run's files (`python -m labkit.book results-page`).

`book/results.md` is generated, never edited by hand: every number on it is
read from the run folder (by default the committed tiny run, `runs/tiny/`):
`evaluation/results.json` for the test evaluation, the manifests and histories
for training, `protocol_times.json` for wall times.  An instructor who ran the
qwen preset regenerates the page from their own run with `--run runs/qwen`.

The protocol's authors also published the figures of their own Qwen run.  They
are shown in a separate section, marked as theirs: this lab did not measure them.
"""

from __future__ import annotations

from pathlib import Path

from . import baselines
from .evaluate import markdown_table, results_table, wilson_interval
from .runs import REPO_ROOT, atomic_write_text, read_json, sha256_file

DEFAULT_RUN = REPO_ROOT / "runs" / "tiny"
DEFAULT_OUT = REPO_ROOT / "book" / "results.md"
MAIN_POLICIES = ("warm_start", "sft", "grpo")

# The Qwen2.5-0.5B-Instruct figures reported by the protocol's authors (the Vietnamese seed
# document, section "Quan sát trong quá trình phát triển", observations during development):
# all 200 test problems (ID50 and OOD100 together), (correct, responses).  Not measured here.
AUTHORS_QWEN = {
    "warm_start": {"greedy": (3, 200), "sample": (15, 800)},
    "sft": {"greedy": (16, 200), "sample": (30, 800)},
    "grpo": {"greedy": (3, 200), "sample": (14, 800)},
    "grpo_g2": {"greedy": (4, 200), "sample": (11, 800)},
    "grpo_g8": {"greedy": (3, 200), "sample": (13, 800)},
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _interval(ci) -> str:
    return f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def verdict(results: dict, mode: str = "greedy", population: str = "ALL",
            better: str = "grpo", than: str = "sft") -> str:
    """One sentence comparing two policies' success rates, decided by their Wilson intervals.

    "beat" only when the intervals do not overlap; otherwise the difference is
    called what it is at this sample size: not resolved.
    """
    a = results["policies"][better][mode][population]
    b = results["policies"][than][mode][population]
    text = (f"{better} {_pct(a['success_rate'])} {_interval(a['success_rate_ci'])} against {than} "
            f"{_pct(b['success_rate'])} {_interval(b['success_rate_ci'])} ({mode}, {population}, "
            f"{a['responses']} responses each)")
    if a["success_rate_ci"][0] > b["success_rate_ci"][1]:
        return f"{better} beat {than}: {text}; the 95% intervals do not overlap."
    if b["success_rate_ci"][0] > a["success_rate_ci"][1]:
        return f"{better} did worse than {than}: {text}; the 95% intervals do not overlap."
    return (f"{better} did not beat {than}: {text}; the 95% intervals overlap, so this sample does not "
            "separate them.")


def _training_rows(run: Path) -> list[str]:
    lines = []
    base = run / "base" / "manifest.json"
    if base.is_file():
        m = read_json(base)
        heldout = m["loss"]["heldout"]
        lines.append(f"- **Base** (pretrained by the lab): {m['steps']} updates in {m['wall_time_s'] / 60:.1f} min "
                     f"on {m['threads']} CPU thread(s); held-out loss {heldout[-1][1]}, teacher-forced exact answers "
                     f"on held-out corpus problems {_pct(heldout[-1][2])}.")
    for branch in ("warm_start", "sft"):
        path = run / branch / "manifest.json"
        if not path.is_file():
            continue
        m = read_json(path)
        greedy = m.get("validation_greedy") or {}
        nll = [round(e["nll"], 4) for e in m.get("validation_nll", [])]
        acc = f"greedy validation accuracy {_pct(greedy['success_rate'])} ({greedy['correct']}/{greedy['problems']})" \
            if greedy else "no greedy validation recorded"
        start = m.get("start_validation_greedy")
        before = (f" It started from a model with greedy validation accuracy {_pct(start['success_rate'])} and valid "
                  f"JSON in {_pct(start['valid_json'])} of its responses.") if start else ""
        lines.append(f"- **{branch}**: {m['counts']['updates']} updates; validation NLL before training and after "
                     f"each epoch {nll}; {acc}.{before}")
    history = run / "grpo" / "history.json"
    if history.is_file():
        h = read_json(history)
        rows = h
        first, last = rows[:10], rows[-10:]

        def mean(rs, key):
            return sum(r[key] for r in rs) / len(rs)

        lines.append(f"- **GRPO**: {len(rows)} iterations; mean reward {mean(first, 'reward'):.3f} over the "
                     f"first 10 iterations and {mean(last, 'reward'):.3f} over the last 10; fraction of "
                     f"zero-variance groups {mean(first, 'frac_reward_zero_std'):.2f} then "
                     f"{mean(last, 'frac_reward_zero_std'):.2f}.")
    return lines


def _authors_verdict() -> str:
    """What the authors' own counts say of GRPO against SFT on greedy pass@1, by the interval rule of `verdict`."""
    (g, n), (f, m) = AUTHORS_QWEN["grpo"]["greedy"], AUTHORS_QWEN["sft"]["greedy"]
    grpo, sft = wilson_interval(g, n), wilson_interval(f, m)
    if grpo[0] > sft[1]:
        call = "GRPO beat SFT on greedy pass@1 (the 95% intervals from their counts do not overlap)"
    elif sft[0] > grpo[1]:
        call = "GRPO did not beat SFT on greedy pass@1: SFT was ahead, and the 95% intervals from their counts do not overlap"
    else:
        call = "GRPO did not beat SFT on greedy pass@1: the 95% intervals from their counts overlap"
    return f"In their run {call} ({g}/{n} against {f}/{m})."


def _chance_section(run: Path, results: dict, main: list[str]) -> list[str]:
    """The chance baselines (labkit.baselines) and, for each policy, whether its interval lies above them."""
    policies = list(results["policy_order"])
    b = baselines.baselines(run / "evaluation", policies)
    targets = baselines.distinct_test_targets()
    const = b["constant_answer"]
    out = ["## Against chance", "",
           "What would an answer that never reads the statement score on these test problems? Two such "
           "baselines, computed by `labkit.baselines` from the data files: the constant answer "
           f"{const['value']} (the most frequent target of the validation split, {const['validation']['correct']} "
           f"of its {const['validation']['problems']} problems), and an answer drawn from the distribution of the "
           f"{b['train_target_draw']['train_targets']} train targets ({b['train_target_draw']['distinct_train_targets']} "
           "distinct values; its expected per-draw success is exact, nothing is sampled).", "",
           baselines.markdown_table(b),
           "A policy is **above chance** when the whole Wilson 95% interval of its rate lies above both: above the "
           "upper end of the constant answer's interval and above the draw's expected success (the first row of the "
           "table below). It is **below** when its whole interval lies below the better of the two (the lower end of the "
           "constant answer's interval, or the draw's expected success); otherwise this evaluation does not "
           "separate it from chance. The last column counts the distinct values among each policy's schema-valid "
           f"answers; the test targets take {targets['ALL']} distinct values ({targets['ID50']} in ID50, "
           f"{targets['OOD100']} in OOD100).", "",
           baselines.markdown_beside(results, b, policies)]
    out += [f"- {baselines.chance_sentence(results, b, policy, mode)}" for policy in main for mode in ("greedy", "sample")]
    return out + [""]


def _authors_table() -> str:
    lines = ["| policy | greedy pass@1 (200) | 95% interval | per-draw success (800) | 95% interval |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for policy, modes in AUTHORS_QWEN.items():
        cells = []
        for mode in ("greedy", "sample"):
            c, n = modes[mode]
            cells += [f"{c}/{n} = {_pct(c / n)}", _interval(wilson_interval(c, n))]
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render(run: str | Path = DEFAULT_RUN) -> str:
    """The page's markdown for the run folder `run` (holding evaluation/results.json)."""
    run = Path(run)
    results_path = run / "evaluation" / "results.json"
    if not results_path.is_file():
        raise FileNotFoundError(f"{results_path} does not exist: run `python -m labkit evaluate --preset <preset> "
                                "--policy all` (or `python -m labkit all`) first")
    results = read_json(results_path)
    try:
        shown = run.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        shown = run.as_posix()
    policies = list(results["policy_order"])
    main = [p for p in MAIN_POLICIES if p in policies]
    setup = results["policies"][policies[0]]["evaluation"]
    problems, draws = setup["problems"], setup["draws"]
    out = [
        "# Results",
        "",
        "```{note}",
        f"This page is generated by `python -m labkit.book results-page --run {shown}` from the files of the "
        f"**{results['preset']}** run in `{shown}/` (`evaluation/results.json`, SHA-256 "
        f"`{sha256_file(results_path)[:16]}…`). Do not edit it by hand; regenerate it after a new run.",
        "```",
        "",
        "Every rate below was computed from the saved raw predictions joined with the test labels "
        f"(`python -m labkit results-json --check` recomputes them byte for byte). {problems} problems and "
        f"{problems * draws} samples are small samples: read the 95% Wilson intervals, not only the rates. "
        f"Per-draw success is the mean over all samples, never best-of-{draws} (chapter 7).",
        "",
        "## The verdict",
        "",
    ]
    if {"grpo", "sft"} <= set(policies):
        for mode in ("greedy", "sample"):
            out.append(f"- {verdict(results, mode)}")
    if {"grpo", "warm_start"} <= set(policies):
        out.append(f"- {verdict(results, 'greedy', than='warm_start')}")
    out += [""]
    out += _chance_section(run, results, main)
    out += ["## Test evaluation by population", ""]
    rows = [r for r in results_table(results) if r["policy"] in main]
    out.append(markdown_table(rows))
    out += ["## pass@k (sampling budget: 4 samples per problem)", "",
            "| policy | population | " + " | ".join(f"pass@{k}" for k in range(1, 5)) + " |",
            "| --- | --- | " + " | ".join("---:" for _ in range(4)) + " |"]
    for policy in policies:
        for population in results["populations"]:
            values = results["policies"][policy]["sample"][population]["pass_at_k"]["values"]
            out.append(f"| {policy} | {population} | " + " | ".join(_pct(v) for v in values) + " |")
    extra = [p for p in policies if p not in MAIN_POLICIES]
    if extra:
        out += ["", "## The group-size branches (chapter 8)", ""]
        out.append(markdown_table([r for r in results_table(results) if r["policy"] in extra + ["warm_start"]
                                   and r["population"] == "ALL"]))
    out += ["", "## Training", ""]
    out += _training_rows(run)
    times = run / "protocol_times.json"
    if times.is_file():
        t = read_json(times)
        order = ("base", "warm_start", "sft", "sft_resume", "grpo", "grpo_resume", "sampler_agreement",
                 "evaluation", "group_size")
        if "base" not in t and (run / "base" / "manifest.json").is_file():
            t["base"] = read_json(run / "base" / "manifest.json")["wall_time_s"]  # pretrained on its own
        out += ["", "Wall time of each step of `python -m labkit all` on this run's machine (the base's from "
                "its own manifest):", "", "| step | seconds |", "| --- | ---: |"]
        out += [f"| {k} | {t[k]:.1f} |" for k in sorted(t, key=lambda k: order.index(k) if k in order else 99)]
        out.append(f"| **total** | {sum(t.values()):.1f} |")
    out += [
        "",
        "## Reference figures reported by the protocol's authors (not measured by this lab)",
        "",
        "The authors of the protocol reported these figures from their own run of Qwen2.5-0.5B-Instruct "
        "(all 200 test problems, ID50 and OOD100 together). They are **theirs**, copied from their "
        "document for comparison; the intervals are computed here from their counts. "
        f"{_authors_verdict()} The authors state that a falling loss does not prove "
        "accuracy rose and that results unfavourable to GRPO are reported.",
        "",
        _authors_table(),
    ]
    return "\n".join(out).rstrip() + "\n"


def write(run: str | Path = DEFAULT_RUN, out: str | Path = DEFAULT_OUT) -> Path:
    """Render the page and write it atomically to `out`."""
    out = Path(out)
    atomic_write_text(out, render(run))
    return out


def is_current(run: str | Path = DEFAULT_RUN, out: str | Path = DEFAULT_OUT) -> bool:
    """True when `out` holds exactly what `render(run)` writes now."""
    out = Path(out)
    return out.is_file() and out.read_text(encoding="utf-8") == render(run)

