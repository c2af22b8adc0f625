"""Chapter 11's numbers, from the committed thinking bases and reasoning runs (nothing is trained here).

    table = base_table()                       # per base: think rate, accuracy thinking / direct, per k
    before_after("from_rare_2")                # the run's base against the run, paired on the test chains
    verdict("from_rare_2")                     # selected / not created / ..., with its statistics

Every profile pairs the same 200 test chains (25 per k = 1 ... 8) and the same seeds, 8 draws each,
so a base and the run trained from it are compared chain by chain (`labkit.eval.paired`); pass@k is the
unbiased estimator of Chen et al. (2021) over those 8 draws.
"""

from __future__ import annotations

import gzip
import json
from math import comb

from ..lab.runs import RunFolder
from ..grpo.loop import read_rollouts
from ..eval import paired
from . import reasoning, thinking_base


def run_profile(name: str, preset: str = "tiny") -> dict:
    """A reasoning run's test profile ({"summary", "table", "rows"}), checked against its manifest."""
    folder = RunFolder(reasoning.default_run_dir(preset, name))
    folder.check_file("profile.json.gz")
    return json.loads(gzip.decompress((folder / "profile.json.gz").read_bytes()))


def run_history(name: str, preset: str = "tiny") -> list[dict]:
    folder = RunFolder(reasoning.default_run_dir(preset, name))
    folder.check_file("history.json")
    return json.loads((folder / "history.json").read_text())


def run_rollouts(name: str, preset: str = "tiny") -> list[dict]:
    """A reasoning run's rows, read as every GRPO run's (`labkit.grpo.loop.read_rollouts`: checked against
    its ledger, no rollout twice, no iteration missing)."""
    return read_rollouts(reasoning.default_run_dir(preset, name))


def summary_row(name: str, rows: list[dict]) -> dict:
    """Think rate, accuracy overall / thinking / direct, share of thinking responses with every step right."""
    thinking = [r for r in rows if r["thinks"]]
    direct = [r for r in rows if not r["thinks"]]
    rate = lambda part, key: (sum(bool(r[key]) for r in part) / len(part)) if part else None  # noqa: E731
    return {"name": name, "responses": len(rows), "think_rate": len(thinking) / len(rows),
            "accuracy": rate(rows, "reward"), "accuracy_thinking": rate(thinking, "reward"),
            "accuracy_direct": rate(direct, "reward"), "steps_right": rate(thinking, "steps_right"),
            "mean_tokens": sum(r["tokens"] for r in rows) / len(rows)}


def per_k(rows: list[dict]) -> dict[int, dict]:
    return {k: summary_row(str(k), [r for r in rows if r["k"] == k]) for k in sorted({r["k"] for r in rows})}


def base_table(preset: str = "tiny") -> list[dict]:
    """One row per thinking base (its test profile at temperature 1)."""
    return [summary_row(name, thinking_base.read_profile(name, preset)["rows"]) for name in thinking_base.BASES]


def successes_by_chain(rows: list[dict], field: str = "reward") -> dict[tuple[int, int], list[int]]:
    """{(k, chain index): [`field` of draw 0, 1, ...] as 0/1}: the reward (default) or the think flag."""
    out: dict[tuple[int, int], list[int]] = {}
    for r in sorted(rows, key=lambda r: (r["k"], r["index"], r["draw"])):
        out.setdefault((r["k"], r["index"]), []).append(int(r[field]))
    return out


def paired_over_chains(before: list[dict], after: list[dict], field: str = "reward") -> dict:
    """`paired.paired_mean_difference` of `field`'s count per chain, before against after (same chains, seeds)."""
    a, b = successes_by_chain(before, field), successes_by_chain(after, field)
    if a.keys() != b.keys():
        raise ValueError("the two profiles were not made on the same chains")
    chains = sorted(a)
    return paired.paired_mean_difference([sum(a[c]) for c in chains], [sum(b[c]) for c in chains], len(a[chains[0]]))


def pass_at(rows: list[dict], k: int) -> float:
    """Mean over chains of the unbiased pass@k, 1 - C(n - c, k) / C(n, k), n draws with c right."""
    chains = successes_by_chain(rows)
    n = len(next(iter(chains.values())))
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= {n} draws, got k={k}")
    return sum(1 - comb(n - sum(s), k) / comb(n, k) for s in chains.values()) / len(chains)


def profiles(run_name: str, preset: str = "tiny") -> tuple[list[dict], list[dict]]:
    """(the run's base's test rows, the run's test rows): the same chains and seeds."""
    return thinking_base.read_profile(reasoning.get_run(run_name).base, preset)["rows"], run_profile(run_name, preset)["rows"]


def before_after(run_name: str, preset: str = "tiny", rows: tuple[list[dict], list[dict]] | None = None) -> dict:
    """The run's base and the run on the same test chains and seeds: per-draw accuracy paired over chains,
    think rates, pass@1 and pass@8, and the chains the run solves that its base never solved in 8 draws.
    rows: `profiles(run_name)`, when already read."""
    before, after = rows or profiles(run_name, preset)
    a, b = successes_by_chain(before), successes_by_chain(after)
    chains = sorted(a)
    draws = len(a[chains[0]])
    base = reasoning.get_run(run_name).base
    return {"run": run_name, "base": base, "draws": draws, "chains": len(chains),
            "before": summary_row(base, before), "after": summary_row(run_name, after),
            "accuracy_test": paired_over_chains(before, after),
            "pass_at_1": (pass_at(before, 1), pass_at(after, 1)),
            "pass_at_8": (pass_at(before, draws), pass_at(after, draws)),
            "reached": sum(1 for c in chains if not any(a[c]) and any(b[c])),
            "lost": sum(1 for c in chains if any(a[c]) and not any(b[c]))}


def think_test(run_name: str, preset: str = "tiny", rows: tuple[list[dict], list[dict]] | None = None) -> dict:
    """The think rate before and after, paired over chains (thinking draws per chain)."""
    return paired_over_chains(*(rows or profiles(run_name, preset)), field="thinks")


SELECTED, CREATED, NOT_CREATED, DESELECTED, NO_CHANGE = ("selected", "created", "not created", "selected against",
                                                         "no separable change")


def verdict(run_name: str, preset: str = "tiny", alpha: float = paired.ALPHA) -> dict:
    """The source design's question for one run: did RL select a behaviour its base showed (think rate up
    from a rare start, accuracy up with it), fail to create one its base never showed, select against it
    (think rate down), or change nothing separable?  Each change is a paired test over the test chains."""
    rows = profiles(run_name, preset)  # read once for both tests
    ba, thinks = before_after(run_name, preset, rows), think_test(run_name, preset, rows)
    started = ba["before"]["think_rate"] > 0
    moved = lambda test: 0 if test["p_permutation"] >= alpha else (1 if test["mean_difference"] > 0 else -1)  # noqa: E731
    think, accuracy = moved(thinks), moved(ba["accuracy_test"])
    if think > 0 and accuracy > 0:
        call = SELECTED if started else CREATED
    elif not started and ba["after"]["think_rate"] == 0:
        call = NOT_CREATED
    elif think < 0:
        call = DESELECTED
    elif think > 0 or accuracy != 0:
        call = f"think rate {'up' if think > 0 else 'unchanged'}, accuracy {['down', 'unchanged', 'up'][accuracy + 1]}"
    else:
        call = NO_CHANGE
    return {"run": run_name, "verdict": call, "think_test": thinks, **ba}


def thinking_accuracy(before: list[dict], after: list[dict]) -> dict:
    """Is the working itself better after RL, not only more frequent?  The share right among the answers
    that work the chain out, before and after (pooled over the draws), and the per-chain difference of
    that share, paired over the chains where both profiles worked it out at least once (a sign-flip
    permutation test, `paired.permutation_p`)."""
    def by_chain(rows):
        out: dict[tuple[int, int], list[int]] = {}
        for r in rows:
            if r["thinks"]:
                out.setdefault((r["k"], r["index"]), []).append(int(r["reward"]))
        return out

    a, b = by_chain(before), by_chain(after)
    shared = sorted(set(a) & set(b))
    differences = [sum(b[c]) / len(b[c]) - sum(a[c]) / len(a[c]) for c in shared]
    p, method = paired.permutation_p(differences) if shared else (1.0, "exact")
    pooled = lambda chains: (sum(sum(v) for v in chains.values()) / sum(len(v) for v in chains.values())  # noqa: E731
                             if chains else None)
    return {"before": pooled(a), "after": pooled(b), "thinking_before": sum(len(v) for v in a.values()),
            "thinking_after": sum(len(v) for v in b.values()), "chains": len(shared),
            "mean_difference": sum(differences) / len(differences) if shared else None,
            "p_permutation": p, "p_permutation_method": method}


def lonely_workers(rows: list[dict], G: int) -> dict:
    """The groups in which no answer was right and some worked the chain out (a run's rollout rows, in
    groups of G): how hard the std normalisation pushed a worked answer down there.  Returns the count of
    such groups, the advantages of their worked answers, and the most negative one with its group's
    optimised rewards and what the mean-only advantage (no std) would have been."""
    groups = [rows[i:i + G] for i in range(0, len(rows), G)]
    lonely = [g for g in groups if not any(r["reward"] for r in g) and any(r["thinks"] for r in g)
              and len({r["optimised_reward"] for r in g}) > 1]
    worked = [(r, g) for g in lonely for r in g if r["thinks"]]
    if not worked:
        return {"groups": 0, "advantages": [], "worst": None}
    loser, group = min(worked, key=lambda t: t[0]["advantage"])
    rewards = [r["optimised_reward"] for r in group]
    return {"groups": len(lonely), "advantages": [r["advantage"] for r, _ in worked],
            "worst": {"iteration": loser["iteration"], "advantage": loser["advantage"], "rewards": rewards,
                      "mean_only": loser["optimised_reward"] - sum(rewards) / len(rewards),
                      "thinks": [bool(r["thinks"]) for r in group]}}
