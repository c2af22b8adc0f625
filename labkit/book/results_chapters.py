"""Chapters 9, 10 and 11 on the results pages: one line each on the results page, a table each on the detail page.

    chapter  runs read                                              compared with (paired, on the same problems)
    9        sweeps/chapter9.json's runs (runs/tiny/sweep/)          the warm start and the sweep's `grpo`
    10       sweeps/chapter10.json's runs, the over-optimisation     the warm start, the protocol's `grpo`, the
             settings (runs/tiny/overoptimisation/)                  format base; each setting's start
    11       the reasoning runs (runs/tiny/reasoning/)               each run's thinking base, on the same chains
                                                                     and draws

Every number is read or recomputed from the committed files by the functions the chapters use
(`labkit.book.narrative.compare_named`, `labkit.studies.overoptimisation_summary`,
`labkit.studies.reasoning_report`); within each family of comparisons the p-values are Holm-adjusted
(`labkit.eval.paired.holm`), and a verdict is read from the adjusted p at the lab's 5% level.
"""

from __future__ import annotations

from pathlib import Path

from ..eval import evaluate, paired
from . import narrative

CHAPTER10_FILE = "chapter10.json"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _rate(s: dict) -> str:
    low, high = s["success_rate_ci"]
    return f"{_pct(s['success_rate'])} [{100 * low:.1f}, {100 * high:.1f}]"


def _points(c: dict) -> str:
    """A paired per-draw difference in points with its permutation p ('+3.4 (p = 0.0003)')."""
    bound = paired.at_floor(c["p_permutation"], c["p_permutation_method"])
    return f"{100 * c['mean_difference']:+.1f} ({paired.format_p(c['p_permutation'], at_most=bound)})"


def _call(p: float, gap: float) -> str:
    """'ahead', 'behind' or 'not separable' from an (adjusted) p and the difference's sign."""
    return "not separable" if p >= paired.ALPHA or gap == 0 else ("ahead" if gap > 0 else "behind")


def _sweep_rows(sweep_file: Path, references: dict[str, Path], labels: list[dict]) -> list[dict]:
    """Each run of `sweep_file` against each reference (name -> its evaluation folder), per draw on ALL:
    {"name", "greedy", "sample", "start", "vs": {reference: comparison}}, Holm-adjusted per reference."""
    from ..studies import sweep

    results = sweep.load_results(sweep_file, "tiny")
    root = sweep.sweep_root(sweep_file, "tiny")
    rows = []
    for name, entry in results["runs"].items():
        folder = root / entry["folder"] / "evaluation" / "grpo"
        vs = {ref: narrative.compare_named(ref_dir, folder, labels, "ALL", names=(ref, name))["sample"]
              for ref, ref_dir in references.items() if ref != name}
        rows.append({"name": name, "start": entry.get("start", "warm_start"), "vs": vs,
                     "greedy": entry["evaluation"]["greedy"]["ALL"], "sample": entry["evaluation"]["sample"]["ALL"]})
    for ref in references:
        family = [r for r in rows if ref in r["vs"]]
        for r, adjusted in zip(family, paired.holm([r["vs"][ref]["p_permutation"] for r in family])):
            r["vs"][ref]["holm"] = adjusted
    return rows


def _vs(c: dict | None) -> str:
    if c is None:
        return "-"
    return f"{_points(c)}, Holm {_adjusted(c['holm'], c)}: {_call(c['holm'], c['mean_difference'])}"


def chapter9(run: Path, labels: list[dict]) -> tuple[str, list[str]]:
    """(the results page's line, the detail page's section) for chapter 9's variants."""
    from ..studies import sweep

    sweep_file = sweep.DEFAULT_FILE
    root = sweep.sweep_root(sweep_file, "tiny")
    partner = root / sweep.load_results(sweep_file, "tiny")["runs"]["grpo"]["folder"] / "evaluation" / "grpo"
    rows = _sweep_rows(sweep_file, {"warm_start": run / "evaluation" / "warm_start", "grpo": partner}, labels)
    variants = [r for r in rows if r["name"] != "grpo"]
    calls = {r["name"]: _call(r["vs"]["grpo"]["holm"], r["vs"]["grpo"]["mean_difference"]) for r in variants}
    separable = [f"`{name}` {call}" for name, call in calls.items() if call != "not separable"]
    row = (f"- **Chapter 9**, {len(variants)} variants of the objective at the protocol's budget "
           f"(`sweeps/chapter9.json`), each against the sweep's `grpo`, per draw, Holm over the {len(variants)}: "
           + (f"{', '.join(separable)}; the other {len(variants) - len(separable)} not separable." if separable
              else "none separable."))
    out = ["", "## The objective's variants (chapter 9)", "",
           "Each run of `sweeps/chapter9.json` trains from the warm start at the protocol's budget with one change "
           "(the chapter names it), evaluated on the 200 test problems with the same seeds. Per-draw differences in "
           "points are paired (permutation p), Holm-adjusted within each column's family.", "",
           "| run | greedy pass@1 [95%] | per draw [95%] | vs warm_start, per draw | vs the sweep's grpo, per draw |",
           "| --- | ---: | ---: | --- | --- |"]
    for r in rows:
        out.append(f"| `{r['name']}` | {_rate(r['greedy'])} | {_rate(r['sample'])} | {_vs(r['vs'].get('warm_start'))} "
                   f"| {_vs(r['vs'].get('grpo'))} |")
    return row, out


def chapter10(run: Path, labels: list[dict]) -> tuple[str, list[str]]:
    """(the results page's line, the detail page's section) for chapter 10: a learned reward, RL from the base."""
    from ..studies import overoptimisation, sweep
    from ..studies import overoptimisation_summary

    sweep_file = sweep.REPO_ROOT / "sweeps" / CHAPTER10_FILE
    references = {"warm_start": run / "evaluation" / "warm_start", "grpo": run / "evaluation" / "grpo",
                  "format_base": run / "format_base" / "evaluation" / "format_base"}
    rows = _sweep_rows(sweep_file, references, labels)
    learned = next(r for r in rows if r["name"] == "learned_reward")
    settings = {s.name: overoptimisation_summary.setting_summary(overoptimisation.read_setting(s.name))
                for s in overoptimisation.SETTINGS}
    over = [name for name, s in settings.items() if s["over_optimised"]]
    row = (f"- **Chapter 10**, GRPO on a learned reward and from the base (`sweeps/chapter10.json`), and a proxy "
           f"pushed (`overoptimisation`): `learned_reward` against the warm start, per draw, "
           f"{_call(learned['vs']['warm_start']['holm'], learned['vs']['warm_start']['mean_difference'])}; "
           f"over-optimised (true reward down, proxy up): {len(over)} of {len(settings)} settings.")
    out = ["", "## A learned reward, and RL from the base (chapter 10)", "",
           "The runs of `sweeps/chapter10.json` (`learned_reward` optimises the learned verifier, a proxy; `from_base` "
           "and `from_format_base` start from the base and the format base), per draw on the 200 test problems, "
           "paired, Holm-adjusted within each column:", "",
           "| run | starts from | greedy pass@1 [95%] | per draw [95%] | vs warm_start | vs grpo | vs format_base |",
           "| --- | --- | ---: | ---: | --- | --- | --- |"]
    for r in rows:
        out.append(f"| `{r['name']}` | {r['start']} | {_rate(r['greedy'])} | {_rate(r['sample'])} | "
                   f"{_vs(r['vs'].get('warm_start'))} | {_vs(r['vs'].get('grpo'))} | {_vs(r['vs'].get('format_base'))} |")
    out += ["", "GRPO pushed against a proxy (`runs/tiny/overoptimisation/`): the true and the proxy reward on the "
            "200 validation problems at the start and at the end, paired (points, permutation p); over-optimised "
            "means the true reward fell and the proxy's rose, each beyond its 95% interval.", "",
            "| setting | true reward, start -> end | change (p) | proxy reward, start -> end | change (p) | sqrt KL at "
            "the end | over-optimised |", "| --- | --- | --- | --- | --- | ---: | --- |"]
    for name, s in settings.items():
        out.append(f"| `{name}` | {s['start']['true']:.3f} -> {s['end']['true']:.3f} | {_points(s['true_change'])} | "
                   f"{s['start']['proxy']:.3f} -> {s['end']['proxy']:.3f} | {_points(s['proxy_change'])} | "
                   f"{s['end']['sqrt_kl']:.2f} | {'yes' if s['over_optimised'] else 'no'} |")
    return row, out


def chapter11() -> tuple[str, list[str]]:
    """(the results page's line, the detail page's section) for chapter 11: RL that teaches the model to reason."""
    from ..studies import reasoning
    from ..studies import reasoning_report as report

    verdicts = {name: report.verdict(name) for name in reasoning.RUN_NAMES}
    think = paired.holm([v["think_test"]["p_permutation"] for v in verdicts.values()])
    right = paired.holm([v["accuracy_test"]["p_permutation"] for v in verdicts.values()])
    headline = verdicts["from_rare_2"]
    row = (f"- **Chapter 11**, GRPO on worked answers from each thinking base (`runs/tiny/reasoning/`): `from_rare_2`, "
           f"worked answers {_pct(headline['before']['think_rate'])} -> {_pct(headline['after']['think_rate'])}, right "
           f"{_pct(headline['before']['accuracy'])} -> {_pct(headline['after']['accuracy'])} "
           f"(p {_adjusted(headline['accuracy_test']['p_permutation'], headline['accuracy_test'])}, paired over chains).")
    out = ["", "## RL that teaches the model to reason (chapter 11)", "",
           "Each run is GRPO on worked answers from a thinking base; before and after are the base's and the "
           f"run's profiles on the same {headline['chains']} test chains x {headline['draws']} draws (the same seeds), "
           "paired over chains (permutation p, Holm-adjusted over the runs within each column).", "",
           "| run | base | worked answers, before -> after | Holm p | right, before -> after | Holm p "
           "| right when worked, before -> after | verdict |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (name, v), p_think, p_right in zip(verdicts.items(), think, right):
        before, after = v["before"], v["after"]
        out.append(f"| `{name}` | {v['base']} | {_pct(before['think_rate'])} -> {_pct(after['think_rate'])} | "
                   f"{_adjusted(p_think, v['think_test'])} | {_pct(before['accuracy'])} -> {_pct(after['accuracy'])} | "
                   f"{_adjusted(p_right, v['accuracy_test'])} | {_maybe_pct(before['accuracy_thinking'])} -> "
                   f"{_maybe_pct(after['accuracy_thinking'])} | {v['verdict']} |")
    return row, out + reasoning_sweep_section()


def reasoning_sweep_section() -> list[str]:
    """The detail page's table of the reasoning sweep (`labkit.studies.reasoning_sweep`, issue 56): each run
    of GRPO from rare_2 with one piece changed, its think rate and share right (the base's before), its paired
    differences from the reference with Holm p within its family, KL and entropy at its last iteration, and
    whether its setting moved it beyond the reference's three training seeds."""
    from ..studies import reasoning_sweep

    try:
        result = reasoning_sweep.table()
    except FileNotFoundError as err:  # the sweep's reference is not trained here: say so, do not invent a table
        return ["", "### Why each piece is there, where RL works (issue 56's reasoning sweep)", "",
                f"Not built: {err}. The chapters read it once it is trained."]
    base, partner = result["base"], result["partner"]

    def diff(r: dict, what: str) -> str:
        t = r["against"][reasoning_sweep.PARTNER]
        p = t[f"{what}_p_holm"]
        return f"{100 * t[f'{what}_difference']:+.1f} ({'< 0.001' if p < 1e-3 else f'{p:.2g}'})"

    out = ["", "### Why each piece is there, where RL works (issue 56's reasoning sweep)", "",
           f"GRPO from the thinking base rare_2 (worked answers {_pct(base['think_rate'])}, right "
           f"{_pct(base['accuracy'])} before RL) with one piece changed per run, each on the same chains, prompt order "
           "and seeds as the reference `worked_grpo` and measured on the same 200 test chains x 8 draws; differences "
           "in points against the reference, paired over chains, Holm p within each family. A setting counts as "
           f"changing a share only where its run differs from all three of the reference's training seeds in one "
           f"direction, each at Holm p < {reasoning_sweep.BEYOND_SEEDS_ALPHA} (the last column).", "",
           "| run | changes | worked answers | right | worked: points (Holm p) | right: points (Holm p) "
           "| KL end | entropy end | beyond the seeds |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
           f"| `{reasoning_sweep.PARTNER}` | the reference | {_pct(partner['think_rate'])} | {_pct(partner['accuracy'])} "
           f"| | | {partner['kl_end']:.3f} | {partner['entropy_end']:.3f} | |"]
    for family, rows in result["families"].items():
        for r in rows:
            beyond = ", ".join(w for w, key in (("worked", "think_beyond_seeds"), ("right", "accuracy_beyond_seeds"))
                               if r[key]) or "neither"
            out.append(f"| `{r['name']}` | {reasoning_sweep.CHANGES.get(r['name'], family)} | {_pct(r['think_rate'])} | "
                       f"{_pct(r['accuracy'])} | {diff(r, 'think')} | {diff(r, 'accuracy')} | {r['kl_end']:.3f} | "
                       f"{r['entropy_end']:.3f} | {beyond} |")
    out += ["", reasoning_sweep.entropy_and_selection(result)]
    if result["missing"]:
        out += ["", f"Not trained yet: {', '.join(f'`{n}`' for n in result['missing'])}."]
    return out


def _adjusted(p: float, test: dict) -> str:
    """A Holm-adjusted p; '<=' when the test's own p was its permutation floor (then the adjusted one is a bound)."""
    bound = paired.at_floor(test["p_permutation"], test["p_permutation_method"])
    return paired.format_p(min(p, 1.0), at_most=bound).removeprefix("p = ").removeprefix("p ")


def _maybe_pct(x: float | None) -> str:
    return "-" if x is None else _pct(x)  # no worked answer to be right in


def sections(run: Path) -> tuple[list[str], list[str]]:
    """(the results page's lines, the detail page's lines) for chapters 9-11; the tiny run's only."""
    labels = evaluate.load_test_labels(phase="scoring")
    rows, detail = [], []
    for build in (lambda: chapter9(run, labels), lambda: chapter10(run, labels), chapter11):
        row, section = build()
        rows.append(row)
        detail += section
    summary = ["", "## Beyond the protocol: chapters 9-11", "",
               "One line a chapter, each its own experiment read from its committed runs; the tables behind each "
               "are on [Results in detail](results_detail.md).", "", *rows]
    return summary, detail
