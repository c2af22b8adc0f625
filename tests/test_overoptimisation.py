"""Reward over-optimisation (labkit.studies.overoptimisation): best-of-n's exact expectation by hand and by
enumeration, the KL, the proxies' subsets and fits, the sequence KL against float64, and the
committed runs re-checked from their raw records."""

import copy
import itertools
import json
import math
import shutil

import pytest
import torch

from labkit.task import data
from labkit.models import presets
from labkit.studies import overoptimisation as oo, overoptimisation_summary as summary, reward_model
from labkit.lab.runs import REPO_ROOT, ArtifactError, read_json
from labkit.task.verifier import score

ROOT = REPO_ROOT / "runs" / "tiny" / "overoptimisation"
PROBLEM = {"initial": 50, "deliveries": [48, 2], "withdrawals": [25, 10]}  # validation-0000: 65


# --- best-of-n -----------------------------------------------------------------------------------


def test_best_of_n_weights_on_a_hand_worked_case():
    # scores 0.1, 0.5, 0.3; n = 2 of 3: subsets {0,1} -> 1, {0,2} -> 2, {1,2} -> 1
    assert oo.best_of_n_weights([0.1, 0.5, 0.3], 2) == pytest.approx([0.0, 2 / 3, 1 / 3], abs=1e-15)
    assert oo.best_of_n_weights([0.1, 0.5, 0.3], 1) == pytest.approx([1 / 3] * 3, abs=1e-15)
    assert oo.best_of_n_weights([0.1, 0.5, 0.3], 3) == [0.0, 1.0, 0.0]
    truth, proxy = oo.best_of_n([1.0, 0.0, 1.0], [0.1, 0.5, 0.3], 2)
    assert truth == pytest.approx(1 / 3, abs=1e-15) and proxy == pytest.approx(2 / 3 * 0.5 + 1 / 3 * 0.3, abs=1e-15)
    with pytest.raises(ValueError, match="n=4: n must lie in 1..3"):
        oo.best_of_n_weights([0.1, 0.5, 0.3], 4)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_best_of_n_equals_enumerating_every_subset_with_ties(n):
    """Ties rank the later draw higher, as the weights say."""
    scores = [0.3, 0.7, 0.3, 0.1, 0.7, 0.5, 0.2]
    truth = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    picks = [max(subset, key=lambda k: (scores[k], k)) for subset in itertools.combinations(range(7), n)]
    expected = sum(truth[k] for k in picks) / len(picks)
    assert oo.best_of_n(truth, scores, n)[0] == pytest.approx(expected, abs=1e-12)
    assert sum(oo.best_of_n_weights(scores, n)) == pytest.approx(1.0, abs=1e-12)


def test_best_of_n_kl_is_log_n_minus_n_minus_one_over_n():
    assert oo.best_of_n_kl(1) == 0.0
    assert oo.best_of_n_kl(2) == pytest.approx(math.log(2) - 0.5, abs=1e-15)
    # the KL of the maximum of n uniform draws to one uniform draw, integrated numerically
    n, steps = 8, 200_000
    density = [n * ((k + 0.5) / steps) ** (n - 1) for k in range(steps)]
    numeric = sum(f * math.log(f) for f in density) / steps
    assert oo.best_of_n_kl(n) == pytest.approx(numeric, abs=1e-6)


# --- the kinds of fooling, the subsets -----------------------------------------------------------


@pytest.mark.parametrize("text, kind", [
    ('{"final_stock": 65}', None), ('{"final_stock": 64}', "off_by_one"), ('{"final_stock": 66}', "off_by_one"),
    ('{"final_stock": 70}', "wrong_value"), ('{"stock": 65}', "invalid"), ("65", "invalid"),
])
def test_fooled_kind_of_a_verdict(text, kind):
    assert oo.fooled_kind(score(text, "eos", PROBLEM), 65) == kind


def test_the_subsets_are_nested_and_about_their_share():
    ids = [f"train-{k:04d}" for k in range(1000)]
    small, mid = ({i for i in ids if oo.in_subset(i, share)} for share in (0.1, 0.3))
    assert small < mid and all(oo.in_subset(i, 1.0) for i in ids)
    assert 70 <= len(small) <= 130 and 250 <= len(mid) <= 350


def test_an_unknown_proxy_or_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown proxy 'judge_7'"):
        oo.get_proxy("judge_7")
    with pytest.raises(ValueError, match="unknown setting 'nope'"):
        oo.run_all("tiny", only=("nope",))


# --- the sequence KL -----------------------------------------------------------------------------


def test_sequence_kl_matches_a_float64_reference_and_is_zero_to_itself():
    a, b = presets.new_tiny_model(seed=1), presets.new_tiny_model(seed=2)
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14]]
    got = oo.sequence_kl(a, b, prompts, responses, pad_id=0)
    a64, b64 = copy.deepcopy(a).double(), copy.deepcopy(b).double()
    expected = []
    with torch.no_grad():
        for prompt, response in zip(prompts, responses):
            ids = torch.tensor([prompt + response])
            la, lb = a64(ids).logits[0], b64(ids).logits[0]  # (T, V) float64
            total = 0.0
            for t in range(len(response)):  # token t is predicted at the position before it
                pos = len(prompt) + t - 1
                pa, pb = la[pos].log_softmax(-1), lb[pos].log_softmax(-1)
                total += float((pa.exp() * (pa - pb)).sum())
            expected.append(total)
    assert got.tolist() == pytest.approx(expected, abs=2e-5)
    assert oo.sequence_kl(a, a, prompts, responses, pad_id=0).abs().max() < 1e-6


# --- the committed files -------------------------------------------------------------------------


def test_the_full_share_warm_start_proxy_is_the_learned_verifier_itself():
    from safetensors.torch import load_file

    mine, theirs = load_file(str(ROOT / "proxies" / "warm_start_100.safetensors")), \
        load_file(str(REPO_ROOT / "runs" / "tiny" / "reward_model" / "model.safetensors"))
    assert sorted(mine) == sorted(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_the_warm_start_proxies_precision_and_recall_recomputed_from_the_samples():
    proxies = oo.read_proxies()
    rows = reward_model.read_samples()
    X = torch.tensor([[r["features"][f] for f in reward_model.FEATURES] for r in rows], dtype=torch.float64)
    held = [k for k, r in enumerate(rows) if r["held_out"]]
    for name in ("warm_start_10", "warm_start_30", "warm_start_100"):
        verifier = oo.load_proxy(name, judge_model=torch.nn.Linear(1, 1), tokenizer=_Ids())
        p = oo.proxy_probabilities(X, verifier.theta, verifier.mu, verifier.sigma)
        assert not any(abs(float(p[k]) - 0.5) < 1e-9 for k in held)  # no verdict sits on the threshold
        m = reward_model.classification_metrics([int(p[k] >= 0.5) for k in held], [rows[k]["label"] for k in held])
        assert m == proxies[name]["metrics"]["held_out"], name
    assert proxies["warm_start_10"]["train_responses"] < proxies["warm_start_30"]["train_responses"] \
        < proxies["warm_start_100"]["train_responses"] == reward_model.read_manifest()["responses"]["train"]


class _Ids:
    pad_token_id, eos_token_id = 0, 1


def test_every_committed_file_is_checked_against_its_digest(tmp_path, monkeypatch):
    copy = tmp_path / "overoptimisation"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("grpo"))
    monkeypatch.setattr(oo, "root", lambda preset="tiny": copy)
    assert oo.read_proxies() == read_json(ROOT / "proxies.json")
    record = json.loads((copy / "proxies.json").read_text())
    record["base_10"]["metrics"]["held_out"]["precision"] = 0.99
    (copy / "proxies.json").write_text(json.dumps(record))
    with pytest.raises(ArtifactError, match="proxies.json: SHA-256 differs"):
        oo.read_proxies()
    with pytest.raises(FileNotFoundError, match="not a file of the over-optimisation step"):
        oo.read_file("settings/other.json")


def test_best_of_n_rows_are_reverified_and_complete():
    rows = oo.read_best_of_n()
    assert len(rows) == 200 * oo.BEST_OF_N_DRAWS
    labels = {r["id"]: r for r in data.open_records("labels", "validation", "learning")}
    for r in rows:
        v = score(r["text"], r["finish_reason"], labels[r["problem_id"]]["problem"], r["tokenization_valid"])
        assert (v.reward, v.reason, oo.fooled_kind(v, r["target"])) == (r["reward"], r["reason"], r["kind"])
        assert sorted(r["p"]) == sorted(p.name for p in oo.PROXIES)


def test_the_curves_add_up_and_pair_up():
    for setting in oo.SETTINGS:
        record = oo.read_setting(setting.name)
        curves = record["curves"]
        assert [c["iteration"] for c in curves] == list(range(0, setting.iterations + 1, setting.curve_every))
        for c in curves:
            n = c["problems"] * c["draws"]
            assert c["true_success"] == sum(c["true_counts"]) / n and c["proxy_yes"] == sum(c["proxy_counts"]) / n
            assert sum(c["fooled"].values()) <= sum(c["proxy_counts"])
            for e in c["fooled_examples"]:
                assert oo.fooled_kind(score(e["text"], "eos", _label(e["problem_id"])), e["target"]) == e["kind"]
        assert curves[0]["sequence_kl"] == 0.0  # the start is the reference
        assert len(record["training"]) == setting.iterations
        # every run starts from the same warm start, answers the same seeded prompts: the same first curve
        first = oo.read_setting(oo.SETTINGS[0].name)["curves"][0]
        assert curves[0]["true_counts"] == first["true_counts"]


def test_every_checkpoint_answer_is_committed_and_rescores_to_its_counts():
    # an outsider's check: the committed texts and the committed labels alone give the true counts
    labels = {r["id"]: r for r in data.open_records("labels", "validation", "learning")}
    for setting in oo.SETTINGS:
        for c in oo.read_setting(setting.name)["curves"]:
            D = c["draws"]
            assert len(c["problem_ids"]) == c["problems"] and len(c["texts"]) == len(c["finish_reasons"]) == c["problems"] * D
            undecodable = set(c["undecodable"])
            counts = [sum(int(score(c["texts"][k * D + d], c["finish_reasons"][k * D + d], labels[pid]["problem"],
                                    k * D + d not in undecodable).reward) for d in range(D))
                      for k, pid in enumerate(c["problem_ids"])]
            assert counts == c["true_counts"], (setting.name, c["iteration"])


def _label(problem_id):
    return next(r["problem"] for r in data.open_records("labels", "validation", "learning") if r["id"] == problem_id)


def test_the_committed_finding_a_proxy_rose_while_the_truth_fell():
    """The chapter's claim: against the base-judged proxy, GRPO's true reward falls and its proxy
    reward rises, each beyond its 95% interval; against the warm-start-judged proxy it does not."""
    base = summary.setting_summary(oo.read_setting("base_100-kl"))
    assert base["over_optimised"]
    assert base["true_change"]["interval"][1] < 0 < base["proxy_change"]["interval"][0]
    warm = summary.setting_summary(oo.read_setting("warm_start_100-kl"))
    assert not warm["over_optimised"]
    bon = summary.best_of_n_summary(summary.best_of_n_table(oo.read_best_of_n()))
    assert bon["base_100"]["fall_interval"][1] < 0 and bon["base_100"]["last_proxy"] > bon["base_100"]["start_proxy"]
    assert bon["warm_start_100"]["peak_true"] > bon["warm_start_100"]["start_true"]


def test_best_of_n_kl_with_ties_by_hand():
    # Two different answers, the higher scored always picked by best-of-2: KL = log 2.
    assert summary.best_of_n_kl_with_ties(["a", "b"], [0.1, 0.9], 2) == pytest.approx(math.log(2), abs=1e-15)
    # The same answer twice: the pick is that answer, KL 0.
    assert summary.best_of_n_kl_with_ties(["a", "a"], [0.4, 0.4], 2) == 0.0
    # Four draws, one answer written twice; best-of-2 picks a, b, c with 1/6, 2/6, 3/6 (C(i-1, 1) / C(4, 2)).
    kl = summary.best_of_n_kl_with_ties(["a", "a", "b", "c"], [0.2, 0.2, 0.5, 0.9], 2)
    by_hand = (1 / 6) * math.log((1 / 6) / 0.5) + (2 / 6) * math.log((2 / 6) / 0.25) + (3 / 6) * math.log((3 / 6) / 0.25)
    assert kl == pytest.approx(by_hand, abs=1e-15)
    # Without ties and with many draws it approaches the continuous formula log n - (n - 1)/n.
    many = [str(k) for k in range(4000)]
    assert summary.best_of_n_kl_with_ties(many, [k / 4000 for k in range(4000)], 4) == pytest.approx(oo.best_of_n_kl(4), abs=2e-3)
