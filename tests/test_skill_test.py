"""Skill or propensity (`labkit.studies.skill_test`, issue 56): the working started for the base, the rest as
chapter 11's profile.  The forced start by hand; a small test (1 chain per k, 1 draw) with the warm start
standing in for every base: each response begins with its forced start, each base is paired with the skill's."""

import gzip
import json

import pytest

from labkit.lab.runs import REPO_ROOT, RunFolder
from labkit.studies import skill_test
from labkit.task import worked

WARM_START = REPO_ROOT / "runs" / "tiny" / "warm_start" / "model.safetensors"


def test_the_forced_start_is_the_first_steps_left_side_as_a_worked_answer_writes_it():
    assert skill_test.forced_start(worked.Chain(41, (35, 12, -30, -7))) == "41 + 35 = "
    assert skill_test.forced_start(worked.Chain(88, (-30,))) == "88 - 30 = "
    chain = worked.Chain(41, (35, 12, -30, -7))
    assert worked.worked_text(chain).startswith(skill_test.forced_start(chain))  # the skill base's own layout


def test_a_small_skill_test_pairs_every_base_with_the_skill_base(tmp_path):
    results = skill_test.run(bases=("skill", "rare_0"), draws=1, chains_per_k=1, out=tmp_path / "skill",
                             model_file=lambda base: WARM_START)
    assert set(results["bases"]) == {"skill", "rare_0"} and set(results["against_skill"]) == {"rare_0"}
    assert results["bases"]["skill"]["responses"] == 8  # 1 chain per k = 1 ... 8, 1 draw
    # the same model, chains and seeds: the same responses, so the paired difference is exactly 0
    assert results["bases"]["skill"] == results["bases"]["rare_0"]
    assert results["against_skill"]["rare_0"]["mean_difference"] == 0
    rows = json.loads(gzip.decompress((tmp_path / "skill" / "rows.json.gz").read_bytes()))
    assert all(r["text"].startswith(r["forced"]) for r in rows) and len(rows) == 16
    assert RunFolder(tmp_path / "skill").is_finished()


def test_the_skill_base_comes_first_and_unknown_bases_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"the skill base first \(the reference\)"):
        skill_test.run(bases=("rare_0", "skill"), out=tmp_path / "x")
    with pytest.raises(ValueError, match="bases \\['skill', 'rare_5'\\]"):
        skill_test.run(bases=("skill", "rare_5"), out=tmp_path / "x")
