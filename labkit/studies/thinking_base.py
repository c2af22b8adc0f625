"""Thinking bases (issue 41, chapter 11): bases that can work a problem out, and that rarely do.

    python -m labkit thinking-bases --preset tiny        # -> runs/tiny/thinking/<name>/

Why.  R1-Zero asks whether RL from a base *creates* a behaviour or *selects* one the base
already shows.  The source design answers it with bases that "rarely write a reasoning chain, but
write it correctly when they do": a first continued pretraining in which half of the documents
hold a worked answer teaches the skill, and a second in which working is rare (0%, 2%, 10% of the
worked-prompt documents) makes the behaviour rare while the skill stays.  A control never learns
the skill.  The committed tiny base cannot serve as is: it answers directly every time, and a short
fine-tune on worked answers teaches it the layout but not the arithmetic (book/instructor.md,
"Chapter 11's bases").

The documents (every problem fresh: none of the protocol's 1,400 under the permutation key, none
of the held-out chains that measure the bases and train GRPO):

* "worked": the worked prompt (`think_profile.worked_prompt_ids`: a chain's statement and
  `worked.WORKED_INSTRUCTION`) answered with the solver's working (`worked.worked_text`);
* "worked_direct": the same prompt answered with the object alone, `{"final_stock": N}`;
* the base's own answer-phase mix (`labkit.train.answer_phase`): the protocol's statements answered
  directly in other formats, so the base's direct skill stays.

Chat documents take their loss on the answer only, plain ones on every token but the drawn
operands; documents are packed whole into rows (`pretrain.pack_rows`: position ids restart with
every document, so a document sees only itself).  What was tried beside this mix (a quarter of
the documents single steps "a + b = c"; every number of the working in three digits) taught the
form of working and not its substance; book/instructor.md says what each change did.

The bases (`BASES`): "skill" (phase 1 from the committed base: half the documents worked);
"rare_0", "rare_2", "rare_10" (phase 2 from "skill": worked-prompt documents answered with
working at 0%, 2%, 10%, the rest directly); "control" (phase 2 at 0% from the committed base: it
never saw a worked answer).  Each is measured every `measure_every` updates on the validation
chains (`think_profile`), and its final profile on the test chains at temperature 1 is committed
(`profile.json.gz`, with every response).

Files of each base: `model.safetensors` (committed for rare_0, rare_2 and control, which chapter 11's
live run starts from; local for the skill base and rare_10: its digest is in the manifest, and
`python -m labkit cache fill` rebuilds it), `log.json`, `profile.json.gz` (rows and per-k table), `manifest.json`, FINISHED.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..lab import skeleton
from ..lab import state as state_lib
from ..lab.runs import REPO_ROOT, RunFolder, atomic_write_bytes, preset_folder, sha256_file, read_json, write_json
from ..lab.skeleton import Autosave, DeferredInterrupt, holding, refuse_earlier_attempt, whole_write
from ..lab.runtime import code_digests, deterministic, environment, seed_everything
from ..task import problems, worked
from ..config import ReasoningConfig, ThinkingBaseConfig, ThinkingPhase
from ..models import presets
from ..train import answer_phase
from ..train import corpus as corpus_mod
from ..train.pretrain import batch_tensors, pack_rows, tokenize_document
from ..train.schedule import lm_update, warmup_cosine
from ..eval import think_profile

MODEL_FILE = "model.safetensors"
OOD_SHARE = 0.15  # chains with operands up to OOD_MAX, as the corpus's problems
# The held-out chains (seeds of worked.fresh_chains): validation measures the bases while they train,
# test is the think profile every chapter-11 table reads, train is GRPO's prompt pool.
VALIDATION_SEED, TEST_SEED, TRAIN_SEED = 410, 411, 412
PROFILE_CHAINS_PER_K = 25  # test: 25 chains x 8 values of k x `profile_draws` draws
MEASURE_CHAINS_PER_K = 12  # validation, while training


BASES = tuple(p.name for p in ThinkingBaseConfig().phases)


def held_out_chains(seed: int, per_k: int) -> dict[int, list[worked.Chain]]:
    """{k: chains} for k = 1 ... 8, ID magnitudes, none of the protocol's problems."""
    forbidden = corpus_mod.dataset_keys()
    return {k: worked.fresh_chains(k, per_k, seed, exclude=forbidden) for k in range(1, worked.MAX_MOVEMENTS + 1)}


def held_out_keys() -> frozenset:
    """Permutation keys of every held-out chain (validation, test, GRPO's pool): never in a document."""
    keys = set()
    for seed, per_k in ((VALIDATION_SEED, MEASURE_CHAINS_PER_K), (TEST_SEED, PROFILE_CHAINS_PER_K),
                        (TRAIN_SEED, TRAIN_CHAINS_PER_K)):
        keys.update(worked.chain_key(c) for chains in held_out_chains(seed, per_k).values() for c in chains)
    return frozenset(keys)


TRAIN_CHAINS_PER_K = ReasoningConfig.train_chains_per_k  # GRPO's pool: 800 chains


class DocumentStream:
    """The phase's documents, drawn from one seed; no chain among `forbidden` keys."""

    def __init__(self, cfg: ThinkingBaseConfig, phase: ThinkingPhase, seed: int, forbidden: frozenset):
        self.cfg, self.phase, self.forbidden = cfg, phase, forbidden
        self.rng = random.Random(seed)
        self.source = corpus_mod.CorpusGenerator(seed + 1, forbidden)  # the answer phase's documents
        self.counts: dict[str, int] = {}

    def chain(self) -> worked.Chain:
        k = self.rng.randint(1, worked.MAX_MOVEMENTS)
        high = problems.OOD_MAX if self.rng.random() < OOD_SHARE else problems.ID_MAX
        while True:
            chain = worked.random_chain(self.rng, k, high)
            if chain is not None and worked.chain_key(chain) not in self.forbidden:
                return chain

    def worked_document(self, thinking: bool) -> corpus_mod.Document:
        chain = self.chain()
        w = corpus_mod._Writer()
        w.write(corpus_mod.CHAT_USER)
        w.write(chain.statement(think_profile.ITEM), drawn=True)
        w.write("\n" + worked.WORKED_INSTRUCTION + corpus_mod.CHAT_ASSISTANT)
        w.write((worked.worked_text(chain) if thinking else f'{{"final_stock": {chain.target}}}') + corpus_mod.CHAT_END)
        return w.document("worked" if thinking else "worked_direct")

    def next(self) -> corpus_mod.Document:
        u = self.rng.random()
        if u < self.cfg.worked_prompt_share:
            doc = self.worked_document(self.rng.random() < self.phase.thinking_share)
        else:
            doc = answer_phase.keyed_document(self.source) if self.rng.random() < 0.5 else self.source.direct()
        self.counts[doc.kind] = self.counts.get(doc.kind, 0) + 1
        return doc


def document_tokens(tokenizer, doc: corpus_mod.Document) -> tuple[list[int], list[int]]:
    """(ids, labels): a chat's loss on its answer only (`answer_phase.answer_batch`), a plain document's on
    every token but its drawn operands (`pretrain.tokenize_document`)."""
    if corpus_mod.CHAT_ASSISTANT not in doc.text:
        return tokenize_document(tokenizer, doc)
    batch = answer_phase.answer_batch(tokenizer, [doc])
    return batch["input_ids"][0].tolist(), batch["labels"][0].tolist()


def fitting(doc: tuple[list[int], list[int]], row_tokens: int) -> tuple[list[int], list[int]]:
    """The document, refused when longer than a row: `pretrain.pack_rows` would keep it waiting forever,
    and once its look-ahead held only such documents every row would be empty (a loss of 0 / 0)."""
    if len(doc[0]) > row_tokens:
        raise ValueError(f"a document of {len(doc[0])} tokens does not fit a row of row_tokens={row_tokens}")
    return doc


def measure(model, tokenizer, chains: dict[int, list[worked.Chain]], draws: int, seed: int) -> tuple[dict, list[dict]]:
    """(summary, rows): the think profile at temperature 1, and the share of written steps that are right."""
    rows = think_profile.sample_worked(model, tokenizer, chains, draws=draws, seed=seed)
    table = think_profile.profile(rows)
    thinking = [r for r in rows if r["thinks"]]
    summary = {"responses": len(rows), "think_rate": len(thinking) / len(rows),
               "accuracy": sum(r["reward"] for r in rows) / len(rows),
               "steps_right": (sum(bool(r["steps_right"]) for r in thinking) / len(thinking)) if thinking else None,
               "per_k": {str(k): {n: v[n] for n in ("think_rate", "accuracy", "accuracy_thinking", "accuracy_direct")}
                         for k, v in table.items()}}
    return summary, rows


class PhaseRun:
    """One phase of continued pretraining in progress: the model, its AdamW, the document rows, the log.
    Everything a resumed run needs is in `capture()`; the rows are not saved but replayed (the stream is
    one seeded generator: the same rows come back in the same order, and the documents' counts with them)."""

    def __init__(self, model, tokenizer, cfg: ThinkingBaseConfig, phase: ThinkingPhase, index: int,
                 watch: Path | None = None):
        self.model, self.tokenizer, self.cfg, self.phase, self.watch = model, tokenizer, cfg, phase, watch
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=phase.peak_lr, betas=(cfg.beta1, cfg.beta2),
                                           weight_decay=cfg.weight_decay)
        self.stream = DocumentStream(cfg, phase, cfg.seed + index, corpus_mod.dataset_keys() | held_out_keys())
        self.rows = pack_rows((fitting(document_tokens(tokenizer, self.stream.next()), cfg.row_tokens)
                               for _ in iter(int, 1)), cfg.row_tokens)
        self.validation = held_out_chains(VALIDATION_SEED, MEASURE_CHAINS_PER_K)
        self.log: list[dict] = []
        self.window: list[float] = []  # the training losses since the last "train" line
        self.done = 0  # updates done

    def logged(self, row: dict) -> dict:
        self.log.append(row)
        if self.watch is not None:
            with open(self.watch, "a") as f:
                f.write(json.dumps(row) + "\n")
        return row

    def measure_now(self) -> dict:
        return self.logged({"kind": "measure", "step": self.done,
                            **measure(self.model, self.tokenizer, self.validation, 2, VALIDATION_SEED)[0]})

    def update(self) -> dict | None:
        """One update; returns the measure line when one was due."""
        cfg, phase = self.cfg, self.phase
        batch = batch_tensors([next(self.rows) for _ in range(cfg.rows_per_step)], cfg.row_tokens,
                              self.tokenizer.pad_token_id)
        lr = warmup_cosine(self.done, phase.steps, cfg.warmup_steps, phase.peak_lr,
                           floor_fraction=phase.final_lr / phase.peak_lr)
        loss, _ = lm_update(self.model, self.optimizer, batch, lr, cfg.grad_clip)
        if not math.isfinite(loss):
            raise FloatingPointError(f"thinking base {phase.name}: loss {loss} at update {self.done + 1}; nothing saved")
        self.window.append(loss)
        self.done += 1
        if self.done % 50 == 0:
            self.logged({"kind": "train", "step": self.done, "loss": sum(self.window) / len(self.window), "lr": lr})
            self.window = []
        if self.done % cfg.measure_every == 0 or self.done == phase.steps:
            return self.measure_now()
        return None

    def capture(self, identity: dict) -> dict:
        return state_lib.capture_state(
            model=self.model, optimizer=self.optimizer, scheduler={"updates_done": self.done, "total": self.phase.steps},
            data_order={"rows_taken": self.done * self.cfg.rows_per_step, "documents": dict(self.stream.counts)},
            generators={}, history=self.log, consumed_ids=[], identity=identity,
            progress={"updates_done": self.done, "window": list(self.window)})

    def restore(self, path: Path, identity: dict) -> None:
        """Continue from a state of the same base: the weights, AdamW, the log, and the rows replayed to where
        the state was taken (checked against the documents' counts it recorded)."""
        saved, _ = state_lib.load_state(path)
        if saved["identity"] != identity:
            diff = sorted(k for k in identity if saved["identity"].get(k) != identity[k])
            raise ValueError(f"{path} belongs to another thinking base or setting: identity fields {diff} differ")
        plain = state_lib.restore_state(saved, model=self.model, optimizer=self.optimizer, generators={})
        self.done, self.window, self.log = plain["progress"]["updates_done"], plain["progress"]["window"], plain["history"]
        for _ in range(plain["data_order"]["rows_taken"]):
            next(self.rows)
        if self.stream.counts != plain["data_order"]["documents"]:
            raise ValueError(f"{path}: replaying the documents gave {self.stream.counts}, the state recorded "
                             f"{plain['data_order']['documents']}: the stream is not the one the state was taken in")
        if self.watch is not None:  # the partial log holds what the state holds, no more
            atomic_write_bytes(self.watch, "".join(json.dumps(row) + "\n" for row in self.log).encode())


def train_phase(model, tokenizer, cfg: ThinkingBaseConfig, phase: ThinkingPhase, index: int, progress: bool = True,
                watch: Path | None = None) -> dict:
    """Continue pretraining `model` in place through one phase, start to end in one go (no folder, no
    states: `build_base` is the resumable run); returns {"log", "counts", "steps"}.
    watch: a file that gets each log line as it comes (to follow a run in a worker process)."""
    run = PhaseRun(model, tokenizer, cfg, phase, index, watch)
    model.eval()  # no dropout, as every phase of the lab (labkit.studies.format_base says why)
    run.measure_now()
    while run.done < phase.steps:
        run.update()
    return {"log": run.log, "steps": phase.steps, "counts": dict(run.stream.counts)}


def newest_state(folder: RunFolder) -> Path | None:
    """The folder's state of the most updates that its ledger lists, or None."""
    listed = [name for name in folder.ledger()["files"] if name.startswith("states/update-")]
    paths = [folder / name for name in listed if (folder / name).is_file()]
    return max(paths, key=lambda p: int(p.name.split("-")[1].split(".")[0])) if paths else None


def _earlier_attempt(folder: RunFolder) -> str | None:
    """What an unfinished attempt left in the folder (None: nothing)."""
    newest = newest_state(folder)
    if newest is not None:
        return f"a state after {int(newest.name.split('-')[1].split('.')[0])} updates"
    if (folder / "log.partial.jsonl").is_file() or (folder / MODEL_FILE).is_file():
        return "a partial log and no state"
    return None


def default_run_dir(preset: str, name: str) -> Path:
    return preset_folder(preset, "thinking") / name


def start_file(preset: str, phase: ThinkingPhase) -> Path:
    """The model a phase continues: the committed base, or another thinking base (finished, digest checked)."""
    if phase.start == "committed":
        return presets.TINY_BASE_STATE
    folder = RunFolder(default_run_dir(preset, phase.start))
    folder.manifest()  # refuses a base that is missing, unfinished, edited or damaged
    folder.check_file(MODEL_FILE)
    return folder / MODEL_FILE


def build_base(name: str, preset: str = "tiny", cfg: ThinkingBaseConfig | None = None, *, overwrite: bool = False,
               resume: bool = False, restart: bool = False, stop_after: int | None = None,
               progress: bool = True) -> dict:
    """One thinking base: its phase from its start model, then its test profile; returns the manifest (or,
    when it stopped early, {"stopped_after": updates, "state": path}).

    The run's life is every training run's (`labkit.lab.skeleton`): the folder is held by this process; a
    state is saved every `skeleton.AUTOSAVE_SECONDS` and when Ctrl-C asks to stop (the run then stops after
    the update it is in, naming the command that continues); a folder holding an unfinished attempt is
    refused unless `resume` (continue from its newest state: the same base, bit for bit) or `restart`
    (delete it); a finished base is refused unless `overwrite`.  stop_after: stop after this many updates,
    with a state, as a Ctrl-C would (tests)."""
    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: only the tiny base is pretrained by the lab")
    cfg = cfg or ThinkingBaseConfig()
    phase = cfg.phase(name)
    if stop_after is not None and not 1 <= stop_after < phase.steps:
        raise ValueError(f"stop_after {stop_after}: an update count in 1..{phase.steps - 1} (the phase has {phase.steps})")
    index = [p.name for p in cfg.phases].index(name)
    source = start_file(preset, phase)
    folder = RunFolder(default_run_dir(preset, name))
    with holding(folder, overwrite):
        refuse_earlier_attempt(folder, _earlier_attempt(folder), resume, restart or overwrite)
        state = newest_state(folder) if resume else None
        if state is None:
            folder.clear((MODEL_FILE, "log.json", "log.partial.jsonl", "profile.json.gz", "manifest.json",
                          "states/update-*.pt.gz"))
        return _build(folder, name, preset, cfg, phase, index, source, state, stop_after, progress)


def _build(folder: RunFolder, name: str, preset: str, cfg: ThinkingBaseConfig, phase: ThinkingPhase, index: int,
           source: Path, state: Path | None, stop_after: int | None, progress: bool) -> dict:
    """`build_base` in its held folder: train (from `state` when resuming), then profile, save, finish."""
    from tqdm import tqdm

    began = time.perf_counter()
    seed_everything(cfg.seed + index)
    model, tokenizer = presets.load(preset, state=source)
    start_digest = presets.parameter_digest(model)
    identity = {"base": name, "phase": asdict(phase), "config": {k: v for k, v in asdict(cfg).items() if k != "phases"},
                "start_digest": start_digest}
    run = PhaseRun(model, tokenizer, cfg, phase, index, watch=folder / "log.partial.jsonl")
    model.eval()  # no dropout, as every phase of the lab (labkit.studies.format_base says why)
    with deterministic("cpu", warn_only=True), DeferredInterrupt() as interrupt:
        autosave = Autosave(folder, interrupt, None, skeleton.AUTOSAVE_SECONDS)
        if state is not None:
            run.restore(state, identity)
            autosave.saved(f"states/{state.name}")  # the newest autosave: replaced by the next, gone at the end
        else:
            run.measure_now()
        end = stop_after or phase.steps
        bar = tqdm(total=phase.steps, initial=run.done, desc=f"thinking base {phase.name}", disable=not progress,
                   mininterval=5)
        while run.done < end:
            row = run.update()
            bar.update(1)
            if row is not None:
                bar.set_postfix(think=f"{row['think_rate']:.2f}", acc=f"{row['accuracy']:.2f}")
            # a state by the clock, on Ctrl-C, at stop_after and after the last update (so that a stop in the
            # final profile resumes straight into it)
            if autosave.due(run.done) or run.done == end:
                with whole_write(interrupt):
                    saved_name = f"states/update-{run.done:05d}.pt.gz"
                    saved = state_lib.save_state(folder / saved_name, run.capture(identity))
                    folder.register(saved_name, saved["sha256"])
                    autosave.saved(saved_name)
                autosave.stop_if_asked(run.done, phase.steps, folder / saved_name, "update", "--resume")
        bar.close()
        if run.done < phase.steps:  # stop_after: a stop with a state, as a Ctrl-C makes
            return {"stopped_after": run.done, "state": str(folder / saved_name)}
        trained = time.perf_counter() - began
        summary, rows = measure(model, tokenizer, held_out_chains(TEST_SEED, PROFILE_CHAINS_PER_K),
                                cfg.profile_draws, TEST_SEED)
    autosave.finish()
    presets.save_model(model, folder / MODEL_FILE)
    write_json(folder / "log.json", run.log)
    (folder / "log.partial.jsonl").unlink(missing_ok=True)
    atomic_write_bytes(folder / "profile.json.gz", gzip.compress(json.dumps(
        {"summary": summary, "table": think_profile.profile(rows), "rows": rows}, sort_keys=True).encode(), mtime=0))
    manifest = {
        "step": "thinking_base", "base": name, "preset": preset, "phase": asdict(phase),
        "config": identity["config"],
        "start_model": {"file": str(source.relative_to(REPO_ROOT)), "parameter_digest": start_digest},
        "final_digest": presets.parameter_digest(model),
        "documents": dict(run.stream.counts), "steps": phase.steps,
        "resumed_from": None if state is None else state.name,
        "test_profile": summary,
        "code_sha256": code_digests(), "environment": environment("cpu"),
        "times": {"train_seconds": trained, "total_seconds": time.perf_counter() - began},
    }
    for file in (MODEL_FILE, "log.json", "profile.json.gz"):
        folder.register(file)
    manifest["ledger"] = folder.ledger()
    write_json(folder / "manifest.json", manifest)
    folder.mark_finished({"think_rate": summary["think_rate"], "accuracy": summary["accuracy"]})
    return manifest


def read_profile(name: str, preset: str = "tiny") -> dict:
    """A base's committed test profile ({"summary", "table", "rows"}), checked against its manifest."""
    folder = RunFolder(default_run_dir(preset, name))
    folder.check_file("profile.json.gz")
    return json.loads(gzip.decompress((folder / "profile.json.gz").read_bytes()))


def _worker(job: tuple[str, str, int, bool, bool]) -> tuple[str, float]:
    name, preset, threads, resume, restart = job
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    build_base(name, preset, resume=resume, restart=restart, progress=False)
    return name, time.perf_counter() - t0


def is_finished(name: str, preset: str = "tiny") -> bool:
    return (default_run_dir(preset, name) / "FINISHED").is_file()


def all_finished(preset: str = "tiny") -> bool:
    return all(is_finished(n, preset) for n in BASES)


def waves(names: list[str], cfg: ThinkingBaseConfig, built: set[str]) -> list[list[str]]:
    """`names` in waves that can run side by side: each base after the one it continues (a base of `built`,
    or one of an earlier wave); refused when a base waits for one that no wave builds."""
    out, ready, left = [], set(built), list(names)
    while left:
        wave = [n for n in left if cfg.phase(n).start == "committed" or cfg.phase(n).start in ready]
        if not wave:
            raise ValueError(f"thinking bases {left} continue bases that are neither built nor asked for: "
                             f"{sorted({cfg.phase(n).start for n in left})}")
        out.append(wave)
        ready |= set(wave)
        left = [n for n in left if n not in wave]
    return out


def run_all(preset: str = "tiny", *, only: tuple[str, ...] | None = None, workers: int = 2, threads: int = 1,
            progress: bool = True, resume: bool = False, restart: bool = False) -> dict[str, float]:
    """Every base in `only` (default: all) not yet finished, `workers` at a time (`labkit.lab.workers`: a
    worker never outlives the command), each after the base it continues; returns {base: seconds}.
    resume, restart: for every base that holds an unfinished attempt (`build_base`; without either, such a
    base is refused in one line, before any work)."""
    from ..lab.workers import run_in_processes

    cfg = ThinkingBaseConfig()
    for name in only or ():
        cfg.phase(name)  # an unknown name is refused before any work
    waiting = [n for n in BASES if (not only or n in only) and not is_finished(n, preset)]
    for name in waiting:  # refuse before any work, as build_base would once its turn came
        attempt = None if resume or restart else _earlier_attempt(RunFolder(default_run_dir(preset, name)))
        refuse_earlier_attempt(RunFolder(default_run_dir(preset, name)), attempt, resume, restart)
    times: dict[str, float] = {}
    try:
        for wave in waves(waiting, cfg, {n for n in BASES if is_finished(n, preset)}):
            failed = []
            for job, result, error in run_in_processes(
                    _worker, [(n, preset, threads, resume, restart) for n in wave], workers):
                if error is not None:
                    failed.append(f"{job[0]}: {error}")
                    continue
                name, seconds = result
                times[name] = seconds
                if progress:
                    print(f"thinking base {name} done in {seconds:.0f} s", flush=True)
            if failed:
                stopped = [f for f in failed if ": Interrupted: " in f]
                if stopped:
                    raise skeleton.Interrupted("; ".join(stopped))
                raise RuntimeError("thinking bases failed: " + "; ".join(failed))
    except KeyboardInterrupt as err:
        if isinstance(err, skeleton.Interrupted):
            raise  # the workers' own messages name each base's state and --resume
        raise skeleton.Interrupted("thinking bases stopped (Ctrl-C): every unfinished base kept its newest state; "
                                   "continue with `python -m labkit thinking-bases --resume`") from None
    if all_finished(preset):
        write_step_manifest(preset)
    return times


def write_step_manifest(preset: str = "tiny") -> dict:
    """runs/<preset>/thinking/manifest.json: every finished run's manifest digest (the step is built when it exists)."""
    root = preset_folder(preset, "thinking")
    manifest = {"step": "thinking", "preset": preset,
                "runs": {n: sha256_file(root / n / "manifest.json") for n in BASES}}
    write_json(root / "manifest.json", manifest)
    return manifest


def is_built(preset: str = "tiny") -> bool:
    return (preset_folder(preset, "thinking") / "manifest.json").is_file()
