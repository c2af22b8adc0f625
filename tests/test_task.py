"""StockArithmetic-v1: the problem, its solver, statements and the generator (in memory)."""

from __future__ import annotations

import pytest

from labkit.task import problems
from labkit.task.problems import Problem, generate_dataset, population_of, render_statement, solve


@pytest.mark.parametrize(
    "problem, levels, target",
    [
        # worked by hand: 1 +27 = 28, +43 = 71, -18 = 53, -10 = 43
        (Problem(1, (27, 43), (18, 10)), [28, 71, 53, 43], 43),
        (Problem(0, (0, 0), (0, 0)), [0, 0, 0, 0], 0),
        (Problem(100, (100, 100), (0, 0)), [200, 300, 300, 300], 300),  # the largest target
        (Problem(0, (0, 5), (5, 0)), [0, 5, 0, 0], 0),  # touches zero, never below
        (Problem(30, (9, 3), (15, 24)), [39, 42, 27, 3], 3),
        (Problem(100, (0, 0), (100, 0)), [100, 100, 0, 0], 0),
    ],
)
def test_solver_on_hand_worked_problems(problem, levels, target):
    assert problem.stock_levels() == levels
    assert solve(problem) == target


def test_target_max_is_the_largest_possible_answer():
    assert problems.TARGET_MAX == problems.OOD_MAX * 3 == 300


@pytest.mark.parametrize(
    "problem, message",
    [
        (Problem(0, (0, 0), (1, 0)), "non-negative"),
        (Problem(10, (0, 5), (16, 0)), "non-negative"),
        (Problem(101, (0, 0), (0, 0)), "0..100"),
        (Problem(-1, (5, 0), (0, 0)), "0..100"),
        (Problem(True, (0, 0), (0, 0)), "integers"),
        (Problem(1.5, (0, 0), (0, 0)), "integers"),
        (Problem(1, (1, 2, 3), (0, 0)), "exactly 2 deliveries"),
        (Problem(1, (1, 2), (0,)), "exactly 2 deliveries and 2 withdrawals"),
    ],
)
def test_solver_refuses_malformed_problems(problem, message):
    with pytest.raises(ValueError, match=message):
        solve(problem)


@pytest.mark.parametrize(
    "d, message",
    [
        ([1, 2, 3], "must be a dict"),
        ({"initial": 1, "deliveries": [1, 2]}, "lacks the field"),
        ({}, "lacks the field"),
    ],
)
def test_from_dict_refuses_malformed_dicts(d, message):
    with pytest.raises(ValueError, match=message):
        Problem.from_dict(d)


def test_dict_round_trip():
    p = Problem(1, (27, 43), (18, 10))
    assert p.to_dict() == {"initial": 1, "deliveries": [27, 43], "withdrawals": [18, 10]}
    assert Problem.from_dict(p.to_dict()) == p


def test_permutation_key_ignores_the_order_of_deliveries_and_of_withdrawals():
    a = Problem(5, (2, 9), (4, 1))
    assert a.key == Problem(5, (9, 2), (1, 4)).key == (5, (2, 9), (1, 4))
    # deliveries and withdrawals are sorted separately, never mixed
    assert a.key != Problem(5, (4, 1), (2, 9)).key
    assert a.key != Problem(6, (2, 9), (4, 1)).key


@pytest.mark.parametrize(
    "problem, population",
    [
        (Problem(50, (50, 50), (50, 50)), "ID50"),
        (Problem(0, (0, 0), (0, 0)), "ID50"),
        (Problem(51, (0, 0), (0, 0)), "OOD100"),
        (Problem(0, (0, 100), (0, 0)), "OOD100"),
        (Problem(50, (50, 50), (51, 0)), "OOD100"),
    ],
)
def test_population(problem, population):
    assert population_of(problem) == population


def test_statement_shows_every_operand_and_the_item():
    p = Problem(1, (27, 43), (18, 10))
    for index in range(len(problems.TEMPLATES)):
        text = render_statement(p, index, "lamps")
        positions = [text.index(str(x)) for x in (1, 27, 43, 18, 10)]
        assert positions == sorted(positions), "operands appear in the order the movements happen"
        assert "{" not in text and "}" not in text, "every placeholder is filled"
    assert render_statement(p, 2, "crates") == (
        "Inventory log for crates: opening stock 1; delivery +27; delivery +43; "
        "withdrawal -18; withdrawal -10. Give the closing stock."
    )


def test_format_instruction_names_the_field():
    assert '{"final_stock": <integer>}' in problems.FORMAT_INSTRUCTION
    assert len(problems.TEMPLATES) >= 3


def test_generation_is_deterministic_and_depends_on_the_seed():
    first = generate_dataset()
    assert first == generate_dataset(problems.DEFAULT_SEED)
    other = generate_dataset(problems.DEFAULT_SEED + 1)
    assert len(other) == len(first) == 1400
    assert [r["problem"] for r in other] != [r["problem"] for r in first]


def test_generated_records_have_the_public_fields():
    records = generate_dataset()
    assert records[0] == {
        "id": "train-0000",
        "split": "train",
        "population": "ID50",
        "statement": "A warehouse holds 1 tyres. It receives deliveries of 27 and 43 tyres, "
        "then ships out 18 and 10 tyres. How many tyres are in stock now?",
        "problem": {"initial": 1, "deliveries": [27, 43], "withdrawals": [18, 10]},
        "target": 43,
    }
    assert all(set(r) == {"id", "split", "population", "statement", "problem", "target"} for r in records)


def test_warm_start_and_pool_partition_the_train_split():
    train = [r for r in generate_dataset() if r["split"] == "train"]
    warm, pool = problems.warm_start_ids(train), problems.pool_ids(train)
    assert (len(warm), len(pool)) == (128, 872)
    assert warm + pool == [r["id"] for r in train]
    assert warm[0] == "train-0000" and warm[-1] == "train-0127" and pool[0] == "train-0128"
