"""labkit.studies.crossover: the unbiased pass@k by hand, and a small real count on the committed base rare_2."""

import json
from math import comb

import pytest

from labkit.eval import evaluate
from labkit.studies import crossover, thinking_base
from labkit.lab.runs import RunFolder


def test_pass_at_k_is_the_unbiased_estimator_worked_by_hand():
    # 4 draws, 1 right: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6, pass@4 = 1
    assert evaluate.pass_at_k(4, 1, 1) == 0.25 and evaluate.pass_at_k(4, 1, 2) == 0.5
    assert evaluate.pass_at_k(4, 1, 4) == 1.0 and evaluate.pass_at_k(4, 0, 4) == 0.0
    assert evaluate.pass_at_k(256, 3, 100) == pytest.approx(1 - comb(253, 100) / comb(256, 100), rel=1e-15)
    with pytest.raises(ValueError, match="n=4, c=5, k=1"):
        evaluate.pass_at_k(4, 5, 1)


def test_curves_cross_where_the_base_reaches_the_run():
    ks = crossover.powers_of_two(8)
    assert ks == [1, 2, 4, 8] and crossover.powers_of_two(6) == [1, 2, 4, 6]
    # the run: one chain always right, one never; the base: both chains right once in 8
    run = [{"n": 8, "right": 8}, {"n": 8, "right": 0}]
    base = [{"n": 8, "right": 1}, {"n": 8, "right": 1}]
    a, b = crossover.curve(base, ks), crossover.curve(run, ks)
    assert b == [0.5, 0.5, 0.5, 0.5] and a[0] == 0.125 and a[-1] == 1.0
    assert crossover.crossing(a, b, ks) == 4  # pass@4 of the base: 1 - C(7,4)/C(8,4) = 0.5
    assert crossover.crossing(b, [1.0] * 4, ks) is None


def test_the_run_against_its_base_is_paired_chain_by_chain_with_holm_over_k():
    # three chains of 4 draws; the run is better on each at k = 1, and the base catches up by k = 4
    base = [{"k": 1, "index": i, "n": 4, "right": c} for i, c in enumerate([1, 1, 2])]
    run = [{"k": 1, "index": i, "n": 4, "right": c} for i, c in reversed(list(enumerate([4, 3, 4])))]
    rows = crossover.compare(base, run, [1, 4])
    one, four = rows
    # pass@1 = c / 4 per chain: differences 3/4, 2/4, 2/4
    assert (one["base"], one["run"]) == (pytest.approx(4 / 12), pytest.approx(11 / 12))
    assert one["difference"] == pytest.approx(7 / 12) and one["interval"][0] > 0
    assert one["p"] == 0.25 and one["method"] == "exact"  # 3 positive flips of 8: the two extreme ones of 2^3
    assert four["difference"] == 0.0 and four["p"] == 1.0  # pass@4 = 1 wherever a chain was right once
    assert [r["p_holm"] for r in rows] == [0.5, 1.0]  # Holm: 2 x 0.25, then max(0.5, 1 x 1.0)
    with pytest.raises(ValueError, match="the same chains"):
        crossover.compare(base, run[:2], [1])


def test_a_small_count_on_rare_2_is_kept_checked_and_not_counted_again(tmp_path):
    out = tmp_path / "crossover"
    counted = crossover.run(policies=("rare_2",), draws=3, chains_per_k=1, out=out, progress=False)
    rows = counted["rare_2"]
    assert [(r["k"], r["index"], r["n"]) for r in rows] == [(k, 0, 3) for k in range(1, 9)]
    assert all(0 <= r["right"] <= 3 and 0 <= r["thinks"] <= 3 for r in rows)
    assert RunFolder(out).is_finished() and crossover.read(out=out) == counted
    # rare_2's model is committed: the counts came from the very model, and its folder's test profile
    where = crossover.provenance(crossover.read_files(out=out))["rare_2"]
    assert where["same_model"] and where["same_profile"] and where["model_sha256"] == where["committed_model_sha256"]
    edited = {**crossover.read_files(out=out)["rare_2"], "model_sha256": "0" * 64, "profile_digest": "1" * 64}
    rare_2 = crossover.profile_summary(thinking_base.read_profile("rare_2")["rows"])
    assert where["committed_profile"] == where["counted_profile"] == rare_2
    assert rare_2 == {"think_rate": 10 / 1600, "accuracy": 24 / 1600}  # chapter 11: rare_2 thinks in 0.6%, right in 1.5%
    assert crossover.provenance({"rare_2": edited})["rare_2"] == {
        "model_sha256": "0" * 64, "committed_model_sha256": where["committed_model_sha256"], "same_model": False,
        "same_profile": False, "committed_profile": rare_2, "counted_profile": rare_2}
    assert json.loads((out / "counts-rare_2.json").read_text())["chains"] == rows
    # a finished study is refused without overwrite; the same draws give the same counts
    with pytest.raises(Exception, match="finished"):
        crossover.run(policies=("rare_2",), draws=3, chains_per_k=1, out=out, progress=False)
    again = crossover.run(policies=("rare_2",), draws=3, chains_per_k=1, out=tmp_path / "again", progress=False)
    assert again == counted


def test_bad_settings_are_refused_before_anything_is_sampled(tmp_path):
    with pytest.raises(ValueError, match=r"policies \['rare_3'\]"):
        crossover.run(policies=("rare_3",), out=tmp_path / "a")
    with pytest.raises(ValueError, match="chains per k 26"):
        crossover.run(policies=("rare_2",), chains_per_k=26, out=tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_policy_whose_weights_are_not_here_names_the_command_that_rebuilds_them(tmp_path, monkeypatch):
    from labkit.studies import reasoning

    monkeypatch.setattr(reasoning, "default_run_dir", lambda preset, name: tmp_path / name)
    folder = tmp_path / "from_rare_2"
    folder.mkdir()
    monkeypatch.setattr(RunFolder, "manifest", lambda self: {})  # a finished run whose weights stay local
    with pytest.raises(FileNotFoundError, match=r"`python -m labkit cache fill --steps reasoning --runs from_rare_2`"):
        crossover.model_file("tiny", "from_rare_2")
