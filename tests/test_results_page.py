"""The results page's verdict is decided by the Wilson intervals, and the page refuses a run without results."""

import pytest

from labkit import results_page
from labkit.evaluate import wilson_interval


def _results(grpo: tuple[int, int], sft: tuple[int, int]) -> dict:
    def entry(c, n):
        return {"greedy": {"ALL": {"success_rate": c / n, "success_rate_ci": wilson_interval(c, n), "responses": n}}}
    return {"policies": {"grpo": entry(*grpo), "sft": entry(*sft)}}


def test_beat_only_when_the_intervals_do_not_overlap():
    assert results_page.verdict(_results((120, 200), (40, 200))).startswith("grpo beat sft:")
    assert results_page.verdict(_results((40, 200), (120, 200))).startswith("grpo did worse than sft:")
    close = results_page.verdict(_results((24, 200), (16, 200)))
    assert close.startswith("grpo did not beat sft:") and "overlap" in close
    assert "12.0% [" in close and "8.0% [" in close


def test_the_authors_figures_are_kept_apart_and_marked_as_theirs():
    table = results_page._authors_table()
    assert "| sft | 16/200 = 8.0% |" in table
    assert "| grpo | 3/200 = 1.5% |" in table


def test_a_run_without_results_is_refused_with_the_command_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="labkit evaluate"):
        results_page.render(tmp_path)


def test_the_page_shows_the_chance_baselines_computed_now():
    from labkit import baselines
    from labkit.runs import read_json

    page = results_page.render()
    results = read_json(results_page.DEFAULT_RUN / "evaluation" / "results.json")
    policies = list(results["policy_order"])
    b = baselines.baselines(results_page.DEFAULT_RUN / "evaluation", policies)
    assert baselines.markdown_table(b) in page
    assert baselines.markdown_beside(results, b, policies) in page
    for policy in policies:
        for mode in ("greedy", "sample"):
            row = next(line for line in page.splitlines() if line.startswith(f"| {policy} | {mode} | ")
                       and line.endswith(f"| {b['distinct_answers'][policy][mode]} |"))
            assert baselines.chance_call(results["policies"][policy][mode]["ALL"], b, "ALL") in row
    for policy in results_page.MAIN_POLICIES:
        for mode in ("greedy", "sample"):
            assert f"- {baselines.chance_sentence(results, b, policy, mode)}\n" in page
    targets = baselines.distinct_test_targets()
    assert f"the test targets take {targets['ALL']} distinct values" in page
    assert f"the constant answer {b['constant_answer']['value']} (" in page


def test_the_authors_verdict_follows_their_counts_and_the_interval_rule():
    g, s = results_page.AUTHORS_QWEN["grpo"]["greedy"], results_page.AUTHORS_QWEN["sft"]["greedy"]
    ahead = wilson_interval(*s)[0] > wilson_interval(*g)[1]
    sentence = results_page._authors_verdict()
    assert sentence.startswith("In their run GRPO did not beat SFT on greedy pass@1")
    assert ("SFT was ahead" in sentence) == ahead
    assert f"({g[0]}/{g[1]} against {s[0]}/{s[1]})" in sentence


# --- labkit.baselines on hand-made labels (data.open_records replaced; no data file is read) -----------------

PROBLEM = {"initial": 41, "deliveries": [35, 22], "withdrawals": [14, 18]}  # any valid problem: only its form is used
HAND_MADE = {
    # validation: 3 and 5 twice each, 9 once -> the constant is 3 (a tie goes to the smaller number), 2 of 5
    ("labels", "validation"): [{"id": f"v{i}", "population": "ID50", "target": t} for i, t in enumerate([5, 3, 3, 5, 9])],
    # train: 3 twice, 7 and 1 once each (4 targets, 3 distinct)
    ("labels", "train"): [{"id": f"r{i}", "population": "ID50", "target": t} for i, t in enumerate([3, 3, 7, 1])],
    ("labels", "test"): [{"id": "t0", "population": "ID50", "target": 3, "problem": PROBLEM},
                         {"id": "t1", "population": "ID50", "target": 7, "problem": PROBLEM},
                         {"id": "t2", "population": "OOD100", "target": 3, "problem": PROBLEM},
                         {"id": "t3", "population": "OOD100", "target": 120, "problem": PROBLEM}],
}


@pytest.fixture
def hand_made(monkeypatch):
    from labkit import baselines

    def open_records(kind, split, phase, *args, **kwargs):
        return [dict(r) for r in HAND_MADE[(kind, split)]]

    monkeypatch.setattr(baselines.data, "open_records", open_records)
    return baselines


def test_constant_answer_is_chosen_on_validation_and_scored_on_test(hand_made):
    const = hand_made.constant_answer()
    assert const["value"] == 3 and const["validation"] == {"correct": 2, "problems": 5}
    assert {p: (const[p]["correct"], const[p]["problems"]) for p in hand_made.POPULATIONS} == \
        {"ALL": (2, 4), "ID50": (1, 2), "OOD100": (1, 2)}
    assert const["ALL"]["success_rate"] == 0.5 and const["ALL"]["success_rate_ci"] == wilson_interval(2, 4)
    assert const["ID50"]["success_rate_ci"] == wilson_interval(1, 2)


def test_train_target_draw_is_the_exact_expectation(hand_made):
    draw = hand_made.train_target_draw()
    assert draw["train_targets"] == 4 and draw["distinct_train_targets"] == 3
    # test targets 3, 7 | 3, 120 have train frequencies 2/4, 1/4 | 2/4, 0/4
    assert draw["ALL"] == {"problems": 4, "expected_success_rate": 5 / 16}
    assert draw["ID50"] == {"problems": 2, "expected_success_rate": 3 / 8}
    assert draw["OOD100"] == {"problems": 2, "expected_success_rate": 1 / 4}
    assert hand_made.distinct_test_targets() == {"ALL": 3, "ID50": 2, "OOD100": 2}


def test_distinct_answers_count_schema_valid_values_only(hand_made, tmp_path):
    from labkit.runs import write_jsonl

    def rows(mode, texts):
        return [{"problem_id": f"t{i % 4}", "mode": mode, "draw": i // 4, "text": text, "finish_reason": "eos",
                 "tokenization_valid": True} for i, text in enumerate(texts)]

    answer = '{{"final_stock": {}}}'.format
    write_jsonl(tmp_path / "p" / "predictions-greedy.jsonl.gz",
                rows("greedy", [answer(3), answer(3), "not json", answer(120)]))
    write_jsonl(tmp_path / "p" / "predictions-sample.jsonl.gz",
                rows("sample", [answer(1), answer(2), answer(2), '{"stock": 7}', answer(7), answer(1), "", answer(9)]))
    assert hand_made.distinct_answers(tmp_path, ["p"]) == {"p": {"greedy": 2, "sample": 4}}


def test_above_chance_needs_the_whole_interval_above_both_baselines(hand_made):
    b = {"constant_answer": hand_made.constant_answer(), "train_target_draw": hand_made.train_target_draw()}
    # ALL: the constant scores 2/4, interval [0.150, 0.850]; the draw expects 5/16 = 0.3125
    low, high = wilson_interval(2, 4)
    assert hand_made.chance_bar(b) == (high, "the upper end of the constant answer's interval")
    assert hand_made.chance_floor(b) == (5 / 16, "the expected success of a draw from the train targets")

    def stats(c, n):
        return {"correct": c, "responses": n, "success_rate": c / n, "success_rate_ci": wilson_interval(c, n)}

    assert hand_made.chance_call(stats(199, 200), b) == "above"   # [0.972, 0.999] above 0.850
    assert hand_made.chance_call(stats(170, 200), b) == "not separated"  # [0.795, 0.893] holds 0.850
    assert hand_made.chance_call(stats(10, 200), b) == "below"    # [0.027, 0.090] below 0.3125
    assert hand_made.chance_call(stats(60, 200), b) == "not separated"  # [0.240, 0.367] holds 0.3125
    results = {"policies": {"q": {"greedy": {"ALL": stats(199, 200)}, "sample": {"ALL": stats(10, 200)}}}}
    assert hand_made.chance_sentence(results, b, "q", "greedy").startswith(
        "q, greedy pass@1 on ALL (199/200 = 99.5%, 95% interval [97.22, 99.91]), is above chance: its whole "
        "interval lies above 85.00%, the upper end of the constant answer's interval.")
    assert "is below chance: its whole interval lies below 31.25%" in hand_made.chance_sentence(results, b, "q", "sample")
