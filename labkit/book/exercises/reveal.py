"""Predict, then run: each chapter's question answered from the committed runs (chapters 2-8, issue 40).

Each `reveal_*` reads what it needs through labkit.studies.ablations (the ablation sweep, the gradient
study), prints the measurement with its paired tests, compares the student's prediction with
`check_prediction` and says why the runs came out as they did; it returns the checker's
{"prediction", "measured", "right"}.  Every number in the words is computed here from the files.
"""

from __future__ import annotations

from ...config import ReasoningConfig, get_preset
from ...lab.runs import RunFolder, display_path
from ...eval import paired
from ...studies import ablations, reasoning_report, reasoning_sweep, thinking_base
from .predict import check_prediction, require_prediction


IDENTITY_CHOICES = ("stays the same", "halves", "falls to a quarter")


def reveal_identity(prediction, preset: str = "tiny") -> dict:
    """Chapter 2: from 16 to 64 sampled tokens, what happens to the score-function estimate's error?"""
    require_prediction(prediction, **EXPECTED["reveal_identity"])  # refused before anything is shown
    identity = ablations.gradient_study_results(preset)["identity"]
    case = identity["cases"][-1]  # the case where the warm start is unsure
    sizes, errors = case["sizes"], case["none"]["rms_error"]
    ratio = errors[sizes.index(16)] / errors[sizes.index(64)]
    measured = IDENTITY_CHOICES[0] if ratio < 1.5 else IDENTITY_CHOICES[1] if ratio < 3 else IDENTITY_CHOICES[2]
    scaled = [e * n ** 0.5 for e, n in zip(errors, sizes)]
    print(f"Problem {case['problem_id']}: the warm start gives the right first digit probability "
          f"{case['p_right']:.2f}; the exact gradient's norm is {case['exact_norm']:.3f}.")
    print("N: " + ", ".join(f"{n}: error {e:.4f}" for n, e in zip(sizes, errors))
          + f"; error x sqrt(N) stays between {min(scaled):.3f} and {max(scaled):.3f}.")
    print(f"Bias (the mean of {identity['trials']:,} estimates minus the exact gradient) at N = {sizes[-1]}: "
          f"{case['none']['bias'][-1]:.5f}.")
    return check_prediction(prediction, measured, **EXPECTED["reveal_identity"], why=(
        f"each estimate averages N independent terms r(a)(onehot(a) - pi) whose mean is the exact gradient, so "
        f"its error is their spread over sqrt(N): 4 times the samples, half the error (measured ratio {ratio:.2f})."))


def reveal_baseline(prediction, preset: str = "tiny") -> dict:
    """Chapter 3: which advantage gives the cleanest gradient at the warm start?"""
    require_prediction(prediction, **EXPECTED["reveal_baseline"])  # refused before anything is shown
    study = ablations.gradient_study_results(preset)
    noise = study["noise"]
    schemes = noise["schemes"]
    best = max(schemes, key=lambda s: schemes[s]["snr_corrected"])
    print(f"{noise['batches']} batches of {noise['P']} prompts x G = {noise['G']} from the warm start "
          f"({noise['zero_signal']:.0%} of their groups had no signal); reference: "
          f"{noise['reference_batches']} other batches.  Signal-to-noise corrected for the plug-in's bias "
          f"(+1/{noise['batches']} = {1 / noise['batches']:.4f}), with its jackknife 95% interval over "
          f"{schemes[best]['jackknife_chunks']} chunks of batches; against leave-one-out, paired on the same batches:")
    for s, v in schemes.items():
        low, high = v["snr_interval"]
        against = v.get("snr_minus_leave_one_out")
        paired_text = ("" if against is None else f"   minus leave-one-out {against['difference']:+.4f} "
                       f"[{against['interval'][0]:+.4f}, {against['interval'][1]:+.4f}]")
        print(f"  {ablations.SCHEME_WORDS[s]:<14} {v['snr_corrected']:.4f} [{low:.4f}, {high:.4f}]   "
              f"(plug-in {v['snr']:.4f})   cosine with the reference {v['cosine']:.2f}{paired_text}")
    cases = study["identity"]["cases"]
    sure, unsure = cases[0], cases[-1]
    at = sure["sizes"].index(16)
    trained = ablations.paired_rows(BASELINE_RUNS, ablations.PARTNER, preset)
    partner = ablations.summary(ablations.load(preset, (ablations.PARTNER,))[ablations.PARTNER])
    print("Trained from the warm start at the ablation budget, paired with GRPO on the test (points, p):")
    print(f"  {'GRPO (mean and std)':<24} {partner['test_per_draw']:6.1%}   {'':>18}   KL end {partner['kl_end']:.4f}"
          f"   entropy end {partner['entropy_end']:.3f}")
    for r in trained:
        p = ("<=" if r["p_is_bound"] else "") + f"{r['p']:.2g}"
        print(f"  {BASELINE_RUNS[r['name']]:<24} {r['test_per_draw']:6.1%}   {100 * r['difference']:+6.1f} (p {p:>6})   "
              f"KL end {r['kl_end']:.4f}   entropy end {r['entropy_end']:.3f}")
    separable = [BASELINE_RUNS[r["name"]] for r in trained if r["p"] < paired.ALPHA]
    largest = max(abs(100 * r["difference"]) for r in trained)
    spread = 100 * ablations.seed_spread("grpo", preset)["spread"]
    return check_prediction(prediction, ablations.SCHEME_WORDS[best], **EXPECTED["reveal_baseline"], why=(
        f"a baseline only helps where it makes the terms smaller.  A wrong answer's tokens were sampled at low "
        f"probability, so their gradients are large; a baseline pushes every wrong answer down with them, the raw "
        f"0/1 reward leaves them out.  The one-token game shows both sides at N = 16: where the warm start is sure "
        f"(p = {sure['p_right']:.2f}) the raw reward's error is {sure['none']['rms_error'][at]:.4f} against "
        f"{sure['leave_one_out']['rms_error'][at]:.4f} with leave-one-out; where it is unsure (p = "
        f"{unsure['p_right']:.2f}), {unsure['none']['rms_error'][at]:.4f} against "
        f"{unsure['leave_one_out']['rms_error'][at]:.4f}.  {_snr_lead(schemes, best, noise['batches'])}  "
        f"What GRPO's baseline buys is a loss whose winners and losers balance, not a quieter gradient at this start.  "
        f"In training, "
        + (f"{' and '.join(separable)} separated from GRPO." if separable else
           f"no advantage separated from GRPO (smallest p = {min(r['p'] for r in trained):.2g}); "
           + (f"the largest difference, {largest:.1f} points, is less than the {spread:.2f} points between GRPO's "
              f"own three training seeds: at this budget the choice of baseline moves success less than a seed does."
              if largest < spread else
              f"the largest difference is {largest:.1f} points, GRPO's own three training seeds span {spread:.2f}."))))


def _snr_lead(schemes: dict, best: str, batches: int) -> str:
    """The highest signal-to-noise against leave-one-out's, paired on the same batches, in words."""
    words = ablations.SCHEME_WORDS
    mean_equal = abs(schemes["mean"]["snr_corrected"] - schemes["leave_one_out"]["snr_corrected"]) < 1e-6
    same = ("The group mean's ratio equals leave-one-out's exactly: its advantages are (G-1)/G times theirs, and a "
            "scale cancels in the ratio.  " if mean_equal else "")
    if best == "leave_one_out":
        return same + "Leave-one-out's estimate is the highest."
    lead = schemes[best]["snr_minus_leave_one_out"]
    low, high = lead["interval"]
    return same + (f"The {words[best]}'s lead over leave-one-out, {lead['difference']:+.4f} [{low:+.4f}, {high:+.4f}] "
                   f"paired on the same {batches} batches, "
                   + ("excludes zero: it is separated." if low > 0 else
                      "includes zero: at this many batches it is a lean, not a separation."))


BASELINE_RUNS = {"mean_only": "group mean (no std)", "rloo": "leave-one-out (RLOO)",
                 "no_baseline": "raw reward (REINFORCE)"}


CLIP_CHOICES = ("better", "worse", "not separable")


def _call(comparison: dict, alpha: float = paired.ALPHA) -> str:
    if comparison["p_permutation"] >= alpha:
        return CLIP_CHOICES[2]
    return CLIP_CHOICES[0] if comparison["mean_difference"] > 0 else CLIP_CHOICES[1]


def reveal_clip(prediction, preset: str = "tiny") -> dict:
    """Chapter 4: with 16 updates per batch at 3e-4, what does widening the clip to 0.99 do on the test?"""
    require_prediction(prediction, **EXPECTED["reveal_clip"])  # refused before anything is shown
    runs = ablations.load(preset, ("updates_4", "updates_4_clip_0p99", "updates_16", "updates_16_clip_0p99",
                         "updates_16_rate_3e-4", "updates_16_clip_0p99_rate_3e-4"))
    for clip, wide in (("updates_4", "updates_4_clip_0p99"), ("updates_16", "updates_16_clip_0p99"),
                       ("updates_16_rate_3e-4", "updates_16_clip_0p99_rate_3e-4")):
        a, b = ablations.summary(runs[clip]), ablations.summary(runs[wide])
        c = ablations.compare(runs[clip], runs[wide], names=("clip 0.2", "clip 0.99"))["test_sample"]
        print(f"{runs[clip].updates_per_iteration} updates per batch at {ablations.format_rate(runs[clip].lr)}: "
              f"tokens clipped at the end {a['clip_end']:.1%} (clip 0.2) and {b['clip_end']:.1%} (0.99); "
              f"KL at the end {a['kl_end']:.4f} and {b['kl_end']:.4f}; test per draw {a['test_per_draw']:.1%} and "
              f"{b['test_per_draw']:.1%} (paired p = {c['p_permutation']:.2g})")
    fast, fast_wide = runs["updates_16_rate_3e-4"], runs["updates_16_clip_0p99_rate_3e-4"]
    c = ablations.compare(fast, fast_wide, names=("clip 0.2", "clip 0.99"))["test_sample"]
    against_start = ablations.compare(ablations.warm_start_evaluation(preset), fast,
                                      names=("warm start", "16 updates, clip 0.2"))
    print(f"Against the warm start, 16 updates at 3e-4 with the clip: {against_start['test_sample']['verdict']}.")
    s, w = ablations.summary(fast), ablations.summary(fast_wide)
    return check_prediction(prediction, _call(c), **EXPECTED["reveal_clip"], why=(
        f"each update on the same batch moves the policy further from the one that sampled it.  With the clip, "
        f"{s['clip_end']:.1%} of the tokens ended in the clipped region (the ratio outside "
        f"[{1 - fast.clip_eps:g}, {1 + fast.clip_eps:g}] on the side "
        f"their advantage pushes) and lost their gradient; at 0.99 only {w['clip_end']:.1%} did, and the KL ended "
        f"{w['kl_end'] / s['kl_end']:.1f} times higher.  Paired on the test, widening the clip: {c['verdict']}."))


def reveal_leash(prediction, preset: str = "tiny") -> dict:
    """Chapter 5: the smallest KL coefficient that halves the end-of-run KL of the run without a leash."""
    require_prediction(prediction, **EXPECTED["reveal_leash"])  # refused before anything is shown
    runs = ablations.load(preset, ("beta_0", ablations.PARTNER, "beta_0p2", "beta_1", "beta_5"))
    betas = [(name, runs[name].kl_coef) for name in ("beta_0", ablations.PARTNER, "beta_0p2", "beta_1", "beta_5")]
    free = ablations.summary(runs["beta_0"])["kl_end"]
    measured, protocol_share, separable = None, None, []
    for name, beta in betas:
        s = ablations.summary(runs[name])
        c = (ablations.compare(runs["beta_0"], runs[name], names=("no leash", f"beta {beta:g}"))["test_sample"]
             if beta else None)
        print(f"beta {beta:<5g} KL at the end {s['kl_end']:.4f} ({s['kl_end'] / free:.0%} of no leash's), test per "
              f"draw {s['test_per_draw']:.1%}" + (f"; against no leash: p = {c['p_permutation']:.2g}" if c else ""))
        if measured is None and beta > 0 and s["kl_end"] <= free / 2:
            measured = beta
        if name == ablations.PARTNER:
            protocol_share = s["kl_end"] / free
        if c and c["p_permutation"] < paired.ALPHA:
            separable.append(f"beta {beta:g} ({'ahead' if c['mean_difference'] > 0 else 'behind'}, "
                             f"p = {c['p_permutation']:.2g})")
    tested = ("on the test, " + ", ".join(separable) + " differs from no leash at p < 0.05"
              if separable else "on the test, no beta differs from no leash at p < 0.05")
    # the highest point of the figure, against the protocol's beta, paired (its axis spans a few points)
    top_name, top_beta = max(betas, key=lambda nb: ablations.summary(runs[nb[0]])["test_per_draw"])
    top = (ablations.compare(runs[ablations.PARTNER], runs[top_name])["test_sample"]
           if top_name != ablations.PARTNER else None)
    highest = ("the highest point of Figure 5.3 is the protocol's beta itself" if top is None else
               f"the highest point of Figure 5.3, beta {top_beta:g}, against the protocol's beta: "
               f"{100 * top['mean_difference']:+.1f} points, p = {top['p_permutation']:.2g} ("
               + ("separable" if top["p_permutation"] < paired.ALPHA else "not separable: its intervals say no more")
               + ")")
    return check_prediction(prediction, measured, **EXPECTED["reveal_leash"], why=(
        f"the penalty pulls with beta times the KL's gradient.  At the protocol's beta the run ends with "
        f"{protocol_share:.0%} of the free run's KL: at this budget the leash does not bind; the KL halves only "
        f"once beta reaches {measured:g}.  On success: {tested}; {highest}."))


def reveal_seeds(prediction, preset: str = "tiny") -> dict:
    """Chapter 6: three GRPO runs that differ only in their training seed: the spread of their test success."""
    require_prediction(prediction, **EXPECTED["reveal_seeds"])  # refused before anything is shown
    spreads = {m: ablations.seed_spread(m, preset) for m in ablations.SEEDS}
    for m, s in spreads.items():
        # counts: 800 draws make steps of 0.125 points, which two decimals of a percentage round unevenly
        right = s["right"]
        print(f"{m.upper():<5} test draws right by seed: " + ", ".join(f"{k}" for k in right) + f" of {s['draws']}; "
              f"spread {max(right) - min(right)} draws = {100 * s['spread']:.3g} points")
    g = spreads["grpo"]
    return check_prediction(prediction, round(100 * g["spread"], 2), tolerance=1.0, **EXPECTED["reveal_seeds"], why=(
        f"each seed draws other prompts in another order and samples other rollouts: the same method lands "
        f"{100 * g['spread']:.2f} points apart.  An ablation's effect smaller than that is not told apart from a "
        "lucky seed by one run of each."))


def reveal_separable(prediction, preset: str = "tiny") -> dict:
    """Chapter 7: of the three pairs of GRPO seeds, how many are separable at p < 0.05 on the test?"""
    require_prediction(prediction, **EXPECTED["reveal_separable"])  # refused before anything is shown
    from itertools import combinations

    runs = ablations.load(preset, ablations.SEEDS["grpo"])
    count = 0
    for a, b in combinations(ablations.SEEDS["grpo"], 2):
        c = ablations.compare(runs[a], runs[b], names=(a, b))["test_sample"]
        count += c["p_permutation"] < paired.ALPHA
        print(f"{a} against {b}: {c['verdict']}")
    start = ablations.warm_start_evaluation(preset)
    beat = []
    for name in ablations.SEEDS["grpo"]:
        c = ablations.compare(start, runs[name], names=("warm start", name))["test_sample"]
        print(f"{name} against the warm start: {100 * c['mean_difference']:+.1f} points, p = {c['p_permutation']:.2g}")
        beat.append(c["p_permutation"] < paired.ALPHA and c["mean_difference"] > 0)
    return check_prediction(prediction, count, **EXPECTED["reveal_separable"], why=(
        f"{count} of 3 pairs of one method differ at p < 0.05, and {sum(beat)} of the 3 seeds beat the warm start "
        "at p < 0.05.  The paired test covers the noise of sampling and of evaluation on these 200 problems, not "
        "the noise of training: a method's effect is established by several seeds, not by one run's p-value."))


def reveal_split(prediction, preset: str = "tiny") -> dict:
    """Chapter 8: at 64 prompts x G = 2, the share of groups with no signal (rewards all equal)."""
    require_prediction(prediction, **EXPECTED["reveal_split"])  # refused before anything is shown
    runs = ablations.load(preset, ("split_64x2", "split_32x4", ablations.PARTNER, "split_8x16"))
    partner = runs[ablations.PARTNER]
    across = f"{partner.prompts_per_iteration} x {partner.G}"
    separable = []
    for name, run in runs.items():
        G = run.G
        s = ablations.summary(run)
        line = (f"{runs[name].prompts_per_iteration:>2} prompts x G = {G:<2}: no signal in {s['zero_signal_all']:.0%} "
                f"of the groups, test per draw {s['test_per_draw']:.1%}")
        if name != ablations.PARTNER:
            c = ablations.compare(runs[ablations.PARTNER], runs[name])["test_sample"]
            line += f" (against {across}: p = {c['p_permutation']:.2g})"
            if c["p_permutation"] < paired.ALPHA:
                separable.append(f"{runs[name].prompts_per_iteration} x {G} "
                                 f"({'ahead' if c['mean_difference'] > 0 else 'behind'}, p = {c['p_permutation']:.2g})")
        print(line)
    measured = ablations.summary(runs["split_64x2"])["zero_signal_all"]
    rewards = [h["reward"] for h in runs["split_64x2"].history()]
    p_mean = sum(rewards) / len(rewards)
    uniform = p_mean ** 2 + (1 - p_mean) ** 2
    tested = (f"; on the test only {', '.join(separable)} is separable from {across}" if separable
              else f"; on the test no split is separable from {across}")
    return check_prediction(prediction, round(measured, 2), tolerance=0.05, **EXPECTED["reveal_split"], why=(
        f"a group of two has no signal whenever both answers agree: p^2 + (1 - p)^2, at least 0.5 whatever p.  At "
        f"the run's mean success p = {p_mean:.2f} that is {uniform:.2f}; measured {measured:.2f}, "
        + ("higher, because its prompts are solved at different rates (an easy prompt's pair agrees more often)"
           if measured > uniform else "not above it") + tested + "."))


RARE_ZERO_CHOICES = ("stays below 1%", "rises, but stays under 20%", "reaches 20% or more")


def rare_zero_outcome(think_rate: float) -> str:
    return RARE_ZERO_CHOICES[0] if think_rate < 0.01 else RARE_ZERO_CHOICES[1] if think_rate < 0.2 else RARE_ZERO_CHOICES[2]


def reveal_rare_zero(prediction, preset: str = "tiny") -> dict:
    """Chapter 11: GRPO from the base whose second phase never showed working: does the think rate rise?"""
    require_prediction(prediction, **EXPECTED["reveal_rare_zero"])  # refused before anything is shown
    ba = reasoning_report.before_after("from_rare_0", preset)
    before, after = ba["before"]["think_rate"], ba["after"]["think_rate"]
    history = reasoning_report.run_history("from_rare_0", preset)
    first = next((line["iteration"] for line in history if line["think_rate"] > 0), None)
    print(f"The base rare_0 thinks in {before:.1%} of its {ba['before']['responses']} test answers; after "
          f"{len(history)} GRPO iterations, {after:.1%}.  In training, the first iteration with any response that "
          f"thinks: {first if first is not None else 'none'}.")
    return check_prediction(prediction, rare_zero_outcome(after), **EXPECTED["reveal_rare_zero"], why=(
        "GRPO can only raise the probability of what it samples.  A behaviour the base never shows gives no "
        "group a thinking response to reward, so nothing pushes it up; one the base shows now and then is "
        "rewarded every time it wins its group.  Whether rare_0 still shows working at all is what its "
        "first phase left behind: it learned the skill, then saw none of it for "
        f"{RunFolder(thinking_base.default_run_dir(preset, 'rare_0')).manifest()['steps']} updates."))



WHERE_RL_WORKS_CHOICES = ("better", "worse", "not separable")
WHERE_RL_WORKS = {
    "advantage": ("worked_mean_only", "think", "without the std (A = r - mean)"),
    "reuse and clip": ("worked_updates_2_clip_0p99", "accuracy", "without the clip (0.99: it never binds)"),
    "KL leash": ("worked_beta_5", "think", "with beta 5"),
    "group size": ("worked_split_64x2", "think", "at G = 2 (64 chains, the same responses per iteration)"),
}
"""each chapter's question in chapter 11's regime (family: (run, "think" or "accuracy", the change in words)):
does the run end better, worse or not separable from the reference, beyond its three training seeds?"""
_MEASURE = {"think": ("the share of test answers that work it out", "think_rate"),
            "accuracy": ("the share of test answers right", "accuracy")}  # what: (in words, the row's key)


def where_rl_works_outcome(row: dict, what: str) -> str:
    """"better" / "worse" where the run differs from every seed of the reference in one direction (Holm p below
    reasoning_sweep.BEYOND_SEEDS_ALPHA each), else "not separable"."""
    if not row[f"{what}_beyond_seeds"]:
        return WHERE_RL_WORKS_CHOICES[2]
    return WHERE_RL_WORKS_CHOICES[0] if row["against"][reasoning_sweep.PARTNER][f"{what}_difference"] > 0 else WHERE_RL_WORKS_CHOICES[1]


def _where_rl_works_why(family: str, row: dict, result: dict, preset: str) -> str:
    """Why the run came out as it did, in numbers from the files (one sentence per family)."""
    partner = result["partner"]
    if family == "advantage":
        one = reasoning_sweep.one_winner_advantages(8, preset=preset)
        grpo, mean_only = one[reasoning_sweep.PARTNER][0], one[row["name"]][0]
        schemes = "; ".join(f"{reasoning_sweep.CHANGES.get(n, 'GRPO')} {w:+.2f} and {lose:+.2f}" for n, (w, lose) in one.items())
        return (f"where success is rare a group's one winner is what moves the policy.  In a group of 8 with one "
                f"winner GRPO gives it {grpo:+.2f} (the std sqrt(p(1 - p)) is small when p = 1/8) and the mean alone "
                f"{mean_only:+.2f}, {grpo / mean_only:.1f} times less (the winner's and each loser's advantage, scheme "
                f"by scheme: {schemes}).  But the step is AdamW's, which divides each weight's step by the running "
                f"size of that weight's own gradients, so a factor common to the whole batch cancels: the std changes "
                f"how the groups are weighted against each other, not how far the policy steps")
    if family == "reuse and clip":
        clipped = [h["clip_ratio/region_mean"] for h in reasoning_sweep.histories((reasoning_sweep.PARTNER,), preset)[
            reasoning_sweep.PARTNER]]
        eps = get_preset(preset).clip_eps
        return (f"the clip acts only on a batch's second update, on the tokens whose ratio has already left "
                f"[{1 - eps:g}, {1 + eps:g}] in the direction their advantage pushes: in the reference at most {max(clipped):.1%} of "
                f"the tokens in any iteration (mean {sum(clipped) / len(clipped):.2%}).  Those are the tokens that moved "
                f"most; without the clip they keep their gradient, and the run ends further from its base (exact KL "
                f"at the end {row['kl_end']:.3f} against the reference's {partner['kl_end']:.3f})" + _reuse(preset, partner["accuracy"]))
    if family == "KL leash":
        return (f"to work problems out the policy must move far from its base: the reference ends at an exact KL of "
                f"{partner['kl_end']:.3f} per token; beta 5 holds its run to {row['kl_end']:.2g}, and it works it out "
                f"in {row['think_rate']:.1%} of test answers (the reference {partner['think_rate']:.1%})")
    if family == "group size":
        groups = {s["name"]: s["config_overrides"].get("prompts_per_iteration", ReasoningConfig.prompts_per_iteration)
                  for s in reasoning_sweep.specs(preset) if s["name"] in (row["name"], reasoning_sweep.PARTNER)}
        mine, theirs = (groups[n] for n in (row["name"], reasoning_sweep.PARTNER))
        return (f"a group has signal only when its rewards differ.  At G = 2 a smaller share of the groups held "
                f"signal, {row['signal_share_mean']:.0%} on average against {partner['signal_share_mean']:.0%} at "
                f"G = 8, but there were {mine} groups an iteration instead of {theirs}: "
                f"{row['signal_share_mean'] * mine:.1f} groups with signal an iteration against "
                f"{partner['signal_share_mean'] * theirs:.1f}.  The same budget of responses holds the same rare "
                f"winners, whichever way it is split")
    raise ValueError(f"family {family!r}: expected one of {list(WHERE_RL_WORKS)}")


def _reuse(preset: str, reference_accuracy: float) -> str:
    """Where the clip is meant to act, many updates on one batch: the 16-update runs with and without it, paired over
    the test chains (empty while either is not trained)."""
    folders = reasoning_sweep.finished_folders(preset)
    pair = ("worked_updates_16", "worked_updates_16_clip_0p99")
    if not all(name in folders for name in pair):
        return ""
    clip, free = (reasoning_sweep.profile_rows(folders[name]) for name in pair)
    t = reasoning_report.paired_over_chains(clip, free)
    return (f".  With 16 updates a batch, where reuse is heavy, both runs end behind the reference's "
            f"{reference_accuracy:.1%} right; the one without the clip is right in {t['b_rate']:.1%} of test answers "
            f"against {t['a_rate']:.1%} with it "
            f"({100 * t['mean_difference']:+.1f} points, paired over the chains, p = {t['p_permutation']:.2g})")


def reveal_where_rl_works(prediction, family: str, preset: str = "tiny") -> dict | None:
    """Chapters 3, 4, 5, 8: the chapter's piece changed in chapter 11's regime (GRPO from rare_2 on worked answers):
    does the run end better, worse or not separable from the reference, beyond its three training seeds?  Prints
    both regimes (`reasoning_sweep.both_regimes`) first.  Returns the checker's dict plus "rows" ({run: its row of
    `reasoning_sweep.table`} for the reference and the family) and "base" (rare_2's think rate and share right), or None (and a line saying so) while the run is not trained."""
    require_prediction(prediction, **EXPECTED["reveal_where_rl_works"])  # refused before anything is shown
    if family not in WHERE_RL_WORKS:
        raise ValueError(f"family {family!r}: expected one of {list(WHERE_RL_WORKS)}")
    name, what, change = WHERE_RL_WORKS[family]
    result = reasoning_sweep.table(preset, families=(family,))
    print(reasoning_sweep.both_regimes(family, result, preset))
    row = next((r for r in result["families"][family] if r["name"] == name), None)
    if row is None:
        print(f"{name} is not trained yet: `python -m labkit sweep {display_path(reasoning_sweep.SWEEP_FILE)}` "
              "trains it; the question waits for it.")
        return None
    measured = where_rl_works_outcome(row, what)
    d = 100 * row["against"][reasoning_sweep.PARTNER][f"{what}_difference"]
    words, key = _MEASURE[what]
    checked = check_prediction(prediction, measured, **EXPECTED["reveal_where_rl_works"], why=(
        f"{_where_rl_works_why(family, row, result, preset)}.  {words[0].upper()}{words[1:]} "
        f"{change}: {row[key]:.1%}, {d:+.1f} points against the reference "
        f"(training seed 1), "
        + ("beyond all three of its seeds" if measured != WHERE_RL_WORKS_CHOICES[2] else
           f"not beyond its seeds (a change counts only where it holds against all three, each at Holm p < "
           f"{reasoning_sweep.BEYOND_SEEDS_ALPHA}, in one direction)") + "."))
    rows = {reasoning_sweep.PARTNER: result["partner"], **{r["name"]: r for r in result["families"][family]}}
    return {**checked, "rows": rows, "base": result["base"]}  # rows, base: for the chapter's own checks of its prose


# What each reveal accepts as a prediction: checked before anything is measured or shown, and by the
# prediction cell itself (`require_prediction_for`), so that a mistyped or empty prediction is refused
# before the figures that answer it are drawn.
EXPECTED = {
    "reveal_identity": dict(choices=IDENTITY_CHOICES),
    "reveal_baseline": dict(choices=tuple(ablations.SCHEME_WORDS.values())),
    "reveal_clip": dict(choices=CLIP_CHOICES),
    "reveal_leash": dict(choices=(0.02, 0.2, 1.0, 5.0)),
    "reveal_seeds": dict(low=0.0, high=100.0),
    "reveal_separable": dict(choices=(0, 1, 2, 3)),
    "reveal_split": dict(share=True, low=0.0, high=1.0),
    "reveal_rare_zero": dict(choices=RARE_ZERO_CHOICES),
    "reveal_where_rl_works": dict(choices=WHERE_RL_WORKS_CHOICES),
}


def require_prediction_for(prediction, reveal) -> None:
    """The prediction cell's check: refuse an empty or mistyped `prediction` for `reveal` (a reveal_* function)."""
    require_prediction(prediction, **EXPECTED[reveal.__name__])
