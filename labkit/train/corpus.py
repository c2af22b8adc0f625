"""The tiny base's pretraining corpus: the language and arithmetic of the task, not its format.

The corpus is generated from a seed and contains none of the 1,400
StockArithmetic-v1 problems (compared under the permutation key, so no
re-ordering of a dataset problem slips in either).  It is chosen so that the
warm start still has something to teach:

- it knows the statements: the task's own `TEMPLATES` (and a few variants)
  with fresh random operands, in the same ChatML prompt the lab uses;
- it knows the arithmetic: direct answers, running totals, bare equations of
  the same shape (initial + d1 + d2 - w1 - w2) and single sums / differences;
- it never answers `{"final_stock": N}`: its instructions are not the lab's
  `FORMAT_INSTRUCTION`, and its answers are sentences, bare numbers, or JSON
  with other keys (`answer`, `stock`).  The key `final_stock` never appears.

So the base computes stocks but answers in the wrong format; the 48 warm-start
updates teach the format, and what the base knows carries over.

Every document is one string holding its special tokens (`<|im_start|>`,
`<|im_end|>`, `<|endoftext|>`) as text; the tokenizer maps them to their ids.
Every document ends with `<|endoftext|>`, which separates it from the next one
when documents are packed into training rows.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Iterator

from ..config import CORPUS_SEED
from ..models.tokenizer import ENDOFTEXT
from ..task.problems import DEFAULT_SEED, ID_MAX, ITEMS, OOD_MAX, Problem, TEMPLATES, generate_dataset, solve

CORPUS_NAME = "tiny-pretraining-corpus-v1"

# (instruction, answer format).  Never the lab's FORMAT_INSTRUCTION, never the key
# `final_stock`: the base must not already answer in the lab's exact format.
DIRECT_ANSWER_STYLES = (
    ("Reply with only a JSON object.", '{{"answer": {n}}}'),
    ("Answer in JSON.", '{{"stock": {n}}}'),
    ("Answer in one short sentence.", "The final stock is {n}."),
    ("Give only the number.", "{n}"),
    ("", "The final stock is {n}."),  # no instruction at all
)
WORKED_INSTRUCTION = "Work it out step by step."

# Variants of the task's statements (the task's own TEMPLATES are used too, more often).
EXTRA_TEMPLATES = (
    "There are {initial} {item} in the store room. {d1} more arrive, then {d2} more. "
    "Later {w1} are sent away and then {w2}. How many {item} are left?",
    "Start: {initial} {item}. In: {d1}, {d2}. Out: {w1}, {w2}. What is the stock at the end?",
)
EXTRA_ITEMS = ("cups", "pens", "tables", "bags", "coats", "plates")

# Share of each document kind.
# Running totals and single sums are the easier skills (copying a number, one
# operation) that the direct answer is built from; they are a good share of it.
KIND_WEIGHTS = (
    ("direct", 0.45),  # chat: statement + other instruction -> answer in another format
    ("worked", 0.25),  # chat or plain text: running totals, then the answer as a sentence
    ("equations", 0.15),  # plain lines: "a + b + c - d - e = n"
    ("sums", 0.15),  # plain lines: "a + b = n", "a - b = n"
)
OOD_SHARE = 0.15  # problems with operands up to 100, so three-digit stocks are not unknown


@dataclass
class Document:
    """One corpus document.

    kind:         "direct", "worked", "equations" or "sums"
    text:         the document, special tokens written as text, ending with `<|endoftext|>`
    keys:         permutation keys of the problems it states (checked against the dataset)
    drawn_spans:  character ranges holding randomly drawn operands: their digits cannot
                  be predicted, so pretraining takes no loss on them (only noise to learn)
    answer_span:  character range of the final answer's number (direct documents), for
                  measuring the answers a model gets right
    """

    kind: str
    text: str
    keys: list[tuple] = field(default_factory=list)
    drawn_spans: list[tuple[int, int]] = field(default_factory=list)
    answer_span: tuple[int, int] | None = None


class _Writer:
    """Builds a document piece by piece, remembering where the drawn operands are."""

    def __init__(self):
        self.parts: list[str] = []
        self.length = 0
        self.drawn: list[tuple[int, int]] = []

    def write(self, text: str, drawn: bool = False) -> tuple[int, int]:
        span = (self.length, self.length + len(text))
        if drawn:
            self.drawn.append(span)
        self.parts.append(text)
        self.length += len(text)
        return span

    def document(self, kind: str, keys: list[tuple] = (), answer_span=None) -> Document:
        return Document(kind, "".join(self.parts), list(keys), self.drawn, answer_span)


def dataset_keys(seed: int = DEFAULT_SEED) -> frozenset:
    """Permutation keys of all 1,400 StockArithmetic-v1 problems (every split)."""
    return frozenset(Problem.from_dict(r["problem"]).key for r in generate_dataset(seed))


CHAT_USER = "<|im_start|>user\n"
CHAT_ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n"
CHAT_END = "<|im_end|>\n" + ENDOFTEXT
# One conversation in ChatML as the tiny tokenizer's chat template renders it (no system
# prompt), then <|endoftext|>: CHAT_USER + user + CHAT_ASSISTANT + answer + CHAT_END.  The
# part up to CHAT_ASSISTANT is, token for token, the prompt the lab builds with
# apply_chat_template(..., add_generation_prompt=True).


class CorpusGenerator:
    """An endless, deterministic stream of documents from one seed.

    Problems whose permutation key belongs to the dataset are never drawn:
    `forbidden` holds those keys, and every problem is checked against it.
    """

    def __init__(self, seed: int = CORPUS_SEED, forbidden: frozenset | None = None):
        self.rng = random.Random(seed)
        self.forbidden = dataset_keys() if forbidden is None else forbidden
        self.templates = TEMPLATES + TEMPLATES + EXTRA_TEMPLATES  # task templates twice as likely
        self.items = ITEMS + EXTRA_ITEMS

    # -- drawing ----------------------------------------------------------------
    def problem(self) -> Problem:
        """A valid problem that is not in the dataset (rejection sampling)."""
        top = OOD_MAX if self.rng.random() < OOD_SHARE else ID_MAX
        while True:
            values = [self.rng.randint(0, top) for _ in range(5)]
            p = Problem(values[0], (values[1], values[2]), (values[3], values[4]))
            if min(p.stock_levels()) >= 0 and p.key not in self.forbidden:
                return p

    def statement(self, p: Problem) -> str:
        d1, d2 = p.deliveries
        w1, w2 = p.withdrawals
        template = self.rng.choice(self.templates)
        return template.format(initial=p.initial, d1=d1, d2=d2, w1=w1, w2=w2, item=self.rng.choice(self.items))

    # -- the four kinds -------------------------------------------------------------
    def direct(self) -> Document:
        """A chat: statement + another instruction -> the stock in another format."""
        p = self.problem()
        instruction, answer = self.rng.choice(DIRECT_ANSWER_STYLES)
        before, after = answer.split("{n}")
        w = _Writer()
        w.write(CHAT_USER)
        w.write(self.statement(p), drawn=True)
        w.write("\n" + instruction if instruction else "")
        w.write(CHAT_ASSISTANT + before.format())  # format() turns the template's {{ }} into { }
        answer_span = w.write(str(solve(p)))
        w.write(after.format() + CHAT_END)
        return w.document("direct", [p.key], answer_span)

    def worked(self) -> Document:
        """The statement, then the running totals and the stock as a sentence (chat or plain text)."""
        p = self.problem()
        steps = [f"Start with {p.initial}."]
        movements = [("+", d) for d in p.deliveries] + [("-", w) for w in p.withdrawals]
        before = p.initial
        for (sign, amount), after in zip(movements, p.stock_levels()):
            steps.append(f"{before} {sign} {amount} = {after}.")
            before = after
        steps.append(f"The final stock is {solve(p)}.")
        w = _Writer()
        if self.rng.random() < 0.5:
            w.write(CHAT_USER)
            w.write(self.statement(p), drawn=True)
            w.write("\n" + WORKED_INSTRUCTION + CHAT_ASSISTANT + " ".join(steps) + CHAT_END)
        else:
            w.write(self.statement(p), drawn=True)
            w.write("\n" + " ".join(steps) + ENDOFTEXT)
        return w.document("worked", [p.key])

    def equations(self, count: int = 6) -> Document:
        """Bare equations of the task's shape: initial + d1 + d2 - w1 - w2 = stock."""
        problems = [self.problem() for _ in range(count)]
        w = _Writer()
        for i, p in enumerate(problems):
            w.write("\n" if i else "")
            w.write(f"{p.initial} + {p.deliveries[0]} + {p.deliveries[1]} - {p.withdrawals[0]} - {p.withdrawals[1]}",
                    drawn=True)
            w.write(f" = {solve(p)}")
        w.write(ENDOFTEXT)
        return w.document("equations", [p.key for p in problems])

    def sums(self, count: int = 10) -> Document:
        """Single sums and differences (never negative, as stocks)."""
        w = _Writer()
        for i in range(count):
            a, b = self.rng.randint(0, 150), self.rng.randint(0, 100)
            if self.rng.random() < 0.5:
                sign, result = "+", a + b
            else:
                a, b = max(a, b), min(a, b)
                sign, result = "-", a - b
            w.write("\n" if i else "")
            w.write(f"{a} {sign} {b}", drawn=True)
            w.write(f" = {result}")
        w.write(ENDOFTEXT)
        return w.document("sums")

    def document(self) -> Document:
        kinds, weights = zip(*KIND_WEIGHTS)
        kind = self.rng.choices(kinds, weights)[0]
        return getattr(self, kind)()

    def __iter__(self) -> Iterator[Document]:
        while True:
            yield self.document()


def generate(count: int, seed: int = CORPUS_SEED) -> list[Document]:
    """The first `count` documents of the corpus with this seed."""
    stream = iter(CorpusGenerator(seed))
    return [next(stream) for _ in range(count)]


def check_disjoint(documents, forbidden: frozenset | None = None) -> int:
    """Raise ValueError if any document holds a dataset problem; return the number of problems checked."""
    forbidden = dataset_keys() if forbidden is None else forbidden
    checked = 0
    for index, doc in enumerate(documents):
        for key in doc.keys:
            if key in forbidden:
                raise ValueError(
                    f"corpus document {index} ({doc.kind}) holds the StockArithmetic-v1 problem {key}; "
                    "the pretraining corpus must contain none of the 1,400 problems (permutation key)"
                )
            checked += 1
    return checked


class CorpusDigest:
    """SHA-256 over the documents' texts in order (one separator byte between them)."""

    def __init__(self):
        self._h = hashlib.sha256()
        self.documents = 0

    def update(self, doc: Document) -> None:
        self._h.update(doc.text.encode("utf-8") + b"\x00")
        self.documents += 1

    def hexdigest(self) -> str:
        return self._h.hexdigest()
