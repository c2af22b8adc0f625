"""What a GRPO run asks of the task it learns, so that one loop trains every task of the lab.

`labkit.grpo.loop.run_grpo` runs every GRPO run: the protocol's (StockArithmetic's one-line answers,
`loop.PROTOCOL_TASK`) and chapter 11's (answers worked step by step, `labkit.studies.reasoning`).
The loop owns what every run does alike: the prompt order and the sampling seeds, the sampler, the
advantages, the updates and their pre-update check, the run folder, its autosaves, Ctrl-C, exact
resume and the finish.  A task supplies only what differs between tasks:

    step         the manifest's "step" ("grpo", "reasoning")
    pool         (tokenizer, config) -> (pool, prompts): the problems, each {"id", "problem", ...},
                 and each problem's prompt token ids by id
    verify       (text, finish_reason, problem, tokenization_valid) -> verdict: the task's verifier
                 (the verdict has a `reward`; it never sees the model)
    reward       (verdict, problem) -> float: the reward the run optimises, before any variant
                 changes it (the protocol's: the verdict's reward)
    record       (loop, iteration, sampled, updates, check) -> (history record, rollout rows):
                 iteration counts from 0; the loop appends the record to its history and the rows
                 to rollouts.jsonl.gz (each row with its "rollout_id")
    checkpoints  (loop, total iterations) -> an object whose `maybe_measure(folder, iteration,
                 at_start=False)` measures the policy when a checkpoint is due and returns its seconds
                 (it reads the policy only: no generator, no optimiser, so it changes no weight)
    postfix      (record) -> the progress bar's figures
    finish       (folder, loop) -> the manifest's extra fields; writes and registers any extra file
                 (chapter 11's test profile)
    identity     fields added to the run's identity (the protocol's run adds none, so its states and
                 folders are those it always had)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


def no_extras(folder, loop) -> dict:
    """A task's finish that writes nothing more (the protocol's)."""
    return {}


@dataclass(frozen=True)
class Task:
    """What differs between the tasks one GRPO loop trains (the module docstring says each field)."""

    step: str
    pool: Callable
    verify: Callable
    reward: Callable
    record: Callable
    checkpoints: Callable
    postfix: Callable
    finish: Callable = no_extras
    identity: dict = field(default_factory=dict)
