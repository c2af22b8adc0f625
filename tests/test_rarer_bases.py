"""Chapter 11's rarer bases (labkit.studies.rarer_bases): one lineage, the same documents, only the share differs."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from labkit.config import ThinkingBaseConfig
from labkit.studies import rarer_bases, thinking_base
from labkit.train import corpus


def _documents(name: str, count: int) -> list:
    cfg = rarer_bases.config()
    stream = thinking_base.DocumentStream(cfg, cfg.phase(name), cfg.seed + rarer_bases.DOCUMENT_INDEX,
                                          corpus.dataset_keys() | thinking_base.held_out_keys())
    return [stream.next() for _ in range(count)]


def test_the_lineage_is_the_thinking_steps_recipe_with_two_rarer_shares():
    thinking = ThinkingBaseConfig()
    assert rarer_bases.BASES == ("skill", "rare_2", "rare_1", "rare_0p5")
    assert rarer_bases.config().phase("skill") == thinking.phase("skill")
    assert rarer_bases.config().phase("rare_2") == thinking.phase("rare_2")
    assert rarer_bases.DOCUMENT_INDEX == [p.name for p in thinking.phases].index("rare_2") == 2
    shares = {name: rarer_bases.config().phase(name).thinking_share for name in rarer_bases.RARER}
    assert shares == {"rare_2": 0.02, "rare_1": 0.01, "rare_0p5": 0.005}
    for name in rarer_bases.RARER:  # everything but the name and the share is rare_2's
        phase = asdict(rarer_bases.config().phase(name))
        assert {k: v for k, v in phase.items() if k not in ("name", "thinking_share")} == \
               {k: v for k, v in asdict(thinking.phase("rare_2")).items() if k not in ("name", "thinking_share")}
    assert [r.base for r in rarer_bases.RUNS] == list(rarer_bases.STARTS)
    assert rarer_bases.RUN_NAMES == ("from_rare_2", "from_rare_1", "from_rare_0p5", "from_rare_2_direct_50",
                                     "from_rare_2_direct_150")
    # the thinned bases: the committed rare_2, then phase 2's documents with no working, at its constant rate
    for phase in rarer_bases.THINNED:
        assert (phase.start, phase.thinking_share, phase.peak_lr, phase.final_lr) == ("rare_2", 0.0, 3e-4, 3e-4)
    assert rarer_bases.thinned_config().warmup_steps == 0
    assert rarer_bases.THINNED_INDEX == len(thinking.phases)  # a document stream no thinking base draws


def test_each_bases_worked_documents_are_a_subset_of_the_next_richer_bases():
    """The same draws for every base: the same chains in the same places, and a document answered with working
    at 0.5% is answered with working at 1% and 2% (the coin is the same number, compared with a larger share)."""
    count = 3000
    docs = {name: _documents(name, count) for name in rarer_bases.RARER}
    worked = {name: {i for i, d in enumerate(ds) if d.kind == "worked"} for name, ds in docs.items()}
    prompt = {name: {i for i, d in enumerate(ds) if d.kind in ("worked", "worked_direct")} for name, ds in docs.items()}
    assert prompt["rare_2"] == prompt["rare_1"] == prompt["rare_0p5"]  # the worked prompt's documents: the same places
    assert worked["rare_0p5"] <= worked["rare_1"] <= worked["rare_2"]
    assert 0 < len(worked["rare_0p5"]) < len(worked["rare_2"])
    for i in prompt["rare_2"] - worked["rare_2"]:  # a direct answer is the same document in every base
        assert docs["rare_2"][i].text == docs["rare_1"][i].text == docs["rare_0p5"][i].text
    others = set(range(count)) - prompt["rare_2"]
    assert all(docs["rare_2"][i].text == docs["rare_0p5"][i].text for i in others)


def test_an_unknown_run_and_an_unfinished_study_are_refused_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown run 'from_rare_3'.*from_rare_2"):
        rarer_bases.get_run("from_rare_3")
    monkeypatch.setattr(rarer_bases, "root", lambda preset="tiny": tmp_path)
    with pytest.raises(FileNotFoundError, match="is not finished: `python -m labkit rarer-bases` builds it"):
        rarer_bases.table()
