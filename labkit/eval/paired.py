"""Paired tests between two policies evaluated on the same test problems with the same seeds.

Why paired.  The evaluation (labkit.eval.evaluate) gives every policy the same 200 test problems and,
for each sampled draw, the same seed: seed(problem_id, draw) is a function of those two alone.
So two policies' answers come in pairs, one pair per (problem, draw), and what differs inside a
pair is the policy, not the problem or the noise.  A problem both policies solve, or both fail,
says nothing about which is better; only the discordant pairs do.  A paired test uses exactly
that: McNemar's test on the greedy answers, and a sign test and a paired permutation test on the
per-problem success rates of the sampled draws.  An unpaired comparison of the two rates throws
the pairing away and is far less sensitive when most answers are shared.

Why overlapping intervals are not a test.  "The two Wilson 95% intervals overlap" is not
"the rates do not differ at the 5% level": the intervals can overlap while a test of the
difference rejects.  81/160 = 50.6% [43.0%, 58.3%] and 102/160 = 63.7% [56.1%, 70.8%]
overlap, yet Fisher's exact test of the two counts gives p = 0.024.  (For two independent
rates with similar standard errors s, the intervals stop overlapping only at a gap of about
2 x 1.96 s, while the test rejects at 1.96 x sqrt(2) s, about 2.77 s.)  The intervals stay as
description of each rate; the verdict comes from a test.

Every distribution comes from scipy.stats: binomtest (McNemar, sign test, Wilson interval),
t (the interval of a mean difference), permutation_test (paired sign flips) and fisher_exact
(unpaired rates).  Nothing here generates or scores: compare_policies reads the saved
predictions and scores them with labkit.eval.evaluate.score_rows.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import numpy as np
from scipy import stats

ALPHA = 0.05  # the level of every verdict here (and of labkit.book.narrative's change_verdict)
CONFIDENCE = 0.95  # the interval of a mean difference, and the default Wilson interval
PERMUTATION_RESAMPLES = 20_000  # sign flips of the Monte-Carlo permutation test
PERMUTATION_SEED = 20_240_601  # numpy.random.default_rng seed of those flips: the p-value is reproducible
SUBSETS = ("ALL", "ID50", "OOD100")  # the test populations, as labkit.eval.evaluate.POPULATIONS names them
SUCCESS = "reward"  # the 0/1 success field of a scored row (labkit.eval.evaluate.score_rows)


# --- 1. Arguments -----------------------------------------------------------------------------------


def _count(value, name: str) -> int:
    """A non-negative integer count (bool and numpy floats refused); ValueError naming it otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_trials(successes, n, name: str = "successes") -> tuple[int, int]:
    """(successes, n) with n >= 1 and 0 <= successes <= n, the rules of labkit.eval.evaluate.wilson_interval."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"an interval needs n >= 1 trials, got n={n!r}")
    if isinstance(successes, (bool, np.bool_)) or not isinstance(successes, (int, np.integer)) \
            or not 0 <= successes <= n:
        raise ValueError(f"{name} must be an integer in 0..n={n}, got {successes!r}")
    return int(successes), int(n)


# --- 2. Tests on counts -------------------------------------------------------------------------------


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pairs of a paired 0/1 comparison.

    gained: pairs where A failed and B succeeded; lost: A succeeded and B failed.  Under the null
    (no difference) each discordant pair is B's gain with probability 1/2, so the test is the exact
    binomial scipy.stats.binomtest(gained, gained + lost, 0.5), two-sided.  1.0 with no discordant
    pair (nothing tells the two apart).
    """
    gained, lost = _count(gained, "gained"), _count(lost, "lost")
    if gained + lost == 0:
        return 1.0
    return float(stats.binomtest(gained, gained + lost, 0.5).pvalue)


def sign_test(differences) -> dict:
    """Exact two-sided sign test of per-problem differences (B - A): {"up", "down", "ties", "p"}.

    up / down: differences above / below 0; ties (== 0) are dropped from the test.  p is
    scipy.stats.binomtest(up, up + down, 0.5).pvalue, 1.0 when every difference is a tie.
    """
    d = np.asarray(differences, dtype=np.float64)
    up, down = int(np.sum(d > 0)), int(np.sum(d < 0))
    return {"up": up, "down": down, "ties": int(d.size) - up - down, "p": mcnemar_exact(up, down)}


def two_proportion_test(k0: int, n0: int, k1: int, n1: int) -> float:
    """Two-sided Fisher exact p-value that k0/n0 and k1/n1 are the same rate (UNPAIRED samples).

    For rates measured on different samples with no pairing between them, e.g. the training reward
    of the first 10 iterations against the last 10, drawn on different prompts: there is no pair to
    match, so the 2x2 table [[k0, n0 - k0], [k1, n1 - k1]] is all there is.  Fisher's test
    (scipy.stats.fisher_exact) conditions on its margins and is exact, so it holds at small counts
    and at 0 or n successes, where a normal approximation does not.
    """
    k0, n0 = _check_trials(k0, n0, "k0")
    k1, n1 = _check_trials(k1, n1, "k1")
    return float(stats.fisher_exact([[k0, n0 - k0], [k1, n1 - k1]]).pvalue)


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> list[float]:
    """[low, high] Wilson score interval of successes / n at `confidence` (95% by default):
    labkit.eval.evaluate.wilson_interval (scipy.stats.binomtest's proportion_ci, method "wilson") at
    z = norm.ppf((1 + confidence) / 2), with its argument rules (n >= 1, successes in 0..n)."""
    from . import evaluate

    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0 < confidence < 1:
        raise ValueError(f"confidence must be a number strictly between 0 and 1, got {confidence!r}")
    successes, n = _check_trials(successes, n)
    return evaluate.wilson_interval(successes, n, z=float(stats.norm.ppf((1 + confidence) / 2)))


# --- 3. Paired rates -------------------------------------------------------------------------------------


def permutation_p(differences) -> tuple[float, str]:
    """(two-sided p, method) of a paired sign-flip permutation test that the mean difference is 0.

    scipy.stats.permutation_test on the one sample of differences with permutation_type="samples"
    (which flips the sign of each difference independently) and the statistic sum(d).  Zero
    differences are dropped first: flipping a 0 changes nothing, so the p-value is the same.  With
    m non-zero differences the test is EXACT when 2^m <= PERMUTATION_RESAMPLES (scipy enumerates
    every flip), else Monte Carlo with PERMUTATION_RESAMPLES flips drawn by
    numpy.random.default_rng(PERMUTATION_SEED): deterministic, and scipy's (hits + 1) / (N + 1).
    (1.0, "exact") with fewer than two non-zero differences: +-d are the only two sums, and each
    is as extreme as the observed one.
    """
    d = np.asarray(differences, dtype=np.float64)
    d = d[d != 0]
    if d.size < 2:
        return 1.0, "exact"
    exact = 2 ** d.size <= PERMUTATION_RESAMPLES
    if not exact and _sums_exactly(d):
        return _monte_carlo_sign_flip_p(d), f"monte carlo, {PERMUTATION_RESAMPLES} sign flips"
    result = stats.permutation_test((d,), lambda x, axis: np.sum(x, axis=axis), permutation_type="samples",
                                    vectorized=True, n_resamples=PERMUTATION_RESAMPLES, alternative="two-sided",
                                    rng=np.random.default_rng(PERMUTATION_SEED))
    return float(result.pvalue), "exact" if exact else f"monte carlo, {PERMUTATION_RESAMPLES} sign flips"


def _sums_exactly(d: np.ndarray) -> bool:
    """Every partial sum of the kept differences is exact in float32: integers whose absolute sum stays below
    2^23 (the paired counts' differences: at most 8 x 200), so that no order of summation can change a sum and
    the comparisons below see what scipy's do; and a little-endian machine (`_monte_carlo_sign_flip_p`)."""
    return sys.byteorder == "little" and bool(np.all(d == np.round(d))) and float(np.abs(d).sum()) < 2.0 ** 23


def _monte_carlo_sign_flip_p(d: np.ndarray) -> float:
    """scipy.stats.permutation_test's Monte Carlo p of `permutation_p`, computed without its general machinery
    (which indexes a (flips, m, 2) array of permutations: 0.1 s a test, 300 tests on the results page).

    scipy treats the one sample of m differences as m samples of two observations (d_i, -d_i) and draws, for
    each flip and each i, a permutation of the pair with `Generator.permuted`: a Fisher-Yates shuffle of two
    items, one `random_interval(1)` each, which is the low bit of the generator's next 32-bit output (PCG64
    hands out each 64-bit draw as two 32-bit halves, low half first: on a little-endian machine, the draws
    viewed as uint32 in order); bit 1 leaves the pair as it is, so the flip keeps +d_i.  Each flip's sum is
    2 (bits . d) - sum(d), compared with the observed sum with scipy's tolerance and its (hits + 1) / (N + 1).
    Equal to scipy's p bit for bit where `_sums_exactly`: tests/test_paired.py compares the two."""
    n, m = PERMUTATION_RESAMPLES, d.size
    raw = np.random.default_rng(PERMUTATION_SEED).bit_generator.random_raw((n * m + 1) // 2)
    bits = (raw.view(np.uint32)[: n * m] & 1).astype(np.float32).reshape(n, m)  # (n, m): 1 keeps d_i, 0 flips it
    observed = float(d.sum())
    null = 2.0 * (bits @ d.astype(np.float32)).astype(np.float64) - observed  # (n,): exact integer sums
    gamma = abs(np.finfo(np.float64).eps * 100 * observed)
    less = (np.count_nonzero(null <= observed + gamma) + 1) / (n + 1)
    greater = (np.count_nonzero(null >= observed - gamma) + 1) / (n + 1)
    return float(np.clip(min(less, greater) * 2, 0.0, 1.0))


def mean_interval(differences, confidence: float = CONFIDENCE) -> list[float]:
    """t interval of the mean of paired differences: mean +- t(1 - a/2, n - 1) * sd / sqrt(n).

    sd with ddof = 1, t from scipy.stats.t.  Needs n >= 2.  When every difference is the same
    (sd = 0; all-zero differences give [0, 0]) the interval is that value, twice.
    """
    d = np.asarray(differences, dtype=np.float64)
    if d.size < 2:
        raise ValueError(f"an interval of a mean difference needs at least 2 problems, got {d.size}")
    mean, sd = float(np.mean(d)), float(np.std(d, ddof=1))
    if sd == 0.0:
        return [mean, mean]
    half = float(stats.t.ppf(0.5 + confidence / 2, d.size - 1)) * sd / float(np.sqrt(d.size))
    return [mean - half, mean + half]


def paired_mean_difference(a_counts, b_counts, draws: int) -> dict:
    """The mean per-problem success-rate difference (B - A) of two policies on the same problems.

    a_counts, b_counts: successes of each problem among its `draws` samples, in the same problem
    order.  Returns {"n_problems", "a_rate", "b_rate", "mean_difference", "interval" (95% t interval,
    mean_interval), "p_permutation" and "p_permutation_method" (permutation_p of the differences)}.
    """
    draws = _count(draws, "draws")
    a, b = np.asarray(a_counts, dtype=np.int64), np.asarray(b_counts, dtype=np.int64)
    if draws < 1 or a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"need draws >= 1 and two equally long lists of counts, got draws={draws}, "
                         f"{a.shape} and {b.shape}")
    if a.min(initial=0) < 0 or b.min(initial=0) < 0 or max(a.max(initial=0), b.max(initial=0)) > draws:
        raise ValueError(f"every count must lie in 0..draws={draws}")
    diff = (b - a) / draws
    interval = mean_interval(diff)
    p, method = permutation_p(b - a)  # integer differences: the same test, no float ties
    return {"n_problems": int(a.size), "a_rate": float(np.mean(a / draws)), "b_rate": float(np.mean(b / draws)),
            "mean_difference": float(np.mean(diff)), "interval": interval,
            "p_permutation": p, "p_permutation_method": method}


# --- 4. Words -----------------------------------------------------------------------------------------------


def format_p(p: float, what: str = "p", at_most: bool = False) -> str:
    """'p = 0.45', 'p = 0.0012', 'p = 3.4e-5' (2 significant digits) or 'p < 1e-6' below 1e-6.

    at_most: p is a bound, not a value ('p <= 1.0e-4'): a Monte-Carlo permutation test in which no
    flip was as extreme as the observed sum gives the smallest p its flips can give."""
    if at_most:
        mantissa, exponent = f"{p:.1e}".split("e")
        return f"{what} <= {mantissa}e{int(exponent)}"
    if p < 1e-6:
        return f"{what} < 1e-6"
    if p < 1e-4:
        mantissa, exponent = f"{p:.1e}".split("e")
        return f"{what} = {mantissa}e{int(exponent)}"
    return f"{what} = {p:.2g}"


def verdict(p: float, alpha: float = ALPHA, what: str = "p", direction: str = "", at_most: bool = False) -> str:
    """'significant at p = 0.0012' (with direction: 'B ahead, significant at ...') or 'not separable (p = 0.45)'.

    what: how the p-value is named in the words ("exact McNemar p").  direction: the side a
    significant result lies on; a result that is not significant claims none.
    """
    if not 0 <= p <= 1 or not 0 < alpha < 1:
        raise ValueError(f"need 0 <= p <= 1 and 0 < alpha < 1, got p={p!r}, alpha={alpha!r}")
    if p < alpha:
        return (f"{direction}, " if direction else "") + f"significant at {format_p(p, what, at_most)}"
    return f"not separable ({format_p(p, what, at_most)})"


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment of a family of m p-values (Holm 1979), in the order given.

        sort ascending p_(1) <= ... <= p_(m);  adj_(i) = max over j <= i of min(1, (m - j + 1) p_(j))

    A hypothesis is rejected at level alpha when its adjusted p is below alpha; the chance of rejecting
    any true one in the family stays below alpha, whatever their dependence."""
    if not pvalues or any(not 0.0 <= p <= 1.0 for p in pvalues):
        raise ValueError(f"holm needs p-values in [0, 1], got {pvalues!r}")
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def at_floor(p: float, method: str) -> bool:
    """Is `p` the smallest p-value a Monte-Carlo permutation test can give (no flip as extreme)?
    scipy's two-sided Monte-Carlo p is at least 2 / (PERMUTATION_RESAMPLES + 1); the true p may be smaller."""
    return method != "exact" and p <= 2 / (PERMUTATION_RESAMPLES + 1) * (1 + 1e-9)


def _side(gap: float, names: tuple[str, str]) -> str:
    return f"{names[1]} ahead" if gap > 0 else f"{names[1]} behind"


# --- 5. Comparisons of scored rows ---------------------------------------------------------------------------


def _by_key(rows: list[dict], draws: bool, name: str) -> dict[tuple, int]:
    """{(problem_id[, draw]): 0/1 success}; ValueError on a duplicated key or a success that is not 0/1."""
    out = {}
    for r in rows:
        key = (r["problem_id"], r["draw"]) if draws else (r["problem_id"],)
        if key in out:
            raise ValueError(f"{name}: key {key} appears twice")
        if r[SUCCESS] not in (0, 1):
            raise ValueError(f"{name}: {key} has {SUCCESS}={r[SUCCESS]!r}, expected 0 or 1")
        out[key] = int(r[SUCCESS])
    return out


def matched(a_rows: list[dict], b_rows: list[dict], draws: bool, names: tuple[str, str] = ("A", "B")) -> list[tuple]:
    """[(key, a success, b success)] in key order; ValueError naming a key one side has and the other lacks."""
    a, b = _by_key(a_rows, draws, names[0]), _by_key(b_rows, draws, names[1])
    for one, other, x, y in ((a, b, *names), (b, a, *names[::-1])):
        extra = sorted(set(one) - set(other))
        if extra:
            raise ValueError(f"{x} and {y} do not cover the same keys: {x} has {extra[0]} which {y} lacks "
                             f"({len(extra)} such key(s)); a paired test needs the same problems and draws")
    if not a:
        raise ValueError("no rows to compare")
    return [(k, a[k], b[k]) for k in sorted(a)]


def compare_greedy(a_rows: list[dict], b_rows: list[dict], names: tuple[str, str] = ("A", "B")) -> dict:
    """Exact McNemar test of two policies' greedy answers, matched by problem_id.

    a_rows, b_rows: scored greedy rows (labkit.eval.evaluate.score_rows: problem_id, reward 0/1).
    Returns {"n", "a_correct", "b_correct", "gained" (A wrong, B right), "lost" (A right, B wrong),
    "p" (mcnemar_exact), "verdict" (a sentence)}.
    """
    pairs = matched(a_rows, b_rows, draws=False, names=names)
    gained = sum(1 for _, x, y in pairs if y > x)
    lost = sum(1 for _, x, y in pairs if x > y)
    p = mcnemar_exact(gained, lost)
    words = verdict(p, what="exact McNemar p", direction=_side(gained - lost, names))
    return {"n": len(pairs), "a_correct": sum(x for _, x, _ in pairs), "b_correct": sum(y for _, _, y in pairs),
            "gained": gained, "lost": lost, "p": p,
            "verdict": f"{names[1]} gained {gained} problems and lost {lost} against {names[0]}: {words}"}


def compare_sampled(a_rows: list[dict], b_rows: list[dict], draws: int, names: tuple[str, str] = ("A", "B")) -> dict:
    """Sign test and paired permutation test of two policies' per-problem rates over `draws` seeded samples.

    a_rows, b_rows: scored sampled rows (problem_id, draw, reward 0/1), matched by (problem_id, draw);
    each problem must have draws 0..draws-1.  Returns {"n_problems", "draws", "a_rate", "b_rate",
    "up", "down", "ties" (problems where B's count is above, below, equal to A's), "p_sign"
    (sign_test), "mean_difference" (of per-problem rates, B - A), "interval" (95% t),
    "p_permutation", "p_permutation_method", "verdict" (a sentence, from the permutation test)}.
    """
    draws = _count(draws, "draws")
    pairs = matched(a_rows, b_rows, draws=True, names=names)
    seen: dict[str, set] = {}
    a_counts, b_counts = Counter(), Counter()
    for (pid, draw), x, y in pairs:
        seen.setdefault(pid, set()).add(draw)
        a_counts[pid] += x
        b_counts[pid] += y
    bad = sorted(pid for pid, d in seen.items() if d != set(range(draws)))
    if bad:
        raise ValueError(f"problem {bad[0]!r} has draws {sorted(seen[bad[0]])}, expected 0..{draws - 1} "
                         f"({len(bad)} such problem(s))")
    problems = sorted(seen)
    a = [a_counts[pid] for pid in problems]
    b = [b_counts[pid] for pid in problems]
    sign = sign_test(np.subtract(b, a))
    mean = paired_mean_difference(a, b, draws)
    words = verdict(mean["p_permutation"], what="paired permutation p", direction=_side(mean["mean_difference"], names),
                    at_most=at_floor(mean["p_permutation"], mean["p_permutation_method"]))
    sentence = (f"{names[1]} did better than {names[0]} on {sign['up']} problems and worse on {sign['down']} "
                f"({sign['ties']} ties; sign test {format_p(sign['p'])}), mean rate difference "
                f"{mean['mean_difference']:+.1%} [{mean['interval'][0]:+.1%}, {mean['interval'][1]:+.1%}]: {words}")
    return {"n_problems": mean["n_problems"], "draws": draws, "a_rate": mean["a_rate"], "b_rate": mean["b_rate"],
            "up": sign["up"], "down": sign["down"], "ties": sign["ties"], "p_sign": sign["p"],
            "mean_difference": mean["mean_difference"], "interval": mean["interval"],
            "p_permutation": mean["p_permutation"], "p_permutation_method": mean["p_permutation_method"],
            "verdict": sentence}


# --- 6. Two evaluated policies -------------------------------------------------------------------------------


def subset_ids(labels: list[dict], name: str) -> set[str]:
    """The test problem ids of subset `name`: "ALL" (every label), or a population ("ID50", "OOD100").

    The same split as labkit.eval.evaluate.score_policy: a row belongs to population P when its
    label's `population` is P, and ALL holds both.
    """
    if name not in SUBSETS:
        raise ValueError(f"unknown subset {name!r}; expected one of {SUBSETS}")
    return {r["id"] for r in labels if name == "ALL" or r["population"] == name}


# A page compares one policy with many (the results page: 91 comparisons of about 30 folders), so each
# folder's predictions are read, checked and scored once per process: keyed by the file (its path, size and
# modification time, so an edited file is read again), the problems expected and the draws.
_SCORED: dict[tuple, list[dict]] = {}


def _checked_and_scored(folder: Path, mode: str, expected: list[dict], draws: int) -> list[dict]:
    """One policy's predictions of `mode`, checked complete (evaluate.check_complete) and scored
    (evaluate.score_rows) against the `expected` labels; the rows are shared between callers: read only."""
    import json

    from . import evaluate

    path = folder / evaluate.PREDICTION_FILES[mode]
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, draws,
           json.dumps(expected, sort_keys=True, separators=(",", ":")))
    if key not in _SCORED:
        rows = evaluate.read_predictions(folder, mode)
        evaluate.check_complete(rows, [r["id"] for r in expected], draws, mode, f"{folder.name}/{mode}")
        _SCORED[key] = evaluate.score_rows(rows, {r["id"]: r for r in expected})
    return _SCORED[key]


def compare_policies(a_dir: str | Path, b_dir: str | Path, labels: list[dict], subset: str | None = None,
                     names: tuple[str, str] | None = None) -> dict:
    """{"greedy": compare_greedy, "sample": compare_sampled} of two evaluated policies (B = b_dir against A).

    a_dir, b_dir: evaluation folders (runs/<preset>/evaluation/<policy>/), named in the sentences
    by `names` (A, B), or by their folder names.  labels: the test labels (evaluate.load_test_labels(phase="scoring")).
    Each mode's predictions are read (evaluate.read_predictions), checked complete with the shared
    seeds (evaluate.check_complete, against each manifest's problems and draws), scored
    (evaluate.score_rows) and, with `subset`, restricted to subset_ids(labels, subset).
    The mode keys are labkit.eval.evaluate.MODES ("greedy", "sample").
    """
    from . import evaluate
    from ..lab.runs import read_json

    a_dir, b_dir = Path(a_dir), Path(b_dir)
    manifests = [read_json(d / evaluate.MANIFEST_FILE) for d in (a_dir, b_dir)]
    if manifests[0]["draws"] != manifests[1]["draws"]:
        raise ValueError(f"{a_dir.name} has {manifests[0]['draws']} draws per problem, {b_dir.name} "
                         f"{manifests[1]['draws']}: not paired")
    draws = manifests[0]["draws"]
    keep = subset_ids(labels, subset or "ALL")
    scored = {}
    for mode in evaluate.MODES:
        for d, manifest in zip((a_dir, b_dir), manifests):
            rows = _checked_and_scored(d, mode, evaluate.select_problems(labels, manifest["limit"]), draws)
            scored[(d, mode)] = [r for r in rows if r["problem_id"] in keep]
    names = names or (a_dir.name, b_dir.name)
    return {"greedy": compare_greedy(scored[(a_dir, "greedy")], scored[(b_dir, "greedy")], names),
            "sample": compare_sampled(scored[(a_dir, "sample")], scored[(b_dir, "sample")], draws, names)}


# --- 7. Per problem: what changed where ------------------------------------------------------------------------


def per_problem_successes(rows: list[dict]) -> dict[str, int]:
    """{problem_id: successful rows} of scored rows (greedy: 0 or 1; sampled: 0..draws)."""
    out: Counter = Counter()
    for r in rows:
        out[r["problem_id"]] += int(r[SUCCESS])
    return dict(out)


def transition_counts(a: dict[str, int], b: dict[str, int], top: int) -> list[list[int]]:
    """(top + 1) x (top + 1) table: entry [i][j] = problems with i successes under A and j under B.

    a, b: per_problem_successes of two policies over the same problems (top = 1 greedy, = draws sampled).
    The diagonal holds the problems whose count did not change; above it, B did better."""
    if set(a) != set(b):
        raise ValueError(f"the two policies answered different problems ({len(set(a) ^ set(b))} differ)")
    table = [[0] * (top + 1) for _ in range(top + 1)]
    for pid in a:
        if not (0 <= a[pid] <= top and 0 <= b[pid] <= top):
            raise ValueError(f"{pid}: {a[pid]} and {b[pid]} successes, expected 0..{top}")
        table[a[pid]][b[pid]] += 1
    return table


def changed_problems(a: dict[str, int], b: dict[str, int]) -> dict[str, list[str]]:
    """{"gained": ids where B has more successes than A, "lost": fewer, "same": equal}, each sorted."""
    return {"gained": sorted(p for p in a if b[p] > a[p]), "lost": sorted(p for p in a if b[p] < a[p]),
            "same": sorted(p for p in a if b[p] == a[p])}


def compare_counts(a_counts: list[int], b_counts: list[int], draws: int, names: tuple[str, str] = ("A", "B")) -> dict:
    """Paired comparison of two per-problem success counts listed in the same problem order.

    draws = 1 (greedy: 0/1 per problem): the exact McNemar test, keys as compare_greedy's.
    draws > 1 (successes out of `draws` seeded samples): the sign test and the paired permutation
    test, keys as compare_sampled's.  Used where there are no prediction files to match, e.g. two
    fixed-prompt checkpoints of a run (labkit.grpo.checkpoint_curves: greedy_correct, draws_correct).
    """
    if len(a_counts) != len(b_counts) or not a_counts:
        raise ValueError(f"{len(a_counts)} and {len(b_counts)} counts: a paired test needs one per problem on each side")
    if draws == 1:
        rows = lambda counts: [{"problem_id": str(k), SUCCESS: int(c)} for k, c in enumerate(counts)]  # noqa: E731
        return compare_greedy(rows(a_counts), rows(b_counts), names)
    rows = lambda counts: [{"problem_id": str(k), "draw": d, SUCCESS: int(d < c)}  # noqa: E731
                           for k, c in enumerate(counts) for d in range(draws)]
    return compare_sampled(rows(a_counts), rows(b_counts), draws, names)


def compare_checkpoints(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> dict:
    """{"greedy", "sample"} paired comparisons of two fixed-prompt checkpoint records (the same fixed
    problems in the same order; the draws share their seeds, so the pairs are problem by problem)."""
    if a["problems"] != b["problems"] or a["draws"] != b["draws"]:
        raise ValueError("the two checkpoints measured different fixed sets; they are not paired")
    return {"greedy": compare_counts(a["greedy_correct"], b["greedy_correct"], 1, names),
            "sample": compare_counts(a["draws_correct"], b["draws_correct"], a["draws"], names)}
