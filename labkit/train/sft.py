"""The warm start and the additional SFT: supervised learning of the solver's targets.

Two branches, one loop (book/protocol.md, "Warm start and SFT"):

    branch      starts from        examples                      epochs  updates of 8
    warm_start  the base           the first 128 train problems     3        48
    sft         the warm start     the other 872 train problems     2       218

Choices, each for a reason:

* **Eval mode throughout** (dropout off), for the updates as for the validation.
  The tiny preset has attention dropout 0.1; in train mode the loss would be
  that of a randomly thinned model, the log-probs the later chapters compute
  (in eval mode, as the protocol requires for GRPO) would not be the ones SFT
  optimised, and the run would consume the global RNG.  Eval mode does not stop
  autograd, so nothing is lost but the noise.
* **AdamW** at the preset's `sft_lr` (tiny 1.5e-4, qwen 2e-5: labkit.config) and `sft_weight_decay`,
  with the lab's one schedule (`labkit.train.schedule`: 10% linear warm-up, then
  linear decay to 10% of the peak) and gradient-norm clipping at `grad_clip`
  (1.0), the same safeguards GRPO uses; the norm before clipping is logged.
* **Loss** = `scoring.sft_loss`: cross-entropy summed over every supervised
  response token of the 8 examples (EOS included) divided by their number, not
  a mean of per-example means.
* **Data order**: each epoch draws `torch.randperm` from the branch's own seeded
  generator; the generator's state, the permutation and the cursor are part of
  the saved state, so a resumed run draws the same next permutation.
* **Validation NLL** (per token, over the 200 validation problems' target
  responses) before training and after every epoch, and the final model's
  greedy accuracy on them: logged, never used to pick a checkpoint.  The final
  model is the one after the last epoch, always.
* **Determinism**: fixed seeds, `torch.use_deterministic_algorithms(True)`
  during the run, and the same thread count.  On the CPU the thread count
  *does* change the numbers (measured on the tiny model: 1 vs 2 threads give
  the same first loss, then losses that differ by about 1e-7 relative from the
  second update on, because matrix products split their sums differently,
  so the weights differ bitwise), so the thread count
  and the device are part of a run's identity: a resume with another thread
  count is refused, and the resume check runs with the real run's count.

Run folder `runs/<preset>/<branch>/`: `model.safetensors` (reloaded and its
digest checked), `history.json`, `manifest.json`, `states/epoch-<k>.pt.gz`
(the full resumable state after every epoch, gzip level 1; the last is the end
state), and `FINISHED`.  `resume_check` adds `resume_report.json`.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..lab import state as state_lib
from ..lab import skeleton
from ..lab.runs import (REPO_ROOT, RunFolder, UnfinishedRunError, display_path, is_finished, preset_folder, read_json,
                   run_path, same_folder, sha256_file, write_json)
from ..lab.runtime import code_digests, data_digests, environment, seed_everything
from ..lab.runtime import deterministic as deterministic_algorithms
from ..lab.skeleton import Autosave, DeferredInterrupt, holding, whole_write
from ..task import data, problems
from ..config import QWEN, SEED_OFFSETS, PresetConfig, get_preset
from ..models import scoring
from .schedule import clipped_step, warmup_linear_decay, warmup_updates

BRANCHES = ("warm_start", "sft")
# Each branch draws its data order from its own generator, seeded apart so the
# two branches never share a permutation stream.
DATA_ORDER_SEED_OFFSET = {"warm_start": SEED_OFFSETS["warm_start_data_order"], "sft": SEED_OFFSETS["sft_data_order"]}
VALIDATION_BATCH = QWEN.validation_batch_size  # examples per validation forward (labkit.config)

ModelFactory = Callable[[], tuple[torch.nn.Module, object]]


# -- 1. Examples -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One supervised example: the chat prompt ids and the target response ids (answer JSON + EOS)."""

    id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]


def load_split_examples(tokenizer, split: str, phase: str = "learning") -> list[Example]:
    """Statements joined with their labels' targets, encoded, in file order.

    Goes through `data.open_records`, so the learning phase cannot open the test
    split (it raises `data.PhaseError`).
    """
    statements = data.open_records("statements", split, phase)
    labels = {r["id"]: r for r in data.open_records("labels", split, phase)}
    if [s["id"] for s in statements] != list(labels):
        raise ValueError(f"{split} statements and labels do not hold the same ids in the same order")
    return [
        Example(
            id=s["id"],
            prompt_ids=tuple(scoring.build_prompt_ids(tokenizer, s["statement"])),
            response_ids=tuple(scoring.target_response_ids(tokenizer, labels[s["id"]]["target"])),
        )
        for s in statements
    ]


def branch_examples(train: list[Example], branch: str, config: PresetConfig) -> list[Example]:
    """The branch's examples: a prefix of the warm-start set (first 128) or of the pool (other 872).

    With the protocol's counts this is exactly `task.warm_start_ids` / `task.pool_ids`;
    a shortened config (tests) takes the first examples of the same set.
    """
    check_branch(branch)
    ids = [e.id for e in train]
    if len(ids) != problems.SPLIT_SIZES["train"]:
        raise ValueError(f"expected {problems.SPLIT_SIZES['train']} train problems, got {len(ids)}")
    if branch == "warm_start":
        wanted, count = problems.warm_start_ids([{"id": i} for i in ids]), config.warm_start_examples
    else:
        wanted, count = problems.pool_ids([{"id": i} for i in ids]), config.sft_examples
    if not 1 <= count <= len(wanted):
        raise ValueError(f"{branch} needs 1..{len(wanted)} examples, the config asks for {count}")
    by_id = {e.id: e for e in train}
    return [by_id[i] for i in wanted[:count]]


def check_branch(branch: str) -> None:
    if branch not in BRANCHES:
        raise ValueError(f"unknown SFT branch {branch!r}; expected one of {BRANCHES}")


# -- 2. The plan: counts and schedule ------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A branch's counts and schedule, all derived from the preset's config by `make_plan`."""

    branch: str
    """"warm_start" or "sft\""""
    examples: int
    """train examples the branch learns from (config.warm_start_examples or config.sft_examples)"""
    epochs: int
    """passes over them (config.warm_start_epochs or config.sft_epochs)"""
    batch_size: int
    """examples per update (config.sft_batch_size; an epoch's last batch may be smaller)"""
    updates_per_epoch: int
    """ceil(examples / batch_size)"""
    total_updates: int
    """updates_per_epoch x epochs: the schedule's length"""
    peak_lr: float
    """the schedule's peak rate (config.sft_lr)"""
    weight_decay: float
    """AdamW's decoupled weight decay (config.sft_weight_decay)"""
    grad_clip: float
    """gradient norm clip (config.grad_clip)"""
    warmup_fraction: float
    """share of the updates spent warming up (config.warmup_fraction)"""
    final_lr_fraction: float
    """the rate decays linearly to this share of its peak (config.final_lr_fraction)"""
    data_order_seed: int
    """seeds the branch's permutations: config.seed + config.SEED_OFFSETS[<branch>_data_order]"""

    def lr(self, update: int) -> float:
        return warmup_linear_decay(update, self.total_updates, self.peak_lr, self.warmup_fraction, self.final_lr_fraction)

    def to_dict(self) -> dict:
        return {**self.__dict__, "warmup_updates": warmup_updates(self.total_updates, self.warmup_fraction)}


def make_plan(config: PresetConfig, branch: str) -> Plan:
    """Counts of a branch: 128 x 3 epochs = 48 updates of 8; 872 x 2 = 218."""
    check_branch(branch)
    n = config.warm_start_examples if branch == "warm_start" else config.sft_examples
    epochs = config.warm_start_epochs if branch == "warm_start" else config.sft_epochs
    per_epoch = math.ceil(n / config.sft_batch_size)  # a last partial batch is kept, never dropped
    return Plan(
        branch=branch,
        examples=n,
        epochs=epochs,
        batch_size=config.sft_batch_size,
        updates_per_epoch=per_epoch,
        total_updates=per_epoch * epochs,
        peak_lr=config.sft_lr,
        weight_decay=config.sft_weight_decay,
        grad_clip=config.grad_clip,
        warmup_fraction=config.warmup_fraction,
        final_lr_fraction=config.final_lr_fraction,
        data_order_seed=config.seed + DATA_ORDER_SEED_OFFSET[branch],
    )


# -- 3. Validation NLL -----------------------------------------------------------------------------


@torch.no_grad()
def validation_nll(model, examples: list[Example], pad_id: int, batch_size: int = VALIDATION_BATCH) -> dict:
    """Per-token negative log-likelihood of the target responses: sum(-log p) / tokens.

    Returns {"nll", "tokens", "examples"}.  Logged only: never used to choose a checkpoint.
    """
    total, tokens = 0.0, 0
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batch = scoring.make_batch([e.prompt_ids for e in chunk], [e.response_ids for e in chunk], pad_id)
        logp, _ = scoring.response_logprobs(model, batch)  # (B, R), 0 beyond each response
        total += float(-logp.double().sum())
        tokens += batch.num_active_tokens
    return {"nll": total / tokens, "tokens": tokens, "examples": len(examples)}


@torch.no_grad()
def greedy_validation(model, tokenizer, examples: list[Example], sampler: str = "fast") -> dict:
    """Greedy pass@1 of the final model on the validation problems, scored by the verifier.

    Measured once, after training, on the final model: it reports what the
    branch reached and chooses nothing.  The fast sampler's greedy tokens are
    checked equal to the reference sampler's in tests/test_sampling.py.
    Returns {"sampler", "problems", "correct", "success_rate", "valid_json",
    "without_eos", "mean_response_tokens", "reasons"} (the names of labkit.grpo.metrics).
    """
    from ..models import sampling
    from ..task import verifier

    labels = {r["id"]: r for r in data.open_records("labels", "validation", "learning")}
    rollouts = sampling.get_sampler(sampler)(
        model, tokenizer, [list(e.prompt_ids) for e in examples], greedy=True, problem_ids=[e.id for e in examples]
    )
    verdicts = [verifier.score(r.text, r.finish_reason, labels[r.problem_id]["problem"], r.tokenization_valid)
                for r in rollouts]
    reasons: dict[str, int] = {}
    for v in verdicts:
        if v.reason is not None:
            reasons[v.reason] = reasons.get(v.reason, 0) + 1
    correct = sum(v.reward for v in verdicts)
    return {
        "sampler": sampler,
        "problems": len(verdicts),
        "correct": correct,
        "success_rate": correct / len(verdicts),
        "valid_json": sum(v.valid for v in verdicts) / len(verdicts),
        "without_eos": sum(r.finish_reason != "eos" for r in rollouts),
        "mean_response_tokens": sum(len(r.response_ids) for r in rollouts) / len(rollouts),
        "reasons": dict(sorted(reasons.items())),
    }


def default_run_dir(preset: str, branch: str) -> Path:
    return preset_folder(preset, branch)


def state_path(run_dir: Path, epoch: int) -> Path:
    return Path(run_dir) / "states" / f"epoch-{epoch}.pt.gz"


def _updates_at(state_file: Path, plan: "Plan") -> int:
    """How many updates a state file was saved after, from its name: states/epoch-<k>.pt.gz (after epoch k)
    or states/update-<n>.pt.gz (an autosave after update n)."""
    try:
        kind, number = state_file.name.split(".")[0].split("-")
        return {"epoch": int(number) * plan.updates_per_epoch, "update": int(number)}[kind]
    except (KeyError, ValueError):
        raise ValueError(f"{state_file}: not an SFT state name (states/epoch-<k>.pt.gz or "
                         "states/update-<n>.pt.gz)") from None


# What a fresh attempt clears from an unfinished (or explicitly overwritten) folder.
ATTEMPT_FILES = ("history.json", "model.safetensors", "manifest.json", "resume_report.json", "states/epoch-*.pt.gz",
                 "states/update-*.pt.gz")
STATE_GLOBS = ("epoch-*.pt.gz", "update-*.pt.gz")


def start_model_factory(preset: str, branch: str, device: str | None = None) -> tuple[ModelFactory, str]:
    """How a branch gets its starting model: the base (warm start) or the finished warm start (SFT).

    Returns (factory, description of the source).
    """
    from ..models import presets

    check_branch(branch)
    if branch == "warm_start":
        source = None  # the preset's own start: tiny's committed base, qwen's released weights
        description = f"{preset} base"
    else:
        warm = default_run_dir(preset, "warm_start")
        if not is_finished(warm):
            raise FileNotFoundError(f"the additional SFT starts from the warm start, but {warm} is not a finished run")
        source = warm / "model.safetensors"
        data.check_path_access("learning", source)
        description = str(source.relative_to(REPO_ROOT))
    return (lambda: presets.load(preset, state=source, device=device)), description


# -- 5. The loop -------------------------------------------------------------------------------------


def _identity(config: PresetConfig, plan: Plan, examples, validation, initial_digest: str, pad_id: int,
              device: str) -> dict:
    """What makes two runs the same run: a resumed run must match its state's identity exactly."""
    return {
        "device": device,
        "torch_threads": torch.get_num_threads(),  # the numbers depend on it (module docstring)
        "branch": plan.branch,
        "config_fingerprint": config.fingerprint(),
        "plan": plan.to_dict(),
        "example_ids": [e.id for e in examples],
        "validation_ids": [e.id for e in validation],
        "data_sha256": data_digests(),
        "initial_parameter_digest": initial_digest,
        "pad_id": pad_id,
    }


@dataclass
class Branch:
    """What an SFT branch carries from one epoch to the next (all of it is in a saved state)."""

    config: PresetConfig
    plan: Plan
    model: torch.nn.Module
    tokenizer: object
    examples: list[Example]
    validation: list[Example]
    identity: dict
    initial_digest: str
    was_training: bool = False  # the mode the model came in, handed back at the end
    optimizer: torch.optim.Optimizer | None = None
    order_generator: torch.Generator | None = None
    history: list[dict] = field(default_factory=list)
    consumed: list[str] = field(default_factory=list)
    progress: dict = field(default_factory=lambda: {"epochs_done": 0, "updates_done": 0, "validation": []})
    data_order: dict = field(default_factory=lambda: {"epoch": 0, "permutation": [], "cursor": 0})

    def start_optimizer(self) -> None:
        """AdamW and the data-order generator, fresh (a resume then overwrites both from its state)."""
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                           lr=self.plan.peak_lr, weight_decay=self.plan.weight_decay)
        self.order_generator = torch.Generator().manual_seed(self.plan.data_order_seed)

    def capture(self) -> dict:
        return state_lib.capture_state(
            model=self.model, optimizer=self.optimizer,
            scheduler=_scheduler_position(self.plan, self.progress["updates_done"]), data_order=self.data_order,
            generators={"data_order": self.order_generator}, history=self.history, consumed_ids=self.consumed,
            identity=self.identity, progress=self.progress,
        )

    def restore(self, path: Path) -> dict:
        """Continue from a saved state of the same run; returns what the manifest records of it."""
        saved, _ = state_lib.load_state(path)
        mismatch = state_lib.compare_states(saved["identity"], self.identity)
        if not mismatch["equal"]:
            raise ValueError(f"{path} is the state of another run; identity differs in {mismatch['different_fields']}")
        rest = state_lib.restore_state(saved, model=self.model, optimizer=self.optimizer,
                                       generators={"data_order": self.order_generator})
        self.history, self.consumed = rest["history"], rest["consumed_ids"]
        self.progress, self.data_order = rest["progress"], rest["data_order"]
        if rest["scheduler"] != _scheduler_position(self.plan, self.progress["updates_done"]):
            raise ValueError(f"{path}: scheduler position {rest['scheduler']} disagrees with {self.progress}")
        return {"path": str(path), "sha256": sha256_file(path), "epochs_done": self.progress["epochs_done"]}


def _open_folder(branch: str, plan: Plan, folder: RunFolder, stop_after_epochs, validation_limit, resume_from,
                 restart: bool) -> Path | None:
    """Refuse bad options before any work; in the held folder, clear an earlier attempt's files
    (a fresh start into a folder that holds an attempt's states is refused unless `restart` or
    an overwrite: states are never deleted silently)."""
    if stop_after_epochs is not None and not 1 <= stop_after_epochs < plan.epochs:
        raise ValueError(f"stop_after_epochs must lie in 1..{plan.epochs - 1} for {branch}, got {stop_after_epochs}")
    if validation_limit is not None and validation_limit < 1:
        raise ValueError(f"validation_limit {validation_limit}: must be at least 1 (or None for all 200)")
    if resume_from is not None:
        resume_from = run_path(resume_from)
        if not resume_from.is_file():
            raise FileNotFoundError(f"--resume-from {resume_from}: no such state file (states are in <run>/states/)")
        data.check_path_access("learning", resume_from)
    run_dir = folder.path
    states = sorted((p for pattern in STATE_GLOBS for p in folder.states.glob(pattern)),
                    key=lambda p: _updates_at(p, plan))
    if resume_from is None and states and not restart:
        raise UnfinishedRunError(
            f"{display_path(run_dir)} holds an unfinished attempt (newest state "
            f"{states[-1].relative_to(run_dir)}): pass --resume-from {display_path(states[-1])} to continue it, "
            "or --restart to delete it and start afresh")
    if resume_from is not None and same_folder(resume_from.parent.parent, run_dir):  # links and `..` resolved
        # Resuming in the run's own folder: states after it belong to a lost attempt, and so do the
        # half-written files of a killed write (atomic_write_bytes' temporaries).
        removed = [p for p in states if _updates_at(p, plan) > _updates_at(resume_from, plan)]
        removed += list(folder.path.glob(".*.tmp")) + list(folder.states.glob(".*.tmp"))
        for path in removed:
            path.unlink()
    else:
        # A fresh start (or a resume into a new folder) must not mix with an earlier attempt's
        # files: a later resume could pick an old state.
        removed = folder.clear(ATTEMPT_FILES)
    if removed:
        print(f"{run_dir}: removed {len(removed)} file(s) of an earlier, unfinished attempt "
              f"({', '.join(sorted(str(p.relative_to(run_dir)) for p in removed))})", flush=True)
    return resume_from


def start_branch(config: PresetConfig, plan: Plan, model_factory: ModelFactory, validation_limit: int | None,
                 expected_start: str | None, start_description: str | None) -> Branch:
    """Stage 1: the starting model (eval mode, digest checked), the branch's examples, the identity."""
    from ..models import presets

    model, tokenizer = model_factory()
    was_training = model.training
    model.eval()  # eval mode for everything: see the module docstring
    initial_digest = presets.parameter_digest(model)
    if expected_start is not None and initial_digest != expected_start:
        raise ValueError(f"{start_description} loads with digest {initial_digest}, the warm start ended at {expected_start}")
    device = str(next(model.parameters()).device)
    examples = branch_examples(load_split_examples(tokenizer, "train"), plan.branch, config)
    validation = load_split_examples(tokenizer, "validation")[: validation_limit or None]
    identity = _identity(config, plan, examples, validation, initial_digest, tokenizer.pad_token_id, device)
    return Branch(config=config, plan=plan, model=model, tokenizer=tokenizer, examples=examples,
                  validation=validation, identity=identity, initial_digest=initial_digest, was_training=was_training)


def run_epoch(b: Branch, epoch: int, bar, after_update: Callable[[], None] | None = None) -> dict:
    """One epoch of updates on a fresh permutation, then the validation NLL; returns its times.

    A branch restored from an autosave inside `epoch` continues that epoch's permutation from its
    cursor (the generator already drew it).  after_update(): called after each update (the autosave)."""
    t0 = time.perf_counter()
    if not (b.data_order["epoch"] == epoch and b.data_order["cursor"] > 0):
        permutation = torch.randperm(len(b.examples), generator=b.order_generator).tolist()
        b.data_order = {"epoch": epoch, "permutation": permutation, "cursor": 0}
    permutation = b.data_order["permutation"]
    pad_id = b.tokenizer.pad_token_id
    done_before = b.progress["updates_done"] - (epoch - 1) * b.plan.updates_per_epoch  # this epoch's, if resumed
    for _ in range(done_before, b.plan.updates_per_epoch):
        chosen = permutation[b.data_order["cursor"]: b.data_order["cursor"] + b.plan.batch_size]
        b.data_order["cursor"] += len(chosen)
        record = sft_update(b.model, b.optimizer, [b.examples[i] for i in chosen], pad_id, b.plan,
                            b.progress["updates_done"], epoch)
        b.progress["updates_done"] += 1
        b.history.append(record)
        b.consumed.extend(f"epoch-{epoch}/{b.examples[i].id}" for i in chosen)
        bar.update(1)
        bar.set_postfix(epoch=epoch, loss=f"{record['loss']:.4f}", lr=f"{record['learning_rate']:.2e}")
        if after_update is not None:
            after_update()
    train_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    b.progress["validation"].append({"epoch": epoch, **validation_nll(b.model, b.validation, pad_id)})
    b.progress["epochs_done"] = epoch
    return {"epoch": epoch, "train_seconds": train_seconds, "validation_seconds": time.perf_counter() - t0}


def run_branch(
    config: PresetConfig | str,
    branch: str,
    run_dir: str | Path | None = None,
    *,
    model_factory: ModelFactory | None = None,
    start_description: str | None = None,
    stop_after_epochs: int | None = None,
    resume_from: str | Path | None = None,
    validation_limit: int | None = None,
    device: str | None = None,
    overwrite: bool = False,
    restart: bool = False,
    progress: bool = True,
    greedy_eval: bool = True,
) -> dict:
    """Train one SFT branch into `run_dir`; returns the manifest.

    model_factory      () -> (model, tokenizer) giving the starting model (default: the preset's
                       base for warm_start, the finished warm start for sft)
    stop_after_epochs  stop (and save the state) after this many epochs; the run is then not
                       finished (no model, no FINISHED marker)
    resume_from        a state file of the same run (same identity) to continue from with a
                       fresh model object, optimizer and generator
    validation_limit   score only the first N validation problems (tests); restart: see _open_folder
    greedy_eval        measure the greedy validation accuracy of the starting model (full runs
                       only) and of the final model (the resume check's second run skips it)
    """
    config = get_preset(config) if isinstance(config, str) else config
    check_branch(branch)
    plan = make_plan(config, branch)
    folder = RunFolder(run_dir if run_dir is not None else default_run_dir(config.name, branch))
    with holding(folder, overwrite):
        resume_from = _open_folder(branch, plan, folder, stop_after_epochs, validation_limit, resume_from,
                                   restart or overwrite)
        return _train_branch(config, branch, plan, folder, model_factory, start_description, stop_after_epochs,
                             resume_from, validation_limit, device, progress, greedy_eval)


def _train_branch(config: PresetConfig, branch: str, plan: Plan, folder: RunFolder, model_factory, start_description,
                  stop_after_epochs, resume_from, validation_limit, device, progress: bool, greedy_eval: bool) -> dict:
    """Stages 1-4 of `run_branch` in its held folder."""
    began = time.perf_counter()

    # Stage 1: the starting model, the data, the plan
    expected_start = None
    if model_factory is None:
        model_factory, start_description = start_model_factory(config.name, branch, device)
        if branch == "sft":  # the additional SFT must start exactly where the warm start ended
            expected_start = read_json(default_run_dir(config.name, "warm_start") / "manifest.json")["final_digest"]
    b = start_branch(config, plan, model_factory, validation_limit, expected_start, start_description)
    times = {"load_seconds": time.perf_counter() - began, "start_greedy_validation_seconds": None, "epochs": []}
    start_greedy = None
    if greedy_eval and resume_from is None and stop_after_epochs is None:
        # What the branch starts from (for the warm start: the base, before it has seen the
        # answer format).  Reported beside the end; it chooses nothing.  No RNG is drawn.
        t0 = time.perf_counter()
        start_greedy = greedy_validation(b.model, b.tokenizer, b.validation)
        times["start_greedy_validation_seconds"] = time.perf_counter() - t0

    # Stage 2: optimizer and data-order generator; fresh or restored from a state
    b.start_optimizer()
    if resume_from is None:
        seed_everything(config.seed)
    resumed = b.restore(resume_from) if resume_from is not None else None

    # Stage 3: epochs of updates; validation and a full state after each epoch, autosaves between
    # (labkit.lab.skeleton: by the clock, and on Ctrl-C, which then stops after the current update)
    stop = stop_after_epochs or plan.epochs
    # A state after the final epoch (a stop during the final stage: the model's save, the greedy
    # validation) resumes straight into that stage; a stop earlier than the state is refused.
    final_state = resume_from is not None and stop == b.progress["epochs_done"] == plan.epochs
    if stop <= b.progress["epochs_done"] and not final_state:
        raise ValueError(f"the state is after epoch {b.progress['epochs_done']}; nothing to do up to epoch {stop}")
    state_files = {}
    with deterministic_algorithms(), DeferredInterrupt() as interrupt:
        autosave = Autosave(folder, interrupt, None, skeleton.AUTOSAVE_SECONDS)
        end = stop * plan.updates_per_epoch

        def after_update() -> None:
            done = b.progress["updates_done"]
            if done < end and autosave.due(done):
                with whole_write(interrupt):
                    name = save_update_state(folder, b)
                    autosave.saved(name)
                autosave.stop_if_asked(done, end, folder / name, "update", f"--resume-from {display_path(folder / name)}")

        if not b.progress["validation"]:
            t0 = time.perf_counter()
            b.progress["validation"].append({"epoch": 0, **validation_nll(b.model, b.validation, b.tokenizer.pad_token_id)})
            times["epochs"].append({"epoch": 0, "train_seconds": 0.0, "validation_seconds": time.perf_counter() - t0})
        bar = _progress_bar(plan, b.progress["updates_done"], stop, progress)
        for epoch in range(b.progress["epochs_done"] + 1, stop + 1):
            epoch_times = run_epoch(b, epoch, bar, after_update)
            with whole_write(interrupt):
                name, saved = save_epoch_state(folder, b, epoch, epoch_times)
            state_files[name] = saved
            autosave.kept()
            times["epochs"].append(epoch_times)
            tqdm_write(bar, f"{branch} epoch {epoch}: validation NLL {b.progress['validation'][-1]['nll']:.4f}")
            autosave.stop_if_asked(b.progress["updates_done"], end, folder / name, "update",
                                   f"--resume-from {display_path(folder / name)}")
        bar.close()
    autosave.finish()
    if b.was_training:
        b.model.train()  # hand the model back as it came (it stays trained)
    return finish_branch(folder, b, model_factory, stop, start_description, start_greedy, resumed, greedy_eval,
                         state_files, times, began)


def save_update_state(folder: RunFolder, b: Branch) -> str:
    """An autosave: the full resumable state after the branch's latest update, registered in the ledger."""
    name = f"states/update-{b.progress['updates_done']:05d}.pt.gz"
    saved = state_lib.save_state(folder / name, b.capture())
    folder.register(name, saved["sha256"])
    return name


def save_epoch_state(folder: RunFolder, b: Branch, epoch: int, times: dict) -> tuple[str, dict]:
    """The full resumable state after `epoch`, registered in the folder's ledger with its digest."""
    saved = state_lib.save_state(state_path(folder.path, epoch), b.capture(), evidence={"times": dict(times)})
    name = f"states/epoch-{epoch}.pt.gz"
    folder.register(name, saved["sha256"])
    times["state_save_seconds"] = saved["save_seconds"]
    return name, {k: saved[k] for k in ("bytes", "raw_bytes", "sha256")}


def finish_branch(folder: RunFolder, b: Branch, model_factory: ModelFactory, stop: int, start_description,
                  start_greedy, resumed, greedy_eval: bool, state_files: dict, times: dict, began: float) -> dict:
    """Stage 4: the final model (reloaded and checked), history, manifest; FINISHED when complete."""
    from ..models import presets

    plan, config, device = b.plan, b.config, b.identity["device"]
    finished = stop == plan.epochs
    final_digest = presets.parameter_digest(b.model)
    manifest = {
        "step": plan.branch,
        "branch": plan.branch,
        "preset": config.name,
        "status": "finished" if finished else f"stopped after epoch {stop} of {plan.epochs}",
        "config": config.to_dict(),
        "config_fingerprint": config.fingerprint(),
        "plan": plan.to_dict(),
        "start_model": {"source": start_description or "given model factory", "parameter_digest": b.initial_digest},
        "final_digest": final_digest,
        "resumed_from": resumed,
        "data_sha256": data_digests(),
        "code_sha256": code_digests(),
        "environment": environment(device),
        "eval_mode": True,
        "start_validation_greedy": start_greedy,
        "validation_nll": b.progress["validation"],
        "validation_used_for_selection": False,
        "counts": _counts(b.history, b.examples, b.validation, b.progress),
        "times": times,
        "files": {"states": state_files},
    }
    write_json(folder / "history.json", {"updates": b.history, "validation": b.progress["validation"]})
    if finished:
        model_path = folder / "model.safetensors"
        presets.save_model(b.model, model_path)
        fresh, _ = model_factory()
        presets.load_state_into(fresh, model_path)
        reloaded = presets.parameter_digest(fresh)
        if reloaded != final_digest:
            raise RuntimeError(f"{model_path} reloads with digest {reloaded}, the trained model has {final_digest}")
        manifest["reloaded_parameter_digest"] = reloaded
        if greedy_eval:
            t0 = time.perf_counter()
            manifest["validation_greedy"] = greedy_validation(fresh.to(device).eval(), b.tokenizer, b.validation)
            times["greedy_validation_seconds"] = time.perf_counter() - t0
        manifest["files"]["model.safetensors"] = folder.register("model.safetensors")
    folder.register("history.json")
    manifest["ledger"] = folder.ledger()
    times["total_seconds"] = time.perf_counter() - began
    write_json(folder / "manifest.json", manifest)
    if finished:
        folder.mark_finished({"branch": plan.branch, "final_digest": final_digest})
    return manifest


def _scheduler_position(plan: Plan, next_update: int) -> dict:
    """The schedule is a pure function of the update index: its state is where it stands."""
    return {"kind": "warmup_linear_decay", "next_update": next_update, "total_updates": plan.total_updates}


def sft_update(model, optimizer, batch_examples: list[Example], pad_id: int, plan: Plan,
                update: int, epoch: int) -> dict:
    """One AdamW update on a batch of examples; returns its history record."""
    if model.training:
        raise RuntimeError("SFT updates run in eval mode (dropout off); the model was switched to train mode")
    lr = plan.lr(update)
    batch = scoring.make_batch([e.prompt_ids for e in batch_examples], [e.response_ids for e in batch_examples], pad_id)
    optimizer.zero_grad(set_to_none=True)
    loss = scoring.sft_loss(model, batch)  # CE over every active token of the batch
    if not torch.isfinite(loss):
        raise FloatingPointError(f"update {update + 1}: non-finite SFT loss {loss.item()}")
    grad_norm = clipped_step(optimizer, loss, lr, plan.grad_clip, error_if_nonfinite=True)
    return {
        "update": update + 1,
        "epoch": epoch,
        "example_ids": [e.id for e in batch_examples],
        "learning_rate": lr,
        "loss": float(loss.detach()),
        "grad_norm": float(grad_norm),
        "response_tokens": batch.num_active_tokens,
        "tokens": int(batch.attention_mask.sum()),
    }


def _counts(history, examples, validation, progress_state) -> dict:
    """What the run consumed: examples, tokens and forward passes (training and validation apart)."""
    val_tokens = sum(len(e.prompt_ids) + len(e.response_ids) for e in validation)
    evaluations = len(progress_state["validation"])
    return {
        "examples": len(examples),
        "updates": len(history),
        "train_sequence_forwards": sum(len(h["example_ids"]) for h in history),  # each also a backward
        "train_batched_forwards": len(history),
        "train_tokens": sum(h["tokens"] for h in history),
        "train_supervised_tokens": sum(h["response_tokens"] for h in history),
        "validation_evaluations": evaluations,
        "validation_sequence_forwards": evaluations * len(validation),
        "validation_tokens": evaluations * val_tokens,
    }


def _progress_bar(plan: Plan, done: int, stop_epoch: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=stop_epoch * plan.updates_per_epoch, initial=done, desc=plan.branch, unit="update",
                disable=not enabled, dynamic_ncols=True)


def tqdm_write(bar, text: str) -> None:
    if not bar.disable:
        bar.write(text)


# -- 6. Resume check ------------------------------------------------------------------------------------


def resume_check(
    config: PresetConfig | str,
    branch: str,
    *,
    run_dir: str | Path | None = None,
    scratch_dir: str | Path | None = None,
    model_factory: ModelFactory | None = None,
    fresh_process: bool = True,
    validation_limit: int | None = None,
    device: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> dict:
    """Continuous run vs stop-after-epoch-1 + resume (`labkit.lab.resume`): the end states, the
    tensors of the two model files, and the two epoch-1 states (stop run vs continuous run) must
    be equal.  The continuous run is run now unless finished; with `fresh_process` the stop and
    resume runs are separate `python -m labkit sft` processes with the real run's thread count.
    Report: `run_dir/resume_report.json`."""
    from safetensors.torch import load_file

    from ..lab import resume

    config = get_preset(config) if isinstance(config, str) else config
    plan = make_plan(config, branch)
    if plan.epochs < 2:
        raise ValueError(f"a resume check needs at least 2 epochs, {branch} has {plan.epochs}")
    run_dir = Path(run_dir) if run_dir is not None else default_run_dir(config.name, branch)
    if (run_dir / "resume_report.json").exists() and not overwrite:
        raise FileExistsError(f"{run_dir / 'resume_report.json'} exists; a resume report is evidence "
                              "(pass overwrite=True to redo it)")
    if fresh_process and model_factory is not None:
        raise ValueError("a custom model_factory cannot cross into a fresh process; use fresh_process=False")
    common = dict(model_factory=model_factory, validation_limit=validation_limit, device=device, progress=progress)
    if not is_finished(run_dir):
        run_branch(config, branch, run_dir, overwrite=overwrite, **common)
    continuous = read_json(run_dir / "manifest.json")
    resume.check_preconditions(run_dir, continuous, state_path(run_dir, plan.epochs),
                               run_dir / "resume_report.json", overwrite=True)
    threads = continuous["environment"]["torch_threads"]

    def stop(folder: Path) -> Path:
        if fresh_process:
            _run_in_fresh_process(config, branch, folder, threads, validation_limit, device, ["--stop-after-epochs", "1"])
        else:
            run_branch(config, branch, folder, stop_after_epochs=1, **common)
        return state_path(folder, 1)

    def resume_into(folder: Path, boundary: Path) -> None:
        if fresh_process:
            _run_in_fresh_process(config, branch, folder, threads, validation_limit, device,
                                  ["--resume-from", str(boundary), "--no-greedy-eval"])
        else:
            run_branch(config, branch, folder, resume_from=boundary, greedy_eval=False, **common)

    def after(boundary: Path, resume_dir: Path) -> dict:
        # the stop run's epoch 1 must also equal the continuous run's epoch 1 (the run is deterministic)
        at_boundary = state_lib.compare_state_files(state_path(run_dir, 1), boundary)
        return {"boundary_state": {k: at_boundary[k] for k in ("equal", "compared_fields", "different_fields", "sections")},
                "cost": {"resumed_run_epoch_times": read_json(resume_dir / "manifest.json")["times"]["epochs"]}}

    return resume.run_resume_check(resume.ResumeCheck(
        run_dir=run_dir,
        scratch_dir=Path(scratch_dir) if scratch_dir is not None else REPO_ROOT / "runs" / "scratch" / config.name / branch,
        end_state=lambda folder: state_path(folder, plan.epochs), stop=stop, resume=resume_into,
        # the saved model files, tensor by tensor
        extras=lambda folder, _: {"final_model_file": load_file(str(folder / "model.safetensors"))},
        boundary=f"after epoch 1 of {plan.epochs} (a completed epoch: every update of it done, state saved)",
        facts={"branch": branch, "preset": config.name}, continuous_seconds=continuous["times"]["total_seconds"],
        extra_work={"extra_updates": plan.total_updates},  # epoch 1 in the stop run + the rest in the resumed run
        after=after,
    ), threads, fresh_process)


def _run_in_fresh_process(config, branch, run_dir, threads, validation_limit, device, extra: list[str]) -> None:
    """`python -m labkit sft ...` in a new interpreter: nothing in memory is shared with this one."""
    if config != get_preset(config.name):
        raise ValueError("a fresh process can only rebuild a preset's own config; use fresh_process=False")
    cmd = [sys.executable, "-m", "labkit", "sft", "--preset", config.name, "--branch", branch,
           "--run-dir", str(run_dir), "--threads", str(threads), "--overwrite", "--no-progress", *extra]
    if validation_limit:
        cmd += ["--validation-limit", str(validation_limit)]
    if device:
        cmd += ["--device", device]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT)
