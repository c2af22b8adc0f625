"""labkit.studies.reasoning_sweep on hand-made histories and results, and on the sweep file's plan."""

import pytest

from labkit.studies import reasoning_sweep


def test_group_signal_reads_the_history_first_worked_iteration_and_share_with_signal():
    line = lambda i, think, silent: {"iteration": i, "think_rate": think,  # noqa: E731
                                     "optimised/frac_reward_zero_std": silent}
    found = reasoning_sweep.group_signal([line(1, 0.0, 1.0), line(2, 0.125, 0.75), line(3, 0.5, 0.0)])
    assert found == {"first_worked_iteration": 2, "signal_share": [0.0, 0.25, 1.0]}
    assert reasoning_sweep.group_signal([line(1, 0.0, 1.0)])["first_worked_iteration"] is None


def test_every_run_of_the_sweep_file_is_in_one_family_and_the_partner_in_none():
    planned = [s["name"] for s in reasoning_sweep.specs()]
    in_families = [n for names in reasoning_sweep.FAMILIES.values() for n in names]
    in_families += [n for names in reasoning_sweep.BASE_SEEDS.values() for n in names]
    assert sorted(in_families + [reasoning_sweep.PARTNER]) == sorted(planned)
    assert set(reasoning_sweep.CHANGES) == set(in_families)
    assert len(set(in_families)) == len(in_families)


@pytest.mark.parametrize("G", [2, 4, 8, 16])
def test_one_winners_advantage_by_each_scheme_is_the_hand_worked_one(G):
    found = reasoning_sweep.one_winner_advantages(G)
    s = (G - 1) ** 0.5  # GRPO: (1 - 1/G) / sqrt((1/G)(1 - 1/G)) = sqrt(G - 1); a loser -1/sqrt(G - 1)
    expected = {"worked_grpo": (s, -1 / s), "worked_mean_only": ((G - 1) / G, -1 / G),
                "worked_no_baseline": (1.0, 0.0), "worked_rloo": (1.0, -1 / (G - 1)),
                "worked_positive_only": (s, 0.0), "worked_negative_only": (0.0, -1 / s)}
    assert found.keys() == expected.keys()
    for name, (winner, loser) in expected.items():
        assert found[name] == pytest.approx((winner, loser), rel=1e-7, abs=1e-12), name  # eps 1e-8 in the std


def test_the_family_figure_draws_the_seeds_as_a_band_and_one_line_per_run():
    import matplotlib

    matplotlib.use("Agg")
    from labkit.book import plots_reasoning

    def history(values):
        return [{"iteration": i + 1, "think_rate": v, "accuracy": v / 2} for i, v in enumerate(values)]

    seeds = {"a": history([0.0, 0.5, 0.9]), "b": history([0.1, 0.3, 1.0])}
    fig = plots_reasoning.plot_family_against_seeds(seeds, {"x": history([0, 0, 0]), "y": history([1, 1, 1])}, "t")
    ax = fig.axes[0]
    band = ax.collections[0].get_paths()[0].vertices
    assert {tuple(v) for v in band} >= {(1.0, 0.0), (2.0, 0.3), (3.0, 0.9), (1.0, 0.1), (2.0, 0.5), (3.0, 1.0)}
    assert [line.get_label() for line in ax.get_lines()] == ["x", "y"]


def _row(name, think, right, d_right, d_think, p=0.001, entropy=(0.5, 0.05)):
    """A row of reasoning_sweep.table's result, the same difference against each of the three seeds."""
    against = {seed: {"accuracy_difference": d_right, "accuracy_p_holm": p, "think_difference": d_think,
                      "think_p_holm": p} for seed in reasoning_sweep.SEEDS}
    return {"name": name, "think_rate": think, "accuracy": right, "against": against,
            "accuracy_beyond_seeds": p < reasoning_sweep.BEYOND_SEEDS_ALPHA and d_right != 0,
            "think_beyond_seeds": p < reasoning_sweep.BEYOND_SEEDS_ALPHA and d_think != 0,
            "entropy_start": entropy[0], "entropy_end": entropy[1]}


def test_the_findings_name_what_changed_beyond_the_seeds_and_what_did_not():
    result = {"partner": {"think_rate": 0.9, "entropy_start": 0.52, "entropy_end": 0.05},
              "families": {"seeds": [], "advantage": [_row("worked_no_baseline", 0.645, 0.452, -0.133, -0.265),
                                                      _row("worked_rloo", 0.93, 0.61, 0.029, 0.021, p=0.08)],
                           "KL leash": [_row("worked_beta_1", 0.009, 0.016, -0.569, -0.901, entropy=(0.52, 0.51))],
                           "controls": []}}
    advantage, leash = reasoning_sweep.findings(result)
    assert advantage == ("Advantage. Beyond the seeds: No baseline (A = r): right 45.2%, -13.3 points (-13.3 to -13.3 "
                         "against the seeds, Holm p <= 0.0010 each); works it out 64.5%, -26.5 points (-26.5 to -26.5 "
                         "against the seeds, Holm p <= 0.0010 each). Within the seeds: leave-one-out baseline (RLOO).")
    assert leash.startswith("KL leash. Beyond the seeds: Beta 1: right 1.6%, -56.9 points")
    assert reasoning_sweep.entropy_and_selection(result) == (
        "Token entropy at the first iteration: 0.50 to 0.52; at the last, 0.05 in the 3 runs that work it "
        "out in more than 50% of their test answers, and 0.51 in the 1 that do not (beta 1).")


def test_right_when_working_is_paired_over_the_chains_both_worked_out():
    from labkit.studies import reasoning_report

    row = lambda k, i, d, thinks, reward: {"k": k, "index": i, "draw": d, "thinks": thinks, "reward": reward}  # noqa: E731
    before = [row(1, 0, 0, True, 0), row(1, 0, 1, False, 1), row(1, 1, 0, True, 1), row(2, 0, 0, False, 0)]
    after = [row(1, 0, 0, True, 1), row(1, 0, 1, True, 1), row(1, 1, 0, True, 1), row(2, 0, 0, True, 0)]
    t = reasoning_report.thinking_accuracy(before, after)
    # pooled: 1 of 2 working answers right before, 3 of 4 after; chains (1,0) and (1,1) worked out by both
    assert (t["before"], t["after"], t["thinking_before"], t["thinking_after"], t["chains"]) == (0.5, 0.75, 2, 4, 2)
    assert t["mean_difference"] == 0.5 and t["p_permutation"] == 1.0  # one non-zero difference: no test


def test_a_lonely_worked_answer_in_an_all_wrong_group_is_found_with_its_mean_only_advantage():
    from labkit.studies import reasoning_report

    rewards = [-0.025] * 3 + [-0.2]
    group = [{"iteration": 3, "reward": 0, "thinks": i == 3, "optimised_reward": r, "advantage": a}
             for i, (r, a) in enumerate(zip(rewards, [0.577, 0.577, 0.577, -1.732]))]
    right = [dict(r, reward=1 if i == 0 else 0, thinks=True) for i, r in enumerate(group)]  # has a right answer
    out = reasoning_report.lonely_workers(group + right, 4)
    assert out["groups"] == 1 and out["advantages"] == [-1.732]
    assert out["worst"]["iteration"] == 3 and abs(out["worst"]["mean_only"] - (-0.2 - (-0.275 / 4))) < 1e-12


def test_both_regimes_states_the_protocol_budgets_power_then_the_family_with_its_finding(monkeypatch):
    monkeypatch.setattr(reasoning_sweep, "protocol_power", lambda preset="tiny": [
        {"name": "grpo_16x8", "difference": 0.02375, "p": 0.04, "p_is_bound": False},
        {"name": "grpo_16x8_seed_2", "difference": 0.00625, "p": 0.6, "p_is_bound": False}])
    result = {"base": {"think_rate": 0.006, "accuracy": 0.015}, "seeds": list(reasoning_sweep.SEEDS), "missing": [],
              "partner": {"think_rate": 0.9, "accuracy": 0.585, "kl_end": 0.1, "entropy_end": 0.05,
                          "first_worked_iteration": 1, "signal_share_mean": 0.47},
              "families": {"advantage": [{**_row("worked_no_baseline", 0.645, 0.452, -0.133, -0.265), "kl_end": 0.1,
                                          "first_worked_iteration": 1, "signal_share_mean": 0.475}]}}
    text = reasoning_sweep.both_regimes("advantage", result)
    assert text.startswith("The protocol's regime (chapter 9's ablation budget): full GRPO against the warm start, "
                           "per training seed, +2.4 points (p = 0.04); +0.6 points (p = 0.6)")
    assert "worked_no_baseline" in text and "Advantage. Beyond the seeds: No baseline (A = r)" in text
    with pytest.raises(ValueError, match="family 'seeds'"):
        reasoning_sweep.both_regimes("seeds", result)


def test_the_detail_pages_table_has_a_row_per_finished_run_and_names_the_missing(monkeypatch):
    from labkit.book import results_chapters

    result = {"base": {"think_rate": 0.006, "accuracy": 0.015}, "seeds": list(reasoning_sweep.SEEDS),
              "missing": ["worked_beta_0"],
              "partner": {"think_rate": 0.91, "accuracy": 0.585, "kl_end": 0.117, "entropy_start": 0.52,
                          "entropy_end": 0.048},
              "families": {"advantage": [{**_row("worked_no_baseline", 0.645, 0.452, -0.133, -0.265, p=0.0004),
                                          "kl_end": 0.136, "entropy_end": 0.193}]}}
    monkeypatch.setattr(reasoning_sweep, "table", lambda *a, **k: result)
    lines = results_chapters.reasoning_sweep_section()
    assert "| `worked_grpo` | the reference | 91.0% | 58.5% | | | 0.117 | 0.048 | |" in lines
    assert ("| `worked_no_baseline` | no baseline (A = r) | 64.5% | 45.2% | -26.5 (< 0.001) | -13.3 (< 0.001) | 0.136 "
            "| 0.193 | worked, right |") in lines
    assert lines[-1] == "Not trained yet: `worked_beta_0`."
    assert lines[-3] == ("Token entropy at the first iteration: 0.50 to 0.52; at the last, 0.05 to 0.19 in the 2 runs "
                         "that work it out in more than 50% of their test answers.")


def test_the_bases_seeds_start_with_chapter_11s_run_and_list_the_sweeps_missing_ones():
    found = reasoning_sweep.base_seeds()
    assert list(found) == ["rare_0", "control"]
    for base, entry in found.items():
        seed_1 = entry["runs"][0]
        assert seed_1["name"] == f"from_{base}"
        # chapter 11's finding, read from the committed run: no response of the run ever worked it out
        assert seed_1["peak_think_rate"] == 0.0 and seed_1["first_worked_iteration"] is None
        assert [r["name"] for r in entry["runs"][1:]] + entry["missing"] == list(reasoning_sweep.BASE_SEEDS[base])


def test_chapter_5s_question_where_rl_works_is_answered_from_the_committed_runs(capsys):
    """Chapter 5's reveal in chapter 11's regime: beta 5 against the reference's seeds, from the files.  The
    answer is recounted here from the table (each seed's paired difference and Holm p), not taken from the reveal."""
    from labkit.book.exercises import reveal_where_rl_works

    # the family's own table: Holm corrects within a family, so its rows are the whole table's
    row = next(r for r in reasoning_sweep.table(families=("KL leash",))["families"]["KL leash"]
               if r["name"] == "worked_beta_5")
    tests = row["against"].values()
    expected = ("worse" if all(t["think_difference"] < 0 and t["think_p_holm"] < reasoning_sweep.BEYOND_SEEDS_ALPHA
                               for t in tests) and len(tests) == 3 else "not separable")
    result = reveal_where_rl_works("better", "KL leash")
    out = capsys.readouterr().out
    assert {k: result[k] for k in ("prediction", "measured", "right")} == {"prediction": "better", "measured": expected,
                                                                           "right": False}
    assert result["rows"]["worked_beta_5"] == row
    assert out.startswith("The protocol's regime (chapter 9's ablation budget)") and "-- KL leash" in out
    assert f"beta 5 holds its run to {row['kl_end']:.2g}" in out and f"The runs: {expected}." in out


def test_the_committed_reasoning_sweep_is_complete_and_rewrites_its_results_byte_for_byte(tmp_path):
    """Issue 56: `python -m labkit sweep sweeps/reasoning.json` on a fresh clone trains nothing (every run is
    finished under today's fingerprint) and its scoring phase writes the committed results file, byte for byte."""
    from labkit.studies import sweep

    specs = reasoning_sweep.specs()
    due = [s["name"] for s in specs if not sweep._done(s)]
    assert due == [], f"reasoning sweep runs {due} are not built for this code; `make cache` trains them"
    committed = sweep.sweep_root(reasoning_sweep.SWEEP_FILE, "tiny") / sweep.results_file(reasoning_sweep.SWEEP_FILE)
    sweep.collect_results(specs, tmp_path / committed.name)
    assert (tmp_path / committed.name).read_bytes() == committed.read_bytes()
