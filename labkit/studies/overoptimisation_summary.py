"""Verdicts from the over-optimisation runs' files (chapter 10; `labkit.studies.overoptimisation` made them).

Kept apart from the module that makes the runs, so that a change to how the chapter words its
verdicts does not make the cached runs stale.

A GRPO setting's record (settings/<name>.jsonl.gz) holds its checkpoint `curves`, one per
`curve_every` iterations, each with these keys:

    iteration          0 = the warm start
    true_success       the verifier's share of the 200 x 4 validation answers
    proxy_yes          the proxy's share of them it pays (p >= threshold): what the loss optimised
    proxy_p            the proxy's mean p(correct) on them
    sequence_kl        mean over the answers of sum_t KL(pi(.|prefix) || pi_0(.|prefix)), nats
    true_counts        per problem, correct answers among its 4 (the same seeds at every checkpoint)
    proxy_counts       per problem, answers the proxy paid among its 4
    fooled             counts by kind of the answers the proxy paid and the verifier did not
    fooled_examples    the first few of them, with the verifier's reason

Paired tests compare two checkpoints of one run problem by problem (`labkit.eval.paired`:
a 95% t interval of the mean per-problem difference and the sign-flip permutation test).
"""

from __future__ import annotations

import math

from ..eval import paired
from .overoptimisation import BEST_OF_N_DRAWS, BEST_OF_N_SIZES, PROXIES, best_of_n, best_of_n_kl, best_of_n_weights


def proxy_table(proxies: dict) -> list[dict]:
    """One row per proxy: its judge, share, training responses and held-out precision and recall."""
    rows = []
    for name in [p.name for p in PROXIES if p.name in proxies]:  # the table's order, not the file's
        r = proxies[name]
        rows.append({"name": name, "judge": r["judge"], "share": r["share"], "train_responses": r["train_responses"],
                     "held_out_n": r["metrics"]["held_out"]["n"], "precision": r["metrics"]["held_out"]["precision"],
                     "recall": r["metrics"]["held_out"]["recall"], "accuracy": r["metrics"]["held_out"]["accuracy"]})
    return rows


def setting_summary(record: dict) -> dict:
    """Start, peak (of the true reward) and end of a GRPO setting, with paired tests start -> end."""
    curves = record["curves"]
    start, end = curves[0], curves[-1]
    peak = max(curves, key=lambda c: (c["true_success"], -c["iteration"]))  # the first of equal maxima (exact
    # rates: counts over the same 800 answers)
    D = start["draws"]
    true_change = paired.paired_mean_difference(start["true_counts"], end["true_counts"], D)
    proxy_change = paired.paired_mean_difference(start["proxy_counts"], end["proxy_counts"], D)
    return {
        "name": record["setting"]["name"], "proxy": record["setting"]["proxy"], "kl": record["setting"]["kl"],
        "iterations": record["setting"]["iterations"],
        "start": {"true": start["true_success"], "proxy": start["proxy_yes"]},
        "end": {"true": end["true_success"], "proxy": end["proxy_yes"], "sqrt_kl": math.sqrt(end["sequence_kl"]),
                "iteration": end["iteration"]},
        "peak": {"true": peak["true_success"], "iteration": peak["iteration"], "kl": peak["sequence_kl"],
                 "sqrt_kl": math.sqrt(peak["sequence_kl"])},
        "true_change": true_change, "proxy_change": proxy_change,
        "over_optimised": over_optimised(true_change, proxy_change),
    }


def over_optimised(true_change: dict, proxy_change: dict) -> bool:
    """The proxy rose and the truth fell, each beyond its 95% interval (the interval excludes 0)."""
    return true_change["interval"][1] < 0 < proxy_change["interval"][0]


def best_of_n_kl_with_ties(texts: list[str], scores: list[float], n: int) -> float:
    """KL(best-of-n pick || one draw) over one problem's draws, identical responses counted as one answer.

    The pick's distribution is `best_of_n_weights` summed over the draws that wrote the same text; one
    draw's is each text's share of the draws.  log n - (n - 1)/n (`best_of_n_kl`) is this KL when every
    draw is a different answer with a different score; a tiny model's draws repeat (the same short
    answer many times), and the pick cannot leave a distribution that puts mass on few answers, so the
    KL with ties is smaller.  Natural log, so nats."""
    weights = best_of_n_weights(scores, n)
    pick: dict[str, float] = {}
    share: dict[str, float] = {}
    for text, w in zip(texts, weights):
        pick[text] = pick.get(text, 0.0) + w
        share[text] = share.get(text, 0.0) + 1.0 / len(texts)
    return max(0.0, sum(q * math.log(q / share[t]) for t, q in pick.items() if q > 0))


def best_of_n_table(rows: list[dict]) -> dict:
    """Per proxy and n: the mean over problems of best-of-n's true reward and proxy p, its KL (measured with
    the draws' ties: `best_of_n_kl_with_ties`; `kl_bound`, log n - (n - 1)/n, holds without ties), and per
    problem the true values (for paired tests between two n)."""
    by_problem: dict[str, list[dict]] = {}
    for r in rows:
        by_problem.setdefault(r["problem_id"], []).append(r)
    for draws in by_problem.values():
        draws.sort(key=lambda r: r["draw"])
        if len(draws) != BEST_OF_N_DRAWS:
            raise ValueError(f"problem {draws[0]['problem_id']}: {len(draws)} draws, expected {BEST_OF_N_DRAWS}")
    out = {}
    for proxy in PROXIES:
        out[proxy.name] = []
        for n in BEST_OF_N_SIZES:
            values = [best_of_n([float(r["reward"]) for r in d], [r["p"][proxy.name] for r in d], n)
                      for d in by_problem.values()]
            kl = sum(best_of_n_kl_with_ties([r["text"] for r in d], [r["p"][proxy.name] for r in d], n)
                     for d in by_problem.values()) / len(by_problem)
            out[proxy.name].append({"n": n, "kl": kl, "sqrt_kl": math.sqrt(kl), "kl_bound": best_of_n_kl(n),
                                    "true": sum(v[0] for v in values) / len(values),
                                    "proxy_p": sum(v[1] for v in values) / len(values),
                                    "true_per_problem": [v[0] for v in values]})
    return out


def best_of_n_summary(table: dict) -> dict:
    """Per proxy: the n where the true reward peaks, and the paired difference from that peak to n = 32."""
    out = {}
    for name, points in table.items():
        best = max(p["true"] for p in points)
        peak = next(p for p in points if p["true"] >= best - 1e-9)  # the smallest n at the maximum (float sums)
        last = points[-1]
        d = [b - a for a, b in zip(peak["true_per_problem"], last["true_per_problem"])]
        p, method = paired.permutation_p(d)
        out[name] = {"peak_n": peak["n"], "peak_true": peak["true"], "peak_kl": peak["kl"],
                     "start_true": points[0]["true"], "last_n": last["n"], "last_true": last["true"],
                     "start_proxy": points[0]["proxy_p"], "last_proxy": last["proxy_p"],
                     "fall_to_last": sum(d) / len(d), "fall_interval": paired.mean_interval(d),
                     "p": p, "p_method": method}
    return out
