"""StockArithmetic-v1: the task, its solver, its statements and its splits.

A fictional inventory exercise: a starting stock, two deliveries, then two
withdrawals, every intermediate stock level non-negative.  The model sees only
a statement and one formatting instruction; the verifier sees the structure.

The 1,400 problems are generated deterministically from a seed:

    split       size  operands                          population
    train      1,000  0..50                             ID50
    validation   200  0..50                             ID50
    test         100  0..50                             ID50
    test         100  0..100, at least one in 51..100   OOD100

Problems are de-duplicated on the *permutation key* (initial, sorted
deliveries, sorted withdrawals) across all splits, so no re-ordering of the
same movements crosses a split.  The first 128 train problems are the warm-start
set; the other 872 are the SFT / RL pool.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DEFAULT_SEED = 20261129

SPLIT_SIZES = {"train": 1000, "validation": 200, "test": 200}
TEST_POPULATION_SIZES = {"ID50": 100, "OOD100": 100}
WARM_START_SIZE = 128  # first 128 train problems
ID_MAX = 50  # operands of train, validation and ID50 test lie in 0..ID_MAX
OOD_MAX = 100  # OOD100 operands lie in 0..OOD_MAX, at least one above ID_MAX
TARGET_MAX = 300  # the verifier's range: 100 + 100 + 100 at most

# One formatting instruction, identical for every problem.
FORMAT_INSTRUCTION = 'Reply with only a JSON object of the form {"final_stock": <integer>}.'

# Several templates shared across splits; {item} is a plural noun.
TEMPLATES = (
    "A warehouse holds {initial} {item}. It receives deliveries of {d1} and {d2} {item}, "
    "then ships out {w1} and {w2} {item}. How many {item} are in stock now?",
    "The stock of {item} starts at {initial}. Two deliveries arrive: {d1}, then {d2}. "
    "Two withdrawals follow: {w1}, then {w2}. What is the final stock?",
    "Inventory log for {item}: opening stock {initial}; delivery +{d1}; delivery +{d2}; "
    "withdrawal -{w1}; withdrawal -{w2}. Give the closing stock.",
    "A shop had {initial} {item} on its shelves. A supplier brought {d1} more and later "
    "another {d2}. Customers then took {w1} and afterwards {w2}. How many {item} remain?",
)
ITEMS = ("boxes", "bolts", "crates", "lamps", "chairs", "bottles", "tyres", "books")


@dataclass(frozen=True)
class Problem:
    """The structure of one problem: what the verifier (never the model) receives."""

    initial: int
    deliveries: tuple[int, int]
    withdrawals: tuple[int, int]

    @classmethod
    def from_dict(cls, d: dict) -> "Problem":
        """Build from `{initial, deliveries, withdrawals}`; raises ValueError if malformed."""
        if not isinstance(d, dict):
            raise ValueError(f"problem must be a dict with initial/deliveries/withdrawals, got {type(d).__name__}")
        missing = {"initial", "deliveries", "withdrawals"} - set(d)
        if missing:
            raise ValueError(f"problem {d!r} lacks the field(s) {sorted(missing)}")
        for name in ("deliveries", "withdrawals"):
            if not isinstance(d[name], (list, tuple)):
                raise ValueError(f"problem field {name!r} must be a list of 2 integers, got {d[name]!r}")
        return cls(d["initial"], tuple(d["deliveries"]), tuple(d["withdrawals"])).validated()

    def to_dict(self) -> dict:
        return {"initial": self.initial, "deliveries": list(self.deliveries), "withdrawals": list(self.withdrawals)}

    @property
    def operands(self) -> tuple[int, ...]:
        return (self.initial, *self.deliveries, *self.withdrawals)

    @property
    def key(self) -> tuple:
        """The permutation key: re-ordering deliveries or withdrawals gives the same problem."""
        return (self.initial, tuple(sorted(self.deliveries)), tuple(sorted(self.withdrawals)))

    def stock_levels(self) -> list[int]:
        """Stock after each movement, in order (deliveries first, then withdrawals)."""
        levels, stock = [], self.initial
        for d in self.deliveries:
            stock += d
            levels.append(stock)
        for w in self.withdrawals:
            stock -= w
            levels.append(stock)
        return levels

    def validated(self) -> "Problem":
        """Return self if it is a well-formed problem, else raise ValueError naming the rule."""
        if len(self.deliveries) != 2 or len(self.withdrawals) != 2:
            raise ValueError(f"a problem has exactly 2 deliveries and 2 withdrawals, got {self!r}")
        for x in self.operands:
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"operands must be integers, got {x!r} in {self!r}")
            if not 0 <= x <= OOD_MAX:
                raise ValueError(f"operands must lie in 0..{OOD_MAX}, got {x} in {self!r}")
        if min(self.stock_levels()) < 0:
            raise ValueError(f"every intermediate stock must be non-negative, got levels {self.stock_levels()} for {self!r}")
        return self


def solve(problem: Problem) -> int:
    """The deterministic solver: the final stock.  No language model, no person."""
    return problem.validated().stock_levels()[-1]


def population_of(problem: Problem) -> str:
    """'ID50' when every operand is in 0..50, 'OOD100' otherwise."""
    return "ID50" if max(problem.operands) <= ID_MAX else "OOD100"


def render_statement(problem: Problem, template_index: int, item: str) -> str:
    """The statement a model sees (the formatting instruction is added by the prompt builder)."""
    d1, d2 = problem.deliveries
    w1, w2 = problem.withdrawals
    return TEMPLATES[template_index].format(initial=problem.initial, d1=d1, d2=d2, w1=w1, w2=w2, item=item)


def _draw_problem(rng: random.Random, low_max: int, high_max: int | None) -> Problem:
    """Draw one valid problem by rejection.

    With high_max None every operand is uniform in 0..low_max; otherwise operands
    are uniform in 0..high_max and at least one must exceed low_max (OOD).
    """
    top = low_max if high_max is None else high_max
    while True:
        initial, d1, d2, w1, w2 = (rng.randint(0, top) for _ in range(5))
        p = Problem(initial, (d1, d2), (w1, w2))
        if min(p.stock_levels()) < 0:
            continue
        if high_max is not None and max(p.operands) <= low_max:
            continue
        return p


def generate_dataset(seed: int = DEFAULT_SEED) -> list[dict]:
    """The 1,400 records of StockArithmetic-v1, in split order (train, validation, test).

    Each record: id, split, population, statement, problem ({initial, deliveries,
    withdrawals}), target.  Same seed, same records, byte for byte once written.
    """
    rng = random.Random(seed)
    seen: set[tuple] = set()
    records: list[dict] = []

    per_split: dict[str, int] = {}

    def take(split: str, count: int, high_max: int | None) -> None:
        index = 0
        while index < count:
            p = _draw_problem(rng, ID_MAX, high_max)
            if p.key in seen:
                continue  # de-duplicate under the permutation key, across all splits
            seen.add(p.key)
            template_index = rng.randrange(len(TEMPLATES))
            item = rng.choice(ITEMS)
            records.append(
                {
                    "id": f"{split}-{per_split.get(split, 0):04d}",
                    "split": split,
                    "population": population_of(p),
                    "statement": render_statement(p, template_index, item),
                    "problem": p.to_dict(),
                    "target": solve(p),
                }
            )
            per_split[split] = per_split.get(split, 0) + 1
            index += 1

    take("train", SPLIT_SIZES["train"], None)
    take("validation", SPLIT_SIZES["validation"], None)
    take("test", TEST_POPULATION_SIZES["ID50"], None)
    take("test", TEST_POPULATION_SIZES["OOD100"], OOD_MAX)
    return records


def warm_start_ids(train_records: list[dict]) -> list[str]:
    """Ids of the warm-start set: the first 128 train problems."""
    return [r["id"] for r in train_records[:WARM_START_SIZE]]


def pool_ids(train_records: list[dict]) -> list[str]:
    """Ids of the SFT / RL pool: the other 872 train problems."""
    return [r["id"] for r in train_records[WARM_START_SIZE:]]
