"""StockArithmetic-worked: the task with room to think before the answer (issue 41; not the protocol).

The protocol's task and verifier (`labkit.task.problems`, `labkit.task.verifier`) are unchanged and stay the
lab's measure.  This variant asks for working before the answer:

    41 + 35 = 76
    76 + 12 = 88
    88 - 30 = 58
    58 - 7 = 51
    {"final_stock": 51}

A response is free working text, then exactly one JSON object `{"final_stock": N}` as the last
thing before end-of-sequence.  Its verdict, `score_worked`:

* the final object is the text from the response's last "{" to its end; it is checked by the
  protocol's own `verifier.parse_answer` (the same schema, the same format reasons) and its value
  against the chain's target;
* the working (everything before that "{") may hold no "{" or "}" at all ("json_in_working"),
  at most MAX_WORKING_CHARS characters ("working_too_long"); a response that hit the token limit
  (WORKED_MAX_NEW_TOKENS, set at sampling) or holds an id the tokenizer lacks fails first,
  as in the protocol;
* the working is read, never run: a *step* is `a + b = c` or `a - b = c` with whole numbers of at
  most 9 digits, found by a regular expression.  A response **thinks** when its working holds at
  least one step;
* each response gets one `category` (the source design's): "correct" (every step right, each
  movement used once, the answer copied from the last step); "wrong_step" (an arithmetic slip, or
  a step that does not start from the previous result or from the opening stock);
  "skipped_or_added" (right arithmetic, but not the problem's movements); "miscopied_final" (right
  working, another number in the answer); "direct" (no working); "malformed" (no reward-bearing
  answer: any reason but "wrong_value").

A problem here is a `Chain`: an opening stock and k signed movements, k = 1 ... 8
(`labkit.task.problems.Problem` is the protocol's k = 4: two deliveries, then two withdrawals).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass

from .problems import ID_MAX, OOD_MAX, TARGET_MAX, Problem
from . import verifier

WORKED_INSTRUCTION = ('Work it out step by step, one movement per line as "a + b = c" or "a - b = c", '
                      'then end with only a JSON object of the form {"final_stock": <integer>}.')
# The sampler's limit for a worked answer: the solver's own worked answer to eight movements at OOD100
# magnitudes takes at most 123 tokens with its end-of-sequence over 2,000 drawn chains (tests/test_worked.py
# measures it), so 160 leaves a model room for a slip; the samplers allow up to `rollouts.SAMPLER_TOKEN_LIMIT` (256).
WORKED_MAX_NEW_TOKENS = 160
MAX_WORKING_CHARS = 400  # eight steps of "100 + 100 = 200" and their line breaks fit three times over
MAX_MOVEMENTS = 8

WORKING_TOO_LONG = "working_too_long"
NO_FINAL_OBJECT = "no_final_object"
JSON_IN_WORKING = "json_in_working"
# The first that applies, in this order: the protocol's id and length checks, the variant's rules, the
# protocol's format reasons for the final object, then the value.
WORKED_REASONS = (verifier.UNDECODABLE_ID, verifier.STOPPED_AT_LENGTH, WORKING_TOO_LONG, NO_FINAL_OBJECT,
                  JSON_IN_WORKING, *verifier.FORMAT_REASONS, verifier.WRONG_VALUE)
CATEGORIES = ("correct", "wrong_step", "skipped_or_added", "miscopied_final", "direct", "malformed")

STEP = re.compile(r"(?<![\d.])(\d{1,9})[ \t]*([+-])[ \t]*(\d{1,9})[ \t]*=[ \t]*(-?\d{1,9})(?![\d.])")


@dataclass(frozen=True)
class Chain:
    """An opening stock and its signed movements (a delivery > 0, a withdrawal < 0), applied in order."""

    initial: int
    movements: tuple[int, ...]

    def __post_init__(self):
        self.validated()

    @classmethod
    def from_problem(cls, problem: Problem) -> "Chain":
        """The protocol's problem as a chain: its deliveries, then its withdrawals."""
        p = problem.validated()
        return cls(p.initial, (*p.deliveries, *(-w for w in p.withdrawals)))

    def levels(self) -> list[int]:
        levels, stock = [], self.initial
        for m in self.movements:
            stock += m
            levels.append(stock)
        return levels

    @property
    def target(self) -> int:
        return self.validated().levels()[-1]

    def validated(self) -> "Chain":
        """Self if well formed, else ValueError naming the rule."""
        if not isinstance(self.movements, tuple) or not 1 <= len(self.movements) <= MAX_MOVEMENTS:
            raise ValueError(f"a chain has a tuple of 1 to {MAX_MOVEMENTS} movements, got {self.movements!r}")
        for x in (self.initial, *self.movements):
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"a chain's numbers are integers, got {x!r}")
        if not 0 <= self.initial <= OOD_MAX or any(abs(m) > OOD_MAX for m in self.movements):
            raise ValueError(f"a chain's opening stock and movements lie within 0..{OOD_MAX}, got {self!r}")
        levels = [self.initial + sum(self.movements[:i + 1]) for i in range(len(self.movements))]
        if min(levels) < 0 or max(levels) > TARGET_MAX:
            raise ValueError(f"every stock level lies in 0..{TARGET_MAX}, got {levels} for {self!r}")
        return self

    def statement(self, item: str = "boxes") -> str:
        """The inventory-log statement (the protocol's third template, for any number of movements)."""
        moves = "; ".join(f"delivery +{m}" if m >= 0 else f"withdrawal -{-m}" for m in self.movements)
        return f"Inventory log for {item}: opening stock {self.initial}; {moves}. Give the closing stock."


@dataclass(frozen=True)
class Step:
    """One `a + b = c` or `a - b = c` of the working, as written (never evaluated as code)."""

    a: int
    sign: str
    b: int
    c: int

    @property
    def right(self) -> bool:
        return self.c == (self.a + self.b if self.sign == "+" else self.a - self.b)

    @property
    def movement(self) -> int:
        return self.b if self.sign == "+" else -self.b


@dataclass(frozen=True)
class WorkedVerdict:
    """reward (0 or 1), reason (None or one of WORKED_REASONS), the final object's `valid` and `value`
    (as the protocol's verifier reads it), the working's `steps`, `thinks`, `steps_right` (None when
    it does not think) and the response's `category` (CATEGORIES)."""

    reward: int
    reason: str | None
    valid: bool
    value: int | None
    steps: tuple[Step, ...]
    thinks: bool
    steps_right: bool | None
    category: str


def split_response(text: str) -> tuple[str, str] | None:
    """(working, final object text): the cut is the last "{"; None when the text has none."""
    cut = text.rfind("{")
    return None if cut < 0 else (text[:cut], text[cut:])


def read_steps(working: str) -> tuple[Step, ...]:
    """Every `a + b = c` or `a - b = c` in the working, in order."""
    return tuple(Step(int(a), sign, int(b), int(c)) for a, sign, b, c in STEP.findall(working))


def _chained(steps: tuple[Step, ...], chain: Chain) -> bool:
    """Each step starts from the previous result, the first from the opening stock."""
    starts = [chain.initial] + [s.c for s in steps[:-1]]
    return all(s.a == start for s, start in zip(steps, starts))


def classify(steps: tuple[Step, ...], chain: Chain, value: int | None, reason: str | None) -> str:
    """The response's category (module docstring), from its steps, its answer and its reason."""
    if reason not in (None, verifier.WRONG_VALUE):
        return "malformed"
    if not steps:
        return "direct"
    if not all(s.right for s in steps) or not _chained(steps, chain):
        return "wrong_step"
    if Counter(s.movement for s in steps) != Counter(chain.movements):
        return "skipped_or_added"
    if value != steps[-1].c:
        return "miscopied_final"
    return "correct"


def score_worked(text: str, finish_reason: str, chain: Chain | Problem, tokenization_valid: bool = True) -> WorkedVerdict:
    """Score one worked response against one chain (or protocol problem).  Never raises on any str;
    ValueError on a programming error (as `verifier.score`: non-str text, unknown finish_reason,
    non-bool tokenization_valid, malformed problem)."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if finish_reason not in verifier.FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {verifier.FINISH_REASONS}, got {finish_reason!r}")
    if not isinstance(tokenization_valid, bool):
        raise ValueError(f"tokenization_valid must be a bool, got {tokenization_valid!r}")
    chain = (Chain.from_problem(chain) if isinstance(chain, Problem) else chain).validated()
    parts = split_response(text)
    working, final = parts if parts is not None else (text, "")
    parsed = verifier.parse_answer(final) if parts is not None else verifier.ParsedAnswer(False, None, None)
    if not tokenization_valid:
        reason = verifier.UNDECODABLE_ID
    elif finish_reason != "eos":
        reason = verifier.STOPPED_AT_LENGTH
    elif len(working) > MAX_WORKING_CHARS:
        reason = WORKING_TOO_LONG
    elif parts is None:
        reason = NO_FINAL_OBJECT
    elif "{" in working or "}" in working:
        reason = JSON_IN_WORKING
    elif not parsed.valid:
        reason = parsed.reason
    elif parsed.value != chain.target:
        reason = verifier.WRONG_VALUE
    else:
        reason = None
    steps = read_steps(working[:MAX_WORKING_CHARS])
    thinks = bool(steps)
    steps_right = (all(s.right for s in steps) and _chained(steps, chain)) if thinks else None
    return WorkedVerdict(reward=int(reason is None), reason=reason, valid=parsed.valid, value=parsed.value,
                         steps=steps, thinks=thinks, steps_right=steps_right,
                         category=classify(steps, chain, parsed.value, reason))


def worked_text(chain: Chain) -> str:
    """The solver's worked answer: one right step per movement, then the object (a reference response)."""
    lines, stock = [], chain.initial
    for m in chain.movements:
        lines.append(f"{stock} {'+' if m >= 0 else '-'} {abs(m)} = {stock + m}")
        stock += m
    return "\n".join(lines) + f'\n{{"{verifier.FIELD}": {stock}}}'


def fresh_chains(k: int, count: int, seed: int, high: int = ID_MAX, exclude: frozenset = frozenset()) -> list[Chain]:
    """`count` distinct chains of k movements (k = 1 ... MAX_MOVEMENTS), operands in 0..high, drawn from
    `seed`: each movement 1..high, its sign drawn where the stock allows, every level in 0..TARGET_MAX.  A chain
    whose permutation key (opening stock, sorted deliveries, sorted withdrawals) is in `exclude` (the
    protocol's 1,400 problems' keys) is never drawn."""
    if not 1 <= k <= MAX_MOVEMENTS:
        raise ValueError(f"k must lie in 1..{MAX_MOVEMENTS}, got {k}")
    if count < 1 or not 1 <= high <= OOD_MAX:
        raise ValueError(f"count >= 1 and high in 1..{OOD_MAX}, got count={count}, high={high}")
    rng = random.Random(f"worked-chains/{seed}/{k}/{high}")
    out, seen = [], set()
    for _ in range(1000 * count):
        chain = random_chain(rng, k, high)
        if chain is None:
            continue
        key = chain_key(chain)
        if key in seen or key in exclude:
            continue
        seen.add(key)
        out.append(chain)
        if len(out) == count:
            return out
    raise ValueError(f"could not draw {count} distinct chains of {k} movements below {high}")


def random_chain(rng: random.Random, k: int, high: int) -> Chain | None:
    """One draw of a chain of k movements with operands in 0..high (each movement 1..high, its sign drawn
    where the stock allows), or None when a stock level would leave 0..TARGET_MAX (draw again)."""
    initial = rng.randint(0, high)
    stock, moves = initial, []
    for _ in range(k):
        amount = rng.randint(1, high)  # no 0: a movement of 0 would blur delivery and withdrawal in the key
        sign = rng.choice((1, -1)) if amount <= stock else 1
        if stock + sign * amount > TARGET_MAX:
            sign = -1 if amount <= stock else 1
        if not 0 <= stock + sign * amount <= TARGET_MAX:
            return None
        moves.append(sign * amount)
        stock += sign * amount
    return Chain(initial, tuple(moves))  # validated on construction


def chain_key(chain: Chain) -> tuple:
    """The permutation key, as `task.Problem.key` writes it for the protocol's problems."""
    return (chain.initial, tuple(sorted(m for m in chain.movements if m >= 0)),
            tuple(sorted(-m for m in chain.movements if m < 0)))
