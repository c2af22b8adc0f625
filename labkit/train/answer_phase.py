"""The second phase of the tiny base's pretraining: dense, answer-only practice on statements.

Why a second phase.  After the corpus phase (`labkit.train.pretrain`) the base writes
the task's language fluently, but it gets only ~1.6% of held-out direct answers
exactly right: most of the corpus phase's loss is spent on predictable template
words, and reading five operands out of a sentence is the hard part (the same
model gets 27% on the bare equations).  This phase shows the model only
statements followed by their answer, in the corpus's own answer styles, and
takes the loss on the answer's digits alone: every gradient is about reading
and adding.  It starts from the corpus phase's model (from scratch it stays at
chance for minutes: the corpus phase is what lets it start).

What it learns from.  Half of its documents are the corpus's direct answers
(`corpus.DIRECT_ANSWER_STYLES`); the other half ask, in the lab's own instruction
template, for a JSON object with *another* key ("Reply with only a JSON object of the
form {"total": <integer>}.") and answer with that key.  So the base learns to write the
key it is asked for; the key `final_stock` never appears, and the warm start still
teaches the lab's exact format.  The loss covers the whole answer (its words, digits
and the end-of-turn token that the lab takes as EOS): a loss on the digits alone
taught the digits but not where an answer ends (the base then ran on with digits).

Resumable: a state (model, optimizer, the document generator's random state,
the log) is written every `state_every_s` seconds; resuming from it continues
bit for bit as if the run had not stopped (one thread).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..config import AnswerPhaseConfig
from ..lab.state import load_state, save_state
from ..task.problems import solve
from . import corpus as corpus_mod
from .schedule import lm_update, warmup_cosine

ANSWER_STATE_KIND = "labkit-pretrain-answer-phase"
# Keys of the keyed-JSON documents: never `final_stock` (checked below), some sharing its
# words, so that "write the key the instruction names" is the skill, not one key.
JSON_KEYS = ("answer", "stock", "total", "result", "count", "final_count", "final_total", "final_answer",
             "closing_stock", "stock_left", "end_stock", "remaining", "items_left", "final_value")
assert "final_stock" not in JSON_KEYS
KEYED_INSTRUCTION = "Reply with only a JSON object of the form {{\"{key}\": <integer>}}."


def lr_at(step: int, cfg: AnswerPhaseConfig) -> float:
    """Learning rate of update `step` (0-based): `schedule.warmup_cosine` from peak_lr down to final_lr."""
    return warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.peak_lr, floor=cfg.final_lr)


def keyed_document(source: corpus_mod.CorpusGenerator) -> corpus_mod.Document:
    """A chat: a statement, the lab's instruction template with another key, the answer with that key."""
    p = source.problem()
    key = source.rng.choice(JSON_KEYS)
    w = corpus_mod._Writer()
    w.write(corpus_mod.CHAT_USER)
    w.write(source.statement(p), drawn=True)
    w.write("\n" + KEYED_INSTRUCTION.format(key=key) + corpus_mod.CHAT_ASSISTANT + '{"' + key + '": ')
    answer_span = w.write(str(solve(p)))
    w.write("}" + corpus_mod.CHAT_END)
    return w.document("keyed", [p.key], answer_span)


def next_document(source: corpus_mod.CorpusGenerator, cfg: "AnswerPhaseConfig") -> corpus_mod.Document:
    """The answer phase's next document: keyed JSON with probability keyed_share, else a corpus direct answer."""
    return keyed_document(source) if source.rng.random() < cfg.keyed_share else source.direct()


def response_span(doc: corpus_mod.Document) -> tuple[int, int]:
    """Characters of the assistant's whole answer, up to and including its end-of-turn token."""
    start = doc.text.index(corpus_mod.CHAT_ASSISTANT) + len(corpus_mod.CHAT_ASSISTANT)
    end = doc.text.index("<|im_end|>", start) + len("<|im_end|>")
    return start, end


def answer_batch(tokenizer, documents: list[corpus_mod.Document], span: str = "response") -> dict[str, torch.Tensor]:
    """{input_ids, labels} (n, T) int64, right-padded: labels are -100 except on the answer's tokens.

    span: "response", the whole answer with its end-of-turn token (what the phase trains);
    "number", the answer's digits only (what the probe measures).

    Right padding needs no attention mask: every pad comes after every real token,
    so the causal mask keeps it unseen.
    """
    encoded = [tokenizer(d.text, add_special_tokens=False, return_offsets_mapping=True) for d in documents]
    width = max(len(e["input_ids"]) for e in encoded)
    input_ids = torch.full((len(documents), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(documents), width), -100, dtype=torch.long)
    for i, (doc, e) in enumerate(zip(documents, encoded)):
        ids = e["input_ids"]
        input_ids[i, : len(ids)] = torch.tensor(ids)
        a, b = doc.answer_span if span == "number" else response_span(doc)
        for j, (start, end) in enumerate(e["offset_mapping"]):
            if a <= start and end <= b and end > start:
                labels[i, j] = ids[j]
    return {"input_ids": input_ids, "labels": labels}


@torch.no_grad()
def digit_accuracy(model, tokenizer, documents: list[corpus_mod.Document]) -> dict:
    """Exact and per-digit accuracy of the model's argmax answers (teacher forcing on the statement).

    With every earlier answer digit given, "every answer token is the argmax" is
    exactly "greedy decoding writes the right number", so `exact` is the
    greedy direct-answer accuracy.  `digits[k]` is the accuracy of the k-th digit
    from the left, over the answers that have one.
    """
    batch = answer_batch(tokenizer, documents, span="number")
    predicted = model(input_ids=batch["input_ids"]).logits[:, :-1].argmax(-1)
    target = batch["labels"][:, 1:]
    mask = target != -100
    right = (predicted == target) | ~mask
    exact = right.all(-1)
    digits: list[list[int]] = []
    for i in range(len(documents)):
        positions = mask[i].nonzero().flatten().tolist()
        for k, pos in enumerate(positions):
            while len(digits) <= k:
                digits.append([0, 0])
            digits[k][0] += int(right[i, pos])
            digits[k][1] += 1
    return {"exact": float(exact.float().mean()), "documents": len(documents),
            "digits": [round(r / n, 4) for r, n in digits]}


def probe_documents(cfg: AnswerPhaseConfig, forbidden: frozenset) -> list[corpus_mod.Document]:
    """The fixed held-out statements: fresh problems (none of the 1,400), the corpus's answer styles."""
    source = corpus_mod.CorpusGenerator(cfg.probe_seed, forbidden)
    return [source.direct() for _ in range(cfg.probe_documents)]


def run_answer_phase(model, tokenizer, cfg: AnswerPhaseConfig, state_dir: Path, *, forbidden: frozenset,
                     minutes_before: float, resume_from: Path | None = None, progress: bool = True,
                     stop_after: int | None = None) -> dict:
    """Train `model` in place through the answer phase.

    Returns {"log", "wall_time_s", "steps_done", "problems_checked", "documents", "config"}.

    minutes_before: CPU minutes already spent (the corpus phase), so the log's
    `minutes` column is the whole recipe's time.  Every `state_every_s` seconds
    (and at `stop_after`) a state goes to `state_dir/answer-<step>.state`.
    """
    from tqdm import tqdm

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2),
                                  weight_decay=cfg.weight_decay)
    stream = corpus_mod.CorpusGenerator(cfg.seed, forbidden)
    probe = probe_documents(cfg, forbidden)
    start_step, log, spent, problems_checked = 0, [], 0.0, 0
    if resume_from is not None:
        state, _ = load_state(resume_from)
        if state.get("kind") != ANSWER_STATE_KIND or state.get("config") != asdict(cfg):
            raise ValueError(f"{resume_from} is not a state of this answer phase (kind or config differs)")
        model.load_state_dict(state["model"], strict=True)
        optimizer.load_state_dict(state["optimizer"])
        stream.rng.setstate(state["stream_rng"])
        start_step, log, spent = state["step"], state["log"], state["elapsed_s"]
        problems_checked = state.get("problems_checked", 0)

    def measure(step: int, elapsed: float) -> dict:
        acc = digit_accuracy(model, tokenizer, probe)
        return {"step": step, "minutes": round(minutes_before + elapsed / 60, 2), "exact": acc["exact"],
                "digits": acc["digits"]}

    def save(step: int, elapsed: float) -> Path:
        path = state_dir / f"answer-{step:05d}.state"
        save_state(path, {"kind": ANSWER_STATE_KIND, "config": asdict(cfg), "step": step, "log": log,
                          "elapsed_s": elapsed, "problems_checked": problems_checked, "model": model.state_dict(),
                          "optimizer": optimizer.state_dict(), "stream_rng": stream.rng.getstate()})
        return path

    if not log:
        log.append({**measure(0, 0.0), "kind": "eval"})
    started = time.time() - spent
    last_save = time.time()
    window: list[float] = []
    last = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    bar = tqdm(range(start_step, last), desc="pretrain tiny: answer phase", disable=not progress,
               initial=start_step, total=cfg.steps, mininterval=5)
    for step in bar:
        documents = [next_document(stream, cfg) for _ in range(cfg.documents_per_step)]
        # none of the 1,400 problems, whatever the generator does
        problems_checked += corpus_mod.check_disjoint(documents, forbidden)
        loss, _ = lm_update(model, optimizer, answer_batch(tokenizer, documents), lr_at(step, cfg), cfg.grad_clip)
        window.append(loss)
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            log.append({"kind": "train", "step": done, "lr": lr_at(step, cfg), "loss": sum(window) / len(window)})
            window = []
        if done % cfg.eval_every == 0 or done == cfg.steps:
            row = {**measure(done, time.time() - started), "kind": "eval"}
            log.append(row)
            bar.set_postfix(exact=f"{row['exact']:.3f}")
        # States only at log boundaries, so a resumed run's log equals a continuous run's.
        if (done % cfg.log_every == 0 and time.time() - last_save > cfg.state_every_s) or done == last:
            save(done, time.time() - started)
            last_save = time.time()
    return {"log": log, "wall_time_s": round(time.time() - started, 1), "steps_done": last,
            "problems_checked": problems_checked, "documents": last * cfg.documents_per_step, "config": asdict(cfg)}
