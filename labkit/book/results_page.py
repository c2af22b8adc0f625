"""The book's results page, written from a run's files (`python -m labkit.book.build results-page`).

`book/results.md` and `book/results_detail.md` are generated, never edited by hand: every number on them is
read from the run folder (by default the committed tiny run, `runs/tiny/`):
`evaluation/results.json` for the test evaluation, the raw predictions under
`evaluation/<policy>/` (and `grpo_large/evaluation/grpo_large/`, when the larger
run finished) for the paired comparisons, the manifests and histories for
training, `protocol_times.json` for wall times.  An instructor who ran the qwen
preset regenerates the page from their own run with `--run runs/qwen`.

Comparisons are paired (labkit.eval.paired).  Every policy answers the same test problems, and
each sampled draw has the same seed for every policy, so two policies' answers come in pairs:
the greedy answers are compared by the exact McNemar test, the per-problem rates of the draws
by a sign test and a paired permutation test.  A difference is called significant or not
separable from that test at the 5% level.  The Wilson intervals describe each rate; whether
two of them overlap is not a test and decides nothing here.

The results page is what a student reads in two minutes: one figure, one table (each policy's
greedy and per-draw test success with Wilson intervals, and its paired verdicts against the warm
start) and the verdict in words.  Everything else (the paired table on every subset, chance, the
populations, pass@k, the group-size branches, the larger run, training, wall times and the
authors' figures) is on the detail page it links to, `results_detail.md`, written by the same
command.  The figure, `figures/results.png` beside the pages (labkit.book.plots_results), is written
deterministically (the same files give the same bytes), and `is_current` checks all three files
byte for byte.

The protocol's authors also published the figures of their own Qwen run.  They
are shown in a separate section, marked as theirs: this lab did not measure them.
Their counts are aggregates with nothing to pair, so their comparison is Fisher's
exact test of two counts (labkit.eval.paired.two_proportion_test).
"""

from __future__ import annotations


import math
from pathlib import Path

from ..lab.runs import (FINISHED_MARKER, REPO_ROOT, atomic_write_bytes, atomic_write_text, read_checked_json, read_json,
                        sha256_file)
from ..eval import baselines, evaluate, paired
from ..eval.evaluate import markdown_table, results_table, wilson_interval
from . import results_chapters

DEFAULT_RUN = REPO_ROOT / "runs" / "tiny"
DEFAULT_OUT = REPO_ROOT / "book" / "results.md"
DETAIL = "results_detail.md"  # the detail page, beside the results page
MAIN_POLICIES = ("warm_start", "sft", "grpo")
LARGE = "grpo_large"  # the larger GRPO run (labkit.studies.larger_run), evaluated under <run>/grpo_large/evaluation/
FIGURE = "figures/results.png"  # the page's figure, relative to the page
# The comparisons of the page, (A, B): B against A.  One is made when both evaluations exist.
COMPARISONS = (("warm_start", "grpo"), ("sft", "grpo"), ("warm_start", "sft"),
               ("grpo", "grpo_g2"), ("grpo", "grpo_g8"), ("warm_start", LARGE), ("grpo", LARGE))
SUBSETS = paired.SUBSETS
# The one sentence of the page that names interval overlap: it says that overlap is no test.
OVERLAP_NOTE = ("Whether two Wilson intervals overlap is not a test of their difference (two rates can differ "
                "at the 5% level while their intervals overlap; labkit.eval.paired shows an example), so no verdict "
                "on this page is read from the intervals.")


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


def _p(p: float) -> str:
    """A p-value for a table cell: paired.format_p without its leading "p" ("0.45", "3.4e-5", "< 1e-6")."""
    return paired.format_p(p).removeprefix("p = ").removeprefix("p ")


def _side(gap: float, better: str) -> str:
    """The direction words of paired.verdict: B ahead or behind (claimed only when significant)."""
    return f"{better} ahead" if gap > 0 else f"{better} behind"


# --- The paired comparisons -----------------------------------------------------------------------------


def evaluation_dirs(run: str | Path = DEFAULT_RUN, policies: list[str] | None = None) -> dict[str, Path]:
    """{policy: evaluation folder}: the protocol's policies (evaluation/<policy>/; `policies`, by default every
    finished one, in labkit.eval.evaluate.POLICIES order), then the larger run's when
    <run>/grpo_large/evaluation/grpo_large/FINISHED exists."""
    run = Path(run)
    if policies is None:
        policies = evaluate.finished_policies(run / "evaluation")
    dirs = {p: run / "evaluation" / p for p in policies}
    large = run / LARGE / "evaluation" / LARGE
    if (large / FINISHED_MARKER).is_file():
        dirs[LARGE] = large
    return dirs


def paired_comparisons(dirs: dict[str, Path], labels: list[dict] | None = None) -> list[dict]:
    """Every comparison of COMPARISONS whose two policies have a folder in `dirs`, on each subset, in that order:
    [{"a", "b", "subset", "greedy", "sample"}], the last two from paired.compare_policies (B = b against A = a).

    labels: the test labels (evaluate.load_test_labels(phase="scoring"), read when not given).
    """
    if labels is None:
        labels = evaluate.load_test_labels(phase="scoring")
    out = []
    for a, b in COMPARISONS:
        if a in dirs and b in dirs:
            for subset in SUBSETS:
                out.append({"a": a, "b": b, "subset": subset,
                            **paired.compare_policies(dirs[a], dirs[b], labels, subset)})
    return out


def _sample_counts(s: dict) -> tuple[int, int, int]:
    """(A's correct draws, B's correct draws, draws in all) of a compare_sampled result."""
    total = s["n_problems"] * s["draws"]
    return round(s["a_rate"] * total), round(s["b_rate"] * total), total


def verdict(results: dict, mode: str = "greedy", population: str = "ALL",
            better: str = "grpo", than: str = "sft", *, run: str | Path = DEFAULT_RUN,
            comparison: dict | None = None) -> str:
    """One sentence comparing two policies on the same test problems, decided by a paired test (labkit.eval.paired).

    greedy: the exact McNemar test of the two policies' answers, problem by problem; sample: the paired
    permutation test of the per-problem rates over the draws, which share their seeds (the sign test is
    reported beside it).  "beat" or "did worse than" when p < paired.ALPHA, else "not separable".
    results: results.json's content (its "policies"), for each rate and its Wilson interval, which describe
    the rates and decide nothing.  comparison: paired.compare_policies(than's folder, better's folder, labels,
    population); read from `run`'s evaluation folders when not given.  ValueError when the two disagree on
    a count (results.json no longer matches the predictions).
    """
    if comparison is None:
        dirs = evaluation_dirs(run, [p for p in (than, better) if p != LARGE])
        comparison = paired.compare_policies(dirs[than], dirs[better], evaluate.load_test_labels(phase="scoring"),
                                             population)
    c = comparison[mode]
    b, a = results["policies"][better][mode][population], results["policies"][than][mode][population]
    if mode == "greedy":
        p, gap, counts, n = c["p"], c["gained"] - c["lost"], (c["b_correct"], c["a_correct"]), c["n"]
        setup = f"greedy pass@1, {population}, the same {n} problems"
    else:
        p, gap = c["p_permutation"], c["mean_difference"]
        k_a, k_b, n = _sample_counts(c)
        counts = (k_b, k_a)
        setup = f"per-draw success, {population}, {c['n_problems']} problems x {c['draws']} draws with shared seeds"
    if (b["correct"], a["correct"]) != counts or a["responses"] != n or b["responses"] != n:
        raise ValueError(f"{better} against {than} ({mode}, {population}): results.json says {b['correct']}/"
                         f"{b['responses']} and {a['correct']}/{a['responses']}, the predictions {counts[0]}/{n} and "
                         f"{counts[1]}/{n}; rerun `python -m labkit results-json`")
    if p < paired.ALPHA:
        call = f"{better} beat {than}" if gap > 0 else f"{better} did worse than {than}"
    else:
        call = f"{better} and {than} are not separable"
    return (f"{call}: {better} {_pct(b['success_rate'])} {_interval(b['success_rate_ci'])} against {than} "
            f"{_pct(a['success_rate'])} {_interval(a['success_rate_ci'])} ({setup}); {c['verdict']}.")


def _short_verdicts(c: dict) -> str:
    g, s = c["greedy"], c["sample"]
    greedy = paired.verdict(g["p"], direction=_side(g["gained"] - g["lost"], c["b"]))
    sample = paired.verdict(s["p_permutation"], direction=_side(s["mean_difference"], c["b"]))
    return f"greedy: {greedy}; per draw: {sample}"


def paired_table(comparisons: list[dict]) -> str:
    """The comparisons as one markdown table, a row per (A, B, subset)."""
    lines = ["| B against A | subset | greedy correct, A → B | gained / lost | exact McNemar p "
             "| per-draw correct, A → B | problems up / down / tied | sign-test p "
             "| mean rate difference B − A, points [95% interval] | permutation p | verdict |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for c in comparisons:
        g, s = c["greedy"], c["sample"]
        k_a, k_b, total = _sample_counts(s)
        low, high = s["interval"]
        perm = _p(s["p_permutation"]) + ("" if s["p_permutation_method"] == "exact" else " (MC)")
        lines.append(
            f"| {c['b']} against {c['a']} | {c['subset']} | {g['a_correct']}/{g['n']} → {g['b_correct']}/{g['n']} "
            f"| {g['gained']} / {g['lost']} | {_p(g['p'])} "
            f"| {k_a}/{total} = {_pct(s['a_rate'])} → {k_b}/{total} = {_pct(s['b_rate'])} "
            f"| {s['up']} / {s['down']} / {s['ties']} | {_p(s['p_sign'])} "
            f"| {100 * s['mean_difference']:+.1f} [{100 * low:+.1f}, {100 * high:+.1f}] | {perm} "
            f"| {_short_verdicts(c)} |")
    return "\n".join(lines) + "\n"


def _paired_section(comparisons: list[dict], problems: int, draws: int) -> list[str]:
    exact_up_to = int(math.log2(paired.PERMUTATION_RESAMPLES))
    tests = 2 * len(comparisons)
    out = ["## Paired comparisons", "",
           f"Every policy answered the same {problems} test problems, and draw d of a problem has the same seed for "
           "every policy, so two policies' answers come in pairs and are compared pair by pair (`labkit.eval.paired`). "
           "**Greedy**: the exact McNemar test counts the problems B solves and A does not (gained) and the reverse "
           "(lost); the problems both solve or both miss say nothing about which is better. **Per draw**: each "
           f"problem's success over its {draws} draws gives one difference B − A; the sign test counts the problems "
           "up and down, the mean difference has a t interval, and the paired permutation test (random sign flips "
           "of the differences) gives the p-value of the per-draw verdict. A difference is **significant** when "
           f"p < {paired.ALPHA}, otherwise **not separable** at this sample size. {OVERLAP_NOTE}", "",
           paired_table(comparisons),
           f"The permutation p is exact when at most {exact_up_to} problems differ (every sign flip is enumerated), "
           f"otherwise (MC) a Monte-Carlo estimate from {paired.PERMUTATION_RESAMPLES} sign flips with a fixed seed "
           f"({paired.PERMUTATION_SEED}), the same on every rebuild. The verdicts rest on {tests} p-values (two a "
           "row), none corrected for the others: at the 5% level about one in twenty would read significant by chance even if "
           "no policy differed from another, and the ID50 and OOD100 rows of a pair are parts of its ALL row, not "
           "new evidence.", "",
           "The same comparisons on all problems, in words:", ""]
    for c in comparisons:
        if c["subset"] == "ALL":
            out.append(f"- {c['b']} against {c['a']}: {c['greedy']['verdict']}. {c['sample']['verdict']}.")
    return out + [""]


# --- The other sections -----------------------------------------------------------------------------------


def _training_rows(run: Path) -> list[str]:
    lines = []
    base = run / "base" / "manifest.json"
    if base.is_file():
        m = read_json(base)
        heldout = m["loss"]["heldout"]
        probe = m["answer_phase"]["probe"]
        # chapter 2's measure, the one number the book quotes for the base: exact answers on fresh statements
        lines.append(f"- **Base** (pretrained by the lab): {m['steps']} updates in {m['wall_time_s'] / 60:.1f} min "
                     f"on {m['threads']} CPU thread(s); held-out loss {heldout[-1][1]}; exact answers on "
                     f"{probe['documents']} fresh statements in its own answer styles "
                     f"{_pct(m['answer_phase']['final_exact'])} (chapter 2).")
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
        h = read_checked_json(history)
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
    """What the authors' own counts say of GRPO against SFT on greedy pass@1, by Fisher's exact test.

    Their figures are aggregate counts (no per-problem answers are published), so nothing pairs the two
    policies' answers: the test is the unpaired one, paired.two_proportion_test.
    """
    (g, n), (f, m) = AUTHORS_QWEN["grpo"]["greedy"], AUTHORS_QWEN["sft"]["greedy"]
    p = paired.two_proportion_test(g, n, f, m)
    words = paired.verdict(p, what="Fisher exact p", direction="SFT ahead" if f / m > g / n else "GRPO ahead")
    call = "GRPO beat SFT" if p < paired.ALPHA and g / n > f / m else "GRPO did not beat SFT"
    return (f"In their run {call} on greedy pass@1 ({g}/{n} against {f}/{m}): {words}. Their figures are "
            "aggregate counts with no per-problem answers to pair, so this is the unpaired Fisher exact test of "
            "the two counts (`labkit.eval.paired.two_proportion_test`), not the paired McNemar test of this lab's "
            "policies.")


def _chance_section(run: Path, results: dict, main: list[str]) -> list[str]:
    """The chance baselines (labkit.eval.baselines) and, for each policy, whether its interval lies above them."""
    policies = list(results["policy_order"])
    b = baselines.baselines(run / "evaluation", policies)
    targets = baselines.distinct_test_targets()
    const = b["constant_answer"]
    out = ["## Against chance", "",
           "What would an answer that never reads the statement score on these test problems? Two such "
           "baselines, computed by `labkit.eval.baselines` from the data files: the constant answer "
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
    out += ["", "Diversity per problem (the source protocol asks for it): among each test problem's "
            f"{results['policies'][policies[0]]['evaluation']['draws']} sampled answers, how many distinct "
            "schema-valid values; a policy sure of one answer writes 1, one that guesses writes more, and an "
            "answer with no valid value adds none (`labkit.eval.baselines.answers_per_problem`).", "",
            baselines.markdown_diversity(run / "evaluation", policies)]
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


def figure_path(out: str | Path = DEFAULT_OUT) -> Path:
    """Where the page `out` keeps its figure: FIGURE, relative to the page's folder."""
    return Path(out).parent / FIGURE


def _large_section(scored: dict) -> list[str]:
    rows = results_table({"policy_order": [LARGE], "policies": {LARGE: scored}})
    return ["## The larger GRPO run", "",
            "The larger run (`python -m labkit grpo-large`, `labkit.studies.larger_run`) is **outside the protocol's "
            "counts**: it gives GRPO more prompts per iteration, a larger group, more iterations and a rate chosen "
            "on the validation split (chapter 6, section 6.8); it is evaluated exactly as the "
            f"protocol's policies, into `{LARGE}/evaluation/{LARGE}/`, and its paired comparisons with the warm "
            "start and the protocol's GRPO are rows of the table above.", "",
            markdown_table(rows).rstrip("\n")]


def _pass_at_k_section(results: dict, policies: list[str]) -> list[str]:
    out = ["## pass@k (sampling budget: 4 samples per problem)", "",
           "| policy | population | " + " | ".join(f"pass@{k}" for k in range(1, 5)) + " |",
           "| --- | --- | " + " | ".join("---:" for _ in range(4)) + " |"]
    for policy in policies:
        for population in results["populations"]:
            values = results["policies"][policy]["sample"][population]["pass_at_k"]["values"]
            out.append(f"| {policy} | {population} | " + " | ".join(_pct(v) for v in values) + " |")
    return out


def _ablation_section(run: Path) -> list[str]:
    """The ablation sweep's table (labkit.studies.ablations), for the tiny run whose sweep is built; else nothing."""
    from ..studies import ablations

    if run.resolve() != DEFAULT_RUN.resolve():
        return []
    try:
        rows = ablations.table()
        partner = ablations.load(names=(ablations.PARTNER,))[ablations.PARTNER]
    except FileNotFoundError:
        return ["", "## What each piece does (chapters 2-8)", "",
                "The ablation sweep is not built for this code: `python -m labkit sweep sweeps/ablations.json`."]
    out = ["", "## What each piece does: the ablation sweep (chapters 2-8 and the objectives appendix)", "",
           f"Every run starts from the warm start at {partner.prompts_per_iteration} prompts x G = "
           f"{partner.G}, {partner.iterations} iterations, rate {ablations.format_rate(partner.lr)} "
           f"(`sweeps/ablations.json`), with the same prompts and seeds as `{ablations.PARTNER}`, and changes what its "
           f"row says. Differences are against `{ablations.PARTNER}`, paired: on the test (200 problems x 4 draws) and "
           "on the last "
           "fixed-prompt validation checkpoint (64 problems x 4 draws), with the permutation test's p (\"<= p\": no "
           "resample was as extreme, so the true p may be smaller). The last "
           "three columns are means over the last 10 iterations. The KL estimators' runs (`k1_beta_1` to "
           "`k3_beta_1`) are paired with the exact KL at the same coefficient (`beta_1`) in the objectives "
           "appendix; the sampler runs (`bf16_*`, `fp8_*`) sample from a copy of the policy with rounded weights, "
           "and the appendix also gives the size of that mismatch.", "",
           f"| run | what it changes | test per draw | vs {ablations.PARTNER}, test (p) | vs {ablations.PARTNER}, "
           "validation (p) | KL at the end "
           "| tokens clipped | groups with no signal |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: (r["chapter"], r["name"])):
        def vs(kind: str) -> str:
            bound = r[f"{kind}_p_is_bound"]
            p = paired.format_p(r[f"{kind}_p"], at_most=bound).removeprefix("p = ").removeprefix("p ")
            return f"{100 * r[f'{kind}_difference']:+.1f} ({p})"

        out.append(f"| `{r['name']}` | {r['changes']} | {_pct(r['test_per_draw'])} | "
                   + (f"{vs('test')} | {vs('validation')}" if "test_p" in r else "| ")
                   + f" | {r['kl_end']:.4f} | {_pct(r['clip_end'])} | {_pct(r['zero_signal'])} |")
    return out


def _times_rows(run: Path) -> list[str]:
    """The wall-time table of protocol_times.json (none without the file)."""
    times = run / "protocol_times.json"
    if not times.is_file():
        return []
    t = read_json(times)
    order = ("base", "warm_start", "sft", "sft_resume", "grpo", "grpo_resume", "sampler_agreement",
             "evaluation", "group_size")
    if "base" not in t and (run / "base" / "manifest.json").is_file():
        t["base"] = read_json(run / "base" / "manifest.json")["wall_time_s"]  # pretrained on its own
    out = ["", "Wall time of each step of `python -m labkit all` on this run's machine (the base's from "
           "its own manifest):", "", "| step | seconds |", "| --- | ---: |"]
    out += [f"| {k} | {t[k]:.1f} |" for k in sorted(t, key=lambda k: order.index(k) if k in order else 99)]
    out.append(f"| **total** | {sum(t.values()):.1f} |")
    return out


def headline_table(rates: dict, by_pair: dict, policies: list[str]) -> str:
    """One row per policy: greedy and per-draw success on ALL with Wilson 95% intervals, and the paired
    verdict against the warm start in each mode (exact McNemar p; paired permutation p)."""
    lines = ["| policy | greedy pass@1 [95% interval] | per-draw success [95% interval] "
             "| against the warm start, greedy | against the warm start, per draw |",
             "| --- | ---: | ---: | --- | --- |"]
    for policy in policies:
        cells = []
        for mode in ("greedy", "sample"):
            r = rates["policies"][policy][mode]["ALL"]
            cells.append(f"{_pct(r['success_rate'])} {_interval(r['success_rate_ci'])}")
        c = by_pair.get(("warm_start", policy))
        if c is None:
            cells += ["(the start)", "(the start)"] if policy == "warm_start" else ["not compared", "not compared"]
        else:
            g, s = c["greedy"], c["sample"]
            cells.append(paired.verdict(g["p"], what="McNemar p", direction=_side(g["gained"] - g["lost"], policy)))
            cells.append(paired.verdict(s["p_permutation"], what="permutation p",
                                        direction=_side(s["mean_difference"], policy)))
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _summary(note: str, rates: dict, by_pair: dict, main: list[str], problems: int, draws: int) -> list[str]:
    """The results page's lines: the figure, the headline table, the verdicts, the link to the detail page."""
    shown_policies = [p for p in (*main, LARGE) if p in rates["policies"]]
    summary = [
        "# Results",
        "",
        note,
        "",
        f"![Greedy pass@1 and per-draw success of each policy on ALL, ID50 and OOD100, with Wilson 95% "
        f"intervals]({FIGURE})",
        "",
        "*Figure: greedy pass@1 (left) and per-draw success (right) of each policy on the test problems, on ALL, "
        "ID50 and OOD100; the bars are Wilson 95% intervals, which describe each rate. Whether two policies "
        "differ is decided by the paired tests in the table, not by the bars.*",
        "",
        f"Each policy answered the same {problems} test problems greedily and with {draws} seeded samples per "
        f"problem, the same seeds for every policy. Per-draw success is the mean over all {problems * draws} "
        f"samples, never best-of-{draws} (chapter 7). The last two columns compare each policy with the warm "
        "start, where all the others began, on the same problems and seeds: the exact McNemar test on the greedy "
        "answers, a paired permutation test on the draws, significant at the 5% level fixed in advance."
        + (f" `{LARGE}` is chapter 6's larger run, **outside the protocol's counts** (more rollouts per update, a "
           "rate chosen on validation)." if LARGE in shown_policies else ""),
        "",
        headline_table(rates, by_pair, shown_policies),
        "## The verdict",
        "",
    ]
    for than, better in (("sft", "grpo"), ("warm_start", "grpo"), ("warm_start", LARGE)):
        if (than, better) in by_pair:
            for mode in ("greedy", "sample"):
                summary.append(f"- {verdict(rates, mode, 'ALL', better, than, comparison=by_pair[(than, better)])}")
    summary += ["",
                f"Everything else (the paired table on every population, chance baselines, pass@k, the group-size "
                f"branches, the larger run, the ablation sweep (what each piece of GRPO does, chapters 2-8), training, "
                f"wall times and the protocol authors' own figures) is on "
                f"[Results in detail]({DETAIL})."]
    return summary


def _page(run: str | Path = DEFAULT_RUN) -> tuple[str, str, bytes]:
    """(the results page's markdown, the detail page's markdown, the figure's PNG bytes) for the run `run`."""
    from . import plots_results

    run = Path(run)
    results_path = run / "evaluation" / "results.json"
    if not results_path.is_file():
        raise FileNotFoundError(f"{results_path} does not exist: run `python -m labkit evaluate --preset <preset> "
                                "--policy all` (or `python -m labkit all`) first")
    results = read_checked_json(results_path)
    try:
        shown = run.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        shown = run.as_posix()
    policies = list(results["policy_order"])
    main = [p for p in MAIN_POLICIES if p in policies]
    setup = results["policies"][policies[0]]["evaluation"]
    problems, draws = setup["problems"], setup["draws"]
    labels = evaluate.load_test_labels(phase="scoring")
    dirs = evaluation_dirs(run, policies)
    rates = {"policies": {p: results["policies"][p] for p in policies}}
    if LARGE in dirs:
        rates["policies"][LARGE] = evaluate.score_policy(dirs[LARGE], labels)
    comparisons = paired_comparisons(dirs, labels)
    by_pair = {(c["a"], c["b"]): c for c in comparisons if c["subset"] == "ALL"}
    note = ("```{note}\n"
            f"This page is generated by `python -m labkit.book.build results-page --run {shown}` from the files of the "
            f"**{results['preset']}** run in `{shown}/` (`evaluation/results.json`, SHA-256 "
            f"`{sha256_file(results_path)[:16]}…`, and the raw predictions). Do not edit it by hand; regenerate it "
            "after a new run.\n```")
    summary = _summary(note, rates, by_pair, main, problems, draws)
    chapters_summary, chapters_detail = results_chapters.sections(run) if _is_tiny_cache(run) else ([], [])
    out = [
        "# Results in detail",
        "",
        note,
        "",
        "Every rate below was computed from the saved raw predictions joined with the test labels "
        f"(`python -m labkit results-json --check` recomputes them byte for byte). {problems} problems and "
        f"{problems * draws} samples are small samples: read the 95% Wilson intervals, not only the rates. "
        "Two policies are compared by paired tests on the same problems and seeds, never by their intervals.",
        "",
    ]
    if comparisons:
        out += _paired_section(comparisons, problems, draws)
    out += _chance_section(run, results, main)
    out += ["## Test evaluation by population", ""]
    rows = [r for r in results_table(results) if r["policy"] in main]
    out.append(markdown_table(rows))
    out += _pass_at_k_section(results, policies)
    extra = [p for p in policies if p not in MAIN_POLICIES]
    if extra:
        out += ["", "## The group-size branches (chapter 8)", ""]
        out.append(markdown_table([r for r in results_table(results) if r["policy"] in extra + ["warm_start"]
                                   and r["population"] == "ALL"]))
        if any(c["a"] == "grpo" and c["b"] in extra for c in comparisons):
            out.append("Their paired comparisons with the protocol's G = 4 run (`grpo`) are rows of the paired "
                       "table above.")
    if LARGE in dirs:
        out += [""] + _large_section(rates["policies"][LARGE])
    out += _ablation_section(run)
    out += chapters_detail
    out += ["", "## Training", ""]
    out += _training_rows(run)
    out += _times_rows(run)
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
    figure = plots_results.png_bytes(rates["policies"], tuple(SUBSETS))
    return "\n".join(summary + chapters_summary).rstrip() + "\n", "\n".join(out).rstrip() + "\n", figure


def _is_tiny_cache(run: Path) -> bool:
    """Chapters 9-11's runs are the tiny preset's committed cache: their rows belong to its pages only."""
    return run.resolve() == DEFAULT_RUN.resolve()


def render(run: str | Path = DEFAULT_RUN) -> str:
    """The results page's markdown for the run folder `run` (holding evaluation/results.json)."""
    return _page(run)[0]


def detail_path(out: str | Path = DEFAULT_OUT) -> Path:
    """Where the results page `out` keeps its detail page: DETAIL, beside it."""
    return Path(out).parent / DETAIL


def write(run: str | Path = DEFAULT_RUN, out: str | Path = DEFAULT_OUT) -> Path:
    """Render the two pages and the figure and write each atomically: `out`, detail_path(out), figure_path(out)."""
    out = Path(out)
    text, detail, figure = _page(run)
    atomic_write_bytes(figure_path(out), figure)
    atomic_write_text(detail_path(out), detail)
    atomic_write_text(out, text)
    return out


def is_current(run: str | Path = DEFAULT_RUN, out: str | Path = DEFAULT_OUT) -> bool:
    """True when `out`, its detail page and its figure hold exactly what `write(run, out)` writes now."""
    out, detail_file, figure_file = Path(out), detail_path(out), figure_path(out)
    if not (out.is_file() and detail_file.is_file() and figure_file.is_file()):
        return False
    text, detail, figure = _page(run)
    return (out.read_text(encoding="utf-8") == text and detail_file.read_text(encoding="utf-8") == detail
            and figure_file.read_bytes() == figure)
