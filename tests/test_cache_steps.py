"""Which cached steps `make cache` rebuilds: the stale ones and everything built from them."""

import pytest

from labkit import cache


def _verdicts(stale: set[str]) -> dict:
    return {name: {"status": "stale" if name in stale else "fresh", "changed": []} for name in cache.STEP_NAMES}


@pytest.mark.parametrize("stale, expected", [
    ({"base"}, ["base", "warm_start", "sft", "grpo", "evaluation", "group_size"]),
    ({"warm_start"}, ["warm_start", "sft", "grpo", "evaluation", "group_size"]),
    ({"grpo"}, ["grpo", "evaluation", "group_size"]),
    ({"sft"}, ["sft", "evaluation", "group_size"]),
    ({"evaluation"}, ["evaluation", "group_size"]),
    ({"group_size"}, ["group_size"]),
    (set(), []),
])
def test_a_rebuilt_step_takes_everything_downstream_with_it(stale, expected):
    assert cache.to_rebuild(_verdicts(stale)) == expected


def test_the_warm_start_and_the_exercise_name_their_other_outputs():
    assert "sampler_agreement.json" in cache.get_step("warm_start").outputs
    assert set(cache.get_step("group_size").outputs) == {"grpo_g2", "grpo_g8"}


def test_an_unknown_step_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown step 'grpo_g4'"):
        cache.get_step("grpo_g4")
