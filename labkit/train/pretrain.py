"""Pretraining the tiny preset's base (`python -m labkit pretrain --preset tiny`), in two phases.

Phase 1, the corpus phase (this module): the language of the task and its arithmetic, from a
generated corpus.  On its own it leaves the base at chance on the statements (1.6% exact
answers): the loss is spent on predictable template words.  Phase 2, the answer phase
(`labkit.train.answer_phase`): statements followed by their answer, loss on the answer's digits
only, starting from phase 1's model.  Both phases write resumable states into
`<run>/states/` every few minutes; `python -m labkit pretrain --resume` continues exactly.

The corpus phase's stages, in the order the loop runs them:

1. the corpus: an endless document stream from `labkit.train.corpus`, every document
   checked against the 1,400 dataset problems before it is used;
2. packing: whole documents, first fit, into rows of `row_tokens` tokens,
   right-padded (labels -100).  Position ids restart at 0 with every document,
   which makes transformers build a block-diagonal causal mask: a document sees
   only itself, at the positions it has when the lab prompts the model alone;
3. the update: next-token cross-entropy over every real token, AdamW, linear
   warm-up then cosine decay, gradient-norm clipping;
4. the record: `corpus_log.jsonl` (loss and learning rate every `log_every` steps,
   held-out loss every `heldout_every`).  After phase 2: `log.jsonl` (its curve),
   `model.safetensors`, `config.json`, `manifest.json`, then the FINISHED marker.
   A finished base is not overwritten without `overwrite=True`.

Dropout is off (eval mode) throughout: the corpus never repeats a document, so
there is nothing to regularise, and the lab's later phases also run in eval mode.
Everything is deterministic from the two seeds on one CPU thread.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Iterable, Iterator

import torch

from ..config import AnswerPhaseConfig, PretrainConfig
from ..lab.runs import (FINISHED_MARKER, atomic_write_text, ensure_not_finished, jsonl_bytes, mark_finished, read_json,
                        sha256_file, write_json)
from ..lab.state import load_state, save_state
from ..models.presets import TINY_ARCH, TINY_BASE_DIR, load_state_into, new_tiny_model, parameter_digest, save_model
from ..models.tokenizer import load_tiny_tokenizer
from . import corpus as corpus_mod
from .answer_phase import run_answer_phase
from .schedule import lm_update, warmup_cosine


def lr_at(step: int, cfg: PretrainConfig) -> float:
    """Learning rate of update `step` (0-based): `schedule.warmup_cosine` down to final_lr_fraction x peak."""
    return warmup_cosine(step, cfg.steps, cfg.warmup_steps, cfg.peak_lr, floor_fraction=cfg.final_lr_fraction)


def tokenize_document(tokenizer, doc: corpus_mod.Document) -> tuple[list[int], list[int]]:
    """(ids, labels) of one document; a label is -100 where the token is a digit of a drawn operand.

    Drawn operands are uniform random draws: no model can predict them, and a loss on
    them only adds noise.  Digits are single tokens in Qwen's split, so a token is
    either wholly inside a drawn span or not.
    """
    encoded = tokenizer(doc.text, add_special_tokens=False, return_offsets_mapping=True)
    ids, labels = encoded["input_ids"], []
    for token_id, (start, end) in zip(ids, encoded["offset_mapping"]):
        drawn = doc.text[start:end].isdigit() and any(a <= start and end <= b for a, b in doc.drawn_spans)
        labels.append(-100 if drawn else token_id)
    return ids, labels


class TokenStream:
    """Documents of the corpus, checked, digested, counted and tokenized, one at a time."""

    def __init__(self, tokenizer, seed: int, forbidden: frozenset, max_tokens: int):
        self.tokenizer = tokenizer
        self.documents = iter(corpus_mod.CorpusGenerator(seed, forbidden))
        self.forbidden = forbidden
        self.max_tokens = max_tokens
        self.digest = corpus_mod.CorpusDigest()
        self.kinds: dict[str, int] = {}
        self.problems_checked = 0
        self.tokens = 0

    def __iter__(self) -> Iterator[tuple[list[int], list[int]]]:
        for doc in self.documents:
            # Stage 1: no dataset problem may be trained on, whatever the generator does.
            self.problems_checked += corpus_mod.check_disjoint([doc], self.forbidden)
            ids, labels = tokenize_document(self.tokenizer, doc)
            if len(ids) > self.max_tokens:
                raise ValueError(f"a {doc.kind} document has {len(ids)} tokens, more than a row's {self.max_tokens}")
            self.digest.update(doc)
            self.kinds[doc.kind] = self.kinds.get(doc.kind, 0) + 1
            self.tokens += len(ids)
            yield ids, labels


Doc = tuple[list[int], list[int]]  # (ids, labels) of equal length
Row = tuple[list[int], list[int], list[int]]  # (ids, labels, position ids) of equal length


def pack_rows(token_docs: Iterable[Doc], row_tokens: int, lookahead: int = 16) -> Iterator[Row]:
    """Whole documents packed into rows of at most `row_tokens` tokens, first fit over a small look-ahead.

    Deterministic; no document is split or dropped, only their order changes
    within the look-ahead window.  Position ids count from 0 in every document.
    """
    source = iter(token_docs)
    pending: list[Doc] = []
    while True:
        while len(pending) < lookahead:
            pending.append(next(source))
        ids: list[int] = []
        labels: list[int] = []
        positions: list[int] = []
        kept = []
        for doc_ids, doc_labels in pending:
            if len(ids) + len(doc_ids) <= row_tokens:
                ids.extend(doc_ids)
                labels.extend(doc_labels)
                positions.extend(range(len(doc_ids)))
            else:
                kept.append((doc_ids, doc_labels))
        pending = kept
        yield ids, labels, positions


def batch_tensors(rows: list[Row], row_tokens: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Model inputs {input_ids, labels, position_ids}, each (rows, row_tokens) int64, right-padded.

    Padding has label -100 and positions continuing the row's last document (it
    comes after every real token, so the causal mask keeps it unseen).  With
    `use_cache=False` and no attention mask, transformers reads the restarting
    position ids as packed sequences and masks attention between documents.
    """
    input_ids = torch.full((len(rows), row_tokens), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), row_tokens), -100, dtype=torch.long)
    position_ids = torch.zeros((len(rows), row_tokens), dtype=torch.long)
    for i, (ids, row_labels, positions) in enumerate(rows):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids)
        labels[i, :n] = torch.tensor(row_labels)
        position_ids[i, :n] = torch.tensor(positions)
        last = positions[-1] if positions else -1
        position_ids[i, n:] = torch.arange(last + 1, last + 1 + row_tokens - n)
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids, "use_cache": False}


def answer_probe(tokenizer, documents: list[corpus_mod.Document]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids (n, T), answer_mask (n, T)) for `answer_accuracy`: direct documents, right-padded.

    answer_mask marks the tokens of each document's answer number.
    """
    encoded = [tokenizer(d.text, add_special_tokens=False, return_offsets_mapping=True) for d in documents]
    width = max(len(e["input_ids"]) for e in encoded)
    input_ids = torch.full((len(documents), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(documents), width), dtype=torch.bool)
    for i, (doc, e) in enumerate(zip(documents, encoded)):
        input_ids[i, : len(e["input_ids"])] = torch.tensor(e["input_ids"])
        a, b = doc.answer_span
        for j, (start, end) in enumerate(e["offset_mapping"]):
            mask[i, j] = a <= start and end <= b and end > start
    return input_ids, mask


@torch.no_grad()
def answer_accuracy(model, input_ids: torch.Tensor, answer_mask: torch.Tensor) -> float:
    """Fraction of documents whose every answer token is the argmax of the model (teacher forcing).

    input_ids, answer_mask: (n, T).  The prediction for token t comes from position t-1.
    """
    predicted = model(input_ids=input_ids).logits[:, :-1].argmax(-1)  # (n, T-1)
    target, mask = input_ids[:, 1:], answer_mask[:, 1:]
    wrong = ((predicted != target) & mask).any(-1)
    return float((~wrong).float().mean())


@torch.no_grad()
def heldout_loss(model, batches: list[dict]) -> float:
    """Mean next-token cross-entropy over every trained token of the held-out batches."""
    total, count = 0.0, 0
    for batch in batches:
        n = int((batch["labels"][:, 1:] != -100).sum())
        total += float(model(**batch).loss) * n
        count += n
    return total / count


CORPUS_STATE_KIND = "labkit-pretrain-corpus-phase"
CORPUS_END_MODEL = "corpus-end.safetensors"  # in states/: the corpus phase's model, where the answer phase starts
CORPUS_END_RECORD = "corpus-end.json"  # in states/: what the corpus phase did (its manifest entries)


def _latest(state_dir: Path, prefix: str) -> Path | None:
    found = sorted(state_dir.glob(f"{prefix}-*.state"))
    return found[-1] if found else None


def corpus_probes(tokenizer, cfg: PretrainConfig, forbidden: frozenset) -> tuple[list[dict], tuple]:
    """(held-out batches, answer probe) of the corpus phase: neither is ever trained on.

    The held-out rows come from a second stream of the corpus (seed heldout_seed), the
    probe's direct answers from a third (seed heldout_seed + 1).
    """
    held = pack_rows(TokenStream(tokenizer, cfg.heldout_seed, forbidden, cfg.row_tokens), cfg.row_tokens)
    held_rows = [next(held) for _ in range(cfg.heldout_rows)]
    held_batches = [batch_tensors(held_rows[i : i + cfg.rows_per_step], cfg.row_tokens, tokenizer.pad_token_id)
                    for i in range(0, cfg.heldout_rows, cfg.rows_per_step)]
    probe_source = corpus_mod.CorpusGenerator(cfg.heldout_seed + 1, forbidden)
    probe = answer_probe(tokenizer, [probe_source.direct() for _ in range(cfg.probe_documents)])
    return held_batches, probe


def _restore_corpus_state(path: Path, cfg: PretrainConfig, model, optimizer) -> dict:
    """Load a corpus-phase state into `model` and `optimizer`; returns the state (step, log, elapsed_s, ...)."""
    state, _ = load_state(path)
    if state.get("kind") != CORPUS_STATE_KIND or state.get("config") != asdict(cfg):
        raise ValueError(f"{path} is not a state of this corpus phase (kind or config differs)")
    model.load_state_dict(state["model"], strict=True)
    optimizer.load_state_dict(state["optimizer"])
    return state


def corpus_record(stream: TokenStream, cfg: PretrainConfig, log: list[dict], wall_time_s: float,
                  initial_digest: str, model) -> dict:
    """What a finished corpus phase did: its corpus, loss curve and parameter digests (the manifest's entries)."""
    losses = [r for r in log if "loss" in r]
    return {
        "corpus": {
            "name": corpus_mod.CORPUS_NAME,
            "seed": cfg.corpus_seed,
            "documents": stream.digest.documents,
            "digest_sha256": stream.digest.hexdigest(),
            "kinds": dict(sorted(stream.kinds.items())),
            "tokens": stream.tokens,
            "problems_checked": stream.problems_checked,
            "dataset_problems_found": 0,  # check_disjoint raised otherwise
        },
        "steps": cfg.steps,
        "wall_time_s": round(wall_time_s, 1),
        "loss": {
            "first_logged": losses[0]["loss"],
            "final_logged": losses[-1]["loss"],
            "min_logged": min(r["loss"] for r in losses),
            "heldout_columns": ["step", "heldout_loss", "answer_accuracy"],
            "heldout": [[r["step"], round(r["heldout_loss"], 4), r["answer_accuracy"]] for r in log if "heldout_loss" in r],
        },
        "initial_parameter_digest": initial_digest,
        "parameter_digest": parameter_digest(model),
        "log": log,
    }


def run_corpus_phase(model, tokenizer, cfg: PretrainConfig, state_dir: Path, *, forbidden: frozenset,
                     resume_from: Path | None = None, progress: bool = True, stop_after: int | None = None,
                     state_every_s: float = 180.0) -> dict | None:
    """Stage 1-4 of the module docstring on `model`, in place; returns the phase's record.

    Every `state_every_s` seconds (at a log boundary) a state goes to
    `state_dir/corpus-<step>.state`; resuming from one replays the corpus stream up
    to that step (the stream is a pure function of its seed), so the run continues
    exactly.  With `stop_after`, it saves a state there and returns None.
    """
    from tqdm import tqdm

    stream = TokenStream(tokenizer, cfg.corpus_seed, forbidden, cfg.row_tokens)
    rows = pack_rows(stream, cfg.row_tokens)
    held_batches, probe = corpus_probes(tokenizer, cfg, forbidden)

    def measure() -> dict:
        return {"heldout_loss": heldout_loss(model, held_batches), "answer_accuracy": answer_accuracy(model, *probe)}

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.peak_lr, betas=(cfg.beta1, cfg.beta2),
                                  weight_decay=cfg.weight_decay)
    initial_digest = parameter_digest(model)
    start_step, spent = 0, 0.0
    if resume_from is not None:
        state = _restore_corpus_state(resume_from, cfg, model, optimizer)
        start_step, log, spent, initial_digest = state["step"], state["log"], state["elapsed_s"], state["initial_digest"]
        for _ in range(start_step * cfg.rows_per_step):  # replay the stream: same rows, same counters
            next(rows)
    else:
        log = [{"step": 0, **measure(), "elapsed_s": 0.0}]
    started = time.time() - spent
    last_save = time.time()
    window: list[float] = []
    last = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    bar = tqdm(range(start_step, last), desc="pretrain tiny: corpus phase", disable=not progress,
               initial=start_step, total=cfg.steps, mininterval=5)
    for step in bar:
        # Stage 3: one update on the next rows_per_step packed rows.
        batch = batch_tensors([next(rows) for _ in range(cfg.rows_per_step)], cfg.row_tokens, tokenizer.pad_token_id)
        loss, grad_norm = lm_update(model, optimizer, batch, lr_at(step, cfg), cfg.grad_clip)
        window.append(loss)

        # Stage 4: the record.
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            row = {"step": done, "lr": lr_at(step, cfg), "loss": sum(window) / len(window),
                   "grad_norm": grad_norm, "tokens": stream.tokens, "elapsed_s": round(time.time() - started, 1)}
            if done % cfg.heldout_every == 0 or done == cfg.steps:
                row.update(measure())
            log.append(row)
            window = []
            bar.set_postfix(loss=f"{row['loss']:.3f}")
            # States only at log boundaries (the loss window is empty), so a resumed log equals a continuous one.
            if time.time() - last_save > state_every_s or done == last:
                save_state(state_dir / f"corpus-{done:05d}.state",
                           {"kind": CORPUS_STATE_KIND, "config": asdict(cfg), "step": done, "log": log,
                            "elapsed_s": time.time() - started, "initial_digest": initial_digest,
                            "model": model.state_dict(), "optimizer": optimizer.state_dict()})
                last_save = time.time()
    if last < cfg.steps:
        return None
    return corpus_record(stream, cfg, log, time.time() - started, initial_digest, model)


def _corpus_config(cfg: PretrainConfig) -> dict:
    """The corpus phase's part of `cfg` (all but the answer phase's), as recorded in CORPUS_END_RECORD."""
    return {k: v for k, v in asdict(cfg).items() if k != "answer"}


def _load_finished_corpus_phase(model, cfg: PretrainConfig, state_dir: Path) -> dict:
    """On resume after phase 1: its recorded model into `model`, checked against its digest; returns its record."""
    record = read_json(state_dir / CORPUS_END_RECORD)
    if record["config"] != _corpus_config(cfg):
        raise ValueError(f"{state_dir / CORPUS_END_RECORD} was made with another corpus-phase config")
    if sha256_file(state_dir / CORPUS_END_MODEL) != record["model_sha256"]:
        raise ValueError(f"{state_dir / CORPUS_END_MODEL} does not match the digest recorded in "
                         f"{CORPUS_END_RECORD}: the file changed since the corpus phase wrote it")
    load_state_into(model, state_dir / CORPUS_END_MODEL)
    return record


def base_manifest(cfg: PretrainConfig, answer_cfg: AnswerPhaseConfig, corpus_record: dict, answer: dict,
                  model, model_path: Path) -> dict:
    """manifest.json of the finished base: both phases' records, the digests and the versions."""
    evals = [r for r in answer["log"] if r["kind"] == "eval"]
    return {
        "preset": "tiny",
        "command": "python -m labkit pretrain --preset tiny",
        "config": asdict(cfg),
        "architecture": {k: v for k, v in TINY_ARCH.items()},
        "corpus_phase": {k: v for k, v in corpus_record.items() if k not in ("config", "log")},
        "answer_phase": {
            "steps": answer_cfg.steps,
            "documents": answer["documents"],
            "problems_checked": answer["problems_checked"],
            "dataset_problems_found": 0,  # check_disjoint raised otherwise
            "wall_time_s": answer["wall_time_s"],
            "probe": {"documents": answer_cfg.probe_documents, "seed": answer_cfg.probe_seed,
                      "what": "fresh statements (none of the 1,400), the corpus's answer styles; "
                              "exact = greedy answer digits all right, teacher-forced on the statement"},
            "curve_columns": ["step", "minutes", "exact", "digits"],
            "curve": [[r["step"], r["minutes"], r["exact"], r["digits"]] for r in evals],
            "final_exact": evals[-1]["exact"],
        },
        # kept under the old keys too: chapter 2 and the tests read them
        "corpus": corpus_record["corpus"],
        "steps": corpus_record["steps"] + answer_cfg.steps,
        "wall_time_s": round(corpus_record["wall_time_s"] + answer["wall_time_s"], 1),
        "loss": corpus_record["loss"],
        "initial_parameter_digest": corpus_record["initial_parameter_digest"],
        "corpus_phase_parameter_digest": corpus_record["parameter_digest"],
        "parameter_digest": parameter_digest(model),
        "model_sha256": sha256_file(model_path),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
        "device": "cpu",
        "threads": cfg.threads,
    }


def pretrain(cfg: PretrainConfig = PretrainConfig(), out_dir: str | Path = TINY_BASE_DIR,
             overwrite: bool = False, progress: bool = True, resume: bool = False,
             stop_after: tuple[str, int] | None = None, state_every_s: float | None = None) -> dict | None:
    """Pretrain the tiny base (corpus phase, then answer phase) into `out_dir`; returns the manifest.

    resume: continue from the newest state in `out_dir/states/` (the corpus phase's, or,
    once it has finished, the answer phase's): the result equals an uninterrupted run.
    stop_after: ("corpus" | "answer", step): save a state there and return None (tests,
    or a planned pause).  state_every_s: seconds between states (default: the answer
    phase config's).
    """
    out_dir = ensure_not_finished(out_dir, overwrite)
    (out_dir / FINISHED_MARKER).unlink(missing_ok=True)  # an explicit overwrite un-finishes the run first
    state_dir = out_dir / "states"
    if not resume and state_dir.exists():
        for old in [*state_dir.glob("*.state"), state_dir / CORPUS_END_MODEL, state_dir / CORPUS_END_RECORD]:
            old.unlink(missing_ok=True)  # a fresh run never mixes with an earlier one's states
    state_dir.mkdir(parents=True, exist_ok=True)
    every = cfg.answer.state_every_s if state_every_s is None else state_every_s
    stop_phase, stop_step = stop_after if stop_after is not None else (None, None)
    if stop_phase not in (None, "corpus", "answer"):
        raise ValueError(f"stop_after phase {stop_phase!r}: expected 'corpus' or 'answer'")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        tokenizer = load_tiny_tokenizer()
        forbidden = corpus_mod.dataset_keys()
        model = new_tiny_model(cfg.seed, tokenizer).eval()

        # Phase 1: the corpus (skipped on resume once it has finished: its model is in states/).
        if resume and (state_dir / CORPUS_END_RECORD).is_file():
            corpus_record = _load_finished_corpus_phase(model, cfg, state_dir)
        else:
            corpus_record = run_corpus_phase(
                model, tokenizer, cfg, state_dir, forbidden=forbidden, progress=progress,
                resume_from=_latest(state_dir, "corpus") if resume else None,
                stop_after=stop_step if stop_phase == "corpus" else None, state_every_s=every)
            if corpus_record is None:
                return None
            save_model(model, state_dir / CORPUS_END_MODEL)
            corpus_record.update(config=_corpus_config(cfg), model_sha256=sha256_file(state_dir / CORPUS_END_MODEL))
            write_json(state_dir / CORPUS_END_RECORD, corpus_record)

        # Phase 2: dense answer-only practice (labkit.train.answer_phase).
        answer_cfg = cfg.answer if state_every_s is None else replace(cfg.answer, state_every_s=state_every_s)
        answer = run_answer_phase(
            model, tokenizer, answer_cfg, state_dir, forbidden=forbidden,
            minutes_before=corpus_record["wall_time_s"] / 60, progress=progress,
            resume_from=_latest(state_dir, "answer") if resume else None,
            stop_after=stop_step if stop_phase == "answer" else None)
        if answer["steps_done"] < answer_cfg.steps:
            return None

        # The record: the model and its logs first, the manifest, then the FINISHED marker.
        save_model(model, out_dir / "model.safetensors")
        atomic_write_text(out_dir / "config.json", model.config.to_json_string())
        atomic_write_text(out_dir / "corpus_log.jsonl", jsonl_bytes(corpus_record["log"]).decode())
        atomic_write_text(out_dir / "log.jsonl", jsonl_bytes(answer["log"]).decode())
        manifest = base_manifest(cfg, answer_cfg, corpus_record, answer, model, out_dir / "model.safetensors")
        write_json(out_dir / "manifest.json", manifest)
        mark_finished(out_dir, {"parameter_digest": manifest["parameter_digest"], "wall_time_s": manifest["wall_time_s"]})
        return manifest
    finally:
        torch.set_num_threads(threads_before)
