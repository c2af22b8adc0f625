"""A base that rarely answers in the lab's format: a short continued pretraining (chapter 10).

    python -m labkit format-base --preset tiny        # -> runs/tiny/format_base/

Why.  "R1-Zero" asks whether RL from a base *creates* a behaviour or *selects* one the base
already shows.  The committed tiny base never answers `{"final_stock": N}` (its pretraining
never shows that key: `labkit.train.corpus`), so GRPO from it sees reward 0 in every group, has no
signal, and can select nothing.  This step makes a base that shows the lab's format *rarely*:
it continues the base's answer phase (`labkit.train.answer_phase`: same document mix, same loss on
the whole answer) at a low learning rate, with a stated share `lab_format_share` of the
documents (2%) in the lab's own prompt (`task.FORMAT_INSTRUCTION`) answered as
`{"final_stock": N}`.  Every problem is fresh: none of the 1,400 (checked per document).

When it stops.  Every `measure_every` updates (and before the first) it measures the share of
valid lab-format answers and of correct ones at temperature 1 on the 200 validation statements
x 4 draws (seeded, the fast sampler), and it stops at the first measurement where that share
reaches `stop_at_valid_share` (5%): the behaviour is then present but rare, which is the set-up
the question needs (absent, RL has nothing to select; common, there is nothing to create).
The model is saved and evaluated on the test statements like every policy (`labkit.eval.evaluate`,
into <folder>/evaluation/format_base/).

Files: `model.safetensors` (digest recorded), `log.json` (loss and measurements),
`manifest.json` (config, counts, the start model's digest, code digests), FINISHED; while it runs,
`states/update-NNNNN.pt.gz` (the run skeleton's autosaves: `--resume` continues from the newest).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..lab import skeleton, state as state_lib
from ..lab.runs import REPO_ROOT, RunFolder, UnfinishedRunError, display_path, preset_folder, read_json, write_json
from ..lab.skeleton import Autosave, DeferredInterrupt, holding, refuse_earlier_attempt, whole_write
from ..lab.runtime import code_digests, deterministic, environment, hashed_seed, seed_everything
from ..task import data
from ..task.problems import FORMAT_INSTRUCTION, solve
from ..config import FormatBaseConfig
from ..models import presets, sampling, scoring
from ..train import answer_phase
from ..train import corpus as corpus_mod
from ..train.schedule import lm_update

MODEL_FILE = "model.safetensors"
POLICY_NAME = "format_base"


def lab_format_document(source: corpus_mod.CorpusGenerator) -> corpus_mod.Document:
    """A chat: a fresh statement, the lab's instruction, the answer as {"final_stock": N}."""
    p = source.problem()
    w = corpus_mod._Writer()
    w.write(corpus_mod.CHAT_USER)
    w.write(source.statement(p), drawn=True)
    w.write("\n" + FORMAT_INSTRUCTION + corpus_mod.CHAT_ASSISTANT + '{"final_stock": ')
    answer_span = w.write(str(solve(p)))
    w.write("}" + corpus_mod.CHAT_END)
    return w.document("lab_format", [p.key], answer_span)


def next_document(source: corpus_mod.CorpusGenerator, cfg: FormatBaseConfig) -> corpus_mod.Document:
    """The lab's format with probability lab_format_share, else the answer phase's mix."""
    if source.rng.random() < cfg.lab_format_share:
        return lab_format_document(source)
    return answer_phase.keyed_document(source) if source.rng.random() < cfg.keyed_share else source.direct()


def measure_seed(problem_id: str, draw: int) -> int:
    """Each measured answer's own seed: SHA-256("format-base/<id>/<draw>"), 62 bits."""
    return hashed_seed(f"format-base/{problem_id}/{draw}")


@torch.no_grad()
def format_share(model, tokenizer, problems: list[dict], draws: int) -> dict:
    """{"valid", "correct", "responses"}: shares of the `draws` temperature-1 answers to each
    problem that are valid lab-format JSON, and that are correct (labkit.task.verifier).  `model` is
    expected in eval mode (no dropout), as everywhere the lab samples; `train` puts it there."""
    items = [(p["id"], scoring.build_prompt_ids(tokenizer, p["statement"]), p["problem"]) for p in problems]
    seeds = [measure_seed(p["id"], d) for p in problems for d in range(draws)]
    groups = sampling.sample_groups(model, tokenizer, items, draws, seeds, sampler="fast")
    verdicts = [v for g in groups for v in g.verdicts]
    return {"valid": sum(v.valid for v in verdicts) / len(verdicts),
            "correct": sum(v.reward for v in verdicts) / len(verdicts), "responses": len(verdicts)}


def validation_problems() -> list[dict]:
    statements = data.open_records("statements", "validation", "learning")
    labels = {r["id"]: r for r in data.open_records("labels", "validation", "learning")}
    return [{**s, **labels[s["id"]]} for s in statements]


class FormatRun:
    """The continued pretraining in progress: the model, its AdamW, the document stream, the log.
    Everything a resumed run needs is in `capture()`; the documents are not saved but replayed (the stream
    is one seeded generator: the same documents come back in the same order, and the counts with them)."""

    def __init__(self, model, tokenizer, cfg: FormatBaseConfig, problems: list[dict]):
        self.model, self.tokenizer, self.cfg, self.problems = model, tokenizer, cfg, problems
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                           weight_decay=cfg.weight_decay)
        self.forbidden = corpus_mod.dataset_keys()
        self.stream = corpus_mod.CorpusGenerator(cfg.seed, self.forbidden)
        self.log: list[dict] = []
        self.window: list[float] = []  # the training losses since the last "train" line
        self.lab_documents, self.checked, self.done = 0, 0, 0
        self.reached = False  # a measurement reached stop_at_valid_share: the run is over

    def measure_now(self) -> dict:
        row = {"kind": "measure", "step": self.done,
               **format_share(self.model, self.tokenizer, self.problems, self.cfg.measure_draws)}
        self.log.append(row)
        self.reached = self.done > 0 and row["valid"] >= self.cfg.stop_at_valid_share
        return row

    def documents(self) -> list[corpus_mod.Document]:
        """The next update's documents, counted (and each checked to be none of the 1,400 problems)."""
        documents = [next_document(self.stream, self.cfg) for _ in range(self.cfg.documents_per_step)]
        self.checked += corpus_mod.check_disjoint(documents, self.forbidden)
        self.lab_documents += sum(d.kind == "lab_format" for d in documents)
        return documents

    def update(self) -> dict | None:
        """One update; returns the measure line when one was due."""
        cfg = self.cfg
        batch = answer_phase.answer_batch(self.tokenizer, self.documents())
        loss, _ = lm_update(self.model, self.optimizer, batch, cfg.lr, cfg.grad_clip)  # constant lr
        self.window.append(loss)
        self.done += 1
        if self.done % cfg.log_every == 0:
            self.log.append({"kind": "train", "step": self.done, "loss": sum(self.window) / len(self.window),
                             "lab_format_documents": self.lab_documents})
            self.window = []
        if self.done % cfg.measure_every == 0 or self.done == cfg.max_steps:
            return self.measure_now()
        return None

    def over(self) -> bool:
        return self.reached or self.done >= self.cfg.max_steps

    def counts(self) -> dict:
        return {"steps": self.done, "documents": self.done * self.cfg.documents_per_step,
                "lab_format_documents": self.lab_documents, "problems_checked": self.checked}

    def capture(self, identity: dict) -> dict:
        return state_lib.capture_state(
            model=self.model, optimizer=self.optimizer, scheduler={"updates_done": self.done, "total": self.cfg.max_steps},
            data_order=self.counts(), generators={}, history=self.log, consumed_ids=[], identity=identity,
            progress={"updates_done": self.done, "window": list(self.window), "reached": self.reached})

    def restore(self, path: Path, identity: dict) -> None:
        """Continue from a state of the same run: the weights, AdamW, the log, and the documents replayed to
        where the state was taken (checked against the counts it recorded)."""
        saved, _ = state_lib.load_state(path)
        if saved["identity"] != identity:
            diff = sorted(k for k in identity if saved["identity"].get(k) != identity[k])
            raise ValueError(f"{path} belongs to another format base or setting: identity fields {diff} differ")
        plain = state_lib.restore_state(saved, model=self.model, optimizer=self.optimizer, generators={})
        progress = plain["progress"]
        for _ in range(progress["updates_done"]):
            self.documents()
        self.done, self.window, self.log, self.reached = (progress["updates_done"], progress["window"],
                                                          plain["history"], progress["reached"])
        if self.counts() != plain["data_order"]:
            raise ValueError(f"{path}: replaying the documents gave {self.counts()}, the state recorded "
                             f"{plain['data_order']}: the stream is not the one the state was taken in")


def train(model, tokenizer, cfg: FormatBaseConfig, problems: list[dict], progress: bool = True) -> dict:
    """Continue pretraining `model` in place, start to end in one go (no folder, no states: `run_format_base`
    is the resumable run); returns {"log", "documents", "lab_format_documents", ...}."""
    from tqdm import tqdm

    run = FormatRun(model, tokenizer, cfg, problems)
    # Eval mode while training, as the lab's SFT and GRPO: the tiny architecture's attention dropout
    # (0.1, for chapter 2's "dropout left on" bug) lifts this base's loss on these documents from 0.12
    # to 2.5 and, trained through, took its held-out exact answers from 42% to 28% in 60 updates.
    model.eval()
    run.measure_now()
    bar = tqdm(total=cfg.max_steps, desc="format base", disable=not progress, mininterval=5)
    while not run.over():
        row = run.update()
        bar.update(1)
        if row is not None:
            bar.set_postfix(valid=f"{row['valid']:.3f}")
    bar.close()
    return {"log": run.log, **run.counts()}


def default_run_dir(preset: str) -> Path:
    return preset_folder(preset, "format_base")


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
    if any((folder / name).is_file() for name in (MODEL_FILE, "log.json", "manifest.json")):
        return "files of an unfinished run and no state"
    return None


def run_format_base(preset: str = "tiny", run_dir: str | Path | None = None, *, cfg: FormatBaseConfig | None = None,
                    evaluate_limit: int | None = None, overwrite: bool = False, resume: bool = False,
                    restart: bool = False, stop_after: int | None = None, progress: bool = True) -> dict:
    """Continue the base's pretraining with the lab's format at a small share, save, measure, evaluate;
    returns the manifest (or, stopped early, {"stopped_after": updates, "state": path}).

    The run's life is every training run's (`labkit.lab.skeleton`): a state is saved every
    `skeleton.AUTOSAVE_SECONDS` and when Ctrl-C asks to stop (the run then stops after the update it is in,
    naming the command that continues); a folder holding an unfinished attempt is refused unless `resume`
    (continue from its newest state, bit for bit) or `restart` (delete it).  A finished base whose
    evaluation a stop cut short is evaluated by the same command; a finished and evaluated one is refused
    unless `overwrite`.  stop_after: stop after this many updates, with a state, as a Ctrl-C would (tests)."""
    from ..eval import evaluate

    if preset != "tiny":
        raise ValueError(f"preset {preset!r}: only the tiny base is pretrained by the lab (the qwen base is "
                         "Qwen2.5-0.5B-Instruct, which already follows instructions)")
    cfg = cfg or FormatBaseConfig()
    if resume and restart:
        raise ValueError("--resume continues an unfinished attempt and --restart deletes it: pass one of them")
    if stop_after is not None and not 1 <= stop_after < cfg.max_steps:
        raise ValueError(f"stop_after {stop_after}: an update count in 1..{cfg.max_steps - 1}")
    folder = RunFolder(run_dir or default_run_dir(preset))
    if folder.is_finished() and not overwrite and not RunFolder(folder / "evaluation" / POLICY_NAME).is_finished():
        manifest = folder.manifest()  # trained, not yet evaluated (a stop during the evaluation): evaluate it
    else:
        with holding(folder, overwrite):
            attempt = _earlier_attempt(folder)
            refuse_earlier_attempt(folder, attempt, resume, restart or overwrite)
            state = newest_state(folder) if resume else None
            if resume and attempt and state is None:
                raise UnfinishedRunError(f"{display_path(folder.path)} holds an unfinished attempt ({attempt}) but "
                                         "no saved state to resume from: pass --restart to delete it and start afresh")
            if state is None:
                folder.clear((MODEL_FILE, "log.json", "manifest.json", "states/update-*.pt.gz"))
            manifest = _train_in(folder, preset, cfg, state, stop_after, progress)
        if "stopped_after" in manifest:
            return manifest
    evaluate.run_inference(preset, POLICY_NAME, state_file=folder / MODEL_FILE, eval_root=folder / "evaluation",
                           limit=evaluate_limit, overwrite=overwrite)
    return manifest


def _train_in(folder: RunFolder, preset: str, cfg: FormatBaseConfig, state: Path | None, stop_after: int | None,
              progress: bool) -> dict:
    """`run_format_base`'s training in its held folder (from `state` when resuming), then save and finish."""
    from tqdm import tqdm

    began = time.perf_counter()
    seed_everything(cfg.seed)
    model, tokenizer = presets.load(preset)  # the committed base, checked against its recorded digest
    start_digest = presets.parameter_digest(model)
    identity = {"step": "format_base", "config": asdict(cfg), "start_digest": start_digest}
    run = FormatRun(model, tokenizer, cfg, validation_problems())
    model.eval()  # no dropout: `train` says why
    with deterministic("cpu", warn_only=True), DeferredInterrupt() as interrupt:
        autosave = Autosave(folder, interrupt, None, skeleton.AUTOSAVE_SECONDS)
        if state is not None:
            run.restore(state, identity)
            autosave.saved(f"states/{state.name}")  # the newest autosave: replaced by the next, gone at the end
        else:
            run.measure_now()
        bar = tqdm(total=cfg.max_steps, initial=run.done, desc="format base", disable=not progress, mininterval=5)
        while not run.over():
            row = run.update()
            bar.update(1)
            if row is not None:
                bar.set_postfix(valid=f"{row['valid']:.3f}")
            if run.over():
                break
            if autosave.due(run.done) or run.done == stop_after:  # by the clock, on Ctrl-C, at stop_after
                with whole_write(interrupt):
                    saved_name = f"states/update-{run.done:05d}.pt.gz"
                    saved = state_lib.save_state(folder / saved_name, run.capture(identity))
                    folder.register(saved_name, saved["sha256"])
                    autosave.saved(saved_name)
                autosave.stop_if_asked(run.done, cfg.max_steps, folder / saved_name, "update", "--resume")
                if run.done == stop_after:
                    bar.close()
                    return {"stopped_after": run.done, "state": str(folder / saved_name)}
        bar.close()
    autosave.finish()
    presets.save_model(model, folder / MODEL_FILE)
    write_json(folder / "log.json", run.log)
    measured = [r for r in run.log if r["kind"] == "measure"]
    manifest = {
        "step": "format_base", "preset": preset, "config": asdict(cfg),
        "start_model": {"file": str(presets.TINY_BASE_STATE.relative_to(REPO_ROOT)), "parameter_digest": start_digest},
        "final_digest": presets.parameter_digest(model),
        "counts": run.counts(),
        "format_share": {"before": measured[0], "after": measured[-1]},
        "resumed_from": None if state is None else state.name,
        "code_sha256": code_digests(), "environment": environment("cpu"),
        "times": {"train_seconds": time.perf_counter() - began},
    }
    for name in (MODEL_FILE, "log.json"):
        folder.register(name)
    manifest["ledger"] = folder.ledger()
    write_json(folder / "manifest.json", manifest)
    folder.mark_finished({"valid_before": measured[0]["valid"], "valid_after": measured[-1]["valid"]})
    return manifest


def read_log(run_dir: str | Path | None = None, preset: str = "tiny") -> list[dict]:
    folder = RunFolder(run_dir or default_run_dir(preset))
    folder.check_file("log.json")
    return read_json(folder / "log.json")
