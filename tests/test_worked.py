"""The worked-answer variant's verifier (labkit.task.worked, issue 41): each rule on hand-made responses,
the protocol's verifier on the final object, the categories, and fresh chains kept apart from the
protocol's problems."""

import random

import pytest

from labkit.task import problems, verifier, worked
from labkit.task.worked import Chain, score_worked

PROBLEM = problems.Problem(41, (35, 12), (30, 7))  # 41 + 35 + 12 - 30 - 7 = 51
CHAIN = Chain.from_problem(PROBLEM)
RIGHT = "41 + 35 = 76\n76 + 12 = 88\n88 - 30 = 58\n58 - 7 = 51\n"


def verdict(text, finish="eos", valid_ids=True, chain=CHAIN):
    return score_worked(text, finish, chain, valid_ids)


def test_the_chain_of_a_protocol_problem_and_its_reference_answer():
    assert CHAIN == Chain(41, (35, 12, -30, -7)) and CHAIN.target == problems.solve(PROBLEM) == 51
    assert worked.worked_text(CHAIN) == RIGHT + '{"final_stock": 51}'
    v = verdict(worked.worked_text(CHAIN))
    assert (v.reward, v.reason, v.thinks, v.steps_right, v.category) == (1, None, True, True, "correct")
    assert [s.c for s in v.steps] == [76, 88, 58, 51]


@pytest.mark.parametrize("text, finish, valid_ids, reason", [
    (RIGHT + '{"final_stock": 51}', "eos", False, verifier.UNDECODABLE_ID),
    (RIGHT + '{"final_stock": 51}', "length", True, verifier.STOPPED_AT_LENGTH),
    ("x" * (worked.MAX_WORKING_CHARS + 1) + '{"final_stock": 51}', "eos", True, worked.WORKING_TOO_LONG),
    (RIGHT + "so the answer is 51", "eos", True, worked.NO_FINAL_OBJECT),
    ('{"final_stock": 76}\n' + RIGHT + '{"final_stock": 51}', "eos", True, worked.JSON_IN_WORKING),
    (RIGHT + "} " + '{"final_stock": 51}', "eos", True, worked.JSON_IN_WORKING),
    (RIGHT + '{"final_stock": 51} thanks', "eos", True, verifier.NOT_JSON),
    (RIGHT + '{"final_stock": "51"}', "eos", True, verifier.STRING),
    (RIGHT + '{"final_stock": 51.0}', "eos", True, verifier.FLOAT),
    (RIGHT + '{"final_stock": 51, "unit": "boxes"}', "eos", True, verifier.EXTRA_FIELD),
    (RIGHT + '{"stock": 51}', "eos", True, verifier.MISSING_FIELD),
    (RIGHT + '{"final_stock": 52}', "eos", True, verifier.WRONG_VALUE),
])
def test_each_rule_rejects_with_its_own_reason(text, finish, valid_ids, reason):
    v = verdict(text, finish, valid_ids)
    assert v.reward == 0 and v.reason == reason and reason in worked.WORKED_REASONS


@pytest.mark.parametrize("text, category, steps_right", [
    (RIGHT + '{"final_stock": 51}', "correct", True),
    ("41 + 35 = 76\n76 + 12 = 89\n89 - 30 = 59\n59 - 7 = 52\n" + '{"final_stock": 52}', "wrong_step", False),
    ("41 + 35 = 76\n77 + 12 = 89\n89 - 30 = 59\n59 - 7 = 52\n" + '{"final_stock": 52}', "wrong_step", False),
    ("41 + 35 = 76\n76 - 30 = 46\n46 - 7 = 39\n" + '{"final_stock": 39}', "skipped_or_added", True),
    ("41 + 12 = 53\n53 + 35 = 88\n88 - 7 = 81\n81 - 30 = 51\n" + '{"final_stock": 51}', "correct", True),
    (RIGHT + '{"final_stock": 15}', "miscopied_final", True),
    ('{"final_stock": 51}', "direct", None),
    ('The stock is {"final_stock": 50}', "direct", None),
    (RIGHT + '{"final_stock": [51]}', "malformed", True),
])
def test_each_response_gets_the_source_designs_category(text, category, steps_right):
    v = verdict(text)
    assert (v.category, v.steps_right, v.thinks) == (category, steps_right, steps_right is not None)
    assert v.category in worked.CATEGORIES


def test_the_final_object_is_the_protocols_verdict():
    """A direct answer is scored exactly as the protocol scores it; with working before it, the same
    object gets the same reward, validity and value."""
    rng = random.Random(0)
    answers = ['{"final_stock": 51}', '{"final_stock": 50}', '{"final_stock": true}', '{"final_stock": 51, "a": 1}',
               '{"final_stock": 1e3}', '{"final_stock": -4}', '{"final_stock": 301}', '{ "final_stock" : 51 }  ']
    for answer in answers:
        for finish in verifier.FINISH_REASONS:
            ids_ok = rng.random() < 0.8
            protocol = verifier.score(answer, finish, PROBLEM, ids_ok)
            for text in (answer, RIGHT + answer):
                v = score_worked(text, finish, PROBLEM, ids_ok)
                assert (v.reward, v.valid, v.value, v.reason) == (protocol.reward, protocol.valid, protocol.value,
                                                                  protocol.reason)


def test_it_never_raises_on_any_text_and_never_runs_it():
    rng = random.Random(1)
    alphabet = '0123456789 +-=={}[]":,.\n\tfinal_stock' + "é\x00\ud800"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
        v = score_worked(text, rng.choice(verifier.FINISH_REASONS), CHAIN, rng.random() < 0.9)
        assert v.reward in (0, 1) and (v.reason in worked.WORKED_REASONS or v.reason is None)
    huge = "9" * 5000 + " + 1 = 1\n" + '{"final_stock": 51}'  # digits beyond int()'s limit: not a step, no error
    assert verdict(huge).reason == worked.WORKING_TOO_LONG
    assert verdict("__import__('os').system('x') = 1\n" + RIGHT + '{"final_stock": 51}').reward == 1
    for bad in (None, 3):
        with pytest.raises(ValueError, match="text must be a str"):
            score_worked(bad, "eos", CHAIN)
    with pytest.raises(ValueError, match="finish_reason must be one of"):
        score_worked("", "stop", CHAIN)


def test_chains_check_their_rules():
    with pytest.raises(ValueError, match="a tuple of 1 to 8 movements"):
        Chain(3, ())
    with pytest.raises(ValueError, match="a tuple of 1 to 8 movements"):
        Chain(3, [1])
    with pytest.raises(ValueError, match="every stock level lies in 0..300"):
        Chain(3, (-5,))
    with pytest.raises(ValueError, match="integers"):
        Chain(3, (True,))
    assert Chain(10, (5, -3)).statement("lamps") == \
        "Inventory log for lamps: opening stock 10; delivery +5; withdrawal -3. Give the closing stock."


def test_fresh_chains_have_k_movements_and_never_meet_the_protocols_problems():
    keys = frozenset(problems.Problem.from_dict(r["problem"]).key for r in problems.generate_dataset())
    assert len(keys) == 1400
    for k in range(1, worked.MAX_MOVEMENTS + 1):
        chains = worked.fresh_chains(k, 50, seed=7, exclude=keys)
        assert len({worked.chain_key(c) for c in chains}) == 50 and all(len(c.movements) == k for c in chains)
        assert all(worked.chain_key(c) not in keys and 0 not in c.movements for c in chains)
        assert all(score_worked(worked.worked_text(c), "eos", c).category == "correct" for c in chains)
    assert worked.fresh_chains(3, 5, seed=7) == worked.fresh_chains(3, 5, seed=7)  # seeded
    ood = worked.fresh_chains(4, 20, seed=7, high=100)
    assert max(max(abs(m) for m in c.movements) for c in ood) > 50


def test_the_worked_limit_fits_eight_movements_and_the_samplers_allow_it():
    from labkit.models import rollouts
    from labkit.task.problems import OOD_MAX
    from labkit.models.tokenizer import load_tiny_tokenizer

    tokenizer = load_tiny_tokenizer()
    longest = max(len(tokenizer.encode(worked.worked_text(c), add_special_tokens=False)) + 1  # + end-of-sequence
                  for c in worked.fresh_chains(worked.MAX_MOVEMENTS, 2000, seed=7, high=OOD_MAX))
    assert longest <= 128 and longest + 32 <= worked.WORKED_MAX_NEW_TOKENS <= rollouts.SAMPLER_TOKEN_LIMIT
