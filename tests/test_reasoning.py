"""Chapter 11's thinking bases and GRPO on worked answers (labkit.studies.thinking_base, labkit.studies.reasoning).

The rewards by hand on one chain; the documents the bases learn from, re-checked by the worked
verifier; and the committed bases and runs, every response re-scored from its text and its problem
alone, every logged rate recomputed from the rows.
"""

import json
import re

import pytest

from labkit.config import ThinkingBaseConfig
from labkit.train import corpus
from labkit.studies import reasoning, thinking_base
from labkit.eval import think_profile
from labkit.task import worked
from labkit.grpo.loop import read_rollouts
from labkit.lab.runs import REPO_ROOT, RunFolder
from labkit.models.tokenizer import load_tiny_tokenizer

CHAIN = worked.Chain(41, (35, 12, -30, -7))  # levels 76, 88, 58, 51
RIGHT = worked.worked_text(CHAIN)
SLIP = '41 + 35 = 76\n76 + 12 = 89\n89 - 30 = 59\n59 - 7 = 52\n{"final_stock": 52}'


def verdict(text: str, finish: str = "eos") -> worked.WorkedVerdict:
    return worked.score_worked(text, finish, CHAIN)


@pytest.mark.parametrize("text, finish, outcome, process, guarded", [
    (RIGHT, "eos", 1.0, 1.0, 1.0),
    # one slip: the later steps start from a wrong stock, so only the first is right
    (SLIP, "eos", 0.0, 0.25, 0.25),
    ('{"final_stock": 51}', "eos", 1.0, 0.0, 0.0),  # a right direct answer earns no process reward
    # a fifth, invented step: four right steps over five written
    (RIGHT.replace('\n{"final_stock": 51}', '\n51 + 1 = 52\n{"final_stock": 52}'), "eos", 0.0, 0.8, 0.8),
    # right working and no final object: the process reward pays, the guard does not
    (RIGHT.rsplit("\n", 1)[0], "eos", 0.0, 1.0, 0.0),
    (RIGHT, "length", 0.0, 1.0, 0.0),  # cut at the token limit: malformed
])
def test_each_reward_by_hand(text, finish, outcome, process, guarded):
    v = verdict(text, finish)
    assert reasoning.outcome_reward(v, CHAIN) == outcome
    assert reasoning.process_reward(v, CHAIN) == pytest.approx(process)
    assert reasoning.guarded_process_reward(v, CHAIN) == pytest.approx(guarded)


def test_a_run_is_refused_an_unknown_reward_or_base_by_name():
    with pytest.raises(ValueError, match="reward 'steps'"):
        reasoning.ReasoningRun("x", "rare_2", reward="steps")
    with pytest.raises(ValueError, match="base 'rare_5'"):
        reasoning.ReasoningRun("x", "rare_5")
    with pytest.raises(ValueError, match="unknown reasoning run 'from_rare_3'"):
        reasoning.get_run("from_rare_3")
    with pytest.raises(ValueError, match="unknown thinking base 'rare_3'"):
        ThinkingBaseConfig().phase("rare_3")


STATEMENT = re.compile(r"opening stock (\d+); (.*)\. Give the closing stock\.")


def chain_of(text: str) -> worked.Chain:
    """The chain a worked-prompt document states, read back from its text."""
    initial, moves = STATEMENT.search(text).groups()
    return worked.Chain(int(initial), tuple(int(m.split()[1]) for m in moves.split("; ")))


def test_the_documents_are_right_fresh_and_in_the_phase_s_shares():
    cfg = ThinkingBaseConfig()
    forbidden = corpus.dataset_keys() | thinking_base.held_out_keys()
    stream = thinking_base.DocumentStream(cfg, cfg.phase("rare_10"), 7, forbidden)
    docs = [stream.next() for _ in range(1500)]
    answer_of = lambda d: d.text.split(corpus.CHAT_ASSISTANT)[1].split("<|im_end|>")[0]  # noqa: E731
    for d in docs:
        if d.kind in ("worked", "worked_direct"):
            chain = chain_of(d.text)
            assert worked.chain_key(chain) not in forbidden
            v = worked.score_worked(answer_of(d), "eos", chain)
            assert (v.reward, v.thinks, v.category) == (1, d.kind == "worked", "correct" if d.kind == "worked" else "direct")
    counts = stream.counts
    worked_prompt = counts["worked"] + counts["worked_direct"]
    assert abs(worked_prompt / 1500 - cfg.worked_prompt_share) < 0.05
    assert set(counts) <= {"worked", "worked_direct", "keyed", "direct"}, counts  # nothing else in the mix
    assert 0.06 < counts["worked"] / worked_prompt < 0.14  # the phase's 10%, within sampling noise


def test_a_chat_document_is_learned_on_its_answer():
    tokenizer = load_tiny_tokenizer()
    cfg = ThinkingBaseConfig()
    stream = thinking_base.DocumentStream(cfg, cfg.phase("skill"), 3, frozenset())
    chat = stream.worked_document(True)
    ids, labels = thinking_base.document_tokens(tokenizer, chat)
    learned = tokenizer.decode([i for i, lab in zip(ids, labels) if lab != -100])
    assert learned == chat.text.split(corpus.CHAT_ASSISTANT)[1].removesuffix(corpus.ENDOFTEXT).removesuffix("\n")
    assert worked.read_steps(learned)[0].a == chain_of(chat.text).initial  # the working starts from the opening stock


def test_a_document_longer_than_a_row_is_refused_by_its_length():
    with pytest.raises(ValueError, match="a document of 5 tokens does not fit a row of row_tokens=4"):
        thinking_base.fitting(([1] * 5, [1] * 5), 4)
    assert thinking_base.fitting(([1] * 4, [1] * 4), 4) == ([1] * 4, [1] * 4)


def test_grpo_never_trains_on_a_chain_it_is_measured_on():
    sets = [thinking_base.held_out_chains(seed, n) for seed, n in (
        (thinking_base.VALIDATION_SEED, thinking_base.MEASURE_CHAINS_PER_K),
        (thinking_base.TEST_SEED, thinking_base.PROFILE_CHAINS_PER_K),
        (thinking_base.TRAIN_SEED, thinking_base.TRAIN_CHAINS_PER_K))]
    validation, test, drawn = [{worked.chain_key(c) for cs in s.values() for c in cs} for s in sets]
    assert [len(validation), len(test), len(drawn)] == [96, 200, 800]
    assert not (test & validation) and not (test & drawn) and len(validation & drawn) == 1  # a k = 1 chain
    pool = {worked.chain_key(p["problem"]) for p in reasoning.chain_pool(thinking_base.TRAIN_CHAINS_PER_K)}
    assert len(pool) == 799 and not (pool & (validation | test))
    assert not ((validation | test | drawn) & corpus.dataset_keys())


# -- the committed bases and runs ----------------------------------------------------------------

THINKING = REPO_ROOT / "runs" / "tiny" / "thinking"
REASONING = REPO_ROOT / "runs" / "tiny" / "reasoning"


def rescored(row: dict, chain: worked.Chain) -> worked.WorkedVerdict:
    return worked.score_worked(row["text"], row["finish_reason"], chain, row["tokenization_valid"])


@pytest.mark.parametrize("name", thinking_base.BASES)
def test_each_committed_base_s_profile_rescores_from_its_texts(name):
    profile = thinking_base.read_profile(name)  # checked against the digest its manifest records
    rows = profile["rows"]
    for r in rows:
        v = rescored(r, worked.Chain(r["chain"]["initial"], tuple(r["chain"]["movements"])))
        assert (v.reward, v.thinks, v.category, len(v.steps)) == (r["reward"], r["thinks"], r["category"], r["steps"])
    assert json.loads(json.dumps(think_profile.profile(rows))) == profile["table"]
    manifest = RunFolder(THINKING / name).manifest()
    assert manifest["test_profile"] == profile["summary"]
    assert len(rows) == 8 * thinking_base.PROFILE_CHAINS_PER_K * manifest["config"]["profile_draws"]


def read_rows(name: str) -> list[dict]:
    return read_rollouts(REASONING / name)  # checked against the run's ledger


@pytest.mark.parametrize("name", reasoning.RUN_NAMES)
def test_each_committed_run_rescores_from_its_rows_and_its_history_recomputes(name):
    run = reasoning.get_run(name)
    manifest = RunFolder(REASONING / name).manifest()
    rows = read_rows(name)
    cfg = manifest["reasoning_config"]
    assert len(rows) == cfg["iterations"] * cfg["prompts_per_iteration"] * cfg["G"]
    reward = reasoning.REWARDS[run.reward]
    for r in rows:
        chain = worked.Chain(r["problem"]["initial"], tuple(r["problem"]["movements"]))
        v = rescored(r, chain)
        assert (v.reward, v.thinks, v.category) == (r["reward"], r["thinks"], r["category"])
        penalty = run.length_penalty * r["tokens"] / worked.WORKED_MAX_NEW_TOKENS
        assert r["optimised_reward"] == pytest.approx(reward(v, chain) - penalty, abs=1e-6)
    history = json.loads((REASONING / name / "history.json").read_text())
    for line in history:
        part = [r for r in rows if r["iteration"] == line["iteration"]]
        assert line["think_rate"] == sum(r["thinks"] for r in part) / len(part)
        assert line["accuracy"] == sum(r["reward"] for r in part) / len(part)
        assert line["mean_tokens"] == sum(r["tokens"] for r in part) / len(part)
